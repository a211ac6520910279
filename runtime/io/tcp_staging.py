"""How the TCP backend moves GPU memory: through a pinned host buffer, one frame at a time.

A socket only reads and writes host memory, so every frame whose local bytes are GPU memory passes
through a ``Staging``: a page-locked buffer of one frame's payload (``max_frame_payload`` bytes) and a copy
stream per GPU, both made on first use. One staging belongs to one thread (a connection's sender, its
receiver, a target's server thread), so none is shared and none needs a lock.

* ``gather(targets)``: copies the targets (device -> host) into consecutive bytes of the buffer and
  returns their views once the copies are done, for sending;
* ``landing(lengths)``: consecutive views of the buffer to receive a payload into;
* ``scatter(targets)``: copies those bytes (host -> device) into the targets and returns once they are in
  GPU memory, so that an acknowledgement sent after it means the data is placed.

A target is ``(region, offset, length)`` of a GPU region; one frame's targets may lie in several regions.

``after`` (a ``gpu.CallerEvent``, recorded on the caller's current stream when the transfer was issued)
makes the copy wait for the caller's GPU work first; the event is released once the wait is queued.
"""

from __future__ import annotations

from .gpu import PinnedBuffer


class Staging:
    def __init__(self, gpu_context, capacity: int):
        self._gpu_context = gpu_context  # () -> (driver, devices); raises RuntimeError without a GPU runtime
        self.capacity = capacity
        self._driver = None
        self._buffer: PinnedBuffer | None = None
        self._streams: dict[int, int] = {}

    def _ensure_buffer(self) -> None:
        if self._driver is None:
            self._driver = self._gpu_context()[0]
        if self._buffer is None:
            self._buffer = PinnedBuffer(self._driver, self.capacity)  # portable: usable by every GPU

    def _stream(self, device: int) -> int:
        """This staging's stream on ``device`` (call inside ``using_device(device)``)."""
        self._ensure_buffer()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self._driver.stream_create()
        return stream

    def _views(self, lengths) -> list[memoryview]:
        total = sum(lengths)
        if total > self.capacity:
            raise ValueError(f"a frame of {total} bytes does not fit the {self.capacity}-byte staging buffer")
        views, at = [], 0
        for length in lengths:
            views.append(self._buffer.view[at : at + length])
            at += length
        return views

    def _wait(self, stream: int, after) -> None:
        if after is not None and after.event is not None:
            try:
                self._driver.stream_wait_event(stream, after.event)
            finally:
                after.release()

    def gather(self, targets, after=None) -> list[memoryview]:
        """Host views of ``targets`` = [(GPU region, offset, length), ...], copied device -> host into
        consecutive bytes of the buffer and synchronized."""
        views = self.landing([length for _, _, length in targets])
        self._copy(targets, after, to_host=True)
        return views

    def landing(self, lengths) -> list[memoryview]:
        """Consecutive views of the buffer, one per length, to receive into (before ``scatter``)."""
        self._ensure_buffer()
        return self._views(list(lengths))

    def scatter(self, targets, after=None) -> None:
        """Copy the buffer's first bytes (laid out as ``landing`` gave them) into ``targets`` = [(GPU region,
        offset, length), ...]; returns when they are in GPU memory."""
        self._copy(targets, after, to_host=False)

    def _copy(self, targets, after, *, to_host: bool) -> None:
        self._ensure_buffer()
        used: dict[int, int] = {}
        at = 0
        for region, offset, length in targets:
            with self._driver.using_device(region.device):
                stream = used.get(region.device)
                if stream is None:
                    stream = used[region.device] = self._stream(region.device)
                    if after is not None and after.device == region.device:
                        self._wait(stream, after)
                        after = None
                host, device_address = self._buffer.address + at, region.address + offset
                if to_host:
                    self._driver.memcpy_async(host, device_address, length, stream)
                else:
                    self._driver.memcpy_async(device_address, host, length, stream)
            at += length
        if after is not None:  # not used by a copy (no target on its device): still hand it back
            after.release()
        for device, stream in used.items():
            with self._driver.using_device(device):
                self._driver.stream_synchronize(stream)

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        for device, stream in self._streams.items():
            try:
                with self._driver.using_device(device):
                    self._driver.stream_destroy(stream)
            except Exception:  # noqa: BLE001 - shutting down: the context may already be gone
                pass
        self._streams.clear()

