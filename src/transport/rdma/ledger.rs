//! `SubmissionLedger`: every work request an endpoint handed its QP, from
//! just before `ibv_post_send` until its end is known (seed 004).
//!
//! A request is recorded (tentatively) before the post, so the ledger is
//! never behind the provider: if the post takes only part of a list, the
//! tail it refused is taken back ([`SubmissionLedger::cancel_tentative`])
//! and never produced a completion. An RC QP completes in order, so one
//! completion settles every request up to it
//! ([`SubmissionLedger::release_by_cqe`]), signalled or not.
//!
//! When the QP is gone (destroyed after a fault), the requests still
//! recorded will never produce a completion: they are **orphaned**
//! ([`SubmissionLedger::insert_orphaned`]) and taken out once, each
//! whole ([`SubmissionLedger::extract_orphaned_records`]), so the caller
//! settles each one exactly once: its abort's kind, a re-post, or a move
//! to another rail. Nothing else ever hands a record out twice: a record
//! leaves the ledger by exactly one of `release_by_cqe`, `take`,
//! `cancel_tentative` or `extract_orphaned_records`.
//!
//! Nothing here allocates once the deques have grown to the QP's depth.
//! The ledger holds whatever a request carries (`T`: the endpoint's
//! `RdmaSlice`), so it knows nothing of slices itself.

use std::collections::VecDeque;

use tent_rings::ErrorKind;

/// One recorded work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubmissionRecord<T> {
    /// Its `wr_id`: strictly increasing per ledger, never reused.
    pub seq: u64,
    /// What it carries.
    pub slice: T,
    /// Its task was aborted with this kind: unless it finished first, it
    /// ends so once its end is known.
    pub abort: Option<ErrorKind>,
}

/// The work requests of one endpoint (see the module docs).
#[derive(Debug)]
pub(crate) struct SubmissionLedger<T> {
    /// Posted (or about to be), oldest first: seqs strictly increasing.
    live: VecDeque<SubmissionRecord<T>>,
    /// Of a QP that is gone, not yet taken out.
    orphans: VecDeque<SubmissionRecord<T>>,
    next_seq: u64,
    /// Live records with an abort set.
    aborted: usize,
}

impl<T> SubmissionLedger<T> {
    /// A ledger for a queue `depth` requests deep.
    pub(crate) fn new(depth: u32) -> SubmissionLedger<T> {
        let depth = depth.max(1) as usize;
        SubmissionLedger {
            live: VecDeque::with_capacity(depth),
            orphans: VecDeque::with_capacity(depth),
            next_seq: 1,
            aborted: 0,
        }
    }

