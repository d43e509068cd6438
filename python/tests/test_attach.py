"""An engine attached to the node's daemon (tentd): tests/python_module.rs
starts one and names its socket in TENT_TEST_DAEMON."""

import ctypes
import os
import time

import pytest
import tent
from helpers import pattern


def daemon_socket():
    sock = os.environ.get("TENT_TEST_DAEMON")
    if not sock:
        pytest.skip("needs a daemon: run through tests/python_module.rs (cargo test), which starts one")
    return sock


def test_an_attached_engine_writes_verified_data_to_a_peer(peer):
    e = tent.TransferEngine(attach=daemon_socket())
    try:
        n = 1 << 20
        src = e.allocate_local_memory(n)
        # The daemon's memory, mapped here: written in place.
        ctypes.memmove(src, pattern(9, n), n)
        # Peers name it where the daemon maps it, in the daemon's segment
        # under this engine's mailbox.
        assert e.peer_address(src) > 0
        assert "#" in e.get_segment_name()
        with pytest.raises(tent.InvalidArgumentError):
            e.peer_address(src + 1)
        seg = e.open_segment(peer.name)
        ring = e.ring(64)
        reqs = [tent.Request(tent.OpCode.WRITE, src + i * (n // 4), seg, peer.base + i * (n // 4), n // 4)
                for i in range(4)]
        assert ring.submit(reqs, [10 + i for i in range(4)]) == 4
        got = []
        deadline = time.time() + 10
        while len(got) < 4:
            got += ring.wait(5)
            assert time.time() < deadline
        assert sorted(c.user_data for c in got) == [10, 11, 12, 13]
        assert all(c.ok and c.bytes == n // 4 for c in got)
        assert peer.ask(f"CHECK 0 {n} 9") == ["CHECK", "OK"]
        # What an attached engine does not serve is refused, named.
        heap = ctypes.create_string_buffer(4096)
        with pytest.raises(tent.InvalidArgumentError, match="allocate_memory"):
            e.register_local_memory(ctypes.addressof(heap), 4096)
        # The batch API: other bytes over them.
        src2 = e.allocate_local_memory(n)
        ctypes.memmove(src2, pattern(5, n), n)
        batch = e.allocate_transfer_batch(4)
        e.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, src2, seg, peer.base, n)])
        st = e.wait_transfer(batch, 10)
        assert st.state == tent.TransferStatusEnum.COMPLETED and st.bytes == n
        assert peer.ask(f"CHECK 0 {n} 5") == ["CHECK", "OK"]
        with pytest.raises(tent.InvalidArgumentError, match="cancel"):
            e.cancel_transfer(batch, 0)
        e.free_transfer_batch(batch)
    finally:
        e.close()


def test_no_daemon_at_the_socket_is_unreachable(tmp_path):
    with pytest.raises(tent.UnreachableError):
        tent.TransferEngine(attach=str(tmp_path / "none.sock"))
