//! The connector: a small pool of helper threads per RDMA transport that
//! runs the part of an endpoint's life that can wait (CQ and QP creation,
//! the `QpConnect` exchange over the control plane, up to its timeout, and
//! RTR/RTS), so the worker that posts never waits on a peer.
//!
//! - An endpoint owns a [`Link`]: its [`QueueSource`] (called only here,
//!   on a connector thread) and a mailbox for the latest connect's
//!   result. [`Link::start`] queues a job (the first post on a rail, or
//!   after a QP error: off the hot path, and the only allocation on it is
//!   the job's slot in the channel); [`Link::try_take`] is two atomic
//!   loads while the job runs, so a flush never blocks on it.
//! - **Peers side by side, each in order.** [`CONNECT_THREADS`] threads
//!   take jobs from one channel. The jobs of one peer
//!   ([`QueueSource::peer`]) run one at a time, in the order they were
//!   queued: a thread that finds the peer's connect in progress files the
//!   job behind it, and the thread running that peer runs it next. A peer
//!   whose control port stalls so holds one thread (up to the connect
//!   timeout per job) and delays no other peer while a thread is left.
//! - **The latest start wins.** Each [`Link::start`] takes a ticket; a
//!   job that is no longer its link's latest is skipped, and the result of
//!   one that ends anyway is destroyed rather than offered: an older
//!   connect never overtakes a newer one of the same link.
//! - Every job is answered exactly once: by its connect, or, when the
//!   connector stops first (or its threads are gone), with `Unreachable`
//!   by the job's own `Drop`, so no endpoint waits forever. A superseded
//!   job's answer is its link's newer job's.
//! - A job whose endpoint was dropped is skipped; one whose endpoint dies
//!   while it connects drops its queue with the mailbox, which destroys the
//!   QP: nothing leaks. A source that panics fails its own job
//!   (`Unreachable`) and leaves its thread serving.
//! - Dropping the [`Connector`] stops and joins its threads: jobs not yet
//!   started are answered `Unreachable`, and the connects in progress (at
//!   most one per thread, side by side) end first, so the wait is bounded
//!   by one connect timeout.
//!
//! Why [`CONNECT_THREADS`] is 4 and not a setting: a peer's connects are
//! serial anyway, so threads only buy isolation between peers. With 4, up
//! to 3 peers may stall at once while the others connect; an idle thread
//! is one parked stack. Within a peer the connects stay serial (its first
//! transfer over 8 workers × 8 rails is 64 round trips per QP of a
//! rail, as with one thread) because running them side by side would let one stalled peer
//! hold every thread.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use tent_rings::ErrorKind;

use crate::error::{Error, Result};
use crate::flow::SqController;
use crate::transport::rdma::sys::ffi;

/// A QP and the CQ it completes into, with whatever keeps them alive.
///
/// The queue is the QP's one poster: posting, polling and moving it to the
/// error state take `&mut Queue`, so the borrow checker, not a convention,
/// keeps a second thread (or a second path on the same one) off the QP's
/// send queue. `Send` (built on a connector thread, then moved to the
/// worker that posts), never `Sync`.
pub struct Queue {
    qp: *mut ffi::ibv_qp,
    cq: *mut ffi::ibv_cq,
    to_error: unsafe fn(*mut ffi::ibv_qp) -> i32,
    /// Owner of the verbs objects (dropped with the queue).
    _owner: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("qp", &self.qp)
            .field("cq", &self.cq)
            .finish_non_exhaustive()
    }
}

// SAFETY: `qp` and `cq` are owned by `_owner` (Send) and live as long as it; verbs objects may be used from any thread, and every use of them takes `&mut Queue` (or `&Queue` for the QP number, which never changes).
unsafe impl Send for Queue {}

