//! The shared-memory face of a segment.
//!
//! A target exports its engine-allocated regions as sealed memfds (one per
//! region) and lists them in a descriptor memfd; both reach peers over the
//! segment's unix socket in the shm dir (`handout`).
//! An initiator in another process maps what the owner hands out, then
//! copies bytes directly.
//!
//! Nothing another process wrote is trusted: the descriptor words are
//! copied under the seqlock and admitted by one parser
//! ([`desc::parse`]), and each memfd is mapped
//! only after [`desc::admit_region`]
//! checked its seals and size.
//!
//! Every access is checked against the region's bounds and its *live key*:
//! the region's key word in the descriptor (`desc::KEY_WORDS_AT`) holds
//! the key while the region is registered and 0 once the target
//! unregisters it, so a peer with a stale mapping gets `AccessDenied`
//! instead of writing into memory the target has given up. The word is in
//! the write-sealed descriptor, not in the region a peer writes: no peer
//! can put a revoked key back for the others.
//!
//! A worker never waits on the owner: a region the owner published after
//! the peer last mapped its descriptor is fetched (handout round trip,
//! `mmap`, pre-fault) by the peer's refresher thread, which also watches
//! the connection for the owner's death (`peer/refresher.rs`); meanwhile an
//! access to it answers [`Access::Later`].

use std::ffi::c_void;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::Arc;
use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption, Cache};
use rustix::fs::{self as rfs, SeekFrom};
use rustix::mm;
use tent_rings::{ErrorKind, RegionId};

use super::desc::{
    self, DESC_BYTES, DESC_CAPACITY, ENTRY_WORDS, HEADER_WORDS, KEY_WORDS_AT, MAX_REGION_LEN,
    ShmEntry,
};
use super::handout::{self, HandoutClient, HandoutServer, HandoutTable, IO_TIMEOUT};
use crate::memfd::Mapping;
use crate::clock::monotonic_ns;
use crate::error::{Error, Result};
use crate::segment::RemoteRegion;
use crate::worker_ctx::{PerWorker, WorkerCtx};

mod budget;
mod refresher;

pub use budget::MapBudget;
use budget::Charge;
use refresher::{Refresher, Wake};

pub(super) use super::desc::DATA_OFFSET;

/// How long a failed refresh that may pass (the owner slow) answers misses:
/// long enough for every op that waited on it to see it on its next turn
/// and fail typed; after that the next miss asks again (and waits), so a
/// failure long past does not fail a new op without a try.
const FAILED_HOLD_NS: u64 = 100_000_000;

/// A mapping's first words viewed as atomics.
fn words(map: &Mapping, n: usize) -> &[AtomicU64] {
    assert!(map.len() >= n * 8, "mapping shorter than its words");
    // SAFETY: the mapping holds at least n words (checked above), is page aligned, lives as long as `map`, and is only ever accessed through atomics (by us and by the other process), so `[AtomicU64]` is sound.
    unsafe { std::slice::from_raw_parts(map.ptr() as *const AtomicU64, n) }
}

/// Live-key word `slot` of a descriptor mapping (`slot < DESC_CAPACITY`:
/// the owner's own choice, or admitted by `parse`).
fn live_key(desc: &Mapping, slot: u32) -> &AtomicU64 {
    &words(desc, DESC_BYTES / 8)[KEY_WORDS_AT + slot as usize]
}

/// Seqlock writer. `seq` is the owner's own copy of the sequence: nothing
/// is ever read back from the shared words (no peer can write them — the
/// descriptor is write-sealed — but the owner does not rely on it).
fn write_descriptor<'a>(
    desc: &Mapping,
    seq: &mut u64,
    entries: impl ExactSizeIterator<Item = &'a ShmEntry>,
) {
    let w = words(desc, DESC_BYTES / 8);
    // Odd while writing. The Release fence orders the odd store before the
    // entry stores; the final Release store publishes them. Wrapping: 2^63
    // publishes are far off, and even then the parity holds.
    let base = *seq;
    *seq = base.wrapping_add(2);
    w[0].store(base.wrapping_add(1), Ordering::Relaxed);
    fence(Ordering::Release);
    w[1].store(entries.len() as u64, Ordering::Relaxed);
    for (i, e) in entries.enumerate() {
        let base = HEADER_WORDS + i * ENTRY_WORDS;
        w[base].store(u64::from(e.id), Ordering::Relaxed);
        w[base + 1].store(e.base, Ordering::Relaxed);
        w[base + 2].store(e.len, Ordering::Relaxed);
        w[base + 3].store(e.key, Ordering::Relaxed);
        w[base + 4].store(e.handle, Ordering::Relaxed);
        w[base + 5].store(u64::from(e.slot), Ordering::Relaxed);
    }
    w[0].store(*seq, Ordering::Release);
}

/// Copy the descriptor's words consistently (seqlock reader); the copy is
/// then judged by [`desc::parse`], never used raw.
fn read_descriptor(desc: &Mapping) -> Result<(u64, Vec<u64>)> {
    let w = words(desc, DESC_BYTES / 8);
    let mut copy = Vec::with_capacity(HEADER_WORDS);
    for _ in 0..10_000 {
        let s1 = w[0].load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        // Bounded by the capacity whatever the count word says; `parse`
        // refuses a count the copy does not hold.
        let count = usize::try_from(w[1].load(Ordering::Relaxed))
            .unwrap_or(usize::MAX)
            .min(DESC_CAPACITY);
        copy.clear();
        copy.extend(
            w[..HEADER_WORDS + count * ENTRY_WORDS]
                .iter()
                .map(|a| a.load(Ordering::Relaxed)),
        );
        // Acquire fence: the entry loads above happen before the re-check.
        fence(Ordering::Acquire);
        if w[0].load(Ordering::Relaxed) == s1 {
            return Ok((s1, copy));
        }
    }
    Err(Error::new(
        ErrorKind::Unreachable,
        "segment descriptor kept changing while being read",
    ))
}

/// Remove segment sockets in `dir` that nobody serves any more.
fn collect_stale(dir: &str) {
    handout::collect_stale(dir);
}

