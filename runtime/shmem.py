"""Symmetric memory (shmem) for the project's device library, with a ``mori.shmem``-compatible host API.

A *PE* is one participant; every PE owns a *symmetric heap* of ``MORI_SHMEM_HEAP_SIZE`` bytes, and a
symmetric object lives at the same offset in every PE's heap. Two modes:

* **multi-process** (``shmem_torch_process_group_init`` / ``shmem_init_attr``): one PE per process, on the
  same or different GPUs of one host. Each process allocates its heap with the driver's ``malloc``
  (cudaMalloc / hipMalloc class, never managed memory); the processes exchange IPC handles with
  ``torch.distributed.all_gather_object`` and map every peer's heap (``ipc_open_mem_handle``). Peers on
  other hosts stay unmapped (``shmem_ptr_p2p`` → 0; the device library returns ENODEV): there is no RDMA
  transport. ``torch.distributed`` must be initialized, and each process must have selected its GPU
  (``torch.cuda.set_device``) before init.
* **virtual** (``shmem_init_virtual(n_pes)``, this project's extension): N PEs in this one process on one
  GPU, for testing multi-PE kernels on a single GPU. One device allocation of n_pes × heap size; PE p's heap
  is at base + p × heap size. ``shmem_malloc`` returns PE 0's address of the object (the symmetric handle);
  ``shmem_ptr_p2p(ptr, 0, p)`` gives PE p's copy. ``shmem_mype()`` is 0. Kernels compiled with virtual PEs
  run all PEs in one launch (PE = grid z index; see runtime/launcher.py).

The heap: ``MORI_SHMEM_HEAP_SIZE`` bytes per PE (K/M/G suffixes; default 1 GiB per PE in this project —
MORI's own default is 4 GiB), rounded up to 256 bytes. Its first ``SYNC_RESERVED_BYTES`` are reserved for
the device library's barrier and zeroed at init. Allocations are 256-byte aligned (or the requested power-of-
two alignment, relative to the heap base) and first-fit from a free list that coalesces on free.

MORI corrupts memory silently when PEs allocate in different orders; here, in multi-process mode every
``shmem_malloc`` / ``shmem_free`` all-gathers (call number, size, alignment, resulting offset) and raises on
every PE, naming both PEs' calls, when they differ. This makes malloc/free collective: every PE must call
them, in the same order.

``shmem_buffer_register`` only records a buffer (as MORI does for RDMA registration): registered buffers
are NOT symmetric and cannot be used with the address-based device API (puts/gets/``ptr_p2p``), which
works only on heap addresses.

The device library reads its state (``mori_compiler_shmem_state``, lib_bitcode/state.py) from every loaded
code object; ``device_state_bytes()`` is the snapshot to write there (runtime/launcher.py does it).

Everything is validated: misuse raises ``ShmemError`` (a ValueError) or ``ShmemStateError`` (a
RuntimeError) with a message saying what to do, rather than faulting the GPU or hanging.
"""

from __future__ import annotations

import bisect
import importlib
import operator
import os
import re
import secrets
import socket
import threading

from mori_compiler.lib_bitcode.state import (FLAG_VIRTUAL_PES, MAX_PES, SYNC_RESERVED_BYTES, WAIT_REPORT_SIZE,
                                             pack_state, unpack_wait_report)  # fmt: skip

from .driver import Driver, get_driver, torch_cuda

MORI_SHMEM_INIT_WITH_UNIQUEID = 1
MORI_SHMEM_INIT_WITH_MPI_COMM = 0
UNIQUE_ID_BYTES = 128
HEAP_SIZE_ENV = "MORI_SHMEM_HEAP_SIZE"
DEFAULT_HEAP_SIZE = 1 << 30
ALLOC_GRANULE = 256
BACKEND_ENV = "MORI_COMPILER_BACKEND"  # nvvm / cuda or rocdl / hip: the driver shmem uses (default: from torch)


class ShmemError(ValueError):
    """A shmem call got an invalid argument (bad pointer, size, PE, alignment...)."""


class ShmemStateError(RuntimeError):
    """A shmem call was made in the wrong state (before init, init twice, mismatched PEs...)."""


class ShmemOutOfMemoryError(ShmemError, MemoryError):
    """The symmetric heap has no free block large enough."""


# ---- heap size -------------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


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
    return _check_heap_size(size, f"{HEAP_SIZE_ENV}={text}" if text else "the default heap size")


