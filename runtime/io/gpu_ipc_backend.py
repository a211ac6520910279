"""The GPU-IPC backend of MORI-IO (``BackendType.XGMI``): one-sided copies between the GPU memory of
engines on one node, through the driver's IPC handles (CUDA IPC on NVIDIA, HIP IPC on AMD), as MORI's XGMI
backend does. No thread and no socket: the copies are queued on the GPU by the initiator.

Driver calls per transfer: a query of the caller's stream, and when it still has work an event record
and a stream wait to order after it; one copy per merged run; one event record; one query or synchronize
to see it done. On the H200 each costs ~0.5 µs of host time and the whole raw path 16-23 µs, as a plain
``copy_`` plus synchronize (measured, bench/results/session8/xgmi_probe.log); the rest of a transfer's
time is this module's and the engine's Python.

Registration (``annotate_memory``): for GPU memory, the handle of the driver allocation that contains it
(``ipc_handle``; torch tensors are sub-allocations of larger segments) and the region's offset in it
(``ipc_offset``) go into the MemoryDesc. If the driver cannot export it (e.g. VMM memory, torch's
``expandable_segments``), a warning is logged and the handle stays zero: other processes then reach that
memory through another backend (TCP) or not at all.

Eligibility (``can_handle(local, remote)``, MORI's rules): both GPU memory; the remote engine is this
engine or a registered one on the same node (``node_id`` equal, else ``hostname``); the remote
``device_bus_id`` is known; if that GPU is visible here, the local GPU must reach it (P2P, always true for
the same GPU), else (a GPU hidden from this process) the handle must be non-zero. One difference: memory of
another process with a zero handle is not eligible here (MORI accepts it and fails the transfer), so the
route falls back to TCP where there is one.

Addresses: memory of this engine is used as registered; another engine's memory is mapped once per
(allocation handle, local GPU) with the handle and offset by ``ipc_offset``. The mapping must cover
``ipc_offset + size`` bytes, else the transfer fails: a descriptor cannot make us copy outside what its
owner exported. An engine of this same process (its handle cannot be opened here: CUDA refuses a process's
own handles) is reached through its registration directly. An engine's mappings are closed when it is
deregistered (after the copies in flight) and by ``close``.

Transfers: every copy of one call runs on one stream of the local GPU (where the remote memory is mapped),
taken round robin from ``num_streams`` per device; first the stream waits for the caller's current stream
(``gpu.wait_for_caller``), then one copy per merged run, then an event is recorded. The status is
``IN_PROGRESS`` until the event is seen complete: ``Code()``/``InProgress()`` query it (never block),
``Wait()`` synchronizes on it; later transfers also reap finished ones so events return to the pool. A
driver failure gives ``ERR_GPU_OP``; memory that cannot be mapped ``ERR_BAD_STATE``. Ordering between
transfers: none (different streams), as MORI. No target-side notifications (``pop_inbound`` is False).
"""

from __future__ import annotations

import collections
import os
import threading
import weakref

from ..driver import Driver, DriverError
from .configs import XgmiBackendConfig
from .descriptors import ZERO_HANDLE, MemoryDesc
from .enums import MemoryLocationType, StatusCode
from .gpu import Devices, EventPool, StreamPool, wait_for_caller
from .log import LOGGER
from .regions import Region
from .status import TransferStatus

GPU = MemoryLocationType.GPU
_REAP_PER_TRANSFER = 8  # finished transfers whose events a new transfer returns to the pool, at most

# The GPU-IPC backends of this process by engine key: how an engine reaches another engine's memory in
# the same process (IPC handles cannot be opened by the process that exported them).
_PROCESS_BACKENDS: "weakref.WeakValueDictionary[str, GpuIpcBackend]" = weakref.WeakValueDictionary()


def _process_peer(desc) -> "GpuIpcBackend | None":
    """The GPU-IPC backend of engine ``desc`` if that engine lives in this process (same pid and a backend
    of that key and engine descriptor here: a pid alone could be another container's), else None."""
    if desc.pid != os.getpid():
        return None
    peer = _PROCESS_BACKENDS.get(desc.key)
    if peer is None or peer.own_desc.node_id != desc.node_id or peer.own_desc.hostname != desc.hostname:
        return None
    return peer


class MappingError(RuntimeError):
    """Remote memory cannot be reached from here (``ERR_BAD_STATE``)."""


