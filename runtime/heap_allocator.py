"""The symmetric heap's geometry and its allocator (pure bookkeeping over offsets; no driver, no PEs).

Size: ``MORI_SHMEM_HEAP_SIZE`` bytes per PE (K/M/G/T suffixes; default 1 GiB per PE in this project —
MORI's own default is 4 GiB), rounded up to ``ALLOC_GRANULE`` (256) bytes. The first ``SYNC_RESERVED_BYTES``
of every heap belong to the device library's barrier (lib_bitcode/state.py) and are never allocated.

Allocation: first fit from a sorted free list of (offset, length) blocks that coalesces on free. Offsets and
lengths are multiples of the granule; an allocation's offset is a multiple of its (power-of-two) alignment,
relative to the heap base. The allocator is deterministic: the same call sequence yields the same offsets on
every PE, which is what makes an object live at the same offset in every PE's heap (symmetric).
"""

from __future__ import annotations

import bisect
import os
import re

from mori_compiler.lib_bitcode.state import SYNC_RESERVED_BYTES

from .shmem_errors import ShmemError

HEAP_SIZE_ENV = "MORI_SHMEM_HEAP_SIZE"
DEFAULT_HEAP_SIZE = 1 << 30
ALLOC_GRANULE = 256

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


# ---- heap size -------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes in ``text``: an integer with an optional K/M/G/T suffix (powers of 1024; "B"/"iB" allowed)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ShmemError(f"cannot parse heap size '{text}': use bytes with an optional K, M or G suffix (e.g. 2G)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def heap_size_from_env() -> int:
    """The per-PE heap size: ``MORI_SHMEM_HEAP_SIZE`` or 1 GiB, rounded up to 256 bytes."""
    text = os.environ.get(HEAP_SIZE_ENV)
    size = DEFAULT_HEAP_SIZE if text in (None, "") else parse_size(text)
    return check_heap_size(size, f"{HEAP_SIZE_ENV}={text}" if text else "the default heap size")


def check_heap_size(size: int, what: str) -> int:
    """``size`` rounded up to the granule; ShmemError (naming ``what``) if it leaves no allocatable byte."""
    size = round_up(int(size), ALLOC_GRANULE)
    if size < SYNC_RESERVED_BYTES + ALLOC_GRANULE:
        raise ShmemError(f"{what}: the heap needs at least {SYNC_RESERVED_BYTES + ALLOC_GRANULE} bytes "
                         f"({SYNC_RESERVED_BYTES} are reserved for the device barrier)")  # fmt: skip
    return size


# ---- the allocator ---------------------------------------------------------------------------------


class HeapAllocator:
    """First-fit allocator over heap offsets [reserved, size): a sorted free list of (offset, length)
    blocks, coalesced on free. Offsets and lengths are multiples of ``granule``; an allocation's offset is
    a multiple of its alignment. Deterministic: the same call sequence yields the same offsets, which is
    what keeps objects symmetric across PEs."""

    def __init__(self, size: int, reserved: int = SYNC_RESERVED_BYTES, granule: int = ALLOC_GRANULE):
        if size % granule or reserved % granule or reserved >= size:
            raise ValueError(f"bad heap geometry: size {size}, reserved {reserved}, granule {granule}")
        self.size = size
        self.reserved = reserved
        self.granule = granule
        self._free_offsets: list[int] = [reserved]
        self._free_lengths: list[int] = [size - reserved]
        self.allocations: dict[int, tuple[int, int]] = {}  # offset -> (requested size, reserved length)
        self._freed: set[int] = set()  # offsets freed and not reallocated since (double-free detection)

    @property
    def bytes_free(self) -> int:
        return sum(self._free_lengths)

    @property
    def largest_free(self) -> int:
        return max(self._free_lengths, default=0)

    @property
    def free_blocks(self) -> list[tuple[int, int]]:
        return list(zip(self._free_offsets, self._free_lengths))

    def find(self, size: int, alignment: int) -> int | None:
        """The offset ``alloc`` would return, or None if no block fits."""
        length = round_up(size, self.granule)
        align = max(alignment, self.granule)
        for off, free_len in zip(self._free_offsets, self._free_lengths):
            start = round_up(off, align)
            if start + length <= off + free_len:
                return start
        return None

    def alloc(self, size: int, alignment: int = ALLOC_GRANULE) -> int | None:
        """Reserve ``size`` bytes at a multiple of ``alignment``; None when no block fits."""
        length = round_up(size, self.granule)
        align = max(alignment, self.granule)
        for i, (off, free_len) in enumerate(zip(self._free_offsets, self._free_lengths)):
            start = round_up(off, align)
            end = start + length
            if end > off + free_len:
                continue
            pieces = []
            if start > off:
                pieces.append((off, start - off))
            if end < off + free_len:
                pieces.append((end, off + free_len - end))
            self._free_offsets[i : i + 1] = [p[0] for p in pieces]
            self._free_lengths[i : i + 1] = [p[1] for p in pieces]
            self.allocations[start] = (size, length)
            self._freed.discard(start)
            return start
        return None

    def free(self, offset: int) -> int:
        """Release the allocation at ``offset``; returns its reserved length. KeyError if none."""
        _, length = self.allocations.pop(offset)
        self._freed.add(offset)
        i = bisect.bisect_left(self._free_offsets, offset)
        start, end = offset, offset + length
        # merge with the following block
        if i < len(self._free_offsets) and self._free_offsets[i] == end:
            end += self._free_lengths[i]
            del self._free_offsets[i], self._free_lengths[i]
        # merge with the preceding block
        if i > 0 and self._free_offsets[i - 1] + self._free_lengths[i - 1] == start:
            start = self._free_offsets[i - 1]
            del self._free_offsets[i - 1], self._free_lengths[i - 1]
            i -= 1
        self._free_offsets.insert(i, start)
        self._free_lengths.insert(i, end - start)
        return length

    def was_freed(self, offset: int) -> bool:
        return offset in self._freed

    def containing(self, offset: int) -> tuple[int, int] | None:
        """(allocation offset, requested size) of the allocation holding heap offset ``offset``."""
        for start, (size, length) in self.allocations.items():
            if start <= offset < start + length:
                return start, size
        return None
