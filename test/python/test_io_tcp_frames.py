"""The TCP backend's frame codec (runtime/io/tcp_frames.py) and its blocking socket helpers
(runtime/io/tcp_socket.py): round trips, the documented byte layout, every decode bound, streams cut
anywhere, random and mutated input, and real sockets (socketpair, loopback TCP) with in-place receives.
"""

from __future__ import annotations

import array
import random
import socket
import struct
import threading
import time
import tracemalloc

import pytest

from mori_compiler.runtime.io import tcp_frames as tf
from mori_compiler.runtime.io.tcp_frames import (CAP_NOTIFY, CloseFrame, ErrorFrame, FrameDecoder, FrameError,
                                                 FrameLimits, FrameType, HelloFrame, MemoryInfoFrame,
                                                 MemoryQueryFrame, NotifyFrame, ReadRequestFrame,
                                                 ReadResponseFrame, Segment, StatusFrame, WriteFrame, decode_frame,
                                                 encode_frame, encode_head)  # fmt: skip
from mori_compiler.runtime.io.tcp_socket import FrameTimeoutError, FrameTruncatedError, recv_frame, send_frame

SAMPLES = [
    HelloFrame("initiator-0", "target-é", max_payload=1 << 20, max_segments=16, capabilities=CAP_NOTIFY),
    HelloFrame("t", "i", reply=True, request_id=5),
    WriteFrame(1, (Segment(3, 0, 4),), b"abcd"),
    WriteFrame(2**64 - 1, (Segment(0, 10, 2), Segment(2**32 - 1, 2**64 - 4, 3), Segment(1, 5, 0)), b"xyz12"),
    ReadRequestFrame(9, (Segment(4, 100, 50), Segment(4, 0, 7))),
    ReadResponseFrame(9, payload=bytes(range(57))),
    ReadResponseFrame(10, status=11, message="offset out of range"),
    StatusFrame(1, 0),
    StatusFrame(2, 13, "reset by peer ✓"),
    NotifyFrame(transfer_uid=2**63 + 5, initiator_key="initiator-0", part_index=2, part_count=3),
    ErrorFrame(0, 14, "unknown engine"),
    CloseFrame(),
    MemoryQueryFrame(3, 17),
    MemoryInfoFrame(3, 17, True, 1 << 40),
    MemoryInfoFrame(4, 18, False),
]


def _header(ftype, body_length, *, magic=b"MoIO", version=1, flags=0, request_id=0):
    return struct.pack("<4sBBHQQ", magic, version, ftype, flags, request_id, body_length)


def _reason(data, limits=tf.DEFAULT_LIMITS):
    with pytest.raises(FrameError) as info:
        FrameDecoder(limits).feed(data)
    return info.value


# ---- encoding, layout, round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__name__)
def test_round_trip_every_frame_type(frame):
    data = encode_frame(frame)
    assert len(data) % 8 == 0 or frame.type in tf.PAYLOAD_TYPES
    assert decode_frame(data) == frame


def test_every_frame_type_has_a_sample():
    assert {f.type for f in SAMPLES} == set(FrameType)


def test_write_layout_matches_the_documented_bytes():
    data = encode_frame(WriteFrame(0x1122, (Segment(7, 0x10, 3), Segment(8, 0x20, 1)), b"abcd"))
    table = struct.pack("<II", 2, 0) + struct.pack("<IIQQ", 7, 0, 0x10, 3) + struct.pack("<IIQQ", 8, 0, 0x20, 1)
    assert data == _header(2, len(table) + 4, request_id=0x1122) + table + b"abcd"
    assert len(tf.HEADER.pack(b"MoIO", 1, 1, 0, 0, 0)) == 24


def test_hello_and_status_layouts_pad_strings_to_8():
    hello = encode_frame(HelloFrame("abc", "de", max_payload=4096, max_segments=2, capabilities=1, reply=True))
    body = struct.pack("<QIIHHI", 4096, 2, 1, 3, 2, 0) + b"abcde" + bytes(3)
    assert hello == _header(1, len(body), flags=1) + body
    status = encode_frame(StatusFrame(4, 11, "no"))
    assert status == _header(5, 16, request_id=4) + struct.pack("<IHH", 11, 2, 0) + b"no" + bytes(6)


