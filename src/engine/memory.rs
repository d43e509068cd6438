//! Registered memory: allocating and registering it ([`Buffer`]),
//! withdrawing it, and the unregister epochs and drain that
//! `unregister_memory` and `close_segment` share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tent_rings::{ErrorKind, RegionId};

use super::Embedded;
use crate::config::HugePages;
use crate::error::{Error, Result};
use crate::memory::{MemRegion, RegionTable, RegionUse, numa_node_of};
use crate::transport::tcp;

/// How often, at most, `unregister_memory` looks whether the workers and
/// the TCP data server are done with a region (and rings the workers that
/// are not), after `DRAIN_YIELDS` quick looks and naps doubling from 10 us
/// (a woken idle worker acknowledges within microseconds).
const DRAIN_POLL: Duration = Duration::from_millis(1);
const DRAIN_YIELDS: u32 = 64;

impl Embedded {
    pub(crate) fn allocate_memory(&self, len: u64) -> Result<Buffer> {
        self.allocate_memory_for(len, 0).map(|(b, _)| b)
    }

    /// [`Engine::allocate_memory`] for daemon client `client` (0: this
    /// process): the region is tagged with it, and its memfd (with the
    /// shm transport on) comes back for the client to map.
    pub(crate) fn allocate_memory_for(
        &self,
        len: u64,
        client: u32,
    ) -> Result<(Buffer, Option<crate::transport::shm::ExportedMemory>)> {
        if len == 0 {
            return Err(Error::invalid("allocate_memory: zero length"));
        }
        let _g = self.shared.registry.lock();
        let table = self.shared.regions.load_full();
        let id = table.next_id();
        let region = match &self.export {
            Some(export) => {
                let mem = export.allocate(len, self.shared.config.hugepages != HugePages::Off)?;
                let ptr = mem.data_ptr();
                let region = MemRegion::new(id, ptr, len, Some(Box::new(mem.clone())))
                    .with_numa_node(numa_node_of(ptr, len))
                    .with_client(client);
                // SAFETY: the region owns the mapping, which outlives its RDMA registration (dropped first).
                let region = Arc::new(unsafe { self.register_rdma(region, ptr, len)? });
                export.publish(&mem, id, len, region.key())?;
                (region, Some(mem))
            }
            None => {
                let heap = HeapMemory::new(len, self.shared.config.hugepages)?;
                let ptr = heap.ptr;
                let region = MemRegion::new(id, ptr, len, Some(Box::new(heap)))
                    .with_numa_node(numa_node_of(ptr, len))
                    .with_client(client);
                // SAFETY: as above, for the anonymous mapping.
                let region = unsafe { self.register_rdma(region, ptr, len)? };
                (Arc::new(region), None)
            }
        };
        let (region, mem) = region;
        self.shared
            .regions
            .store(Arc::new(table.with(region.clone())?));
        Ok((
            Buffer {
                mem: Memory::Region(region),
            },
            mem,
        ))
    }

    pub(crate) unsafe fn register_memory(&self, ptr: *mut u8, len: u64) -> Result<Buffer> {
        // SAFETY: forwarded from the caller.
        let mut one = unsafe { self.register_memory_batch(&[(ptr, len)])? };
        Ok(one.pop().expect("one range, one buffer"))
    }