impl Queue {
    /// A queue over the QP `qp` completing into `cq`, both kept alive by
    /// `owner`. `to_error` moves `qp` to the error state without waiting
    /// for its flushes ([`crate::transport::rdma::verbs::modify_to_error`]
    /// for a real QP): 0, or an errno.
    ///
    /// # Safety
    /// `qp` and `cq` are live verbs objects (their context's ops table
    /// filled) until `owner` is dropped; no other handle posts on `qp` or
    /// polls `cq`; `to_error` may be called on `qp` while it lives.
    pub unsafe fn new(
        qp: *mut ffi::ibv_qp,
        cq: *mut ffi::ibv_cq,
        to_error: unsafe fn(*mut ffi::ibv_qp) -> i32,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Queue {
        Queue {
            qp,
            cq,
            to_error,
            _owner: owner,
        }
    }

    /// The same queue, also keeping `extra` until it drops (tests count
    /// the queues alive).
    #[cfg(test)]
    pub(crate) fn also_owning(self, extra: impl std::any::Any + Send) -> Queue {
        Queue {
            _owner: Box::new((self._owner, extra)),
            ..self
        }
    }

    /// The QP number (what the async-event thread files it under).
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: `qp` is live while the queue is (`Queue::new`'s contract).
        unsafe { (*self.qp).qp_num }
    }

    /// `ibv_post_send` of the linked list at `wr`: 0, or an errno with
    /// `bad` at the first WR not posted.
    ///
    /// # Safety
    /// `wr` heads a list of valid WRs whose SGEs and memory are valid for
    /// the call, and every buffer they name stays registered and alive
    /// until its completion is reaped or the queue is dropped (which
    /// destroys the QP, after which the NIC touches none of it).
    #[inline]
    pub unsafe fn post_send(
        &mut self,
        wr: *mut ffi::ibv_send_wr,
        bad: &mut *mut ffi::ibv_send_wr,
    ) -> i32 {
        // SAFETY: `qp` is live and this `&mut` is its only poster; the caller vouches for the list.
        unsafe { super::sys::ops::post_send(self.qp, wr, bad) }
    }

    /// `ibv_poll_cq` into `wcs`: how many were written, or a negative
    /// provider error.
    #[inline]
    pub fn poll_cq(&mut self, wcs: &mut [ffi::ibv_wc]) -> i32 {
        let n = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: `cq` is live and this `&mut` is its only poller; the provider writes at most `n` entries of `wcs`.
        unsafe { super::sys::ops::poll_cq(self.cq, n, wcs.as_mut_ptr()) }
    }

    /// Move the QP to the error state (its posted work flushes): 0, or an
    /// errno.
    pub(crate) fn flush_to_error(&mut self) -> i32 {
        // SAFETY: `qp` is live (`Queue::new`'s contract, which also vouches for `to_error`).
        unsafe { (self.to_error)(self.qp) }
    }
}

/// Makes connected queues: the first, and a fresh one after an error.
/// Called on a connector thread, where it may wait (on the peer, up to its
/// own timeout), never for two jobs of the same peer at once.
pub trait QueueSource: Send {
    /// A connected QP ready to post on.
    fn connect(&mut self) -> Result<Queue>;

    /// `queue`, just connected, will post under `sq`: a source whose QPs
    /// report async events files it (so a QP-fatal event takes the
    /// endpoint out of service). Called on a connector thread.
    fn watch(&mut self, queue: &Queue, sq: &Arc<SqController>) {
        let _ = (queue, sq);
    }

    /// Who the queues lead to (log lines and their rate limit key). The
    /// connector runs one peer's connects one at a time, in order: sources
    /// that name no peer share one such line.
    fn peer(&self) -> &str {
        ""
    }
}

/// Threads in a connector's pool (why 4: see the module docs).
pub(crate) const CONNECT_THREADS: usize = 4;

enum Msg {
    Connect(Job),
    Stop,
}

/// What a connector's threads share.
struct Pool {
    /// Where jobs arrive. The idle thread holding the lock waits in `recv`,
    /// the other idle ones on the lock; senders never take it.
    rx: Mutex<Receiver<Msg>>,
    /// Peers with a connect in progress, each with its jobs that came
    /// meanwhile, oldest first. Taken while holding `rx` or alone, never
    /// the other way round.
    busy: Mutex<HashMap<Arc<str>, VecDeque<Job>>>,
    /// The connector is stopping: jobs not started are answered, not run.
    stopping: AtomicBool,
}

impl Pool {
    /// One thread's loop: the next job (with the jobs of its peer filed
    /// behind it meanwhile), until a `Stop`.
    fn serve(&self) {
        loop {
            let job = {
                let rx = self.rx.lock();
                match rx.recv() {
                    // Filed while `rx` is held: one peer's jobs are filed
                    // in the order they were sent.
                    Ok(Msg::Connect(job)) => self.claim(job),
                    Ok(Msg::Stop) | Err(_) => return,
                }
            };
            if let Some(job) = job {
                self.run_peer(job);
            }
        }
    }

