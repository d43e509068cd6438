//! The shm segment descriptor's layout, and the one parser that admits what
//! another process wrote into it.
//!
//! A descriptor is a sealed memfd of [`DESC_BYTES`] bytes: [`HEADER_WORDS`]
//! header words (seqlock sequence, entry count, [`DESC_MAGIC`]) then up to
//! [`DESC_CAPACITY`] entries of [`ENTRY_WORDS`] words (region id, base
//! address in the owner, length, key, handle, key slot), then
//! [`DESC_CAPACITY`] *live-key* words from [`KEY_WORDS_AT`]: slot `s` holds
//! the key of the region whose entry names `s` while it is registered, and
//! 0 once the owner revokes it. The live keys are in the descriptor, not in
//! the regions, because the descriptor is write-sealed against every
//! process but the owner's own mapping: a peer, which must be able to
//! write a region's bytes, can then not write a revoked region's key back
//! and keep other peers writing into memory the owner gave up. A region is
//! a sealed memfd of `DATA_OFFSET + len` bytes that the owner hands out by
//! handle.
//!
//! Everything here is pure: the peer copies the words out under the
//! seqlock, then [`parse`] decides, with checked arithmetic, whether they
//! describe a sane set of regions, and [`admit_memfd`] whether a handed-out
//! file may be mapped for one. Both are fuzzed (`fuzz/fuzz_targets/
//! shm_descriptor.rs`) and property-tested.

/// Region entries a descriptor can list.
pub const DESC_CAPACITY: usize = 1024;
/// Header words: sequence, count, magic, five reserved.
pub(crate) const HEADER_WORDS: usize = 8;
/// Words per entry: id, base, len, key, handle, key slot, two reserved.
pub(crate) const ENTRY_WORDS: usize = 8;
/// The first live-key word (one per slot, [`DESC_CAPACITY`] of them).
pub(crate) const KEY_WORDS_AT: usize = HEADER_WORDS + DESC_CAPACITY * ENTRY_WORDS;
/// Size of the descriptor memfd.
pub const DESC_BYTES: usize = (KEY_WORDS_AT + DESC_CAPACITY) * 8;
/// Header word 2: layout identity ("TENTSHD3": live keys in the
/// descriptor; a peer of layout 2 refuses it, and is refused).
pub(crate) const DESC_MAGIC: u64 = u64::from_le_bytes(*b"TENTSHD3");
/// Where user data starts inside a region memfd (page aligned; the first
/// page is reserved and unused since the live keys moved to the
/// descriptor).
pub const DATA_OFFSET: usize = 4096;
/// Largest region length admitted (64 TiB): far beyond any allocation, far
/// below where `DATA_OFFSET + len` or an mmap length could overflow.
pub const MAX_REGION_LEN: u64 = 1 << 46;
/// Longest segment name.
pub(crate) const MAX_NAME_LEN: usize = 200;

/// Seals a peer requires before it maps a memfd: without them the owner
/// could shrink the file under the mapping (SIGBUS in the peer).
pub const REQUIRED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Seals a peer requires on the descriptor memfd as well: the owner must
/// have sealed it against writes by anyone but its own (earlier) mapping,
/// so no peer can write the words other peers read.
pub const DESC_WRITE_SEALS: i32 = libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE;

/// One region, as admitted from a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmEntry {
    /// Region id in the owner's engine (fits a `RegionId`).
    pub id: u32,
    /// Start address in the owner's address space.
    pub base: u64,
    /// Length in bytes: `0 < len <= MAX_REGION_LEN`, `base + len` does not wrap.
    pub len: u64,
    /// The key the region's live word must hold (never 0).
    pub key: u64,
    /// The owner's handle for the region's memfd (never 0).
    pub handle: u64,
    /// Its live-key word: `KEY_WORDS_AT + slot` (`slot < DESC_CAPACITY`,
    /// no two entries share one).
    pub slot: u32,
}

impl ShmEntry {
    /// One past the last byte (cannot overflow for an admitted entry).
    pub(crate) fn end(&self) -> u64 {
        self.base + self.len
    }
}

