"""Symmetric memory over a fake driver, through the public API (runtime/shmem.py) and ShmemState: the
heap allocator (runtime/heap_allocator.py), virtual PEs, the multi-process logic (runtime/shmem_comm.py)
with a fake torch.distributed (ranks simulated by threads of this process), the device state, tensor
views and every error path. No GPU and no torch needed.
"""

from __future__ import annotations

import struct
import sys
import threading
import types

import pytest

from mori_compiler.lib_bitcode.state import (FLAG_VIRTUAL_PES, MAX_PES, STATE_SIZE, SYNC_RESERVED_BYTES,
                                             WAIT_REPORT_FORMAT, WAIT_REPORT_SIZE, unpack_state)  # fmt: skip
from mori_compiler.runtime import shmem, shmem_comm
from mori_compiler.runtime.driver import Driver, Function, Module
from mori_compiler.runtime.heap_allocator import HeapAllocator
from mori_compiler.runtime.shmem import ShmemError, ShmemOutOfMemoryError, ShmemState, ShmemStateError

HEAP = 1 << 20  # 1 MiB per PE in these tests


# ---- a fake driver with device memory and process-spanning IPC --------------------------------------


class IpcRegistry:
    """What the kernel driver shares between processes: handle -> the exporting allocation's memory."""

    def __init__(self):
        self.exports: dict[bytes, bytearray] = {}


class FakeDriver(Driver):
    backend = "nvvm"
    api = "FAKE"
    _next_base = [0x10_0000_0000]  # shared by all instances: distinct address ranges per "process"

    def __init__(self, ipc: IpcRegistry | None = None, *, base_align: int = 2 << 20):
        self.ipc = ipc or IpcRegistry()
        self.base_align = base_align
        self.memory: dict[int, bytearray] = {}  # base -> bytes (own allocations and IPC mappings)
        self.mapped: set[int] = set()
        self.calls: list[tuple] = []
        self.fail: dict[str, Exception] = {}

    def _rec(self, name, *args):
        self.calls.append((name, *args))
        if name in self.fail:
            raise self.fail[name]

    def _new_range(self, n: int) -> int:
        base = FakeDriver._next_base[0]
        FakeDriver._next_base[0] += (n + self.base_align - 1) // self.base_align * self.base_align + self.base_align
        return base

    def locate(self, addr: int, n: int) -> tuple[bytearray, int]:
        for base, buf in self.memory.items():
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base
        raise AssertionError(f"fake driver: access to unmapped memory 0x{addr:x} (+{n})")

    def read(self, addr: int, n: int) -> bytes:
        buf, off = self.locate(addr, n)
        return bytes(buf[off : off + n])

    def write(self, addr: int, data: bytes) -> None:
        buf, off = self.locate(addr, len(data))
        buf[off : off + len(data)] = data

    def load_module(self, image: bytes) -> Module:
        raise NotImplementedError

    def malloc(self, n: int) -> int:
        self._rec("malloc", n)
        base = self._new_range(n)
        self.memory[base] = bytearray(b"\xEE" * n)  # not zeroed, like cudaMalloc
        return base

    def free(self, ptr: int) -> None:
        self._rec("free", ptr)
        assert ptr not in self.mapped, "freeing an IPC mapping"
        del self.memory[ptr]

    def memcpy_htod(self, dst, data, stream=None):
        self._rec("memcpy_htod", dst, len(data))
        self.write(dst, bytes(data))

    def memcpy_dtoh(self, src, n, stream=None):
        self._rec("memcpy_dtoh", src, n)
        return self.read(src, n)

    def memset_d8(self, ptr, value, n, stream=None):
        self._rec("memset_d8", ptr, value, n)
        self.write(ptr, bytes([value]) * n)

    def launch(self, fn: Function, grid, block, params, *, shared_mem=0, stream=None, cooperative=False):
        raise NotImplementedError

    def max_active_blocks_per_sm(self, fn, block_threads, shared_mem=0):
        return 1

    def multiprocessor_count(self):
        return 1

    def ipc_get_mem_handle(self, ptr):
        self._rec("ipc_get_mem_handle", ptr)
        handle = f"handle:{ptr:x}".encode().ljust(64, b"\0")
        self.ipc.exports[handle] = self.memory[ptr]
        return handle

    def ipc_open_mem_handle(self, handle):
        self._rec("ipc_open_mem_handle", handle)
        buf = self.ipc.exports[bytes(handle)]
        base = self._new_range(len(buf))
        self.memory[base] = buf  # the same bytes, at another address: a mapping
        self.mapped.add(base)
        return base

    def ipc_close_mem_handle(self, ptr):
        self._rec("ipc_close_mem_handle", ptr)
        self.mapped.remove(ptr)
        del self.memory[ptr]

    def stream_synchronize(self, stream):
        self._rec("stream_synchronize", stream)

    ordinal = 0  # the GPU this "process" works on
    peers: frozenset = frozenset()  # other GPUs it has P2P access to

    @property
    def device(self):
        return self.ordinal

    def can_access_peer(self, peer_ordinal):
        self._rec("can_access_peer", peer_ordinal)
        return peer_ordinal == self.ordinal or peer_ordinal in self.peers

    def device_synchronize(self):
        self._rec("device_synchronize")

    def current_stream(self):
        return 0


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("MORI_SHMEM_HEAP_SIZE", raising=False)
    yield
    if shmem.current_state() is not None:
        shmem.shmem_finalize()


