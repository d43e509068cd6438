//! `SqController`: the one owner of a queue's credits, the threads waiting
//! for them, and its degraded state (seed 004, MORI IO's SQ flow-control
//! rework). Every bounded queue in the engine is one of these: an RDMA
//! endpoint's send queue, a TCP connection's wire window, a worker's
//! window of slices in flight on a transport.
//!
//! Two counts share the queue's depth:
//!
//! - **posted** (hard credits, a [`CreditPool`]): work requests handed to
//!   the provider whose completion is not known yet. The post path takes
//!   them with one compare-and-swap ([`SqController::try_reserve`]),
//!   checks again just before `ibv_post_send` that the queue was not
//!   degraded meanwhile ([`SqController::recheck`], which gives the
//!   credits back when it was: a degrade between reserve and post never
//!   leaks them), and completions give them back
//!   ([`SqController::release`]). The pool's resume watermark
//!   (`sq_resume_watermark_wr`) is the hysteresis: once a reserve fails
//!   with fewer free than the watermark, nothing is reserved until
//!   completions free that many, so one large list is not starved by a
//!   stream of single requests.
//! - **queued** (soft): work admitted toward this queue and not handed to
//!   the endpoint yet ([`SqController::try_admit`] → an [`AdmissionToken`],
//!   released exactly once: handed over, dropped, moved on). Admission
//!   refuses while posted + queued + the endpoint's backlog (handed over,
//!   not posted) would pass the depth, so pressure stays with the
//!   submitter instead of turning into `SqFull` inside the worker. The
//!   last eighth of the depth is HIGH's ([`SqController::limit`], the
//!   rule the worker's window keeps too): a queue full of bulk still
//!   admits a HIGH call at once, and a HIGH newcomer does not queue
//!   behind bulk waiters for the resume watermark (seed 001's priority
//!   in seed 004's admission).
//!
//! A terminal degrade ([`SqController::mark_terminal`]: a fatal
//! completion, a refused post) refuses every reserve and admission from
//! then on and wakes every waiter at once; completions of the orphaned
//! requests still give their credits back ([`SqController::release`]) and
//! never restore admission.
//!
//! Waiting ([`SqController::wait_for_credits`], [`SqController::wait_admission`])
//! is a futex on a bell that a degrade rings always, and a release rings
//! when a sleeper could go on: each sleeper says how many free slots it
//! needs, and the first release that frees as many as the least needy
//! asked for rings once and clears the requests (the woken ask again
//! before they sleep again), so a crowd of completions under pressure
//! costs one wake-up per round of sleeps, not a futex call each. The test
//! is on credits not posted, an upper bound of admission's free slots
//! (what is queued, or held in the owner's backlog and published apart
//! from the releases, is not counted), so an admission sleeper may wake
//! early and ask again, never late; slots the owner frees without a
//! release ([`SqController::room_freed`]) ring the same way. A waiter
//! reads the bell, states its need, checks the state, then sleeps only if
//! the bell did not move, so no change is missed. Each
//! sleep is at most one wait slice (`sq_admission_wait_slice_us`), and the
//! whole wait at most its timeout. The worker never waits here: it only
//! reserves, re-checks and releases (one CAS each); the waits are for
//! threads outside it.

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tent_rings::Priority;
use tent_rings::credit::{CreditPool, CreditSnapshot, ReserveError};

use crate::doorbell::Doorbell;
use crate::flow::diag::SqCqeDiagnostics;

/// [`SqController`]'s `want` when no sleeper asked since the last ring.
const NOBODY: u32 = u32::MAX;

/// Credits taken by [`SqController::try_reserve`]: post that many work
/// requests, or give them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "reserved credits are posted or released, never dropped"]
pub struct Reservation {
    /// Credits held.
    pub n: u32,
    /// The queue's health epoch when they were taken.
    pub epoch: u32,
}

/// Why the controller refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqRefusal {
    /// No room now (or paused by the resume watermark).
    Full(SqSnapshot),
    /// The queue is terminal-degraded: it takes no more work.
    Degraded,
    /// Asked for more than the whole depth: can never succeed.
    TooLarge {
        /// Credits asked for.
        requested: u32,
        /// The depth.
        depth: u32,
    },
    /// A wait ran out of time with no room.
    TimedOut(SqSnapshot),
}

/// The controller at one instant (diagnostics: an `SqFull` error carries
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqSnapshot {
    /// The posted count's pool.
    pub credits: CreditSnapshot,
    /// Admitted, not posted.
    pub queued: u32,
    /// Most ever queued at once.
    pub queued_high_watermark: u32,
    /// Admission waits that had to sleep.
    pub admission_waits: u64,
    /// Microseconds spent in them.
    pub admission_wait_us: u64,
    /// Admission waits that timed out.
    pub admission_timeouts: u64,
}