struct ExportState {
    entries: Vec<(ShmEntry, Arc<Mapping>)>,
    /// Live-key slots no published region holds.
    free_slots: Vec<u32>,
    next_handle: u64,
    /// The descriptor's sequence, kept here (owner-private memory).
    seq: u64,
}

/// This engine's segment, published in shared memory.
pub struct ShmExport {
    name: String,
    desc: Mapping,
    table: Arc<HandoutTable>,
    state: Mutex<ExportState>,
    // Dropped last: peers are hung up on once nothing more is served.
    _server: HandoutServer,
}

impl std::fmt::Debug for ShmExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmExport")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Memory backing an exported region; keeps its memfd mapped.
#[derive(Debug, Clone)]
pub struct ExportedMemory {
    map: Arc<Mapping>,
    fd: Arc<OwnedFd>,
    handle: u64,
}

impl ExportedMemory {
    /// Start of the user-visible bytes.
    pub fn data_ptr(&self) -> *mut u8 {
        self.map.ptr().wrapping_add(DATA_OFFSET)
    }

    /// The sealed memfd behind it (its bytes start at `DATA_OFFSET`).
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

fn mem_err(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::new(ErrorKind::OutOfMemory, what).with_source(e)
}

impl ShmExport {
    /// Publish a new, empty segment: a descriptor memfd served on a fresh
    /// socket in `dir`; with `secret`, peers must prove it first.
    pub fn create(dir: &str, secret: Option<Vec<u8>>) -> Result<ShmExport> {
        collect_stale(dir);
        let name = HandoutServer::fresh_name();
        // Mapped writable here, then write-sealed: peers get a read-only,
        // write-sealed file and can never write what other peers read.
        let (desc, fd) =
            handout::descriptor_memfd(&name, DESC_BYTES).map_err(mem_err("descriptor memfd"))?;
        words(&desc, HEADER_WORDS)[2].store(desc::DESC_MAGIC, Ordering::Release);
        let table = Arc::new(HandoutTable::new(fd, secret));
        let (server, name) = HandoutServer::start(dir, name, table.clone())?;
        tracing::debug!(segment = %name, "shm segment published");
        Ok(ShmExport {
            name,
            desc,
            table,
            state: Mutex::new(ExportState {
                entries: Vec::new(),
                free_slots: (0..DESC_CAPACITY as u32).rev().collect(),
                next_handle: 0,
                seq: 0,
            }),
            _server: server,
        })
    }

    /// The segment name peers open.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Create the sealed memfd for a new region of `len` bytes (not yet
    /// reachable: see [`ShmExport::publish`]); `huge`: advise transparent
    /// huge pages for it (shmem honours that where the kernel's
    /// `shmem_enabled` says `advise`). Always shmem pages: peers refuse a
    /// hugetlbfs file, a hole in which would end them with `SIGBUS`.
    pub fn allocate(&self, len: u64, huge: bool) -> Result<ExportedMemory> {
        if len == 0 || len > MAX_REGION_LEN {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!("region of {len} bytes (shm regions hold 1..={MAX_REGION_LEN})"),
            ));
        }
        let handle = {
            let mut st = self.state.lock();
            st.next_handle += 1;
            st.next_handle
        };
        let size = DATA_OFFSET as u64 + len;
        let fd = handout::sealed_memfd(&format!("{}-r{handle}", self.name), size)
            .map_err(mem_err("region memfd"))?;
        let map = Mapping::map(
            fd.as_fd(),
            usize::try_from(size)
                .map_err(|_| Error::new(ErrorKind::OutOfMemory, "region too large"))?,
            true,
        )
        .map_err(mem_err("map a region memfd"))?;
        if huge && map.len() >= 2 << 20 {
            advise_huge(map.ptr(), map.len());
        }
        // The owner commits its region's pages now (best effort), so they
        // are not faulted in one by one inside the first transfers, and so
        // a peer's prefault, which covers only populated pages, finds them.
        populate(map.ptr(), map.len());
        Ok(ExportedMemory {
            map: Arc::new(map),
            fd: Arc::new(fd),
            handle,
        })
    }

    /// Make an allocated region reachable by peers under `key`.
    pub fn publish(&self, mem: &ExportedMemory, id: RegionId, len: u64, key: u64) -> Result<()> {
        let mut st = self.state.lock();
        if st.entries.len() >= DESC_CAPACITY {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!(
                    "segment {} already exports {DESC_CAPACITY} regions",
                    self.name
                ),
            ));
        }
        // As many slots as entries: a free one exists below the capacity.
        let Some(slot) = st.free_slots.pop() else {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!("segment {}: no live-key slot left", self.name),
            ));
        };
        // Release: a peer that sees the key also sees the zeroed memory.
        live_key(&self.desc, slot).store(key, Ordering::Release);
        let entry = ShmEntry {
            id: id.index(),
            base: mem.data_ptr() as u64,
            len,
            key,
            handle: mem.handle,
            slot,
        };
        self.table.insert(mem.handle, mem.fd.clone());
        st.entries.push((entry, mem.map.clone()));
        let st = &mut *st;
        write_descriptor(&self.desc, &mut st.seq, st.entries.iter().map(|(e, _)| e));
        Ok(())
    }

    /// Withdraw region `id`: its key stops matching at once, then it leaves
    /// the descriptor and is handed out no more.
    pub fn revoke(&self, id: RegionId) {
        let mut st = self.state.lock();
        if let Some(pos) = st.entries.iter().position(|(e, _)| e.id == id.index()) {
            let (e, _map) = st.entries.remove(pos);
            live_key(&self.desc, e.slot).store(0, Ordering::Release);
            st.free_slots.push(e.slot);
            self.table.remove(e.handle);
            let st = &mut *st;
            write_descriptor(&self.desc, &mut st.seq, st.entries.iter().map(|(e, _)| e));
        }
    }

    /// Publish raw descriptor entries as a hostile owner would (tests of the
    /// peer's parser); the published regions stay handed out by handle.
    #[doc(hidden)]
    pub fn forge_descriptor(&self, entries: &[ShmEntry]) {
        let mut st = self.state.lock();
        write_descriptor(&self.desc, &mut st.seq, entries.iter().take(DESC_CAPACITY));
    }

    /// The handle of the published region `id` (tests forge entries naming it).
    #[doc(hidden)]
    pub fn handle_of(&self, id: RegionId) -> Option<u64> {
        self.entry_of(id).map(|e| e.handle)
    }

    /// Store `key` in the live-key word of the published region `id`, as
    /// the owner (the only process that can write it) would (tests of a
    /// key that stops matching while the descriptor still lists it).
    #[doc(hidden)]
    pub fn forge_live_key(&self, id: RegionId, key: u64) {
        if let Some(slot) = self.slot_of(id) {
            live_key(&self.desc, slot).store(key, Ordering::Release);
        }
    }

    /// The live-key slot of the published region `id` (tests forge
    /// entries naming it).
    #[doc(hidden)]
    pub fn slot_of(&self, id: RegionId) -> Option<u32> {
        self.entry_of(id).map(|e| e.slot)
    }

    /// The descriptor entry of the published region `id`.
    fn entry_of(&self, id: RegionId) -> Option<ShmEntry> {
        let st = self.state.lock();
        st.entries
            .iter()
            .find(|(e, _)| e.id == id.index())
            .map(|(e, _)| *e)
    }
}

