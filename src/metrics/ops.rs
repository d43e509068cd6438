//! A worker's request counters: requests, bytes and failures by opcode and
//! transport (slot 0, `none`: refused at intake, before any transport),
//! and each request's time from intake to completion by transport and
//! priority, as a histogram, with that time split in its three [`Stage`]s.
//!
//! One writer (the worker) per [`OpStats`]: every count is a relaxed load
//! and a relaxed store, no locked read-modify-write, as for the worker's
//! other counters. A request done at intake adds one count to `inline`
//! (intake and completion are one instant: bucket 0 of the histogram) and
//! reads no clock; a queued one is timed with the turn's clock, which its
//! completion has already read. Readers sum every worker's at scrape time
//! ([`OpStats::sum_into`]).

use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::{ErrorKind, Opcode, Priority, TransportKind};

use crate::qos::stats::{WAIT_BUCKETS, bucket_of};

/// Transport slots (`TransportKind` codes).
pub(crate) const TRANSPORTS: usize = 5;
/// Opcodes: READ, WRITE.
pub(crate) const OPCODES: usize = 2;

/// Where a request's time goes; the three add up to its time from intake
/// to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// From intake to its first slice handed to a transport: the time in
    /// the priority lanes (the QoS wait) and waiting for credits.
    Queue = 0,
    /// From its first slice handed to a transport to its last: slicing and
    /// posting, waits for credits or SQ room between slices, a failover's
    /// second queueing.
    Dispatch = 1,
    /// From its last slice handed to a transport to its completion: the
    /// time on the wire (or in the copy).
    Transport = 2,
}

impl Stage {
    /// Every stage, in a request's order.
    pub(crate) const ALL: [Stage; STAGES] = [Stage::Queue, Stage::Dispatch, Stage::Transport];

    /// The stage's label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Dispatch => "dispatch",
            Stage::Transport => "transport",
        }
    }
}

/// Stages of a request ([`Stage`]).
pub(crate) const STAGES: usize = 3;

/// A histogram by transport and priority (buckets as the QoS wait's).
type Hist = [[[AtomicU64; WAIT_BUCKETS]; 3]; TRANSPORTS];
/// Its sums in ns.
type HistSum = [[AtomicU64; 3]; TRANSPORTS];

/// One worker's counters (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct OpStats {
    ok: [[AtomicU64; TRANSPORTS]; OPCODES],
    bytes: [[AtomicU64; TRANSPORTS]; OPCODES],
    failed: [[AtomicU64; TRANSPORTS]; OPCODES],
    /// Requests done at intake, by transport and priority.
    inline: [[AtomicU64; 3]; TRANSPORTS],
    /// Queued requests' intake-to-completion times.
    latency: Hist,
    latency_sum_ns: HistSum,
    /// The same requests' times by [`Stage`] (those that handed a
    /// transport at least one slice).
    stage: [Hist; STAGES],
    stage_sum_ns: [HistSum; STAGES],
}

/// Add one (single writer: a plain load and store).
#[inline]
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl OpStats {
    /// Count a request's result: `done` bytes when it succeeded.
    #[inline]
    fn count(&self, op: Opcode, t: TransportKind, res: Result<u64, ErrorKind>, done: u64) {
        let (o, t) = (op as usize, (t as usize).min(TRANSPORTS - 1));
        if res.is_ok() {
            bump(&self.ok[o][t], 1);
            bump(&self.bytes[o][t], done);
        } else {
            bump(&self.failed[o][t], 1);
        }
    }

    /// A request refused at intake, before any transport (a deadline
    /// already past, an address not registered, a segment not open...):
    /// a failure under transport slot 0, shown as `none`.
    #[inline]
    pub(crate) fn refused(&self, op: Opcode) {
        bump(&self.failed[op as usize][0], 1);
    }

    /// A request done at intake (no time passed between intake and its
    /// completion).
    #[inline]
    pub(crate) fn inline(
        &self,
        op: Opcode,
        t: TransportKind,
        p: Priority,
        res: Result<u64, ErrorKind>,
        done: u64,
    ) {
        self.count(op, t, res, done);
        bump(&self.inline[(t as usize).min(TRANSPORTS - 1)][p.index()], 1);
    }

    /// A queued request completed `ns` after intake; `stages`, its time
    /// by [`Stage`] when it handed a transport a slice.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn completed(
        &self,
        op: Opcode,
        t: TransportKind,
        p: Priority,
        res: Result<u64, ErrorKind>,
        done: u64,
        ns: u64,
        stages: Option<[u64; STAGES]>,
    ) {
        self.count(op, t, res, done);
        let (t, p) = ((t as usize).min(TRANSPORTS - 1), p.index());
        bump(&self.latency[t][p][bucket_of(ns)], 1);
        bump(&self.latency_sum_ns[t][p], ns);
        if let Some(stages) = stages {
            for (s, ns) in stages.into_iter().enumerate() {
                bump(&self.stage[s][t][p][bucket_of(ns)], 1);
                bump(&self.stage_sum_ns[s][t][p], ns);
            }
        }
    }

    /// Add this worker's counts to `s`.
    pub(crate) fn sum_into(&self, s: &mut OpSnapshot) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for o in 0..OPCODES {
            for t in 0..TRANSPORTS {
                s.ok[o][t] += get(&self.ok[o][t]);
                s.bytes[o][t] += get(&self.bytes[o][t]);
                s.failed[o][t] += get(&self.failed[o][t]);
            }
        }
        for t in 0..TRANSPORTS {
            for p in 0..3 {
                s.latency[t][p][0] += get(&self.inline[t][p]);
                s.inline += get(&self.inline[t][p]);
                for k in 0..WAIT_BUCKETS {
                    s.latency[t][p][k] += get(&self.latency[t][p][k]);
                }
                s.latency_sum_ns[t][p] += get(&self.latency_sum_ns[t][p]);
                for g in 0..STAGES {
                    // Done at intake: every stage took no time.
                    s.stage[g][t][p][0] += get(&self.inline[t][p]);
                    for k in 0..WAIT_BUCKETS {
                        s.stage[g][t][p][k] += get(&self.stage[g][t][p][k]);
                    }
                    s.stage_sum_ns[g][t][p] += get(&self.stage_sum_ns[g][t][p]);
                }
            }
        }
    }
}

