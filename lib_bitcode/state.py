"""The device state of the project's device library: one global, one layout, shared with the runtime.

The device library reads ``mori_compiler_shmem_state`` (an exported 64-byte device global); the runtime
fills it after loading a code object (``cuModuleGetGlobal`` / ``hipModuleGetGlobal`` + a copy) with
``pack_state``. This module is the only definition of the layout: lib_bitcode/sources/*.ll use the byte
offsets below (a test checks that they agree).

MORI's own bitcode uses ``_ZN4mori5shmem15globalGpuStatesE`` (80 bytes) instead, filled by
``mori.shmem.shmem_module_init(hipModule)`` (docs/device-abi.md §3.1); a code object linked with MORI's
bitcode is initialized that way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

STATE_SYMBOL = "mori_compiler_shmem_state"
STATE_SIZE = 64
STATE_ALIGN = 8

FLAG_VIRTUAL_PES = 1  # the PEs of one launch are its grid's z slices: my_pe = rank + blockIdx.z


@dataclass(frozen=True)
class StateField:
    name: str
    offset: int
    struct_format: str  # Python struct code (little endian is applied by pack_state)
    doc: str


STATE_FIELDS: tuple[StateField, ...] = (
    StateField("rank", 0, "i", "this process's PE (with virtual PEs: the first PE of a launch)"),
    StateField("n_pes", 4, "i", "number of PEs"),
    StateField("flags", 8, "I", "bit 0: virtual PEs (my_pe = rank + blockIdx.z)"),
    StateField("reserved0", 12, "I", "zero"),
    StateField("heap_size", 16, "Q", "bytes in each PE's symmetric heap"),
    StateField("heap_bases", 24, "Q", "device pointer to uint64_t[n_pes]: every PE's heap base in this process"),
    StateField("sync_words", 32, "Q", "device pointer to the barrier words (inside the heap)"),
    StateField("wait_limit", 40, "Q", "bounded-wait polls before a wait reports and gives up (0 = forever)"),
    StateField("wait_report", 48, "Q", "device pointer to the wait report record (bounded-wait debug mode)"),
    StateField("reserved1", 56, "Q", "zero"),
)
STATE_FORMAT = "<" + "".join(f.struct_format for f in STATE_FIELDS)
assert struct.calcsize(STATE_FORMAT) == STATE_SIZE
assert all(struct.calcsize("<" + "".join(f.struct_format for f in STATE_FIELDS[:i])) == f.offset
           for i, f in enumerate(STATE_FIELDS))  # fmt: skip


def field_offset(name: str) -> int:
    return next(f.offset for f in STATE_FIELDS if f.name == name)


def pack_state(**values: int) -> bytes:
    """The state bytes for the given field values (unnamed fields are 0)."""
    unknown = set(values) - {f.name for f in STATE_FIELDS}
    if unknown:
        raise ValueError(f"unknown device state fields: {', '.join(sorted(unknown))}")
    return struct.pack(STATE_FORMAT, *(values.get(f.name, 0) for f in STATE_FIELDS))


def unpack_state(data: bytes) -> dict[str, int]:
    return dict(zip((f.name for f in STATE_FIELDS), struct.unpack(STATE_FORMAT, data[:STATE_SIZE])))


# The head of every PE's heap is reserved for the library's barrier_all: 8-byte epoch slots, slot q
# (q < MAX_PES) for PE q's announcements and slot MAX_PES for this PE's own epoch counter
# (sources/shmem_core.ll, __mc_barrier_all). The runtime zeroes it at init; allocations start after it.
MAX_PES = 255
SYNC_RESERVED_BYTES = (MAX_PES + 1) * 8  # 2048

# Bounded-wait debug mode: when state.wait_limit != 0, a wait gives up after that many polls; the first
# waiter to give up fills the record at state.wait_report (device memory, zeroed by the runtime):
WAIT_REPORT_FORMAT = "<IiI4xQQQ"  # claimed flag, pe, kind (0 ==, 1 unsigned >, 2 signed >), addr, expected, seen
WAIT_REPORT_SIZE = struct.calcsize(WAIT_REPORT_FORMAT)  # 40
WAIT_EQUALS, WAIT_UNSIGNED_GT, WAIT_SIGNED_GT = 0, 1, 2  # the kind codes the wrappers pass
WAIT_KINDS = {WAIT_EQUALS: "equals", WAIT_UNSIGNED_GT: "greater_than (unsigned)",
              WAIT_SIGNED_GT: "greater_than (signed)"}  # fmt: skip


def unpack_wait_report(data: bytes) -> dict | None:
    """The decoded report, or None when no wait gave up."""
    flag, pe, kind, addr, expected, seen = struct.unpack(WAIT_REPORT_FORMAT, data[:WAIT_REPORT_SIZE])
    if not flag:
        return None
    return {"pe": pe, "kind": WAIT_KINDS.get(kind, str(kind)), "addr": addr, "expected": expected, "seen": seen}
