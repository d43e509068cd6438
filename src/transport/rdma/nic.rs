//! The RDMA NICs an engine uses: each opened once, with its protection
//! domain, the port it talks through and that port's GID; and memory
//! registered on all of them at once (one rkey per NIC for the descriptor).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tent_rings::ErrorKind;

use crate::control::wire::NicEntry;
use crate::error::{Error, Result};
use crate::transport::rails::Sysfs;
use crate::transport::rdma::gid::GidChoice;
use crate::transport::rdma::layout::{self, MrLayout};
use crate::transport::rdma::qp_table::QpTable;
use crate::transport::rdma::sys::ffi;
use crate::transport::rdma::verbs::{
    Addressing, Context, MemoryRegion, ProtectionDomain, default_traffic_class, device_names,
};

/// Buffers at least this large are registered on every NIC at once.
const PARALLEL_REGISTRATION_BYTES: usize = 64 << 20;

/// What the configuration asks of every NIC (`transports/rdma/*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicOptions {
    /// `gid_index`: `None` chooses by type.
    pub gid_index: Option<u8>,
    /// `traffic_class`: `None` takes the port's, else the link's default.
    pub traffic_class: Option<u8>,
    /// `service_level`.
    pub service_level: u8,
}

/// The port every NIC is used through (multi-port NICs are one rail per
/// device here).
const PORT: u8 = 1;

/// One opened NIC.
pub struct Nic {
    /// Its device context.
    pub ctx: Arc<Context>,
    /// The protection domain all its QPs and MRs share.
    pub pd: Arc<ProtectionDomain>,
    /// Port number.
    pub port: u8,
    /// How its QPs are addressed (the GID may be chosen again when the
    /// port's table changes: `reselect_gid`).
    addressing: Mutex<Addressing>,
    /// The configured GID index, kept for a new choice.
    wanted_gid: Option<u8>,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU (an `ibv_mtu` value).
    pub mtu: u32,
    /// Largest message one work request may carry.
    pub max_msg: u32,
    /// The network device under the GID in use (RoCE), whose link state
    /// is the rail's: `(name, ifindex)`; chosen again with the GID.
    netdev: Mutex<Option<(String, u32)>>,
    /// The NUMA node the device hangs off (sysfs; `None` when unknown).
    pub numa_node: Option<u32>,
    /// The port's theoretical rate in Gbit/s (active speed × width; `None`
    /// when the port reports a code we do not know): where the rail's
    /// bandwidth estimate starts.
    pub speed_gbps: Option<f64>,
    /// Link state, kept by the RDMA transport's link watch (the netdev,
    /// RoCE) and its port events (`NicEvents`, any NIC); a rail whose local
    /// NIC is down takes no new slices.
    pub up: AtomicBool,
}

impl Nic {
    /// Its link went `up` or down, as `source` saw it (the link watch, a
    /// port event): logged on a change only, so the two sources of the
    /// same change log once. Returns whether it changed.
    pub(crate) fn set_link(&self, up: bool, source: &str) -> bool {
        let was = self.up.swap(up, Ordering::AcqRel);
        let name = self.ctx.name();
        if was && !up {
            tracing::warn!(
                nic = name,
                source,
                "rail down: link lost; in-flight slices move to sibling rails"
            );
        } else if !was && up {
            tracing::info!(nic = name, source, "rail up: link restored");
        }
        was != up
    }

    /// How new QPs on it are addressed.
    pub fn addressing(&self) -> Addressing {
        *self.addressing.lock()
    }

    /// The GID new QPs on it use.
    pub fn gid(&self) -> GidChoice {
        self.addressing.lock().gid
    }

    /// Choose the GID again (the port's table changed: an address came or
    /// went); QPs made from now on use the new choice. Returns whether it
    /// changed.
    pub(crate) fn reselect_gid(&self) -> Result<bool> {
        let choice = self.ctx.choose_gid(self.port, self.wanted_gid)?;
        let mut a = self.addressing.lock();
        if a.gid == choice {
            return Ok(false);
        }
        tracing::info!(nic = self.ctx.name(), old = a.gid.index, gid_index = choice.index, gid_type = ?choice.ty, why = choice.why, "RDMA GID chosen again after a GID table change");
        a.gid = choice;
        // The link watch follows the new GID's network device.
        *self.netdev.lock() = netdev_of(self.ctx.name(), self.port, choice.index);
        Ok(true)
    }

