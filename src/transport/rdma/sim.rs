//! A simulated verbs provider: QPs whose `ibv_context` ops table is Rust
//! functions, so an [`Endpoint`](super::Endpoint) runs its real
//! `post_send` / `poll_cq` dispatch, ledger and [`SqController`] with no
//! kernel and no device. `tent-bench --mode sq` measures seed 004's flow
//! control against it (release build, any machine).
//!
//! The NIC model is a queue per QP, `depth` deep (`post_send` past it
//! answers `ENOMEM`, as a full send queue does), that finishes at most
//! `per_poll` requests, in order, at each `poll_cq` on its CQ: a slow QP is
//! one with a small `per_poll`. Completion semantics are the device's: a
//! signalled request yields a CQE; an unsignalled one finishes silently
//! (its CQE is the next signalled one's); a QP moved to the error state
//! flushes what it holds (`WR_FLUSH_ERR`, each request a CQE), and so does
//! anything posted to it afterwards. Every request succeeds otherwise:
//! fault injection is the endpoint tests' fake provider's job.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use parking_lot::Mutex;

use super::connector::{Queue, QueueSource};
use super::sys::ffi::{
    ibv_context, ibv_cq, ibv_qp, ibv_send_flags, ibv_send_wr, ibv_wc, ibv_wc_opcode, ibv_wc_status,
};
use crate::error::Result;

/// One simulated QP's NIC side.
#[derive(Debug, Default)]
struct Nic {
    /// Requests the NIC holds, in order: (wr_id, signalled).
    pending: VecDeque<(u64, bool)>,
    /// Completions not yet polled: (wr_id, status).
    cqes: VecDeque<(u64, ibv_wc_status)>,
    /// Moved to the error state.
    error: bool,
}

/// A QP, its CQ and their context in one allocation: the ops find the
/// whole from the `ibv_qp` / `ibv_cq` pointer they are handed.
#[repr(C)]
struct SimQueue {
    /// First: a `*mut ibv_qp` is a `*mut SimQueue`.
    qp: ibv_qp,
    cq: ibv_cq,
    ctx: ibv_context,
    depth: usize,
    per_poll: usize,
    nic: Mutex<Nic>,
    counts: Arc<SimCounts>,
}

impl SimQueue {
    /// The queue a QP pointer handed to the ops belongs to.
    ///
    /// # Safety
    /// `qp` must be the `qp` field of a live `SimQueue`.
    unsafe fn of_qp<'a>(qp: *mut ibv_qp) -> &'a SimQueue {
        // SAFETY: `qp` is the first field of a `#[repr(C)]` SimQueue (the caller's contract).
        unsafe { &*(qp as *const SimQueue) }
    }

    /// The queue a CQ pointer handed to the ops belongs to.
    ///
    /// # Safety
    /// `cq` must be the `cq` field of a live `SimQueue`.
    unsafe fn of_cq<'a>(cq: *mut ibv_cq) -> &'a SimQueue {
        let off = std::mem::offset_of!(SimQueue, cq);
        // SAFETY: `cq` lies `off` bytes into a live SimQueue (the caller's contract).
        unsafe { &*((cq as *const u8).sub(off) as *const SimQueue) }
    }

    fn nic(&self) -> parking_lot::MutexGuard<'_, Nic> {
        self.nic.lock()
    }
}

/// What the simulated NIC did, summed over a source's QPs.
#[derive(Debug, Default)]
pub struct SimCounts {
    /// Requests taken by `post_send`.
    pub posted: AtomicU64,
    /// `post_send` calls (doorbells).
    pub doorbells: AtomicU64,
    /// Requests refused because the send queue was full (`ENOMEM`).
    pub full: AtomicU64,
    /// Requests finished (successfully or flushed).
    pub finished: AtomicU64,
}