struct PeerRegion {
    id: RegionId,
    base: u64,
    len: u64,
    key: u64,
    handle: u64,
    slot: u32,
    data: *mut u8,
    map: Arc<Mapping>,
    /// The mapping's bytes, held against the engine's [`MapBudget`] for
    /// as long as a table holds the mapping.
    charge: Arc<Charge>,
    /// Its live-key word, in `desc`.
    live: *const AtomicU64,
    desc: Arc<Mapping>,
}

#[derive(Default)]
struct PeerTable {
    seq: u64,
    regions: Vec<PeerRegion>,
}

// SAFETY: `data` points into `map` and `live` into `desc`, which the table
// keeps alive; the table is immutable once built, only bytes are copied
// through `data` and `live` is only loaded atomically.
unsafe impl Send for PeerTable {}
// SAFETY: as above.
unsafe impl Sync for PeerTable {}

/// The latest refresh that failed, against the descriptor sequence it read.
struct Failed {
    seq: u64,
    /// What an access that misses in the old view answers: the refresh's
    /// own kind when it may pass (`Timeout`, `Unreachable`) or a mapping
    /// cap refused it (`OutOfMemory`), else (`None`) the miss's lookup
    /// error.
    answer: Option<ErrorKind>,
    /// May pass: once [`FAILED_HOLD_NS`] past `at_ns`, the next miss asks
    /// for another refresh. Refused (the descriptor, or a region memfd,
    /// failed admission, or its regions exceed the per-peer cap): not
    /// re-read until the sequence moves.
    retry: bool,
    /// When it failed (monotonic ns).
    at_ns: u64,
}

/// What an access that missed in the current view does next.
enum Miss {
    /// The view changed since the lookup: look again.
    Retry,
    /// A refresh is on its way: not yet.
    Later,
    /// Nothing newer to see, or the refresh of what is newer failed.
    Fail(ErrorKind),
}

/// What [`ShmPeer::with_remote`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Access<R> {
    /// The closure ran on the checked memory: its result.
    Done(R),
    /// Not yet, and not a fault: the owner published regions this peer has
    /// not mapped yet, and its refresher is fetching them (nobody waits).
    /// Ask again later.
    Later,
}

/// A peer's state, shared with its refresher thread.
struct PeerState {
    name: String,
    /// The owner's descriptor (read-only, write-sealed); every table's
    /// regions hold it too, for their live-key words.
    desc: Arc<Mapping>,
    /// The connection to the owner: region handout and liveness.
    owner: HandoutClient,
    /// True once the owner is seen gone (by the refresher, which watches
    /// the connection); read on every access.
    owner_gone: AtomicBool,
    table: ArcSwap<PeerTable>,
    refresh: Mutex<()>,
    failed: ArcSwapOption<Failed>,
    /// Refused descriptors seen (only the first is a warning).
    refusals: AtomicU64,
    /// What this peer may map, and its engine's other peers with it.
    budget: Arc<MapBudget>,
    /// Refreshes refused over a mapping cap (only the first is a warning).
    over_cap: AtomicU64,
    wake: Wake,
}

/// Another process's segment, mapped into this one. Its refresher thread
/// (see `peer/refresher.rs`) maps what the owner publishes later and
/// watches the owner; [`ShmPeer::stop`] (a closed segment) ends it, and
/// dropping the peer stops and joins it.
pub struct ShmPeer {
    state: Arc<PeerState>,
    /// Each worker's own view of `state.table` (see [`ShmPeer::for_workers`]);
    /// none until the engine asks.
    views: Option<PerWorker<WorkerView>>,
    refresher: Refresher,
}

/// A worker's view of a peer's table: an `arc_swap::Cache`, which sees
/// whether the table changed with one Acquire load of its pointer instead of
/// the shared `load()` (a thread-local debt slot and a locked swap per
/// slice: 8% of an 8 B shm WRITE's worker time). It holds the table it last
/// saw, so the mappings of a table the refresher replaced live until this
/// worker's next access to the peer, or the peer's drop.
type TableView = Cache<TableSource, Arc<PeerTable>>;

/// One worker's view of a peer: its [`TableView`], and the region its last
/// access hit. A run of small ops to one region (the common case: a KV
/// block, a parameter shard) then checks that the view still holds the
/// table the memo came from (the shared pointer, two loads from the cell),
/// the bounds and the region's live key (one load from the cell), where a
/// lookup walks a chain of eight dependent loads (table, region array,
/// binary search, region, mapping, key): 8 B WRITEs spent a fifth of the
/// worker's time at the end of that chain.
struct WorkerView {
    table: TableView,
    last: Option<RegionHit>,
}

/// A region of one table, as a lookup found it: what an access to it
/// checks, by value (a worker's view keeps the last one). Its pointers are
/// into that table's mappings, so they are used only while the table is
/// held (a view checks it still holds that very table, by address).
#[derive(Clone, Copy)]
struct RegionHit {
    table: *const PeerTable,
    base: u64,
    len: u64,
    data: *mut u8,
    key: u64,
    live: *const AtomicU64,
}

// SAFETY: plain addresses into a table's mappings, which are shared memory
// (`PeerTable` is Send + Sync); whichever thread holds the view reads
// through them only while the view holds that table.
unsafe impl Send for RegionHit {}