def test_encoders_refuse_what_the_decoder_would_refuse():
    limits = FrameLimits(max_segments=2, max_key_bytes=4, max_message_bytes=3)
    cases = [
        (HelloFrame("toolong", "x"), "hello.sender_key"),
        (HelloFrame("a", "b", max_payload=100), "hello.max_payload"),
        (WriteFrame(1, (Segment(0, 0, 1),) * 3, b"abc"), "write.count"),
        (WriteFrame(1, (), b""), "write.count"),
        (WriteFrame(1, (Segment(0, 2**64 - 1, 1),), b"a"), "write.segments[0]"),
        (WriteFrame(1, (Segment(-1, 0, 1),), b"a"), "write.segments[0].mem_id"),
        (WriteFrame(1, (Segment(0, 0, 2),), b"a"), "write.payload"),
        (ReadResponseFrame(1, status=11, payload=b"x"), "read_response.payload"),
        (StatusFrame(1, 2**32), "status.status"),
        (StatusFrame(1, 0, "four"), "status.message"),
        (StatusFrame(1, 0, "\ud800"), "status.message"),
        (NotifyFrame(1, "k", part_index=1, part_count=1), "notify.part_index"),
        (MemoryInfoFrame(1, 2, False, 5), "memory_info.size"),
        (CloseFrame(request_id=2**64), "frame.request_id"),
    ]
    for frame, field in cases:
        with pytest.raises(FrameError) as info:
            encode_frame(frame, limits)
        assert info.value.field == field, (frame, info.value.reason)
    with pytest.raises(FrameError, match="carry no payload"):
        encode_head(StatusFrame(1, 0), 5)


def test_limits_are_validated_and_meet_the_peers():
    for bad in ({"max_payload": 100}, {"max_payload": 2**40}, {"max_segments": 0}, {"max_key_bytes": 70000},
                {"max_message_bytes": -1}, {"max_segments": True}):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad))):
            FrameLimits(**bad)
    mine = FrameLimits(max_payload=1 << 20, max_segments=64)
    met = mine.for_peer(HelloFrame("p", "me", max_payload=8192, max_segments=1000))
    assert (met.max_payload, met.max_segments) == (8192, 64)
    assert tf.clip_message("héllo", 2) == "h" and tf.clip_message("héllo", 3) == "hé"


# ---- streams cut anywhere --------------------------------------------------------------------------


def test_split_at_every_byte_boundary():
    frames = [SAMPLES[0], SAMPLES[3], SAMPLES[6]]
    data = b"".join(map(encode_frame, frames))
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert got == frames, cut
        assert decoder.pending == 0
    decoder = FrameDecoder()
    got = [f for i in range(len(data)) for f in decoder.feed(data[i : i + 1])]
    assert got == frames


def test_many_frames_in_one_chunk():
    rng = random.Random(5)
    frames = [rng.choice(SAMPLES) for _ in range(2000)]
    decoder = FrameDecoder()
    assert decoder.feed(b"".join(map(encode_frame, frames))) == frames
    decoder.finish()


def test_incomplete_stream_is_reported_by_finish():
    decoder = FrameDecoder()
    data = encode_frame(SAMPLES[2])
    assert decoder.feed(data[:-1]) == [] and decoder.pending == len(data) - 1
    with pytest.raises(FrameError) as info:
        decoder.finish()
    assert info.value.field == "stream" and str(len(data) - 1) in info.value.reason
    with pytest.raises(FrameError, match="exactly one frame"):
        decode_frame(data + encode_frame(CloseFrame()))