def _check_heap_size(size: int, what: str) -> int:
    size = _round_up(int(size), ALLOC_GRANULE)
    if size < SYNC_RESERVED_BYTES + ALLOC_GRANULE:
        raise ShmemError(f"{what}: the heap needs at least {SYNC_RESERVED_BYTES + ALLOC_GRANULE} bytes "
                         f"({SYNC_RESERVED_BYTES} are reserved for the device barrier)")  # fmt: skip
    return size


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _lowbit(value: int) -> int:
    return value & -value if value else 1 << 63


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
        length = _round_up(size, self.granule)
        align = max(alignment, self.granule)
        for off, free_len in zip(self._free_offsets, self._free_lengths):
            start = _round_up(off, align)
            if start + length <= off + free_len:
                return start
        return None

    def alloc(self, size: int, alignment: int = ALLOC_GRANULE) -> int | None:
        """Reserve ``size`` bytes at a multiple of ``alignment``; None when no block fits."""
        length = _round_up(size, self.granule)
        align = max(alignment, self.granule)
        for i, (off, free_len) in enumerate(zip(self._free_offsets, self._free_lengths)):
            start = _round_up(off, align)
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


# ---- process groups --------------------------------------------------------------------------------


class TorchComm:
    """The collectives shmem needs, over a torch.distributed process group (None = WORLD)."""

    def __init__(self, group=None):
        self.dist = importlib.import_module("torch.distributed")
        self.group = group
        try:
            self.rank = int(self.dist.get_rank(group=group))
            self.world_size = int(self.dist.get_world_size(group=group))
        except Exception:  # noqa: BLE001 - a C++ ProcessGroup the Python layer does not know
            if group is None:
                raise
            self.rank, self.world_size = int(group.rank()), int(group.size())

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)


def _torch_distributed():
    try:
        dist = importlib.import_module("torch.distributed")
    except Exception as exc:  # noqa: BLE001
        raise ShmemStateError(f"multi-process shmem needs torch.distributed, which cannot be imported ({exc})") from exc
    if not dist.is_available():
        raise ShmemStateError("multi-process shmem needs torch.distributed, which this torch build lacks")
    return dist


def resolve_process_group(group_name: str):
    """The torch process group registered as ``group_name`` (None stands for WORLD)."""
    dist = _torch_distributed()
    pg = None
    try:
        c10d = importlib.import_module("torch._C._distributed_c10d")
        pg = c10d._resolve_process_group(group_name)
    except Exception:  # noqa: BLE001 - not registered (or no registry in this torch)
        pg = None
    if pg is not None:
        world = getattr(getattr(dist, "group", None), "WORLD", None)
        return None if world is not None and pg is world else pg
    if group_name.lower() in ("default", "world") and dist.is_initialized():
        return None
    if not dist.is_initialized():
        raise ShmemStateError(f"torch process group '{group_name}' not found and torch.distributed is not "
                              f"initialized: call torch.distributed.init_process_group first")  # fmt: skip
    raise ShmemError(f"no torch process group is registered as '{group_name}'; register one with "
                     f"torch._C._distributed_c10d._register_process_group('{group_name}', group), or use "
                     f"'default' for the WORLD group")  # fmt: skip


# ---- the state -------------------------------------------------------------------------------------


