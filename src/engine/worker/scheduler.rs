//! The scheduler: which queued task a worker serves next, and what a
//! slice's outcome means for the lanes.
//!
//! It owns the three priority lanes and their promotion (QoS seed), the
//! slot gate's view from this worker (lanes it held back, demand edges),
//! HIGH's headroom in the worker's credit window, and the turn's byte
//! budget. It reads no clock (every decision takes `now`) and calls no
//! transport: the worker asks it what to serve, posts, and tells it what
//! happened. Its decisions are unit-tested below with a simulated clock
//! and a scripted gate.
//!
//! A dispatch pass:
//! ```text
//! begin_pass ─▶ next ─▶ (may_take_credit) ─▶ post ─▶ deferred | posted | finished ─▶ next …
//!                                                              end_pass ◀─ None / Stop
//! ```

use tent_rings::Priority;

use crate::qos::{PriorityLanes, SendGate};

/// Bytes posted in one turn before the worker goes back to its rings, so a
/// HIGH request arriving behind large LOW ones waits for at most this.
/// Every slice is charged, the last of a task included.
pub(super) const TURN_BYTES: u64 = 4 << 20;

/// A synchronous transport (local, shm) moves its bytes inside `submit`:
/// they cost the worker's own time, so they count this many times over.
/// 4 MiB / 16 = 256 KiB of memcpy a turn, about 20 µs at 14 GB/s: a HIGH
/// request behind a copying LOW stream waits that long, not the 300 µs of
/// 4 MiB.
pub(super) const SYNC_BYTE_WEIGHT: u64 = 16;

/// The bit of priority `p` in a lane mask.
#[inline]
fn bit(p: Priority) -> u8 {
    1 << p.index()
}

/// May a lane of priority `p` take one of the worker's credits now? The
/// last `headroom` credits of the window are HIGH's, so a window full of
/// bulk slices still lets a HIGH slice out at once. A synchronous
/// transport (`!credited`) has nothing in flight once submit returns and
/// takes no credit.
#[inline]
pub(super) fn lane_may_post(credited: bool, p: Priority, available: u32, headroom: u32) -> bool {
    !credited || p == Priority::High || available > headroom
}

/// What a slice costs the turn's byte budget: its bytes, or for a
/// synchronous transport, whose bytes are the worker's own copying time,
/// `SYNC_BYTE_WEIGHT` times them.
#[inline]
pub(super) fn slice_cost(len: u64, credited: bool) -> u64 {
    if credited {
        len
    } else {
        len.saturating_mul(SYNC_BYTE_WEIGHT)
    }
}

/// Count a task of one priority in (`up`) or out; true on the edges the
/// gate hears of: the first one in, the last one out.
#[inline]
pub(super) fn live_edge(n: &mut u32, up: bool) -> bool {
    if up {
        *n += 1;
        *n == 1
    } else {
        *n -= 1;
        *n == 0
    }
}

/// Whether the dispatch goes on after a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    /// Serve the next lane head.
    Continue,
    /// The pass is over (the turn's budget is spent, or every queued task
    /// was answered `Later` and the gate moved while it went round).
    Stop,
}

/// One dispatch pass's memory: which task each lane first deferred, and
/// which lanes it found waiting.
#[derive(Debug)]
pub(super) struct Pass {
    /// Per lane, the first task its transport deferred this pass: when it
    /// is that lane's head again, every head of the lane is waiting, and
    /// the lane is passed over for the rest of the pass, so the lanes below
    /// it still post.
    first_deferred: [Option<u32>; 3],
    /// Lanes passed over for the rest of the pass (bit per priority).
    waiting: u8,
    /// Deferrals so far; past one per queued task (the gate moved while
    /// the pass went round), the pass ends.
    deferrals: usize,
    most_deferrals: usize,
}

/// What the worker learns at the end of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PassEnd {
    /// Lanes the gate newly held back (bit per priority): each closing is
    /// counted once.
    pub(super) newly_held: u8,
}

