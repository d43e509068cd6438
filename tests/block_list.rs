//! Block lists (`Engine::submit_blocks`): scattered pages land where each
//! pair says, a list is one task per local registration, bad lists are
//! refused whole.

mod common;

use std::time::Duration;

use common::{engine, pattern};
use tent::{BlockList, ErrorKind, Opcode, Priority, TaskState};

const BLOCK: u64 = 4096;

#[test]
fn scattered_blocks_land_in_place_and_contiguous_ones_merge() {
    let (a, b) = (engine(), engine());
    let seg = a.open_segment(&b.segment_name()).unwrap();
    let n = 64u64;
    let src = a.allocate_memory(n * BLOCK).unwrap();
    let back = a.allocate_memory(n * BLOCK).unwrap();
    let dst = b.allocate_memory(n * BLOCK).unwrap();
    let data = pattern(9, (n * BLOCK) as usize);
    src.write(0, &data).unwrap();
    // Local block i goes to remote page perm[i]: runs of 4 in order, the
    // runs themselves reversed (16 runs, one task).
    let perm: Vec<u64> = (0..n).map(|i| (n / 4 - 1 - i / 4) * 4 + i % 4).collect();
    let local: Vec<u64> = (0..n).map(|i| src.addr() + i * BLOCK).collect();
    let remote: Vec<u64> = perm.iter().map(|p| dst.addr() + p * BLOCK).collect();
    let batch = a.allocate_batch(n as usize).unwrap();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: seg,
        block_len: BLOCK,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::Low,
    };
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 1);
    let s = a.wait_batch(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (s.state, s.transferred_bytes),
        (TaskState::Completed, n * BLOCK)
    );
    let mut out = vec![0u8; (n * BLOCK) as usize];
    dst.read(0, &mut out).unwrap();
    for (i, &p) in perm.iter().enumerate() {
        let (l, r) = (i * BLOCK as usize, (p * BLOCK) as usize);
        assert!(
            out[r..r + BLOCK as usize] == data[l..l + BLOCK as usize],
            "block {i} not at page {p}"
        );
    }
    // And back with READ into another buffer, same pairs.
    let local_back: Vec<u64> = (0..n).map(|i| back.addr() + i * BLOCK).collect();
    let read = BlockList {
        opcode: Opcode::Read,
        local_addrs: &local_back,
        ..list
    };
    let batch2 = a.allocate_batch(n as usize).unwrap();
    assert_eq!(a.submit_blocks(batch2, &read).unwrap(), 1);
    assert_eq!(
        a.wait_batch(batch2, Duration::from_secs(10)).unwrap().state,
        TaskState::Completed
    );
    let mut got = vec![0u8; (n * BLOCK) as usize];
    back.read(0, &mut got).unwrap();
    assert!(got == data, "READ back differs");
}

#[test]
fn a_bad_block_list_is_refused_whole() {
    let a = engine();
    let src = a.allocate_memory(8 * BLOCK).unwrap();
    let dst = a.allocate_memory(8 * BLOCK).unwrap();
    let batch = a.allocate_batch(4).unwrap();
    let local: Vec<u64> = (0..4).map(|i| src.addr() + 2 * i * BLOCK).collect();
    let remote: Vec<u64> = (0..4).map(|i| dst.addr() + 2 * i * BLOCK).collect();
    let list = |local: &'_ [u64], remote: &'_ [u64], block_len| {
        let l = BlockList {
            opcode: Opcode::Write,
            segment: tent::SegmentId::LOCAL,
            block_len,
            local_addrs: local,
            remote_addrs: remote,
            priority: Priority::High,
        };
        a.submit_blocks(batch, &l).map_err(|e| e.kind())
    };
    // The last block's local side runs off the end of the region.
    let mut past = local.clone();
    past[3] = src.addr() + 8 * BLOCK - 1;
    assert_eq!(list(&past, &remote, BLOCK), Err(ErrorKind::OutOfBounds));
    let mut stray = local.clone();
    stray[1] = 0x1000;
    assert_eq!(
        list(&stray, &remote, BLOCK),
        Err(ErrorKind::AddressNotRegistered)
    );
    assert_eq!(
        list(&local[..3], &remote, BLOCK),
        Err(ErrorKind::InvalidArgument)
    );
    assert_eq!(list(&local, &remote, 0), Err(ErrorKind::InvalidArgument));
    // Nothing of the refused calls was queued.
    assert!(a.status_list(batch).unwrap().is_empty());
    for _ in 0..4 {
        assert_eq!(list(&local, &remote, BLOCK), Ok(1));
    }
    assert_eq!(
        list(&local, &remote, BLOCK),
        Err(ErrorKind::InvalidArgument),
        "a fifth task into a batch of 4"
    );
    let s = a.wait_batch(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (s.state, s.transferred_bytes),
        (TaskState::Completed, 4 * 4 * BLOCK)
    );
    assert_eq!(a.status_list(batch).unwrap().len(), 4);
}