    /// The configured GID index (`transports/rdma/gid_index`), if any.
    pub(crate) fn wanted_gid(&self) -> Option<u8> {
        self.wanted_gid
    }

    /// The network device under the GID in use, `(name, ifindex)`, if any
    /// (RoCE).
    pub fn netdev(&self) -> Option<(String, u32)> {
        self.netdev.lock().clone()
    }

    /// Its ifindex.
    pub(crate) fn netdev_index(&self) -> Option<u32> {
        self.netdev.lock().as_ref().map(|(_, i)| *i)
    }

    /// Is the NIC's link up?
    #[inline]
    pub fn is_up(&self) -> bool {
        // Relaxed: a hint; a slice posted just as the link drops is moved
        // to another rail when its endpoint is evacuated.
        self.up.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("name", &self.ctx.name())
            .field("addressing", &self.addressing())
            .field("numa_node", &self.numa_node)
            .field("speed_gbps", &self.speed_gbps)
            .finish()
    }
}

/// The NICs in use, in a fixed order (descriptor rkeys follow it).
#[derive(Debug, Default)]
pub struct NicSet {
    nics: Vec<Nic>,
    /// Each live QP's controller, for QP-fatal async events.
    qps: QpTable,
}

impl NicSet {
    /// Open `wanted` (every device found when empty) as `opts` asks. A
    /// name not found is an error that lists the devices found; a device
    /// whose port is down is skipped when none were named, and an error
    /// when it was.
    pub fn open(wanted: &[String], opts: NicOptions) -> Result<NicSet> {
        let found = device_names()?;
        fork_protection();
        let names: Vec<String> = if wanted.is_empty() {
            found.clone()
        } else {
            for w in wanted {
                if !found.contains(w) {
                    return Err(Error::invalid(format!(
                        "no RDMA device named {w:?} (found: {})",
                        found.join(", ")
                    )));
                }
            }
            wanted.to_vec()
        };
        let mut nics = Vec::with_capacity(names.len());
        let mut skipped = Vec::new();
        for name in &names {
            match Self::open_one(name, opts) {
                Ok(n) => nics.push(n),
                Err(e) if wanted.is_empty() => {
                    tracing::warn!(device = %name, error = %e, "RDMA device skipped");
                    skipped.push(e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        if nics.is_empty() {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                no_usable(&found, &skipped),
            ));
        }
        Ok(NicSet {
            nics,
            qps: QpTable::default(),
        })
    }

    fn open_one(name: &str, opts: NicOptions) -> Result<Nic> {
        let ctx = Context::open(name)?;
        if let Err(why) = ctx.rc_capable() {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!("{name} is {why}: tent does not use it"),
            ));
        }
        let port = ctx.port(PORT)?;
        // IBV_PORT_ACTIVE
        if port.state != 4 {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!(
                    "{name} port {PORT} is {} (state {}), not ACTIVE",
                    port.state_name(),
                    port.state
                ),
            ));
        }
        let gid = ctx.choose_gid(PORT, opts.gid_index)?;
        let sysfs = Sysfs::default();
        let traffic_class = opts
            .traffic_class
            .or_else(|| port_traffic_class(&sysfs, name, PORT))
            .unwrap_or_else(|| default_traffic_class(port.link_layer));
        let addressing = Addressing {
            port: PORT,
            gid,
            link: port.link_layer,
            traffic_class,
            service_level: opts.service_level,
        };
        tracing::info!(
            nic = name,
            link = ?port.link_layer,
            gid_index = gid.index,
            gid_type = ?gid.ty,
            why = gid.why,
            traffic_class,
            service_level = opts.service_level,
            "RDMA NIC addressing chosen"
        );
        let pd = ProtectionDomain::new(&ctx)?;
        let speed_gbps = port.speed_gbps();
        if speed_gbps.is_none() {
            tracing::debug!(
                device = %name,
                active_speed = port.active_speed,
                active_width = port.active_width,
                "RDMA port speed unknown; the rail starts from the default bandwidth"
            );
        }
        Ok(Nic {
            ctx,
            pd,
            port: PORT,
            addressing: Mutex::new(addressing),
            wanted_gid: opts.gid_index,
            lid: port.lid,
            mtu: port.active_mtu,
            max_msg: port.max_msg_sz.max(4096),
            netdev: Mutex::new(netdev_of(name, PORT, gid.index)),
            numa_node: sysfs.ibdev_numa(name),
            speed_gbps,
            up: AtomicBool::new(true),
        })
    }

    /// The NICs, in descriptor order.
    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// The live QPs' send-queue controllers, by (NIC index, QP number).
    pub(crate) fn qps(&self) -> &QpTable {
        &self.qps
    }

    /// The NUMA nodes the NICs hang off (where their workers belong).
    pub(crate) fn numa_nodes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.nics.iter().filter_map(|n| n.numa_node).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The index of the NIC called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nics.iter().position(|n| n.ctx.name() == name)
    }

    /// What the descriptor says about them.
    pub fn entries(&self) -> Vec<NicEntry> {
        self.nics
            .iter()
            .map(|n| {
                let gid = n.gid();
                NicEntry {
                    name: n.ctx.name().to_owned(),
                    gid: gid.gid,
                    lid: n.lid,
                    mtu: n.mtu,
                    gid_type: gid.ty.map(|t| t.code()),
                    prefix: gid.prefix,
                }
            })
            .collect()
    }

    /// Register `[addr, addr+len)` on every NIC: one memory region each,
    /// or, past the smallest `max_mr_size` among them, overlapping chunks
    /// ([`MrLayout`]).
    ///
    /// # Safety
    /// The memory must stay mapped until the registration is dropped.
    pub unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Registration> {
        // Chunks as large as every NIC that can hold chunks takes; a NIC
        // too small for them (or, without chunks, for the region) refuses
        // its registration (typed, naming max_mr_size): left out.
        let max_mr = self
            .nics
            .iter()
            .map(|n| layout::max_mr_size(n.ctx.max_mr_size()))
            .filter(|&m| layout::can_chunk(m))
            .min()
            .unwrap_or(u64::MAX);
        let layout = MrLayout::new(len as u64, max_mr).unwrap_or(MrLayout::whole(len as u64));
        let parallel = if self.nics.len() > 1 && len >= PARALLEL_REGISTRATION_BYTES {
            // SAFETY: forwarded from the caller.
            unsafe { self.register_in_parallel(addr, layout) }
        } else {
            None
        };
        let results = parallel.unwrap_or_else(|| {
            self.nics
                .iter()
                // SAFETY: forwarded from the caller.
                .map(|n| unsafe { register_chunks(n, addr, layout) })
                .collect()
        });
        let mrs = keep_registered(results, |i, e| {
            crate::lograte::warn_limited!(
                ("registration-left-out", i),
                nic = self.nics[i].ctx.name(),
                error = %e,
                "rdma: memory not registered on this NIC; its rails avoid the region"
            );
        })?;
        Ok(Registration { layout, mrs })
    }

    /// [`register`](Self::register) with one thread per NIC (pinning the
    /// pages of a large buffer takes as long on each NIC); `None` when a
    /// thread could not be started, and the caller registers in turn.
    ///
    /// # Safety
    /// As `register`.
    unsafe fn register_in_parallel(
        &self,
        addr: *mut u8,
        layout: MrLayout,
    ) -> Option<Vec<Result<Vec<MemoryRegion>>>> {
        // A raw pointer is not Send; the address crosses as an integer.
        let at = addr as usize;
        std::thread::scope(|s| {
            let mut threads = Vec::with_capacity(self.nics.len());
            for n in &self.nics {
                let t = std::thread::Builder::new()
                    .name("tent-reg-mr".into())
                    // SAFETY: forwarded from the caller; the scope joins every thread before returning.
                    .spawn_scoped(s, move || unsafe {
                        register_chunks(n, at as *mut u8, layout)
                    })
                    .ok()?;
                threads.push(t);
            }
            // Joined in NIC order.
            Some(
                threads
                    .into_iter()
                    .map(|t| {
                        t.join().unwrap_or_else(|_| {
                            Err(Error::new(
                                ErrorKind::LocalNicFailed,
                                "a registration thread panicked",
                            ))
                        })
                    })
                    .collect(),
            )
        })
    }
}

