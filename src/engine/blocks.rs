//! Block lists: one call for N (local block, remote block) pairs of equal
//! size, as a paged KV cache moves them.
//!
//! A list is one request per local registration it uses (one, for a KV
//! cache in one registration), whatever its length. The call checks every
//! local block against the registration table, merges pairs that continue
//! the previous one on both sides into runs, and hands the runs to the
//! request's batch task ([`Runs`]); the worker cuts the request's slices
//! run by run, and a completion, a failover or a cancel treats it as the
//! one request it is. A list that is one run is an ordinary request.

use std::sync::Arc;

use parking_lot::Mutex;
use tent_rings::{LocalAddr, Opcode, Priority, RemoteAddr, SegmentId, op};

use super::{BatchId, Embedded};
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

/// One run of a block-list request: its bytes from logical offset `start`
/// to the next run's start (or the request's end) are at `local` (an
/// offset in the request's registration) and `remote`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    start: u64,
    local: u64,
    remote: u64,
}

/// A block-list request's runs, held by its batch task (set before the
/// request is published, dropped with the batch), read by the worker that
/// serves it. Every run lies below `local_end` in the registration, which
/// the worker checks once against the live region; a run's remote side is
/// checked by the transport, slice by slice, as any request's is. Its
/// buffer goes back to the engine's [`RunPool`] when it is dropped.
#[derive(Debug)]
pub(crate) struct Runs {
    runs: Vec<Run>,
    total: u64,
    local_end: u64,
    pool: Option<Arc<RunPool>>,
}

impl Drop for Runs {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.runs));
        }
    }
}

/// Run buffers kept between block lists. A fresh buffer for 10,000 runs
/// is 60 pages, and faulting them in took most of a `submit_blocks` call
/// (150 µs of 200 here); a buffer that was used before is mapped already.
/// A list's buffer comes back when its batch is freed (the application's
/// thread: a worker never drops a batch).
#[derive(Debug, Default)]
pub(crate) struct RunPool {
    free: Mutex<Vec<Vec<Run>>>,
}

/// Buffers the pool keeps, and the largest it keeps (runs): at most
/// 4 x 6 MiB held between lists.
const POOL_BUFFERS: usize = 4;
const POOL_MAX_RUNS: usize = 1 << 18;

impl RunPool {
    /// A buffer for `n` runs: the smallest kept one that holds them, else
    /// the largest (it grows).
    fn take(&self, n: usize) -> Vec<Run> {
        let mut free = self.free.lock();
        let fits = free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        let largest = free
            .iter()
            .enumerate()
            .max_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match fits.or(largest) {
            Some(i) => {
                let mut v = free.swap_remove(i);
                drop(free);
                v.reserve(n);
                v
            }
            None => Vec::with_capacity(n),
        }
    }

    fn give(&self, mut v: Vec<Run>) {
        if v.capacity() > POOL_MAX_RUNS {
            return;
        }
        v.clear();
        let mut free = self.free.lock();
        if free.len() < POOL_BUFFERS {
            free.push(v);
        } else if let Some(small) = free.iter_mut().min_by_key(|k| k.capacity())
            && small.capacity() < v.capacity()
        {
            // Keep the larger buffers: they serve every smaller list.
            *small = v;
        }
    }
}

/// Where the bytes of a block-list request at one logical offset are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Offset in the request's registration.
    pub(crate) local: u64,
    pub(crate) remote: u64,
    /// Bytes left in its run from here.
    pub(crate) len: u64,
}

impl Runs {
    /// The request's length: every block's bytes.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// How far into the registration its local blocks reach.
    pub(crate) fn local_end(&self) -> u64 {
        self.local_end
    }

    fn end(&self, i: usize) -> u64 {
        self.runs.get(i + 1).map_or(self.total, |r| r.start)
    }

    /// The bytes at logical `offset` (below `total`). `cursor` remembers
    /// the run of the last call: a request is posted in order, so the run
    /// is the same or the next one; a step back (a refused slice posted
    /// again) looks it up.
    #[inline]
    pub(crate) fn piece(&self, offset: u64, cursor: &mut u32) -> Option<Piece> {
        let mut i = *cursor as usize;
        let hit = |i: usize| {
            self.runs
                .get(i)
                .is_some_and(|r| r.start <= offset && offset < self.end(i))
        };
        if !hit(i) {
            i += 1;
            if !hit(i) {
                i = self
                    .runs
                    .partition_point(|r| r.start <= offset)
                    .checked_sub(1)?;
                if !hit(i) {
                    return None;
                }
            }
        }
        *cursor = i as u32;
        let r = self.runs[i];
        let into = offset - r.start;
        Some(Piece {
            local: r.local + into,
            remote: r.remote + into,
            len: self.end(i) - offset,
        })
    }

