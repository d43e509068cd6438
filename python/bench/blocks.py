"""Block lists from Python over shm between two processes.

    python python/bench/blocks.py [--blocks 10000] [--block-kib 16] [--reps 10]

A peer process (python/tests/peer.py) exports a region; this process
writes N blocks of B KiB into it with one `submit_blocks` call per
repetition, remote blocks in a random order (a paged KV cache's layout:
nothing merges; one task, as every list in one registration is), and
reports:

- the time inside the `submit_blocks` call, min / median / max over the
  repetitions, with the address lists as numpy uint64 arrays (read in
  place through the buffer protocol) and as Python lists of ints
  (converted in the call);
- end to end, submit to completion, in GB/s;
- the same bytes as one request (`submit_transfer`), end to end;
- the same blocks laid out contiguously (they merge into one run).

The data of the last block-list repetition is checked against the peer
(sha256 of the region).
"""

import argparse
import ctypes
import hashlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import tent  # noqa: E402
from helpers import CONFIG, Peer  # noqa: E402


def run(engine, submit, total, reps):
    """Time `submit(batch)` and submit-to-completion over `reps` runs."""
    inside, e2e = [], []
    for _ in range(reps):
        batch = engine.allocate_transfer_batch(16384)
        t0 = time.perf_counter_ns()
        tasks = submit(batch)
        t1 = time.perf_counter_ns()
        st = engine.wait_transfer(batch, 60)
        t2 = time.perf_counter_ns()
        assert st.bytes == total, st
        engine.free_transfer_batch(batch)
        inside.append((t1 - t0) / 1e6)
        e2e.append((t2 - t0) / 1e9)
    return tasks, inside, e2e


def show(label, tasks, inside, e2e, total):
    gbps = [total / s / 1e9 for s in e2e]
    print(
        f"{label:<34} tasks {tasks:>6}  in call ms min {min(inside):7.3f} med {statistics.median(inside):7.3f} "
        f"max {max(inside):7.3f}   end-to-end GB/s med {statistics.median(gbps):5.2f} "
        f"(min {min(gbps):5.2f}, max {max(gbps):5.2f})"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=10000)
    ap.add_argument("--block-kib", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--config", default=CONFIG, help="engine config (JSON text or path), both processes")
    args = ap.parse_args()
    n, blk = args.blocks, args.block_kib << 10
    total = n * blk
    size = (total + (1 << 20) - 1) & ~((1 << 20) - 1)

    peer = Peer(size, -1, args.config)
    engine = tent.TransferEngine(args.config)
    try:
        seg = engine.open_segment(peer.name)
        src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
        engine.register_local_memory(src)
        local = np.uint64(src.ctypes.data) + np.arange(n, dtype=np.uint64) * np.uint64(blk)
        perm = np.random.default_rng(1).permutation(n).astype(np.uint64)
        scattered = np.uint64(peer.base) + perm * np.uint64(blk)
        contiguous = np.uint64(peer.base) + np.arange(n, dtype=np.uint64) * np.uint64(blk)
        print(f"{n} blocks x {args.block_kib} KiB = {total / 2**20:.1f} MiB over shm, {args.reps} repetitions, "
              f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")

        def blocks(remote):
            return lambda b: engine.submit_blocks(b, tent.OpCode.WRITE, seg, blk, local, remote)

        def blocks_lists(remote):
            local_list, remote_list = local.tolist(), remote.tolist()
            return lambda b: engine.submit_blocks(b, tent.OpCode.WRITE, seg, blk, local_list, remote_list)

        def one(b):
            engine.submit_transfer(b, [tent.Request(tent.OpCode.WRITE, src, seg, peer.base, total)])
            return 1

        # Warm up once each (page faults of first touch on both sides).
        run(engine, blocks(scattered), total, 1)
        run(engine, one, total, 1)
        res = run(engine, blocks(scattered), total, args.reps)
        show("submit_blocks, scattered", *res, total)
        expect = bytearray(size)
        sv = memoryview(src)
        for i, j in enumerate(perm.tolist()):
            expect[j * blk:(j + 1) * blk] = sv[i * blk:(i + 1) * blk]
        got = peer.ask(f"HASH 0 {total}")[1]
        assert got == hashlib.sha256(expect[:total]).hexdigest(), "block-list data differs at the peer"
        print("  data verified at the peer (sha256)")
        show("submit_blocks, scattered, lists", *run(engine, blocks_lists(scattered), total, args.reps), total)
        show("submit_blocks, contiguous (merged)", *run(engine, blocks(contiguous), total, args.reps), total)
        show("one request (submit_transfer)", *run(engine, one, total, args.reps), total)
    finally:
        engine.close()
        peer.close()


if __name__ == "__main__":
    main()
