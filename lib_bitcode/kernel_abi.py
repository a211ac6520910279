"""The host ↔ kernel calling conventions shared by the compiler and the runtime (stdlib only).

Kernel parameters are passed by value with these types (MLIR type → name → bytes):
``!llvm.ptr`` → ptr (8), i64 (8), i32 (4), i16 (2), i8 (1), f64 (8), f32 (4).

Virtual PEs (several PEs in one launch on one GPU, PE = grid z index): a kernel compiled with
``virtual_pes`` takes a single pointer to an *argument table* instead of its parameters. The table holds
one record per PE; a record lays the original parameters out at their natural alignment, and the record
stride is rounded up to 8 bytes. The kernel's prologue loads its parameters from record ``blockIdx.z``
(pass ``mori-virtual-pe-args``); the runtime packs the records (``pack_arg_table``).
"""

from __future__ import annotations

import struct

PARAM_SIZES = {"ptr": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "f64": 8, "f32": 4}
MLIR_PARAM_TYPES = {"!llvm.ptr": "ptr", "i64": "i64", "i32": "i32", "i16": "i16", "i8": "i8", "f64": "f64",
                    "f32": "f32"}  # fmt: skip
_STRUCT_CODE = {"ptr": "Q", "i64": "q", "i32": "i", "i16": "h", "i8": "b", "f64": "d", "f32": "f"}
ARG_TABLE_ALIGN = 8


def arg_table_layout(types) -> tuple[tuple[int, ...], int]:
    """(offset of each parameter, record stride) for parameter type names ``types``."""
    offsets, pos = [], 0
    for t in types:
        size = PARAM_SIZES[t]
        pos = (pos + size - 1) // size * size
        offsets.append(pos)
        pos += size
    stride = max(ARG_TABLE_ALIGN, (pos + ARG_TABLE_ALIGN - 1) // ARG_TABLE_ALIGN * ARG_TABLE_ALIGN)
    return tuple(offsets), stride


# Accepted integer values per type: signed or unsigned spelling of the same bits (pointers unsigned).
INT_RANGES = {"ptr": (0, 1 << 64), "i64": (-(1 << 63), 1 << 64), "i32": (-(1 << 31), 1 << 32),
              "i16": (-(1 << 15), 1 << 16), "i8": (-(1 << 7), 1 << 8)}  # fmt: skip


def abi_value(t: str, v):
    """``v`` as the kernel receives a parameter of type ``t``: a float, an unsigned pointer, or a signed
    integer (values in [2**(bits-1), 2**bits) are passed as their two's complement). Shared by the direct
    launch (ctypes) and the virtual-PE argument table (struct), so both accept the same values."""
    if t in ("f32", "f64"):
        return float(v)
    value = int(v)
    low, high = INT_RANGES[t]
    if not low <= value < high:
        raise ValueError(f"value {value} does not fit a {t} kernel parameter")
    if t == "ptr":
        return value
    bits = 8 * PARAM_SIZES[t]
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def pack_record(types, values) -> bytes:
    """One argument-table record: ``values`` at the layout of ``types`` (pointers as integers)."""
    types = list(types)
    values = list(values)
    if len(types) != len(values):
        raise ValueError(f"kernel takes {len(types)} arguments, got {len(values)}")
    offsets, stride = arg_table_layout(types)
    record = bytearray(stride)
    for t, off, v in zip(types, offsets, values):
        struct.pack_into("<" + _STRUCT_CODE[t], record, off, abi_value(t, v))
    return bytes(record)


def pack_arg_table(types, per_pe_values) -> bytes:
    """The whole table: one record per PE, in PE order."""
    return b"".join(pack_record(types, values) for values in per_pe_values)


# Kernel traces (mori_comm.trace, pass mori-trace-to-timer; docs/tracing.md): a traced kernel K has a 16-byte
# module global TRACE_GLOBAL_PREFIX + K, {u64 trace buffer device address (0: off), u64 slots in the buffer},
# which the runtime writes; the buffer is u64 timer values, warp-major: slot ``linear_warp * E + e`` for the
# kernel's E events. The kernel stores only to slots below the count (a launch larger than the buffer, e.g.
# a CUDA-graph replay of a larger grid, records its first slots and writes nothing past the buffer).
TRACE_GLOBAL_PREFIX = "__mori_trace_"
TRACE_GLOBAL_BYTES = 16
TRACE_SLOT_BYTES = 8


def trace_global(kernel: str) -> str:
    """The module global holding kernel ``kernel``'s trace buffer address."""
    return TRACE_GLOBAL_PREFIX + kernel
