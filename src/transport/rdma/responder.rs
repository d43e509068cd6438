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
//! - **A full table never evicts a live QP.** It drops the dead ones (a
//!   QP the device moved to ERROR, or RESET, read with `ibv_query_qp`;
//!   swept at most once per [`SWEEP_EVERY`], since a query may be a
//!   firmware command), and with none dead the newcomer is refused with
//!   `SqFull`, the control plane's "busy" (logged once per interval).
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
//! Known limits: a passive QP whose initiator vanished (engine restarted,
//! host gone) stays in RTS, since nothing is ever sent on it, so it is
//! neither dead nor replaced (the new engine has a new id): it holds its
//! slot until this engine stops. Two attachments of one engine to this
//! target at once (a segment closed and reopened while the old one still
//! has transfers in flight, or opened under two addresses) share keys, and
//! the later connection replaces the earlier one's QPs.

use std::collections::HashMap;
use std::sync::Arc;
use parking_lot::Mutex;
use std::time::Duration;

use tent_rings::ErrorKind;

use super::NicSet;
use super::gid::{self, GidType};
use crate::clock::monotonic_ns;
use crate::control::wire::{QpBootstrap, QpInitiator, QpRequest};
use crate::error::{Error, Result};
use crate::transport::rdma::sys::ffi::ibv_qp_state;
use crate::transport::rdma::verbs::{CompletionQueue, QpEndpoint, QueuePair};

/// Passive QPs kept at once. Each holds a QP and a small CQ on the NIC:
/// 8192 serve 64 initiator engines of 8 workers × 8 rails at two QPs each
/// (`qp_per_transfer`'s default on RoCE; more per rail serve fewer),
/// stay well inside a NIC's QP limit (rxe's is 64 k), and bound what peers
/// can make this engine allocate.
pub(crate) const MAX_PASSIVE_QPS: usize = 8192;

/// Least time between two sweeps of a full table for dead QPs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A passive QP as the table sees it.
pub(crate) trait Passive {
    /// Can it still carry its initiator's operations? `false` for a QP the
    /// device moved to an error state (it never recovers from there).
    fn is_live(&self) -> bool;
}

/// The table is full of live QPs (the newcomer is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableFull;

/// Passive QPs filed under their initiator's key (see the module doc).
#[derive(Debug)]
pub(crate) struct PassiveTable<Q> {
    cap: usize,
    qps: HashMap<QpInitiator, Q>,
    /// No sweep before this instant (monotonic ns).
    next_sweep_ns: u64,
    /// The latest request being connected for each key, by ticket: QPs
    /// are made outside the lock, and only the latest request for a key
    /// files its QP (an older one finishing last must not replace it).
    pending: HashMap<QpInitiator, u64>,
    next_ticket: u64,
}

impl<Q: Passive> PassiveTable<Q> {
    /// An empty table holding at most `cap` QPs.
    pub(crate) fn new(cap: usize) -> PassiveTable<Q> {
        PassiveTable {
            cap,
            qps: HashMap::new(),
            next_sweep_ns: 0,
            pending: HashMap::new(),
            next_ticket: 0,
        }
    }

    /// A request for `key` starts: its ticket, now `key`'s latest.
    pub(crate) fn begin(&mut self, key: QpInitiator) -> u64 {
        self.next_ticket += 1;
        self.pending.insert(key, self.next_ticket);
        self.next_ticket
    }

    /// The request with `ticket` ended without a QP to file.
    pub(crate) fn abandon(&mut self, key: &QpInitiator, ticket: u64) {
        if self.pending.get(key) == Some(&ticket) {
            self.pending.remove(key);
        }
    }

    /// File `q` under `key` for the request with `ticket`, if it is still
    /// `key`'s latest; the QP it replaces comes back (to be destroyed).
    /// `Err(q)` when a newer request for `key` began meanwhile (it files
    /// its own) or the table is full.
    pub(crate) fn finish(
        &mut self,
        key: QpInitiator,
        ticket: u64,
        q: Q,
    ) -> std::result::Result<Option<Q>, Q> {
        if self.pending.get(&key) != Some(&ticket) {
            return Err(q);
        }
        self.pending.remove(&key);
        self.insert(key, q)
    }