    /// Slices of at most `slice` bytes the request is cut into (cut at
    /// every run's end): what it charges the RDMA admission.
    pub(crate) fn slices(&self, slice: u64) -> u64 {
        let slice = slice.max(1);
        (0..self.runs.len())
            .map(|i| (self.end(i) - self.runs[i].start).div_ceil(slice))
            .fold(0u64, u64::saturating_add)
    }
}

/// A registration a block's local side lies in, as `plan` is told it:
/// `handle` names it to the caller, `[base, base + len)` its bytes.
#[derive(Debug, Clone, Copy)]
struct Registration<R> {
    handle: R,
    base: u64,
    len: u64,
}

/// One request of a list: the blocks in one registration.
#[derive(Debug)]
struct Group<R> {
    local: Registration<R>,
    runs: Vec<Run>,
    total: u64,
    local_end: u64,
    /// Where the last run ends on each side (absolute), and the remote
    /// region it is in: the next block continues it only if it starts
    /// there on both sides in the same remote region.
    tail: Option<(u64, u64, usize)>,
}

impl<R> Group<R> {
    /// Its runs, for its request's life. A buffer far larger than they
    /// need (a pooled one, or the list's size for runs that merged) goes
    /// back to the pool, and they take an exact one.
    fn runs(self, pool: Option<Arc<RunPool>>) -> Runs {
        let runs = match &pool {
            Some(p) if self.runs.capacity() > 2 * self.runs.len() + 64 => {
                let exact = self.runs.to_vec();
                p.give(self.runs);
                exact
            }
            _ => self.runs,
        };
        Runs {
            runs,
            total: self.total,
            local_end: self.local_end,
            pool,
        }
    }
}

/// Which of `sorted` (`(start, len)` by start) holds `addr`, trying `hint`
/// first (a list walks a few regions, often one).
fn region_of(sorted: &[(u64, u64)], addr: u64, hint: usize) -> Option<usize> {
    let holds = |i: usize| {
        sorted
            .get(i)
            .is_some_and(|&(start, len)| addr.wrapping_sub(start) < len && addr >= start)
    };
    if holds(hint) {
        return Some(hint);
    }
    let i = sorted
        .partition_point(|&(start, _)| start <= addr)
        .checked_sub(1)?;
    holds(i).then_some(i)
}

