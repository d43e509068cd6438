//! Single-producer single-consumer rings with io_uring-style batching.
//!
//! Each handle keeps its own index and a cached copy of the other side's, so
//! the common case of [`Producer::push`] and [`Consumer::pop`] touches no
//! shared cache line at all. Work becomes visible to the other side only when
//! a handle calls `sync`, which publishes its index with a single Release
//! store — one store per batch, like io_uring's `io_uring_submit`.
//!
//! A consumer that runs out of work can ask to be woken
//! ([`Consumer::prepare_park`]); the producer checks
//! [`Producer::needs_wakeup`] after publishing and only then pays for a
//! wake-up syscall (the `IORING_SQ_NEED_WAKEUP` protocol).
//!
//! Rings live in a [`Region`]: on the heap ([`channel`]) or in shared memory,
//! where two processes can each hold one end ([`init_in_region`],
//! [`producer_in_region`], [`consumer_in_region`]).
//!
//! # Memory layout
//!
//! | offset | owner    | contents                                            |
//! |--------|----------|-----------------------------------------------------|
//! | 0      | creator  | capacity, entry size, entry align, format word      |
//! | 128    | producer | `tail`, `closed`                                    |
//! | 256    | consumer | `head`                                              |
//! | 384    | consumer | `flags` (`NEED_WAKEUP`)                              |
//! | 512    | —        | `capacity` entries                                  |
//!
//! Each index sits on its own 128-byte block, not just its own 64-byte line,
//! because x86's adjacent-line prefetcher pulls cache lines in pairs and would
//! otherwise reintroduce false sharing. The indices are free-running `u32`s
//! (wrapping), masked by `capacity - 1` to find a slot.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use crate::region::{Region, RegionType};

/// Ask the core to start fetching `p`'s cache line. A hint only: not an
/// access in the memory model, and it never faults.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    {
        // SAFETY: a prefetch reads nothing the program observes and does not fault, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = p;
}

/// Ask the core to fetch `p`'s cache line for writing (`prefetchw`): the
/// ownership request goes out now instead of when a store reaches the head
/// of the store queue. A hint only, as [`prefetch`].
#[inline(always)]
fn prefetch_write<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    {
        // `_mm_prefetch` with `_MM_HINT_ET0` compiles to a plain `prefetcht0`
        // unless the build enables `prfchw`, and a read prefetch fetches the
        // line shared: the store still has to ask for it. `prefetchw` is in
        // every x86-64 core since 2014 (AMD since K8) and an older Intel
        // core decodes it as a no-op.
        // SAFETY: a prefetch reads nothing the program observes and does not fault, whatever the address.
        unsafe {
            std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, readonly, preserves_flags))
        };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = p;
}

/// How far ahead of its tail a producer asks for its slots' lines (bytes
/// of entries): about as many lines as it writes while one cross-core
/// ownership request is answered.
const WRITE_AHEAD_BYTES: usize = 2048;

/// What can live in a ring: plain old data ([`bytemuck::Pod`]: every bit
/// pattern valid, no padding, no pointers, no `Drop`), because rings hand
/// out values read from memory that another process (or a buggy peer) may
/// have written, and never run destructors. `Sqe` and `Cqe` derive `Pod`,
/// which checks their layout when the crate compiles; their accessors
/// validate each field.
pub trait Entry: bytemuck::Pod + Send {}

impl<T: bytemuck::Pod + Send> Entry for T {}

/// Format word stored last by [`init_in_region`]: "this memory is a ring".
const RING_MAGIC: u64 = u64::from_le_bytes(*b"TENTSPSC");
/// Consumer flag: "I am (about to be) parked; wake me after publishing".
const NEED_WAKEUP: u32 = 1;
const MAX_CAPACITY: u32 = 1 << 30;
/// Spacing of the control blocks, and the alignment the backing memory needs.
const BLOCK: usize = 128;

/// One 128-byte control block.
///
/// Not `crossbeam_utils::CachePadded`: its size varies by target, and this
/// layout is a format that separately compiled processes must agree on.
#[repr(C, align(128))]
struct Block<T>(T);

#[repr(C)]
struct HeaderLine {
    capacity: AtomicU32,
    entry_size: AtomicU32,
    entry_align: AtomicU32,
    _pad: AtomicU32,
    format: AtomicU64,
}

#[repr(C)]
struct ProducerLine {
    tail: AtomicU32,
    closed: AtomicU32,
}

#[repr(C)]
struct ConsumerLine {
    head: AtomicU32,
}

#[repr(C)]
struct FlagsLine {
    flags: AtomicU32,
}

/// The shared control blocks at the start of the ring memory. All atomics,
/// because the other end may be another process.
#[repr(C)]
struct Control {
    header: Block<HeaderLine>,
    producer: Block<ProducerLine>,
    consumer: Block<ConsumerLine>,
    flags: Block<FlagsLine>,
}

const ENTRIES_OFFSET: usize = size_of::<Control>();
const _: () = assert!(ENTRIES_OFFSET == 4 * BLOCK);

/// Bytes a ring of `capacity` entries of `T` needs: the control blocks plus
/// the entries.
///
/// `capacity` must be a power of two in `2..=1 << 30`; for other values the
/// result is meaningless and the constructors report
/// [`RingError::BadCapacity`].
pub fn ring_bytes<T: Entry>(capacity: u32) -> usize {
    (capacity as usize)
        .saturating_mul(size_of::<T>())
        .saturating_add(ENTRIES_OFFSET)
}

/// Layout words to store in the [`Region`] header for a ring:
/// `[capacity, size_of::<T>(), align_of::<T>(), 0]`.
pub fn ring_layout<T: Entry>(capacity: u32) -> [u64; 4] {
    [
        u64::from(capacity),
        size_of::<T>() as u64,
        align_of::<T>() as u64,
        0,
    ]
}

