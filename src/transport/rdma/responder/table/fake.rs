//! A passive QP whose device state and initiator the test sets, recording
//! its probes and its drop.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::{Passive, PassiveTable, PROBE_EVERY, SWEEP_EVERY};
use crate::control::wire::QpInitiator;

/// What is at the other end of a fake passive QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// A live initiator QP: a probe is acknowledged.
    Live,
    /// No QP any more: a probe fails (retries exhausted).
    Gone,
    /// A probe gets no answer yet (the device is still retrying).
    Silent,
    /// Posting a probe fails.
    Unpostable,
}

/// A passive QP whose liveness and peer the test sets.
#[derive(Debug)]
pub(crate) struct Fake {
    pub(crate) id: u32,
    live: Rc<Cell<bool>>,
    peer: Rc<Cell<Peer>>,
    probes: Rc<Cell<u32>>,
    in_flight: Cell<bool>,
    dropped: Rc<RefCell<Vec<u32>>>,
}

impl Passive for Fake {
    fn is_live(&self) -> bool {
        self.live.get()
    }

    fn probe(&self) -> bool {
        assert!(!self.in_flight.get(), "fake {}: a second probe in flight", self.id);
        if self.peer.get() == Peer::Unpostable {
            return false;
        }
        self.in_flight.set(true);
        self.probes.set(self.probes.get() + 1);
        true
    }

    fn probe_done(&self) -> Option<bool> {
        if !self.in_flight.get() {
            return None;
        }
        let acked = match self.peer.get() {
            Peer::Live => true,
            Peer::Gone => {
                // The device moves a QP whose request failed to ERROR.
                self.live.set(false);
                false
            }
            Peer::Silent | Peer::Unpostable => return None,
        };
        self.in_flight.set(false);
        Some(acked)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.dropped.borrow_mut().push(self.id);
    }
}

/// The test's handles on one fake.
#[derive(Debug, Clone)]
pub(crate) struct Ctl {
    /// The device's view (false: ERROR).
    pub(crate) live: Rc<Cell<bool>>,
    /// What answers its probes.
    pub(crate) peer: Rc<Cell<Peer>>,
    /// Probes posted on it.
    pub(crate) probes: Rc<Cell<u32>>,
}

/// Makes fakes sharing one drop log.
#[derive(Default)]
pub(crate) struct Fakes {
    dropped: Rc<RefCell<Vec<u32>>>,
}

impl Fakes {
    /// A live QP of a live initiator, and the switch that kills it.
    pub(crate) fn qp(&self, id: u32) -> (Fake, Rc<Cell<bool>>) {
        let (q, ctl) = self.probed(id);
        (q, ctl.live)
    }

    /// A live QP of a live initiator, and all its handles.
    pub(crate) fn probed(&self, id: u32) -> (Fake, Ctl) {
        let ctl = Ctl {
            live: Rc::new(Cell::new(true)),
            peer: Rc::new(Cell::new(Peer::Live)),
            probes: Rc::new(Cell::new(0)),
        };
        let q = Fake {
            id,
            live: ctl.live.clone(),
            peer: ctl.peer.clone(),
            probes: ctl.probes.clone(),
            in_flight: Cell::new(false),
            dropped: self.dropped.clone(),
        };
        (q, ctl)
    }

    /// The ids dropped so far, sorted.
    pub(crate) fn dropped(&self) -> Vec<u32> {
        let mut d = self.dropped.borrow().clone();
        d.sort_unstable();
        d
    }
}

pub(crate) fn key(engine: u64, worker: usize, rail: usize) -> QpInitiator {
    QpInitiator::new(engine, worker, rail).unwrap()
}

/// A simulated instant well past 0.
pub(crate) const T0: u64 = 1_000_000_000;
pub(crate) const SWEEP: u64 = SWEEP_EVERY.as_nanos() as u64;
pub(crate) const PROBE: u64 = PROBE_EVERY.as_nanos() as u64;

pub(crate) fn id_at(t: &PassiveTable<Fake>, k: &QpInitiator) -> Option<u32> {
    t.get(k).map(|q| q.id)
}

/// `room` then `insert` at `now`, as the responder does.
pub(crate) fn admit(t: &mut PassiveTable<Fake>, k: QpInitiator, q: Fake, now: u64) -> bool {
    if t.room(&k, now).is_err() {
        return false;
    }
    match t.insert(k, q, now) {
        Ok(old) => {
            drop(old);
            true
        }
        Err(_) => panic!("room was made, yet insert refused"),
    }
}
