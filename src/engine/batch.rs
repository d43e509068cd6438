//! The batch API's state: TENT-compatible task states, updated by workers
//! with atomics and read by any thread.
//!
//! A batch's SQEs travel through the same worker rings as ring-API SQEs;
//! their `user_data` points at the task's [`BatchTask`] slot, and the worker
//! writes the final state there instead of posting a CQE. A batch cannot be
//! freed while any of its tasks is `Pending`, so that pointer stays valid.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

use tent_rings::{ErrorKind, FAILOVER_EXHAUSTED, TransportKind};

use super::blocks::Runs;
use crate::error::{Error, Result};
use crate::flow::AdmissionSlot;
use crate::notify::delivery::Delivery;

/// A task's state (TENT's names).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Allocated in a batch, not submitted.
    Initial = 0,
    /// Submitted, not finished.
    Pending = 1,
    /// Rejected before any byte moved: the request itself was wrong.
    Invalid = 2,
    /// Canceled by the application.
    Canceled = 3,
    /// All bytes moved.
    Completed = 4,
    /// Its deadline passed.
    Timeout = 5,
    /// The transfer failed.
    Failed = 6,
}

impl TaskState {
    fn from_u8(v: u8) -> TaskState {
        match v {
            0 => TaskState::Initial,
            1 => TaskState::Pending,
            2 => TaskState::Invalid,
            3 => TaskState::Canceled,
            4 => TaskState::Completed,
            5 => TaskState::Timeout,
            _ => TaskState::Failed,
        }
    }

    /// Finished, one way or another.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Initial | TaskState::Pending)
    }

    /// The state a finished transfer lands in; `validation` says the error
    /// was found before the transfer started.
    pub(crate) fn for_result(res: Result<u64, ErrorKind>, validation: bool) -> TaskState {
        match res {
            Ok(_) => TaskState::Completed,
            Err(ErrorKind::Timeout) => TaskState::Timeout,
            // Terminal, not faults: the error field says which.
            Err(ErrorKind::Canceled | ErrorKind::Shutdown) => TaskState::Canceled,
            // The request itself was wrong (a permanent kind found before
            // any byte moved); transient kinds stay Failed.
            Err(e) if validation && e.is_permanent() => TaskState::Invalid,
            Err(_) => TaskState::Failed,
        }
    }
}

/// What `status` reports for a task (or, aggregated, a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStatus {
    /// Its state.
    pub state: TaskState,
    /// Bytes moved so far (all of them once `Completed`).
    pub transferred_bytes: u64,
    /// Why it did not complete, for Invalid/Failed/Timeout/Canceled.
    pub error: Option<ErrorKind>,
    /// The transport that served it last (`Any`: none did).
    pub transport: TransportKind,
    /// Times it moved to another transport.
    pub failover_count: u8,
    /// It failed after every transport it was allowed to try had failed.
    pub failover_exhausted: bool,
}

impl TaskStatus {
    /// A status with no transport recorded.
    pub(crate) fn plain(
        state: TaskState,
        transferred_bytes: u64,
        error: Option<ErrorKind>,
    ) -> Self {
        TaskStatus {
            state,
            transferred_bytes,
            error,
            transport: TransportKind::Any,
            failover_count: 0,
            failover_exhausted: false,
        }
    }

    /// Served by a transport other than its first choice.
    pub fn fallback(&self) -> bool {
        self.failover_count > 0 && self.state == TaskState::Completed
    }

    /// Why it failed, in words, when failover has something to say
    /// ("Failover limit exceeded, all transports exhausted").
    pub fn reason(&self) -> Option<&'static str> {
        self.failover_exhausted.then_some(FAILOVER_EXHAUSTED)
    }
}

