//! `TransferEngine`: TENT's engine class over [`tent::Engine`].
//!
//! Every call that can wait (engine start and stop, segments, memory,
//! submits, waits) runs with the GIL released. The only state here is
//! what TENT's address-based API needs and the Rust API hands out as
//! values: the `Buffer`s behind `allocate_local_memory` addresses, and the
//! buffer exports held while Python memory is registered.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tent::{BatchId, BlockList, Buffer, Config, Engine, ErrorKind, TaskState};

use crate::errors::{IntoPyResult, invalid, raise, to_py};
use crate::live::{Live, MemTable, wait_sliced};
use crate::memory::{Mem, U64s};
use crate::ring::Ring;
use crate::types::{
    Notification, OpCode, Request, SegmentInfo, SegmentInfoBuffer, TransferStatus, segment_id,
};

/// TENT's `TransferEngine(config_path)`.
#[pyclass(module = "tent", frozen)]
pub struct TransferEngine {
    live: RwLock<Option<Arc<Live>>>,
}

impl TransferEngine {
    /// The open engine, or `ShutdownError` once `close()`d.
    pub fn live(&self, py: Python<'_>) -> PyResult<Arc<Live>> {
        self.live
            .read()
            .expect("engine lock poisoned")
            .clone()
            .ok_or_else(|| raise(py, ErrorKind::Shutdown, "the engine was closed"))
    }
}

/// A configuration from what TENT's constructor takes: nothing
/// (`TENT_CONF` or the defaults), a path, inline JSON text (it starts with
/// `{`), or (beyond TENT) a dict.
fn config(py: Python<'_>, arg: Option<&Bound<'_, PyAny>>) -> PyResult<Config> {
    let Some(arg) = arg.filter(|a| !a.is_none()) else {
        return py.detach(Config::load).map_err(tent::Error::from).py(py);
    };
    let text: String = if arg.is_instance_of::<PyDict>() {
        py.import("json")?
            .call_method1("dumps", (arg,))?
            .extract()?
    } else if let Ok(s) = arg.cast::<PyString>() {
        s.to_str()?.to_owned()
    } else {
        // os.PathLike
        py.import("os")?.call_method1("fspath", (arg,))?.extract()?
    };
    py.detach(|| Config::from_path_or_json(&text, "TransferEngine(inline JSON)"))
        .map_err(tent::Error::from)
        .py(py)
}

fn secs(py: Python<'_>, timeout: Option<f64>) -> PyResult<Duration> {
    match timeout {
        None => Ok(Duration::MAX),
        Some(t) => Duration::try_from_secs_f64(t)
            .map_err(|_| invalid(py, format!("timeout {t}: expected seconds >= 0"))),
    }
}

#[pymethods]
impl TransferEngine {
    /// Start an engine. `config_path`: a JSON file's path, inline JSON
    /// text, a dict (each taken whole), or None (the defaults, then the
    /// `TENT_CONF` variable, then the `TENT_<KEY>` variables). The
    /// process's first engine sets what the module logs to stderr: its
    /// `log_level`, or the `TENT_LOG` filter; later ones do not change it.
    ///
    /// `attach`: the unix socket of the node's daemon (`tentd`) to attach
    /// to instead of starting an engine in this process (with
    /// `config_path` too, that configuration's `daemon_socket`; it may set
    /// only the keys that apply to a client). Memory from
    /// `allocate_local_memory` and rings then live in memory shared with
    /// the daemon, whose workers serve them; `register_local_memory` is
    /// refused (allocate through the engine), and so, for now, is cancel
    /// (`InvalidArgumentError` naming the call); tell peers
    /// `peer_address(addr)` and `get_segment_name()` (the daemon's
    /// segment with this engine's mailbox). `UnreachableError` when no
    /// daemon answers.
    #[new]
    #[pyo3(signature = (config_path=None, attach=None))]
    fn new(
        py: Python<'_>,
        config_path: Option<&Bound<'_, PyAny>>,
        attach: Option<std::path::PathBuf>,
    ) -> PyResult<TransferEngine> {
        let engine = match (attach, config_path.filter(|a| !a.is_none())) {
            (Some(socket), None) => {
                tent::stderr_log::install(tent::Config::default().log_level);
                py.detach(|| Engine::attach(socket)).py(py)?
            }
            (socket, config_path) => {
                let mut cfg = config(py, config_path)?;
                if let Some(socket) = socket {
                    cfg.daemon_socket = socket.display().to_string();
                }
                // The process's first engine sets what the module logs to
                // stderr (its `log_level`, or the `TENT_LOG` filter), unless
                // the process installed a `tracing` subscriber already.
                tent::stderr_log::install(cfg.log_level);
                py.detach(|| Engine::new(cfg)).py(py)?
            }
        };
        Ok(TransferEngine {
            live: RwLock::new(Some(Arc::new(Live {
                engine,
                mem: Mutex::new(MemTable::default()),
            }))),
        })
    }