class _InFlight:
    """One issued transfer: its completion event and status; finished once, by whoever sees it first. The
    event goes back to the pool only when finished and no thread is still querying or waiting on it (else
    a new transfer could re-record it under that thread)."""

    __slots__ = ("backend", "device", "event", "status", "done", "users", "lock")

    def __init__(self, backend: "GpuIpcBackend", device: int, event, status: TransferStatus):
        self.backend, self.device, self.event, self.status = backend, device, event, status
        self.done = False
        self.users = 0
        self.lock = threading.Lock()

    def poll(self) -> bool:
        """Query the event (never blocks); True once finished."""
        return self._use(self.backend.driver.event_query)

    def wait(self) -> None:
        self._use(lambda event: self.backend.driver.event_synchronize(event) or True)

    def _use(self, ask) -> bool:
        with self.lock:
            if self.done:
                return True
            self.users += 1
        code = None
        try:
            with self.backend.driver.using_device(self.device):
                if ask(self.event):
                    code, message = StatusCode.SUCCESS, ""
        except DriverError as exc:
            code, message = StatusCode.ERR_GPU_OP, f"XGMI: {exc}"
        with self.lock:
            self.users -= 1
            first = code is not None and not self.done
            if first:
                self.done = True
            event = None
            if self.done and self.users == 0:
                event, self.event = self.event, None
        if event is not None:
            self.backend.events.give(self.device, event)
        if first:
            self.status.SetCode(code, message)
        return code is not None or self.done


