"""One engine, its own memory (segment 0, LOCAL_SEGMENT_ID): TENT's API
surface, buffer-protocol memory, the ring API, block lists."""

import ctypes
import json
import threading
import time
from array import array

import numpy as np
import pytest
import tent
from helpers import CONFIG, pattern


def test_tent_names_exist():
    for name in [
        "TransferEngine", "Request", "OpCode", "TransferStatusEnum", "TransferStatus",
        "Notification", "SegmentInfo", "SegmentInfoBuffer", "TentException",
        "InvalidArgumentError", "AddressNotRegisteredError", "PRIO_HIGH", "PRIO_MEDIUM",
        "PRIO_LOW", "LOCAL_SEGMENT_ID", "READ", "WRITE", "COMPLETED", "PENDING",
        # TENT's own classes, for scripts' except clauses.
        "RdmaError", "MetadataError", "InternalError", "NotImplementedError",
    ]:
        assert hasattr(tent, name), name
    for m in [
        "get_segment_name", "open_segment", "close_segment", "get_segment_info",
        "allocate_local_memory", "free_local_memory", "register_local_memory",
        "unregister_local_memory", "allocate_transfer_batch", "free_transfer_batch",
        "submit_transfer", "submit_transfer_notif", "cancel_transfer", "send_notifi",
        "recv_notifi", "get_transfer_status", "get_transfer_status_list",
        "get_transfer_status_overall", "available",
    ]:
        assert callable(getattr(tent.TransferEngine, m)), m
    assert (tent.PRIO_HIGH, tent.PRIO_MEDIUM, tent.PRIO_LOW) == (0, 1, 2)
    assert int(tent.OpCode.WRITE) == 1 and tent.OpCode.READ.name == "READ"
    assert tent.TransferStatusEnum.COMPLETED.value == 4
    assert tent.COMPLETED == tent.TransferStatusEnum.COMPLETED


def test_exception_classes_carry_kind_and_code():
    e = tent.OutOfBoundsError
    assert issubclass(e, tent.TentException) and (e.kind, e.code) == ("OutOfBounds", 36)
    assert tent.InvalidArgumentError.code == 32
    assert tent.SegmentNotFoundError.kind == "SegmentNotFound"
    # tent's Timeout is also Python's TimeoutError.
    assert issubclass(tent.TimeoutError, TimeoutError)
    assert tent.error_class("Shutdown") is tent.ShutdownError
    # Every kind of the engine's taxonomy has its class.
    for name, code in tent._tent.error_kinds():
        cls = getattr(tent, f"{name}Error")
        assert cls.code == code and issubclass(cls, tent.TentException)
    # A star import does not shadow Python's own.
    ns = {}
    exec("from tent import *", ns)
    assert "TimeoutError" not in ns and "InvalidArgumentError" in ns


def test_config_forms(tmp_path):
    p = tmp_path / "tent.json"
    p.write_text(CONFIG)
    for arg in (str(p), p, CONFIG, json.loads(CONFIG)):
        e = tent.TransferEngine(arg)
        assert e.available() and ":" in e.get_segment_name()
        e.close()
        assert not e.available()
    with pytest.raises(tent.InvalidArgumentError, match="cuont"):
        tent.TransferEngine('{"workers": {"cuont": 2}}')
    with pytest.raises(tent.InvalidArgumentError):
        tent.TransferEngine(str(tmp_path / "missing.json"))


def write_read_local(engine, src, dst, n, **kw):
    batch = engine.allocate_transfer_batch(2)
    engine.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, src, tent.LOCAL_SEGMENT_ID, dst, n, **kw)])
    st = engine.wait_transfer(batch, 10)
    assert st.state == tent.TransferStatusEnum.COMPLETED and st.bytes == n
    s0 = engine.get_transfer_status(batch, 0)
    assert (s0.state, s0.bytes) == (tent.COMPLETED, n)
    assert engine.get_transfer_status_overall(batch).state == tent.COMPLETED
    assert [s.state for s in engine.get_transfer_status_list(batch)] == [tent.COMPLETED]
    engine.free_transfer_batch(batch)


