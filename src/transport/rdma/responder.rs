//! The target side of QP bootstrap: answer a peer's `QpConnect` with a QP
//! of our own on the NIC it names, connected to its end.
//!
//! One-sided READ and WRITE never complete on the target, so these QPs are
//! passive: nothing posts on them or polls their CQ. They are filed in a
//! [`PassiveTable`] under the initiator's key (engine, worker, rail, QP of
//! the rail under `qp_per_transfer`), at
//! most [`MAX_PASSIVE_QPS`], until the engine stops:
//!
//! - **Reconnect replaces.** A request under a key already filed destroys
//!   the QP filed there: that endpoint has dropped its old QP (it
//!   reconnects after an error, or its engine reopened the segment).
//! - **A full table never evicts a live QP.** It drops the dead ones and
//!   probes the others (see the [`table`] module): a sweep, at most once
//!   per [`SWEEP_EVERY`] (a query may be a firmware command), drops the
//!   QPs the device moved to ERROR or RESET (read with `ibv_query_qp`) and
//!   those whose liveness probe failed; when that frees no slot it posts a
//!   probe, a signalled zero-length RDMA WRITE, on each QP due for one (at
//!   most one per QP per [`PROBE_EVERY`], none within [`PROBE_EVERY`] of
//!   its filing). With none dead the newcomer is refused with `SqFull`,
//!   the control plane's "busy" (logged once per interval): that QP
//!   bootstrap fails, and the initiator may ask again.
//! - **A vanished initiator's QP is reclaimed.** Its passive QP stays RTS
//!   (nothing else is ever sent on it) and its engine, restarted, has a new
//!   id, so only a probe finds it: no QP answers, the device sends it
//!   again [`FINITE_RETRY_CNT`] times
//!   [`ACK_TIMEOUT`](crate::transport::rdma::verbs::ACK_TIMEOUT) apart (≈ 470 ms; up
//!   to ≈ 1.9 s on a NIC waiting the most the IB spec allows), fails it and
//!   moves the QP to ERROR. Passive QPs connect with that finite count
//!   because rxe reads 7 as "retry without end". A newcomer knocking on a
//!   full table is let in at the first sweep after the failure: within
//!   [`PROBE_EVERY`] + the retry time + [`SWEEP_EVERY`] of its first
//!   refusal, ≈ 6.5 s (≈ 8 s on such a NIC), once the dead QP is older
//!   than [`PROBE_EVERY`]. A live initiator's NIC acknowledges a probe and
//!   completes nothing on its side; a probe sent while its path is down
//!   longer than the retry time costs that initiator a reconnect.
//!
//! What a peer can do with this: with `rpc_shared_secret` set, only
//! engines holding the secret reach this code, and the key is what such an
//! engine says it is. Without a secret anyone reaching the control port
//! can: fill the free slots with live QPs under made-up keys, after which
//! newcomers are refused `SqFull` (QPs already filed keep working); and
//! replace the QP filed under a key it knows, which breaks that
//! initiator's rail until it reconnects (and replaces it back). Engine ids
//! are random 64-bit values, sent in clear in `QpConnect`, so it needs to
//! see the victim's control traffic. Both are small next to what such a
//! peer can do anyway: without a secret, any peer may READ and WRITE every
//! registered region.
//!
//! Known limits: a probe proves only that some QP answers at the
//! initiator's address and QP number, so a QP number reused meanwhile on
//! that NIC may keep a dead initiator's slot. Two attachments of one engine
//! to this target at once (a segment closed and reopened while the old one
//! still has transfers in flight, or opened under two addresses) share
//! keys, and the later connection replaces the earlier one's QPs.

mod table;

use std::sync::Arc;

use parking_lot::Mutex;
use tent_rings::ErrorKind;

use super::NicSet;
use super::gid::{self, GidType};
use crate::clock::monotonic_ns;
use crate::control::wire::{QpBootstrap, QpInitiator, QpRequest};
use crate::error::{Error, Result};
use crate::transport::rdma::sys::ffi::{ibv_qp_state, ibv_wc, ibv_wc_status};
use crate::transport::rdma::verbs::{CompletionQueue, FINITE_RETRY_CNT, QpEndpoint, QueuePair};
use table::{Passive, PassiveTable, TableFull};
pub use table::{PROBE_EVERY, ProbeCounts, SWEEP_EVERY};

/// Passive QPs kept at once. Each holds a QP and a small CQ on the NIC:
/// 8192 serve 64 initiator engines of 8 workers × 8 rails at two QPs each
/// (`qp_per_transfer`'s default on RoCE; more per rail serve fewer),
/// stay well inside a NIC's QP limit (rxe's is 64 k), and bound what peers
/// can make this engine allocate.
pub(crate) const MAX_PASSIVE_QPS: usize = 8192;