impl RegionHit {
    fn of(table: &PeerTable, r: &PeerRegion) -> RegionHit {
        RegionHit {
            table,
            base: r.base,
            len: r.len,
            data: r.data,
            key: r.key,
            live: r.live,
        }
    }

    /// Is `addr` in this region of `table`?
    #[inline]
    fn covers(&self, table: &PeerTable, addr: u64) -> bool {
        std::ptr::eq(self.table, table) && addr.checked_sub(self.base).is_some_and(|o| o < self.len)
    }

    /// `[addr, addr + len)` in the region, once the bounds hold and its
    /// live key equals `key` (`OutOfBounds`, `AccessDenied`, in that order).
    ///
    /// # Safety
    /// The table this was found in is alive (the caller holds it), and
    /// `addr` is in the region ([`covers`](Self::covers), or `find`).
    #[inline]
    unsafe fn access(&self, addr: u64, len: u64, key: u64) -> Result<*mut u8, ErrorKind> {
        let off = addr - self.base;
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(ErrorKind::OutOfBounds);
        }
        // SAFETY: `live` is a word of the descriptor mapping the table holds, and the table is alive (caller).
        let live = unsafe { &*self.live };
        // Acquire pairs with the target's Release in publish/revoke.
        if live.load(Ordering::Acquire) != key {
            return Err(ErrorKind::AccessDenied);
        }
        Ok(self.data.wrapping_add(off as usize))
    }
}

impl WorkerView {
    fn new(state: &Arc<PeerState>) -> WorkerView {
        WorkerView {
            table: Cache::new(TableSource(state.clone())),
            last: None,
        }
    }

    /// `lookup` in this worker's newest view of the table, answered from
    /// the last hit when it is in the same region of the same table.
    #[inline]
    fn lookup(&mut self, addr: u64, len: u64) -> Result<*mut u8, ErrorKind> {
        let table: &PeerTable = self.table.load();
        let hit = match self.last {
            Some(h) if h.covers(table, addr) => h,
            _ => {
                // Forgotten before the lookup, whatever it finds: a memo
                // outlives the table it names only until the view's next
                // access, which is this one. (A later table may be
                // allocated where a dropped one was; the view drops a
                // table only while loading its successor, which already
                // has another address, so `covers` cannot mistake one for
                // the other while this holds.)
                self.last = None;
                let r = find(table, addr).ok_or(ErrorKind::AddressNotRegistered)?;
                let h = RegionHit::of(table, r);
                self.last = Some(h);
                h
            }
        };
        // SAFETY: the view holds `table`, the one `hit` was found in (`covers` or just now), and `addr` is in the region.
        unsafe { hit.access(addr, len, hit.key) }
    }
}

/// A peer's table as one thread that is not a worker sees it
/// ([`ShmPeer::thread_view`]).
pub(crate) struct ThreadView(WorkerView);

/// What a [`TableView`] reads: the peer's shared table.
struct TableSource(Arc<PeerState>);

impl std::ops::Deref for TableSource {
    type Target = ArcSwap<PeerTable>;

    fn deref(&self) -> &ArcSwap<PeerTable> {
        &self.0.table
    }
}

impl std::fmt::Debug for ShmPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPeer")
            .field("name", &self.state.name)
            .field("owner_pid", &self.state.owner.owner_pid())
            .finish_non_exhaustive()
    }
}

impl ShmPeer {
    /// The segment is closed and no worker uses it any more: end the
    /// refresher thread now, on this (API) thread, so the peer's last drop
    /// joins nothing, wherever it happens. Waits for the thread to end,
    /// boundedly; `false` if it did not (the drop joins it then).
    pub(crate) fn stop(&self) -> bool {
        self.refresher.stop()
    }

    /// Has the refresher thread ended?
    pub fn refresher_finished(&self) -> bool {
        self.refresher.finished()
    }

    /// Connect to the segment called `name` served in `dir` (proving
    /// `secret` when set), map what it exports, and start its refresher;
    /// mapping within caps derived from the address space, as the keys'
    /// defaults are ([`MapBudget::from_config`]).
    pub fn attach(dir: &str, name: &str, secret: Option<&[u8]>) -> Result<ShmPeer> {
        let budget = MapBudget::from_config(&crate::config::ShmConfig::default());
        Self::attach_within(dir, name, secret, &Arc::new(budget))
    }

    /// [`attach`](Self::attach), mapping only what `budget` allows: a
    /// descriptor whose regions need more than its per-peer cap, or more
    /// than is left of its total, is refused `OutOfMemory` with nothing of
    /// it mapped.
    pub fn attach_within(
        dir: &str,
        name: &str,
        secret: Option<&[u8]>,
        budget: &Arc<MapBudget>,
    ) -> Result<ShmPeer> {
        let (owner, desc) = HandoutClient::connect(dir, name, secret)?;
        let wake = Wake::new().map_err(mem_err("shm refresher eventfd"))?;
        let state = Arc::new(PeerState {
            name: name.to_owned(),
            desc: Arc::new(desc),
            owner,
            owner_gone: AtomicBool::new(false),
            table: ArcSwap::from_pointee(PeerTable::default()),
            refresh: Mutex::new(()),
            failed: ArcSwapOption::empty(),
            refusals: AtomicU64::new(0),
            budget: budget.clone(),
            over_cap: AtomicU64::new(0),
            wake,
        });
        state.refresh(true, Instant::now() + IO_TIMEOUT)?;
        let refresher = Refresher::start(state.clone())?;
        Ok(ShmPeer {
            state,
            views: None,
            refresher,
        })
    }

    /// The same peer with a view of its table for each of `workers` engine
    /// workers, which [`with_remote_on`](Self::with_remote_on) reads: the
    /// engine's workers then look the table up with no shared write.
    pub(crate) fn for_workers(mut self, workers: usize) -> ShmPeer {
        let state = &self.state;
        self.views = Some(PerWorker::new(workers, |_| WorkerView::new(state)));
        self
    }

    /// Pid of the process that exported the segment, as this process's pid
    /// namespace sees it (0 when it cannot); informational only.
    pub(crate) fn owner_pid(&self) -> u32 {
        u32::try_from(self.state.owner.owner_pid()).unwrap_or(0)
    }

