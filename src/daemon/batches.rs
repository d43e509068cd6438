//! The batch API of an attached engine, kept on the client's side over a
//! ring of its own: a batch's requests go into that ring (each SQE's
//! `user_data` naming its batch slot and task), and their CQEs, reaped by
//! whichever call looks, settle the tasks here. The daemon sees ring ops
//! only; nothing of a batch crosses the socket.
//!
//! As an embedded engine's, a submit is all or nothing: it waits, the
//! table's lock released, up to `default_timeout_ms` for room in the ring
//! for every request, then publishes them together, or fails `SqFull`
//! with nothing queued. What differs: a task cannot be canceled (the op
//! runs in the daemon, which a client cannot reach but through its ring),
//! a permanent error counts as `Invalid` (the CQE does not say whether it
//! was found before a byte moved), and every pending task ends `Canceled`
//! with `Shutdown` once the daemon has gone. The ring holds
//! `max_batch_size` entries and counts as one of the client's rings at the
//! daemon (`DaemonLimits::rings_per_client`).

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tent_rings::{Cqe, ErrorKind, SegmentId, Sqe};

use crate::engine::batch::overall_of;
use crate::engine::{BatchId, Ring, TaskState, TaskStatus};
use crate::error::{Error, Result};
use crate::notify::Notification;

/// Bits of a CQE's `user_data` that hold the task's index in its batch
/// (`max_batch_size` is at most 1 << 20); the slot sits above them.
const TASK_BITS: u32 = 24;
/// Bits of a [`BatchId`] that hold its slot (`max_batches` is at most
/// 1 << 20); the generation sits above them.
const SLOT_BITS: u32 = 20;
/// The longest nap of a wait, between looks at the ring (the table's lock
/// is never held across one).
const NAP_MAX: Duration = Duration::from_millis(1);

/// Every batch of one attached engine.
pub(crate) struct ClientBatches {
    max_batches: usize,
    max_batch_size: usize,
    /// How long a submit waits for room in the ring.
    room_timeout: Duration,
    state: Mutex<State>,
}

struct State {
    /// Made at the first submit.
    ring: Option<Ring>,
    slots: Vec<Option<Batch>>,
    next_generation: u64,
}

struct Batch {
    generation: u64,
    capacity: usize,
    tasks: Vec<TaskStatus>,
    pending: usize,
    /// Notifications to send once their submission's tasks completed.
    notes: Vec<Note>,
}

/// A notification attached to a submission (`submit_with_notification`).
struct Note {
    segment: SegmentId,
    note: Notification,
    /// Its submission's tasks.
    tasks: std::ops::Range<usize>,
    state: NoteState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoteState {
    /// Its tasks still run.
    Waiting,
    /// Given to the daemon: its fate is asked with this ticket.
    Sent(u64),
    /// Delivered, or failed with this kind.
    Settled(std::result::Result<(), ErrorKind>),
}

/// A note's place: its batch's slot and generation, its index there.
pub(crate) type NoteKey = (usize, u64, usize);

/// What the courier has to do for the notes (see [`ClientBatches::notes_due`]).
#[derive(Default)]
pub(crate) struct NotesDue {
    /// Notes whose data landed: send each (as its client) to its segment.
    pub(crate) send: Vec<(NoteKey, SegmentId, Notification)>,
    /// Notes on their way: ask each ticket's fate.
    pub(crate) ask: Vec<(NoteKey, u64)>,
    /// A note still waits for its tasks.
    pub(crate) waiting: bool,
}

impl ClientBatches {
    pub(crate) fn new(
        max_batches: u32,
        max_batch_size: u32,
        room_timeout: Duration,
    ) -> ClientBatches {
        ClientBatches {
            max_batches: max_batches.min(1 << SLOT_BITS) as usize,
            max_batch_size: max_batch_size.min(1 << 20) as usize,
            room_timeout,
            state: Mutex::new(State {
                ring: None,
                slots: Vec::new(),
                next_generation: 1,
            }),
        }
    }