    pub(crate) unsafe fn register_memory_batch(
        &self,
        ranges: &[(*mut u8, u64)],
    ) -> Result<Vec<Buffer>> {
        for &(ptr, len) in ranges {
            if len == 0 || ptr.is_null() {
                return Err(Error::invalid(
                    "register_memory: null pointer or zero length",
                ));
            }
            // Every later bound check adds within the region: it must not wrap.
            if (ptr as u64).checked_add(len).is_none() || usize::try_from(len).is_err() {
                return Err(Error::invalid(format!(
                    "register_memory: [{:#x}, +{len}) wraps the address space",
                    ptr as u64
                )));
            }
        }
        let _g = self.shared.registry.lock();
        let mut table = RegionTable::clone(&self.shared.regions.load());
        let mut out = Vec::with_capacity(ranges.len());
        for &(ptr, len) in ranges {
            // Where its pages are now (those faulted in): the rails' tiers
            // for its slices rank from that node.
            let region = MemRegion::new(table.next_id(), ptr, len, None)
                .with_numa_node(numa_node_of(ptr, len));
            // On an error below, what was registered so far is dropped
            // (its RDMA registrations with it) and the table is left as it was.
            // SAFETY: the caller keeps the memory mapped while it is registered.
            let region = Arc::new(unsafe { self.register_rdma(region, ptr, len)? });
            table.insert(region.clone())?;
            out.push(Buffer {
                mem: Memory::Region(region),
            });
        }
        self.shared.regions.store(Arc::new(table));
        Ok(out)
    }

    pub(crate) fn local_addr(&self, addr: u64, len: u64) -> Result<tent_rings::LocalAddr> {
        if len == 0 {
            return Err(Error::invalid("local_addr: zero length"));
        }
        let table = self.shared.regions.load();
        let (region, _) = table.find_addr(addr, len).map_err(|kind| {
            Error::new(
                kind,
                format!(
                    "[{addr:#x}, +{len}) is not inside one registered region (allocate or register it first)"
                ),
            )
        })?;
        Ok(tent_rings::LocalAddr::new(
            region.id(),
            addr - region.addr(),
        ))
    }

    /// Register `region` on every RDMA NIC (a no-op without RDMA).
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay mapped while the region lives.
    unsafe fn register_rdma(&self, region: MemRegion, ptr: *mut u8, len: u64) -> Result<MemRegion> {
        let Some(nics) = &self.shared.rdma else {
            return Ok(region);
        };
        // SAFETY: forwarded from the caller.
        let reg = unsafe { nics.register(ptr, len as usize)? };
        Ok(region.with_rdma(reg.layout(), reg.rkeys(), reg.lkeys(), Box::new(reg)))
    }

    pub(crate) fn unregister_memory(&self, id: RegionId) -> Result<()> {
        self.unregister_memory_batch(&[id])
    }

    pub(crate) fn unregister_memory_batch(&self, ids: &[RegionId]) -> Result<()> {
        let regions = self.withdraw(ids)?;
        for region in &regions {
            self.drain(region)?;
            region.release_rdma();
        }
        if regions.len() == 1 {
            self.retiring.release(|r| r.id() == ids[0]);
        } else {
            let gone: std::collections::HashSet<RegionId> = ids.iter().copied().collect();
            self.retiring.release(|r| gone.contains(&r.id()));
        }
        Ok(())
    }

