//! `tent_engine_t`: an engine behind an opaque pointer; create from JSON
//! (or a file, or the environment), destroy, and its names.

use std::ffi::{c_char, c_int};
use std::path::Path;

use tent::{Config, Engine, Result};

use crate::boundary::{arg, c_str, copy_str, out, put};
use crate::error::call;

/// An engine (opaque). Created by `tent_engine_create*`, released by
/// `tent_engine_destroy`; every other function borrows it and may be
/// called from any thread.
#[derive(Debug)]
pub struct tent_engine_t {
    pub(crate) engine: Engine,
}

/// The engine behind a handle, or `InvalidArgument` for NULL.
///
/// # Safety
/// A non-NULL `p` came from `tent_engine_create*` and is not destroyed.
pub(crate) unsafe fn engine<'a>(p: *const tent_engine_t) -> Result<&'a Engine> {
    // SAFETY: forwarded from the caller.
    Ok(&unsafe { arg(p, "engine") }?.engine)
}

/// Start an engine from `config`, logging at its `log_level` to stderr
/// when it is the process's first and the process installed no `tracing`
/// subscriber of its own (`TENT_LOG` overrides the level).
fn start(config: Config) -> Result<Engine> {
    tent::stderr_log::install(config.log_level);
    Engine::new(config)
}

/// Hand a new engine to C.
///
/// # Safety
/// `out_engine` passed [`out`].
unsafe fn hand_out(engine: Engine, out_engine: *mut *mut tent_engine_t) {
    let handle = Box::into_raw(Box::new(tent_engine_t { engine }));
    // SAFETY: checked non-NULL by the caller; a pointer-sized write.
    unsafe { put(out_engine, handle) };
}

/// Start an engine from JSON text (`transfer-engine.json`'s keys; keys
/// left out keep their defaults). `config_json` NULL: the defaults, then
/// the configuration `TENT_CONF` names (inline JSON or a file), then one
/// `TENT_<KEY>` environment variable per key.
/// `*out_engine` gets the engine. The process's first engine sets what
/// the library logs to stderr (`log_level`, or the `TENT_LOG` filter).
/// Later engines do not change it (one asking for another level logs a warning).
/// Not at all if the process installed a Rust `tracing` subscriber first.
///
/// # Safety
/// `config_json` is NULL or a NUL-terminated string; `out_engine` is
/// valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_engine_create(
    config_json: *const c_char,
    out_engine: *mut *mut tent_engine_t,
) -> c_int {
    call("tent_engine_create", || {
        out(out_engine, "out_engine")?;
        let config = if config_json.is_null() {
            Config::load()?
        } else {
            // SAFETY: non-NULL and NUL-terminated (caller).
            let text = unsafe { c_str(config_json, "config_json") }?;
            Config::from_json_str(text, "tent_engine_create")?
        };
        let engine = start(config)?;
        // SAFETY: checked above.
        unsafe { hand_out(engine, out_engine) };
        Ok(())
    })
}

/// Start an engine from a JSON configuration file (logging as
/// `tent_engine_create`).
///
/// # Safety
/// `path` is a NUL-terminated string; `out_engine` is valid for one
/// pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_engine_create_from_file(
    path: *const c_char,
    out_engine: *mut *mut tent_engine_t,
) -> c_int {
    call("tent_engine_create_from_file", || {
        out(out_engine, "out_engine")?;
        // SAFETY: the caller passes a NUL-terminated string (NULL is refused).
        let path = unsafe { c_str(path, "path") }?;
        let engine = start(Config::from_file(Path::new(path))?)?;
        // SAFETY: checked above.
        unsafe { hand_out(engine, out_engine) };
        Ok(())
    })
}

