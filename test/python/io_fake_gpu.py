"""A pretend GPU in host memory for MORI-IO's GPU paths on machines without one (CI).

``HostGpuDriver`` implements the runtime driver's copy-engine interface over host memory: "device
allocations" are POSIX shared-memory segments (so another process can map them, as CUDA IPC maps device
memory), the IPC handle names the segment, and copies are queued per stream and run only when something
waits for them (an event query or synchronize, a stream synchronize). That keeps the property the backends
must respect: bytes have not moved until the event of the copy is seen complete.

It models what the code under test relies on, no more: several devices with PCI bus ids and a P2P matrix,
the thread's current device (``using_device``), the caller's stream (always the default stream 0, waited
on by every ``stream_wait_event``), and CUDA's refusal to open a process's own IPC handle
(``CUDA_ERROR_INVALID_CONTEXT``). ``fail`` makes named calls raise ``DriverError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
from multiprocessing import shared_memory

from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime.driver import Driver, DriverError

HANDLE_MAGIC = b"HOSTGPU\0"


class _Allocation:
    def __init__(self, shm: shared_memory.SharedMemory, owned: bool):
        self.shm, self.owned = shm, owned
        self.size = shm.size
        self.array = (ctypes.c_char * self.size).from_buffer(shm.buf)
        self.base = ctypes.addressof(self.array)

    def close(self):
        del self.array
        self.shm.close()
        if self.owned:
            self.shm.unlink()


class HostGpuDriver(Driver):
    backend = "nvvm"
    api = "HOSTGPU"

    def __init__(self, devices: int = 1, peers: set | None = None, bus_prefix: str = "0000:0"):
        self.devices = devices
        self.peers = peers if peers is not None else set()  # {(device, peer)} with P2P access
        self.bus_ids = [f"{bus_prefix}{i}:00.0" for i in range(devices)]
        self.allocations: dict[int, _Allocation] = {}
        self.lock = threading.RLock()
        self.local = threading.local()
        self.streams: dict[int, list] = {0: []}
        self.events: dict[int, tuple] = {}
        self.fail: set[str] = set()
        self.calls: list[tuple] = []
        self.pinned: dict[int, object] = {}  # host_alloc'd "pinned" buffers by address
        self._ids = itertools.count(1)

    # ---- helpers ----
    def _rec(self, name, *args):
        self.calls.append((name, *args))
        if name in self.fail:
            raise DriverError(name, "CUDA_ERROR_UNKNOWN", "injected by the test")

    def _find(self, address: int, n: int = 1) -> _Allocation:
        for alloc in self.allocations.values():
            if alloc.base <= address and address + n <= alloc.base + alloc.size:
                return alloc
        raise DriverError("access", "CUDA_ERROR_ILLEGAL_ADDRESS", f"{address:#x} (+{n}) is not mapped")

    def _run(self, stream: int, upto=None) -> None:
        with self.lock:
            queue = self.streams.get(stream, [])
            while queue:
                op = queue.pop(0)
                if op[0] == "copy":
                    _, dst, src, n = op
                    ctypes.memmove(dst, src, n)
                elif op[0] == "record" and op[1] is upto:
                    return

    # ---- device and memory ----
    @property
    def device(self) -> int:
        return getattr(self.local, "device", 0)

    def set_device(self, ordinal: int) -> None:
        self.local.device = int(ordinal)

    @contextlib.contextmanager
    def using_device(self, ordinal: int):
        if not 0 <= int(ordinal) < self.devices:
            raise DriverError("using_device", "CUDA_ERROR_INVALID_DEVICE", f"no device {ordinal}")
        previous = self.device
        self.local.device = int(ordinal)
        try:
            yield
        finally:
            self.local.device = previous

    def device_count(self) -> int:
        return self.devices

    def pci_bus_id(self, ordinal: int) -> str:
        return self.bus_ids[ordinal]

    def can_access_peer(self, peer_ordinal: int) -> bool:
        return self.peer_access(self.device, peer_ordinal)

    def peer_access(self, device: int, peer: int) -> bool:
        return device == peer or (device, peer) in self.peers

    def malloc(self, n: int) -> int:
        alloc = _Allocation(shared_memory.SharedMemory(create=True, size=n), owned=True)
        self.allocations[alloc.base] = alloc
        return alloc.base

    def free(self, ptr: int) -> None:
        self.allocations.pop(ptr).close()

    def address_range(self, ptr: int) -> tuple[int, int]:
        self._rec("address_range", ptr)
        alloc = self._find(ptr)
        return alloc.base, alloc.size

    def write(self, address: int, data: bytes) -> None:
        self._find(address, len(data))
        ctypes.memmove(address, bytes(data), len(data))

    def read(self, address: int, n: int) -> bytes:
        self._find(address, n)
        return ctypes.string_at(address, n)

    def memcpy_htod(self, dst, data, stream=None):
        self.write(dst, data)

    def memcpy_dtoh(self, src, n, stream=None):
        return self.read(src, n)

    def memset_d8(self, ptr, value, n, stream=None):
        self.write(ptr, bytes([value & 0xFF]) * n)

    # ---- IPC ----
    def ipc_get_mem_handle(self, ptr: int) -> bytes:
        self._rec("ipc_get_mem_handle", ptr)
        alloc = self.allocations.get(ptr)
        if alloc is None or not alloc.owned:
            raise DriverError("cuIpcGetMemHandle", "CUDA_ERROR_INVALID_VALUE", "not an allocation base")
        name = alloc.shm.name.encode()
        return (HANDLE_MAGIC + name).ljust(64, b"\0")

    def ipc_open_mem_handle(self, handle: bytes) -> int:
        self._rec("ipc_open_mem_handle", handle)
        name = bytes(handle)[len(HANDLE_MAGIC):].rstrip(b"\0").decode()
        if any(a.owned and a.shm.name == name for a in self.allocations.values()):
            raise DriverError("cuIpcOpenMemHandle", "CUDA_ERROR_INVALID_CONTEXT", "the process's own handle")
        alloc = _Allocation(shared_memory.SharedMemory(name=name), owned=False)
        self.allocations[alloc.base] = alloc
        return alloc.base

    def ipc_close_mem_handle(self, ptr: int) -> None:
        self._rec("ipc_close_mem_handle", ptr)
        self.allocations.pop(ptr).close()

    # ---- streams, events, copies ----
    def stream_create(self) -> int:
        self._rec("stream_create")
        stream = next(self._ids) * 16
        with self.lock:
            self.streams[stream] = []
        return stream

    def stream_destroy(self, stream: int) -> None:
        self._run(stream)
        with self.lock:
            self.streams.pop(stream, None)

    def event_create(self):
        self._rec("event_create")
        return object()

    def event_destroy(self, event) -> None:
        pass

    def event_record(self, event, stream) -> None:
        self._rec("event_record", stream)
        with self.lock:
            self.events[id(event)] = (event, stream or 0)
            self.streams.setdefault(stream or 0, []).append(("record", event))

    def _event_pending(self, event) -> bool:
        recorded = self.events.get(id(event))
        if recorded is None:
            return False
        return any(op[0] == "record" and op[1] is event for op in self.streams.get(recorded[1], []))

    def event_query(self, event) -> bool:
        self._rec("event_query")
        with self.lock:
            if not self._event_pending(event):
                return True
            self._run(self.events[id(event)][1], upto=event)  # the pretend GPU gets to it now
            return False if self._event_pending(event) else True

    def event_synchronize(self, event) -> None:
        self._rec("event_synchronize")
        with self.lock:
            if self._event_pending(event):
                self._run(self.events[id(event)][1], upto=event)

    def stream_query(self, stream) -> bool:
        self._rec("stream_query", stream or 0)
        with self.lock:
            return not self.streams.get(stream or 0)

    def stream_wait_event(self, stream: int, event) -> None:
        self._rec("stream_wait_event", stream)
        with self.lock:
            recorded = self.events.get(id(event))
            if recorded is not None and self._event_pending(event):
                self._run(recorded[1], upto=event)  # the dependency resolves before later work

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        self._rec("memcpy_async", n, stream)
        for address in (dst, src):
            if not self._host_pinned(address):
                self._find(address, n)
        with self.lock:
            self.streams.setdefault(stream, []).append(("copy", dst, src, n))

    def stream_synchronize(self, stream) -> None:
        self._rec("stream_synchronize", stream)
        self._run(stream or 0)

    def device_synchronize(self) -> None:
        for stream in list(self.streams):
            self._run(stream)

    def host_alloc(self, n: int) -> int:
        self._rec("host_alloc", n)
        buffer = (ctypes.c_char * n)()
        self.pinned[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def host_free(self, ptr: int) -> None:
        self.pinned.pop(ptr, None)

    def _host_pinned(self, address: int) -> bool:
        return any(base <= address < base + ctypes.sizeof(buf) for base, buf in self.pinned.items())

    # ---- not modelled ----
    def load_module(self, image):
        raise NotImplementedError

    def launch(self, *args, **kwargs):
        raise NotImplementedError

    def max_active_blocks_per_sm(self, *args):
        raise NotImplementedError

    def multiprocessor_count(self):
        raise NotImplementedError

    def close(self) -> None:
        for base in list(self.allocations):
            self.allocations.pop(base).close()


def install(driver: HostGpuDriver, monkeypatch=None) -> None:
    """Make ``driver`` the process's default GPU driver (MORI-IO looks it up through default_driver)."""
    driver_mod._reset_drivers()
    driver_mod._drivers["nvvm"] = driver
    if monkeypatch is not None:
        monkeypatch.setenv(driver_mod.BACKEND_ENV, "nvvm")
    else:
        import os

        os.environ[driver_mod.BACKEND_ENV] = "nvvm"