unsafe extern "C" fn sim_post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> i32 {
    // SAFETY: the endpoint posts on the QP `SimSource::connect` made.
    let q = unsafe { SimQueue::of_qp(qp) };
    let mut nic = q.nic();
    q.counts.doorbells.fetch_add(1, Ordering::Relaxed);
    while !wr.is_null() {
        // SAFETY: `wr` is an element of the caller's valid list.
        let (wr_id, flags, next) = unsafe { ((*wr).wr_id, (*wr).send_flags, (*wr).next) };
        if nic.error {
            nic.cqes
                .push_back((wr_id, ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
            q.counts.finished.fetch_add(1, Ordering::Relaxed);
        } else if nic.pending.len() >= q.depth {
            q.counts.full.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `bad` is the caller's out-parameter.
            unsafe { *bad = wr };
            return libc::ENOMEM;
        } else {
            let signalled = flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            nic.pending.push_back((wr_id, signalled));
        }
        q.counts.posted.fetch_add(1, Ordering::Relaxed);
        wr = next;
    }
    0
}

unsafe extern "C" fn sim_poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    // SAFETY: the endpoint polls the CQ `SimSource::connect` made.
    let q = unsafe { SimQueue::of_cq(cq) };
    let mut nic = q.nic();
    // The NIC's progress since the last poll.
    let mut done = 0;
    while done < q.per_poll {
        let Some((wr_id, signalled)) = nic.pending.pop_front() else {
            break;
        };
        if signalled {
            nic.cqes.push_back((wr_id, ibv_wc_status::IBV_WC_SUCCESS));
        }
        done += 1;
    }
    q.counts.finished.fetch_add(done as u64, Ordering::Relaxed);
    let mut k = 0;
    while k < n.max(0) as usize {
        let Some((wr_id, status)) = nic.cqes.pop_front() else {
            break;
        };
        // SAFETY: the caller's `wc` holds `n` entries.
        unsafe {
            *wc.add(k) = ibv_wc {
                wr_id,
                status,
                opcode: ibv_wc_opcode::IBV_WC_RDMA_WRITE,
                ..Default::default()
            }
        };
        k += 1;
    }
    k as i32
}

/// `to_error`: every request the NIC holds is flushed, in order.
///
/// # Safety
/// `qp` must be a live QP made by [`SimSource::connect`].
unsafe fn sim_to_error(qp: *mut ibv_qp) -> i32 {
    // SAFETY: the caller's contract.
    let q = unsafe { SimQueue::of_qp(qp) };
    let mut nic = q.nic();
    nic.error = true;
    let flushed = nic.pending.len() as u64;
    while let Some((wr_id, _)) = nic.pending.pop_front() {
        nic.cqes
            .push_back((wr_id, ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
    }
    q.counts.finished.fetch_add(flushed, Ordering::Relaxed);
    0
}

/// Connects simulated QPs for one endpoint: each `depth` deep, finishing
/// at most `per_poll` requests per poll of its CQ.
#[derive(Debug, Clone)]
pub struct SimSource {
    depth: usize,
    per_poll: usize,
    counts: Arc<SimCounts>,
}

impl SimSource {
    /// A source of QPs `depth` deep that finish `per_poll` requests per
    /// poll (at least 1 each).
    pub fn new(depth: u32, per_poll: u32) -> SimSource {
        SimSource {
            depth: depth.max(1) as usize,
            per_poll: per_poll.max(1) as usize,
            counts: Arc::default(),
        }
    }

    /// What its QPs' NIC did so far.
    pub fn counts(&self) -> &Arc<SimCounts> {
        &self.counts
    }
}

/// Owns a [`SimQueue`] through the raw pointer every op pointer was
/// derived from (never a `Box` or `&mut` to it while the endpoint holds
/// those pointers), freeing it when the endpoint drops its queue.
struct SimOwner(*mut SimQueue);

// SAFETY: the queue's state is behind its mutex; the endpoint hands the owner between threads, never shares it.
unsafe impl Send for SimOwner {}

impl Drop for SimOwner {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `Box::into_raw` in `connect` and is freed only here, once; the endpoint drops its QP and CQ pointers with the owner.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

impl QueueSource for SimSource {
    fn connect(&mut self) -> Result<Queue> {
        let raw = Box::into_raw(Box::new(SimQueue {
            qp: ibv_qp::default(),
            cq: ibv_cq::default(),
            ctx: ibv_context::default(),
            depth: self.depth,
            per_poll: self.per_poll,
            nic: Mutex::default(),
            counts: self.counts.clone(),
        }));
        // Every pointer below is a projection of `raw`, so each keeps the
        // whole allocation's provenance (the ops go from a field back to
        // the queue).
        // SAFETY: `raw` is a fresh, live, unaliased allocation.
        let (qp, cq) = unsafe {
            let ctx = &raw mut (*raw).ctx;
            (*ctx).ops.post_send = Some(sim_post_send);
            (*ctx).ops.poll_cq = Some(sim_poll_cq);
            (*raw).qp.context = ctx;
            (*raw).cq.context = ctx;
            (&raw mut (*raw).qp, &raw mut (*raw).cq)
        };
        // SAFETY: `qp` and `cq` point into `raw`, which `SimOwner` frees on drop; their context's ops are filled above; the queue is their only user; `sim_to_error` takes a live sim QP.
        Ok(unsafe { Queue::new(qp, cq, sim_to_error, Box::new(SimOwner(raw))) })
    }

    fn peer(&self) -> &str {
        "sim"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rdma::connector::Connector;
    use crate::transport::rdma::endpoint::{Endpoint, RdmaCompletion, RdmaSlice, SqSettings};
    use std::time::Duration;
    use tent_rings::Opcode;
    use tent_rings::Priority;

    fn slice(token: u64) -> RdmaSlice {
        RdmaSlice {
            token,
            opcode: Opcode::Write,
            local: 0x1000 + token,
            len: 64,
            lkey: 1,
            remote: 0x2000,
            rkey: 2,
            reposts: 0,
            ctx: 0,
            posted_ns: 0,
            ahead: 0,
            urgent: false,
        }
    }

    #[test]
    fn an_endpoint_runs_on_it_and_a_slow_queue_drains_at_its_rate() {
        let connector = Connector::start().unwrap();
        let src = SimSource::new(16, 2);
        let counts = src.counts().clone();
        let mut ep = Endpoint::new(Box::new(src), 16, 64, &connector.handle());
        for t in 0..40 {
            assert!(ep.submit(slice(t)));
        }
        let mut seen: Vec<RdmaCompletion> = Vec::new();
        let mut polls = 0;
        let start = std::time::Instant::now();
        while seen.len() < 40 {
            assert!(start.elapsed().as_secs() < 10, "stuck at {}", seen.len());
            let mut done = |c: RdmaCompletion| seen.push(c);
            ep.flush(&mut done);
            if ep.is_connected() {
                polls += 1;
            }
            ep.reap(&mut done);
            std::thread::yield_now();
        }
        assert!(seen.iter().all(|c| c.result.is_ok()), "{seen:?}");
        let mut tokens: Vec<u64> = seen.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..40).collect::<Vec<_>>(), "each once");
        assert_eq!(counts.posted.load(Ordering::Relaxed), 40);
        assert_eq!(counts.finished.load(Ordering::Relaxed), 40);
        // 2 per poll: at least 20 polls with a QP to finish 40.
        assert!(polls >= 20, "{polls}");
        assert!(
            counts.doorbells.load(Ordering::Relaxed) < 40,
            "lists, not one by one"
        );
    }

    /// Seed 001: a HIGH slice submitted behind a long queue of bulk
    /// slices goes out ahead of every bulk slice still waiting in the
    /// backlog (behind only what the queue already holds).
    #[test]
    fn a_high_slice_overtakes_the_bulk_waiting_in_the_backlog() {
        let connector = Connector::start().unwrap();
        // A QP of 4 finishing one request per poll: bulk queues up.
        let mut ep = Endpoint::new(Box::new(SimSource::new(4, 1)), 4, 64, &connector.handle());
        for t in 0..40 {
            assert!(ep.submit(slice(t)));
        }
        let mut seen: Vec<u64> = Vec::new();
        let start = std::time::Instant::now();
        // Let the queue start on the bulk work.
        while seen.len() < 2 {
            assert!(start.elapsed().as_secs() < 10);
            let mut done = |c: RdmaCompletion| seen.push(c.token);
            ep.flush(&mut done);
            ep.reap(&mut done);
            std::thread::yield_now();
        }
        let mut high = slice(1000);
        high.urgent = true;
        assert!(ep.submit(high));
        let mut second = slice(1001);
        second.urgent = true;
        assert!(ep.submit(second));
        while seen.len() < 42 {
            assert!(start.elapsed().as_secs() < 10, "stuck at {}", seen.len());
            let mut done = |c: RdmaCompletion| seen.push(c.token);
            ep.flush(&mut done);
            ep.reap(&mut done);
            std::thread::yield_now();
        }
        let at = |t: u64| seen.iter().position(|&x| x == t).unwrap();
        // At most the QP's depth of bulk was posted when HIGH arrived.
        assert!(at(1000) <= 2 + 4, "HIGH finished {}th: {seen:?}", at(1000));
        assert!(at(1000) < at(1001), "HIGH slices keep their order");
        let bulk: Vec<u64> = seen.iter().copied().filter(|&t| t < 1000).collect();
        assert_eq!(bulk, (0..40).collect::<Vec<_>>(), "bulk keeps its order");
    }

    #[test]
    fn slices_leaving_the_backlog_give_their_admission_slots_back() {
        let connector = Connector::start().unwrap();
        let mut ep = Endpoint::new(Box::new(SimSource::new(16, 2)), 16, 64, &connector.handle());
        let free = |ep: &Endpoint| ep.published_sq().load().free();
        for _ in 0..12 {
            assert!(ep.submit(slice(7)));
        }
        assert_eq!(free(&ep), 4, "waiting slices count at once");
        let mut ended = 0;
        ep.abort(7, tent_rings::ErrorKind::Canceled, &mut |_| ended += 1);
        assert_eq!((ended, ep.outstanding()), (12, 0));
        // Nothing outstanding: the transport stops polling it, so the
        // abort itself must say the slots are free again.
        assert_eq!(free(&ep), 16);
    }

    /// A submitter asleep for admission wakes when an abort empties the
    /// backlog (no completion rings for slices never posted), not a wait
    /// slice later: the QP's slice here is ten seconds.
    #[test]
    fn an_abort_that_empties_the_backlog_wakes_an_admission_sleeper() {
        let connector = Connector::start().unwrap();
        // A ten-second wait slice: a ring and a slice run out are told apart.
        let settings = SqSettings {
            wait_slice: Duration::from_secs(10),
            ..SqSettings::default()
        };
        let mut ep = Endpoint::with_settings(
            Box::new(SimSource::new(16, 2)),
            16,
            64,
            &connector.handle(),
            settings,
        );
        let sq = ep.published_sq().load_full();
        for _ in 0..16 {
            assert!(ep.submit(slice(7)));
        }
        assert_eq!(sq.free(), 0);
        let waiter = {
            let sq = sq.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                let got = sq.wait_admission(4, 0, Duration::from_secs(60), Priority::High);
                (got.map(|t| t.count()), t.elapsed())
            })
        };
        while sq.snapshot().credits.waiters == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        ep.abort(7, tent_rings::ErrorKind::Canceled, &mut |_| {});
        let (got, took) = waiter.join().unwrap();
        assert_eq!(got.unwrap(), 4);
        assert!(
            took < Duration::from_secs(5),
            "woken only by its slice: {took:?}"
        );
    }
}
