//! Self-describing memory regions: on the heap, or in a `/dev/shm` file that
//! another process maps.
//!
//! Every region starts with a [`HEADER_LEN`]-byte header recording what it
//! holds (type, layout words, payload length, creator pid); the payload follows
//! at offset [`HEADER_LEN`]. The creator writes the header and publishes the
//! magic number *last*, so a process that attaches concurrently either sees a
//! complete header or [`RegionError::NotReady`].

use std::alloc::{self, Layout};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

/// Magic number in the first header word of every initialised region.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"TENTRGN1");
/// Header format version.
pub const REGION_VERSION: u32 = 1;
/// Header size; the payload starts at this offset.
pub const HEADER_LEN: usize = 128;

/// Alignment of the whole region (and so of the payload, since `HEADER_LEN`
/// is a multiple of it): two cache lines, which is what the rings' padded
/// index lines need.
const REGION_ALIGN: usize = 128;

/// What a region holds.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionType {
    /// An SPSC ring (see [`spsc`](crate::spsc)).
    Ring = 1,
    /// A registered memory segment.
    Segment = 2,
    /// A slot clock.
    SlotClock = 3,
    /// Plain data.
    Data = 4,
}

impl RegionType {
    /// The type with this tag, if any.
    pub fn from_u32(v: u32) -> Option<RegionType> {
        match v {
            1 => Some(RegionType::Ring),
            2 => Some(RegionType::Segment),
            3 => Some(RegionType::SlotClock),
            4 => Some(RegionType::Data),
            _ => None,
        }
    }
}

/// Why a region could not be created or attached.
#[derive(Debug)]
pub enum RegionError {
    /// Creating, opening, sizing or mapping the file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file does not start with [`REGION_MAGIC`].
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first header word.
        found: u64,
    },
    /// The header has another format version.
    Version {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// [`REGION_VERSION`].
        expected: u32,
    },
    /// The region holds something else.
    WrongType {
        /// The file.
        path: PathBuf,
        /// The type tag in the file.
        found: u32,
        /// The type asked for.
        expected: RegionType,
    },
    /// The layout words differ from the expected ones.
    Layout {
        /// The file.
        path: PathBuf,
        /// The layout words in the file.
        found: [u64; 4],
        /// The layout asked for (`u64::MAX` words are wildcards).
        expected: [u64; 4],
    },
    /// The header's payload length differs from the one asked for (a file
    /// of the same layout sized for another configuration, or truncated
    /// and re-published by another process).
    PayloadLen {
        /// The file.
        path: PathBuf,
        /// The payload length in the file's header.
        found: u64,
        /// The payload length asked for.
        expected: u64,
    },
    /// The file is shorter than its header says it should be.
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length needed.
        need: u64,
    },
    /// The file is not one this user alone controls (another owner, a
    /// mode others may write, not a regular file).
    Foreign {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The creator has not finished writing the header yet; retry later.
    NotReady {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io { path, source } => {
                write!(f, "region {}: {source}", path.display())
            }
            RegionError::BadMagic { path, found } => {
                write!(f, "region {}: bad magic {found:#018x}", path.display())
            }
            RegionError::Version {
                path,
                found,
                expected,
            } => write!(
                f,
                "region {}: header version {found}, expected {expected}",
                path.display()
            ),
            RegionError::WrongType {
                path,
                found,
                expected,
            } => write!(
                f,
                "region {}: type tag {found}, expected {expected:?}",
                path.display()
            ),
            RegionError::Layout {
                path,
                found,
                expected,
            } => write!(
                f,
                "region {}: layout {found:?}, expected {expected:?}",
                path.display()
            ),
            RegionError::PayloadLen {
                path,
                found,
                expected,
            } => write!(
                f,
                "region {}: payload of {found} bytes, expected {expected}",
                path.display()
            ),
            RegionError::TooSmall { path, len, need } => write!(
                f,
                "region {}: file is {len} bytes, need {need}",
                path.display()
            ),
            RegionError::Foreign { path, why } => {
                write!(f, "region {}: refused: {why}", path.display())
            }
            RegionError::NotReady { path } => {
                write!(f, "region {}: header not published yet", path.display())
            }
        }
    }
}

