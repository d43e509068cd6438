"""Two processes over shm: this one opens the peer's segment by its name
(ip:port, TENT's naming) and moves data; the peer (tests/peer.py) checks
what landed and answers on its stdout."""

import ctypes
import hashlib

import numpy as np
import pytest
import tent
from helpers import pattern

PEER_SEED = 7


def peer_pattern(peer, off, n):
    return pattern(PEER_SEED, peer.size)[off:off + n]


def test_two_process_write_and_read_verified(engine, peer):
    seg = engine.open_segment(peer.name)
    assert engine.open_segment(peer.name) == seg, "same name, same handle"
    info = engine.get_segment_info(seg)
    assert (peer.base, peer.size) in {(b.base, b.length) for b in info.buffers}

    # WRITE 4 MiB from a registered numpy array at an offset, and a small
    # one from allocated memory by raw address.
    n = 4 << 20
    src = np.frombuffer(pattern(21, n), dtype=np.uint8).copy()
    engine.register_local_memory(src)
    small = engine.allocate_local_memory(4096)
    ctypes.memmove(small, pattern(22, 4096), 4096)
    batch = engine.allocate_transfer_batch(4)
    engine.submit_transfer(batch, [
        tent.Request(tent.OpCode.WRITE, src, seg, peer.base + (1 << 20), n),
        tent.Request(tent.OpCode.WRITE, small, seg, peer.base + (8 << 20), 4096),
    ])
    st = engine.wait_transfer(batch, 30)
    assert (st.state, st.bytes) == (tent.COMPLETED, n + 4096)
    assert engine.get_transfer_status(batch, 0).transport == "shm"
    assert peer.ask(f"CHECK {1 << 20} {n} 21") == ["CHECK", "OK"]
    assert peer.ask(f"CHECK {8 << 20} 4096 22") == ["CHECK", "OK"]
    # The check can fail: the peer's bytes there are not seed 23's.
    assert peer.ask(f"CHECK {8 << 20} 4096 23") == ["CHECK", "BAD"]

    # READ the peer's own pattern into a registered bytearray.
    dst = bytearray(n)
    engine.register_local_memory(dst)
    off = 12 << 20
    engine.submit_transfer(batch, [tent.Request(tent.OpCode.READ, dst, seg, peer.base + off, n)])
    engine.wait_transfer(batch, 30)
    assert bytes(dst) == peer_pattern(peer, off, n)
    engine.free_transfer_batch(batch)
    engine.unregister_local_memory(src)
    engine.unregister_local_memory(dst)
    engine.close_segment(seg)
    with pytest.raises(tent.SegmentNotFoundError):
        engine.get_segment_info(seg)


def test_two_process_notifications_both_ways(engine, peer):
    seg = engine.open_segment(peer.name)
    engine.send_notifi(seg, tent.Notification("hello", "from the test"))
    name, msg, sender, _, ok = peer.ask("WAITNOTE 10 0 0 0")[1:]
    assert (name, bytes.fromhex(msg), sender) == ("hello", b"from the test", engine.get_segment_name())
    # And back: the peer opens this engine's segment and sends one.
    assert peer.ask(f"SEND {engine.get_segment_name()} back peer-says-hi") == ["SENT"]
    note = engine.wait_notifi(10)
    assert (note.name, note.msg, note.sender) == ("back", "peer-says-hi", peer.name)
    assert engine.recv_notifi() == []
    # Several, in order, taken at once by recv_notifi.
    for i in range(3):
        assert peer.ask(f"SEND {engine.get_segment_name()} n{i} m{i}") == ["SENT"]
    got = engine.recv_notifi()
    assert [(n.name, n.msg) for n in got] == [("n0", "m0"), ("n1", "m1"), ("n2", "m2")]


@pytest.mark.parametrize("form", ["notif", "Notification"])
def test_notification_arrives_after_the_data(engine, peer, form):
    """The peer reads the data the moment the notification arrives: all of
    it must be there. 64 MiB in 16 requests: a notification sent without
    waiting for the data (send_notifi right after submit_transfer) beats
    it here every time, so this fails if the engine sends too early."""
    seg = engine.open_segment(peer.name)
    n, piece = 64 << 20, 4 << 20
    src = engine.allocate_local_memory(n)
    seed = 31 if form == "notif" else 32
    ctypes.memmove(src, pattern(seed, n), n)
    peer.send(f"WAITNOTE 30 0 {n} {seed}")
    batch = engine.allocate_transfer_batch(16)
    reqs = [
        tent.Request(tent.OpCode.WRITE, src + i * piece, seg, peer.base + i * piece, piece)
        for i in range(n // piece)
    ]
    if form == "notif":
        engine.submit_transfer_notif(batch, reqs, "kv-ready", "layer 3")
    else:
        engine.submit_transfer(batch, reqs, tent.Notification("kv-ready", b"layer 3"))
    reply = peer.answer()
    assert reply[:3] == ["NOTE", "kv-ready", b"layer 3".hex()], reply
    assert reply[-2:] == ["DATA", "OK"], reply
    st = engine.wait_transfer(batch, 30)
    assert (st.state, st.bytes) == (tent.COMPLETED, n)
    engine.free_transfer_batch(batch)


def test_two_process_block_list(engine, peer):
    blk, nblk = 16 << 10, 512
    src = np.frombuffer(pattern(41, blk * nblk), dtype=np.uint8).copy()
    engine.register_local_memory(src)
    seg = engine.open_segment(peer.name)
    perm = np.random.default_rng(2).permutation(nblk).astype(np.uint64)
    local = np.uint64(src.ctypes.data) + np.arange(nblk, dtype=np.uint64) * np.uint64(blk)
    remote = np.uint64(peer.base) + perm * np.uint64(blk)
    batch = engine.allocate_transfer_batch(nblk)
    tasks = engine.submit_blocks(batch, tent.OpCode.WRITE, seg, blk, local, remote)
    assert tasks == 1, "one registration: one request"
    st = engine.wait_transfer(batch, 30)
    assert (st.state, st.bytes) == (tent.COMPLETED, blk * nblk)
    expect = bytearray(blk * nblk)
    for i, j in enumerate(perm):
        expect[int(j) * blk:(int(j) + 1) * blk] = src[i * blk:(i + 1) * blk].tobytes()
    assert peer.ask(f"HASH 0 {blk * nblk}") == ["HASH", hashlib.sha256(expect).hexdigest()]
    # And READ them back scattered into a zeroed array.
    back = np.zeros_like(src)
    engine.register_local_memory(back)
    local_back = np.uint64(back.ctypes.data) + np.arange(nblk, dtype=np.uint64) * np.uint64(blk)
    engine.free_transfer_batch(batch)
    batch = engine.allocate_transfer_batch(nblk)
    engine.submit_blocks(batch, tent.OpCode.READ, seg, blk, local_back, remote)
    engine.wait_transfer(batch, 30)
    assert (back == src).all()
    engine.free_transfer_batch(batch)
