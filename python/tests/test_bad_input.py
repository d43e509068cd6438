"""Bad input at the boundary: each case raises the class of its kind,
queues nothing, and leaves the engine working (a valid transfer right
after it lands intact)."""

import ctypes
import time

import numpy as np
import pytest
import tent
from helpers import CONFIG, pattern


@pytest.fixture
def mem(engine):
    n = 64 << 10
    src = engine.allocate_local_memory(n)
    dst = engine.allocate_local_memory(n)
    ctypes.memmove(src, pattern(1, n), n)
    return src, dst, n


def still_works(engine, mem, batch=None):
    """A valid WRITE after whatever was refused (in `batch` when it has
    room, else a batch of its own): it lands intact."""
    src, dst, n = mem
    ctypes.memmove(src, pattern(1, n), n)
    ctypes.memset(dst, 0, n)
    own = batch is None
    if own:
        batch = engine.allocate_transfer_batch(1)
    done = len(engine.get_transfer_status_list(batch))
    engine.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, src, 0, dst, n)])
    deadline = time.time() + 10
    while engine.get_transfer_status(batch, done).state == tent.PENDING:
        assert time.time() < deadline, "valid transfer did not finish"
        time.sleep(0.001)
    st = engine.get_transfer_status(batch, done)
    assert (st.state, st.bytes) == (tent.COMPLETED, n)
    assert ctypes.string_at(dst, n) == pattern(1, n)
    if own:
        engine.free_transfer_batch(batch)


def fails_in_its_task(engine, batch, req, error_class, state, error):
    """`req`, alone in `batch`, is taken by submit and fails in its task:
    waiting raises `error_class`, its status is `state` with `error` and
    no bytes moved."""
    engine.submit_transfer(batch, [req])
    with pytest.raises(error_class):
        engine.wait_transfer(batch, 10)
    st = engine.get_transfer_status(batch, 0)
    assert (st.state, st.error, st.bytes) == (state, error, 0)


def test_null_pointers(engine, mem):
    src, dst, n = mem
    with pytest.raises(tent.InvalidArgumentError):
        engine.register_local_memory(0, 4096)
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.free_local_memory(0)
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.unregister_local_memory(0)
    batch = engine.allocate_transfer_batch(2)
    # A NULL source beside a valid request: refused whole, nothing queued.
    good = tent.Request(tent.OpCode.WRITE, src, 0, dst, n)
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.submit_transfer(batch, [good, tent.Request(tent.OpCode.WRITE, 0, 0, dst, 8)])
    assert engine.get_transfer_status_list(batch) == []
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, [src, 0], [dst, dst + 8])
    assert engine.get_transfer_status_list(batch) == []
    # A NULL target address: the engine fails the task (nothing registered there).
    fails_in_its_task(
        engine,
        batch,
        tent.Request(tent.OpCode.WRITE, src, 0, 0, 8),
        tent.AddressNotRegisteredError,
        tent.FAILED,
        "AddressNotRegistered",
    )
    still_works(engine, mem, batch)
    engine.free_transfer_batch(batch)


def test_buffer_too_small(engine, mem):
    src, dst, n = mem
    small = bytearray(16)
    with pytest.raises(tent.OutOfBoundsError):
        tent.Request(tent.OpCode.WRITE, small, 0, dst, 64)
    with pytest.raises(tent.OutOfBoundsError):
        engine.register_local_memory(small, 64)
    engine.register_local_memory(small)
    r = tent.Request(tent.OpCode.WRITE, small, 0, dst)
    assert r.length == 16
    r.length = 17  # grown after the fact: refused at submit
    batch = engine.allocate_transfer_batch(1)
    with pytest.raises(tent.OutOfBoundsError):
        engine.submit_transfer(batch, [r])
    # A raw address whose range runs past its allocation: the engine says so.
    with pytest.raises(tent.OutOfBoundsError):
        engine.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, src + n - 8, 0, dst, 16)])
    # Zero length.
    with pytest.raises(tent.InvalidArgumentError):
        engine.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, src, 0, dst, 0)])
    assert engine.get_transfer_status_list(batch) == []
    still_works(engine, mem, batch)
    engine.free_transfer_batch(batch)
    engine.unregister_local_memory(small)


