//! Batches and rings: handing requests to workers (`ring`, `submit` and
//! its RDMA admission), task status, cancel and wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tent_rings::spsc;
use tent_rings::{Cqe, ErrorKind, Sqe, TransportKind};

use super::blocks::Runs;
use super::worker::{self, WorkerRing, WorkerShared};
use super::{BatchId, Embedded, Ring, TaskStatus};
use crate::error::{Error, Result};
use crate::flow::AdmissionToken;
use crate::segment::Segment;

impl Embedded {
    pub(crate) fn ring(&self) -> Result<Ring> {
        self.ring_with_depth(self.shared.config.ring_depth)
    }

    pub(crate) fn ring_with_depth(&self, depth: u32) -> Result<Ring> {
        let (sp, sc) =
            spsc::channel::<Sqe>(depth).map_err(|e| Error::invalid("ring depth").with_source(e))?;
        let (cp, cc) =
            spsc::channel::<Cqe>(depth).map_err(|e| Error::invalid("ring depth").with_source(e))?;
        let w = self.pick_worker();
        let bell = Arc::new(crate::doorbell::CqBell::default());
        w.adopt(WorkerRing::new(sc, Some(cp), Some(bell.clone())));
        Ok(Ring::new(sp, cc, w.clone(), bell, &self.shared))
    }

    pub(super) fn pick_worker(&self) -> &Arc<WorkerShared> {
        self.pick_worker_at().1
    }

    /// [`pick_worker`](Self::pick_worker), with its index.
    fn pick_worker_at(&self) -> (usize, &Arc<WorkerShared>) {
        self.workers.next()
    }