/// The ring is full; the value is handed back.
#[derive(Debug)]
pub struct PushError<T>(pub T);

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring is full")
    }
}

impl<T: fmt::Debug> std::error::Error for PushError<T> {}

/// Why a ring could not be created or attached.
#[derive(Debug, PartialEq, Eq)]
pub enum RingError {
    /// The capacity is not a power of two in `2..=1 << 30`.
    BadCapacity(u32),
    /// The region's payload cannot hold the ring.
    TooSmall {
        /// Bytes the ring needs ([`ring_bytes`]).
        need: usize,
        /// Bytes the payload has.
        have: usize,
    },
    /// The region does not describe a ring of this entry type, or is not
    /// (or is already) initialised.
    Layout(String),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::BadCapacity(c) => write!(
                f,
                "ring capacity {c} is not a power of two in 2..={MAX_CAPACITY}"
            ),
            RingError::TooSmall { need, have } => {
                write!(f, "ring needs {need} bytes, region payload has {have}")
            }
            RingError::Layout(why) => write!(f, "ring layout: {why}"),
        }
    }
}

impl std::error::Error for RingError {}

fn check_capacity(capacity: u32) -> Result<(), RingError> {
    if capacity.is_power_of_two() && (2..=MAX_CAPACITY).contains(&capacity) {
        Ok(())
    } else {
        Err(RingError::BadCapacity(capacity))
    }
}

/// Heap-backed ring of `capacity` entries.
///
/// ```
/// use tent_rings::spsc;
///
/// let (mut tx, mut rx) = spsc::channel::<u64>(8)?;
/// tx.push(1).unwrap();
/// tx.push_slice(&[2, 3]);
/// assert_eq!(rx.pop(), None); // nothing published yet
/// tx.sync();
/// let mut out = [0; 4];
/// assert_eq!(rx.pop_into(&mut out), 3);
/// assert_eq!(&out[..3], &[1, 2, 3]);
/// rx.sync(); // hand the slots back to the producer
/// # Ok::<(), spsc::RingError>(())
/// ```
pub fn channel<T: Entry>(capacity: u32) -> Result<(Producer<T>, Consumer<T>), RingError> {
    check_capacity(capacity)?;
    let region = Region::heap(
        RegionType::Ring,
        ring_layout::<T>(capacity),
        ring_bytes::<T>(capacity),
    );
    init_in_region(Arc::new(region))
}

/// Initialise a fresh ring inside a region of type [`RegionType::Ring`]
/// created with layout [`ring_layout::<T>(capacity)`](ring_layout) and payload
/// length [`ring_bytes::<T>(capacity)`](ring_bytes); returns both ends.
///
/// Either end may be dropped and re-attached later, e.g. by another process
/// with [`producer_in_region`].
///
/// ```
/// use std::sync::Arc;
/// use tent_rings::entry::Sqe;
/// use tent_rings::region::{Region, RegionType};
/// use tent_rings::spsc;
///
/// let name = format!("tent-doc-ring-{}", std::process::id());
/// let region = Region::create_shm(&name, RegionType::Ring, spsc::ring_layout::<Sqe>(64),
///                                 spsc::ring_bytes::<Sqe>(64))?;
/// let (mut sq, _rx) = spsc::init_in_region::<Sqe>(Arc::new(region))?;
///
/// // Normally another process:
/// let theirs = Region::attach_shm(&name, RegionType::Ring, Some(spsc::ring_layout::<Sqe>(64)))?;
/// drop(_rx);
/// let mut rx = spsc::consumer_in_region::<Sqe>(Arc::new(theirs))?;
///
/// sq.push(Sqe::zeroed().with_user_data(5)).unwrap();
/// sq.sync();
/// assert_eq!(rx.pop().map(|s| s.user_data()), Some(5));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn init_in_region<T: Entry>(
    region: Arc<Region>,
) -> Result<(Producer<T>, Consumer<T>), RingError> {
    init_ring::<T>(&region)?;
    Ok((Producer::attach(region.clone())?, Consumer::attach(region)?))
}

/// Initialise a ring in `region` for another process to attach one end of
/// ([`producer_in_region`] / [`consumer_in_region`]): this process keeps
/// no end yet (an end dropped here would mark the ring closed).
pub fn init_ring<T: Entry>(region: &Arc<Region>) -> Result<(), RingError> {
    let raw = RawRing::<T>::new(region)?;
    let control = raw.control();
    // Acquire: pairs with the Release of a previous initialisation, so a
    // second init is reliably refused.
    if control.header.0.format.load(Ordering::Acquire) != 0 {
        return Err(RingError::Layout("ring is already initialised".into()));
    }
    let header = &control.header.0;
    // Relaxed: published by the Release store of `format` below.
    header.capacity.store(raw.capacity, Ordering::Relaxed);
    header
        .entry_size
        .store(size_of::<T>() as u32, Ordering::Relaxed);
    header
        .entry_align
        .store(align_of::<T>() as u32, Ordering::Relaxed);
    control.producer.0.tail.store(0, Ordering::Relaxed);
    control.producer.0.closed.store(0, Ordering::Relaxed);
    control.consumer.0.head.store(0, Ordering::Relaxed);
    control.flags.0.flags.store(0, Ordering::Relaxed);
    // Release: an attacher that Acquire-loads the format word sees the
    // geometry and zeroed indices above.
    header.format.store(RING_MAGIC, Ordering::Release);
    Ok(())
}

/// Attach the producer end to a ring that another process initialised
/// (validates capacity and entry size against the region's layout words).
///
/// At most one producer may be attached at a time; attaching clears the
/// "producer closed" flag.
pub fn producer_in_region<T: Entry>(region: Arc<Region>) -> Result<Producer<T>, RingError> {
    Producer::attach(region)
}

