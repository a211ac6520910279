"""The TCP backend's wire protocol: frames that carry MORI-IO's one-sided RDMA semantics over a byte stream.

MORI has no TCP data plane; ours stands in for its RDMA backend. This module is the frame codec
only (standard library, no sockets): encoders, a staged head parser, and ``FrameDecoder`` for byte chunks.
``tcp_socket`` drives the same parser over blocking sockets and receives payloads in place.

The codec never trusts its peer: every field is checked on decode against ``FrameLimits``, the parser never
reads past a buffer nor allocates more than a length it has already bounded, and the encoding is canonical
(reserved fields and padding are zero), so any byte string the decoder accepts re-encodes to itself.

Frame layout (version 1; all integers little-endian, unsigned)
---------------------------------------------------------------
Header, 24 bytes (``<4sBBHQQ``)::

    0  magic        4 bytes  b"MoIO"
    4  version      u8       1
    5  type         u8       FrameType (1..10)
    6  flags        u16      per type; HELLO allows FLAG_HELLO_REPLY (bit 0), every other type 0
    8  request_id   u64      the initiator's id of the request this frame makes or answers (any value;
                             the engine chooses them, unique per connection among outstanding requests)
    16 body_length  u64      bytes after the header; at most ``FrameLimits.max_body(type)``

Bodies (offsets relative to the body; ``str`` = UTF-8 bytes, their length is a u16 field of the lead, and the
strings of a body are followed by zero padding to a multiple of 8, so that payloads start 8-aligned)::

    HELLO          max_payload u64, max_segments u32, capabilities u32, sender_key_len u16,
                   receiver_key_len u16, reserved u32 (=0)  | sender_key str, receiver_key str, pad
    WRITE          count u32 (1..max_segments), reserved u32 | count x segment | payload
    READ_REQUEST   count u32 (1..max_segments), reserved u32 | count x segment
    segment        mem_id u32, reserved u32, offset u64, length u64  (24 bytes; offset+length <= 2^64-1)
    READ_RESPONSE  status u32, message_len u16, reserved u16 | message str, pad | payload
    STATUS         status u32, message_len u16, reserved u16 | message str, pad
    ERROR          status u32, message_len u16, reserved u16 | message str, pad
    NOTIFY         transfer_uid u64, part_index u32, part_count u32, key_len u16, reserved u16,
                   reserved u32 | initiator_key str, pad      (part_index < part_count)
    CLOSE          (empty)
    MEMORY_QUERY   mem_id u32, reserved u32
    MEMORY_INFO    mem_id u32, found u32 (0/1), size u64  (size 0 when not found)

Bounds checked on decode (each failure is a ``FrameError`` whose ``field`` names the field and whose
``reason`` says the allowed range): magic, version, type, flags; body_length <= max_body(type) (checked on
the header alone, before any body byte is read or buffer allocated); the lead of a body fits its
body_length; segment count in [1, max_segments]; offset+length of each segment <= 2^64-1; a WRITE's
payload (body minus table) equals the sum of its segment lengths; a READ_REQUEST's total and every payload
<= max_payload; strings valid UTF-8 of at most max_key_bytes / max_message_bytes; reserved fields and padding
zero; no bytes after a frame's last field (``trailing``); a READ_RESPONSE whose status is not SUCCESS has no
payload; HELLO limits at least MIN_MAX_PAYLOAD / 1; NOTIFY part_index < part_count; MEMORY_INFO found 0/1.
Status values are carried as raw u32: the engine maps them through ``StatusCode`` and treats a value it
does not know as a failure. ``FrameError`` from an encoder means the caller asked for a frame those same
rules forbid.

Versioning: any change of layout, a new type or a new flag bumps ``VERSION``; a receiver refuses other
versions (``FrameError``; the engine answers ERROR and closes). Optional behaviours that keep the layout are
HELLO capability bits: each side advertises what it supports and the connection uses the intersection, so
bits a receiver does not know are ignored by design. Version 1 defines ``CAP_NOTIFY`` (the target counts
inbound NOTIFY frames for ``pop_inbound_transfer_status``).

Connection sequence (the engine's job; the codec does not track state): the initiator connects and sends
HELLO(sender = its key, receiver = the target's key, its limits); the target checks receiver_key is its own
key and answers HELLO(reply flag, its key, the initiator's key, its limits), or ERROR and closes. Each side
then sends frames within ``own_limits.for_peer(peer_hello)``. WRITE is answered by STATUS (same
request_id) once its bytes are placed; READ_REQUEST by READ_RESPONSE (SUCCESS and the bytes of the segments
concatenated in request order, or an error status without payload); MEMORY_QUERY by MEMORY_INFO; NOTIFY
(sent after the data of a transfer's part on that connection; its initiator_key must equal the
connection's HELLO sender_key, which the target checks) gets no answer. ERROR means the sender closes
the connection after it; CLOSE means the sender sends no further frame.

Large payloads (the zero-copy contract): a sender writes ``encode_head(frame, n)`` (header + segment table or
status) then the n payload bytes straight from its buffers (``tcp_socket.send_frame``, one ``sendmsg``). A
receiver parses the head with ``read_head`` (every bound above is checked before a payload byte is read),
and only then chooses where the payload goes: the receiving engine checks each segment's
[offset, offset + length) against the registered region ``mem_id`` (and, for READ_RESPONSE, that the length
is what it asked for) and receives into views of exactly those ranges; a segment that fails the check is
drained into scratch memory and answered with an error status. That check is what keeps a peer from writing
a byte outside a registered region: the codec guarantees the sizes are consistent, not that they fit memory.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, replace
from typing import ClassVar, Generator, Union

MAGIC = b"MoIO"
VERSION = 1
HEADER = struct.Struct("<4sBBHQQ")
HEADER_SIZE = HEADER.size  # 24

U16_MAX = (1 << 16) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

FLAG_HELLO_REPLY = 0x0001
CAP_NOTIFY = 0x0000_0001
# StatusCode.SUCCESS's wire value (MORI include/mori/io/enum.hpp); the only status value the codec interprets.
STATUS_SUCCESS = 0

DEFAULT_MAX_PAYLOAD = 64 << 20
MIN_MAX_PAYLOAD = 4096
MAX_MAX_PAYLOAD = 1 << 32
MAX_MAX_SEGMENTS = 1 << 16

_HELLO_LEAD = struct.Struct("<QIIHHI")
_TABLE_LEAD = struct.Struct("<II")
_SEGMENT = struct.Struct("<IIQQ")
_STATUS_LEAD = struct.Struct("<IHH")
_NOTIFY_LEAD = struct.Struct("<QIIHHI")
_MEMORY_QUERY = struct.Struct("<II")
_MEMORY_INFO = struct.Struct("<IIQ")

Buffer = Union[bytes, bytearray, memoryview]


class FrameType(enum.IntEnum):
    HELLO = 1
    WRITE = 2
    READ_REQUEST = 3
    READ_RESPONSE = 4
    STATUS = 5
    NOTIFY = 6
    ERROR = 7
    CLOSE = 8
    MEMORY_QUERY = 9
    MEMORY_INFO = 10


class FrameError(ValueError):
    """A frame breaks the protocol (decoded from a peer) or would break it (asked of an encoder).

    ``field`` names the offending field (``header.magic``, ``write.segments[3].offset``...), ``reason`` is
    ``field: what was found and the allowed range``. A connection that produced one is unusable.
    """

    def __init__(self, field: str, detail: str):
        self.field = field
        self.reason = f"{field}: {detail}"
        self.frames: list = []  # frames FrameDecoder.feed completed before this one, in the same chunk
        super().__init__(f"invalid MORI-IO TCP frame: {self.reason}")


def _pad8(n: int) -> int:
    return -n % 8


# ---- limits ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameLimits:
    """What one side accepts on a connection (per connection; HELLO advertises max_payload/max_segments)."""

    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_segments: int = 1024
    max_key_bytes: int = 1024
    max_message_bytes: int = 4096

    def __post_init__(self):
        for name, low, high in (("max_payload", MIN_MAX_PAYLOAD, MAX_MAX_PAYLOAD),
                                ("max_segments", 1, MAX_MAX_SEGMENTS),
                                ("max_key_bytes", 1, U16_MAX), ("max_message_bytes", 0, U16_MAX)):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"FrameLimits.{name} must be an integer in [{low}, {high}], got {value!r}")

    def max_body(self, ftype: FrameType) -> int:
        """The largest body_length a frame of ``ftype`` may declare under these limits."""
        table = _TABLE_LEAD.size + _SEGMENT.size * self.max_segments
        message = _STATUS_LEAD.size + self.max_message_bytes + _pad8(self.max_message_bytes)
        return {
            FrameType.HELLO: _HELLO_LEAD.size + 2 * self.max_key_bytes + _pad8(2 * self.max_key_bytes),
            FrameType.WRITE: table + self.max_payload,
            FrameType.READ_REQUEST: table,
            FrameType.READ_RESPONSE: message + self.max_payload,
            FrameType.STATUS: message,
            FrameType.ERROR: message,
            FrameType.NOTIFY: _NOTIFY_LEAD.size + self.max_key_bytes + _pad8(self.max_key_bytes),
            FrameType.CLOSE: 0,
            FrameType.MEMORY_QUERY: _MEMORY_QUERY.size,
            FrameType.MEMORY_INFO: _MEMORY_INFO.size,
        }[ftype]

    def for_peer(self, hello: "HelloFrame") -> "FrameLimits":
        """The limits to send under once the peer's HELLO arrived: the smaller of both sides'."""
        return replace(self, max_payload=min(self.max_payload, hello.max_payload),
                       max_segments=min(self.max_segments, hello.max_segments))  # fmt: skip


DEFAULT_LIMITS = FrameLimits()


# ---- frames ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """``length`` bytes at ``offset`` of the target's registered region ``mem_id`` (MemoryDesc.id)."""

    mem_id: int
    offset: int
    length: int