@pytest.fixture
def drv():
    return FakeDriver()


def _virtual(drv, n_pes, heap=HEAP):
    shmem.shmem_init_virtual(n_pes, heap_size=heap, driver=drv)
    return shmem.current_state()


# ---- the allocator ----------------------------------------------------------------------------------


def test_allocator_first_fit_reuse_and_coalescing():
    a = HeapAllocator(64 * 256, reserved=2 * 256)
    x, y, z = a.alloc(256), a.alloc(300), a.alloc(256)
    assert (x, y, z) == (512, 768, 1280)  # 300 bytes take two 256-byte granules
    assert a.free_blocks == [(1536, 64 * 256 - 1536)]
    a.free(y)
    assert a.alloc(100) == 768  # first fit reuses the hole
    a.free(768)
    a.free(x)
    assert a.free_blocks[0] == (512, 768)  # x and y's hole merged
    a.free(z)
    assert a.free_blocks == [(512, 64 * 256 - 512)]  # everything merged back into one block
    assert a.bytes_free == 64 * 256 - 512


def test_allocator_alignment_splits_the_gap():
    a = HeapAllocator(1 << 16, reserved=256)
    first = a.alloc(256)
    aligned = a.alloc(100, 4096)
    assert first == 256 and aligned == 4096
    assert a.free_blocks[0] == (512, 4096 - 512)  # the gap before the aligned block stays free
    assert a.alloc(256) == 512
    assert a.find(1 << 20, 256) is None and a.alloc(1 << 20) is None


# ---- virtual PEs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_pes", [2, 4, 8])
def test_virtual_heaps_and_ptr_p2p(drv, n_pes):
    s = _virtual(drv, n_pes)
    assert shmem.shmem_mype() == 0 and shmem.shmem_npes() == n_pes
    (alloc,) = [c for c in drv.calls if c[0] == "malloc" and c[1] == n_pes * HEAP]
    base = s.heap_bases[0]
    assert s.heap_bases == [base + p * HEAP for p in range(n_pes)]
    for b in s.heap_bases:  # every PE's barrier area is zeroed
        assert drv.read(b, SYNC_RESERVED_BYTES) == bytes(SYNC_RESERVED_BYTES)
    ptr = shmem.shmem_malloc(1000)
    assert ptr == base + SYNC_RESERVED_BYTES  # the symmetric handle is PE 0's address
    for p in range(n_pes):
        assert shmem.shmem_ptr_p2p(ptr, 0, p) == s.heap_bases[p] + SYNC_RESERVED_BYTES
        # any PE's copy translates to any other PE's
        assert shmem.shmem_ptr_p2p(shmem.shmem_ptr_p2p(ptr, 0, p), p, n_pes - 1) == shmem.shmem_ptr_p2p(ptr, 0, n_pes - 1)
    assert shmem.shmem_ptr_p2p(base - 8, 0, 1) == 0  # below the heap
    assert shmem.shmem_ptr_p2p(base + HEAP, 0, 1) == 0  # PE 1's heap is not PE 0's
    assert shmem.shmem_ptr_p2p(s.heap_bases[-1] + HEAP, n_pes - 1, 0) == 0  # past the last heap
    assert shmem.shmem_ptr_p2p(0x1234, 0, 0) == 0


