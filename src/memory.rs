//! Registered memory: what a transfer may read or write locally, and what a
//! remote peer may reach, each checked against region, key and bounds.
//!
//! The table is an immutable snapshot swapped with `arc-swap` on
//! (un)registration, so a worker resolves a `(region, offset)` with one
//! lock-free load and a bounds check.
//!
//! Unregistering does not wait for the last `Arc` to drop: a region is
//! *revoked* (`MemRegion::revoke`, which new requests see at validation),
//! its target-side users are counted (`MemRegion::enter`), and its RDMA
//! registration is dropped explicitly (`MemRegion::release_rdma`) once the
//! engine has drained what was in flight on it (`Engine::unregister_memory`).

use std::any::Any;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use parking_lot::Mutex;

use crossbeam_utils::CachePadded;
use tent_rings::{ErrorKind, RegionId};

use crate::error::{Error, Result};
use crate::transport::rdma::layout::MrLayout;

/// One registered memory range.
pub struct MemRegion {
    id: RegionId,
    key: u64,
    base: *mut u8,
    len: u64,
    /// The NUMA node its pages were on at registration (`None`: unknown,
    /// not faulted in yet, or spread over nodes): the rails' tiers for its
    /// slices are ranked from it.
    numa_node: Option<u32>,
    /// The daemon client whose memory it is (`ClientScope::id`); 0: this
    /// process's own. A client's ring names only its own regions.
    client: u32,
    /// The unregister epoch that revoked it (0: live). Written once; read
    /// (Relaxed) by workers at validation, beside `base` and `len`.
    revoked: AtomicU64,
    /// Target-side users (TCP data server ops in progress) and
    /// [`USERS_REVOKED`]; on its own line: server threads RMW it per op.
    users: CachePadded<AtomicU64>,
    // RDMA: how the region is cut into memory regions on each NIC, its
    // keys (NIC by NIC, each NIC's chunks in order), and what keeps the
    // registrations alive until `release_rdma` (or the last drop). Declared
    // before `_owner` so the memory is deregistered before it is freed
    // (fields drop in declaration order).
    layout: MrLayout,
    rkeys: Vec<u32>,
    lkeys: Vec<Option<u32>>,
    rdma: Mutex<Option<Box<dyn Any + Send + Sync>>>,
    // Keeps engine-allocated memory (heap or an exported shm mapping) alive
    // for as long as any handle or in-flight task holds this region.
    _owner: Option<Box<dyn Any + Send + Sync>>,
}

/// The bit of `MemRegion::users` that refuses new users.
const USERS_REVOKED: u64 = 1 << 63;

/// A target-side use of a region in progress (see [`MemRegion::enter`]).
#[must_use = "the use ends when the guard drops"]
#[derive(Debug)]
pub(crate) struct RegionUse<'a>(&'a MemRegion);

impl Drop for RegionUse<'_> {
    fn drop(&mut self) {
        // Release: the use's accesses to the memory happen before a
        // revoker that sees the count reach 0.
        self.0.users.fetch_sub(1, Ordering::Release);
    }
}

/// A target-side use of a region that outlives any borrow of the region
/// table: an op whose I/O spans several turns of a serving thread (a READ
/// response queued behind others, a WRITE payload received in parts).
/// Counted as [`RegionUse`] is; the region stays alive while it is held.
#[must_use = "the use ends when the hold drops"]
#[derive(Debug)]
pub(crate) struct RegionHold(Arc<MemRegion>);

impl RegionHold {
    /// Whether the region was revoked after this use began (an unregister
    /// is waiting for it): a slow use should end rather than hold it.
    pub(crate) fn is_revoked(&self) -> bool {
        self.0.is_revoked()
    }
}

impl Drop for RegionHold {
    fn drop(&mut self) {
        // Release: as `RegionUse::drop`.
        self.0.users.fetch_sub(1, Ordering::Release);
    }
}

