//! The passive-QP table: which QP holds which slot, and when a full table
//! sweeps out dead QPs and probes the rest for liveness. Every decision is
//! a function of the `now` passed in (the responder passes the monotonic
//! clock, the tests a simulated one).
//!
//! A probe is one signalled zero-length RDMA WRITE on the passive QP. The
//! initiator's NIC acknowledges it without touching memory or completing
//! anything on its side; a vanished initiator's QP answers nothing, so the
//! probe fails once its retries run out and the device moves the passive
//! QP to ERROR. A full table probes each QP at most once per
//! [`PROBE_EVERY`] (never within [`PROBE_EVERY`] of its filing, while its
//! initiator may still be moving its own QP to RTS), with at most one probe
//! in flight per QP, and reaps the outcomes at its next sweep: a failed
//! probe (or a QP in ERROR) gives up its slot there.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::nanos;
use crate::control::wire::QpInitiator;

/// Least time between two sweeps of a full table for dead QPs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Least time between two liveness probes of one passive QP, and from its
/// filing to its first.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);

/// A passive QP as the table sees it.
pub(crate) trait Passive {
    /// Can it still carry its initiator's operations? `false` for a QP the
    /// device moved to an error state (it never recovers from there).
    fn is_live(&self) -> bool;
    /// Post a liveness probe; `false` when it could not be posted.
    fn probe(&self) -> bool;
    /// The outcome of the probe in flight, once it completed: `Some(true)`
    /// when the initiator's QP acknowledged it, `Some(false)` when it
    /// failed (no such QP answers: the initiator vanished).
    fn probe_done(&self) -> Option<bool>;
}

/// The table is full of live QPs (the newcomer is refused); `probing` of
/// them have a liveness probe in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableFull {
    pub(crate) probing: usize,
}

/// Liveness probes since the table was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    /// Posted on a passive QP.
    pub posted: u64,
    /// Acknowledged by the initiator's QP (it stays).
    pub acked: u64,
    /// Failed: the initiator's QP is gone (its slot was reclaimed).
    pub failed: u64,
}

/// Where a filed QP stands with its probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// None in flight; the next not before this instant (monotonic ns).
    Idle { next_ns: u64 },
    /// One posted, its completion not reaped yet.
    InFlight,
}

#[derive(Debug)]
struct Filed<Q> {
    q: Q,
    probe: Probe,
}

/// Passive QPs filed under their initiator's key (see the responder's
/// module doc).
#[derive(Debug)]
pub(crate) struct PassiveTable<Q> {
    pub(super) cap: usize,
    qps: HashMap<QpInitiator, Filed<Q>>,
    /// No sweep before this instant (monotonic ns).
    next_sweep_ns: u64,
    /// The latest request being connected for each key, by ticket: QPs
    /// are made outside the lock, and only the latest request for a key
    /// files its QP (an older one finishing last must not replace it).
    pub(super) pending: HashMap<QpInitiator, u64>,
    next_ticket: u64,
    counts: ProbeCounts,
}

impl<Q: Passive> PassiveTable<Q> {
    /// An empty table holding at most `cap` QPs.
    pub(crate) fn new(cap: usize) -> PassiveTable<Q> {
        PassiveTable {
            cap,
            qps: HashMap::new(),
            next_sweep_ns: 0,
            pending: HashMap::new(),
            next_ticket: 0,
            counts: ProbeCounts::default(),
        }
    }

    /// A request for `key` starts: its ticket, now `key`'s latest.
    pub(crate) fn begin(&mut self, key: QpInitiator) -> u64 {
        self.next_ticket += 1;
        self.pending.insert(key, self.next_ticket);
        self.next_ticket
    }

    /// The request with `ticket` ended without a QP to file.
    pub(crate) fn abandon(&mut self, key: &QpInitiator, ticket: u64) {
        if self.pending.get(key) == Some(&ticket) {
            self.pending.remove(key);
        }
    }

    /// File `q` under `key` at `now_ns` for the request with `ticket`, if
    /// it is still `key`'s latest; the QP it replaces comes back (to be
    /// destroyed). `Err(q)` when a newer request for `key` began meanwhile
    /// (it files its own) or the table is full.
    pub(crate) fn finish(
        &mut self,
        key: QpInitiator,
        ticket: u64,
        q: Q,
        now_ns: u64,
    ) -> std::result::Result<Option<Q>, Q> {
        if self.pending.get(&key) != Some(&ticket) {
            return Err(q);
        }
        self.pending.remove(&key);
        self.insert(key, q, now_ns)
    }

