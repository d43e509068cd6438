//! Engine configuration: TENT's `transfer-engine.json`, key names verbatim.
//!
//! One table ([`Config::schema`]) drives everything: which keys exist, their
//! type and range, their default, whether a feature stands behind them yet,
//! and which struct field each one fills. Adding a key is one line in the
//! `schema!` invocation below plus the typed field it fills in `sections!`
//! (a test fails when a field has no key). The same table gives
//! [`Config::key_table`] (`tent-bench --print-config`, `docs/CONFIG.md`).
//!
//! Fields have their real types: [`Duration`]s for the `_secs`, `_ms` and
//! `_us` keys (whole numbers of that unit in a file), enums for names
//! ([`LogLevel`], [`SplitPolicy`], [`MetadataType`], [`GidIndex`],
//! [`TrafficClass`], [`QpsPerRail`], [`HugePages`]), a list
//! for `transports/rdma/devices`. A value read from a file or a variable is
//! type-checked into a field's type, then range-checked; one built in code
//! gets the same range checks from [`Config::validate`], field by field.
//!
//! Every key named in the reference documents is known from the start. A key
//! whose feature is not built yet is still type- and range-checked, then
//! accepted and reported once per process at warn level ("not yet in
//! effect"), so a production `transfer-engine.json` loads unchanged. An
//! unknown key is an error that names the key, the file, the keys known at
//! that level and the closest match: a typo must never silently fall back to
//! a default.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Map, Value};

mod env;
mod json;

pub use crate::secret::Secret;

/// The environment variable naming the configuration: a file path, or the
/// JSON text itself when it starts with `{`.
pub const ENV_VAR: &str = "TENT_CONF";

/// The `source` of a configuration read inline from [`ENV_VAR`].
pub const INLINE_SOURCE: &str = "TENT_CONF (inline)";

/// The `source` of [`Config::default`].
pub const DEFAULT_SOURCE: &str = "default";

/// A value each field type can start from before the schema writes every
/// key's default over it: what lets `Config::default()` come from the
/// schema alone, with no second list of fields.
trait Blank {
    fn blank() -> Self;
}

macro_rules! blank_is_default {
    ($($t:ty),*) => {$(
        impl Blank for $t {
            fn blank() -> Self {
                <$t>::default()
            }
        }
    )*};
}
blank_is_default!(
    bool,
    u16,
    u32,
    u64,
    f64,
    String,
    Vec<String>,
    Vec<f64>,
    Vec<usize>,
    Duration,
    Secret,
    GidIndex,
    TrafficClass,
    QpsPerRail,
    u8
);

/// Declares the configuration's structs: each gets its `Blank` value from
/// the same field list, and the names of its fields (`FIELDS`), which a
/// test holds against the schema's keys.
macro_rules! sections {
    ($( $(#[$meta:meta])* pub struct $name:ident { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )* } )*) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Blank for $name {
            fn blank() -> Self {
                $name { $( $field: Blank::blank(), )* }
            }
        }

        impl $name {
            #[cfg(test)]
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
        }
    )*};
}

sections! {
/// The whole engine configuration. Field docs name the JSON key (paths use
/// `/` between nested objects, as TENT does).
pub struct Config {
    /// Where this configuration came from: `"default"`, a file path, or
    /// `"TENT_CONF (inline)"`; after [`Config::load`] applied variables,
    /// that followed by `, then ` and their names.
    pub source: String,
    /// `block_size`: slice size in bytes; larger requests are split.
    pub block_size: u64,
    /// `default_timeout_ms`: per-operation deadline when the SQE has none.
    pub default_timeout_ms: Duration,
    /// `max_timeout_ms`: the furthest deadline an operation may ask for.
    pub max_timeout_ms: Duration,
    /// `ring_depth`: entries per submission/completion ring (power of two).
    pub ring_depth: u32,
    /// `max_batch_size`: tasks per batch.
    pub max_batch_size: u32,
    /// `max_batches`: batches allocated at once.
    pub max_batches: u32,
    /// `max_tasks_per_worker`: task-table capacity of one worker.
    pub max_tasks_per_worker: u32,
    /// `max_inflight_slices`: credit-pool size per worker per transport.
    pub max_inflight_slices: u32,
    /// `inline_max_bytes`: the largest op a submitting thread performs
    /// itself (inline issue, on local and shm); 0 turns it off.
    pub inline_max_bytes: u64,
    /// `inline_max_in_flight`: the most ops a ring issues inline at once
    /// (staged and not reaped).
    pub inline_max_in_flight: u32,
    /// `daemon_socket`: attach to the node's `tentd` at this path instead
    /// of starting an engine in this process; empty: embed one.
    pub daemon_socket: String,
    /// `daemon_embed_fallback`: with `daemon_socket` set, embed an engine
    /// when no daemon answers there (attach, else embed).
    pub daemon_embed_fallback: bool,
    /// `daemon_client_name`: the name this process gives the daemon at
    /// attach (its weights and reports name it); empty: none.
    pub daemon_client_name: String,
    /// `max_failover_attempts`: transport switches per task; 0 disables
    /// cross-transport failover for every request (an SQE's `no_failover`
    /// flag disables it for one).
    pub max_failover_attempts: u32,
    /// `merge_requests`: merge adjacent requests of a batch. Not yet in
    /// effect.
    pub merge_requests: bool,
    /// `hugepages`: the pages behind [`crate::Engine::allocate_memory`].
    pub hugepages: HugePages,
    /// `log_level`: what tent's own binaries, its C library and its Python
    /// module log (a Rust application installs its own subscriber).
    pub log_level: LogLevel,
    /// `metadata_type`: control-plane backend.
    pub metadata_type: MetadataType,
    /// `metadata_servers`: the etcd endpoints (`host:port`), with
    /// `metadata_type` `"etcd"`.
    pub metadata_servers: Vec<String>,
    /// `metadata_key_prefix`: where in etcd this engine's cluster lives.
    pub metadata_key_prefix: String,
    /// `metadata_lease_ttl_secs`: the lease a published descriptor lives by.
    pub metadata_lease_ttl_secs: Duration,
    /// `metadata_segment_name`: the name this engine publishes its segment
    /// under in etcd (empty: its control server's `ip:port`).
    pub metadata_segment_name: String,
    /// `metadata_tls_ca_file`: the CA `https://` etcd endpoints are
    /// checked against (empty: the public web roots).
    pub metadata_tls_ca_file: String,
    /// `metadata_tls_cert_file`: this engine's client certificate for etcd.
    pub metadata_tls_cert_file: String,
    /// `metadata_tls_key_file`: its private key.
    pub metadata_tls_key_file: String,
    /// `metadata_user`: the etcd user, when etcd has auth enabled.
    pub metadata_user: String,
    /// `metadata_password`: that user's password.
    pub metadata_password: Secret,
    /// `rpc_server_hostname`: address the p2p handshake listens on.
    pub rpc_server_hostname: String,
    /// `rpc_server_port`: port of the p2p handshake; 0 = ephemeral.
    pub rpc_server_port: u16,
    /// `rpc_shared_secret`: HMAC key of the control plane's challenge-
    /// response; empty = no authentication.
    pub rpc_shared_secret: Secret,
    /// `non_dumpable`: make the engine's process non-dumpable.
    pub non_dumpable: bool,
    /// The `workers` object.
    pub workers: WorkersConfig,
    /// The `transports` object.
    pub transports: TransportsConfig,
    /// The `metrics` object.
    pub metrics: MetricsConfig,
}

/// The `metrics` object: the HTTP endpoint serving `/metrics`,
/// `/metrics/json`, `/health` and `/topology`.
pub struct MetricsConfig {
    /// `metrics/http_enable`: serve the endpoint.
    pub http_enable: bool,
    /// `metrics/http_port`: its port (0: ephemeral); a port taken falls
    /// back to an ephemeral one, with a warning.
    pub http_port: u16,
    /// `metrics/max_labelled_peers`: how many peers (segments) get their
    /// own per-rail and per-SQ series; the rest are summed under
    /// `segment="_other"`.
    pub max_labelled_peers: u32,
}

/// The `workers` object: how many worker threads, where they run, and how
/// they idle.
pub struct WorkersConfig {
    /// `workers/count`: number of worker threads.
    pub count: u32,
    /// `workers/cores`: worker `i` is pinned to `cores[i % len]`; empty lets
    /// the topology choose.
    pub cores: Vec<usize>,
    /// `workers/pin`: pin workers to cores at all.
    pub pin: bool,
    /// `workers/spin_us`: busy-poll time after the last work before
    /// yielding.
    pub spin_us: Duration,
    /// `workers/yield_us`: `sched_yield` phase before parking.
    pub yield_us: Duration,
    /// `workers/park_timeout_ms`: longest sleep while parked, so deadlines
    /// are still enforced on an idle worker.
    pub park_timeout_ms: Duration,
    /// `workers/idle_poll_budget_pct`: share of one core an idle worker
    /// may spend polling through the gaps regular arrivals predict.
    pub idle_poll_budget_pct: u32,
}

/// The `transports` object: one sub-object per transport.
pub struct TransportsConfig {
    /// `transports/local`: in-process memcpy.
    pub local: LocalConfig,
    /// `transports/shm`: cross-process shared memory.
    pub shm: ShmConfig,
    /// `transports/tcp`: one-sided READ/WRITE served by the target.
    pub tcp: TcpConfig,
    /// `transports/rdma`: verbs, rails, QoS, spraying, SQ flow control.
    pub rdma: RdmaConfig,
}

/// `transports/local`.
pub struct LocalConfig {
    /// `transports/local/enable`.
    pub enable: bool,
}

/// `transports/shm`.
pub struct ShmConfig {
    /// `transports/shm/enable`.
    pub enable: bool,
    /// `transports/shm/dir`: directory of the shared-memory files (absolute).
    pub dir: String,
    /// `transports/shm/max_mapped_bytes_per_peer`: bytes of one owner's
    /// regions this engine maps at most; 0 = an eighth of the address
    /// space left at start.
    pub max_mapped_bytes_per_peer: u64,
    /// `transports/shm/max_mapped_bytes`: bytes of every owner's regions
    /// this engine maps at most; 0 = a quarter of the address space left
    /// at start.
    pub max_mapped_bytes: u64,
}

/// `transports/tcp`.
pub struct TcpConfig {
    /// `transports/tcp/enable`.
    pub enable: bool,
    /// `transports/tcp/connections_per_peer`.
    pub connections_per_peer: u32,
    /// `transports/tcp/max_inflight_per_connection`: bytes on a
    /// connection's wire, in full slices.
    pub max_inflight_per_connection: u32,
    /// `transports/tcp/bulk_window_beside_high`: bulk bytes each worker
    /// keeps on the wire to a peer over one rail while HIGH (from any
    /// worker) flows there; 0 = no cap.
    pub bulk_window_beside_high: u64,
    /// `transports/tcp/high_hold_us`: how long after a HIGH slice HIGH
    /// counts as flowing.
    pub high_hold_us: Duration,
    /// `transports/tcp/user_timeout_ms`: `TCP_USER_TIMEOUT`; 0 = OS default.
    pub user_timeout_ms: Duration,
    /// `transports/tcp/slice_size`: bytes per TCP slice (each costs a
    /// request and a response, so TCP wants them larger than `block_size`).
    pub slice_size: u64,
    /// `transports/tcp/backend`: io_uring, epoll, or the best available.
    pub backend: TcpBackend,
    /// `transports/tcp/serving_threads`: threads serving the target side;
    /// 0 = one per core available to the engine.
    pub serving_threads: u32,
    /// `transports/tcp/max_served_connections`: data connections served
    /// at once; 0 = derived from open-file limit and memory.
    pub max_served_connections: u32,
}

/// `transports/rdma`: every RDMA key of the reference documents (failover
/// rails, QoS, slice spraying, SQ flow control).
pub struct RdmaConfig {
    /// `transports/rdma/enable`.
    pub enable: bool,
    /// `transports/rdma/devices`: the RDMA devices to open (a list, or in
    /// a file also one comma-separated string); empty = every device found.
    pub devices: Vec<String>,
    /// `transports/rdma/gid_index`: `"auto"` (first non-zero GID) or a GID
    /// table index.
    pub gid_index: GidIndex,
    /// `transports/rdma/traffic_class`: the traffic class of RDMA packets.
    pub traffic_class: TrafficClass,
    /// `transports/rdma/service_level`: the InfiniBand service level (the
    /// 802.1p priority on RoCE NICs that map it), 0 to 15.
    pub service_level: u8,
    /// `transports/rdma/slice_size`: bytes per RDMA slice (clamped to the
    /// NICs' max message size).
    pub slice_size: u64,
    /// `transports/rdma/qp_depth`: send work requests per QP (clamped to
    /// the NIC's `max_qp_wr`).
    pub qp_depth: u32,
    /// `transports/rdma/rail_error_threshold`: failures inside the window
    /// that pause a rail (every network transport's rails).
    pub rail_error_threshold: u32,
    /// `transports/rdma/rail_error_window_secs`: sliding window for rail
    /// errors.
    pub rail_error_window_secs: Duration,
    /// `transports/rdma/rail_cooldown_secs`: first cooldown of a paused rail;
    /// doubles per repeat, capped at 300 s.
    pub rail_cooldown_secs: Duration,
    /// `transports/rdma/rail_backoff_decay_secs`: healthy time that halves
    /// a rail's remembered cooldown (decay instead of reset).
    pub rail_backoff_decay_secs: Duration,
    /// `transports/rdma/enable_priority_filtering`: priority-based device
    /// filtering. Not yet in effect.
    pub enable_priority_filtering: bool,
    /// `transports/rdma/local_rotation_interval_us`. Not yet in effect.
    pub local_rotation_interval_us: Duration,
    /// `transports/rdma/priority_promotion_timeout_us`: wait after which a
    /// queued MEDIUM/LOW request is promoted one level.
    pub priority_promotion_timeout_us: Duration,
    /// `transports/rdma/slot_rotation_interval_ms`: global QoS time-slot
    /// length. Not yet in effect.
    pub slot_rotation_interval_ms: Duration,
    /// `transports/rdma/shared_quota_shm_path`: shared-memory name of the
    /// global slot clock; empty = single-process mode. Not yet in effect.
    pub shared_quota_shm_path: String,
    /// `transports/rdma/enable_smart_scheduling`: EWMA rail selection
    /// (`rails::DeviceSelector`, TCP and RDMA) instead of round robin.
    pub enable_smart_scheduling: bool,
    /// `transports/rdma/numa_penalties`: score multiplier per NUMA tier.
    pub numa_penalties: Vec<f64>,
    /// `transports/rdma/bandwidth_learning_rate`: EWMA weight of the old
    /// estimate.
    pub bandwidth_learning_rate: f64,
    /// `transports/rdma/ewma_min_bandwidth_multiplier`.
    pub ewma_min_bandwidth_multiplier: f64,
    /// `transports/rdma/ewma_max_bandwidth_multiplier`.
    pub ewma_max_bandwidth_multiplier: f64,
    /// `transports/rdma/score_jitter_range`.
    pub score_jitter_range: f64,
    /// `transports/rdma/score_epsilon`.
    pub score_epsilon: f64,
    /// `transports/rdma/default_bandwidth_gbps`.
    pub default_bandwidth_gbps: f64,
    /// `transports/rdma/min_bandwidth_gbps`.
    pub min_bandwidth_gbps: f64,
    /// `transports/rdma/max_bandwidth_gbps`.
    pub max_bandwidth_gbps: f64,
    /// `transports/rdma/max_slice_count`: multi-path allocation starts at
    /// half this many slices.
    pub max_slice_count: u32,
    /// `transports/rdma/sq_backoff_timeout_us` (`MORI_IO_SQ_BACKOFF_TIMEOUT_US`):
    /// no completion this long with requests posted = a stalled endpoint.
    pub sq_backoff_timeout_us: Duration,
    /// `transports/rdma/sq_signal_interval_wr` (`MORI_IO_SQ_SIGNAL_INTERVAL_WR`):
    /// signal every n-th request of a posted list too; 0 = every
    /// `qp_depth / 2`-th (the last of each list always is).
    pub sq_signal_interval_wr: u32,
    /// `transports/rdma/sq_resume_watermark_wr` (`MORI_IO_SQ_RESUME_WATERMARK_WR`):
    /// the endpoint's `SqController` hysteresis; 0 = off.
    pub sq_resume_watermark_wr: u32,
    /// `transports/rdma/sq_executor_admission` (`MORI_IO_SQ_EXECUTOR_ADMISSION`):
    /// the batch API's admission gate.
    pub sq_executor_admission: bool,
    /// `transports/rdma/sq_admission_timeout_us` (`MORI_IO_SQ_ADMISSION_TIMEOUT_US`).
    pub sq_admission_timeout_us: Duration,
    /// `transports/rdma/sq_admission_resume_watermark_wr`
    /// (`MORI_IO_SQ_ADMISSION_RESUME_WATERMARK_WR`): free slots a refused
    /// admission waits for before it tries again (clamped to the depth);
    /// 0 = off.
    pub sq_admission_resume_watermark_wr: u32,
    /// `transports/rdma/sq_admission_wait_slice_us`
    /// (`MORI_IO_SQ_ADMISSION_WAIT_SLICE_US`).
    pub sq_admission_wait_slice_us: Duration,
    /// `transports/rdma/sq_admission_chunk_wr` (`MORI_IO_SQ_ADMISSION_CHUNK_WR`);
    /// 0 = one endpoint's depth.
    pub sq_admission_chunk_wr: u32,
    /// `transports/rdma/sq_admission_max_chunks_per_call`
    /// (`MORI_IO_SQ_ADMISSION_MAX_CHUNKS_PER_CALL`): most endpoints one
    /// admission is split over; 0 = every active QP.
    pub sq_admission_max_chunks_per_call: u32,
    /// `transports/rdma/sq_split_policy` (`MORI_IO_SQ_SPLIT_POLICY`).
    pub sq_split_policy: SplitPolicy,
    /// `transports/rdma/sq_enable_experimental_capacity`
    /// (`MORI_IO_SQ_ENABLE_EXPERIMENTAL_CAPACITY`): required by the
    /// `capacity` split policy.
    pub sq_enable_experimental_capacity: bool,
    /// `transports/rdma/qp_per_transfer` (MORI's `qpPerTransfer`): QPs each
    /// worker keeps per rail to a peer.
    pub qp_per_transfer: QpsPerRail,
}
}