/// A connected passive QP and its CQ (the QP is dropped first). Its send
/// queue carries only liveness probes, one at a time, so its CQ (16
/// entries) never overflows.
struct PassiveQp {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
}

/// The work request id of a liveness probe.
const PROBE_WR_ID: u64 = 0x0070_726f_6265;

impl Passive for PassiveQp {
    fn is_live(&self) -> bool {
        // A QP that cannot even be queried is no use to its initiator.
        self.qp.state().is_ok_and(|s| {
            [
                ibv_qp_state::IBV_QPS_INIT,
                ibv_qp_state::IBV_QPS_RTR,
                ibv_qp_state::IBV_QPS_RTS,
                ibv_qp_state::IBV_QPS_SQD,
            ]
            .contains(&s)
        })
    }

    fn probe(&self) -> bool {
        match self.qp.post_zero_write(PROBE_WR_ID) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "rdma: a liveness probe of a passive QP could not be posted");
                false
            }
        }
    }

    fn probe_done(&self) -> Option<bool> {
        let mut wc = [ibv_wc::default(); 4];
        let n = match self.cq.poll(&mut wc) {
            Ok(n) => n,
            Err(e) => {
                // `is_live` judges a QP whose CQ cannot be read.
                tracing::debug!(error = %e, "rdma: a passive QP's probe CQ could not be polled");
                return None;
            }
        };
        let failed = wc[..n]
            .iter()
            .find(|w| w.status != ibv_wc_status::IBV_WC_SUCCESS);
        if let Some(w) = failed {
            tracing::debug!(status = ?w.status, "rdma: a passive QP's liveness probe failed: its initiator is gone");
        }
        (n > 0).then_some(failed.is_none())
    }
}

/// Answers `QpConnect` requests.
pub struct Responder {
    nics: Arc<NicSet>,
    qps: Mutex<PassiveTable<PassiveQp>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder over `nics`, keeping at most [`MAX_PASSIVE_QPS`].
    pub(crate) fn new(nics: Arc<NicSet>) -> Responder {
        Responder::with_capacity(nics, MAX_PASSIVE_QPS)
    }

    /// A responder over `nics` keeping at most `cap` passive QPs.
    pub fn with_capacity(nics: Arc<NicSet>, cap: usize) -> Responder {
        Responder {
            nics,
            qps: Mutex::new(PassiveTable::new(cap)),
        }
    }

    /// Passive QPs held now.
    pub fn passive_qps(&self) -> usize {
        self.qps.lock().len()
    }

    /// Liveness probes of passive QPs so far.
    pub fn probe_counts(&self) -> ProbeCounts {
        self.qps.lock().probe_counts()
    }

    /// Connect a QP on the request's target NIC to the initiator's end,
    /// filed under its key (replacing the QP filed there); our end.
    ///
    /// # Errors
    /// `InvalidArgument`: no such NIC here. `SqFull`: the table holds only
    /// other keys' live QPs. A verbs failure creating or connecting the QP.
    pub fn accept(&self, req: &QpRequest) -> Result<QpBootstrap> {
        let QpRequest {
            initiator: key,
            initiator_nic,
            target_nic,
            qp: theirs,
            gid_type,
        } = req;
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
        let addr = nic.addressing();
        let theirs_type = gid_type.and_then(GidType::from_code);
        if !gid::reachable(addr.gid.ty, &addr.gid.gid, theirs_type, &theirs.gid) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "GID type mismatch: {initiator_nic} addresses its QP with a {} GID of another kind of address or version than {target_nic} here ({})",
                    theirs_type.map_or("?".to_owned(), |t| t.to_string()),
                    addr.gid.ty.map_or("?".to_owned(), |t| t.to_string()),
                ),
            ));
        }
        let (ours, replaced) = make_and_file(&self.qps, key, initiator_nic, || {
            let cq = CompletionQueue::new(&nic.ctx, 16)?;
            let qp = QueuePair::new(&nic.pd, &cq, addr, 16)?;
            qp.connect_with_retries(&endpoint(theirs), FINITE_RETRY_CNT)?;
            let ours = bootstrap(&qp.endpoint()?);
            Ok((PassiveQp { qp, cq }, ours))
        })?;
        tracing::debug!(%initiator_nic, %target_nic, qpn = ours.qpn, engine = key.engine(), worker = key.worker(), rail = key.rail(), queue = key.queue(), replaced, "rdma: passive QP connected for a peer");
        Ok(ours)
    }
}