impl std::error::Error for RegionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegionError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The header at offset 0. Every field is atomic because another process may
/// read it while the creator is still writing it; `magic` is the publication
/// point.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    type_tag: AtomicU32,
    header_len: AtomicU32,
    _pad: AtomicU32,
    payload_len: AtomicU64,
    layout: [AtomicU64; 4],
    owner_pid: AtomicU32,
    _reserved: [AtomicU32; 15],
}

const _: () = assert!(size_of::<Header>() == HEADER_LEN);
const _: () = assert!(HEADER_LEN % REGION_ALIGN == 0);

impl Header {
    /// Fill in a zeroed header and publish it.
    fn publish(&self, ty: RegionType, layout: [u64; 4], payload_len: usize) {
        // Relaxed: nobody may read these until they observe `magic` below,
        // whose Release store orders them before it.
        self.version.store(REGION_VERSION, Ordering::Relaxed);
        self.type_tag.store(ty as u32, Ordering::Relaxed);
        self.header_len.store(HEADER_LEN as u32, Ordering::Relaxed);
        self.payload_len
            .store(payload_len as u64, Ordering::Relaxed);
        for (word, value) in self.layout.iter().zip(layout) {
            word.store(value, Ordering::Relaxed);
        }
        self.owner_pid.store(std::process::id(), Ordering::Relaxed);
        // Release: an attacher that Acquire-loads the magic sees every field
        // above, never a half-written header.
        self.magic.store(REGION_MAGIC, Ordering::Release);
    }

    fn layout(&self) -> [u64; 4] {
        // Relaxed: only read after the Acquire load of `magic` (or by the
        // creator itself), which already ordered the header writes before us.
        self.layout.each_ref().map(|w| w.load(Ordering::Relaxed))
    }
}

#[derive(Debug)]
enum Backing {
    Heap {
        layout: Layout,
    },
    Shm {
        // Held only to keep the mapping alive; `Region::base` points into it.
        _map: MmapRaw,
        path: PathBuf,
        owner: bool,
        persist: bool,
    },
}

/// Memory with a self-describing header: heap, or a file in `/dev/shm` mapped
/// with `MAP_SHARED` that another process attaches to.
///
/// The header fields returned by the accessors are the values validated when
/// the region was created or attached; later writes by another process do not
/// change them.
///
/// ```
/// use tent_rings::region::{Region, RegionType};
///
/// let name = format!("tent-doc-region-{}", std::process::id());
/// let created = Region::create_shm(&name, RegionType::Data, [1, 2, 3, 4], 4096)?;
/// let attached = Region::attach_shm(&name, RegionType::Data, Some([1, u64::MAX, 3, 4]))?;
/// assert_eq!(attached.payload_len(), 4096);
/// assert_eq!(attached.owner_pid(), std::process::id());
/// drop(attached);
/// drop(created); // the creator unlinks the file
/// # Ok::<(), tent_rings::region::RegionError>(())
/// ```
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    backing: Backing,
    ty: RegionType,
    layout: [u64; 4],
    payload_len: usize,
    owner_pid: u32,
}

// SAFETY: `base` is owned memory (a heap allocation or a mapping) that lives as
// long as the region; the region itself only touches it through the atomic
// header, and every other access goes through the raw `payload_ptr`, whose
// users take on the synchronisation duty.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` exposes nothing but atomics and a raw pointer.
unsafe impl Sync for Region {}

impl Region {
    /// A region of this process at `base`, its header published (what
    /// every constructor but an attach ends with).
    fn published(
        base: NonNull<u8>,
        backing: Backing,
        ty: RegionType,
        layout: [u64; 4],
        payload_len: usize,
    ) -> Region {
        let region = Region {
            base,
            backing,
            ty,
            layout,
            payload_len,
            owner_pid: std::process::id(),
        };
        region.header().publish(ty, layout, payload_len);
        region
    }