/// Attach to the node's daemon (`tentd`) listening at the unix socket
/// `socket_path` instead of starting an engine in this process: memory
/// (`tent_allocate_memory`), rings and segments come from the daemon, and
/// its workers serve this process's rings in shared memory, with no system
/// call on the busy path. `tent_engine_create` with the `daemon_socket` key
/// does the same from a configuration (with `daemon_embed_fallback`, an
/// engine is embedded where no daemon answers). `*out_engine` gets the
/// engine, destroyed by `tent_engine_destroy` (which detaches).
///
/// Fails `TENT_ERR_UNREACHABLE` when no daemon answers there,
/// `TENT_ERR_ACCESS_DENIED` when it runs as another user, and
/// `TENT_ERR_INVALID_ARGUMENT` on a layout version mismatch (the message
/// names both). An attached engine refuses `tent_register_memory`
/// (allocate through the engine instead: the daemon cannot reach this
/// process's heap) and, for now, cancel, each
/// `TENT_ERR_INVALID_ARGUMENT` naming the call. Tell peers a buffer's
/// `peer_addr` (where the daemon maps it) and `tent_segment_name` (the
/// daemon's segment with this engine's mailbox: its notifications come
/// here); once
/// the daemon has gone, calls fail `TENT_ERR_SHUTDOWN` and
/// `tent_ring_wait` returns it instead of waiting.
///
/// # Safety
/// `socket_path` is a NUL-terminated string; `out_engine` is valid for
/// one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_engine_attach(
    socket_path: *const c_char,
    out_engine: *mut *mut tent_engine_t,
) -> c_int {
    call("tent_engine_attach", || {
        out(out_engine, "out_engine")?;
        // SAFETY: the caller passes a NUL-terminated string (NULL is refused).
        let path = unsafe { c_str(socket_path, "socket_path") }?;
        let engine = Engine::attach(path)?;
        // SAFETY: checked above.
        unsafe { hand_out(engine, out_engine) };
        Ok(())
    })
}

/// Apply a new configuration to a running engine (JSON text as for
/// `tent_engine_create`): the keys `tent::config::RELOADABLE` lists (the
/// failover budget, the rail policy and selector, the QoS intervals,
/// `log_level`) take effect at the next decision that reads them.
/// `log_level` sets what this process's library logs (all its engines),
/// unless `TENT_LOG` decides or the process installed its own Rust
/// subscriber: the reload is then refused. `*out_generation` (may be
/// NULL) gets the configuration generation now.
///
/// Fails `TENT_ERR_INVALID_ARGUMENT`, applying nothing, when the text does
/// not validate or changes a key that needs a restart (the message, from
/// `tent_last_error_message`, names each).
///
/// # Safety
/// `engine` is a live engine; `config_json` a NUL-terminated string;
/// `out_generation` NULL or valid for one `uint64_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_engine_reload(
    engine: *const tent_engine_t,
    config_json: *const c_char,
    out_generation: *mut u64,
) -> c_int {
    call("tent_engine_reload", || {
        // SAFETY: a live engine (caller).
        let engine = unsafe { self::engine(engine) }?;
        // SAFETY: NUL-terminated (caller); NULL is refused.
        let text = unsafe { c_str(config_json, "config_json") }?;
        let generation = engine.reload(Config::from_json_str(text, "tent_engine_reload")?)?;
        if !out_generation.is_null() {
            // SAFETY: non-NULL and valid for a u64 write (caller).
            unsafe { put(out_generation, generation) };
        }
        Ok(())
    })
}

/// Stop an engine and release it: when this returns, the engine touches
/// no memory it was given. NULL is a no-op. Rings created from it stay
/// valid to destroy; their calls then fail `TENT_ERR_SHUTDOWN`. Using the
/// engine pointer afterwards is undefined (as for `free`).
///
/// # Safety
/// `engine` is NULL or came from `tent_engine_create*` and was not
/// destroyed; no other thread uses it during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_engine_destroy(engine: *mut tent_engine_t) {
    if engine.is_null() {
        return;
    }
    // A panic while stopping is recorded as the thread's last error; the
    // function has no code to return it with.
    call("tent_engine_destroy", || {
        // SAFETY: it came from Box::into_raw in hand_out and is released once (caller).
        drop(unsafe { Box::from_raw(engine) });
        Ok(())
    });
}

/// This engine's segment name (TENT's: `ip:port` of its control server),
/// what a peer passes to `tent_open_segment`. Copied with its NUL into
/// `buf` of `len` bytes; a smaller buffer is `TENT_ERR_INVALID_ARGUMENT`
/// (the message says the length needed) and is left as it was.
///
/// # Safety
/// `engine` is a live engine; `buf` is valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_segment_name(
    engine: *const tent_engine_t,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    call("tent_segment_name", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: `len` writable bytes at `buf` (caller).
        unsafe { copy_str(&e.segment_name(), buf, len, "segment name") }
    })
}

/// The name of this engine's shared-memory segment (a peer on this host
/// may open it directly), or `""` when shm is off. Copied as
/// `tent_segment_name` copies.
///
/// # Safety
/// As `tent_segment_name`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_local_segment_name(
    engine: *const tent_engine_t,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    call("tent_local_segment_name", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        let name = e.local_segment_name().unwrap_or("");
        // SAFETY: `len` writable bytes at `buf` (caller).
        unsafe { copy_str(name, buf, len, "local segment name") }
    })
}
