"""The rendezvous a unique id carries (as MORI's socket bootstrap): multi-process shmem without torch.distributed.

``new_unique_id()`` opens a TCP listener in the calling process, which must then be rank 0 (as in MORI:
rank 0 gets the id and hands it to the others), and returns ``UNIQUE_ID_BYTES`` bytes: a magic, a random
token, and the listener's host name and port. ``connect(unique_id, rank, nranks)`` on every rank gives the
rendezvous object shmem_comm's collectives run on (``rank``, ``world_size``, ``all_gather_object``,
``barrier``): rank 0 serves on its listener, the other ranks connect to the address. It is a star: every
rank sends its object to rank 0, which answers each with the list, in rank order.

Whoever listens at the id's address is not trusted until it proves it holds the token, nor is whoever
connects to the listener (a stale id's port may have been reused, any local process may connect):

* a joining rank sends a fresh nonce, its rank, nranks and HMAC-SHA256(token, "join" | nonce | rank |
  nranks), never the token itself; rank 0 drops, unread, every connection whose MAC is wrong;
* rank 0 answers at once with HMAC-SHA256(token, "serve" | nonce); the joining rank reads nothing else
  before it checked that proof (``hmac.compare_digest``).

Frames are a kind byte (``A`` rank 0's proof, ``O`` an object, ``E`` an error text) and a length; a frame of
a kind not due at that point, or longer than ``MAX_FRAME_BYTES`` (rank 0's proof: exactly 32 bytes), is
refused before anything is allocated for it, and payloads are read in bounded chunks. Objects travel in a
small tagged encoding (``encode`` / ``decode``) of None, bool, int, float, str, bytes, list, tuple and dict
(what shmem_comm's records hold): decoding builds only those, so no frame can run code (unlike pickle).
Every malformed frame is a ShmemStateError naming the peer and what was wrong.

Every wait has a deadline (``timeout``, default ``MORI_COMPILER_RENDEZVOUS_TIMEOUT`` seconds, else 300): a rank
that does not arrive is an error naming it on every rank that waits, never a hang. A refused connection is
not retried: the listener exists before the id does, so a refusal means rank 0's listener is gone (a stale
id, or rank 0 exited); only unreachable networks and hosts are retried, to the deadline. The host advertised
is this machine's name (``socket.gethostname()``); the listener is bound to every interface, since the
address the name resolves to here (often 127.0.1.1) need not be the one other hosts reach. Listeners of ids
this process made and does not use are closed at shmem init and finalize (``release_all``).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import math
import numbers
import os
import secrets
import socket
import struct
import threading
import time

from .shmem_errors import ShmemError, ShmemStateError

UNIQUE_ID_BYTES = 128
MAGIC = b"mori_compiler-uid3:"
TOKEN_BYTES = 16
NONCE_BYTES = 16
TIMEOUT_ENV = "MORI_COMPILER_RENDEZVOUS_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
#: The longest frame a rank accepts (64 MiB). The largest message, rank 0's list of every PE's init record,
#: is a few hundred bytes per PE; the cap bounds what a peer's (or a stranger's) length field can make us read.
MAX_FRAME_BYTES = 64 << 20
#: The most ranks one rendezvous takes (65536): rank 0 holds a socket per rank, and file descriptors run out
#: well before; their init records (a few hundred bytes each) then stay far below MAX_FRAME_BYTES.
MAX_RANKS = 1 << 16
MAX_NESTING = 16  # the deepest list/tuple/dict nesting decode() accepts (shmem_comm's records nest 2 deep)

_CHUNK = 1 << 20  # recv() at most this much at a time: a length field never sizes an allocation
_MAC_BYTES = hashlib.sha256().digest_size
_HELLO = struct.Struct(f"<{NONCE_BYTES}s{_MAC_BYTES}sii")  # nonce, join MAC, rank, nranks
_FRAME = struct.Struct("<cQ")  # kind, payload length
_PROOF, _OBJECT, _ERROR = b"A", b"O", b"E"
_KIND_NAMES = {_PROOF: "rank 0's proof", _OBJECT: "an object", _ERROR: "an error"}
_RETRIED_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH})  # the route may come up: retried
_LISTENERS: dict[bytes, socket.socket] = {}  # token -> the listener of an id made in this process
_LOCK = threading.Lock()


def new_unique_id() -> bytes:
    """UNIQUE_ID_BYTES bytes: MAGIC, a random token, the port and host name of a fresh listener of this process."""
    token = secrets.token_bytes(TOKEN_BYTES)
    host = socket.gethostname().encode()[: UNIQUE_ID_BYTES - len(MAGIC) - TOKEN_BYTES - 3]
    listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=128)
    port = listener.getsockname()[1]
    with _LOCK:
        _LISTENERS[token] = listener
    uid = MAGIC + token + struct.pack("<HB", port, len(host)) + host
    return uid.ljust(UNIQUE_ID_BYTES, b"\0")


def parse_unique_id(uid: bytes) -> tuple[bytes, str, int] | None:
    """(token, host, port) of an id from new_unique_id, or None for any other UNIQUE_ID_BYTES bytes."""
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
    """Close the listener of ``uid`` if this process made it and has not used it."""
    parsed = parse_unique_id(uid)
    if parsed is not None:
        with _LOCK:
            listener = _LISTENERS.pop(parsed[0], None)
        if listener is not None:
            listener.close()


def release_all(keep: bytes | None = None) -> None:
    """Close the listener of every id this process made, but ``keep``'s (the id an init is about to use)."""
    parsed = parse_unique_id(keep) if keep is not None else None
    kept = parsed[0] if parsed is not None else None
    with _LOCK:
        closing = [_LISTENERS.pop(token) for token in list(_LISTENERS) if token != kept]
    for sock in closing:
        sock.close()