/// One status for tasks `list`: Pending while any is (or Initial when
/// there are none); otherwise Completed if all completed, else the most
/// severe failure; the bytes of all of them.
pub(crate) fn overall_of(list: &[TaskStatus]) -> TaskStatus {
    let bytes = list.iter().map(|s| s.transferred_bytes).sum();
    let rank = |s: TaskState| match s {
        TaskState::Pending | TaskState::Initial => 6,
        TaskState::Failed => 5,
        TaskState::Timeout => 4,
        TaskState::Invalid => 3,
        TaskState::Canceled => 2,
        TaskState::Completed => 1,
    };
    match list.iter().max_by_key(|s| rank(s.state)) {
        None => TaskStatus::plain(TaskState::Initial, 0, None),
        Some(w) => TaskStatus {
            transferred_bytes: bytes,
            ..*w
        },
    }
}

/// How a task was served, packed in one word: transport, failover count,
/// exhausted bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Served {
    pub transport: TransportKind,
    pub failover_count: u8,
    pub exhausted: bool,
}

impl Served {
    fn pack(self) -> u32 {
        u32::from(self.transport as u8)
            | u32::from(self.failover_count) << 8
            | u32::from(self.exhausted) << 16
    }
    fn unpack(w: u32) -> Served {
        Served {
            transport: TransportKind::from_u8(w as u8).unwrap_or(TransportKind::Any),
            failover_count: (w >> 8) as u8,
            exhausted: w & (1 << 16) != 0,
        }
    }
}

/// One task slot, written by a worker, read by anyone.
#[derive(Debug)]
pub(crate) struct BatchTask {
    state: AtomicU8,
    error: AtomicU16,
    bytes: AtomicU64,
    served: AtomicU32,
    cancel: AtomicBool,
    /// Its share of an admission (`sq_executor_admission`), until its last
    /// slice is posted, it ends, or the batch is dropped.
    admission: AdmissionSlot,
    /// A block-list request's runs: set before its SQE is published (a
    /// slot is claimed once in a batch's life), dropped with the batch,
    /// so never by a worker.
    blocks: std::sync::OnceLock<Runs>,
}

impl BatchTask {
    fn new() -> BatchTask {
        BatchTask {
            state: AtomicU8::new(TaskState::Initial as u8),
            error: AtomicU16::new(0),
            bytes: AtomicU64::new(0),
            served: AtomicU32::new(0),
            cancel: AtomicBool::new(false),
            admission: AdmissionSlot::default(),
            blocks: std::sync::OnceLock::new(),
        }
    }

    /// Its block list's runs, if it is a block-list request.
    #[inline]
    pub(crate) fn blocks(&self) -> Option<&Runs> {
        self.blocks.get()
    }

    /// Give it a block list's runs (before its request is published).
    pub(crate) fn set_blocks(&self, runs: Runs) {
        // Claimed once per batch, so never set twice.
        let set = self.blocks.set(runs);
        debug_assert!(set.is_ok(), "a batch task's block list set twice");
    }

