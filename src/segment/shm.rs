//! The shared-memory face of a segment.
//!
//! A target exports its engine-allocated regions as files in `/dev/shm`
//! (one per region) and lists them in a descriptor file named after the
//! segment. An initiator in another process maps the descriptor and the
//! region files, then copies bytes directly.
//!
//! Every access is checked against the region's bounds and its *live key*:
//! the first word of each region file holds the key while the region is
//! registered and 0 once the target unregisters it, so a peer with a stale
//! mapping gets `AccessDenied` instead of writing into memory the target has
//! given up.

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tent_rings::region::{Region, RegionType};
use tent_rings::{ErrorKind, RegionId};

use crate::error::{Error, Result};

/// Region entries a descriptor can list.
pub const DESC_CAPACITY: usize = 1024;
const HEADER_WORDS: usize = 8;
const ENTRY_WORDS: usize = 16;
const NAME_BYTES: usize = (ENTRY_WORDS - 4) * 8;
/// Where user data starts inside a region file's payload (page aligned; the
/// first line holds the live key).
pub const DATA_OFFSET: usize = 4096;

const DESC_LAYOUT: [u64; 4] = [DESC_CAPACITY as u64, (ENTRY_WORDS * 8) as u64, 1, 0];
const DESC_BYTES: usize = (HEADER_WORDS + DESC_CAPACITY * ENTRY_WORDS) * 8;

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

#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    base: u64,
    len: u64,
    key: u64,
    file: String,
}

/// The descriptor's payload viewed as atomic words (seqlock-protected).
fn words(region: &Region) -> &[AtomicU64] {
    debug_assert!(region.payload_len() >= DESC_BYTES);
    // SAFETY: the payload is at least DESC_BYTES long, 64-byte aligned, lives as long as `region`, and is only ever accessed through atomics (by us and by the peer process), so viewing it as `[AtomicU64]` is sound.
    unsafe { std::slice::from_raw_parts(region.payload_ptr() as *const AtomicU64, DESC_BYTES / 8) }
}

/// The live-key word at the start of a region file's payload.
fn live_key(region: &Region) -> &AtomicU64 {
    // SAFETY: region files are created with DATA_OFFSET + len payload bytes; the first word is aligned and only accessed atomically.
    unsafe { &*(region.payload_ptr() as *const AtomicU64) }
}

fn write_descriptor<'a>(desc: &Region, entries: impl ExactSizeIterator<Item = &'a Entry>) {
    let w = words(desc);
    // Seqlock writer: odd while writing. The Release fence orders the odd
    // store before the entry stores; the final Release store publishes them.
    let seq = w[0].load(Ordering::Relaxed);
    w[0].store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    w[1].store(entries.len() as u64, Ordering::Relaxed);
    for (i, e) in entries.enumerate() {
        let base = HEADER_WORDS + i * ENTRY_WORDS;
        w[base].store(e.id, Ordering::Relaxed);
        w[base + 1].store(e.base, Ordering::Relaxed);
        w[base + 2].store(e.len, Ordering::Relaxed);
        w[base + 3].store(e.key, Ordering::Relaxed);
        let mut name = [0u8; NAME_BYTES];
        name[..e.file.len()].copy_from_slice(e.file.as_bytes());
        for (j, chunk) in name.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            w[base + 4 + j].store(v, Ordering::Relaxed);
        }
    }
    w[0].store(seq + 2, Ordering::Release);
}

/// Read a consistent copy of the descriptor (seqlock reader).
fn read_descriptor(desc: &Region) -> Result<(u64, Vec<Entry>)> {
    let w = words(desc);
    for _ in 0..10_000 {
        let s1 = w[0].load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let count = w[1].load(Ordering::Relaxed) as usize;
        if count > DESC_CAPACITY {
            return Err(Error::invalid(format!(
                "segment descriptor lists {count} regions (max {DESC_CAPACITY})"
            )));
        }
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let base = HEADER_WORDS + i * ENTRY_WORDS;
            let mut name = [0u8; NAME_BYTES];
            for (j, chunk) in name.chunks_exact_mut(8).enumerate() {
                chunk.copy_from_slice(&w[base + 4 + j].load(Ordering::Relaxed).to_le_bytes());
            }
            let end = name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
            out.push(Entry {
                id: w[base].load(Ordering::Relaxed),
                base: w[base + 1].load(Ordering::Relaxed),
                len: w[base + 2].load(Ordering::Relaxed),
                key: w[base + 3].load(Ordering::Relaxed),
                file: String::from_utf8_lossy(&name[..end]).into_owned(),
            });
        }
        // Acquire fence: the entry loads above happen before the re-check.
        fence(Ordering::Acquire);
        if w[0].load(Ordering::Relaxed) == s1 {
            return Ok((s1, out));
        }
    }
    Err(Error::new(
        ErrorKind::Unreachable,
        "segment descriptor kept changing while being read",
    ))
}