/// `table` with room for `key` (dead QPs dropped to make it), or `SqFull`
/// when every slot holds a live QP of another key.
fn make_room<'t, Q: Passive>(
    table: &'t Mutex<PassiveTable<Q>>,
    key: &QpInitiator,
    initiator_nic: &str,
) -> Result<parking_lot::MutexGuard<'t, PassiveTable<Q>>> {
    let mut table = table.lock();
    match table.room(key, monotonic_ns()) {
        Ok(0) => Ok(table),
        Ok(dead) => {
            tracing::debug!(dead, "rdma: dropped dead passive QPs to make room");
            Ok(table)
        }
        Err(TableFull { probing }) => {
            let cap = table.cap;
            crate::lograte::warn_limited!("responder-full", cap, probing, %initiator_nic, "rdma: every passive QP slot holds a live QP; new QP bootstraps are refused (SqFull)");
            Err(Error::new(
                ErrorKind::SqFull,
                format!(
                    "busy: all {cap} passive QP slots hold live QPs of other initiators ({probing} being probed for liveness); retry later"
                ),
            ))
        }
    }
}

/// Make a passive QP for `key` with `make` and file it in `table`: what
/// `make` returns beside the QP, and whether a QP filed under `key` was
/// replaced (and destroyed).
///
/// Room first, so a full table refuses before any verbs call; the lock is
/// not held across `make` (QP creation and RTR/RTS: many initiators
/// connecting at once are served side by side), so the room is looked for
/// again at filing, and a ticket makes sure an older request for the same
/// key (a retry overtook it) files nothing: it fails `Canceled`.
fn make_and_file<Q: Passive, B>(
    table: &Mutex<PassiveTable<Q>>,
    key: &QpInitiator,
    initiator_nic: &str,
    make: impl FnOnce() -> Result<(Q, B)>,
) -> Result<(B, bool)> {
    let ticket = make_room(table, key, initiator_nic)?.begin(*key);
    let (passive, made) = match make() {
        Ok(m) => m,
        Err(e) => {
            table.lock().abandon(key, ticket);
            return Err(e);
        }
    };
    let mut filing = match make_room(table, key, initiator_nic) {
        Ok(t) => t,
        Err(e) => {
            table.lock().abandon(key, ticket);
            return Err(e);
        }
    };
    let filed = filing.finish(*key, ticket, passive, monotonic_ns());
    // Destroying a QP is a firmware command: not under the lock.
    drop(filing);
    let replaced = filed.map_err(|_| {
        Error::new(
            ErrorKind::Canceled,
            "a newer request for the same endpoint replaced this one, or the passive QP table filled",
        )
    })?;
    Ok((made, replaced.is_some()))
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

#[cfg(test)]
mod tests {
    use super::table::fake::{Fake, Fakes, id_at, key};
    use super::*;

    #[test]
    fn a_passive_qp_is_made_outside_the_table_lock_and_a_retry_meanwhile_files_its_own() {
        let f = Fakes::default();
        let table = Mutex::new(PassiveTable::new(2));
        let k = key(7, 0, 0);
        let first = make_and_file(&table, &k, "nic0", || {
            assert!(
                table.try_lock().is_some(),
                "the table is not locked while a QP is made"
            );
            // The initiator's retry for the same key is served meanwhile.
            let retry = make_and_file(&table, &k, "nic0", || Ok((f.qp(2).0, "retry")));
            assert_eq!(retry.map(|r| r.0).ok(), Some("retry"));
            Ok((f.qp(1).0, "first"))
        });
        // The older request ends last: it files nothing, its QP destroyed.
        assert_eq!(
            first.map(|r| r.0).unwrap_err().kind(),
            ErrorKind::Canceled
        );
        assert_eq!(id_at(&table.lock(), &k), Some(2));
        assert_eq!(f.dropped(), [1]);
        // A request whose QP could not be made leaves nothing pending.
        let failed = make_and_file(&table, &key(7, 0, 1), "nic0", || {
            Err::<(Fake, ()), _>(Error::new(ErrorKind::Unreachable, "no QP"))
        });
        assert_eq!(failed.unwrap_err().kind(), ErrorKind::Unreachable);
        assert!(table.lock().pending.is_empty());
        // A full table refuses before anything is made.
        assert!(make_and_file(&table, &key(7, 0, 1), "nic0", || Ok((f.qp(3).0, ()))).is_ok());
        let full = make_and_file(&table, &key(9, 0, 0), "nic0", || -> Result<(Fake, ())> {
            panic!("made a QP for a full table")
        });
        let e = full.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SqFull);
        assert!(e.to_string().contains("0 being probed"), "{e}");
        // Replacing a key's QP says so.
        let again = make_and_file(&table, &k, "nic0", || Ok((f.qp(4).0, ())));
        assert!(again.unwrap().1, "the retry's QP was replaced");
        assert_eq!(f.dropped(), [1, 2]);
    }
}