/// A key that is `"auto"` or a byte: the enum (`Auto` its default), the
/// accessor for the byte asked for, and the conversions.
macro_rules! auto_or_byte {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(#[$ameta:meta])* Auto,
            $(#[$vmeta:meta])* $variant:ident(u8),
        }
        $(#[$gmeta:meta])* fn $get:ident;
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        #[non_exhaustive]
        pub enum $name {
            $(#[$ameta])*
            #[default]
            Auto,
            $(#[$vmeta])*
            $variant(u8),
        }

        impl $name {
            $(#[$gmeta])*
            pub fn $get(self) -> Option<u8> {
                match self {
                    $name::Auto => None,
                    $name::$variant(v) => Some(v),
                }
            }
        }

        impl Field for $name {
            fn assign(&mut self, val: Val) -> bool {
                match val {
                    Val::AutoOrByte(v) => {
                        *self = v.map_or($name::Auto, $name::$variant);
                        true
                    }
                    _ => false,
                }
            }
            fn to_val(&self) -> Val {
                Val::AutoOrByte(self.$get())
            }
        }
    };
}

auto_or_byte! {
    /// `transports/rdma/gid_index`: which entry of a port's GID table the
    /// RDMA transport uses.
    pub enum GidIndex {
        /// `"auto"`: the engine chooses.
        Auto,
        /// This index on every device (an address handle holds 8 bits of it).
        Index(u8),
    }
    /// The index asked for; `None` for [`GidIndex::Auto`].
    fn index;
}

auto_or_byte! {
    /// `transports/rdma/qp_per_transfer`: how many QPs each worker keeps per
    /// rail to a peer.
    pub enum QpsPerRail {
        /// `"auto"`: 2 where a peer's rails are RoCE (two flows, two ECMP
        /// hashes: a large transfer no longer rides one path of a routed
        /// fabric), 1 on InfiniBand (the subnet manager's routes and adaptive
        /// routing spread a single QP's packets already).
        Auto,
        /// This many, 1 to 16, on every rail.
        Count(u8),
    }
    /// The count asked for; `None` for [`QpsPerRail::Auto`].
    fn count;
}

auto_or_byte! {
    /// `transports/rdma/traffic_class`: the IP traffic class (DSCP and ECN
    /// bits) of RoCE packets, or the GRH's on InfiniBand.
    pub enum TrafficClass {
        /// `"auto"`: the port's own (sysfs `tc/<port>/traffic_class`, which
        /// mlx5 exposes), else 106 on RoCE (DSCP 26 with ECN capable, the
        /// lossless class of a typical fabric) and 0 on InfiniBand.
        Auto,
        /// This byte: DSCP in the upper six bits, ECN in the lower two.
        Value(u8),
    }
    /// The class asked for; `None` for [`TrafficClass::Auto`].
    fn value;
}

/// A key spelled as one of a few names: the enum, its spellings in order
/// (`NAMES`, what the schema checks against) and the two conversions.
macro_rules! named {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            const NAMES: &'static [&'static str] = &[$($text),*];

            /// The configuration spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// Parses the configuration spelling.
            pub fn from_name(name: &str) -> Option<$name> {
                match name {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl Blank for $name {
            fn blank() -> Self {
                [$($name::$variant),*][0]
            }
        }

        impl Field for $name {
            fn assign(&mut self, val: Val) -> bool {
                match val {
                    Val::Str(s) => $name::from_name(&s).map(|v| *self = v).is_some(),
                    _ => false,
                }
            }
            fn to_val(&self) -> Val {
                Val::Str(self.as_str().to_owned())
            }
        }
    };
}

named! {
    /// How a batch is split across QPs under SQ admission
    /// (`transports/rdma/sq_split_policy`).
    pub enum SplitPolicy {
        /// `"static"`: round-robin.
        Static = "static",
        /// `"least_loaded"`: the active QP with the lowest depth + queued depth.
        LeastLoaded = "least_loaded",
        /// `"capacity"`: split by per-QP free slots (experimental).
        Capacity = "capacity",
    }
}

named! {
    /// `log_level`: the least severe events tent's own binaries, its C
    /// library and its Python module log.
    pub enum LogLevel {
        /// `"trace"`.
        Trace = "trace",
        /// `"debug"`.
        Debug = "debug",
        /// `"info"`.
        Info = "info",
        /// `"warn"`.
        Warn = "warn",
        /// `"error"`.
        Error = "error",
    }
}

impl From<LogLevel> for tracing::Level {
    fn from(level: LogLevel) -> tracing::Level {
        match level {
            LogLevel::Trace => tracing::Level::TRACE,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Error => tracing::Level::ERROR,
        }
    }
}

named! {
    /// `hugepages`: the pages behind `allocate_memory`'s memory.
    pub enum HugePages {
        /// `"transparent"`: base pages, advised to become transparent huge
        /// pages for buffers of 2 MiB and more (the kernel's THP setting
        /// decides).
        Transparent = "transparent",
        /// `"off"`: base pages, no advice.
        Off = "off",
        /// `"2m"`: 2 MiB hugetlbfs pages from the system's reserved pool,
        /// the length rounded up to whole pages; transparent where the pool
        /// has too few.
        Huge2M = "2m",
        /// `"1g"`: 1 GiB hugetlbfs pages for buffers of at least 1 GiB,
        /// else as `"2m"`.
        Huge1G = "1g",
    }
}

named! {
    /// `transports/tcp/backend`: how each worker drives its TCP
    /// connections.
    pub enum TcpBackend {
        /// `"auto"`: io_uring where the kernel offers it, else epoll.
        Auto = "auto",
        /// `"io_uring"`: the worker's own io_uring; the engine fails to
        /// start where the kernel refuses one.
        IoUring = "io_uring",
        /// `"epoll"`: non-blocking sockets on the worker's epoll set.
        Epoll = "epoll",
    }
}

named! {
    /// `metadata_type`: where an engine finds its peers.
    pub enum MetadataType {
        /// `"p2p"`: a peer is named by its `ip:port` and asked directly.
        P2p = "p2p",
        /// `"etcd"`: engines publish their descriptors in etcd under their
        /// segment names, with a lease they keep alive.
        Etcd = "etcd",
    }
}

/// Why a configuration was rejected. Every variant names the file (or
/// `TENT_CONF (inline)`) and, where one is at fault, the full key path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("{file}: not valid JSON: {msg}")]
    Parse {
        /// The file.
        file: String,
        /// The parser's message, with line and column.
        msg: String,
    },
    /// A key the schema does not know.
    #[error("{file}: unknown key \"{key}\": expected {expected}")]
    UnknownKey {
        /// The file.
        file: String,
        /// Full key path, e.g. `transports/rdma/rail_cooldwn_secs`.
        key: String,
        /// The keys known at that level and the closest match.
        expected: String,
    },
    /// A known key with a value of the wrong JSON type.
    #[error("{file}: key \"{key}\": expected {expected}, found {found}")]
    Type {
        /// The file.
        file: String,
        /// Full key path (array elements as `key[i]`).
        key: String,
        /// The type the schema wants.
        expected: &'static str,
        /// The JSON type found and the value, truncated.
        found: String,
    },
    /// A known key whose value is outside its range.
    #[error("{file}: key \"{key}\": value {value} is out of range (allowed: {allowed})")]
    Range {
        /// The file.
        file: String,
        /// Full key path (array elements as `key[i]`).
        key: String,
        /// The value as written.
        value: String,
        /// The allowed range.
        allowed: String,
    },
    /// A value the type and range allow but the engine cannot use: a
    /// non-power-of-two ring depth, an unknown enum name, keys that
    /// contradict each other.
    #[error("{file}: key \"{key}\": {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// Full key path.
        key: String,
        /// What is wrong and what would be accepted.
        reason: String,
    },
}

/// One key of the schema, as listed by [`Config::schema`].
#[derive(Debug)]
#[non_exhaustive]
pub struct KeySpec {
    /// Full key path, e.g. `transports/rdma/rail_cooldown_secs`.
    pub path: &'static str,
    /// The JSON type expected: `"unsigned integer"`, `"number"`, `"bool"`,
    /// `"string"`, `"array of numbers"`, `"array of unsigned integers"`.
    pub ty: &'static str,
    /// The default, as JSON text.
    pub default: &'static str,
    /// Whether a feature acts on this key yet; if not, the key is accepted
    /// and a warning is logged once per process.
    pub in_effect: bool,
    /// What the key does, with its allowed values.
    pub doc: &'static str,
    kind: Kind,
}

impl KeySpec {
    /// The values allowed, e.g. `1..=300 s` or `static, least_loaded,
    /// capacity`.
    pub fn allowed(&self) -> String {
        self.kind.allowed()
    }

    /// The environment variable that sets this key under [`Config::load`],
    /// e.g. `TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS`.
    pub fn env_var(&self) -> String {
        env::var_name(self.path)
    }
}

/// What a key's value must look like.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Bool,
    Uint {
        min: u64,
        max: u64,
    },
    /// An unsigned integer in range that must also be a power of two.
    PowerOfTwo {
        min: u64,
        max: u64,
    },
    /// A whole number of `unit`s, `min..=max` of them.
    Duration {
        unit: Unit,
        min: u64,
        max: u64,
    },
    Float(FloatRange),
    FloatArray {
        each: FloatRange,
        min_len: usize,
        max_len: usize,
    },
    UintArray {
        max: u64,
        max_len: usize,
    },
    Str(StrRule),
    /// A string that must be one of these names.
    Choice(&'static [&'static str]),
    /// RDMA device names: an array of strings, or one string of names
    /// separated by commas (TENT's spelling).
    Devices,
    /// etcd endpoints: an array of `host:port` strings, or one string of
    /// them separated by commas.
    Endpoints,
    /// `"auto"` or a byte (a number, or a string of digits) in
    /// `min..=max`: what it is.
    AutoOrByte {
        /// What the byte is, for the error.
        what: &'static str,
        /// Smallest allowed.
        min: u8,
        /// Largest allowed.
        max: u8,
    },
}

/// The unit of a duration key, named in the key (`_secs`, `_ms`, `_us`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Secs,
    Millis,
    Micros,
}

impl Unit {
    fn of(self, n: u64) -> Duration {
        match self {
            Unit::Secs => Duration::from_secs(n),
            Unit::Millis => Duration::from_millis(n),
            Unit::Micros => Duration::from_micros(n),
        }
    }

    /// `d` in whole units, `None` when it is not a whole number of them or
    /// too many for a `u64`.
    fn count(self, d: Duration) -> Option<u64> {
        let per = self.of(1).as_nanos();
        let nanos = d.as_nanos();
        (nanos % per == 0)
            .then(|| u64::try_from(nanos / per).ok())
            .flatten()
    }

    fn symbol(self) -> &'static str {
        match self {
            Unit::Secs => "s",
            Unit::Millis => "ms",
            Unit::Micros => "us",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct FloatRange {
    min: f64,
    /// False for ranges like "> 0" where the bound itself is meaningless
    /// (a zero penalty or bandwidth would divide by zero downstream).
    min_inclusive: bool,
    max: f64,
}

#[derive(Debug, Clone, Copy)]
enum StrRule {
    NonEmpty,
    /// Empty, or at least 16 bytes (a shared secret worth the name).
    EmptyOrSecret,
    AbsolutePath,
    /// Empty, or a POSIX shared-memory name (`shm_open` wants a leading `/`).
    EmptyOrShmName,
    /// Any string, never echoed (a password someone else chose).
    Password,
    /// 1 to 128 bytes of printable ASCII with no space (an etcd key prefix).
    KeyPrefix,
    /// Empty, or what [`StrRule::KeyPrefix`] allows.
    EmptyOrKeyName,
    /// Empty, or an absolute path.
    EmptyOrAbsolutePath,
}

/// An etcd endpoint (`host:port`, `http://host:port[/]` or
/// `https://host:port[/]`) as the base URL the client talks to, or why it
/// is not one (what `metadata_servers` is checked with).
pub(crate) fn etcd_endpoint_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim().trim_end_matches('/');
    let (scheme, rest) = match e.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some((scheme, _)) if !endpoint.contains('@') => {
            return Err(format!(
                "endpoint {endpoint:?}: scheme {scheme:?} is not supported (http or https)"
            ));
        }
        Some(_) => {
            return Err(
                "an endpoint with user info (not shown) and a scheme other than http or https"
                    .to_owned(),
            );
        }
        None => ("http", e),
    };
    let ok = !rest.is_empty()
        && rest.len() <= 255
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b));
    if !ok {
        // User info (user:password@) is not echoed.
        let shown = match endpoint.contains('@') {
            true => "(an endpoint with user info, not shown)".to_owned(),
            false => format!("{endpoint:?}"),
        };
        return Err(format!(
            "endpoint {shown} is not host:port (etcd's user and password go in metadata_user and metadata_password)"
        ));
    }
    Ok(format!("{scheme}://{rest}"))
}

/// Most etcd endpoints `metadata_servers` may name.
const MAX_ENDPOINTS: usize = 32;

/// Most RDMA devices `transports/rdma/devices` may name.
const MAX_DEVICES: usize = 64;
/// Longest RDMA device name (the kernel's `IB_DEVICE_NAME_MAX` is 64 with
/// its NUL).
const MAX_DEVICE_NAME: usize = 63;

/// A POSIX shared-memory name: `/` then 1 to 254 bytes with no `/` or
/// NUL, and not `.` or `..` (it names a file directly in `/dev/shm`).
pub fn is_shm_name(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('/') else {
        return false;
    };
    !rest.is_empty() && s.len() <= 255 && !rest.contains(['/', '\0']) && rest != "." && rest != ".."
}

/// An RDMA device name as the kernel spells one: 1 to 63 bytes of
/// `[A-Za-z0-9_.-]`.
fn is_device_name(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= MAX_DEVICE_NAME
        && d.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

impl Kind {
    const fn type_name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Uint { .. } | Kind::PowerOfTwo { .. } | Kind::Duration { .. } => {
                "unsigned integer"
            }
            Kind::Float(_) => "number",
            Kind::FloatArray { .. } => "array of numbers",
            Kind::UintArray { .. } => "array of unsigned integers",
            Kind::Str(_) | Kind::Choice(_) => "string",
            Kind::Devices | Kind::Endpoints => "array of strings, or a string",
            Kind::AutoOrByte { .. } => "\"auto\" or unsigned integer",
        }
    }

    /// The values allowed, for the key table.
    fn allowed(self) -> String {
        match self {
            Kind::Bool => "true, false".to_owned(),
            Kind::Uint { min, max } => format!("{min}..={max}"),
            Kind::PowerOfTwo { min, max } => format!("a power of two in {min}..={max}"),
            Kind::Duration { unit, min, max } => format!("{min}..={max} {}", unit.symbol()),
            Kind::Float(r) => r.describe(),
            Kind::FloatArray {
                each,
                min_len,
                max_len,
            } => format!("{min_len} to {max_len} entries, each {}", each.describe()),
            Kind::UintArray { max, max_len } => {
                format!("at most {max_len} entries, each 0..={max}")
            }
            Kind::Str(StrRule::NonEmpty) => "not empty".to_owned(),
            Kind::Str(StrRule::EmptyOrSecret) => "empty, or at least 16 bytes".to_owned(),
            Kind::Str(StrRule::AbsolutePath) => "an absolute path".to_owned(),
            Kind::Str(StrRule::EmptyOrShmName) => {
                "empty, or a shared-memory name (/name)".to_owned()
            }
            Kind::Str(StrRule::Password) => "any string".to_owned(),
            Kind::Str(StrRule::EmptyOrAbsolutePath) => "empty, or an absolute path".to_owned(),
            Kind::Str(StrRule::EmptyOrKeyName) => {
                "empty, or 1 to 128 bytes of printable ASCII, no space".to_owned()
            }
            Kind::Str(StrRule::KeyPrefix) => {
                "1 to 128 bytes of printable ASCII, no space".to_owned()
            }
            Kind::Endpoints => format!("at most {MAX_ENDPOINTS} host:port endpoints"),
            Kind::Choice(names) => names.join(", "),
            Kind::Devices => format!(
                "at most {MAX_DEVICES} device names of [A-Za-z0-9_.-], 1 to {MAX_DEVICE_NAME} bytes each"
            ),
            Kind::AutoOrByte { min, max, .. } => format!("\"auto\", {min}..={max}"),
        }
    }
}

const fn uint(min: u64, max: u64) -> Kind {
    Kind::Uint { min, max }
}

const fn secs(min: u64, max: u64) -> Kind {
    Kind::Duration {
        unit: Unit::Secs,
        min,
        max,
    }
}

const fn millis(min: u64, max: u64) -> Kind {
    Kind::Duration {
        unit: Unit::Millis,
        min,
        max,
    }
}

const fn micros(min: u64, max: u64) -> Kind {
    Kind::Duration {
        unit: Unit::Micros,
        min,
        max,
    }
}

const fn float(min: f64, max: f64) -> Kind {
    Kind::Float(FloatRange {
        min,
        min_inclusive: true,
        max,
    })
}

const fn positive(max: f64) -> Kind {
    Kind::Float(FloatRange {
        min: 0.0,
        min_inclusive: false,
        max,
    })
}

/// A value of a key's type, on its way into a struct field or out of one.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bool(bool),
    Uint(u64),
    Duration(Duration),
    Float(f64),
    Str(String),
    Strs(Vec<String>),
    Floats(Vec<f64>),
    Uints(Vec<u64>),
    AutoOrByte(Option<u8>),
}

/// How a [`Val`] lands in a struct field and comes back out.
trait Field {
    /// False when the schema gave this field a kind of the wrong shape (a
    /// schema bug, caught by the tests that load every default and maximum).
    fn assign(&mut self, val: Val) -> bool;
    fn to_val(&self) -> Val;
}

/// `Field` for a type that one `Val` variant holds as it is.
macro_rules! plain_field {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl Field for $t {
            fn assign(&mut self, val: Val) -> bool {
                match val {
                    Val::$variant(v) => {
                        *self = v;
                        true
                    }
                    _ => false,
                }
            }
            fn to_val(&self) -> Val {
                Val::$variant(self.clone())
            }
        }
    )*};
}
plain_field!(
    bool => Bool,
    Duration => Duration,
    f64 => Float,
    String => Str,
    Vec<String> => Strs,
    Vec<f64> => Floats,
);

macro_rules! uint_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn assign(&mut self, val: Val) -> bool {
                match val {
                    Val::Uint(n) => <$t>::try_from(n).map(|n| *self = n).is_ok(),
                    _ => false,
                }
            }
            fn to_val(&self) -> Val {
                Val::Uint(u64::from(*self))
            }
        }
    )*};
}
uint_field!(u8, u16, u32, u64);

impl Field for Secret {
    fn assign(&mut self, val: Val) -> bool {
        match val {
            Val::Str(s) => {
                *self = Secret::from(s);
                true
            }
            _ => false,
        }
    }
    fn to_val(&self) -> Val {
        Val::Str(self.expose().to_owned())
    }
}