/// The error when no device `found` could be opened: each one's name and
/// why it was `skipped` (in the same order).
fn no_usable(found: &[String], skipped: &[String]) -> String {
    if skipped.is_empty() {
        return format!("no usable RDMA device (found: {})", found.join(", "));
    }
    format!(
        "no usable RDMA device (found: {}; skipped: {})",
        found.join(", "),
        skipped.join("; ")
    )
}

/// `layout`'s chunks of the memory at `addr`, registered on `nic`: all of
/// them, or the first failure.
///
/// # Safety
/// The memory must stay mapped until the regions are dropped.
unsafe fn register_chunks(nic: &Nic, addr: *mut u8, layout: MrLayout) -> Result<Vec<MemoryRegion>> {
    (0..layout.chunks())
        .map(|k| {
            let (off, len) = layout.chunk(k);
            // Inside the region: `chunk` stays within its length.
            let at = addr.wrapping_add(off as usize);
            // SAFETY: `[at, at+len)` lies in the caller's mapped memory.
            unsafe { MemoryRegion::new(&nic.pd, at, len as usize) }
        })
        .collect()
}

/// The network device a RoCE GID belongs to, from sysfs
/// (`ports/<p>/gid_attrs/ndevs/<i>`); `None` on InfiniBand.
fn netdev_of(dev: &str, port: u8, gid_index: u8) -> Option<(String, u32)> {
    let base = std::path::Path::new("/sys/class/infiniband").join(dev);
    let path = base.join(format!("ports/{port}/gid_attrs/ndevs/{gid_index}"));
    let name = std::fs::read_to_string(path).ok()?.trim().to_owned();
    let index = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((name, index))
}

