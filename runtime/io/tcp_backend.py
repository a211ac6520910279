"""The TCP backend of MORI-IO: one-sided reads and writes of registered memory over sockets (it stands in
for MORI's RDMA backend; the wire protocol is ``tcp_frames``, the socket I/O ``tcp_socket``). GPU memory, on
either side, passes through pinned host buffers one frame at a time (``tcp_staging``): the initiator's
copies wait for the caller's current stream at the time of the call, and a target acknowledges a write
into GPU memory only once the bytes are there.

Threads (all daemons, ended by ``close``):

* one listener per backend, on the engine's host/port (port 0: an ephemeral one, see ``port``);
* one *server* thread per accepted connection: it answers the peer's HELLO, then serves WRITE (each
  segment is checked against the registered region before a byte lands; a refused one is drained and
  answered ``ERR_INVALID_ARGS``, the connection stays; a peer stalled inside a frame for ``io_timeout_ms`` is
  dropped), READ_REQUEST (checked the same way; READ_RESPONSE
  with the bytes or the error), NOTIFY (counted for ``pop_inbound``) and MEMORY_QUERY;
* one *sender* and one *receiver* thread per outgoing connection: the sender sends the queued frames in
  order (payloads straight from the local region; a small frame with nothing queued ahead of it is sent by
  the caller's thread instead, saving a thread wake-up); the receiver completes the initiator's parts from
  STATUS and READ_RESPONSE frames (a read's bytes are received straight into the local region).

Initiator side: the caller's thread checks, queues the frames and returns (MORI's calls are asynchronous);
the connection's threads send them and complete the parts. A connection that fails (peer gone, reset, protocol error, no answer within
``io_timeout_ms`` while parts are outstanding) fails all its outstanding parts with ``ERR_RDMA_OP`` and is
dropped; the next transfer towards that engine connects again (and raises ``RuntimeError`` if it cannot),
as building a new session does in MORI.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..driver import DriverError
from .configs import TcpBackendConfig
from .descriptors import MemoryDesc
from .enums import StatusCode
from .gpu import CallerEvent, EventPool, caller_stream_busy
from .log import LOGGER
from .regions import Region
from .tcp_frames import (CAP_NOTIFY, STATUS_SUCCESS, CloseFrame, ErrorFrame, FrameError, FrameLimits, FrameType,
                         HelloFrame, MemoryInfoFrame, MemoryQueryFrame, NotifyFrame, ReadRequestFrame, ReadResponseFrame, Segment,
                         StatusFrame, WriteFrame)  # fmt: skip
from .tcp_socket import FrameTimeoutError, keep_io_timeout, recv_frame, send_frame
from .tcp_staging import Staging

# Complete = callback(code, message) run once per part, from the receiver thread or the caller's.
Complete = Callable[[StatusCode, str], None]
_MAX_SEGMENTS = 1024


@dataclass
class Part:
    """One frame's worth of a transfer: the remote segments and the local pieces [(offset, length), ...] of
    ``local`` they pair with, in payload order. ``after``: for GPU memory, the event recorded on the
    caller's stream at issue time that the staging copy waits for."""

    segments: list
    local: Region | None
    pieces: list
    complete: Complete
    nbytes: int = 0
    after: CallerEvent | None = None
    issued: float = 0.0  # time.monotonic() when submitted: the receive timeout counts from it

    def targets(self) -> list:
        return [(self.local, offset, length) for offset, length in self.pieces]

    def finish(self, code: StatusCode, message: str) -> None:
        """Complete the part (its caller-stream event goes back to the pool if no copy used it)."""
        if self.after is not None:
            self.after.release()
        self.complete(code, message)

    def host_views(self) -> list:
        """CPU memory: views of the local pieces."""
        return [self.local.view[offset : offset + length] for offset, length in self.pieces]


_GPU_FAILURE = (DriverError, RuntimeError, NotImplementedError, ValueError)
INLINE_SEND_BYTES = 64 << 10  # a WRITE up to this payload is sent by the caller when nothing is queued


def _status_code(value: int) -> StatusCode:
    try:
        code = StatusCode(value)
    except ValueError:
        return StatusCode.ERR_RDMA_OP
    return code if code.failed or code is StatusCode.SUCCESS else StatusCode.ERR_RDMA_OP