    /// QPs filed.
    pub(crate) fn len(&self) -> usize {
        self.qps.len()
    }

    /// Is nothing filed?
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.qps.is_empty()
    }

    /// The QP filed under `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &QpInitiator) -> Option<&Q> {
        self.qps.get(key)
    }

    /// Make sure [`PassiveTable::insert`] will take a QP for `key`: it has
    /// a QP to replace, or a free slot, or a full table gives up its dead
    /// QPs (a sweep, at most once per [`SWEEP_EVERY`] of `now_ns`). Returns
    /// how many dead QPs were dropped.
    ///
    /// # Errors
    /// [`TableFull`]: every slot holds another key's live QP (or a sweep
    /// ran less than [`SWEEP_EVERY`] ago).
    pub(crate) fn room(
        &mut self,
        key: &QpInitiator,
        now_ns: u64,
    ) -> std::result::Result<usize, TableFull> {
        if self.qps.contains_key(key) || self.qps.len() < self.cap {
            return Ok(0);
        }
        if now_ns < self.next_sweep_ns {
            return Err(TableFull);
        }
        self.next_sweep_ns = now_ns.saturating_add(SWEEP_EVERY.as_nanos() as u64);
        let before = self.qps.len();
        self.qps.retain(|_, q| q.is_live());
        let dropped = before - self.qps.len();
        if self.qps.len() < self.cap {
            Ok(dropped)
        } else {
            Err(TableFull)
        }
    }

    /// File `q` under `key`; the QP it replaces comes back (to be
    /// destroyed). A full table without one for `key` hands `q` back.
    pub(crate) fn insert(&mut self, key: QpInitiator, q: Q) -> std::result::Result<Option<Q>, Q> {
        if !self.qps.contains_key(&key) && self.qps.len() >= self.cap {
            return Err(q);
        }
        Ok(self.qps.insert(key, q))
    }
}