// SAFETY: `base` points at memory whose lifetime is tied to `_owner` (or, for
// user-registered memory, guaranteed by the caller of `Engine::register_memory`);
// the engine only copies bytes through it, which is what any thread may do.
unsafe impl Send for MemRegion {}
// SAFETY: as above; no interior state besides the immutable fields.
unsafe impl Sync for MemRegion {}

impl std::fmt::Debug for MemRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemRegion")
            .field("id", &self.id.0)
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl MemRegion {
    /// A region over `[base, base+len)`; `owner` keeps the memory alive.
    pub(crate) fn new(
        id: RegionId,
        base: *mut u8,
        len: u64,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> MemRegion {
        MemRegion {
            id,
            key: fresh_key(),
            base,
            len,
            numa_node: None,
            client: 0,
            revoked: AtomicU64::new(0),
            users: CachePadded::new(AtomicU64::new(0)),
            layout: MrLayout::whole(len),
            rkeys: Vec::new(),
            lkeys: Vec::new(),
            rdma: Mutex::new(None),
            _owner: owner,
        }
    }

    /// The same region, registered for RDMA as `layout` cuts it: `rkeys` /
    /// `lkeys` NIC by NIC, each NIC's chunks in order, `registration`
    /// keeping them valid.
    pub(crate) fn with_rdma(
        mut self,
        layout: MrLayout,
        rkeys: Vec<u32>,
        lkeys: Vec<Option<u32>>,
        registration: Box<dyn Any + Send + Sync>,
    ) -> MemRegion {
        self.layout = layout;
        self.rkeys = rkeys;
        self.lkeys = lkeys;
        self.rdma = Mutex::new(Some(registration));
        self
    }

    /// The same region, its memory on NUMA node `node` (`None`: unknown).
    pub(crate) fn with_numa_node(mut self, node: Option<u32>) -> MemRegion {
        self.numa_node = node;
        self
    }

    /// The same region, a daemon client's memory.
    pub(crate) fn with_client(mut self, client: u32) -> MemRegion {
        self.client = client;
        self
    }

    /// The daemon client whose memory it is (0: this process's).
    #[inline]
    pub(crate) fn client(&self) -> u32 {
        self.client
    }

    /// The NUMA node its memory was on at registration (`None`: unknown).
    #[inline]
    pub(crate) fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    /// Whether the engine owns the memory (`allocate_memory`): alive for as
    /// long as this region is. Otherwise it is the application's
    /// (`register_memory`), valid only until it is unregistered or the
    /// engine dropped.
    pub(crate) fn owns_memory(&self) -> bool {
        self._owner.is_some()
    }

    /// Withdraw the region at unregister epoch `epoch` (non-zero): new
    /// requests naming it are refused from now on (workers check
    /// [`MemRegion::is_revoked`] at validation, and a TCP op can no longer
    /// [`MemRegion::enter`] it). Uses already in progress go on; see
    /// [`MemRegion::in_use`].
    pub(crate) fn revoke(&self, epoch: u64) {
        debug_assert!(epoch != 0);
        // Release: pairs with the Acquire of a worker that reads the
        // engine's epoch (published after this) and then this flag.
        self.revoked.store(epoch, Ordering::Release);
        self.users.fetch_or(USERS_REVOKED, Ordering::AcqRel);
    }

    /// The unregister epoch that revoked it, 0 while it is live.
    #[inline]
    pub(crate) fn revoked_epoch(&self) -> u64 {
        // Relaxed: a worker that misses a fresh revoke accepts one more
        // task, which the unregister drain then waits for.
        self.revoked.load(Ordering::Relaxed)
    }

    /// Has it been unregistered (new requests refused)?
    #[inline]
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked_epoch() != 0
    }

    /// Start a target-side use (a TCP op into or out of it); `None` once it
    /// is revoked. The guard keeps `unregister_memory` waiting.
    #[inline]
    pub(crate) fn enter(&self) -> Option<RegionUse<'_>> {
        // Acquire: nothing of the use happens before it is counted. One
        // total order on `users`: a use counted before the revoke's
        // `fetch_or` is waited for, one after it sees the bit.
        let prev = self.users.fetch_add(1, Ordering::Acquire);
        if prev & USERS_REVOKED != 0 {
            self.users.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(RegionUse(self))
    }

    /// [`MemRegion::enter`], held by an owner rather than a borrow.
    #[inline]
    pub(crate) fn hold(self: &Arc<Self>) -> Option<RegionHold> {
        let used = self.enter()?;
        // The count taken by `enter` passes to the hold, which gives it
        // back on drop.
        std::mem::forget(used);
        Some(RegionHold(self.clone()))
    }

    /// Target-side uses still in progress.
    pub(crate) fn in_use(&self) -> u64 {
        // Acquire: pairs with `RegionUse::drop`.
        self.users.load(Ordering::Acquire) & !USERS_REVOKED
    }

    /// Drop the RDMA registration now (`ibv_dereg_mr` on every NIC): a peer
    /// still holding an rkey gets a remote access error from here on.
    /// Called once nothing of the engine uses the region any more; a no-op
    /// the second time or without RDMA.
    pub(crate) fn release_rdma(&self) {
        let reg = self
            .rdma
            .lock()
            .take();
        drop(reg);
    }

    /// Is it still registered for RDMA?
    #[cfg(test)]
    pub(crate) fn rdma_registered(&self) -> bool {
        self.rdma
            .lock()
            .is_some()
    }

    /// Remote keys per NIC, as a descriptor's `rkeys` carries them:
    /// zeros for a region cut into chunks (its keys are
    /// [`MemRegion::chunk_rkeys`]); empty without RDMA.
    pub(crate) fn nic_rkeys(&self) -> Vec<u32> {
        match self.layout.step() {
            None => self.rkeys.clone(),
            Some(_) => vec![0; self.rkeys.len() / self.layout.chunks()],
        }
    }

    /// Remote keys of a region cut into chunks, NIC by NIC, each NIC's
    /// chunks in order; empty for a region that is one MR per NIC.
    pub(crate) fn chunk_rkeys(&self) -> &[u32] {
        match self.layout.step() {
            None => &[],
            Some(_) => &self.rkeys,
        }
    }

    /// How the region is cut into memory regions on each NIC.
    pub(crate) fn mr_layout(&self) -> MrLayout {
        self.layout
    }

    /// Does RDMA NIC `nic` hold the region?
    #[inline]
    pub(crate) fn on_nic(&self, nic: usize) -> bool {
        self.lkey_at(nic, self.base as u64).is_some()
    }

    /// The local key on RDMA NIC `nic` for a work request that starts at
    /// `addr` (inside the region, and no longer than its chunks' step).
    #[inline]
    pub(crate) fn lkey_at(&self, nic: usize, addr: u64) -> Option<u32> {
        let chunks = self.layout.chunks();
        let k = self.layout.chunk_of(addr.wrapping_sub(self.base as u64));
        self.lkeys.get(nic.checked_mul(chunks)?.checked_add(k)?).copied().flatten()
    }

    /// Region id (what an SQE names).
    pub(crate) fn id(&self) -> RegionId {
        self.id
    }

    /// The access key a peer must present.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Start address in this process.
    pub(crate) fn addr(&self) -> u64 {
        self.base as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length region (never registered; here for clippy).
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to `offset` if `[offset, offset+len)` lies inside the region.
    #[inline]
    pub(crate) fn slice_ptr(&self, offset: u64, len: u64) -> Result<*mut u8, ErrorKind> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base.wrapping_add(offset as usize)),
            _ => Err(ErrorKind::OutOfBounds),
        }
    }

    /// Does `[addr, addr+len)` start inside this region?
    fn contains_addr(&self, addr: u64) -> bool {
        addr >= self.addr() && addr - self.addr() < self.len
    }
}