impl Field for Vec<usize> {
    fn assign(&mut self, val: Val) -> bool {
        match val {
            Val::Uints(v) => v
                .into_iter()
                .map(usize::try_from)
                .collect::<Result<Vec<usize>, _>>()
                .map(|v| *self = v)
                .is_ok(),
            _ => false,
        }
    }
    fn to_val(&self) -> Val {
        // usize is at most 64 bits on every target tent builds for.
        Val::Uints(self.iter().map(|&n| n as u64).collect())
    }
}

/// The machine half of a schema entry; `RULES[i]` belongs to `SPECS[i]`.
struct Rule {
    kind: Kind,
    set: fn(&mut Config, Val) -> bool,
    get: fn(&Config) -> Val,
}

const LIVE: bool = true;
const LATER: bool = false;

/// Expands one line per key into the public `SPECS` table and the private
/// `RULES` table, in the same order, so they cannot drift apart.
/// The keys `Engine::reload` applies while the engine runs; every other
/// key needs a restart (a reload that changes one is refused, naming it).
pub const RELOADABLE: &[&str] = &[
    "log_level",
    "max_failover_attempts",
    "transports/rdma/priority_promotion_timeout_us",
    "transports/rdma/rail_error_threshold",
    "transports/rdma/rail_error_window_secs",
    "transports/rdma/rail_cooldown_secs",
    "transports/rdma/rail_backoff_decay_secs",
    "transports/rdma/slot_rotation_interval_ms",
    "transports/rdma/enable_priority_filtering",
    "transports/rdma/local_rotation_interval_us",
    "transports/rdma/enable_smart_scheduling",
    "transports/rdma/numa_penalties",
    "transports/rdma/bandwidth_learning_rate",
    "transports/rdma/ewma_min_bandwidth_multiplier",
    "transports/rdma/ewma_max_bandwidth_multiplier",
    "transports/rdma/score_jitter_range",
    "transports/rdma/score_epsilon",
    "transports/rdma/max_slice_count",
];

/// Does `Engine::reload` apply `path` while the engine runs?
pub fn reloadable(path: &str) -> bool {
    RELOADABLE.contains(&path)
}

macro_rules! schema {
    ($( $path:literal => $($field:ident).+ : $kind:expr, $default:literal, $effect:expr, $doc:literal; )*) => {
        static SPECS: &[KeySpec] = &[$(
            KeySpec {
                path: $path,
                ty: $kind.type_name(),
                default: $default,
                in_effect: $effect,
                doc: $doc,
                kind: $kind,
            },
        )*];
        static RULES: &[Rule] = &[$(
            Rule {
                kind: $kind,
                set: |c, v| Field::assign(&mut c.$($field).+, v),
                get: |c| Field::to_val(&c.$($field).+),
            },
        )*];
    };
}

schema! {
    // engine
    "block_size" => block_size: uint(64, 1 << 30), "65536", LIVE,
        "Slice size in bytes; requests larger than this are split into slices.";
    "default_timeout_ms" => default_timeout_ms: millis(1, 86_400_000), "30000", LIVE,
        "Per-operation deadline in ms when the SQE carries none.";
    "max_timeout_ms" => max_timeout_ms: millis(1, 86_400_000), "3600000", LIVE,
        "The furthest deadline in ms an operation's SQE may ask for, from when it is taken: one further is refused InvalidArgument. Bounds how long unregister_memory and close_segment can wait on an op in flight. Taken as default_timeout_ms when smaller.";
    "ring_depth" => ring_depth: Kind::PowerOfTwo { min: 2, max: 1 << 20 }, "1024", LIVE,
        "Entries per submission/completion ring; a power of two.";
    "max_batch_size" => max_batch_size: uint(1, 1 << 20), "4096", LIVE,
        "Tasks per batch.";
    "max_batches" => max_batches: uint(1, 1 << 20), "1024", LIVE,
        "Batches that may be allocated at once.";
    "max_tasks_per_worker" => max_tasks_per_worker: uint(16, 1 << 20), "4096", LIVE,
        "Task-table capacity of one worker.";
    "max_inflight_slices" => max_inflight_slices: uint(1, 1 << 20), "256", LIVE,
        "Credit-pool size per worker per transport: slices posted and not yet completed.";
    "inline_max_bytes" => inline_max_bytes: uint(0, 1 << 20), "4096", LIVE,
        "Largest ring op in bytes that the submitting thread performs itself (inline issue, as io_uring issues a request in the submitter's context): a READ or WRITE of at most one slice on the local or shm transport, pushed while nothing of its ring waits at the worker and the slot gate is open to its priority, is staged by SubmissionQueue::push and copied by Ring::submit (HIGH first, then MEDIUM, then LOW) on the calling thread, its CQE there when submit returns, with no crossing to the worker's core; anything else goes to the worker. 0 turns inline issue off for the engine; Ring::set_inline(false) (tent_ring_set_inline, Ring.set_inline) turns it off for one ring, for a thread that must never spend its time copying.";
    "inline_max_in_flight" => inline_max_in_flight: uint(1, 1 << 20), "8", LIVE,
        "The most ops of a ring issued inline at once (staged for a submit, or completed and not yet reaped): an op pushed past it, and those staged before it, go to the worker, whose core then works beside the submitting thread. One thread doing every copy wins while few ops are in flight (8 B shm: 1.7x the worker path at 1 to 4 in flight, 1.5x at 8 on a 2-core VM) and loses to two cores working side by side with a deep queue (0.9x at 16, 0.8x at 32).";
    "daemon_socket" => daemon_socket: Kind::Str(StrRule::EmptyOrAbsolutePath), "\"\"", LIVE,
        "Attach to the node's daemon (tentd) listening at this unix socket instead of starting an engine in this process: memory, rings and segments come from the daemon, and its workers serve this process's rings in shared memory. The daemon runs the node's one engine from its own configuration, so a client's configuration may set only daemon_socket, daemon_embed_fallback, daemon_client_name, ring_depth, max_batch_size, max_batches and log_level (any other key set is refused, naming it). Empty: embed an engine.";
    "daemon_embed_fallback" => daemon_embed_fallback: Kind::Bool, "false", LIVE,
        "With daemon_socket set: embed an engine (from this configuration) when no daemon answers at the socket, instead of failing Unreachable.";
    "daemon_client_name" => daemon_client_name: Kind::Str(StrRule::EmptyOrKeyName), "\"\"", LIVE,
        "With daemon_socket set: the name this process gives the daemon when it attaches. The daemon's weights may name it (tentd --weight name:NAME=W: its share of work within a priority against the other clients), and its /metrics and /health label this client with it. Empty: no name.";
    "max_failover_attempts" => max_failover_attempts: uint(0, 64), "3", LIVE,
        "Transport switches allowed per task; 0 disables cross-transport failover.";
    "merge_requests" => merge_requests: Kind::Bool, "true", LATER,
        "Merge adjacent requests of a batch into one transfer.";
    "hugepages" => hugepages: Kind::Choice(HugePages::NAMES), "\"transparent\"", LIVE,
        "The pages behind allocate_memory: transparent (base pages advised to become transparent huge pages from 2 MiB up), off (base pages), 2m or 1g (hugetlbfs pages from the reserved pool, /proc/sys/vm/nr_hugepages or the 1 GiB pool, the length rounded up to whole pages, not copied into a forked child; 1g for buffers of 1 GiB and more, falling back to 2m and either to transparent, logged once per cause and then counted). Regions exported over shm stay on shmem pages, advised as transparent (effective where /sys/kernel/mm/transparent_hugepage/shmem_enabled is advise or always): peers map only shmem files, since a hole in a hugetlbfs file would end a peer with SIGBUS.";
    "log_level" => log_level: Kind::Choice(LogLevel::NAMES), "\"info\"", LIVE,
        "One of trace, debug, info, warn, error: the tracing filter tent's own binaries (tent-bench) install, and the C library and the Python module install at a process's first engine, writing to stderr (once per process: a later engine asking for another level gets a warning; not at all when the process installed a tracing subscriber first; a TENT_LOG filter wins). An embedding Rust application installs its own subscriber. A reload sets the whole process's level where tent installed the subscriber (or the application registered a setter with tent::logging::control_level), and is refused, naming this key, where nothing can apply it or TENT_LOG decides.";
    // control plane
    "metadata_type" => metadata_type: Kind::Choice(MetadataType::NAMES), "\"p2p\"", LIVE,
        "Where an engine finds its peers: p2p (a segment is named by its control server's ip:port and asked directly) or etcd (each engine publishes its descriptor under its segment name in etcd, metadata_servers, with a lease it keeps alive; open_segment resolves a name there, and a watch tells the engine when a peer's lease expires or it restarted). Either way a peer's control server is then asked for its descriptor (authenticated with rpc_shared_secret when set).";
    "metadata_servers" => metadata_servers: Kind::Endpoints, "[]", LIVE,
        "etcd endpoints (host:port, or http://host:port), as an array or one string separated by commas: the first that answers healthy is used, the others when it fails. Required with metadata_type etcd.";
    "metadata_key_prefix" => metadata_key_prefix: Kind::Str(StrRule::KeyPrefix), "\"/tent\"", LIVE,
        "The etcd key prefix of this cluster: a segment is published at <prefix>/segments/<name>. Engines that should find each other use the same.";
    "metadata_lease_ttl_secs" => metadata_lease_ttl_secs: secs(2, 3600), "5", LIVE,
        "TTL in s of the etcd lease this engine's descriptor is published with, kept alive every third of it; once it lapses (the process died or hung, or lost etcd for that long) peers fail their work to this engine ProcessFailed.";
    "metadata_segment_name" => metadata_segment_name: Kind::Str(StrRule::EmptyOrKeyName), "\"\"", LIVE,
        "The name this engine publishes its segment under in etcd (peers pass it to open_segment); empty = its control server's ip:port. A restarted engine that takes the same name is the same peer to those that had it open: they reconnect to the new process. Only with metadata_type etcd.";
    "metadata_tls_ca_file" => metadata_tls_ca_file: Kind::Str(StrRule::EmptyOrAbsolutePath), "\"\"", LIVE,
        "PEM file of the CA(s) that signed the etcd members' certificates, for https:// endpoints in metadata_servers; empty = the public web roots.";
    "metadata_tls_cert_file" => metadata_tls_cert_file: Kind::Str(StrRule::EmptyOrAbsolutePath), "\"\"", LIVE,
        "PEM client certificate (chain) this engine shows an etcd that asks for one (etcd's --client-cert-auth); with metadata_tls_key_file.";
    "metadata_tls_key_file" => metadata_tls_key_file: Kind::Str(StrRule::EmptyOrAbsolutePath), "\"\"", LIVE,
        "PEM private key of metadata_tls_cert_file.";
    "metadata_user" => metadata_user: Kind::Str(StrRule::KeyPrefix), "\"root\"", LIVE,
        "etcd user, used when metadata_password is set.";
    "metadata_password" => metadata_password: Kind::Str(StrRule::Password), "\"\"", LIVE,
        "etcd password of metadata_user; empty = etcd without authentication.";
    "rpc_server_hostname" => rpc_server_hostname: Kind::Str(StrRule::NonEmpty), "\"127.0.0.1\"", LIVE,
        "Address the p2p handshake server listens on.";
    "rpc_server_port" => rpc_server_port: uint(0, 65535), "0", LIVE,
        "Port of the p2p handshake server; 0 picks an ephemeral port.";
    "rpc_shared_secret" => rpc_shared_secret: Kind::Str(StrRule::EmptyOrSecret), "\"\"", LIVE,
        "Shared secret for the control plane's HMAC challenge-response (never sent); empty = no authentication. A peer without it is refused.";
    "non_dumpable" => non_dumpable: Kind::Bool, "false", LIVE,
        "Make the engine's process non-dumpable (PR_SET_DUMPABLE 0) at start, so a same-uid process cannot open the registered memory's memfds through /proc/<pid>/fd (which bypasses rpc_shared_secret on this host). Also: same-uid perf and gdb can no longer attach, core dumps are off, and nothing else of the process can be read through /proc by its user.";
    // the HTTP endpoint
    "metrics/http_enable" => metrics.http_enable: Kind::Bool, "true", LIVE,
        "Serve /metrics (OpenMetrics text, which Prometheus scrapes), /metrics/json, /health (/health/live, /health/ready) and /topology over HTTP on the control plane's address (rpc_server_hostname), from one thread off the workers. With rpc_shared_secret set, every path but /health/live needs the bearer token derived from it (Engine::http_bearer_token).";
    "metrics/http_port" => metrics.http_port: uint(0, 65535), "9464", LIVE,
        "Port of the HTTP endpoint; 0 picks an ephemeral one. When the port is taken, an ephemeral one is used and a warning names it; the URL is in the log, in /health and in this engine's descriptor.";
    "metrics/max_labelled_peers" => metrics.max_labelled_peers: uint(0, 100_000), "64", LIVE,
        "Most peers (segments) with their own per-rail (tent_rail_*) and per-SQ (tent_sq_*) series in /metrics and metrics_text: those that carried the most bytes (ties: by name). The rest are summed into one series per family and transport (per QP slot for tent_sq_*) labelled segment, local and remote \"_other\": counters, occupancies and bandwidths add up, tent_rail_state and tent_rail_numa_tier take the worst, high watermarks the highest, ages the newest. Bounds the series a scraper stores however many peers connect; 0 sums every peer.";
    // workers
    "workers/count" => workers.count: uint(1, 256), "1", LIVE,
        "Number of worker threads.";
    "workers/cores" => workers.cores: Kind::UintArray { max: 4095, max_len: 4096 }, "[]", LIVE,
        "CPU ids (< 4096); worker i is pinned to cores[i % len]. Empty: chosen by topology.";
    "workers/pin" => workers.pin: Kind::Bool, "true", LIVE,
        "Pin workers to cores (to workers/cores, or cores chosen by topology).";
    "workers/spin_us" => workers.spin_us: micros(0, 1_000_000), "50", LIVE,
        "Busy-poll time in us after the last work before yielding.";
    "workers/yield_us" => workers.yield_us: micros(0, 10_000_000), "200", LIVE,
        "sched_yield phase in us before parking.";
    "workers/park_timeout_ms" => workers.park_timeout_ms: millis(1, 60_000), "100", LIVE,
        "Longest sleep in ms while parked, so deadlines are enforced on idle workers.";
    "workers/idle_poll_budget_pct" => workers.idle_poll_budget_pct: uint(0, 100), "25", LIVE,
        "Share of one core (percent, over each 100 ms) an idle worker may spend polling for work that regular arrivals predict: when ops come at a steady pace (gaps of 20 us to 20 ms, their deviation under a quarter of the gap), a worker with nothing to do, past its spin_us and yield_us, sleeps until just before the next is due and polls through the window the gaps predict, so the op finds it awake instead of paying a futex wake (tens of microseconds). Past the budget, or with irregular or no arrivals, it spins spin_us, yields yield_us and parks as before. 0 turns it off.";
    // transports/local, shm, tcp
    "transports/local/enable" => transports.local.enable: Kind::Bool, "true", LIVE,
        "Enable the in-process memcpy transport.";
    "transports/shm/enable" => transports.shm.enable: Kind::Bool, "true", LIVE,
        "Enable the cross-process shared-memory transport.";
    "transports/shm/dir" => transports.shm.dir: Kind::Str(StrRule::AbsolutePath), "\"/dev/shm\"", LIVE,
        "Absolute directory holding the shared-memory segment files.";
    "transports/shm/max_mapped_bytes_per_peer" => transports.shm.max_mapped_bytes_per_peer: uint(0, 1 << 57), "0", LIVE,
        "Bytes of one shm owner's regions this engine maps at most (each region costs its length plus a 4 KiB page of address space, populated or not); past it the owner's descriptor is refused OutOfMemory, nothing of it mapped, and ops on its new regions fail OutOfMemory. 0 = an eighth of the address space left at engine start (the lower of RLIMIT_AS and the 47-bit user space, less the process's VmSize).";
    "transports/shm/max_mapped_bytes" => transports.shm.max_mapped_bytes: uint(0, 1 << 57), "0", LIVE,
        "Bytes of every shm owner's regions this engine maps at most, all its peers together; past it a segment's new regions are refused OutOfMemory (retried once others are unmapped). 0 = a quarter of the address space left at engine start.";
    "transports/tcp/enable" => transports.tcp.enable: Kind::Bool, "true", LIVE,
        "Enable the TCP transport.";
    "transports/tcp/connections_per_peer" => transports.tcp.connections_per_peer: uint(1, 64), "4", LIVE,
        "TCP connections opened to each peer.";
    "transports/tcp/max_inflight_per_connection" => transports.tcp.max_inflight_per_connection: uint(1, 1024), "2", LIVE,
        "Bytes on the wire per TCP connection, counted in full slices of slice_size (more only fills socket buffers: 2 x 256 KiB measured 1.6x faster than 8 on loopback); smaller slices go up to 64 at once within the same bytes.";
    "transports/tcp/bulk_window_beside_high" => transports.tcp.bulk_window_beside_high: uint(0, 1 << 40), "524288", LIVE,
        "While HIGH slices flow to a peer over a rail (one posted by any worker within the last high_hold_us, give or take a sixteenth of it), the bulk (MEDIUM and LOW) bytes each worker keeps on the wire to it over that rail, all its connections together; a slice onto a wire with no bulk goes whatever its size, and new bulk takes one connection. A HIGH slice waits behind what the path and the target still hold of that bulk. On loopback (tent-bench --mode qos, 4 MiB LOW WRITEs through tentd), HIGH's median under load was 0.55 ms with no cap, 0.21 ms at 512 KiB and 0.10 ms at 256 KiB, LOW keeping 96%, 89% and 76% of its throughput. 0 = no cap: each connection keeps max_inflight_per_connection.";
    "transports/tcp/high_hold_us" => transports.tcp.high_hold_us: micros(1, 10_000_000), "10000", LIVE,
        "How long in us after a HIGH slice to a peer its rail's bulk stays within bulk_window_beside_high.";
    "transports/tcp/user_timeout_ms" => transports.tcp.user_timeout_ms: millis(0, 3_600_000), "10000", LIVE,
        "TCP_USER_TIMEOUT in ms; 0 keeps the OS default.";
    "transports/tcp/slice_size" => transports.tcp.slice_size: uint(4096, 1 << 30), "262144", LIVE,
        "Bytes per slice over TCP (each slice costs one request and one response).";
    "transports/tcp/backend" => transports.tcp.backend: Kind::Choice(TcpBackend::NAMES), "\"auto\"", LIVE,
        "How each worker drives its TCP connections: auto (its own io_uring where the kernel offers one, else epoll; the choice is logged once), io_uring (the engine fails to start where io_uring is missing, disabled by kernel.io_uring_disabled or refused by a seccomp profile), epoll (non-blocking sockets on an edge-triggered epoll set).";
    "transports/tcp/serving_threads" => transports.tcp.serving_threads: uint(0, 256), "0", LIVE,
        "Threads serving the target side of TCP, each driving any number of connections on its own io_uring (or epoll set); 0 = one per core available to the engine.";
    "transports/tcp/max_served_connections" => transports.tcp.max_served_connections: uint(0, 1 << 20), "0", LIVE,
        "TCP data connections the target serves at once (past it an unused one is evicted for a newcomer, or the newcomer is told BUSY); 0 = derived: half the open-file limit, and what a sixteenth of the available memory holds at 256 KiB a connection.";
    // transports/rdma: failover rails (seed 000)
    "transports/rdma/enable" => transports.rdma.enable: Kind::Bool, "true", LIVE,
        "Enable the RDMA transport (used when the machine has RDMA devices).";
    "transports/rdma/devices" => transports.rdma.devices: Kind::Devices, "[]", LIVE,
        "RDMA devices to open, e.g. [\"mlx5_0\", \"mlx5_1\"] (or TENT's \"mlx5_0,mlx5_1\"); empty = every device found.";
    "transports/rdma/gid_index" => transports.rdma.gid_index: Kind::AutoOrByte { what: "a GID index", min: 0, max: 255 }, "\"auto\"", LIVE,
        "GID table index (0..=255) used on every device, or \"auto\": on RoCE the RoCE v2 GID with an IPv4 address on a network device that is up, else v2 global IPv6, else v2 link-local, RoCE v1 only where the port lists no v2; on InfiniBand the port GID.";
    "transports/rdma/traffic_class" => transports.rdma.traffic_class: Kind::AutoOrByte { what: "a traffic class", min: 0, max: 255 }, "\"auto\"", LIVE,
        "Traffic class byte (DSCP << 2 | ECN) of RDMA packets, or \"auto\": the port's own (sysfs tc/<port>/traffic_class), else 106 on RoCE (DSCP 26, ECN capable) and 0 on InfiniBand.";
    "transports/rdma/service_level" => transports.rdma.service_level: uint(0, 15), "0", LIVE,
        "InfiniBand service level of RDMA packets (RoCE NICs may map it to an 802.1p priority).";
    "transports/rdma/slice_size" => transports.rdma.slice_size: uint(4096, 1 << 30), "65536", LIVE,
        "Bytes per RDMA slice (clamped to the devices' max message size).";
    "transports/rdma/qp_depth" => transports.rdma.qp_depth: uint(1, 1 << 16), "256", LIVE,
        "Send work requests per QP (clamped to the device's max_qp_wr).";
    "transports/rdma/rail_error_threshold" => transports.rdma.rail_error_threshold: uint(1, 1_000_000), "3", LIVE,
        "Failures inside rail_error_window_secs that pause a rail.";
    "transports/rdma/rail_error_window_secs" => transports.rdma.rail_error_window_secs: secs(1, 86_400), "10", LIVE,
        "Sliding window in s for counting rail errors.";
    "transports/rdma/rail_cooldown_secs" => transports.rdma.rail_cooldown_secs: secs(1, 300), "30", LIVE,
        "Initial cooldown in s of a paused rail; doubles per repeat failure, capped at 300 s.";
    "transports/rdma/rail_backoff_decay_secs" => transports.rdma.rail_backoff_decay_secs: secs(1, 86_400), "60", LIVE,
        "Healthy time in s that halves a rail's remembered cooldown (so a flapping rail pays a growing cooldown).";
    // transports/rdma: QoS (seed 001)
    "transports/rdma/enable_priority_filtering" => transports.rdma.enable_priority_filtering: Kind::Bool, "true", LIVE,
        "Priority-aware rail filtering (RDMA and TCP rails): a HIGH request's last (or only) slice binds at once to the least-loaded rail of its best NUMA tier, and bulk slices keep off that rail for local_rotation_interval_us.";
    "transports/rdma/local_rotation_interval_us" => transports.rdma.local_rotation_interval_us: micros(1, 10_000_000), "200", LIVE,
        "How long in us the rail HIGH last used stays HIGH's (bulk keeps off it while another rail is usable); HIGH re-picks the least-loaded rail per slice, so the held rail rotates with load.";
    "transports/rdma/priority_promotion_timeout_us" => transports.rdma.priority_promotion_timeout_us: micros(1, 60_000_000), "10000", LIVE,
        "Wait in us after which a queued MEDIUM/LOW request is promoted one priority level.";
    "transports/rdma/slot_rotation_interval_ms" => transports.rdma.slot_rotation_interval_ms: millis(1, 60_000), "2", LIVE,
        "Global QoS time-slot length in ms (a full cycle is three slots: HIGH only, HIGH + MEDIUM, all); every process sharing a slot file must use the same. A reload writes the new interval into the slot file: every participant follows it from its next tick, and a process that joins later must name it.";
    "transports/rdma/shared_quota_shm_path" => transports.rdma.shared_quota_shm_path: Kind::Str(StrRule::EmptyOrShmName), "\"\"", LIVE,
        "Shared-memory name (leading /, the file is /dev/shm/<name>) of the global slot clock every process naming it shares; empty = single-process mode (per-worker lanes only).";
    // transports/rdma: slice spraying (seed 003); every network transport's rails
    "transports/rdma/enable_smart_scheduling" => transports.rdma.enable_smart_scheduling: Kind::Bool, "true", LIVE,
        "EWMA-based rail selection for RDMA and TCP rails alike; false = round-robin within the best NUMA tier.";
    "transports/rdma/numa_penalties" => transports.rdma.numa_penalties: Kind::FloatArray {
            each: FloatRange { min: 0.0, min_inclusive: false, max: 1e6 }, min_len: 1, max_len: 16,
        }, "[1.0, 5.0, 10.0]", LIVE,
        "Score multiplier per NUMA tier (1 to 16 entries, each > 0).";
    "transports/rdma/bandwidth_learning_rate" => transports.rdma.bandwidth_learning_rate: float(0.0, 1.0), "0.01", LIVE,
        "EWMA weight of the old estimate: 0 = always the new sample, 1 = never learn.";
    "transports/rdma/ewma_min_bandwidth_multiplier" => transports.rdma.ewma_min_bandwidth_multiplier: positive(1000.0), "0.1", LIVE,
        "Lower clamp of the EWMA estimate, as a multiple of theoretical bandwidth; <= the max multiplier.";
    "transports/rdma/ewma_max_bandwidth_multiplier" => transports.rdma.ewma_max_bandwidth_multiplier: positive(1000.0), "10.0", LIVE,
        "Upper clamp of the EWMA estimate, as a multiple of theoretical bandwidth.";
    "transports/rdma/score_jitter_range" => transports.rdma.score_jitter_range: float(0.0, 1.0), "1e-9", LIVE,
        "Random jitter added to device scores to avoid deterministic ties.";
    "transports/rdma/score_epsilon" => transports.rdma.score_epsilon: positive(1.0), "1e-12", LIVE,
        "Small positive value that prevents division by zero in scoring.";
    "transports/rdma/default_bandwidth_gbps" => transports.rdma.default_bandwidth_gbps: positive(100_000.0), "400.0", LIVE,
        "Rail bandwidth in Gbps assumed when the port (ibv_query_port, /sys/class/net/<if>/speed) does not report one, or reports one outside [min, max].";
    "transports/rdma/min_bandwidth_gbps" => transports.rdma.min_bandwidth_gbps: positive(100_000.0), "10.0", LIVE,
        "Smallest plausible NIC bandwidth in Gbps.";
    "transports/rdma/max_bandwidth_gbps" => transports.rdma.max_bandwidth_gbps: positive(100_000.0), "800.0", LIVE,
        "Largest plausible NIC bandwidth in Gbps.";
    "transports/rdma/max_slice_count" => transports.rdma.max_slice_count: uint(1, 65_536), "64", LIVE,
        "A request is planned in windows of this many slices; a window of fewer than half of it goes to the single best rail, a larger one is split across rails by weight.";
    // transports/rdma: SQ flow control (seed 004, MORI_IO_SQ_* without the prefix)
    "transports/rdma/sq_backoff_timeout_us" => transports.rdma.sq_backoff_timeout_us: micros(0, 600_000_000), "1000000", LIVE,
        "How long in us an RDMA endpoint may hold posted requests with no completion before it counts as stalled: new slices go to other rails, its waiting slices move there too, and slices no rail can take fail SqFull (failed over), with the SQ/CQE counters logged once; 0 = never. MORI's 10 ms bounds a worker's blocking wait for credits; here nothing waits, and 1 s outlasts a signalled completion every qp_depth/2 requests on a slow link and the RC retry timer, so only a stall trips it.";
    "transports/rdma/sq_signal_interval_wr" => transports.rdma.sq_signal_interval_wr: uint(0, 65_536), "0", LIVE,
        "Signal every n-th work request within a posted list (the last of each list always is); 0 = every qp_depth/2-th.";
    "transports/rdma/sq_resume_watermark_wr" => transports.rdma.sq_resume_watermark_wr: uint(0, 1 << 20), "0", LIVE,
        "Free SQ slots needed before an endpoint posts again once a post found too little room (hysteresis, clamped to qp_depth); 0 = off.";
    "transports/rdma/sq_executor_admission" => transports.rdma.sq_executor_admission: Kind::Bool, "false", LIVE,
        "Admission gate for the batch API: a submit toward an RDMA peer is charged to the picked worker's endpoints to that peer (a work request per slice) and waits for posted + queued to fit their depth, so a slow peer backs up its submitters instead of the worker's task table. The ring API's back-pressure is its ring (push reports Full).";
    "transports/rdma/sq_admission_timeout_us" => transports.rdma.sq_admission_timeout_us: micros(1, 600_000_000), "1000000", LIVE,
        "Longest wait in us at the admission gate; then submit fails SqFull with nothing queued, naming the endpoint and its SQ/CQE counters.";
    "transports/rdma/sq_admission_resume_watermark_wr" => transports.rdma.sq_admission_resume_watermark_wr: uint(0, 1 << 20), "0", LIVE,
        "Hysteresis of the admission gate: a submit refused for room waits until its endpoint has this many free slots (clamped to qp_depth) before it tries again, so waiters do not wake for every single completion; 0 = off (it tries again as soon as its charge fits). MORI's default, 2048, exceeds a 256-deep queue and would mean waiting for an empty one.";
    "transports/rdma/sq_admission_wait_slice_us" => transports.rdma.sq_admission_wait_slice_us: micros(1, 1_000_000), "100", LIVE,
        "Longest single sleep in us of an admission wait (a release or a degrade wakes it sooner).";
    "transports/rdma/sq_admission_chunk_wr" => transports.rdma.sq_admission_chunk_wr: uint(0, 1 << 20), "0", LIVE,
        "Most work requests one submit is charged per peer; 0 = one endpoint's depth (or, under capacity, all of them).";
    "transports/rdma/sq_admission_max_chunks_per_call" => transports.rdma.sq_admission_max_chunks_per_call: uint(0, 65_536), "0", LIVE,
        "Most endpoints (QPs) one submit's charge to a peer is split over under the capacity policy, most free first; 0 = every active one. static and least_loaded charge one endpoint per call.";
    "transports/rdma/sq_split_policy" => transports.rdma.sq_split_policy: Kind::Choice(SplitPolicy::NAMES), "\"static\"", LIVE,
        "Which endpoint an admitted submit is charged to: static (round robin), least_loaded (fewest posted + queued, skipping terminal ones), capacity (split over the endpoints' free slots; needs sq_enable_experimental_capacity). Slices still bind to rails late, by the spraying policy.";
    "transports/rdma/sq_enable_experimental_capacity" => transports.rdma.sq_enable_experimental_capacity: Kind::Bool, "false", LIVE,
        "Allow the experimental capacity split policy.";
    "transports/rdma/qp_per_transfer" => transports.rdma.qp_per_transfer: Kind::AutoOrByte { what: "a QP count", min: 1, max: 16 }, "\"auto\"", LIVE,
        "QPs (endpoints) each worker keeps per rail to a peer; auto: 2 where the peer's rails are RoCE (two flows hash onto two ECMP paths), 1 on InfiniBand. The rail layer picks the rail, sq_split_policy picks the rail's QP for each slice (static: round robin; least_loaded: fewest posted + queued; capacity: the current QP while it has free slots, so consecutive slices post as one list), and a QP that goes terminal or stalls hands its work to a sibling QP of the same rail first.";
}

