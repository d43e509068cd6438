//! The worker's task table: one record per accepted request, preallocated so
//! accepting, posting and finishing allocate nothing.

use tent_rings::{ErrorKind, Opcode, Priority, TransportKind};

use super::batch::BatchTask;
use super::blocks::Runs;
use crate::memory::MemRegion;
use crate::segment::Segment;

/// Where a task's completion goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A CQE on the completion ring in worker ring slot `n`.
    Ring(u32),
    /// A batch task slot (the SQE's user_data points at it).
    Batch,
}

/// A live task's hold on its local region or its segment, without a
/// reference count.
///
/// An `Arc` clone at accept and its drop at the end cost two locked
/// read-modify-writes per request each, and the drop's serialising `lock
/// decq` waited on the CQE stores ahead of it: a profile of 8 B WRITEs put
/// a fifth of the worker's time there. Neither can go away under a live
/// task: `Engine::unregister_memory` and `Engine::close_segment` keep what
/// they take out of the tables (`retiring`, `closing`, besides their own
/// hold) until every worker has acknowledged an epoch past its revoke or
/// close, and a worker does not while a live task names it
/// (`Worker::ack_unregister`); the engine drops its tables only after the
/// workers have stopped.
#[derive(Debug)]
pub(crate) struct Held<T>(std::ptr::NonNull<T>);

impl<T> Clone for Held<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Held<T> {}

impl<T> Held<T> {
    pub(in crate::engine) fn new(r: &T) -> Held<T> {
        Held(std::ptr::NonNull::from(r))
    }

    /// What it holds, for as long as this hold is borrowed (a task's hold
    /// lends it for no longer than the task slot is borrowed).
    ///
    /// # Safety
    /// Only while the task holding it is live (see the type).
    #[inline]
    pub(in crate::engine) unsafe fn get(&self) -> &T {
        // SAFETY: the caller's task is live, so the referent is held (see the type).
        unsafe { self.0.as_ref() }
    }
}

/// One accepted request.
#[derive(Debug)]
pub(crate) struct Task {
    pub generation: u32,
    pub live: bool,
    /// Stopped by its deadline, a cancel or shutdown: nothing more is
    /// posted, its slices in flight were aborted, and its completion goes
    /// out once they are all back.
    pub stopped: bool,
    pub origin: Origin,
    pub user_data: u64,
    pub opcode: Opcode,
    pub local: *mut u8,
    pub local_region: Option<Held<MemRegion>>,
    pub segment: Option<Held<Segment>>,
    pub remote: u64,
    /// A block-list request's runs (in its batch task, which outlives
    /// it): its slices are cut from them, and `local` is its region's
    /// start; `None`: one range from `local` and `remote`.
    pub blocks: Option<Held<Runs>>,
    /// The run of `blocks` its last slice came from.
    pub run_cursor: u32,
    pub len: u64,
    pub posted: u64,
    pub done: u64,
    pub inflight: u32,
    pub error: Option<ErrorKind>,
    pub deadline_ns: u64,
    pub priority: Priority,
    pub transport: TransportKind,
    /// Rank of `transport` in the worker's `RANKED` order (the next
    /// failover looks below it).
    pub xport_priority: u8,
    pub failover_count: u8,
    pub no_failover: bool,
    /// A transient fault this task will fail over from once its slices on
    /// the failing transport have drained.
    pub failing: Option<ErrorKind>,
    /// The transport that `failing` came from: when it is no longer the
    /// task's (a submit-stage switch happened meanwhile), the task restarts
    /// on its current transport instead of switching again.
    pub failing_on: TransportKind,
    /// Failed with its failover budget spent or no transport left.
    pub exhausted: bool,
    /// When intake accepted it (monotonic ns).
    pub accepted_ns: u64,
    /// Its first slice went out (its queue wait is recorded).
    pub waited: bool,
    /// When its first slice was handed to a transport (the turn's clock;
    /// meaningful once `waited`): the end of its queue wait.
    pub first_post_ns: u64,
    /// When its latest slice was handed to a transport: the end of its
    /// dispatch, the start of its time on the transport.
    pub last_post_ns: u64,
    /// When the latest of its slices to finish finished inside `submit`
    /// (a synchronous copy: the dispatch pass's clock after it); 0 when the
    /// latest finished through a completion, which the completion stage
    /// times.
    pub done_ns: u64,
    /// On the table's due list (`TaskTable::note_if_settled`), not yet taken off
    /// it by the completion stage.
    due: bool,
}

