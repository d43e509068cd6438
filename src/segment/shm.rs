//! The shared-memory face of a segment.
//!
//! A target exports its engine-allocated regions as sealed memfds (one per
//! region) and lists them in a descriptor memfd; both reach peers over the
//! segment's unix socket in the shm dir (`shm_handout`).
//! An initiator in another process maps what the owner hands out, then
//! copies bytes directly.
//!
//! Nothing another process wrote is trusted: the descriptor words are
//! copied under the seqlock and admitted by one parser
//! ([`shm_desc::parse`]), and each memfd is mapped
//! only after [`shm_desc::admit_region`]
//! checked its seals and size.
//!
//! Every access is checked against the region's bounds and its *live key*:
//! the first word of each region memfd holds the key while the region is
//! registered and 0 once the target unregisters it, so a peer with a stale
//! mapping gets `AccessDenied` instead of writing into memory the target has
//! given up.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tent_rings::{ErrorKind, RegionId};

use super::shm_desc::{
    self, DESC_BYTES, DESC_CAPACITY, ENTRY_WORDS, HEADER_WORDS, MAX_REGION_LEN, ShmEntry,
};
use super::shm_handout::{self, HandoutClient, HandoutServer, HandoutTable, IO_TIMEOUT, Mapping};
use crate::error::{Error, Result};

pub use super::shm_desc::DATA_OFFSET;

/// How long a refresh that a worker's miss triggers may wait, for another
/// refresher or for the owner's answers, before the op fails typed.
const WORKER_REFRESH_WAIT: Duration = Duration::from_millis(100);

/// A region as a peer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Region id in the owner's engine.
    pub id: RegionId,
    /// Start address in the owner's address space (what remote offsets name).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A mapping's first words viewed as atomics.
fn words(map: &Mapping, n: usize) -> &[AtomicU64] {
    assert!(map.len() >= n * 8, "mapping shorter than its words");
    // SAFETY: the mapping holds at least n words (checked above), is page aligned, lives as long as `map`, and is only ever accessed through atomics (by us and by the other process), so `[AtomicU64]` is sound.
    unsafe { std::slice::from_raw_parts(map.ptr() as *const AtomicU64, n) }
}

/// The live-key word at the start of a region memfd.
fn live_key(map: &Mapping) -> &AtomicU64 {
    // SAFETY: region mappings are DATA_OFFSET + len bytes (admitted before mapping); the first word is aligned and only accessed atomically.
    unsafe { &*(map.ptr() as *const AtomicU64) }
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
    }
    w[0].store(*seq, Ordering::Release);
}

/// Copy the descriptor's words consistently (seqlock reader); the copy is
/// then judged by [`shm_desc::parse`], never used raw.
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
    shm_handout::collect_stale(dir);
}