fn join(dir: &str, file: &str) -> String {
    format!("{}/{file}", dir.trim_end_matches('/'))
}

/// Remove files left in `dir` by tent processes that no longer exist
/// (a target killed with -9 cannot clean up after itself).
fn collect_stale(dir: &str) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("tent-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if !pid_alive(pid as u32) {
            tracing::debug!(file = ?entry.path(), pid, "removing stale shm file of a dead process");
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

struct ExportState {
    entries: Vec<(Entry, Arc<Region>)>,
    next_file: u64,
}

/// This engine's segment, published in shared memory.
pub struct ShmExport {
    name: String,
    dir: String,
    desc: Region,
    state: Mutex<ExportState>,
}

impl std::fmt::Debug for ShmExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmExport")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Memory backing an exported region; keeps the region file mapped.
#[derive(Debug, Clone)]
pub struct ExportedMemory {
    region: Arc<Region>,
}

impl ExportedMemory {
    /// Start of the user-visible bytes.
    pub fn data_ptr(&self) -> *mut u8 {
        self.region.payload_ptr().wrapping_add(DATA_OFFSET)
    }
}

impl ShmExport {
    /// Publish a new, empty segment descriptor in `dir`.
    pub fn create(dir: &str) -> Result<ShmExport> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        collect_stale(dir);
        let pid = std::process::id();
        let name = format!(
            "tent-{pid}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed) + (crate::memory::fresh_key() & 0xffff) * 1000
        );
        let desc = Region::create_shm(
            &join(dir, &name),
            RegionType::Segment,
            DESC_LAYOUT,
            DESC_BYTES,
        )?;
        tracing::debug!(segment = %name, "shm segment descriptor published");
        Ok(ShmExport {
            name,
            dir: dir.to_owned(),
            desc,
            state: Mutex::new(ExportState {
                entries: Vec::new(),
                next_file: 0,
            }),
        })
    }

    /// The segment name peers open.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Create the shared file for a new region of `len` bytes (not yet
    /// reachable: see [`ShmExport::publish`]).
    pub fn allocate(&self, len: u64) -> Result<ExportedMemory> {
        let file = {
            let mut st = self.state.lock().expect("export state poisoned");
            st.next_file += 1;
            format!("{}-r{}", self.name, st.next_file)
        };
        let payload = DATA_OFFSET as u64 + len;
        let region = Region::create_shm(
            &join(&self.dir, &file),
            RegionType::Data,
            [len, DATA_OFFSET as u64, 0, 0],
            usize::try_from(payload)
                .map_err(|_| Error::new(ErrorKind::OutOfMemory, "region too large"))?,
        )?;
        Ok(ExportedMemory {
            region: Arc::new(region),
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
        let file = mem
            .region
            .path()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        // Release: a peer that sees the key also sees the zeroed memory.
        live_key(&mem.region).store(key, Ordering::Release);
        let entry = Entry {
            id: u64::from(id.0),
            base: mem.data_ptr() as u64,
            len,
            key,
            file,
        };
        st.entries.push((entry, mem.region.clone()));
        write_descriptor(&self.desc, st.entries.iter().map(|(e, _)| e));
        Ok(())
    }

    /// Withdraw region `id`: its key stops matching at once, then it leaves
    /// the descriptor.
    pub fn revoke(&self, id: RegionId) {
        let mut st = self.state.lock().expect("export state poisoned");
        if let Some(pos) = st.entries.iter().position(|(e, _)| e.id == u64::from(id.0)) {
            let (_, region) = st.entries.remove(pos);
            live_key(&region).store(0, Ordering::Release);
            write_descriptor(&self.desc, st.entries.iter().map(|(e, _)| e));
        }
    }
}

struct PeerRegion {
    id: RegionId,
    base: u64,
    len: u64,
    key: u64,
    data: *mut u8,
    map: Arc<Region>,
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
    dir: String,
    desc: Region,
    owner_pid: u32,
    /// False once the owner process is seen gone; set by a worker's
    /// housekeeping ([`ShmPeer::check_owner`]), read on every access.
    owner_gone: std::sync::atomic::AtomicBool,
    table: ArcSwap<PeerTable>,
    refresh: Mutex<()>,
}

impl std::fmt::Debug for ShmPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPeer")
            .field("name", &self.name)
            .field("owner_pid", &self.owner_pid)
            .finish_non_exhaustive()
    }
}