/// Attach the consumer end to a ring that another process initialised
/// (validates capacity and entry size against the region's layout words).
///
/// At most one consumer may be attached at a time.
pub fn consumer_in_region<T: Entry>(region: Arc<Region>) -> Result<Consumer<T>, RingError> {
    Consumer::attach(region)
}

/// What both ends share: pointers into the region, and the region itself.
struct RawRing<T> {
    control: NonNull<Control>,
    entries: NonNull<T>,
    capacity: u32,
    mask: u32,
    // Keeps the memory behind the pointers alive.
    region: Arc<Region>,
    _entries: PhantomData<T>,
}

impl<T: Entry> RawRing<T> {
    /// Validate the region's type, layout words, size and alignment for a ring
    /// of `T`, without looking at the ring memory itself.
    fn new(region: &Arc<Region>) -> Result<Self, RingError> {
        if region.region_type() != RegionType::Ring {
            return Err(RingError::Layout(format!(
                "region holds {:?}, not a Ring",
                region.region_type()
            )));
        }
        let layout = region.layout();
        let capacity = u32::try_from(layout[0]).unwrap_or(u32::MAX);
        check_capacity(capacity)?;
        if layout != ring_layout::<T>(capacity) {
            return Err(RingError::Layout(format!(
                "region layout {layout:?} does not describe a ring of {}-byte, {}-aligned entries",
                size_of::<T>(),
                align_of::<T>()
            )));
        }
        if align_of::<T>() > BLOCK {
            return Err(RingError::Layout(format!(
                "entry alignment {} exceeds {BLOCK}",
                align_of::<T>()
            )));
        }
        let need = ring_bytes::<T>(capacity);
        if region.payload_len() < need {
            return Err(RingError::TooSmall {
                need,
                have: region.payload_len(),
            });
        }
        let base = region.payload_ptr();
        if base as usize % BLOCK != 0 {
            return Err(RingError::Layout(format!(
                "region payload at {base:p} is not {BLOCK}-byte aligned"
            )));
        }
        let control = NonNull::new(base.cast::<Control>()).expect("region payload is null");
        // SAFETY: the payload holds at least ring_bytes() = ENTRIES_OFFSET + capacity * size_of::<T>() bytes, so the entries start in bounds.
        let entries = unsafe { control.cast::<u8>().add(ENTRIES_OFFSET) }.cast::<T>();
        Ok(RawRing {
            control,
            entries,
            capacity,
            mask: capacity - 1,
            region: Arc::clone(region),
            _entries: PhantomData,
        })
    }

    /// Like `new`, and also check that the ring was initialised with the same
    /// geometry.
    fn attach(region: Arc<Region>) -> Result<Self, RingError> {
        let raw = Self::new(&region)?;
        let header = &raw.control().header.0;
        // Acquire: pairs with the Release in init_in_region; the geometry and
        // indices read after this are the initialised ones.
        if header.format.load(Ordering::Acquire) != RING_MAGIC {
            return Err(RingError::Layout("ring is not initialised".into()));
        }
        // Relaxed: ordered by the Acquire load above.
        let capacity = header.capacity.load(Ordering::Relaxed);
        let entry_size = header.entry_size.load(Ordering::Relaxed);
        if capacity != raw.capacity || entry_size as usize != size_of::<T>() {
            return Err(RingError::Layout(format!(
                "ring was initialised with capacity {capacity} and {entry_size}-byte entries, \
                 region layout says {} and {}",
                raw.capacity,
                size_of::<T>()
            )));
        }
        Ok(raw)
    }

    fn control(&self) -> &Control {
        // SAFETY: `control` points to the start of the region payload, which `self.region` keeps alive, is 128-byte aligned and at least ENTRIES_OFFSET bytes long; Control is all atomics.
        unsafe { self.control.as_ref() }
    }

    /// The slot that free-running index `index` maps to.
    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: the mask keeps the offset below `capacity`, and the region holds `capacity` entries after the control blocks.
        unsafe { self.entries.as_ptr().add((index & self.mask) as usize) }
    }

    /// Copy `count` entries between `buf` and the ring, starting at ring
    /// index `index` and wrapping at the end of the slot array.
    ///
    /// # Safety
    /// `buf` must be valid for `count` reads (`to_ring`) or writes, not
    /// overlap the ring, and the caller must own the `count` slots.
    unsafe fn copy(&self, index: u32, buf: *mut T, count: usize, to_ring: bool) {
        let start = (index & self.mask) as usize;
        let first = count.min(self.capacity as usize - start);
        let wrapped = count - first;
        let (first_ring, wrapped_ring) = (self.slot(index), self.entries.as_ptr());
        // SAFETY: `buf` covers `count = first + wrapped` entries (caller); the ring holds `first` slots from `start` to the end of the array and `wrapped` from its start, which the caller owns.
        unsafe {
            let wrapped_buf = buf.add(first);
            if to_ring {
                ptr::copy_nonoverlapping(buf, first_ring, first);
                ptr::copy_nonoverlapping(wrapped_buf, wrapped_ring, wrapped);
            } else {
                ptr::copy_nonoverlapping(first_ring, buf, first);
                ptr::copy_nonoverlapping(wrapped_ring, wrapped_buf, wrapped);
            }
        }
    }
}

/// The writing end of a ring.
///
/// `Send` but not `Sync`: exactly one thread at a time pushes.
pub struct Producer<T: Entry> {
    ring: RawRing<T>,
    /// Next slot to write; runs ahead of the shared tail until `sync`.
    tail: u32,
    /// The value last stored to the shared tail.
    published_tail: u32,
    /// Last consumer head we loaded; the consumer may be further along.
    cached_head: u32,
}