@dataclass(frozen=True)
class HelloFrame:
    type: ClassVar[FrameType] = FrameType.HELLO
    sender_key: str
    receiver_key: str
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_segments: int = 1024
    capabilities: int = 0
    reply: bool = False
    request_id: int = 0


@dataclass(frozen=True)
class WriteFrame:
    """Place ``payload`` (the segments' bytes, concatenated in table order) into the target's memory."""

    type: ClassVar[FrameType] = FrameType.WRITE
    request_id: int
    segments: tuple
    payload: Buffer = b""

    @property
    def payload_length(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass(frozen=True)
class ReadRequestFrame:
    type: ClassVar[FrameType] = FrameType.READ_REQUEST
    request_id: int
    segments: tuple

    @property
    def requested_length(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass(frozen=True)
class ReadResponseFrame:
    type: ClassVar[FrameType] = FrameType.READ_RESPONSE
    request_id: int
    status: int = STATUS_SUCCESS
    message: str = ""
    payload: Buffer = b""


@dataclass(frozen=True)
class StatusFrame:
    """The outcome of a request (``status`` = a StatusCode value)."""

    type: ClassVar[FrameType] = FrameType.STATUS
    request_id: int
    status: int
    message: str = ""


@dataclass(frozen=True)
class NotifyFrame:
    """Target-side completion notice: part ``part_index`` of ``part_count`` of transfer ``transfer_uid``."""

    type: ClassVar[FrameType] = FrameType.NOTIFY
    transfer_uid: int
    initiator_key: str
    part_index: int = 0
    part_count: int = 1
    request_id: int = 0


@dataclass(frozen=True)
class ErrorFrame:
    """The sender hit a connection-level error and closes after this frame."""

    type: ClassVar[FrameType] = FrameType.ERROR
    request_id: int
    status: int
    message: str = ""


@dataclass(frozen=True)
class CloseFrame:
    type: ClassVar[FrameType] = FrameType.CLOSE
    request_id: int = 0


@dataclass(frozen=True)
class MemoryQueryFrame:
    """Does the target have region ``mem_id`` registered? (MORI's AskMemoryRegion, at session build.)"""

    type: ClassVar[FrameType] = FrameType.MEMORY_QUERY
    request_id: int
    mem_id: int


@dataclass(frozen=True)
class MemoryInfoFrame:
    type: ClassVar[FrameType] = FrameType.MEMORY_INFO
    request_id: int
    mem_id: int
    found: bool
    size: int = 0


Frame = Union[HelloFrame, WriteFrame, ReadRequestFrame, ReadResponseFrame, StatusFrame, NotifyFrame,
              ErrorFrame, CloseFrame, MemoryQueryFrame, MemoryInfoFrame]  # fmt: skip
PAYLOAD_TYPES = (FrameType.WRITE, FrameType.READ_RESPONSE)


# ---- shared field rules ----------------------------------------------------------------------------


def _check_uint(field: str, value, high: int, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise FrameError(field, f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def _check_segments(kind: str, segments, limits: FrameLimits) -> int:
    """The total length of ``segments``, after checking count, fields and the u64 end of each."""
    if not 1 <= len(segments) <= limits.max_segments:
        raise FrameError(f"{kind}.count", f"{len(segments)} segments; allowed 1 to {limits.max_segments}")
    total = 0
    for i, seg in enumerate(segments):
        if not isinstance(seg, Segment):
            raise FrameError(f"{kind}.segments[{i}]", f"must be a Segment, got {type(seg).__name__}")
        _check_uint(f"{kind}.segments[{i}].mem_id", seg.mem_id, U32_MAX)
        _check_uint(f"{kind}.segments[{i}].offset", seg.offset, U64_MAX)
        _check_uint(f"{kind}.segments[{i}].length", seg.length, U64_MAX)
        if seg.offset + seg.length > U64_MAX:
            raise FrameError(f"{kind}.segments[{i}]", f"offset {seg.offset} + length {seg.length} overflows u64 "
                                                      f"(the end must be at most {U64_MAX})")  # fmt: skip
        total += seg.length
    if total > limits.max_payload:
        raise FrameError(f"{kind}.segments", f"total length {total} is above max_payload {limits.max_payload}")
    return total


def _encode_text(field: str, text, limit: int) -> bytes:
    if not isinstance(text, str):
        raise FrameError(field, f"must be a str, got {type(text).__name__}")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FrameError(field, f"is not encodable as UTF-8 ({e.reason} at {e.start})") from None
    if len(raw) > limit:
        raise FrameError(field, f"{len(raw)} UTF-8 bytes; allowed at most {limit}")
    return raw


def _decode_text(field: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FrameError(field, f"is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _check_text_length(field: str, length: int, limit: int):
    if length > limit:
        raise FrameError(field, f"{length} bytes; allowed at most {limit}")


def _check_zero(field: str, value):
    if value if isinstance(value, int) else any(value):
        raise FrameError(field, "reserved bytes must be zero")


def clip_message(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes at a character boundary (so an error can always be sent)."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def _strings(*raws: bytes) -> bytes:
    joined = b"".join(raws)
    return joined + bytes(_pad8(len(joined)))


# ---- encoding --------------------------------------------------------------------------------------


def _encode_body(frame, limits: FrameLimits) -> tuple[int, bytes]:
    """(flags, body bytes before the payload) of ``frame``, checked against the decode rules."""
    t = type(frame)
    if t is HelloFrame:
        sender = _encode_text("hello.sender_key", frame.sender_key, limits.max_key_bytes)
        receiver = _encode_text("hello.receiver_key", frame.receiver_key, limits.max_key_bytes)
        lead = _HELLO_LEAD.pack(_check_uint("hello.max_payload", frame.max_payload, U64_MAX, MIN_MAX_PAYLOAD),
                                _check_uint("hello.max_segments", frame.max_segments, U32_MAX, 1),
                                _check_uint("hello.capabilities", frame.capabilities, U32_MAX),
                                len(sender), len(receiver), 0)  # fmt: skip
        return (FLAG_HELLO_REPLY if frame.reply else 0), lead + _strings(sender, receiver)
    if t in (WriteFrame, ReadRequestFrame):
        kind = "write" if t is WriteFrame else "read_request"
        segments = tuple(frame.segments)
        _check_segments(kind, segments, limits)
        table = b"".join(_SEGMENT.pack(s.mem_id, 0, s.offset, s.length) for s in segments)
        return 0, _TABLE_LEAD.pack(len(segments), 0) + table
    if t in (ReadResponseFrame, StatusFrame, ErrorFrame):
        kind = {ReadResponseFrame: "read_response", StatusFrame: "status", ErrorFrame: "error"}[t]
        message = _encode_text(f"{kind}.message", frame.message, limits.max_message_bytes)
        lead = _STATUS_LEAD.pack(_check_uint(f"{kind}.status", frame.status, U32_MAX), len(message), 0)
        return 0, lead + _strings(message)
    if t is NotifyFrame:
        key = _encode_text("notify.initiator_key", frame.initiator_key, limits.max_key_bytes)
        count = _check_uint("notify.part_count", frame.part_count, U32_MAX, 1)
        index = _check_uint("notify.part_index", frame.part_index, count - 1)
        lead = _NOTIFY_LEAD.pack(_check_uint("notify.transfer_uid", frame.transfer_uid, U64_MAX), index, count,
                                 len(key), 0, 0)  # fmt: skip
        return 0, lead + _strings(key)
    if t is CloseFrame:
        return 0, b""
    if t is MemoryQueryFrame:
        return 0, _MEMORY_QUERY.pack(_check_uint("memory_query.mem_id", frame.mem_id, U32_MAX), 0)
    if t is MemoryInfoFrame:
        if not isinstance(frame.found, bool):
            raise FrameError("memory_info.found", f"must be a bool, got {frame.found!r}")
        size = _check_uint("memory_info.size", frame.size, U64_MAX if frame.found else 0)
        return 0, _MEMORY_INFO.pack(_check_uint("memory_info.mem_id", frame.mem_id, U32_MAX), int(frame.found), size)
    raise FrameError("frame", f"{t.__name__} is not a frame type of this protocol")


def payload_nbytes(payload) -> int:
    """Bytes in a payload buffer (any object with the buffer protocol)."""
    return memoryview(payload).nbytes


def encode_head(frame: Frame, payload_length: int | None = None, limits: FrameLimits = DEFAULT_LIMITS) -> bytes:
    """Header and body of ``frame`` up to its payload; ``payload_length`` defaults to the frame's own payload.

    The caller sends exactly ``payload_length`` payload bytes after it (``tcp_socket.send_frame`` does).
    """
    flags, body = _encode_body(frame, limits)
    _check_uint("frame.request_id", frame.request_id, U64_MAX)
    if frame.type in PAYLOAD_TYPES:
        length = payload_nbytes(frame.payload) if payload_length is None else payload_length
        _check_uint("payload_length", length, limits.max_payload)
        if frame.type is FrameType.WRITE and length != frame.payload_length:
            raise FrameError("write.payload", f"{length} bytes, but the segments sum to {frame.payload_length}")
        if frame.type is FrameType.READ_RESPONSE and length and frame.status != STATUS_SUCCESS:
            raise FrameError("read_response.payload", f"{length} bytes with status {frame.status}; "
                                                      "a failed read carries no payload")  # fmt: skip
    elif payload_length:
        raise FrameError("payload_length", f"{frame.type.name} frames carry no payload, got {payload_length}")
    else:
        length = 0
    return HEADER.pack(MAGIC, VERSION, frame.type, flags, frame.request_id, len(body) + length) + body


def encode_frame(frame: Frame, limits: FrameLimits = DEFAULT_LIMITS) -> bytes:
    """The whole frame, payload included (copies the payload: use ``tcp_socket.send_frame`` for big ones)."""
    head = encode_head(frame, None, limits)
    return head + bytes(frame.payload) if frame.type in PAYLOAD_TYPES else head


# ---- decoding --------------------------------------------------------------------------------------

_TYPE_NAMES = {t: t.name.lower() for t in FrameType}
_ALLOWED_FLAGS = {FrameType.HELLO: FLAG_HELLO_REPLY}

HeadSteps = Generator[int, bytes, tuple]


class _Body:
    """The bytes of a body still to come, so that no stage asks for more than body_length declared."""

    def __init__(self, kind: str, length: int):
        self.kind, self.remaining = kind, length

    def take(self, n: int, what: str) -> HeadSteps:
        if n > self.remaining:
            raise FrameError(f"{self.kind}.{what}", f"needs {n} more bytes, but body_length leaves only "
                                                    f"{self.remaining}")  # fmt: skip
        self.remaining -= n
        raw = yield n
        return raw

    def strings(self, what: str, *lengths: int) -> HeadSteps:
        """The strings of ``lengths`` and their padding; the padding is checked to be zero."""
        total = sum(lengths)
        raw = yield from self.take(total + _pad8(total), what)
        _check_zero(f"{self.kind}.padding", raw[total:])
        out, pos = [], 0
        for n in lengths:
            out.append(raw[pos : pos + n])
            pos += n
        return out


def read_head(limits: FrameLimits = DEFAULT_LIMITS) -> HeadSteps:
    """Parse one frame's head in stages: a generator that yields how many bytes it needs next, is sent
    exactly that many, and returns ``(frame, payload_length)`` (the frame without its payload).

    Every bound is checked as soon as its bytes arrive; after the return, ``payload_length`` more bytes
    (already bounded by ``limits``) make up the frame.
    """
    raw = yield HEADER_SIZE
    magic, version, type_value, flags, request_id, body_length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise FrameError("header.magic", f"expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise FrameError("header.version", f"version {version} is not supported; allowed {VERSION}")
    try:
        ftype = FrameType(type_value)
    except ValueError:
        raise FrameError("header.type", f"unknown frame type {type_value}; allowed 1 to {len(FrameType)}") from None
    allowed = _ALLOWED_FLAGS.get(ftype, 0)
    if flags & ~allowed:
        raise FrameError("header.flags", f"0x{flags:04x} has bits outside 0x{allowed:04x} allowed for {ftype.name}")
    if body_length > limits.max_body(ftype):
        raise FrameError("header.body_length", f"{body_length} is above the maximum {limits.max_body(ftype)} "
                                               f"for {ftype.name} under these limits")  # fmt: skip
    kind = _TYPE_NAMES[ftype]
    body = _Body(kind, body_length)
    frame = yield from _BODY_PARSERS[ftype](body, request_id, flags, limits)
    payload_length = body.remaining
    if ftype is FrameType.WRITE:
        if payload_length != frame.payload_length:
            raise FrameError("write.payload", f"{payload_length} bytes follow the table, but the segments sum "
                                              f"to {frame.payload_length}")  # fmt: skip
    elif ftype is FrameType.READ_RESPONSE:
        if payload_length > limits.max_payload:
            raise FrameError("read_response.payload", f"{payload_length} bytes; allowed at most {limits.max_payload}")
        if payload_length and frame.status != STATUS_SUCCESS:
            raise FrameError("read_response.payload", f"{payload_length} bytes with status {frame.status}; "
                                                      "a failed read carries no payload")  # fmt: skip
    elif payload_length:
        raise FrameError(f"{kind}.trailing", f"{payload_length} bytes after the last field; allowed 0")
    return frame, payload_length


def _parse_hello(body: _Body, request_id, flags, limits) -> HeadSteps:
    lead = yield from body.take(_HELLO_LEAD.size, "lead")
    max_payload, max_segments, capabilities, sender_len, receiver_len, reserved = _HELLO_LEAD.unpack(lead)
    _check_zero("hello.reserved", reserved)
    if max_payload < MIN_MAX_PAYLOAD:
        raise FrameError("hello.max_payload", f"{max_payload}; allowed {MIN_MAX_PAYLOAD} to {U64_MAX}")
    if max_segments < 1:
        raise FrameError("hello.max_segments", f"{max_segments}; allowed 1 to {U32_MAX}")
    _check_text_length("hello.sender_key", sender_len, limits.max_key_bytes)
    _check_text_length("hello.receiver_key", receiver_len, limits.max_key_bytes)
    sender, receiver = yield from body.strings("keys", sender_len, receiver_len)
    return HelloFrame(_decode_text("hello.sender_key", sender), _decode_text("hello.receiver_key", receiver),
                      max_payload, max_segments, capabilities, bool(flags & FLAG_HELLO_REPLY), request_id)  # fmt: skip


def _parse_table(body: _Body, limits: FrameLimits) -> HeadSteps:
    lead = yield from body.take(_TABLE_LEAD.size, "lead")
    count, reserved = _TABLE_LEAD.unpack(lead)
    _check_zero(f"{body.kind}.reserved", reserved)
    if not 1 <= count <= limits.max_segments:
        raise FrameError(f"{body.kind}.count", f"{count} segments; allowed 1 to {limits.max_segments}")
    raw = yield from body.take(count * _SEGMENT.size, "segments")
    segments = []
    for i, (mem_id, reserved, offset, length) in enumerate(_SEGMENT.iter_unpack(raw)):
        _check_zero(f"{body.kind}.segments[{i}].reserved", reserved)
        segments.append(Segment(mem_id, offset, length))
    segments = tuple(segments)
    _check_segments(body.kind, segments, limits)
    return segments


def _parse_write(body, request_id, flags, limits) -> HeadSteps:
    return WriteFrame(request_id, (yield from _parse_table(body, limits)))


def _parse_read_request(body, request_id, flags, limits) -> HeadSteps:
    return ReadRequestFrame(request_id, (yield from _parse_table(body, limits)))


def _status_parser(cls):
    def parse(body: _Body, request_id, flags, limits) -> HeadSteps:
        lead = yield from body.take(_STATUS_LEAD.size, "lead")
        status, message_len, reserved = _STATUS_LEAD.unpack(lead)
        _check_zero(f"{body.kind}.reserved", reserved)
        _check_text_length(f"{body.kind}.message", message_len, limits.max_message_bytes)
        (message,) = yield from body.strings("message", message_len)
        return cls(request_id, status, _decode_text(f"{body.kind}.message", message))

    return parse


def _parse_notify(body: _Body, request_id, flags, limits) -> HeadSteps:
    lead = yield from body.take(_NOTIFY_LEAD.size, "lead")
    uid, index, count, key_len, reserved16, reserved32 = _NOTIFY_LEAD.unpack(lead)
    _check_zero("notify.reserved", reserved16 | reserved32)
    if not index < count:
        raise FrameError("notify.part_index", f"{index} with part_count {count}; allowed 0 to part_count - 1")
    _check_text_length("notify.initiator_key", key_len, limits.max_key_bytes)
    (key,) = yield from body.strings("initiator_key", key_len)
    return NotifyFrame(uid, _decode_text("notify.initiator_key", key), index, count, request_id)


def _parse_close(body, request_id, flags, limits) -> HeadSteps:
    return CloseFrame(request_id)
    yield  # a generator like the others  # pragma: no cover


def _parse_memory_query(body: _Body, request_id, flags, limits) -> HeadSteps:
    mem_id, reserved = _MEMORY_QUERY.unpack((yield from body.take(_MEMORY_QUERY.size, "fields")))
    _check_zero("memory_query.reserved", reserved)
    return MemoryQueryFrame(request_id, mem_id)


def _parse_memory_info(body: _Body, request_id, flags, limits) -> HeadSteps:
    mem_id, found, size = _MEMORY_INFO.unpack((yield from body.take(_MEMORY_INFO.size, "fields")))
    if found not in (0, 1):
        raise FrameError("memory_info.found", f"{found}; allowed 0 or 1")
    if not found and size:
        raise FrameError("memory_info.size", f"{size} for a region not found; allowed 0")
    return MemoryInfoFrame(request_id, mem_id, bool(found), size)


_BODY_PARSERS = {
    FrameType.HELLO: _parse_hello,
    FrameType.WRITE: _parse_write,
    FrameType.READ_REQUEST: _parse_read_request,
    FrameType.READ_RESPONSE: _status_parser(ReadResponseFrame),
    FrameType.STATUS: _status_parser(StatusFrame),
    FrameType.ERROR: _status_parser(ErrorFrame),
    FrameType.NOTIFY: _parse_notify,
    FrameType.CLOSE: _parse_close,
    FrameType.MEMORY_QUERY: _parse_memory_query,
    FrameType.MEMORY_INFO: _parse_memory_info,
}


class FrameDecoder:
    """Whole frames out of a byte stream cut anywhere: ``feed(chunk)`` returns the frames it completed.

    It holds only the bytes fed and not yet returned. The first malformed frame raises ``FrameError`` (with
    the frames completed earlier in that chunk in ``error.frames``); the decoder then refuses all input.
    Payloads are buffered whole: for big ones use ``tcp_socket.recv_frame`` with ``into``.
    """

    def __init__(self, limits: FrameLimits = DEFAULT_LIMITS):
        self.limits = limits
        self._buffer = bytearray()
        self._frame_bytes = 0  # bytes of the current, incomplete frame already consumed from the buffer
        self._error: FrameError | None = None
        self._start_frame()

    def _start_frame(self):
        self._steps = read_head(self.limits)
        self._need = next(self._steps)
        self._head = None
        self._frame_bytes = 0

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (0 at a frame boundary)."""
        return self._frame_bytes + len(self._buffer)

    def feed(self, data: Buffer) -> list:
        if self._error is not None:
            raise FrameError("decoder", f"refuses input after an earlier invalid frame ({self._error.reason})")
        self._buffer += data
        frames, pos = [], 0
        try:
            while len(self._buffer) - pos >= self._need:
                chunk = bytes(self._buffer[pos : pos + self._need])
                pos += self._need
                self._frame_bytes += self._need
                if self._head is not None:
                    frame = self._head
                    frames.append(replace(frame, payload=chunk) if frame.type in PAYLOAD_TYPES else frame)
                    self._start_frame()
                    continue
                try:
                    self._need = self._steps.send(chunk)
                except StopIteration as done:
                    self._head, self._need = done.value
        except FrameError as error:
            self._error = error
            error.frames = frames
            raise
        finally:
            del self._buffer[:pos]
        return frames

    def finish(self):
        """Check the stream ended at a frame boundary (``FrameError`` naming the bytes held otherwise)."""
        if self._error is None and self.pending:
            raise FrameError("stream", f"ended inside a frame: {self.pending} bytes of an incomplete frame")


def decode_frame(data: Buffer, limits: FrameLimits = DEFAULT_LIMITS) -> Frame:
    """The single frame that ``data`` holds exactly (``FrameError`` if it holds less, more or another)."""
    decoder = FrameDecoder(limits)
    frames = decoder.feed(data)
    if len(frames) != 1 or decoder.pending:
        extra = f"{len(frames)} frames and {decoder.pending} bytes left" if frames else "an incomplete frame"
        raise FrameError("stream", f"expected exactly one frame, got {extra}")
    return frames[0]