/// A bounded queue's flow control (see the module docs).
#[derive(Debug)]
pub struct SqController {
    credits: CreditPool,
    depth: u32,
    queued: AtomicU32,
    bell: Doorbell,
    /// The fewest free slots any sleeper asked for since the bell last
    /// rang (`NOBODY`: none since). A release rings only when that many
    /// are free, and a ring clears it: one wake-up per round of sleeps,
    /// not a futex call per completion while someone waits.
    want: AtomicU32,
    /// Longest single sleep.
    slice: Duration,
    /// The endpoint's diagnostics: admission counters land there, so they
    /// outlive this QP's controller.
    diag: Arc<SqCqeDiagnostics>,
}

impl SqController {
    /// A controller for a queue `depth` work requests deep (at least 1),
    /// with `resume_watermark` free requests needed to resume after a
    /// refused reserve paused it (0: no hysteresis), sleeping at most
    /// `slice` at a time when waiting.
    pub(crate) fn new(depth: u32, resume_watermark: u32, slice: Duration) -> SqController {
        SqController::with_diagnostics(depth, resume_watermark, slice, Arc::default())
    }

    /// [`SqController::new`], counting into the endpoint's `diag`.
    pub(crate) fn with_diagnostics(
        depth: u32,
        resume_watermark: u32,
        slice: Duration,
        diag: Arc<SqCqeDiagnostics>,
    ) -> SqController {
        let depth = depth.max(1);
        SqController {
            credits: CreditPool::new(depth, resume_watermark),
            depth,
            queued: AtomicU32::new(0),
            bell: Doorbell::default(),
            want: AtomicU32::new(NOBODY),
            slice: slice.max(Duration::from_micros(1)),
            diag,
        }
    }

    /// The diagnostics it counts into.
    pub(crate) fn diagnostics(&self) -> &Arc<SqCqeDiagnostics> {
        &self.diag
    }

    /// The queue's depth.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// Work requests posted and not completed.
    pub(crate) fn posted(&self) -> u32 {
        self.credits.in_flight()
    }

    /// Work admitted and not posted.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Credits free to reserve now (ignoring a pause).
    pub(crate) fn available(&self) -> u32 {
        self.credits.available()
    }

    /// Is the queue terminal-degraded?
    pub(crate) fn is_terminal(&self) -> bool {
        self.credits.is_degraded()
    }

    /// Take `n` credits, all or nothing (one CAS).
    #[inline]
    pub(crate) fn try_reserve(&self, n: u32) -> Result<Reservation, SqRefusal> {
        match self.credits.try_reserve(n) {
            Ok(epoch) => Ok(Reservation { n, epoch }),
            Err(ReserveError::Full(_)) => Err(SqRefusal::Full(self.snapshot())),
            Err(ReserveError::Degraded { .. }) => Err(SqRefusal::Degraded),
            Err(ReserveError::TooLarge {
                requested,
                capacity,
            }) => Err(SqRefusal::TooLarge {
                requested,
                depth: capacity,
            }),
        }
    }

    /// Just before posting `r`: still the epoch it was taken in and not
    /// degraded? If not, its credits go back (rollback) and the post must
    /// not happen.
    #[inline]
    pub(crate) fn recheck(&self, r: Reservation) -> Result<Reservation, SqRefusal> {
        if self.credits.health() == (false, r.epoch) {
            return Ok(r);
        }
        self.release(r.n, 0);
        Err(SqRefusal::Degraded)
    }

    /// `n` posted requests are known complete (a CQE, or a flush of a
    /// queue that is gone), at `now_ns`. Orphans of a terminal queue give
    /// their credits back too; the queue stays terminal.
    #[inline]
    pub(crate) fn release(&self, n: u32, now_ns: u64) {
        if n == 0 {
            return;
        }
        self.credits.release(n, now_ns);
        self.wake();
    }

    /// Take the queue out of service for good: every reserve and admission
    /// is refused from now on, and every waiter wakes now. Returns the new
    /// epoch (the current one if it was terminal already).
    pub(crate) fn mark_terminal(&self) -> u32 {
        let epoch = self.credits.mark_degraded();
        self.want.store(NOBODY, Ordering::SeqCst);
        self.bell.ring_all();
        epoch
    }

    /// Admit `n` HIGH requests toward this queue: posted + queued + `n`
    /// must fit the depth. The token gives them back exactly once.
    #[cfg(test)]
    pub(crate) fn try_admit(self: &Arc<Self>, n: u32) -> Result<AdmissionToken, SqRefusal> {
        self.try_admit_as(n, Priority::High)
    }

    /// The part of the depth admission hands out to priority `p`: all of
    /// it to HIGH, all but the last eighth to MEDIUM and LOW.
    pub(crate) fn limit(&self, p: Priority) -> u32 {
        match p {
            Priority::High => self.depth,
            Priority::Medium | Priority::Low => self.depth - self.depth / 8,
        }
    }

    /// Slots admission could still hand to priority `p`.
    pub(crate) fn free_for(&self, p: Priority) -> u32 {
        self.free().saturating_sub(self.depth - self.limit(p))
    }

