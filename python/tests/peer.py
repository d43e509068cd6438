"""The other process of the two-process tests and the bench: a tent engine
that allocates a patterned region and answers commands, one per line on
stdin, one answer per line on stdout.

    READY <segment name> <base> <size>      (printed at start)
    CHECK <off> <len> <seed>  -> CHECK OK | CHECK BAD  (region vs pattern)
    HASH <off> <len>          -> HASH <sha256 hex>
    WAITNOTE <timeout> <off> <len> <seed>
                              -> NOTE <name> <msg hex> <sender> DATA OK|BAD
       (waits for a notification, then checks the data at once)
    SEND <segment name> <name> <msg>   -> SENT   (a notification to a peer)
    QUIT
"""

import ctypes
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tent  # noqa: E402
from helpers import CONFIG, pattern  # noqa: E402


def main():
    size = int(sys.argv[1])
    seed = int(sys.argv[2])
    config = sys.argv[3] if len(sys.argv) > 3 else CONFIG
    engine = tent.TransferEngine(config)
    base = engine.allocate_local_memory(size)
    if seed >= 0:
        data = pattern(seed, size)
        ctypes.memmove(base, data, size)
    out = sys.stdout
    print("READY", engine.get_segment_name(), base, size, file=out, flush=True)
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        cmd = w[0]
        if cmd == "CHECK":
            off, n, s = int(w[1]), int(w[2]), int(w[3])
            ok = ctypes.string_at(base + off, n) == pattern(s, n)
            print("CHECK", "OK" if ok else "BAD", flush=True)
        elif cmd == "HASH":
            off, n = int(w[1]), int(w[2])
            print("HASH", hashlib.sha256(ctypes.string_at(base + off, n)).hexdigest(), flush=True)
        elif cmd == "WAITNOTE":
            timeout, off, n, s = float(w[1]), int(w[2]), int(w[3]), int(w[4])
            try:
                note = engine.wait_notifi(timeout)
            except tent.TimeoutError:
                print("NOTE TIMEOUT", flush=True)
                continue
            # Read the data the notification follows right away.
            ok = n == 0 or ctypes.string_at(base + off, n) == pattern(s, n)
            print(
                "NOTE",
                note.name,
                note.msg_bytes.hex() or "-",
                note.sender,
                "DATA",
                "OK" if ok else "BAD",
                flush=True,
            )
        elif cmd == "SEND":
            handle = engine.open_segment(w[1])
            engine.send_notifi(handle, tent.Notification(w[2], w[3]))
            print("SENT", flush=True)
        elif cmd == "QUIT":
            break
        else:
            print("UNKNOWN", cmd, flush=True)
    engine.close()


if __name__ == "__main__":
    main()
