//! Dispatch: post slices of the lane heads through the slot gate, the
//! worker's credit window and the transport, and judge each outcome. A
//! task it leaves settled goes on the due list for the completion stage.

use tent_rings::{ErrorKind, Priority};

use super::scheduler::Flow;
use super::{Worker, housekeeping};
use crate::engine::slot_index;
use crate::engine::task::Origin;
use crate::transport::{Capabilities, Slice, SubmitOutcome};

/// Synchronous copies are followed by a clock read (23 ns) once this many
/// bytes were copied since the last one: fewer take under a microsecond,
/// the finest bucket of the request histograms.
const TIMED_COPY_BYTES: u64 = 16 << 10;

/// What the worker does with a slice after `Transport::submit` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum Verdict {
    /// Not started, and no fault: the transport is getting ready for it
    /// (`Later`), or answers back-pressure (`SqFull`) while this worker has
    /// slices in flight, whose completions will free room. The task keeps
    /// its place (and its deadline) behind the others of its lane, which
    /// may go elsewhere this turn (another peer, a rail with room).
    Defer,
    /// Not started, or finished at once with a transient fault: it moved no
    /// byte that matters, so its range (and the rest of the task) moves to
    /// the next transport right away while slices already posted on this
    /// one finish there. Nothing is posted twice (submit-stage failover).
    Refused(ErrorKind),
    /// Done inside `submit` (a synchronous transport, or a permanent fault).
    Done(Result<u64, ErrorKind>),
    /// In flight: its completion comes from `poll`.
    Posted,
    /// Not started, for a reason no other transport helps with.
    Rejected(ErrorKind),
}

/// Judge a slice's outcome. `others_in_flight`: this worker has slices
/// posted whose completions free room. A transport that finishes a slice
/// `SqFull` (RDMA: its queues went `sq_backoff_timeout_us` without a
/// completion) means no wait will help: that is a failure, failed over.
pub(in crate::engine) fn judge(outcome: SubmitOutcome, others_in_flight: bool) -> Verdict {
    match outcome {
        SubmitOutcome::Later => Verdict::Defer,
        SubmitOutcome::Rejected(ErrorKind::SqFull) if others_in_flight => Verdict::Defer,
        SubmitOutcome::Rejected(e) | SubmitOutcome::Completed(Err(e)) if e.is_transient() => {
            Verdict::Refused(e)
        }
        SubmitOutcome::Completed(res) => Verdict::Done(res),
        SubmitOutcome::Posted => Verdict::Posted,
        SubmitOutcome::Rejected(e) => Verdict::Rejected(e),
    }
}

/// The next slice of a request with `rest` bytes left to post: at most one
/// slice of its transport (`caps.slice_bytes`, else the engine's
/// `block_size`). The one cut for every path: the dispatch and intake's
/// one-slice ops alike.
#[inline]
pub(in crate::engine) fn slice_len(rest: u64, caps: Capabilities, block_size: u64) -> u64 {
    let most = match caps.slice_bytes {
        0 => block_size,
        n => n,
    };
    rest.min(most)
}