def test_decoder_refuses_input_after_an_error_and_keeps_earlier_frames():
    decoder = FrameDecoder()
    good = encode_frame(SAMPLES[7])
    with pytest.raises(FrameError) as info:
        decoder.feed(good + good + b"XXXX" + bytes(20))
    assert info.value.field == "header.magic" and info.value.frames == [SAMPLES[7], SAMPLES[7]]
    with pytest.raises(FrameError, match="refuses input") as again:
        decoder.feed(good)
    assert again.value.field == "decoder"


# ---- each decode bound -----------------------------------------------------------------------------


def _table(segments, count=None, reserved=0):
    out = struct.pack("<II", len(segments) if count is None else count, reserved)
    return out + b"".join(struct.pack("<IIQQ", m, r, o, n) for m, r, o, n in segments)


def test_unknown_magic_version_type_and_flags():
    assert _reason(_header(8, 0, magic=b"RDMA")).field == "header.magic"
    error = _reason(_header(8, 0, version=2))
    assert error.field == "header.version" and "allowed 1" in error.reason
    error = _reason(_header(0, 0))
    assert error.field == "header.type" and "allowed 1 to 10" in error.reason
    assert _reason(_header(11, 0)).field == "header.type"
    error = _reason(_header(8, 0, flags=1))
    assert error.field == "header.flags" and "0x0000" in error.reason
    assert _reason(_header(1, 0, flags=2)).field == "header.flags"


def test_body_length_above_the_configured_maximum_is_refused_on_the_header_alone():
    limits = FrameLimits(max_payload=8192, max_segments=4)
    largest = limits.max_body(FrameType.WRITE)
    assert largest == 8 + 4 * 24 + 8192
    error = _reason(_header(2, largest + 1), limits)
    assert error.field == "header.body_length" and str(largest) in error.reason
    default_largest = tf.DEFAULT_LIMITS.max_body(FrameType.WRITE)
    assert default_largest == 8 + 1024 * 24 + (64 << 20)
    assert _reason(_header(2, default_largest + 1)).field == "header.body_length"
    assert _reason(_header(2, 2**64 - 1)).field == "header.body_length"
    assert _reason(_header(8, 1)).field == "header.body_length"  # CLOSE has no body at all
    # A header declaring the largest allowed body allocates nothing until the bytes arrive.
    tracemalloc.start()
    decoder = FrameDecoder()
    assert decoder.feed(_header(2, 8 + 24 + (64 << 20)) + _table([(0, 0, 0, 64 << 20)])) == []
    assert decoder.pending == 24 + 8 + 24
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_segment_count_bounds():
    limits = FrameLimits(max_segments=2)
    error = _reason(_header(2, 8 + 3 * 24 + 3) + _table([(0, 0, 0, 1)] * 3) + b"abc", limits)
    assert error.field == "write.count" and "allowed 1 to 2" in error.reason
    # A READ_REQUEST body holds only the table, so too many segments already break body_length.
    assert _reason(_header(3, 8 + 3 * 24) + _table([(0, 0, 0, 1)] * 3), limits).field == "header.body_length"
    assert _reason(_header(3, 8) + _table([])).field == "read_request.count"
    # A count the body_length cannot hold is refused before the table is awaited.
    error = _reason(_header(3, 8 + 24) + _table([], count=2))
    assert error.field == "read_request.segments" and "needs 48" in error.reason


def test_write_payload_must_match_the_segment_lengths():
    body = _table([(1, 0, 0, 4), (1, 0, 8, 4)])
    assert decode_frame(_header(2, len(body) + 8) + body + b"12345678").payload == b"12345678"
    error = _reason(_header(2, len(body) + 7) + body + b"1234567")
    assert error.field == "write.payload" and "sum to 8" in error.reason
    assert _reason(_header(2, len(body) + 9) + body + b"123456789").field == "write.payload"


def test_segment_end_overflowing_u64():
    body = _table([(1, 0, 2**64 - 2, 2)])
    error = _reason(_header(3, len(body)) + body)
    assert error.field == "read_request.segments[0]" and "overflows u64" in error.reason
    ok = _table([(1, 0, 2**64 - 2, 1)])
    assert decode_frame(_header(3, len(ok)) + ok).segments == (Segment(1, 2**64 - 2, 1),)


