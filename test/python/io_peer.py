"""Child-process peers for test_io_transfers.py: a MORI-IO engine driven over a multiprocessing Pipe, and raw
TCP peers that speak just enough of the frame protocol to misbehave in one chosen way.

Both are the ``target`` of a ``spawn`` process (or, for the raw peers, a thread). A child never outlives
its test session: it leaves its command loop when the parent's end of the Pipe closes (the parent died or
dropped it), and a watchdog thread ends it after ``LIFETIME_S`` whatever happens.

Memory is held in ``Slab``s: ``guard`` bytes, the registered ``size`` bytes, ``guard`` bytes, all in one
bytearray, so that a write outside the registered range lands in a guard and shows up in a dump.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import socket
import threading
import time
import traceback

LIFETIME_S = 300
POISON_SEED = 0xDEAD  # the pattern every slab is filled with before a test writes into it
GUARD_DEFAULT = 4096  # unregistered bytes on each side of a slab's registered region
_CACHED_MAX = 8 << 20  # poison patterns up to this size are kept (the 64 MiB one is not)


@functools.lru_cache(maxsize=8)
def _cached_pattern(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def pattern(seed: int, size: int) -> bytes:
    """``size`` pseudo-random bytes, the same in every process for the same seed."""
    if seed == POISON_SEED and size <= _CACHED_MAX:
        return _cached_pattern(seed, size)
    return random.Random(seed).randbytes(size)


def digest(data) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Slab:
    """A bytearray of ``guard + size + guard`` bytes whose middle ``size`` bytes get registered."""

    def __init__(self, size: int, guard: int = GUARD_DEFAULT, seed: int = POISON_SEED):
        self.size, self.guard = size, guard
        self.data = bytearray(pattern(seed, size + 2 * guard))

    @property
    def middle(self) -> memoryview:
        return memoryview(self.data)[self.guard : self.guard + self.size]

    def fill(self, seed: int) -> None:
        self.data[:] = pattern(seed, len(self.data))

    def register(self, engine):
        from mori_compiler.io import MemoryLocationType

        return engine.register_memory(self.middle, self.size, -1, MemoryLocationType.CPU)


def _watchdog() -> None:
    def expire():
        time.sleep(LIFETIME_S)
        os._exit(3)

    threading.Thread(target=expire, daemon=True).start()


# ---- an engine in a child process ----


def make_engine(key: str, backend: str, options: dict):
    """An engine on 127.0.0.1 with an ephemeral port; ``backend`` "TCP" (``options`` = TcpBackendConfig
    fields) or "RDMA" (``options`` = RdmaBackendConfig fields)."""
    from mori_compiler.io import BackendType, IOEngine, IOEngineConfig, RdmaBackendConfig, TcpBackendConfig

    engine = IOEngine(key, IOEngineConfig("127.0.0.1", 0))
    config = TcpBackendConfig(**options) if backend == "TCP" else RdmaBackendConfig(**options)
    engine.create_backend(BackendType[backend], config)
    return engine


class _EnginePeer:
    """The commands a parent sends to ``engine_peer`` (each answers ``("ok", value)`` or ``("error", text)``)."""

    def __init__(self, key: str, backend: str, options: dict):
        self.engine = make_engine(key, backend, options)
        self.slabs: dict[str, Slab] = {}
        self.descs: dict = {}

    def desc(self):
        return self.engine.get_engine_desc().pack()

    def alloc(self, name: str, size: int):
        self.slabs[name] = Slab(size)
        self.descs[name] = self.slabs[name].register(self.engine)
        return self.descs[name].pack()

    def free(self, name: str):
        self.engine.deregister_memory(self.descs.pop(name))
        del self.slabs[name]

    def fill(self, name: str, seed: int):
        self.slabs[name].fill(seed)

    def dump(self, name: str):
        return bytes(self.slabs[name].data)

    def digests(self, name: str, cuts: list):
        """Digests of the slab's pieces between the given cut points (0 and the end are implied)."""
        data = memoryview(self.slabs[name].data)
        points = [0, *cuts, len(data)]
        return [digest(data[a:b]) for a, b in zip(points, points[1:])]

    def deregister(self, name: str):
        """Deregister the slab but keep it, so that a dump still shows whether anything wrote into it."""
        self.engine.deregister_memory(self.descs.pop(name))

    def register_remote(self, packed: bytes):
        from mori_compiler.io import EngineDesc

        self.engine.register_remote_engine(EngineDesc.unpack(packed))

    def pop(self, key: str, uid: int):
        return self.engine.pop_inbound_transfer_status(key, uid) is not None

    def transfers(self, specs: list, wait_ms: int):
        """Issue every spec first, then wait for all: spec = (op, local name, local offsets, packed remote
        MemoryDesc, remote offsets, sizes, uid); op "write"/"read" (one entry) or "batch_write"/"batch_read".
        Returns [(code, message), ...]."""
        from mori_compiler.io import MemoryDesc, wait_all

        statuses = []
        for op, name, l_offs, remote, r_offs, sizes, uid in specs:
            local, remote = self.descs[name], MemoryDesc.unpack(remote)
            if op in ("write", "read"):
                statuses.append(getattr(self.engine, op)(local, l_offs[0], remote, r_offs[0], sizes[0], uid))
            else:
                (status,) = getattr(self.engine, op)([local], [l_offs], [remote], [r_offs], [sizes], [uid])
                statuses.append(status)
        wait_all(statuses, wait_ms)
        return [(int(s.Code()), s.Message()) for s in statuses]

    def close_engine(self):
        self.engine.close()