    /// True until `close()`.
    fn available(&self) -> bool {
        self.live.read().expect("engine lock poisoned").is_some()
    }

    /// Stop the engine (beyond TENT; dropping the object does the same):
    /// its workers stop, its memory is freed and held buffers released.
    /// Later calls raise `ShutdownError`. Closing twice is a no-op.
    fn close(&self, py: Python<'_>) {
        let live = self.live.write().expect("engine lock poisoned").take();
        // Stopping joins the workers: without the GIL. A call running on
        // another thread keeps the engine until it returns.
        py.detach(move || drop(live));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// This engine's segment name (`ip:port`): what a peer passes to
    /// `open_segment`.
    fn get_segment_name(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.live(py)?.engine.segment_name())
    }

    /// Apply a new configuration (a path, inline JSON or a dict, as the
    /// constructor takes; beyond TENT): the reloadable keys
    /// (`tent::config::RELOADABLE`: failover budget, rail policy and
    /// selector, QoS intervals, `log_level`) take effect at the next
    /// decision that reads them; `log_level` sets what the whole process's
    /// module logs, unless `TENT_LOG` decides or the process installed its
    /// own subscriber. Returns the configuration generation. Raises
    /// `InvalidArgumentError`, applying nothing, naming each key that
    /// needs a restart, or why `log_level` cannot change.
    #[pyo3(signature = (config_path))]
    fn reload(&self, py: Python<'_>, config_path: &Bound<'_, PyAny>) -> PyResult<u64> {
        let live = self.live(py)?;
        let cfg = config(py, Some(config_path))?;
        py.detach(|| live.engine.reload(cfg)).py(py)
    }

    /// Open a peer's segment by name; returns its handle (`target_id`).
    fn open_segment(&self, py: Python<'_>, segment_name: &str) -> PyResult<u64> {
        let live = self.live(py)?;
        let id = py
            .detach(|| live.engine.open_segment(segment_name))
            .py(py)?;
        Ok(id.0)
    }

    /// Close a segment (waits until no task uses it).
    fn close_segment(&self, py: Python<'_>, handle: u64) -> PyResult<()> {
        let live = self.live(py)?;
        let id = segment_id(py, handle)?;
        py.detach(|| live.engine.close_segment(id)).py(py)
    }

    /// The regions a segment offers: `.buffers`, each with `base` and `length`.
    fn get_segment_info(&self, py: Python<'_>, handle: u64) -> PyResult<SegmentInfo> {
        let live = self.live(py)?;
        let id = segment_id(py, handle)?;
        let regions = py.detach(|| live.engine.segment_regions(id)).py(py)?;
        let buffers = regions
            .into_iter()
            .map(|r| {
                Py::new(
                    py,
                    SegmentInfoBuffer {
                        base: r.addr,
                        length: r.len,
                    },
                )
            })
            .collect::<PyResult<_>>()?;
        Ok(SegmentInfo { buffers })
    }

    /// Allocate `size` bytes of registered memory (zeroed; peers on this
    /// host reach it over shm); returns its address.
    fn allocate_local_memory(&self, py: Python<'_>, size: u64) -> PyResult<u64> {
        let live = self.live(py)?;
        let buf = py.detach(|| live.engine.allocate_memory(size)).py(py)?;
        let addr = buf.addr();
        live.mem
            .lock()
            .expect("memory table poisoned")
            .allocated
            .insert(addr, buf);
        Ok(addr)
    }