    /// A batch of up to `capacity` tasks.
    pub(crate) fn allocate(&self, capacity: usize) -> Result<BatchId> {
        if capacity == 0 || capacity > self.max_batch_size {
            return Err(Error::invalid(format!(
                "batch capacity {capacity}: 1..={} (max_batch_size)",
                self.max_batch_size
            )));
        }
        let mut st = self.state.lock();
        let slot = match st.slots.iter().position(Option::is_none) {
            Some(s) => s,
            None if st.slots.len() < self.max_batches => {
                st.slots.push(None);
                st.slots.len() - 1
            }
            None => {
                return Err(Error::new(
                    ErrorKind::OutOfMemory,
                    format!("{} batches allocated (max_batches)", self.max_batches),
                ));
            }
        };
        let generation = st.next_generation;
        st.next_generation = (generation + 1) & ((1 << (64 - SLOT_BITS)) - 1);
        st.next_generation = st.next_generation.max(1);
        st.slots[slot] = Some(Batch {
            generation,
            capacity,
            tasks: Vec::new(),
            pending: 0,
            notes: Vec::new(),
        });
        Ok(BatchId(generation << SLOT_BITS | slot as u64))
    }

    /// The depth of the ring batches go through: a batch of
    /// `max_batch_size` fits whole.
    pub(crate) fn ring_depth(&self) -> u32 {
        (self.max_batch_size as u32)
            .next_power_of_two()
            .clamp(64, 1 << 16)
    }

    /// Append `requests` to batch `id` as its next tasks and post them, all
    /// or none (see the module doc). `make_ring` gives the ring at the
    /// first submit (called without the table's lock: it asks the daemon).
    pub(crate) fn submit(
        &self,
        make_ring: impl FnOnce() -> Result<Ring>,
        id: BatchId,
        requests: &[Sqe],
    ) -> Result<()> {
        self.submit_noted(make_ring, id, requests, None)
    }

    /// [`ClientBatches::submit`], with `note` for `segment`'s owner
    /// attached to these requests: the batch stays pending until the
    /// courier delivered it (or it failed), as an embedded engine's.
    pub(crate) fn submit_noted(
        &self,
        make_ring: impl FnOnce() -> Result<Ring>,
        id: BatchId,
        requests: &[Sqe],
        note: Option<(SegmentId, Notification)>,
    ) -> Result<()> {
        {
            let st = self.state.lock();
            room_in_batch(&st.slots, id, requests.len())?;
            if requests.is_empty() {
                return Ok(());
            }
        }
        if self.state.lock().ring.is_none() {
            let ring = make_ring()?;
            // Another submit may have made one meanwhile: that one stays,
            // and this one is closed (a request to the daemon) after the
            // lock is let go.
            let spare = {
                let mut st = self.state.lock();
                match st.ring {
                    Some(_) => Some(ring),
                    None => {
                        st.ring = Some(ring);
                        None
                    }
                }
            };
            drop(spare);
        }
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        loop {
            {
                let mut st = self.state.lock();
                poll(&mut st);
                let slot = room_in_batch(&st.slots, id, requests.len())?;
                let State { ring, slots, .. } = &mut *st;
                let ring = ring.as_mut().expect("made above");
                let capacity = ring.submission().capacity();
                if requests.len() > capacity {
                    return Err(Error::invalid(format!(
                        "{} requests in one submit; an attached engine's batch ring holds {} (max_batch_size)",
                        requests.len(),
                        capacity
                    )));
                }
                if ring.stopped() {
                    return Err(Error::new(
                        ErrorKind::Shutdown,
                        "the daemon (tentd) this engine is attached to has gone",
                    ));
                }
                if ring.submission().slots() >= requests.len() {
                    let b = slots[slot].as_mut().expect("found");
                    let first = b.tasks.len();
                    {
                        let mut sq = ring.submission();
                        for (i, sqe) in requests.iter().enumerate() {
                            let mut sqe = *sqe;
                            sqe.set_user_data((slot as u64) << TASK_BITS | (first + i) as u64);
                            // Room for all was seen, and only this thread
                            // pushes (under the lock).
                            let _ = sq.push(sqe);
                        }
                    }
                    b.tasks.extend(std::iter::repeat_n(
                        TaskStatus::plain(TaskState::Pending, 0, None),
                        requests.len(),
                    ));
                    b.pending += requests.len();
                    if let Some((segment, note)) = note {
                        b.notes.push(Note {
                            segment,
                            note,
                            tasks: first..first + requests.len(),
                            state: NoteState::Waiting,
                        });
                    }
                    if let Err(e) = ring.submit() {
                        end_pending(slots, e.kind());
                        return Err(e);
                    }
                    return Ok(());
                }
            }
            if start.elapsed() > self.room_timeout {
                return Err(Error::new(
                    ErrorKind::SqFull,
                    format!(
                        "no room for {} requests in the batch ring within {:?}; nothing queued",
                        requests.len(),
                        self.room_timeout
                    ),
                ));
            }
            nap_for(&mut nap);
        }
    }