/// Keys already reported as "not yet in effect", so each is logged once per
/// process however often configurations are loaded.
static WARNED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

impl Default for Config {
    fn default() -> Config {
        static DEFAULT: OnceLock<Config> = OnceLock::new();
        DEFAULT.get_or_init(build_default).clone()
    }
}

impl Default for WorkersConfig {
    fn default() -> WorkersConfig {
        Config::default().workers
    }
}

impl Default for TransportsConfig {
    fn default() -> TransportsConfig {
        Config::default().transports
    }
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        Config::default().transports.local
    }
}

impl Default for ShmConfig {
    fn default() -> ShmConfig {
        Config::default().transports.shm
    }
}

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        Config::default().transports.tcp
    }
}

impl Default for RdmaConfig {
    fn default() -> RdmaConfig {
        Config::default().transports.rdma
    }
}

/// Every key's default, written over a blank configuration: the defaults
/// live only in the schema.
fn build_default() -> Config {
    let mut cfg = Config {
        source: DEFAULT_SOURCE.to_owned(),
        ..Config::blank()
    };
    for (spec, rule) in SPECS.iter().zip(RULES) {
        // A bad default is a schema bug that the `every_default_is_accepted`
        // test catches; at run time the placeholder is kept and reported
        // rather than taking the process down.
        let applied = serde_json::from_str::<Value>(spec.default)
            .ok()
            .and_then(|v| check_value(rule.kind, spec.path, &v, DEFAULT_SOURCE).ok())
            .is_some_and(|val| (rule.set)(&mut cfg, val));
        if !applied {
            tracing::error!(
                key = spec.path,
                default = spec.default,
                "config schema default rejected"
            );
        }
    }
    cfg
}

impl Config {
    /// `rpc_shared_secret`, `None` when it is empty (no authentication).
    pub fn shared_secret(&self) -> Option<&Secret> {
        (!self.rpc_shared_secret.is_empty()).then_some(&self.rpc_shared_secret)
    }

    /// [`shared_secret`](Self::shared_secret) as the bytes every door
    /// checks.
    pub fn secret(&self) -> Option<&[u8]> {
        self.shared_secret().map(|s| s.expose().as_bytes())
    }

    /// Entries of each worker's batch submission ring: room for the largest
    /// batch (`max_batch_size`) in one all-or-nothing `Engine::submit`, and
    /// never less than `ring_depth` (a power of two either way).
    pub fn batch_ring_depth(&self) -> u32 {
        self.ring_depth.max(
            self.max_batch_size
                .checked_next_power_of_two()
                .unwrap_or(1 << 31),
        )
    }

    /// Parses and validates JSON text; `source` names it in errors and
    /// becomes [`Config::source`]. Keys left out keep their defaults.
    pub fn from_json_str(text: &str, source: &str) -> Result<Config, ConfigError> {
        Config::checked(Config::layer_from_json(text, source)?)
    }

    /// A layer read, each key checked alone; the checks across keys wait
    /// for the last layer (`checked`).
    fn layer_from_json(text: &str, source: &str) -> Result<Layer, ConfigError> {
        let value: Value = json::parse(text).map_err(|e| ConfigError::Parse {
            file: source.to_owned(),
            msg: e.to_string(),
        })?;
        let (cfg, later) = Config::keys_from_value(&value, source)?;
        Ok(Layer { cfg, later })
    }

    /// The last layer in: the checks across keys, named by the whole
    /// source, and the warning for keys not in effect.
    fn checked(layer: Layer) -> Result<Config, ConfigError> {
        let Layer { cfg, later } = layer;
        cross_check(&cfg, &cfg.source)?;
        warn_not_in_effect(&later, &cfg.source);
        tracing::debug!(source = %cfg.source, "configuration loaded");
        Ok(cfg)
    }

    /// Every key of `value` checked alone, over the defaults.
    fn keys_from_value(
        value: &Value,
        source: &str,
    ) -> Result<(Config, Vec<&'static str>), ConfigError> {
        let Value::Object(map) = value else {
            return Err(ConfigError::Type {
                file: source.to_owned(),
                key: "(top level)".to_owned(),
                expected: "object",
                // Its type only: a whole config's text holds the secret.
                found: type_name(value).to_owned(),
            });
        };
        let mut cfg = Config {
            source: source.to_owned(),
            ..Config::default()
        };
        let mut later = Vec::new();
        walk(map, "", source, &mut cfg, &mut later)?;
        Ok((cfg, later))
    }