/// Per-NIC registration results as a registration: a NIC that failed is
/// left out (`None`, reported through `left_out`) as long as one NIC holds
/// the memory; when none does, the first failure.
fn keep_registered<T>(
    results: Vec<Result<T>>,
    mut left_out: impl FnMut(usize, &Error),
) -> Result<Vec<Option<T>>> {
    if !results.iter().any(Result::is_ok) {
        return Err(results
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_else(|| {
                Error::new(ErrorKind::LocalNicFailed, "no RDMA NIC to register on")
            }));
    }
    Ok(results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.inspect_err(|e| left_out(i, e)).ok())
        .collect())
}

/// What to do so that a `fork()` of the application cannot leave the NIC
/// writing into pages its parent no longer sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForkPlan {
    /// The kernel copies DMA pages on fork (5.13 and later).
    Unneeded,
    /// Someone called `ibv_fork_init` already (or `RDMAV_FORK_SAFE` is set).
    AlreadyOn,
    /// Call `ibv_fork_init` before the first registration.
    Init,
}

fn fork_plan(status: ffi::ibv_fork_status) -> ForkPlan {
    match status {
        ffi::ibv_fork_status::IBV_FORK_UNNEEDED => ForkPlan::Unneeded,
        ffi::ibv_fork_status::IBV_FORK_ENABLED => ForkPlan::AlreadyOn,
        _ => ForkPlan::Init,
    }
}

/// Make registrations fork-safe, once per process, before the first one
/// (`ibv_fork_init` refuses once memory is registered): needed only where
/// the kernel does not copy DMA pages on fork itself.
fn fork_protection() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(lib) = crate::transport::rdma::verbs::lib() else {
            return;
        };
        if lib.ibv_is_fork_initialized.is_err() || lib.ibv_fork_init.is_err() {
            tracing::warn!("rdma: libibverbs cannot report fork protection; an application that forks should set RDMAV_FORK_SAFE=1");
            return;
        }
        // SAFETY: takes no arguments, reads the library's state.
        let plan = fork_plan(unsafe { lib.ibv_is_fork_initialized() });
        match plan {
            ForkPlan::Unneeded | ForkPlan::AlreadyOn => {
                tracing::debug!(?plan, "rdma: fork protection")
            }
            ForkPlan::Init => {
                // SAFETY: takes no arguments; called before any registration of this process's.
                let rc = unsafe { lib.ibv_fork_init() };
                if rc == 0 {
                    tracing::info!("rdma: fork protection enabled (ibv_fork_init): the kernel does not copy DMA pages on fork");
                } else {
                    tracing::warn!(rc, "rdma: ibv_fork_init failed; an application that forks may see the NIC write into pages only the child holds");
                }
            }
        }
    });
}

/// The traffic class a port is configured with (sysfs
/// `tc/<port>/traffic_class`, which mlx5 exposes as `Global tclass=106`
/// once an administrator sets one); `None` when it says nothing.
fn port_traffic_class(sysfs: &Sysfs, dev: &str, port: u8) -> Option<u8> {
    parse_traffic_class(&sysfs.ibdev_text(dev, &format!("tc/{port}/traffic_class"))?)
}

