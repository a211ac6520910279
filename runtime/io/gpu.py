"""GPU resources MORI-IO's backends share: the driver, the visible devices (PCI bus id <-> ordinal, P2P
access), per-device pools of copy streams and events, the event that orders a copy after the caller's
stream, and pinned host buffers.

Everything goes through the runtime's driver interface (``runtime/driver.py``: CUDA via cuda-bindings,
HIP via hip-python), so the same code serves NVIDIA and AMD. Resources are created on first use, on the
device they belong to (``Driver.using_device``), and destroyed by ``close``.

Ordering after the caller (MORI does not do this; see docs/mori-io.md): a transfer of GPU memory first
records an event on the caller's current stream of the local device (torch's current stream, else the
default stream) and makes its copy stream wait on it, so that the bytes a kernel or a torch op queued
before the call are the bytes that move. The wait is queued on the GPU: the host never blocks on it. When
a query shows that stream has nothing left to run, there is nothing to order after and no event is used.
"""

from __future__ import annotations

import ctypes
import itertools
import threading

from ..driver import Driver, DriverError, default_driver


def io_driver() -> Driver:
    """The process's GPU driver for MORI-IO (the runtime's default one), or a clear RuntimeError."""
    try:
        return default_driver()
    except (ImportError, DriverError, RuntimeError) as exc:
        raise RuntimeError(f"MORI-IO: GPU memory needs a GPU runtime (cuda-bindings or hip-python) and a GPU: "
                           f"{exc}") from None  # fmt: skip


class Devices:
    """The GPUs this process sees: bus id -> ordinal and the P2P matrix (queried once per pair)."""

    def __init__(self, driver: Driver):
        self.driver = driver
        self._lock = threading.Lock()
        self._bus_ids: dict[int, str] | None = None
        self._p2p: dict[tuple[int, int], bool] = {}

    def bus_ids(self) -> dict[int, str]:
        with self._lock:
            if self._bus_ids is None:
                count = self.driver.device_count()
                self._bus_ids = {i: self.driver.pci_bus_id(i) for i in range(count)}
            return self._bus_ids

    def bus_id(self, ordinal: int) -> str:
        return self.bus_ids().get(ordinal, "")

    def ordinal(self, bus_id: str) -> int | None:
        """The local ordinal of the GPU with PCI ``bus_id`` (case-insensitive), None when not visible."""
        bus_id = bus_id.lower()
        for ordinal, known in self.bus_ids().items():
            if known == bus_id:
                return ordinal
        return None

    def p2p(self, device: int, peer: int) -> bool:
        """Whether copies on ``device`` can reach ``peer``'s memory directly (True on the diagonal)."""
        if device == peer:
            return True
        key = (device, peer)
        with self._lock:
            known = self._p2p.get(key)
        if known is None:
            try:
                known = bool(self.driver.peer_access(device, peer))
            except DriverError:
                known = False
            with self._lock:
                self._p2p[key] = known
        return known


class StreamPool:
    """``count`` non-blocking copy streams per device, handed out round robin (MORI's XGMI pool)."""

    def __init__(self, driver: Driver, count: int):
        self.driver, self.count = driver, count
        self._lock = threading.Lock()
        self._streams: dict[int, list[int]] = {}
        self._turn: dict[int, itertools.count] = {}

    def next(self, device: int) -> int:
        """The next stream of ``device`` (call inside ``using_device(device)``); created on first use."""
        with self._lock:
            streams = self._streams.setdefault(device, [])
            turn = self._turn.setdefault(device, itertools.count())
            index = next(turn) % self.count
            if index < len(streams):
                return streams[index]
            stream = self.driver.stream_create()
            streams.append(stream)
            return stream

    def close(self) -> None:
        with self._lock:
            streams, self._streams = self._streams, {}
        for device, handles in streams.items():
            with self.driver.using_device(device):
                for stream in handles:
                    _quietly(self.driver.stream_destroy, stream)


class EventPool:
    """Reusable timing-free events per device: ``initial`` of them are made at a device's first ``take``
    (MORI's ``num_events``), more when none is free; ``give`` returns one."""

    def __init__(self, driver: Driver, initial: int = 0):
        self.driver, self.initial = driver, initial
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}
        self._all: dict[int, list] = {}

    def take(self, device: int):
        """A free event of ``device`` (call inside ``using_device(device)``)."""
        with self._lock:
            first = device not in self._all
            if first:
                self._all[device] = []
            free = self._free.setdefault(device, [])
            if free:
                return free.pop()
        if first and self.initial > 1:
            made = [self.driver.event_create() for _ in range(self.initial - 1)]
            with self._lock:
                self._all[device].extend(made)
                self._free[device].extend(made)
        event = self.driver.event_create()
        with self._lock:
            self._all.setdefault(device, []).append(event)
        return event

    def give(self, device: int, event) -> None:
        with self._lock:
            self._free.setdefault(device, []).append(event)

    def close(self) -> None:
        with self._lock:
            events, self._all, self._free = self._all, {}, {}
        for device, handles in events.items():
            with self.driver.using_device(device):
                for event in handles:
                    _quietly(self.driver.event_destroy, event)


def caller_stream_busy(driver: Driver, caller_device: int) -> int | None:
    """The caller's current stream of ``caller_device`` if work queued on it may still run, else None
    (all done: nothing to wait for, and the event wait, which costs GPU-side latency, is skipped)."""
    stream = driver.current_stream(caller_device)
    with driver.using_device(caller_device):
        return None if driver.stream_query(stream) else stream


def wait_for_caller(driver: Driver, events: EventPool, caller_device: int, stream: int, device: int) -> None:
    """Make ``stream`` (on ``device``; call inside ``using_device(device)``) wait for the work queued so far
    on the caller's current stream of ``caller_device`` (nothing when that is all done). The event goes back
    to the pool at once: a stream wait captures the event's last record when it is queued, so re-recording
    it later is harmless."""
    caller = caller_stream_busy(driver, caller_device)
    if caller is None:
        return
    with driver.using_device(caller_device):
        event = events.take(caller_device)
        driver.event_record(event, caller)
    try:
        driver.stream_wait_event(stream, event)
    finally:
        events.give(caller_device, event)


class CallerEvent:
    """An event recorded on the caller's stream of ``device`` when a transfer was issued, for a later copy
    to wait on. ``release`` returns it to its pool, once, whoever gets there first (the copy, once its
    wait is queued, or the transfer's completion when no copy ran)."""

    __slots__ = ("pool", "device", "event", "_lock")

    def __init__(self, pool: EventPool, device: int, event):
        self.pool, self.device, self.event = pool, device, event
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            event, self.event = self.event, None
        if event is not None:
            self.pool.give(self.device, event)


class PinnedBuffer:
    """``size`` bytes of page-locked host memory and a byte view of them (TCP staging of GPU memory)."""

    def __init__(self, driver: Driver, size: int):
        self.driver, self.size = driver, size
        self.address = driver.host_alloc(size)
        self.view = memoryview((ctypes.c_char * size).from_address(self.address)).cast("B")

    def close(self) -> None:
        if self.address:
            self.view = memoryview(b"")  # slices handed out earlier must not outlive the buffer
            _quietly(self.driver.host_free, self.address)
            self.address = 0


def _quietly(fn, *args) -> None:
    """Release a resource at shutdown; a failure there is not worth an exception (the process may be
    ending, the context already gone)."""
    try:
        fn(*args)
    except (DriverError, NotImplementedError, RuntimeError):
        pass
