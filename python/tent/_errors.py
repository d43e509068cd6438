"""tent's exceptions: ``TentException`` and one subclass per error kind.

A class per kind of the engine's taxonomy (``tent._tent.error_kinds()``,
so the list cannot drift from the engine's), named ``<Kind>Error`` as TENT
names its own (``InvalidArgumentError``, ``AddressNotRegisteredError``,
...). Each has ``kind`` (the kind's name) and ``code`` (its stable number).
``TimeoutError`` is also a builtin ``TimeoutError``.

TENT's classes for kinds tent does not have (``RdmaError``,
``MetadataError``, ...) exist so that a TENT script's ``except`` clauses
still name real classes; tent raises the kind classes.
"""

import builtins as _builtins

from . import _tent


class TentException(Exception):
    """Base of every exception tent raises; ``kind`` and ``code`` say which."""

    kind = None
    code = None


_KINDS = {}
for _name, _code in _tent.error_kinds():
    _bases = (TentException,)
    if _name == "Timeout":
        _bases = (TentException, _builtins.TimeoutError)
    _cls = type(
        f"{_name}Error",
        _bases,
        {
            "kind": _name,
            "code": _code,
            "__module__": "tent",
            "__doc__": f"tent error kind {_name} (code {_code}).",
        },
    )
    globals()[_cls.__name__] = _cls
    _KINDS[_name] = _cls

# TENT's exception classes for its own status codes.
for _name in (
    "DeviceNotFound",
    "InvalidEntry",
    "Rdma",
    "Cuda",
    "Metadata",
    "RpcService",
    "Internal",
    "NotImplemented",
):
    _cls = type(
        f"{_name}Error",
        (TentException,),
        {"__module__": "tent", "__doc__": f"TENT's {_name}Error (tent does not raise it)."},
    )
    globals()[_cls.__name__] = _cls

del _name, _code, _bases, _cls


def error_class(kind):
    """The exception class for an error kind's name (e.g. ``"OutOfBounds"``)."""
    return _KINDS[kind]
