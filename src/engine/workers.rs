//! The engine's workers: their threads, what each shares with the API
//! side, and which one takes the next ring or batch.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tent_rings::{ErrorKind, Sqe, spsc};

use super::EngineShared;
use super::worker::{RegionAck, Worker, WorkerShared};
use crate::doorbell::Wakers;
use crate::error::{Error, Result};
use crate::flow::SqController;
use crate::topology::pin_current_thread;
use crate::transport::{EngineId, WorkerCtx};

/// The running workers, one thread each. Dropping the pool stops and
/// joins them (after every task was stopped and every slice came back:
/// `Worker::drain_on_shutdown`).
pub(super) struct WorkerPool {
    shared: Vec<Arc<WorkerShared>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Round-robin cursor for new rings and batches.
    next: AtomicUsize,
}

/// `WorkerShared::core` until the worker's thread has tried to pin itself.
const PIN_PENDING: i64 = -2;
impl WorkerPool {
    /// Start one worker per entry of `cores` (pinned where it names a
    /// core) for engine `id`. On an error the workers started so far are
    /// stopped and joined.
    pub(super) fn start(
        engine: &Arc<EngineShared>,
        id: EngineId,
        cores: Vec<Option<usize>>,
        wakers: &Arc<Wakers>,
    ) -> Result<WorkerPool> {
        let depth = engine.config.batch_ring_depth();
        let inflight = engine.config.max_inflight_slices;
        let mut pool = WorkerPool {
            shared: Vec::with_capacity(cores.len()),
            threads: Mutex::new(Vec::with_capacity(cores.len())),
            next: AtomicUsize::new(0),
        };
        for (index, core) in cores.into_iter().enumerate() {
            let (bp, bc) = spsc::channel::<Sqe>(depth)
                .map_err(|e| Error::invalid("batch ring").with_source(e))?;
            let ws = Arc::new(WorkerShared {
                index,
                wakers: wakers.clone(),
                new_rings: Mutex::new(Vec::new()),
                has_new: CachePadded::new(AtomicBool::new(false)),
                shutdown: CachePadded::new(AtomicBool::new(false)),
                exited: CachePadded::new(AtomicBool::new(false)),
                batch_sq: Mutex::new(bp),
                core: AtomicI64::new(PIN_PENDING),
                // Nobody waits on a worker's window: the slice length is moot.
                credits: std::array::from_fn(|_| {
                    SqController::new(inflight, 0, Duration::from_millis(1))
                }),
                ops: CachePadded::new(Default::default()),
                region_ack: CachePadded::new(RegionAck::default()),
                qos: CachePadded::new(crate::qos::PriorityStats::default()),
            });
            let (ws2, engine) = (ws.clone(), engine.clone());
            let handle = std::thread::Builder::new()
                .name(format!("tent-worker-{index}"))
                .spawn(move || {
                    // However the thread ends, a panic included, the
                    // worker says it has exited: submitters stop waiting on
                    // it, and /health says so.
                    let _exit = ExitMark(ws2.clone());
                    let pinned = match core {
                        Some(core) if pin_current_thread(core) => core as i64,
                        _ => -1,
                    };
                    ws2.core.store(pinned, Ordering::Release);
                    // SAFETY: `id` is this engine's alone (EngineId::next) and it starts one thread per worker index: this is worker `index`'s, and the context (`!Send`) never leaves it.
                    let ctx = unsafe { WorkerCtx::new(id, index) };
                    Worker::new(ws2, engine, bc, ctx).run();
                })
                .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn worker").with_source(e))?;
            pool.shared.push(ws);
            pool.threads.get_mut().push(handle);
        }
        // Each worker's pinning is known once `Engine::new` returns (what
        // `worker_cores` and the topology report say), not whenever its
        // thread first runs: a start-up wait of a thread's first steps.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while pool
            .shared
            .iter()
            .any(|w| w.core.load(Ordering::Acquire) == PIN_PENDING)
            && std::time::Instant::now() < until
        {
            std::thread::yield_now();
        }
        Ok(pool)
    }

    /// The worker that takes the next ring or batch (round robin), with
    /// its index.
    pub(super) fn next(&self) -> (usize, &Arc<WorkerShared>) {
        let n = self.shared.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        // A worker that exited (its thread panicked) takes nothing new;
        // with every worker gone, the one in turn (its user sees
        // `Shutdown`).
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.shared[i].exited.load(Ordering::Acquire))
            .unwrap_or(start);
        (i, &self.shared[i])
    }

    /// Ask every worker to stop, wake it, and join its thread (once).
    pub(super) fn stop(&self) {
        for w in &self.shared {
            w.shutdown.store(true, Ordering::Release);
            w.doorbell().ring();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for h in threads {
            let _ = h.join();
        }
    }
}

impl std::ops::Deref for WorkerPool {
    type Target = [Arc<WorkerShared>];

    /// What each worker shares, by index.
    fn deref(&self) -> &[Arc<WorkerShared>] {
        &self.shared
    }
}

/// Marks its worker exited when dropped (see `WorkerPool::start`).
struct ExitMark(Arc<WorkerShared>);

impl Drop for ExitMark {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(
                worker = self.0.index,
                "worker thread panicked; it serves nothing more (the engine is not ready, /health says so)"
            );
        }
        // SeqCst: as the orderly exit stores it (`drain_on_shutdown`).
        self.0.exited.store(true, Ordering::SeqCst);
        self.0.doorbell().ring();
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop();
    }
}