def test_read_request_total_above_max_payload():
    body = _table([(1, 0, 0, 4096), (1, 0, 4096, 1)])
    error = _reason(_header(3, len(body)) + body, FrameLimits(max_payload=4096))
    assert error.field == "read_request.segments" and "max_payload 4096" in error.reason


def test_reserved_fields_and_padding_must_be_zero():
    assert _reason(_header(3, 8 + 24) + _table([(1, 0, 0, 1)], reserved=1)).field == "read_request.reserved"
    assert _reason(_header(3, 8 + 24) + _table([(1, 9, 0, 1)])).field == "read_request.segments[0].reserved"
    status = bytearray(encode_frame(StatusFrame(1, 0, "ab")))
    status[24 + 8 + 5] = 1
    assert _reason(bytes(status)).field == "status.padding"
    status = bytearray(encode_frame(StatusFrame(1, 0, "ab")))
    status[24 + 6] = 1
    assert _reason(bytes(status)).field == "status.reserved"


def test_strings_not_utf8_or_too_long():
    lead = struct.pack("<IHH", 0, 2, 0) + b"\xff\xfe" + bytes(6)
    error = _reason(_header(5, len(lead)) + lead)
    assert error.field == "status.message" and "UTF-8" in error.reason
    limits = FrameLimits(max_key_bytes=8)
    hello = struct.pack("<QIIHHI", 4096, 1, 0, 9, 1, 0) + b"123456789x" + bytes(6)
    assert decode_frame(_header(1, len(hello)) + hello, FrameLimits(max_key_bytes=16)).sender_key == "123456789"
    error = _reason(_header(1, len(hello)) + hello, limits)
    # 24 + 16 = 40 bytes is within max_body(HELLO) = 24 + 16 for 8-byte keys, so the key length itself fails.
    assert error.field == "hello.sender_key" and "at most 8" in error.reason
    notify = struct.pack("<QIIHHI", 1, 0, 1, 2, 0, 0) + b"\xc3\x28" + bytes(6)
    assert _reason(_header(6, len(notify)) + notify).field == "notify.initiator_key"


def test_trailing_bytes_after_the_last_field():
    body = struct.pack("<II", 5, 0) + bytes(8)
    assert _reason(_header(9, len(body)) + body).field == "header.body_length"  # fixed-size bodies
    status = struct.pack("<IHH", 0, 0, 0) + bytes(8)
    error = _reason(_header(5, len(status)) + status)
    assert error.field == "status.trailing" and "allowed 0" in error.reason
    request = _table([(1, 0, 0, 4)]) + b"abcd"
    assert _reason(_header(3, len(request)) + request).field == "read_request.trailing"


def test_frame_specific_rules():
    failed = _header(4, 8 + 3) + struct.pack("<IHH", 11, 0, 0) + b"abc"
    assert _reason(failed).field == "read_response.payload"
    big = FrameLimits(max_payload=4096)
    error = _reason(_header(4, 8 + 4097) + struct.pack("<IHH", 0, 0, 0) + bytes(4097), big)
    assert error.field == "read_response.payload" and "at most 4096" in error.reason
    notify = struct.pack("<QIIHHI", 1, 3, 3, 0, 0, 0)
    assert _reason(_header(6, len(notify)) + notify).field == "notify.part_index"
    hello = struct.pack("<QIIHHI", 100, 1, 0, 0, 0, 0)
    assert _reason(_header(1, len(hello)) + hello).field == "hello.max_payload"
    hello = struct.pack("<QIIHHI", 4096, 0, 0, 0, 0, 0)
    assert _reason(_header(1, len(hello)) + hello).field == "hello.max_segments"
    assert _reason(_header(10, 16) + struct.pack("<IIQ", 1, 2, 0)).field == "memory_info.found"
    assert _reason(_header(10, 16) + struct.pack("<IIQ", 1, 0, 5)).field == "memory_info.size"
    assert _reason(_header(9, 8) + struct.pack("<II", 1, 1)).field == "memory_query.reserved"


