//! The target side of QP bootstrap: answer a peer's `QpConnect` with a QP
//! of our own on the NIC it names, connected to its end.
//!
//! One-sided READ and WRITE never complete on the target, so these QPs are
//! passive: nothing posts on them or polls their CQ. They are kept (at most
//! [`MAX_PASSIVE_QPS`], oldest dropped first: a peer whose QP goes away
//! gets an error and connects a fresh one) until the engine stops.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tent_rings::ErrorKind;

use super::NicSet;
use crate::control::wire::QpBootstrap;
use crate::error::{Error, Result};
use crate::verbs::{CompletionQueue, QpEndpoint, QueuePair};

/// Passive QPs kept at once.
pub const MAX_PASSIVE_QPS: usize = 4096;

/// Answers `QpConnect` requests.
pub struct Responder {
    nics: Arc<NicSet>,
    qps: Mutex<VecDeque<(QueuePair, Arc<CompletionQueue>)>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder over `nics`.
    pub fn new(nics: Arc<NicSet>) -> Responder {
        Responder {
            nics,
            qps: Mutex::new(VecDeque::new()),
        }
    }

    /// Connect a QP on `target_nic` to the peer's `theirs`; our end.
    pub fn accept(
        &self,
        initiator_nic: &str,
        target_nic: &str,
        theirs: &QpBootstrap,
    ) -> Result<QpBootstrap> {
        let Some(i) = self.nics.index_of(target_nic) else {
            let have: Vec<_> = self.nics.entries().into_iter().map(|n| n.name).collect();
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "no RDMA NIC named {target_nic:?} here (have: {})",
                    have.join(", ")
                ),
            ));
        };
        let nic = &self.nics.nics()[i];
        let cq = CompletionQueue::new(&nic.ctx, 16)?;
        let qp = QueuePair::new(&nic.pd, &cq, nic.port, Some(nic.gid_index), 16)?;
        qp.connect(&endpoint(theirs))?;
        let ours = bootstrap(&qp.endpoint()?);
        tracing::debug!(%initiator_nic, %target_nic, qpn = ours.qpn, "rdma: passive QP connected for a peer");
        let mut qps = self.qps.lock().expect("responder poisoned");
        if qps.len() >= MAX_PASSIVE_QPS {
            qps.pop_front();
        }
        qps.push_back((qp, cq));
        Ok(ours)
    }
}

/// Wire form → verbs form.
pub fn endpoint(b: &QpBootstrap) -> QpEndpoint {
    QpEndpoint {
        gid: b.gid,
        lid: b.lid,
        qpn: b.qpn,
        psn: b.psn,
        mtu: b.mtu,
    }
}

/// Verbs form → wire form.
pub fn bootstrap(e: &QpEndpoint) -> QpBootstrap {
    QpBootstrap {
        gid: e.gid,
        lid: e.lid,
        qpn: e.qpn,
        psn: e.psn,
        mtu: e.mtu,
    }
}