impl Worker {
    /// Post slices of lane heads, in the order the scheduler gives them.
    ///
    /// `now` is the turn's clock; it moves on once synchronous copies of
    /// [`TIMED_COPY_BYTES`] or more were made since it was read, so that
    /// the tasks after them in the pass are stamped after them and a
    /// copy's own task is timed with it.
    pub(super) fn dispatch(&mut self, mut now: u64) -> bool {
        let mut work = false;
        let mut pass = self.sched.begin_pass();
        // Bytes copied synchronously since `now` was read.
        let mut untimed = 0u64;
        while let Some((p, i)) = self.sched.next(&mut pass, &*self.engine.gate, now) {
            let t = self.tasks.get_mut(i);
            if !t.live || t.stopped {
                // Stopped (deadline, cancel): nothing to post.
                self.sched.finished(p);
                continue;
            }
            let canceled = t.batch_task().is_some_and(|b| b.cancel_requested());
            if let Some(kind) = housekeeping::stop_reason(canceled, now, t.deadline_ns) {
                self.sched.finished(p);
                self.stop_task(i, kind);
                work = true;
                continue;
            }
            if t.posting_done() {
                self.sched.finished(p);
                self.tasks.note_if_settled(i);
                work = true;
                continue;
            }
            let kind = t.transport;
            let pool = &self.shared.credits[slot_index(kind)];
            let Some(installed) = self.views.slot(kind) else {
                t.error.get_or_insert(ErrorKind::Unreachable);
                continue;
            };
            let offset = t.posted;
            let mut len = slice_len(t.len - offset, installed.caps, self.block_size);
            let (local, remote) = match t.blocks {
                None => (t.local.wrapping_add(offset as usize), t.remote + offset),
                Some(runs) => {
                    // SAFETY: `t` is live (checked at the top of the loop), so its batch task holds the runs.
                    let runs = unsafe { runs.get() };
                    let Some(piece) = runs.piece(offset, &mut t.run_cursor) else {
                        // Unreachable: `posted` stays below the runs' total.
                        t.error.get_or_insert(ErrorKind::InvalidArgument);
                        t.done_ns = 0;
                        self.sched.finished(p);
                        self.tasks.note_if_settled(i);
                        work = true;
                        continue;
                    };
                    len = len.min(piece.len);
                    // Below the runs' `local_end`, inside the region (`Views::accept`).
                    (t.local.wrapping_add(piece.local as usize), piece.remote)
                }
            };
            // Credits bound slices in flight; a synchronous transport has
            // none in flight once submit returns, so it needs none.
            let credited = !installed.caps.synchronous;
            if !self
                .sched
                .may_take_credit(&mut pass, p, credited, pool.available())
            {
                // The rest of the window is HIGH's: this lane (and those
                // below it, which meet the same) waits for completions.
                continue;
            }
            if credited && pool.try_reserve(1).is_err() {
                // Every credit is in flight: wait for completions.
                break;
            }
            // SAFETY: `t` is live (checked at the top of the loop).
            let segment = unsafe { t.segment.as_ref().expect("live task has a segment").get() };
            // SAFETY: `t` is live (checked at the top of the loop).
            let region = unsafe {
                t.local_region
                    .as_ref()
                    .expect("live task has a region")
                    .get()
            };
            let slice = Slice {
                token: t.token(i),
                opcode: t.opcode,
                local,
                region,
                segment,
                remote,
                len,
                rest: t.len - offset,
                priority: p,
            };
            let mut outcome = [SubmitOutcome::Rejected(ErrorKind::Unreachable)];
            let handed = now;
            installed
                .transport
                .submit(&self.ctx, std::slice::from_ref(&slice), &mut outcome);
            if installed.caps.synchronous {
                untimed += len;
                if untimed >= TIMED_COPY_BYTES {
                    // The copies since the last reading are done: time
                    // moved on by their length.
                    now = crate::clock::monotonic_ns();
                    untimed = 0;
                }
            }
            t.posted += len;
            let verdict = judge(outcome[0], self.book.any());
            if verdict == Verdict::Defer {
                if credited {
                    pool.release(1, now);
                }
                t.posted -= len;
                if self.sched.deferred(&mut pass, p, i) == Flow::Stop {
                    break;
                }
                continue;
            }
            if let Verdict::Refused(e) = verdict {
                if credited {
                    pool.release(1, now);
                }
                t.posted -= len;
                if self.may_fail_over(i, e) && self.fail_over(i, e) {
                    work = true;
                    continue;
                }
                let t = self.tasks.get_mut(i);
                t.error.get_or_insert(e);
                // It ends now, not at an earlier slice's copy.
                t.done_ns = 0;
                self.sched.finished(p);
                self.tasks.note_if_settled(i);
                work = true;
                continue;
            }
            let t = self.tasks.get_mut(i);
            t.last_post_ns = handed;
            if !t.waited {
                // Its first slice is out: the queue wait QoS is judged by.
                t.waited = true;
                t.first_post_ns = handed;
                let waited = handed.saturating_sub(t.accepted_ns);
                self.shared.qos.waited(t.priority, waited);
                if let Origin::Ring(ri) = t.origin
                    && let Some(scope) = self.rings.scope(ri as usize)
                {
                    scope.waited(t.priority, waited);
                }
            }
            match verdict {
                Verdict::Done(res) => {
                    if credited {
                        pool.release(1, now);
                    }
                    t.done_ns = now;
                    match res {
                        Ok(n) => t.done += n,
                        Err(e) => {
                            t.error.get_or_insert(e);
                        }
                    }
                }
                Verdict::Posted => {
                    t.inflight += 1;
                    self.book.posted(kind, installed);
                }
                Verdict::Rejected(e) => {
                    if credited {
                        pool.release(1, now);
                    }
                    t.posted -= len;
                    t.error.get_or_insert(e);
                    // It ends now, not at an earlier slice's copy.
                    t.done_ns = 0;
                }
                Verdict::Defer | Verdict::Refused(_) => unreachable!("handled above"),
            }
            work = true;
            let done = t.posting_done();
            if done {
                // Its admission (seed 004) was for work not yet posted:
                // none is left, so the queue's room goes back now.
                if let Some(b) = t.batch_task() {
                    b.admission().release();
                }
            }
            let flow = self.sched.posted(p, len, credited, done);
            self.tasks.note_if_settled(i);
            if flow == Flow::Stop {
                break;
            }
        }
        let end = self.sched.end_pass(pass, &*self.engine.gate, now);
        for p in Priority::ALL {
            if end.newly_held & (1 << p.index()) != 0 {
                self.shared.qos.gate_held(p);
            }
        }
        work
    }
}