/// Pages of a region [`numa_node_of`] asks the kernel about: spread evenly
/// over it, first and last page included.
const NODE_SAMPLES: usize = 16;

/// The NUMA node holding `[base, base + len)`, asked of the kernel at
/// registration (`move_pages` with no target nodes: it reports where each
/// page is and moves nothing): [`dominant_node`] of up to [`NODE_SAMPLES`]
/// pages spread over the range. A page not faulted in yet has no node;
/// none faulted, a kernel without NUMA, or a refused call (seccomp): `None`,
/// and the rails rank from the worker's node. One syscall; never on the
/// hot path. The memory is only looked up, never touched or faulted.
pub(crate) fn numa_node_of(base: *const u8, len: u64) -> Option<u32> {
    // Any address inside a page names it: 4 KiB steps also work where
    // pages are larger (a page sampled twice counts twice).
    const PAGE: u64 = 4096;
    if len == 0 {
        return None;
    }
    let first = base as u64 & !(PAGE - 1);
    let last = (base as u64).saturating_add(len - 1) & !(PAGE - 1);
    let pages = (last - first) / PAGE + 1;
    let n = (pages as usize).min(NODE_SAMPLES);
    let mut addrs = [std::ptr::null_mut::<libc::c_void>(); NODE_SAMPLES];
    for (i, a) in addrs.iter_mut().enumerate().take(n) {
        // Evenly from the first page to the last (n ≥ 1).
        let k = if n == 1 { 0 } else { i as u64 * (pages - 1) / (n as u64 - 1) };
        *a = (first + k * PAGE) as *mut libc::c_void;
    }
    let mut status = [0i32; NODE_SAMPLES];
    // With `nodes` null the call only writes each page's node (or a
    // negative errno) into `status`, reads nothing through the page
    // addresses, and moves no page (pid 0: this process; flags 0).
    // SAFETY: `addrs` and `status` hold `n` entries each (see above).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::c_long,
            n as libc::c_ulong,
            addrs.as_mut_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "move_pages: the memory's NUMA node is unknown"
        );
        return None;
    }
    dominant_node(&status[..n])
}

