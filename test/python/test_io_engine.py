"""IOEngine over the TCP backend with CPU memory: real loopback sockets, engines in this process and in a
spawned child process. Every wait is bounded, so a bug fails a test instead of hanging it."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest

from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, IOEngineSession, MemoryDesc,
                              MemoryLocationType, RdmaBackendConfig, StatusCode, TcpBackendConfig, TransferStatus,
                              wait_all)  # fmt: skip
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime.io.engine import NO_BACKEND, _merge

CPU = MemoryLocationType.CPU
WAIT_MS = 10_000
SIZES = [1, 4096, 1 << 20, 16 << 20]


def make_engine(key, backend=BackendType.RDMA, config=None):
    engine = IOEngine(key, IOEngineConfig("127.0.0.1", 0))
    engine.create_backend(backend, config)
    return engine


@pytest.fixture
def pair():
    a, b = make_engine("init"), make_engine("target")
    a.register_remote_engine(b.get_engine_desc())
    b.register_remote_engine(a.get_engine_desc())
    yield a, b
    a.close()
    b.close()


def register(engine, buffer):
    return engine.register_memory(buffer, len(buffer), -1, CPU)


def done(status, code=StatusCode.SUCCESS):
    assert status.WaitFor(WAIT_MS) == code, status.Message()
    return status


# ---- descriptors, backends, memory ----


def test_engine_desc_gets_the_bound_port_and_round_trips():
    engine = IOEngine("solo", IOEngineConfig("127.0.0.1", 0))
    assert engine.get_engine_desc().port == 0
    engine.create_backend(BackendType.TCP, TcpBackendConfig(num_connections=2))
    try:
        desc = engine.get_engine_desc()
        assert desc.port > 0 and desc.key == "solo" and desc.pid == os.getpid()
        assert EngineDesc.unpack(desc.pack()) == desc
        engine.create_backend(BackendType.TCP)  # duplicate: a warning, no second listener
        with pytest.raises(RuntimeError, match="same TCP transport"):
            engine.create_backend(BackendType.RDMA)
    finally:
        engine.close()


@pytest.mark.parametrize("kind", [BackendType.FABRIC, BackendType.Unknown])
def test_backends_that_do_not_exist_are_refused(kind):
    engine = IOEngine("x", IOEngineConfig("127.0.0.1", 0))
    with pytest.raises(NotImplementedError, match="not implemented"):
        engine.create_backend(kind)


def test_gpu_work_without_a_gpu_runtime_is_refused_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)  # no cuda-bindings (as on CI)
    monkeypatch.setenv("MORI_COMPILER_BACKEND", "nvvm")
    driver_mod._reset_drivers()
    engine = IOEngine("x", IOEngineConfig("127.0.0.1", 0))
    with pytest.raises(RuntimeError, match="needs a GPU runtime"):
        engine.create_backend(BackendType.XGMI)
    with pytest.raises(RuntimeError, match="needs a GPU runtime"):
        engine.register_memory(12345, 8, 0, MemoryLocationType.GPU)
    driver_mod._reset_drivers()


def test_port_one_is_refused():
    with pytest.raises(RuntimeError, match="port 1 is reserved"):
        IOEngine("p", IOEngineConfig("127.0.0.1", 1)).create_backend(BackendType.RDMA)


def test_register_memory_kinds_and_refusals():
    engine = IOEngine("m", IOEngineConfig())
    data = bytearray(b"abcdefgh")
    d0 = engine.register_memory(data, 8, -1, CPU)
    array = np.zeros(16, dtype=np.int32)
    d1 = engine.register_memory(array, array.nbytes, -1, CPU)
    raw = (ctypes.c_char * 32)()
    d2 = engine.register_memory(ctypes.addressof(raw), 32, -1, CPU)
    assert [d.id for d in (d0, d1, d2)] == [0, 1, 2]
    assert d1.size == 64 and d1.data == array.ctypes.data and d2.data == ctypes.addressof(raw)
    assert d0.engine_key == "m" and d0.loc == CPU and MemoryDesc.unpack(d0.pack()) == d0
    with pytest.raises(ValueError, match="read-only"):
        engine.register_memory(b"const", 5, -1, CPU)
    with pytest.raises(ValueError, match="larger than the buffer"):
        engine.register_memory(data, 9, -1, CPU)
    with pytest.raises(ValueError, match="Unknown"):
        engine.register_memory(data, 8, -1, MemoryLocationType.Unknown)
    with pytest.raises(TypeError, match="buffer protocol"):
        engine.register_memory(object(), 8, -1, CPU)
    with pytest.raises(TypeError, match="torch.Tensor"):
        engine.register_torch_tensor(data)
    assert [engine.allocate_transfer_uid() for _ in range(3)] == [0, 1, 2]


def test_merge_sorts_by_remote_offset_and_joins_contiguous_entries():
    assert _merge([0, 10, 20], [0, 10, 20], [10, 10, 10]) == [(0, [(0, 30)])]
    assert _merge([40, 0], [10, 0], [10, 10]) == [(0, [(0, 10), (40, 10)])]  # remote contiguous, local not
    assert _merge([0, 10], [0, 50], [10, 0]) == [(0, [(0, 10)])]  # zero-size dropped
    assert _merge([0, 10], [0, 20], [10, 10]) == [(0, [(0, 10)]), (20, [(10, 10)])]


# ---- data movement in one process ----


@pytest.mark.parametrize("size", SIZES)
def test_write_and_read_bytes_exactly(pair, size):
    a, b = pair
    pad = 64
    source = bytearray(os.urandom(size))
    target = bytearray(b"\xee" * (size + 2 * pad))
    ms, mt = register(a, source), register(b, target)
    done(a.write(ms, 0, mt, pad, size, a.allocate_transfer_uid()))
    assert target[pad : pad + size] == source
    assert target[:pad] == b"\xee" * pad and target[pad + size :] == b"\xee" * pad
    back = bytearray(size + 1)
    mb = register(a, back)
    done(a.read(mb, 1, mt, pad, size, a.allocate_transfer_uid()))
    assert back[1:] == source and back[0] == 0


@pytest.mark.parametrize("count", [1, 7, 256])
@pytest.mark.parametrize("stride", [1024, 1536])  # 1024: contiguous entries; 1536: gaps on both sides
def test_batch_write_and_read(pair, count, stride):
    a, b = pair
    entry = 1024
    source = bytearray(os.urandom(count * stride))
    target = bytearray(count * stride)
    ms, mt = register(a, source), register(b, target)
    offsets = list(range(0, count * stride, stride))[::-1]  # reversed: the engine sorts them
    sizes = [entry] * count
    (status,) = a.batch_write([ms], [offsets], [mt], [offsets], [sizes], [a.allocate_transfer_uid()])
    done(status)
    expected = bytearray(count * stride)
    for off in offsets:
        expected[off : off + entry] = source[off : off + entry]
    assert target == expected
    back = bytearray(count * stride)
    mb = register(a, back)
    (status,) = a.batch_read([mb], [offsets], [mt], [offsets], [sizes], [a.allocate_transfer_uid()])
    done(status)
    assert back == expected


def test_batch_over_several_pairs_and_the_early_return(pair):
    a, b = pair
    s1, s2, t1, t2 = bytearray(b"1" * 100), bytearray(b"2" * 100), bytearray(100), bytearray(100)
    m1, m2, n1, n2 = register(a, s1), register(a, s2), register(b, t1), register(b, t2)
    statuses = a.batch_write([m1, m2], [[0], [0]], [n1, n2], [[0], [0]], [[100], [50]], [1, 2])
    assert wait_all(statuses, WAIT_MS) == StatusCode.SUCCESS
    assert t1 == s1 and t2[:50] == s2[:50] and t2[50:] == bytes(50)
    stranger = IOEngine("stranger", IOEngineConfig())
    foreign = stranger.register_memory(bytearray(100), 100, -1, CPU)
    statuses = a.batch_write([m1, m1, m1], [[0]] * 3, [n1, foreign, n1], [[0]] * 3, [[10]] * 3, [3, 4, 5])
    assert statuses[1].Code() == StatusCode.ERR_BAD_STATE and statuses[1].Message() == NO_BACKEND
    assert statuses[2].Code() == StatusCode.INIT
    done(statuses[0])
    with pytest.raises(ValueError, match="equal lengths"):
        a.batch_write([m1], [[0]], [n1, n2], [[0]], [[1]], [6])


def test_session_ops(pair):
    a, b = pair
    source, target = bytearray(os.urandom(8192)), bytearray(8192)
    ms, mt = register(a, source), register(b, target)
    session = a.create_session(ms, mt)
    assert isinstance(session, IOEngineSession) and session.alive()
    done(session.write(0, 4096, 4096, session.allocate_transfer_uid()))
    assert target[4096:] == source[:4096] and target[:4096] == bytes(4096)
    done(session.batch_write([4096, 6144], [0, 2048], [2048, 2048], session.allocate_transfer_uid()))
    assert target[:4096] == source[4096:]
    back = bytearray(8192)
    read_session = a.create_session(register(a, back), mt)
    done(read_session.batch_read([0, 4096], [0, 4096], [4096, 4096], 99))
    assert back == target
    done(read_session.read(0, 0, 10, 100))
    assert session.write(0, 8000, 500, 101).Code() == StatusCode.ERR_INVALID_ARGS
    stranger = IOEngine("stranger", IOEngineConfig())
    assert a.create_session(ms, stranger.register_memory(bytearray(4), 4, -1, CPU)) is None
    with pytest.raises(RuntimeError, match="not registered"):  # the target is asked about its memory
        a.create_session(ms, mt._replace(id=77))
    with pytest.raises(RuntimeError, match="size mismatch"):
        a.create_session(ms, mt._replace(size=8193))


def test_notifications_are_peeked_per_initiator_and_uid(pair):
    a, b = pair
    ms, mt = register(a, bytearray(4096)), register(b, bytearray(4096))
    assert b.pop_inbound_transfer_status("init", 42) is None
    done(a.write(ms, 0, mt, 0, 4096, 42))
    deadline = time.monotonic() + 5
    while b.pop_inbound_transfer_status("init", 42) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    status = b.pop_inbound_transfer_status("init", 42)
    assert isinstance(status, TransferStatus) and status.Succeeded()
    assert b.pop_inbound_transfer_status("init", 42).Succeeded()  # a peek: still there
    assert b.pop_inbound_transfer_status("other", 42) is None
    assert b.pop_inbound_transfer_status("init", 43) is None


@pytest.mark.parametrize("how", ["config", "environment"])
def test_notifications_can_be_turned_off(how, monkeypatch):
    if how == "environment":  # MORI's override, applied at create_backend
        monkeypatch.setenv("MORI_IO_ENABLE_NOTIFICATION", "0")
    a = make_engine("quiet", config=RdmaBackendConfig(enable_notification=how == "environment"))
    b = make_engine("listener")
    try:
        a.register_remote_engine(b.get_engine_desc())
        ms, mt = register(a, bytearray(16)), register(b, bytearray(16))
        done(a.write(ms, 0, mt, 0, 16, 5))
        time.sleep(0.05)
        assert b.pop_inbound_transfer_status("quiet", 5) is None
    finally:
        a.close()
        b.close()


# ---- errors ----


def test_bounds_errors_are_synchronous(pair):
    a, b = pair
    ms, mt = register(a, bytearray(100)), register(b, bytearray(100))
    for status in (a.write(ms, 1, mt, 0, 100, 1), a.write(ms, 0, mt, 1, 100, 2), a.read(ms, 0, mt, 90, 11, 3)):
        assert status.Code() == StatusCode.ERR_INVALID_ARGS  # already failed when the call returned
        assert "outside" in status.Message()
    (status,) = a.batch_write([ms], [[0, 0]], [mt], [[0]], [[1, 1]], [4])
    assert status.Code() == StatusCode.ERR_INVALID_ARGS and "unequal" in status.Message()
    stranger = IOEngine("stranger", IOEngineConfig())
    foreign_local = stranger.register_memory(bytearray(100), 100, -1, CPU)
    status = a.write(foreign_local, 0, mt, 0, 10, 5)
    assert status.Code() == StatusCode.ERR_INVALID_ARGS and "not registered" in status.Message()
    with pytest.raises(ValueError):
        a.write(ms, -1, mt, 0, 1, 6)
    with pytest.raises(TypeError):
        a.write(ms, 0.5, mt, 0, 1, 6)


def test_no_backend_and_unregistered_remote_engine():
    a = IOEngine("lonely", IOEngineConfig())
    b = make_engine("unknown-to-a")
    try:
        ms, mt = register(a, bytearray(8)), register(b, bytearray(8))
        status = a.write(ms, 0, mt, 0, 8, 1)
        assert status.Code() == StatusCode.ERR_BAD_STATE and status.Message() == NO_BACKEND
        a.create_backend(BackendType.RDMA)
        assert a.read(ms, 0, mt, 0, 8, 2).Code() == StatusCode.ERR_BAD_STATE  # b never registered with a
        assert a.create_session(ms, mt) is None
    finally:
        a.close()
        b.close()


def test_unknown_and_deregistered_remote_memory_are_refused_by_the_target(pair):
    a, b = pair
    source, target = bytearray(b"x" * 64), bytearray(64)
    ms, mt = register(a, source), register(b, target)
    unknown = mt._replace(id=999)
    done(a.write(ms, 0, unknown, 0, 64, 1), StatusCode.ERR_INVALID_ARGS)
    b.deregister_memory(mt)
    status = done(a.write(ms, 0, mt, 0, 64, 2), StatusCode.ERR_INVALID_ARGS)
    assert "not registered" in status.Message()
    done(a.read(ms, 0, mt, 0, 64, 3), StatusCode.ERR_INVALID_ARGS)
    assert target == bytes(64) and source == b"x" * 64
    mt2 = register(b, target)  # the connection survived the refusals
    done(a.write(ms, 0, mt2, 0, 64, 4))
    assert target == source
    a.deregister_memory(ms)
    assert a.write(ms, 0, mt2, 0, 64, 5).Code() == StatusCode.ERR_INVALID_ARGS


def test_the_target_checks_bounds_itself(pair):
    # A descriptor that claims more than the target registered gets past the initiator's check: the target
    # refuses the segment before a byte lands, drains the payload and keeps the connection.
    a, b = pair
    source, target = bytearray(os.urandom(8192)), bytearray(b"\x11" * 4096)
    ms, mt = register(a, source), register(b, target)
    inflated = mt._replace(size=8192)
    status = done(a.write(ms, 0, inflated, 2048, 4096, 1), StatusCode.ERR_INVALID_ARGS)
    assert "outside memory" in status.Message()
    done(a.read(ms, 0, inflated, 0, 8192, 2), StatusCode.ERR_INVALID_ARGS)
    assert target == b"\x11" * 4096
    done(a.write(ms, 0, mt, 0, 4096, 3))
    assert target == source[:4096]


def test_a_hello_for_another_engine_is_answered_with_an_error(pair):
    from mori_compiler.runtime.io.tcp_frames import FrameType, HelloFrame
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    _, b = pair
    with socket.create_connection(("127.0.0.1", b.get_engine_desc().port), timeout=5) as sock:
        send_frame(sock, HelloFrame("intruder", "not-target"))
        answer = recv_frame(sock, timeout=5)
        assert answer.type is FrameType.ERROR and "not 'not-target'" in answer.message
        assert recv_frame(sock, timeout=5) is None  # and the target closed the connection


def test_a_target_refuses_frames_that_are_not_requests(pair):
    from mori_compiler.runtime.io.tcp_frames import FrameType, HelloFrame, ReadResponseFrame
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    _, b = pair
    with socket.create_connection(("127.0.0.1", b.get_engine_desc().port), timeout=5) as sock:
        send_frame(sock, HelloFrame("rogue", "target"))
        assert recv_frame(sock, timeout=5).reply
        send_frame(sock, ReadResponseFrame(1, payload=b"unasked"))
        answer = recv_frame(sock, timeout=5)
        assert answer.type is FrameType.ERROR and "READ_RESPONSE is not a request" in answer.message
        assert recv_frame(sock, timeout=5) is None


def test_a_peer_that_stops_answering_fails_the_transfer_after_io_timeout():
    from mori_compiler.runtime.io.tcp_frames import HelloFrame
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    mute = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def answer_hello_then_nothing():
        sock, _ = mute.accept()
        accepted.append(sock)
        hello = recv_frame(sock, timeout=5)
        send_frame(sock, HelloFrame("mute", hello.sender_key, reply=True))

    server = threading.Thread(target=answer_hello_then_nothing, daemon=True)
    server.start()
    engine = make_engine("patient", BackendType.TCP, TcpBackendConfig(io_timeout_ms=300))
    try:
        engine.register_remote_engine(EngineDesc._from_fields(key="mute", host="127.0.0.1", port=mute.getsockname()[1]))
        remote = MemoryDesc._from_fields(engine_key="mute", id=0, size=4096, loc=CPU)
        start = time.monotonic()
        status = engine.write(register(engine, bytearray(4096)), 0, remote, 0, 4096, 1)
        assert status.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP
        assert 0.2 < time.monotonic() - start < 5
    finally:
        engine.close()
        server.join(5)
        for sock in accepted:
            sock.close()
        mute.close()


def test_a_target_drops_a_peer_stalled_inside_a_frame():
    from mori_compiler.runtime.io.tcp_frames import (FrameType, HelloFrame, MemoryQueryFrame, Segment, WriteFrame,
                                                     encode_head)  # fmt: skip
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    b = make_engine("strict", BackendType.TCP, TcpBackendConfig(io_timeout_ms=200))
    try:
        register(b, bytearray(4096))
        with socket.create_connection(("127.0.0.1", b.get_engine_desc().port), timeout=5) as sock:
            send_frame(sock, HelloFrame("slow", "strict"))
            assert recv_frame(sock, timeout=5).reply
            time.sleep(0.4)  # idle at a frame boundary for longer than io_timeout: kept
            send_frame(sock, MemoryQueryFrame(9, 0))
            info = recv_frame(sock, timeout=5)
            assert info.type is FrameType.MEMORY_INFO and info.found and info.size == 4096
            sock.sendall(encode_head(WriteFrame(1, (Segment(0, 0, 4096),)), 4096) + b"x" * 100)  # then stall
            start = time.monotonic()
            assert recv_frame(sock, timeout=5) is None  # the target closed it
            assert time.monotonic() - start < 3
    finally:
        b.close()


def test_unreachable_target_raises():
    a = make_engine("caller")
    b = make_engine("gone")
    desc = b.get_engine_desc()
    mt = register(b, bytearray(8))
    b.close()
    try:
        a.register_remote_engine(desc)
        with pytest.raises(RuntimeError, match="cannot connect"):
            a.write(register(a, bytearray(8)), 0, mt, 0, 8, 1)
    finally:
        a.close()


# ---- concurrency ----


def test_several_threads_write_through_one_engine():
    a, b = make_engine("threads", config=RdmaBackendConfig(qp_per_transfer=3)), make_engine("t")  # 3 sockets
    try:
        a.register_remote_engine(b.get_engine_desc())
        chunk, workers, rounds = 64 << 10, 4, 8
        source = bytearray(os.urandom(chunk * workers * rounds))
        target = bytearray(len(source))
        ms, mt = register(a, source), register(b, target)
        errors = []

        def work(w):
            for r in range(rounds):
                off = (w * rounds + r) * chunk
                status = a.write(ms, off, mt, off, chunk, a.allocate_transfer_uid())
                if status.WaitFor(WAIT_MS) != StatusCode.SUCCESS:
                    errors.append(status.Message())

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and not any(t.is_alive() for t in threads)
        assert target == source
    finally:
        a.close()
        b.close()


def test_two_initiators_into_one_target():
    target_engine = make_engine("sink")
    initiators = [make_engine(f"src{i}") for i in range(2)]
    try:
        size = 1 << 20
        target = bytearray(2 * size)
        mt = register(target_engine, target)
        sources, statuses = [], []
        for i, engine in enumerate(initiators):
            engine.register_remote_engine(target_engine.get_engine_desc())
            sources.append(bytearray(os.urandom(size)))
            statuses.append(engine.write(register(engine, sources[i]), 0, mt, i * size, size, 7))
        assert wait_all(statuses, WAIT_MS) == StatusCode.SUCCESS
        assert target == sources[0] + sources[1]
    finally:
        for engine in (target_engine, *initiators):
            engine.close()


def test_close_ends_every_thread_and_socket():
    def ours():
        return [t for t in threading.enumerate() if t.name.startswith("mori-io-tcp-") and ("-closer" in t.name
                or "-closee" in t.name)]  # fmt: skip

    a, b = make_engine("closer", config=TcpBackendConfig(num_connections=2), backend=BackendType.TCP), make_engine("closee")
    a.register_remote_engine(b.get_engine_desc())
    done(a.write(register(a, bytearray(8)), 0, register(b, bytearray(8)), 0, 8, 1))
    assert len(ours()) == 1 + 2 * 2 + 1 + 2  # a: listener, 2 x (sender, receiver); b: listener, 2 servers
    a.close()
    b.close()
    deadline = time.monotonic() + 5
    while ours() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not ours()


# ---- two processes ----


def _target_process(conn, size):
    """A target engine in a child process: ships its descriptors, then serves until told otherwise."""
    engine = make_engine("child")
    memory = bytearray(b"\x5a" * size)
    desc = register(engine, memory)
    conn.send((engine.get_engine_desc().pack(), desc.pack()))
    engine.register_remote_engine(EngineDesc.unpack(conn.recv()))
    while True:
        command = conn.recv()
        if command == "dump":
            conn.send(bytes(memory))
        elif command.startswith("pop "):
            conn.send(engine.pop_inbound_transfer_status("parent", int(command[4:])) is not None)
        else:
            break
    engine.close()


@pytest.fixture
def child():
    def start(size):
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_target_process, args=(child_conn, size), daemon=True)
        proc.start()
        assert parent_conn.poll(60), "the child engine did not start"
        engine_bytes, mem_bytes = parent_conn.recv()
        engine = make_engine("parent")
        engine.register_remote_engine(EngineDesc.unpack(engine_bytes))
        parent_conn.send(engine.get_engine_desc().pack())
        started.append((proc, engine))
        return proc, parent_conn, engine, MemoryDesc.unpack(mem_bytes)

    started = []
    yield start
    for proc, engine in started:
        engine.close()
        proc.kill()
        proc.join(10)


def test_two_processes_write_read_notify(child):
    size = 16 << 20
    proc, conn, engine, remote = child(size + 128)
    for n, offset in ((1, 3), (4096, 7), (1 << 20, 100), (size, 128)):
        source = bytearray(os.urandom(n))
        done(engine.write(register(engine, source), 0, remote, offset, n, n))
        back = bytearray(n)
        done(engine.read(register(engine, back), 0, remote, offset, n, n + 1))
        assert back == source
    conn.send("dump")
    assert conn.poll(30)
    image = conn.recv()
    assert image[128:] == source and image[:3] + image[4:7] == b"\x5a" * 6  # untouched outside the writes
    conn.send(f"pop {size}")
    assert conn.poll(10) and conn.recv() is True
    conn.send("exit")


def test_killed_peer_fails_transfers_and_the_engine_stays_usable(child):
    size = 64 << 20
    proc, conn, engine, remote = child(size)
    warm = bytearray(16)
    done(engine.write(register(engine, warm), 0, remote, 0, 16, 1))  # connection up
    os.kill(proc.pid, signal.SIGSTOP)  # the peer stops reading: the transfers below cannot complete
    big = bytearray(size)
    local = register(engine, big)
    read_status = engine.read(local, 0, remote, 0, 4096, 2)
    start = time.monotonic()
    write_status = engine.write(local, 0, remote, 0, size, 3)
    assert time.monotonic() - start < 1.0  # asynchronous: the connection's thread sends
    time.sleep(0.3)
    assert read_status.WaitFor(0) == StatusCode.IN_PROGRESS and write_status.WaitFor(0) == StatusCode.IN_PROGRESS
    proc.kill()
    proc.join(10)
    assert read_status.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP
    assert write_status.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP
    with pytest.raises(RuntimeError, match="cannot connect"):  # no silent reconnection to a dead peer
        engine.write(local, 0, remote, 0, 16, 4)
    other = make_engine("survivor")
    try:
        engine.register_remote_engine(other.get_engine_desc())
        target = bytearray(16)
        done(engine.write(register(engine, warm), 0, register(other, target), 0, 16, 5))
        assert target == warm
    finally:
        other.close()


def test_no_byte_lands_after_deregister_memory_returns():
    """A peer inside a WRITE when the target deregisters: deregistration waits for the frame, then (the
    peer stalls) shuts its connection; the rest of the payload never lands in the memory."""
    from mori_compiler.runtime.io.tcp_frames import DEFAULT_LIMITS, HelloFrame, Segment, WriteFrame, encode_head
    from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

    target = make_engine("dereg-target")
    try:
        n = 1 << 16
        memory = (ctypes.c_char * n)()
        desc = target.register_memory(ctypes.addressof(memory), n, -1, CPU)
        peer = socket.create_connection(("127.0.0.1", target.get_engine_desc().port), timeout=10)
        send_frame(peer, HelloFrame("raw-peer", "dereg-target"))
        assert recv_frame(peer).type.name == "HELLO"
        peer.sendall(encode_head(WriteFrame(1, (Segment(desc.id, 0, n),)), n, DEFAULT_LIMITS) + b"A" * 100)
        time.sleep(0.2)  # the target holds the region, inside the frame
        start = time.monotonic()
        target.deregister_memory(desc)
        assert 0.5 < time.monotonic() - start < 10  # it waited for the frame, then shut the connection
        assert bytes(memory[:100]) == b"A" * 100
        try:
            peer.sendall(b"B" * (n - 100))
        except OSError:
            pass  # the connection is already gone
        time.sleep(0.2)
        assert bytes(memory[100:]) == bytes(n - 100)  # nothing landed after deregister_memory returned
        peer.close()
    finally:
        target.close()
