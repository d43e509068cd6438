//! A worker's views of the engine's shared tables: the registered regions,
//! the open segments and the installed transports.
//!
//! Each is a local copy refreshed only when the engine changed it (one
//! atomic load per use to see whether it did), so a lookup on the hot path
//! is a plain read. Entries of the cached tables stay alive while the view
//! holds the table; a task made from one keeps it alive beyond that
//! through the unregister handshake (see `Held`).

use std::sync::Arc;

use arc_swap::{ArcSwap, Cache};
use tent_rings::{ErrorKind, Opcode, Priority, RegionId, SegmentId, Sqe, TransportKind};

use super::super::blocks::Runs;
use super::super::client_scope::ClientScope;
use super::super::task::Held;
use super::super::{EngineShared, slot_index};
use super::turn_clock::{TurnClock, asked_deadline};
use crate::memory::{MemRegion, RegionTable};
use crate::segment::{PeerState, Segment, SegmentTable};
use crate::transport::{Installed, TransportSlots};

/// Transports best first. A request's ranked fallback list is this order
/// filtered by what is installed and reaches its segment (so what both
/// ends offer: RDMA → TCP for a remote peer, SHM → TCP for one on this
/// host); its `xport_priority` is the index here of its current transport.
pub(in crate::engine) const RANKED: [TransportKind; 4] = [
    TransportKind::Local,
    TransportKind::Shm,
    TransportKind::Rdma,
    TransportKind::Tcp,
];

type RegionCache = Cache<Arc<ArcSwap<RegionTable>>, Arc<RegionTable>>;
type SegmentCache = Cache<Arc<ArcSwap<SegmentTable>>, Arc<SegmentTable>>;

/// What `resolve` from rank 0 answered last depends on only these: the
/// segment (an entry of one segment table, which the view holds while it
/// is current: a table is named by its address, and every reload of the
/// cache either happens in [`Views::segment`], where a new table has a new
/// address while the old one is still held, or forgets the answer), the
/// hint, and the installed transports. A run of requests to one peer walks
/// the transports once (`reaches` is a virtual call per transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResolveKey {
    /// The table's address (compared, never followed).
    table: usize,
    segment: SegmentId,
    hint: TransportKind,
    slots_epoch: u64,
}

/// A request's remote end as the views found it.
pub(super) struct Reached {
    pub(super) segment: Held<Segment>,
    /// The rank in [`RANKED`] of the transport that serves it.
    pub(super) rank: u8,
    pub(super) transport: TransportKind,
}

/// A request that passed [`Views::accept`]: what it names, resolved.
pub(in crate::engine) struct Accepted {
    pub(in crate::engine) opcode: Opcode,
    pub(in crate::engine) priority: Priority,
    /// Its local bytes (in `region`).
    pub(in crate::engine) local: *mut u8,
    pub(in crate::engine) region: Held<MemRegion>,
    pub(in crate::engine) segment: Held<Segment>,
    pub(in crate::engine) transport: TransportKind,
    /// The rank in [`RANKED`] of `transport`.
    pub(in crate::engine) xport_priority: u8,
    /// `None`: the default, set if the request is queued.
    pub(in crate::engine) deadline_ns: Option<u64>,
}

impl Accepted {
    /// The whole request as one slice, for a synchronous transport that
    /// does it in one copy (completion at intake, inline issue): no
    /// completion echoes its token.
    ///
    /// # Safety
    /// The tables `accept` found its region and segment in are still held
    /// (no load of the views since), and their memory stays valid while the
    /// slice is used.
    #[inline(always)]
    pub(in crate::engine) unsafe fn whole(&self, sqe: &Sqe) -> crate::transport::Slice<'_> {
        crate::transport::Slice {
            token: u64::MAX,
            opcode: self.opcode,
            local: self.local,
            // SAFETY: held, as the caller promises.
            region: unsafe { self.region.get() },
            // SAFETY: as above.
            segment: unsafe { self.segment.get() },
            remote: sqe.remote().offset,
            len: sqe.len(),
            rest: sqe.len(),
            priority: self.priority,
        }
    }
}

/// See the module doc.
pub(in crate::engine) struct Views {
    regions: RegionCache,
    segments: SegmentCache,
    /// The engine's transport slots as of `slots_epoch`: a slot read is a
    /// plain field read. A swapped-out transport is let go at the next
    /// refresh (slices still posted on it are held by the in-flight book).
    slots: [Option<Arc<Installed>>; 5],
    slots_epoch: u64,
    /// `resolve`'s last answer from rank 0.
    resolved: Option<(ResolveKey, (u8, TransportKind))>,
}

impl Views {
    pub(in crate::engine) fn new(engine: &EngineShared) -> Views {
        Views {
            regions: Cache::new(engine.regions.clone()),
            segments: Cache::new(engine.segments.clone()),
            slots_epoch: engine.transports.epoch(),
            slots: engine.transports.load_all(),
            resolved: None,
        }
    }

    /// Reload the transport slots if one was swapped since the last look
    /// (one Acquire load of a line written only by a swap), so a request
    /// submitted after `swap_transport` returned is served by what it
    /// installed.
    #[inline]
    pub(in crate::engine) fn refresh_slots(&mut self, transports: &TransportSlots) {
        let epoch = transports.epoch();
        if epoch != self.slots_epoch {
            self.slots = transports.load_all();
            self.slots_epoch = epoch;
        }
    }

    /// The transport installed for `kind`, as of the last refresh.
    #[inline]
    pub(in crate::engine) fn slot(&self, kind: TransportKind) -> Option<&Arc<Installed>> {
        self.slots[slot_index(kind)].as_ref()
    }