struct ExportState {
    entries: Vec<(ShmEntry, Arc<Mapping>)>,
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
        let (desc, fd) = shm_handout::descriptor_memfd(&name, DESC_BYTES)
            .map_err(mem_err("descriptor memfd"))?;
        words(&desc, HEADER_WORDS)[2].store(shm_desc::DESC_MAGIC, Ordering::Release);
        let table = Arc::new(HandoutTable::new(fd, secret));
        let (server, name) = HandoutServer::start(dir, name, table.clone())?;
        tracing::debug!(segment = %name, "shm segment published");
        Ok(ShmExport {
            name,
            desc,
            table,
            state: Mutex::new(ExportState {
                entries: Vec::new(),
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
    /// reachable: see [`ShmExport::publish`]).
    pub fn allocate(&self, len: u64) -> Result<ExportedMemory> {
        if len == 0 || len > MAX_REGION_LEN {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!("region of {len} bytes (shm regions hold 1..={MAX_REGION_LEN})"),
            ));
        }
        let handle = {
            let mut st = self.state.lock().expect("export state poisoned");
            st.next_handle += 1;
            st.next_handle
        };
        let size = DATA_OFFSET as u64 + len;
        let fd = shm_handout::sealed_memfd(&format!("{}-r{handle}", self.name), size)
            .map_err(mem_err("region memfd"))?;
        let map = Mapping::map(
            fd.as_fd(),
            usize::try_from(size)
                .map_err(|_| Error::new(ErrorKind::OutOfMemory, "region too large"))?,
            true,
        )
        .map_err(mem_err("map a region memfd"))?;
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
        let mut st = self.state.lock().expect("export state poisoned");
        if st.entries.len() >= DESC_CAPACITY {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!(
                    "segment {} already exports {DESC_CAPACITY} regions",
                    self.name
                ),
            ));
        }
        // Release: a peer that sees the key also sees the zeroed memory.
        live_key(&mem.map).store(key, Ordering::Release);
        let entry = ShmEntry {
            id: id.0,
            base: mem.data_ptr() as u64,
            len,
            key,
            handle: mem.handle,
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
        let mut st = self.state.lock().expect("export state poisoned");
        if let Some(pos) = st.entries.iter().position(|(e, _)| e.id == id.0) {
            let (e, map) = st.entries.remove(pos);
            live_key(&map).store(0, Ordering::Release);
            self.table.remove(e.handle);
            let st = &mut *st;
            write_descriptor(&self.desc, &mut st.seq, st.entries.iter().map(|(e, _)| e));
        }
    }

    /// Publish raw descriptor entries as a hostile owner would (tests of the
    /// peer's parser); the published regions stay handed out by handle.
    #[doc(hidden)]
    pub fn forge_descriptor(&self, entries: &[ShmEntry]) {
        let mut st = self.state.lock().expect("export state poisoned");
        write_descriptor(&self.desc, &mut st.seq, entries.iter().take(DESC_CAPACITY));
    }

    /// The handle of the published region `id` (tests forge entries naming it).
    #[doc(hidden)]
    pub fn handle_of(&self, id: RegionId) -> Option<u64> {
        let st = self.state.lock().expect("export state poisoned");
        st.entries
            .iter()
            .find(|(e, _)| e.id == id.0)
            .map(|(e, _)| e.handle)
    }
}

struct PeerRegion {
    id: RegionId,
    base: u64,
    len: u64,
    key: u64,
    handle: u64,
    data: *mut u8,
    map: Arc<Mapping>,
}

#[derive(Default)]
struct PeerTable {
    seq: u64,
    regions: Vec<PeerRegion>,
}

// SAFETY: `data` points into `map`, which the table keeps alive; the table is
// immutable once built and only bytes are copied through the pointer.
unsafe impl Send for PeerTable {}
// SAFETY: as above.
unsafe impl Sync for PeerTable {}

/// Another process's segment, mapped into this one.
pub struct ShmPeer {
    name: String,
    desc: Mapping,
    /// The connection to the owner: region handout and liveness.
    owner: HandoutClient,
    /// True once the owner is seen gone; set by a worker's housekeeping
    /// ([`ShmPeer::check_owner`]), read on every access.
    owner_gone: AtomicBool,
    table: ArcSwap<PeerTable>,
    refresh: Mutex<()>,
    /// The descriptor sequence last refused (not re-read until it moves),
    /// and how many refusals were seen (only the first is a warning).
    refused_seq: AtomicU64,
    refusals: AtomicU64,
}

impl std::fmt::Debug for ShmPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPeer")
            .field("name", &self.name)
            .field("owner_pid", &self.owner.owner_pid())
            .finish_non_exhaustive()
    }
}

impl ShmPeer {
    /// Connect to the segment called `name` served in `dir` (proving
    /// `secret` when set) and map what it exports.
    pub fn attach(dir: &str, name: &str, secret: Option<&[u8]>) -> Result<ShmPeer> {
        let (owner, desc) = HandoutClient::connect(dir, name, secret)?;
        let peer = ShmPeer {
            name: name.to_owned(),
            desc,
            owner,
            owner_gone: AtomicBool::new(false),
            table: ArcSwap::from_pointee(PeerTable::default()),
            refresh: Mutex::new(()),
            refused_seq: AtomicU64::new(u64::MAX),
            refusals: AtomicU64::new(0),
        };
        peer.refresh(true, Instant::now() + IO_TIMEOUT)?;
        Ok(peer)
    }

    /// Pid of the process that exported the segment, as this process's pid
    /// namespace sees it (0 when it cannot); informational only.
    pub fn owner_pid(&self) -> u32 {
        u32::try_from(self.owner.owner_pid()).unwrap_or(0)
    }

    /// Is the owner still serving the segment?
    pub fn owner_alive(&self) -> bool {
        !self.owner_gone.load(Ordering::Relaxed) && !self.owner.owner_gone()
    }

    /// Look whether the owner still holds its end of our connection (one
    /// non-blocking `poll`); once it hung up (died, or withdrew the
    /// segment) every access fails with `ProcessFailed` instead of landing
    /// in a mapping nobody serves. Called from worker housekeeping, not per
    /// access. Returns whether the owner is alive.
    pub fn check_owner(&self) -> bool {
        if self.owner_gone.load(Ordering::Relaxed) {
            return false;
        }
        let alive = !self.owner.owner_gone();
        if !alive {
            tracing::warn!(segment = %self.name, "shm segment owner hung up: ProcessFailed from now on");
            self.owner_gone.store(true, Ordering::Relaxed);
        }
        alive
    }

