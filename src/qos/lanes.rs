use std::collections::VecDeque;

use tent_rings::Priority;

use super::SendGate;

/// A task waiting in a lane, stamped with when it entered that lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneEntry {
    /// Worker-local task index.
    pub task: u32,
    /// Monotonic ns when it entered its current lane.
    pub stamp_ns: u64,
}

/// Three bounded FIFO lanes (HIGH, MEDIUM, LOW). HIGH drains first; a task
/// that waited longer than the promotion timeout moves up one lane, so LOW
/// work is never starved forever. Capacity is fixed at construction: pushes
/// never allocate.
#[derive(Debug)]
pub(crate) struct PriorityLanes {
    lanes: [VecDeque<LaneEntry>; 3],
    capacity: usize,
    promotion_ns: u64,
}

impl PriorityLanes {
    /// Lanes of `capacity` entries each; promotion after `promotion_ns`.
    pub(crate) fn new(capacity: usize, promotion_ns: u64) -> PriorityLanes {
        PriorityLanes {
            lanes: std::array::from_fn(|_| VecDeque::with_capacity(capacity)),
            capacity,
            promotion_ns,
        }
    }

    /// Queue `task` at priority `p`; `false` if that lane is full.
    #[inline]
    pub(crate) fn push(&mut self, p: Priority, task: u32, now_ns: u64) -> bool {
        let lane = &mut self.lanes[p.index()];
        if lane.len() >= self.capacity {
            return false;
        }
        lane.push_back(LaneEntry {
            task,
            stamp_ns: now_ns,
        });
        true
    }

    /// Promote after `ns` from now on.
    #[inline]
    pub(crate) fn set_promotion_ns(&mut self, ns: u64) {
        self.promotion_ns = ns;
    }

    /// Move tasks that waited too long up one lane; returns how many moved
    /// out of each lane.
    pub(crate) fn promote(&mut self, now_ns: u64) -> [u32; 3] {
        let mut moved = [0; 3];
        for from in [Priority::Medium, Priority::Low] {
            let to = from.index() - 1;
            while let Some(head) = self.lanes[from.index()].front().copied() {
                if now_ns.saturating_sub(head.stamp_ns) < self.promotion_ns
                    || self.lanes[to].len() >= self.capacity
                {
                    break;
                }
                self.lanes[from.index()].pop_front();
                self.lanes[to].push_back(LaneEntry {
                    task: head.task,
                    stamp_ns: now_ns,
                });
                moved[from.index()] += 1;
            }
        }
        moved
    }

    /// The task to serve next: head of the first non-empty lane the gate
    /// lets through.
    #[inline]
    #[cfg(test)]
    pub(crate) fn next(&self, gate: &dyn SendGate, now: u64) -> Option<(Priority, LaneEntry)> {
        self.next_except(gate, 0, now)
    }

    /// As [`next`](Self::next), passing over the lanes whose bit
    /// (`1 << priority index`) is set in `skip`: lanes whose every head is
    /// waiting this turn, so the lanes below them still post.
    #[inline]
    pub(crate) fn next_except(
        &self,
        gate: &dyn SendGate,
        skip: u8,
        now: u64,
    ) -> Option<(Priority, LaneEntry)> {
        Priority::ALL.into_iter().find_map(|p| {
            if skip & (1 << p.index()) != 0 {
                return None;
            }
            let head = self.lanes[p.index()].front()?;
            gate.can_send(p, now).then_some((p, *head))
        })
    }

    /// Remove the head of lane `p` (it is fully posted).
    #[inline]
    pub(crate) fn pop(&mut self, p: Priority) -> Option<LaneEntry> {
        self.lanes[p.index()].pop_front()
    }

    /// Move the head of lane `p` to its back (its turn is over, others in
    /// the lane go next); keeps its stamp.
    #[inline]
    pub(crate) fn rotate(&mut self, p: Priority) {
        let lane = &mut self.lanes[p.index()];
        if lane.len() > 1 {
            lane.rotate_left(1);
        }
    }