class GpuIpcBackend:
    """MORI's XGMI backend over the runtime driver (see the module docstring). ``regions`` is the engine's
    registry (mem_id -> Region), read under ``regions_lock``; ``own_desc`` the engine's EngineDesc."""

    def __init__(self, own_desc, config: XgmiBackendConfig, driver: Driver, devices: Devices, regions: dict,
                 regions_lock: threading.Lock):  # fmt: skip
        self.key, self.own_desc = own_desc.key, own_desc
        self.driver, self.devices = driver, devices
        self.regions, self.regions_lock = regions, regions_lock
        self.streams = StreamPool(driver, config.effective_num_streams)
        self.events = EventPool(driver, config.effective_num_events)
        self.remotes: dict[str, object] = {}  # key -> EngineDesc
        self.lock = threading.Lock()
        # (handle, local GPU) -> (base, size, owning engine key)
        self._mappings: dict[tuple[bytes, int], tuple[int, int, str]] = {}
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        _PROCESS_BACKENDS[self.key] = self

    # ---- engines and memory ----

    def register_remote_engine(self, desc) -> None:
        with self.lock:
            self.remotes[desc.key] = desc

    def deregister_remote_engine(self, desc) -> None:
        """Forget the engine and close its memory's mappings (after the copies in flight, which may use them:
        the owner may free that memory once it has no importer)."""
        with self.lock:
            self.remotes.pop(desc.key, None)
            mine = [key for key, (_, _, owner) in self._mappings.items() if owner == desc.key]
            flights = list(self._in_flight) if mine else []
        for flight in flights:
            flight.wait()
        for key in mine:
            with self.lock:
                mapping = self._mappings.pop(key, None)
            if mapping is not None:
                self._unmap(key[1], mapping[0])

    def annotate_memory(self, desc: MemoryDesc, region: Region) -> MemoryDesc:
        """The descriptor with the IPC handle of the region's allocation and its offset (GPU memory)."""
        if not region.on_gpu:
            return desc
        try:
            with self.driver.using_device(region.device):
                handle = self.driver.ipc_get_mem_handle(region.base)
        except DriverError as exc:
            LOGGER.warning("MORI-IO XGMI: GPU memory %d of engine %r cannot be exported (%s); other processes "
                           "will not reach it through GPU IPC", desc.id, self.key, exc)  # fmt: skip
            return desc
        return desc._replace(ipc_handle=handle, ipc_offset=region.address - region.base)

    def forget_memory(self, mem_id: int) -> None:
        """Nothing is cached per local memory (mappings are per remote allocation)."""

    # ---- route ----

    def can_handle(self, local: MemoryDesc, remote: MemoryDesc) -> bool:
        if local.loc is not GPU or remote.loc is not GPU or not remote.device_bus_id:
            return False
        own = remote.engine_key == self.key
        if not own:
            with self.lock:
                desc = self.remotes.get(remote.engine_key)
            if desc is None or not self._same_node(desc):
                return False
            if _process_peer(desc) is None and remote.ipc_handle == ZERO_HANDLE:
                return False  # nothing to open: let another backend carry it
        visible = self.devices.ordinal(remote.device_bus_id)
        if visible is not None:
            return self.devices.p2p(local.device_id, visible)
        return remote.ipc_handle != ZERO_HANDLE

    def _same_node(self, desc) -> bool:
        mine = self.own_desc
        if desc.node_id and mine.node_id:
            return desc.node_id == mine.node_id
        return desc.hostname == mine.hostname

    def prepare_session(self, local: MemoryDesc, remote: MemoryDesc) -> bool:
        """Map the remote memory now (a session is only made when that works, else None, as MORI)."""
        try:
            self._remote_address(local.device_id, remote)
        except MappingError as exc:
            LOGGER.error("MORI-IO XGMI: failed to create a session to memory %d of engine %r: %s", remote.id,
                         remote.engine_key, exc)  # fmt: skip
            return False
        return True

    # ---- addresses ----

    def _remote_address(self, local_device: int, remote: MemoryDesc) -> int:
        """The address, in this process, of the first byte of ``remote``."""
        if remote.engine_key == self.key:
            return self._registered_address(self, remote)
        with self.lock:
            desc = self.remotes.get(remote.engine_key)
        peer = _process_peer(desc) if desc is not None else None
        if peer is not None:
            return self._registered_address(peer, remote)
        if remote.ipc_handle == ZERO_HANDLE:
            raise MappingError(f"memory {remote.id} of engine {remote.engine_key!r} has no IPC handle (registered "
                               "before that engine's XGMI backend existed, or not exportable)")  # fmt: skip
        base, size = self._map(remote.ipc_handle, local_device, remote.engine_key)
        if remote.ipc_offset + remote.size > size:
            raise MappingError(f"memory {remote.id} of engine {remote.engine_key!r} claims [{remote.ipc_offset}, "
                               f"+{remote.size}) of an allocation of {size} bytes")  # fmt: skip
        return base + remote.ipc_offset

    @staticmethod
    def _registered_address(owner: "GpuIpcBackend", remote: MemoryDesc) -> int:
        """The address of memory registered by an engine of this process, checked against its registry."""
        with owner.regions_lock:
            region = owner.regions.get(remote.id)
        if region is None or not region.on_gpu or region.address != remote.data or region.size < remote.size:
            raise MappingError(f"memory {remote.id} of engine {remote.engine_key!r} is not registered as that "
                               "descriptor says (deregistered?)")  # fmt: skip
        return region.address

    def _map(self, handle: bytes, local_device: int, owner: str) -> tuple[int, int]:
        """(base, size) in this process of the allocation ``handle`` names, mapped once per local GPU."""
        key = (handle, local_device)
        with self.lock:
            found = self._mappings.get(key)
        if found is not None:
            return found[:2]
        try:
            with self.driver.using_device(local_device):
                base = self.driver.ipc_open_mem_handle(handle)
                size = self.driver.address_range(base)[1]
        except DriverError as exc:
            raise MappingError(f"opening the IPC handle failed: {exc}") from None
        with self.lock:
            if key in self._mappings:  # another thread mapped it meanwhile: keep one mapping
                duplicate, found = base, self._mappings[key]
            else:
                duplicate, found = None, self._mappings.setdefault(key, (base, size, owner))
        if duplicate is not None:
            self._unmap(local_device, duplicate)
        return found[:2]

    def _unmap(self, device: int, base: int) -> None:
        try:
            with self.driver.using_device(device):
                self.driver.ipc_close_mem_handle(base)
        except DriverError as exc:
            LOGGER.warning("MORI-IO XGMI: closing an IPC mapping failed: %s", exc)

    # ---- transfers ----

    def transfer(self, kind: str, local: Region, remote: MemoryDesc, runs, uid: int, status: TransferStatus) -> None:
        """Queue the copies of ``runs`` = [(remote_offset, [(local_offset, length), ...]), ...]; the status
        completes through its progress and wait callbacks."""
        self._reap()
        device = local.device
        try:
            remote_base = self._remote_address(device, remote)
        except MappingError as exc:
            status.SetCode(StatusCode.ERR_BAD_STATE, f"XGMI: failed to create session: {exc}")
            return
        copies = []
        for remote_offset, pieces in runs:
            for local_offset, length in pieces:
                local_address, remote_address = local.address + local_offset, remote_base + remote_offset
                if kind == "write":
                    copies.append((remote_address, local_address, length))
                else:
                    copies.append((local_address, remote_address, length))
                remote_offset += length
        if not copies:
            status.SetCode(StatusCode.SUCCESS, "")
            return
        driver = self.driver
        try:
            with driver.using_device(device):
                stream = self.streams.next(device)
                wait_for_caller(driver, self.events, device, stream, device)
                for dst, src, length in copies:
                    driver.memcpy_async(dst, src, length, stream)
                event = self.events.take(device)
                driver.event_record(event, stream)
        except DriverError as exc:
            status.SetCode(StatusCode.ERR_GPU_OP, f"XGMI: {exc}")
            return
        flight = _InFlight(self, device, event, status)
        status.SetProgressCallback(flight.poll)
        status.SetWaitCallback(flight.wait)
        with self.lock:
            self._in_flight.append(flight)

    def _reap(self) -> None:
        """Finish the oldest transfers that are done (their events go back to the pool)."""
        for _ in range(_REAP_PER_TRANSFER):
            with self.lock:
                if not self._in_flight:
                    return
                flight = self._in_flight[0]
            if not flight.poll():
                return
            with self.lock:
                if self._in_flight and self._in_flight[0] is flight:
                    self._in_flight.popleft()

    def pop_inbound(self, remote_key: str, uid: int) -> bool:
        return False  # GPU IPC never tells the target (MORI's XGMI neither)

    def close(self) -> None:
        with self.lock:
            flights, self._in_flight = list(self._in_flight), collections.deque()
            mappings, self._mappings = dict(self._mappings), {}
        for flight in flights:
            flight.wait()
        for (_, device), (base, _, _) in mappings.items():
            self._unmap(device, base)
        self.streams.close()
        self.events.close()
        if _PROCESS_BACKENDS.get(self.key) is self:
            del _PROCESS_BACKENDS[self.key]