// SAFETY: the handle only holds pointers into memory kept alive by its
// Arc<Region> (Send + Sync) and T: Send; the raw pointers are what make it
// !Sync, which is intended: one thread owns the producer side at a time.
unsafe impl<T: Entry> Send for Producer<T> {}

impl<T: Entry> Producer<T> {
    /// [`WRITE_AHEAD_BYTES`] in entries (at least one).
    const WRITE_AHEAD: u32 = {
        let n = match std::mem::size_of::<T>() {
            0 => 1,
            size => WRITE_AHEAD_BYTES / size,
        };
        if n == 0 { 1 } else { n as u32 }
    };

    fn attach(region: Arc<Region>) -> Result<Self, RingError> {
        let ring = RawRing::attach(region)?;
        let control = ring.control();
        // Acquire: pick up a previous producer's tail and the consumer's head
        // together with the slot contents they cover.
        let tail = control.producer.0.tail.load(Ordering::Acquire);
        let cached_head = control.consumer.0.head.load(Ordering::Acquire);
        // Relaxed: the flag carries no data; it only tells a consumer that a
        // producer exists again.
        control.producer.0.closed.store(0, Ordering::Relaxed);
        Ok(Producer {
            ring,
            tail,
            published_tail: tail,
            cached_head,
        })
    }

    /// Number of slots in the ring.
    pub fn capacity(&self) -> usize {
        self.ring.capacity as usize
    }

    /// Slots free according to the cached head. Saturating, so a corrupt head
    /// from a misbehaving peer reads as "full" rather than overflowing.
    fn free_cached(&self) -> u32 {
        self.ring
            .capacity
            .saturating_sub(self.tail.wrapping_sub(self.cached_head))
    }

    fn refresh_head(&mut self) -> u32 {
        // Acquire: pairs with the consumer's Release in `Consumer::sync`; its
        // reads of the slots it released happen before we overwrite them.
        self.cached_head = self.ring.control().consumer.0.head.load(Ordering::Acquire);
        self.free_cached()
    }

    /// Write `value` into the next slot and advance the local tail. The entry
    /// is not visible to the consumer until [`sync`](Producer::sync).
    ///
    /// No read-modify-write and no syscall; the shared head is loaded only
    /// when the cached copy says the ring is full.
    ///
    /// ```
    /// let (mut tx, _rx) = tent_rings::spsc::channel::<u64>(2)?;
    /// tx.push(1).unwrap();
    /// tx.push(2).unwrap();
    /// assert_eq!(tx.push(3).unwrap_err().0, 3); // full: value handed back
    /// # Ok::<(), tent_rings::spsc::RingError>(())
    /// ```
    pub fn push(&mut self, value: T) -> Result<(), PushError<T>> {
        if self.free_cached() == 0 && self.refresh_head() == 0 {
            return Err(PushError(value));
        }
        // SAFETY: the slot lies between the consumer's published head and head + capacity, so the consumer has released it and we own it.
        unsafe { self.ring.slot(self.tail).write(value) };
        self.tail = self.tail.wrapping_add(1);
        // The line of a slot some entries ahead was last read by the
        // consumer (a lap ago): claim it now, while it is free, so that
        // store does not stall younger ones behind its miss. Only a slot
        // the consumer has released: one it may still read would bounce.
        let ahead = Self::WRITE_AHEAD;
        if self.free_cached() > ahead {
            prefetch_write(self.ring.slot(self.tail.wrapping_add(ahead)));
        }
        Ok(())
    }

    /// Push as many of `values` as fit; returns how many were pushed. Like
    /// [`push`](Producer::push), nothing is visible until `sync`.
    pub fn push_slice(&mut self, values: &[T]) -> usize {
        let mut free = self.free_cached() as usize;
        if free < values.len() {
            free = self.refresh_head() as usize;
        }
        let n = free.min(values.len());
        // SAFETY: `values` is valid for n reads and is caller memory, not the ring; the n slots from `tail` are free (see `push`).
        unsafe {
            self.ring
                .copy(self.tail, values.as_ptr().cast_mut(), n, true)
        };
        self.tail = self.tail.wrapping_add(n as u32);
        n
    }

    /// Publish every locally pushed entry with one Release store of the tail
    /// (io_uring's `sync`). A no-op when nothing is pending.
    pub fn sync(&mut self) {
        if self.tail != self.published_tail {
            // Release: the slot writes before this become visible to a
            // consumer that Acquire-loads this tail.
            self.ring
                .control()
                .producer
                .0
                .tail
                .store(self.tail, Ordering::Release);
            self.published_tail = self.tail;
        }
    }

    /// The consumer's head (free-running), refreshed: how far it has read.
    /// From another process it is whatever that process wrote.
    pub fn consumer_head(&mut self) -> u32 {
        self.refresh_head();
        self.cached_head
    }

    /// Free slots, after refreshing the cached consumer head.
    pub fn slots(&mut self) -> usize {
        self.refresh_head() as usize
    }

    /// Are at least `n` slots free? Answers from the cached head and loads
    /// the shared one only when the cache says no (a worker asks this for
    /// every entry it accepts; the shared load is a cross-core miss).
    ///
    /// ```
    /// let (mut tx, _rx) = tent_rings::spsc::channel::<u64>(4)?;
    /// assert!(tx.has_slots(4));
    /// tx.push(1).unwrap();
    /// assert!(!tx.has_slots(4));
    /// # Ok::<(), tent_rings::spsc::RingError>(())
    /// ```
    #[inline]
    pub fn has_slots(&mut self, n: usize) -> bool {
        self.free_cached() as usize >= n || self.refresh_head() as usize >= n
    }