/// The worker's scheduling state. See the module doc.
#[derive(Debug)]
pub(super) struct Scheduler {
    lanes: PriorityLanes,
    /// Lanes whose every task the last pass found waiting (`Later`, or
    /// back-pressure with slices in flight; bit per priority), with nothing
    /// queued into them since: work served at intake may pass them, as the
    /// pass's rotation would.
    waiting: u8,
    /// Lanes the gate held back at the last look (bit per priority).
    held: u8,
    /// The last pass stopped because every lane head it could reach was
    /// deferred: the worker parks (briefly) rather than spin while the
    /// transport gets ready.
    later: bool,
    /// The last pass found every queued lane closed by the gate (nothing
    /// else to post): the worker naps `gate.recheck_after()` instead of
    /// spinning on it.
    gated: bool,
    /// Credits of a worker window that only HIGH slices may take (an
    /// eighth of `max_inflight_slices`).
    high_headroom: u32,
    /// Bytes this turn may still move (`TURN_BYTES`, reset every turn):
    /// charged by the pass and by work served at intake alike, so a HIGH
    /// request waits for at most one turn's worth of copying, whichever
    /// path did it.
    turn_budget: u64,
    /// Live HIGH and MEDIUM tasks (accepted, not finished; by priority):
    /// the gate hears when a count goes from 0 to 1 and back.
    live: [u32; 2],
    /// The gate hears demand edges (`SendGate::tracks_demand`).
    tracks_demand: bool,
}

impl Scheduler {
    /// Lanes of `capacity` tasks each, promotion after `promotion_ns`, a
    /// credit window of `window` slices.
    pub(super) fn new(
        capacity: usize,
        promotion_ns: u64,
        window: u32,
        tracks_demand: bool,
    ) -> Scheduler {
        Scheduler {
            lanes: PriorityLanes::new(capacity, promotion_ns),
            waiting: 0,
            held: 0,
            later: false,
            gated: false,
            high_headroom: window / 8,
            turn_budget: TURN_BYTES,
            live: [0; 2],
            tracks_demand,
        }
    }

    /// A new turn: a fresh byte budget.
    #[inline]
    pub(super) fn begin_turn(&mut self) {
        self.turn_budget = TURN_BYTES;
    }

    /// Nothing queued?
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Tasks queued in each lane.
    pub(super) fn queued(&self) -> [usize; 3] {
        self.lanes.lens()
    }

    /// Did the last pass stop on deferred work only?
    #[inline]
    pub(super) fn later(&self) -> bool {
        self.later
    }

    /// Did the last pass find nothing but gate-closed lanes?
    #[inline]
    pub(super) fn gated(&self) -> bool {
        self.gated
    }

    /// Queue task `task` at `p` (at the back of its lane). Lanes are as
    /// large as the task table, so this cannot fail for a task the table
    /// holds once.
    #[inline]
    pub(super) fn queue(&mut self, p: Priority, task: u32, now: u64) {
        let queued = self.lanes.push(p, task, now);
        debug_assert!(queued, "lanes are as large as the task table");
        self.waiting &= !bit(p);
    }

    /// Take `task` out of every lane.
    pub(super) fn remove(&mut self, task: u32) {
        self.lanes.retain(|x| x != task);
    }

    /// Empty every lane.
    pub(super) fn clear(&mut self) {
        self.lanes.retain(|_| false);
    }

    /// Move tasks that waited past the promotion timeout (`promotion_ns`,
    /// as it is now) up one lane; how many left each lane.
    #[inline]
    pub(super) fn promote(&mut self, now: u64, promotion_ns: u64) -> [u32; 3] {
        self.lanes.set_promotion_ns(promotion_ns);
        self.lanes.promote(now)
    }

    /// A task of `p` was accepted (`up`) or finished: true when the gate
    /// must hear of it (the worker's first such task came, or its last one
    /// went). LOW is not counted: nothing is reserved for it.
    #[inline]
    pub(super) fn count_live(&mut self, p: Priority, up: bool) -> bool {
        p != Priority::Low && self.tracks_demand && live_edge(&mut self.live[p.index()], up)
    }

    /// May a request of `p` be served at intake, ahead of everything
    /// queued? Only HIGH (intake takes SQEs in ring order: a LOW or MEDIUM
    /// op done there would go before a HIGH one published with it but not
    /// read yet), only while the turn has budget, and only when nothing
    /// queued at HIGH is ready (every such lane empty or waiting, which
    /// the pass would pass over too).
    #[inline]
    pub(super) fn may_serve_at_intake(&self, p: Priority) -> bool {
        p == Priority::High
            && self.turn_budget > 0
            && self.lanes.nothing_ready_from(p, self.waiting)
    }