/// The list as requests: its blocks grouped by the registration holding
/// their local side (`find`: the registration holding `[addr, addr +
/// len)`, else why not), each group's blocks as runs in list order. A
/// block merges into the run before it when it starts where that run ends
/// on both sides and lies in the same remote region (`remote`, sorted;
/// two regions that happen to be adjacent stay two runs, as one slice
/// must lie in one region). A block in no known remote region starts a
/// run of its own, which the transport refuses or serves.
fn plan<R: Copy>(
    b: &BlockList<'_>,
    mut find: impl FnMut(u64, u64) -> Result<Registration<R>>,
    remote: &[(u64, u64)],
    pool: &RunPool,
) -> Result<Vec<Group<R>>> {
    let len = b.block_len;
    if len == 0 {
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
    let mut groups: Vec<Group<R>> = Vec::new();
    match group(b, &mut find, remote, pool, &mut groups) {
        Ok(()) => Ok(groups),
        Err(e) => {
            // A refused list's buffers serve the next one.
            for g in groups {
                pool.give(g.runs);
            }
            Err(e)
        }
    }
}

/// `plan`'s walk over the blocks, into `groups`.
fn group<R: Copy>(
    b: &BlockList<'_>,
    find: &mut impl FnMut(u64, u64) -> Result<Registration<R>>,
    remote: &[(u64, u64)],
    pool: &RunPool,
    groups: &mut Vec<Group<R>>,
) -> Result<()> {
    let len = b.block_len;
    // Each group by its registration's base (registrations do not
    // overlap), for a list that moves between them.
    let mut by_base: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    // The group of the last block (lists mostly stay in one).
    let mut g = 0usize;
    // The remote region of the last block.
    let mut rhint = 0usize;
    for (i, (&l, &r)) in b.local_addrs.iter().zip(b.remote_addrs).enumerate() {
        let inside = |reg: &Registration<R>| {
            l.checked_sub(reg.base)
                .is_some_and(|off| off <= reg.len && reg.len - off >= len)
        };
        if !groups.get(g).is_some_and(|x| inside(&x.local)) {
            let reg = find(l, len).map_err(|e| {
                Error::new(
                    e.kind(),
                    format!("block list: block {i}, local [{l:#x}, +{len}): {e}"),
                )
            })?;
            g = *by_base.entry(reg.base).or_insert_with(|| {
                groups.push(Group {
                    local: reg,
                    // The first is sized for the rest of the list (the
                    // common case: one registration), later ones grow.
                    runs: if groups.is_empty() {
                        pool.take(b.local_addrs.len() - i)
                    } else {
                        Vec::new()
                    },
                    total: 0,
                    local_end: 0,
                    tail: None,
                });
                groups.len() - 1
            });
        }
        let Some(rend) = r.checked_add(len) else {
            return Err(Error::invalid(format!(
                "block list: block {i}, remote [{r:#x}, +{len}) wraps past the end of the address space"
            )));
        };
        let group = &mut groups[g];
        let off = l - group.local.base;
        let rregion = region_of(remote, r, rhint);
        if let Some(k) = rregion {
            rhint = k;
        }
        let continues = matches!(
            (group.tail, rregion),
            (Some((lend, rend, k)), Some(k2)) if lend == l && rend == r && k == k2
        );
        if !continues {
            group.runs.push(Run {
                start: group.total,
                local: off,
                remote: r,
            });
        }
        group.total = group
            .total
            .checked_add(len)
            .ok_or_else(|| Error::invalid("block list: more bytes than 2^64"))?;
        // `inside` held: `off + len` is within the registration.
        group.local_end = group.local_end.max(off + len);
        group.tail = rregion.map(|k| (l + len, rend, k));
    }
    Ok(())
}

impl Embedded {
    pub(crate) fn submit_blocks(&self, batch: BatchId, blocks: &BlockList<'_>) -> Result<usize> {
        let b = self.batches.get(batch)?;
        let mut remote: Vec<(u64, u64)> = self
            .segment_regions(blocks.segment)?
            .iter()
            .map(|r| (r.addr, r.len))
            .collect();
        remote.sort_unstable();
        // One snapshot of the registrations for every lookup.
        let table = self.shared.regions.load();
        let groups = plan(
            blocks,
            |addr, len| {
                let (region, _) = table
                    .find_addr(addr, len)
                    .map_err(|kind| Error::new(kind, "not inside one registered region"))?;
                Ok(Registration {
                    handle: region.id(),
                    base: region.addr(),
                    len: region.len(),
                })
            },
            &remote,
            &self.run_pool,
        )?;
        drop(table);
        // `submit_to` checks the batch's room first; a refused list's
        // buffers go back to the pool as `lists` drops.
        let mut sqes = Vec::with_capacity(groups.len());
        let mut lists = Vec::with_capacity(groups.len());
        for g in groups {
            let first = g.runs[0];
            let single = g.runs.len() == 1;
            let local = LocalAddr::new(g.local.handle, if single { first.local } else { 0 });
            let remote = RemoteAddr::new(blocks.segment, first.remote);
            sqes.push(
                op::Transfer::new(blocks.opcode, local, remote, g.total)
                    .priority(blocks.priority)
                    .build(),
            );
            lists.push(if single {
                self.run_pool.give(g.runs);
                None
            } else {
                Some(g.runs(Some(self.run_pool.clone())))
            });
        }
        self.submit_to(&b, &sqes, lists)?;
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

    /// One region covering every address used below.
    const ALL: &[(u64, u64)] = &[(0, u64::MAX)];

    /// Local lookups in `regions` (`(base, len)`), the handle its index.
    fn plan_in(
        b: &BlockList<'_>,
        local: &[(u64, u64)],
        remote: &[(u64, u64)],
    ) -> Result<Vec<Group<usize>>> {
        plan(
            b,
            |addr, len| {
                local
                    .iter()
                    .position(|&(base, n)| addr >= base && addr - base < n)
                    .map(|i| Registration {
                        handle: i,
                        base: local[i].0,
                        len: local[i].1,
                    })
                    .filter(|r| addr - r.base <= r.len - len)
                    .ok_or_else(|| Error::invalid("nowhere"))
            },
            remote,
            &RunPool::default(),
        )
    }

    fn one(b: &BlockList<'_>) -> Runs {
        let mut g = plan_in(b, ALL, ALL).unwrap();
        assert_eq!(g.len(), 1);
        g.remove(0).runs(None)
    }

    fn run(start: u64, local: u64, remote: u64) -> Run {
        Run {
            start,
            local,
            remote,
        }
    }

    #[test]
    fn contiguous_on_both_sides_merges_and_nothing_else_does() {
        // 0,1,2 contiguous both sides; 3 breaks remote; 4 follows 3; 5 breaks local.
        let local = [0, 16, 32, 48, 64, 1000];
        let remote = [100, 116, 132, 500, 516, 532];
        let r = one(&list(&local, &remote, 16));
        assert_eq!(
            r.runs,
            [run(0, 0, 100), run(48, 48, 500), run(80, 1000, 532)]
        );
        assert_eq!((r.total(), r.local_end()), (96, 1016));
        // Backwards adjacency is not contiguity.
        assert_eq!(one(&list(&[16, 0], &[16, 0], 16)).runs.len(), 2);
    }

    #[test]
    fn a_list_is_one_request_per_local_registration() {
        let regs = &[(0, 64), (1000, 64)];
        // Alternating between two registrations: two groups, in the order
        // first met, each with its blocks in list order.
        let local = [0, 1000, 16, 1016, 48];
        let remote = [0, 100, 16, 116, 300];
        let g = plan_in(&list(&local, &remote, 16), regs, ALL).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].local.handle, g[1].local.handle), (0, 1));
        assert_eq!(g[0].runs, [run(0, 0, 0), run(32, 48, 300)]);
        assert_eq!(g[1].runs, [run(0, 0, 100)]);
        assert_eq!((g[0].total, g[1].total), (48, 32));
        assert_eq!((g[0].local_end, g[1].local_end), (64, 32));
        // A block running off its registration is refused, naming it.
        let e = plan_in(&list(&[0, 60], &[0, 16], 16), regs, ALL).unwrap_err();
        assert!(e.to_string().contains("block 1"), "{e}");
    }

    #[test]
    fn adjacent_remote_regions_split_a_run_and_unknown_ones_never_merge() {
        let two = &[(100, 32), (132, 32)];
        let r = one(&list(&[0, 16, 32], &[116, 132, 148], 16));
        assert_eq!(r.runs.len(), 1, "one remote region: one run");
        let g = plan_in(&list(&[0, 16, 32], &[116, 132, 148], 16), ALL, two).unwrap();
        assert_eq!(g[0].runs, [run(0, 0, 116), run(16, 16, 132)]);
        // Outside every known remote region: a run of its own each.
        let g = plan_in(&list(&[0, 16], &[500, 516], 16), ALL, two).unwrap();
        assert_eq!(g[0].runs.len(), 2);
    }

    #[test]
    fn wrapping_addresses_never_merge_and_bad_lists_are_refused() {
        let top = u64::MAX - 15;
        let g = plan_in(&list(&[0, 16], &[top - 32, top - 16], 16), ALL, ALL).unwrap();
        assert_eq!(g[0].runs.len(), 1, "up to the last byte merges");
        let kind = |b: BlockList<'_>| plan_in(&b, ALL, ALL).unwrap_err().kind();
        use tent_rings::ErrorKind::InvalidArgument;
        // A remote block past the end of the address space names itself.
        let e = plan_in(&list(&[0, 16], &[0, top + 1], 16), ALL, ALL).unwrap_err();
        assert_eq!(e.kind(), InvalidArgument);
        assert!(e.to_string().contains("block 1"), "{e}");
        assert_eq!(kind(list(&[0], &[0], 0)), InvalidArgument);
        assert_eq!(kind(list(&[0, 16], &[0], 16)), InvalidArgument);
        assert_eq!(kind(list(&[], &[], 16)), InvalidArgument);
        // 2^64 bytes in all.
        let half = 1u64 << 63;
        assert_eq!(kind(list(&[0, 0], &[0, 0], half)), InvalidArgument);
    }

    #[test]
    fn a_piece_is_found_in_order_after_a_step_back_and_nowhere_past_the_end() {
        // Runs of 48, 32 and 16 bytes.
        let local = [0, 16, 32, 48, 64, 1000];
        let remote = [100, 116, 132, 500, 516, 532];
        let r = one(&list(&local, &remote, 16));
        let mut cursor = 0;
        let piece = |offset, cursor: &mut u32| r.piece(offset, cursor).unwrap();
        let p = |local, remote, len| Piece { local, remote, len };
        assert_eq!(piece(0, &mut cursor), p(0, 100, 48));
        assert_eq!(piece(40, &mut cursor), p(40, 140, 8));
        assert_eq!(piece(48, &mut cursor), p(48, 500, 32));
        assert_eq!(cursor, 1);
        assert_eq!(piece(80, &mut cursor), p(1000, 532, 16));
        assert_eq!(cursor, 2);
        // A step back (a refused slice posted again) and a jump.
        assert_eq!(piece(10, &mut cursor), p(10, 110, 38));
        assert_eq!(cursor, 0);
        assert_eq!(piece(95, &mut cursor), p(1015, 547, 1));
        assert_eq!(r.piece(96, &mut cursor), None);
        // A stale cursor past the runs still finds it.
        let mut stale = 7;
        assert_eq!(piece(50, &mut stale), p(50, 502, 30));
    }

    #[test]
    fn a_refused_list_gives_its_buffer_back_and_a_sparse_one_keeps_an_exact_copy() {
        let pool = Arc::new(RunPool::default());
        pool.give(Vec::with_capacity(1000));
        // The second block is in no registration: refused, and the
        // buffer the first group took is back.
        let find = |addr: u64, len: u64| {
            (addr + len <= 64)
                .then_some(Registration {
                    handle: 0usize,
                    base: 0,
                    len: 64,
                })
                .ok_or_else(|| Error::invalid("nowhere"))
        };
        let bad = list(&[0, 4096], &[0, 16], 16);
        assert!(plan(&bad, find, ALL, &pool).is_err());
        assert_eq!(pool.free.lock().len(), 1);
        assert!(pool.free.lock()[0].capacity() >= 1000);
        // 4 contiguous blocks: one run in a buffer sized for 1000; the
        // runs keep an exact copy and the big buffer goes back.
        let ok = list(&[0, 16, 32, 48], &[0, 16, 32, 48], 16);
        let mut g = plan(&ok, find, ALL, &pool).unwrap();
        assert!(pool.free.lock().is_empty(), "taken");
        let runs = g.remove(0).runs(Some(pool.clone()));
        assert_eq!(runs.runs.len(), 1);
        assert!(runs.runs.capacity() < 64);
        assert!(pool.free.lock()[0].capacity() >= 1000, "given back");
    }

    #[test]
    fn admission_counts_slices_cut_at_every_run_end() {
        let local = [0, 16, 32, 48, 64, 1000];
        let remote = [100, 116, 132, 500, 516, 532];
        let r = one(&list(&local, &remote, 16));
        // 48 → 2 slices of 32, 32 → 1, 16 → 1.
        assert_eq!(r.slices(32), 4);
        assert_eq!(r.slices(16), 6);
        assert_eq!(r.slices(0), 96, "a zero slice counts as one byte");
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn a_list_s_buffer_comes_back_and_serves_the_next_list() {
        let pool = Arc::new(RunPool::default());
        let mut v = pool.take(100);
        let at = v.as_ptr();
        v.push(Run {
            start: 0,
            local: 0,
            remote: 0,
        });
        drop(Runs {
            runs: v,
            total: 1,
            local_end: 1,
            pool: Some(pool.clone()),
        });
        let again = pool.take(50);
        assert_eq!(again.as_ptr(), at, "the same buffer, already mapped");
        assert!(again.is_empty() && again.capacity() >= 100);
        // Beyond the pool's bound a buffer is let go; the pool keeps its
        // largest buffers.
        pool.give(Vec::with_capacity(POOL_MAX_RUNS + 1));
        assert!(pool.free.lock().is_empty());
        for n in [10, 20, 30, 40, 50] {
            pool.give(Vec::with_capacity(n));
        }
        let mut caps: Vec<usize> = pool.free.lock().iter().map(Vec::capacity).collect();
        caps.sort_unstable();
        assert_eq!(caps, [20, 30, 40, 50]);
        assert_eq!(pool.take(25).capacity(), 30, "the smallest that holds it");
        assert!(pool.take(1000).capacity() >= 1000, "the largest, grown");
    }
}