    /// `job`, to run now if its peer has no connect in progress, or `None`
    /// once filed behind that connect.
    fn claim(&self, job: Job) -> Option<Job> {
        let mut busy = self.busy.lock();
        match busy.get_mut(&job.peer) {
            Some(waiting) => {
                waiting.push_back(job);
                None
            }
            None => {
                busy.insert(job.peer.clone(), VecDeque::new());
                Some(job)
            }
        }
    }

    /// Run `job`, then the jobs of its peer filed behind it, oldest first,
    /// until none is left (the peer is then free for any thread).
    fn run_peer(&self, job: Job) {
        let peer = job.peer.clone();
        let mut next = Some(job);
        while let Some(job) = next {
            self.run(job);
            let mut busy = self.busy.lock();
            next = busy.get_mut(&peer).and_then(VecDeque::pop_front);
            if next.is_none() {
                busy.remove(&peer);
            }
        }
    }

    /// Run one job; once stopping, drop it instead (which answers it). A
    /// source that panics answers its job with its `Drop` and leaves the
    /// thread (and its peer's line) serving.
    fn run(&self, mut job: Job) {
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        let peer = job.peer.clone();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || job.run()));
        if ran.is_err() {
            tracing::error!(peer = %peer, "rdma: a QP connect panicked; its endpoint sees Unreachable");
        }
    }
}

/// The connector's threads (see the module docs).
pub struct Connector {
    tx: Sender<Msg>,
    pool: Arc<Pool>,
    threads: Vec<JoinHandle<()>>,
}

/// Where endpoints send their connect jobs (cheap to clone; outliving the
/// [`Connector`] is fine: jobs sent then fail `Unreachable`).
#[derive(Clone)]
pub struct ConnectorHandle {
    tx: Sender<Msg>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ConnectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorHandle").finish_non_exhaustive()
    }
}

impl Connector {
    /// Start the connector's [`CONNECT_THREADS`] threads.
    pub fn start() -> Result<Connector> {
        Connector::with_threads(CONNECT_THREADS)
    }

    /// A connector with `n` threads (at least one).
    pub(crate) fn with_threads(n: usize) -> Result<Connector> {
        let (tx, rx) = channel();
        let mut c = Connector {
            tx,
            pool: Arc::new(Pool {
                rx: Mutex::new(rx),
                busy: Mutex::new(HashMap::new()),
                stopping: AtomicBool::new(false),
            }),
            threads: Vec::with_capacity(n.max(1)),
        };
        for i in 0..n.max(1) {
            let pool = c.pool.clone();
            let t = std::thread::Builder::new()
                .name(format!("tent-rdma-conn{i}"))
                .spawn(move || pool.serve())
                // Dropping `c` stops the threads already started.
                .map_err(|e| {
                    Error::new(ErrorKind::OutOfMemory, "spawn rdma connector").with_source(e)
                })?;
            c.threads.push(t);
        }
        Ok(c)
    }