class ShmemState:
    """One initialized shmem: the PEs, every PE's heap as mapped in this process, the allocator and the
    device-resident tables the device state points to. Module-level functions work on one process-global
    instance; tests create several (one per simulated process)."""

    def __init__(self, driver: Driver, *, mode: str, my_pe: int, n_pes: int, heap_size: int, comm=None):
        self.driver = driver
        self.mode = mode  # "virtual" or "multiprocess"
        self.my_pe = my_pe
        self.n_pes = n_pes
        self.heap_size = heap_size
        self.comm = comm
        self.heap_bases: list[int] = [0] * n_pes  # every PE's heap as mapped in this process (0: unmapped)
        self.allocator = HeapAllocator(heap_size)
        self.registered: dict[int, int] = {}
        self._own_allocation = 0  # the device allocation holding our heap(s)
        self._ipc_mapped: list[int] = []
        self._bases_dev = 0
        self._report_dev = 0
        self._seq = 0
        self._finalized = False
        self._lock = threading.RLock()

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def create_virtual(cls, driver: Driver, n_pes: int, heap_size: int | None = None) -> "ShmemState":
        n_pes = _check_npes(n_pes)
        heap_size = heap_size_from_env() if heap_size is None else _check_heap_size(heap_size, "heap_size")
        state = cls(driver, mode="virtual", my_pe=0, n_pes=n_pes, heap_size=heap_size)
        try:
            base = driver.malloc(n_pes * heap_size)
            state._own_allocation = base
            state.heap_bases = [base + p * heap_size for p in range(n_pes)]
            for b in state.heap_bases:
                driver.memset_d8(b, 0, SYNC_RESERVED_BYTES)
            state._make_device_tables()
            driver.device_synchronize()
        except BaseException:
            state._release()
            raise
        return state

    @classmethod
    def create_multiprocess(cls, driver: Driver, comm, heap_size: int | None = None,
                            unique_id: bytes | None = None) -> "ShmemState":  # fmt: skip
        """Collective over ``comm``: every PE must call it."""
        n_pes, my_pe = int(comm.world_size), int(comm.rank)
        n_pes = _check_npes(n_pes)
        heap_size = heap_size_from_env() if heap_size is None else _check_heap_size(heap_size, "heap_size")
        state = cls(driver, mode="multiprocess", my_pe=my_pe, n_pes=n_pes, heap_size=heap_size, comm=comm)
        host = socket.gethostname()
        local_error = None
        handle = b""
        try:
            base = driver.malloc(heap_size)
            state._own_allocation = base
            driver.memset_d8(base, 0, SYNC_RESERVED_BYTES)
            driver.device_synchronize()
            if n_pes > 1:
                handle = driver.ipc_get_mem_handle(base)
        except Exception as exc:  # noqa: BLE001 - reported to every PE below, so that none hangs
            local_error = f"{type(exc).__name__}: {exc}"
            base = 0
        info = {"pe": my_pe, "host": host, "pid": _process_identity(), "device": driver.device,
                "heap_size": heap_size, "base": base,
                "handle": handle, "unique_id": bytes(unique_id) if unique_id is not None else None,
                "error": local_error}  # fmt: skip
        try:
            infos = comm.all_gather_object(info)
            problem = _check_peer_infos(infos, info, n_pes)
            if problem:
                raise ShmemStateError(problem)
            state.heap_bases[my_pe] = base
            # Phase 2: map the peers. A failure on one PE is all-gathered too, so that no PE goes on
            # (or waits) while another has given up.
            local_error = None
            try:
                for q, peer in enumerate(infos):
                    if q == my_pe or peer["host"] != host:
                        continue  # our own heap is used directly; other hosts' heaps stay unmapped (no RDMA)
                    if not driver.can_access_peer(peer["device"]):
                        # Kernels store straight into the peer's heap: without P2P the mapping would exist but
                        # every access would fault, so say so here, on every PE.
                        raise ShmemStateError(f"PE {my_pe} (GPU {driver.device}) has no peer access to PE {q}'s "
                                              f"GPU {peer['device']} on {host}: intra-node shmem needs "
                                              f"P2P-capable GPUs (NVLink, xGMI or PCIe P2P)")  # fmt: skip
                    mapped = driver.ipc_open_mem_handle(peer["handle"])
                    state._ipc_mapped.append(mapped)
                    state.heap_bases[q] = mapped
                state._make_device_tables()
                driver.device_synchronize()
            except Exception as exc:  # noqa: BLE001
                local_error = f"{type(exc).__name__}: {exc}"
            errors = comm.all_gather_object(local_error)
            failed = [(q, e) for q, e in enumerate(errors) if e]
            if failed:
                raise ShmemStateError("shmem init failed mapping the peers' heaps: "
                                      + "; ".join(f"PE {q}: {e}" for q, e in failed))
        except BaseException:
            state._release()
            raise
        return state

    def _make_device_tables(self) -> None:
        table = b"".join(int(b).to_bytes(8, "little") for b in self.heap_bases)
        self._bases_dev = self.driver.malloc(max(len(table), 8))
        self.driver.memcpy_htod(self._bases_dev, table)
        self._report_dev = self.driver.malloc(_round_up(WAIT_REPORT_SIZE, 64))
        self.driver.memset_d8(self._report_dev, 0, _round_up(WAIT_REPORT_SIZE, 64))

    def _release(self) -> None:
        """Free everything this state holds (idempotent, best effort: first error re-raised at the end)."""
        first_error = None
        for step in ([lambda p=p: self.driver.ipc_close_mem_handle(p) for p in self._ipc_mapped]
                     + [lambda p=p: self.driver.free(p) for p in (self._bases_dev, self._report_dev,
                                                                  self._own_allocation) if p]):  # fmt: skip
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                first_error = first_error or exc
        self._ipc_mapped, self._bases_dev, self._report_dev, self._own_allocation = [], 0, 0, 0
        if first_error is not None:
            raise first_error

    def finalize(self) -> None:
        with self._lock:
            if self._finalized:
                return
            self._finalized = True
            try:
                self.driver.device_synchronize()
                if self.comm is not None and self.n_pes > 1:
                    self.comm.barrier()  # no peer may still be writing into our heap through its mapping
            finally:
                self.heap_bases = [0] * self.n_pes
                self._release()

    @property
    def finalized(self) -> bool:
        return self._finalized

    @property
    def virtual(self) -> bool:
        return self.mode == "virtual"

    def _check_live(self) -> None:
        if self._finalized:
            raise ShmemStateError("this shmem state was finalized")

    # ---- addresses ---------------------------------------------------------------------------
    def check_pe(self, pe, what: str = "PE") -> int:
        try:
            pe = operator.index(pe)
        except TypeError:
            raise ShmemError(f"{what} must be an integer, got {pe!r}") from None
        if not 0 <= pe < self.n_pes:
            raise ShmemError(f"{what} {pe} is out of range: there are {self.n_pes} PEs (0..{self.n_pes - 1})")
        return pe

    @property
    def my_base(self) -> int:
        return self.heap_bases[self.my_pe]

    def offset_of(self, ptr: int, pe: int | None = None) -> int | None:
        """``ptr``'s offset in PE ``pe``'s heap (default mine) as mapped here, or None if outside it."""
        base = self.heap_bases[self.my_pe if pe is None else pe]
        if not base:
            return None
        off = int(ptr) - base
        return off if 0 <= off < self.heap_size else None

    def locate(self, addr: int) -> tuple[int, int] | None:
        """(PE, offset) of the heap that holds ``addr`` as mapped in this process, or None."""
        for pe, base in enumerate(self.heap_bases):
            if base and base <= addr < base + self.heap_size:
                return pe, addr - base
        return None

    def ptr_p2p(self, ptr: int, my_pe: int, dest_pe: int) -> int:
        """PE ``dest_pe``'s address (as mapped in this process) of the object at ``ptr`` in PE ``my_pe``'s
        heap; 0 if ``ptr`` is outside that heap or ``dest_pe``'s heap is not mapped here."""
        self._check_live()
        my_pe = self.check_pe(my_pe, "my_pe")
        dest_pe = self.check_pe(dest_pe, "dest_pe")
        off = self.offset_of(ptr, my_pe)
        if off is None or not self.heap_bases[dest_pe]:
            return 0
        return self.heap_bases[dest_pe] + off

    # ---- allocation --------------------------------------------------------------------------
    def malloc(self, size, alignment=ALLOC_GRANULE) -> int:
        with self._lock:
            self._check_live()
            error = kind = None
            offset = None
            try:
                size = _check_size(size)
                alignment = self._check_alignment(alignment)
                offset = self.allocator.alloc(size, alignment)
                if offset is None:
                    error, kind = self._oom_message(size, alignment), "out of memory"
            except ShmemError as exc:
                error, kind = str(exc), "invalid argument"
            record = {"op": "malloc", "size": size, "alignment": alignment, "offset": offset, "error": kind}
            self._collective_check(record, error, undo=lambda: self.allocator.free(offset))
            if kind == "out of memory":
                raise ShmemOutOfMemoryError(error)
            if error:
                raise ShmemError(error)
            return self.my_base + offset

    def _oom_message(self, size: int, alignment: int) -> str:
        a = self.allocator
        return (f"out of symmetric heap memory: shmem_malloc({size}, alignment={alignment}) does not fit; the heap "
                f"has {self.heap_size} bytes per PE ({HEAP_SIZE_ENV}), {a.bytes_free} free, largest free block "
                f"{a.largest_free}; raise {HEAP_SIZE_ENV} (e.g. {HEAP_SIZE_ENV}=4G) or free objects")  # fmt: skip

    def _check_alignment(self, alignment) -> int:
        try:
            alignment = operator.index(alignment)
        except TypeError:
            raise ShmemError(f"alignment must be an integer, got {alignment!r}") from None
        if alignment <= 0 or alignment & (alignment - 1):
            raise ShmemError(f"alignment {alignment} is not a positive power of two")
        # Offsets are aligned; addresses are as aligned as every heap base in this process.
        base_align = min((_lowbit(b) for b in self.heap_bases if b), default=1 << 63)
        if alignment > base_align:
            raise ShmemError(f"alignment {alignment} exceeds the alignment of the heap bases ({base_align} bytes); "
                             f"an object cannot be aligned that much at the same offset in every PE's heap")  # fmt: skip
        return alignment

    def free(self, ptr) -> None:
        with self._lock:
            self._check_live()
            error = kind = None
            offset = None
            try:
                offset = self._allocation_offset(ptr, "shmem_free")
            except ShmemError as exc:
                error, kind = str(exc), "invalid pointer"
                offset = self.offset_of(ptr) if isinstance(ptr, int) else None
            record = {"op": "free", "offset": offset, "error": kind}
            self._collective_check(record, error, undo=None)
            if error:
                raise ShmemError(error)
            self.allocator.free(offset)

    def _allocation_offset(self, ptr, call: str) -> int:
        try:
            ptr = int(ptr)
        except Exception:  # noqa: BLE001
            raise ShmemError(f"{call}: expected a pointer (int), got {ptr!r}") from None
        off = self.offset_of(ptr)
        if off is None:
            located = self.locate(ptr)
            if located is not None:
                pe, peer_off = located
                raise ShmemError(f"{call}(0x{ptr:x}): that is PE {pe}'s copy (offset 0x{peer_off:x}); pass the "
                                 f"address shmem_malloc returned (PE {self.my_pe}'s)")  # fmt: skip
            base = self.my_base
            raise ShmemError(f"{call}(0x{ptr:x}): pointer outside the symmetric heap "
                             f"[0x{base:x}, 0x{base + self.heap_size:x})")  # fmt: skip
        if off not in self.allocator.allocations:
            if self.allocator.was_freed(off):
                raise ShmemError(f"{call}(0x{ptr:x}): double free (already freed)")
            inside = self.allocator.containing(off)
            if inside is not None:
                raise ShmemError(f"{call}(0x{ptr:x}): pointer inside the object at 0x{self.my_base + inside[0]:x} "
                                 f"(offset {off - inside[0]}), not returned by shmem_malloc")  # fmt: skip
            raise ShmemError(f"{call}(0x{ptr:x}): pointer not returned by shmem_malloc")
        return off

    def _collective_check(self, record: dict, error: str | None, undo) -> None:
        """Multi-process: all-gather this PE's call and its outcome; raise on every PE if the PEs disagree
        (after undoing the local effect). Every PE takes part even when its own call failed, so that a
        local error never leaves the others waiting in the collective."""
        self._seq += 1
        if self.mode != "multiprocess" or self.n_pes == 1 or self.comm is None:
            return
        mine = dict(record, seq=self._seq)
        records = self.comm.all_gather_object(dict(mine, message=error))
        for q, theirs in enumerate(records):
            if q == self.my_pe or {k: theirs.get(k) for k in mine} == mine:
                continue
            if undo is not None and error is None:
                undo()
            raise ShmemStateError(
                f"symmetric allocation mismatch at shmem call #{self._seq}: PE {self.my_pe} did "
                f"{_describe(dict(mine, message=error))}, PE {q} did {_describe(theirs)}; every PE must make the "
                f"same shmem_malloc/shmem_free calls (same sizes and alignments) in the same order")

    def check_object(self, ptr: int, nbytes: int, what: str) -> int:
        """Offset of [ptr, ptr + nbytes) in my heap, which must lie inside one allocation."""
        off = self.offset_of(ptr)
        if off is None:
            raise ShmemError(f"{what}: 0x{int(ptr):x} is not in the symmetric heap (PE {self.my_pe}'s addresses)")
        inside = self.allocator.containing(off)
        if inside is None:
            raise ShmemError(f"{what}: 0x{int(ptr):x} is not inside an object allocated with shmem_malloc")
        start, size = inside
        if off + nbytes > start + size:
            raise ShmemError(f"{what}: {nbytes} bytes at 0x{int(ptr):x} run past the end of its object "
                             f"({size} bytes at 0x{self.my_base + start:x})")  # fmt: skip
        return off

    # ---- registration (bookkeeping only) -----------------------------------------------------
    def buffer_register(self, ptr, size) -> None:
        with self._lock:
            self._check_live()
            ptr, size = int(ptr), _check_size(size)
            if self.locate(ptr) is not None:
                raise ShmemError(f"shmem_buffer_register(0x{ptr:x}): the buffer is in the symmetric heap, which "
                                 f"needs no registration")  # fmt: skip
            for start, length in self.registered.items():
                if start < ptr + size and ptr < start + length:
                    raise ShmemError(f"shmem_buffer_register(0x{ptr:x}, {size}) overlaps the buffer registered at "
                                     f"0x{start:x} ({length} bytes)")  # fmt: skip
            self.registered[ptr] = size

    def buffer_deregister(self, ptr) -> None:
        with self._lock:
            self._check_live()
            if self.registered.pop(int(ptr), None) is None:
                raise ShmemError(f"shmem_buffer_deregister(0x{int(ptr):x}): no buffer is registered at that address")

    # ---- barriers ----------------------------------------------------------------------------
    def barrier_all(self) -> None:
        self._check_live()
        self.driver.device_synchronize()
        if self.comm is not None and self.n_pes > 1:
            self.comm.barrier()

    # ---- device state ------------------------------------------------------------------------
    def device_state_bytes(self, wait_limit: int = 0) -> bytes:
        """The 64-byte ``mori_compiler_shmem_state`` snapshot for a code object loaded now."""
        self._check_live()
        wait_limit = int(wait_limit)
        if wait_limit < 0:
            raise ShmemError(f"wait_limit must be >= 0 (0 = wait forever), got {wait_limit}")
        return pack_state(rank=self.my_pe, n_pes=self.n_pes, flags=FLAG_VIRTUAL_PES if self.virtual else 0,
                          heap_size=self.heap_size, heap_bases=self._bases_dev, sync_words=self.my_base,
                          wait_limit=wait_limit, wait_report=self._report_dev)  # fmt: skip

    @property
    def wait_report_device(self) -> int:
        return self._report_dev

    def read_wait_report(self) -> dict | None:
        self._check_live()
        return unpack_wait_report(self.driver.memcpy_dtoh(self._report_dev, WAIT_REPORT_SIZE))

    def reset_wait_report(self) -> None:
        self._check_live()
        self.driver.memset_d8(self._report_dev, 0, WAIT_REPORT_SIZE)