    /// A zeroed heap region with a 128-byte aligned payload.
    ///
    /// ```
    /// use tent_rings::region::{Region, RegionType};
    ///
    /// let r = Region::heap(RegionType::Data, [0; 4], 256);
    /// assert!(!r.is_shared());
    /// assert_eq!(r.payload_ptr() as usize % 128, 0);
    /// ```
    pub fn heap(ty: RegionType, layout: [u64; 4], payload_len: usize) -> Region {
        let alloc_layout = HEADER_LEN
            .checked_add(payload_len)
            .and_then(|size| Layout::from_size_align(size, REGION_ALIGN).ok())
            .expect("region payload length overflows the address space");
        // SAFETY: the layout has a non-zero size (at least HEADER_LEN).
        let raw = unsafe { alloc::alloc_zeroed(alloc_layout) };
        let Some(base) = NonNull::new(raw) else {
            alloc::handle_alloc_error(alloc_layout)
        };
        Region::published(
            base,
            Backing::Heap {
                layout: alloc_layout,
            },
            ty,
            layout,
            payload_len,
        )
    }

    /// Create `/dev/shm/<name>` (or `name` itself if it contains `'/'`)
    /// exclusively, sized `HEADER_LEN + payload_len` and zeroed, and publish
    /// its header. The creator unlinks the file on drop unless
    /// [`persist(true)`](Region::persist) is called.
    pub fn create_shm(
        name: &str,
        ty: RegionType,
        layout: [u64; 4],
        payload_len: usize,
    ) -> Result<Region, RegionError> {
        let path = shm_path(name);
        let io_err = |source| RegionError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err)?;
        // From here on the file is ours: remove it again if we fail.
        let map =
            Self::size_and_map(&file, HEADER_LEN as u64 + payload_len as u64).map_err(|e| {
                let _ = fs::remove_file(&path);
                io_err(e)
            })?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returned null");
        let region = Region::published(
            base,
            Backing::Shm {
                _map: map,
                path: path.clone(),
                owner: true,
                persist: false,
            },
            ty,
            layout,
            payload_len,
        );
        Ok(region)
    }

    /// Map `file`, an unlinked file another process may map too (a memfd
    /// handed over a unix socket, say), and publish a header for a payload
    /// of `payload_len` bytes. The file must already hold `HEADER_LEN +
    /// payload_len` zeroed bytes: its size is not changed here (a sealed
    /// memfd's cannot be). Nothing is unlinked on drop.
    pub fn create_in_file(
        file: &File,
        ty: RegionType,
        layout: [u64; 4],
        payload_len: usize,
    ) -> Result<Region, RegionError> {
        let path = PathBuf::from("(file)");
        let io_err = |source| RegionError::Io {
            path: path.clone(),
            source,
        };
        let need = (HEADER_LEN as u64).saturating_add(payload_len as u64);
        let len = file.metadata().map_err(io_err)?.len();
        if len < need {
            return Err(RegionError::TooSmall { path, len, need });
        }
        let map = MmapRaw::map_raw(file).map_err(io_err)?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returned null");
        let region = Region::published(
            base,
            Backing::Shm {
                _map: map,
                path,
                owner: false,
                persist: false,
            },
            ty,
            layout,
            payload_len,
        );
        Ok(region)
    }

    /// Map a region another process made with
    /// [`create_in_file`](Region::create_in_file) in `file`, checked as
    /// [`attach_shm`](Region::attach_shm) checks one.
    pub fn attach_file(
        file: &File,
        ty: RegionType,
        expect_layout: Option<[u64; 4]>,
    ) -> Result<Region, RegionError> {
        let path = PathBuf::from("(file)");
        let map = MmapRaw::map_raw(file).map_err(|source| RegionError::Io {
            path: path.clone(),
            source,
        })?;
        Self::validate(path, map, ty, expect_layout)
    }

    fn size_and_map(file: &File, len: u64) -> io::Result<MmapRaw> {
        // set_len on a fresh file leaves it zero-filled.
        file.set_len(len)?;
        MmapRaw::map_raw(file)
    }

    /// Map an existing region created (possibly by another process) with
    /// [`create_shm`](Region::create_shm).
    ///
    /// Checks, in order: the file is at least [`HEADER_LEN`] long (an empty
    /// file is reported as `NotReady`: the creator has not sized it yet), the
    /// magic (0 means `NotReady`), version, type, layout (if `expect_layout`
    /// is given; `u64::MAX` words match anything), and that the file holds the
    /// payload the header records. The file is not unlinked on drop.
    pub fn attach_shm(
        name: &str,
        ty: RegionType,
        expect_layout: Option<[u64; 4]>,
    ) -> Result<Region, RegionError> {
        let path = shm_path(name);
        let io_err = |source| RegionError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        if file_len == 0 {
            return Err(RegionError::NotReady { path: path.clone() });
        }
        if file_len < HEADER_LEN as u64 {
            return Err(RegionError::TooSmall {
                path: path.clone(),
                len: file_len,
                need: HEADER_LEN as u64,
            });
        }
        let map = MmapRaw::map_raw(&file).map_err(io_err)?;
        Self::validate(path, map, ty, expect_layout)
    }

    /// Check a mapped file's header as [`attach_shm`](Region::attach_shm)
    /// describes, and wrap the mapping (not unlinked on drop).
    fn validate(
        path: PathBuf,
        map: MmapRaw,
        ty: RegionType,
        expect_layout: Option<[u64; 4]>,
    ) -> Result<Region, RegionError> {
        // The file may have changed size since `metadata`; the mapping is what
        // we can actually touch.
        let map_len = map.len() as u64;
        if map_len < HEADER_LEN as u64 {
            return Err(RegionError::TooSmall {
                path,
                len: map_len,
                need: HEADER_LEN as u64,
            });
        }
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returned null");
        // SAFETY: the mapping is at least HEADER_LEN bytes, page aligned, and lives in `map` for the rest of this function (and then in the region).
        let header = unsafe { Self::header_at(base) };

        // Acquire: pairs with the creator's Release store of the magic, so the
        // fields read below are the ones it wrote.
        let magic = header.magic.load(Ordering::Acquire);
        if magic == 0 {
            return Err(RegionError::NotReady { path });
        }
        if magic != REGION_MAGIC {
            return Err(RegionError::BadMagic { path, found: magic });
        }
        // Relaxed (here and below): ordered by the Acquire load of the magic.
        let version = header.version.load(Ordering::Relaxed);
        if version != REGION_VERSION {
            return Err(RegionError::Version {
                path,
                found: version,
                expected: REGION_VERSION,
            });
        }
        let type_tag = header.type_tag.load(Ordering::Relaxed);
        if type_tag != ty as u32 {
            return Err(RegionError::WrongType {
                path,
                found: type_tag,
                expected: ty,
            });
        }
        let layout = header.layout();
        if let Some(expected) = expect_layout {
            let matches = layout
                .iter()
                .zip(expected)
                .all(|(&found, want)| want == u64::MAX || found == want);
            if !matches {
                return Err(RegionError::Layout {
                    path,
                    found: layout,
                    expected,
                });
            }
        }
        let payload_len = header.payload_len.load(Ordering::Relaxed);
        let need = payload_len.saturating_add(HEADER_LEN as u64);
        if map_len < need {
            return Err(RegionError::TooSmall {
                path,
                len: map_len,
                need,
            });
        }
        let owner_pid = header.owner_pid.load(Ordering::Relaxed);
        Ok(Region {
            base,
            backing: Backing::Shm {
                _map: map,
                path,
                owner: false,
                persist: false,
            },
            ty,
            layout,
            // Fits: it is at most the mapping length, which is a usize.
            payload_len: payload_len as usize,
            owner_pid,
        })
    }

    /// Open the region at `name` that processes share, creating it when no
    /// file is there: the rendezvous of peers that may start in any order
    /// and outlive each other (the slot clock). Returns the region and
    /// whether this call initialised it.
    ///
    /// Creation and checking happen under an exclusive `flock` on the file
    /// (waited for at most one second: a holder only holds it to
    /// initialise), so two processes starting together never both
    /// initialise it, and a file whose creator died before publishing its
    /// header (magic still 0) is initialised again rather than reported
    /// `NotReady` forever. The file is opened without following a symlink,
    /// created mode 0600, and must be a regular file owned by this
    /// process's effective user whom nobody else may write (`Foreign`
    /// otherwise); an initialised file is checked exactly as
    /// [`attach_shm`](Region::attach_shm) checks one. The file is never
    /// unlinked on drop: whoever joins later must find it.
    pub fn open_or_create_shm(
        name: &str,
        ty: RegionType,
        layout: [u64; 4],
        payload_len: usize,
    ) -> Result<(Region, bool), RegionError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

        let path = shm_path(name);
        let io_err = |source| RegionError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let foreign = |why: String| RegionError::Foreign {
            path: path.clone(),
            why,
        };
        if !meta.file_type().is_file() {
            return Err(foreign("not a regular file".into()));
        }
        if meta.uid() != euid {
            return Err(foreign(format!(
                "owned by uid {}, this process runs as uid {euid}",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(foreign(format!(
                "mode {:o} lets other users write it",
                meta.mode() & 0o777
            )));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            // SAFETY: flock on a descriptor this function owns and keeps open until `_unlock` below has unlocked it.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io_err(e));
            }
            if std::time::Instant::now() >= deadline {
                return Err(io_err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "another process held its lock for over 1 s",
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // A mapping keeps the open file description (and so its lock) alive
        // after `file` closes: unlock explicitly on every way out.
        struct Unlock(i32);
        impl Drop for Unlock {
            fn drop(&mut self) {
                // SAFETY: unlocks the descriptor locked above, still open (declared after `file`, so dropped before it).
                unsafe { libc::flock(self.0, libc::LOCK_UN) };
            }
        }
        let _unlock = Unlock(file.as_raw_fd());
        let size = HEADER_LEN as u64 + payload_len as u64;
        let len = file.metadata().map_err(io_err)?.len();
        if len >= HEADER_LEN as u64 {
            let map = MmapRaw::map_raw(&file).map_err(io_err)?;
            let base = NonNull::new(map.as_mut_ptr()).expect("mmap returned null");
            // SAFETY: the mapping is at least HEADER_LEN bytes, page aligned, and lives in `map` while `header` is used.
            let header = unsafe { Self::header_at(base) };
            // Acquire: pairs with the Release store that published it.
            if header.magic.load(Ordering::Acquire) != 0 {
                let region = Self::validate(path.clone(), map, ty, Some(layout))?;
                if region.payload_len != payload_len {
                    return Err(RegionError::PayloadLen {
                        path,
                        found: region.payload_len as u64,
                        expected: payload_len as u64,
                    });
                }
                return Ok((region, false));
            }
        } else if len != 0 {
            return Err(RegionError::TooSmall {
                path,
                len,
                need: HEADER_LEN as u64,
            });
        }
        // Empty, or a creator died before publishing (we hold the lock, so
        // nobody is writing it): start from zeroes.
        file.set_len(0).map_err(io_err)?;
        let map = Self::size_and_map(&file, size).map_err(io_err)?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returned null");
        let region = Region::published(
            base,
            Backing::Shm {
                _map: map,
                path,
                owner: false,
                persist: true,
            },
            ty,
            layout,
            payload_len,
        );
        Ok((region, true))
    }

    /// # Safety
    /// `base` must point to at least `HEADER_LEN` readable, writable bytes,
    /// 8-byte aligned, that outlive `'a`.
    unsafe fn header_at<'a>(base: NonNull<u8>) -> &'a Header {
        // SAFETY: guaranteed by the caller; Header is all atomics, so shared references to memory other processes write are fine.
        unsafe { base.cast::<Header>().as_ref() }
    }

    fn header(&self) -> &Header {
        // SAFETY: every region owns at least HEADER_LEN bytes at `base`, REGION_ALIGN- or page-aligned, for as long as `self` lives.
        unsafe { Self::header_at(self.base) }
    }

    /// What the region holds.
    pub fn region_type(&self) -> RegionType {
        self.ty
    }

    /// The layout words recorded in the header.
    pub fn layout(&self) -> [u64; 4] {
        self.layout
    }

    /// Start of the payload; aligned to at least 128 bytes.
    pub fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: the region is HEADER_LEN + payload_len bytes long, so the payload start is in bounds (or one past the end if it is empty).
        unsafe { self.base.as_ptr().add(HEADER_LEN) }
    }

    /// Payload length in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// The backing file, if the region is shared.
    pub fn path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Heap { .. } => None,
            Backing::Shm { path, .. } => Some(path),
        }
    }

    /// Pid of the process that created the region.
    pub fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    /// Whether the region is a shared-memory file.
    pub fn is_shared(&self) -> bool {
        matches!(self.backing, Backing::Shm { .. })
    }

    /// For the creator: keep the file on drop when `keep_file` is true. Has
    /// no effect on attached or heap regions.
    pub fn persist(&mut self, keep_file: bool) {
        if let Backing::Shm { persist, .. } = &mut self.backing {
            *persist = keep_file;
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Heap { layout } => {
                // SAFETY: `base` came from `alloc_zeroed(*layout)` in `heap` and is freed only here.
                unsafe { alloc::dealloc(self.base.as_ptr(), *layout) }
            }
            Backing::Shm {
                path,
                owner,
                persist,
                ..
            } => {
                if *owner && !*persist {
                    // Best effort: the name may already be gone, and the
                    // mapping itself is released when `_map` drops.
                    let _ = fs::remove_file(path);
                }
            }
        }
    }
}

