"""tent: TENT's Python API over the tent data-transfer engine.

A script written for TENT's module runs unchanged::

    import tent
    engine = tent.TransferEngine('{"workers": {"count": 1}}')
    addr = engine.allocate_local_memory(1 << 20)
    handle = engine.open_segment(peer_name)
    batch = engine.allocate_transfer_batch(1)
    engine.submit_transfer(batch, [tent.Request(tent.OpCode.WRITE, addr, handle, base, 4096)])

Beyond TENT: memory from the buffer protocol (bytearray, numpy arrays,
memoryview) wherever an address is taken, ``submit_blocks`` (a block list
in one call), ``wait_transfer``, ``wait_notifi``, the ring API
(``TransferEngine.ring``), and ``close()`` / ``with``.
"""

from . import _tent
from ._errors import *  # noqa: F401,F403
from ._errors import TentException, error_class  # noqa: F401
from ._tent import (  # noqa: F401
    LOCAL_SEGMENT_ID,
    MAX_NOTIFY_MSG,
    MAX_NOTIFY_NAME,
    PRIO_HIGH,
    PRIO_LOW,
    PRIO_MEDIUM,
    Completion,
    Notification,
    OpCode,
    Request,
    Ring,
    SegmentInfo,
    SegmentInfoBuffer,
    TransferEngine,
    TransferStatus,
    TransferStatusEnum,
)

# As pybind11's export_values() does for TENT's enums.
READ = OpCode.READ
WRITE = OpCode.WRITE
INITIAL = TransferStatusEnum.INITIAL
PENDING = TransferStatusEnum.PENDING
INVALID = TransferStatusEnum.INVALID
CANCELED = TransferStatusEnum.CANCELED
COMPLETED = TransferStatusEnum.COMPLETED
TIMEOUT = TransferStatusEnum.TIMEOUT
FAILED = TransferStatusEnum.FAILED

# Star-imports leave Python's own TimeoutError and NotImplementedError alone.
__all__ = [
    n
    for n in dir()
    if not n.startswith("_") and n not in ("TimeoutError", "NotImplementedError", "error_class")
]