    /// Is the owner still serving the segment?
    pub fn owner_alive(&self) -> bool {
        !self.state.owner_gone() && !self.state.owner.owner_gone()
    }

    /// The regions the peer exports now (re-read here, on the calling
    /// thread, if the owner published since).
    pub fn regions(&self) -> Vec<RemoteRegion> {
        let _ = self.state.refresh_if_changed(IO_TIMEOUT);
        self.state
            .table
            .load()
            .regions
            .iter()
            .map(|r| RemoteRegion {
                id: r.id,
                addr: r.base,
                len: r.len,
            })
            .collect()
    }

    /// Run `f` on the peer memory at `[addr, addr+len)` after checking
    /// bounds and the live key. The mapping stays valid while `f` runs.
    ///
    /// Never waits: when the address is in none of the regions mapped but
    /// the owner published since, the refresher is asked to map them and
    /// the answer is [`Access::Later`]; once that refresh has run, the
    /// access succeeds or fails with what it found.
    ///
    /// # Errors
    /// `ProcessFailed` once the owner hung up; `AddressNotRegistered`,
    /// `OutOfBounds`, `AccessDenied` (the key no longer matches) when the
    /// newest view says so; `Timeout` or `Unreachable` when the refresh
    /// that would have shown it could not reach the owner.
    #[inline]
    pub fn with_remote<R>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<Access<R>, ErrorKind> {
        let s = &*self.state;
        // Relaxed: a late view only lets one more copy land in the orphan
        // mapping, which harms nobody (its owner is gone).
        if s.owner_gone() {
            return Err(ErrorKind::ProcessFailed);
        }
        let table = s.table.load();
        let (looked, e) = match lookup(&table, addr, len) {
            Ok(ptr) => return Ok(Access::Done(f(ptr))),
            Err(e) => (table.seq, e),
        };
        drop(table);
        match s.on_miss(looked, e) {
            Miss::Retry => lookup(&s.table.load(), addr, len).map(|ptr| Access::Done(f(ptr))),
            Miss::Later => Ok(Access::Later),
            Miss::Fail(kind) => Err(kind),
        }
    }