    /// The regions the peer exports now.
    pub fn regions(&self) -> Vec<RemoteRegion> {
        let _ = self.refresh_if_changed(IO_TIMEOUT);
        self.table
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

    /// Re-read the descriptor if its sequence moved (and was not refused),
    /// waiting at most `wait` for another refresher or the owner.
    fn refresh_if_changed(&self, wait: Duration) -> Result<bool> {
        let seq = words(&self.desc, 1)[0].load(Ordering::Acquire);
        if seq == self.table.load().seq || seq == self.refused_seq.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.refresh(false, Instant::now() + wait)?;
        Ok(true)
    }

    /// The refresh lock, waited for until `deadline` at most (`Timeout`):
    /// a worker never queues behind a refresher stuck on a slow owner.
    fn lock_refresh(&self, deadline: Instant) -> Result<MutexGuard<'_, ()>> {
        loop {
            match self.refresh.try_lock() {
                Ok(g) => return Ok(g),
                Err(TryLockError::Poisoned(_)) => panic!("peer refresh poisoned"),
                Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        "another refresh of the shm segment is in progress",
                    ));
                }
                Err(TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Re-read the descriptor and map regions that are new, by `deadline`;
    /// slow path only. `prefault` maps their populated pages up front: done
    /// when the segment is opened (an API thread), not on a refresh a
    /// worker triggers. A descriptor the parser refuses leaves the old
    /// table in place and is not re-read until it moves; a failure that may
    /// pass (the owner slow, a memfd that could not travel) is retried on
    /// the next miss.
    fn refresh(&self, prefault_pages: bool, deadline: Instant) -> Result<()> {
        let _g = self.lock_refresh(deadline)?;
        let (seq, words) = read_descriptor(&self.desc)?;
        let old = self.table.load_full();
        if seq == old.seq && !prefault_pages {
            // Another refresher got there while we waited.
            return Ok(());
        }
        let entries = shm_desc::parse(&words).map_err(|e| {
            self.refused(seq, Error::invalid(format!("segment {}: {e}", self.name)))
        })?;
        let mut regions = Vec::with_capacity(entries.len());
        for e in entries {
            if let Some(r) = old.regions.iter().find(|r| {
                r.key == e.key && r.base == e.base && r.len == e.len && r.handle == e.handle
            }) {
                regions.push(PeerRegion {
                    id: r.id,
                    base: r.base,
                    len: r.len,
                    key: r.key,
                    handle: r.handle,
                    data: r.data,
                    map: r.map.clone(),
                });
                continue;
            }
            let handed = match self.owner.region(
                e.handle,
                |size, seals| shm_desc::admit_region(&e, size, seals),
                deadline,
            ) {
                Ok(Some(h)) => h,
                // Revoked between the descriptor read and the request.
                Ok(None) => continue,
                Err(err) if err.kind() == ErrorKind::InvalidArgument => {
                    return Err(self.refused(seq, err));
                }
                Err(err) => {
                    crate::lograte::warn_limited!(
                        (self.name.as_str(), err.kind().code()),
                        segment = %self.name,
                        error = %err,
                        "shm segment refresh failed; retried on the next miss"
                    );
                    return Err(err);
                }
            };
            if prefault_pages {
                prefault_populated(handed.fd.as_fd(), &handed.map, e.len);
            }
            let map = Arc::new(handed.map);
            let data = map.ptr().wrapping_add(DATA_OFFSET);
            regions.push(PeerRegion {
                id: RegionId(e.id),
                base: e.base,
                len: e.len,
                key: e.key,
                handle: e.handle,
                data,
                map,
            });
        }
        // `parse` sorted them by base and proved them disjoint.
        self.table.store(Arc::new(PeerTable { seq, regions }));
        Ok(())
    }

    /// Remember that descriptor `seq` was refused (so misses do not re-read
    /// it) and say so: a warning the first time, debug after that.
    fn refused(&self, seq: u64, err: Error) -> Error {
        self.refused_seq.store(seq, Ordering::Relaxed);
        if self.refusals.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(segment = %self.name, error = %err, "shm segment descriptor refused; keeping the previous view");
        } else {
            tracing::debug!(segment = %self.name, error = %err, "shm segment descriptor refused again");
        }
        err
    }