def test_closed_engine(mem):
    e = tent.TransferEngine(CONFIG)
    addr = e.allocate_local_memory(4096)
    batch = e.allocate_transfer_batch(1)
    ring = e.ring()
    held = bytearray(4096)
    e.register_local_memory(held)
    with pytest.raises(BufferError):
        held.extend(b"x")
    e.close()
    held.extend(b"x")  # the engine let go of it
    e.close()  # twice: a no-op
    assert not e.available()
    req = tent.Request(tent.OpCode.WRITE, addr, 0, addr, 8)
    calls = [
        lambda: e.get_segment_name(),
        lambda: e.open_segment("127.0.0.1:1"),
        lambda: e.close_segment(1),
        lambda: e.get_segment_info(0),
        lambda: e.allocate_local_memory(64),
        lambda: e.free_local_memory(addr),
        lambda: e.register_local_memory(bytearray(64)),
        lambda: e.unregister_local_memory(addr),
        lambda: e.allocate_transfer_batch(1),
        lambda: e.free_transfer_batch(batch),
        lambda: e.submit_transfer(batch, [req]),
        lambda: e.submit_transfer_notif(batch, [req], "n", "m"),
        lambda: e.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, [addr], [addr]),
        lambda: e.cancel_transfer(batch),
        lambda: e.get_transfer_status(batch, 0),
        lambda: e.get_transfer_status_list(batch),
        lambda: e.get_transfer_status_overall(batch),
        lambda: e.wait_transfer(batch, 1),
        lambda: e.send_notifi(0, tent.Notification("n", "m")),
        lambda: e.recv_notifi(),
        lambda: e.wait_notifi(0.01),
        lambda: e.ring(),
        lambda: ring.push(req),
        lambda: ring.submit([req]),
    ]
    for call in calls:
        with pytest.raises(tent.ShutdownError):
            call()
    # A ring outliving its engine reaps nothing and does not crash.
    assert ring.completions() == []
    with pytest.raises(tent.ShutdownError):
        ring.wait(0.01)
    # Another engine works.
    with tent.TransferEngine(CONFIG) as e2:
        a = e2.allocate_local_memory(4096)
        still_works(e2, (a, a + 2048, 2048))
    assert not e2.available()


def test_freed_batch(engine, mem):
    src, dst, n = mem
    batch = engine.allocate_transfer_batch(1)
    engine.free_transfer_batch(batch)
    req = tent.Request(tent.OpCode.WRITE, src, 0, dst, n)
    with pytest.raises(tent.InvalidArgumentError, match="freed|not allocated"):
        engine.submit_transfer(batch, [req])
    with pytest.raises(tent.InvalidArgumentError):
        engine.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, [src], [dst])
    with pytest.raises(tent.InvalidArgumentError):
        engine.get_transfer_status(batch, 0)
    with pytest.raises(tent.InvalidArgumentError):
        engine.wait_transfer(batch, 1)
    with pytest.raises(tent.InvalidArgumentError, match="double free"):
        engine.free_transfer_batch(batch)
    # Overflowing a live batch queues nothing.
    batch = engine.allocate_transfer_batch(1)
    with pytest.raises(tent.InvalidArgumentError, match="overflow"):
        engine.submit_transfer(batch, [req, req])
    assert engine.get_transfer_status_list(batch) == []
    with pytest.raises(tent.InvalidArgumentError):
        engine.allocate_transfer_batch(0)
    still_works(engine, mem, batch)
    engine.free_transfer_batch(batch)