def _describe(record: dict) -> str:
    if record.get("op") == "malloc":
        out = f"shmem_malloc(size={record['size']}, alignment={record['alignment']})"
    else:
        off = record.get("offset")
        out = "shmem_free(" + (f"offset 0x{off:x}" if off is not None else "a pointer outside the heap") + ")"
    if record.get("error"):
        return f"{out} -> error: {record.get('message') or record['error']}"
    if record.get("op") == "malloc":
        out += f" -> offset 0x{record['offset']:x}"
    return out


def _process_identity() -> int:
    """Tells processes on one host apart (the pid; tests that simulate ranks with threads replace it)."""
    return os.getpid()


def _check_peer_infos(infos: list, mine: dict, n_pes: int) -> str | None:
    if len(infos) != n_pes:
        return f"shmem init: the process group returned {len(infos)} PEs' data, expected {n_pes}"
    for q, info in enumerate(infos):
        if info.get("error"):
            return f"shmem init failed on PE {q}: {info['error']}"
        if info["pe"] != q:
            return f"shmem init: PE data out of order (slot {q} holds PE {info['pe']})"
    for q, info in enumerate(infos):
        if info["heap_size"] != mine["heap_size"]:
            return (f"shmem init: PE {q} has a {info['heap_size']}-byte heap, PE {mine['pe']} a "
                    f"{mine['heap_size']}-byte one; set the same {HEAP_SIZE_ENV} on every PE")  # fmt: skip
        if info["unique_id"] != mine["unique_id"]:
            return (f"shmem init: PE {q} passed a different unique id than PE {mine['pe']}; every PE must pass "
                    f"the id that one PE got from shmem_get_unique_id()")  # fmt: skip
        if q != mine["pe"] and info["host"] == mine["host"] and info["pid"] == mine["pid"]:
            return (f"shmem init: PEs {mine['pe']} and {q} are the same process; multi-process shmem needs one "
                    f"process per PE (use shmem_init_virtual for several PEs in one process)")  # fmt: skip
    return None