    /// Charge `len` bytes served (`credited`: on an asynchronous
    /// transport) to the turn; true when the budget is spent.
    #[inline]
    pub(super) fn charge(&mut self, len: u64, credited: bool) -> bool {
        self.turn_budget = self.turn_budget.saturating_sub(slice_cost(len, credited));
        self.turn_budget == 0
    }

    /// Start a dispatch pass.
    #[inline]
    pub(super) fn begin_pass(&mut self) -> Pass {
        self.later = false;
        self.gated = false;
        Pass {
            first_deferred: [None; 3],
            waiting: 0,
            deferrals: 0,
            most_deferrals: self.lanes.len(),
        }
    }

    /// The next task to serve: the head of the first lane the gate lets
    /// through that the pass has not found waiting. A lane whose head is
    /// the task it first deferred has nothing but deferred work: it is
    /// passed over from now on.
    #[inline]
    pub(super) fn next(
        &mut self,
        pass: &mut Pass,
        gate: &dyn SendGate,
        now: u64,
    ) -> Option<(Priority, u32)> {
        loop {
            let (p, head) = self.lanes.next_except(gate, pass.waiting, now)?;
            if pass.first_deferred[p.index()] == Some(head.task) {
                pass.waiting |= bit(p);
                self.later = true;
                continue;
            }
            return Some((p, head.task));
        }
    }

    /// May lane `p`'s head take a credit, `available` being left in the
    /// window? When not, the rest of the window is HIGH's: the lane waits
    /// for completions for the rest of the pass.
    #[inline]
    pub(super) fn may_take_credit(
        &self,
        pass: &mut Pass,
        p: Priority,
        credited: bool,
        available: u32,
    ) -> bool {
        let may = lane_may_post(credited, p, available, self.high_headroom);
        if !may {
            pass.waiting |= bit(p);
        }
        may
    }

    /// The head of lane `p` is done with (fully posted, stopped, or
    /// failed): out of its lane.
    #[inline]
    pub(super) fn finished(&mut self, p: Priority) {
        self.lanes.pop(p);
    }

    /// The head of lane `p`, `task`, was deferred by its transport (`Later`,
    /// or back-pressure with slices out): it keeps its place behind the
    /// others of its lane, which may go elsewhere.
    #[inline]
    pub(super) fn deferred(&mut self, pass: &mut Pass, p: Priority, task: u32) -> Flow {
        self.lanes.rotate(p);
        pass.first_deferred[p.index()].get_or_insert(task);
        pass.deferrals += 1;
        if pass.deferrals > pass.most_deferrals {
            self.later = true;
            return Flow::Stop;
        }
        Flow::Continue
    }

    /// The head of lane `p` had a slice of `len` bytes served; `done`: its
    /// last one (it leaves its lane). The turn is charged; once its budget
    /// is spent a task with more to post goes to the back of its lane, so
    /// the next turn starts with another.
    #[inline]
    pub(super) fn posted(&mut self, p: Priority, len: u64, credited: bool, done: bool) -> Flow {
        if done {
            self.lanes.pop(p);
        }
        if !self.charge(len, credited) {
            return Flow::Continue;
        }
        if !done {
            self.lanes.rotate(p);
        }
        Flow::Stop
    }

    /// End a pass: which lanes with work did the gate hold back? Each
    /// closing is reported once; the worker is `gated` when nothing but the
    /// gate stops it.
    pub(super) fn end_pass(&mut self, pass: Pass, gate: &dyn SendGate, now: u64) -> PassEnd {
        self.waiting = pass.waiting;
        let mut closed = 0u8;
        let mut open_work = false;
        for p in Priority::ALL {
            if self.lanes.lane_is_empty(p) || pass.waiting & bit(p) != 0 {
                continue;
            }
            if gate.can_send(p, now) {
                open_work = true;
            } else {
                closed |= bit(p);
            }
        }
        let newly_held = closed & !self.held;
        self.held = closed;
        self.gated = closed != 0 && !open_work && pass.waiting == 0;
        PassEnd { newly_held }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Flow, Pass, PassEnd, SYNC_BYTE_WEIGHT, Scheduler, TURN_BYTES, bit, lane_may_post,
        live_edge, slice_cost,
    };
    use crate::qos::SendGate;
    use std::cell::Cell;
    use std::time::Duration;
    use tent_rings::Priority;

