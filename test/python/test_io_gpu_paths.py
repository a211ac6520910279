"""MORI-IO's GPU paths on a pretend GPU (``io_fake_gpu.HostGpuDriver``: "device memory" in shared host
memory, IPC handles naming it, copies that run only when waited for), so that CI without a GPU checks the
GPU-IPC backend (registration, eligibility, mapping, offsets, completion, faults), GPU memory over TCP
(staging), route selection and MORI_DISABLE_AUTO_XGMI. The same paths run on a real GPU in
test/python/gpu/test_io_gpu.py.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time

import pytest

from io_fake_gpu import HostGpuDriver, install
from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, MemoryLocationType,
                              StatusCode, TcpBackendConfig)  # fmt: skip
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime.io.descriptors import ZERO_HANDLE

GPU, CPU = MemoryLocationType.GPU, MemoryLocationType.CPU
WAIT_MS = 10_000


@pytest.fixture
def gpu(monkeypatch):
    driver = HostGpuDriver(devices=2, peers={(0, 1), (1, 0)})
    install(driver, monkeypatch)
    monkeypatch.delenv("MORI_DISABLE_AUTO_XGMI", raising=False)
    yield driver
    driver_mod._reset_drivers()
    driver.close()


@pytest.fixture
def engines():
    made = []

    def make(key, *backends, host="127.0.0.1"):
        engine = IOEngine(key, IOEngineConfig(host, 0))
        for backend in backends:
            engine.create_backend(backend)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def _bytes(n, seed):
    return random.Random(seed).randbytes(n)


def _notified(engine, initiator, uid, seconds=5.0) -> bool:
    """Whether the notice of ``uid`` arrives (it follows the data on the socket: poll, as MORI's tests)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if engine.pop_inbound_transfer_status(initiator, uid) is not None:
            return True
        time.sleep(0.005)
    return False


def done(status, code=StatusCode.SUCCESS):
    assert status.WaitFor(WAIT_MS) == code, status.Message()
    return status


def test_registration_fills_bus_id_handle_and_offset_of_a_sub_allocation(gpu, engines):
    engine = engines("e", BackendType.XGMI)
    base = gpu.malloc(1 << 16)
    desc = engine.register_memory(base + 4099, 1000, 1, GPU)
    assert desc.loc == GPU and desc.device_id == 1 and desc.device_bus_id == gpu.bus_ids[1]
    assert desc.ipc_offset == 4099 and desc.ipc_handle != ZERO_HANDLE and desc.data == base + 4099
    assert MemoryDesc.unpack(desc.pack()) == desc and MemoryDesc.unpack(desc.pack()).ipc_handle == desc.ipc_handle
    with pytest.raises(ValueError, match="runs past the end"):
        engine.register_memory(base + 100, 1 << 16, 0, GPU)
    with pytest.raises(ValueError, match="is not GPU memory"):
        engine.register_memory(12345, 8, 0, GPU)
    with pytest.raises(ValueError, match="device_id"):
        engine.register_memory(base, 8, -1, GPU)


def test_memory_registered_before_the_gpu_ipc_backend_keeps_a_zero_handle(gpu, engines, caplog):
    engine = engines("late", BackendType.TCP)
    early = engine.register_memory(gpu.malloc(256), 256, 0, GPU)
    with caplog.at_level(logging.WARNING, logger="mori_compiler.io"):
        engine.create_backend(BackendType.XGMI)
    assert early.ipc_handle == ZERO_HANDLE  # MORI does not replay registrations either
    assert "registered before the XGMI backend" in caplog.text
    assert engine.register_memory(gpu.malloc(256), 256, 0, GPU).ipc_handle != ZERO_HANDLE


@pytest.mark.parametrize("api", ["engine", "session"])
def test_one_engine_write_read_batch_completes_only_through_the_event(gpu, engines, api):
    engine = engines("solo", BackendType.XGMI)
    src_base, dst_base = gpu.malloc(1 << 20), gpu.malloc(1 << 20)
    payload = _bytes(1 << 20, 1)
    gpu.write(src_base, payload)
    gpu.write(dst_base, b"\xee" * (1 << 20))
    src = engine.register_memory(src_base, 1 << 20, 0, GPU)
    dst = engine.register_memory(dst_base + 64, (1 << 20) - 64, 1, GPU)  # another device, P2P
    session = engine.create_session(src, dst) if api == "session" else None
    write = session.write(0, 0, 4096, 7) if session else engine.write(src, 0, dst, 0, 4096, 7)
    assert gpu.read(dst_base + 64, 4096) == b"\xee" * 4096  # queued, not yet run: nothing moved
    done(write)
    assert write.Message() == "" and gpu.read(dst_base + 64, 4096) == payload[:4096]
    offsets = [8192 + i * 3000 for i in range(16)]  # strided: 16 separate copies
    if session:
        status = session.batch_write(offsets, offsets, [1000] * 16, 8)
    else:
        (status,) = engine.batch_write([src], [offsets], [dst], [offsets], [[1000] * 16], [8])
    done(status)
    image = gpu.read(dst_base + 64, (1 << 20) - 64)
    for off in offsets:
        assert image[off : off + 1000] == payload[off : off + 1000]
        assert image[off + 1000 : off + 3000] == b"\xee" * 2000  # the gaps untouched
    back = engine.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    read = session and engine.create_session(back, dst).read(0, 8192, 1000, 9) or engine.read(back, 0, dst, 8192, 1000, 9)
    done(read)
    assert gpu.read(back.data, 1000) == payload[8192:9192]
    assert engine.pop_inbound_transfer_status("solo", 7) is None  # GPU IPC never notifies


def test_in_progress_polling_completes_without_wait(gpu, engines):
    engine = engines("poll", BackendType.XGMI)
    a = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    b = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    status = engine.write(a, 0, b, 0, 64, 1)
    polls = 0
    while status.InProgress():
        polls += 1
        assert polls < 1000
    assert status.Succeeded()


def test_ordering_after_the_callers_stream_and_one_stream_per_call(gpu, engines):
    engine = engines("order", BackendType.XGMI)
    a = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    b = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    gpu.calls.clear()
    done(engine.write(a, 0, b, 0, 64, 1))  # the caller's stream is idle: no event, no wait
    names = [c[0] for c in gpu.calls]
    assert "stream_query" in names and "stream_wait_event" not in names and names.count("event_record") == 1
    producer = gpu.malloc(64)
    gpu.write(producer, b"produced")
    gpu.streams[0].append(("copy", a.data, producer, 8))  # the caller's work that fills a, still queued
    gpu.calls.clear()
    done(engine.write(a, 0, b, 0, 8, 2))
    assert gpu.read(b.data, 8) == b"produced"
    names = [c[0] for c in gpu.calls]
    record_caller = names.index("event_record")
    assert gpu.calls[record_caller][1] == 0  # the caller's (default) stream
    wait = names.index("stream_wait_event")
    copy = names.index("memcpy_async")
    assert record_caller < wait < copy < names.index("event_record", copy)
    assert gpu.calls[wait][1] == gpu.calls[copy][2]  # the copy stream waited before copying


def test_out_of_range_is_synchronous_and_nothing_moves(gpu, engines):
    engine = engines("bounds", BackendType.XGMI)
    a = engine.register_memory(gpu.malloc(128), 128, 0, GPU)
    b_base = gpu.malloc(256)
    gpu.write(b_base, b"\x11" * 256)
    b = engine.register_memory(b_base, 128, 0, GPU)
    gpu.calls.clear()
    status = engine.write(a, 0, b, 100, 29, 1)
    assert status.Code() == StatusCode.ERR_INVALID_ARGS and "outside" in status.Message()
    assert not [c for c in gpu.calls if c[0] == "memcpy_async"]
    assert gpu.read(b_base, 256) == b"\x11" * 256


def test_a_driver_failure_is_err_gpu_op_and_the_backend_stays_usable(gpu, engines):
    engine = engines("fails", BackendType.XGMI)
    a = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    b = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
    gpu.fail.add("memcpy_async")
    status = engine.write(a, 0, b, 0, 64, 1)
    assert status.Code() == StatusCode.ERR_GPU_OP and "injected" in status.Message()
    gpu.fail.clear()
    done(engine.write(a, 0, b, 0, 64, 2))
    gpu.fail.add("event_query")
    status = engine.write(a, 0, b, 0, 64, 3)
    assert status.WaitFor(0) == StatusCode.ERR_GPU_OP


def test_two_engines_of_one_process_reach_each_other_through_their_registrations(gpu, engines):
    a, b = engines("a", BackendType.XGMI), engines("b", BackendType.XGMI)
    a.register_remote_engine(b.get_engine_desc())
    src = a.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    gpu.write(src.data, _bytes(4096, 2))
    dst = b.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    done(a.write(src, 0, dst, 0, 4096, 1))  # the own-process handle cannot be opened: registry used
    assert gpu.read(dst.data, 4096) == _bytes(4096, 2)
    assert not [c for c in gpu.calls if c[0] == "ipc_open_mem_handle"]  # same pid: no handle opened
    b.deregister_memory(dst)
    status = a.write(src, 0, dst, 0, 16, 2)
    assert status.Code() == StatusCode.ERR_BAD_STATE and "not registered" in status.Message()
    assert a.create_session(src, dst) is None


def test_route_gpu_ipc_first_then_tcp_and_cpu_memory_over_tcp(gpu, engines):
    a = engines("ra", BackendType.TCP, BackendType.XGMI)
    b = engines("rb", BackendType.TCP, BackendType.XGMI)
    a.register_remote_engine(b.get_engine_desc())
    b.register_remote_engine(a.get_engine_desc())
    g_src = a.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    gpu.write(g_src.data, _bytes(4096, 3))
    g_dst = b.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    c_dst = bytearray(4096)
    c_desc = b.register_memory(c_dst, 4096, -1, CPU)
    gpu.calls.clear()
    done(a.write(g_src, 0, g_dst, 0, 4096, 1))
    assert any(c[0] == "memcpy_async" for c in gpu.calls)  # GPU IPC carried it
    done(a.write(g_src, 0, c_desc, 0, 4096, 2))  # GPU -> CPU: TCP, staged through pinned memory
    assert bytes(c_dst) == _bytes(4096, 3)
    assert _notified(b, "ra", 2) and a.pop_inbound_transfer_status("ra", 2) is None
    assert b.pop_inbound_transfer_status("ra", 1) is None  # the GPU-IPC write left no notice


def test_gpu_memory_over_tcp_both_ways_and_sides(gpu, engines):
    """GPU memory on the initiator and on the target, write and read, frames larger than one staging."""
    config = TcpBackendConfig(max_frame_payload=64 << 10, num_connections=2)
    a, b = IOEngine("ta", IOEngineConfig("127.0.0.1", 0)), IOEngine("tb", IOEngineConfig("127.0.0.1", 0))
    try:
        a.create_backend(BackendType.TCP, config)
        b.create_backend(BackendType.TCP, config)
        a.register_remote_engine(b.get_engine_desc())
        n = (1 << 20) + 3
        payload = _bytes(n, 4)
        src = a.register_memory(gpu.malloc(n), n, 1, GPU)
        gpu.write(src.data, payload)
        target_base = gpu.malloc(n + 200)
        gpu.write(target_base, b"\x77" * (n + 200))
        dst = b.register_memory(target_base + 100, n, 0, GPU)
        done(a.write(src, 0, dst, 0, n, 1))
        image = gpu.read(target_base, n + 200)
        assert image[100 : 100 + n] == payload and image[:100] == image[100 + n :] == b"\x77" * 100
        back = a.register_memory(gpu.malloc(n), n, 0, GPU)
        offs = [i * 5000 for i in range(50)]
        (status,) = a.batch_read([back], [offs], [dst], [offs], [[1234] * 50], [2])
        done(status)
        got = gpu.read(back.data, n)
        for off in offs:
            assert got[off : off + 1234] == payload[off : off + 1234]
        cpu_back = bytearray(n)
        done(a.read(a.register_memory(cpu_back, n, -1, CPU), 0, dst, 0, n, 3))  # GPU target -> CPU initiator
        assert bytes(cpu_back) == payload
    finally:
        a.close()
        b.close()


def test_auto_xgmi_follows_moris_reading_of_the_variable(gpu, engines, monkeypatch):
    for value, expect in ((None, False), ("1", False), ("0", True), ("00", True), ("false", False)):
        if value is None:
            monkeypatch.delenv("MORI_DISABLE_AUTO_XGMI", raising=False)
        else:
            monkeypatch.setenv("MORI_DISABLE_AUTO_XGMI", value)
        engine = engines(f"auto{value}", BackendType.RDMA)
        has = engine._backends.get(BackendType.XGMI) is not None
        assert has is expect, value
        desc = engine.register_memory(gpu.malloc(64), 64, 0, GPU)
        assert (desc.ipc_handle != ZERO_HANDLE) is expect


def test_rdma_over_tcp_can_be_refused(monkeypatch, engines, tmp_path, caplog):
    from mori_compiler.runtime.io import engine as engine_mod

    monkeypatch.setattr(engine_mod, "RDMA_SYSFS", str(tmp_path / "none"))
    monkeypatch.setenv("MORI_IO_RDMA_OVER_TCP", "0")
    with pytest.raises(RuntimeError, match="no RDMA device, and MORI_IO_RDMA_OVER_TCP=0"):
        engines("refuse", BackendType.RDMA)
    engines("tcp ok", BackendType.TCP)
    monkeypatch.delenv("MORI_IO_RDMA_OVER_TCP")
    (tmp_path / "ib").mkdir()
    (tmp_path / "ib" / "mlx5_0").mkdir()
    monkeypatch.setattr(engine_mod, "RDMA_SYSFS", str(tmp_path / "ib"))
    with caplog.at_level(logging.WARNING, logger="mori_compiler.io"):
        engines("served", BackendType.RDMA)
    assert "RDMA devices (mlx5_0) are not used" in caplog.text and "served by the TCP transport" in caplog.text


def test_eligibility_rules(gpu, engines):
    a = engines("ea", BackendType.XGMI)
    mine = a.register_memory(gpu.malloc(64), 64, 0, GPU)
    other_node = engines("eb", BackendType.XGMI)
    remote = other_node.register_memory(gpu.malloc(64), 64, 0, GPU)
    backend = a._backends[BackendType.XGMI]
    assert not backend.can_handle(mine, remote)  # engine not registered
    desc = other_node.get_engine_desc()
    a.register_remote_engine(desc._replace(node_id="elsewhere"))
    assert not backend.can_handle(mine, remote)  # another node
    a.register_remote_engine(desc)
    assert backend.can_handle(mine, remote)
    assert not backend.can_handle(mine, remote._replace(device_bus_id=""))
    hidden = remote._replace(device_bus_id="0000:99:00.0")  # a GPU this process does not see
    assert backend.can_handle(mine, hidden)
    assert not backend.can_handle(mine, hidden._replace(ipc_handle=ZERO_HANDLE))
    gpu.peers.clear()
    backend.devices._p2p.clear()
    assert not backend.can_handle(mine, remote._replace(device_bus_id=gpu.bus_ids[1]))  # no P2P 0 -> 1
    cpu = a.register_memory(bytearray(64), 64, -1, CPU)
    assert not backend.can_handle(cpu, remote)
    status = a.write(cpu, 0, remote, 0, 64, 1)  # only GPU IPC here and it cannot take CPU memory
    assert status.Code() == StatusCode.ERR_BAD_STATE


# ---- another process: the IPC handle is opened, the offset honoured ----


def _gpu_target(conn, offset, size):
    driver = HostGpuDriver(devices=1)
    install(driver)
    engine = IOEngine("gpu-child", IOEngineConfig("127.0.0.1", 0))
    engine.create_backend(BackendType.XGMI)
    base = driver.malloc(offset + size + 64)
    driver.write(base, b"\x5a" * (offset + size + 64))
    desc = engine.register_memory(base + offset, size, 0, GPU)
    conn.send((engine.get_engine_desc().pack(), desc.pack()))
    while True:
        command = conn.recv()
        if command == "dump":
            conn.send(driver.read(base, offset + size + 64))
        else:
            break
    engine.close()
    driver.close()


def test_another_process_memory_through_its_ipc_handle(gpu, engines):
    offset, size = 1 << 16, 1 << 16
    ctx = multiprocessing.get_context("spawn")
    parent, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_gpu_target, args=(child_conn, offset, size), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "the child engine did not start"
        engine_bytes, mem_bytes = parent.recv()
        remote = MemoryDesc.unpack(mem_bytes)
        assert remote.ipc_offset == offset and remote.ipc_handle != ZERO_HANDLE
        engine = engines("gpu-parent", BackendType.XGMI)
        remote_engine = EngineDesc.unpack(engine_bytes)
        assert remote_engine.pid != os.getpid()
        engine.register_remote_engine(remote_engine)
        src = engine.register_memory(gpu.malloc(size), size, 0, GPU)
        gpu.write(src.data, _bytes(size, 5))
        done(engine.write(src, 0, remote, 100, size - 200, 1))
        parent.send("dump")
        assert parent.poll(30)
        image = parent.recv()
        assert image[offset + 100 : offset + size - 100] == _bytes(size, 5)[: size - 200]
        assert image[: offset + 100] == b"\x5a" * (offset + 100)  # nothing before the written range
        assert image[offset + size - 100 :] == b"\x5a" * 164  # nor after it
        back = engine.register_memory(gpu.malloc(size), size, 0, GPU)
        done(engine.read(back, 0, remote, 100, 1000, 2))
        assert gpu.read(back.data, 1000) == _bytes(size, 5)[:1000]
        liar = remote._replace(size=remote.size + 100)  # claims more than the owner exported
        status = engine.write(src, 0, liar, 0, size, 3)
        assert status.Code() == StatusCode.ERR_BAD_STATE and "claims" in status.Message()
        gpu.calls.clear()
        engine.deregister_remote_engine(remote_engine)  # its mapping is closed: the owner may free the memory
        assert [c for c in gpu.calls if c[0] == "ipc_close_mem_handle"]
        assert engine.write(src, 0, remote, 0, 8, 4).Code() == StatusCode.ERR_BAD_STATE  # no route any more
        parent.send("exit")
        proc.join(30)
    finally:
        proc.kill()
        proc.join(10)


def test_a_staging_failure_on_the_target_answers_err_gpu_op_and_the_connection_stays(gpu, engines):
    a, b = engines("sa", BackendType.TCP), engines("sb", BackendType.TCP)
    a.register_remote_engine(b.get_engine_desc())
    src = a.register_memory(bytearray(_bytes(4096, 6)), 4096, -1, CPU)
    dst = b.register_memory(gpu.malloc(4096), 4096, 0, GPU)
    gpu.fail.add("host_alloc")
    status = a.write(src, 0, dst, 0, 4096, 1)
    assert status.WaitFor(WAIT_MS) == StatusCode.ERR_GPU_OP and "staging" in status.Message()
    gpu.fail.clear()
    done(a.write(src, 0, dst, 0, 4096, 2))  # same connection, now with a staging buffer
    assert gpu.read(dst.data, 4096) == _bytes(4096, 6)