def test_malloc_alignment_and_free_reuse(drv):
    s = _virtual(drv, 2)
    a = shmem.shmem_malloc(10)
    b = shmem.shmem_malloc_align(4096, 10)
    assert (a - s.heap_bases[0]) % 256 == 0 and b % 4096 == 0
    c = shmem.shmem_malloc(256)
    shmem.shmem_free(a)
    assert shmem.shmem_malloc(200) == a  # the freed block is reused
    for p in (a, b, c):
        shmem.shmem_free(p)
    assert s.allocator.free_blocks == [(SYNC_RESERVED_BYTES, HEAP - SYNC_RESERVED_BYTES)]


def test_allocation_errors(drv):
    s = _virtual(drv, 4)
    p = shmem.shmem_malloc(512)
    with pytest.raises(ShmemError, match="size must be positive, got 0"):
        shmem.shmem_malloc(0)
    with pytest.raises(ShmemError, match="size must be positive, got -5"):
        shmem.shmem_malloc(-5)
    with pytest.raises(ShmemError, match="size must be an integer"):
        shmem.shmem_malloc(1.5)
    with pytest.raises(ShmemError, match="alignment 48 is not a positive power of two"):
        shmem.shmem_malloc_align(48, 16)
    with pytest.raises(ShmemError, match="alignment 0 is not a positive power of two"):
        shmem.shmem_malloc_align(0, 16)
    with pytest.raises(ShmemError, match="exceeds the alignment of the heap bases"):
        shmem.shmem_malloc_align(1 << 40, 16)
    with pytest.raises(ShmemError, match="pointer inside the object .* not returned by shmem_malloc"):
        shmem.shmem_free(p + 256)
    with pytest.raises(ShmemError, match="pointer not returned by shmem_malloc"):
        shmem.shmem_free(s.heap_bases[0] + 64 * 1024)
    with pytest.raises(ShmemError, match="pointer outside the symmetric heap"):
        shmem.shmem_free(0xDEAD)
    with pytest.raises(ShmemError, match="that is PE 2's copy .*pass the address shmem_malloc returned"):
        shmem.shmem_free(shmem.shmem_ptr_p2p(p, 0, 2))
    shmem.shmem_free(p)
    with pytest.raises(ShmemError, match="double free"):
        shmem.shmem_free(p)
    with pytest.raises(ShmemError, match="dest_pe 4 is out of range: there are 4 PEs"):
        shmem.shmem_ptr_p2p(p, 0, 4)
    with pytest.raises(ShmemError, match="my_pe -1 is out of range"):
        shmem.shmem_ptr_p2p(p, -1, 0)