/// Why a descriptor, a handed-out file or a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescError {
    /// Fewer words than the header needs.
    #[error("descriptor of {0} words is shorter than its header")]
    Short(usize),
    /// Header word 2 is not [`DESC_MAGIC`].
    #[error("descriptor magic {0:#018x} is not tent's")]
    Magic(u64),
    /// More entries than [`DESC_CAPACITY`], or than the words hold.
    #[error("descriptor lists {0} regions (at most {DESC_CAPACITY})")]
    Count(u64),
    /// An entry's length is 0 or above [`MAX_REGION_LEN`].
    #[error("region {index}: length {len} out of range")]
    Len {
        /// Entry index.
        index: usize,
        /// Its length.
        len: u64,
    },
    /// `base + len` wraps past 2^64.
    #[error("region {index}: base {base:#x} + length {len} wraps")]
    Wraps {
        /// Entry index.
        index: usize,
        /// Its base.
        base: u64,
        /// Its length.
        len: u64,
    },
    /// Key or handle 0, an id that is no `RegionId`, or a live-key slot
    /// past the key words.
    #[error("region {index}: zero key/handle, or id {id} or its key slot out of range")]
    Field {
        /// Entry index.
        index: usize,
        /// Its id word.
        id: u64,
    },
    /// Two regions share bytes.
    #[error("regions at {a:#x} and {b:#x} overlap")]
    Overlap {
        /// Lower base.
        a: u64,
        /// Higher base.
        b: u64,
    },
    /// Two entries share an id, a handle or a live-key slot.
    #[error("two regions share id, handle or key slot")]
    Duplicate,
    /// A region's memfd is sealed against writes: a peer could map it
    /// only read-only, and every WRITE into it would fail.
    #[error("handed-out region memfd is write-sealed (seals {0:#x}): peers write regions")]
    RegionWriteSealed(i32),
    /// The handed-out file is not a sealed regular memfd.
    #[error("handed-out file is not a shrink/grow-sealed memfd (seals {0:#x})")]
    Unsealed(i32),
    /// The handed-out descriptor is not sealed against writes by peers.
    #[error("handed-out descriptor is writable by peers (seals {0:#x}, no write seal)")]
    Writable(i32),
    /// The handed-out file is shorter than what would be mapped.
    #[error("handed-out file holds {size} bytes, {need} would be mapped")]
    FileTooSmall {
        /// Its size.
        size: u64,
        /// Bytes the mapping needs.
        need: u64,
    },
    /// A segment name that could name something outside the shm dir.
    #[error("bad segment name {0:?}")]
    Name(String),
}

/// Decide whether `words` (a copy of a descriptor taken under its seqlock)
/// describes a sane set of regions; returns them sorted by base.
///
/// # Errors
/// Any [`DescError`] but `Unsealed`, `FileTooSmall`, `Name`.
pub fn parse(words: &[u64]) -> Result<Vec<ShmEntry>, DescError> {
    if words.len() < HEADER_WORDS {
        return Err(DescError::Short(words.len()));
    }
    if words[2] != DESC_MAGIC {
        return Err(DescError::Magic(words[2]));
    }
    let count_word = words[1];
    let count = usize::try_from(count_word)
        .ok()
        .filter(|&c| c <= DESC_CAPACITY)
        .ok_or(DescError::Count(count_word))?;
    let needed = count
        .checked_mul(ENTRY_WORDS)
        .and_then(|n| n.checked_add(HEADER_WORDS))
        .ok_or(DescError::Count(count_word))?;
    if needed > words.len() {
        return Err(DescError::Count(count_word));
    }
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        let w = &words[HEADER_WORDS + index * ENTRY_WORDS..][..ENTRY_WORDS];
        let (id, base, len, key, handle, slot) = (w[0], w[1], w[2], w[3], w[4], w[5]);
        if len == 0 || len > MAX_REGION_LEN {
            return Err(DescError::Len { index, len });
        }
        if base.checked_add(len).is_none() {
            return Err(DescError::Wraps { index, base, len });
        }
        let id32 = u32::try_from(id).map_err(|_| DescError::Field { index, id })?;
        if key == 0 || handle == 0 {
            return Err(DescError::Field { index, id });
        }
        let slot = u32::try_from(slot)
            .ok()
            .filter(|&s| (s as usize) < DESC_CAPACITY)
            .ok_or(DescError::Field { index, id })?;
        out.push(ShmEntry {
            id: id32,
            base,
            len,
            key,
            handle,
            slot,
        });
    }
    out.sort_unstable_by_key(|e| e.base);
    for pair in out.windows(2) {
        if pair[0].end() > pair[1].base {
            return Err(DescError::Overlap {
                a: pair[0].base,
                b: pair[1].base,
            });
        }
    }
    let mut ids: Vec<u32> = out.iter().map(|e| e.id).collect();
    let mut handles: Vec<u64> = out.iter().map(|e| e.handle).collect();
    let mut slots: Vec<u32> = out.iter().map(|e| e.slot).collect();
    ids.sort_unstable();
    handles.sort_unstable();
    slots.sort_unstable();
    if ids.windows(2).any(|p| p[0] == p[1])
        || handles.windows(2).any(|p| p[0] == p[1])
        || slots.windows(2).any(|p| p[0] == p[1])
    {
        return Err(DescError::Duplicate);
    }
    Ok(out)
}