# ---- random and mutated input ----------------------------------------------------------------------


def test_random_and_mutated_bytes_raise_only_frame_error():
    rng = random.Random(20261201)
    valid = [encode_frame(f) for f in SAMPLES]
    accepted = 0
    start = time.monotonic()
    tracemalloc.start()
    for i in range(4000):
        if i % 2:
            data = rng.randbytes(rng.randrange(0, 200))
            if i % 4 == 1:
                data = b"MoIO\x01" + data  # get past the magic and version to reach deeper checks
        else:
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        decoder = FrameDecoder()
        try:
            frames = decoder.feed(data)
        except FrameError:
            continue
        # Whatever is accepted is canonical: it re-encodes to the bytes it came from.
        assert b"".join(map(encode_frame, frames)) == data[: len(data) - decoder.pending]
        accepted += bool(frames)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert accepted > 0
    assert peak < 4 << 20, peak
    assert time.monotonic() - start < 30


# ---- sockets ---------------------------------------------------------------------------------------


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_every_frame_type_through_a_socketpair(pair):
    a, b = pair
    for frame in SAMPLES:
        send_frame(a, frame, timeout=5)
        got = recv_frame(b, timeout=5)
        assert got == frame
    a.close()
    assert recv_frame(b, timeout=5) is None  # end of stream at a frame boundary


def test_loopback_tcp_with_payload_views():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=5)
        conn, _ = server.accept()
        with client, conn:
            segments = (Segment(1, 0, 3), Segment(2, 100, 5))
            sent = send_frame(client, WriteFrame(42, segments), [b"abc", memoryview(bytearray(b"defgh"))], timeout=5)
            assert sent == len(encode_frame(WriteFrame(42, segments, b"abcdefgh")))
            send_frame(client, ReadResponseFrame(43), [b"xy", b"", b"z"], timeout=5)
            assert recv_frame(conn, timeout=5) == WriteFrame(42, segments, b"abcdefgh")
            assert recv_frame(conn, timeout=5) == ReadResponseFrame(43, payload=b"xyz")