def _check_npes(n_pes) -> int:
    try:
        n_pes = operator.index(n_pes)
    except TypeError:
        raise ShmemError(f"the number of PEs must be an integer, got {n_pes!r}") from None
    if not 1 <= n_pes <= MAX_PES:
        raise ShmemError(f"{n_pes} PEs: the device library supports 1..{MAX_PES} PEs")
    return n_pes


def _check_size(size) -> int:
    try:
        size = operator.index(size)
    except TypeError:
        raise ShmemError(f"size must be an integer number of bytes, got {size!r}") from None
    if size <= 0:
        raise ShmemError(f"size must be positive, got {size}")
    return size


# ---- the process-global state and the mori.shmem-style API ------------------------------------------

_STATE: ShmemState | None = None
_STATE_LOCK = threading.RLock()


def current_state() -> ShmemState | None:
    """The initialized shmem state, or None."""
    return _STATE


def state() -> ShmemState:
    """The initialized shmem state; raises ShmemStateError before init."""
    s = _STATE
    if s is None:
        raise ShmemStateError("shmem is not initialized: call shmem_torch_process_group_init(name), "
                              "shmem_init_attr(...) or shmem_init_virtual(n_pes) first")  # fmt: skip
    return s


def _default_driver() -> Driver:
    backend = os.environ.get(BACKEND_ENV)
    if not backend:
        torch = torch_cuda()
        backend = "rocdl" if torch is not None and getattr(torch.version, "hip", None) else "nvvm"
    return get_driver(backend)