/// May a handed-out memfd of `size` bytes carrying `seals` be mapped for
/// `want` bytes? Returns the mapping length.
///
/// # Errors
/// `Unsealed` without [`REQUIRED_SEALS`], `FileTooSmall` when `size < want`
/// or `want` does not fit the address space.
pub(crate) fn admit_memfd(size: u64, seals: i32, want: u64) -> Result<usize, DescError> {
    if seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err(DescError::Unsealed(seals));
    }
    match usize::try_from(want) {
        Ok(len) if want <= size && len <= isize::MAX as usize => Ok(len),
        _ => Err(DescError::FileTooSmall { size, need: want }),
    }
}

/// [`admit_memfd`] for the descriptor: it must also carry a write seal
/// ([`DESC_WRITE_SEALS`]: `F_SEAL_FUTURE_WRITE` from an owner that mapped
/// it first), and hold [`DESC_BYTES`].
///
/// # Errors
/// As [`admit_memfd`], and `Writable` without a write seal.
pub fn admit_descriptor(size: u64, seals: i32) -> Result<usize, DescError> {
    let len = admit_memfd(size, seals, DESC_BYTES as u64)?;
    if seals & DESC_WRITE_SEALS == 0 {
        return Err(DescError::Writable(seals));
    }
    Ok(len)
}

/// [`admit_memfd`] for the region `e`: its memfd must hold
/// `DATA_OFFSET + e.len` bytes (checked).
///
/// # Errors
/// As [`admit_memfd`], and `RegionWriteSealed` for a memfd sealed against
/// writes.
pub fn admit_region(e: &ShmEntry, size: u64, seals: i32) -> Result<usize, DescError> {
    // Refused typed here: mapped writable anyway, it failed `EPERM` as an
    // `OutOfMemory` retried on every miss.
    if seals & DESC_WRITE_SEALS != 0 {
        return Err(DescError::RegionWriteSealed(seals));
    }
    let want = e
        .len
        .checked_add(DATA_OFFSET as u64)
        .ok_or(DescError::FileTooSmall {
            size,
            need: u64::MAX,
        })?;
    admit_memfd(size, seals, want)
}

/// A segment name is one path component of `[A-Za-z0-9._-]`, not starting
/// with a dot, at most [`MAX_NAME_LEN`] bytes.
///
/// # Errors
/// `Name` otherwise.
pub fn check_segment_name(name: &str) -> Result<(), DescError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(DescError::Name(name.to_owned()))
    }
}