    /// The address a peer names memory `allocate_local_memory` returned
    /// by (`addr` itself for an engine in this process; where the daemon
    /// maps it for an attached one): tell peers this.
    fn peer_address(&self, py: Python<'_>, addr: u64) -> PyResult<u64> {
        let live = self.live(py)?;
        let mem = live.mem.lock().expect("memory table poisoned");
        match mem.allocated.get(&addr) {
            Some(b) => Ok(b.peer_addr()),
            None => {
                drop(mem);
                Err(not_from(py, &live, addr, "allocate_local_memory"))
            }
        }
    }

    /// Free memory `allocate_local_memory` returned (waits until no task
    /// uses it).
    fn free_local_memory(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        let live = self.live(py)?;
        let id = {
            let mem = live.mem.lock().expect("memory table poisoned");
            mem.allocated.get(&addr).map(Buffer::id)
        };
        let Some(id) = id else {
            return Err(not_from(py, &live, addr, "allocate_local_memory"));
        };
        py.detach(|| live.engine.unregister_memory(id)).py(py)?;
        let buf = live
            .mem
            .lock()
            .expect("memory table poisoned")
            .allocated
            .remove(&addr);
        py.detach(move || drop(buf));
        Ok(())
    }

    /// Register memory for transfers: `register_local_memory(addr, size)`
    /// (TENT: a raw address, trusted to stay valid until unregistered) or
    /// `register_local_memory(buffer[, size])` (a writable, contiguous
    /// buffer-protocol object, held until unregistered). Returns the
    /// address. `permission` (TENT's) is accepted and must be None.
    #[pyo3(signature = (addr, size=None, permission=None))]
    fn register_local_memory(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        size: Option<u64>,
        permission: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        if permission.is_some_and(|p| !p.is_none()) {
            return Err(invalid(
                py,
                "permission: tent registers memory read-write for peers; pass none",
            ));
        }
        let live = self.live(py)?;
        let (ptr, len, hold) = match Mem::extract(addr)? {
            Mem::Addr(a) => {
                let len = size.ok_or_else(|| invalid(py, "size is required with a raw address"))?;
                (a, len, None)
            }
            Mem::Buf(b) => {
                // Peers may write registered memory.
                b.require_writable(py, "registered memory is writable by peers")?;
                let len = size.unwrap_or(b.len());
                b.require_len(py, len)?;
                (b.addr(), len, Some(b))
            }
        };
        // A buffer's export is held in the table until unregister_local_memory
        // succeeds or the engine is dropped (the engine drops first: `Live`'s
        // field order); a raw address is the caller's promise, as in TENT.
        let register = || {
            // SAFETY: [ptr, ptr+len) stays valid while registered (see above).
            unsafe { live.engine.register_memory(ptr as *mut u8, len) }
        };
        let buf = py.detach(register).py(py)?;
        live.mem
            .lock()
            .expect("memory table poisoned")
            .registered
            .insert(ptr, (buf, hold));
        Ok(ptr)
    }

    /// Withdraw a registration (an address or the buffer registered);
    /// returns once the engine is done with the memory. `size` (TENT's) is
    /// ignored: the registration is found by its address.
    #[pyo3(signature = (addr, size=0))]
    fn unregister_local_memory(
        &self,
        py: Python<'_>,
        addr: &Bound<'_, PyAny>,
        size: u64,
    ) -> PyResult<()> {
        let _ = size;
        let live = self.live(py)?;
        let addr = Mem::extract(addr)?.addr();
        let id = {
            let mem = live.mem.lock().expect("memory table poisoned");
            mem.registered.get(&addr).map(|(b, _)| b.id())
        };
        let Some(id) = id else {
            return Err(not_from(py, &live, addr, "register_local_memory"));
        };
        py.detach(|| live.engine.unregister_memory(id)).py(py)?;
        // The export is released here, with the GIL.
        let entry = live
            .mem
            .lock()
            .expect("memory table poisoned")
            .registered
            .remove(&addr);
        drop(entry);
        Ok(())
    }

    /// A batch able to hold `batch_size` tasks; returns its id.
    fn allocate_transfer_batch(&self, py: Python<'_>, batch_size: usize) -> PyResult<u64> {
        let live = self.live(py)?;
        let id = py
            .detach(|| live.engine.allocate_batch(batch_size))
            .py(py)?;
        Ok(id.0)
    }

    /// Free a batch (refused while a task is pending, and twice).
    fn free_transfer_batch(&self, py: Python<'_>, batch_id: u64) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.engine.free_batch(BatchId(batch_id)))
            .py(py)
    }

