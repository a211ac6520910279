"""The rendezvous a unique id carries (as MORI's socket bootstrap): multi-process shmem without torch.distributed.

``new_unique_id()`` opens a TCP listener in the calling process, which must then be rank 0 (as in MORI:
rank 0 gets the id and hands it to the others), and returns 128 bytes: a magic, a random token, and the
listener's host name and port. ``connect(unique_id, rank, nranks)`` on every rank gives the rendezvous object
shmem_comm's collectives run on (``rank``, ``world_size``, ``all_gather_object``, ``barrier``): rank 0 serves
on its listener, the other ranks connect to the address. It is a star: every rank sends its object to rank 0,
which answers each with the list, in rank order.

A peer proves it holds the id (the token) before rank 0 reads anything else from it, and connections that
do not are dropped; objects travel pickled, as torch.distributed's ``all_gather_object`` sends them. Every
wait has a deadline (``timeout``, default ``MORI_COMPILER_RENDEZVOUS_TIMEOUT`` seconds, else 300): a rank that
does not arrive is an error naming it on every rank that waits, never a hang. The host advertised is this
machine's name (``socket.gethostname()``), the listener is bound to every interface.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import threading
import time

from .shmem_errors import ShmemError, ShmemStateError

UNIQUE_ID_BYTES = 128
MAGIC = b"mori_compiler-uid2:"
TOKEN_BYTES = 16
TIMEOUT_ENV = "MORI_COMPILER_RENDEZVOUS_TIMEOUT"
DEFAULT_TIMEOUT = 300.0

_HELLO = struct.Struct("<16sii")  # token, rank, nranks
_FRAME = struct.Struct("<cQ")  # kind (b"O" object, b"E" error), payload length
_LISTENERS: dict[bytes, socket.socket] = {}  # token -> the listener of an id made in this process
_LOCK = threading.Lock()


def new_unique_id() -> bytes:
    """128 bytes: MAGIC, a random token, the port and host name of a fresh listener of this process."""
    token = secrets.token_bytes(TOKEN_BYTES)
    host = socket.gethostname().encode()[: UNIQUE_ID_BYTES - len(MAGIC) - TOKEN_BYTES - 3]
    listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=128)
    port = listener.getsockname()[1]
    with _LOCK:
        _LISTENERS[token] = listener
    uid = MAGIC + token + struct.pack("<HB", port, len(host)) + host
    return uid.ljust(UNIQUE_ID_BYTES, b"\0")


def parse_unique_id(uid: bytes) -> tuple[bytes, str, int] | None:
    """(token, host, port) of an id from new_unique_id, or None for any other 128 bytes."""
    if len(uid) != UNIQUE_ID_BYTES or not uid.startswith(MAGIC):
        return None
    at = len(MAGIC)
    token = uid[at : at + TOKEN_BYTES]
    port, n = struct.unpack_from("<HB", uid, at + TOKEN_BYTES)
    host = uid[at + TOKEN_BYTES + 3 : at + TOKEN_BYTES + 3 + n]
    try:
        return token, host.decode(), port
    except UnicodeDecodeError:
        return None


def release(uid: bytes) -> None:
    """Close the listener of ``uid`` if this process made it (an id used with torch.distributed instead)."""
    parsed = parse_unique_id(uid)
    if parsed is not None:
        with _LOCK:
            listener = _LISTENERS.pop(parsed[0], None)
        if listener is not None:
            listener.close()


def timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ShmemError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds > 0")
    return value


# ---- framing -----------------------------------------------------------------------------------------


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    data = bytearray()
    while len(data) < n:
        deadline.arm(sock)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _send_frame(sock: socket.socket, kind: bytes, payload: bytes, deadline: _Deadline) -> None:
    deadline.arm(sock)
    sock.sendall(_FRAME.pack(kind, len(payload)) + payload)


def _recv_frame(sock: socket.socket, deadline: _Deadline) -> tuple[bytes, bytes]:
    kind, n = _FRAME.unpack(_recv_exact(sock, _FRAME.size, deadline))
    return kind, _recv_exact(sock, n, deadline)


# ---- the rendezvous ----------------------------------------------------------------------------------


class UniqueIdComm:
    """shmem_comm's rendezvous object over the star of sockets a unique id names (see the module docstring)."""

    def __init__(self, rank: int, world_size: int, timeout: float):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._peers: list[socket.socket | None] = [None] * world_size  # rank 0: a socket per other rank
        self._hub: socket.socket | None = None  # the others: the socket to rank 0

    def all_gather_object(self, obj) -> list:
        deadline = _Deadline(self.timeout)
        if self.rank != 0:
            try:
                _send_frame(self._hub, b"O", pickle.dumps(obj), deadline)
                kind, payload = _recv_frame(self._hub, deadline)
            except (OSError, TimeoutError) as exc:
                raise ShmemStateError(f"shmem rendezvous: rank {self.rank} lost rank 0 ({_why(exc, self.timeout)})") from None
            if kind == b"E":
                raise ShmemStateError(payload.decode(errors="replace"))
            return pickle.loads(payload)  # noqa: S301 - from rank 0, which the id named
        out, problem = [obj] + [None] * (self.world_size - 1), None
        for q in range(1, self.world_size):
            try:
                kind, payload = _recv_frame(self._peers[q], deadline)
                out[q] = pickle.loads(payload)  # noqa: S301 - from an authenticated peer
            except (OSError, TimeoutError) as exc:
                problem = f"shmem rendezvous: rank 0 lost rank {q} ({_why(exc, self.timeout)})"
                break
        kind, payload = (b"E", problem.encode()) if problem else (b"O", pickle.dumps(out))
        for q in range(1, self.world_size):
            try:
                _send_frame(self._peers[q], kind, payload, deadline)
            except (OSError, TimeoutError):
                pass  # that rank fails on its own
        if problem:
            raise ShmemStateError(problem)
        return out

    def barrier(self) -> None:
        self.all_gather_object(None)

    def close(self) -> None:
        for sock in [self._hub, *self._peers]:
            if sock is not None:
                sock.close()
        self._hub, self._peers = None, [None] * self.world_size