    /// Reload both tables past an unregister or close the engine
    /// published, so a parked worker does not keep what it removed alive.
    pub(super) fn refresh_tables(&mut self) {
        let _ = self.regions.load();
        let _ = self.segments.load();
        // `resolved` names a table by address: once it may have moved, forget.
        self.resolved = None;
    }

    /// Check a request against the tables: every field known, its local
    /// range inside a live registration, its segment open and reached by
    /// an installed transport, its deadline neither past nor beyond
    /// `max_timeout_ns` (the error is the completion's). The worker's intake
    /// and a ring's inline issue both accept through here, so a request is
    /// judged the same wherever it runs. Call `refresh_slots` first.
    ///
    /// `blocks`: the request is a block list's (its batch task's runs):
    /// its local range is its registration from the start to where its
    /// blocks reach, and its length theirs. `scope`: it came from a daemon
    /// client's ring, and may name only that client's regions
    /// (`AddressNotRegistered` otherwise, as for a region that does not
    /// exist) and the segments it opened (`SegmentNotFound`).
    #[inline(always)]
    pub(in crate::engine) fn accept(
        &mut self,
        sqe: &Sqe,
        clock: &mut TurnClock,
        max_timeout_ns: u64,
        blocks: Option<&Runs>,
        scope: Option<&ClientScope>,
    ) -> Result<Accepted, ErrorKind> {
        // A flag bit or reserved byte this version does not know: a newer
        // client's request, refused rather than run with part of it ignored.
        if sqe.has_unknown_fields() {
            return Err(ErrorKind::InvalidArgument);
        }
        let opcode = sqe.opcode().ok_or(ErrorKind::InvalidArgument)?;
        let priority = sqe.priority().ok_or(ErrorKind::InvalidArgument)?;
        let hint = sqe.transport_hint().ok_or(ErrorKind::InvalidArgument)?;
        if sqe.is_empty() {
            return Err(ErrorKind::InvalidArgument);
        }
        let local = sqe.local();
        let client = scope.map(ClientScope::id);
        let (ptr, region) = match blocks {
            None => self.local(local.region, local.offset, sqe.len(), client)?,
            Some(runs) => {
                if local.offset != 0 || runs.total() != sqe.len() {
                    return Err(ErrorKind::InvalidArgument);
                }
                self.local(local.region, 0, runs.local_end(), client)?
            }
        };
        let segment = sqe.remote().segment;
        if scope.is_some_and(|s| !s.allows(segment)) {
            return Err(ErrorKind::SegmentNotFound);
        }
        let reached = self.segment(segment, hint)?;
        let deadline_ns = asked_deadline(sqe.deadline_ns(), clock, max_timeout_ns)?;
        Ok(Accepted {
            opcode,
            priority,
            local: ptr,
            region,
            segment: reached.segment,
            transport: reached.transport,
            xport_priority: reached.rank,
            deadline_ns,
        })
    }

    /// `len` bytes at `offset` of registered region `region`, unless it is
    /// unknown, revoked or (with `client`) not that daemon client's
    /// (`AddressNotRegistered`), or the range leaves it.
    #[inline]
    pub(super) fn local(
        &mut self,
        region: RegionId,
        offset: u64,
        len: u64,
        client: Option<u32>,
    ) -> Result<(*mut u8, Held<MemRegion>), ErrorKind> {
        let r = self
            .regions
            .load()
            .get(region)
            .filter(|r| !r.is_revoked() && client.is_none_or(|c| r.client() == c))
            .ok_or(ErrorKind::AddressNotRegistered)?;
        let at = r.slice_ptr(offset, len)?;
        Ok((at, Held::new(&**r)))
    }

    /// Open segment `id` and the best transport that reaches it (only
    /// `hint`, unless it is `Any`): `SegmentNotFound` for a closed or
    /// unknown one, `Unreachable` when nothing installed reaches it.
    #[inline]
    pub(super) fn segment(
        &mut self,
        id: SegmentId,
        hint: TransportKind,
    ) -> Result<Reached, ErrorKind> {
        let table = self.segments.load();
        let table_at = Arc::as_ptr(table) as usize;
        let segment = Held::new(
            &**table
                .get(id)
                // Closed, in a table this worker has not refreshed yet.
                .filter(|s| s.closed_epoch() == 0)
                .ok_or(ErrorKind::SegmentNotFound)?,
        );
        // SAFETY: the segment is in the cached table, which holds it until this view's next load, after this call.
        if unsafe { segment.get() }.peer_state() == PeerState::Gone {
            return Err(ErrorKind::ProcessFailed);
        }
        let key = ResolveKey {
            table: table_at,
            segment: id,
            hint,
            slots_epoch: self.slots_epoch,
        };
        let (rank, transport) = match self.resolved {
            Some((k, answer)) if k == key => answer,
            _ => {
                // SAFETY: the segment is in the cached table, which holds it until this view's next load, after this call.
                let live = unsafe { segment.get() };
                let answer = self.resolve(live, 0, hint).ok_or(ErrorKind::Unreachable)?;
                self.resolved = Some((key, answer));
                answer
            }
        };
        Ok(Reached {
            segment,
            rank,
            transport,
        })
    }

    /// The best transport at rank `from` or below that is installed and
    /// reaches `segment` (only `only`, unless it is `Any`), with its rank.
    pub(super) fn resolve(
        &self,
        segment: &Segment,
        from: usize,
        only: TransportKind,
    ) -> Option<(u8, TransportKind)> {
        for (rank, &kind) in RANKED.iter().enumerate().skip(from) {
            if only != TransportKind::Any && kind != only {
                continue;
            }
            if let Some(installed) = self.slot(kind)
                && installed.transport.reaches(segment)
            {
                return Some((rank as u8, kind));
            }
        }
        None
    }
}