    /// Entries pushed locally but not yet published.
    pub fn pending(&self) -> usize {
        self.tail.wrapping_sub(self.published_tail) as usize
    }

    /// Entries pushed through this ring so far, wrapping (the local tail;
    /// a new ring starts at 0). With [`Consumer::popped`] of a ring that
    /// answers each entry with one, it says how many are still out.
    #[inline]
    pub fn pushed(&self) -> u32 {
        self.tail
    }

    /// After [`sync`](Producer::sync): does the consumer ask to be woken?
    ///
    /// This is the producer half of a Dekker pair with
    /// [`Consumer::prepare_park`]: tail store, SeqCst fence, flag load here;
    /// flag store, SeqCst fence, tail load there. At least one side sees the
    /// other's store, so a consumer never sleeps on entries it missed.
    ///
    /// ```
    /// let (mut tx, mut rx) = tent_rings::spsc::channel::<u64>(4)?;
    /// assert!(rx.prepare_park()); // empty: the consumer may sleep
    /// tx.push(1).unwrap();
    /// tx.sync();
    /// assert!(tx.needs_wakeup()); // so the producer must wake it
    /// rx.clear_need_wakeup();
    /// assert_eq!(rx.pop(), Some(1));
    /// # Ok::<(), tent_rings::spsc::RingError>(())
    /// ```
    pub fn needs_wakeup(&self) -> bool {
        // SeqCst fence: orders our earlier tail store before the flag load
        // below (a Release store alone may be reordered after a later load).
        fence(Ordering::SeqCst);
        // Relaxed: the fence pair provides the ordering; the flag carries no
        // data.
        self.ring.control().flags.0.flags.load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }

    #[cfg(test)]
    fn set_indices(&mut self, tail: u32, head: u32) {
        self.ring
            .control()
            .producer
            .0
            .tail
            .store(tail, Ordering::Relaxed);
        (self.tail, self.published_tail, self.cached_head) = (tail, tail, head);
    }
}

impl<T: Entry> Drop for Producer<T> {
    fn drop(&mut self) {
        self.sync();
        // Release: a consumer that Acquire-loads `closed == 1` also sees the
        // final tail published just above, so it can drain and retire.
        self.ring
            .control()
            .producer
            .0
            .closed
            .store(1, Ordering::Release);
    }
}

impl<T: Entry> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.ring.capacity)
            .field("tail", &self.tail)
            .field("published_tail", &self.published_tail)
            .field("cached_head", &self.cached_head)
            .field("shared", &self.ring.region.is_shared())
            .finish()
    }
}

/// The reading end of a ring.
///
/// `Send` but not `Sync`: exactly one thread at a time pops.
pub struct Consumer<T: Entry> {
    ring: RawRing<T>,
    /// Next slot to read; runs ahead of the shared head until `sync`.
    head: u32,
    /// The value last stored to the shared head.
    published_head: u32,
    /// Last producer tail we loaded; the producer may be further along.
    cached_tail: u32,
}

// SAFETY: as for Producer: memory kept alive by an Arc<Region> (Send + Sync),
// T: Send, and !Sync on purpose.
unsafe impl<T: Entry> Send for Consumer<T> {}

impl<T: Entry> Consumer<T> {
    fn attach(region: Arc<Region>) -> Result<Self, RingError> {
        let ring = RawRing::attach(region)?;
        let control = ring.control();
        // Acquire: pick up a previous consumer's head and the producer's
        // published entries.
        let head = control.consumer.0.head.load(Ordering::Acquire);
        let cached_tail = control.producer.0.tail.load(Ordering::Acquire);
        Ok(Consumer {
            ring,
            head,
            published_head: head,
            cached_tail,
        })
    }

    /// Number of slots in the ring.
    pub fn capacity(&self) -> usize {
        self.ring.capacity as usize
    }

    /// Entries available according to the cached tail. Clamped, so a corrupt
    /// tail from a misbehaving peer cannot make us read more than one lap.
    fn available_cached(&self) -> u32 {
        self.cached_tail
            .wrapping_sub(self.head)
            .min(self.ring.capacity)
    }

    fn refresh_tail(&mut self) -> u32 {
        // The next entry's line starts on its way while the tail's does: when
        // the tail shows it published, its entry is (nearly) here, so a new
        // entry costs one cross-core transfer in series, not two.
        prefetch(self.ring.slot(self.head));
        self.refresh_tail_quiet()
    }

    /// [`refresh_tail`](Self::refresh_tail) without the prefetch.
    #[inline]
    fn refresh_tail_quiet(&mut self) -> u32 {
        // Acquire: pairs with the producer's Release in `Producer::sync`, so
        // the entries up to this tail are fully written before we read them.
        self.cached_tail = self.ring.control().producer.0.tail.load(Ordering::Acquire);
        self.available_cached()
    }

    /// Take the next entry, or `None` if nothing is published.
    ///
    /// Reads from the cached tail and loads the shared one only when the ring
    /// looks empty. Advances the local head only: the slot goes back to the
    /// producer at the next [`sync`](Consumer::sync).
    pub fn pop(&mut self) -> Option<T> {
        if self.available_cached() == 0 && self.refresh_tail() == 0 {
            return None;
        }
        // SAFETY: the slot is below the published tail, so the producer has written it and will not touch it until we publish a head past it.
        let value = unsafe { self.ring.slot(self.head).read() };
        self.head = self.head.wrapping_add(1);
        Some(value)
    }

    /// Borrow the next entry without consuming it.
    pub fn peek(&mut self) -> Option<&T> {
        if self.available_cached() == 0 && self.refresh_tail() == 0 {
            return None;
        }
        // SAFETY: as in `pop`; the borrow of `self` prevents a `sync` that would hand the slot back while the reference lives.
        Some(unsafe { &*self.ring.slot(self.head) })
    }