def open_listener_count() -> int:
    """How many listeners of this process's ids are open (none after an init or a finalize has run)."""
    with _LOCK:
        return len(_LISTENERS)


def check_timeout(value, what: str = "timeout") -> float:
    """``value`` as seconds: a finite real number > 0 (not a bool); ShmemError naming ``what`` otherwise."""
    seconds = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ShmemError(f"{what}={value!r}: expected a finite number of seconds > 0")
    return seconds


def timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ShmemError(f"{TIMEOUT_ENV}={text!r}: expected a finite number of seconds > 0")
    return value


# ---- the objects' encoding: a tag byte, then a length or a fixed-size value ----------------------------


class _Malformed(Exception):
    """A frame or payload that breaks the protocol; the message says how, the caller names the peer."""


_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")


def encode(obj) -> bytes:
    """``obj`` (None, bool, int, float, str, bytes, and lists, tuples and dicts of them) as bytes for decode()."""
    out = bytearray()
    _encode(obj, out, 0)
    return bytes(out)


def _encode(obj, out: bytearray, depth: int) -> None:
    if depth > MAX_NESTING:
        raise ShmemError(f"shmem rendezvous: objects nested deeper than {MAX_NESTING} levels cannot be sent")
    if obj is None or obj is True or obj is False:
        out += {None: b"N", True: b"T", False: b"F"}[obj]
    elif isinstance(obj, int):
        raw = obj.to_bytes(obj.bit_length() // 8 + 1, "little", signed=True)
        out += b"I" + _U32.pack(len(raw)) + raw
    elif isinstance(obj, float):
        out += b"D" + _F64.pack(obj)
    elif isinstance(obj, (str, bytes, bytearray)):
        raw = obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else bytes(obj)
        out += (b"S" if isinstance(obj, str) else b"B") + _U32.pack(len(raw)) + raw
    elif isinstance(obj, (list, tuple)):
        out += (b"L" if isinstance(obj, list) else b"U") + _U32.pack(len(obj))
        for item in obj:
            _encode(item, out, depth + 1)
    elif isinstance(obj, dict):
        out += b"M" + _U32.pack(len(obj))
        for key, value in obj.items():
            _encode(key, out, depth + 1)
            _encode(value, out, depth + 1)
    else:
        raise ShmemError(f"shmem rendezvous: cannot send a {type(obj).__name__} (the unique id's rendezvous carries "
                         f"None, bool, int, float, str, bytes, list, tuple and dict)")  # fmt: skip


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = memoryview(data), 0

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.at:
            raise _Malformed(f"{what} runs past the end of the payload")
        self.at += n
        return bytes(self.data[self.at - n : self.at])

    def length(self, what: str) -> int:
        (n,) = _U32.unpack(self.take(_U32.size, what))
        if n > len(self.data) - self.at:  # every item or byte takes at least one byte of what is left
            raise _Malformed(f"{what} of length {n} runs past the end of the payload")
        return n


def decode(data: bytes):
    """The object encode() made of ``data``; _Malformed for anything else (a stray byte, an unknown tag...)."""
    reader = _Reader(data)
    obj = _decode(reader, 0)
    if reader.at != len(data):
        raise _Malformed(f"{len(data) - reader.at} stray byte(s) after the object")
    return obj


def _decode(r: _Reader, depth: int):
    if depth > MAX_NESTING:
        raise _Malformed(f"objects nested deeper than {MAX_NESTING} levels")
    tag = r.take(1, "a tag")
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag]
    if tag == b"I":
        return int.from_bytes(r.take(r.length("an int"), "an int"), "little", signed=True)
    if tag == b"D":
        return _F64.unpack(r.take(_F64.size, "a float"))[0]
    if tag == b"S":
        try:
            return r.take(r.length("a str"), "a str").decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise _Malformed("a str that is not UTF-8") from None
    if tag == b"B":
        return r.take(r.length("a bytes"), "a bytes")
    if tag in (b"L", b"U"):
        items = [_decode(r, depth + 1) for _ in range(r.length("a list"))]
        return items if tag == b"L" else tuple(items)
    if tag == b"M":
        out = {}
        for _ in range(r.length("a dict")):
            key = _decode(r, depth + 1)
            try:
                out[key] = _decode(r, depth + 1)
            except TypeError:
                raise _Malformed(f"a dict key that is not hashable ({type(key).__name__})") from None
        return out
    raise _Malformed(f"unknown tag {tag!r}")


