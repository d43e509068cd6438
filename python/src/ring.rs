//! The ring API from Python (beyond TENT): push requests, submit them in
//! one publish, reap completions.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pyo3::prelude::*;
use tent::ErrorKind;

use crate::errors::{IntoPyResult, invalid, raise};
use crate::live::{Live, wait_sliced};
use crate::types::{Completion, Request};

/// A submission/completion ring pair, from `TransferEngine.ring()`. Any
/// thread may use it; calls on one ring are serialised.
#[pyclass(module = "tent", frozen)]
pub struct Ring {
    /// The engine, for address lookups; a ring does not keep it open.
    live: Weak<Live>,
    ring: Mutex<tent::Ring>,
}

impl Ring {
    pub fn new(live: &Arc<Live>, ring: tent::Ring) -> Ring {
        Ring {
            live: Arc::downgrade(live),
            ring: Mutex::new(ring),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, tent::Ring> {
        self.ring.lock().expect("ring poisoned")
    }
}

#[pymethods]
impl Ring {
    /// Push `request` with token `user_data` (echoed in its completion)
    /// and publish it. `SqFullError` when the ring has no free slot.
    #[pyo3(signature = (request, user_data=0))]
    fn push(&self, py: Python<'_>, request: PyRef<'_, Request>, user_data: u64) -> PyResult<()> {
        self.submit(py, vec![request], Some(vec![user_data]))
            .map(|_| ())
    }

    /// Push every request of `requests` (tokens `user_data[i]`, default
    /// the index) and publish them at once: all or nothing, `SqFullError`
    /// with none pushed when the ring has not room for all. Returns how
    /// many.
    #[pyo3(signature = (requests, user_data=None))]
    fn submit(
        &self,
        py: Python<'_>,
        requests: Vec<PyRef<'_, Request>>,
        user_data: Option<Vec<u64>>,
    ) -> PyResult<usize> {
        let live = self
            .live
            .upgrade()
            .ok_or_else(|| raise(py, ErrorKind::Shutdown, "the engine was closed"))?;
        let tokens = user_data.unwrap_or_else(|| (0..requests.len() as u64).collect());
        if tokens.len() != requests.len() {
            return Err(invalid(
                py,
                format!(
                    "{} requests but {} user_data tokens",
                    requests.len(),
                    tokens.len()
                ),
            ));
        }
        let sqes = requests
            .iter()
            .zip(tokens)
            .map(|(r, u)| Ok(r.to_sqe(py, &live.engine)?.with_user_data(u)))
            .collect::<PyResult<Vec<_>>>()?;
        drop(live);
        let pushed = py.detach(|| {
            let mut ring = self.ring();
            let mut sq = ring.submission();
            if sq.slots() < sqes.len() {
                return Err(sq.slots());
            }
            for sqe in &sqes {
                // Room was checked above, and only this thread pushes.
                let _ = sq.push(*sqe);
            }
            // Dropping the submission side publishes.
            Ok(sqes.len())
        });
        let n = pushed.map_err(|free| {
            raise(
                py,
                ErrorKind::SqFull,
                format!(
                    "the submission ring has {free} free slots for {} requests: reap completions first; none pushed",
                    sqes.len()
                ),
            )
        })?;
        // A stopped engine: what was published gets no completion.
        py.detach(|| self.ring().submit()).py(py)?;
        Ok(n)
    }

    /// Every completion ready now (never blocks).
    fn completions(&self, py: Python<'_>) -> Vec<Completion> {
        let got: Vec<tent::Cqe> = py.detach(|| self.ring().completion().collect());
        got.into_iter().map(Completion::from).collect()
    }

    /// Wait up to `timeout` seconds (None: no bound) until a completion
    /// is ready; return every ready one. `TimeoutError` if none came.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<Completion>> {
        let t = match timeout {
            None => Duration::MAX,
            Some(t) => Duration::try_from_secs_f64(t)
                .map_err(|_| invalid(py, format!("timeout {t}: expected seconds >= 0")))?,
        };
        wait_sliced(
            py,
            t,
            || self.live.strong_count() > 0,
            |slice| self.ring().wait_ready(slice),
        )?;
        Ok(self.completions(py))
    }

    /// Turn inline issue on (the default where the engine's
    /// `inline_max_bytes` is not 0) or off for this ring: on, a small local
    /// or shm request is performed by `submit` itself, its completion
    /// ready when the call returns; off, every request goes to the worker.
    fn set_inline(&self, on: bool) {
        self.ring().set_inline(on);
    }

    /// An eventfd (an int the ring owns: do not close it) that turns
    /// readable when the worker posts completions while the ring is about
    /// to sleep (`prepare_wait`): wait on it with `selectors`, `select` or
    /// asyncio's `loop.add_reader` (remove it before the ring goes). One
    /// waiter per ring: `wait()` clears the same flag.
    fn completion_fd(&self, py: Python<'_>) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        let mut ring = self.ring();
        let fd = ring.completion_fd().py(py)?;
        Ok(fd.as_raw_fd())
    }

    /// Say the caller is about to sleep on `completion_fd`: True when it
    /// may (the worker writes the fd for the next completions), False when
    /// a completion is already there (call `completions` instead). After
    /// waking, call `finish_wait`.
    fn prepare_wait(&self) -> bool {
        self.ring().prepare_wait()
    }

    /// The sleep is over: the worker stops writing the fd, and its counter
    /// is drained.
    fn finish_wait(&self) {
        self.ring().finish_wait();
    }

    /// The number of entries the ring holds.
    #[getter]
    fn capacity(&self) -> usize {
        self.ring().submission().capacity()
    }
}
