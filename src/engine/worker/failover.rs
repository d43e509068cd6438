//! Failover: a task whose transport failed with a transient error moves
//! to the next transport in its ranked list, at submit or at completion.

use tent_rings::{ErrorKind, TransportKind};

use super::Worker;
use crate::clock::monotonic_ns;

/// May a request fail over from a transient `kind` at all? Not when it
/// asked not to (`SQE_NO_FAILOVER`), when failover is off
/// (`max_failover_attempts` 0), or for its own deadline (`Timeout` is
/// transient for the peer, but the request's time is spent everywhere).
pub(super) fn may_fail_over(kind: ErrorKind, no_failover: bool, max: u8) -> bool {
    kind.is_transient() && !no_failover && max > 0 && kind != ErrorKind::Timeout
}

/// Why a failover found nowhere to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exhausted {
    /// `max_failover_attempts` switches spent.
    Limit,
    /// No installed transport below the failed one reaches the segment.
    NoneLeft,
}

/// Where a request that switched `count` times (of `max`) goes next:
/// `next`, the best transport ranked below the failed one that reaches its
/// segment (as `Worker::resolve` finds it), unless the budget is spent.
pub(super) fn next_transport(
    count: u8,
    max: u8,
    next: Option<(u8, TransportKind)>,
) -> Result<(u8, TransportKind), Exhausted> {
    if count >= max {
        return Err(Exhausted::Limit);
    }
    next.ok_or(Exhausted::NoneLeft)
}

impl Worker {
    /// May task `i` fail over from a transient `kind` at all?
    #[inline]
    pub(super) fn may_fail_over(&mut self, i: u32, kind: ErrorKind) -> bool {
        let max = self.engine.live.max_failover();
        may_fail_over(kind, self.tasks.get_mut(i).no_failover, max)
    }

    /// Move task `i`, whose current transport failed with `cause`, to the
    /// next transport in its ranked list (TENT's `resubmitTransferTask`).
    /// Posting resumes at the task's cursor: the caller has made sure that
    /// everything before it is done and nothing after it is in flight on
    /// the old transport. Returns false, with the task's error set, when
    /// the budget is spent or no transport is left.
    pub(super) fn fail_over(&mut self, i: u32, cause: ErrorKind) -> bool {
        let max = self.engine.live.max_failover();
        let t = self.tasks.get_mut(i);
        let from = t.transport;
        t.failing = None;
        // SAFETY: task `i` is live (it is failing over), and stays so here.
        let segment = unsafe { t.segment.as_ref().expect("live task has a segment").get() };
        // A dead peer fails every task it had, and every task after it:
        // each of these lines is logged once per (segment, transport,
        // cause), then summarised with a count at most once a second.
        let peer = segment.name();
        let key = (segment.id(), from, cause);
        let count = t.failover_count;
        let from_rank = usize::from(t.xport_priority) + 1;
        let next = if count < max {
            self.views.resolve(segment, from_rank, TransportKind::Any)
        } else {
            None
        };
        let (rank, to) = match next_transport(count, max, next) {
            Ok(to) => to,
            Err(why) => {
                match why {
                    Exhausted::Limit => crate::lograte::warn_limited!(
                        key,
                        %peer,
                        %cause,
                        "Task failover limit reached ({max}), last transport={from}"
                    ),
                    Exhausted::NoneLeft => crate::lograte::warn_limited!(
                        key,
                        %peer,
                        %cause,
                        "No more transports available after {from} failed"
                    ),
                }
                return self.exhaust(i, cause);
            }
        };
        t.failover_count += 1;
        t.transport = to;
        t.xport_priority = rank;
        crate::lograte::info_limited!(
            (segment.id(), from, to, cause),
            %peer,
            cause = %cause,
            "Transport failover: {from} -> {to} (attempt {}/{max})",
            t.failover_count
        );
        self.engine.metrics.failover(from, to);
        true
    }

    /// Task `i` has no failover left: it fails with `cause`. Always false
    /// (what `fail_over` returns then).
    fn exhaust(&mut self, i: u32, cause: ErrorKind) -> bool {
        let t = self.tasks.get_mut(i);
        t.error = Some(cause);
        t.exhausted = true;
        self.engine.metrics.exhausted();
        false
    }

    /// Completion-stage failover: task `i`'s slices on the failed transport
    /// have drained; which of them landed is not known per byte, so the
    /// whole request runs again on the next transport (as TENT resubmits a
    /// task). Returns false, with the error set, if it cannot.
    pub(super) fn resubmit(&mut self, i: u32, cause: ErrorKind) -> bool {
        let t = self.tasks.get_mut(i);
        if t.failing_on == t.transport {
            if !self.fail_over(i, cause) {
                return false;
            }
        } else {
            // A straggler of a transport it already left failed: run
            // again on the current one, no switch spent.
            t.failing = None;
        }
        let t = self.tasks.get_mut(i);
        t.posted = 0;
        t.done = 0;
        t.done_ns = 0;
        let priority = t.priority;
        // The task may still sit in a lane (a multi-slice task failing
        // while not at the head): one entry only.
        self.sched.remove(i);
        self.sched.queue(priority, i, monotonic_ns());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Exhausted, may_fail_over, next_transport};
    use tent_rings::{ErrorKind, TransportKind};

    #[test]
    fn only_transient_faults_of_requests_that_allow_it_fail_over() {
        assert!(may_fail_over(ErrorKind::Unreachable, false, 1));
        assert!(may_fail_over(ErrorKind::ProcessFailed, false, 3));
        assert!(!may_fail_over(ErrorKind::Unreachable, true, 3));
        assert!(!may_fail_over(ErrorKind::Unreachable, false, 0));
        assert!(!may_fail_over(ErrorKind::Timeout, false, 3));
        assert!(!may_fail_over(ErrorKind::OutOfBounds, false, 3));
        assert!(!may_fail_over(ErrorKind::AccessDenied, false, 3));
    }

    #[test]
    fn the_budget_is_spent_before_the_list() {
        let tcp = Some((3, TransportKind::Tcp));
        assert_eq!(next_transport(0, 1, tcp), Ok((3, TransportKind::Tcp)));
        assert_eq!(next_transport(1, 1, tcp), Err(Exhausted::Limit));
        assert_eq!(next_transport(0, 2, None), Err(Exhausted::NoneLeft));
        assert_eq!(next_transport(2, 2, None), Err(Exhausted::Limit));
    }
}
