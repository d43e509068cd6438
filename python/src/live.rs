//! What an open `TransferEngine` holds (`Live`), and the GIL-free wait
//! every blocking call runs through (`wait_sliced`): shared by the engine
//! and the ring classes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tent::{Buffer, Engine, ErrorKind};

use crate::errors::{IntoPyResult, raise};
use crate::memory::Exported;

/// An open engine and the memory the binding keeps for it. Fields drop in
/// order: the engine (its workers stopped) before the memory it may use.
pub struct Live {
    pub engine: Engine,
    pub(crate) mem: Mutex<MemTable>,
}

#[derive(Default)]
pub(crate) struct MemTable {
    /// `allocate_local_memory` addresses.
    pub(crate) allocated: HashMap<u64, Buffer>,
    /// `register_local_memory` addresses, with the buffer export (if the
    /// memory came from a Python object) held while registered.
    pub(crate) registered: HashMap<u64, (Buffer, Option<Exported>)>,
}

/// How long one wait runs with the GIL released before Python's signal
/// handlers get a turn (Ctrl-C interrupts a long wait).
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Run `wait(slice)` (a wait that fails `Timeout` when its slice passes)
/// until it returns otherwise or `timeout` has passed, without the GIL,
/// running Python's signal handlers between slices; `ShutdownError` when
/// `open()` turns false meanwhile (closed from another thread).
pub fn wait_sliced<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    open: impl Fn() -> bool,
    wait: impl Fn(Duration) -> tent::Result<T> + Sync,
) -> PyResult<T> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        let slice = left.min(WAIT_SLICE);
        match py.detach(|| wait(slice)) {
            Err(e) if e.kind() == ErrorKind::Timeout && slice < left => {
                py.check_signals()?;
                if !open() {
                    return Err(raise(py, ErrorKind::Shutdown, "the engine was closed"));
                }
            }
            r => return r.py(py),
        }
    }
}