    /// Run `f` on the peer memory at `[addr, addr+len)` after checking
    /// bounds and the live key. The mapping stays valid while `f` runs.
    #[inline]
    pub fn with_remote<R>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, ErrorKind> {
        // Relaxed: a late view only lets one more copy land in the orphan
        // mapping, which harms nobody (its owner is gone).
        if self.owner_gone.load(Ordering::Relaxed) {
            return Err(ErrorKind::ProcessFailed);
        }
        for attempt in 0..2 {
            let table = self.table.load();
            match lookup(&table, addr, len) {
                Ok(ptr) => return Ok(f(ptr)),
                Err(
                    e @ (ErrorKind::AddressNotRegistered
                    | ErrorKind::AccessDenied
                    | ErrorKind::OutOfBounds),
                ) if attempt == 0 => {
                    // Slow path: the target may have (re)registered memory
                    // since we last looked, possibly at the same address.
                    match self.refresh_if_changed(WORKER_REFRESH_WAIT) {
                        Ok(true) => continue,
                        // The owner (or another refresher) was too slow,
                        // or a memfd could not travel: may pass.
                        Err(err)
                            if matches!(
                                err.kind(),
                                ErrorKind::Timeout | ErrorKind::Unreachable
                            ) =>
                        {
                            return Err(err.kind());
                        }
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(ErrorKind::AddressNotRegistered)
    }

    /// The key this initiator holds for the region containing `addr` (tests
    /// use it to present a wrong one).
    pub fn key_of(&self, addr: u64) -> Option<u64> {
        let t = self.table.load();
        find(&t, addr).map(|r| r.key)
    }

    /// Check an explicit key against the region holding `addr`: the target's
    /// live key must equal `key`.
    pub fn check_key(&self, addr: u64, len: u64, key: u64) -> Result<(), ErrorKind> {
        let t = self.table.load();
        let r = find(&t, addr).ok_or(ErrorKind::AddressNotRegistered)?;
        bounds(r, addr, len)?;
        if key == 0 || live_key(&r.map).load(Ordering::Acquire) != key {
            return Err(ErrorKind::AccessDenied);
        }
        Ok(())
    }
}

fn find(t: &PeerTable, addr: u64) -> Option<&PeerRegion> {
    let idx = t.regions.partition_point(|r| r.base <= addr);
    idx.checked_sub(1)
        .map(|i| &t.regions[i])
        .filter(|r| addr - r.base < r.len)
}

fn bounds(r: &PeerRegion, addr: u64, len: u64) -> Result<*mut u8, ErrorKind> {
    let off = addr - r.base;
    match off.checked_add(len) {
        Some(end) if end <= r.len => Ok(r.data.wrapping_add(off as usize)),
        _ => Err(ErrorKind::OutOfBounds),
    }
}

#[inline]
fn lookup(t: &PeerTable, addr: u64, len: u64) -> Result<*mut u8, ErrorKind> {
    let r = find(t, addr).ok_or(ErrorKind::AddressNotRegistered)?;
    let ptr = bounds(r, addr, len)?;
    // Acquire pairs with the target's Release in publish/revoke.
    if live_key(&r.map).load(Ordering::Acquire) != r.key {
        return Err(ErrorKind::AccessDenied);
    }
    Ok(ptr)
}

/// Map `len` bytes at `ptr` writable now rather than fault them in one by
/// one inside the first transfers (best effort; Linux >= 5.14).
fn populate(ptr: *mut u8, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = ptr as usize + len;
    if end <= start {
        return;
    }
    // SAFETY: callers pass a range inside a live shared mapping of a memfd; MADV_POPULATE_WRITE only pre-faults pages, it changes no bytes.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_WRITE) };
    if rc != 0 {
        tracing::trace!("madvise(MADV_POPULATE_WRITE) failed; pages fault in lazily");
    }
}

/// Pre-fault, in the peer, only the pages of a region that its owner has
/// populated (data extents found with `SEEK_DATA`/`SEEK_HOLE` over the
/// memfd), never the length it merely declares: a peer commits no memory
/// on an owner's behalf. At most `MAX_EXTENTS` extents are walked.
fn prefault_populated(fd: BorrowedFd<'_>, map: &Mapping, len: u64) {
    const MAX_EXTENTS: usize = 4096;
    let start = DATA_OFFSET as i64;
    // `len` was admitted: at most MAX_REGION_LEN and inside the mapping.
    let end = start + len as i64;
    let mut off = start;
    for _ in 0..MAX_EXTENTS {
        if off >= end {
            break;
        }
        // SAFETY: lseek on a live descriptor; it moves only that file description's offset, which nothing else uses.
        let data = unsafe { libc::lseek(fd.as_raw_fd(), off, libc::SEEK_DATA) };
        if data < 0 || data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd.as_raw_fd(), data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { end } else { hole.min(end) };
        // data < hole <= end <= the mapping's length (admitted).
        populate(
            map.ptr().wrapping_add(data as usize),
            (hole - data) as usize,
        );
        off = hole;
    }
}