/// Every worker's [`OpStats`] summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OpSnapshot {
    /// Requests that succeeded, by opcode and transport.
    pub(crate) ok: [[u64; TRANSPORTS]; OPCODES],
    /// Their bytes.
    pub(crate) bytes: [[u64; TRANSPORTS]; OPCODES],
    /// Requests that failed, by opcode and transport.
    pub(crate) failed: [[u64; TRANSPORTS]; OPCODES],
    /// Intake-to-completion histogram by transport and priority (requests
    /// done at intake in bucket 0).
    pub(crate) latency: [[[u64; WAIT_BUCKETS]; 3]; TRANSPORTS],
    pub(crate) latency_sum_ns: [[u64; 3]; TRANSPORTS],
    /// The same by [`Stage`] (requests that handed a transport a slice,
    /// and those done at intake in bucket 0).
    pub(crate) stage: [[[[u64; WAIT_BUCKETS]; 3]; TRANSPORTS]; STAGES],
    pub(crate) stage_sum_ns: [[[u64; 3]; TRANSPORTS]; STAGES],
    /// Requests done at intake.
    pub(crate) inline: u64,
}

impl OpSnapshot {
    /// Requests that succeeded, and their bytes, over every opcode and
    /// transport.
    pub(crate) fn completed(&self) -> (u64, u64) {
        let sum = |a: &[[u64; TRANSPORTS]; OPCODES]| a.iter().flatten().sum::<u64>();
        (sum(&self.ok), sum(&self.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_by_opcode_transport_and_priority_and_sum_across_workers() {
        let (a, b) = (OpStats::default(), OpStats::default());
        a.inline(Opcode::Write, TransportKind::Shm, Priority::High, Ok(8), 8);
        a.completed(
            Opcode::Read,
            TransportKind::Tcp,
            Priority::Low,
            Ok(4096),
            4096,
            3_500,
            Some([1_500, 0, 2_000]),
        );
        b.completed(
            Opcode::Read,
            TransportKind::Tcp,
            Priority::Low,
            Err(ErrorKind::Timeout),
            0,
            2_000_000,
            None,
        );
        let mut s = OpSnapshot::default();
        a.sum_into(&mut s);
        b.sum_into(&mut s);
        let (w, r) = (Opcode::Write as usize, Opcode::Read as usize);
        let (shm, tcp) = (TransportKind::Shm as usize, TransportKind::Tcp as usize);
        assert_eq!((s.ok[w][shm], s.bytes[w][shm]), (1, 8));
        assert_eq!(
            (s.ok[r][tcp], s.bytes[r][tcp], s.failed[r][tcp]),
            (1, 4096, 1)
        );
        assert_eq!(s.completed(), (2, 4104));
        assert_eq!(s.inline, 1);
        assert_eq!(
            s.latency[shm][Priority::High.index()][0],
            1,
            "at intake: bucket 0"
        );
        let low = &s.latency[tcp][Priority::Low.index()];
        assert_eq!(low[bucket_of(3_500)], 1);
        assert_eq!(low[bucket_of(2_000_000)], 1);
        assert_eq!(s.latency_sum_ns[tcp][Priority::Low.index()], 2_003_500);
        // Stages: only the request that handed a slice over, and the one
        // done at intake (bucket 0 of each).
        let (q, d, x) = (
            Stage::Queue as usize,
            Stage::Dispatch as usize,
            Stage::Transport as usize,
        );
        let low = Priority::Low.index();
        assert_eq!(s.stage[q][tcp][low][bucket_of(1_500)], 1);
        assert_eq!(s.stage[d][tcp][low][0], 1);
        assert_eq!(s.stage[x][tcp][low][bucket_of(2_000)], 1);
        assert_eq!(
            s.stage[q][tcp][low].iter().sum::<u64>(),
            1,
            "the failure before any slice is not staged"
        );
        assert_eq!(
            (0..STAGES)
                .map(|g| s.stage_sum_ns[g][tcp][low])
                .sum::<u64>(),
            3_500,
            "the stages add up to the request's time"
        );
        for g in 0..STAGES {
            assert_eq!(s.stage[g][shm][Priority::High.index()][0], 1, "at intake");
        }
    }
}