    /// Record `slice` as about to be posted; its `wr_id`.
    #[inline]
    pub(crate) fn record(&mut self, slice: T) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.live.push_back(SubmissionRecord {
            seq,
            slice,
            abort: None,
        });
        seq
    }

    /// The provider refused the requests from `first` on (they never went
    /// out and will never complete): take them back, newest first, through
    /// `f`; returns how many.
    pub(crate) fn cancel_tentative(&mut self, first: u64, mut f: impl FnMut(SubmissionRecord<T>)) -> u32 {
        let mut n = 0;
        while self.live.back().is_some_and(|r| r.seq >= first) {
            let r = self.live.pop_back().expect("checked");
            self.aborted -= usize::from(r.abort.is_some());
            n += 1;
            f(r);
        }
        n
    }

    /// A completion for `seq` (in order: every request up to it is done):
    /// each record up to and including `seq`, oldest first, through `f`;
    /// returns how many. A `seq` already settled releases nothing.
    #[inline]
    pub(crate) fn release_by_cqe(&mut self, seq: u64, mut f: impl FnMut(SubmissionRecord<T>)) -> u32 {
        let mut n = 0;
        while self.live.front().is_some_and(|r| r.seq <= seq) {
            let r = self.live.pop_front().expect("checked");
            self.aborted -= usize::from(r.abort.is_some());
            n += 1;
            f(r);
        }
        n
    }

    /// The oldest record, taken out, if it is `seq`.
    pub(crate) fn take(&mut self, seq: u64) -> Option<SubmissionRecord<T>> {
        if self.live.front().is_none_or(|r| r.seq != seq) {
            return None;
        }
        let r = self.live.pop_front()?;
        self.aborted -= usize::from(r.abort.is_some());
        Some(r)
    }

    /// Is `seq` a completion of a request already settled (flushed and
    /// dealt with, re-posted): nothing to do?
    #[inline]
    pub(crate) fn is_stale(&self, seq: u64) -> bool {
        self.live.front().is_none_or(|r| seq < r.seq)
    }

    /// Mark every live record whose payload is `of` the aborted task and
    /// not marked yet as aborted with `kind`; returns how many.
    pub(crate) fn mark_aborted(&mut self, of: impl Fn(&T) -> bool, kind: ErrorKind) -> usize {
        let mut n = 0;
        for r in self.live.iter_mut() {
            if r.abort.is_none() && of(&r.slice) {
                r.abort = Some(kind);
                n += 1;
            }
        }
        self.aborted += n;
        n
    }

    /// Live records with an abort set.
    pub(crate) fn aborted(&self) -> usize {
        self.aborted
    }

    /// The QP is gone: every live record is orphaned (none of them will
    /// complete); returns how many.
    pub(crate) fn insert_orphaned(&mut self) -> u32 {
        let n = self.live.len() as u32;
        self.orphans.extend(self.live.drain(..));
        self.aborted = 0;
        n
    }

    /// Take out every orphaned record, oldest first, through `f`: each
    /// exactly once. Returns how many.
    pub(crate) fn extract_orphaned_records(&mut self, mut f: impl FnMut(SubmissionRecord<T>)) -> u32 {
        let mut n = 0;
        while let Some(r) = self.orphans.pop_front() {
            n += 1;
            f(r);
        }
        n
    }

    /// Records live (posted, end not known).
    pub(crate) fn record_count(&self) -> usize {
        self.live.len()
    }

    /// Records orphaned and not taken out.
    #[cfg(test)]
    pub(crate) fn orphan_count(&self) -> usize {
        self.orphans.len()
    }

    /// No live record?
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request carrying its task's token.
    fn slice(token: u64) -> u64 {
        token
    }

    fn tokens(v: &[SubmissionRecord<u64>]) -> Vec<u64> {
        v.iter().map(|r| r.slice).collect()
    }

    /// The seed's `submission_ledger_basic`, with `ReleaseByCqe`,
    /// `CancelTentative` and `ExtractOrphanedRecords`.
    #[test]
    fn ledger_basic() {
        let mut l = SubmissionLedger::new(8);
        let seqs: Vec<u64> = (0..6).map(|t| l.record(slice(t))).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "seqs strictly increasing");
        assert_eq!(l.record_count(), 6);

        // The provider took only the first four: the tail comes back,
        // newest first, whole.
        let mut back = vec![];
        assert_eq!(l.cancel_tentative(5, |r| back.push(r)), 2);
        assert_eq!(tokens(&back), [5, 4]);
        assert_eq!(l.record_count(), 4);
        // Its seqs are not reused: a stray completion of them is stale.
        assert_eq!(l.record(slice(9)), 7);

        // A completion of 2 settles 1 and 2, in order.
        let mut done = vec![];
        assert_eq!(l.release_by_cqe(2, |r| done.push(r)), 2);
        assert_eq!(tokens(&done), [0, 1]);
        assert_eq!(done[0].seq, 1);
        // Settled already: stale, releases nothing.
        assert!(l.is_stale(2));
        assert_eq!(l.release_by_cqe(2, |_| panic!("released twice")), 0);
        assert!(!l.is_stale(3));

        // `take` only the front, only by its own seq.
        assert!(l.take(4).is_none());
        assert_eq!(l.take(3).map(|r| r.slice), Some(2));

        // Aborts are counted until their record leaves.
        assert_eq!(l.mark_aborted(|&t| t == 9, ErrorKind::Canceled), 1);
        assert_eq!(
            l.mark_aborted(|&t| t == 9, ErrorKind::Canceled),
            0,
            "marked once"
        );
        assert_eq!(l.aborted(), 1);

        // The QP is gone: what is left is orphaned and comes out once,
        // oldest first, abort marks kept.
        assert_eq!(l.insert_orphaned(), 2);
        assert_eq!(l.record_count(), 0);
        assert_eq!(l.aborted(), 0);
        assert_eq!(l.orphan_count(), 2);
        let mut orphans = vec![];
        assert_eq!(l.extract_orphaned_records(|r| orphans.push(r)), 2);
        assert_eq!(tokens(&orphans), [3, 9]);
        assert_eq!(orphans[1].abort, Some(ErrorKind::Canceled));
        assert_eq!(l.extract_orphaned_records(|_| panic!("twice")), 0);
        // And nothing of the dead QP's is live: its late completions are
        // stale.
        assert!(l.is_stale(7));
    }

    #[test]
    fn cancelling_an_aborted_tail_keeps_the_count() {
        let mut l = SubmissionLedger::new(4);
        l.record(slice(1));
        l.record(slice(2));
        l.mark_aborted(|&t| t == 2, ErrorKind::Timeout);
        assert_eq!(l.cancel_tentative(2, |_| {}), 1);
        assert_eq!(l.aborted(), 0);
        assert_eq!(l.release_by_cqe(1, |_| {}), 1);
        assert!(l.is_empty());
    }
}