def test_64_mib_write_received_in_place(pair):
    a, b = pair
    size = 64 << 20
    first = 4096 + 3
    source = bytearray(random.Random(1).randbytes(1 << 16)) * (size // (1 << 16))
    region = bytearray(size + 8192)  # the "registered" memory the target owns
    frame = WriteFrame(7, (Segment(5, 8192, size - first), Segment(5, 0, first)))
    view = memoryview(source)
    sender = threading.Thread(target=send_frame, args=(a, frame, [view[:size - first], view[size - first:]]),
                              kwargs={"timeout": 20})  # fmt: skip
    seen = []

    def into(head, length):
        seen.append((head, length))
        target = memoryview(region)
        for seg in head.segments:  # the engine's bounds check against the registered region
            assert seg.mem_id == 5 and seg.offset + seg.length <= len(region)
        return [target[s.offset : s.offset + s.length] for s in head.segments]

    start = time.monotonic()
    sender.start()
    got = recv_frame(b, into=into, timeout=20)
    sender.join()
    elapsed = time.monotonic() - start
    assert seen == [(frame, size)] and got == frame and got.payload == b""
    assert region[8192 : 8192 + size - first] == source[: size - first]
    assert region[:first] == source[size - first :]
    assert region[first:8192] == bytes(8192 - first)
    assert elapsed < 10, elapsed


def test_into_may_drop_a_payload_and_the_stream_stays_usable(pair):
    a, b = pair
    send_frame(a, WriteFrame(1, (Segment(9, 0, 5),), b"hello"))
    send_frame(a, StatusFrame(2, 0))
    assert recv_frame(b, into=lambda head, length: None, timeout=5) == WriteFrame(1, (Segment(9, 0, 5),))
    assert recv_frame(b, timeout=5) == StatusFrame(2, 0)


def test_into_views_must_cover_the_payload_exactly(pair):
    a, b = pair
    send_frame(a, WriteFrame(1, (Segment(9, 0, 5),), b"hello"))
    with pytest.raises(ValueError, match="4 bytes of buffers for a payload of 5"):
        recv_frame(b, into=lambda head, length: [bytearray(4)], timeout=5)
    a, b = socket.socketpair()  # the stream position is lost after an error: a new connection
    with a, b:
        send_frame(a, WriteFrame(1, (Segment(9, 0, 5),), b"hello"))
        with pytest.raises(ValueError, match="read-only"):
            recv_frame(b, into=lambda head, length: [b"12345"], timeout=5)


def test_send_refuses_ambiguous_or_mismatched_payloads(pair):
    a, _ = pair
    with pytest.raises(ValueError, match="not both"):
        send_frame(a, WriteFrame(1, (Segment(0, 0, 1),), b"x"), [b"x"])
    with pytest.raises(FrameError) as info:
        send_frame(a, WriteFrame(1, (Segment(0, 0, 2),)), [b"x"])
    assert info.value.field == "write.payload"
    with pytest.raises(ValueError, match="carry no payload"):
        send_frame(a, StatusFrame(1, 0), [b"x"])


def test_recv_checks_the_header_before_reading_the_body(pair):
    a, b = pair
    a.sendall(_header(2, tf.DEFAULT_LIMITS.max_body(FrameType.WRITE) + 1))
    with pytest.raises(FrameError) as info:
        recv_frame(b, timeout=5)  # nothing else is sent: it must not wait for the body
    assert info.value.field == "header.body_length"


def test_eof_mid_frame_names_the_missing_bytes(pair):
    a, b = pair
    data = encode_frame(WriteFrame(3, (Segment(1, 0, 100),), bytes(100)))
    a.sendall(data[:-40])
    a.close()
    with pytest.raises(FrameTruncatedError) as info:
        recv_frame(b, timeout=5)
    assert info.value.missing == 40 and info.value.expected == len(data)
    assert isinstance(info.value, ConnectionError) and "40 bytes missing" in str(info.value)


def test_eof_inside_the_header(pair):
    a, b = pair
    a.sendall(encode_frame(CloseFrame())[:10])
    a.close()
    with pytest.raises(FrameTruncatedError) as info:
        recv_frame(b, timeout=5)
    assert info.value.missing == 14 and "at least 14" in str(info.value)


def test_receive_timeout(pair):
    a, b = pair
    with pytest.raises(FrameTimeoutError) as info:
        recv_frame(b, timeout=0.05)
    assert isinstance(info.value, TimeoutError) and info.value.at_boundary
    assert b.gettimeout() is None  # the socket's own timeout is put back
    a.sendall(encode_frame(StatusFrame(1, 0))[:30])
    with pytest.raises(FrameTimeoutError) as info:
        recv_frame(b, timeout=0.05)
    assert not info.value.at_boundary and info.value.done == 30 and info.value.expected == 32
    with pytest.raises(ValueError, match="positive"):
        recv_frame(b, timeout=0)


def test_send_timeout(pair):
    a, b = pair
    big = bytes(16 << 20)  # more than the socket buffers hold: the unread peer stalls the send
    with pytest.raises(FrameTimeoutError) as info:
        send_frame(a, WriteFrame(1, (Segment(0, 0, len(big)),)), [big], timeout=0.2)
    assert info.value.action == "send" and 0 < info.value.done < info.value.expected


def test_read_response_received_in_place_with_its_declared_length(pair):
    a, b = pair
    words = array.array("I", range(256))  # a non-byte buffer is sent as its bytes
    send_frame(a, ReadResponseFrame(8), [words], timeout=5)
    local = bytearray(2048)
    lengths = []

    def into(head, length):
        lengths.append(length)
        assert head == ReadResponseFrame(8) and length <= len(local) - 16
        return [memoryview(local)[16 : 16 + length]]

    assert recv_frame(b, into=into, timeout=5) == ReadResponseFrame(8)
    assert lengths == [1024] and local[16:1040] == words.tobytes() and local[:16] == bytes(16)