    /// Drop every queued entry for which `keep` is false.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        for lane in &mut self.lanes {
            lane.retain(|e| keep(e.task));
        }
    }

    /// Tasks queued in each lane.
    pub(crate) fn lens(&self) -> [usize; 3] {
        std::array::from_fn(|i| self.lanes[i].len())
    }

    /// Is lane `p` empty?
    #[inline]
    pub(crate) fn lane_is_empty(&self, p: Priority) -> bool {
        self.lanes[p.index()].is_empty()
    }

    /// May work of priority `p` go before everything queued? True when
    /// every lane at `p` or above is empty or `waiting` (bit per priority:
    /// each of its tasks was answered `Later` or back-pressure at the last
    /// dispatch, which would pass over it too). Lanes below `p` never hold
    /// it back.
    pub(crate) fn nothing_ready_from(&self, p: Priority, waiting: u8) -> bool {
        Priority::ALL[..=p.index()]
            .iter()
            .all(|q| waiting & (1 << q.index()) != 0 || self.lanes[q.index()].is_empty())
    }

    /// Tasks queued in all lanes.
    pub(crate) fn len(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum()
    }

    /// Nothing queued?
    pub(crate) fn is_empty(&self) -> bool {
        self.lanes.iter().all(VecDeque::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::OpenGate;

    #[derive(Debug)]
    struct OnlyHigh;
    impl SendGate for OnlyHigh {
        fn can_send(&self, p: Priority, _now: u64) -> bool {
            p == Priority::High
        }
    }

    #[test]
    fn high_first_then_fifo() {
        let mut l = PriorityLanes::new(4, 1_000);
        assert!(l.push(Priority::Low, 1, 0));
        assert!(l.push(Priority::High, 2, 0));
        assert!(l.push(Priority::High, 3, 0));
        assert_eq!(l.next(&OpenGate, 0).unwrap().1.task, 2);
        l.pop(Priority::High);
        assert_eq!(l.next(&OpenGate, 0).unwrap().1.task, 3);
        l.pop(Priority::High);
        assert_eq!(
            l.next(&OpenGate, 0).unwrap(),
            (
                Priority::Low,
                LaneEntry {
                    task: 1,
                    stamp_ns: 0
                }
            )
        );
        assert!(l.next(&OnlyHigh, 0).is_none());
    }

    #[test]
    fn bounded_and_promotion() {
        let mut l = PriorityLanes::new(2, 1_000);
        assert!(l.push(Priority::Low, 1, 0));
        assert!(l.push(Priority::Low, 2, 500));
        assert!(!l.push(Priority::Low, 3, 0));
        assert_eq!(l.promote(999), [0; 3]);
        assert_eq!(l.promote(1_000), [0, 0, 1]);
        assert_eq!(
            l.next(&OpenGate, 0).unwrap(),
            (
                Priority::Medium,
                LaneEntry {
                    task: 1,
                    stamp_ns: 1_000
                }
            )
        );
        assert_eq!(l.promote(2_000), [0, 1, 1]); // task 1 -> HIGH, task 2 -> MEDIUM
        assert_eq!(l.lens(), [1, 1, 0]);
        assert_eq!(l.next(&OnlyHigh, 0).unwrap().1.task, 1);
        l.rotate(Priority::High);
        l.retain(|t| t != 1);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn next_except_passes_over_the_skipped_lanes() {
        let mut l = PriorityLanes::new(4, 1_000);
        l.push(Priority::High, 1, 0);
        l.push(Priority::Low, 3, 0);
        let gate = crate::qos::OpenGate;
        assert_eq!(
            l.next_except(&gate, 0, 0).map(|(p, e)| (p, e.task)),
            Some((Priority::High, 1))
        );
        let skip_high = 1 << Priority::High.index();
        assert_eq!(
            l.next_except(&gate, skip_high, 0).map(|(p, e)| (p, e.task)),
            Some((Priority::Low, 3))
        );
        let skip_all = skip_high | 1 << Priority::Low.index();
        assert!(l.next_except(&gate, skip_all, 0).is_none());
    }

    #[test]
    fn only_ready_work_at_or_above_a_priority_holds_it_back() {
        let mut l = PriorityLanes::new(8, 1_000_000);
        for p in Priority::ALL {
            assert!(l.nothing_ready_from(p, 0));
        }
        // A LOW task: HIGH and MEDIUM may pass it, LOW may not.
        assert!(l.push(Priority::Low, 1, 0));
        assert!(l.nothing_ready_from(Priority::High, 0));
        assert!(l.nothing_ready_from(Priority::Medium, 0));
        assert!(!l.nothing_ready_from(Priority::Low, 0));
        // Unless the last dispatch found it waiting.
        assert!(l.nothing_ready_from(Priority::Low, 1 << Priority::Low.index()));
        // A HIGH task holds back every priority, waiting bits of other
        // lanes notwithstanding.
        assert!(l.push(Priority::High, 2, 0));
        for p in Priority::ALL {
            assert!(!l.nothing_ready_from(p, 1 << Priority::Low.index()));
        }
        let all = 0b111;
        assert!(l.nothing_ready_from(Priority::Low, all));
        assert!(!l.nothing_ready_from(Priority::Medium, 1 << Priority::Medium.index()));
    }
}
