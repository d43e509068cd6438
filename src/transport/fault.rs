//! `FaultProxyTransport`: any transport, with faults injected.
//!
//! A decorator (seed 000's test design): the engine sees an ordinary
//! transport, so every failover path runs unmodified. Four policy-driven
//! faults, all drawn from a seeded generator per worker so that a run is
//! reproducible:
//!
//! - `submit_fail_rate`: a slice is refused at submit (`Rejected`), never
//!   reaching the wrapped transport;
//! - `status_corrupt_rate`: a slice that succeeded is reported failed;
//! - `fail_after_n_submits`: the first N slices go through, every later one
//!   is refused (a transport that enqueues some requests, then fails);
//! - `fail_install`: `install` fails, as a transport that cannot come up.
//!
//! [`FaultProxyTransport::poison_when`] adds a per-request predicate: the
//! slices it picks at submit have their completions flipped to failures.
//! A wrapped synchronous transport is made asynchronous (its results are
//! handed back through `poll`), so completion faults apply to it too.
//! [`Engine::swap_transport`](crate::Engine::swap_transport) is the
//! test-only hook that puts a proxy into a slot after construction. Its
//! per-worker state is a [`PerWorker`]: a proxy serves one engine, the one
//! that installs it or else whose worker first uses it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::{ErrorKind, TransportKind};

use super::{
    Capabilities, InstallContext, PerWorker, Slice, SliceCompletion, SubmitOutcome, Transport,
    WorkerCtx,
};
use crate::error::{Error, Result};
use crate::segment::Segment;

/// Workers a proxy keeps state for (the engine's maximum).
const MAX_WORKERS: usize = 256;

/// Which faults to inject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultPolicy {
    /// Probability that a slice is refused at submit.
    pub submit_fail_rate: f64,
    /// Probability that a successful slice is reported failed.
    pub status_corrupt_rate: f64,
    /// Let this many slices through, then refuse every one.
    pub fail_after_n_submits: Option<u64>,
    /// Make `install` fail.
    pub fail_install: bool,
    /// Seed of the per-worker generators.
    pub seed: u64,
    /// The error a refused submit reports.
    pub submit_error: ErrorKind,
    /// The error a corrupted completion reports.
    pub status_error: ErrorKind,
}

impl Default for FaultPolicy {
    fn default() -> Self {
        FaultPolicy {
            submit_fail_rate: 0.0,
            status_corrupt_rate: 0.0,
            fail_after_n_submits: None,
            fail_install: false,
            seed: 0x7e94_9bb6_b477_27cf,
            submit_error: ErrorKind::Unreachable,
            status_error: ErrorKind::Unreachable,
        }
    }
}

/// Picks slices whose completion is to be flipped to a failure.
pub type RequestPredicate = Arc<dyn Fn(&Slice<'_>) -> bool + Send + Sync>;

/// What the proxy has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Slices the engine handed to the proxy.
    pub submitted: u64,
    /// Slices passed on to the wrapped transport.
    pub forwarded: u64,
    /// Slices refused at submit by injection.
    pub rejected: u64,
    /// Successful completions reported as failures.
    pub corrupted: u64,
    /// Completions handed back to the engine.
    pub completed: u64,
}

struct ProxyWorker {
    rng: u64,
    /// Tokens whose completion is to be flipped (few: bounded by credits).
    poisoned: Vec<u64>,
    /// Results of a synchronous wrapped transport, handed back by `poll`.
    ready: VecDeque<SliceCompletion>,
}

/// A transport with faults injected; see the module docs.
pub struct FaultProxyTransport {
    inner: Arc<dyn Transport>,
    kind: TransportKind,
    policy: FaultPolicy,
    poison: Option<RequestPredicate>,
    workers: PerWorker<ProxyWorker>,
    submitted: AtomicU64,
    forwarded: AtomicU64,
    rejected: AtomicU64,
    corrupted: AtomicU64,
    completed: AtomicU64,
}

impl std::fmt::Debug for FaultProxyTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxyTransport")
            .field("kind", &self.kind)
            .field("policy", &self.policy)
            .field("counts", &self.counts())
            .finish()
    }
}

/// splitmix64: small, fast, and reproducible from its seed.
#[inline]
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline]
fn chance(state: &mut u64, p: f64) -> bool {
    p > 0.0 && ((next(state) >> 11) as f64 / (1u64 << 53) as f64) < p
}

impl FaultProxyTransport {
    /// `inner`, in its own slot, with `policy`'s faults.
    pub fn new(inner: Arc<dyn Transport>, policy: FaultPolicy) -> FaultProxyTransport {
        let workers = PerWorker::new(MAX_WORKERS, |w| ProxyWorker {
            rng: policy.seed ^ (w as u64).wrapping_mul(0xa076_1d64_78bd_642f),
            poisoned: Vec::new(),
            ready: VecDeque::new(),
        });
        FaultProxyTransport {
            kind: inner.kind(),
            inner,
            policy,
            poison: None,
            workers,
            submitted: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            corrupted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }

    /// Occupy `kind`'s slot instead of the wrapped transport's own (a
    /// memcpy transport standing in for RDMA, say).
    pub fn as_kind(mut self, kind: TransportKind) -> Self {
        self.kind = kind;
        self
    }

    /// Flip the completion of every slice `pred` picks at submit (the
    /// per-request variant of `status_corrupt_rate`).
    pub fn poison_when(mut self, pred: RequestPredicate) -> Self {
        self.poison = Some(pred);
        self
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &Arc<dyn Transport> {
        &self.inner
    }

    /// What it has done so far.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            submitted: self.submitted.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            corrupted: self.corrupted.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
        }
    }