    /// Task `task` of batch `id`, after reaping what has completed.
    pub(crate) fn status(&self, id: BatchId, task: usize) -> Result<TaskStatus> {
        let mut st = self.state.lock();
        let slot = find(&st.slots, id)?;
        poll(&mut st);
        let b = st.slots[slot].as_ref().expect("found");
        b.tasks.get(task).copied().ok_or_else(|| {
            Error::invalid(format!(
                "batch {:#x} has {} tasks, not task {task}",
                id.0,
                b.tasks.len()
            ))
        })
    }

    /// Every task of batch `id`.
    pub(crate) fn status_list(&self, id: BatchId) -> Result<Vec<TaskStatus>> {
        let mut st = self.state.lock();
        let slot = find(&st.slots, id)?;
        poll(&mut st);
        Ok(st.slots[slot].as_ref().expect("found").tasks.clone())
    }

    /// One status for batch `id` (see `Engine::batch_status`): pending
    /// too while a notification of it is on its way, failed when one
    /// could not be delivered.
    pub(crate) fn overall(&self, id: BatchId) -> Result<TaskStatus> {
        let mut st = self.state.lock();
        let slot = find(&st.slots, id)?;
        poll(&mut st);
        Ok(st.slots[slot].as_ref().expect("found").overall())
    }

    /// What the courier has to do: notes whose data all completed are to
    /// send (a note whose data failed fails, unsent), notes sent are to
    /// ask about.
    pub(crate) fn notes_due(&self) -> NotesDue {
        let mut st = self.state.lock();
        poll(&mut st);
        let mut due = NotesDue::default();
        for (slot, b) in st.slots.iter_mut().enumerate() {
            let Some(b) = b else { continue };
            let generation = b.generation;
            for (i, n) in b.notes.iter_mut().enumerate() {
                let key = (slot, generation, i);
                match n.state {
                    NoteState::Waiting => {
                        let tasks = &b.tasks[n.tasks.clone()];
                        if tasks.iter().any(|t| t.state == TaskState::Pending) {
                            due.waiting = true;
                        } else if let Some(t) =
                            tasks.iter().find(|t| t.state != TaskState::Completed)
                        {
                            // Not sent: its data did not all land.
                            n.state =
                                NoteState::Settled(Err(t.error.unwrap_or(ErrorKind::Canceled)));
                        } else {
                            due.send.push((key, n.segment, n.note.clone()));
                        }
                    }
                    NoteState::Sent(ticket) => due.ask.push((key, ticket)),
                    NoteState::Settled(_) => {}
                }
            }
        }
        due
    }

    /// Note `key` was given to the daemon (`Ok(ticket)`), or settled
    /// (`Err`: its fate, delivered or the failure's kind).
    pub(crate) fn note_moved(
        &self,
        key: NoteKey,
        to: std::result::Result<u64, std::result::Result<(), ErrorKind>>,
    ) {
        let mut st = self.state.lock();
        let (slot, generation, i) = key;
        let Some(Some(b)) = st.slots.get_mut(slot) else {
            return;
        };
        if b.generation != generation {
            return;
        }
        if let Some(n) = b.notes.get_mut(i) {
            n.state = match to {
                Ok(ticket) => NoteState::Sent(ticket),
                Err(fate) => NoteState::Settled(fate),
            };
        }
    }

    /// The daemon is gone: every note not yet settled fails `Shutdown`.
    pub(crate) fn end_notes(&self) {
        let mut st = self.state.lock();
        for b in st.slots.iter_mut().flatten() {
            for n in &mut b.notes {
                if !matches!(n.state, NoteState::Settled(_)) {
                    n.state = NoteState::Settled(Err(ErrorKind::Shutdown));
                }
            }
        }
    }

    /// Wait until every task of batch `id` has ended, up to `timeout`
    /// (the table's lock taken only to look).
    pub(crate) fn wait(&self, id: BatchId, timeout: Duration) -> Result<TaskStatus> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        loop {
            {
                let mut st = self.state.lock();
                let slot = find(&st.slots, id)?;
                poll(&mut st);
                let b = st.slots[slot].as_ref().expect("found");
                if b.pending == 0 && !b.notes_pending() {
                    return Ok(b.overall());
                }
            }
            if start.elapsed() > timeout {
                return Err(Error::new(ErrorKind::Timeout, "batch still pending"));
            }
            nap_for(&mut nap);
        }
    }