/// The node holding more than half of the sampled pages that are on a
/// node, from `move_pages` statuses (a node id, or a negative errno such
/// as `-ENOENT` for a page not faulted in); `None` when no page is on a
/// node or none holds a majority (memory interleaved over nodes has no
/// one node to rank rails from).
pub(crate) fn dominant_node(status: &[i32]) -> Option<u32> {
    let on_node = || status.iter().filter_map(|&s| u32::try_from(s).ok());
    let placed = on_node().count();
    // Boyer-Moore majority vote, then a count to confirm it.
    let mut candidate = None;
    let mut votes = 0usize;
    for n in on_node() {
        if votes == 0 {
            candidate = Some(n);
        }
        votes = if candidate == Some(n) { votes + 1 } else { votes - 1 };
    }
    let c = candidate?;
    (on_node().filter(|&n| n == c).count() * 2 > placed).then_some(c)
}

/// A random, non-zero key: a stale or guessed key must not match by accident.
/// From the kernel's CSPRNG (`getrandom`); should it be unavailable, SipHash
/// under std's per-process random keys over a counter and the clock.
pub(crate) fn fresh_key() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let drawn = getrandom::u64().unwrap_or_else(|_| {
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u64(crate::clock::monotonic_ns());
        h.finish()
    });
    drawn | 1
}

/// Ids per chunk of [`RegionTable`]'s id index, and regions per leaf of
/// its address index (a leaf splits past twice this).
const CHUNK: usize = 512;

/// One chunk of the id index: `CHUNK` ids from a multiple of `CHUNK`.
type IdChunk = Vec<Option<Arc<MemRegion>>>;

/// Snapshot of every registered region, by id and by address.
///
/// Both indexes are cut into chunks shared between snapshots (`Arc`), so a
/// change copies the outer lists and the one or two chunks it touches, not
/// every region: registering or unregistering costs about the same with
/// 100 000 regions as with 1 000. A lookup is two indexings (by id) or two
/// binary searches (by address). A chunk of ids none of which is
/// registered any more is dropped.
#[derive(Debug, Default, Clone)]
pub(crate) struct RegionTable {
    /// By id: chunk `id / CHUNK`, slot `id % CHUNK`.
    by_id: Vec<Option<Arc<IdChunk>>>,
    /// By address: leaves of regions sorted by address, in address order,
    /// none empty; `starts[i]` is leaf `i`'s first address.
    leaves: Vec<Arc<Vec<Arc<MemRegion>>>>,
    starts: Vec<u64>,
    /// The next id to hand out (ids are never reused).
    next: u32,
    len: usize,
    /// Changes made to the table (registrations and unregistrations): what
    /// a peer is told as the regions' version.
    version: u64,
    /// The engine's tag every id here carries (0 in a table built for a
    /// test): an id with another is another engine's, and names nothing.
    tag: u32,
}

