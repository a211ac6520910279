"""``EngineDesc`` and ``MemoryDesc``: what one engine tells another, out of band, about itself and about
memory it registered, and their wire format (MORI's, byte for byte).

Wire format: a msgpack array of the fields in MORI's order (EngineDesc 6 elements, MemoryDesc 15), packed
with ``use_bin_type=True``: strings as msgpack str, the 64-byte handles as bin, integers in their smallest
encoding, enums as their integer value; this is what MORI's msgpack-c ``MSGPACK_DEFINE`` produces. On
unpack, a shorter array leaves the trailing fields at their defaults and extra elements are ignored (as
msgpack-c does), so peers one field apart still understand each other.

``unpack`` takes bytes from another process: any input that is not a well-formed descriptor raises a
``ValueError`` naming the field, and the decoder's limits bound what it allocates whatever the input says.
It is stricter than msgpack-c where that one would accept nonsense: trailing bytes after the array, a bin
where a str is due, a handle that is not 64 bytes, a ``loc`` that is no MemoryLocationType are refused.
"""

from __future__ import annotations

import os
import socket
from typing import Callable, NamedTuple

import msgpack

from . import checks
from .enums import MemoryLocationType

IPC_HANDLE_SIZE = 64  # HIP's and CUDA's IPC memory handles are both 64 bytes
ZERO_HANDLE = bytes(IPC_HANDLE_SIZE)
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# Decoder limits: a descriptor is a flat array of 15 scalars; the slack admits a few extra fields of a
# newer peer. Strings (engine keys, host names) get 64 KiB.
_MAX_ARRAY = 64
_MAX_STR = 1 << 16
_MAX_BIN = 1 << 16


def local_node_id() -> str:
    """The id of this machine as MORI computes it: ``MORI_NODE_ID`` if set (non-empty), else the kernel's
    boot id, else the host name. Two engines with the same node id are on the same node."""
    override = os.environ.get("MORI_NODE_ID")
    if override:
        return override
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            boot_id = f.read(256).strip()
    except (OSError, ValueError):
        boot_id = ""
    return boot_id or socket.gethostname()


class _Field(NamedTuple):
    name: str
    default: object
    check: Callable[[str, object], object]
    compared: bool = True  # part of ==


def _int(lo: int, hi: int):
    return lambda where, value: checks.integer(where, value, lo, hi)


def _handle(where, value):
    return checks.fixed_bytes(where, value, IPC_HANDLE_SIZE)


def _location(where, value):
    return checks.member(where, value, MemoryLocationType)