/// The file a region name refers to: `name` itself if it contains `'/'`,
/// otherwise `/dev/shm/<name>`.
///
/// ```
/// use std::path::Path;
/// use tent_rings::region::shm_path;
///
/// assert_eq!(shm_path("sq0"), Path::new("/dev/shm/sq0"));
/// assert_eq!(shm_path("/tmp/sq0"), Path::new("/tmp/sq0"));
/// ```
pub fn shm_path(name: &str) -> PathBuf {
    if name.contains('/') {
        PathBuf::from(name)
    } else {
        Path::new("/dev/shm").join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn unique_name(tag: &str) -> String {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        format!("tent-rings-unit-{tag}-{}-{n}", std::process::id())
    }

    /// Removes a file the test wrote by hand, even if the test fails.
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }

    /// A file of the same layout with another payload length is refused
    /// saying so (it was refused as "layout [..], expected [..]" with the
    /// two layouts equal).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn a_payload_of_another_length_is_refused_naming_the_lengths() {
        let name = unique_name("paylen");
        let _keep =
            Region::open_or_create_shm(&name, RegionType::Data, [2, 4160, 0, 0], 4096).unwrap();
        let _cleanup = Cleanup(shm_path(&name));
        let err =
            Region::open_or_create_shm(&name, RegionType::Data, [2, 4160, 0, 0], 8192).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::PayloadLen {
                    found: 4096,
                    expected: 8192,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("payload of 4096 bytes, expected 8192"),
            "{err}"
        );
    }

    #[test]
    fn heap_region() {
        let r = Region::heap(RegionType::Segment, [1, 2, 3, 4], 1000);
        assert_eq!(r.region_type(), RegionType::Segment);
        assert_eq!(r.layout(), [1, 2, 3, 4]);
        assert_eq!(r.payload_len(), 1000);
        assert_eq!(r.payload_ptr() as usize % 128, 0);
        assert_eq!(r.path(), None);
        assert!(!r.is_shared());
        assert_eq!(r.owner_pid(), std::process::id());
        assert_eq!(r.header().magic.load(Ordering::Acquire), REGION_MAGIC);
        // SAFETY: the payload is 1000 zeroed bytes owned by `r`.
        let payload = unsafe { std::slice::from_raw_parts(r.payload_ptr(), 1000) };
        assert!(payload.iter().all(|&b| b == 0));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn create_then_attach_shares_memory() {
        let name = unique_name("share");
        let a = Region::create_shm(&name, RegionType::Data, [7, 8, 9, 10], 4096).unwrap();
        let b = Region::attach_shm(&name, RegionType::Data, Some([7, 8, 9, 10])).unwrap();
        assert!(a.is_shared() && b.is_shared());
        assert_eq!(a.path(), Some(shm_path(&name).as_path()));
        assert_eq!(b.layout(), [7, 8, 9, 10]);
        assert_eq!(b.payload_len(), 4096);
        assert_eq!(b.owner_pid(), std::process::id());
        assert_eq!(b.payload_ptr() as usize % 128, 0);
        // SAFETY: both payloads are 4096 bytes of the same file, and only this thread touches them.
        unsafe {
            a.payload_ptr().add(4095).write(0xab);
            assert_eq!(b.payload_ptr().add(4095).read(), 0xab);
        }
        drop(b);
        assert!(shm_path(&name).exists(), "attacher must not unlink");
        drop(a);
        assert!(!shm_path(&name).exists(), "owner unlinks");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn open_or_create_initialises_once_and_keeps_the_file() {
        let name = unique_name("rendezvous");
        let _clean = Cleanup(shm_path(&name));
        let (a, created) =
            Region::open_or_create_shm(&name, RegionType::SlotClock, [1, 0, 0, 0], 256).unwrap();
        assert!(created);
        // SAFETY: 256 payload bytes, only this thread writes them.
        unsafe { a.payload_ptr().write(7) };
        let (b, created) =
            Region::open_or_create_shm(&name, RegionType::SlotClock, [1, 0, 0, 0], 256).unwrap();
        assert!(!created, "the second opener joins");
        // SAFETY: as above, the same file.
        assert_eq!(unsafe { b.payload_ptr().read() }, 7);
        drop((a, b));
        assert!(shm_path(&name).exists(), "nobody unlinks a rendezvous");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(shm_path(&name)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another format (layout word) or type is refused, naming the path.
        let e = Region::open_or_create_shm(&name, RegionType::SlotClock, [2, 0, 0, 0], 256)
            .unwrap_err();
        assert!(matches!(e, RegionError::Layout { .. }), "{e}");
        assert!(e.to_string().contains(&name), "{e}");
        let e = Region::open_or_create_shm(&name, RegionType::Data, [1, 0, 0, 0], 256).unwrap_err();
        assert!(matches!(e, RegionError::WrongType { .. }), "{e}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn open_or_create_recovers_a_half_made_file_and_refuses_foreign_ones() {
        use std::os::unix::fs::PermissionsExt;
        let name = unique_name("half");
        let path = shm_path(&name);
        let _clean = Cleanup(path.clone());
        // A creator that died after sizing, before publishing its header.
        fs::write(&path, vec![0u8; HEADER_LEN + 256]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let (_r, created) =
            Region::open_or_create_shm(&name, RegionType::SlotClock, [1, 0, 0, 0], 256).unwrap();
        assert!(created, "an unpublished file is initialised again");
        // Somebody else's format.
        let foreign = unique_name("foreign");
        let _clean2 = Cleanup(shm_path(&foreign));
        fs::write(shm_path(&foreign), [0x5au8; 512]).unwrap();
        fs::set_permissions(shm_path(&foreign), fs::Permissions::from_mode(0o600)).unwrap();
        let e = Region::open_or_create_shm(&foreign, RegionType::SlotClock, [1, 0, 0, 0], 256)
            .unwrap_err();
        assert!(matches!(e, RegionError::BadMagic { .. }), "{e}");
        // A file others may write.
        fs::set_permissions(shm_path(&foreign), fs::Permissions::from_mode(0o666)).unwrap();
        let e = Region::open_or_create_shm(&foreign, RegionType::SlotClock, [1, 0, 0, 0], 256)
            .unwrap_err();
        assert!(matches!(e, RegionError::Foreign { .. }), "{e}");
        assert!(e.to_string().contains(&foreign), "{e}");
        // A symlink is not followed.
        let link = unique_name("link");
        let _clean3 = Cleanup(shm_path(&link));
        std::os::unix::fs::symlink(&path, shm_path(&link)).unwrap();
        let e = Region::open_or_create_shm(&link, RegionType::SlotClock, [1, 0, 0, 0], 256)
            .unwrap_err();
        assert!(matches!(e, RegionError::Io { .. }), "{e}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn create_is_exclusive_and_persist_keeps_file() {
        let name = unique_name("excl");
        let mut a = Region::create_shm(&name, RegionType::Data, [0; 4], 64).unwrap();
        let _cleanup = Cleanup(shm_path(&name));
        let err = Region::create_shm(&name, RegionType::Data, [0; 4], 64).unwrap_err();
        assert!(matches!(err, RegionError::Io { .. }), "{err}");
        a.persist(true);
        drop(a);
        assert!(shm_path(&name).exists());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_missing_file_is_io() {
        let err = Region::attach_shm(&unique_name("missing"), RegionType::Data, None).unwrap_err();
        match err {
            RegionError::Io { source, .. } => assert_eq!(source.kind(), io::ErrorKind::NotFound),
            other => panic!("{other}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_garbage_is_bad_magic() {
        let name = unique_name("garbage");
        let _cleanup = Cleanup(shm_path(&name));
        fs::write(shm_path(&name), [0x5a; 4096]).unwrap();
        let err = Region::attach_shm(&name, RegionType::Data, None).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::BadMagic {
                    found: 0x5a5a_5a5a_5a5a_5a5a,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_wrong_version() {
        let name = unique_name("version");
        let a = Region::create_shm(&name, RegionType::Data, [0; 4], 64).unwrap();
        a.header()
            .version
            .store(REGION_VERSION + 1, Ordering::Relaxed);
        let err = Region::attach_shm(&name, RegionType::Data, None).unwrap_err();
        assert!(
            matches!(err, RegionError::Version { found, expected: REGION_VERSION, .. } if found == REGION_VERSION + 1),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_wrong_type() {
        let name = unique_name("type");
        let _a = Region::create_shm(&name, RegionType::Ring, [0; 4], 64).unwrap();
        let err = Region::attach_shm(&name, RegionType::Segment, None).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::WrongType {
                    found: 1,
                    expected: RegionType::Segment,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_layout_mismatch_and_wildcards() {
        let name = unique_name("layout");
        let _a = Region::create_shm(&name, RegionType::Ring, [16, 64, 64, 0], 64).unwrap();
        let err = Region::attach_shm(&name, RegionType::Ring, Some([32, 64, 64, 0])).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::Layout {
                    found: [16, 64, 64, 0],
                    expected: [32, 64, 64, 0],
                    ..
                }
            ),
            "{err}"
        );
        let any = [u64::MAX; 4];
        Region::attach_shm(&name, RegionType::Ring, Some(any)).unwrap();
        Region::attach_shm(&name, RegionType::Ring, Some([16, u64::MAX, 64, 0])).unwrap();
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_too_small() {
        let name = unique_name("small");
        let _cleanup = Cleanup(shm_path(&name));
        fs::write(shm_path(&name), [0u8; 64]).unwrap();
        let err = Region::attach_shm(&name, RegionType::Data, None).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::TooSmall {
                    len: 64,
                    need: 128,
                    ..
                }
            ),
            "{err}"
        );

        // A valid header whose payload was cut off.
        let name = unique_name("truncated");
        let a = Region::create_shm(&name, RegionType::Data, [0; 4], 4096).unwrap();
        let file = OpenOptions::new()
            .write(true)
            .open(a.path().unwrap())
            .unwrap();
        file.set_len(HEADER_LEN as u64 + 100).unwrap();
        let err = Region::attach_shm(&name, RegionType::Data, None).unwrap_err();
        assert!(
            matches!(
                err,
                RegionError::TooSmall {
                    len: 228,
                    need: 4224,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "/dev/shm file: Miri cannot open or mmap files under isolation"
    )]
    fn attach_before_publish_is_not_ready() {
        let name = unique_name("notready");
        let a = Region::create_shm(&name, RegionType::Data, [0; 4], 64).unwrap();
        a.header().magic.store(0, Ordering::Relaxed);
        let err = Region::attach_shm(&name, RegionType::Data, None).unwrap_err();
        assert!(matches!(err, RegionError::NotReady { .. }), "{err}");

        let empty = unique_name("empty");
        let _cleanup = Cleanup(shm_path(&empty));
        File::create(shm_path(&empty)).unwrap();
        let err = Region::attach_shm(&empty, RegionType::Data, None).unwrap_err();
        assert!(matches!(err, RegionError::NotReady { .. }), "{err}");
    }

    #[test]
    fn region_type_tags() {
        for t in [
            RegionType::Ring,
            RegionType::Segment,
            RegionType::SlotClock,
            RegionType::Data,
        ] {
            assert_eq!(RegionType::from_u32(t as u32), Some(t));
        }
        assert_eq!(RegionType::from_u32(0), None);
        assert_eq!(RegionType::from_u32(5), None);
    }

    #[test]
    fn errors_display_path() {
        let e = RegionError::NotReady {
            path: PathBuf::from("/dev/shm/x"),
        };
        assert!(e.to_string().contains("/dev/shm/x"));
    }

    #[test]
    fn region_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Region>();
    }
}