def test_non_contiguous_numpy(engine, mem):
    src, dst, n = mem
    a = np.zeros(4096, dtype=np.uint8)
    strided = a[::2]
    with pytest.raises(tent.InvalidArgumentError, match="non-contiguous"):
        engine.register_local_memory(strided)
    with pytest.raises(tent.InvalidArgumentError, match="non-contiguous"):
        tent.Request(tent.OpCode.WRITE, strided, 0, dst, 8)
    r = tent.Request(tent.OpCode.WRITE, src, 0, dst, 8)
    with pytest.raises(tent.InvalidArgumentError, match="non-contiguous"):
        r.source = np.zeros((8, 8), dtype=np.uint8)[:, 1]
    batch = engine.allocate_transfer_batch(4)
    addrs = np.array([src, src + 8, src + 16, src + 24], dtype=np.uint64)
    with pytest.raises(tent.InvalidArgumentError, match="non-contiguous"):
        engine.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, addrs[::2], addrs[:2])
    # Address arrays must be unsigned 64-bit.
    with pytest.raises(tent.InvalidArgumentError, match="uint64"):
        engine.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, addrs.astype(np.int64), addrs)
    with pytest.raises(tent.InvalidArgumentError):
        engine.submit_blocks(batch, tent.OpCode.WRITE, 0, 8, ["x"], addrs[:1])
    # A read-only buffer cannot be registered or READ into.
    with pytest.raises(tent.InvalidArgumentError, match="read-only"):
        engine.register_local_memory(b"immutable bytes")
    ro = np.zeros(64, dtype=np.uint8)
    engine.register_local_memory(ro)
    ro.flags.writeable = False
    with pytest.raises(tent.InvalidArgumentError, match="read-only"):
        engine.submit_transfer(batch, [tent.Request(tent.OpCode.READ, memoryview(ro), 0, dst, 8)])
    # Not memory at all.
    with pytest.raises(tent.InvalidArgumentError):
        tent.Request(tent.OpCode.WRITE, "not memory", 0, dst, 8)
    with pytest.raises(tent.InvalidArgumentError):
        tent.Request(tent.OpCode.WRITE, src, 0, dst, 8, priority=7)
    with pytest.raises(tent.InvalidArgumentError):
        tent.Request(tent.OpCode.WRITE, src, 0, dst, 8, transport_hint="carrier-pigeon")
    with pytest.raises(tent.InvalidArgumentError):
        engine.wait_transfer(batch, -1)
    assert engine.get_transfer_status_list(batch) == []
    still_works(engine, mem, batch)
    engine.free_transfer_batch(batch)


def test_unknown_segment(engine, mem):
    src, dst, n = mem
    with pytest.raises(tent.SegmentNotFoundError):
        engine.open_segment("tent-no-such-segment")
    with pytest.raises(tent.InvalidArgumentError):
        engine.open_segment("../etc/passwd")
    for call in (
        lambda: engine.close_segment(99),
        lambda: engine.get_segment_info(99),
        lambda: engine.send_notifi(99, tent.Notification("n", "m")),
    ):
        with pytest.raises(tent.SegmentNotFoundError):
            call()
    # A 64-bit handle whose tag is another engine's names nothing here.
    with pytest.raises(tent.SegmentNotFoundError):
        engine.get_segment_info(1 << 40)
    # A request naming it is refused by the engine at intake: the task
    # ends INVALID with the kind, and waiting raises its class.
    batch = engine.allocate_transfer_batch(2)
    fails_in_its_task(
        engine,
        batch,
        tent.Request(tent.OpCode.WRITE, src, 99, dst, 8),
        tent.SegmentNotFoundError,
        tent.INVALID,
        "SegmentNotFound",
    )
    still_works(engine, mem, batch)
    engine.free_transfer_batch(batch)
    # A notification to it is refused before anything is queued.
    batch = engine.allocate_transfer_batch(1)
    with pytest.raises(tent.SegmentNotFoundError):
        engine.submit_transfer_notif(batch, [tent.Request(tent.OpCode.WRITE, src, 99, dst, 8)], "n", "m")
    assert engine.get_transfer_status_list(batch) == []
    engine.free_transfer_batch(batch)


def test_unknown_memory_for_free_and_unregister(engine, mem):
    src, dst, n = mem
    with pytest.raises(tent.InvalidArgumentError, match="not returned by allocate"):
        engine.free_local_memory(src + 8)
    with pytest.raises(tent.InvalidArgumentError, match="not returned by register"):
        engine.unregister_local_memory(src)
    with pytest.raises(tent.InvalidArgumentError):
        engine.register_local_memory(12345)  # raw address without a size
    engine.free_local_memory(src)
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.free_local_memory(src)