class _Outgoing:
    """A connection this engine opened to a remote engine: send lock, outstanding parts, receiver thread."""

    def __init__(self, backend: "TcpBackend", sock: socket.socket, peer_limits: FrameLimits, notify: bool, key: str):
        self.backend, self.sock, self.peer_limits, self.notify, self.remote_key = backend, sock, peer_limits, notify, key
        self.lock = threading.Lock()  # guards pending and dead
        self.pending: dict[int, tuple[str, Part]] = {}
        self.dead = False
        self._send_staging: Staging | None = None  # GPU memory: the sender's and the receiver's buffers
        self._recv_staging: Staging | None = None
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (frame, write part or None) to send; None ends
        # Frames leave in submission order: whoever sends holds _send_lock; _queued counts the frames put in
        # the outbox and not yet sent, so a caller sends a small frame itself only when nothing is ahead.
        self._send_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._queued = 0
        self._sender = threading.Thread(target=self._send_loop, name=f"mori-io-tcp-send-{key}", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name=f"mori-io-tcp-recv-{key}", daemon=True)
        self._sender.start()
        self._receiver.start()

    def submit(self, kind: str, part: Part) -> None:
        """Send one WRITE or READ_REQUEST; the part completes later (or now, if the connection is dead)."""
        part.issued = time.monotonic()
        with self.lock:
            if self.dead:
                dead = True
            else:
                dead = False
                request_id = next(self._ids)
                self.pending[request_id] = (kind, part)
        if dead:
            part.finish(StatusCode.ERR_RDMA_OP, f"TCP connection to engine {self.remote_key!r} is closed")
            return
        segments = tuple(part.segments)
        if kind == "write":
            small = part.nbytes <= INLINE_SEND_BYTES and not part.local.on_gpu
            self._enqueue((WriteFrame(request_id, segments), (request_id, part)), inline=small)
        else:
            self._enqueue((ReadRequestFrame(request_id, segments), None), inline=True)

    def _enqueue(self, item, inline: bool = False) -> None:
        """Send ``item`` from this thread if it is small (``inline``) and no frame is ahead of it (saves the
        sender thread's wake-up); otherwise queue it for the sender thread. An inline send blocks only when
        the peer stopped reading and the socket's buffer is full, then at most ``io_timeout_ms``."""
        if inline and self._send_lock.acquire(blocking=False):
            try:
                with self._count_lock:
                    idle = self._queued == 0
                if idle:
                    if not self.dead:
                        self._send(item)
                    return
            finally:
                self._send_lock.release()
        with self._count_lock:
            self._queued += 1
        self._outbox.put(item)

    def _staging(self, which: str) -> Staging:
        staging = getattr(self, which)
        if staging is None:
            staging = Staging(self.backend.gpu_context, self.peer_limits.max_payload)
            setattr(self, which, staging)
        return staging

    def _payload(self, request_id: int, part: Part):
        """The views a WRITE sends: the local bytes, or their staged copy for GPU memory (None if staging
        failed: the part is then failed and dropped)."""
        if not part.local.on_gpu:
            return part.host_views()
        try:
            return self._staging("_send_staging").gather(part.targets(), part.after)
        except _GPU_FAILURE as exc:
            with self.lock:
                self.pending.pop(request_id, None)
            part.finish(StatusCode.ERR_GPU_OP, f"TCP: staging GPU memory for sending failed: {exc}")
            return None

    def _send_loop(self) -> None:
        """The connection's only sender: frames go out in the order they were queued (a transfer's NOTIFY
        after its data), so the caller's thread never blocks on a slow peer."""
        try:
            self._send_queued()
        finally:
            _close_staging(self, "_send_staging")  # only this thread uses it (inline sends never stage)

    def _send_queued(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            with self._send_lock:
                try:
                    if not self.dead:  # else its part was failed with the connection
                        self._send(item)
                finally:
                    with self._count_lock:
                        self._queued -= 1

    def _send(self, item) -> None:
        """Send one queued item (call with ``_send_lock`` held); a failure fails the connection."""
        frame, write = item
        views = None
        if write is not None:
            views = self._payload(*write)
            if views is None:
                return
        try:
            send_frame(self.sock, frame, views, limits=self.peer_limits)  # the socket's io timeout
        except (OSError, FrameError, ValueError) as exc:
            self.fail(f"sending to engine {self.remote_key!r} failed: {exc}")

    def query_memory(self, mem_id: int, timeout: float):
        """The target's MEMORY_INFO for ``mem_id`` (RuntimeError if the connection fails or times out)."""
        answered = threading.Event()
        outcome: list = []

        def complete(code, message, info=None):
            outcome.append((code, message, info))
            answered.set()

        with self.lock:
            if self.dead:
                raise RuntimeError(f"MORI-IO TCP backend: the connection to engine {self.remote_key!r} is closed")
            request_id = next(self._ids)
            self.pending[request_id] = ("query", Part([], None, [], complete, issued=time.monotonic()))
        self._enqueue((MemoryQueryFrame(request_id, mem_id), None), inline=True)
        if not answered.wait(timeout):
            self.fail(f"engine {self.remote_key!r} did not answer a memory query within {timeout} s")
            answered.wait(1.0)
        code, message, info = outcome[0] if outcome else (StatusCode.ERR_RDMA_OP, "no answer", None)
        if info is None:
            raise RuntimeError(f"MORI-IO TCP backend: memory query to engine {self.remote_key!r} failed: {message}")
        return info

    def send_notify(self, uid: int, index: int, count: int) -> None:
        if self.notify and not self.dead:
            # Queued, never sent inline: this runs on a receiver thread, which must not block on a send
            # while the peer waits for it to read.
            self._enqueue((NotifyFrame(uid, self.backend.key, index, count), None))

    def fail(self, message: str) -> None:
        """Mark the connection dead and fail every outstanding part with ERR_RDMA_OP."""
        with self.lock:
            was_dead, self.dead = self.dead, True
            pending, self.pending = self.pending, {}
        if not was_dead:
            self._outbox.put(None)
            LOGGER.warning("MORI-IO TCP: %s", message)
            self.backend._drop(self)
            _close(self.sock)
        for _, part in pending.values():
            part.finish(StatusCode.ERR_RDMA_OP, message)

    def close(self) -> None:
        """Send CLOSE after the frames already queued (waiting up to a second), then fail what is left."""
        if not self.dead:
            self._enqueue((CloseFrame(), None))
        self._outbox.put(None)
        self._sender.join(1.0)
        self.fail(f"connection to engine {self.remote_key!r} closed by this engine")
        self._receiver.join(1.0)  # each thread frees its own staging buffer when it ends

    def _into(self, frame, length: int):
        if frame.type is not FrameType.READ_RESPONSE:
            raise FrameError("frame.type", f"{frame.type.name} is not an answer an initiator accepts")
        with self.lock:
            entry = self.pending.get(frame.request_id)
        if entry is None or entry[0] != "read" or entry[1].nbytes != length:
            raise FrameError("read_response.payload", f"{length} bytes for request {frame.request_id}, which is "
                                                      "not an outstanding read of that size")  # fmt: skip
        part = entry[1]
        if part.local.on_gpu:
            return self._staging("_recv_staging").landing([n for _, n in part.pieces])
        return part.host_views()

    def _receive_loop(self) -> None:
        timeout = self.backend.io_timeout
        try:
            while True:
                try:
                    frame = recv_frame(self.sock, self.backend.own_limits, self._into)
                except FrameTimeoutError as exc:
                    # A receive that times out at a frame boundary started before the requests now
                    # outstanding may have: each gets io_timeout from its own submission (so at most
                    # twice that in all) before the connection is given up.
                    with self.lock:
                        oldest = min((part.issued for _, part in self.pending.values()), default=None)
                    if exc.at_boundary and (oldest is None or time.monotonic() - oldest < timeout):
                        continue
                    raise
                if frame is None:
                    raise ConnectionError("the peer closed the connection")
                if frame.type in (FrameType.STATUS, FrameType.READ_RESPONSE, FrameType.MEMORY_INFO):
                    with self.lock:
                        entry = self.pending.pop(frame.request_id, None)
                    expected = {FrameType.STATUS: "write", FrameType.READ_RESPONSE: "read",
                                FrameType.MEMORY_INFO: "query"}[frame.type]  # fmt: skip
                    if entry is None or entry[0] != expected:
                        raise FrameError("request_id", f"{frame.request_id} answers no outstanding {expected} "
                                                       f"request with a {frame.type.name}")  # fmt: skip
                    if frame.type is FrameType.MEMORY_INFO:
                        entry[1].complete(StatusCode.SUCCESS, "", frame)
                        continue
                    code = _status_code(frame.status)
                    part = entry[1]
                    if frame.type is FrameType.READ_RESPONSE and not code.failed and part.local.on_gpu:
                        try:
                            self._staging("_recv_staging").scatter(part.targets(), part.after)
                        except _GPU_FAILURE as exc:
                            part.finish(StatusCode.ERR_GPU_OP, f"TCP: copying received bytes to the GPU failed: {exc}")
                            continue
                    part.finish(code, frame.message if code.failed else "")
                elif frame.type is FrameType.ERROR:
                    raise ConnectionError(f"the peer reported an error: {frame.message}")
                elif frame.type is FrameType.CLOSE:
                    raise ConnectionError("the peer closed the connection")
                else:
                    raise FrameError("frame.type", f"{frame.type.name} is not an answer an initiator accepts")
        except (OSError, FrameError, ValueError) as exc:
            self.fail(f"connection to engine {self.remote_key!r} failed: {exc}")
        finally:
            _close_staging(self, "_recv_staging")


class TcpBackend:
    """The TCP transport of one engine (see the module docstring). ``regions`` is the engine's registry
    (mem_id -> Region), read under ``regions_lock``."""

    def __init__(self, key: str, host: str, port: int, config: TcpBackendConfig, regions: dict,
                 regions_lock: threading.Lock, gpu_context=None):  # fmt: skip
        self.key, self.config = key, config
        self.regions, self.regions_lock = regions, regions_lock
        self.gpu_context = gpu_context or _no_gpu  # () -> (driver, devices): GPU memory only
        self._events: EventPool | None = None
        self.own_limits = FrameLimits(max_payload=config.max_frame_payload, max_segments=_MAX_SEGMENTS)
        self.io_timeout = config.io_timeout_ms / 1000 if config.io_timeout_ms else None
        self.remotes: dict[str, object] = {}  # key -> EngineDesc
        self.connections: dict[str, list[_Outgoing]] = {}
        # Target side, per (initiator key, uid): the NOTIFY part indices seen and the part count announced.
        # Never freed, as MORI's (a pop is a peek).
        self.inbound: dict[tuple[str, int], set] = {}
        self.inbound_counts: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self._connect_lock = threading.Lock()  # one thread builds the connections to a remote at a time
        self.closed = False
        self._accepted: list[socket.socket] = []
        self._servers: list[threading.Thread] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host or "0.0.0.0", port))
        except OSError as exc:
            self.listener.close()
            raise RuntimeError(f"MORI-IO TCP backend: cannot listen on {host or '0.0.0.0'}:{port}: {exc}") from None
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"mori-io-tcp-listen-{key}", daemon=True)
        self._accept_thread.start()

    # ---- remote engines ----

    def register_remote_engine(self, desc) -> None:
        with self.lock:
            self.remotes[desc.key] = desc

    def deregister_remote_engine(self, desc) -> None:
        with self.lock:
            self.remotes.pop(desc.key, None)
            connections = self.connections.pop(desc.key, [])
        for conn in connections:
            conn.close()

    def can_handle(self, local: MemoryDesc, remote: MemoryDesc) -> bool:
        """Any memory of a registered remote engine that listens (MORI's RDMA rule; port 1 = no listener)."""
        with self.lock:
            desc = self.remotes.get(remote.engine_key)
        return desc is not None and desc.port != 1

    def annotate_memory(self, desc: MemoryDesc, region: Region) -> MemoryDesc:
        return desc  # the target looks regions up by id: nothing to add

    def forget_memory(self, mem_id: int) -> None:
        """Nothing cached per memory: the target reads the engine's registry for every frame."""

    def prepare_session(self, local: MemoryDesc, remote: MemoryDesc) -> bool:
        self.check_remote_memory(remote.engine_key, remote.id, remote.size)
        return True

    def connections_to(self, remote_key: str) -> list[_Outgoing]:
        """The live connections to ``remote_key``, connecting (RuntimeError on failure) where needed."""
        with self.lock:
            live = [c for c in self.connections.get(remote_key, []) if not c.dead]
        if len(live) == self.config.num_connections:
            return live  # the caller's own list: _drop edits the backend's
        with self._connect_lock:
            with self.lock:
                desc = self.remotes.get(remote_key)
                live = [c for c in self.connections.get(remote_key, []) if not c.dead]
            if desc is None:
                raise RuntimeError(f"MORI-IO TCP backend: engine {remote_key!r} is not registered")
            made = []
            try:
                while len(live) + len(made) < self.config.num_connections:
                    made.append(self._connect(desc))
            except RuntimeError:
                for conn in made:  # a partial set is not kept: close what this attempt opened
                    conn.close()
                raise
            live += made
            with self.lock:
                self.connections[remote_key] = list(live)
        return live

    def _connect(self, desc) -> _Outgoing:
        host = desc.host or "127.0.0.1"
        timeout = self.config.connect_timeout_ms / 1000
        try:
            sock = socket.create_connection((host, desc.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            caps = CAP_NOTIFY if self.config.enable_notification else 0
            send_frame(sock, HelloFrame(self.key, desc.key, self.own_limits.max_payload, _MAX_SEGMENTS, caps),
                       timeout=timeout)  # fmt: skip
            reply = recv_frame(sock, self.own_limits, timeout=timeout)
        except (OSError, FrameError) as exc:
            raise RuntimeError(f"MORI-IO TCP backend: cannot connect to engine {desc.key!r} at {host}:{desc.port}: "
                               f"{exc}") from None  # fmt: skip
        if reply is None or reply.type is not FrameType.HELLO or not reply.reply or reply.sender_key != desc.key:
            _close(sock)
            why = getattr(reply, "message", None) or f"unexpected answer {reply!r}"
            raise RuntimeError(f"MORI-IO TCP backend: engine {desc.key!r} at {host}:{desc.port} refused the "
                               f"connection: {why}")  # fmt: skip
        keep_io_timeout(sock, self.io_timeout)  # the sender's and the receiver's calls then set nothing
        notify = bool(caps & reply.capabilities & CAP_NOTIFY)
        return _Outgoing(self, sock, self.own_limits.for_peer(reply), notify, desc.key)

    def _drop(self, conn: _Outgoing) -> None:
        with self.lock:
            conns = self.connections.get(conn.remote_key)
            if conns and conn in conns:
                conns.remove(conn)

    def check_remote_memory(self, remote_key: str, mem_id: int, size: int) -> None:
        """MORI's AskMemoryRegion at session build: RuntimeError unless the target has region ``mem_id`` of
        at least ``size`` bytes registered."""
        conn = self.connections_to(remote_key)[0]
        info = conn.query_memory(mem_id, self.config.connect_timeout_ms / 1000)
        if not info.found or info.size < size:
            found = f"{info.size} bytes" if info.found else "not registered"
            raise RuntimeError(f"MORI-IO TCP backend: remote memory {mem_id} of engine {remote_key!r} is {found}; "
                               f"the descriptor says {size} bytes (remote MR size mismatch)")  # fmt: skip

    # ---- transfers (initiator side) ----

    def transfer(self, kind: str, local: Region, remote: MemoryDesc, runs: Sequence, uid: int, status) -> None:
        """Issue ``runs`` = [(remote_offset, [(local_offset, length), ...]), ...] (remote-contiguous runs) as
        frames over the connections; the status gets the transfer's outcome (first error wins)."""
        conns = self.connections_to(remote.engine_key)
        limits = conns[0].peer_limits
        parts = _frames(runs, remote.id, limits.max_payload, limits.max_segments)
        if not parts:
            status.Update(StatusCode.SUCCESS, "")
            return
        afters = [None] * len(parts)
        if local.on_gpu:
            try:
                for i in range(len(parts)):
                    afters[i] = self._caller_event(local.device)
            except _GPU_FAILURE as exc:
                for after in afters:
                    if after is not None:
                        after.release()
                status.Update(StatusCode.ERR_GPU_OP, f"TCP: ordering after the caller's stream failed: {exc}")
                return
        assignment = [conns[(uid + i) % len(conns)] for i in range(len(parts))]
        used = list(dict.fromkeys(assignment))

        def finished(code: StatusCode, message: str) -> None:
            # The notices go out once every part is placed: a failed transfer is not notified (as RDMA,
            # where the notice SEND of a QP in error is flushed).
            if not code.failed:
                for index, conn in enumerate(used):
                    conn.send_notify(uid, index, len(used))
            status.Update(code, message)

        state = _Aggregate(len(parts), finished)
        for (segments, pieces, nbytes), after, conn in zip(parts, afters, assignment):
            conn.submit(kind, Part(segments, local, pieces, state.part_done, nbytes, after))

    def _caller_event(self, device: int) -> CallerEvent | None:
        """An event recorded now on the caller's current stream of ``device``, or None when that stream
        has nothing left to run."""
        driver, _ = self.gpu_context()
        caller = caller_stream_busy(driver, device)
        if caller is None:
            return None
        with self.lock:
            if self._events is None:
                self._events = EventPool(driver)
            events = self._events
        with driver.using_device(device):
            event = events.take(device)
            try:
                driver.event_record(event, caller)
            except BaseException:
                events.give(device, event)
                raise
        return CallerEvent(events, device, event)

    # ---- target side ----

    def pop_inbound(self, remote_key: str, uid: int) -> bool:
        """Whether every notified part of transfer ``uid`` from ``remote_key`` arrived (a peek, as MORI's)."""
        with self.lock:
            count = self.inbound_counts.get((remote_key, uid))
            return count is not None and len(self.inbound.get((remote_key, uid), ())) >= count

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.closed:
                    _close(sock)
                    return
                self._accepted.append(sock)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_io_timeout(sock, self.io_timeout)  # sends to a stalled peer fail too, after io_timeout_ms
            server = threading.Thread(target=self._serve, args=(sock,), name=f"mori-io-tcp-serve-{self.key}",
                                      daemon=True)  # fmt: skip
            with self.lock:
                self._servers = [t for t in self._servers if t.is_alive()] + [server]
            server.start()

    def _lookup(self, segment: Segment, held: list, sock):
        """The bytes a segment names: a view of CPU memory, a (region, offset, length) target of GPU memory,
        or the reason (str) it names none. The region is held (appended to ``held``) until ``_release``:
        ``deregister_memory`` waits for it, so no byte lands after that returns."""
        with self.regions_lock:
            region = self.regions.get(segment.mem_id)
            if region is None:
                return f"memory {segment.mem_id} is not registered on engine {self.key!r}"
            if not region.contains(segment.offset, segment.length):
                return (f"[{segment.offset}, {segment.offset + segment.length}) is outside memory {segment.mem_id} "
                        f"of {region.size} bytes on engine {self.key!r}")  # fmt: skip
            region.hold(sock)
            held.append(region)
        if region.on_gpu:
            return (region, segment.offset, segment.length)
        return region.slice(segment.offset, segment.length)

    def _check(self, segments, held: list, sock) -> tuple[list, str]:
        found_all = []
        for segment in segments:
            found = self._lookup(segment, held, sock)
            if isinstance(found, str):
                return [], found
            found_all.append(found)
        return found_all, ""

    def _release(self, held: list, sock) -> None:
        """End a frame's use of the regions it named (and wake a ``deregister_memory`` waiting for them)."""
        if held:
            with self.regions_lock:
                for region in held:
                    region.unhold(sock)
                self.regions_lock.notify_all()
            held.clear()

    def _serve(self, sock: socket.socket) -> None:
        try:
            hello = recv_frame(sock, self.own_limits, timeout=self.config.connect_timeout_ms / 1000)
            if hello is None or hello.type is not FrameType.HELLO or hello.reply:
                return
            if hello.receiver_key != self.key:
                send_frame(sock, ErrorFrame(0, StatusCode.ERR_INVALID_ARGS,
                                            f"this is engine {self.key!r}, not {hello.receiver_key!r}"))  # fmt: skip
                return
            caps = CAP_NOTIFY if self.config.enable_notification else 0
            send_frame(sock, HelloFrame(self.key, hello.sender_key, self.own_limits.max_payload, _MAX_SEGMENTS,
                                        caps, reply=True))  # fmt: skip
            peer_limits = self.own_limits.for_peer(hello)
            refused = ["", StatusCode.ERR_INVALID_ARGS]  # why the WRITE being received is dropped, and its code
            staging = Staging(self.gpu_context, self.own_limits.max_payload)  # GPU memory only, made on first use
            landed: list = []  # the GPU targets of the WRITE being received
            held: list = []  # the regions the frame being served uses (released once it is answered)

            def into(frame, length):
                if frame.type is not FrameType.WRITE:
                    raise FrameError("frame.type", f"{frame.type.name} is not a request a target serves")
                found, refused[0] = self._check(frame.segments, held, sock)
                refused[1] = StatusCode.ERR_INVALID_ARGS
                if refused[0]:
                    return None
                try:
                    return _host_views(found, staging, landed)
                except _GPU_FAILURE as exc:  # no staging buffer: drop the payload, answer the error
                    landed.clear()
                    refused[0], refused[1] = f"staging for GPU memory failed: {exc}", StatusCode.ERR_GPU_OP
                    return None

            while True:
                try:  # an idle connection may stay idle; one stalled inside a frame is dropped after io_timeout
                    frame = recv_frame(sock, self.own_limits, into)  # the socket's io timeout
                except FrameTimeoutError as exc:
                    if exc.at_boundary:
                        continue
                    LOGGER.warning("MORI-IO TCP engine %r: %s; closing the connection", self.key, exc)
                    return
                if frame is None or frame.type is FrameType.CLOSE:
                    return
                if frame.type is FrameType.WRITE:
                    bad, refused[0] = refused[0], ""
                    code = refused[1] if bad else STATUS_SUCCESS
                    if landed and not bad:
                        code, bad = _place(staging, landed)
                    landed.clear()
                    self._release(held, sock)  # every byte is placed
                    send_frame(sock, StatusFrame(frame.request_id, code, bad), limits=peer_limits)
                elif frame.type is FrameType.READ_REQUEST:
                    found, bad = self._check(frame.segments, held, sock)
                    code, views = StatusCode.ERR_INVALID_ARGS, None
                    if not bad:
                        code, views, bad = _read_views(found, staging)
                    if bad:
                        send_frame(sock, ReadResponseFrame(frame.request_id, code, bad), limits=peer_limits)
                    else:
                        send_frame(sock, ReadResponseFrame(frame.request_id), views, limits=peer_limits)
                    del views, found
                    self._release(held, sock)  # every byte is sent
                elif frame.type is FrameType.NOTIFY:
                    if frame.initiator_key != hello.sender_key:
                        raise FrameError("notify.initiator_key", f"{frame.initiator_key!r} on a connection of "
                                                                 f"{hello.sender_key!r}")  # fmt: skip
                    if caps:
                        entry = (frame.initiator_key, frame.transfer_uid)
                        with self.lock:
                            self.inbound.setdefault(entry, set()).add(frame.part_index)
                            self.inbound_counts[entry] = frame.part_count
                elif frame.type is FrameType.MEMORY_QUERY:
                    with self.regions_lock:
                        region = self.regions.get(frame.mem_id)
                    size = region.size if region is not None else 0
                    send_frame(sock, MemoryInfoFrame(frame.request_id, frame.mem_id, region is not None, size),
                               limits=peer_limits)  # fmt: skip
                else:
                    raise FrameError("frame.type", f"{frame.type.name} is not a request a target serves")
        except (FrameError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, FrameError) else str(exc)
            try:
                send_frame(sock, ErrorFrame(0, StatusCode.ERR_INVALID_ARGS, reason[:1000]), timeout=1.0)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            if "held" in locals():
                self._release(held, sock)
            with self.lock:
                if sock in self._accepted:
                    self._accepted.remove(sock)
            _close(sock)
            if "staging" in locals():
                staging.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            connections = [c for conns in self.connections.values() for c in conns]
            self.connections.clear()
            accepted = list(self._accepted)
            servers = list(self._servers)
        _close(self.listener)
        for conn in connections:
            conn.close()
        for sock in accepted:
            _close(sock)
        # Wait (briefly) for the threads to end: a daemon thread still running when the interpreter
        # finalizes can abort the process ("terminate called without an active exception").
        deadline = time.monotonic() + 2.0
        for thread in (self._accept_thread, *servers):
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._events is not None:
            self._events.close()


class _Aggregate:
    """Counts a transfer's parts; the first error is reported at once, success once all parts succeeded."""

    def __init__(self, count: int, complete: Complete):
        self.left, self.complete, self.failed = count, complete, False
        self.lock = threading.Lock()

    def part_done(self, code: StatusCode, message: str) -> None:
        with self.lock:
            self.left -= 1
            report = (code.failed and not self.failed) or (self.left == 0 and not self.failed)
            self.failed = self.failed or code.failed
        if report:
            self.complete(code, message)


def _frames(runs, mem_id: int, max_payload: int, max_segments: int) -> list:
    """Cut remote-contiguous runs into frames of at most ``max_payload`` bytes and ``max_segments`` segments:
    [(segments, local pieces [(offset, length), ...], bytes), ...]."""
    frames, segments, pieces, nbytes = [], [], [], 0

    def flush():
        nonlocal segments, pieces, nbytes
        if segments:
            frames.append((segments, pieces, nbytes))
        segments, pieces, nbytes = [], [], 0

    for remote_offset, run_pieces in runs:
        for local_offset, length in run_pieces:
            while length:
                if nbytes == max_payload or len(segments) == max_segments:
                    flush()
                step = min(length, max_payload - nbytes)
                last = segments[-1] if segments else None
                if last is not None and last.offset + last.length == remote_offset:
                    segments[-1] = Segment(mem_id, last.offset, last.length + step)
                else:
                    segments.append(Segment(mem_id, remote_offset, step))
                pieces.append((local_offset, step))
                nbytes += step
                remote_offset += step
                local_offset += step
                length -= step
    flush()
    return frames


def _host_views(found: list, staging: Staging, landed: list) -> list:
    """Where a WRITE's payload lands: CPU views as they are, GPU targets in the staging buffer (recorded in
    ``landed`` for ``_place``)."""
    gpu = [f for f in found if isinstance(f, tuple)]
    slots = iter(staging.landing([length for _, _, length in gpu])) if gpu else iter(())
    landed.extend(gpu)
    return [next(slots) if isinstance(f, tuple) else f for f in found]


def _place(staging: Staging, landed: list) -> tuple[StatusCode, str]:
    """Copy a received WRITE's GPU targets from the staging buffer into GPU memory (done on return)."""
    try:
        staging.scatter(landed)
    except _GPU_FAILURE as exc:
        return StatusCode.ERR_GPU_OP, f"copying the received bytes into GPU memory failed: {exc}"
    return STATUS_SUCCESS, ""


def _read_views(found: list, staging: Staging) -> tuple[StatusCode, list | None, str]:
    """The views a READ_RESPONSE sends: CPU views as they are, GPU targets copied into the staging buffer;
    or the error code and reason."""
    gpu = [f for f in found if isinstance(f, tuple)]
    if not gpu:
        return STATUS_SUCCESS, found, ""
    try:
        slots = iter(staging.gather(gpu))
    except _GPU_FAILURE as exc:
        return StatusCode.ERR_GPU_OP, None, f"copying GPU memory for the answer failed: {exc}"
    return STATUS_SUCCESS, [next(slots) if isinstance(f, tuple) else f for f in found], ""


def _close_staging(conn: "_Outgoing", which: str) -> None:
    staging = getattr(conn, which)
    if staging is not None:
        setattr(conn, which, None)
        staging.close()


def _no_gpu():
    raise RuntimeError("MORI-IO TCP backend: this engine has no GPU runtime for GPU memory")


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