    /// Free batch `id`: refused while a task of it is pending.
    pub(crate) fn free(&self, id: BatchId) -> Result<()> {
        let mut st = self.state.lock();
        let slot = find(&st.slots, id)?;
        poll(&mut st);
        let b = st.slots[slot].as_ref().expect("found");
        let pending = b.pending + usize::from(b.notes_pending());
        if pending > 0 {
            return Err(Error::invalid(format!(
                "batch {:#x} still has {pending} pending tasks: wait for them first",
                id.0
            )));
        }
        st.slots[slot] = None;
        Ok(())
    }
}

impl Batch {
    /// A notification of it is not settled yet.
    fn notes_pending(&self) -> bool {
        self.notes
            .iter()
            .any(|n| !matches!(n.state, NoteState::Settled(_)))
    }

    /// Pending while any task is or, its data all landed, while a
    /// notification is on its way; else completed, or the most severe
    /// failure (a notification's included).
    fn overall(&self) -> TaskStatus {
        let overall = overall_of(&self.tasks);
        if overall.state != TaskState::Completed {
            return overall;
        }
        let mut state = overall;
        for n in &self.notes {
            match n.state {
                NoteState::Settled(Ok(())) => {}
                NoteState::Settled(Err(kind)) => {
                    return TaskStatus {
                        state: TaskState::Failed,
                        error: Some(kind),
                        ..overall
                    };
                }
                NoteState::Waiting | NoteState::Sent(_) => state.state = TaskState::Pending,
            }
        }
        state
    }
}

/// Yield, then nap for `nap`, doubling up to [`NAP_MAX`].
fn nap_for(nap: &mut Duration) {
    if *nap < Duration::from_micros(40) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(*nap);
    }
    *nap = (*nap * 2).min(NAP_MAX);
}

/// The slot of batch `id`, with room for `n` more tasks.
fn room_in_batch(slots: &[Option<Batch>], id: BatchId, n: usize) -> Result<usize> {
    let slot = find(slots, id)?;
    let b = slots[slot].as_ref().expect("found");
    if b.tasks.len() + n > b.capacity {
        return Err(Error::invalid(format!(
            "batch {:#x} has room for {} more requests, not {n}",
            id.0,
            b.capacity - b.tasks.len()
        )));
    }
    Ok(slot)
}

/// The slot of batch `id`, if it is allocated.
fn find(slots: &[Option<Batch>], id: BatchId) -> Result<usize> {
    let slot = (id.0 & ((1 << SLOT_BITS) - 1)) as usize;
    let generation = id.0 >> SLOT_BITS;
    match slots.get(slot) {
        Some(Some(b)) if b.generation == generation => Ok(slot),
        _ => Err(Error::invalid(format!(
            "batch {:#x} is not allocated (freed, or another engine's)",
            id.0
        ))),
    }
}

/// Reap what has completed; end every pending task once the daemon is gone.
fn poll(st: &mut State) {
    let State { ring, slots, .. } = st;
    if let Some(ring) = ring.as_mut() {
        reap(ring, slots);
        if ring.stopped() {
            end_pending(slots, ErrorKind::Shutdown);
        }
    }
}

/// Settle the tasks whose CQEs are in the ring. A CQE naming no pending
/// task (the daemon's bytes are checked like any other process's) is
/// dropped.
fn reap(ring: &mut Ring, slots: &mut [Option<Batch>]) {
    for c in ring.completion() {
        let slot = (c.user_data() >> TASK_BITS) as usize;
        let task = (c.user_data() & ((1 << TASK_BITS) - 1)) as usize;
        let Some(Some(b)) = slots.get_mut(slot) else {
            continue;
        };
        if let Some(t) = b.tasks.get_mut(task)
            && t.state == TaskState::Pending
        {
            *t = status_of(&c);
            b.pending -= 1;
        }
    }
}

/// What a CQE says of its task.
fn status_of(c: &Cqe) -> TaskStatus {
    let res = c.result();
    TaskStatus {
        state: TaskState::for_result(res, true),
        transferred_bytes: res.unwrap_or(0),
        error: res.err(),
        transport: c.transport(),
        failover_count: c.failover_count(),
        failover_exhausted: c.failover_exhausted(),
    }
}

/// The ring will answer no more (`kind`: `Shutdown`): every pending task
/// ends, as an embedded engine's do when it stops.
fn end_pending(slots: &mut [Option<Batch>], kind: ErrorKind) {
    for b in slots.iter_mut().flatten() {
        for t in b.tasks.iter_mut().filter(|t| t.state == TaskState::Pending) {
            *t = TaskStatus::plain(TaskState::for_result(Err(kind), false), 0, Some(kind));
        }
        b.pending = 0;
    }
}