def engine_peer(conn, key: str, backend: str, options: dict) -> None:
    """Run an engine in this process and serve the parent's commands until it says "exit" or goes away."""
    _watchdog()
    try:
        peer = _EnginePeer(key, backend, options)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", peer.desc()))
    while True:
        try:
            name, *args = conn.recv()
        except (EOFError, OSError):
            break
        if name == "exit":
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(peer, name)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
    peer.engine.close()


# ---- raw peers: a listener that speaks the frame protocol by hand ----


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def recv_head(sock: socket.socket):
    """The next frame's head, parsed by the codec: ``(frame, payload_length)``; its payload is still to come."""
    from mori_compiler.runtime.io.tcp_frames import read_head

    steps = read_head()
    need = next(steps)
    try:
        while True:
            need = steps.send(recv_exactly(sock, need))
    except StopIteration as done:
        return done.value


def answer_hello(sock: socket.socket, key: str):
    from mori_compiler.runtime.io.tcp_frames import CAP_NOTIFY, HelloFrame
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    hello = recv_frame(sock, timeout=30)
    send_frame(sock, HelloFrame(key, hello.sender_key, capabilities=CAP_NOTIFY, reply=True))
    return hello


def raw_peer(conn, key: str, mode: str, param: float = 0.0) -> None:
    """A listener on 127.0.0.1 that sends ``("port", port)`` and then does what ``mode`` says with every
    connection it accepts (an engine opens several):

    * ``silent``: accepts and never sends a byte (not even the HELLO answer);
    * ``hello_then_silent``: answers the HELLO, then reads and answers nothing;
    * ``hello_then_close``: answers the HELLO and closes the connection when the first request arrives;
    * ``stall_mid_write``: answers the HELLO, reads a WRITE head and ``param`` bytes of its payload, sends
      ``("half", payload_length)`` (the first connection to get there) and waits to be killed;
    * ``stall_mid_read``: answers the HELLO and a READ_REQUEST with the READ_RESPONSE head and ``param``
      payload bytes, sends ``("half", payload_length)`` (the first connection) and waits to be killed;
    * ``slow_status``: answers the HELLO, then every WRITE (its payload drained) with a SUCCESS STATUS
      ``param`` seconds after it arrived.

    It ends on the parent's "exit" or when the Pipe closes (and by the watchdog).
    """
    _watchdog()
    listener = socket.create_server(("127.0.0.1", 0))
    reported = threading.Lock()
    accepted = []

    def serve(sock):
        try:
            _misbehave(sock, key, mode, param, conn, reported)
        except (OSError, ConnectionError):
            pass

    def accept_loop():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            sock.settimeout(60)
            accepted.append(sock)
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    conn.send(("port", listener.getsockname()[1]))
    try:
        while conn.recv() != "exit":
            pass
    except (EOFError, OSError):
        pass
    listener.close()
    for sock in accepted:
        sock.close()


def _misbehave(sock, key, mode, param, conn, reported) -> None:
    from mori_compiler.runtime.io.tcp_frames import FrameType, ReadResponseFrame, StatusFrame, encode_head
    from mori_compiler.runtime.io.tcp_socket import send_frame

    if mode == "silent":
        time.sleep(LIFETIME_S)
    answer_hello(sock, key)
    if mode == "hello_then_silent":
        time.sleep(LIFETIME_S)
    elif mode == "hello_then_close":
        recv_head(sock)
        sock.close()
    elif mode in ("stall_mid_write", "stall_mid_read"):
        frame, length = recv_head(sock)
        if mode == "stall_mid_write":
            assert frame.type is FrameType.WRITE
            recv_exactly(sock, int(param))
        else:
            assert frame.type is FrameType.READ_REQUEST
            length = frame.requested_length
            sock.sendall(encode_head(ReadResponseFrame(frame.request_id), length) + bytes(int(param)))
        if reported.acquire(blocking=False):
            conn.send(("half", length))
        time.sleep(LIFETIME_S)
    elif mode == "slow_status":
        while True:
            frame, length = recv_head(sock)
            arrived = time.monotonic()
            recv_exactly(sock, length)
            if frame.type is FrameType.WRITE:
                time.sleep(max(0.0, arrived + param - time.monotonic()))
                send_frame(sock, StatusFrame(frame.request_id, 0))


def raw_initiator(conn, port: int, target_key: str, mem_id: int, offset: int, length: int, sent: int) -> None:
    """Connect to the engine listening on ``port`` as initiator "raw-initiator", send a WRITE of ``length``
    bytes at ``offset`` of region ``mem_id`` but only ``sent`` bytes of its payload (0xAB), report
    ``("half", sent)`` and wait to be killed."""
    from mori_compiler.runtime.io.tcp_frames import HelloFrame, Segment, WriteFrame, encode_head
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    _watchdog()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    send_frame(sock, HelloFrame("raw-initiator", target_key))
    recv_frame(sock, timeout=30)
    sock.sendall(encode_head(WriteFrame(1, (Segment(mem_id, offset, length),)), length) + b"\xab" * sent)
    conn.send(("half", sent))
    try:
        conn.recv()
    except (EOFError, OSError):
        pass