    /// [`try_admit`](Self::try_admit) for requests of priority `p`:
    /// posted + queued + `n` must fit [`limit`](Self::limit)`(p)`.
    pub(crate) fn try_admit_as(
        self: &Arc<Self>,
        n: u32,
        p: Priority,
    ) -> Result<AdmissionToken, SqRefusal> {
        self.within(n, p)?;
        let limit = self.limit(p);
        // SeqCst here and on every count a waiter reads or a release
        // writes: a sleeper's request and a releaser's look at it are a
        // store-buffering pair (see `wake`). Free on x86 and ARMv8.
        let mut q = self.queued.load(Ordering::SeqCst);
        loop {
            if self.is_terminal() {
                return Err(SqRefusal::Degraded);
            }
            // Soft: posted may move meanwhile; completions only lower it,
            // and a post first turns a queued request into a posted one.
            if self.used(q).saturating_add(n) > limit {
                return Err(SqRefusal::Full(self.snapshot()));
            }
            match self
                .queued
                .compare_exchange_weak(q, q + n, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    // Read first: a new high is rare, a locked RMW each time is not.
                    if q + n > self.diag.queued_high.load(Ordering::Relaxed) {
                        self.diag.queued_high.fetch_max(q + n, Ordering::Relaxed);
                    }
                    return Ok(AdmissionToken {
                        sq: Some(self.clone()),
                        n,
                    });
                }
                Err(now) => q = now,
            }
        }
    }

    /// [`try_admit`](Self::try_admit), sleeping up to `timeout` for room.
    /// A degrade ends the wait at once. Once refused for room, it tries
    /// again only when `resume` slots (`sq_admission_resume_watermark_wr`,
    /// clamped to the depth; 0: as soon as `n` fit) are free, so a crowd
    /// of waiters does not wake for every single completion.
    pub(crate) fn wait_admission(
        self: &Arc<Self>,
        n: u32,
        resume: u32,
        timeout: Duration,
        p: Priority,
    ) -> Result<AdmissionToken, SqRefusal> {
        // Never fits: say so now, not after a wait.
        self.within(n, p)?;
        let limit = self.limit(p);
        let resume = resume.min(limit);
        // The common case, room now: no clock, no waiter registration.
        // With a watermark and threads already waiting for it, a newcomer
        // queues behind them instead of taking the slots they wait for;
        // a HIGH one does not (the waiters are bulk, or HIGH like it).
        if resume == 0 || p == Priority::High || self.credits.waiters() == 0 {
            match self.try_admit_as(n, p) {
                Err(SqRefusal::Full(_)) if !timeout.is_zero() => {}
                Err(SqRefusal::Full(snap)) => {
                    self.diag.admission_timeouts.fetch_add(1, Ordering::Relaxed);
                    return Err(SqRefusal::TimedOut(snap));
                }
                done => return done,
            }
        }
        let start = Instant::now();
        let mut slept = false;
        let out = self.wait_until(start + timeout, n.max(resume), &mut slept, || {
            // Refused once: wait for the watermark, but a degrade (which
            // frees no slot) ends the wait at once.
            if self.is_terminal() {
                return Err(SqRefusal::Degraded);
            }
            if self.free_for(p) < resume {
                return Err(SqRefusal::Full(self.snapshot()));
            }
            self.try_admit_as(n, p)
        });
        if slept {
            self.diag.admission_waits.fetch_add(1, Ordering::Relaxed);
            let us = start.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
            self.diag.admission_wait_us.fetch_add(us, Ordering::Relaxed);
        }
        if matches!(out, Err(SqRefusal::TimedOut(_))) {
            self.diag.admission_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// `TooLarge` for more than `p` may ever hold (it can never fit).
    fn within(&self, n: u32, p: Priority) -> Result<(), SqRefusal> {
        let limit = self.limit(p);
        if n > limit {
            return Err(SqRefusal::TooLarge {
                requested: n,
                depth: limit,
            });
        }
        Ok(())
    }

    /// Slots neither posted, admitted nor waiting in the endpoint's
    /// backlog (what admission can still hand out).
    pub(crate) fn free(&self) -> u32 {
        self.depth
            .saturating_sub(self.used(self.queued.load(Ordering::SeqCst)))
    }

    /// Slots taken with `queued` admitted: posted + `queued` + the slices
    /// the worker handed to the endpoint's backlog (their admission
    /// released then), which count until they are posted.
    #[inline]
    fn used(&self, queued: u32) -> u32 {
        self.credits
            .in_flight()
            .saturating_add(queued)
            .saturating_add(self.diag.backlog.load(Ordering::SeqCst))
    }

    /// [`try_reserve`](Self::try_reserve), sleeping up to `timeout` for
    /// credits (for a thread other than the worker). A degrade ends the
    /// wait at once.
    #[cfg(test)]
    pub(crate) fn wait_for_credits(&self, n: u32, timeout: Duration) -> Result<Reservation, SqRefusal> {
        let mut slept = false;
        self.wait_until(Instant::now() + timeout, n, &mut slept, || {
            self.try_reserve(n)
        })
    }

    /// Try `attempt` until it gives anything but `Full`, sleeping on the
    /// bell between tries, at most until `deadline`; `need` is the free
    /// slots that could let it through (the bell rings for no fewer).
    fn wait_until<T>(
        &self,
        deadline: Instant,
        need: u32,
        slept: &mut bool,
        mut attempt: impl FnMut() -> Result<T, SqRefusal>,
    ) -> Result<T, SqRefusal> {
        loop {
            // Announce the sleeper, read the bell, ask for `need`, then
            // try. A release after the try sees the request (or came
            // after a ring that cleared it, and that ring moved the bell
            // past `seen`): either way the futex returns.
            self.credits.add_waiter();
            let seen = self.bell.value();
            self.want.fetch_min(need.max(1), Ordering::SeqCst);
            let out = attempt();
            let now = Instant::now();
            let out = match out {
                Err(SqRefusal::Full(s)) if now >= deadline => Some(Err(SqRefusal::TimedOut(s))),
                Err(SqRefusal::Full(_)) => {
                    *slept = true;
                    self.bell.wait(seen, (deadline - now).min(self.slice));
                    None
                }
                other => Some(other),
            };
            self.credits.remove_waiter();
            if let Some(out) = out {
                return out;
            }
        }
    }

    /// After a release: ring the bell if someone sleeps on it and as many
    /// slots are free as the least needy sleeper asked for; once per round
    /// of sleeps (the ring clears the request; the woken ask again before
    /// they sleep again).
    #[inline]
    fn wake(&self) {
        if self.credits.waiters() == 0 {
            return;
        }
        // Credits not posted bound every free count a sleeper waits for
        // (admission's free slots are fewer still), so this never rings
        // too rarely. SeqCst, as the sleeper's request and the release
        // before this: a request made after this update follows the
        // release, and the try after it sees the freed slots. Requests
        // only fall until a ring clears them, so a failed update means no
        // sleeper can go on yet.
        let free = self.credits.available();
        let cleared = self
            .want
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w <= free).then_some(NOBODY)
            });
        if cleared.is_ok() {
            self.bell.ring_all();
        }
    }

    /// Room came free other than by a release or an admission given
    /// back (the queue's owner dropped slices it held for it: moved,
    /// aborted, failed): wake a sleeper that may go on now.
    pub(crate) fn room_freed(&self) {
        // The owner's count of held slices was a plain store: order it
        // before the look at the sleepers (see `wake`).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.wake();
    }

    fn unqueue(&self, n: u32) {
        let _ = self
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                debug_assert!(q >= n, "{n} admissions released with {q} queued");
                Some(q.saturating_sub(n))
            });
        self.wake();
    }

    /// The controller now.
    pub(crate) fn snapshot(&self) -> SqSnapshot {
        SqSnapshot {
            credits: self.credits.snapshot(),
            queued: self.queued.load(Ordering::Relaxed),
            queued_high_watermark: self.diag.queued_high.load(Ordering::Relaxed),
            admission_waits: self.diag.admission_waits.load(Ordering::Relaxed),
            admission_wait_us: self.diag.admission_wait_us.load(Ordering::Relaxed),
            admission_timeouts: self.diag.admission_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// Requests admitted toward one queue, not posted yet. Move-only: the
/// count goes back exactly once, at [`release`](Self::release) or on drop
/// (posted, cancelled, failed, moved elsewhere, shut down).
#[derive(Debug)]
#[must_use = "dropping an admission token releases it at once"]
pub struct AdmissionToken {
    sq: Option<Arc<SqController>>,
    n: u32,
}

impl AdmissionToken {
    /// Requests it admits (0 once released).
    pub(crate) fn count(&self) -> u32 {
        if self.sq.is_some() { self.n } else { 0 }
    }

    /// Give the admission back now; later calls (and the drop) do nothing.
    pub(crate) fn release(&mut self) {
        if let Some(sq) = self.sq.take() {
            sq.unqueue(self.n);
        }
    }

    /// Split up to `k` of its requests off into a token of their own (a
    /// call admitted at once hands each task its share); the two release
    /// separately.
    pub fn split(&mut self, k: u32) -> AdmissionToken {
        let k = k.min(self.count());
        self.n -= k;
        AdmissionToken {
            sq: (k > 0).then(|| self.sq.clone()).flatten(),
            n: k,
        }
    }

    /// The queue it admits toward.
    #[cfg(test)]
    pub(crate) fn queue(&self) -> Option<&Arc<SqController>> {
        self.sq.as_ref()
    }
}

/// An [`AdmissionToken`] parked where a worker and the application both
/// reach it (a batch task): it goes back exactly once, at whichever comes
/// first of the worker's [`release`](Self::release) (the task's last
/// slice is posted, or the task ends) and the slot's drop (the batch is
/// freed, the engine shut down). Lock-free: one pointer swap decides who
/// releases.
#[derive(Debug)]
pub struct AdmissionSlot {
    /// An `Arc::into_raw` of the token's queue, or null.
    sq: AtomicPtr<SqController>,
    n: AtomicU32,
}

impl Default for AdmissionSlot {
    fn default() -> AdmissionSlot {
        AdmissionSlot {
            sq: AtomicPtr::new(std::ptr::null_mut()),
            n: AtomicU32::new(0),
        }
    }
}

impl AdmissionSlot {
    /// Park `token` here (one already parked is released first). Called
    /// before the task is published to a worker: the ring's release makes
    /// both stores visible to it.
    pub(crate) fn put(&self, mut token: AdmissionToken) {
        self.release();
        let Some(sq) = token.sq.take() else {
            return;
        };
        self.n.store(token.n, Ordering::Relaxed);
        self.sq
            .store(Arc::into_raw(sq).cast_mut(), Ordering::Release);
    }

    /// Give the parked admission back, if any is still parked.
    #[inline]
    pub(crate) fn release(&self) {
        // Relaxed first: a task never admitted costs no locked swap.
        if self.sq.load(Ordering::Relaxed).is_null() {
            return;
        }
        let p = self.sq.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            return;
        }
        // SAFETY: `p` came from `Arc::into_raw` in `put`, and the swap made this call the only one to take it back.
        let sq = unsafe { Arc::from_raw(p) };
        sq.unqueue(self.n.load(Ordering::Relaxed));
    }

    /// Is an admission parked?
    #[cfg(test)]
    pub(crate) fn is_held(&self) -> bool {
        !self.sq.load(Ordering::Acquire).is_null()
    }
}

impl Drop for AdmissionSlot {
    fn drop(&mut self) {
        self.release();
    }
}

impl Drop for AdmissionToken {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn sq(depth: u32, watermark: u32) -> Arc<SqController> {
        Arc::new(SqController::new(
            depth,
            watermark,
            Duration::from_millis(50),
        ))
    }

    /// A thread waiting (up to 10 s) to admit `n` toward `c` with resume
    /// watermark `resume`: what it got (the count) and how long it took.
    fn admission_waiter(
        c: &Arc<SqController>,
        n: u32,
        resume: u32,
    ) -> thread::JoinHandle<(Result<u32, SqRefusal>, Duration)> {
        let c = c.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let out = c
                .wait_admission(n, resume, Duration::from_secs(10), Priority::High)
                .map(|t| t.count());
            (out, start.elapsed())
        })
    }

    #[test]
    fn reserve_release_wait_with_watermark_hysteresis() {
        let c = sq(8, 4);
        let r = c.try_reserve(6).unwrap();
        assert_eq!((r.n, c.posted(), c.available()), (6, 6, 2));
        // 3 > 2 free, and 2 < the watermark: refused, and paused.
        assert!(matches!(c.try_reserve(3), Err(SqRefusal::Full(s)) if s.credits.paused));
        // Paused: even what would fit is refused until 4 are free.
        assert!(matches!(c.try_reserve(1), Err(SqRefusal::Full(_))));
        c.release(1, 10);
        assert!(matches!(c.try_reserve(1), Err(SqRefusal::Full(_))));
        c.release(1, 20);
        assert_eq!(c.available(), 4);
        assert_eq!(c.try_reserve(3).unwrap().n, 3);
        // A waiter sleeps until a release makes room, well within its
        // timeout.
        let waiter = {
            let c = c.clone();
            thread::spawn(move || {
                let t = Instant::now();
                (c.wait_for_credits(4, Duration::from_secs(10)), t.elapsed())
            })
        };
        thread::sleep(Duration::from_millis(30));
        c.release(7, 30);
        let (got, took) = waiter.join().unwrap();
        assert_eq!(got.unwrap().n, 4);
        assert!(took < Duration::from_secs(5), "{took:?}");
        // With no release the wait ends at its timeout.
        let t = Instant::now();
        let out = c.wait_for_credits(8, Duration::from_millis(20));
        assert!(matches!(out, Err(SqRefusal::TimedOut(_))), "{out:?}");
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    /// While someone sleeps, a release rings the bell only when the least
    /// needy sleeper could go on, and once per round: the ring clears the
    /// request until a sleeper asks again (was: a futex wake per release).
    #[test]
    fn a_release_rings_once_per_round_and_only_with_room_for_a_sleeper() {
        let c = sq(8, 0);
        let r = c.try_reserve(8).unwrap();
        let bell = || c.bell.value();
        let before = bell();
        c.release(1, 1);
        assert_eq!(bell(), before, "nobody waits: no ring");
        // A sleeper asks for 3 (what `wait_until` does before its try).
        c.credits.add_waiter();
        c.want.fetch_min(3, Ordering::SeqCst);
        c.release(1, 2);
        assert_eq!(bell(), before, "2 free < 3 asked: no ring");
        c.release(1, 3);
        assert_eq!(bell(), before + 1, "3 free: ring");
        c.release(1, 4);
        assert_eq!(bell(), before + 1, "rung this round: no second ring");
        // The woken sleeper asks again (for 5; 4 are free).
        c.want.fetch_min(5, Ordering::SeqCst);
        c.release(1, 5);
        assert_eq!(bell(), before + 2);
        // A degrade rings whatever was asked.
        c.mark_terminal();
        assert_eq!(bell(), before + 3);
        c.credits.remove_waiter();
        c.release(r.n - 5, 6);
        assert_eq!(c.posted(), 0);
    }

    /// A sleeper wakes on the release that frees exactly what it needs,
    /// not a slice later: an admission waiter (its free slots count what
    /// is queued too) and a credit waiter (only what is posted), each
    /// alone, with a ten-second slice.
    #[test]
    fn a_sleeper_wakes_on_the_release_that_frees_exactly_its_need() {
        let spawn = |c: &Arc<SqController>, admit: bool, n: u32| {
            let c = c.clone();
            thread::spawn(move || {
                let t = Instant::now();
                let got = if admit {
                    c.wait_admission(n, 0, Duration::from_secs(60), Priority::High)
                        .map(|t| t.count())
                } else {
                    c.wait_for_credits(n, Duration::from_secs(60)).map(|r| r.n)
                };
                (got, t.elapsed())
            })
        };
        let asleep = |c: &SqController| {
            while c.credits.waiters() == 0 || c.want.load(Ordering::SeqCst) == NOBODY {
                thread::yield_now();
            }
            thread::sleep(Duration::from_millis(20));
        };
        // Admission: 8 posted; it needs 3 free.
        let c = Arc::new(SqController::new(8, 0, Duration::from_secs(10)));
        let r = c.try_reserve(8).unwrap();
        let h = spawn(&c, true, 3);
        asleep(&c);
        for i in 0..3 {
            c.release(1, i);
        }
        let (got, took) = h.join().unwrap();
        assert_eq!(got.unwrap(), 3);
        assert!(
            took < Duration::from_secs(5),
            "admission slept out its slice: {took:?}"
        );
        c.release(r.n - 3, 9);
        // Credits: 4 admitted (queued) and 8 posted, so no slot is free
        // for admission while credits come back; it needs 2 credits.
        let c = Arc::new(SqController::new(8, 0, Duration::from_secs(10)));
        let queued = c.try_admit(4).unwrap();
        let r = c.try_reserve(8).unwrap();
        let h = spawn(&c, false, 2);
        asleep(&c);
        c.release(1, 1);
        c.release(1, 2);
        let (got, took) = h.join().unwrap();
        assert_eq!(got.unwrap(), 2);
        assert!(
            took < Duration::from_secs(5),
            "the credit waiter slept out its slice: {took:?}"
        );
        drop(queued);
        c.release(r.n, 3);
    }

    /// Seed 001 in admission: a queue filled by bulk keeps its last eighth
    /// for HIGH, and a HIGH call does not queue behind bulk waiters for
    /// their resume watermark.
    #[test]
    fn the_last_eighth_of_the_depth_is_high_s_and_high_does_not_queue_behind_bulk() {
        let c = Arc::new(SqController::new(16, 0, Duration::from_secs(10)));
        assert_eq!((c.limit(Priority::Low), c.limit(Priority::High)), (14, 16));
        let bulk = c.try_admit_as(14, Priority::Low).unwrap();
        assert!(matches!(
            c.try_admit_as(1, Priority::Medium),
            Err(SqRefusal::Full(_))
        ));
        assert!(matches!(
            c.try_admit_as(15, Priority::Low),
            Err(SqRefusal::TooLarge {
                requested: 15,
                depth: 14
            })
        ));
        // A LOW waiter for a watermark of 4 free slots sleeps...
        let waiter = {
            let c = c.clone();
            thread::spawn(move || {
                c.wait_admission(1, 4, Duration::from_secs(60), Priority::Low)
                    .map(|t| t.count())
            })
        };
        while c.credits.waiters() == 0 {
            thread::yield_now();
        }
        // ...and a HIGH call takes the reserve at once, without a wait.
        let t = Instant::now();
        let high = c
            .wait_admission(2, 4, Duration::from_secs(30), Priority::High)
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(high.count(), 2);
        assert!(matches!(c.try_admit(1), Err(SqRefusal::Full(_))));
        drop(high);
        drop(bulk);
        c.room_freed();
        assert_eq!(waiter.join().unwrap().unwrap(), 1);
    }

    /// More than the depth is refused at once, also while others wait for
    /// a resume watermark (that path skips the quick try; it used to wait
    /// for room that could never be enough).
    #[test]
    fn more_than_the_depth_is_refused_at_once_even_behind_watermark_waiters() {
        let c = Arc::new(SqController::new(4, 0, Duration::from_secs(10)));
        let r = c.try_reserve(4).unwrap();
        let waiter = {
            let c = c.clone();
            thread::spawn(move || {
                c.wait_admission(1, 2, Duration::from_secs(60), Priority::High)
                    .map(|t| t.count())
            })
        };
        while c.credits.waiters() == 0 {
            thread::yield_now();
        }
        let t = Instant::now();
        let out = c.wait_admission(5, 2, Duration::from_secs(30), Priority::Low);
        assert!(
            matches!(
                out,
                Err(SqRefusal::TooLarge {
                    requested: 5,
                    depth: 4
                })
            ),
            "{out:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        c.release(r.n, 1);
        assert_eq!(waiter.join().unwrap().unwrap(), 1);
    }

    /// No sleeper waits out its slice for a wake-up it should have had:
    /// with a one-minute slice, admission and credit waiters with
    /// different needs all get through as completions free room one at a
    /// time.
    #[test]
    fn sleepers_with_different_needs_all_wake_without_waiting_out_a_slice() {
        let c = Arc::new(SqController::new(8, 0, Duration::from_secs(60)));
        let r = c.try_reserve(8).unwrap();
        let admitters: Vec<_> = [3u32, 1, 2]
            .into_iter()
            .map(|n| {
                let c = c.clone();
                thread::spawn(move || {
                    let t = Instant::now();
                    let got = c.wait_admission(n, 0, Duration::from_secs(120), Priority::High);
                    (got.map(|t| t.count()), t.elapsed())
                })
            })
            .collect();
        let reserver = {
            let c = c.clone();
            thread::spawn(move || {
                let t = Instant::now();
                let got = c.wait_for_credits(2, Duration::from_secs(120));
                (got.map(|r| r.n), t.elapsed())
            })
        };
        // Every waiter asleep (or about to be), then room one slot at a
        // time, so most releases free less than some sleeper needs.
        while c.credits.waiters() < 4 {
            thread::yield_now();
        }
        for i in 0..r.n {
            thread::sleep(Duration::from_millis(5));
            c.release(1, u64::from(i));
        }
        // Admissions keep their slots (queued) until dropped: 3 + 1 + 2
        // queued and 2 posted fit the 8 freed.
        let mut held = Vec::new();
        for h in admitters {
            let (got, took) = h.join().unwrap();
            held.push(got.unwrap());
            assert!(
                took < Duration::from_secs(30),
                "an admitter slept out its slice: {took:?}"
            );
        }
        let (got, took) = reserver.join().unwrap();
        assert_eq!(got.unwrap(), 2);
        assert!(
            took < Duration::from_secs(30),
            "the reserver slept out its slice: {took:?}"
        );
        held.sort_unstable();
        assert_eq!(held, [1, 2, 3]);
    }

    #[test]
    fn terminal_degrade_wakes_waiters_and_drained_orphans_do_not_restore_admission() {
        let c = sq(4, 0);
        let held = c.try_reserve(4).unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let c = c.clone();
                thread::spawn(move || {
                    let t = Instant::now();
                    let out = if i == 0 {
                        c.wait_for_credits(1, Duration::from_secs(30)).map(|_| ())
                    } else {
                        c.wait_admission(1, 0, Duration::from_secs(30), Priority::High)
                            .map(|_| ())
                    };
                    (out, t.elapsed())
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(30));
        c.mark_terminal();
        for w in waiters {
            let (out, took) = w.join().unwrap();
            assert_eq!(out, Err(SqRefusal::Degraded));
            assert!(took < Duration::from_secs(10), "{took:?}");
        }
        // The orphans drain: their credits come back, the queue stays out.
        c.release(held.n, 1);
        assert_eq!(c.posted(), 0);
        assert!(c.is_terminal());
        assert_eq!(c.try_reserve(1), Err(SqRefusal::Degraded));
        assert!(matches!(c.try_admit(1), Err(SqRefusal::Degraded)));
    }

    #[test]
    fn recheck_rolls_back_after_a_degrade() {
        let c = sq(4, 0);
        let r = c.try_reserve(2).unwrap();
        assert_eq!(c.recheck(r), Ok(r));
        c.release(2, 0);
        let r = c.try_reserve(3).unwrap();
        c.mark_terminal();
        assert_eq!(c.recheck(r), Err(SqRefusal::Degraded));
        assert_eq!(c.posted(), 0, "the rollback gave the credits back");
    }

    #[test]
    fn admission_counts_posted_and_queued_against_the_depth() {
        let c = sq(8, 0);
        let _posted = c.try_reserve(3).unwrap();
        let mut a = c.try_admit(4).unwrap();
        assert_eq!((c.queued(), a.count()), (4, 4));
        // 3 posted + 4 queued + 2 > 8.
        assert!(matches!(c.try_admit(2), Err(SqRefusal::Full(s)) if s.queued == 4));
        let b = c.try_admit(1).unwrap();
        assert!(matches!(
            c.try_admit(9),
            Err(SqRefusal::TooLarge {
                requested: 9,
                depth: 8
            })
        ));
        // A waiter gets in when a token goes back.
        let waiter = admission_waiter(&c, 3, 0);
        thread::sleep(Duration::from_millis(30));
        a.release();
        assert_eq!(waiter.join().unwrap().0, Ok(3));
        drop(b);
        let s = c.snapshot();
        assert_eq!(s.queued, 0, "{s:?}");
        assert_eq!(s.queued_high_watermark, 5);
        assert_eq!(s.admission_waits, 1);
        // A wait that times out is counted.
        let _fill = c.try_admit(5).unwrap();
        let out = c.wait_admission(1, 0, Duration::from_millis(5), Priority::High);
        assert!(matches!(out, Err(SqRefusal::TimedOut(_))), "{out:?}");
        assert_eq!(c.snapshot().admission_timeouts, 1);
    }

    #[test]
    fn a_refused_admission_resumes_only_at_the_watermark() {
        let c = sq(8, 0);
        let mut held: Vec<AdmissionToken> = (0..8).map(|_| c.try_admit(1).unwrap()).collect();
        let waiter = admission_waiter(&c, 1, 4);
        thread::sleep(Duration::from_millis(20));
        // One slot free: the charge fits, but the waiter holds off until 4 are.
        held.pop();
        thread::sleep(Duration::from_millis(30));
        assert!(!waiter.is_finished(), "woke below the watermark");
        assert_eq!((c.free(), c.queued()), (1, 7));
        held.truncate(4);
        assert_eq!(waiter.join().unwrap().0, Ok(1));
        assert_eq!(c.queued(), 4, "the waiter's token went back with it");
        // A watermark above the depth means an empty queue, not never.
        let full: Vec<AdmissionToken> = (0..4).map(|_| c.try_admit(1).unwrap()).collect();
        let waiter = admission_waiter(&c, 1, 1 << 20);
        thread::sleep(Duration::from_millis(20));
        drop((held, full));
        assert_eq!(waiter.join().unwrap().0, Ok(1));
    }

    #[test]
    fn a_degrade_ends_a_wait_for_the_watermark_at_once() {
        let c = sq(8, 0);
        let _held: Vec<AdmissionToken> = (0..8).map(|_| c.try_admit(1).unwrap()).collect();
        let waiter = admission_waiter(&c, 1, 4);
        thread::sleep(Duration::from_millis(20));
        c.mark_terminal();
        let (out, took) = waiter.join().unwrap();
        assert_eq!(out, Err(SqRefusal::Degraded));
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(c.snapshot().admission_timeouts, 0);
    }

    #[test]
    fn admission_is_refused_on_a_degraded_queue() {
        let c = sq(8, 0);
        c.mark_terminal();
        assert!(matches!(c.try_admit(1), Err(SqRefusal::Degraded)));
        assert!(matches!(
            c.wait_admission(1, 0, Duration::from_secs(5), Priority::High),
            Err(SqRefusal::Degraded)
        ));
    }

    #[test]
    fn an_admission_token_releases_exactly_once_however_it_moves() {
        let c = sq(8, 0);
        let mut t = c.try_admit(3).unwrap();
        let moved = std::mem::replace(&mut t, c.try_admit(2).unwrap());
        assert_eq!(c.queued(), 5);
        let mut held = vec![moved];
        t.release();
        t.release();
        assert_eq!((c.queued(), t.count()), (3, 0));
        drop(t);
        assert_eq!(c.queued(), 3);
        held.clear();
        assert_eq!(c.queued(), 0);
    }

    #[test]
    fn a_split_token_and_a_parked_one_release_exactly_once() {
        let c = sq(8, 0);
        let mut t = c.try_admit(6).unwrap();
        let a = t.split(2);
        let b = t.split(9);
        assert_eq!((t.count(), a.count(), b.count()), (0, 2, 4));
        assert_eq!(c.queued(), 6);
        drop(a);
        assert_eq!(c.queued(), 4);
        let slot = AdmissionSlot::default();
        slot.put(b);
        assert!(slot.is_held());
        assert_eq!(c.queued(), 4, "parked, not released");
        // From two threads at once: one of them gives the four back.
        std::thread::scope(|s| {
            s.spawn(|| slot.release());
            s.spawn(|| slot.release());
        });
        assert_eq!(c.queued(), 0);
        assert!(!slot.is_held());
        drop(slot);
        assert_eq!(c.queued(), 0, "the drop releases nothing twice");
        // A slot dropped with a token parked gives it back (a freed batch).
        let slot = AdmissionSlot::default();
        slot.put(c.try_admit(3).unwrap());
        // Parking over a parked token releases the old one.
        slot.put(c.try_admit(2).unwrap());
        assert_eq!(c.queued(), 2);
        drop(slot);
        assert_eq!(c.queued(), 0);
        drop(t);
        assert_eq!(Arc::strong_count(&c), 1, "no reference leaked");
    }
}