    /// Worker side: record the final result. The state store is last and
    /// Release, so a reader that sees a terminal state sees bytes and error.
    pub(crate) fn finish(
        &self,
        state: TaskState,
        bytes: u64,
        error: Option<ErrorKind>,
        served: Served,
    ) {
        // Ended: whatever it was admitted for will not be posted now.
        self.admission.release();
        self.served.store(served.pack(), Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
        self.error
            .store(error.map_or(0, ErrorKind::code), Ordering::Relaxed);
        self.state.store(state as u8, Ordering::Release);
    }

    /// The slot a batch SQE's `user_data` names.
    ///
    /// # Safety
    /// `user_data` must come from [`Batch::task_ptr`] of a batch that is
    /// still allocated; a batch cannot be freed while the task is Pending,
    /// so this holds until the worker's final `finish`.
    #[inline]
    pub(crate) unsafe fn from_user_data<'a>(user_data: u64) -> &'a BatchTask {
        // SAFETY: the caller guarantees the address is a live BatchTask.
        unsafe { &*(user_data as *const BatchTask) }
    }

    /// Its admission slot (seed 004's executor admission).
    #[inline]
    pub(crate) fn admission(&self) -> &AdmissionSlot {
        &self.admission
    }

    /// Has the application asked to cancel it? (Relaxed: a hint checked
    /// between slices; a late read only delays the cancel by a slice.)
    #[inline]
    pub(crate) fn cancel_requested(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn status(&self) -> TaskStatus {
        let state = TaskState::from_u8(self.state.load(Ordering::Acquire));
        let served = Served::unpack(self.served.load(Ordering::Relaxed));
        TaskStatus {
            state,
            transferred_bytes: self.bytes.load(Ordering::Relaxed),
            error: ErrorKind::from_code(self.error.load(Ordering::Relaxed)),
            transport: served.transport,
            failover_count: served.failover_count,
            failover_exhausted: served.exhausted,
        }
    }
}

/// A batch: fixed capacity, filled by one or more `submit` calls.
#[derive(Debug)]
pub(crate) struct Batch {
    tasks: Box<[BatchTask]>,
    used: Mutex<Usage>,
    /// Notifications attached to its submissions
    /// (`Engine::submit_with_notification`): the batch is not done until
    /// each is delivered, and failed if one cannot be.
    notes: Mutex<Vec<Arc<Delivery>>>,
}

/// Claimed task count, and whether the batch was freed; one lock so a
/// `free` and a concurrent `submit` cannot both succeed.
#[derive(Debug, Default)]
struct Usage {
    used: usize,
    freed: bool,
}

/// A batch handle: the engine's tag in the top 24 bits (so another
/// engine's id is caught), then the slot and its generation (so a stale id
/// is caught). The slot takes as many bits as `max_batches` needs, the
/// generation the rest of the 40: 30 bits with the default 1024 batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchId(pub u64);

/// Bits of a [`BatchId`] below the tag.
const LOW_BITS: u32 = 64 - crate::incarnation::BATCH_TAG_BITS;

#[derive(Debug)]
struct Slot {
    generation: u64,
    batch: Option<Arc<Batch>>,
}

/// Every allocated batch.
#[derive(Debug)]
pub(crate) struct BatchTable {
    slots: Mutex<Slots>,
    max_batches: usize,
    max_batch_size: usize,
    /// The engine's batch tag every id carries.
    tag: u32,
    /// Bits of an id for the slot; the generation has `LOW_BITS` less these.
    slot_bits: u32,
}

/// The slots, and where the search for a free one starts: each allocation
/// takes the next free slot after the last one taken, so an allocate/free
/// loop walks every slot and a slot's generation wraps only after
/// `max_batches` times 2^generation-bits allocations.
#[derive(Debug, Default)]
struct Slots {
    all: Vec<Slot>,
    cursor: usize,
}

impl BatchTable {
    pub(crate) fn new(max_batches: usize, max_batch_size: usize, tag: u32) -> BatchTable {
        let slot_bits = usize::BITS - max_batches.saturating_sub(1).leading_zeros();
        BatchTable {
            slots: Mutex::new(Slots::default()),
            max_batches,
            max_batch_size,
            tag,
            slot_bits: slot_bits.clamp(1, LOW_BITS / 2),
        }
    }

    fn generation_mask(&self) -> u64 {
        (1 << (LOW_BITS - self.slot_bits)) - 1
    }

    /// The id of slot `index` at `generation`.
    fn id(&self, index: usize, generation: u64) -> BatchId {
        let gen_bits = LOW_BITS - self.slot_bits;
        BatchId(
            (u64::from(self.tag) << LOW_BITS)
                | ((index as u64) << gen_bits)
                | (generation & self.generation_mask()),
        )
    }

    /// The slot `id` names, if this engine issued it and it is current.
    fn slot_of<'a>(&self, slots: &'a mut Slots, id: BatchId) -> Option<&'a mut Slot> {
        let gen_bits = LOW_BITS - self.slot_bits;
        if (id.0 >> LOW_BITS) as u32 != self.tag {
            return None;
        }
        let index = ((id.0 >> gen_bits) & ((1 << self.slot_bits) - 1)) as usize;
        let mask = self.generation_mask();
        slots
            .all
            .get_mut(index)
            .filter(|s| s.generation & mask == id.0 & mask && s.batch.is_some())
    }

