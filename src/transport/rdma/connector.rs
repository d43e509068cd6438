//! The connector: one helper thread per RDMA transport that runs the part
//! of an endpoint's life that can wait (CQ and QP creation, the
//! `QpConnect` exchange over the control plane, up to its timeout, and
//! RTR/RTS), so the worker that posts never waits on a peer.
//!
//! - An endpoint owns a [`Link`]: its [`QueueSource`] (called only here,
//!   on the connector thread) and a mailbox for the latest connect's
//!   result. [`Link::start`] queues a job (the first post on a rail, or
//!   after a QP error: off the hot path, and the only allocation on it is
//!   the job's slot in the channel); [`Link::try_take`] is one atomic load
//!   while the job runs, so a flush never blocks on it.
//! - Every job is answered exactly once: by its connect, or, when the
//!   connector stops first (or its thread is gone), with `Unreachable` by
//!   the job's own `Drop`, so no endpoint waits forever.
//! - A job whose endpoint was dropped is skipped; one whose endpoint dies
//!   while it connects drops its queue with the mailbox, which destroys the
//!   QP: nothing leaks.
//! - Dropping the [`Connector`] stops and joins its thread (waiting at most
//!   for the connect in progress, bounded by the connect timeout).
//!
//! Jobs run one at a time, in order: a peer that stalls delays the next
//! connects (never a worker) by up to the connect timeout each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::Arc;
use parking_lot::Mutex;
use std::thread::JoinHandle;

use tent_rings::ErrorKind;

use crate::error::{Error, Result};
use crate::flow::SqController;
use crate::transport::rdma::sys::ffi;

/// A QP and the CQ it completes into, with whatever keeps them alive.
///
/// The queue is the QP's one poster: posting, polling and moving it to the
/// error state take `&mut Queue`, so the borrow checker, not a convention,
/// keeps a second thread (or a second path on the same one) off the QP's
/// send queue. `Send` (built on the connector's thread, then moved to the
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
/// Called on the connector's thread, where it may wait (on the peer, up
/// to its own timeout).
pub trait QueueSource: Send {
    /// A connected QP ready to post on.
    fn connect(&mut self) -> Result<Queue>;

    /// `queue`, just connected, will post under `sq`: a source whose QPs
    /// report async events files it (so a QP-fatal event takes the
    /// endpoint out of service). Called on the connector thread.
    fn watch(&mut self, queue: &Queue, sq: &Arc<SqController>) {
        let _ = (queue, sq);
    }

    /// Who the queues lead to (log lines and their rate limit key).
    fn peer(&self) -> &str {
        ""
    }
}

enum Msg {
    Connect(Job),
    Stop,
}

/// The connector thread (see the module docs).
pub struct Connector {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

/// Where endpoints send their connect jobs (cheap to clone; outliving the
/// [`Connector`] is fine: jobs sent then fail `Unreachable`).
#[derive(Clone)]
pub struct ConnectorHandle {
    tx: Sender<Msg>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ConnectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorHandle").finish_non_exhaustive()
    }
}

impl Connector {
    /// Start the connector thread.
    pub fn start() -> Result<Connector> {
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("tent-rdma-connect".into())
            .spawn(move || run(rx))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "spawn rdma connector").with_source(e)
            })?;
        Ok(Connector {
            tx,
            thread: Some(thread),
        })
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
        // Jobs queued behind the stop are answered by their Drop when the
        // thread's receiver goes away.
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(rx: Receiver<Msg>) {
    while let Ok(Msg::Connect(mut job)) = rx.recv() {
        job.run();
    }
}

/// What an endpoint and the connector share.
struct Mailbox {
    /// Called only on the connector thread, one job at a time.
    source: Mutex<Box<dyn QueueSource>>,
    /// The latest connect's result (set before `done`).
    result: Mutex<Option<Result<Queue>>>,
    /// A result waits in `result`.
    done: AtomicBool,
}

/// An endpoint's side of the connector: its source and where the result
/// of its connect lands.
pub(crate) struct Link {
    mailbox: Arc<Mailbox>,
    connector: ConnectorHandle,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("done", &self.mailbox.done.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link for `source`, connected through `connector`.
    pub(crate) fn new(source: Box<dyn QueueSource>, connector: &ConnectorHandle) -> Link {
        Link {
            mailbox: Arc::new(Mailbox {
                source: Mutex::new(source),
                result: Mutex::new(None),
                done: AtomicBool::new(false),
            }),
            connector: connector.clone(),
        }
    }

    /// Ask for a connected queue that will post under `sq`; the answer
    /// comes through [`Link::try_take`]. The caller has none pending (one
    /// job at a time).
    pub(crate) fn start(&self, sq: &Arc<SqController>) {
        let job = Job {
            mailbox: self.mailbox.clone(),
            sq: sq.clone(),
            answered: false,
        };
        // A connector that is gone hands the job back: dropping it answers
        // it (`Unreachable`).
        let _ = self.connector.tx.send(Msg::Connect(job));
    }

    /// The result of the job started last, if it is done; never waits.
    pub(crate) fn try_take(&self) -> Option<Result<Queue>> {
        if !self.mailbox.done.load(Ordering::Acquire) {
            return None;
        }
        // The connector released the lock before raising `done` and does
        // not take it again until the next job: this never contends.
        let mut slot = self.mailbox.result.try_lock()?;
        let r = slot.take();
        self.mailbox.done.store(false, Ordering::Relaxed);
        r
    }
}

/// One connect to run; answered exactly once (see the module docs).
struct Job {
    mailbox: Arc<Mailbox>,
    /// The controller the queue will post under.
    sq: Arc<SqController>,
    answered: bool,
}

impl Job {
    fn run(&mut self) {
        if Arc::strong_count(&self.mailbox) == 1 {
            // Its endpoint is gone: nobody would post on the queue.
            self.answered = true;
            return;
        }
        let r = {
            let mut source = self
                .mailbox
                .source
                .lock();
            let r = source.connect();
            if let Ok(q) = &r {
                source.watch(q, &self.sq);
            }
            r
        };
        if Arc::strong_count(&self.mailbox) == 1 {
            // The endpoint died meanwhile: the queue (and its QP) is
            // destroyed here rather than kept for nobody.
            tracing::debug!("rdma: endpoint gone while its QP connected; QP destroyed");
            self.answered = true;
            return;
        }
        self.answer(r);
    }

    fn answer(&mut self, r: Result<Queue>) {
        *self
            .mailbox
            .result
            .lock() = Some(r);
        self.mailbox.done.store(true, Ordering::Release);
        self.answered = true;
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.answered {
            self.answer(Err(Error::new(
                ErrorKind::Unreachable,
                "the RDMA connector stopped before this QP connected",
            )));
        }
    }
}
