//! Dispatch: post slices of the lane heads through the slot gate, the
//! worker's credit window and the transport, and judge each outcome.

use super::*;

/// What the worker does with a slice after `Transport::submit` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
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
pub(super) fn judge(outcome: SubmitOutcome, others_in_flight: bool) -> Verdict {
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

/// May a lane of priority `p` take one of the worker's credits now? The
/// last `headroom` credits of the window are HIGH's, so a window full of
/// bulk slices still lets a HIGH slice out at once. A synchronous
/// transport (`!credited`) has nothing in flight once submit returns and
/// takes no credit.
pub(super) fn lane_may_post(credited: bool, p: Priority, available: u32, headroom: u32) -> bool {
    !credited || p == Priority::High || available > headroom
}

/// What a slice costs the turn's byte budget: its bytes, or for a
/// synchronous transport, whose bytes are the worker's own copying time,
/// `SYNC_BYTE_WEIGHT` times them.
pub(super) fn slice_cost(len: u64, credited: bool) -> u64 {
    if credited {
        len
    } else {
        len.saturating_mul(SYNC_BYTE_WEIGHT)
    }
}

impl Worker {
    /// Post slices of lane heads.
    pub(super) fn dispatch(&mut self, now: u64) -> bool {
        let mut work = false;
        // Per lane, the first task its transport answered `Later` (or
        // `SqFull` with slices in flight: back-pressure) this
        // turn: when it is that lane's head again, every head of the lane
        // is waiting, and the lane is passed over for the rest of the turn
        // (`waiting`), so the lanes below it still post. `Later` answers
        // are also counted: past one per queued task (the gate moved while
        // we went round), the turn ends.
        let mut first_later: [Option<u32>; 3] = [None; 3];
        let mut waiting: u8 = 0;
        let mut laters = 0usize;
        let most_laters = self.lanes.len();
        self.later = false;
        self.gated = false;
        while let Some((p, entry)) = self.lanes.next_except(&*self.engine.gate, waiting, now) {
            let i = entry.task;
            if first_later[p.index()] == Some(i) {
                waiting |= 1 << p.index();
                self.later = true;
                continue;
            }
            let t = self.tasks.get_mut(i);
            if !t.live || t.stopped {
                // Stopped (deadline, cancel): nothing to post.
                self.lanes.pop(p);
                continue;
            }
            let canceled = t.batch_task().is_some_and(|b| b.cancel_requested());
            if let Some(kind) = housekeeping::stop_reason(canceled, now, t.deadline_ns) {
                self.lanes.pop(p);
                self.stop_task(i, kind);
                work = true;
                continue;
            }
            if t.posting_done() {
                self.lanes.pop(p);
                self.maybe_finish(i);
                work = true;
                continue;
            }
            let kind = t.transport;
            let pool = &self.shared.credits[slot_index(kind)];
            let Some(installed) = self.slots[slot_index(kind)].as_ref() else {
                t.error.get_or_insert(ErrorKind::Unreachable);
                continue;
            };
            // Credits bound slices in flight; a synchronous transport has
            // none in flight once submit returns, so it needs none.
            let credited = !installed.caps.synchronous;
            if !lane_may_post(credited, p, pool.available(), self.high_headroom) {
                // The rest of the window is HIGH's: this lane (and those
                // below it, which meet the same) waits for completions.
                waiting |= 1 << p.index();
                continue;
            }
            if credited && pool.try_reserve(1).is_err() {
                // Every credit is in flight: wait for completions.
                break;
            }
            let slice = match installed.caps.slice_bytes {
                0 => self.block_size,
                n => n,
            };
            let len = slice.min(t.len - t.posted);
            let offset = t.posted;
            // SAFETY: `t` is live (checked at the top of the loop).
            let segment = unsafe { t.segment.expect("live task has a segment").get() };
            // SAFETY: `t` is live (checked at the top of the loop).
            let region = unsafe { t.local_region.expect("live task has a region").get() };
            let slice = Slice {
                token: t.token(i),
                opcode: t.opcode,
                local: t.local.wrapping_add(offset as usize),
                region,
                segment,
                remote: t.remote + offset,
                len,
                rest: t.len - offset,
                priority: p,
            };
            let mut outcome = [SubmitOutcome::Rejected(ErrorKind::Unreachable)];
            installed
                .transport
                .submit(&self.ctx, std::slice::from_ref(&slice), &mut outcome);
            t.posted += len;
            t.last_slice = SliceRecord {
                rail: 0,
                bytes: len,
                post_ns: now,
            };
            let verdict = judge(outcome[0], self.async_inflight > 0);
            if verdict == Verdict::Defer {
                if credited {
                    pool.release(1, now);
                }
                t.posted -= len;
                self.lanes.rotate(p);
                first_later[p.index()].get_or_insert(i);
                laters += 1;
                if laters > most_laters {
                    self.later = true;
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
                self.lanes.pop(p);
                self.maybe_finish(i);
                work = true;
                continue;
            }
            let t = self.tasks.get_mut(i);
            if !t.waited {
                // Its first slice is out: the queue wait QoS is judged by.
                t.waited = true;
                self.shared
                    .qos
                    .waited(t.priority, now.saturating_sub(t.accepted_ns));
            }
            match verdict {
                Verdict::Done(res) => {
                    if credited {
                        pool.release(1, now);
                    }
                    match res {
                        Ok(n) => t.done += n,
                        Err(e) => {
                            t.error.get_or_insert(e);
                        }
                    }
                }
                Verdict::Posted => {
                    t.inflight += 1;
                    self.async_inflight += 1;
                    let k = slot_index(kind);
                    match &mut self.posted[k] {
                        Some(p) if Arc::ptr_eq(&p.transport, installed) => p.inflight += 1,
                        other => {
                            // First post on this instance (or the slot was
                            // swapped): keep the previous one polled until
                            // its slices drain. Rare: the only Arc clone.
                            let next = PostedOn {
                                kind,
                                transport: installed.clone(),
                                inflight: 1,
                            };
                            if let Some(prev) = other.replace(next)
                                && prev.inflight > 0
                            {
                                self.draining.push(prev);
                            }
                        }
                    }
                }
                Verdict::Rejected(e) => {
                    if credited {
                        pool.release(1, now);
                    }
                    t.posted -= len;
                    t.error.get_or_insert(e);
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
                self.lanes.pop(p);
                self.maybe_finish(i);
            }
            self.turn_budget = self.turn_budget.saturating_sub(slice_cost(len, credited));
            if self.turn_budget == 0 {
                if !done {
                    self.lanes.rotate(p);
                }
                break;
            }
        }
        self.waiting = waiting;
        self.note_gate(waiting, now);
        work
    }

    /// After a dispatch: which lanes with work did the slot gate hold
    /// back? Counts each closing once, and marks the worker `gated` when
    /// nothing but the gate stops it (it then naps instead of spinning).
    fn note_gate(&mut self, waiting: u8, now: u64) {
        let gate = &*self.engine.gate;
        let mut closed = 0u8;
        let mut open_work = false;
        for p in Priority::ALL {
            if self.lanes.lane_is_empty(p) || waiting & (1 << p.index()) != 0 {
                continue;
            }
            if gate.can_send(p, now) {
                open_work = true;
            } else {
                closed |= 1 << p.index();
                if self.held & (1 << p.index()) == 0 {
                    self.shared.qos.gate_held(p);
                }
            }
        }
        self.held = closed;
        self.gated = closed != 0 && !open_work && waiting == 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_last_credits_of_the_window_are_high_s() {
        for p in [Priority::Medium, Priority::Low] {
            assert!(lane_may_post(true, p, 9, 8));
            assert!(!lane_may_post(true, p, 8, 8));
            assert!(!lane_may_post(true, p, 0, 8));
            // A synchronous transport takes no credit.
            assert!(lane_may_post(false, p, 0, 8));
        }
        assert!(lane_may_post(true, Priority::High, 1, 8));
    }

    #[test]
    fn synchronous_bytes_cost_the_turn_more() {
        assert_eq!(slice_cost(4096, true), 4096);
        assert_eq!(slice_cost(4096, false), 4096 * SYNC_BYTE_WEIGHT);
        assert_eq!(slice_cost(u64::MAX, false), u64::MAX);
        // A turn of synchronous copying stops at TURN_BYTES / 16.
        assert_eq!(TURN_BYTES / SYNC_BYTE_WEIGHT, 256 << 10);
    }
}