    pub(crate) fn allocate(&self, capacity: usize) -> Result<BatchId> {
        if capacity == 0 || capacity > self.max_batch_size {
            return Err(Error::invalid(format!(
                "batch capacity {capacity} outside 1..={} (max_batch_size)",
                self.max_batch_size
            )));
        }
        let batch = Arc::new(Batch {
            tasks: (0..capacity).map(|_| BatchTask::new()).collect(),
            used: Mutex::new(Usage::default()),
            notes: Mutex::new(Vec::new()),
        });
        let mut guard = self.slots.lock();
        let slots = &mut *guard;
        let n = slots.all.len();
        let free = (0..n)
            .map(|k| (slots.cursor + k) % n)
            .find(|&i| slots.all[i].batch.is_none());
        let index = match free {
            Some(i) => i,
            None if n < self.max_batches => {
                slots.all.push(Slot {
                    generation: 0,
                    batch: None,
                });
                n
            }
            None => {
                return Err(Error::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "all {} batches are allocated (max_batches)",
                        self.max_batches
                    ),
                ));
            }
        };
        slots.cursor = index + 1;
        let slot = &mut slots.all[index];
        slot.generation = slot.generation.wrapping_add(1);
        slot.batch = Some(batch);
        let generation = slot.generation;
        Ok(self.id(index, generation))
    }

    pub(crate) fn get(&self, id: BatchId) -> Result<Arc<Batch>> {
        let mut slots = self.slots.lock();
        self.slot_of(&mut slots, id)
            .and_then(|s| s.batch.clone())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "batch {:#x} is not allocated (freed already?)",
                    id.0
                ))
            })
    }

    pub(crate) fn free(&self, id: BatchId) -> Result<()> {
        let mut slots = self.slots.lock();
        let slot = self.slot_of(&mut slots, id).ok_or_else(|| {
            Error::invalid(format!("batch {:#x} is not allocated (double free?)", id.0))
        })?;
        let batch = slot.batch.as_ref().expect("checked above");
        // Under the batch's lock: a submit that claimed tasks before us left
        // them Pending (we refuse); one that comes after sees `freed`.
        let mut usage = batch.used.lock();
        let pending = batch.tasks[..usage.used]
            .iter()
            .filter(|t| t.status().state == TaskState::Pending)
            .count()
            + batch.notes_pending();
        if pending > 0 {
            return Err(Error::invalid(format!(
                "batch {:#x} still has {pending} pending tasks: wait for them or cancel first",
                id.0
            )));
        }
        usage.freed = true;
        drop(usage);
        let freed = slot.batch.take();
        // Dropped outside the table's lock: the last hold frees the batch's
        // block lists (their buffers go back to the run pool).
        drop(slots);
        drop(freed);
        Ok(())
    }
}

impl Batch {
    /// Would [`Batch::claim`] of `n` succeed now? (Claims nothing.)
    pub(crate) fn check_claim(&self, n: usize) -> Result<()> {
        let usage = self.used.lock();
        Self::room(&usage, self.tasks.len(), n)
    }

    fn room(usage: &Usage, cap: usize, n: usize) -> Result<()> {
        if usage.freed {
            return Err(Error::invalid("submit to a batch that was freed"));
        }
        if n == 0 {
            return Err(Error::invalid("submit of an empty request list"));
        }
        if usage.used + n > cap {
            return Err(Error::invalid(format!(
                "batch overflow: {} tasks submitted + {n} new > capacity {cap}",
                usage.used
            )));
        }
        Ok(())
    }

    /// Claim `n` task slots for a submit; all or nothing.
    pub(crate) fn claim(&self, n: usize) -> Result<std::ops::Range<usize>> {
        let mut usage = self.used.lock();
        Self::room(&usage, self.tasks.len(), n)?;
        let range = usage.used..usage.used + n;
        usage.used += n;
        for t in &self.tasks[range.clone()] {
            // A cancel issued before this submit does not reach these tasks.
            t.cancel.store(false, Ordering::Relaxed);
            t.state.store(TaskState::Pending as u8, Ordering::Release);
        }
        Ok(range)
    }

    /// The slot a worker reports task `i` into.
    pub(crate) fn task_ptr(&self, i: usize) -> *const BatchTask {
        &self.tasks[i]
    }