def test_allocated_memory_by_address(engine):
    n = 1 << 20
    a = engine.allocate_local_memory(n)
    b = engine.allocate_local_memory(n)
    info = engine.get_segment_info(tent.LOCAL_SEGMENT_ID)
    bases = {(x.base, x.length) for x in info.buffers}
    assert {(a, n), (b, n)} <= bases
    data = pattern(3, n)
    ctypes.memmove(a, data, n)
    write_read_local(engine, a, b, n, priority=tent.PRIO_LOW, transport_hint="local")
    assert ctypes.string_at(b, n) == data
    engine.free_local_memory(a)
    engine.free_local_memory(b)
    info = engine.get_segment_info(0)
    assert not {a, b} & {x.base for x in info.buffers}


def test_buffer_protocol_memory(engine):
    n = 256 << 10
    src = np.frombuffer(pattern(5, n), dtype=np.uint8).copy()
    dst = bytearray(n)
    view = memoryview(bytearray(n))
    for obj in (src, dst, view):
        assert engine.register_local_memory(obj) == tent.Request(source=obj).source
    # numpy source -> bytearray target, by object.
    write_read_local(engine, src, tent.Request(source=dst).source, n)
    assert bytes(dst) == src.tobytes()
    # A registered bytearray is held: it cannot be resized under the engine.
    with pytest.raises(BufferError):
        dst.extend(b"x")
    # A READ into a memoryview, a sub-range by a slice of a registered array.
    batch = engine.allocate_transfer_batch(1)
    half = src[n // 2:]
    engine.submit_transfer(batch, [tent.Request(tent.OpCode.READ, view, 0, half.ctypes.data, n // 2)])
    engine.wait_transfer(batch, 10)
    assert view[: n // 2].tobytes() == src[n // 2:].tobytes()
    engine.free_transfer_batch(batch)
    for obj in (src, dst, view):
        engine.unregister_local_memory(obj)
    dst.extend(b"x")  # released: resizable again
    # 2-D and Fortran-ordered arrays are one contiguous range too.
    f = np.asfortranarray(np.zeros((64, 64), dtype=np.float32))
    assert engine.register_local_memory(f) == f.ctypes.data
    engine.unregister_local_memory(f.ctypes.data)


def test_register_raw_address(engine):
    n = 64 << 10
    raw = ctypes.create_string_buffer(pattern(9, n), n)
    addr = ctypes.addressof(raw)
    assert engine.register_local_memory(addr, n) == addr
    dst = engine.allocate_local_memory(n)
    write_read_local(engine, addr, dst, n)
    assert ctypes.string_at(dst, n) == pattern(9, n)
    engine.unregister_local_memory(addr, n)
    with pytest.raises(tent.AddressNotRegisteredError):
        engine.unregister_local_memory(addr)


def test_cancel_and_deadline_fields(engine):
    n = 4096
    a = engine.allocate_local_memory(n)
    b = engine.allocate_local_memory(n)
    r = tent.Request(tent.OpCode.WRITE, a, 0, b, n, deadline_ns=time.monotonic_ns() + 10**9)
    r.priority = tent.PRIO_MEDIUM
    r.transport_hint = "ANY"
    assert (r.priority, r.transport_hint, r.length) == (1, "any", n)
    assert "WRITE" in repr(r)
    batch = engine.allocate_transfer_batch(1)
    engine.submit_transfer(batch, [r])
    engine.cancel_transfer(batch)  # after or before completion: either way it ends
    deadline = time.time() + 10
    while engine.get_transfer_status(batch, 0).state == tent.PENDING:
        assert time.time() < deadline
    assert engine.get_transfer_status(batch, 0).state in (tent.COMPLETED, tent.CANCELED)
    engine.cancel_transfer(batch, 0)
    engine.free_transfer_batch(batch)


def test_ring_round_trip(engine):
    n = 64 << 10
    src = engine.allocate_local_memory(n)
    dst = engine.allocate_local_memory(n)
    ctypes.memmove(src, pattern(11, n), n)
    ring = engine.ring(64)
    assert ring.capacity == 64
    reqs = [tent.Request(tent.OpCode.WRITE, src + i * 4096, 0, dst + i * 4096, 4096) for i in range(16)]
    assert ring.submit(reqs, [100 + i for i in range(16)]) == 16
    got = []
    deadline = time.time() + 10
    while len(got) < 16:
        got += ring.wait(5)
        assert time.time() < deadline
    assert sorted(c.user_data for c in got) == [100 + i for i in range(16)]
    assert all(c.ok and c.bytes == 4096 and c.error is None for c in got)
    assert ctypes.string_at(dst, n) == pattern(11, n)
    for c in got:
        c.raise_for_error()
    # A request past its region completes with the engine's error.
    ring.push(tent.Request(tent.OpCode.WRITE, src, 0, dst + n - 8, 64), user_data=7)
    (c,) = ring.wait(5)
    assert (c.user_data, c.ok, c.error) == (7, False, "OutOfBounds")
    with pytest.raises(tent.OutOfBoundsError):
        c.raise_for_error()
    # Full ring: all or nothing.
    with pytest.raises(tent.SqFullError):
        ring.submit([tent.Request(tent.OpCode.WRITE, src, 0, dst, 8)] * 65)
    with pytest.raises(tent.TimeoutError):
        ring.wait(0.05)
    assert ring.completions() == []


def test_ring_inline_issue_and_completion_fd(engine):
    import selectors

    n = 1 << 20
    src = engine.allocate_local_memory(n)
    dst = engine.allocate_local_memory(n)
    ring = engine.ring(8)
    # A small local op is issued inline: its completion is there when push
    # returns.
    ring.push(tent.Request(tent.OpCode.WRITE, src, 0, dst, 8), user_data=1)
    assert [c.user_data for c in ring.completions()] == [1]
    # The worker's completion wakes a selector on the completion fd.
    ring.set_inline(False)
    fd = ring.completion_fd()
    assert ring.prepare_wait()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    ring.push(tent.Request(tent.OpCode.WRITE, src, 0, dst, n), user_data=2)
    assert sel.select(10), "the completion fd did not turn readable"
    ring.finish_wait()
    got = []
    deadline = time.time() + 10
    while not got:
        got += ring.completions()
        assert time.time() < deadline
    assert [(c.user_data, c.bytes) for c in got] == [(2, n)]
    sel.close()


def test_block_list_local(engine):
    blk, nblk = 4096, 64
    src = np.frombuffer(pattern(13, blk * nblk), dtype=np.uint8).copy()
    dst = np.zeros(blk * nblk, dtype=np.uint8)
    engine.register_local_memory(src)
    engine.register_local_memory(dst)
    perm = np.random.default_rng(1).permutation(nblk)
    local = (src.ctypes.data + np.arange(nblk, dtype=np.uint64) * blk).astype(np.uint64)
    remote = (dst.ctypes.data + perm.astype(np.uint64) * blk).astype(np.uint64)
    batch = engine.allocate_transfer_batch(nblk)
    tasks = engine.submit_blocks(batch, tent.OpCode.WRITE, 0, blk, local, remote)
    assert tasks == 1, "one registration: one task"
    engine.wait_transfer(batch, 10)
    for i in range(nblk):
        j = perm[i]
        assert (dst[j * blk:(j + 1) * blk] == src[i * blk:(i + 1) * blk]).all(), i
    engine.free_transfer_batch(batch)
    # Contiguous on both sides: one task; lists and array('Q') work too.
    dst[:] = 0
    batch = engine.allocate_transfer_batch(nblk)
    addrs = [src.ctypes.data + i * blk for i in range(nblk)]
    daddrs = array("Q", [dst.ctypes.data + i * blk for i in range(nblk)])
    assert engine.submit_blocks(batch, tent.OpCode.WRITE, 0, blk, addrs, daddrs, priority=tent.PRIO_LOW) == 1
    engine.wait_transfer(batch, 10)
    assert (dst == src).all()
    engine.free_transfer_batch(batch)


def test_local_notification(engine):
    engine.send_notifi(tent.LOCAL_SEGMENT_ID, tent.Notification("self", b"\x00\xffbin"))
    (n,) = engine.recv_notifi()
    assert (n.name, n.msg_bytes) == ("self", b"\x00\xffbin")
    assert n.msg.encode("utf-8", "surrogateescape") == b"\x00\xffbin"
    assert engine.recv_notifi() == []
    with pytest.raises(tent.TimeoutError):
        engine.wait_notifi(0.05)
    big = tent.Notification("x", b"y" * (tent.MAX_NOTIFY_MSG + 1))
    with pytest.raises(tent.InvalidArgumentError):
        engine.send_notifi(0, big)
    n = tent.Notification()
    n.name, n.msg = "later", "set after"
    engine.send_notifi(0, n)
    assert engine.wait_notifi(5).msg == "set after"


def gil_gap(wait):
    """The longest stretch another thread went without running Python
    while `wait()` ran: about the whole wait if it held the GIL."""
    state = {"last": time.monotonic(), "gap": 0.0}
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            now = time.monotonic()
            state["gap"] = max(state["gap"], now - state["last"])
            state["last"] = now

    t = threading.Thread(target=tick)
    t.start()
    try:
        time.sleep(0.05)
        state["gap"] = 0.0
        wait()
        time.sleep(0.05)  # let the ticker see a gap that just ended
        return state["gap"]
    finally:
        stop.set()
        t.join()


def test_waits_release_the_gil(engine):
    """While one thread waits in the engine, another runs Python."""
    def engine_wait():
        with pytest.raises(tent.TimeoutError):
            engine.wait_notifi(1.0)

    assert gil_gap(engine_wait) < 0.5
    # The measure can fail: a native call that keeps the GIL (ctypes.PyDLL
    # does) leaves the other thread still for all of it.
    assert gil_gap(lambda: ctypes.PyDLL(None).usleep(1_000_000)) > 0.9


def test_unbounded_waits_end_on_ctrl_c_and_on_close(engine):
    import _thread
    import signal

    # interrupt_main() does nothing while SIGINT is ignored, and a process
    # started in the background (`cmd &`) by a non-interactive shell
    # inherits SIGINT ignored: give it Python's handler for this test.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # Ctrl-C (SIGINT's handler) interrupts a wait with no timeout. Should
        # it not, close() ends the wait after 10 s: ShutdownError, a failure
        # rather than a hang.
        guard = threading.Timer(10, engine.close)
        guard.start()
        threading.Timer(0.2, _thread.interrupt_main).start()
        t0 = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                engine.wait_notifi()
        finally:
            guard.cancel()
        assert time.monotonic() - t0 < 5

        # close() from another thread ends one. Should it not, SIGINT ends
        # the wait after 10 s with a failure.
        def stuck(signum, frame):
            raise AssertionError("close() from another thread did not end the wait in 10 s")

        signal.signal(signal.SIGINT, stuck)
        guard = threading.Timer(10, _thread.interrupt_main)
        guard.start()
        threading.Timer(0.2, engine.close).start()
        try:
            with pytest.raises(tent.ShutdownError):
                engine.wait_notifi()
        finally:
            guard.cancel()
    finally:
        signal.signal(signal.SIGINT, old)


def test_enums_hash_and_compare_like_pybind11s():
    assert {tent.OpCode.READ: 1}[tent.READ] == 1
    assert len({tent.COMPLETED, tent.TransferStatusEnum.COMPLETED, tent.FAILED}) == 2
    assert tent.OpCode.WRITE == 1 and tent.OpCode.WRITE != tent.OpCode.READ
    assert repr(tent.OpCode.WRITE) == "OpCode.WRITE"