    /// Apply completion faults to `c`.
    #[inline]
    fn finish(&self, ws: &mut ProxyWorker, mut c: SliceCompletion) -> SliceCompletion {
        if let Some(i) = ws.poisoned.iter().position(|&t| t == c.token) {
            ws.poisoned.swap_remove(i);
            if c.result.is_ok() {
                c.result = Err(self.policy.status_error);
                self.corrupted.fetch_add(1, Ordering::Relaxed);
            }
        }
        c
    }
}

impl Transport for FaultProxyTransport {
    fn kind(&self) -> TransportKind {
        self.kind
    }

    fn install(&self, ctx: &InstallContext) -> Result<()> {
        if self.policy.fail_install {
            return Err(Error::new(
                ErrorKind::LocalNicFailed,
                format!(
                    "{}: install failure injected by FaultProxyTransport",
                    self.kind
                ),
            ));
        }
        self.workers.bind(ctx.engine)?;
        self.inner.install(ctx)
    }

    fn capabilities(&self) -> Capabilities {
        let inner = self.inner.capabilities();
        Capabilities {
            // Refusals are per slice, so a list is never all-or-nothing.
            atomic_submit: false,
            synchronous: false,
            // Results of a synchronous inner wait in `ready`: nobody
            // rings the worker for them.
            wakes_worker: inner.wakes_worker && !inner.synchronous,
            parks_worker: inner.parks_worker && !inner.synchronous,
            ..inner
        }
    }

    fn live_rail_policy(&self) -> Option<Arc<super::rails::LiveRailPolicy>> {
        self.inner.live_rail_policy()
    }

    fn live_selector(&self) -> Option<Arc<super::rails::LiveSelector>> {
        self.inner.live_selector()
    }

    fn reaches(&self, segment: &Segment) -> bool {
        self.inner.reaches(segment)
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let mut ws = match self.workers.get(ctx) {
            Ok(ws) => ws,
            Err(e) => return out.fill(SubmitOutcome::Rejected(e)),
        };
        let ws = &mut *ws;
        for (s, o) in slices.iter().zip(out.iter_mut()) {
            let n = self.submitted.fetch_add(1, Ordering::Relaxed);
            let after = self.policy.fail_after_n_submits.is_some_and(|k| n >= k);
            if after || chance(&mut ws.rng, self.policy.submit_fail_rate) {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                *o = SubmitOutcome::Rejected(self.policy.submit_error);
                continue;
            }
            self.forwarded.fetch_add(1, Ordering::Relaxed);
            let poison = self.poison.as_ref().is_some_and(|p| p(s))
                || chance(&mut ws.rng, self.policy.status_corrupt_rate);
            let mut one = [SubmitOutcome::Rejected(ErrorKind::Unreachable)];
            self.inner.submit(ctx, std::slice::from_ref(s), &mut one);
            *o = match one[0] {
                SubmitOutcome::Posted => {
                    if poison {
                        ws.poisoned.push(s.token);
                    }
                    SubmitOutcome::Posted
                }
                SubmitOutcome::Completed(result) => {
                    let mut c = SliceCompletion {
                        token: s.token,
                        result,
                    };
                    if poison && c.result.is_ok() {
                        c.result = Err(self.policy.status_error);
                        self.corrupted.fetch_add(1, Ordering::Relaxed);
                    }
                    ws.ready.push_back(c);
                    SubmitOutcome::Posted
                }
                not_started @ (SubmitOutcome::Rejected(_) | SubmitOutcome::Later) => not_started,
            };
        }
    }

    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        // Refused at submit too: nothing of this worker's is in flight here.
        let Ok(mut ws) = self.workers.get(ctx) else {
            return 0;
        };
        let ws = &mut *ws;
        let mut n = 0;
        while n < out.len() {
            let Some(c) = ws.ready.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        let m = self.inner.poll(ctx, &mut out[n..]);
        for c in &mut out[n..n + m] {
            *c = self.finish(ws, *c);
        }
        let total = n + m;
        self.completed.fetch_add(total as u64, Ordering::Relaxed);
        total
    }

    fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        // A slice that comes back after the abort keeps its own result
        // (`kind`, or what it finished with first): no poison flips it.
        // Results already in `ready` are complete: nothing to stop.
        if let Ok(mut ws) = self.workers.get(ctx) {
            ws.poisoned.retain(|&t| t != token);
        }
        self.inner.abort(ctx, token, kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_reproducible_and_rates_hold() {
        let draw = |seed: u64| {
            let mut s = seed;
            (0..10_000).filter(|_| chance(&mut s, 0.3)).count()
        };
        assert_eq!(draw(7), draw(7));
        let hits = draw(7);
        assert!((2_700..3_300).contains(&hits), "{hits}");
        let mut s = 1;
        assert!((0..1000).all(|_| !chance(&mut s, 0.0)));
        assert!((0..1000).all(|_| chance(&mut s, 1.0)));
    }
}