    /// At the engine's drop (workers stopped): revoke every region of
    /// application memory still registered or being unregistered, and wait
    /// until nothing uses it (a `Buffer` copy, a TCP op, which a revoke
    /// cuts within a poll).
    pub(super) fn revoke_application_memory(&self) {
        let table = self.shared.regions.load_full();
        let retiring = self.retiring.snapshot();
        for r in table.iter().chain(retiring.iter()) {
            if r.owns_memory() {
                continue;
            }
            if !r.is_revoked() {
                // No worker runs: any non-zero epoch marks it.
                r.revoke(u64::MAX);
            }
            while r.in_use() != 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        // Revoked and closed: an inline copy still running ends first, and
        // no ring keeps the tables.
        self.shared.inline.release_views();
    }

    /// Take regions `ids` out of the table and revoke them at the next
    /// unregister epoch (one table change), or find those withdrawn by an
    /// earlier call that has not finished. An id that names neither
    /// refuses the call and changes nothing.
    fn withdraw(&self, ids: &[RegionId]) -> Result<Vec<Arc<MemRegion>>> {
        let _g = self.shared.registry.lock();
        let mut next = RegionTable::clone(&self.shared.regions.load());
        let (mut removed, mut all) = (Vec::new(), Vec::with_capacity(ids.len()));
        for &id in ids {
            if let Some(r) = next.remove(id) {
                removed.push(r.clone());
                all.push(r);
                continue;
            }
            let r = self.retiring.find(|r| r.id() == id).ok_or_else(|| {
                Error::new(
                    ErrorKind::AddressNotRegistered,
                    format!("region {} is not registered", id.0),
                )
            })?;
            all.push(r);
        }
        if removed.is_empty() {
            return Ok(all);
        }
        self.next_epoch(|epoch| {
            for r in &removed {
                r.revoke(epoch);
                if let Some(export) = &self.export {
                    export.revoke(r.id());
                }
            }
            self.shared.regions.store(Arc::new(next));
            for r in removed {
                self.retiring.hold(r);
            }
        });
        Ok(all)
    }

    /// Take the next unregister epoch (shared by `unregister_memory` and
    /// `close_segment`, its only writers, both under the registry lock):
    /// `retire(epoch)` marks what leaves a table at it and stores the table
    /// without it; the epoch is published after (Release), so a worker that
    /// reads it sees both.
    pub(super) fn next_epoch(&self, retire: impl FnOnce(u64)) {
        self.shared.next_epoch(retire);
    }

    /// Wait until no worker and no TCP data server thread uses `region`
    /// (revoked), ringing workers that have not acknowledged its epoch so a
    /// parked one wakes; `Timeout` past the bound (see
    /// [`Engine::unregister_memory`]).
    fn drain(&self, region: &MemRegion) -> Result<()> {
        self.drain_epoch(
            region.revoked_epoch(),
            || region.in_use(),
            |workers, served| {
                format!(
                    "region {} still in use past the drain bound ({workers} worker(s) with tasks on it, {served} TCP op(s) being served): it stays withdrawn and registered; do not free it, call unregister_memory again",
                    region.id().0
                )
            },
        )
    }

    /// Wait until every worker has acknowledged unregister epoch `epoch`
    /// (none holds a live task on what it took out) and `served()` is 0,
    /// ringing workers that have not so a parked one wakes; `Timeout` with
    /// `why(workers, served)` past the latest deadline of such a task (or
    /// the call) plus twice the TCP stall limit.
    pub(super) fn drain_epoch(
        &self,
        epoch: u64,
        served: impl Fn() -> u64,
        why: impl Fn(usize, u64) -> String,
    ) -> Result<()> {
        let cfg = &self.shared.config;
        let stall =
            tcp::server::stall_limit(tcp::user_timeout_ms(cfg.transports.tcp.user_timeout_ms));
        let grace = u64::try_from(stall.as_nanos().saturating_mul(2)).unwrap_or(u64::MAX);
        let start = crate::clock::monotonic_ns();
        let mut look = 0u32;
        let mut nap = Duration::from_micros(10);
        // A ring's inline copy in progress ends first (a bounded copy),
        // and no ring keeps what was withdrawn.
        self.shared.inline.release_views();
        loop {
            // Ring on the first look and on every slow one, not per yield.
            let ring = look == 0 || look >= DRAIN_YIELDS;
            let (mut workers, mut latest) = (0, start);
            for w in self.workers.iter() {
                // Acquire: pairs with the worker's Release of its ack: what
                // its tasks did to the memory happens before.
                if w.region_ack.epoch.load(Ordering::Acquire) >= epoch {
                    continue;
                }
                workers += 1;
                latest = latest.max(w.region_ack.wait_until.load(Ordering::Relaxed));
                if ring {
                    w.doorbell().ring();
                }
            }
            let served = served();
            if workers == 0 && served == 0 {
                return Ok(());
            }
            if crate::clock::monotonic_ns() > latest.saturating_add(grace) {
                return Err(Error::new(ErrorKind::Timeout, why(workers, served)));
            }
            if look < DRAIN_YIELDS {
                look += 1;
                std::thread::yield_now();
            } else {
                // A parked worker woken by the ring acknowledges within
                // tens of microseconds: look again soon, then less often.
                std::thread::sleep(nap);
                nap = (nap * 2).min(DRAIN_POLL);
            }
        }
    }
}

/// Registered memory handed out by the engine.
#[derive(Debug, Clone)]
pub struct Buffer {
    mem: Memory,
}

/// Whose memory a [`Buffer`] is.
#[derive(Debug, Clone)]
enum Memory {
    /// A region of this process's engine.
    Region(Arc<MemRegion>),
    /// Memory the daemon allocated for this client, mapped here too.
    Client(Arc<crate::daemon::ClientMemory>),
}

impl Buffer {
    pub(crate) fn client(mem: Arc<crate::daemon::ClientMemory>) -> Buffer {
        Buffer {
            mem: Memory::Client(mem),
        }
    }