impl ShmPeer {
    /// Map the segment called `name` exported in `dir`.
    pub fn attach(dir: &str, name: &str) -> Result<ShmPeer> {
        if name.is_empty() || name.contains('/') || name.len() > 200 {
            return Err(Error::invalid(format!("bad segment name {name:?}")));
        }
        let path = join(dir, name);
        if !std::path::Path::new(&path).exists() {
            return Err(Error::new(
                ErrorKind::SegmentNotFound,
                format!("no segment named {name:?} (no {path})"),
            ));
        }
        let desc = Region::attach_shm(&path, RegionType::Segment, Some(DESC_LAYOUT))?;
        if desc.payload_len() < DESC_BYTES {
            return Err(Error::invalid(format!(
                "segment {name:?}: descriptor payload {} bytes, expected {DESC_BYTES}",
                desc.payload_len()
            )));
        }
        let owner_pid = desc.owner_pid();
        let peer = ShmPeer {
            name: name.to_owned(),
            dir: dir.to_owned(),
            desc,
            owner_pid,
            owner_gone: std::sync::atomic::AtomicBool::new(false),
            table: ArcSwap::from_pointee(PeerTable::default()),
            refresh: Mutex::new(()),
        };
        peer.refresh(true)?;
        Ok(peer)
    }

    /// Pid of the process that exported the segment.
    pub fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    /// Is the exporting process still there?
    pub fn owner_alive(&self) -> bool {
        pid_alive(self.owner_pid)
    }

    /// Look whether the owner process still exists (one `kill(pid, 0)`);
    /// once it is gone every access fails with `ProcessFailed` instead of
    /// landing in a mapping nobody serves. Called from worker housekeeping,
    /// not per access. Returns whether the owner is alive.
    pub fn check_owner(&self) -> bool {
        if self.owner_gone.load(Ordering::Relaxed) {
            return false;
        }
        let alive = pid_alive(self.owner_pid);
        if !alive {
            tracing::warn!(segment = %self.name, pid = self.owner_pid, "shm segment owner process is gone: ProcessFailed from now on");
            self.owner_gone.store(true, Ordering::Relaxed);
        }
        alive
    }

    /// The regions the peer exports now.
    pub fn regions(&self) -> Vec<RemoteRegion> {
        let _ = self.refresh_if_changed();
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

    fn refresh_if_changed(&self) -> Result<bool> {
        let seq = words(&self.desc)[0].load(Ordering::Acquire);
        if seq == self.table.load().seq {
            return Ok(false);
        }
        self.refresh(false)?;
        Ok(true)
    }

    /// Re-read the descriptor and map regions that are new; slow path only.
    /// `prefault` maps their pages up front: done when the segment is opened
    /// (an API thread), not on a refresh a worker triggers.
    fn refresh(&self, prefault_pages: bool) -> Result<()> {
        let _g = self.refresh.lock().expect("peer refresh poisoned");
        let (seq, entries) = read_descriptor(&self.desc)?;
        let old = self.table.load_full();
        let mut regions = Vec::with_capacity(entries.len());
        for e in entries {
            if let Some(r) = old
                .regions
                .iter()
                .find(|r| r.key == e.key && r.base == e.base)
            {
                regions.push(PeerRegion {
                    id: r.id,
                    base: r.base,
                    len: r.len,
                    key: r.key,
                    data: r.data,
                    map: r.map.clone(),
                });
                continue;
            }
            if e.file.is_empty() || e.file.contains('/') {
                return Err(Error::invalid(format!(
                    "segment {} lists a bad file name",
                    self.name
                )));
            }
            let map = match Region::attach_shm(
                &join(&self.dir, &e.file),
                RegionType::Data,
                Some([e.len, DATA_OFFSET as u64, 0, 0]),
            ) {
                Ok(m) => Arc::new(m),
                // Revoked between the descriptor read and the attach.
                Err(tent_rings::region::RegionError::Io { .. }) => continue,
                Err(other) => return Err(other.into()),
            };
            // The mapping must really hold what the descriptor promises: a
            // peer's file is not trusted to be self-consistent.
            if (map.payload_len() as u64) < DATA_OFFSET as u64 + e.len {
                return Err(Error::invalid(format!(
                    "segment {}: region file {} holds {} bytes, descriptor says {}",
                    self.name,
                    e.file,
                    map.payload_len(),
                    DATA_OFFSET as u64 + e.len
                )));
            }
            let data = map.payload_ptr().wrapping_add(DATA_OFFSET);
            if prefault_pages {
                prefault(data, e.len);
            }
            regions.push(PeerRegion {
                id: RegionId(e.id as u32),
                base: e.base,
                len: e.len,
                key: e.key,
                data,
                map,
            });
        }
        regions.sort_by_key(|r| r.base);
        self.table.store(Arc::new(PeerTable { seq, regions }));
        Ok(())
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
                    match self.refresh_if_changed() {
                        Ok(true) => continue,
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

/// Map the peer's pages writable now rather than fault them in one by one
/// inside the first transfers (best effort; Linux >= 5.14).
fn prefault(ptr: *mut u8, len: u64) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = ptr as usize + len as usize;
    // SAFETY: [start, end) lies inside a live shared mapping of the region file; MADV_POPULATE_WRITE only pre-faults pages, it changes no bytes.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_WRITE) };
    if rc != 0 {
        tracing::trace!("madvise(MADV_POPULATE_WRITE) unsupported; pages fault in lazily");
    }
}
