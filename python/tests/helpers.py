"""Shared by the tests, the peer process and the bench."""

import json
import os
import subprocess
import sys

# One unpinned worker that parks quickly (CI machines have 2 cores).
CONFIG = json.dumps(
    {
        "workers": {"count": 1, "pin": False, "spin_us": 20, "yield_us": 50, "park_timeout_ms": 20},
        "default_timeout_ms": 10000,
        "max_batch_size": 16384,
    }
)


def pattern(seed, n):
    """n bytes, distinct per seed: byte i is (i * 31 + seed) mod 256."""
    return bytes(((i * 31 + seed) & 0xFF) for i in range(256)) * (n // 256) + bytes(
        ((i * 31 + seed) & 0xFF) for i in range(n % 256)
    )


class Peer:
    """The other process (tests/peer.py), driven over its stdin/stdout."""

    def __init__(self, size, seed, config=CONFIG):
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(here, "peer.py"), str(size), str(seed), config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            self.proc.kill()
            raise RuntimeError(f"peer did not start: {line}")
        self.name, self.base, self.size = line[1], int(line[2]), int(line[3])

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited (code {self.proc.wait()}) on {cmd!r}")
        return line.split()

    def send(self, cmd):
        """Send without waiting for the answer (read it with `answer`)."""
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited (code {self.proc.wait()})")
        return line.split()

    def close(self):
        try:
            self.proc.stdin.write("QUIT\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        code = self.proc.wait(timeout=30)
        assert code == 0, f"peer exited with {code}"
