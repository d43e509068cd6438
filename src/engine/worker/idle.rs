//! Idle: what the worker does with no work (spin, yield, park) and the
//! park itself.

use std::time::Duration;

pub(super) use predict::{ArrivalPredictor, Plan};

mod predict;

/// Longest sleep while slices are in flight on transports that wake us,
/// or while every task waits on a transport that answered `Later`.
const COMPLETION_PARK: Duration = Duration::from_millis(1);

/// What the worker knows when a turn found no work.
#[derive(Debug, Clone, Copy)]
pub(super) struct Idle {
    /// Since the last turn that moved something.
    pub idle_ns: u64,
    /// `workers/spin_us`, and that plus `workers/yield_us`, in ns.
    pub spin_ns: u64,
    pub yield_ns: u64,
    /// Tasks wait in the lanes.
    pub queued: bool,
    /// The last dispatch found every lane head answered `Later` (a
    /// transport getting ready).
    pub later: bool,
    /// The last dispatch found every queued lane closed by the slot gate
    /// alone (meaningful only with `queued`).
    pub gated: bool,
    /// Slices are posted on an asynchronous transport.
    pub in_flight: bool,
    /// Every transport with slices posted rings the worker's bell when one
    /// completes.
    pub completions_wake: bool,
    /// `workers/park_timeout_ms`.
    pub park: Duration,
    /// How soon the gate may reopen a closed slot (`SendGate::recheck_after`).
    pub gate_recheck: Duration,
}

/// What to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Poll again at once (the first `spin_us`).
    Spin,
    /// Give the core away for a moment, then poll.
    Yield,
    /// Sleep on the doorbell up to `timeout`; with `completions`, a
    /// transport's completion also rings it.
    Park {
        timeout: Duration,
        completions: bool,
    },
}

/// The idle policy: spin, then yield, then park. Slices in flight on
/// transports that all wake the worker let it park right after the spin
/// (their threads need the core more); in flight elsewhere, or work
/// queued that a turn could post, it only yields. Work queued that only a
/// transport getting ready (`later`) or the gate (`gated`) holds back
/// parks for a nap: 1 ms, or sooner when the gate says a slot may reopen;
/// nothing at all parks for `park`. Every park is bounded, so deadlines
/// are swept even when nobody rings.
pub(super) fn step(s: &Idle) -> Step {
    let gated = s.queued && s.gated;
    let later = s.queued && (s.later || gated);
    let mut nap = s.park.min(COMPLETION_PARK);
    if gated {
        nap = nap.min(s.gate_recheck);
    }
    if s.idle_ns < s.spin_ns {
        Step::Spin
    } else if s.in_flight && s.completions_wake {
        Step::Park {
            timeout: nap,
            completions: true,
        }
    } else if s.idle_ns < s.yield_ns || (s.queued && !later) || s.in_flight {
        Step::Yield
    } else {
        Step::Park {
            timeout: if later { nap } else { s.park },
            completions: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Idle, Step, step};
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// Idle past spin and yield with nothing anywhere.
    fn quiet() -> Idle {
        Idle {
            idle_ns: 10_000_000,
            spin_ns: 50_000,
            yield_ns: 1_000_000,
            queued: false,
            later: false,
            gated: false,
            in_flight: false,
            completions_wake: false,
            park: Duration::from_millis(100),
            gate_recheck: Duration::MAX,
        }
    }

    #[test]
    fn spins_then_yields_then_parks_for_the_full_timeout() {
        let s = quiet();
        assert_eq!(step(&Idle { idle_ns: 10, ..s }), Step::Spin);
        assert_eq!(
            step(&Idle {
                idle_ns: 60_000,
                ..s
            }),
            Step::Yield
        );
        assert_eq!(
            step(&s),
            Step::Park {
                timeout: Duration::from_millis(100),
                completions: false
            }
        );
    }

    #[test]
    fn slices_in_flight_park_only_when_their_transports_wake_it() {
        let s = Idle {
            in_flight: true,
            idle_ns: 60_000,
            ..quiet()
        };
        assert_eq!(
            step(&Idle {
                completions_wake: true,
                ..s
            }),
            Step::Park {
                timeout: MS,
                completions: true
            }
        );
        // A transport that does not ring: poll it, however long idle.
        assert_eq!(
            step(&Idle {
                idle_ns: u64::MAX,
                ..s
            }),
            Step::Yield
        );
    }

    #[test]
    fn queued_work_a_turn_could_post_keeps_it_awake() {
        let s = Idle {
            queued: true,
            ..quiet()
        };
        assert_eq!(step(&s), Step::Yield);
    }

    #[test]
    fn work_waiting_on_a_transport_or_the_gate_naps() {
        let s = Idle {
            queued: true,
            later: true,
            ..quiet()
        };
        assert_eq!(
            step(&s),
            Step::Park {
                timeout: MS,
                completions: false
            }
        );
        let gated = Idle {
            queued: true,
            gated: true,
            gate_recheck: Duration::from_micros(300),
            ..quiet()
        };
        assert_eq!(
            step(&gated),
            Step::Park {
                timeout: Duration::from_micros(300),
                completions: false
            }
        );
        // `later` / `gated` without queued work mean nothing.
        let stale = Idle {
            later: true,
            gated: true,
            gate_recheck: Duration::from_micros(300),
            ..quiet()
        };
        assert_eq!(
            step(&stale),
            Step::Park {
                timeout: Duration::from_millis(100),
                completions: false
            }
        );
    }
}