impl RegionTable {
    /// An empty table whose ids carry the engine's `tag`.
    pub(crate) fn tagged(tag: u32) -> RegionTable {
        RegionTable {
            tag,
            ..RegionTable::default()
        }
    }

    /// The region with `id` (none for an id another engine issued).
    #[inline]
    pub(crate) fn get(&self, id: RegionId) -> Option<&Arc<MemRegion>> {
        if id.tag() != self.tag {
            return None;
        }
        let i = id.index() as usize;
        self.by_id
            .get(i / CHUNK)?
            .as_ref()?
            .get(i % CHUNK)?
            .as_ref()
    }

    /// Resolve a local `(region, offset, len)` to a pointer.
    #[inline]
    #[cfg(test)]
    pub(crate) fn resolve(&self, id: RegionId, offset: u64, len: u64) -> Result<*mut u8, ErrorKind> {
        self.get(id)
            .ok_or(ErrorKind::AddressNotRegistered)?
            .slice_ptr(offset, len)
    }

    /// The region starting last at or before `addr`, and where it sits
    /// (leaf, index in it).
    #[inline]
    fn at_or_before(&self, addr: u64) -> Option<(usize, usize)> {
        let leaf = self.starts.partition_point(|&s| s <= addr).checked_sub(1)?;
        let at = self.leaves[leaf].partition_point(|r| r.addr() <= addr).checked_sub(1)?;
        Some((leaf, at))
    }

    /// The region holding address `addr`, checking that `[addr, addr+len)`
    /// stays inside it.
    #[inline]
    pub(crate) fn find_addr(&self, addr: u64, len: u64) -> Result<(&Arc<MemRegion>, *mut u8), ErrorKind> {
        let region = self
            .at_or_before(addr)
            .map(|(leaf, at)| &self.leaves[leaf][at])
            .filter(|r| r.contains_addr(addr))
            .ok_or(ErrorKind::AddressNotRegistered)?;
        let ptr = region.slice_ptr(addr - region.addr(), len)?;
        Ok((region, ptr))
    }

    /// The id for the next registration. Ids are never reused, so a stale
    /// id names nothing rather than someone else's memory.
    pub(crate) fn next_id(&self) -> RegionId {
        RegionId::from_parts(self.tag, self.next.max(1))
    }

    /// Regions registered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A copy with `region` added; overlapping ranges are refused so an
    /// address names exactly one region.
    pub(crate) fn with(&self, region: Arc<MemRegion>) -> Result<RegionTable> {
        let mut next = self.clone();
        next.insert(region)?;
        Ok(next)
    }