/// The words a descriptor holding `entries` has (what the owner writes,
/// minus the sequence word's value): tests and the fuzz seeds use it.
#[cfg(any(test, feature = "testing"))]
pub fn encode(entries: &[ShmEntry]) -> Vec<u64> {
    let mut w = vec![0u64; HEADER_WORDS + entries.len() * ENTRY_WORDS];
    w[1] = entries.len() as u64;
    w[2] = DESC_MAGIC;
    for (i, e) in entries.iter().enumerate() {
        let at = HEADER_WORDS + i * ENTRY_WORDS;
        w[at] = u64::from(e.id);
        w[at + 1] = e.base;
        w[at + 2] = e.len;
        w[at + 3] = e.key;
        w[at + 4] = e.handle;
        w[at + 5] = u64::from(e.slot);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(id: u32, base: u64, len: u64) -> ShmEntry {
        ShmEntry {
            id,
            base,
            len,
            key: 7 + u64::from(id),
            handle: 1 + u64::from(id),
            slot: id,
        }
    }

    /// The shm_descriptor fuzz target's seeds are real descriptors as a
    /// peer reads them: a sealed descriptor file's size and seals, then
    /// the words (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds`
    /// writes them).
    #[test]
    fn fuzz_seeds_are_real_descriptors() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/shm_descriptor");
        let head = |size: u64, seals: i32| [&size.to_le_bytes()[..], &seals.to_le_bytes()].concat();
        let desc_head = head(DESC_BYTES as u64, REQUIRED_SEALS | DESC_WRITE_SEALS);
        let seeds = [
            ("empty", vec![]),
            ("one_region", vec![entry(1, 0x7f00_0000_0000, 1 << 20)]),
            (
                "three_regions",
                vec![
                    entry(1, 0x1000, 4096),
                    entry(2, 0x10_0000, 16 << 10),
                    entry(5, 0x7fff_0000_0000, MAX_REGION_LEN),
                ],
            ),
        ];
        for (name, entries) in seeds {
            let words = encode(&entries);
            let bytes: Vec<u8> = desc_head
                .iter()
                .copied()
                .chain(words.iter().flat_map(|w| w.to_le_bytes()))
                .collect();
            let path = dir.join(name);
            if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert_eq!(on_disk, bytes, "{}: TENT_WRITE_SEEDS=1 writes it", path.display());
            assert_eq!(admit_descriptor(DESC_BYTES as u64, REQUIRED_SEALS | DESC_WRITE_SEALS), Ok(DESC_BYTES));
            assert_eq!(parse(&words).unwrap().len(), entries.len());
        }
    }

    #[test]
    fn refuses_each_forgery() {
        let ok = encode(&[entry(1, 0x1000, 4096), entry(2, 0x3000, 4096)]);
        assert_eq!(parse(&ok).unwrap().len(), 2);
        let mut bad = ok.clone();
        bad[HEADER_WORDS + 2] = u64::MAX - 4095; // DATA_OFFSET + len wraps
        assert!(matches!(parse(&bad), Err(DescError::Len { .. })));
        let wrap = encode(&[entry(1, u64::MAX - 100, 4096)]);
        assert!(matches!(parse(&wrap), Err(DescError::Wraps { .. })));
        let over = encode(&[entry(1, 0x1000, 8192), entry(2, 0x2000, 4096)]);
        assert!(matches!(parse(&over), Err(DescError::Overlap { .. })));
        let zero = encode(&[entry(1, 0x1000, 0)]);
        assert!(matches!(parse(&zero), Err(DescError::Len { .. })));
        let dup = encode(&[entry(1, 0x1000, 4096), entry(1, 0x9000, 4096)]);
        assert_eq!(parse(&dup), Err(DescError::Duplicate));
        // A live-key slot past the key words, or two entries on one.
        let mut slot = ok.clone();
        slot[HEADER_WORDS + 5] = DESC_CAPACITY as u64;
        assert!(matches!(parse(&slot), Err(DescError::Field { .. })));
        slot[HEADER_WORDS + 5] = u64::MAX;
        assert!(matches!(parse(&slot), Err(DescError::Field { .. })));
        slot[HEADER_WORDS + 5] = 2; // the second entry's
        assert_eq!(parse(&slot), Err(DescError::Duplicate));
        let mut count = ok.clone();
        count[1] = 3; // more than the words hold
        assert_eq!(parse(&count), Err(DescError::Count(3)));
        count[1] = u64::MAX;
        assert_eq!(parse(&count), Err(DescError::Count(u64::MAX)));
        let mut magic = ok;
        magic[2] = 0;
        assert_eq!(parse(&magic), Err(DescError::Magic(0)));
        assert_eq!(parse(&[0; 3]), Err(DescError::Short(3)));
    }

    #[test]
    fn memfds_must_be_sealed_and_large_enough() {
        let e = entry(1, 0x1000, 4096);
        assert_eq!(admit_region(&e, 8192, REQUIRED_SEALS), Ok(8192));
        assert!(admit_region(&e, 8191, REQUIRED_SEALS).is_err());
        assert!(admit_region(&e, 8192, libc::F_SEAL_GROW).is_err());
        for ws in [libc::F_SEAL_WRITE, libc::F_SEAL_FUTURE_WRITE] {
            assert_eq!(
                admit_region(&e, 8192, REQUIRED_SEALS | ws),
                Err(DescError::RegionWriteSealed(REQUIRED_SEALS | ws))
            );
        }
        assert!(admit_memfd(u64::MAX, REQUIRED_SEALS, u64::MAX).is_err());
    }

    #[test]
    fn descriptors_must_be_write_sealed() {
        let d = DESC_BYTES as u64;
        let fw = REQUIRED_SEALS | libc::F_SEAL_FUTURE_WRITE;
        assert_eq!(admit_descriptor(d, fw), Ok(DESC_BYTES));
        assert_eq!(
            admit_descriptor(d, REQUIRED_SEALS | libc::F_SEAL_WRITE),
            Ok(DESC_BYTES)
        );
        assert_eq!(
            admit_descriptor(d, REQUIRED_SEALS | libc::F_SEAL_SEAL),
            Err(DescError::Writable(REQUIRED_SEALS | libc::F_SEAL_SEAL))
        );
        assert!(admit_descriptor(d - 1, fw).is_err());
        assert!(admit_descriptor(d, libc::F_SEAL_FUTURE_WRITE).is_err());
    }

    #[test]
    fn names_are_one_plain_component() {
        assert!(check_segment_name("tent-s-0123abcd").is_ok());
        for bad in ["", ".", "..", "../x", "a/b", ".hidden", "a\0b", "é"] {
            assert!(check_segment_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_segment_name(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    fn arb_words() -> impl Strategy<Value = Vec<u64>> {
        let word = prop_oneof![
            Just(0u64),
            Just(1),
            Just(4096),
            Just(u64::MAX),
            Just(u64::MAX - 4095),
            Just(MAX_REGION_LEN),
            Just(MAX_REGION_LEN + 1),
            0u64..0x1_0000,
            any::<u64>(),
        ];
        (
            0u64..6,
            prop::bool::weighted(0.9),
            prop::collection::vec(word, 0..48),
        )
            .prop_map(|(count, magic, rest)| {
                let mut w = vec![0, count, if magic { DESC_MAGIC } else { 1 }, 0, 0, 0, 0, 0];
                w.extend(rest);
                w
            })
    }

    proptest! {
        /// Whatever the words, an admitted descriptor is bounded, sorted,
        /// non-overlapping, non-wrapping, with mappable regions.
        #[test]
        fn admitted_descriptors_are_sane(words in arb_words()) {
            if let Ok(entries) = parse(&words) {
                prop_assert!(entries.len() <= DESC_CAPACITY);
                prop_assert!(HEADER_WORDS + entries.len() * ENTRY_WORDS <= words.len());
                for e in &entries {
                    prop_assert!(e.len > 0 && e.len <= MAX_REGION_LEN);
                    prop_assert!(e.base.checked_add(e.len).is_some());
                    prop_assert!(e.key != 0 && e.handle != 0);
                    let need = e.len + DATA_OFFSET as u64;
                    prop_assert_eq!(admit_region(e, need, REQUIRED_SEALS), Ok(need as usize));
                    prop_assert!(admit_region(e, need - 1, REQUIRED_SEALS).is_err());
                }
                for p in entries.windows(2) {
                    prop_assert!(p[0].end() <= p[1].base);
                }
                // Re-encoding what was admitted parses to the same thing.
                prop_assert_eq!(parse(&encode(&entries)), Ok(entries));
            }
        }

        /// Valid entry sets always parse (no false refusals).
        #[test]
        fn disjoint_entries_parse(lens in prop::collection::vec(1u64..1 << 30, 0..20), gap in 0u64..1 << 20) {
            let mut base = 0x1000u64;
            let entries: Vec<ShmEntry> = lens.iter().enumerate().map(|(i, &len)| {
                let e = entry(i as u32, base, len);
                base += len + gap;
                e
            }).collect();
            prop_assert_eq!(parse(&encode(&entries)), Ok(entries));
        }
    }
}