/// A block whose remote side is in no memory of the segment: the call
/// cannot know (the segment's memory is the peer's), so the list's task
/// fails with the transport's typed error; the blocks in the other
/// registration's task still move.
#[test]
fn a_block_outside_the_segment_fails_its_task_with_a_typed_error() {
    let a = engine();
    let src = a.allocate_memory(4 * BLOCK).unwrap();
    let other = a.allocate_memory(BLOCK).unwrap();
    let dst = a.allocate_memory(4 * BLOCK).unwrap();
    let data = pattern(7, BLOCK as usize);
    other.write(0, &data).unwrap();
    let local = [src.addr(), src.addr() + BLOCK, other.addr()];
    let remote = [dst.addr() + 2 * BLOCK, 0x1000, dst.addr()];
    let batch = a.allocate_batch(2).unwrap();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: tent::SegmentId::LOCAL,
        block_len: BLOCK,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::High,
    };
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 2);
    let s = a.wait_batch(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Failed);
    let tasks = a.status_list(batch).unwrap();
    assert_eq!(tasks[0].state, TaskState::Failed);
    assert!(
        matches!(
            tasks[0].error,
            Some(ErrorKind::AddressNotRegistered | ErrorKind::OutOfBounds)
        ),
        "{:?}",
        tasks[0].error
    );
    assert_eq!(
        (tasks[1].state, tasks[1].transferred_bytes),
        (TaskState::Completed, BLOCK)
    );
    let mut out = vec![0u8; BLOCK as usize];
    dst.read(0, &mut out).unwrap();
    assert!(out == data, "the other registration's block moved");
}