    /// Check a configuration built in code (its fields are public) as a
    /// file's is checked: each field against its key's range and rules,
    /// then the checks across keys. `Engine::new` runs it, so
    /// `workers/count` 0 or `block_size` 0 set in code is refused, as it is
    /// from JSON, instead of panicking or spinning later.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let source = if self.source.is_empty() {
            "Config (built in code)"
        } else {
            self.source.as_str()
        };
        for (spec, rule) in SPECS.iter().zip(RULES) {
            check_val(rule.kind, spec.path, &(rule.get)(self), None, source)?;
        }
        cross_check(self, source)
    }

    /// Reads and validates a JSON file; errors name `path`.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        Config::checked(Config::layer_from_file(path)?)
    }

    fn layer_from_file(path: &Path) -> Result<Layer, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: file.clone(),
            source,
        })?;
        Config::layer_from_json(&text, &file)
    }

    /// Reads `TENT_CONF`: unset gives `Ok(None)`; a value that starts with
    /// `{` (after trimming) is inline JSON (source `"TENT_CONF (inline)"`);
    /// anything else is a file path.
    pub fn from_env() -> Result<Option<Config>, ConfigError> {
        Config::from_env_value(std::env::var_os(ENV_VAR).as_deref())
    }

    /// The configuration an engine takes when given none, in layers: the
    /// defaults, then `TENT_CONF` ([`Config::from_env`]: a file or inline
    /// JSON), then one environment variable per key, `TENT_` and the key's
    /// path in capitals with `/` as `_` (e.g.
    /// `TENT_TRANSPORTS_RDMA_RAIL_COOLDOWN_SECS=5`), with the same type and
    /// range checks as a file and errors that name the variable. A string
    /// key takes the variable's text as it is; an array may be written
    /// `1,2` or `[1,2]`. `TENT_CONF` and `TENT_LOG` are no keys; another
    /// `TENT_*` variable spelled close to a key's is warned about once.
    /// [`Config::source`] lists the variables applied. The checks across
    /// keys run once, on the result. A configuration given whole
    /// ([`Config::from_path_or_json`], a binding's path or dict) takes no
    /// variables.
    pub fn load() -> Result<Config, ConfigError> {
        Config::from_layers(std::env::var_os(ENV_VAR).as_deref(), std::env::vars_os())
    }

    /// [`Config::load`] over the given `TENT_CONF` value and environment,
    /// so tests need not mutate the process environment.
    fn from_layers(
        conf: Option<&std::ffi::OsStr>,
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Config, ConfigError> {
        let mut layer = match conf {
            Some(v) => Config::layer_from_path_or_json(v, INLINE_SOURCE)?,
            None => Layer {
                cfg: Config::default(),
                later: Vec::new(),
            },
        };
        let over = env::apply(&mut layer.cfg, vars)?;
        env::warn_near_misses(&over.near_misses);
        if !over.applied.is_empty() {
            layer.cfg.source = format!("{}, then {}", layer.cfg.source, over.applied.join(", "));
            layer.later.extend(over.later);
        }
        Config::checked(layer)
    }

    /// Every known key with its type, default (JSON text), whether it is in
    /// effect, and what it does.
    pub fn schema() -> &'static [KeySpec] {
        SPECS
    }

    /// The schema as a Markdown table, one row per key: path, environment
    /// variable, type, allowed values, default, whether it is in effect,
    /// and what it does. What `tent-bench --print-config` prints and
    /// `docs/CONFIG.md` holds.
    pub fn key_table() -> String {
        let mut out = String::from(
            "| Key | Variable | Type | Allowed | Default | In effect | Reload | What it does |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for spec in SPECS {
            let cell = |s: &str| s.replace('|', "\\|");
            out.push_str(&format!(
                "| `{}` | `{}` | {} | {} | `{}` | {} | {} | {} |\n",
                spec.path,
                spec.env_var(),
                cell(spec.ty),
                cell(&spec.allowed()),
                spec.default,
                if spec.in_effect { "yes" } else { "not yet" },
                if reloadable(spec.path) {
                    "yes"
                } else {
                    "restart"
                },
                cell(spec.doc),
            ));
        }
        out
    }

    /// Set key `path` to its value in `from` (a key of the schema).
    pub(crate) fn copy_key(&mut self, from: &Config, path: &str) {
        if let Some((_, rule)) = SPECS.iter().zip(RULES).find(|(s, _)| s.path == path) {
            let set = (rule.set)(self, (rule.get)(from));
            debug_assert!(set, "{path}: a value read from a config fits it");
        }
    }

    /// The keys whose values differ between `self` and `other`, in
    /// schema order.
    pub fn changed_keys(&self, other: &Config) -> Vec<&'static str> {
        SPECS
            .iter()
            .zip(RULES)
            .filter(|(_, rule)| (rule.get)(self) != (rule.get)(other))
            .map(|(spec, _)| spec.path)
            .collect()
    }

    /// This configuration as JSON, every known key present; feeding it back
    /// to [`Config::from_json_str`] gives an equal configuration (up to
    /// `source`).
    pub fn to_json(&self) -> Value {
        let mut root = Map::new();
        for (spec, rule) in SPECS.iter().zip(RULES) {
            insert_path(
                &mut root,
                spec.path,
                val_to_json(rule.kind, (rule.get)(self)),
            );
        }
        Value::Object(root)
    }

    /// The environment value, split out so tests need not mutate the
    /// process environment (which races with C code reading it, e.g. hwloc).
    fn from_env_value(value: Option<&std::ffi::OsStr>) -> Result<Option<Config>, ConfigError> {
        value
            .map(|v| Config::from_path_or_json(v, INLINE_SOURCE))
            .transpose()
    }

    /// TENT's one config argument: inline JSON (text that starts with `{`,
    /// named `source` in errors) or the path of a JSON file. What
    /// `TENT_CONF` and the bindings' `TransferEngine(config_path)` take.
    pub fn from_path_or_json(
        value: impl AsRef<std::ffi::OsStr>,
        source: &str,
    ) -> Result<Config, ConfigError> {
        Config::checked(Config::layer_from_path_or_json(value.as_ref(), source)?)
    }

    fn layer_from_path_or_json(
        value: &std::ffi::OsStr,
        source: &str,
    ) -> Result<Layer, ConfigError> {
        let text = value.to_string_lossy();
        // A byte-order mark is no path character either.
        let trimmed = text.trim_start_matches('\u{feff}').trim();
        // Text that is JSON, or meant to be (a quote, a line break, an
        // array), is parsed as such: taken for a path, a failed read would
        // echo it whole, secret included.
        let inline = trimmed.starts_with(['{', '[', '"'])
            || trimmed.contains(['"', '\n'])
            || trimmed.len() > 4096;
        if inline {
            Config::layer_from_json(trimmed, source)
        } else {
            Config::layer_from_file(Path::new(value))
        }
    }
}

/// A configuration read from one source, each key checked alone, and the
/// keys it set that are not in effect.
struct Layer {
    cfg: Config,
    later: Vec<&'static str>,
}

fn walk(
    map: &Map<String, Value>,
    prefix: &str,
    file: &str,
    cfg: &mut Config,
    later: &mut Vec<&'static str>,
) -> Result<(), ConfigError> {
    for (name, value) in map {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        // A '/' inside a name would let a flattened key alias a nested one
        // and make the result depend on key order.
        let idx = if name.contains('/') || name.is_empty() {
            None
        } else {
            SPECS.iter().position(|s| s.path == path)
        };
        if let Some(i) = idx {
            set_key(i, value, file, cfg, later)?;
        } else if !name.contains('/') && !name.is_empty() && is_object_path(&path) {
            match value {
                Value::Object(inner) => walk(inner, &path, file, cfg, later)?,
                other => {
                    return Err(ConfigError::Type {
                        file: file.to_owned(),
                        key: path,
                        expected: "object",
                        found: describe(other),
                    });
                }
            }
        } else {
            return Err(unknown_key(prefix, name, path, file));
        }
    }
    Ok(())
}

/// Check `value` as key `SPECS[i]` and set it in `cfg`, noting the key in
/// `later` if no feature acts on it yet: what every source of keys does.
fn set_key(
    i: usize,
    value: &Value,
    file: &str,
    cfg: &mut Config,
    later: &mut Vec<&'static str>,
) -> Result<(), ConfigError> {
    let (spec, rule) = (&SPECS[i], &RULES[i]);
    let val = check_value(rule.kind, spec.path, value, file)?;
    if !(rule.set)(cfg, val) {
        return Err(ConfigError::Invalid {
            file: file.to_owned(),
            key: spec.path.to_owned(),
            reason: "internal error: the schema's type does not fit the field".to_owned(),
        });
    }
    if !spec.in_effect {
        later.push(spec.path);
    }
    Ok(())
}

fn warn_not_in_effect(later: &[&'static str], file: &str) {
    let mut warned = WARNED.lock();
    for &key in later {
        if warned.insert(key) {
            tracing::warn!(
                key = %key,
                file = %file,
                "config key not yet in effect: accepted, no behaviour attached yet"
            );
        }
    }
}

fn cross_check(cfg: &Config, file: &str) -> Result<(), ConfigError> {
    let invalid = |key: &str, reason: String| ConfigError::Invalid {
        file: file.to_owned(),
        key: key.to_owned(),
        reason,
    };
    if cfg.metadata_type == MetadataType::Etcd && cfg.metadata_servers.is_empty() {
        return Err(invalid(
            "metadata_servers",
            "metadata_type \"etcd\" needs at least one etcd endpoint (host:port)".to_owned(),
        ));
    }
    if cfg.metadata_tls_cert_file.is_empty() != cfg.metadata_tls_key_file.is_empty() {
        return Err(invalid(
            "metadata_tls_cert_file",
            "a client certificate needs its key (metadata_tls_key_file), and a key its certificate"
                .to_owned(),
        ));
    }
    if cfg.metadata_segment_name == "local" {
        return Err(invalid(
            "metadata_segment_name",
            "\"local\" names every engine's own segment; choose another name".to_owned(),
        ));
    }
    if cfg.metadata_segment_name.contains('#') {
        return Err(invalid(
            "metadata_segment_name",
            "'#' ends a segment name before a daemon client's mailbox (owner#mailbox); choose a name without it".to_owned(),
        ));
    }
    if cfg.metadata_type == MetadataType::P2p && !cfg.metadata_segment_name.is_empty() {
        return Err(invalid(
            "metadata_segment_name",
            "a p2p segment is named by its control server's ip:port; a name of one's own needs metadata_type \"etcd\"".to_owned(),
        ));
    }
    let r = &cfg.transports.rdma;
    if r.min_bandwidth_gbps > r.max_bandwidth_gbps {
        return Err(invalid(
            "transports/rdma/min_bandwidth_gbps",
            format!(
                "{} exceeds transports/rdma/max_bandwidth_gbps = {}",
                r.min_bandwidth_gbps, r.max_bandwidth_gbps
            ),
        ));
    }
    if !(r.min_bandwidth_gbps..=r.max_bandwidth_gbps).contains(&r.default_bandwidth_gbps) {
        return Err(invalid(
            "transports/rdma/default_bandwidth_gbps",
            format!(
                "{} lies outside [transports/rdma/min_bandwidth_gbps, transports/rdma/max_bandwidth_gbps] = [{}, {}]",
                r.default_bandwidth_gbps, r.min_bandwidth_gbps, r.max_bandwidth_gbps
            ),
        ));
    }
    if r.ewma_min_bandwidth_multiplier > r.ewma_max_bandwidth_multiplier {
        return Err(invalid(
            "transports/rdma/ewma_min_bandwidth_multiplier",
            format!(
                "{} exceeds transports/rdma/ewma_max_bandwidth_multiplier = {}",
                r.ewma_min_bandwidth_multiplier, r.ewma_max_bandwidth_multiplier
            ),
        ));
    }
    if r.sq_split_policy == SplitPolicy::Capacity && !r.sq_enable_experimental_capacity {
        return Err(invalid(
            "transports/rdma/sq_split_policy",
            "\"capacity\" is experimental and requires transports/rdma/sq_enable_experimental_capacity = true"
                .to_owned(),
        ));
    }
    Ok(())
}

/// One value from a file or a variable, type- and range-checked against
/// its kind.
fn check_value(kind: Kind, key: &str, v: &Value, file: &str) -> Result<Val, ConfigError> {
    let val = read_value(kind, key, v, file)?;
    check_val(kind, key, &val, Some(v), file)?;
    Ok(val)
}

/// A JSON value as a [`Val`] of `kind`'s type: the type check alone.
fn read_value(kind: Kind, key: &str, v: &Value, file: &str) -> Result<Val, ConfigError> {
    let type_err = |expected: &'static str, key: &str, v: &Value| ConfigError::Type {
        file: file.to_owned(),
        key: key.to_owned(),
        expected,
        // An etcd endpoint may carry user info: its value is never shown.
        found: match kind {
            Kind::Endpoints => "(an etcd endpoint value, not shown)".to_owned(),
            _ => describe(v),
        },
    };
    let array = || {
        v.as_array()
            .ok_or_else(|| type_err(kind.type_name(), key, v))
    };
    let uint = |key: &str, v: &Value| {
        v.as_u64()
            .ok_or_else(|| type_err("unsigned integer", key, v))
    };
    match kind {
        Kind::Bool => v
            .as_bool()
            .map(Val::Bool)
            .ok_or_else(|| type_err(kind.type_name(), key, v)),
        Kind::Uint { .. } | Kind::PowerOfTwo { .. } => uint(key, v).map(Val::Uint),
        // Every u64 of seconds, ms or us fits a Duration.
        Kind::Duration { unit, .. } => uint(key, v).map(|n| Val::Duration(unit.of(n))),
        Kind::Float(_) => v
            .as_f64()
            .map(Val::Float)
            .ok_or_else(|| type_err(kind.type_name(), key, v)),
        Kind::FloatArray { .. } => array()?
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_f64()
                    .ok_or_else(|| type_err("number", &format!("{key}[{i}]"), item))
            })
            .collect::<Result<_, _>>()
            .map(Val::Floats),
        Kind::UintArray { .. } => array()?
            .iter()
            .enumerate()
            .map(|(i, item)| uint(&format!("{key}[{i}]"), item))
            .collect::<Result<_, _>>()
            .map(Val::Uints),
        Kind::Str(rule) => match v.as_str() {
            Some(s) => Ok(Val::Str(s.to_owned())),
            // A secret's value is never echoed in an error, whatever its
            // type or length.
            None if matches!(rule, StrRule::EmptyOrSecret | StrRule::Password) => {
                Err(ConfigError::Type {
                    file: file.to_owned(),
                    key: key.to_owned(),
                    expected: kind.type_name(),
                    found: "(a secret that is not a string)".to_owned(),
                })
            }
            None => Err(type_err(kind.type_name(), key, v)),
        },
        Kind::Choice(_) => v
            .as_str()
            .map(|s| Val::Str(s.to_owned()))
            .ok_or_else(|| type_err(kind.type_name(), key, v)),
        Kind::Devices | Kind::Endpoints => match v {
            // TENT's spelling: one string, names separated by commas, each
            // trimmed; "" is no device named.
            Value::String(s) if s.trim().is_empty() => Ok(Val::Strs(Vec::new())),
            Value::String(s) => Ok(Val::Strs(
                s.split(',').map(|d| d.trim().to_owned()).collect(),
            )),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| type_err("string", &format!("{key}[{i}]"), item))
                })
                .collect::<Result<_, _>>()
                .map(Val::Strs),
            _ => Err(type_err(kind.type_name(), key, v)),
        },
        Kind::AutoOrByte { what, min, max } => {
            let index = match v {
                Value::String(s) if s == "auto" => return Ok(Val::AutoOrByte(None)),
                Value::String(s) => s.parse::<u64>().ok(),
                Value::Number(n) => n.as_u64(),
                _ => return Err(type_err(kind.type_name(), key, v)),
            };
            match index.map(u8::try_from) {
                Some(Ok(i)) if (min..=max).contains(&i) => Ok(Val::AutoOrByte(Some(i))),
                // An address handle holds 8 bits of a GID index and of a
                // traffic class: a larger one would name another.
                Some(_) => Err(range_error(kind, key, &v.to_string(), file)),
                None => Err(ConfigError::Invalid {
                    file: file.to_owned(),
                    key: key.to_owned(),
                    reason: format!(
                        "{}: must be \"auto\" or {what} {min}..={max}",
                        truncate(&v.to_string())
                    ),
                }),
            }
        }
    }
}

fn range_error(kind: Kind, key: &str, written: &str, file: &str) -> ConfigError {
    ConfigError::Range {
        file: file.to_owned(),
        key: key.to_owned(),
        value: truncate(written),
        allowed: kind.allowed(),
    }
}

/// The range and rule checks of one value, read from a file (`written` is
/// the value as written, for errors) or taken from a field.
fn check_val(
    kind: Kind,
    key: &str,
    val: &Val,
    written: Option<&Value>,
    file: &str,
) -> Result<(), ConfigError> {
    // How an error shows the value: as written, else as JSON.
    let shown = |written: Option<&Value>, val: Val| {
        truncate(
            &written
                .cloned()
                .unwrap_or_else(|| val_to_json(kind, val))
                .to_string(),
        )
    };
    let range =
        |key: &str, written: Option<&Value>, val: Val, allowed: String| ConfigError::Range {
            file: file.to_owned(),
            key: key.to_owned(),
            value: shown(written, val),
            allowed,
        };
    let invalid = |reason: String| ConfigError::Invalid {
        file: file.to_owned(),
        key: key.to_owned(),
        reason,
    };
    match (kind, val) {
        (Kind::AutoOrByte { min, max, .. }, &Val::AutoOrByte(Some(n)))
            if !(min..=max).contains(&n) =>
        {
            Err(range(
                key,
                written,
                Val::AutoOrByte(Some(n)),
                kind.allowed(),
            ))
        }
        (Kind::Bool, Val::Bool(_)) | (Kind::AutoOrByte { .. }, Val::AutoOrByte(_)) => Ok(()),
        (Kind::Uint { min, max }, &Val::Uint(n)) if !(min..=max).contains(&n) => {
            Err(range(key, written, Val::Uint(n), kind.allowed()))
        }
        (Kind::Uint { .. }, Val::Uint(_)) => Ok(()),
        (Kind::PowerOfTwo { min, max }, &Val::Uint(n)) => {
            if !(min..=max).contains(&n) {
                return Err(range(key, written, Val::Uint(n), kind.allowed()));
            }
            if !n.is_power_of_two() {
                let below = 1u64 << (63 - n.leading_zeros());
                return Err(invalid(format!(
                    "{n} is not a power of two (nearest: {below} or {})",
                    below.saturating_mul(2)
                )));
            }
            Ok(())
        }
        (Kind::Duration { unit, min, max }, &Val::Duration(d)) => {
            if !(unit.of(min)..=unit.of(max)).contains(&d) {
                return Err(range(key, written, Val::Duration(d), kind.allowed()));
            }
            if unit.count(d).is_none() {
                return Err(invalid(format!(
                    "{d:?} is not a whole number of {}",
                    unit.symbol()
                )));
            }
            Ok(())
        }
        (Kind::Float(r), &Val::Float(x)) if !r.contains(x) => {
            Err(range(key, written, Val::Float(x), r.describe()))
        }
        (Kind::Float(_), Val::Float(_)) => Ok(()),
        (
            Kind::FloatArray {
                each,
                min_len,
                max_len,
            },
            Val::Floats(xs),
        ) => {
            if !(min_len..=max_len).contains(&xs.len()) {
                return Err(range(
                    key,
                    written,
                    val.clone(),
                    format!("{min_len} to {max_len} entries"),
                ));
            }
            for (i, &x) in xs.iter().enumerate() {
                if !each.contains(x) {
                    let item = written.and_then(|w| w.get(i));
                    return Err(range(
                        &format!("{key}[{i}]"),
                        item,
                        Val::Float(x),
                        each.describe(),
                    ));
                }
            }
            Ok(())
        }
        (Kind::UintArray { max, max_len }, Val::Uints(ns)) => {
            if ns.len() > max_len {
                return Err(range(
                    key,
                    written,
                    val.clone(),
                    format!("at most {max_len} entries"),
                ));
            }
            for (i, &n) in ns.iter().enumerate() {
                if n > max {
                    let item = written.and_then(|w| w.get(i));
                    return Err(range(
                        &format!("{key}[{i}]"),
                        item,
                        Val::Uint(n),
                        format!("0..={max}"),
                    ));
                }
            }
            Ok(())
        }
        (Kind::Str(rule), Val::Str(s)) => {
            let problem = match rule {
                StrRule::NonEmpty if s.is_empty() => Some("must not be empty"),
                StrRule::EmptyOrSecret if !s.is_empty() && s.len() < 16 => {
                    Some("must be empty (no authentication) or at least 16 bytes")
                }
                StrRule::EmptyOrAbsolutePath if !s.is_empty() && !s.starts_with('/') => {
                    Some("must be empty or an absolute path (starting with /)")
                }
                StrRule::AbsolutePath if !s.starts_with('/') => {
                    Some("must be an absolute path (starting with /)")
                }
                StrRule::KeyPrefix | StrRule::EmptyOrKeyName
                    if (s.is_empty() && matches!(rule, StrRule::KeyPrefix))
                        || s.len() > 128
                        || !s.bytes().all(|b| b.is_ascii_graphic()) =>
                {
                    Some("must be 1 to 128 bytes of printable ASCII with no space")
                }
                StrRule::EmptyOrShmName if !s.is_empty() && !is_shm_name(s) => Some(
                    "must be empty (single-process mode) or a shared-memory name like /mooncake_rdma_slots (one leading /, no other /, not /. or /.., at most 255 bytes)",
                ),
                _ => None,
            };
            match problem {
                // Only a secret's length is ever shown.
                Some(reason) if matches!(rule, StrRule::EmptyOrSecret) => Err(invalid(format!(
                    "(a secret of {} bytes): {reason}",
                    s.len()
                ))),
                Some(reason) => Err(invalid(format!(
                    "{}: {reason}",
                    shown(written, val.clone())
                ))),
                None => Ok(()),
            }
        }
        (Kind::Choice(names), Val::Str(s)) if !names.contains(&s.as_str()) => {
            Err(invalid(format!(
                "{} is not one of: {}",
                shown(written, val.clone()),
                names.join(", ")
            )))
        }
        (Kind::Choice(_), Val::Str(_)) => Ok(()),
        (Kind::Endpoints, Val::Strs(endpoints)) => {
            if endpoints.len() > MAX_ENDPOINTS {
                return Err(invalid(format!("at most {MAX_ENDPOINTS} endpoints")));
            }
            for (i, e) in endpoints.iter().enumerate() {
                if let Err(why) = etcd_endpoint_url(e) {
                    return Err(ConfigError::Invalid {
                        file: file.to_owned(),
                        key: format!("{key}[{i}]"),
                        reason: why,
                    });
                }
            }
            Ok(())
        }
        (Kind::Devices, Val::Strs(names)) => {
            if names.len() > MAX_DEVICES || !names.iter().all(|d| is_device_name(d)) {
                return Err(invalid(format!(
                    "{}: must be empty (every device) or device names like [\"mlx5_0\", \"mlx5_1\"] (or \"mlx5_0,mlx5_1\"): at most {MAX_DEVICES}, each 1 to {MAX_DEVICE_NAME} bytes of [A-Za-z0-9_.-]",
                    shown(written, val.clone())
                )));
            }
            Ok(())
        }
        (kind, val) => Err(invalid(format!(
            "internal error: a {} key holds {val:?}",
            kind.type_name()
        ))),
    }
}

