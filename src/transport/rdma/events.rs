//! `NicEvents`: the NICs' asynchronous events (`ibv_get_async_event`), read
//! by one thread per transport.
//!
//! A port that goes down says so here at once (`IBV_EVENT_PORT_ERR`), also
//! on an InfiniBand NIC that has no network device for the link watch to
//! follow; before this thread such a NIC learned of the failure only from
//! its completions. What each event does ([`apply`]):
//!
//! - `PORT_ERR`: the NIC's link is down (its rails take no new slices and
//!   their endpoints move what they hold to sibling rails), as the link
//!   watch would mark it; `PORT_ACTIVE`: up again (its rails are probed
//!   again by the selector); `DEVICE_FATAL`: down for good (nothing marks
//!   it up but a `PORT_ACTIVE`).
//! - QP errors (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`): the QP's
//!   `SqController` (found in the NICs' [`QpTable`]) is marked terminal at
//!   once, so its endpoint is taken out of service at its worker's next
//!   reserve or reap (seed 004's reserve path), before the flushed
//!   completions arrive; counted, logged once per cause. `CQ_ERR` names no
//!   QP: counted and logged; its QPs' requests fail through it.
//! - `GID_CHANGE` on the port in use: the NIC's GID is chosen again
//!   (`Nic::reselect_gid`), for the QPs made from then on.
//!
//! The thread sleeps in `poll(2)` on every NIC's (non-blocking) event
//! descriptor and an eventfd that stops it; it holds the NICs, so their
//! contexts outlive it. It never touches a worker's state: the link bit and
//! a controller's terminal bit are all it writes.
//!
//! [`QpTable`]: super::qp_table::QpTable

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::transport::rdma::nic::{Nic, NicSet};
use crate::transport::rdma::sys::ffi::ibv_event_type as E;
use crate::transport::rdma::verbs::AsyncEvent;
use rustix::event::{self, EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;
use tent_rings::ErrorKind;

/// Events seen, by what they did (for tests and metrics).
#[derive(Debug, Default)]
pub struct EventCounts {
    /// `PORT_ERR`.
    pub port_down: AtomicU64,
    /// `PORT_ACTIVE`.
    pub port_up: AtomicU64,
    /// `DEVICE_FATAL`.
    pub device_fatal: AtomicU64,
    /// QP and CQ errors.
    pub queue_errors: AtomicU64,
    /// QP error events whose QP was known: its controller marked terminal.
    pub qps_terminal: AtomicU64,
    /// `GID_CHANGE` on the port in use: the GID is chosen again.
    pub gid_changes: AtomicU64,
    /// Everything else (LID/PKey changes, COMM_EST, ...).
    pub other: AtomicU64,
}

/// Apply `ev`, an event of `nic`, and count it (see the module docs).
pub(crate) fn apply(nics: &NicSet, i: usize, ev: AsyncEvent, counts: &EventCounts) {
    let nic: &Nic = &nics.nics()[i];
    apply_to(
        nic.ctx.name(),
        nic.port,
        ev,
        counts,
        &mut |up, source| {
            nic.set_link(up, source);
        },
        &mut |qp_num| nics.qps().mark_terminal(i, qp_num),
        &mut || {
            if let Err(e) = nic.reselect_gid() {
                tracing::warn!(nic = nic.ctx.name(), error = %e, "rdma: GID table changed and no GID fits now; new QPs keep the old choice");
            }
        },
    );
}

/// [`apply`] for the NIC `name` used through `port`, whose link state
/// `set_link(up, source)` sets and whose QP `n` `qp_fatal(n)` takes out
/// of service (whether it knew the QP), and whose GID `gid_changed()`
/// chooses again.
fn apply_to(
    name: &str,
    port: u8,
    ev: AsyncEvent,
    counts: &EventCounts,
    set_link: &mut dyn FnMut(bool, &str),
    qp_fatal: &mut dyn FnMut(u32) -> bool,
    gid_changed: &mut dyn FnMut(),
) {
    match ev.kind {
        E::IBV_EVENT_GID_CHANGE if ev.port == port => {
            counts.gid_changes.fetch_add(1, Ordering::Relaxed);
            gid_changed();
        }
        E::IBV_EVENT_PORT_ERR if ev.port == port => {
            counts.port_down.fetch_add(1, Ordering::Relaxed);
            set_link(false, "port event");
        }
        E::IBV_EVENT_PORT_ACTIVE if ev.port == port => {
            counts.port_up.fetch_add(1, Ordering::Relaxed);
            set_link(true, "port event");
        }
        E::IBV_EVENT_DEVICE_FATAL => {
            counts.device_fatal.fetch_add(1, Ordering::Relaxed);
            tracing::error!(nic = name, "rdma: device fatal error; its rails are down");
            set_link(false, "device fatal");
        }
        E::IBV_EVENT_QP_FATAL | E::IBV_EVENT_QP_REQ_ERR | E::IBV_EVENT_QP_ACCESS_ERR => {
            counts.queue_errors.fetch_add(1, Ordering::Relaxed);
            let known = qp_fatal(ev.qp_num);
            counts
                .qps_terminal
                .fetch_add(u64::from(known), Ordering::Relaxed);
            crate::lograte::warn_limited!(
                (name, ev.kind.0),
                nic = name,
                event = ev.kind.0,
                qp_num = ev.qp_num,
                known,
                "rdma: QP error event; its endpoint is taken out of service"
            );
        }
        E::IBV_EVENT_CQ_ERR => {
            counts.queue_errors.fetch_add(1, Ordering::Relaxed);
            crate::lograte::warn_limited!(
                (name, ev.kind.0),
                nic = name,
                event = ev.kind.0,
                "rdma: CQ error event; its QPs' requests fail through it"
            );
        }
        _ => {
            counts.other.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                nic = name,
                event = ev.kind.0,
                port = ev.port,
                "rdma: async event"
            );
        }
    }
}