class _Descriptor:
    """Read-only fields in wire order (``_FIELDS``), equality on the compared ones, msgpack pack/unpack."""

    __slots__ = ()
    _FIELDS: tuple[_Field, ...] = ()

    @classmethod
    def _from_fields(cls, **values):
        """A descriptor with the given fields (checked), the others at their defaults. For the engine and
        its backends; applications get descriptors from the engine or from ``unpack``."""
        names = {f.name for f in cls._FIELDS}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
        self = object.__new__(cls)
        for f in cls._FIELDS:
            value = values.get(f.name, f.default)
            object.__setattr__(self, f.name, f.check(f"{cls.__name__}.{f.name}", value))
        return self

    def _replace(self, **changes):
        """A copy with some fields changed (the engine updates its port, a backend adds an IPC handle)."""
        return self._from_fields(**{**self._values(), **changes})

    def _values(self) -> dict:
        return {f.name: getattr(self, f.name) for f in self._FIELDS}

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__}.{name} is read-only")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__}.{name} is read-only")

    def _compared(self) -> tuple:
        return tuple(getattr(self, f.name) for f in self._FIELDS if f.compared)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self):
        return hash(self._compared())

    def __repr__(self):
        shown = ", ".join(f"{f.name}={_shown(getattr(self, f.name))}" for f in self._FIELDS)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self):  # pickling goes through the wire format
        return (type(self).unpack, (self.pack(),))

    def pack(self) -> bytes:
        """The msgpack array of the fields in wire order (MORI's bytes)."""
        return msgpack.packb([_wire(getattr(self, f.name)) for f in self._FIELDS], use_bin_type=True)

    @classmethod
    def unpack(cls, data):
        """The descriptor that ``data`` (bytes from ``pack``, here or in MORI) encodes; ``ValueError`` for
        anything else."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{cls.__name__}.unpack takes bytes, not {type(data).__name__}")
        try:
            obj = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=False,
                                  max_str_len=_MAX_STR, max_bin_len=_MAX_BIN, max_array_len=_MAX_ARRAY,
                                  max_map_len=_MAX_ARRAY, max_ext_len=_MAX_BIN)  # fmt: skip
        except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
            why = _DECODE_ERRORS.get(type(exc).__name__) or str(exc) or type(exc).__name__
            raise ValueError(f"{cls.__name__}.unpack: not one well-formed msgpack value ({why})") from None
        if not isinstance(obj, list):
            raise ValueError(f"{cls.__name__}.unpack: expected a msgpack array of fields, got {_kind(obj)}")
        values = {f.name: element for f, element in zip(cls._FIELDS, obj)}  # extra elements: ignored
        try:
            return cls._from_fields(**values)
        except (TypeError, ValueError) as exc:  # the message names the field
            raise ValueError(f"{cls.__name__}.unpack: {exc}") from None


_DECODE_ERRORS = {
    "ExtraData": "trailing bytes after the array",
    "StackError": "nested too deeply",
    "FormatError": "a byte that starts no msgpack value",
}


def _shown(value) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes, zero>" if not any(value) else f"bytes.fromhex('{value.hex()}')"
    return repr(value)


def _wire(value):
    return int(value) if isinstance(value, int) else value  # enums as their integer value


def _kind(obj) -> str:
    return {dict: "a map", str: "a str", bytes: "a bin", int: "an integer", float: "a float",
            bool: "a bool", type(None): "nil"}.get(type(obj), type(obj).__name__)  # fmt: skip


class EngineDesc(_Descriptor):
    """An engine as its peers see it: ``key`` (unique engine name), ``node_id`` (``local_node_id()``),
    ``hostname``, ``host`` and ``port`` (where its listener is; the port is the bound one), ``pid``.
    Read-only; no public constructor (``IOEngine.get_engine_desc()`` or ``EngineDesc.unpack``). ``==``
    compares all six fields."""

    __slots__ = ("key", "node_id", "hostname", "host", "port", "pid")
    _FIELDS = (
        _Field("key", "", checks.string),
        _Field("node_id", "", checks.string),
        _Field("hostname", "", checks.string),
        _Field("host", "", checks.string),
        _Field("port", 0, _int(*checks.U16)),
        _Field("pid", 0, _int(*checks.I32)),
    )

    def __init__(self, *args, **kwargs):
        raise TypeError("EngineDesc has no public constructor: use IOEngine.get_engine_desc() or EngineDesc.unpack()")


class MemoryDesc(_Descriptor):
    """A registered memory region: its owner ``engine_key``, ``id`` (per engine, from 0), ``device_id``
    (-1 for CPU memory), ``device_bus_id`` (lower-case PCI id, ``""`` for CPU), ``data`` (address),
    ``size`` (bytes), ``loc`` (MemoryLocationType), ``ipc_handle`` (64 bytes, of the allocation that
    contains ``data``; zero unless a GPU-IPC backend registered it), ``numa_node`` (-1 unless CPU memory
    on a known node). Beyond MORI's Python attributes, for the backends: ``ipc_offset`` (``data`` minus the
    allocation base) and the FABRIC fields (carried on the wire, unused here).

    ``MemoryDesc()`` is an empty descriptor, as in MORI; read-only. ``==`` compares ``engine_key, id,
    device_id, device_bus_id, data, size, loc, numa_node, ipc_offset``, not the handles."""

    __slots__ = ("engine_key", "id", "device_id", "device_bus_id", "data", "size", "loc", "ipc_handle",
                 "numa_node", "ipc_offset", "fabric_handle", "vpod_id", "vpod_ppod_id", "fabric_offset",
                 "fabric_alloc_size")  # fmt: skip
    _FIELDS = (
        _Field("engine_key", "", checks.string),
        _Field("id", 0, _int(*checks.U32)),
        _Field("device_id", -1, _int(*checks.I32)),
        _Field("device_bus_id", "", checks.string),
        _Field("data", 0, _int(*checks.U64)),
        _Field("size", 0, _int(*checks.U64)),
        _Field("loc", MemoryLocationType.Unknown, _location),
        _Field("ipc_handle", ZERO_HANDLE, _handle, compared=False),
        _Field("numa_node", -1, _int(*checks.I32)),
        _Field("ipc_offset", 0, _int(*checks.U64)),
        _Field("fabric_handle", ZERO_HANDLE, _handle, compared=False),
        _Field("vpod_id", 0, _int(*checks.I32), compared=False),  # [?] MORI's default not verified
        _Field("vpod_ppod_id", "", checks.string, compared=False),
        _Field("fabric_offset", 0, _int(*checks.U64), compared=False),
        _Field("fabric_alloc_size", 0, _int(*checks.U64), compared=False),
    )

    def __new__(cls):
        return cls._from_fields()