def _install(make) -> None:
    global _STATE
    with _STATE_LOCK:
        if _STATE is not None:
            raise ShmemStateError(f"shmem is already initialized ({_STATE.mode}, {_STATE.n_pes} PEs): call "
                                  f"shmem_finalize() before initializing again")  # fmt: skip
        _STATE = make()


def _device_index(device) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device
    if index is not None:
        return int(index)
    text = str(device)
    m = re.match(r"^(?:cuda|hip)?:?(\d+)$", text)
    if not m:
        raise ShmemError(f"cannot tell which GPU '{device}' is: pass an index or 'cuda:N'")
    return int(m.group(1))


def shmem_init_virtual(n_pes: int, *, device=None, heap_size: int | None = None, driver: Driver | None = None) -> int:
    """Initialize ``n_pes`` virtual PEs in this process on one GPU (``device``: index, 'cuda:N' or a
    torch.device; default the current one). Returns 0."""
    def make():
        drv = driver if driver is not None else _default_driver()
        index = _device_index(device)
        if index is not None:
            drv.set_device(index)
        return ShmemState.create_virtual(drv, n_pes, heap_size)

    _install(make)
    return 0


def shmem_init_attr(flags: int, rank: int, nranks: int, unique_id, *, heap_size: int | None = None,
                    driver: Driver | None = None) -> int:  # fmt: skip
    """MORI's ``shmem_init_attr``. Only ``MORI_SHMEM_INIT_WITH_UNIQUEID`` is supported; the rendezvous is
    torch.distributed's WORLD group, which must be initialized with world size ``nranks`` and this process
    at ``rank``. Collective: every rank must call it. Returns 0."""
    if flags != MORI_SHMEM_INIT_WITH_UNIQUEID:
        raise ShmemError(f"shmem_init_attr flags={flags}: only MORI_SHMEM_INIT_WITH_UNIQUEID "
                         f"({MORI_SHMEM_INIT_WITH_UNIQUEID}) is supported (no MPI)")  # fmt: skip
    uid = bytes(unique_id)
    if len(uid) != UNIQUE_ID_BYTES:
        raise ShmemError(f"unique_id must be {UNIQUE_ID_BYTES} bytes (from shmem_get_unique_id()), got {len(uid)}")
    dist = _torch_distributed()
    if not dist.is_initialized():
        raise ShmemStateError("shmem_init_attr needs torch.distributed initialized (init_process_group) with "
                              f"world size {nranks}")  # fmt: skip
    comm = TorchComm(None)
    if comm.world_size != nranks or comm.rank != rank:
        raise ShmemStateError(f"shmem_init_attr(rank={rank}, nranks={nranks}) does not match torch.distributed "
                              f"(rank {comm.rank} of world size {comm.world_size})")  # fmt: skip

    def make():
        drv = driver if driver is not None else _default_driver()
        return ShmemState.create_multiprocess(drv, comm, heap_size, unique_id=uid)

    _install(make)
    return 0


