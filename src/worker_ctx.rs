//! Who may touch a transport's per-worker state: [`WorkerCtx`], the proof of
//! being one engine's worker `index`, and [`PerWorker`], the cells that open
//! only against it.
//!
//! A transport keeps state per worker (its active peers, each peer's
//! connections) and changes it in `submit` and `poll` with no lock. That is
//! sound because one thread alone can ever show a given worker's context:
//! the engine mints it once, on the worker's own thread, and it can neither
//! leave that thread (`!Send`) nor be lent to another (`!Sync`). A
//! [`PerWorker`] is bound to one engine (at install, or by its first user)
//! and opens cell `w` only for worker `w` of that engine; so each cell is
//! touched by one thread, and its borrow flag needs no atomic. Two engines
//! that both have a worker 0 cannot share a cell: the second is refused.

use std::cell::{RefCell, RefMut};
use std::marker::PhantomData;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tent_rings::ErrorKind;

use crate::error::{Error, Result};

/// One engine, among all engines this process ever builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineId(NonZeroU64);

impl EngineId {
    /// A fresh id (never 0: 0 means "not bound" in [`PerWorker`]).
    pub(crate) fn next() -> EngineId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Relaxed: uniqueness needs only the RMW's atomicity.
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        EngineId(NonZeroU64::new(id).expect("2^64 engines"))
    }

    /// The id as a number (for logs).
    pub(crate) fn get(self) -> u64 {
        self.0.get()
    }
}

impl std::fmt::Display for EngineId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "engine#{}", self.0)
    }
}

/// Proof that the caller is worker [`index`](WorkerCtx::index) of engine
/// `engine`, running on that worker's thread.
///
/// The engine hands `&WorkerCtx` to `Transport::submit` and `poll`; a
/// transport opens its [`PerWorker`] state with it, which is sound only
/// because one thread alone can ever show a given worker's context.
///
/// A worker context cannot leave its thread:
///
/// ```compile_fail,E0277
/// fn send<T: Send>(_: T) {}
/// fn cannot_send(ctx: tent::transport::WorkerCtx) {
///     send(ctx);
/// }
/// ```
///
/// nor be lent to another thread:
///
/// ```compile_fail,E0277
/// fn share<T: Sync>(_: &T) {}
/// fn cannot_share(ctx: &tent::transport::WorkerCtx) {
///     share(ctx);
/// }
/// ```
///
/// and nothing outside the engine can make one:
///
/// ```compile_fail,E0624
/// fn forge(engine: tent::transport::EngineId) -> tent::transport::WorkerCtx {
///     // SAFETY: (none possible: the constructor is the engine's alone)
///     unsafe { tent::transport::WorkerCtx::new(engine, 0) }
/// }
/// ```
///
/// The same three with a type that is `Send`, `Sync` and public, so the
/// snippets above fail for the reason they name:
///
/// ```
/// fn send<T: Send>(_: T) {}
/// fn share<T: Sync>(_: &T) {}
/// fn can(engine: tent::transport::EngineId) -> tent::transport::EngineId {
///     send(engine);
///     share(&engine);
///     engine
/// }
/// ```
#[derive(Debug)]
pub struct WorkerCtx {
    engine: EngineId,
    index: usize,
    /// `!Send + !Sync`: the proof is good on this thread only.
    _thread: PhantomData<*mut ()>,
}

impl WorkerCtx {
    /// The context of worker `index` of `engine`.
    ///
    /// # Safety
    /// No other thread holds, or will ever hold, a context for the same
    /// (`engine`, `index`): [`PerWorker`] lets whoever holds one into that
    /// worker's cells with no lock.
    pub(crate) unsafe fn new(engine: EngineId, index: usize) -> WorkerCtx {
        WorkerCtx {
            engine,
            index,
            _thread: PhantomData,
        }
    }