    /// [`with_remote`](Self::with_remote) from an engine worker: the hit
    /// reads the worker's own view of the table (one pointer load when the
    /// table has not changed); a miss, or a peer built without
    /// [`for_workers`](Self::for_workers), takes `with_remote`'s path,
    /// which sees the newest table and asks the refresher.
    #[inline]
    pub(crate) fn with_remote_on<R>(
        &self,
        ctx: &WorkerCtx,
        addr: u64,
        len: u64,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<Access<R>, ErrorKind> {
        if let Some(views) = &self.views
            && ctx.index() < views.workers()
            && !self.state.owner_gone()
            && let Ok(mut view) = views.get(ctx)
            && let Ok(ptr) = view.lookup(addr, len)
        {
            // The view holds the table, and so the mapping, while `f` runs.
            return Ok(Access::Done(f(ptr)));
        }
        self.with_remote(addr, len, f)
    }

    /// A view of this peer's table for one thread that is not a worker (a
    /// ring issuing ops inline): what a worker's own view is, kept by the
    /// caller between accesses.
    pub(crate) fn thread_view(&self) -> ThreadView {
        ThreadView(WorkerView::new(&self.state))
    }

    /// Is `view` one of this peer's table?
    pub(crate) fn owns_view(&self, view: &ThreadView) -> bool {
        std::ptr::eq(view.0.table.arc_swap(), &self.state.table)
    }

    /// [`with_remote`](Self::with_remote) through `view`: the hit reads
    /// the view, as [`with_remote_on`](Self::with_remote_on) does a
    /// worker's; a miss, or a view of another peer, takes `with_remote`'s
    /// path.
    #[inline]
    pub(crate) fn with_remote_in<R>(
        &self,
        view: &mut ThreadView,
        addr: u64,
        len: u64,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<Access<R>, ErrorKind> {
        if std::ptr::eq(view.0.table.arc_swap(), &self.state.table)
            && !self.state.owner_gone()
            && let Ok(ptr) = view.0.lookup(addr, len)
        {
            // The view holds the table, and so the mapping, while `f` runs.
            return Ok(Access::Done(f(ptr)));
        }
        self.with_remote(addr, len, f)
    }

    /// The key this initiator holds for the region containing `addr` (tests
    /// use it to present a wrong one).
    pub fn key_of(&self, addr: u64) -> Option<u64> {
        let t = self.state.table.load();
        find(&t, addr).map(|r| r.key)
    }

    /// Check an explicit key against the region holding `addr`: the target's
    /// live key must equal `key`.
    pub fn check_key(&self, addr: u64, len: u64, key: u64) -> Result<(), ErrorKind> {
        let t = self.state.table.load();
        let r = find(&t, addr).ok_or(ErrorKind::AddressNotRegistered)?;
        // SAFETY: `t` holds the table `r` is in, and `find` put `addr` in it.
        unsafe { RegionHit::of(&t, r).access(addr, len, key) }?;
        // A zero key is no key: a revoked region's live key is zero too.
        if key == 0 {
            return Err(ErrorKind::AccessDenied);
        }
        Ok(())
    }
}

impl PeerState {
    fn owner_gone(&self) -> bool {
        self.owner_gone.load(Ordering::Relaxed)
    }

    /// The refresher saw the owner hang up (it died, or withdrew the
    /// segment): every access fails `ProcessFailed` from now on instead of
    /// landing in a mapping nobody serves.
    fn owner_hung_up(&self) {
        tracing::warn!(segment = %self.name, "shm segment owner hung up: ProcessFailed from now on");
        self.owner_gone.store(true, Ordering::Relaxed);
    }

    /// The descriptor's sequence as the owner last published it.
    fn published_seq(&self) -> u64 {
        // Acquire: pairs with the owner's Release publish (the seqlock);
        // the value is only compared here, the words are read under the
        // seqlock by `refresh`.
        words(&self.desc, 1)[0].load(Ordering::Acquire)
    }

    /// An access missed in the view of sequence `looked` with `e`: the
    /// worker's slow path. Nothing here waits: at most one eventfd write.
    #[cold]
    fn on_miss(&self, looked: u64, e: ErrorKind) -> Miss {
        let seq = self.published_seq();
        if seq == looked {
            return Miss::Fail(e);
        }
        if self.table.load().seq == seq {
            // Refreshed since the lookup.
            return Miss::Retry;
        }
        if let Some(f) = self.failed.load().as_deref()
            && f.seq == seq
            && (!f.retry || monotonic_ns().saturating_sub(f.at_ns) < FAILED_HOLD_NS)
        {
            return Miss::Fail(f.answer.unwrap_or(e));
        }
        self.wake.request();
        Miss::Later
    }

    /// Was descriptor `seq` refused (not to be re-read until it moves)?
    fn refused(&self, seq: u64) -> bool {
        self.failed
            .load()
            .as_deref()
            .is_some_and(|f| f.seq == seq && !f.retry)
    }

    /// Re-read the descriptor if its sequence moved (and was not refused),
    /// waiting at most `wait` for another refresher or the owner (an API
    /// thread).
    fn refresh_if_changed(&self, wait: Duration) -> Result<bool> {
        let seq = self.published_seq();
        if seq == self.table.load().seq || self.refused(seq) {
            return Ok(false);
        }
        self.refresh(false, Instant::now() + wait)?;
        Ok(true)
    }

    /// The refresh lock, waited for until `deadline` at most (`Timeout`):
    /// an API thread does not queue behind a refresher stuck on a slow
    /// owner for longer than it said it would wait.
    fn lock_refresh(&self, deadline: Instant) -> Result<MutexGuard<'_, ()>> {
        self.refresh.try_lock_until(deadline).ok_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                "another refresh of the shm segment is in progress",
            )
        })
    }

    /// Re-read the descriptor and map regions that are new, by `deadline`;
    /// then pre-fault the pages of the new ones that the owner populated.
    /// Runs on an API thread (attach, `regions`) or on the refresher, never
    /// on a worker. `force` reads the descriptor even if its sequence did
    /// not move (attach: the parser must see it once). A refused descriptor
    /// (or region) leaves the old view in place and is not re-read until
    /// the sequence moves; a failure that may pass (the owner slow, a memfd
    /// that could not travel) is retried on the next miss. Either is
    /// recorded against the sequence read, for the misses that wait on it.
    fn refresh(&self, force: bool, deadline: Instant) -> Result<()> {
        let g = self.lock_refresh(deadline)?;
        let (seq, words) = match read_descriptor(&self.desc) {
            Ok(r) => r,
            // Kept changing (or odd): recorded against what a miss sees.
            Err(e) => return Err(self.failed(self.published_seq(), e)),
        };
        let old = self.table.load_full();
        if !force && (seq == old.seq || self.refused(seq)) {
            // Another refresher got there while we waited, or nothing new.
            return Ok(());
        }
        let entries = desc::parse(&words)
            .map_err(|e| self.failed(seq, Error::invalid(format!("segment {}: {e}", self.name))))?;
        let kept: Vec<Option<&PeerRegion>> = entries
            .iter()
            .map(|e| {
                old.regions.iter().find(|r| {
                    r.key == e.key
                        && r.base == e.base
                        && r.len == e.len
                        && r.handle == e.handle
                        && r.slot == e.slot
                })
            })
            .collect();
        // Every region of the new table costs its whole mapping, populated
        // or not; the new ones are reserved before any is mapped.
        let (mut need, mut new_bytes) = (Some(0u64), Some(0u64));
        for (e, k) in entries.iter().zip(&kept) {
            let cost = mapped_len(e);
            need = need.zip(cost).and_then(|(n, c)| n.checked_add(c));
            if k.is_none() {
                new_bytes = new_bytes.zip(cost).and_then(|(n, c)| n.checked_add(c));
            }
        }
        self.budget
            .check_peer(&self.name, need.unwrap_or(u64::MAX))
            .map_err(|err| self.over_cap(seq, err, false))?;
        let mut reserved = self
            .budget
            .reserve(&self.name, new_bytes.unwrap_or(u64::MAX))
            .map_err(|err| self.over_cap(seq, err, true))?;
        let mut regions = Vec::with_capacity(entries.len());
        let mut fresh = Vec::new();
        for (e, k) in entries.into_iter().zip(kept) {
            if let Some(r) = k {
                regions.push(PeerRegion {
                    id: r.id,
                    base: r.base,
                    len: r.len,
                    key: r.key,
                    handle: r.handle,
                    slot: r.slot,
                    data: r.data,
                    map: r.map.clone(),
                    charge: r.charge.clone(),
                    live: r.live,
                    desc: r.desc.clone(),
                });
                continue;
            }
            let handed = match self.owner.region(
                e.handle,
                |size, seals| desc::admit_region(&e, size, seals),
                deadline,
            ) {
                Ok(Some(h)) => h,
                // Revoked between the descriptor read and the request.
                Ok(None) => continue,
                Err(err) => return Err(self.failed(seq, err)),
            };
            let map = Arc::new(handed.map);
            // Reserved above: `mapped_len` of every new entry.
            let charge = Arc::new(reserved.split_off(mapped_len(&e).unwrap_or(u64::MAX)));
            fresh.push((handed.fd, map.clone(), e.len));
            let data = map.ptr().wrapping_add(DATA_OFFSET);
            regions.push(PeerRegion {
                id: RegionId::from_parts(0, e.id),
                base: e.base,
                len: e.len,
                key: e.key,
                handle: e.handle,
                slot: e.slot,
                data,
                map,
                charge,
                // `parse` admitted `slot < DESC_CAPACITY`.
                live: live_key(&self.desc, e.slot),
                desc: self.desc.clone(),
            });
        }
        // What was reserved for regions revoked meanwhile goes back.
        drop(reserved);
        // `parse` sorted them by base and proved them disjoint.
        self.table.store(Arc::new(PeerTable { seq, regions }));
        drop(g);
        // After publishing: an op on a large new region does not wait for
        // its pre-fault (pages it touches first fault in as they would).
        for (fd, map, len) in fresh {
            prefault_populated(fd.as_fd(), &map, len, || self.wake.stopped());
        }
        Ok(())
    }

    /// Record that the refresh of descriptor `seq` failed with `err` (for
    /// the misses waiting on it) and log it: a refusal (the owner's fault,
    /// `InvalidArgument`) as a warning the first time, debug after that;
    /// anything else rate-limited. Returns `err`.
    fn failed(&self, seq: u64, err: Error) -> Error {
        let kind = err.kind();
        let retry = kind != ErrorKind::InvalidArgument;
        let answer = matches!(kind, ErrorKind::Timeout | ErrorKind::Unreachable).then_some(kind);
        if retry {
            crate::lograte::warn_limited!(
                (self.name.as_str(), kind.code()),
                segment = %self.name,
                error = %err,
                "shm segment refresh failed; retried on the next miss"
            );
        } else if self.refusals.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(segment = %self.name, error = %err, "shm segment descriptor refused; keeping the previous view");
        } else {
            tracing::debug!(segment = %self.name, error = %err, "shm segment descriptor refused again");
        }
        self.record(seq, answer, retry);
        err
    }

    /// Record that the refresh of descriptor `seq` was refused over a
    /// mapping cap (`err`, `OutOfMemory`, says which, with the figures):
    /// misses on its new regions answer `OutOfMemory`; `retry` when room
    /// may come back (the total: other peers unmap), else the descriptor is
    /// not re-read until its sequence moves. A warning the first time,
    /// debug after that. Returns `err`.
    #[cold]
    fn over_cap(&self, seq: u64, err: Error, retry: bool) -> Error {
        if self.over_cap.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                segment = %self.name,
                per_peer = self.budget.per_peer(),
                total = self.budget.total(),
                mapped = self.budget.mapped(),
                error = %err,
                "shm segment refused over a mapping cap: its new regions are not mapped"
            );
        } else {
            tracing::debug!(segment = %self.name, error = %err, "shm segment refused over a mapping cap again");
        }
        self.record(seq, Some(err.kind()), retry);
        err
    }

    /// Keep descriptor `seq`'s failure for the misses that wait on it.
    fn record(&self, seq: u64, answer: Option<ErrorKind>, retry: bool) {
        self.failed.store(Some(Arc::new(Failed {
            seq,
            answer,
            retry,
            at_ns: monotonic_ns(),
        })));
    }
}