def shmem_torch_process_group_init(group_name: str, *, heap_size: int | None = None,
                                   driver: Driver | None = None) -> int:  # fmt: skip
    """Initialize over the torch process group registered as ``group_name`` ('default'/'world': WORLD when
    torch.distributed is initialized). Collective over that group. Returns 0."""
    return shmem_init_comm(TorchComm(resolve_process_group(group_name)), heap_size=heap_size, driver=driver)


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def shmem_init_from_env(*, heap_size: int | None = None, backend: str = "gloo",
                        driver: Driver | None = None) -> int:  # fmt: skip
    """The torchrun path: one process per GPU, started by ``torchrun --nproc-per-node N`` (or anything
    that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT). Binds this process to GPU
    LOCAL_RANK, initializes torch.distributed from the environment when it is not yet (``backend``:
    gloo is enough, only host objects travel), then does the collective shmem init over WORLD: IPC handles
    exchanged through torch.distributed, every peer's heap mapped after checking peer access. Returns
    LOCAL_RANK (the GPU ordinal)."""
    missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
    dist = _torch_distributed()
    if missing and not dist.is_initialized():
        raise ShmemError(f"shmem_init_from_env: {', '.join(missing)} not set; start one process per GPU with "
                         f"torchrun --nproc-per-node <GPUs> (it sets {', '.join(TORCHRUN_VARIABLES)})")  # fmt: skip
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ShmemError(f"LOCAL_RANK must be an integer, got {os.environ['LOCAL_RANK']!r}") from None
    drv = driver if driver is not None else _default_driver()
    torch = torch_cuda()
    if torch is not None:
        count = torch.cuda.device_count()
        if not 0 <= local_rank < count:
            raise ShmemError(f"LOCAL_RANK {local_rank} but {count} GPU(s) visible to this process; start at most "
                             f"{count} processes per node")  # fmt: skip
        torch.cuda.set_device(local_rank)
    drv.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://")
    shmem_init_comm(TorchComm(None), heap_size=heap_size, driver=drv)
    return local_rank