    /// Region id (for SQEs' local side).
    pub fn id(&self) -> RegionId {
        match &self.mem {
            Memory::Region(r) => r.id(),
            Memory::Client(c) => c.id(),
        }
    }

    /// Access key; 0 for memory of an attached engine (the daemon holds
    /// its keys).
    pub fn key(&self) -> u64 {
        match &self.mem {
            Memory::Region(r) => r.key(),
            Memory::Client(_) => 0,
        }
    }

    /// Address in this process (what
    /// [`Engine::local_addr`](crate::Engine::local_addr) takes).
    pub fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    /// The address a peer names it by in a
    /// [`RemoteAddr`](crate::RemoteAddr) (with the segment this engine's
    /// [`segment_name`](crate::Engine::segment_name) opens): its address
    /// here for an engine in this process; for one attached to a daemon,
    /// where the daemon maps it (a peer reaches it through the daemon's
    /// engine). Tell peers this, not [`Buffer::addr`].
    pub fn peer_addr(&self) -> u64 {
        match &self.mem {
            Memory::Region(_) => self.as_ptr() as u64,
            Memory::Client(c) => c.addr(),
        }
    }

    /// Length.
    pub fn len(&self) -> u64 {
        match &self.mem {
            Memory::Region(r) => r.len(),
            Memory::Client(c) => c.len(),
        }
    }

    /// Never true (zero-length registrations are refused).
    pub fn is_empty(&self) -> bool {
        match &self.mem {
            Memory::Region(r) => r.is_empty(),
            Memory::Client(c) => c.len() == 0,
        }
    }

    /// Raw pointer to the start.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.mem {
            Memory::Region(r) => r.addr() as *mut u8,
            Memory::Client(c) => c.ptr(),
        }
    }

    /// Copy `data` in at `offset`, with byte-wise relaxed atomic stores.
    /// Do not write or read bytes a transfer is moving at the same time:
    /// transports copy with plain (non-atomic) copies, DMA or the kernel,
    /// so that is a data race, as for any buffer handed to a NIC; wait for
    /// the transfer's completion first.
    ///
    /// On memory the application registered (`register_memory`), this is
    /// `AddressNotRegistered` once the region is unregistered or its
    /// engine dropped: the application may have freed it then. (Memory the
    /// engine allocated stays readable and writable while a `Buffer` of it
    /// exists.)
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let region = match &self.mem {
            Memory::Region(r) => r,
            Memory::Client(c) => return c.write(offset, data),
        };
        let _use = using(region, "write")?;
        let p = region
            .slice_ptr(offset, data.len() as u64)
            .map_err(|k| Error::new(k, "buffer write out of bounds"))?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above); the memory is alive: the engine's own while `self` is, the application's while `_use` makes unregister and the engine's drop wait; AtomicU8 has the layout of u8.
            unsafe { (*(p.add(i) as *const AtomicU8)).store(*b, Ordering::Relaxed) };
        }
        Ok(())
    }

    /// Copy out `out.len()` bytes from `offset` (byte-wise relaxed atomic
    /// loads; see [`Buffer::write`] on transfers in progress, and as
    /// there, `AddressNotRegistered` on application memory once it is
    /// unregistered).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let region = match &self.mem {
            Memory::Region(r) => r,
            Memory::Client(c) => return c.read(offset, out),
        };
        let _use = using(region, "read")?;
        let p = region
            .slice_ptr(offset, out.len() as u64)
            .map_err(|k| Error::new(k, "buffer read out of bounds"))?;
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: as in `write`.
            *b = unsafe { (*(p.add(i) as *const AtomicU8)).load(Ordering::Relaxed) };
        }
        Ok(())
    }
}