/// Two registered regions that happen to be adjacent in memory: a block at
/// the end of one and the next at the start of the other are contiguous,
/// but one request must lie in one region, so they stay two requests (they
/// were merged into one that no region holds: `OutOfBounds`).
#[test]
fn blocks_contiguous_across_two_adjacent_regions_are_not_merged() {
    let a = engine();
    let mut mem = vec![0u8; 4 * BLOCK as usize];
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` outlives the engine's use of it: unregistered below before it drops.
    let first = unsafe { a.register_memory(base, 2 * BLOCK) }.unwrap();
    let half = base.wrapping_add(2 * BLOCK as usize);
    // SAFETY: as above; the second half of the same allocation.
    let second = unsafe { a.register_memory(half, 2 * BLOCK) }.unwrap();
    assert_eq!(first.addr() + 2 * BLOCK, second.addr(), "adjacent");
    let dst = a.allocate_memory(2 * BLOCK).unwrap();
    let data = pattern(4, 2 * BLOCK as usize);
    first.write(BLOCK, &data[..BLOCK as usize]).unwrap();
    second.write(0, &data[BLOCK as usize..]).unwrap();
    let local = [first.addr() + BLOCK, second.addr()];
    let remote = [dst.addr(), dst.addr() + BLOCK];
    let batch = a.allocate_batch(2).unwrap();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: tent::SegmentId::LOCAL,
        block_len: BLOCK,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::High,
    };
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 2);
    assert_eq!(
        a.wait_batch(batch, Duration::from_secs(10)).unwrap().state,
        TaskState::Completed
    );
    let mut out = vec![0u8; 2 * BLOCK as usize];
    dst.read(0, &mut out).unwrap();
    assert!(out == data);
    a.free_batch(batch).unwrap();
    a.unregister_memory(first.id()).unwrap();
    a.unregister_memory(second.id()).unwrap();
    drop(mem);
}

/// Blocks longer than a slice (`block_size`): each run is cut into slices
/// that never cross its end, and every byte lands where its pair says.
#[test]
fn blocks_longer_than_a_slice_are_cut_within_their_runs() {
    let mut cfg = common::test_config();
    cfg.block_size = 64 << 10;
    let a = tent::Engine::new(cfg).unwrap();
    let block: u64 = 100 << 10;
    let n = 8u64;
    let src = a.allocate_memory(n * block).unwrap();
    let dst = a.allocate_memory(n * block).unwrap();
    let data = pattern(3, (n * block) as usize);
    src.write(0, &data).unwrap();
    let perm = [5u64, 2, 7, 0, 3, 6, 1, 4];
    let local: Vec<u64> = (0..n).map(|i| src.addr() + i * block).collect();
    let remote: Vec<u64> = perm.iter().map(|p| dst.addr() + p * block).collect();
    let batch = a.allocate_batch(1).unwrap();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: tent::SegmentId::LOCAL,
        block_len: block,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::Medium,
    };
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 1);
    let s = a.wait_batch(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (s.state, s.transferred_bytes),
        (TaskState::Completed, n * block)
    );
    let mut out = vec![0u8; (n * block) as usize];
    dst.read(0, &mut out).unwrap();
    let b = block as usize;
    for (i, &p) in perm.iter().enumerate() {
        let p = p as usize;
        assert!(
            out[p * b..(p + 1) * b] == data[i * b..(i + 1) * b],
            "block {i} not at {p}"
        );
    }
}

/// A list over three registrations is three tasks, in the order their
/// registrations first appear in the list; into a batch with room for two
/// it is refused whole, nothing queued.
#[test]
fn a_list_over_several_registrations_is_a_task_each_or_refused_whole() {
    let a = engine();
    let regs: Vec<_> = (0..3)
        .map(|_| a.allocate_memory(4 * BLOCK).unwrap())
        .collect();
    let dst = a.allocate_memory(16 * BLOCK).unwrap();
    // Blocks of registration 2, 0, 2, 1: tasks for 2 (2 blocks), 0, 1.
    let local = [
        regs[2].addr(),
        regs[0].addr(),
        regs[2].addr() + BLOCK,
        regs[1].addr() + 2 * BLOCK,
    ];
    let remote: Vec<u64> = (0..4).map(|i| dst.addr() + 3 * i * BLOCK).collect();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: tent::SegmentId::LOCAL,
        block_len: BLOCK,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::High,
    };
    let small = a.allocate_batch(2).unwrap();
    assert_eq!(
        a.submit_blocks(small, &list).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
    assert!(a.status_list(small).unwrap().is_empty(), "nothing queued");
    let batch = a.allocate_batch(3).unwrap();
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 3);
    assert_eq!(
        a.wait_batch(batch, Duration::from_secs(10)).unwrap().state,
        TaskState::Completed
    );
    let bytes: Vec<u64> = a
        .status_list(batch)
        .unwrap()
        .iter()
        .map(|s| s.transferred_bytes)
        .collect();
    assert_eq!(bytes, [2 * BLOCK, BLOCK, BLOCK]);
}

/// A cancel stops a block list between its slices: its task ends
/// `Canceled` with the bytes moved so far, and the batch can be freed.
#[test]
fn a_cancel_stops_a_block_list_between_slices() {
    let mut cfg = common::test_config();
    cfg.block_size = 4096;
    let a = tent::Engine::new(cfg).unwrap();
    let n = 16384u64;
    let src = a.allocate_memory(n * BLOCK).unwrap();
    let dst = a.allocate_memory(n * BLOCK).unwrap();
    // Reversed: no two blocks merge, 16384 runs of one slice each.
    let local: Vec<u64> = (0..n).map(|i| src.addr() + i * BLOCK).collect();
    let remote: Vec<u64> = (0..n).map(|i| dst.addr() + (n - 1 - i) * BLOCK).collect();
    let batch = a.allocate_batch(1).unwrap();
    let list = BlockList {
        opcode: Opcode::Write,
        segment: tent::SegmentId::LOCAL,
        block_len: BLOCK,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: Priority::Low,
    };
    assert_eq!(a.submit_blocks(batch, &list).unwrap(), 1);
    a.cancel(batch).unwrap();
    let s = a.wait_batch(batch, Duration::from_secs(30)).unwrap();
    assert_eq!(
        (s.state, s.error),
        (TaskState::Canceled, Some(ErrorKind::Canceled)),
        "64 MiB in 4 KiB slices cannot finish before the cancel lands"
    );
    assert!(s.transferred_bytes < n * BLOCK);
    assert_eq!(s.transferred_bytes % BLOCK, 0, "whole slices only");
    a.free_batch(batch).unwrap();
}