/// The bytes of address space a region's mapping takes: its length and the
/// page before it (`None` past `u64`, which `parse`'s bounds rule out).
fn mapped_len(e: &ShmEntry) -> Option<u64> {
    e.len.checked_add(DATA_OFFSET as u64)
}

fn find(t: &PeerTable, addr: u64) -> Option<&PeerRegion> {
    let idx = t.regions.partition_point(|r| r.base <= addr);
    idx.checked_sub(1)
        .map(|i| &t.regions[i])
        .filter(|r| addr - r.base < r.len)
}

#[inline]
fn lookup(t: &PeerTable, addr: u64, len: u64) -> Result<*mut u8, ErrorKind> {
    let r = find(t, addr).ok_or(ErrorKind::AddressNotRegistered)?;
    // SAFETY: the caller holds `t`, the table `r` is in, and `find` put `addr` in it.
    unsafe { RegionHit::of(t, r).access(addr, len, r.key) }
}

/// Best effort: advise transparent huge pages for a live shared mapping
/// (shmem honours it where `shmem_enabled` is `advise` or `always`).
fn advise_huge(ptr: *mut u8, len: usize) {
    // SAFETY: callers pass a whole live mapping of a memfd; MADV_HUGEPAGE changes no bytes.
    let rc = unsafe { mm::madvise(ptr.cast::<c_void>(), len, mm::Advice::LinuxHugepage) };
    if rc.is_err() {
        tracing::trace!("madvise(MADV_HUGEPAGE) failed; base pages");
    }
}

/// Map `len` bytes at `ptr` writable now rather than fault them in one by
/// one inside the first transfers (best effort; Linux >= 5.14).
fn populate(ptr: *mut u8, len: usize) {
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = ptr as usize + len;
    if end <= start {
        return;
    }
    // SAFETY: callers pass a range inside a live shared mapping of a memfd; MADV_POPULATE_WRITE only pre-faults pages, it changes no bytes.
    let rc = unsafe { mm::madvise(start as *mut c_void, end - start, mm::Advice::LinuxPopulateWrite) };
    if rc.is_err() {
        tracing::trace!("madvise(MADV_POPULATE_WRITE) failed; pages fault in lazily");
    }
}