#[cfg(test)]
mod tests {
    use super::{Verdict, judge, slice_len};
    use crate::transport::{Capabilities, SubmitOutcome};
    use tent_rings::ErrorKind;

    #[test]
    fn a_slice_is_at_most_the_transport_s_or_else_the_block_size() {
        let caps = |slice_bytes| Capabilities {
            atomic_submit: false,
            synchronous: false,
            remote: true,
            slice_bytes,
            wakes_worker: true,
            parks_worker: false,
        };
        assert_eq!(slice_len(1 << 20, caps(0), 64 << 10), 64 << 10);
        assert_eq!(slice_len(1 << 20, caps(4 << 10), 64 << 10), 4 << 10);
        assert_eq!(slice_len(100, caps(0), 64 << 10), 100, "the last one");
    }

    #[test]
    fn later_and_back_pressure_with_slices_out_defer() {
        assert_eq!(judge(SubmitOutcome::Later, false), Verdict::Defer);
        assert_eq!(
            judge(SubmitOutcome::Rejected(ErrorKind::SqFull), true),
            Verdict::Defer
        );
    }

    #[test]
    fn back_pressure_with_nothing_out_is_a_transient_failure() {
        // No completion of this worker's will make room: fail over.
        assert!(ErrorKind::SqFull.is_transient());
        assert_eq!(
            judge(SubmitOutcome::Rejected(ErrorKind::SqFull), false),
            Verdict::Refused(ErrorKind::SqFull)
        );
        // Finished `SqFull` (the RDMA backoff spent): failed over too.
        assert_eq!(
            judge(SubmitOutcome::Completed(Err(ErrorKind::SqFull)), true),
            Verdict::Refused(ErrorKind::SqFull)
        );
    }

    #[test]
    fn transient_faults_are_refused_permanent_ones_are_final() {
        for out in [
            SubmitOutcome::Rejected(ErrorKind::Unreachable),
            SubmitOutcome::Completed(Err(ErrorKind::Unreachable)),
        ] {
            assert_eq!(judge(out, false), Verdict::Refused(ErrorKind::Unreachable));
        }
        assert!(!ErrorKind::OutOfBounds.is_transient());
        assert_eq!(
            judge(SubmitOutcome::Completed(Err(ErrorKind::OutOfBounds)), false),
            Verdict::Done(Err(ErrorKind::OutOfBounds))
        );
        assert_eq!(
            judge(SubmitOutcome::Rejected(ErrorKind::OutOfBounds), true),
            Verdict::Rejected(ErrorKind::OutOfBounds)
        );
        assert_eq!(
            judge(SubmitOutcome::Completed(Ok(8)), false),
            Verdict::Done(Ok(8))
        );
        assert_eq!(judge(SubmitOutcome::Posted, false), Verdict::Posted);
    }
}