/// The thread reading the NICs' events; dropping it stops and joins it.
#[derive(Debug)]
pub struct NicEvents {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<EventCounts>,
}

impl NicEvents {
    /// Start reading the events of every NIC of `nics`.
    pub fn start(nics: Arc<NicSet>) -> Result<NicEvents> {
        let fds = nics
            .nics()
            .iter()
            .map(|n| n.ctx.async_fd())
            .collect::<Result<Vec<_>>>()?;
        let stop = event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| {
                Error::new(
                    ErrorKind::LocalNicFailed,
                    format!("eventfd: {}", std::io::Error::from(e)),
                )
            })?;
        let stop = Arc::new(stop);
        let counts = Arc::new(EventCounts::default());
        let (c, stop2) = (counts.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tent-rdma-events".into())
            .spawn(move || run(&nics, &fds, stop2.as_fd(), &c))
            .map_err(|e| {
                Error::new(
                    ErrorKind::LocalNicFailed,
                    format!("cannot start the RDMA event thread: {e}"),
                )
            })?;
        Ok(NicEvents {
            stop,
            thread: Some(thread),
            counts,
        })
    }

    /// What it has seen.
    pub fn counts(&self) -> &EventCounts {
        &self.counts
    }
}

impl Drop for NicEvents {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: poll every NIC's event fd and `stop`; drain what is ready.
fn run(nics: &NicSet, fds: &[RawFd], stop: BorrowedFd<'_>, counts: &EventCounts) {
    let nic_fds: Vec<BorrowedFd<'_>> = fds
        .iter()
        // Each is a NIC context's event descriptor, which the context owns
        // and keeps open for as long as it lives.
        // SAFETY: the contexts outlive this thread (the caller holds `nics` for all of it).
        .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
        .collect();
    // A NIC whose descriptor failed is no longer polled.
    let mut alive = vec![true; nic_fds.len()];
    let mut polled: Vec<usize> = Vec::with_capacity(nic_fds.len());
    let mut pfds: Vec<PollFd<'_>> = Vec::with_capacity(nic_fds.len() + 1);
    loop {
        polled.clear();
        polled.extend((0..nic_fds.len()).filter(|&i| alive[i]));
        pfds.clear();
        pfds.push(PollFd::from_borrowed_fd(stop, PollFlags::IN));
        pfds.extend(
            polled
                .iter()
                .map(|&i| PollFd::from_borrowed_fd(nic_fds[i], PollFlags::IN)),
        );
        match event::poll(&mut pfds, None) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(
                    error = %std::io::Error::from(e),
                    "rdma: polling the NICs' events failed; port events are no longer read"
                );
                return;
            }
        }
        if !pfds[0].revents().is_empty() {
            return;
        }
        for (p, &i) in pfds[1..].iter().zip(&polled) {
            let revents = p.revents();
            if revents.is_empty() {
                continue;
            }
            let nic = &nics.nics()[i];
            if revents.intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL) {
                // The device is gone: stop polling it.
                tracing::warn!(
                    nic = nic.ctx.name(),
                    "rdma: the NIC's event descriptor failed; its port events are no longer read"
                );
                alive[i] = false;
            }
            while let Some(ev) = nic.ctx.next_async_event() {
                apply(nics, i, ev, counts);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: E, port: u8) -> AsyncEvent {
        AsyncEvent {
            kind,
            port,
            qp_num: 7,
        }
    }

    #[test]
    fn port_events_set_the_link_and_qp_errors_take_their_queue_out_of_service() {
        use crate::{flow::SqController, transport::rdma::qp_table::QpTable};
        let table = QpTable::default();
        let sq = Arc::new(SqController::new(8, 0, std::time::Duration::from_millis(1)));
        table.watch(0, 7, &sq);
        let counts = EventCounts::default();
        let mut link = Vec::new();
        let mut reselected = 0;
        let mut run = |e: AsyncEvent| {
            apply_to(
                "mlx5_0",
                1,
                e,
                &counts,
                &mut |up, _| link.push(up),
                &mut |qp| table.mark_terminal(0, qp),
                &mut || reselected += 1,
            )
        };
        run(ev(E::IBV_EVENT_PORT_ERR, 1));
        // Another port of the device is not the one in use.
        run(ev(E::IBV_EVENT_PORT_ERR, 2));
        run(ev(E::IBV_EVENT_PORT_ACTIVE, 1));
        run(ev(E::IBV_EVENT_QP_FATAL, 0));
        run(ev(E::IBV_EVENT_CQ_ERR, 0));
        run(ev(E::IBV_EVENT_GID_CHANGE, 1));
        // Another port's table is not the one in use.
        run(ev(E::IBV_EVENT_GID_CHANGE, 2));
        run(ev(E::IBV_EVENT_DEVICE_FATAL, 0));
        assert_eq!(link, [false, true, false]);
        assert!(
            sq.is_terminal(),
            "QP 7's controller was taken out of service"
        );
        assert_eq!(counts.qps_terminal.load(Ordering::Relaxed), 1);
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(
            (
                c(&counts.port_down),
                c(&counts.port_up),
                c(&counts.queue_errors),
                c(&counts.device_fatal),
                c(&counts.other)
            ),
            (1, 1, 2, 1, 2)
        );
        assert_eq!(c(&counts.gid_changes), 1);
        assert_eq!(reselected, 1, "the GID is chosen again on the port's change only");
    }
}