impl FloatRange {
    fn contains(self, x: f64) -> bool {
        let above_min = if self.min_inclusive {
            x >= self.min
        } else {
            x > self.min
        };
        above_min && x <= self.max
    }

    fn describe(self) -> String {
        if self.min_inclusive {
            format!("{}..={}", self.min, self.max)
        } else {
            format!("> {} and <= {}", self.min, self.max)
        }
    }
}

/// True when `path` is a known object (a proper prefix of some key).
fn is_object_path(path: &str) -> bool {
    SPECS.iter().any(|s| {
        s.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The names known directly under `prefix` ("" = top level); objects end in
/// `/`.
fn children(prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for spec in SPECS {
        let rest = if prefix.is_empty() {
            Some(spec.path)
        } else {
            spec.path
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('/'))
        };
        let Some(rest) = rest else { continue };
        let child = match rest.split_once('/') {
            Some((object, _)) => format!("{object}/"),
            None => rest.to_owned(),
        };
        if !out.contains(&child) {
            out.push(child);
        }
    }
    out
}

fn unknown_key(prefix: &str, name: &str, path: String, file: &str) -> ConfigError {
    let known = children(prefix);
    let level = if prefix.is_empty() {
        "one of the known top-level keys".to_owned()
    } else {
        format!("one of the known keys under {prefix}")
    };
    let mut expected = format!("{level}: {}", known.join(", "));
    if let Some(hint) = suggest(prefix, name, &known) {
        expected.push_str("; did you mean ");
        expected.push_str(&hint);
        expected.push('?');
    }
    ConfigError::UnknownKey {
        file: file.to_owned(),
        key: path,
        expected,
    }
}

/// Lower-cases and drops MORI's env-var prefix, so `MORI_IO_SQ_SPLIT_POLICY`
/// finds `sq_split_policy`.
fn normalize(name: &str) -> String {
    let lower = name.trim_end_matches('/').to_ascii_lowercase();
    lower
        .strip_prefix("mori_io_")
        .map(str::to_owned)
        .unwrap_or(lower)
}

/// The closest known key: first at the same level, then anywhere (spelled as
/// a full path, since it lives elsewhere — the QoS document's troubleshooting
/// snippets put RDMA keys at the top level, for instance).
fn suggest(prefix: &str, name: &str, known: &[String]) -> Option<String> {
    if name.contains('/') {
        let joined = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        if SPECS.iter().any(|s| s.path == joined) || is_object_path(&joined) {
            return Some(format!("{joined}, written as nested objects"));
        }
    }
    let wanted = normalize(name);
    let close_enough = |candidate: &str| {
        let d = levenshtein(&wanted, candidate);
        (d <= (wanted.len().max(candidate.len()) / 3).max(1)).then_some(d)
    };
    let local = known
        .iter()
        .filter_map(|k| close_enough(&normalize(k)).map(|d| (d, k.trim_end_matches('/'))))
        .min_by_key(|&(d, _)| d);
    if let Some((_, k)) = local {
        return Some(k.to_owned());
    }
    SPECS
        .iter()
        .filter_map(|s| {
            let last = s.path.rsplit('/').next().unwrap_or(s.path);
            close_enough(last).map(|d| (d, s.path))
        })
        .min_by_key(|&(d, _)| d)
        .map(|(_, p)| p.to_owned())
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != cb));
            diag = above;
        }
    }
    row[b.len()]
}

/// JSON type name.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// JSON type name plus the value, short enough for a one-line error.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        _ => format!("{} {}", type_name(v), truncate(&v.to_string())),
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 48;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A value as a file would hold it.
fn val_to_json(kind: Kind, val: Val) -> Value {
    match val {
        Val::Bool(b) => Value::Bool(b),
        Val::Uint(n) => Value::from(n),
        Val::Duration(d) => match kind {
            Kind::Duration { unit, .. } => match unit.count(d) {
                Some(n) => Value::from(n),
                None => Value::String(format!("{d:?}")),
            },
            _ => Value::String(format!("{d:?}")),
        },
        Val::Float(x) => Value::from(x),
        Val::Str(s) => Value::String(s),
        Val::Strs(v) => Value::from(v),
        Val::Floats(v) => Value::from(v),
        Val::Uints(v) => Value::from(v),
        Val::AutoOrByte(None) => Value::from("auto"),
        Val::AutoOrByte(Some(i)) => Value::from(i),
    }
}