# ---- framing -----------------------------------------------------------------------------------------


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.001)

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    data = bytearray()
    while len(data) < n:
        deadline.arm(sock)
        chunk = sock.recv(min(n - len(data), _CHUNK))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _send_frame(sock: socket.socket, kind: bytes, payload: bytes, deadline: _Deadline) -> None:
    deadline.arm(sock)
    sock.sendall(_FRAME.pack(kind, len(payload)) + payload)


def _recv_frame(sock: socket.socket, deadline: _Deadline, due: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """The next frame, which must be of a kind in ``due``; its length is checked before a byte of it is read."""
    kind, n = _FRAME.unpack(_recv_exact(sock, _FRAME.size, deadline))
    if kind not in due:
        expected = " or ".join(_KIND_NAMES[k] for k in due)
        raise _Malformed(f"a frame of kind {kind!r} where {expected} was due")
    if kind == _PROOF and n != _MAC_BYTES:
        raise _Malformed(f"a {n}-byte proof (a proof has {_MAC_BYTES} bytes)")
    if n > MAX_FRAME_BYTES:
        raise _Malformed(f"a {n}-byte frame (at most MAX_FRAME_BYTES = {MAX_FRAME_BYTES})")
    return kind, _recv_exact(sock, n, deadline)


def _error_text(payload: bytes) -> str:
    return payload.decode("utf-8", errors="replace")


def _join_mac(token: bytes, nonce: bytes, rank: int, nranks: int) -> bytes:
    return hmac.new(token, b"join" + nonce + struct.pack("<ii", rank, nranks), hashlib.sha256).digest()


def _serve_mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, b"serve" + nonce, hashlib.sha256).digest()


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
            return self._gather_from_rank0(encode(obj), deadline)
        out, problem = [obj] + [None] * (self.world_size - 1), None
        for q in range(1, self.world_size):
            try:
                _, payload = _recv_frame(self._peers[q], deadline, (_OBJECT,))
                out[q] = decode(payload)
            except (OSError, TimeoutError) as exc:
                problem = f"shmem rendezvous: rank 0 lost rank {q} ({_why(exc, self.timeout)})"
            except _Malformed as exc:
                problem = f"shmem rendezvous: rank 0 got a malformed frame from rank {q} ({exc})"
            if problem:
                break
        if not problem:
            try:
                payload = encode(out)
            except ShmemError as exc:  # rank 0's own object: the others must not wait for it
                problem = str(exc)
            if not problem and len(payload) > MAX_FRAME_BYTES:
                problem = (f"shmem rendezvous: the gathered objects take {len(payload)} bytes, more than a frame may "
                           f"(MAX_FRAME_BYTES = {MAX_FRAME_BYTES})")  # fmt: skip
        kind, payload = (_ERROR, problem.encode()) if problem else (_OBJECT, payload)
        for q in range(1, self.world_size):
            try:
                _send_frame(self._peers[q], kind, payload, deadline)
            except (OSError, TimeoutError):
                pass  # that rank fails on its own
        if problem:
            raise ShmemStateError(problem)
        return out

    def _gather_from_rank0(self, payload: bytes, deadline: _Deadline) -> list:
        try:
            _send_frame(self._hub, _OBJECT, payload, deadline)
            kind, payload = _recv_frame(self._hub, deadline, (_OBJECT, _ERROR))
            if kind == _ERROR:
                raise ShmemStateError(_error_text(payload))
            out = decode(payload)
            if not isinstance(out, list) or len(out) != self.world_size:
                raise _Malformed(f"a {type(out).__name__} where the list of {self.world_size} ranks' objects was due")
        except (OSError, TimeoutError) as exc:
            raise ShmemStateError(f"shmem rendezvous: rank {self.rank} lost rank 0 ({_why(exc, self.timeout)})") from None
        except _Malformed as exc:
            raise ShmemStateError(f"shmem rendezvous: rank {self.rank} got a malformed frame from rank 0 ({exc})") from None
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
    if not 0 <= rank < nranks <= MAX_RANKS:
        raise ShmemError(f"shmem rendezvous: rank={rank}, nranks={nranks}: expected 0 <= rank < nranks <= {MAX_RANKS} "
                         f"(MAX_RANKS)")  # fmt: skip
    timeout = timeout_from_env() if timeout is None else check_timeout(timeout)
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
            hello = _Deadline(min(10.0, deadline.left()))  # a silent stranger: not for long
            try:
                nonce, mac, their_rank, their_n = _HELLO.unpack(_recv_exact(sock, _HELLO.size, hello))
            except (OSError, TimeoutError, struct.error):
                sock.close()
                continue
            if not hmac.compare_digest(mac, _join_mac(token, nonce, their_rank, their_n)):
                sock.close()  # it does not hold the id: never read from it, never answer it
                continue
            try:
                _send_frame(sock, _PROOF, _serve_mac(token, nonce), deadline)
            except (OSError, TimeoutError):
                sock.close()
                continue
            if their_n != nranks or not 0 < their_rank < nranks or comm._peers[their_rank] is not None:
                why = "joined twice" if their_n == nranks and 0 < their_rank < nranks else f"rank 0 has nranks={nranks}"
                problem = f"shmem rendezvous: a process joined as rank {their_rank} of {their_n} ({why})"
                try:
                    _send_frame(sock, _ERROR, problem.encode(), deadline)
                except (OSError, TimeoutError):
                    pass
                sock.close()
                problems.append(problem)
                break
            comm._peers[their_rank] = sock
        kind, payload = (_ERROR, problems[0].encode()) if problems else (_OBJECT, b"")
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
    where = f"{host}:{port}"
    cannot = f"shmem rendezvous: rank {rank} cannot reach rank 0 at {where}"
    sock = None
    while sock is None:
        try:
            sock = socket.create_connection((host, port), timeout=deadline.left())
        except (TimeoutError, socket.timeout):
            raise ShmemStateError(f"{cannot} within {deadline.seconds:g} s ({TIMEOUT_ENV})") from None
        except ConnectionRefusedError:
            raise ShmemStateError(f"{cannot}: the connection was refused, so rank 0's listener is gone (it exists "
                                  f"before the id does): the unique id is stale or rank 0 exited; pass every rank "
                                  f"the id rank 0 got from shmem_get_unique_id() in this run") from None  # fmt: skip
        except socket.gaierror as exc:
            raise ShmemStateError(f"{cannot}: the host name {host!r} does not resolve here ({exc.strerror or exc}); "
                                  f"the id names rank 0's host by socket.gethostname()") from None  # fmt: skip
        except OSError as exc:
            if exc.errno not in _RETRIED_ERRNOS or time.monotonic() >= deadline.end:
                raise ShmemStateError(f"{cannot} ({exc.strerror or exc})") from None
            time.sleep(0.05)  # no route (yet): the network may come up before the deadline
    comm._hub = sock
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    nonce = secrets.token_bytes(NONCE_BYTES)
    try:
        deadline.arm(sock)
        sock.sendall(_HELLO.pack(nonce, _join_mac(token, nonce, rank, nranks), rank, nranks))
        _, proof = _recv_frame(sock, deadline, (_PROOF,))
        if not hmac.compare_digest(proof, _serve_mac(token, nonce)):
            raise _Malformed("a proof that does not match the id's token")
        kind, payload = _recv_frame(sock, deadline, (_OBJECT, _ERROR))
        if kind == _OBJECT and payload:
            raise _Malformed(f"a {len(payload)}-byte start signal (it is empty)")
    except (OSError, TimeoutError) as exc:
        raise ShmemStateError(f"shmem rendezvous: rank {rank} lost rank 0 at {where} "
                              f"({_why(exc, deadline.seconds)})") from None  # fmt: skip
    except _Malformed as exc:
        raise ShmemStateError(f"shmem rendezvous: rank {rank}: what answers at {where} is not rank 0 of this unique "
                              f"id ({exc}); a stale id whose port another process now holds? Pass every rank the id "
                              f"rank 0 got from shmem_get_unique_id() in this run") from None  # fmt: skip
    if kind == _ERROR:
        raise ShmemStateError(_error_text(payload))