    pub(crate) fn task(&self, i: usize) -> &BatchTask {
        &self.tasks[i]
    }

    pub(crate) fn status(&self, i: usize) -> Result<TaskStatus> {
        if i >= self.tasks.len() {
            return Err(Error::invalid(format!(
                "task {i} out of range (batch capacity {})",
                self.tasks.len()
            )));
        }
        Ok(self.tasks[i].status())
    }

    /// Task `i`'s status (`i` below the claimed count).
    pub(crate) fn task_status(&self, i: usize) -> TaskStatus {
        self.tasks[i].status()
    }

    /// `None` while any of `tasks` runs; then `Ok` if all completed, else
    /// the first failed task and its kind (what an attached notification
    /// waits for).
    pub(crate) fn outcome(
        &self,
        tasks: std::ops::Range<usize>,
    ) -> Option<std::result::Result<(), (usize, ErrorKind)>> {
        let mut failed = None;
        for i in tasks {
            let s = self.task_status(i);
            match s.state {
                TaskState::Initial | TaskState::Pending => return None,
                TaskState::Completed => {}
                other => {
                    let kind = s.error.unwrap_or(match other {
                        TaskState::Canceled => ErrorKind::Canceled,
                        TaskState::Timeout => ErrorKind::Timeout,
                        _ => ErrorKind::InvalidArgument,
                    });
                    failed.get_or_insert((i, kind));
                }
            }
        }
        Some(failed.map_or(Ok(()), Err))
    }

    /// Attach a notification's fate to the batch.
    pub(crate) fn attach_note(&self, d: Arc<Delivery>) {
        self.notes.lock().push(d);
    }

    /// Take back a notification whose submission was refused.
    pub(crate) fn detach_note(&self, d: &Arc<Delivery>) {
        self.notes.lock().retain(|n| !Arc::ptr_eq(n, d));
    }

    /// Attached notifications not yet delivered (or failed).
    fn notes_pending(&self) -> usize {
        self.notes
            .lock()
            .iter()
            .filter(|d| d.state().is_none())
            .count()
    }

    pub(crate) fn status_list(&self) -> Vec<TaskStatus> {
        let used = self.used.lock().used;
        self.tasks[..used].iter().map(BatchTask::status).collect()
    }

    /// [`overall`](Self::overall), once nothing of the batch is in flight:
    /// every submitted task ended and every attached notification settled
    /// (its terminal state), or nothing submitted at all (`Initial`);
    /// `None` while something runs.
    pub(crate) fn settled(&self) -> Option<TaskStatus> {
        // Notifications first: a submit with one attaches it before it
        // claims its tasks, so a batch seen without pending notifications
        // and then without tasks had neither at the first look.
        let quiet = self.notes_pending() == 0;
        let s = self.overall();
        (s.state.is_terminal() || (quiet && s.state == TaskState::Initial)).then_some(s)
    }

    /// One status for the whole batch: Pending while any task is; otherwise
    /// Completed if all completed, else the most severe failure.
    pub(crate) fn overall(&self) -> TaskStatus {
        let overall = overall_of(&self.status_list());
        if overall.state != TaskState::Completed {
            return overall;
        }
        // All data landed: done once the notifications are delivered too.
        let notes = self.notes.lock();
        let mut state = overall;
        for d in notes.iter() {
            match d.state() {
                None => state.state = TaskState::Pending,
                Some(Err(kind)) => {
                    return TaskStatus {
                        state: TaskState::Failed,
                        error: Some(kind),
                        ..overall
                    };
                }
                Some(Ok(())) => {}
            }
        }
        state
    }