    /// A handle for endpoints.
    pub fn handle(&self) -> ConnectorHandle {
        ConnectorHandle {
            tx: self.tx.clone(),
        }
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        // Jobs met from now on are dropped unrun (answering them); one
        // stop per thread, behind the jobs already queued. Jobs queued
        // behind the stops are answered by their `Drop` when the last
        // thread lets go of the receiver.
        self.pool.stopping.store(true, Ordering::Release);
        for _ in &self.threads {
            let _ = self.tx.send(Msg::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What an endpoint and the connector share.
struct Mailbox {
    /// Called only on a connector thread, one job at a time (its peer's).
    source: Mutex<Box<dyn QueueSource>>,
    /// The latest connect's result (`answered` names its ticket).
    result: Mutex<Option<Result<Queue>>>,
    /// The ticket of the job started last (tickets count from 1).
    latest: AtomicU64,
    /// The ticket whose result waits in `result`; 0: none. Written with
    /// `result`'s lock held.
    answered: AtomicU64,
}

/// An endpoint's side of the connector: its source and where the result
/// of its connect lands.
pub(crate) struct Link {
    mailbox: Arc<Mailbox>,
    /// The source's peer: its jobs run one at a time, in order.
    peer: Arc<str>,
    connector: ConnectorHandle,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer", &self.peer)
            .field("latest", &self.mailbox.latest.load(Ordering::Relaxed))
            .field("answered", &self.mailbox.answered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link for `source`, connected through `connector`.
    pub(crate) fn new(source: Box<dyn QueueSource>, connector: &ConnectorHandle) -> Link {
        let peer = Arc::from(source.peer());
        Link {
            mailbox: Arc::new(Mailbox {
                source: Mutex::new(source),
                result: Mutex::new(None),
                latest: AtomicU64::new(0),
                answered: AtomicU64::new(0),
            }),
            peer,
            connector: connector.clone(),
        }
    }

    /// Ask for a connected queue that will post under `sq`; the answer
    /// comes through [`Link::try_take`]. The caller has none pending (one
    /// job at a time); were one pending, only this newer one is answered.
    pub(crate) fn start(&self, sq: &Arc<SqController>) {
        let ticket = self.mailbox.latest.fetch_add(1, Ordering::AcqRel) + 1;
        let job = Job {
            mailbox: Arc::downgrade(&self.mailbox),
            peer: self.peer.clone(),
            ticket,
            sq: sq.clone(),
            answered: false,
        };
        // A connector that is gone hands the job back: dropping it answers
        // it (`Unreachable`).
        let _ = self.connector.tx.send(Msg::Connect(job));
    }

    /// The result of the job started last, if it is done; never waits.
    pub(crate) fn try_take(&self) -> Option<Result<Queue>> {
        let ticket = self.mailbox.answered.load(Ordering::Acquire);
        if ticket == 0 || ticket != self.mailbox.latest.load(Ordering::Relaxed) {
            return None;
        }
        // The connector holds the lock only while it files a result: a
        // miss leaves this one for the next call.
        let mut slot = self.mailbox.result.try_lock()?;
        let r = slot.take();
        self.mailbox.answered.store(0, Ordering::Relaxed);
        r
    }
}

/// One connect to run; answered exactly once (see the module docs).
struct Job {
    /// Gone once the endpoint is.
    mailbox: std::sync::Weak<Mailbox>,
    peer: Arc<str>,
    /// This start's place among its link's (see [`Mailbox::latest`]).
    ticket: u64,
    /// The controller the queue will post under.
    sq: Arc<SqController>,
    answered: bool,
}

impl Job {
    fn run(&mut self) {
        let Some(mailbox) = self.mailbox.upgrade() else {
            // Its endpoint is gone: nobody would post on the queue.
            self.answered = true;
            return;
        };
        if mailbox.latest.load(Ordering::Acquire) != self.ticket {
            // Its link started a newer connect, which answers instead.
            self.answered = true;
            return;
        }
        let r = {
            let mut source = mailbox.source.lock();
            let r = source.connect();
            if let Ok(q) = &r {
                source.watch(q, &self.sq);
            }
            r
        };
        if Arc::strong_count(&mailbox) == 1 {
            // The endpoint died meanwhile: the queue (and its QP) is
            // destroyed here rather than kept for nobody.
            tracing::debug!(peer = %self.peer, "rdma: endpoint gone while its QP connected; QP destroyed");
            self.answered = true;
            return;
        }
        self.answer(&mailbox, r);
    }

    /// File `r` as the link's answer, unless a newer start superseded this
    /// job: its queue is then destroyed here.
    fn answer(&mut self, mailbox: &Mailbox, r: Result<Queue>) {
        self.answered = true;
        let mut slot = mailbox.result.lock();
        let stale = if mailbox.latest.load(Ordering::Acquire) == self.ticket {
            let old = slot.replace(r);
            mailbox.answered.store(self.ticket, Ordering::Release);
            old
        } else {
            Some(r)
        };
        // Destroying a QP is a verbs command: not under the lock.
        drop(slot);
        drop(stale);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        if let Some(mailbox) = self.mailbox.upgrade() {
            self.answer(
                &mailbox,
                Err(Error::new(
                    ErrorKind::Unreachable,
                    "the RDMA connector stopped before this QP connected",
                )),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::mpsc::{Receiver, Sender};
    use std::time::{Duration, Instant};

    /// Longest wait for one step of a connector thread: reaching it means
    /// the step hangs (it takes microseconds when it does not).
    const LIMIT: Duration = Duration::from_secs(10);

    /// A QP and a CQ that only carry a QP number, and who to tell when
    /// they are destroyed.
    struct Objects {
        qp: Box<ffi::ibv_qp>,
        _cq: Box<ffi::ibv_cq>,
        dropped: Sender<u32>,
    }

    // SAFETY: plain boxed structs that only their queue points at; these tests never post on or poll them.
    unsafe impl Send for Objects {}

    impl Drop for Objects {
        fn drop(&mut self) {
            let _ = self.dropped.send(self.qp.qp_num);
        }
    }

    /// `to_error` for a QP nothing was posted on.
    unsafe fn no_flush(_: *mut ffi::ibv_qp) -> i32 {
        0
    }

    fn queue(qp_num: u32, dropped: Sender<u32>) -> Queue {
        let mut qp = Box::new(ffi::ibv_qp {
            qp_num,
            ..Default::default()
        });
        let mut cq = Box::new(ffi::ibv_cq::default());
        let (qpp, cqp): (*mut ffi::ibv_qp, *mut ffi::ibv_cq) = (&mut *qp, &mut *cq);
        let owner = Box::new(Objects {
            qp,
            _cq: cq,
            dropped,
        });
        // SAFETY: `qpp` and `cqp` point into boxes `owner` keeps (a box's heap address does not move with it); the tests only read the QP number, never post or poll.
        unsafe { Queue::new(qpp, cqp, no_flush, owner) }
    }

    /// Connects in progress now, and the most ever at once.
    #[derive(Default)]
    struct Gauge {
        now: AtomicU32,
        peak: AtomicU32,
    }

    /// A source whose connects report when they start and, when gated,
    /// each wait for one message on the gate (a closed gate fails them).
    /// Its QPs are numbered `base + 1`, `base + 2`, ...
    struct Stub {
        peer: &'static str,
        base: u32,
        connects: u32,
        gate: Option<Receiver<()>>,
        entered: Sender<(&'static str, u32)>,
        dropped: Sender<u32>,
        gauge: Arc<Gauge>,
    }

    impl QueueSource for Stub {
        fn connect(&mut self) -> Result<Queue> {
            self.connects += 1;
            let qp_num = self.base + self.connects;
            let n = self.gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.gauge.peak.fetch_max(n, Ordering::SeqCst);
            let _ = self.entered.send((self.peer, qp_num));
            let open = self.gate.as_ref().map_or(Ok(()), |g| g.recv());
            self.gauge.now.fetch_sub(1, Ordering::SeqCst);
            open.map_err(|_| Error::new(ErrorKind::Unreachable, "gate closed"))?;
            Ok(queue(qp_num, self.dropped.clone()))
        }

        fn peer(&self) -> &str {
            self.peer
        }
    }

    /// Where a test's stubs report.
    struct Rig {
        entered_tx: Sender<(&'static str, u32)>,
        entered: Receiver<(&'static str, u32)>,
        dropped_tx: Sender<u32>,
        dropped: Receiver<u32>,
        gauge: Arc<Gauge>,
    }

    impl Rig {
        fn new() -> Rig {
            let (entered_tx, entered) = std::sync::mpsc::channel();
            let (dropped_tx, dropped) = std::sync::mpsc::channel();
            Rig {
                entered_tx,
                entered,
                dropped_tx,
                dropped,
                gauge: Arc::default(),
            }
        }

        fn stub(&self, peer: &'static str, base: u32, gate: Option<Receiver<()>>) -> Stub {
            Stub {
                peer,
                base,
                connects: 0,
                gate,
                entered: self.entered_tx.clone(),
                dropped: self.dropped_tx.clone(),
                gauge: self.gauge.clone(),
            }
        }

        /// A link over a stub whose connects wait for the returned gate.
        fn gated(&self, peer: &'static str, base: u32, c: &Connector) -> (Link, Sender<()>) {
            let (open, gate) = std::sync::mpsc::channel();
            let link = Link::new(Box::new(self.stub(peer, base, Some(gate))), &c.handle());
            (link, open)
        }

        /// A link over a stub that connects at once.
        fn free(&self, peer: &'static str, base: u32, c: &Connector) -> Link {
            Link::new(Box::new(self.stub(peer, base, None)), &c.handle())
        }

        /// The next connect to start: (peer, QP number it makes).
        fn entered(&self) -> (&'static str, u32) {
            self.entered
                .recv_timeout(LIMIT)
                .expect("a connect started (none did: the connector hangs)")
        }

        /// The next queue destroyed: its QP number.
        fn dropped(&self) -> u32 {
            self.dropped
                .recv_timeout(LIMIT)
                .expect("a queue was destroyed")
        }
    }

    fn sq() -> Arc<SqController> {
        Arc::new(SqController::new(8, 0, Duration::from_secs(10)))
    }

    /// The answer to `link`'s latest start; fails the test if none comes
    /// within [`LIMIT`].
    fn answer(link: &Link) -> Result<Queue> {
        let start = Instant::now();
        loop {
            if let Some(r) = link.try_take() {
                return r;
            }
            assert!(start.elapsed() < LIMIT, "no answer for {link:?}: a connect hangs");
            std::thread::yield_now();
        }
    }

    fn qp_num(r: Result<Queue>) -> u32 {
        r.expect("connected").qp_num()
    }

    fn kind(r: Result<Queue>) -> ErrorKind {
        r.map(|q| q.qp_num()).expect_err("no queue").kind()
    }

    #[test]
    fn a_stalled_peer_delays_no_other_peer() {
        let c = Connector::start().unwrap();
        let rig = Rig::new();
        let (a, open_a) = rig.gated("a", 100, &c);
        let b = rig.free("b", 200, &c);
        let sq = sq();
        a.start(&sq);
        assert_eq!(rig.entered(), ("a", 101), "a's connect stalls");
        b.start(&sq);
        assert_eq!(qp_num(answer(&b)), 201, "b connected while a stalls");
        assert!(a.try_take().is_none(), "a still stalls");
        open_a.send(()).unwrap();
        assert_eq!(qp_num(answer(&a)), 101);
    }

    #[test]
    fn more_stalled_peers_than_threads_are_all_answered() {
        let c = Connector::with_threads(2).unwrap();
        let rig = Rig::new();
        let peers = ["a", "b", "c", "d", "e"];
        let (links, gates): (Vec<_>, Vec<_>) = (0..)
            .zip(peers)
            .map(|(i, p)| rig.gated(p, 100 * (i + 1), &c))
            .unzip();
        let sq = sq();
        for l in &links {
            l.start(&sq);
        }
        // Both threads hold a stalled peer; the other three wait for one.
        let mut seen = vec![rig.entered().0, rig.entered().0];
        assert_eq!(rig.gauge.now.load(Ordering::SeqCst), 2);
        for g in &gates {
            g.send(()).unwrap();
        }
        for (i, l) in (0..).zip(&links) {
            assert_eq!(qp_num(answer(l)), 100 * (i + 1) + 1, "peer {}", peers[i as usize]);
        }
        seen.extend((0..3).map(|_| rig.entered().0));
        seen.sort_unstable();
        assert_eq!(seen, peers, "each peer connected once");
        assert_eq!(rig.gauge.peak.load(Ordering::SeqCst), 2, "never more connects than threads");
    }

    #[test]
    fn dropping_the_connector_answers_every_job_and_joins_its_threads() {
        let c = Connector::with_threads(2).unwrap();
        let pool = c.pool.clone();
        let rig = Rig::new();
        // a1 runs; a2 (same peer) is filed behind it; b runs on the other
        // thread; d waits in the channel.
        let (a1, open_a1) = rig.gated("a", 100, &c);
        let (a2, _open_a2) = rig.gated("a", 200, &c);
        let (b, open_b) = rig.gated("b", 300, &c);
        let (d, _open_d) = rig.gated("d", 400, &c);
        let sq = sq();
        for l in [&a1, &a2, &b, &d] {
            l.start(&sq);
        }
        let mut running = [rig.entered(), rig.entered()];
        running.sort_unstable();
        assert_eq!(running, [("a", 101), ("b", 301)]);
        let (stopped_tx, stopped) = std::sync::mpsc::channel();
        let stopper = std::thread::spawn(move || {
            drop(c);
            stopped_tx.send(()).unwrap();
        });
        let start = Instant::now();
        while !pool.stopping.load(Ordering::Acquire) {
            assert!(start.elapsed() < LIMIT, "the drop began");
            std::thread::yield_now();
        }
        // The connects in progress end (here opened; a stalled one at its
        // timeout), and the drop returns: every thread joined.
        open_a1.send(()).unwrap();
        open_b.send(()).unwrap();
        stopped.recv_timeout(LIMIT).expect("the drop joined its threads");
        stopper.join().unwrap();
        assert_eq!(qp_num(answer(&a1)), 101);
        assert_eq!(qp_num(answer(&b)), 301);
        assert_eq!(kind(answer(&a2)), ErrorKind::Unreachable, "filed behind a1");
        assert_eq!(kind(answer(&d)), ErrorKind::Unreachable, "queued in the channel");
        assert!(rig.entered.try_recv().is_err(), "no job started after the drop");
        // With the threads gone, a new start is answered at once.
        drop(pool);
        a1.start(&sq);
        assert_eq!(kind(answer(&a1)), ErrorKind::Unreachable);
    }

    #[test]
    fn an_older_connect_of_a_link_never_overtakes_its_newer_start() {
        let c = Connector::with_threads(2).unwrap();
        let rig = Rig::new();
        let (l, open) = rig.gated("a", 100, &c);
        let sq = sq();
        l.start(&sq);
        assert_eq!(rig.entered(), ("a", 101));
        // Two more starts while the first connects: only the last counts.
        l.start(&sq);
        l.start(&sq);
        open.send(()).unwrap();
        assert_eq!(rig.dropped(), 101, "the first connect's queue destroyed, not offered");
        // The second start is skipped; the third connects.
        assert_eq!(rig.entered(), ("a", 102));
        assert!(l.try_take().is_none(), "nothing to take while the latest connects");
        open.send(()).unwrap();
        assert_eq!(qp_num(answer(&l)), 102);
        assert!(rig.entered.try_recv().is_err(), "two connects in all");
    }

    #[test]
    fn one_peers_jobs_run_one_at_a_time_in_the_order_started() {
        let c = Connector::start().unwrap();
        let rig = Rig::new();
        let (l1, open1) = rig.gated("a", 100, &c);
        let (l2, open2) = rig.gated("a", 200, &c);
        let sq = sq();
        l1.start(&sq);
        l2.start(&sq);
        assert_eq!(rig.entered(), ("a", 101), "the first started runs first");
        open1.send(()).unwrap();
        assert_eq!(qp_num(answer(&l1)), 101);
        assert_eq!(rig.entered(), ("a", 201));
        open2.send(()).unwrap();
        assert_eq!(qp_num(answer(&l2)), 201);
        assert_eq!(rig.gauge.peak.load(Ordering::SeqCst), 1, "never two at once");
    }

    #[test]
    fn a_connect_that_panics_fails_its_job_and_the_thread_serves_on() {
        struct Panics;
        impl QueueSource for Panics {
            fn connect(&mut self) -> Result<Queue> {
                panic!("a source bug");
            }
            fn peer(&self) -> &str {
                "p"
            }
        }
        let c = Connector::with_threads(1).unwrap();
        let rig = Rig::new();
        let p = Link::new(Box::new(Panics), &c.handle());
        let sq = sq();
        p.start(&sq);
        assert_eq!(kind(answer(&p)), ErrorKind::Unreachable);
        // The one thread, and the peer's line, still serve.
        p.start(&sq);
        assert_eq!(kind(answer(&p)), ErrorKind::Unreachable);
        let f = rig.free("f", 500, &c);
        f.start(&sq);
        assert_eq!(qp_num(answer(&f)), 501);
    }
}