    /// The worker's index in its engine (`0..workers/count`).
    #[inline]
    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

/// One `T` per worker, each on its own cache line, opened only against the
/// [`WorkerCtx`] of its worker.
///
/// Bound to one engine by [`bind`](PerWorker::bind) (a transport's
/// `install`) or else by the first context that opens it; after that a
/// context of any other engine is refused. Opening costs a plain load and
/// compare, a bounds check and a non-atomic borrow flag.
///
/// ```
/// use tent::TransportKind;
/// use tent::segment::Segment;
/// use tent::transport::{
///     Capabilities, InstallContext, PerWorker, Slice, SliceCompletion, SubmitOutcome,
///     Transport, WorkerCtx,
/// };
///
/// /// Refuses every slice, counting them per worker.
/// struct Refusing {
///     seen: PerWorker<u64>,
/// }
///
/// impl Transport for Refusing {
///     fn kind(&self) -> TransportKind {
///         TransportKind::Local
///     }
///     fn install(&self, ctx: &InstallContext) -> tent::Result<()> {
///         // A second engine is refused here.
///         self.seen.bind(ctx.engine)
///     }
///     fn capabilities(&self) -> Capabilities {
///         Capabilities::default()
///     }
///     fn reaches(&self, _: &Segment) -> bool {
///         true
///     }
///     fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
///         let kind = match self.seen.get(ctx) {
///             Ok(mut seen) => {
///                 *seen += slices.len() as u64;
///                 tent::ErrorKind::Unreachable
///             }
///             Err(e) => e,
///         };
///         out.fill(SubmitOutcome::Rejected(kind));
///     }
///     fn poll(&self, _: &WorkerCtx, _: &mut [SliceCompletion]) -> usize {
///         0
///     }
///     fn abort(&self, _: &WorkerCtx, _: u64, _: tent::ErrorKind) {
///         // It posts nothing: nothing to stop.
///     }
/// }
///
/// let t = Refusing { seen: PerWorker::new(4, |_| 0) };
/// assert_eq!(t.seen.workers(), 4);
/// ```
pub struct PerWorker<T> {
    /// The bound engine's id, 0 until bound; set once, never changed.
    engine: AtomicU64,
    cells: Box<[CachePadded<RefCell<T>>]>,
}

// SAFETY: cell `w` is opened only by `get` with a WorkerCtx for worker `w` of the one engine `engine` names, which one thread alone ever holds (WorkerCtx::new), and the `RefMut` it returns is `!Send`: each RefCell and its borrow flag are only ever touched by that thread. `T: Send` because that thread is not the one that builds or drops the cell.
unsafe impl<T: Send> Sync for PerWorker<T> {}

impl<T> std::fmt::Debug for PerWorker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerWorker")
            .field("workers", &self.cells.len())
            .field("engine", &self.engine.load(Ordering::Relaxed))
            .finish()
    }
}

/// Cell `w` holds the iterator's `w`-th item; bound to no engine yet.
impl<T> FromIterator<T> for PerWorker<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> PerWorker<T> {
        PerWorker {
            engine: AtomicU64::new(0),
            cells: items
                .into_iter()
                .map(|t| CachePadded::new(RefCell::new(t)))
                .collect(),
        }
    }
}

impl<T> PerWorker<T> {
    /// `workers` cells, cell `w` holding `init(w)`; bound to no engine yet.
    pub fn new(workers: usize, init: impl FnMut(usize) -> T) -> PerWorker<T> {
        (0..workers).map(init).collect()
    }

    /// How many workers it has cells for.
    pub fn workers(&self) -> usize {
        self.cells.len()
    }

    /// Belong to `engine` (a transport's `install` calls it).
    ///
    /// # Errors
    /// `InvalidArgument` when already bound to another engine: one
    /// transport serves one engine, whose workers alone may open its cells.
    pub fn bind(&self, engine: EngineId) -> Result<()> {
        match self.claim(engine) {
            Ok(()) => Ok(()),
            Err(bound) => Err(Error::invalid(format!(
                "this transport already serves engine#{bound}; {engine} needs its own instance"
            ))),
        }
    }

    /// Bind to `engine` unless bound already; `Err` holds the other id.
    fn claim(&self, engine: EngineId) -> Result<(), u64> {
        // Relaxed: only the value matters. The cells themselves reached
        // this thread through whatever shared the container (an Arc).
        match self
            .engine
            .compare_exchange(0, engine.get(), Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(bound) if bound == engine.get() => Ok(()),
            Err(bound) => Err(bound),
        }
    }