    /// Pop up to `out.len()` entries into `out`; returns how many.
    pub fn pop_into(&mut self, out: &mut [T]) -> usize {
        let mut available = self.available_cached() as usize;
        if available < out.len() {
            available = self.refresh_tail() as usize;
        }
        let n = available.min(out.len());
        // SAFETY: `out` is valid for n writes and is caller memory; the n slots from `head` are published and not yet released (see `pop`).
        unsafe { self.ring.copy(self.head, out.as_mut_ptr(), n, false) };
        self.head = self.head.wrapping_add(n as u32);
        n
    }

    /// Publish the local head with one Release store, so the producer can
    /// reuse the slots. A no-op when nothing was consumed since the last sync.
    pub fn sync(&mut self) {
        if self.head != self.published_head {
            // Release: our reads of the released slots happen before the
            // producer's Acquire load of this head, hence before it rewrites
            // them.
            self.ring
                .control()
                .consumer
                .0
                .head
                .store(self.head, Ordering::Release);
            self.published_head = self.head;
        }
    }

    /// Entries available, after refreshing the cached tail.
    pub fn len(&mut self) -> usize {
        self.refresh_tail() as usize
    }

    /// Whether no entries are available (refreshes the cached tail). Each
    /// call also starts the next entry's cache line on its way, so a
    /// consumer waiting on one entry gets it with the tail that publishes
    /// it: the right wait for a round trip.
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// [`is_empty`](Self::is_empty) without touching the next entry's line:
    /// the wait while the producer has more entries coming. Its stores go
    /// into that line; fetched by every check of a spinning consumer, the
    /// line would be taken back from the producer before each of them
    /// (8 B WRITEs at 32 in flight: 13% of the rate).
    ///
    /// ```
    /// let (mut tx, mut rx) = tent_rings::spsc::channel::<u64>(4)?;
    /// assert!(rx.is_empty_quiet());
    /// tx.push(1).unwrap();
    /// tx.sync();
    /// assert!(!rx.is_empty_quiet());
    /// assert_eq!((tx.pushed(), rx.popped()), (1, 0));
    /// rx.pop();
    /// assert_eq!(rx.popped(), 1);
    /// # Ok::<(), tent_rings::spsc::RingError>(())
    /// ```
    #[inline]
    pub fn is_empty_quiet(&mut self) -> bool {
        self.available_cached() == 0 && self.refresh_tail_quiet() == 0
    }

    /// Entries popped from this ring so far, wrapping (the local head; a
    /// new ring starts at 0). See [`Producer::pushed`].
    #[inline]
    pub fn popped(&self) -> u32 {
        self.head
    }

    /// Ask to be woken, then check once more: returns `true` if the ring is
    /// still empty (the caller may park until the producer wakes it), `false`
    /// if entries arrived (the caller should
    /// [`clear_need_wakeup`](Consumer::clear_need_wakeup) and keep going).
    ///
    /// Publishes the head first: a parked consumer must not sit on slots the
    /// producer may be waiting for. See [`Producer::needs_wakeup`] for the
    /// other half of the protocol.
    pub fn prepare_park(&mut self) -> bool {
        self.sync();
        let flags = &self.ring.control().flags.0.flags;
        // Relaxed: the SeqCst fence below orders it before the tail load.
        flags.fetch_or(NEED_WAKEUP, Ordering::Relaxed);
        // SeqCst fence: Dekker pair with `Producer::needs_wakeup` — either the
        // producer sees NEED_WAKEUP, or we see its new tail.
        fence(Ordering::SeqCst);
        self.refresh_tail() == 0
    }

    /// Clear `NEED_WAKEUP` (after waking, or when `prepare_park` said no).
    pub fn clear_need_wakeup(&self) {
        // Relaxed: a producer that still sees the old flag only issues a
        // spurious wake-up.
        self.ring
            .control()
            .flags
            .0
            .flags
            .fetch_and(!NEED_WAKEUP, Ordering::Relaxed);
    }

    /// Whether the producer end has been dropped (and none re-attached), so a
    /// worker can retire the ring once it is drained.
    ///
    /// After this returns `true`, [`len`](Consumer::len) sees every entry the
    /// producer ever published.
    pub fn is_producer_closed(&self) -> bool {
        // Acquire: pairs with the Release in `Producer::drop`, ordering its
        // final tail publication before our later tail loads.
        self.ring
            .control()
            .producer
            .0
            .closed
            .load(Ordering::Acquire)
            != 0
    }

    #[cfg(test)]
    fn set_indices(&mut self, head: u32, tail: u32) {
        self.ring
            .control()
            .consumer
            .0
            .head
            .store(head, Ordering::Relaxed);
        (self.head, self.published_head, self.cached_tail) = (head, head, tail);
    }
}

impl<T: Entry> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.sync();
    }
}

impl<T: Entry> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.ring.capacity)
            .field("head", &self.head)
            .field("published_head", &self.published_head)
            .field("cached_tail", &self.cached_tail)
            .field("shared", &self.ring.region.is_shared())
            .finish()
    }
}