    /// QPs filed.
    pub(crate) fn len(&self) -> usize {
        self.qps.len()
    }

    /// Is nothing filed?
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.qps.is_empty()
    }

    /// The QP filed under `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &QpInitiator) -> Option<&Q> {
        self.qps.get(key).map(|f| &f.q)
    }

    /// Liveness probes so far.
    pub(crate) fn probe_counts(&self) -> ProbeCounts {
        self.counts
    }

    /// Filed QPs with a probe in flight.
    fn probing(&self) -> usize {
        self.qps
            .values()
            .filter(|f| f.probe == Probe::InFlight)
            .count()
    }

    /// Make sure [`PassiveTable::insert`] will take a QP for `key`: it has
    /// a QP to replace, or a free slot, or a full table gives up its dead
    /// QPs. A full table is swept at most once per [`SWEEP_EVERY`] of
    /// `now_ns`: QPs whose probe failed or that the device moved to an
    /// error state are dropped, and if that frees no slot, the QPs due for
    /// a probe are probed (their outcome is read at a later sweep).
    /// Returns how many dead QPs were dropped.
    ///
    /// # Errors
    /// [`TableFull`]: every slot holds another key's live QP (or a sweep
    /// ran less than [`SWEEP_EVERY`] ago).
    pub(crate) fn room(
        &mut self,
        key: &QpInitiator,
        now_ns: u64,
    ) -> std::result::Result<usize, TableFull> {
        if self.qps.contains_key(key) || self.qps.len() < self.cap {
            return Ok(0);
        }
        if now_ns < self.next_sweep_ns {
            return Err(TableFull {
                probing: self.probing(),
            });
        }
        self.next_sweep_ns = now_ns.saturating_add(nanos(SWEEP_EVERY));
        let dropped = self.sweep(now_ns);
        if self.qps.len() < self.cap {
            return Ok(dropped);
        }
        self.probe_due(now_ns);
        Err(TableFull {
            probing: self.probing(),
        })
    }

    /// Reap the probes that completed and drop the dead QPs; how many.
    fn sweep(&mut self, now_ns: u64) -> usize {
        let before = self.qps.len();
        let next_ns = now_ns.saturating_add(nanos(PROBE_EVERY));
        let counts = &mut self.counts;
        self.qps.retain(|_, f| {
            if f.probe == Probe::InFlight {
                match f.q.probe_done() {
                    Some(true) => {
                        counts.acked += 1;
                        f.probe = Probe::Idle { next_ns };
                    }
                    Some(false) => {
                        counts.failed += 1;
                        return false;
                    }
                    None => {}
                }
            }
            f.q.is_live()
        });
        before - self.qps.len()
    }

    /// Probe every QP without a probe in flight whose next is due. One
    /// that cannot be posted is tried again a [`PROBE_EVERY`] later (and
    /// stays: a QP the device failed is found by `is_live`).
    fn probe_due(&mut self, now_ns: u64) {
        let next_ns = now_ns.saturating_add(nanos(PROBE_EVERY));
        for f in self.qps.values_mut() {
            let Probe::Idle { next_ns: due } = f.probe else {
                continue;
            };
            if now_ns < due {
                continue;
            }
            f.probe = if f.q.probe() {
                self.counts.posted += 1;
                Probe::InFlight
            } else {
                Probe::Idle { next_ns }
            };
        }
    }

    /// File `q` under `key` at `now_ns` (its first probe not before a
    /// [`PROBE_EVERY`] later); the QP it replaces comes back (to be
    /// destroyed). A full table without one for `key` hands `q` back.
    pub(crate) fn insert(
        &mut self,
        key: QpInitiator,
        q: Q,
        now_ns: u64,
    ) -> std::result::Result<Option<Q>, Q> {
        if !self.qps.contains_key(&key) && self.qps.len() >= self.cap {
            return Err(q);
        }
        let probe = Probe::Idle {
            next_ns: now_ns.saturating_add(nanos(PROBE_EVERY)),
        };
        Ok(self.qps.insert(key, Filed { q, probe }).map(|f| f.q))
    }
}

#[cfg(test)]
pub(super) mod fake;
#[cfg(test)]
mod tests;