    /// Submit `request_list` into a batch, all or nothing. With `notifi`
    /// (a `Notification`), the requests' target (one segment, opened by its
    /// `ip:port` name) receives it once all of their data has landed; the
    /// batch stays PENDING until it is delivered.
    #[pyo3(signature = (batch_id, request_list, notifi=None))]
    fn submit_transfer(
        &self,
        py: Python<'_>,
        batch_id: u64,
        request_list: Vec<PyRef<'_, Request>>,
        notifi: Option<PyRef<'_, Notification>>,
    ) -> PyResult<()> {
        let live = self.live(py)?;
        let sqes = request_list
            .iter()
            .map(|r| r.to_sqe(py, &live.engine))
            .collect::<PyResult<Vec<_>>>()?;
        let batch = BatchId(batch_id);
        match notifi.map(|n| n.to_tent()) {
            None => py.detach(|| live.engine.submit(batch, &sqes)).py(py),
            Some(n) => py
                .detach(|| live.engine.submit_with_notification(batch, &sqes, &n))
                .py(py),
        }
    }

    /// `submit_transfer` with `Notification(name, message)`.
    fn submit_transfer_notif(
        &self,
        py: Python<'_>,
        batch_id: u64,
        request_list: Vec<PyRef<'_, Request>>,
        name: String,
        message: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = Py::new(py, Notification::new(name, Some(message))?)?;
        self.submit_transfer(py, batch_id, request_list, Some(n.borrow(py)))
    }

    /// Beyond TENT: a block list in one call. Block `i` (`block_len`
    /// bytes) moves between local address `local_addrs[i]` and
    /// `remote_addrs[i]` in segment `target_id`; the address lists are
    /// uint64 arrays (numpy, `array('Q')`; read in place) or sequences of
    /// ints. A list is one task per local registration its blocks use (one,
    /// usually); returns how many tasks it appended to the batch.
    #[pyo3(signature = (batch_id, opcode, target_id, block_len, local_addrs, remote_addrs, priority=0))]
    #[allow(clippy::too_many_arguments)]
    fn submit_blocks(
        &self,
        py: Python<'_>,
        batch_id: u64,
        opcode: OpCode,
        target_id: u64,
        block_len: u64,
        local_addrs: &Bound<'_, PyAny>,
        remote_addrs: &Bound<'_, PyAny>,
        priority: u8,
    ) -> PyResult<usize> {
        let live = self.live(py)?;
        let local = U64s::extract(local_addrs, "local_addrs")?;
        let remote = U64s::extract(remote_addrs, "remote_addrs")?;
        let list = BlockList {
            opcode: opcode.into(),
            segment: segment_id(py, target_id)?,
            block_len,
            local_addrs: local.as_slice(),
            remote_addrs: remote.as_slice(),
            priority: crate::types::priority(py, priority)?,
        };
        py.detach(|| live.engine.submit_blocks(BatchId(batch_id), &list))
            .py(py)
    }

    /// Send `notifi` to the owner of segment `target_id` (opened by its
    /// `ip:port` name; 0: this engine); returns once it has it.
    fn send_notifi(
        &self,
        py: Python<'_>,
        target_id: u64,
        notifi: PyRef<'_, Notification>,
    ) -> PyResult<()> {
        let live = self.live(py)?;
        let segment = segment_id(py, target_id)?;
        let n = notifi.to_tent();
        drop(notifi);
        py.detach(|| live.engine.send_notification(segment, &n))
            .py(py)
    }

    /// Every notification received and not yet taken, oldest first, as
    /// `Notification`s (`.name`, `.msg`, and `.sender`); never blocks.
    fn recv_notifi(&self, py: Python<'_>) -> PyResult<Vec<Notification>> {
        let live = self.live(py)?;
        let got = py.detach(|| live.engine.recv_notifications());
        Ok(got.into_iter().map(Notification::from).collect())
    }

