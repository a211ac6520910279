"""Blocking frame I/O over a socket for the TCP backend: ``send_frame`` and ``recv_frame`` (standard library).

``send_frame`` writes the head of a frame and its payload buffers in one ``sendmsg`` (no copy of the
payload). ``recv_frame`` reads the head through ``tcp_frames.read_head`` (all bounds checked first), then
receives the payload into memory the caller picks after seeing the validated head: the ``into`` callback
returns writable views, and exactly those views are written (the contract of tcp_frames' docstring: the
callback checks every segment against its registered region before returning views over it).

Errors: a frame that breaks the protocol is ``FrameError``; a socket timeout is ``FrameTimeoutError``
(a TimeoutError); end of stream inside a frame is ``FrameTruncatedError`` (a ConnectionError) naming the
missing bytes. After any of them, or any exception from ``into``, the stream position is unknown: close
the connection (the one exception is a receive timeout with ``at_boundary`` true, where nothing of a
frame was consumed). One thread sends on a socket at a time, and one receives.
"""

from __future__ import annotations

import socket
import struct
import weakref
from dataclasses import replace
from typing import Callable, Sequence

from .tcp_frames import DEFAULT_LIMITS, HEADER_SIZE, PAYLOAD_TYPES, Frame, FrameLimits, encode_head, read_head

# Buffers per sendmsg call (Linux IOV_MAX is 1024) and the scratch size used to drain a refused payload.
_MAX_IOV = 512
_DRAIN_CHUNK = 1 << 20


class FrameTimeoutError(TimeoutError):
    """A socket send or receive timed out; ``done`` bytes of the frame had moved (0 = at a boundary)."""

    def __init__(self, action: str, timeout, done: int, expected: int | None):
        self.action, self.timeout, self.done, self.expected = action, timeout, done, expected
        of = f"{expected}" if expected is not None else "at least 24"
        super().__init__(f"MORI-IO TCP {action} timed out after {timeout} s with {done} of {of} bytes "
                         "of a frame transferred")  # fmt: skip

    @property
    def at_boundary(self) -> bool:
        return self.done == 0


class FrameTruncatedError(ConnectionError):
    """The peer closed the stream inside a frame: ``missing`` of its ``expected`` bytes never came."""

    def __init__(self, received: int, expected: int, known: bool):
        self.received, self.expected, self.missing = received, expected, expected - received
        at_least = "" if known else "at least "
        super().__init__(f"MORI-IO TCP peer closed the connection inside a frame: {at_least}{self.missing} "
                         f"bytes missing (received {received} of {at_least}{expected})")  # fmt: skip