    /// Add `region` (refused, and nothing changed, if it overlaps one).
    pub(crate) fn insert(&mut self, region: Arc<MemRegion>) -> Result<()> {
        if self.get(region.id()).is_some() {
            return Err(Error::invalid(format!("region id {:#x} is registered already", region.id().0)));
        }
        let (start, end) = (region.addr(), region.addr() + region.len());
        // Regions do not overlap, so only the last one starting before
        // `end` can reach into `[start, end)`.
        if let Some((leaf, at)) = end.checked_sub(1).and_then(|last| self.at_or_before(last)) {
            let other = &self.leaves[leaf][at];
            if other.addr() + other.len() > start {
                return Err(Error::invalid(format!(
                    "memory [{start:#x}, {end:#x}) overlaps registered region {} at [{:#x}, {:#x})",
                    other.id().0,
                    other.addr(),
                    other.addr() + other.len()
                )));
            }
        }
        if region.id().tag() != self.tag {
            return Err(Error::invalid(format!("region id {:#x} is not this engine's", region.id().0)));
        }
        self.version += 1;
        let idx = region.id().index() as usize;
        let chunk = idx / CHUNK;
        if self.by_id.len() <= chunk {
            self.by_id.resize(chunk + 1, None);
        }
        let ids = Arc::make_mut(self.by_id[chunk].get_or_insert_with(|| Arc::new(vec![None; CHUNK])));
        if ids[idx % CHUNK].replace(region.clone()).is_none() {
            self.len += 1;
        }
        self.next = self.next.max(region.id().index().saturating_add(1));
        // The leaf it falls in (the first when it starts before all).
        if self.leaves.is_empty() {
            self.leaves.push(Arc::new(vec![region]));
            self.starts.push(start);
            return Ok(());
        }
        let li = self.starts.partition_point(|&s| s <= start).saturating_sub(1);
        let leaf = Arc::make_mut(&mut self.leaves[li]);
        let pos = leaf.partition_point(|r| r.addr() < start);
        leaf.insert(pos, region);
        self.starts[li] = leaf[0].addr();
        if leaf.len() > 2 * CHUNK {
            let upper = leaf.split_off(CHUNK);
            self.starts.insert(li + 1, upper[0].addr());
            self.leaves.insert(li + 1, Arc::new(upper));
        }
        Ok(())
    }

    /// A copy without region `id`, and the removed region.
    #[cfg(test)]
    pub(crate) fn without(&self, id: RegionId) -> Option<(RegionTable, Arc<MemRegion>)> {
        self.get(id)?;
        let mut next = self.clone();
        let removed = next.remove(id)?;
        Some((next, removed))
    }

    /// Take region `id` out; `None` if it is not registered.
    pub(crate) fn remove(&mut self, id: RegionId) -> Option<Arc<MemRegion>> {
        if id.tag() != self.tag {
            return None;
        }
        let idx = id.index() as usize;
        let slot = self.by_id.get_mut(idx / CHUNK)?;
        let ids = Arc::make_mut(slot.as_mut()?);
        let removed = ids[idx % CHUNK].take()?;
        if ids.iter().all(Option::is_none) {
            *slot = None;
        }
        self.len -= 1;
        let (li, at) = self
            .at_or_before(removed.addr())
            .expect("a registered region is in the address index");
        let leaf = Arc::make_mut(&mut self.leaves[li]);
        debug_assert_eq!(leaf[at].id(), id);
        leaf.remove(at);
        if leaf.is_empty() {
            self.leaves.remove(li);
            self.starts.remove(li);
        } else {
            self.starts[li] = leaf[0].addr();
        }
        self.version += 1;
        Some(removed)
    }

