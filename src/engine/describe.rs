//! What this engine tells a peer about its segment: the descriptor, whose
//! regions come in pages so that any number of them can be described (a
//! KV-cache pool registered block by block holds tens of thousands) while
//! every message stays far under the control plane's body limit.

use crate::control::wire::{RegionEntry, RegionsPage};
use crate::memory::{MemRegion, RegionTable};

/// Regions in one page at most.
pub(crate) const PAGE_REGIONS: usize = 4096;
/// Bytes one page's regions take at most: half the message limit, so the
/// descriptor's other fields always fit beside its first page.
pub(crate) const PAGE_BYTES: usize = 512 << 10;

const _: () = assert!(PAGE_REGIONS <= crate::control::wire::MAX_REGIONS);

/// How a peer sees region `r`.
fn entry_of(r: &MemRegion) -> RegionEntry {
    RegionEntry {
        id: r.id().index(),
        addr: r.addr(),
        len: r.len(),
        key: r.key(),
        rkeys: r.nic_rkeys(),
        mr_step: r.mr_layout().step(),
        chunk_rkeys: r.chunk_rkeys().to_vec(),
    }
}

/// The page of `table`'s regions that start at or after `from`: as many as
/// [`PAGE_REGIONS`] and [`PAGE_BYTES`] allow, and where the next page
/// starts when some are left.
pub(crate) fn region_page(table: &RegionTable, from: u64) -> RegionsPage {
    let mut regions = Vec::new();
    let mut bytes = 0usize;
    let mut next = None;
    for r in table.starting_at(from) {
        let entry = entry_of(r);
        let len = entry.wire_len_bound();
        if regions.len() == PAGE_REGIONS || bytes + len > PAGE_BYTES {
            next = Some(entry.addr);
            break;
        }
        bytes += len;
        regions.push(entry);
    }
    RegionsPage {
        version: table.version(),
        regions,
        from: next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tent_rings::RegionId;

    fn table(n: u32) -> (RegionTable, Vec<u8>) {
        let mut mem = vec![0u8; n as usize * 64];
        let base = mem.as_mut_ptr();
        let mut t = RegionTable::default();
        for i in 0..n {
            // SAFETY: each region is 64 bytes of `mem`, which the caller keeps.
            let at = unsafe { base.add(i as usize * 64) };
            let r = MemRegion::new(RegionId::from_parts(0, i + 1), at, 64, None);
            t.insert(Arc::new(r)).unwrap();
        }
        (t, mem)
    }

    #[test]
    fn pages_cover_every_region_once_in_address_order() {
        let n = PAGE_REGIONS as u32 * 2 + 7;
        let (t, _mem) = table(n);
        let mut seen = Vec::new();
        let mut from = 0;
        let mut pages = 0;
        loop {
            let p = region_page(&t, from);
            assert_eq!(p.version, t.version());
            assert!(p.regions.len() <= PAGE_REGIONS);
            let bytes: usize = p.regions.iter().map(RegionEntry::wire_len_bound).sum();
            assert!(bytes <= PAGE_BYTES);
            seen.extend(p.regions.iter().map(|r| r.addr));
            pages += 1;
            match p.from {
                Some(next) => {
                    assert!(next > from, "no progress");
                    from = next;
                }
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), n as usize);
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        // From the middle of a region: the next one on.
        let p = region_page(&t, seen[5] + 1);
        assert_eq!(p.regions[0].addr, seen[6]);
        // Past the last: an empty last page.
        let p = region_page(&t, u64::MAX);
        assert!(p.regions.is_empty() && p.from.is_none());
    }

    #[test]
    fn the_version_moves_with_every_change() {
        let (mut t, _mem) = table(3);
        let v = t.version();
        assert_eq!(v, 3);
        t.remove(RegionId::from_parts(0, 2)).unwrap();
        assert_eq!(t.version(), v + 1);
        assert!(t.remove(RegionId::from_parts(0, 2)).is_none());
        assert_eq!(t.version(), v + 1, "nothing removed, nothing changed");
    }
}