    /// Worker `ctx.index()`'s cell.
    ///
    /// # Errors
    /// `InvalidArgument` (logged once per cause) when `ctx` is a worker of
    /// another engine than the one this is bound to, its index has no
    /// cell, or the cell is open already (a transport re-entering itself).
    #[inline]
    pub fn get(&self, ctx: &WorkerCtx) -> Result<RefMut<'_, T>, ErrorKind> {
        // Relaxed: the id is set once; a stale 0 only sends us to `claim`.
        let bound = self.engine.load(Ordering::Relaxed);
        if bound != ctx.engine.get() {
            self.bind_or_refuse(ctx)?;
        }
        let Some(cell) = self.cells.get(ctx.index) else {
            return Err(self.refuse(ctx, "no cell for this worker index"));
        };
        cell.try_borrow_mut()
            .map_err(|_| self.refuse(ctx, "cell already open (re-entered)"))
    }

    /// Bind to `ctx`'s engine if nobody has (its first use), else refuse.
    #[cold]
    fn bind_or_refuse(&self, ctx: &WorkerCtx) -> Result<(), ErrorKind> {
        self.claim(ctx.engine)
            .map_err(|_| self.refuse(ctx, "transport serves another engine"))
    }

    #[cold]
    fn refuse(&self, ctx: &WorkerCtx, why: &'static str) -> ErrorKind {
        let bound = self.engine.load(Ordering::Relaxed);
        crate::lograte::warn_limited!(
            (bound, ctx.engine.get(), why),
            engine = %ctx.engine,
            worker = ctx.index,
            bound,
            why,
            "per-worker transport state refused"
        );
        ErrorKind::InvalidArgument
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(engine: EngineId, index: usize) -> WorkerCtx {
        // SAFETY: each test mints its contexts on its own thread from fresh engine ids, and none leaves it.
        unsafe { WorkerCtx::new(engine, index) }
    }

    #[test]
    fn a_worker_opens_its_own_cell_and_cells_nest() {
        let e = EngineId::next();
        let a = PerWorker::new(2, |w| w * 10);
        let b = PerWorker::new(2, |_| Vec::<u8>::new());
        let (w0, w1) = (ctx(e, 0), ctx(e, 1));
        {
            let mut x = a.get(&w0).unwrap();
            // Another container, the same worker: both open at once.
            let mut y = b.get(&w0).unwrap();
            *x += 1;
            y.push(1);
            // Another worker's cell of the same container.
            assert_eq!(*a.get(&w1).unwrap(), 10);
        }
        assert_eq!(*a.get(&w0).unwrap(), 1);
        assert_eq!(b.get(&w0).unwrap().len(), 1);
        assert!(b.get(&w1).unwrap().is_empty());
    }

    #[test]
    fn re_entering_an_open_cell_is_refused_not_aliased() {
        let e = EngineId::next();
        let a = PerWorker::new(1, |_| 0u32);
        let w0 = ctx(e, 0);
        let open = a.get(&w0).unwrap();
        assert_eq!(a.get(&w0).err(), Some(ErrorKind::InvalidArgument));
        drop(open);
        assert!(a.get(&w0).is_ok());
    }

    #[test]
    fn the_first_engine_keeps_it() {
        let (e1, e2) = (EngineId::next(), EngineId::next());
        assert_ne!(e1, e2);
        let a = PerWorker::new(1, |_| 0u32);
        // Bound by its first user: the other engine's worker 0 is refused.
        *a.get(&ctx(e1, 0)).unwrap() = 7;
        assert_eq!(a.get(&ctx(e2, 0)).err(), Some(ErrorKind::InvalidArgument));
        assert_eq!(a.bind(e2).unwrap_err().kind(), ErrorKind::InvalidArgument);
        a.bind(e1)
            .expect("binding again to the same engine is fine");
        assert_eq!(*a.get(&ctx(e1, 0)).unwrap(), 7);

        // Bound at install: refused before any use.
        let b = PerWorker::new(1, |_| 0u32);
        b.bind(e2).unwrap();
        assert!(b.get(&ctx(e1, 0)).is_err());
        assert!(b.get(&ctx(e2, 0)).is_ok());
    }

    #[test]
    fn an_index_without_a_cell_is_refused() {
        let e = EngineId::next();
        let a = PerWorker::new(2, |_| ());
        assert_eq!(a.get(&ctx(e, 2)).err(), Some(ErrorKind::InvalidArgument));
    }

    #[test]
    fn two_threads_racing_to_bind_leave_one_owner() {
        for _ in 0..100 {
            let a = std::sync::Arc::new(PerWorker::new(1, |_| 0u32));
            let won: Vec<bool> = (0..2)
                .map(|_| {
                    let a = a.clone();
                    std::thread::spawn(move || {
                        let c = ctx(EngineId::next(), 0);
                        a.get(&c).map(|mut v| *v += 1).is_ok()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert_eq!(won.iter().filter(|&&w| w).count(), 1, "{won:?}");
        }
    }
}