    const PROMOTION_NS: u64 = 1_000_000;
    const WINDOW: u32 = 64;

    /// A gate whose open lanes (bit per priority) the test sets.
    #[derive(Debug)]
    struct Scripted(std::sync::atomic::AtomicU8);

    impl Scripted {
        fn open(mask: u8) -> Scripted {
            Scripted(std::sync::atomic::AtomicU8::new(mask))
        }
        fn set(&self, mask: u8) {
            self.0.store(mask, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl SendGate for Scripted {
        fn can_send(&self, p: Priority, _now: u64) -> bool {
            self.0.load(std::sync::atomic::Ordering::Relaxed) & bit(p) != 0
        }
        fn recheck_after(&self) -> Duration {
            Duration::from_millis(1)
        }
    }

    const ALL: u8 = 0b111;
    const H: Priority = Priority::High;
    const M: Priority = Priority::Medium;
    const L: Priority = Priority::Low;

    fn sched() -> Scheduler {
        Scheduler::new(16, PROMOTION_NS, WINDOW, true)
    }

    /// Serve one pass, answering each head with `answer(task)`: what the
    /// pass served, in order.
    fn pass_with(
        s: &mut Scheduler,
        gate: &dyn SendGate,
        now: u64,
        mut answer: impl FnMut(&mut Scheduler, &mut Pass, Priority, u32) -> Flow,
    ) -> (Vec<u32>, PassEnd) {
        let mut pass = s.begin_pass();
        let mut served = Vec::new();
        while let Some((p, t)) = s.next(&mut pass, gate, now) {
            served.push(t);
            if answer(s, &mut pass, p, t) == Flow::Stop {
                break;
            }
        }
        let end = s.end_pass(pass, gate, now);
        (served, end)
    }

    #[test]
    fn high_is_served_before_medium_before_low() {
        let mut s = sched();
        s.queue(L, 1, 0);
        s.queue(M, 2, 0);
        s.queue(H, 3, 0);
        let gate = Scripted::open(ALL);
        let (served, _) = pass_with(&mut s, &gate, 0, |s, _, p, _| s.posted(p, 8, true, true));
        assert_eq!(served, [3, 2, 1]);
        assert!(s.is_empty());
    }

    #[test]
    fn a_task_waiting_past_the_promotion_timeout_moves_up_one_lane() {
        let mut s = sched();
        s.queue(L, 1, 0);
        s.queue(M, 2, 500_000);
        let p = PROMOTION_NS;
        assert_eq!(s.promote(p - 1, p), [0, 0, 0], "not yet");
        assert_eq!(s.promote(p, p), [0, 0, 1], "LOW -> MEDIUM");
        assert_eq!(s.queued(), [0, 2, 0]);
        // Restamped on entry: MEDIUM's older task goes up first, the
        // promoted one only a timeout after its promotion.
        assert_eq!(s.promote(p + 500_000, p), [0, 1, 0]);
        assert_eq!(s.queued(), [1, 1, 0]);
        assert_eq!(s.promote(2 * p, p), [0, 1, 0]);
        assert_eq!(s.queued(), [2, 0, 0]);
    }

    #[test]
    fn a_reloaded_promotion_timeout_applies_at_the_next_promotion() {
        let mut s = sched();
        s.queue(L, 1, 0);
        let p = PROMOTION_NS;
        assert_eq!(s.promote(p / 2, p), [0, 0, 0], "half the timeout: not yet");
        // Reloaded to a quarter: the same wait is now past it.
        assert_eq!(s.promote(p / 2, p / 4), [0, 0, 1]);
    }

    #[test]
    fn a_lane_the_gate_closes_is_held_counted_once_per_closing() {
        let mut s = sched();
        s.queue(L, 1, 0);
        let gate = Scripted::open(bit(H) | bit(M));
        let (served, end) = pass_with(&mut s, &gate, 0, |_, _, _, _| unreachable!());
        assert!(served.is_empty(), "LOW is closed");
        assert_eq!(end.newly_held, bit(L));
        assert!(s.gated(), "nothing but the gate holds the worker");
        let (_, end) = pass_with(&mut s, &gate, 1, |_, _, _, _| unreachable!());
        assert_eq!(end.newly_held, 0, "the same closing");
        gate.set(ALL);
        let (served, end) = pass_with(&mut s, &gate, 2, |s, _, p, _| s.posted(p, 8, true, true));
        assert_eq!(served, [1]);
        assert_eq!(end.newly_held, 0);
        assert!(!s.gated());
        // Closed again later: a new closing, counted again.
        s.queue(L, 2, 3);
        gate.set(bit(H));
        assert_eq!(
            pass_with(&mut s, &gate, 3, |_, _, _, _| unreachable!())
                .1
                .newly_held,
            bit(L)
        );
    }

    #[test]
    fn a_closed_lane_does_not_hold_an_open_one() {
        let mut s = sched();
        s.queue(M, 1, 0);
        s.queue(L, 2, 0);
        let gate = Scripted::open(bit(H) | bit(L));
        let (served, end) = pass_with(&mut s, &gate, 0, |s, _, p, _| s.posted(p, 8, true, true));
        assert_eq!(served, [2], "LOW goes while MEDIUM's slot is closed");
        assert_eq!(end.newly_held, bit(M));
        assert!(s.gated(), "only MEDIUM is left, behind the gate");
    }

    #[test]
    fn the_last_credits_of_the_window_are_high_s() {
        let s = sched();
        let headroom = WINDOW / 8;
        let mut pass = Scheduler::new(16, PROMOTION_NS, WINDOW, true).begin_pass();
        for p in [M, L] {
            assert!(s.may_take_credit(&mut pass, p, true, headroom + 1));
            assert!(!s.may_take_credit(&mut pass, p, true, headroom));
            // A synchronous transport takes no credit.
            assert!(s.may_take_credit(&mut pass, p, false, 0));
        }
        assert!(s.may_take_credit(&mut pass, H, true, 1));
        assert_eq!(pass.waiting, bit(M) | bit(L), "refused lanes wait");
        // The same rule as a plain function.
        assert!(lane_may_post(true, H, 1, 8));
        assert!(!lane_may_post(true, L, 8, 8));
    }

    #[test]
    fn a_lane_short_of_headroom_waits_and_the_lanes_below_still_post() {
        let mut s = sched();
        s.queue(M, 1, 0);
        s.queue(L, 2, 0);
        let gate = Scripted::open(ALL);
        let available = Cell::new(WINDOW / 8);
        let (served, _) = pass_with(&mut s, &gate, 0, |s, pass, p, _| {
            if !s.may_take_credit(pass, p, true, available.get()) {
                return Flow::Continue;
            }
            s.posted(p, 8, true, true)
        });
        // MEDIUM is refused and passed over; LOW meets the same rule.
        assert_eq!(served, [1, 2]);
        assert_eq!(s.queued(), [0, 1, 1]);
        assert!(!s.later() && !s.gated());
    }

    #[test]
    fn a_deferred_task_rotates_and_a_lane_of_deferred_tasks_is_passed_over() {
        let mut s = sched();
        s.queue(M, 1, 0);
        s.queue(M, 2, 0);
        s.queue(L, 3, 0);
        let gate = Scripted::open(ALL);
        let (served, _) = pass_with(&mut s, &gate, 0, |s, pass, p, t| match t {
            1 | 2 => s.deferred(pass, p, t),
            _ => s.posted(p, 8, true, true),
        });
        // 1 and 2 deferred in turn; 1 at the head again: MEDIUM is all
        // waiting, LOW still posts.
        assert_eq!(served, [1, 2, 3]);
        assert_eq!(s.queued(), [0, 2, 0]);
        assert!(s.later(), "parks briefly: only deferred work is left");
        // Work served at intake may pass a waiting lane...
        assert!(s.may_serve_at_intake(H));
        // ...until something is queued into it.
        s.queue(H, 4, 1);
        assert!(!s.may_serve_at_intake(H));
    }

    #[test]
    fn a_pass_ends_when_the_gate_moves_while_it_goes_round() {
        let mut s = sched();
        s.queue(L, 1, 0);
        s.queue(L, 2, 0);
        let gate = Scripted::open(ALL);
        let mut served = 0;
        let mut pass = s.begin_pass();
        // The gate flaps, so `next` keeps returning heads: past one
        // deferral per queued task the pass stops on its own.
        let mut flow = Flow::Continue;
        while flow == Flow::Continue {
            let Some((p, t)) = s.next(&mut pass, &gate, 0) else {
                break;
            };
            served += 1;
            // Forget what the pass saw, as if the gate had closed and
            // reopened the lane between two looks.
            pass.first_deferred = [None; 3];
            flow = s.deferred(&mut pass, p, t);
        }
        assert_eq!(flow, Flow::Stop);
        assert_eq!(served, 3, "two queued: stops at the third deferral");
        assert!(s.later());
    }

    #[test]
    fn the_turn_budget_stops_the_pass_and_rotates_an_unfinished_task() {
        let mut s = sched();
        s.queue(L, 1, 0);
        s.queue(L, 2, 0);
        let gate = Scripted::open(ALL);
        let slice = TURN_BYTES / 4;
        let (served, _) = pass_with(&mut s, &gate, 0, |s, _, p, _| {
            s.posted(p, slice, true, false)
        });
        assert_eq!(served, [1, 1, 1, 1], "four slices spend the turn");
        assert_eq!(s.queued(), [0, 0, 2]);
        // Task 1 went to the back: the next turn starts with task 2.
        s.begin_turn();
        let (served, _) = pass_with(&mut s, &gate, 1, |s, _, p, _| {
            s.posted(p, slice, true, true)
        });
        assert_eq!(served, [2, 1]);
    }

    #[test]
    fn synchronous_bytes_cost_the_turn_more() {
        assert_eq!(slice_cost(4096, true), 4096);
        assert_eq!(slice_cost(4096, false), 4096 * SYNC_BYTE_WEIGHT);
        assert_eq!(slice_cost(u64::MAX, false), u64::MAX);
        // A turn of synchronous copying stops at TURN_BYTES / 16.
        assert_eq!(TURN_BYTES / SYNC_BYTE_WEIGHT, 256 << 10);
        let mut s = sched();
        assert!(!s.charge(TURN_BYTES / SYNC_BYTE_WEIGHT - 1, false));
        assert!(s.charge(1, false));
        assert!(!s.may_serve_at_intake(H), "no budget left for intake");
        s.begin_turn();
        assert!(s.may_serve_at_intake(H));
    }

    #[test]
    fn only_high_is_served_at_intake_and_never_ahead_of_ready_high_work() {
        let mut s = sched();
        assert!(s.may_serve_at_intake(H));
        assert!(!s.may_serve_at_intake(M), "could pass an unread HIGH SQE");
        assert!(!s.may_serve_at_intake(L));
        s.queue(H, 1, 0);
        assert!(!s.may_serve_at_intake(H), "a ready HIGH task goes first");
        let gate = Scripted::open(ALL);
        pass_with(&mut s, &gate, 0, |s, _, p, _| s.posted(p, 8, true, true));
        assert!(s.may_serve_at_intake(H));
        // Queued MEDIUM and LOW work never holds HIGH back.
        s.queue(M, 2, 0);
        s.queue(L, 3, 0);
        assert!(s.may_serve_at_intake(H));
    }

    #[test]
    fn the_gate_hears_the_first_in_and_the_last_out() {
        let mut s = sched();
        assert!(s.count_live(H, true));
        assert!(!s.count_live(H, true));
        assert!(s.count_live(M, true), "each priority on its own");
        assert!(!s.count_live(H, false));
        assert!(s.count_live(H, false));
        assert!(!s.count_live(L, true), "LOW is not counted");
        let mut deaf = Scheduler::new(16, PROMOTION_NS, WINDOW, false);
        assert!(!deaf.count_live(H, true), "a gate that tracks no demand");
        let mut n = 0;
        assert!(live_edge(&mut n, true));
        assert!(!live_edge(&mut n, true));
        assert!(!live_edge(&mut n, false));
        assert!(live_edge(&mut n, false));
    }
}