def shmem_init_comm(comm, *, heap_size: int | None = None, driver: Driver | None = None) -> int:
    """Multi-process init over any rendezvous object with ``rank``, ``world_size``,
    ``all_gather_object(obj) -> list`` and ``barrier()`` (what TorchComm provides). Collective."""

    def make():
        drv = driver if driver is not None else _default_driver()
        return ShmemState.create_multiprocess(drv, comm, heap_size)

    _install(make)
    return 0


def shmem_get_unique_id() -> bytes:
    """128 bytes: a random token and this host's name. Used only as a rendezvous key (checked equal on
    every PE by shmem_init_attr)."""
    token = b"mori_compiler-uid:" + secrets.token_hex(16).encode() + b"@" + socket.gethostname().encode()[:64]
    return token[:UNIQUE_ID_BYTES].ljust(UNIQUE_ID_BYTES, b"\0")


def shmem_finalize() -> int:
    """Release the heap, the IPC mappings and the device tables. Tensors and pointers into the heap
    become invalid. Collective in multi-process mode."""
    global _STATE
    with _STATE_LOCK:
        s = state()
        _STATE = None
        s.finalize()
    return 0


def shmem_mype() -> int:
    return state().my_pe


def shmem_npes() -> int:
    return state().n_pes


def shmem_malloc(size: int) -> int:
    """A symmetric allocation of ``size`` bytes (256-byte aligned); returns this PE's address (virtual
    mode: PE 0's). Collective in multi-process mode."""
    return state().malloc(size)


def shmem_malloc_align(alignment: int, size: int) -> int:
    return state().malloc(size, alignment)


def shmem_free(ptr: int) -> None:
    state().free(ptr)


def shmem_buffer_register(ptr: int, size: int) -> None:
    """Record a non-heap buffer (MORI registers it for RDMA). Registered buffers are not symmetric: the
    address-based device API (put/get/ptr_p2p) works only on heap addresses."""
    state().buffer_register(ptr, size)


def shmem_buffer_deregister(ptr: int) -> None:
    state().buffer_deregister(ptr)


def shmem_ptr_p2p(ptr: int, my_pe: int, dest_pe: int) -> int:
    return state().ptr_p2p(ptr, my_pe, dest_pe)


def shmem_barrier_all() -> None:
    """Host barrier: synchronize the device, then (multi-process) a torch.distributed barrier."""
    state().barrier_all()


def device_state_bytes(wait_limit: int = 0) -> bytes:
    return state().device_state_bytes(wait_limit)


def read_wait_report() -> dict | None:
    """The bounded-wait report (lib_bitcode/state.py unpack_wait_report), or None when no wait gave up."""
    return state().read_wait_report()


def reset_wait_report() -> None:
    state().reset_wait_report()


# ---- torch tensors over symmetric memory ------------------------------------------------------------


class _DeviceBytes:
    """A zero-copy description of device bytes for torch.as_tensor (the CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (int(ptr), False),
                                         "strides": None, "version": 2}  # fmt: skip


def _shape_tuple(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ShmemError(f"negative dimension in shape {shape}")
    return shape


def _tensor_view(s: ShmemState, addr: int, shape, dtype):
    torch = importlib.import_module("torch")
    shape = _shape_tuple(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=torch.device("cuda", s.driver.device))
    raw = torch.as_tensor(_DeviceBytes(addr, nbytes), device=torch.device("cuda", s.driver.device))
    return raw.view(dtype).view(shape)


def _nbytes(shape, dtype) -> int:
    torch = importlib.import_module("torch")
    numel = 1
    for d in _shape_tuple(shape):
        numel *= d
    return numel * torch.empty((), dtype=dtype).element_size()


def mori_shmem_create_tensor(shape, dtype):
    """A torch tensor over a fresh symmetric allocation (this PE's copy; virtual mode: PE 0's). Free it
    with ``shmem_free(t.data_ptr())``; it dangles after shmem_finalize()."""
    s = state()
    ptr = s.malloc(max(_nbytes(shape, dtype), 1))
    return _tensor_view(s, ptr, shape, dtype)


def shmem_tensor(ptr: int, shape, dtype, pe: int | None = None):
    """A torch tensor view of the symmetric object at ``ptr`` (this PE's address) on PE ``pe`` (default
    mine; virtual mode: any PE; multi-process: a peer's heap through its IPC mapping)."""
    s = state()
    nbytes = _nbytes(shape, dtype)
    s.check_object(ptr, max(nbytes, 1), "shmem_tensor")
    pe = s.my_pe if pe is None else s.check_pe(pe, "pe")
    addr = s.ptr_p2p(ptr, s.my_pe, pe)
    if not addr:
        raise ShmemError(f"shmem_tensor: PE {pe}'s heap is not mapped in this process (another host)")
    return _tensor_view(s, addr, shape, dtype)