    /// Beyond TENT: the oldest notification not yet taken, waiting up to
    /// `timeout` seconds (None: until one comes); `TimeoutError` if none.
    #[pyo3(signature = (timeout=None))]
    fn wait_notifi(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Notification> {
        let live = self.live(py)?;
        let t = secs(py, timeout)?;
        let r = wait_sliced(
            py,
            t,
            || self.available(),
            |slice| live.engine.wait_notification(slice),
        )?;
        Ok(r.into())
    }

    /// Ask a batch's tasks (or one, `task_id`) to stop.
    #[pyo3(signature = (batch_id, task_id=None))]
    fn cancel_transfer(
        &self,
        py: Python<'_>,
        batch_id: u64,
        task_id: Option<usize>,
    ) -> PyResult<()> {
        let live = self.live(py)?;
        let b = BatchId(batch_id);
        py.detach(|| match task_id {
            Some(t) => live.engine.cancel_task(b, t),
            None => live.engine.cancel(b),
        })
        .py(py)
    }

    /// A task's status (`.state`, `.bytes`).
    fn get_transfer_status(
        &self,
        py: Python<'_>,
        batch_id: u64,
        task_id: usize,
    ) -> PyResult<TransferStatus> {
        let live = self.live(py)?;
        let s = py
            .detach(|| live.engine.status(BatchId(batch_id), task_id))
            .py(py)?;
        Ok(s.into())
    }

    /// Every submitted task's status.
    fn get_transfer_status_list(
        &self,
        py: Python<'_>,
        batch_id: u64,
    ) -> PyResult<Vec<TransferStatus>> {
        let live = self.live(py)?;
        let list = py
            .detach(|| live.engine.status_list(BatchId(batch_id)))
            .py(py)?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// One status for the whole batch.
    fn get_transfer_status_overall(
        &self,
        py: Python<'_>,
        batch_id: u64,
    ) -> PyResult<TransferStatus> {
        let live = self.live(py)?;
        let s = py
            .detach(|| live.engine.batch_status(BatchId(batch_id)))
            .py(py)?;
        Ok(s.into())
    }

    /// Beyond TENT: wait until nothing of the batch is in flight (`timeout`
    /// seconds, None: no bound) and return its overall status; raise the
    /// failure's class (e.g. `SegmentNotFoundError`) if it did not complete
    /// (at once, for a batch with nothing submitted), `TimeoutError` if
    /// still pending at `timeout`.
    #[pyo3(signature = (batch_id, timeout=None))]
    fn wait_transfer(
        &self,
        py: Python<'_>,
        batch_id: u64,
        timeout: Option<f64>,
    ) -> PyResult<TransferStatus> {
        let live = self.live(py)?;
        let t = secs(py, timeout)?;
        let s = wait_sliced(
            py,
            t,
            || self.available(),
            |slice| live.engine.wait_batch(BatchId(batch_id), slice),
        )?;
        match (s.state, s.error) {
            (TaskState::Completed, _) => Ok(s.into()),
            (state, Some(kind)) => Err(raise(
                py,
                kind,
                format!(
                    "batch {batch_id:#x} ended {:?} after {} bytes",
                    state, s.transferred_bytes
                ),
            )),
            (state, None) => Err(crate::errors::base(
                py,
                format!(
                    "batch {batch_id:#x} ended {state:?} after {} bytes",
                    s.transferred_bytes
                ),
            )),
        }
    }

    /// Beyond TENT: a submission/completion ring pair (the ring API);
    /// `depth` entries (a power of two; default: the config's).
    #[pyo3(signature = (depth=None))]
    fn ring(&self, py: Python<'_>, depth: Option<u32>) -> PyResult<Ring> {
        let live = self.live(py)?;
        let r = py
            .detach(|| match depth {
                Some(d) => live.engine.ring_with_depth(d),
                None => live.engine.ring(),
            })
            .py(py)?;
        Ok(Ring::new(&live, r))
    }

    fn __repr__(&self) -> String {
        match &*self.live.read().expect("engine lock poisoned") {
            Some(l) => format!("TransferEngine({:?})", l.engine.segment_name()),
            None => "TransferEngine(closed)".to_owned(),
        }
    }
}

/// The error for an address that `what` did not return: the engine's own
/// (`AddressNotRegistered`) when no region holds it, else InvalidArgument.
fn not_from(py: Python<'_>, live: &Live, addr: u64, what: &str) -> PyErr {
    match live.engine.local_addr(addr, 1) {
        Err(e) => to_py(py, e),
        Ok(_) => invalid(
            py,
            format!(
                "{addr:#x} was not returned by {what} (free what you allocated, unregister what you registered)"
            ),
        ),
    }
}
