//! How much of other processes' memory an engine's shm peers may map.
//!
//! A region costs its owner what it populates, but its peer the whole
//! declared length in address space: an owner listing sparse memfds of up
//! to `MAX_REGION_LEN` (64 TiB) each could fill a peer's address space, and
//! every later `mmap` of that process (a heap arena, a thread stack) would
//! fail. So each peer's table may map at most `per_peer` bytes, and all of
//! one engine's peers together at most `total`; what crosses either is
//! refused `OutOfMemory` before anything is mapped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::ErrorKind;

use crate::config::ShmConfig;
use crate::error::{Error, Result};
use crate::procfs;

/// The user address space `mmap` hands out without an address hint: 47
/// bits on x86-64 (also with 5-level paging) and on 48-bit arm64.
const USER_SPACE: u64 = 1 << 47;

/// The caps on bytes mapped from shm owners, and what is mapped now.
#[derive(Debug)]
pub struct MapBudget {
    per_peer: u64,
    total: u64,
    mapped: AtomicU64,
}

impl MapBudget {
    /// The caps `cfg` sets (`max_mapped_bytes_per_peer`,
    /// `max_mapped_bytes`), each 0 derived from the address space left to
    /// this process now (`procfs::address_space_room`): an eighth of it per
    /// peer, a quarter in total.
    pub fn from_config(cfg: &ShmConfig) -> MapBudget {
        let room = procfs::address_space_room(USER_SPACE);
        let or = |set: u64, derived: u64| if set == 0 { derived } else { set };
        MapBudget::new(
            or(cfg.max_mapped_bytes_per_peer, room / 8),
            or(cfg.max_mapped_bytes, room / 4),
        )
    }

    /// At most `per_peer` bytes for one peer, `total` for all of them.
    pub fn new(per_peer: u64, total: u64) -> MapBudget {
        MapBudget {
            per_peer,
            total,
            mapped: AtomicU64::new(0),
        }
    }

    /// The cap on one peer's mappings.
    pub fn per_peer(&self) -> u64 {
        self.per_peer
    }

    /// The cap on all peers' mappings together.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes mapped now, by every peer under this budget.
    pub fn mapped(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// Refuse a peer table of `need` bytes (every region's mapping, old
    /// and new) over the per-peer cap.
    pub(crate) fn check_peer(&self, segment: &str, need: u64) -> Result<()> {
        if need > self.per_peer {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!(
                    "segment {segment}: its regions need {need} bytes mapped, over \
                     transports/shm/max_mapped_bytes_per_peer ({} bytes)",
                    self.per_peer
                ),
            ));
        }
        Ok(())
    }

    /// Reserve `bytes` more (the regions a refresh is about to map) within
    /// the total, all or nothing; the reservation is given back as its
    /// parts ([`Charge::split_off`]) and what is left of it drop.
    pub(crate) fn reserve(self: &Arc<Self>, segment: &str, bytes: u64) -> Result<Charge> {
        self.mapped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                m.checked_add(bytes).filter(|&after| after <= self.total)
            })
            .map_err(|now| {
                Error::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "segment {segment}: mapping its {bytes} new bytes next to the {now} \
                         this engine's shm peers map would pass transports/shm/max_mapped_bytes \
                         ({} bytes)",
                        self.total
                    ),
                )
            })?;
        Ok(Charge {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes held against a [`MapBudget`]'s total, given back on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<MapBudget>,
    bytes: u64,
}

impl Charge {
    /// Move `bytes` of this charge into one of its own (at most what it
    /// holds: a reservation covers every mapping made from it).
    pub(crate) fn split_off(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            budget: self.budget.clone(),
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.mapped.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_reserved_all_or_nothing_and_given_back_on_drop() {
        let b = Arc::new(MapBudget::new(100, 100));
        let mut r = b.reserve("s", 60).unwrap();
        assert_eq!(b.mapped(), 60);
        let e = b.reserve("s", 41).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("max_mapped_bytes"), "{e}");
        assert_eq!(b.mapped(), 60, "a refused reservation holds nothing");
        assert!(b.reserve("s", u64::MAX).is_err(), "no wrap");
        let part = r.split_off(50);
        let rest = r.split_off(20);
        assert_eq!((part.bytes, rest.bytes, r.bytes), (50, 10, 0));
        drop((r, rest));
        assert_eq!(b.mapped(), 50, "the unused rest goes back");
        drop(part);
        assert_eq!(b.mapped(), 0);
    }

    #[test]
    fn one_peer_over_its_cap_is_refused() {
        let b = MapBudget::new(100, 1000);
        b.check_peer("s", 100).unwrap();
        let e = b.check_peer("s", 101).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("max_mapped_bytes_per_peer"), "{e}");
    }

    #[test]
    fn derived_caps_are_fractions_of_the_room() {
        let room = procfs::address_space_room(USER_SPACE);
        assert!(room > 0 && room <= USER_SPACE);
        let b = MapBudget::from_config(&ShmConfig::default());
        assert!(b.per_peer() > 0 && b.per_peer() <= USER_SPACE / 8);
        assert!(b.total() <= USER_SPACE / 4 && b.total() >= b.per_peer());
        let set = MapBudget::from_config(&ShmConfig {
            max_mapped_bytes_per_peer: 7,
            max_mapped_bytes: 9,
            ..ShmConfig::default()
        });
        assert_eq!((set.per_peer(), set.total()), (7, 9));
    }
}