/// A connected passive QP and its CQ (the QP is dropped first).
struct PassiveQp {
    qp: QueuePair,
    _cq: Arc<CompletionQueue>,
}

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
            qp.connect(&endpoint(theirs))?;
            let ours = bootstrap(&qp.endpoint()?);
            Ok((PassiveQp { qp, _cq: cq }, ours))
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
        Err(TableFull) => {
            let cap = table.cap;
            crate::lograte::warn_limited!("responder-full", cap, %initiator_nic, "rdma: every passive QP slot holds a live QP; new QP bootstraps are refused (SqFull)");
            Err(Error::new(
                ErrorKind::SqFull,
                format!(
                    "busy: all {cap} passive QP slots hold live QPs of other initiators; retry later"
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
    let filed = filing.finish(*key, ticket, passive);
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
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// A passive QP whose liveness the test sets; records its drop.
    #[derive(Debug)]
    struct Fake {
        id: u32,
        live: Rc<Cell<bool>>,
        dropped: Rc<RefCell<Vec<u32>>>,
    }

    impl Passive for Fake {
        fn is_live(&self) -> bool {
            self.live.get()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.borrow_mut().push(self.id);
        }
    }

    /// Makes fakes sharing one drop log.
    #[derive(Default)]
    struct Fakes {
        dropped: Rc<RefCell<Vec<u32>>>,
    }

    impl Fakes {
        /// A live QP and the switch that kills it.
        fn qp(&self, id: u32) -> (Fake, Rc<Cell<bool>>) {
            let live = Rc::new(Cell::new(true));
            let q = Fake {
                id,
                live: live.clone(),
                dropped: self.dropped.clone(),
            };
            (q, live)
        }

        fn dropped(&self) -> Vec<u32> {
            let mut d = self.dropped.borrow().clone();
            d.sort_unstable();
            d
        }
    }

    fn key(engine: u64, worker: usize, rail: usize) -> QpInitiator {
        QpInitiator::new(engine, worker, rail).unwrap()
    }

    const T0: u64 = 1_000_000_000;
    const SWEEP: u64 = SWEEP_EVERY.as_nanos() as u64;

    fn id_at(t: &PassiveTable<Fake>, k: &QpInitiator) -> Option<u32> {
        t.get(k).map(|q| q.id)
    }

    /// `room` then `insert`, as the responder does.
    fn admit(t: &mut PassiveTable<Fake>, k: QpInitiator, q: Fake, now: u64) -> bool {
        if t.room(&k, now).is_err() {
            return false;
        }
        match t.insert(k, q) {
            Ok(old) => {
                drop(old);
                true
            }
            Err(_) => panic!("room was made, yet insert refused"),
        }
    }

    #[test]
    fn of_two_requests_for_one_key_the_latest_files_its_qp_whichever_ends_first() {
        let f = Fakes::default();
        let mut t = PassiveTable::new(8);
        let k = key(7, 0, 0);
        let older = t.begin(k);
        let newer = t.begin(k);
        // The newer (a retry) connects first and is filed.
        assert!(t.finish(k, newer, f.qp(2).0).unwrap().is_none());
        // The older one ends last: it files nothing and its QP comes back
        // to be destroyed; the newer one's QP stays.
        let back = t.finish(k, older, f.qp(1).0).map(|_| ()).unwrap_err();
        assert_eq!(back.id, 1);
        drop(back);
        assert_eq!(id_at(&t, &k), Some(2));
        assert_eq!(f.dropped(), [1]);
        // In the other order the older is superseded as well.
        let older = t.begin(k);
        let newer = t.begin(k);
        let back = t.finish(k, older, f.qp(3).0).map(|_| ()).unwrap_err();
        drop(back);
        assert_eq!(t.finish(k, newer, f.qp(4).0).unwrap().map(|q| q.id), Some(2));
        assert_eq!(id_at(&t, &k), Some(4));
        // A request that made no QP leaves nothing pending.
        let gone = t.begin(k);
        t.abandon(&k, gone);
        assert!(t.pending.is_empty());
    }

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
        assert_eq!(full.unwrap_err().kind(), ErrorKind::SqFull);
        // Replacing a key's QP says so.
        let again = make_and_file(&table, &k, "nic0", || Ok((f.qp(4).0, ())));
        assert!(again.unwrap().1, "the retry's QP was replaced");
        assert_eq!(f.dropped(), [1, 2]);
    }

    #[test]
    fn reconnect_under_the_same_key_replaces_the_old_qp() {
        let f = Fakes::default();
        let mut t = PassiveTable::new(8);
        assert!(admit(&mut t, key(7, 0, 0), f.qp(1).0, T0));
        assert!(admit(&mut t, key(7, 0, 1), f.qp(2).0, T0));
        // Worker 0 rail 0 of engine 7 reconnects: its old QP goes.
        assert!(admit(&mut t, key(7, 0, 0), f.qp(3).0, T0));
        assert_eq!(t.len(), 2);
        assert_eq!(id_at(&t, &key(7, 0, 0)), Some(3));
        assert_eq!(id_at(&t, &key(7, 0, 1)), Some(2));
        assert_eq!(f.dropped(), [1]);
        // Another worker, rail or engine is another key.
        assert!(admit(&mut t, key(7, 1, 0), f.qp(4).0, T0));
        assert!(admit(&mut t, key(8, 0, 0), f.qp(5).0, T0));
        assert_eq!(t.len(), 4);
        assert_eq!(f.dropped(), [1]);
        // insert hands the replaced QP back to the caller.
        let (q, _) = f.qp(6);
        let old = t.insert(key(8, 0, 0), q).unwrap().expect("replaced");
        assert_eq!(old.id, 5);
    }

    #[test]
    fn a_full_table_of_live_qps_refuses_a_newcomer_and_keeps_them_all() {
        let f = Fakes::default();
        let mut t = PassiveTable::new(3);
        for r in 0..3 {
            assert!(admit(&mut t, key(7, 0, r), f.qp(r as u32).0, T0));
        }
        assert_eq!(t.room(&key(9, 0, 0), T0), Err(TableFull));
        // Even past the sweep interval: a sweep finds nothing dead.
        assert_eq!(t.room(&key(9, 0, 0), T0 + 10 * SWEEP), Err(TableFull));
        let (q, _) = f.qp(9);
        let back = t.insert(key(9, 0, 0), q).map(|_| ()).unwrap_err();
        assert_eq!(back.id, 9, "the refused QP comes back to its caller");
        drop(back);
        assert_eq!(t.len(), 3);
        for r in 0..3 {
            assert_eq!(id_at(&t, &key(7, 0, r)), Some(r as u32));
        }
        assert_eq!(f.dropped(), [9], "no filed QP was dropped");
        // A reconnect of a filed key needs no free slot.
        assert!(admit(&mut t, key(7, 0, 1), f.qp(11).0, T0 + 10 * SWEEP));
        assert_eq!(id_at(&t, &key(7, 0, 1)), Some(11));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_full_table_evicts_dead_qps_and_only_them() {
        let f = Fakes::default();
        let mut t = PassiveTable::new(4);
        let mut kill = Vec::new();
        for r in 0..4 {
            let (q, live) = f.qp(r as u32);
            assert!(admit(&mut t, key(7, 0, r), q, T0));
            kill.push(live);
        }
        // Rails 1 and 3 went to ERROR.
        kill[1].set(false);
        kill[3].set(false);
        assert_eq!(t.room(&key(9, 0, 0), T0), Ok(2));
        assert_eq!(f.dropped(), [1, 3]);
        assert_eq!(id_at(&t, &key(7, 0, 0)), Some(0));
        assert_eq!(id_at(&t, &key(7, 0, 2)), Some(2));
        assert!(t.insert(key(9, 0, 0), f.qp(10).0).is_ok());
        assert!(admit(&mut t, key(9, 0, 1), f.qp(11).0, T0));
        // Full again, all live: the next newcomer is refused.
        assert!(!admit(&mut t, key(9, 0, 2), f.qp(12).0, T0 + SWEEP));
        assert_eq!(t.len(), 4);
        assert_eq!(f.dropped(), [1, 3, 12]);
    }

    #[test]
    fn a_full_table_is_swept_at_most_once_per_interval() {
        let f = Fakes::default();
        let mut t = PassiveTable::new(2);
        let (q0, live0) = f.qp(0);
        assert!(admit(&mut t, key(7, 0, 0), q0, T0));
        assert!(admit(&mut t, key(7, 0, 1), f.qp(1).0, T0));
        // A sweep that finds nothing dead...
        assert_eq!(t.room(&key(9, 0, 0), T0), Err(TableFull));
        // ...is not repeated before SWEEP_EVERY, even once a QP dies.
        live0.set(false);
        assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP - 1), Err(TableFull));
        assert!(f.dropped().is_empty());
        assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP), Ok(1));
        assert_eq!(f.dropped(), [0]);
        // A table with room never sweeps (nor waits for the interval).
        assert_eq!(t.room(&key(9, 0, 0), T0 + SWEEP), Ok(0));
    }

    #[test]
    fn keys_are_bounded() {
        // A table key is a QpInitiator, which only QpInitiator::new makes.
        assert!(QpInitiator::new(0, 0, 0).is_err(), "engine 0 is reserved");
        assert!(QpInitiator::new(1, crate::control::wire::MAX_QP_WORKERS, 0).is_err());
        assert!(QpInitiator::new(1, 0, crate::control::wire::MAX_QP_RAILS).is_err());
        let mut t = PassiveTable::<Fake>::new(0);
        // A zero-capacity table takes nothing (and sweeps nothing).
        assert_eq!(t.room(&key(1, 0, 0), T0), Err(TableFull));
        assert!(t.is_empty());
    }
}
