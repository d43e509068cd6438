//! Block lists: one call for N (local block, remote block) pairs of equal
//! size, as a paged KV cache moves them. Pairs that continue the previous
//! one on both sides merge into one request, so contiguous pages cost one
//! task and one pass through the worker, not one each.

use tent_rings::{LocalAddr, Opcode, Priority, RemoteAddr, SegmentId, op};

use super::{BatchId, Engine};
use crate::error::{Error, Result};

/// N blocks of `block_len` bytes: block `i` moves between local address
/// `local_addrs[i]` (inside registered memory) and `remote_addrs[i]` in
/// `segment` (READ: remote → local; WRITE: local → remote).
#[derive(Debug, Clone, Copy)]
pub struct BlockList<'a> {
    /// `Read` or `Write`.
    pub opcode: Opcode,
    /// The remote segment every block is in.
    pub segment: SegmentId,
    /// Bytes per block (non-zero).
    pub block_len: u64,
    /// Each block's local address.
    pub local_addrs: &'a [u64],
    /// Each block's remote address, same order and count.
    pub remote_addrs: &'a [u64],
    /// The priority of every request.
    pub priority: Priority,
}

/// One merged run: contiguous on both sides, inside one region on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    local: u64,
    remote: u64,
    len: u64,
    /// The regions holding its start (indices into the lists `runs` was
    /// given); `None`: in none, so nothing merges with it and the request
    /// fails on its own (a typed error here or in its CQE).
    regions: (Option<usize>, Option<usize>),
}

/// Which of `sorted` (`(start, len)` by start) holds `addr`.
fn region_of(sorted: &[(u64, u64)], addr: u64) -> Option<usize> {
    let i = sorted
        .partition_point(|&(start, _)| start <= addr)
        .checked_sub(1)?;
    let (start, len) = sorted[i];
    (addr - start < len).then_some(i)
}

/// The pairs as runs, merging a pair into the previous run when it starts
/// where that run ends on both sides and in the same region on each (two
/// regions that happen to be adjacent stay two requests: one request must
/// lie in one region).
fn runs(b: &BlockList<'_>, local: &[(u64, u64)], remote: &[(u64, u64)]) -> Result<Vec<Run>> {
    if b.block_len == 0 {
        return Err(Error::invalid("block list: zero block length"));
    }
    if b.local_addrs.len() != b.remote_addrs.len() {
        return Err(Error::invalid(format!(
            "block list: {} local addresses but {} remote ones",
            b.local_addrs.len(),
            b.remote_addrs.len()
        )));
    }
    if b.local_addrs.is_empty() {
        return Err(Error::invalid("block list: no blocks"));
    }
    let mut out: Vec<Run> = Vec::new();
    for (&l, &r) in b.local_addrs.iter().zip(b.remote_addrs) {
        if let Some(last) = out.last_mut()
            && last.local.checked_add(last.len) == Some(l)
            && last.remote.checked_add(last.len) == Some(r)
            && let (Some(lr), Some(rr)) = last.regions
            && region_of(local, l) == Some(lr)
            && region_of(remote, r) == Some(rr)
            && let Some(len) = last.len.checked_add(b.block_len)
        {
            last.len = len;
            continue;
        }
        out.push(Run {
            local: l,
            remote: r,
            len: b.block_len,
            regions: (region_of(local, l), region_of(remote, r)),
        });
    }
    Ok(out)
}