    pub(crate) fn cancel(&self, only: Option<usize>) -> Result<()> {
        match only {
            Some(i) => self
                .tasks
                .get(i)
                .ok_or_else(|| Error::invalid(format!("task {i} out of range")))?
                .cancel
                .store(true, Ordering::Relaxed),
            None => self
                .tasks
                .iter()
                .for_each(|t| t.cancel.store(true, Ordering::Relaxed)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_before_submit_does_not_reach_later_tasks() {
        let t = BatchTable::new(1, 4, 5);
        let b = t.get(t.allocate(4).unwrap()).unwrap();
        b.cancel(None).unwrap();
        let r = b.claim(2).unwrap();
        assert!(r.clone().all(|i| !b.task(i).cancel_requested()));
        b.cancel(Some(0)).unwrap();
        assert!(b.task(0).cancel_requested() && !b.task(1).cancel_requested());
    }

    #[test]
    fn shutdown_and_validation_states() {
        use ErrorKind as K;
        assert_eq!(
            TaskState::for_result(Err(K::Shutdown), false),
            TaskState::Canceled
        );
        assert_eq!(
            TaskState::for_result(Err(K::OutOfBounds), true),
            TaskState::Invalid
        );
        assert_eq!(
            TaskState::for_result(Err(K::Unreachable), true),
            TaskState::Failed
        );
        assert_eq!(
            TaskState::for_result(Err(K::OutOfBounds), false),
            TaskState::Failed
        );
        assert_eq!(
            TaskState::for_result(Err(K::Timeout), true),
            TaskState::Timeout
        );
    }

    #[test]
    fn lifecycle_overflow_double_free() {
        let t = BatchTable::new(2, 4, 5);
        assert!(t.allocate(5).is_err());
        let id = t.allocate(4).unwrap();
        let b = t.get(id).unwrap();
        assert_eq!(b.overall().state, TaskState::Initial);
        let r = b.claim(3).unwrap();
        assert_eq!(r, 0..3);
        let e = b.claim(2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("overflow"));
        assert_eq!(
            b.check_claim(2).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        b.check_claim(1).unwrap();
        assert_eq!(b.status_list().len(), 3, "check_claim claims nothing");
        assert_eq!(b.overall().state, TaskState::Pending);
        assert!(t.free(id).is_err(), "pending tasks block free");
        b.task(0)
            .finish(TaskState::Completed, 10, None, Served::default());
        b.task(1)
            .finish(TaskState::Completed, 10, None, Served::default());
        b.task(2).finish(
            TaskState::Failed,
            0,
            Some(ErrorKind::SqFull),
            Served::default(),
        );
        let o = b.overall();
        assert_eq!(
            (o.state, o.transferred_bytes, o.error),
            (TaskState::Failed, 20, Some(ErrorKind::SqFull))
        );
        t.free(id).unwrap();
        let e = t.free(id).unwrap_err();
        assert!(e.to_string().contains("double free"));
        assert!(t.get(id).is_err());
        assert!(b.claim(1).is_err(), "a freed batch takes no more tasks");
        let id2 = t.allocate(1).unwrap();
        assert_ne!(id, id2, "generation makes reused slots distinct");
        t.allocate(1).unwrap();
        assert_eq!(t.allocate(1).unwrap_err().kind(), ErrorKind::OutOfMemory);
    }

    /// A freed id stays stale: an allocate/free loop walks the slots, and
    /// a slot's generation has 38 bits here (4 batches), so the id of the
    /// first batch does not come back within 2^20 allocations (with 20
    /// bits of generation and the first free slot reused, it did).
    #[test]
    fn a_freed_batch_id_does_not_come_back() {
        let t = BatchTable::new(4, 4, 5);
        let first = t.allocate(1).unwrap();
        t.free(first).unwrap();
        for _ in 0..(1u32 << 20) {
            let id = t.allocate(1).unwrap();
            assert_ne!(id, first, "a stale id names a live batch again");
            t.free(id).unwrap();
        }
        assert!(t.get(first).is_err());
        // The most batches the key allows still get distinct ids.
        let big = BatchTable::new(1 << 20, 1, 5);
        assert_eq!(big.slot_bits, 20);
        let ids: Vec<_> = (0..3).map(|_| big.allocate(1).unwrap()).collect();
        assert!(ids[0] != ids[1] && ids[1] != ids[2]);
        for id in ids {
            assert!(big.get(id).is_ok());
            assert_eq!(id.0 >> LOW_BITS, 5, "the tag on top");
        }
    }
}
