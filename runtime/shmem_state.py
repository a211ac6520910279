"""One initialized shmem (``ShmemState``): the PEs, the memory it owns, addresses, allocation, device state.

``heap_bases[pe]`` is every PE's heap as mapped in this process (0: unmapped); the allocator
(runtime/heap_allocator.py) gives the same offsets on every PE. ``runtime/shmem.py`` keeps the
process-global instance its API works on.

Who owns what memory (all released by ``finalize``, or by a failed construction, in ``_release``):

* **virtual** (``create_virtual``): N PEs in this one process on one GPU. One device allocation of
  n_pes × heap size, owned by this state; PE p's heap is at base + p × heap size. PE 0's address of an
  object is its symmetric handle (``malloc`` returns it; ``my_pe`` is 0) and ``ptr_p2p(ptr, 0, p)`` gives PE
  p's copy. Kernels compiled with virtual PEs run all PEs in one launch (PE = grid z index; see
  runtime/launcher.py).
* **multi-process** (``create_multiprocess``): one PE per process. Each process owns its own heap, allocated
  with the driver's ``malloc`` (cudaMalloc / hipMalloc class, never managed memory), and maps (does not own)
  the heaps of the peers on its host through their IPC handles: the mappings are closed, never freed. Peers
  on other hosts stay unmapped (``ptr_p2p`` → 0; the device library returns ENODEV): there is no RDMA
  transport. ``finalize`` first waits at a barrier so that no peer still writes into our heap through its
  mapping.
* **device tables**, owned in both modes: the table of every PE's heap base (8 bytes each, as mapped here)
  and the bounded-wait report, both read by the device library through the state snapshot.

Every heap's first ``SYNC_RESERVED_BYTES`` (the device barrier's words; the snapshot's ``sync_words`` points
at this PE's) are zeroed at init. The device library reads its state (``mori_compiler_shmem_state``: layout in
lib_bitcode/state.py, rules in docs/device-abi.md) from every loaded code object; ``device_state_bytes()`` is
the snapshot to write there (runtime/launcher.py does it).

``buffer_register`` only records a buffer (as MORI does for RDMA registration): registered buffers are not
symmetric and cannot be used with the address-based device API (puts/gets/``ptr_p2p``), which works only on
heap addresses.
"""

from __future__ import annotations

import operator
import threading

from mori_compiler.lib_bitcode.state import (FLAG_VIRTUAL_PES, MAX_PES, SYNC_RESERVED_BYTES, WAIT_REPORT_SIZE,
                                             pack_state, unpack_wait_report)  # fmt: skip

from . import shmem_comm
from .driver import Driver
from .heap_allocator import ALLOC_GRANULE, HEAP_SIZE_ENV, HeapAllocator, check_heap_size, heap_size_from_env, round_up
from .shmem_errors import ShmemError, ShmemOutOfMemoryError, ShmemStateError


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
        n_pes = check_npes(n_pes)
        heap_size = heap_size_from_env() if heap_size is None else check_heap_size(heap_size, "heap_size")
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
        """Collective over ``comm``: every PE must call it. Phase 1: allocate our heap and all-gather the init
        records (shmem_comm), checked equal on every PE. Phase 2: map the peers on this host; its outcome is
        all-gathered too, so that no PE goes on (or waits) while another has given up."""
        n_pes, my_pe = int(comm.world_size), int(comm.rank)
        n_pes = check_npes(n_pes)
        heap_size = heap_size_from_env() if heap_size is None else check_heap_size(heap_size, "heap_size")
        state = cls(driver, mode="multiprocess", my_pe=my_pe, n_pes=n_pes, heap_size=heap_size, comm=comm)
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
        mine = shmem_comm.init_record(pe=my_pe, device=driver.device, heap_size=heap_size, base=base, handle=handle,
                                      unique_id=unique_id, error=local_error)  # fmt: skip
        host = mine["host"]
        try:
            infos = shmem_comm.gather_init_records(comm, mine, n_pes)
            state.heap_bases[my_pe] = base
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
            shmem_comm.gather_failures(comm, local_error, "shmem init failed mapping the peers' heaps")
        except BaseException:
            state._release()
            raise
        return state

    def _make_device_tables(self) -> None:
        table = b"".join(int(b).to_bytes(8, "little") for b in self.heap_bases)
        self._bases_dev = self.driver.malloc(max(len(table), 8))
        self.driver.memcpy_htod(self._bases_dev, table)
        self._report_dev = self.driver.malloc(round_up(WAIT_REPORT_SIZE, 64))
        self.driver.memset_d8(self._report_dev, 0, round_up(WAIT_REPORT_SIZE, 64))

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
                size = check_size(size)
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
        """Multi-process: all-gather this PE's call and its outcome (shmem_comm.call_mismatch); raise on every
        PE if the PEs disagree, after undoing the local effect."""
        self._seq += 1
        if self.mode != "multiprocess" or self.n_pes == 1 or self.comm is None:
            return
        mismatch = shmem_comm.call_mismatch(self.comm, self.my_pe, dict(record, seq=self._seq), error)
        if mismatch is not None:
            if undo is not None and error is None:
                undo()
            raise ShmemStateError(mismatch)

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
            ptr, size = int(ptr), check_size(size)
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


def check_npes(n_pes) -> int:
    try:
        n_pes = operator.index(n_pes)
    except TypeError:
        raise ShmemError(f"the number of PEs must be an integer, got {n_pes!r}") from None
    if not 1 <= n_pes <= MAX_PES:
        raise ShmemError(f"{n_pes} PEs: the device library supports 1..{MAX_PES} PEs")
    return n_pes


def check_size(size) -> int:
    try:
        size = operator.index(size)
    except TypeError:
        raise ShmemError(f"size must be an integer number of bytes, got {size!r}") from None
    if size <= 0:
        raise ShmemError(f"size must be positive, got {size}")
    return size


def _lowbit(value: int) -> int:
    return value & -value if value else 1 << 63