def _why(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s ({TIMEOUT_ENV})"
    return f"{type(exc).__name__}: {exc}"


def connect(uid: bytes, rank: int, nranks: int, *, timeout: float | None = None) -> UniqueIdComm:
    """This rank's rendezvous over the id's address. Collective: every rank 0 .. nranks-1 must call it."""
    parsed = parse_unique_id(uid)
    if parsed is None:
        raise ShmemError("shmem_init_attr: this unique id carries no rendezvous address (it was not made by this "
                         "project's shmem_get_unique_id()); without torch.distributed every rank needs the id "
                         "rank 0 got from shmem_get_unique_id()")  # fmt: skip
    token, host, port = parsed
    timeout = timeout_from_env() if timeout is None else float(timeout)
    comm = UniqueIdComm(rank, nranks, timeout)
    deadline = _Deadline(timeout)
    try:
        if rank == 0:
            _serve(comm, token, nranks, deadline)
        else:
            _join(comm, token, host, port, rank, nranks, deadline)
    except BaseException:
        comm.close()
        raise
    return comm


def _serve(comm: UniqueIdComm, token: bytes, nranks: int, deadline: _Deadline) -> None:
    with _LOCK:
        listener = _LISTENERS.pop(token, None)
    if listener is None:
        raise ShmemStateError("shmem_init_attr: rank 0 must be the process that called shmem_get_unique_id() (the id "
                              "names its rendezvous listener); pass rank 0's id to every rank")  # fmt: skip
    problems = []
    try:
        while any(comm._peers[q] is None for q in range(1, nranks)) and not problems:
            try:
                deadline.arm(listener)
                sock, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                missing = [q for q in range(1, nranks) if comm._peers[q] is None]
                problems.append(f"shmem rendezvous: rank(s) {missing} did not join within {deadline.seconds:g} s "
                                f"({TIMEOUT_ENV}); start all {nranks} ranks with the same unique id")  # fmt: skip
                break
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _Deadline(min(10.0, max(deadline.end - time.monotonic(), 0.001)))  # a silent stranger: not for long
            try:
                their_token, their_rank, their_n = _HELLO.unpack(_recv_exact(sock, _HELLO.size, hello))
            except (OSError, TimeoutError, struct.error):
                sock.close()
                continue
            if their_token != token:
                sock.close()  # not one of ours: never read from it
                continue
            if their_n != nranks or not 0 < their_rank < nranks or comm._peers[their_rank] is not None:
                why = "joined twice" if their_n == nranks and 0 < their_rank < nranks else f"rank 0 has nranks={nranks}"
                problem = f"shmem rendezvous: a process joined as rank {their_rank} of {their_n} ({why})"
                _send_frame(sock, b"E", problem.encode(), deadline)
                sock.close()
                problems.append(problem)
                break
            comm._peers[their_rank] = sock
        kind, payload = (b"E", problems[0].encode()) if problems else (b"O", b"")
        for q in range(1, nranks):
            if comm._peers[q] is not None:
                try:
                    _send_frame(comm._peers[q], kind, payload, deadline)
                except (OSError, TimeoutError):
                    problems.append(f"shmem rendezvous: rank {q} left during the rendezvous")
    finally:
        listener.close()
    if problems:
        raise ShmemStateError(problems[0])


def _join(comm: UniqueIdComm, token: bytes, host: str, port: int, rank: int, nranks: int, deadline: _Deadline) -> None:
    sock = None
    while sock is None:  # refused: rank 0's process may not be up yet (another host's id, say); retried to the deadline
        try:
            sock = socket.create_connection((host, port), timeout=max(deadline.end - time.monotonic(), 0.001))
        except (TimeoutError, socket.timeout):
            raise ShmemStateError(f"shmem rendezvous: rank {rank} cannot reach rank 0 at {host}:{port} within "
                                  f"{deadline.seconds:g} s ({TIMEOUT_ENV})") from None  # fmt: skip
        except OSError as exc:
            if time.monotonic() >= deadline.end:
                raise ShmemStateError(f"shmem rendezvous: rank {rank} cannot reach rank 0 at {host}:{port} "
                                      f"({exc.strerror or exc})") from None  # fmt: skip
            time.sleep(0.05)
    comm._hub = sock
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        deadline.arm(sock)
        sock.sendall(_HELLO.pack(token, rank, nranks))
        kind, payload = _recv_frame(sock, deadline)
    except (OSError, TimeoutError) as exc:
        raise ShmemStateError(f"shmem rendezvous: rank {rank} lost rank 0 at {host}:{port} "
                              f"({_why(exc, deadline.seconds)})") from None  # fmt: skip
    if kind == b"E":
        raise ShmemStateError(payload.decode(errors="replace"))