/// A heap ring whose indices start at `start`, to exercise `u32` wrap-around.
#[cfg(test)]
fn channel_starting_at<T: Entry>(capacity: u32, start: u32) -> (Producer<T>, Consumer<T>) {
    let (mut p, mut c) = channel(capacity).unwrap();
    p.set_indices(start, start);
    c.set_indices(start, start);
    (p, c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Cqe, LocalAddr, RegionId, RemoteAddr, SegmentId, Sqe};
    use crate::op;

    #[test]
    fn push_pop_full_empty() {
        let (mut p, mut c) = channel::<u64>(4).unwrap();
        assert_eq!(p.capacity(), 4);
        assert_eq!(c.capacity(), 4);
        assert_eq!(c.pop(), None);
        for v in 0..4 {
            p.push(v).unwrap();
        }
        assert_eq!(p.push(99).unwrap_err().0, 99);
        p.sync();
        assert_eq!(c.len(), 4);
        for v in 0..4 {
            assert_eq!(c.pop(), Some(v));
        }
        assert_eq!(c.pop(), None);
        assert!(c.is_empty());
    }

    #[test]
    fn wraps_around_the_slot_array() {
        let (mut p, mut c) = channel::<u64>(4).unwrap();
        for v in 0..100u64 {
            p.push(v).unwrap();
            if v % 3 == 0 {
                p.push_slice(&[]);
            }
            p.sync();
            assert_eq!(c.pop(), Some(v));
            c.sync();
        }
    }

    #[test]
    fn u32_indices_wrap() {
        for start in [u32::MAX - 2, u32::MAX, u32::MAX - 5] {
            let (mut p, mut c) = channel_starting_at::<u64>(4, start);
            let mut next = 0u64;
            let mut expect = 0u64;
            for _ in 0..10 {
                let batch: Vec<u64> = (next..next + 3).collect();
                let n = p.push_slice(&batch);
                next += n as u64;
                p.sync();
                let mut out = [0u64; 4];
                let got = c.pop_into(&mut out);
                for v in &out[..got] {
                    assert_eq!(*v, expect);
                    expect += 1;
                }
                c.sync();
            }
            assert_eq!(expect, 30);
            assert_eq!(p.slots(), 4);
        }
    }

    #[test]
    fn push_slice_is_partial_when_nearly_full() {
        let (mut p, mut c) = channel::<u64>(4).unwrap();
        assert_eq!(p.push_slice(&[1, 2, 3]), 3);
        assert_eq!(p.push_slice(&[4, 5, 6]), 1);
        assert_eq!(p.push_slice(&[7]), 0);
        assert_eq!(p.pending(), 4);
        p.sync();
        assert_eq!(p.pending(), 0);
        let mut out = [0; 3];
        assert_eq!(c.pop_into(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        // Popped but not synced: the producer still sees a full ring.
        assert_eq!(p.slots(), 0);
        c.sync();
        assert_eq!(p.slots(), 3);
        assert_eq!(c.peek(), Some(&4));
        assert_eq!(c.pop(), Some(4));
    }

    #[test]
    fn push_error_hands_value_back() {
        let (mut p, _c) = channel::<Sqe>(2).unwrap();
        let sqe = op::Write::new(
            LocalAddr::new(RegionId(1), 0),
            RemoteAddr::new(SegmentId(2), 0),
            8,
        )
        .user_data(42)
        .build();
        p.push(sqe).unwrap();
        p.push(sqe).unwrap();
        let err = p.push(sqe.with_user_data(43)).unwrap_err();
        assert_eq!(err.0.user_data(), 43);
        assert_eq!(err.to_string(), "ring is full");
    }

    #[test]
    fn nothing_is_visible_before_sync() {
        let (mut p, mut c) = channel::<u64>(8).unwrap();
        p.push(1).unwrap();
        p.push_slice(&[2, 3]);
        assert_eq!(c.pop(), None);
        assert_eq!(c.peek(), None);
        assert_eq!(c.len(), 0);
        p.sync();
        assert_eq!(c.len(), 3);
        assert_eq!(c.peek(), Some(&1));
        assert_eq!(c.pop(), Some(1));
    }

    #[test]
    fn need_wakeup_protocol() {
        let (mut p, mut c) = channel::<u64>(4).unwrap();
        assert!(!p.needs_wakeup());
        assert!(c.prepare_park());
        assert!(p.needs_wakeup());
        c.clear_need_wakeup();
        assert!(!p.needs_wakeup());

        // Entries arriving before the re-check: don't park.
        p.push(5).unwrap();
        p.sync();
        assert!(!c.prepare_park());
        c.clear_need_wakeup();
        assert_eq!(c.pop(), Some(5));
    }

    #[test]
    fn prepare_park_publishes_head() {
        let (mut p, mut c) = channel::<u64>(2).unwrap();
        p.push_slice(&[1, 2]);
        p.sync();
        assert_eq!(c.pop(), Some(1));
        assert_eq!(c.pop(), Some(2));
        assert_eq!(p.slots(), 0);
        assert!(c.prepare_park());
        assert_eq!(p.slots(), 2);
    }

    #[test]
    fn producer_closed_flag() {
        let (mut p, mut c) = channel::<u64>(4).unwrap();
        assert!(!c.is_producer_closed());
        p.push(7).unwrap();
        drop(p); // publishes the pending entry
        assert!(c.is_producer_closed());
        assert_eq!(c.pop(), Some(7));
    }

    #[test]
    fn consumer_drop_publishes_head() {
        let (mut p, mut c) = channel::<u64>(2).unwrap();
        p.push_slice(&[1, 2]);
        p.sync();
        assert_eq!(c.pop(), Some(1));
        drop(c);
        assert_eq!(p.slots(), 1);
    }

    #[test]
    fn bad_capacities() {
        for cap in [0, 1, 3, 6, (1 << 30) + 1, 1 << 31, u32::MAX] {
            assert_eq!(
                channel::<u64>(cap).unwrap_err(),
                RingError::BadCapacity(cap)
            );
        }
        assert!(channel::<u64>(2).is_ok());
    }

    #[test]
    fn ring_bytes_and_layout() {
        assert_eq!(ring_bytes::<Sqe>(4), 512 + 4 * 64);
        assert_eq!(ring_layout::<Sqe>(4), [4, 64, 64, 0]);
        assert_eq!(ring_layout::<u64>(8), [8, 8, 8, 0]);
    }

    #[test]
    fn region_validation() {
        let data = Arc::new(Region::heap(RegionType::Data, ring_layout::<u64>(4), 4096));
        assert!(matches!(
            init_in_region::<u64>(data),
            Err(RingError::Layout(_))
        ));

        let wrong_entry = Arc::new(Region::heap(RegionType::Ring, ring_layout::<u64>(4), 4096));
        assert!(matches!(
            init_in_region::<Sqe>(wrong_entry),
            Err(RingError::Layout(_))
        ));

        let small = Arc::new(Region::heap(RegionType::Ring, ring_layout::<Sqe>(4), 600));
        assert_eq!(
            init_in_region::<Sqe>(small).unwrap_err(),
            RingError::TooSmall {
                need: 768,
                have: 600
            }
        );

        let bad_cap = Arc::new(Region::heap(RegionType::Ring, ring_layout::<u64>(5), 4096));
        assert_eq!(
            init_in_region::<u64>(bad_cap).unwrap_err(),
            RingError::BadCapacity(5)
        );

        let fresh = Arc::new(Region::heap(RegionType::Ring, ring_layout::<u64>(4), 4096));
        assert!(matches!(
            producer_in_region::<u64>(fresh.clone()),
            Err(RingError::Layout(_))
        ));
        let (_p, _c) = init_in_region::<u64>(fresh.clone()).unwrap();
        assert!(matches!(
            init_in_region::<u64>(fresh),
            Err(RingError::Layout(_))
        ));
    }

    #[test]
    fn reattach_continues_where_the_old_end_stopped() {
        let region = Arc::new(Region::heap(
            RegionType::Ring,
            ring_layout::<u64>(4),
            ring_bytes::<u64>(4),
        ));
        let (mut p, c) = init_in_region::<u64>(region.clone()).unwrap();
        drop(c);
        p.push_slice(&[1, 2, 3]);
        p.sync();
        let mut c = consumer_in_region::<u64>(region.clone()).unwrap();
        assert_eq!(c.pop(), Some(1));
        drop(c);
        drop(p);
        let mut c = consumer_in_region::<u64>(region.clone()).unwrap();
        assert!(c.is_producer_closed());
        let p = producer_in_region::<u64>(region).unwrap();
        assert!(
            !c.is_producer_closed(),
            "attaching a producer reopens the ring"
        );
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), Some(3));
        assert_eq!(c.pop(), None);
        drop(p);
    }

    #[test]
    fn threads_move_a_million_entries_in_order() {
        let (mut p, mut c) = channel::<u64>(64).unwrap();
        const N: u64 = if cfg!(miri) { 2_000 } else { 1_000_000 };
        let producer = std::thread::spawn(move || {
            let mut next = 0u64;
            let mut batch = [0u64; 16];
            while next < N {
                for (i, slot) in batch.iter_mut().enumerate() {
                    *slot = next + i as u64;
                }
                let want = (N - next).min(16) as usize;
                let n = p.push_slice(&batch[..want]);
                next += n as u64;
                p.sync();
                if n == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut expect = 0u64;
        let mut out = [0u64; 32];
        while expect < N {
            let n = c.pop_into(&mut out);
            for v in &out[..n] {
                assert_eq!(*v, expect);
                expect += 1;
            }
            c.sync();
            if n == 0 {
                std::thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert!(c.is_producer_closed());
        assert!(c.is_empty());
    }

    #[test]
    fn handles_are_send() {
        fn check<T: Send>() {}
        check::<Producer<Sqe>>();
        check::<Consumer<Cqe>>();
        check::<PushError<u64>>();
    }

    #[test]
    fn debug_output() {
        let (p, c) = channel::<[u8; 64]>(2).unwrap();
        assert!(format!("{p:?}").contains("capacity: 2"));
        assert!(format!("{c:?}").contains("head: 0"));
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;
    use crate::region::HEADER_LEN;
    use std::fs::File;
    use std::os::fd::FromRawFd;

    /// An unlinked file of `len` zeroed bytes, as a memfd handed over a
    /// socket is.
    fn memfd(len: u64) -> File {
        // SAFETY: a NUL-terminated name; the flags are valid.
        let fd = unsafe { libc::memfd_create(c"tent-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "memfd_create and mmap of a file are not supported by Miri"
    )]
    fn a_ring_made_in_a_file_is_attached_through_another_mapping() {
        let cap = 8;
        let f = memfd((HEADER_LEN + ring_bytes::<u64>(cap)) as u64);
        let made = Arc::new(
            Region::create_in_file(
                &f,
                RegionType::Ring,
                ring_layout::<u64>(cap),
                ring_bytes::<u64>(cap),
            )
            .unwrap(),
        );
        init_ring::<u64>(&made).unwrap();
        let mut consumer = consumer_in_region::<u64>(made.clone()).unwrap();
        assert!(!consumer.is_producer_closed());
        // The other process: a second mapping of the same file.
        let theirs = Arc::new(Region::attach_file(&f, RegionType::Ring, None).unwrap());
        let mut producer = producer_in_region::<u64>(theirs).unwrap();
        producer.push(7).unwrap();
        producer.sync();
        assert_eq!(consumer.pop(), Some(7));
        drop(producer);
        assert!(consumer.is_producer_closed());
        drop(made);
        // Too short a file is refused, and so is one of another type.
        let short = memfd(HEADER_LEN as u64);
        assert!(Region::create_in_file(&short, RegionType::Ring, [0; 4], 4096).is_err());
        let data = memfd(HEADER_LEN as u64 + 64);
        drop(Region::create_in_file(&data, RegionType::Data, [0; 4], 64).unwrap());
        assert!(Region::attach_file(&data, RegionType::Ring, None).is_err());
    }
}