/// Pre-fault, in the peer, only the pages of a region that its owner has
/// populated (data extents found with `SEEK_DATA`/`SEEK_HOLE` over the
/// memfd), never the length it merely declares: a peer commits no memory
/// on an owner's behalf. At most `MAX_EXTENTS` extents are walked, in
/// chunks of `CHUNK` bytes; it gives up as soon as `stop` says so (the
/// peer is being dropped and waits for this).
fn prefault_populated(fd: BorrowedFd<'_>, map: &Mapping, len: u64, stop: impl Fn() -> bool) {
    const MAX_EXTENTS: usize = 4096;
    const CHUNK: u64 = 16 << 20;
    let start = DATA_OFFSET as u64;
    // `len` was admitted: at most MAX_REGION_LEN and inside the mapping.
    let end = start + len;
    let mut off = start;
    for _ in 0..MAX_EXTENTS {
        if off >= end {
            break;
        }
        // lseek moves only this file description's offset, which nothing
        // else uses; ENXIO: no data past `off`.
        let data = match rfs::seek(fd, SeekFrom::Data(off)) {
            Ok(data) if data < end => data,
            _ => break,
        };
        let hole = rfs::seek(fd, SeekFrom::Hole(data)).map_or(end, |hole| hole.min(end));
        // data < hole <= end <= the mapping's length (admitted).
        let mut at = data;
        while at < hole {
            if stop() {
                return;
            }
            let n = (hole - at).min(CHUNK);
            populate(map.ptr().wrapping_add(at as usize), n as usize);
            at += n;
        }
        off = hole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_ctx::EngineId;

    fn tmpdir(tag: &str) -> String {
        let d = format!("/tmp/tent-shm-view-{tag}-{}", std::process::id());
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An export in its own directory with one 4 KiB region published (id
    /// 1, key 42), a peer of it with views for `workers` workers, and
    /// worker `index`'s context.
    struct OneRegion {
        dir: String,
        export: ShmExport,
        mem: ExportedMemory,
        peer: ShmPeer,
        ctx: WorkerCtx,
        /// The region's address, as the peer sees it.
        addr: u64,
    }

    fn one_region(tag: &str, workers: usize, index: usize) -> OneRegion {
        let dir = tmpdir(tag);
        let export = ShmExport::create(&dir, None).unwrap();
        let mem = export.allocate(4096, true).unwrap();
        export.publish(&mem, RegionId(1), 4096, 42).unwrap();
        let peer = ShmPeer::attach(&dir, export.name(), None)
            .unwrap()
            .for_workers(workers);
        // SAFETY: a fresh engine id: no other context for it exists.
        let ctx = unsafe { WorkerCtx::new(EngineId::next(), index) };
        let addr = peer.regions()[0].addr;
        OneRegion {
            dir,
            export,
            mem,
            peer,
            ctx,
            addr,
        }
    }

    /// Through a worker's view, the answers are the shared path's: a
    /// region published after the view was made is reached, and a region
    /// the owner revoked is refused (the live key sits in the mapping, not
    /// in the view).
    #[test]
    fn a_worker_view_follows_the_peer_table() {
        let OneRegion {
            dir,
            export,
            mem: _mem,
            peer,
            ctx,
            addr: a,
        } = one_region("follow", 2, 1);
        assert_eq!(peer.with_remote_on(&ctx, a, 8, |_| 7), Ok(Access::Done(7)));

        let mem2 = export.allocate(4096, true).unwrap();
        export.publish(&mem2, RegionId(2), 4096, 43).unwrap();
        let b = loop {
            // `regions` refreshes on this thread when the owner published.
            if let Some(r) = peer.regions().iter().find(|r| r.id == RegionId(2)) {
                break r.addr;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(peer.with_remote_on(&ctx, b, 8, |_| 8), Ok(Access::Done(8)));

        // Revoked: the view's table still maps the region, and its live
        // key (0 now) refuses the access; the miss then waits on the
        // refresh (`Later`) and ends refused, never done.
        export.revoke(RegionId(1));
        let t0 = Instant::now();
        let r = loop {
            match peer.with_remote_on(&ctx, a, 8, |_| 9) {
                Ok(Access::Later) if t0.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                r => break r,
            }
        };
        assert!(
            matches!(
                r,
                Err(ErrorKind::AccessDenied | ErrorKind::AddressNotRegistered)
            ),
            "{r:?}"
        );
        // A worker index without a view takes the shared path.
        // SAFETY: a fresh engine id: no other context for it exists.
        let other = unsafe { WorkerCtx::new(EngineId::next(), 5) };
        assert_eq!(
            peer.with_remote_on(&other, b, 8, |_| 1),
            Ok(Access::Done(1))
        );
        drop(peer);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The last hit a view remembers answers only what the full lookup
    /// would: bounds are checked against its region, an address past it
    /// is looked up afresh, and the live key is read at every access, so
    /// a revoke refuses the very next one.
    #[test]
    fn a_worker_view_s_last_hit_keeps_every_check() {
        let OneRegion {
            dir,
            export,
            mem: _mem,
            peer,
            ctx,
            addr: a,
        } = one_region("memo", 1, 0);
        let Ok(Access::Done(base)) = peer.with_remote_on(&ctx, a, 8, |p| p) else {
            panic!("the published region is reached");
        };
        // Answered by the memo: the same region, the right place in it.
        assert_eq!(
            peer.with_remote_on(&ctx, a + 4088, 8, |p| p),
            Ok(Access::Done(base.wrapping_add(4088)))
        );
        for (addr, len, kind) in [
            (a + 4089, 8, ErrorKind::OutOfBounds),
            (a + 8, u64::MAX, ErrorKind::OutOfBounds),
            (a + 4096, 8, ErrorKind::AddressNotRegistered),
            (a.wrapping_sub(1), 8, ErrorKind::AddressNotRegistered),
        ] {
            assert_eq!(
                peer.with_remote_on(&ctx, addr, len, |_| ()),
                Err(kind),
                "{addr:#x}+{len}"
            );
            // And the region is still reached after the miss.
            assert_eq!(peer.with_remote_on(&ctx, a, 8, |_| 1), Ok(Access::Done(1)));
        }
        // The memo holds the key it saw; the live key is read each time.
        export.revoke(RegionId(1));
        let r = peer.with_remote_on(&ctx, a, 8, |_| 2);
        assert!(
            matches!(r, Ok(Access::Later) | Err(ErrorKind::AccessDenied)),
            "{r:?}"
        );
        drop(peer);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A peer must be able to write a region's bytes, so nothing that
    /// guards the region may sit in them. The live keys were the first
    /// word of each region memfd: a second peer that stored the revoked
    /// key back (it is in the descriptor) kept every other peer writing
    /// into memory the owner had unregistered, with success CQEs. They are
    /// in the write-sealed descriptor now; what a peer writes into the
    /// region's reserved page changes nothing.
    #[test]
    fn a_peer_cannot_put_a_revoked_key_back_for_the_others() {
        let OneRegion {
            dir,
            export,
            mem: _mem,
            peer,
            ctx,
            addr: a,
        } = one_region("forge-key", 1, 0);
        let hostile = ShmPeer::attach(&dir, export.name(), None).unwrap();
        assert!(matches!(
            peer.with_remote_on(&ctx, a, 8, |_| ()),
            Ok(Access::Done(()))
        ));
        // Everything the hostile peer mapped of the region, before the revoke.
        let map = hostile.state.table.load().regions[0].map.clone();
        export.revoke(RegionId(1));
        // It writes the old key (42) over every word of the reserved page.
        let reserved = words(&map, DATA_OFFSET / 8);
        for w in reserved {
            w.store(42, Ordering::Release);
        }
        for _ in 0..50 {
            let r = peer.with_remote_on(&ctx, a, 8, |_| ());
            assert!(
                !matches!(r, Ok(Access::Done(()))),
                "an honest peer still writes into a revoked region: {r:?}"
            );
            let r = peer.with_remote(a, 8, |_| ());
            assert!(!matches!(r, Ok(Access::Done(()))), "{r:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
        drop((peer, hostile));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