    pub(crate) fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        self.batches.allocate(capacity)
    }

    pub(crate) fn submit(&self, batch: BatchId, requests: &[Sqe]) -> Result<()> {
        let b = self.batches.get(batch)?;
        self.submit_to(&b, requests, Vec::new()).map(drop)
    }

    /// [`Engine::submit`] into `b`; returns the tasks it claimed.
    /// `lists[i]`, where there is one, is request `i`'s block list, handed
    /// to its batch task before the request is published.
    pub(super) fn submit_to(
        &self,
        b: &super::batch::Batch,
        requests: &[Sqe],
        lists: Vec<Option<Runs>>,
    ) -> Result<std::ops::Range<usize>> {
        let n = requests.len();
        // Refuse what can never go before waiting for room.
        b.check_claim(n)?;
        let (wi, w) = self.pick_worker_at();
        let gone = || {
            Error::new(
                ErrorKind::Shutdown,
                "the worker serving this batch has exited; nothing queued",
            )
        };
        if w.exited.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(gone());
        }
        // Admitted before the ring is touched (waiting here holds no
        // lock); what is not handed to a task below goes back on return.
        let mut admitted = self.admit(wi, requests, &lists)?;
        let mut sq = w.batch_sq.lock();
        if n > sq.capacity() {
            return Err(Error::invalid(format!(
                "submit of {n} requests exceeds the batch ring ({} entries): split it",
                sq.capacity()
            )));
        }
        let deadline = Instant::now() + self.shared.config.default_timeout_ms;
        // Room for every request first; nothing is published until there is.
        // We hold the ring's only producer, so room found here stays.
        while !sq.has_slots(n) {
            if w.exited.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(gone());
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::SqFull,
                    format!(
                        "batch ring had no room for {n} requests within the default timeout; nothing queued"
                    ),
                ));
            }
            w.doorbell().ring();
            std::thread::yield_now();
        }
        let range = b.claim(n)?;
        for (i, runs) in lists.into_iter().enumerate() {
            if let Some(runs) = runs {
                b.task(range.start + i).set_blocks(runs);
            }
        }
        for (i, r) in requests.iter().enumerate() {
            if let Some(t) = admitted.get_mut(i).and_then(Option::take) {
                b.task(range.start + i).admission().put(t);
            }
            let sqe = r.with_user_data(b.task_ptr(range.start + i) as u64);
            // Cannot fail: `has_slots(n)` above, and only we push.
            let pushed = sq.push(sqe);
            debug_assert!(pushed.is_ok());
        }
        sq.sync();
        if sq.needs_wakeup() {
            w.doorbell().ring();
        }
        Ok(range)
    }

    /// Seed 004's executor admission (`sq_executor_admission`): the
    /// requests of a `submit` bound for RDMA peers are charged to worker
    /// `w`'s endpoints to each peer (a request counts one work request per
    /// slice; a peer's charge is at most one endpoint's depth, or all of
    /// them under `capacity`), waiting up to `sq_admission_timeout_us` for
    /// room. Returns each request's share (empty: the gate is off).
    ///
    /// # Errors
    /// `SqFull` naming the endpoint and its counters when the wait ran
    /// out; nothing of the call is queued (shares taken so far go back).
    fn admit(
        &self,
        w: usize,
        requests: &[Sqe],
        lists: &[Option<Runs>],
    ) -> Result<Vec<Option<AdmissionToken>>> {
        let r = &self.shared.config.transports.rdma;
        if !r.sq_executor_admission || requests.is_empty() {
            return Ok(Vec::new());
        }
        let Some(rdma) = self.shared.transports.slot(TransportKind::Rdma).load_full() else {
            return Ok(Vec::new());
        };
        let slice = match rdma.caps.slice_bytes {
            0 => self.shared.config.block_size.max(1),
            n => n,
        };
        let timeout = r.sq_admission_timeout_us;
        let start = Instant::now();
        let segments = self.shared.segments.load();
        let mut out: Vec<Option<AdmissionToken>> = requests.iter().map(|_| None).collect();
        let mut seen = vec![false; requests.len()];
        for i in 0..requests.len() {
            if seen[i] {
                continue;
            }
            // A call names few peers: one charge per peer, its requests'
            // shares in order.
            let id = requests[i].remote().segment;
            let members: Vec<usize> = (i..requests.len())
                .filter(|&k| !seen[k] && requests[k].remote().segment == id)
                .collect();
            for &k in &members {
                seen[k] = true;
            }
            // A bad segment fails validation in the worker; a peer RDMA
            // does not serve first (or a request pinned elsewhere) is not
            // charged here.
            let Some(segment) = segments.get(id) else {
                continue;
            };
            let Some(peer) = crate::transport::rdma::transport::peer_of(segment) else {
                continue;
            };
            if !self.rdma_serves_first(segment) {
                continue;
            }
            let Some(gate) = peer.gate(w) else {
                continue;
            };
            let shares: Vec<(usize, u32)> = members
                .into_iter()
                .filter(|&k| {
                    requests[k]
                        .transport_hint()
                        .is_some_and(|h| matches!(h, TransportKind::Any | TransportKind::Rdma))
                })
                .map(|k| {
                    let wrs = match lists.get(k) {
                        Some(Some(runs)) => runs.slices(slice),
                        _ => requests[k].len().div_ceil(slice),
                    }
                    .max(1);
                    (k, u32::try_from(wrs).unwrap_or(u32::MAX))
                })
                .collect();
            let need = shares.iter().fold(0u32, |a, &(_, n)| a.saturating_add(n));
            // The charge goes at its most urgent request's priority (a
            // priority no request names is refused by the worker later;
            // here it counts as LOW).
            let priority = shares
                .iter()
                .filter_map(|&(k, _)| requests[k].priority())
                .min_by_key(|p| p.index())
                .unwrap_or(tent_rings::Priority::Low);
            // `sq_admission_chunk_wr` caps one charge (0: the gate's own
            // cap, one endpoint's depth).
            let need = match r.sq_admission_chunk_wr {
                0 => need,
                c => need.min(c),
            };
            let left = timeout.saturating_sub(start.elapsed());
            let tokens = gate
                .admit(r.sq_split_policy, need, left, priority)
                .map_err(|(ep, e)| self.admission_refused(peer, w, ep, need, e))?;
            // Each task takes its share from the charge, in order, from one
            // token (one slot per task: a share across two tokens keeps the
            // first part, the rest stays with the next token); a charge
            // capped below the need leaves the last tasks none.
            let mut tokens = tokens.into_iter();
            let mut cur = tokens.next();
            for (k, want) in shares {
                while cur.as_ref().is_some_and(|t| t.count() == 0) {
                    cur = tokens.next();
                }
                let Some(t) = cur.as_mut() else { break };
                out[k] = Some(t.split(want));
            }
        }
        Ok(out)
    }

    /// Is RDMA the first transport the worker would give a request to
    /// `segment` (the worker's `RANKED` order)?
    fn rdma_serves_first(&self, segment: &Segment) -> bool {
        worker::RANKED.iter().find(|&&kind| {
            self.shared
                .transports
                .slot(kind)
                .load_full()
                .is_some_and(|t| t.transport.reaches(segment))
        }) == Some(&TransportKind::Rdma)
    }

    /// The error a refused admission ends `submit` with: the endpoint and
    /// its counters, so the line tells a stall from a drain from a burst.
    #[cold]
    fn admission_refused(
        &self,
        peer: &crate::transport::rdma::RdmaPeer,
        w: usize,
        ep: usize,
        need: u32,
        e: crate::flow::SqRefusal,
    ) -> Error {
        let q = peer.qp_per_transfer();
        let (rail, qp) = (ep / q, ep % q);
        let report = peer
            .sq_report(w, ep)
            .map_or_else(String::new, |r| r.to_string());
        let why = match e {
            crate::flow::SqRefusal::Degraded => "every endpoint is out of service",
            _ => "no room within sq_admission_timeout_us",
        };
        crate::lograte::warn_limited!(
            (peer.name(), w, why),
            peer = peer.name(),
            worker = w,
            rail,
            qp,
            need,
            %report,
            "rdma: admission refused ({why}); submit failed SqFull with nothing queued"
        );
        Error::new(
            ErrorKind::SqFull,
            format!(
                "admission to {} refused ({why}): {need} work requests, endpoint worker {w} rail {rail} qp {qp} \
                 (qp_per_transfer={q}, workers={}): {report}; nothing queued",
                peer.name(),
                self.workers.len()
            ),
        )
    }

    pub(crate) fn status(&self, batch: BatchId, task: usize) -> Result<TaskStatus> {
        self.batches.get(batch)?.status(task)
    }

    pub(crate) fn status_list(&self, batch: BatchId) -> Result<Vec<TaskStatus>> {
        Ok(self.batches.get(batch)?.status_list())
    }

    pub(crate) fn batch_status(&self, batch: BatchId) -> Result<TaskStatus> {
        Ok(self.batches.get(batch)?.overall())
    }

    pub(crate) fn cancel(&self, batch: BatchId) -> Result<()> {
        self.batches.get(batch)?.cancel(None)
    }

    pub(crate) fn cancel_task(&self, batch: BatchId, task: usize) -> Result<()> {
        self.batches.get(batch)?.cancel(Some(task))
    }

    pub(crate) fn free_batch(&self, batch: BatchId) -> Result<()> {
        self.batches.free(batch)
    }

    pub(crate) fn wait_batch(&self, batch: BatchId, timeout: Duration) -> Result<TaskStatus> {
        let b = self.batches.get(batch)?;
        let start = Instant::now();
        let mut nap = Duration::from_micros(10);
        loop {
            if let Some(s) = b.settled() {
                return Ok(s);
            }
            let waited = start.elapsed();
            if waited > timeout {
                return Err(Error::new(ErrorKind::Timeout, "batch still pending"));
            }
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap.min(timeout - waited));
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }
}