fn insert_path(root: &mut Map<String, Value>, path: &str, value: Value) {
    match path.split_once('/') {
        None => {
            root.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            let slot = root
                .entry(head.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            if let Value::Object(inner) = slot {
                insert_path(inner, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_json_str(text, "test.json")
    }

    /// The config_text fuzz target's seeds are configurations that load:
    /// every key at its default, and TENT-style files
    /// (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds` writes
    /// them).
    #[test]
    fn fuzz_seeds_are_configs_that_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/config_text");
        let every_key = serde_json::to_string_pretty(&Config::default().to_json()).unwrap();
        let seeds = [
            ("every_key.json", every_key.as_str()),
            (
                "tent_rdma.json",
                r#"{"metadata_type": "p2p", "rpc_server_hostname": "10.0.0.1",
                    "rpc_server_port": 12345, "log_level": "warn",
                    "transports": {"rdma": {"devices": "mlx5_0,mlx5_1", "gid_index": 3,
                    "rail_cooldown_secs": 5}}, "workers": {"count": 4}}"#,
            ),
            (
                "tcp_secret.json",
                r#"{"rpc_shared_secret": "a secret of sixteen bytes or more",
                    "transports": {"tcp": {"serving_threads": 2}},
                    "default_timeout_ms": 5000}"#,
            ),
            ("empty.json", "{}"),
        ];
        for (name, text) in seeds {
            let path = dir.join(name);
            if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, text).unwrap();
            }
            assert_eq!(
                std::fs::read_to_string(&path).unwrap_or_default(),
                text,
                "{}: TENT_WRITE_SEEDS=1 writes it",
                path.display()
            );
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let c = parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let again = parse(&c.to_json().to_string()).unwrap();
            assert_eq!(
                Config {
                    source: c.source.clone(),
                    ..again
                },
                c
            );
        }
    }

    fn spec_index(path: &str) -> usize {
        SPECS
            .iter()
            .position(|s| s.path == path)
            .unwrap_or_else(|| panic!("{path} not in schema"))
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let c = Config::default();
        assert_eq!(c.source, "default");
        assert_eq!(c.block_size, 65536);
        assert_eq!(c.default_timeout_ms, Duration::from_secs(30));
        assert_eq!(c.ring_depth, 1024);
        assert_eq!(c.max_batch_size, 4096);
        assert_eq!(c.max_batches, 1024);
        assert_eq!(c.max_tasks_per_worker, 4096);
        assert_eq!(c.max_inflight_slices, 256);
        assert_eq!(c.max_failover_attempts, 3);
        assert!(c.merge_requests);
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.metadata_type, MetadataType::P2p);
        assert_eq!(c.rpc_server_hostname, "127.0.0.1");
        assert_eq!(c.rpc_server_port, 0);
        let w = &c.workers;
        assert_eq!(
            (
                w.count,
                w.cores.is_empty(),
                w.pin,
                w.spin_us,
                w.yield_us,
                w.park_timeout_ms
            ),
            (
                1,
                true,
                true,
                Duration::from_micros(50),
                Duration::from_micros(200),
                Duration::from_millis(100)
            )
        );
        let t = &c.transports;
        assert!(t.local.enable && t.shm.enable && t.tcp.enable && t.rdma.enable);
        assert_eq!(t.shm.dir, "/dev/shm");
        assert_eq!(
            (
                t.tcp.connections_per_peer,
                t.tcp.max_inflight_per_connection,
                t.tcp.user_timeout_ms,
                t.tcp.slice_size
            ),
            (4, 2, Duration::from_secs(10), 256 << 10)
        );
        let r = &t.rdma;
        assert_eq!(
            (
                r.rail_error_threshold,
                r.rail_error_window_secs,
                r.rail_cooldown_secs
            ),
            (3, Duration::from_secs(10), Duration::from_secs(30))
        );
        assert!(r.enable_priority_filtering);
        assert_eq!(r.local_rotation_interval_us, Duration::from_micros(200));
        assert_eq!(r.priority_promotion_timeout_us, Duration::from_millis(10));
        assert_eq!(r.slot_rotation_interval_ms, Duration::from_millis(2));
        assert_eq!(r.shared_quota_shm_path, "");
        assert!(r.enable_smart_scheduling);
        assert_eq!(r.numa_penalties, vec![1.0, 5.0, 10.0]);
        assert_eq!(r.bandwidth_learning_rate, 0.01);
        assert_eq!(r.ewma_min_bandwidth_multiplier, 0.1);
        assert_eq!(r.ewma_max_bandwidth_multiplier, 10.0);
        assert_eq!(r.score_jitter_range, 1e-9);
        assert_eq!(r.score_epsilon, 1e-12);
        assert_eq!(
            (
                r.default_bandwidth_gbps,
                r.min_bandwidth_gbps,
                r.max_bandwidth_gbps
            ),
            (400.0, 10.0, 800.0)
        );
        assert_eq!(r.max_slice_count, 64);
        assert_eq!(r.sq_backoff_timeout_us, Duration::from_secs(1));
        assert_eq!(r.sq_signal_interval_wr, 0);
        assert_eq!(r.sq_resume_watermark_wr, 0);
        assert!(!r.sq_executor_admission);
        assert_eq!(r.sq_admission_timeout_us, Duration::from_secs(1));
        assert_eq!(r.sq_admission_resume_watermark_wr, 0);
        assert_eq!(r.sq_admission_wait_slice_us, Duration::from_micros(100));
        assert_eq!(r.sq_admission_chunk_wr, 0);
        assert_eq!(r.sq_admission_max_chunks_per_call, 0);
        assert_eq!(r.sq_split_policy, SplitPolicy::Static);
        assert!(!r.sq_enable_experimental_capacity);
        assert_eq!(r.qp_per_transfer, QpsPerRail::Auto);
        assert_eq!(WorkersConfig::default(), c.workers);
        assert_eq!(RdmaConfig::default(), c.transports.rdma);
        assert_eq!(TcpConfig::default(), c.transports.tcp);
        assert_eq!(ShmConfig::default(), c.transports.shm);
        assert_eq!(LocalConfig::default(), c.transports.local);
        assert_eq!(TransportsConfig::default(), c.transports);
    }

    #[test]
    fn empty_object_gives_defaults_with_source() {
        let c = parse("{}").unwrap();
        assert_eq!(c.source, "test.json");
        assert_eq!(
            Config {
                source: "default".into(),
                ..c
            },
            Config::default()
        );
    }

    #[test]
    fn schema_has_no_duplicates_and_matches_rules() {
        assert_eq!(SPECS.len(), RULES.len());
        let mut seen = BTreeSet::new();
        for s in Config::schema() {
            assert!(seen.insert(s.path), "duplicate key {}", s.path);
            assert!(!s.doc.is_empty(), "{} has no doc", s.path);
        }
    }

    #[test]
    fn the_key_table_in_the_docs_is_the_schema_s() {
        const MARKER: &str = "<!-- key table: Config::key_table(); regenerate with TENT_BLESS=1 cargo test -p tent --lib key_table -->\n";
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/CONFIG.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let (head, table) = doc
            .split_once(MARKER)
            .expect("docs/CONFIG.md lost its marker");
        if std::env::var_os("TENT_BLESS").is_some() {
            std::fs::write(&path, format!("{head}{MARKER}{}", Config::key_table())).unwrap();
        } else {
            assert!(
                table == Config::key_table(),
                "docs/CONFIG.md's key table is not the schema's: TENT_BLESS=1 cargo test -p tent --lib key_table"
            );
        }
    }

    #[test]
    fn reloadable_keys_are_keys_and_changes_are_found_and_copied_by_key() {
        for k in RELOADABLE {
            assert!(SPECS.iter().any(|s| s.path == *k), "{k} is no key");
        }
        let a = Config::default();
        let mut b = a.clone();
        b.max_failover_attempts = 7;
        b.workers.count = 3;
        assert_eq!(
            a.changed_keys(&b),
            vec!["max_failover_attempts", "workers/count"]
        );
        let mut c = a.clone();
        c.copy_key(&b, "workers/count");
        assert_eq!(a.changed_keys(&c), vec!["workers/count"]);
        assert_eq!(c.workers.count, 3);
    }

    #[test]
    fn every_field_is_filled_by_a_key() {
        // The leaves of the structs (neither `source` nor a nested section),
        // as the last parts of key paths.
        let sections = [
            "workers",
            "transports",
            "local",
            "shm",
            "tcp",
            "rdma",
            "metrics",
        ];
        let mut fields: Vec<&str> = [
            Config::FIELDS,
            MetricsConfig::FIELDS,
            WorkersConfig::FIELDS,
            TransportsConfig::FIELDS,
            LocalConfig::FIELDS,
            ShmConfig::FIELDS,
            TcpConfig::FIELDS,
            RdmaConfig::FIELDS,
        ]
        .concat()
        .into_iter()
        .filter(|f| *f != "source" && !sections.contains(f))
        .collect();
        let mut keys: Vec<&str> = SPECS
            .iter()
            .map(|s| s.path.rsplit('/').next().unwrap())
            .collect();
        fields.sort_unstable();
        keys.sort_unstable();
        assert_eq!(fields, keys);
    }

    /// A value of `kind` different from `current`, to see which fields a key
    /// writes.
    fn other_value(kind: Kind, current: &Val) -> Val {
        match (kind, current) {
            (Kind::Bool, Val::Bool(b)) => Val::Bool(!b),
            (Kind::Uint { min, max } | Kind::PowerOfTwo { min, max }, Val::Uint(n)) => {
                Val::Uint(if *n == max { min } else { max })
            }
            (Kind::Float(r), Val::Float(x)) => {
                Val::Float(if *x == r.max { r.max / 2.0 } else { r.max })
            }
            (Kind::FloatArray { each, .. }, _) => Val::Floats(vec![each.max; 5]),
            (Kind::UintArray { max, .. }, _) => Val::Uints(vec![max, 1, 2]),
            (Kind::Str(_), Val::Str(s)) => Val::Str(format!("/x{s}")),
            (Kind::Choice(names), Val::Str(s)) => {
                Val::Str(names.iter().find(|n| **n != s).unwrap().to_string())
            }
            (Kind::Duration { unit, min, max }, Val::Duration(d)) => {
                Val::Duration(unit.of(if unit.count(*d) == Some(max) {
                    min
                } else {
                    max
                }))
            }
            (Kind::Devices, _) => Val::Strs(vec!["mlx5_7".to_owned()]),
            (Kind::Endpoints, _) => Val::Strs(vec!["10.0.0.7:2379".to_owned()]),
            (Kind::AutoOrByte { min, max, .. }, _) => Val::AutoOrByte(Some(7.clamp(min, max))),
            (kind, v) => panic!("{kind:?} does not produce {v:?}"),
        }
    }

    #[test]
    fn each_key_writes_its_own_field_only() {
        let base = Config::default();
        for (i, rule) in RULES.iter().enumerate() {
            if matches!(rule.kind, Kind::Choice(names) if names.len() == 1) {
                // No other value exists to write (metadata_type: p2p).
                continue;
            }
            let mut c = base.clone();
            let changed = other_value(rule.kind, &(rule.get)(&base));
            assert!((rule.set)(&mut c, changed.clone()), "{}", SPECS[i].path);
            assert_eq!((rule.get)(&c), changed, "{}", SPECS[i].path);
            assert_ne!(c, base, "{} writes nothing", SPECS[i].path);
            for (j, other) in RULES.iter().enumerate() {
                if j != i {
                    assert_eq!(
                        (other.get)(&c),
                        (other.get)(&base),
                        "{} also writes {}",
                        SPECS[i].path,
                        SPECS[j].path
                    );
                }
            }
        }
    }

    #[test]
    fn every_schema_key_is_accepted_with_its_default() {
        let defaults = Config::default();
        for (spec, rule) in SPECS.iter().zip(RULES) {
            let mut root = Map::new();
            insert_path(
                &mut root,
                spec.path,
                serde_json::from_str(spec.default).unwrap(),
            );
            let c = Config::from_json_str(&Value::Object(root).to_string(), "t.json")
                .unwrap_or_else(|e| panic!("{}: {e}", spec.path));
            assert_eq!((rule.get)(&c), (rule.get)(&defaults), "{}", spec.path);
            assert_eq!(spec.ty, rule.kind.type_name());
        }
    }

    #[test]
    fn every_schema_key_accepts_its_maximum_and_fits_its_field() {
        for (spec, rule) in SPECS.iter().zip(RULES) {
            let max = match rule.kind {
                Kind::Uint { max, .. } | Kind::PowerOfTwo { max, .. } => Value::from(max),
                Kind::Float(r) => Value::from(r.max),
                Kind::UintArray { max, .. } => Value::from(vec![max]),
                Kind::FloatArray { each, .. } => Value::from(vec![each.max]),
                _ => continue,
            };
            // Cross-key checks may reject a lone maximum in a file, so the
            // field fit is checked by assigning directly.
            let mut c = Config::default();
            let val = check_value(rule.kind, spec.path, &max, "t").unwrap();
            assert!(
                (rule.set)(&mut c, val.clone()),
                "{} does not fit its field",
                spec.path
            );
            assert_eq!((rule.get)(&c), val, "{}", spec.path);
        }
    }

    #[test]
    fn to_json_round_trips() {
        let c = Config::default();
        let again = Config::from_json_str(&c.to_json().to_string(), "default").unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn config_text_that_is_no_object_is_never_echoed() {
        let secret = "an-unguessable-0123456789";
        let bom = format!("\u{feff}{{\"rpc_shared_secret\":\"{secret}\"}}");
        let c = Config::from_path_or_json(&bom, "t").expect("JSON after a byte-order mark");
        assert_eq!(c.secret(), Some(secret.as_bytes()));
        for text in [
            format!("\"rpc_shared_secret\": \"{secret}\""),
            format!("[{{\"rpc_shared_secret\":\"{secret}\"}}]"),
        ] {
            let e = Config::from_path_or_json(&text, "t").expect_err("not an object");
            assert!(!e.to_string().contains(secret), "{e}");
        }
    }

    #[test]
    fn a_config_printed_whole_or_refused_never_shows_its_secret() {
        let secret = "an-unguessable-0123456789";
        let c = Config::from_json_str(&format!(r#"{{"rpc_shared_secret":"{secret}"}}"#), "t")
            .expect("a valid secret");
        let printed = format!("{c:?}");
        assert!(!printed.contains(secret), "Debug of a config: {printed}");
        assert!(printed.contains("rpc_shared_secret: ***"));
        assert_eq!(c.secret(), Some(secret.as_bytes()));
        let short = "short-secret";
        let e = Config::from_json_str(&format!(r#"{{"rpc_shared_secret":"{short}"}}"#), "t")
            .expect_err("a secret under 16 bytes");
        assert!(!e.to_string().contains(short), "{e}");
        let e = Config::from_json_str(r#"{"rpc_shared_secret":987654321}"#, "t")
            .expect_err("a secret that is not a string");
        assert!(!e.to_string().contains("987654321"), "{e}");
    }

    fn type_error(text: &str) -> (String, &'static str, String) {
        match parse(text) {
            Err(ConfigError::Type {
                file,
                key,
                expected,
                found,
            }) => {
                assert_eq!(file, "test.json");
                (key, expected, found)
            }
            other => panic!("{text}: expected a type error, got {other:?}"),
        }
    }

    #[test]
    fn type_mismatches_name_key_expected_and_found() {
        let (k, e, f) = type_error(r#"{"block_size": "64k"}"#);
        assert_eq!((k.as_str(), e), ("block_size", "unsigned integer"));
        assert_eq!(f, "string \"64k\"");

        let (k, e, f) = type_error(r#"{"block_size": 1.5}"#);
        assert_eq!(
            (k.as_str(), e, f.as_str()),
            ("block_size", "unsigned integer", "number 1.5")
        );

        let (k, _, f) = type_error(r#"{"ring_depth": -4}"#);
        assert_eq!((k.as_str(), f.as_str()), ("ring_depth", "integer -4"));

        let (k, e, f) = type_error(r#"{"merge_requests": 1}"#);
        assert_eq!(
            (k.as_str(), e, f.as_str()),
            ("merge_requests", "bool", "integer 1")
        );

        let (k, e, f) = type_error(r#"{"log_level": null}"#);
        assert_eq!((k.as_str(), e, f.as_str()), ("log_level", "string", "null"));

        let (k, e, _) = type_error(r#"{"workers": 4}"#);
        assert_eq!((k.as_str(), e), ("workers", "object"));

        let (k, e, _) = type_error(r#"{"transports": {"rdma": []}}"#);
        assert_eq!((k.as_str(), e), ("transports/rdma", "object"));

        let (k, e, _) = type_error(r#"{"transports": {"rdma": {"numa_penalties": 1.0}}}"#);
        assert_eq!(
            (k.as_str(), e),
            ("transports/rdma/numa_penalties", "array of numbers")
        );

        let (k, e, f) = type_error(r#"{"transports": {"rdma": {"numa_penalties": [1.0, "x"]}}}"#);
        assert_eq!(
            (k.as_str(), e, f.as_str()),
            (
                "transports/rdma/numa_penalties[1]",
                "number",
                "string \"x\""
            )
        );

        let (k, e, _) = type_error(r#"{"workers": {"cores": [1, -2]}}"#);
        assert_eq!((k.as_str(), e), ("workers/cores[1]", "unsigned integer"));

        let (k, e, _) =
            type_error(r#"{"transports": {"rdma": {"bandwidth_learning_rate": "0.1"}}}"#);
        assert_eq!(
            (k.as_str(), e),
            ("transports/rdma/bandwidth_learning_rate", "number")
        );

        let (k, e, _) = type_error(r#"{"transports": {"shm": {"dir": 7}}}"#);
        assert_eq!((k.as_str(), e), ("transports/shm/dir", "string"));

        let (k, e, _) = type_error(r#"{"transports": {"rdma": {"sq_split_policy": 1}}}"#);
        assert_eq!(
            (k.as_str(), e),
            ("transports/rdma/sq_split_policy", "string")
        );

        let (k, e, _) = type_error("[1, 2]");
        assert_eq!((k.as_str(), e), ("(top level)", "object"));
    }

    #[test]
    fn long_values_are_truncated_in_errors() {
        let long = "x".repeat(500);
        let (_, _, found) = type_error(&format!(r#"{{"block_size": "{long}"}}"#));
        assert!(found.chars().count() < 80, "{found}");
        assert!(found.ends_with('…'));
    }

    #[test]
    fn floats_accept_integers() {
        let c = parse(
            r#"{"transports": {"rdma": {"max_bandwidth_gbps": 1600, "numa_penalties": [1, 2]}}}"#,
        )
        .unwrap();
        assert_eq!(c.transports.rdma.max_bandwidth_gbps, 1600.0);
        assert_eq!(c.transports.rdma.numa_penalties, vec![1.0, 2.0]);
    }

    #[test]
    fn unknown_top_level_key_names_key_file_and_close_match() {
        let err = parse(r#"{"block_sise": 4096}"#).unwrap_err();
        let ConfigError::UnknownKey {
            file,
            key,
            expected,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((file.as_str(), key.as_str()), ("test.json", "block_sise"));
        assert!(expected.contains("known top-level keys"), "{expected}");
        assert!(expected.contains("workers/"), "{expected}");
        assert!(expected.ends_with("did you mean block_size?"), "{expected}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("test.json: unknown key \"block_sise\""),
            "{msg}"
        );
    }

    #[test]
    fn unknown_nested_key_names_full_path_and_close_match() {
        let err = parse(r#"{"transports": {"rdma": {"rail_cooldwn_secs": 5}}}"#).unwrap_err();
        let ConfigError::UnknownKey {
            file,
            key,
            expected,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(file, "test.json");
        assert_eq!(key, "transports/rdma/rail_cooldwn_secs");
        assert!(
            expected.starts_with("one of the known keys under transports/rdma: enable, "),
            "{expected}"
        );
        assert!(
            expected.ends_with("did you mean rail_cooldown_secs?"),
            "{expected}"
        );
    }

    #[test]
    fn unknown_keys_elsewhere_suggest_the_full_path() {
        // The QoS document's troubleshooting snippets write RDMA keys at the
        // top level; point at where they live.
        let err = parse(r#"{"slot_rotation_interval_ms": 1}"#).unwrap_err();
        let ConfigError::UnknownKey { expected, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            expected.ends_with("did you mean transports/rdma/slot_rotation_interval_ms?"),
            "{expected}"
        );

        let err = parse(r#"{"transports": {"rdma": {"MORI_IO_SQ_SPLIT_POLICY": "static"}}}"#)
            .unwrap_err();
        let ConfigError::UnknownKey { expected, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            expected.ends_with("did you mean sq_split_policy?"),
            "{expected}"
        );

        let err = parse(r#"{"transports": {"ucx": {}}}"#).unwrap_err();
        let ConfigError::UnknownKey { key, expected, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(key, "transports/ucx");
        assert!(expected.contains("local/, shm/, tcp/, rdma/"), "{expected}");
    }

    #[test]
    fn flattened_slash_keys_are_rejected_with_a_hint() {
        let err = parse(r#"{"transports/rdma/rail_cooldown_secs": 5}"#).unwrap_err();
        let ConfigError::UnknownKey { key, expected, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(key, "transports/rdma/rail_cooldown_secs");
        assert!(expected.contains("written as nested objects"), "{expected}");
    }

    #[test]
    fn rdma_device_list_and_gid_index_are_checked() {
        let c =
            parse(r#"{"transports": {"rdma": {"devices": " mlx5_0, mlx5_1 ", "gid_index": "3"}}}"#)
                .unwrap();
        assert_eq!(c.transports.rdma.devices, ["mlx5_0", "mlx5_1"]);
        assert_eq!(c.transports.rdma.gid_index, GidIndex::Index(3));
        let d = Config::default();
        assert!(d.transports.rdma.devices.is_empty());
        assert_eq!(d.transports.rdma.gid_index, GidIndex::Auto, "auto");
        for bad in [
            r#"{"transports": {"rdma": {"devices": "mlx5_0,,mlx5_1"}}}"#,
            r#"{"transports": {"rdma": {"devices": "mlx5 0"}}}"#,
            r#"{"transports": {"rdma": {"gid_index": "-1"}}}"#,
            r#"{"transports": {"rdma": {"gid_index": "first"}}}"#,
            // An address handle holds 8 bits of the index: 256 would have
            // used GID 0, 300 GID 44.
            r#"{"transports": {"rdma": {"gid_index": 256}}}"#,
            r#"{"transports": {"rdma": {"gid_index": "300"}}}"#,
            r#"{"transports": {"rdma": {"gid_index": 3.5}}}"#,
            r#"{"transports": {"rdma": {"devices": ["mlx5_0", 1]}}}"#,
            r#"{"transports": {"rdma": {"devices": ["mlx5_0", ""]}}}"#,
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("transports/rdma/"), "{bad}: {e}");
        }
    }

    #[test]
    fn rdma_devices_and_gid_index_take_their_natural_json_types() {
        let c = parse(
            r#"{"transports": {"rdma": {"devices": ["mlx5_0", "mlx5_1"], "gid_index": 255}}}"#,
        )
        .unwrap();
        assert_eq!(c.transports.rdma.devices, ["mlx5_0", "mlx5_1"]);
        assert_eq!(c.transports.rdma.gid_index, GidIndex::Index(255));
        let c = parse(r#"{"transports": {"rdma": {"devices": []}}}"#).unwrap();
        assert!(c.transports.rdma.devices.is_empty());
    }

    #[test]
    fn validate_checks_fields_set_in_code_without_a_json_trip() {
        let mut c = Config::default();
        c.transports.rdma.devices = vec!["mlx5 0".to_owned()];
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("transports/rdma/devices") && e.contains("mlx5 0"),
            "{e}"
        );
        let mut c = Config::default();
        c.transports.rdma.rail_cooldown_secs = Duration::from_millis(1500);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("not a whole number of s"), "{e}");
        c.transports.rdma.rail_cooldown_secs = Duration::from_secs(301);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("value 301 is out of range (allowed: 1..=300 s)"),
            "{e}"
        );
        let c = Config {
            rpc_shared_secret: "short-secret".into(),
            ..Config::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("(a secret of 12 bytes)") && !e.contains("short-secret"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_values_are_range_errors() {
        let cases = [
            (
                r#"{"block_size": 32}"#,
                "block_size",
                "32",
                "64..=1073741824",
            ),
            (
                r#"{"max_failover_attempts": 65}"#,
                "max_failover_attempts",
                "65",
                "0..=64",
            ),
            (
                r#"{"rpc_server_port": 65536}"#,
                "rpc_server_port",
                "65536",
                "0..=65535",
            ),
            (
                r#"{"workers": {"count": 0}}"#,
                "workers/count",
                "0",
                "1..=256",
            ),
            (
                r#"{"workers": {"cores": [0, 4096]}}"#,
                "workers/cores[1]",
                "4096",
                "0..=4095",
            ),
            (
                r#"{"transports": {"rdma": {"bandwidth_learning_rate": 1.5}}}"#,
                "transports/rdma/bandwidth_learning_rate",
                "1.5",
                "0..=1",
            ),
            (
                r#"{"transports": {"rdma": {"numa_penalties": [1.0, 0.0]}}}"#,
                "transports/rdma/numa_penalties[1]",
                "0.0",
                "> 0 and <= 1000000",
            ),
            (
                r#"{"transports": {"rdma": {"numa_penalties": []}}}"#,
                "transports/rdma/numa_penalties",
                "[]",
                "1 to 16 entries",
            ),
        ];
        for (text, want_key, want_value, want_allowed) in cases {
            match parse(text) {
                Err(ConfigError::Range {
                    file,
                    key,
                    value,
                    allowed,
                }) => {
                    assert_eq!(file, "test.json");
                    assert_eq!(key, want_key);
                    assert_eq!(value, want_value);
                    assert_eq!(allowed, want_allowed);
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn ring_depth_must_be_a_power_of_two() {
        assert_eq!(parse(r#"{"ring_depth": 4096}"#).unwrap().ring_depth, 4096);
        match parse(r#"{"ring_depth": 1000}"#) {
            Err(ConfigError::Invalid { key, reason, .. }) => {
                assert_eq!(key, "ring_depth");
                assert!(reason.contains("not a power of two"), "{reason}");
                assert!(reason.contains("512 or 1024"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"{"ring_depth": 1}"#),
            Err(ConfigError::Range { .. })
        ));
    }

    #[test]
    fn strings_and_enums_are_checked() {
        let invalid_key = |text: &str| match parse(text) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(invalid_key(r#"{"log_level": "verbose"}"#), "log_level");
        assert_eq!(
            invalid_key(r#"{"metadata_type": "zookeeper"}"#),
            "metadata_type"
        );
        assert_eq!(
            invalid_key(r#"{"metadata_type": "etcd"}"#),
            "metadata_servers"
        );
        assert_eq!(
            invalid_key(
                r#"{"metadata_type": "etcd", "metadata_servers": "127.0.0.1:2379, bad host"}"#
            ),
            "metadata_servers[1]"
        );
        assert_eq!(
            invalid_key(r#"{"metadata_servers": "grpc://10.0.0.1:2379"}"#),
            "metadata_servers[0]"
        );
        assert_eq!(
            invalid_key(r#"{"metadata_key_prefix": "a b"}"#),
            "metadata_key_prefix"
        );
        assert_eq!(
            invalid_key(
                r#"{"metadata_type": "etcd", "metadata_servers": "h:1", "metadata_segment_name": "local"}"#
            ),
            "metadata_segment_name"
        );
        assert_eq!(
            invalid_key(r#"{"metadata_segment_name": "mine"}"#),
            "metadata_segment_name"
        );
        assert_eq!(
            invalid_key(
                r#"{"metadata_type": "etcd", "metadata_servers": "h:1", "metadata_segment_name": "job#00000000000000a1"}"#
            ),
            "metadata_segment_name"
        );
        for text in [
            r#"{"metadata_servers": "http://root:hunter2@10.0.0.1:2379"}"#,
            r#"{"metadata_servers": "etcd://root:hunter2@10.0.0.1:2379"}"#,
            r#"{"metadata_servers": [{"url": "http://root:hunter2@h:1"}]}"#,
            r#"{"metadata_servers": 7}"#,
        ] {
            let e = parse(text).unwrap_err();
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let c = parse(
            r#"{"metadata_type": "etcd", "metadata_servers": "127.0.0.1:2379,http://10.0.0.2:2379",
                "metadata_password": "pw"}"#,
        )
        .unwrap();
        assert_eq!(
            c.metadata_servers,
            ["127.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert!(
            !format!("{c:?}").contains("\"pw\""),
            "a password is never printed"
        );
        assert_eq!(
            invalid_key(r#"{"rpc_server_hostname": ""}"#),
            "rpc_server_hostname"
        );
        assert_eq!(
            invalid_key(r#"{"transports": {"shm": {"dir": "shm"}}}"#),
            "transports/shm/dir"
        );
        assert_eq!(
            invalid_key(r#"{"transports": {"rdma": {"shared_quota_shm_path": "slots"}}}"#),
            "transports/rdma/shared_quota_shm_path"
        );
        // The name must stay a file directly in /dev/shm.
        for bad in ["/a/b", "/..", "/.", "/../../tmp/x", "/"] {
            assert_eq!(
                invalid_key(&format!(
                    r#"{{"transports": {{"rdma": {{"shared_quota_shm_path": "{bad}"}}}}}}"#
                )),
                "transports/rdma/shared_quota_shm_path",
                "{bad}"
            );
        }
        assert_eq!(
            invalid_key(r#"{"transports": {"rdma": {"sq_split_policy": "random"}}}"#),
            "transports/rdma/sq_split_policy"
        );
        let c = parse(r#"{"log_level": "debug", "transports": {"rdma": {"sq_split_policy": "least_loaded"}}}"#)
            .unwrap();
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.transports.rdma.sq_split_policy, SplitPolicy::LeastLoaded);
    }

    #[test]
    fn cross_key_checks() {
        let invalid = |text: &str| match parse(text) {
            Err(ConfigError::Invalid { key, reason, .. }) => (key, reason),
            other => panic!("{text}: {other:?}"),
        };
        let (key, reason) = invalid(r#"{"transports": {"rdma": {"sq_split_policy": "capacity"}}}"#);
        assert_eq!(key, "transports/rdma/sq_split_policy");
        assert!(
            reason.contains("transports/rdma/sq_enable_experimental_capacity"),
            "{reason}"
        );
        let c = parse(
            r#"{"transports": {"rdma": {"sq_split_policy": "capacity", "sq_enable_experimental_capacity": true}}}"#,
        )
        .unwrap();
        assert_eq!(c.transports.rdma.sq_split_policy, SplitPolicy::Capacity);

        let (key, _) = invalid(r#"{"transports": {"rdma": {"default_bandwidth_gbps": 900}}}"#);
        assert_eq!(key, "transports/rdma/default_bandwidth_gbps");
        let (key, _) = invalid(r#"{"transports": {"rdma": {"min_bandwidth_gbps": 1000}}}"#);
        assert_eq!(key, "transports/rdma/min_bandwidth_gbps");
        parse(r#"{"transports": {"rdma": {"ewma_min_bandwidth_multiplier": 2.0, "ewma_max_bandwidth_multiplier": 2.0}}}"#)
            .unwrap();
        let (key, reason) = invalid(
            r#"{"transports": {"rdma": {"ewma_min_bandwidth_multiplier": 2.0, "ewma_max_bandwidth_multiplier": 1.5}}}"#,
        );
        assert_eq!(key, "transports/rdma/ewma_min_bandwidth_multiplier");
        assert!(
            reason.contains("transports/rdma/ewma_max_bandwidth_multiplier"),
            "{reason}"
        );
        let (key, _) = invalid(
            r#"{"transports": {"rdma": {"min_bandwidth_gbps": 900, "max_bandwidth_gbps": 800}}}"#,
        );
        assert_eq!(key, "transports/rdma/min_bandwidth_gbps");
    }

    #[test]
    fn not_valid_json_is_a_parse_error() {
        match parse("{\"block_size\": }") {
            Err(ConfigError::Parse { file, msg }) => {
                assert_eq!(file, "test.json");
                assert!(msg.contains("line 1"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    const SEED_EXAMPLES: &[&str] = &[
        // 000 failover
        r#"{
          "max_failover_attempts": 3,
          "transports": {
            "rdma": {
              "rail_error_threshold": 3,
              "rail_error_window_secs": 10,
              "rail_cooldown_secs": 30
            }
          }
        }"#,
        // 001 QoS
        r#"{"transports": {"rdma": {"enable_priority_filtering": true, "local_rotation_interval_us": 200, "priority_promotion_timeout_us": 10000}}}"#,
        r#"{"transports": {"rdma": {"slot_rotation_interval_ms": 2, "shared_quota_shm_path": "/mooncake_rdma_slots"}}}"#,
        r#"{"transports": {"rdma": {"enable_priority_filtering": true, "slot_rotation_interval_ms": 1, "shared_quota_shm_path": "/mooncake_rdma_slots"}}}"#,
        r#"{"transports": {"rdma": {"enable_priority_filtering": true, "shared_quota_shm_path": ""}}}"#,
        r#"{"transports": {"rdma": {"slot_rotation_interval_ms": 10, "shared_quota_shm_path": "/mooncake_rdma_slots"}}}"#,
        // 003 slice spraying
        r#"{"transports": {"rdma": {"enable_smart_scheduling": true}}}"#,
        r#"{"transports": {"rdma": {"numa_penalties": [1.0, 5.0, 10.0]}}}"#,
        r#"{"transports": {"rdma": {"bandwidth_learning_rate": 0.01, "ewma_min_bandwidth_multiplier": 0.1, "ewma_max_bandwidth_multiplier": 10.0}}}"#,
        r#"{"transports": {"rdma": {"score_jitter_range": 1e-9, "score_epsilon": 1e-12}}}"#,
        r#"{"transports": {"rdma": {"default_bandwidth_gbps": 400.0, "min_bandwidth_gbps": 10.0, "max_bandwidth_gbps": 800.0}}}"#,
        r#"{"transports": {"rdma": {"enable_smart_scheduling": true, "numa_penalties": [1.0, 100.0, 1000.0], "bandwidth_learning_rate": 0.001}}}"#,
        r#"{"transports": {"rdma": {"enable_smart_scheduling": true, "numa_penalties": [1.0, 2.0, 3.0], "bandwidth_learning_rate": 0.1}}}"#,
        r#"{"transports": {"rdma": {"enable_smart_scheduling": false}}}"#,
        // 004 SQ flow control, the PR's test-plan settings as config keys
        r#"{"transports": {"rdma": {"sq_backoff_timeout_us": 5000000}}}"#,
        r#"{"transports": {"rdma": {"sq_executor_admission": true, "sq_admission_timeout_us": 2000000, "sq_backoff_timeout_us": 1000000}}}"#,
        r#"{"transports": {"rdma": {"sq_split_policy": "least_loaded", "sq_signal_interval_wr": 256}}}"#,
    ];

    #[test]
    fn seed_examples_parse() {
        for text in SEED_EXAMPLES {
            parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        let c = parse(SEED_EXAMPLES[0]).unwrap();
        assert_eq!(c.max_failover_attempts, 3);
        assert_eq!(
            c.transports.rdma.rail_cooldown_secs,
            Duration::from_secs(30)
        );
        let c = parse(SEED_EXAMPLES[11]).unwrap();
        assert_eq!(c.transports.rdma.numa_penalties, vec![1.0, 100.0, 1000.0]);
        assert_eq!(c.transports.rdma.bandwidth_learning_rate, 0.001);
    }

    #[test]
    fn full_example_with_every_section_parses() {
        let text = r#"{
          "block_size": 131072,
          "default_timeout_ms": 5000,
          "ring_depth": 256,
          "max_failover_attempts": 1,
          "merge_requests": false,
          "log_level": "warn",
          "metadata_type": "p2p",
          "rpc_server_hostname": "10.0.0.1",
          "rpc_server_port": 12345,
          "workers": {"count": 2, "cores": [1, 0], "pin": false, "spin_us": 0, "yield_us": 0, "park_timeout_ms": 5},
          "transports": {
            "local": {"enable": false},
            "shm": {"enable": true, "dir": "/tmp"},
            "tcp": {"enable": true, "connections_per_peer": 2, "max_inflight_per_connection": 16, "user_timeout_ms": 0},
            "rdma": {
              "rail_error_threshold": 5,
              "priority_promotion_timeout_us": 500,
              "numa_penalties": [1.0, 2.0],
              "sq_split_policy": "capacity",
              "sq_enable_experimental_capacity": true
            }
          }
        }"#;
        let c = parse(text).unwrap();
        assert_eq!(c.block_size, 131_072);
        assert_eq!(c.rpc_server_port, 12345);
        assert_eq!(c.workers.cores, vec![1, 0]);
        assert!(!c.workers.pin);
        assert!(!c.transports.local.enable);
        assert_eq!(c.transports.shm.dir, "/tmp");
        assert_eq!(c.transports.tcp.max_inflight_per_connection, 16);
        assert_eq!(
            c.transports.rdma.priority_promotion_timeout_us,
            Duration::from_micros(500)
        );
        assert_eq!(c.transports.rdma.rail_error_threshold, 5);
        // Untouched keys in a touched object keep their defaults.
        assert_eq!(
            c.transports.rdma.rail_cooldown_secs,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn not_yet_in_effect_keys_are_accepted_and_recorded_once() {
        // Request merging is not built.
        let path = "merge_requests";
        assert!(!SPECS[spec_index(path)].in_effect);
        parse(r#"{"merge_requests": true}"#).unwrap();
        parse(r#"{"merge_requests": false}"#).unwrap();
        let warned = WARNED.lock();
        assert!(warned.contains(path));
        // Live keys are never reported.
        drop(warned);
        parse(r#"{"block_size": 4096}"#).unwrap();
        assert!(!WARNED.lock().contains("block_size"));
    }

    #[test]
    fn every_slice_spraying_key_is_in_effect() {
        for path in [
            "transports/rdma/enable_smart_scheduling",
            "transports/rdma/numa_penalties",
            "transports/rdma/bandwidth_learning_rate",
            "transports/rdma/ewma_min_bandwidth_multiplier",
            "transports/rdma/ewma_max_bandwidth_multiplier",
            "transports/rdma/score_jitter_range",
            "transports/rdma/score_epsilon",
            "transports/rdma/default_bandwidth_gbps",
            "transports/rdma/min_bandwidth_gbps",
            "transports/rdma/max_bandwidth_gbps",
            "transports/rdma/max_slice_count",
        ] {
            assert!(SPECS[spec_index(path)].in_effect, "{path}");
        }
    }

    #[test]
    fn from_file_reads_and_names_the_file() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("tent-config-test-{}.json", std::process::id()));
        std::fs::write(&path, r#"{"workers": {"count": 3}}"#).unwrap();
        let c = Config::from_file(&path).unwrap();
        assert_eq!(c.workers.count, 3);
        assert_eq!(c.source, path.display().to_string());

        std::fs::write(&path, r#"{"workers": {"cnt": 3}}"#).unwrap();
        let err = Config::from_file(&path).unwrap_err();
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();

        match Config::from_file(&path) {
            Err(ConfigError::Io { file, .. }) => assert_eq!(file, path.display().to_string()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tent_conf_inline_vs_path() {
        use std::ffi::OsStr;
        assert!(Config::from_env_value(None).unwrap().is_none());

        let inline = Config::from_env_value(Some(OsStr::new("  {\"ring_depth\": 64}  ")))
            .unwrap()
            .unwrap();
        assert_eq!(inline.ring_depth, 64);
        assert_eq!(inline.source, INLINE_SOURCE);
        match Config::from_env_value(Some(OsStr::new("{\"ring_depth\": 63}"))) {
            Err(ConfigError::Invalid { file, .. }) => assert_eq!(file, INLINE_SOURCE),
            other => panic!("{other:?}"),
        }

        let path =
            std::env::temp_dir().join(format!("tent-conf-env-test-{}.json", std::process::id()));
        std::fs::write(&path, r#"{"ring_depth": 128}"#).unwrap();
        let from_path = Config::from_env_value(Some(path.as_os_str()))
            .unwrap()
            .unwrap();
        assert_eq!(from_path.ring_depth, 128);
        assert_eq!(from_path.source, path.display().to_string());
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            Config::from_env_value(Some(path.as_os_str())),
            Err(ConfigError::Io { .. })
        ));
    }

    #[test]
    fn load_without_tent_conf_gives_defaults() {
        // Reads the real environment but never writes it: set_var would race
        // with C code (hwloc) reading the environment in parallel tests.
        let key_vars = std::env::vars_os().any(|(k, _)| {
            SPECS
                .iter()
                .any(|s| k.to_str() == Some(env::var_name(s.path).as_str()))
        });
        if std::env::var_os(ENV_VAR).is_none() && !key_vars {
            assert!(Config::from_env().unwrap().is_none());
            assert_eq!(Config::load().unwrap(), Config::default());
        }
    }

    #[test]
    fn the_environment_overrides_tent_conf_key_by_key_and_the_result_is_checked_whole() {
        let vars = |list: &[(&str, &str)]| -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
            list.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let conf = std::ffi::OsStr::new(r#"{"block_size": 4096, "ring_depth": 128}"#);
        let cfg = Config::from_layers(Some(conf), vars(&[("TENT_BLOCK_SIZE", "8192")])).unwrap();
        assert_eq!(cfg.block_size, 8192, "the environment comes last");
        assert_eq!(cfg.ring_depth, 128, "what it does not name stays");
        assert_eq!(cfg.source, "TENT_CONF (inline), then TENT_BLOCK_SIZE");
        let plain = Config::from_layers(None, vars(&[("TENT_NETNS_ROLE", "x")])).unwrap();
        assert_eq!(plain, Config::default());
        // The checks across keys see every layer: a file's choice that a
        // variable allows is no error.
        let split =
            std::ffi::OsStr::new(r#"{"transports": {"rdma": {"sq_split_policy": "capacity"}}}"#);
        assert!(Config::from_layers(Some(split), vars(&[])).is_err());
        let both = Config::from_layers(
            Some(split),
            vars(&[(
                "TENT_TRANSPORTS_RDMA_SQ_ENABLE_EXPERIMENTAL_CAPACITY",
                "true",
            )]),
        )
        .unwrap();
        assert!(both.transports.rdma.sq_enable_experimental_capacity);
        // A bad value fails the whole load, named by its variable.
        let e = Config::from_layers(Some(conf), vars(&[("TENT_RING_DEPTH", "100")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("TENT_RING_DEPTH (environment): key \"ring_depth\""),
            "{e}"
        );
    }

    #[test]
    fn a_key_given_twice_in_a_file_is_refused_naming_it() {
        let e = Config::from_json_str(
            r#"{"transports": {"rdma": {"rail_cooldown_secs": 2, "rail_cooldown_secs": 4}}}"#,
            "dup.json",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("dup.json: not valid JSON"), "{e}");
        assert!(
            e.contains("duplicate key \"transports/rdma/rail_cooldown_secs\""),
            "{e}"
        );
    }

    #[test]
    fn closest_match_helpers() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("same", "same"), 0);
        assert_eq!(suggest("", "zzzzzzzz", &children("")), None);
    }

    /// A strategy producing an in-range JSON value for a key's kind.
    fn value_strategy(kind: Kind) -> BoxedStrategy<Value> {
        match kind {
            Kind::Bool => any::<bool>().prop_map(Value::from).boxed(),
            Kind::Uint { min, max } => (min..=max).prop_map(Value::from).boxed(),
            Kind::PowerOfTwo { min, max } => {
                let (lo, hi) = (min.trailing_zeros(), max.trailing_zeros());
                (lo..=hi).prop_map(|k| Value::from(1u64 << k)).boxed()
            }
            Kind::Float(r) => float_strategy(r).prop_map(Value::from).boxed(),
            Kind::FloatArray {
                each,
                min_len,
                max_len,
            } => proptest::collection::vec(float_strategy(each), min_len..=max_len)
                .prop_map(Value::from)
                .boxed(),
            Kind::UintArray { max, max_len } => {
                proptest::collection::vec(0..=max, 0..=max_len.min(8))
                    .prop_map(Value::from)
                    .boxed()
            }
            Kind::Str(StrRule::NonEmpty) => "[a-z0-9.]{1,12}".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::EmptyOrSecret) => "([a-z0-9]{16,24})?".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::AbsolutePath) => "/[a-z_/]{0,12}".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::EmptyOrShmName) => "(/[a-z_]{1,12})?".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::Password) => "[a-z0-9 ]{0,12}".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::EmptyOrAbsolutePath) => {
                "(/[a-z_/]{0,12})?".prop_map(Value::from).boxed()
            }
            Kind::Str(StrRule::KeyPrefix) => "/?[a-z0-9_/]{1,12}".prop_map(Value::from).boxed(),
            Kind::Str(StrRule::EmptyOrKeyName) => {
                "([a-z0-9_-]{1,12})?".prop_map(Value::from).boxed()
            }
            Kind::Endpoints => prop_oneof![
                "([a-z0-9]{1,8}:[1-9][0-9]{0,3})?".prop_map(Value::from),
                proptest::collection::vec("[a-z0-9.]{1,8}:[1-9][0-9]{0,3}", 0..=3)
                    .prop_map(Value::from),
            ]
            .boxed(),
            Kind::Devices => prop_oneof![
                "([a-z0-9_]{1,8}(,[a-z0-9_]{1,8}){0,2})?".prop_map(Value::from),
                proptest::collection::vec("[a-z0-9_.-]{1,8}", 0..=3).prop_map(Value::from),
            ]
            .boxed(),
            Kind::AutoOrByte { min, max, .. } => prop_oneof![
                Just(Value::from("auto")),
                (u64::from(min)..=u64::from(max)).prop_map(Value::from),
                (u64::from(min)..=u64::from(max)).prop_map(|n| Value::from(n.to_string())),
            ]
            .boxed(),
            Kind::Duration { min, max, .. } => (min..=max).prop_map(Value::from).boxed(),
            Kind::Choice(names) => proptest::sample::select(names)
                .prop_map(Value::from)
                .boxed(),
        }
    }

    fn float_strategy(r: FloatRange) -> impl Strategy<Value = f64> {
        let lo = if r.min_inclusive {
            r.min
        } else {
            r.min + f64::EPSILON.max(r.min * 1e-9)
        };
        prop_oneof![Just(lo), Just(r.max), lo..=r.max]
    }

    fn random_config() -> impl Strategy<Value = Vec<(usize, Value)>> {
        let per_key: Vec<_> = RULES
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                proptest::option::of(value_strategy(rule.kind).prop_map(move |v| (i, v)))
            })
            .collect();
        per_key.prop_map(|picked| picked.into_iter().flatten().collect())
    }

    fn near(a: &Val, b: &Val) -> bool {
        let close = |x: f64, y: f64| x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
        match (a, b) {
            (Val::Float(x), Val::Float(y)) => close(*x, *y),
            (Val::Floats(x), Val::Floats(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(*x, *y))
            }
            _ => a == b,
        }
    }

    proptest! {
        #[test]
        fn random_known_keys_round_trip(entries in random_config()) {
            let mut root = Map::new();
            for (i, v) in &entries {
                insert_path(&mut root, SPECS[*i].path, v.clone());
            }
            match Config::from_json_str(&Value::Object(root).to_string(), "prop.json") {
                Ok(cfg) => {
                    for (i, v) in &entries {
                        let want = check_value(RULES[*i].kind, SPECS[*i].path, v, "prop.json").unwrap();
                        let got = (RULES[*i].get)(&cfg);
                        prop_assert!(near(&got, &want), "{}: got {:?}, want {:?}", SPECS[*i].path, got, want);
                    }
                    prop_assert_eq!(cfg.source.as_str(), "prop.json");
                }
                Err(ConfigError::Invalid { key, .. }) => {
                    // Only the cross-key rules may reject in-range values;
                    // confirm one of them really is violated.
                    let mut cfg = Config::default();
                    for (i, v) in &entries {
                        let val = check_value(RULES[*i].kind, SPECS[*i].path, v, "p").unwrap();
                        (RULES[*i].set)(&mut cfg, val);
                    }
                    prop_assert!(cross_check(&cfg, "p").is_err(), "spurious rejection of {}", key);
                }
                Err(other) => prop_assert!(false, "in-range values rejected: {}", other),
            }
        }
    }
}