    /// Every region, by address.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<MemRegion>> {
        self.leaves.iter().flat_map(|l| l.iter())
    }

    /// The regions starting at or after `addr`, in address order.
    pub(crate) fn starting_at(&self, addr: u64) -> impl Iterator<Item = &Arc<MemRegion>> {
        let li = self.starts.partition_point(|&s| s < addr).saturating_sub(1);
        let rest = self.leaves.get(li..).unwrap_or_default();
        rest.iter()
            .flat_map(|l| l.iter())
            .skip_while(move |r| r.addr() < addr)
    }

    /// Changes made so far (see the field).
    pub(crate) fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(id: u32, buf: &mut [u8]) -> Arc<MemRegion> {
        Arc::new(MemRegion::new(
            RegionId::from_parts(0, id),
            buf.as_mut_ptr(),
            buf.len() as u64,
            None,
        ))
    }

    /// Random registrations and unregistrations of regions of 1..4
    /// pages at random page addresses (some overlapping, refused), past
    /// several chunks and leaf splits: the table answers by id and by
    /// address as a plain map of the same regions does, in address order,
    /// and an earlier snapshot is unchanged by later ones.
    #[test]
    fn the_chunked_table_answers_as_a_plain_map_does() {
        use proptest::prelude::*;
        use std::collections::BTreeMap;
        let ops = proptest::collection::vec((any::<bool>(), 0u64..6000, 1u64..4), 1..3000);
        proptest!(ProptestConfig::with_cases(24), |(ops in ops)| {
            const PAGE: u64 = 4096;
            let mut t = RegionTable::default();
            let mut model: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
            let mut ids: Vec<u32> = Vec::new();
            let mut snapshot: Option<(RegionTable, Vec<u32>)> = None;
            for (k, (add, page, pages)) in ops.into_iter().enumerate() {
                if add || ids.is_empty() {
                    let (addr, len) = ((page + 1) * PAGE, pages * PAGE);
                    let id = t.next_id();
                    let r = Arc::new(MemRegion::new(id, addr as *mut u8, len, None));
                    let overlaps = model.range(..addr + len).next_back().is_some_and(|(&a, &(_, l))| a + l > addr);
                    match t.with(r) {
                        Ok(next) => {
                            prop_assert!(!overlaps);
                            t = next;
                            model.insert(addr, (id.index(), len));
                            ids.push(id.index());
                        }
                        Err(_) => prop_assert!(overlaps),
                    }
                } else {
                    let id = ids.swap_remove(page as usize % ids.len());
                    let (next, removed) = t.without(RegionId::from_parts(0, id)).expect("registered");
                    prop_assert_eq!(removed.id(), RegionId::from_parts(0, id));
                    model.remove(&removed.addr());
                    t = next;
                    prop_assert!(t.get(RegionId::from_parts(0, id)).is_none());
                }
                if k == 500 {
                    snapshot = Some((t.clone(), t.iter().map(|r| r.id().index()).collect()));
                }
            }
            prop_assert_eq!(t.len(), model.len());
            let order: Vec<u32> = t.iter().map(|r| r.id().index()).collect();
            let want: Vec<u32> = model.values().map(|&(id, _)| id).collect();
            prop_assert_eq!(order, want);
            for (&addr, &(id, len)) in &model {
                prop_assert_eq!(t.get(RegionId::from_parts(0, id)).map(|r| r.addr()), Some(addr));
                prop_assert_eq!(t.find_addr(addr + len - 1, 1).map(|(r, _)| r.id().index()), Ok(id));
                prop_assert!(t.find_addr(addr, len + 1).is_err());
            }
            if let Some((old, order)) = snapshot {
                let now: Vec<u32> = old.iter().map(|r| r.id().index()).collect();
                prop_assert_eq!(now, order, "a later change reached an earlier snapshot");
            }
        });
    }

    #[test]
    fn resolve_and_bounds() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 100];
        let t = RegionTable::default();
        let id = t.next_id();
        assert_eq!(id, RegionId(1));
        let t = t.with(region(1, &mut a)).unwrap();
        let t = t.with(region(2, &mut b)).unwrap();
        assert!(t.resolve(RegionId(1), 0, 4096).is_ok());
        assert_eq!(t.resolve(RegionId(1), 1, 4096), Err(ErrorKind::OutOfBounds));
        assert_eq!(
            t.resolve(RegionId(1), u64::MAX, 2),
            Err(ErrorKind::OutOfBounds)
        );
        assert_eq!(
            t.resolve(RegionId(9), 0, 1),
            Err(ErrorKind::AddressNotRegistered)
        );
        let addr = b.as_ptr() as u64;
        let (r, p) = t.find_addr(addr + 10, 90).unwrap();
        assert_eq!(r.id(), RegionId(2));
        assert_eq!(p as u64, addr + 10);
        assert_eq!(
            t.find_addr(addr + 10, 91).unwrap_err(),
            ErrorKind::OutOfBounds
        );
        assert_eq!(
            t.find_addr(1, 1).unwrap_err(),
            ErrorKind::AddressNotRegistered
        );
        let (t, removed) = t.without(RegionId(2)).unwrap();
        assert_eq!(removed.id(), RegionId(2));
        assert!(t.find_addr(addr, 1).is_err());
        assert_eq!(t.next_id(), RegionId(3), "ids are not reused");
    }

    #[test]
    fn revoke_refuses_new_users_and_counts_those_in_progress() {
        let mut a = vec![0u8; 64];
        let r = region(1, &mut a);
        assert!(!r.is_revoked());
        let first = r.enter().expect("live region");
        let second = r.enter().expect("live region");
        assert_eq!(r.in_use(), 2);
        r.revoke(7);
        assert_eq!(r.revoked_epoch(), 7);
        assert!(r.enter().is_none(), "a revoked region takes no new use");
        assert_eq!(r.in_use(), 2, "uses in progress go on");
        drop(first);
        assert_eq!(r.in_use(), 1);
        drop(second);
        assert_eq!(r.in_use(), 0);
    }

    #[test]
    fn release_rdma_drops_the_registration_before_the_last_handle() {
        use std::sync::atomic::AtomicBool;
        struct Probe(Arc<AtomicBool>);
        impl Drop for Probe {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let mut a = vec![0u8; 64];
        let dropped = Arc::new(AtomicBool::new(false));
        let r = Arc::new(
            MemRegion::new(RegionId(1), a.as_mut_ptr(), 64, None).with_rdma(
                MrLayout::whole(64),
                vec![5],
                vec![Some(6)],
                Box::new(Probe(dropped.clone())),
            ),
        );
        let other = r.clone();
        assert!(r.rdma_registered());
        r.release_rdma();
        assert!(dropped.load(Ordering::Relaxed), "deregistered at once");
        assert!(!other.rdma_registered());
        r.release_rdma();
        drop(other);
    }

    #[test]
    fn dominant_node_needs_a_majority_of_the_placed_pages() {
        const ENOENT: i32 = -2;
        assert_eq!(dominant_node(&[]), None);
        assert_eq!(dominant_node(&[ENOENT; 4]), None, "nothing faulted in");
        assert_eq!(dominant_node(&[1, ENOENT, ENOENT, 1]), Some(1));
        assert_eq!(dominant_node(&[0, 1, 1, ENOENT, -14]), Some(1));
        assert_eq!(dominant_node(&[0, 1, 0, 1]), None, "interleaved");
        assert_eq!(dominant_node(&[2, 0, 1]), None);
        assert_eq!(dominant_node(&[3, 3, 0]), Some(3));
    }

    /// One NUMA node here at least: a faulted page is on a node the
    /// kernel names (or the call is refused: unknown), a page never
    /// touched is on none, and the query faults nothing in.
    #[test]
    fn numa_node_of_reports_only_faulted_pages() {
        let map = memmap2::MmapMut::map_anon(8 << 12).unwrap();
        let base = map.as_ptr();
        assert_eq!(numa_node_of(base, 8 << 12), None, "nothing faulted in");
        assert_eq!(numa_node_of(base, 0), None);
        let mut map = map;
        map.fill(1);
        let node = numa_node_of(map.as_ptr(), 8 << 12);
        let online = std::fs::read_to_string("/sys/devices/system/node/online").ok();
        if let (Some(n), Some(online)) = (node, online) {
            assert!(
                online.trim().split(',').any(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    (a.parse().unwrap()..=b.parse().unwrap()).contains(&n)
                }),
                "node {n} is not online ({online})"
            );
        }
        // Half touched: the majority of the sampled pages is unplaced but
        // the placed ones decide.
        let mut half = memmap2::MmapMut::map_anon(8 << 12).unwrap();
        half[..4 << 12].fill(1);
        assert_eq!(numa_node_of(half.as_ptr(), 8 << 12), node);
        // An unaligned range inside one page.
        assert_eq!(numa_node_of(map.as_ptr().wrapping_add(100), 10), node);
    }

    #[test]
    fn overlap_refused_and_keys_differ() {
        let mut a = vec![0u8; 64];
        let t = RegionTable::default().with(region(1, &mut a)).unwrap();
        let err = t.with(region(2, &mut a)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert_ne!(fresh_key(), fresh_key());
    }
}