/// What keeps the memory valid during a copy: nothing for memory the
/// engine owns (this handle keeps it); for the application's, a use
/// counted on the region (`unregister_memory` and the engine's drop
/// wait for it), refused once the region is revoked.
fn using<'a>(region: &'a MemRegion, what: &str) -> Result<Option<RegionUse<'a>>> {
    if region.owns_memory() {
        return Ok(None);
    }
    region.enter().map(Some).ok_or_else(|| {
        Error::new(
            ErrorKind::AddressNotRegistered,
            format!(
                "buffer {what}: region {} was unregistered (or its engine dropped); the application may have freed it",
                region.id().0
            ),
        )
    })
}

/// Page-aligned, zeroed anonymous memory for `allocate_memory` without
/// shm export, backed as `hugepages` says: hugetlbfs pages from the
/// reserved pool (`2m`, `1g`), or base pages advised to become transparent
/// huge pages, so large buffers cost few TLB entries when the kernel
/// copies through them (TCP moves every byte through a kernel copy) and
/// few translation entries on a NIC.
struct HeapMemory {
    ptr: *mut u8,
    _map: memmap2::MmapMut,
}

// SAFETY: HeapMemory exclusively owns its mapping.
unsafe impl Send for HeapMemory {}
// SAFETY: no interior mutability through &HeapMemory.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    fn new(len: u64, pages: HugePages) -> Result<HeapMemory> {
        let oom = |e: Option<std::io::Error>| {
            let err = Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes"),
            );
            match e {
                Some(e) => err.with_source(e),
                None => err,
            }
        };
        let n = usize::try_from(len).map_err(|_| oom(None))?;
        for &bits in hugetlb_sizes(pages, len) {
            match map_hugetlb(n, bits) {
                Ok(mut map) => {
                    tracing::debug!(
                        len,
                        page_mib = (1u64 << bits) >> 20,
                        "allocate_memory: hugetlbfs pages"
                    );
                    // A child of a fork() gets no copy: after an RDMA
                    // registration pinned them, the kernel would copy
                    // these pages at fork, from a pool sized for the
                    // buffers (the fork would fail). A child has no
                    // business in engine memory (README, fork).
                    if let Err(e) = map.advise(memmap2::Advice::DontFork) {
                        tracing::debug!(error = %e, "madvise(MADV_DONTFORK) refused for hugetlbfs pages");
                    }
                    return Ok(HeapMemory {
                        ptr: map.as_mut_ptr(),
                        _map: map,
                    });
                }
                Err(e) => crate::lograte::warn_limited!(
                    (bits, e.raw_os_error()),
                    page_mib = (1u64 << bits) >> 20,
                    len,
                    error = %e,
                    "hugepages: no hugetlbfs pages of this size for allocate_memory (reserve them in /proc/sys/vm/nr_hugepages or /sys/kernel/mm/hugepages); using the next size, then transparent huge pages"
                ),
            }
        }
        let mut map = memmap2::MmapOptions::new()
            .len(n)
            .map_anon()
            .map_err(|e| oom(Some(e)))?;
        if pages != HugePages::Off && n >= 2 << 20 {
            // Best effort: THP may be off system-wide.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(HeapMemory {
            ptr: map.as_mut_ptr(),
            _map: map,
        })
    }
}

/// The hugetlbfs page sizes (as log2 of bytes) to try for `len` bytes,
/// largest first: 1 GiB pages only for a buffer of at least one.
fn hugetlb_sizes(pages: HugePages, len: u64) -> &'static [u8] {
    match pages {
        HugePages::Huge1G if len >= 1 << 30 => &[30, 21],
        HugePages::Huge1G | HugePages::Huge2M => &[21],
        _ => &[],
    }
}