def test_out_of_heap_memory_names_the_heap_size(drv):
    _virtual(drv, 2)
    shmem.shmem_malloc(HEAP // 2)
    with pytest.raises(ShmemOutOfMemoryError) as info:
        shmem.shmem_malloc(HEAP // 2)
    message = str(info.value)
    assert isinstance(info.value, ShmemError) and isinstance(info.value, MemoryError)
    assert f"the heap has {HEAP} bytes per PE (MORI_SHMEM_HEAP_SIZE)" in message
    assert "raise MORI_SHMEM_HEAP_SIZE" in message


def test_state_errors(drv):
    with pytest.raises(ShmemStateError, match="shmem is not initialized: call shmem_torch_process_group_init"):
        shmem.shmem_malloc(8)
    with pytest.raises(ShmemStateError, match="not initialized"):
        shmem.shmem_mype()
    with pytest.raises(ShmemStateError, match="not initialized"):
        shmem.shmem_finalize()
    _virtual(drv, 2)
    with pytest.raises(ShmemStateError, match=r"already initialized \(virtual, 2 PEs\): call shmem_finalize"):
        shmem.shmem_init_virtual(2, heap_size=HEAP, driver=drv)
    shmem.shmem_finalize()
    _virtual(drv, 4)  # init after finalize works
    assert shmem.shmem_npes() == 4


@pytest.mark.parametrize("n_pes, message", [(0, "0 PEs: the device library supports 1..255"),
                                            (MAX_PES + 1, "256 PEs: the device library supports 1..255"),
                                            ("2", "must be an integer")])  # fmt: skip
def test_bad_pe_counts(drv, n_pes, message):
    with pytest.raises(ShmemError, match=message):
        shmem.shmem_init_virtual(n_pes, heap_size=HEAP, driver=drv)
    assert shmem.current_state() is None and drv.memory == {}


def test_heap_size_from_environment(monkeypatch, drv):
    for text, size in [("4096K", 4 << 20), ("3M", 3 << 20), ("2G", 2 << 30), ("1gib", 1 << 30), ("300000", 300032)]:
        monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", text)
        assert shmem.heap_size_from_env() == size
    monkeypatch.delenv("MORI_SHMEM_HEAP_SIZE")
    assert shmem.heap_size_from_env() == 1 << 30  # the project's default (MORI's is 4 GiB)
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", "lots")
    with pytest.raises(ShmemError, match="cannot parse heap size 'lots'"):
        shmem.heap_size_from_env()
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", "1K")
    with pytest.raises(ShmemError, match="MORI_SHMEM_HEAP_SIZE=1K: the heap needs at least"):
        shmem.shmem_init_virtual(2, driver=drv)
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", "2M")
    shmem.shmem_init_virtual(2, driver=drv)
    assert shmem.current_state().heap_size == 2 << 20


def test_device_state_decodes(drv):
    s = _virtual(drv, 4)
    data = shmem.device_state_bytes(wait_limit=123)
    assert len(data) == STATE_SIZE
    state = unpack_state(data)
    assert state["rank"] == 0 and state["n_pes"] == 4 and state["flags"] == FLAG_VIRTUAL_PES
    assert state["heap_size"] == HEAP and state["wait_limit"] == 123
    assert struct.unpack("<4Q", drv.read(state["heap_bases"], 32)) == tuple(s.heap_bases)
    assert state["sync_words"] == s.heap_bases[0]
    assert drv.read(state["wait_report"], WAIT_REPORT_SIZE) == bytes(WAIT_REPORT_SIZE)
    with pytest.raises(ShmemError, match="wait_limit must be >= 0"):
        shmem.device_state_bytes(-1)


def test_wait_report_roundtrip(drv):
    s = _virtual(drv, 2)
    assert shmem.read_wait_report() is None
    drv.write(s.wait_report_device, struct.pack(WAIT_REPORT_FORMAT, 1, 1, 2, 0xABC, 5, 3))
    assert shmem.read_wait_report() == {"pe": 1, "kind": "greater_than (signed)", "addr": 0xABC, "expected": 5,
                                        "seen": 3}  # fmt: skip
    shmem.reset_wait_report()
    assert shmem.read_wait_report() is None
    assert s.locate(s.heap_bases[1] + 0x20) == (1, 0x20) and s.locate(1) is None


def test_buffer_registration_is_bookkeeping(drv):
    s = _virtual(drv, 2)
    shmem.shmem_buffer_register(0x5000_0000, 4096)
    assert s.registered == {0x5000_0000: 4096}
    with pytest.raises(ShmemError, match="overlaps the buffer registered at 0x50000000"):
        shmem.shmem_buffer_register(0x5000_0800, 16)
    with pytest.raises(ShmemError, match="in the symmetric heap, which needs no registration"):
        shmem.shmem_buffer_register(s.heap_bases[1] + 4096, 16)
    with pytest.raises(ShmemError, match="size must be positive"):
        shmem.shmem_buffer_register(0x6000_0000, 0)
    assert shmem.shmem_ptr_p2p(0x5000_0000, 0, 1) == 0  # registered buffers are not symmetric
    shmem.shmem_buffer_deregister(0x5000_0000, 4096)
    with pytest.raises(ShmemError, match="no buffer is registered at that address"):
        shmem.shmem_buffer_deregister(0x5000_0000, 4096)


def test_barrier_and_finalize_release_everything(drv):
    s = _virtual(drv, 2)
    shmem.shmem_malloc(64)
    shmem.shmem_barrier_all()
    assert drv.calls[-1] == ("device_synchronize",)
    shmem.shmem_finalize()
    assert drv.memory == {}  # heap, heap_bases table and wait report freed
    assert shmem.current_state() is None
    with pytest.raises(ShmemStateError, match="finalized"):
        s.malloc(8)


def test_failed_init_leaves_nothing_behind(drv):
    drv.fail["memcpy_htod"] = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        shmem.shmem_init_virtual(2, heap_size=HEAP, driver=drv)
    assert shmem.current_state() is None and drv.memory == {}


def test_unique_id():
    uid = shmem.shmem_get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    assert uid != shmem.shmem_get_unique_id()


# ---- multi-process: a fake torch.distributed, ranks as threads ---------------------------------------


class FakeWorld:
    """A fake torch.distributed whose ranks are threads: all_gather_object is a real rendezvous."""

    def __init__(self, world_size: int, *, initialized: bool = True):
        self.world_size = world_size
        self.initialized = initialized
        self.local = threading.local()
        self.slots = [None] * world_size
        self.sync = threading.Barrier(world_size, timeout=10)
        self.gathers = 0
        self.registered: dict[str, object] = {}
        self.WORLD = types.SimpleNamespace(name="WORLD")

    def module(self) -> types.ModuleType:
        dist = types.ModuleType("torch.distributed")
        dist.is_available = lambda: True
        dist.is_initialized = lambda: self.initialized
        dist.get_rank = lambda group=None: self.local.rank
        dist.get_world_size = lambda group=None: self.world_size
        dist.all_gather_object = self.all_gather_object
        dist.barrier = lambda group=None: self.sync.wait()
        dist.group = types.SimpleNamespace(WORLD=self.WORLD)
        return dist

    def all_gather_object(self, out, obj, group=None):
        self.slots[self.local.rank] = obj
        self.sync.wait()
        out[:] = list(self.slots)
        self.gathers += 1
        self.sync.wait()

    def resolve(self, name):
        if name not in self.registered:
            raise RuntimeError(f"Could not resolve the process group registered under the name {name}")
        return self.registered[name]


@pytest.fixture
def world(monkeypatch):
    # every simulated rank is a thread of this process: let the same-process check see threads
    monkeypatch.setattr(shmem_comm, "process_identity", threading.get_ident)

    def make(world_size, **kw):
        w = FakeWorld(world_size, **kw)
        torch = types.ModuleType("torch")
        dist = w.module()
        torch.distributed = dist
        c10d = types.ModuleType("torch._C._distributed_c10d")
        c10d._resolve_process_group = w.resolve
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
        monkeypatch.setitem(sys.modules, "torch._C", types.ModuleType("torch._C"))
        monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", c10d)
        return w

    return make


def run_ranks(w: FakeWorld, fn):
    """Run fn(rank) on one thread per rank; returns per-rank results (exceptions returned, not raised)."""
    results = [None] * w.world_size

    def body(rank):
        w.local.rank = rank
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(w.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"
    return results


def _mp_states(w, drivers, heap=HEAP, **kw):
    return run_ranks(w, lambda r: ShmemState.create_multiprocess(drivers[r], shmem.TorchComm(None), heap, **kw))


def test_multiprocess_exchange_maps_every_peer(world):
    w = world(3)
    ipc = IpcRegistry()
    drivers = [FakeDriver(ipc) for _ in range(3)]
    states = _mp_states(w, drivers)
    assert all(isinstance(s, ShmemState) for s in states), states
    for r, s in enumerate(states):
        assert s.my_pe == r and s.n_pes == 3 and s.mode == "multiprocess"
        assert s.heap_bases[r] == s._own_allocation  # our own heap, used directly
        assert sorted(drivers[r].mapped) == sorted(b for q, b in enumerate(s.heap_bases) if q != r)
        state = unpack_state(s.device_state_bytes())
        assert state["rank"] == r and state["n_pes"] == 3 and state["flags"] == 0
        assert struct.unpack("<3Q", drivers[r].read(state["heap_bases"], 24)) == tuple(s.heap_bases)

    # same calls on every PE: same offsets; a write through PE 0's mapping of PE 2's heap lands in PE 2's heap
    ptrs = run_ranks(w, lambda r: states[r].malloc(1000))
    offsets = {p - states[r].my_base for r, p in enumerate(ptrs)}
    assert offsets == {SYNC_RESERVED_BYTES}
    remote = states[0].ptr_p2p(ptrs[0], 0, 2)
    drivers[0].write(remote, b"hello")
    assert drivers[2].read(ptrs[2], 5) == b"hello"
    assert states[0].ptr_p2p(ptrs[0], 0, 0) == ptrs[0]
    run_ranks(w, lambda r: states[r].free(ptrs[r]))

    run_ranks(w, lambda r: states[r].finalize())
    for d in drivers:
        assert d.memory == {} and d.mapped == set()  # mappings closed, heaps and tables freed


def test_allocation_order_mismatch_is_detected_on_every_pe(world):
    w = world(2)
    ipc = IpcRegistry()
    drivers = [FakeDriver(ipc) for _ in range(2)]
    states = _mp_states(w, drivers)
    run_ranks(w, lambda r: states[r].malloc(256))
    results = run_ranks(w, lambda r: states[r].malloc(256 if r == 0 else 512))
    for r, exc in enumerate(results):
        assert isinstance(exc, ShmemStateError), exc
        message = str(exc)
        assert "symmetric allocation mismatch at shmem call #2" in message
        mine, theirs = ("256", "512") if r == 0 else ("512", "256")
        assert f"PE {r} did shmem_malloc(size={mine}, alignment=256)" in message
        assert f"PE {1 - r} did shmem_malloc(size={theirs}, alignment=256)" in message
    # the mismatched allocation was undone on both PEs: the heaps still agree
    assert states[0].allocator.free_blocks == states[1].allocator.free_blocks
    # a local error on one PE only fails every PE instead of leaving the other waiting
    p = run_ranks(w, lambda r: states[r].malloc(64))
    results = run_ranks(w, lambda r: states[r].free(p[r] if r == 0 else 0x42))
    assert all(isinstance(e, ShmemStateError) for e in results), results
    assert "PE 1 did shmem_free(a pointer outside the heap) -> error:" in str(results[0])
    # the same bad call on every PE is a plain argument error
    results = run_ranks(w, lambda r: states[r].malloc(0))
    assert all(isinstance(e, ShmemError) and "size must be positive" in str(e) for e in results), results
    run_ranks(w, lambda r: states[r].finalize())


def test_multiprocess_checks_peer_access(world):
    # One process per GPU: GPUs 0 and 1 reach each other (P2P), GPU 2 reaches nobody. Every PE reports the
    # failure (the error is all-gathered), naming the PE and the GPUs; nothing stays mapped or allocated.
    w = world(3)
    ipc = IpcRegistry()
    drivers = [FakeDriver(ipc) for _ in range(3)]
    for r, d in enumerate(drivers):
        d.ordinal = r
    drivers[0].peers, drivers[1].peers = frozenset({1}), frozenset({0})
    results = _mp_states(w, drivers)
    for r, res in enumerate(results):
        assert isinstance(res, ShmemStateError), res
        assert "PE 0 (GPU 0) has no peer access to PE 2's GPU 2" in str(res)
        assert "PE 2 (GPU 2) has no peer access to PE 0's GPU 0" in str(res)
        assert not drivers[r].mapped and not drivers[r].memory
    # all peer-accessible: the heaps are mapped
    w = world(2)
    drivers = [FakeDriver(ipc) for _ in range(2)]
    drivers[0].ordinal, drivers[1].ordinal = 0, 1
    drivers[0].peers, drivers[1].peers = frozenset({1}), frozenset({0})
    states = _mp_states(w, drivers)
    assert all(isinstance(s, ShmemState) for s in states), states
    assert [("can_access_peer", 1 - r) in drivers[r].calls for r in range(2)] == [True, True]
    run_ranks(w, lambda r: states[r].finalize())


def test_multiprocess_init_mismatches(world):
    w = world(2)
    ipc = IpcRegistry()
    results = run_ranks(w, lambda r: ShmemState.create_multiprocess(FakeDriver(ipc), shmem.TorchComm(None),
                                                                    HEAP if r == 0 else 2 * HEAP))  # fmt: skip
    assert all(isinstance(e, ShmemStateError) and "set the same MORI_SHMEM_HEAP_SIZE" in str(e) for e in results)
    uids = [b"a" * 128, b"b" * 128]
    results = run_ranks(w, lambda r: ShmemState.create_multiprocess(FakeDriver(ipc), shmem.TorchComm(None), HEAP,
                                                                    unique_id=uids[r]))  # fmt: skip
    assert all(isinstance(e, ShmemStateError) and "different unique id" in str(e) for e in results)
    # a failure on one PE (its heap allocation) is reported on every PE, nobody hangs
    drivers = [FakeDriver(ipc), FakeDriver(ipc)]
    drivers[1].fail["malloc"] = RuntimeError("out of device memory")
    results = _mp_states(w, drivers)
    assert all(isinstance(e, ShmemStateError) and "failed on PE 1: RuntimeError: out of device memory" in str(e)
               for e in results), results  # fmt: skip
    # ... and so is a failure to map a peer
    drivers = [FakeDriver(ipc), FakeDriver(ipc)]
    drivers[0].fail["ipc_open_mem_handle"] = RuntimeError("peer access denied")
    results = _mp_states(w, drivers)
    assert all(isinstance(e, ShmemStateError) and "PE 0: RuntimeError: peer access denied" in str(e)
               for e in results), results  # fmt: skip
    assert all(d.memory == {} for d in drivers)


def test_init_attr_checks_torch_distributed(world, drv):
    w = world(2)
    w.local.rank = 0
    uid = shmem.shmem_get_unique_id()
    with pytest.raises(ShmemStateError, match=r"shmem_init_attr\(rank=0, nranks=4\) does not match torch.distributed "
                                              r"\(rank 0 of world size 2\)"):  # fmt: skip
        shmem.shmem_init_attr(shmem.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 4, uid, driver=drv)
    with pytest.raises(ShmemStateError, match=r"rank=1, nranks=2\) does not match"):
        shmem.shmem_init_attr(1, 1, 2, uid, driver=drv)
    with pytest.raises(ShmemError, match="only MORI_SHMEM_INIT_WITH_UNIQUEID"):
        shmem.shmem_init_attr(0, 0, 2, uid, driver=drv)
    with pytest.raises(ShmemError, match=r"unique_id must be the 128 bytes of shmem_get_unique_id\(\), got 5"):
        shmem.shmem_init_attr(1, 0, 2, b"short", driver=drv)
    w.initialized = False  # then the unique id carries the rendezvous: rank 0 waits for rank 1, up to the timeout
    with pytest.raises(ShmemStateError, match="rank 0 must be the process that called shmem_get_unique_id"):
        shmem.shmem_init_attr(1, 0, 2, uid, driver=drv, timeout=0.2)  # that id's listener was closed: not used
    with pytest.raises(ShmemStateError, match=r"rank\(s\) \[1\] did not join within 0.2 s"):
        shmem.shmem_init_attr(1, 0, 2, shmem.shmem_get_unique_id(), driver=drv, timeout=0.2)
    assert shmem.current_state() is None and drv.calls == []


def test_init_attr_two_ranks(world):
    w = world(2)
    ipc = IpcRegistry()
    uid = shmem.shmem_get_unique_id()
    drivers = [FakeDriver(ipc), FakeDriver(ipc)]
    # the module-level API holds one state per process: simulate through ShmemState, as each process would
    results = run_ranks(w, lambda r: ShmemState.create_multiprocess(drivers[r], shmem.TorchComm(None), HEAP,
                                                                    unique_id=uid))  # fmt: skip
    assert [s.my_pe for s in results] == [0, 1]
    run_ranks(w, lambda r: results[r].finalize())


def test_torch_process_group_init(world, drv):
    w = world(1)
    w.local.rank = 0
    with pytest.raises(ShmemError, match="no torch process group is registered as 'ep_group'"):
        shmem.shmem_torch_process_group_init("ep_group", heap_size=HEAP, driver=drv)
    shmem.shmem_torch_process_group_init("default", heap_size=HEAP, driver=drv)  # falls back to WORLD
    assert shmem.shmem_mype() == 0 and shmem.shmem_npes() == 1
    assert shmem.current_state().mode == "multiprocess"
    shmem.shmem_finalize()
    w.registered["default"] = w.WORLD  # registered: resolves to WORLD itself
    shmem.shmem_torch_process_group_init("default", heap_size=HEAP, driver=drv)
    assert shmem.current_state().comm.group is None
    shmem.shmem_barrier_all()
    shmem.shmem_finalize()
    w.registered.clear()
    w.initialized = False
    with pytest.raises(ShmemStateError, match="torch.distributed is not initialized"):
        shmem.shmem_torch_process_group_init("default", heap_size=HEAP, driver=drv)


def test_init_from_env_is_the_torchrun_path(world, drv, monkeypatch):
    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; without them (and without an
    # initialized torch.distributed) the error says how to start the processes.
    w = world(1, initialized=False)
    w.local.rank = 0
    for var in shmem.TORCHRUN_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ShmemError, match=r"RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set; "
                                         r"start one process per GPU with torchrun --nproc-per-node"):
        shmem.shmem_init_from_env(heap_size=HEAP, driver=drv)
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    inits = []

    def init_process_group(backend, init_method=None):
        inits.append((backend, init_method))
        w.initialized = True

    sys.modules["torch.distributed"].init_process_group = init_process_group
    assert shmem.shmem_init_from_env(heap_size=HEAP, driver=drv) == 0
    assert inits == [("gloo", "env://")]  # torch.distributed from the environment, host objects only
    s = shmem.current_state()
    assert s.mode == "multiprocess" and s.my_pe == 0 and s.n_pes == 1 and s.comm.group is None
    shmem.shmem_finalize()
    assert shmem.shmem_init_from_env(heap_size=HEAP, driver=drv) == 0  # already initialized: not again
    assert len(inits) == 1
    shmem.shmem_finalize()
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ShmemError, match="LOCAL_RANK must be an integer, got 'x'"):
        shmem.shmem_init_from_env(heap_size=HEAP, driver=drv)
    monkeypatch.setenv("LOCAL_RANK", "3")  # the fake driver has only GPU 0
    with pytest.raises(ValueError, match="supports only device 0, not 3"):
        shmem.shmem_init_from_env(heap_size=HEAP, driver=drv)
    bound = []  # with torch's CUDA: LOCAL_RANK is checked against the visible GPUs, then bound
    sys.modules["torch"].cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                                                      set_device=bound.append)
    with pytest.raises(ShmemError, match=r"LOCAL_RANK 3 but 2 GPU\(s\) visible to this process; start at most 2"):
        shmem.shmem_init_from_env(heap_size=HEAP, driver=drv)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert shmem.shmem_init_from_env(heap_size=HEAP, driver=drv) == 0 and bound == [0]
    shmem.shmem_finalize()
    assert shmem.current_state() is None


# ---- tensors (through a fake torch) -----------------------------------------------------------------


class FakeTensor:
    def __init__(self, ptr, nbytes, dtype="uint8", shape=None, device=None):
        self.ptr, self.nbytes, self.dtype, self.shape, self.device = ptr, nbytes, dtype, shape or (nbytes,), device

    def view(self, what):
        if isinstance(what, tuple):
            return FakeTensor(self.ptr, self.nbytes, self.dtype, what, self.device)
        return FakeTensor(self.ptr, self.nbytes, what, self.shape, self.device)

    def data_ptr(self):
        return self.ptr


def test_tensor_views(monkeypatch, drv):
    torch = types.ModuleType("torch")
    seen = []

    def as_tensor(obj, device=None):
        cai = obj.__cuda_array_interface__
        seen.append(cai)
        assert cai["typestr"] == "|u1" and cai["version"] == 2 and cai["strides"] is None
        return FakeTensor(cai["data"][0], cai["shape"][0], device=device)

    torch.as_tensor = as_tensor
    torch.device = lambda kind, index: f"{kind}:{index}"
    torch.empty = lambda shape, dtype=None, device=None: types.SimpleNamespace(element_size=lambda: 4)
    torch.float32 = "float32"
    monkeypatch.setitem(sys.modules, "torch", torch)

    s = _virtual(drv, 4)
    t = shmem.mori_shmem_create_tensor((2, 3), torch.float32)
    assert t.ptr == s.heap_bases[0] + SYNC_RESERVED_BYTES and t.nbytes == 24
    assert t.dtype == "float32" and t.shape == (2, 3) and t.device == "cuda:0"
    peer = shmem.shmem_tensor(t.ptr, (6,), torch.float32, pe=3)
    assert peer.ptr == s.heap_bases[3] + SYNC_RESERVED_BYTES and peer.shape == (6,)
    with pytest.raises(ShmemError, match="run past the end of its object"):
        shmem.shmem_tensor(t.ptr, (7,), torch.float32)
    with pytest.raises(ShmemError, match="not inside an object allocated with shmem_malloc"):
        shmem.shmem_tensor(s.heap_bases[0] + 64 * 1024, (1,), torch.float32)
    with pytest.raises(ShmemError, match="pe 4 is out of range"):
        shmem.shmem_tensor(t.ptr, (1,), torch.float32, pe=4)