/// `Global tclass=106`, or a bare number.
fn parse_traffic_class(text: &str) -> Option<u8> {
    let value = match text.find("tclass=") {
        Some(at) => &text[at + "tclass=".len()..],
        None => text,
    };
    value
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

/// Memory registered on every NIC of a [`NicSet`]; deregistered on drop
/// (an engine's region drops it when `unregister_memory` has drained the
/// region: `MemRegion::release_rdma`, not with the region's last holder).
pub struct Registration {
    layout: MrLayout,
    /// Per NIC, its chunks; `None` where registering failed and others
    /// did not.
    mrs: Vec<Option<Vec<MemoryRegion>>>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("rkeys", &self.rkeys())
            .finish()
    }
}

impl Registration {
    /// How the region is cut on every NIC.
    pub(crate) fn layout(&self) -> MrLayout {
        self.layout
    }

    /// The rkeys, NIC by NIC, each NIC's chunks in order
    /// ([`MrLayout::chunks`] per NIC); 0 (no access, what peers read as
    /// such) where the NIC holds no registration.
    pub fn rkeys(&self) -> Vec<u32> {
        self.keys(MemoryRegion::rkey)
            .into_iter()
            .map(|k| k.unwrap_or(0))
            .collect()
    }

    /// The lkeys, laid out as [`Registration::rkeys`]; `None` where the
    /// NIC holds no registration.
    pub fn lkeys(&self) -> Vec<Option<u32>> {
        self.keys(MemoryRegion::lkey)
    }

    /// The lkey of chunk 0 on NIC `i`; `None` where it holds no
    /// registration.
    pub fn lkey(&self, i: usize) -> Option<u32> {
        self.mrs.get(i)?.as_ref()?.first().map(MemoryRegion::lkey)
    }

    fn keys(&self, key: impl Fn(&MemoryRegion) -> u32) -> Vec<Option<u32>> {
        let chunks = self.layout.chunks();
        let mut out = Vec::with_capacity(self.mrs.len() * chunks);
        for m in &self.mrs {
            out.extend((0..chunks).map(|k| m.as_ref().and_then(|c| c.get(k)).map(&key)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nic_that_cannot_register_is_left_out_unless_none_can() {
        let fail = |m: &'static str| Err(Error::new(ErrorKind::OutOfMemory, m));
        let mut out = Vec::new();
        let kept = keep_registered(vec![Ok(1), fail("efa"), Ok(3)], |i, _| out.push(i)).unwrap();
        assert_eq!(kept, [Some(1), None, Some(3)]);
        assert_eq!(out, [1]);
        let e = keep_registered::<u32>(vec![fail("first"), fail("second")], |_, _| {}).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("first"), "{e}");
        assert!(keep_registered::<u32>(Vec::new(), |_, _| {}).is_err());
    }

    #[test]
    fn no_usable_device_names_each_one_found_and_why_it_was_skipped() {
        let found = ["rxe0".to_owned(), "mlx5_0".to_owned()];
        let why = [
            "rxe0 port 1 is DOWN (state 1), not ACTIVE".to_owned(),
            "mlx5_0 port 1: no RoCE GID on a network device that is up; the table has no entry"
                .to_owned(),
        ];
        let m = no_usable(&found, &why);
        assert_eq!(
            m,
            "no usable RDMA device (found: rxe0, mlx5_0; skipped: rxe0 port 1 is DOWN \
             (state 1), not ACTIVE; mlx5_0 port 1: no RoCE GID on a network device that is up; the table has no entry)"
        );
        assert_eq!(
            no_usable(&found, &[]),
            "no usable RDMA device (found: rxe0, mlx5_0)"
        );
    }

    #[test]
    fn fork_init_runs_only_where_the_kernel_does_not_copy_dma_pages() {
        use ffi::ibv_fork_status as S;
        assert_eq!(fork_plan(S::IBV_FORK_DISABLED), ForkPlan::Init);
        assert_eq!(fork_plan(S::IBV_FORK_ENABLED), ForkPlan::AlreadyOn);
        assert_eq!(fork_plan(S::IBV_FORK_UNNEEDED), ForkPlan::Unneeded);
    }

    #[test]
    fn a_port_traffic_class_reads_as_mlx5_writes_it() {
        assert_eq!(parse_traffic_class("Global tclass=106"), Some(106));
        assert_eq!(parse_traffic_class("Global tclass=96\n"), Some(96));
        assert_eq!(parse_traffic_class("104"), Some(104));
        assert_eq!(parse_traffic_class(""), None);
        assert_eq!(parse_traffic_class("Global tclass=300"), None);
        assert_eq!(parse_traffic_class("tclass=x"), None);
    }
}