/// `n` bytes of hugetlbfs pages of `1 << bits` bytes, the length rounded
/// up to whole pages. The kernel reserves the pages at `mmap` (no
/// `MAP_NORESERVE`), so a short pool fails here with `ENOMEM` rather than
/// at first touch (a hugetlb cgroup limit is still charged at first
/// touch).
fn map_hugetlb(n: usize, bits: u8) -> std::io::Result<memmap2::MmapMut> {
    let len = n
        .checked_next_multiple_of(1 << bits)
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
    memmap2::MmapOptions::new()
        .len(len)
        .huge(Some(bits))
        .map_anon()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::numa_node_of;
    use crate::{Config, Engine};

    fn engine(shm: bool) -> Engine {
        engine_with(shm, HugePages::Transparent)
    }

    fn engine_with(shm: bool, pages: HugePages) -> Engine {
        let mut c = Config::default();
        c.workers.count = 1;
        c.workers.pin = false;
        c.transports.tcp.enable = false;
        c.transports.rdma.enable = false;
        c.transports.shm.enable = shm;
        c.hugepages = pages;
        Engine::new(c).expect("engine")
    }

    #[test]
    fn one_gib_pages_only_for_buffers_of_one_gib() {
        use HugePages::*;
        assert_eq!(hugetlb_sizes(Huge1G, 1 << 30), &[30, 21]);
        assert_eq!(hugetlb_sizes(Huge1G, (1 << 30) - 1), &[21]);
        assert_eq!(hugetlb_sizes(Huge2M, 1 << 40), &[21]);
        assert!(hugetlb_sizes(Transparent, 1 << 30).is_empty());
        assert!(hugetlb_sizes(Off, 1 << 30).is_empty());
    }

    /// Is this machine one NUMA node (node 0), as `/sys` says?
    fn one_node() -> bool {
        std::fs::read_to_string("/sys/devices/system/node/online").is_ok_and(|s| s.trim() == "0")
    }

    /// The node recorded at registration is what the region in the
    /// engine's table reports: for an exported allocation (committed on
    /// this thread) where its pages are, for heap memory none yet (never
    /// faulted in), for registered memory where its touched pages are.
    #[test]
    fn the_node_recorded_at_registration_is_what_the_region_reports() {
        // Where a page this thread touches lands (`None`: `move_pages`
        // refused here, so every node is unknown).
        let touched = vec![1u8; 1 << 16];
        let here = numa_node_of(touched.as_ptr(), 1 << 16);
        if one_node() {
            assert!(matches!(here, Some(0) | None), "{here:?}");
        }
        let reported = |e: &Engine, b: &Buffer| {
            let table = e.embedded().expect("embedded").shared.regions.load();
            let r = table.get(b.id()).expect("registered");
            let Memory::Region(region) = &b.mem else {
                panic!("a region of this engine")
            };
            assert_eq!(r.numa_node(), region.numa_node());
            r.numa_node()
        };

        let e = engine(true);
        let exported = e.allocate_memory(1 << 20).unwrap();
        let node = reported(&e, &exported);
        assert_eq!(node, numa_node_of(exported.addr() as *const u8, 1 << 20));
        if one_node() {
            assert_eq!(node, here, "committed on this thread's node");
        }

        let e = engine(false);
        let heap = e.allocate_memory(1 << 20).unwrap();
        assert_eq!(reported(&e, &heap), None, "not faulted in yet");

        let mut mine = vec![7u8; 1 << 16];
        // SAFETY: `mine` outlives the engine, dropped first.
        let registered = unsafe { e.register_memory(mine.as_mut_ptr(), 1 << 16) }.unwrap();
        let node = reported(&e, &registered);
        assert_eq!(node, numa_node_of(mine.as_ptr(), 1 << 16));
        if one_node() {
            assert_eq!(node, here);
        }
        drop(e);
    }
}