impl Task {
    fn empty() -> Task {
        Task {
            generation: 0,
            live: false,
            stopped: false,
            origin: Origin::Batch,
            user_data: 0,
            opcode: Opcode::Write,
            local: std::ptr::null_mut(),
            local_region: None,
            segment: None,
            remote: 0,
            blocks: None,
            run_cursor: 0,
            len: 0,
            posted: 0,
            done: 0,
            inflight: 0,
            error: None,
            deadline_ns: 0,
            priority: Priority::High,
            transport: TransportKind::Any,
            xport_priority: 0,
            failover_count: 0,
            no_failover: false,
            failing: None,
            failing_on: TransportKind::Any,
            exhausted: false,
            accepted_ns: 0,
            waited: false,
            first_post_ns: 0,
            last_post_ns: 0,
            done_ns: 0,
            due: false,
        }
    }

    /// The batch slot this task reports into, if it came from a batch.
    #[inline]
    pub(super) fn batch_task(&self) -> Option<&BatchTask> {
        match self.origin {
            // SAFETY: a batch SQE's user_data is a BatchTask address in a batch that cannot be freed while this task is Pending.
            Origin::Batch => Some(unsafe { BatchTask::from_user_data(self.user_data) }),
            Origin::Ring(_) => None,
        }
    }

    /// Nothing more will be posted for it (on its current transport).
    #[inline]
    pub(super) fn posting_done(&self) -> bool {
        self.posted >= self.len || self.error.is_some() || self.failing.is_some()
    }

    /// Nothing more will be posted for it and none of it is in flight: it
    /// is finished, or fails over.
    #[inline]
    pub(super) fn settled(&self) -> bool {
        self.posting_done() && self.inflight == 0
    }

    /// The slice token for this task's current generation.
    #[inline]
    pub(super) fn token(&self, index: u32) -> u64 {
        (u64::from(index) << 32) | u64::from(self.generation)
    }
}

/// Fixed-capacity task slots with a free list, and the due list: the
/// tasks a stage left settled (`Task::settled`), which the completion
/// stage finishes or fails over, each once, in the order they were noted.
#[derive(Debug)]
pub(crate) struct TaskTable {
    tasks: Vec<Task>,
    free: Vec<u32>,
    due: Vec<u32>,
    /// The next entry of `due` to hand out.
    due_next: usize,
}

// SAFETY: the raw pointers inside tasks refer to registered memory and batch
// slots kept alive by the unregister and close protocols (`Held`) and the
// batch rules documented on each field; the table is owned by exactly one
// worker thread at a time.
unsafe impl Send for TaskTable {}

impl TaskTable {
    pub(super) fn new(capacity: usize) -> TaskTable {
        TaskTable {
            tasks: (0..capacity).map(|_| Task::empty()).collect(),
            free: (0..capacity as u32).rev().collect(),
            due: Vec::with_capacity(capacity),
            due_next: 0,
        }
    }

    #[inline]
    pub(super) fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    #[inline]
    pub(super) fn active(&self) -> usize {
        self.tasks.len() - self.free.len()
    }

    /// Take a free slot; the caller fills it in.
    #[inline]
    pub(super) fn alloc(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        let t = &mut self.tasks[i as usize];
        t.generation = t.generation.wrapping_add(1);
        t.live = true;
        t.stopped = false;
        Some(i)
    }

    /// Return a slot, forgetting what it held.
    #[inline]
    pub(super) fn release(&mut self, i: u32) {
        let t = &mut self.tasks[i as usize];
        if !t.live {
            debug_assert!(false, "task slot {i} released twice");
            return;
        }
        t.live = false;
        t.local_region = None;
        t.segment = None;
        t.blocks = None;
        // Capacity was reserved up front: this push never reallocates.
        self.free.push(i);
    }

    /// Put task `i` on the due list if it is live and settled
    /// (`Task::settled`), unless it is on it already.
    #[inline]
    pub(super) fn note_if_settled(&mut self, i: u32) {
        let t = &mut self.tasks[i as usize];
        if t.live && t.settled() && !t.due {
            t.due = true;
            // A task is on the list at most once, and capacity was
            // reserved for every slot: this push never reallocates.
            self.due.push(i);
        }
    }

    /// The next task on the due list, taken off it; `None` once the list
    /// is empty (and it is then reset).
    #[inline]
    pub(super) fn next_due(&mut self) -> Option<u32> {
        let Some(&i) = self.due.get(self.due_next) else {
            self.due.clear();
            self.due_next = 0;
            return None;
        };
        self.due_next += 1;
        self.tasks[i as usize].due = false;
        Some(i)
    }

    #[inline]
    pub(super) fn get_mut(&mut self, i: u32) -> &mut Task {
        &mut self.tasks[i as usize]
    }

    /// The live task a slice token refers to (None if it is stale).
    #[inline]
    pub(super) fn by_token(&mut self, token: u64) -> Option<(u32, &mut Task)> {
        let i = (token >> 32) as u32;
        let t = self.tasks.get_mut(i as usize)?;
        (t.live && t.generation == token as u32).then_some((i, t))
    }

    pub(super) fn capacity(&self) -> usize {
        self.tasks.len()
    }
}