impl Engine {
    /// Submit a block list into `batch` as one call: adjacent blocks that
    /// are contiguous on both sides become one request. Returns how many
    /// tasks it appended to the batch (their indices follow the batch's
    /// earlier tasks). All or nothing, as [`Engine::submit`].
    ///
    /// # Errors
    /// `SegmentNotFound` for a segment not open; `InvalidArgument` for a
    /// zero block length, no blocks, address lists of different lengths,
    /// or more requests than the batch has room for; `AddressNotRegistered` /
    /// `OutOfBounds` for a block outside registered local memory (the
    /// message names the block); the errors of [`Engine::submit`].
    pub fn submit_blocks(&self, batch: BatchId, blocks: &BlockList<'_>) -> Result<usize> {
        let b = self.batches.get(batch)?;
        // One snapshot of each side's regions for every lookup.
        let table = self.shared.regions.load();
        let local: Vec<(u64, u64)> = table.iter().map(|r| (r.addr(), r.len())).collect();
        let mut remote: Vec<(u64, u64)> = self
            .segment_regions(blocks.segment)?
            .iter()
            .map(|r| (r.addr, r.len))
            .collect();
        remote.sort_unstable();
        let runs = runs(blocks, &local, &remote)?;
        b.check_claim(runs.len())?;
        let mut sqes = Vec::with_capacity(runs.len());
        for r in &runs {
            let (region, _) = table.find_addr(r.local, r.len).map_err(|kind| {
                Error::new(
                    kind,
                    format!(
                        "block list: local [{:#x}, +{}) is not inside one registered region",
                        r.local, r.len
                    ),
                )
            })?;
            let local = LocalAddr::new(region.id(), r.local - region.addr());
            let remote = RemoteAddr::new(blocks.segment, r.remote);
            sqes.push(
                op::Transfer::new(blocks.opcode, local, remote, r.len)
                    .priority(blocks.priority)
                    .build(),
            );
        }
        drop(table);
        self.submit_to(&b, &sqes)?;
        Ok(sqes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list<'a>(local: &'a [u64], remote: &'a [u64], block_len: u64) -> BlockList<'a> {
        BlockList {
            opcode: Opcode::Write,
            segment: SegmentId::LOCAL,
            block_len,
            local_addrs: local,
            remote_addrs: remote,
            priority: Priority::High,
        }
    }

    /// One region on each side covering every address used below.
    const ALL: &[(u64, u64)] = &[(0, u64::MAX)];

    fn runs(b: &BlockList<'_>) -> Result<Vec<Run>> {
        super::runs(b, ALL, ALL)
    }

    #[test]
    fn contiguous_on_both_sides_merges_and_nothing_else_does() {
        let r = |local, remote, len| Run {
            local,
            remote,
            len,
            regions: (Some(0), Some(0)),
        };
        // 0,1,2 contiguous both sides; 3 breaks remote; 4 follows 3; 5 breaks local.
        let local = [0, 16, 32, 48, 64, 1000];
        let remote = [100, 116, 132, 500, 516, 532];
        assert_eq!(
            runs(&list(&local, &remote, 16)).unwrap(),
            [r(0, 100, 48), r(48, 500, 32), r(1000, 532, 16)]
        );
        // Backwards adjacency is not contiguity.
        assert_eq!(
            runs(&list(&[16, 0], &[16, 0], 16)).unwrap().len(),
            2,
            "reversed blocks stay apart"
        );
    }

    #[test]
    fn adjacent_regions_split_a_run_on_either_side() {
        let two = &[(0, 32), (32, 32)];
        let local = [16, 32];
        let remote = [100, 116];
        assert_eq!(
            super::runs(&list(&local, &remote, 16), two, ALL)
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            super::runs(&list(&remote, &local, 16), ALL, two)
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            super::runs(&list(&local, &remote, 16), ALL, ALL)
                .unwrap()
                .len(),
            1
        );
        // Outside every region: never merged, each fails on its own.
        let none = super::runs(&list(&[64, 80], &[0, 16], 16), two, ALL).unwrap();
        assert_eq!(none.len(), 2);
        assert_eq!(none[0].regions, (None, Some(0)));
    }

    #[test]
    fn wrapping_addresses_never_merge_and_bad_lists_are_refused() {
        let top = u64::MAX - 15;
        assert_eq!(runs(&list(&[top, 0], &[top, 0], 16)).unwrap().len(), 2);
        let kind = |b: BlockList<'_>| runs(&b).unwrap_err().kind();
        use tent_rings::ErrorKind::InvalidArgument;
        assert_eq!(kind(list(&[0], &[0], 0)), InvalidArgument);
        assert_eq!(kind(list(&[0, 16], &[0], 16)), InvalidArgument);
        assert_eq!(kind(list(&[], &[], 16)), InvalidArgument);
    }
}