def _byte_view(buffer, writable: bool) -> memoryview:
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise ValueError("payload buffers must be contiguous")
    if writable and view.readonly:
        raise ValueError("recv_frame: 'into' returned a read-only buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


_KERNEL_TIMEOUTS: "weakref.WeakKeyDictionary[socket.socket, float | None]" = weakref.WeakKeyDictionary()


def keep_io_timeout(sock: socket.socket, seconds: float | None) -> None:
    """Make ``sock`` blocking with the kernel's receive and send timeouts (``SO_RCVTIMEO``/``SO_SNDTIMEO``)
    at ``seconds`` (None: no limit), for the calls that then pass ``timeout=None``. Cheaper than Python's
    socket timeouts, which poll before every receive: one system call per chunk instead of two."""
    sock.settimeout(None)
    whole = int(seconds) if seconds else 0
    micro = int(round(((seconds or 0) - whole) * 1_000_000))
    timeval = struct.pack("@ll", whole, micro)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    _KERNEL_TIMEOUTS[sock] = seconds


class _Timeout:
    """Set a socket's timeout for the duration of one call and put the old one back (no system call when
    it already has that timeout: two threads, a sender and a receiver, share one socket)."""

    def __init__(self, sock, timeout):
        self.sock, self.timeout = sock, timeout

    def __enter__(self):
        self.old = self.sock.gettimeout()
        if self.timeout is not None:
            if self.timeout <= 0:
                raise ValueError(f"timeout must be positive seconds or None, got {self.timeout!r}")
            if self.timeout != self.old:  # usually equal: the backend keeps its sockets' timeout
                self.sock.settimeout(self.timeout)
        elif self.old == 0.0:
            raise ValueError("send_frame/recv_frame need a blocking socket (timeout None or > 0), "
                             "got a non-blocking one")  # fmt: skip
        effective = self.sock.gettimeout()
        return _KERNEL_TIMEOUTS.get(self.sock) if effective is None else effective

    def __exit__(self, *exc):
        if self.sock.gettimeout() != self.old:
            self.sock.settimeout(self.old)


def send_frame(sock: socket.socket, frame: Frame, payload_views: Sequence | None = None, *,
               limits: FrameLimits = DEFAULT_LIMITS, timeout: float | None = None) -> int:  # fmt: skip
    """Send ``frame``; its payload is ``payload_views`` (buffers sent in order, not copied) or, when that is
    None, ``frame.payload``. Returns the bytes sent. ``limits`` are the peer's (``own.for_peer(hello)``);
    ``timeout`` is the inactivity limit of each socket call (None: the socket's own)."""
    if payload_views is None:
        views = [_byte_view(frame.payload, False)] if frame.type in PAYLOAD_TYPES else []
    else:
        if frame.type not in PAYLOAD_TYPES:
            raise ValueError(f"send_frame: {frame.type.name} frames carry no payload, got payload_views")
        if len(memoryview(frame.payload)):
            raise ValueError("send_frame: give the payload either in frame.payload or in payload_views, not both")
        views = [_byte_view(v, False) for v in payload_views]
    views = [v for v in views if v.nbytes]
    head = encode_head(frame, sum(v.nbytes for v in views) if frame.type in PAYLOAD_TYPES else None, limits)
    pending = [memoryview(head), *views]
    total = sum(v.nbytes for v in pending)
    sent = 0
    with _Timeout(sock, timeout) as effective:
        try:
            while pending:
                if hasattr(sock, "sendmsg"):
                    n = sock.sendmsg(pending[:_MAX_IOV])
                else:  # pragma: no cover (platforms without sendmsg)
                    n = sock.send(pending[0])
                sent += n
                while pending and n >= pending[0].nbytes:
                    n -= pending.pop(0).nbytes
                if n:
                    pending[0] = pending[0][n:]
        except (TimeoutError, BlockingIOError) as e:  # BlockingIOError: the kernel's SO_SNDTIMEO
            raise FrameTimeoutError("send", effective, sent, total) from e
    return sent


Into = Callable[[Frame, int], "Sequence | None"]


def recv_frame(sock: socket.socket, limits: FrameLimits = DEFAULT_LIMITS, into: Into | None = None, *,
               timeout: float | None = None):  # fmt: skip
    """The next frame from ``sock``, or None if the peer closed the stream at a frame boundary.

    Without ``into``, the payload is received into a new bytearray of the declared (bounded) length, which
    becomes ``frame.payload``. With ``into``, ``into(frame, payload_length)`` is called once the head is
    validated and before any payload byte is read, for frames with a non-empty payload (``frame`` without
    its payload; for a WRITE the length is the sum of its segments, for a READ_RESPONSE the initiator
    compares it with what it asked for). It returns writable buffers whose sizes add up to
    ``payload_length`` (they are filled in order, and nothing else is written), or None to drain and drop
    the payload (the stream stays usable, e.g. to answer an out-of-bounds WRITE with an error status). The
    returned frame's payload is then empty. ``timeout``: inactivity limit of each socket call.
    """
    with _Timeout(sock, timeout) as effective:
        reader = _Reader(sock, effective)
        steps = read_head(limits)
        need = next(steps)
        try:
            while True:
                raw = reader.exactly(need)
                if raw is None:
                    return None
                need = steps.send(raw)
        except StopIteration as done:
            frame, payload_length = done.value
        reader.expected = reader.received + payload_length
        if frame.type not in PAYLOAD_TYPES or not payload_length:
            return frame
        if into is None:
            payload = bytearray(payload_length)
            reader.fill(memoryview(payload))
            return replace(frame, payload=payload)
        views = into(frame, payload_length)
        if views is None:
            reader.drain(payload_length)
            return frame
        views = [_byte_view(v, True) for v in views]
        if sum(v.nbytes for v in views) != payload_length:
            raise ValueError(f"recv_frame: 'into' returned {sum(v.nbytes for v in views)} bytes of buffers for a "
                             f"payload of {payload_length}")  # fmt: skip
        for view in views:
            reader.fill(view)
        return frame


class _Reader:
    """Exact-size receives of one frame, counting bytes for the errors."""

    def __init__(self, sock, timeout):
        self.sock, self.timeout = sock, timeout
        self.received = 0
        self.expected: int | None = None  # known once the head is parsed

    def exactly(self, n: int) -> bytes | None:
        buffer = bytearray(n)
        if not self.fill(memoryview(buffer), eof_ok=self.received == 0):
            return None
        if self.received == HEADER_SIZE and self.expected is None:
            self.expected = HEADER_SIZE + int.from_bytes(buffer[16:24], "little")
        return bytes(buffer)

    def fill(self, view: memoryview, eof_ok: bool = False) -> bool:
        """Fill ``view`` from the socket; False on end of stream before its first byte if ``eof_ok``."""
        pos = 0
        while pos < view.nbytes:
            try:
                n = self.sock.recv_into(view[pos:])
            except (TimeoutError, BlockingIOError) as e:  # BlockingIOError: the kernel's SO_RCVTIMEO
                raise FrameTimeoutError("receive", self.timeout, self.received, self.expected) from e
            if n == 0:
                if eof_ok and pos == 0:
                    return False
                known = self.expected is not None
                raise FrameTruncatedError(self.received, self.expected if known else HEADER_SIZE, known)
            pos += n
            self.received += n
        return True

    def drain(self, n: int):
        scratch = memoryview(bytearray(min(n, _DRAIN_CHUNK)))
        while n:
            step = min(n, scratch.nbytes)
            self.fill(scratch[:step])
            n -= step
