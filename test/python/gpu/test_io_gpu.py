"""MORI-IO on a real GPU: the GPU-IPC backend (BackendType.XGMI: CUDA IPC through the runtime driver) in one
process (one engine; two engines) and between two processes on one GPU, GPU memory over the TCP backend
(staged through pinned host memory), and the ordering of a transfer after the caller's stream. Memory is
torch tensors, registered as views at odd offsets into larger allocations (the sub-allocation case of
MORI's test_xgmi_suballocation). Destinations are poisoned first; bytes outside the transferred ranges are
checked unchanged. With several GPUs the copies also cross devices.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

pytestmark = pytest.mark.gpu

WAIT_MS = 30_000
POISON = 0xA5


def _torch():
    import torch

    return torch


def _io():
    from mori_compiler import io

    return io


def _engine(key, *backends, **configs):
    io = _io()
    engine = io.IOEngine(key, io.IOEngineConfig("127.0.0.1", 0))
    for backend in backends:
        engine.create_backend(backend, configs.get(backend.name))
    return engine


def _random_bytes(n, seed, device="cuda"):
    torch = _torch()
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).to(device)


def _view(total, offset, n, fill=POISON):
    """A uint8 view of ``n`` bytes at ``offset`` into a fresh GPU allocation of ``total`` bytes (poisoned)."""
    torch = _torch()
    whole = torch.full((total,), fill, dtype=torch.uint8, device="cuda")
    return whole, whole[offset : offset + n]


def _done(status, code=None):
    io = _io()
    code = io.StatusCode.SUCCESS if code is None else code
    assert status.WaitFor(WAIT_MS) == code, status.Message()


@pytest.mark.parametrize("n", [1, 7, 4096, (1 << 20) + 3, 64 << 20])
def test_one_engine_gpu_ipc_write_read_sizes(n):
    io, torch = _io(), _torch()
    engine = _engine("one", io.BackendType.XGMI)
    try:
        _, src = _view(n + 8192, 4099, n)
        src.copy_(_random_bytes(n, n))
        dst_whole, dst = _view(n + 8192, 8191, n)
        ms, md = engine.register_torch_tensor(src), engine.register_torch_tensor(dst)
        from mori_compiler.runtime.driver import default_driver

        segment_base = default_driver().address_range(dst.data_ptr())[0]  # torch sub-allocates segments
        assert md.ipc_offset == dst.data_ptr() - segment_base >= 8191
        assert md.ipc_handle != bytes(64) and md.device_bus_id
        _done(engine.write(ms, 0, md, 0, n, 1))
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        assert bool((dst_whole[:8191] == POISON).all()) and bool((dst_whole[8191 + n :] == POISON).all())
        back_whole, back = _view(n + 64, 1, n)
        _done(engine.read(engine.register_torch_tensor(back), 0, md, 0, n, 2))
        assert torch.equal(back, src) and int(back_whole[0]) == POISON
        assert engine.pop_inbound_transfer_status("one", 1) is None
    finally:
        engine.close()


@pytest.mark.parametrize("api", ["engine", "session"])
@pytest.mark.parametrize("count,contiguous", [(1, False), (64, False), (4096, False), (4096, True)])
def test_gpu_ipc_batches(api, count, contiguous):
    io, torch = _io(), _torch()
    engine = _engine("batch", io.BackendType.XGMI)
    try:
        size = 33
        stride = size if contiguous else size + 1
        total = count * stride
        src = _random_bytes(total, count)
        _, dst = _view(total + 256, 128, total)
        ms, md = engine.register_torch_tensor(src), engine.register_torch_tensor(dst)
        offs = [i * stride for i in range(count)]
        import random

        random.Random(count).shuffle(offs)  # the backend sorts and merges
        if api == "session":
            status = engine.create_session(ms, md).batch_write(offs, offs, [size] * count, 3)
        else:
            (status,) = engine.batch_write([ms], [offs], [md], [offs], [[size] * count], [3])
        _done(status)
        torch.cuda.synchronize()
        mask = torch.zeros(total, dtype=torch.bool, device="cuda")
        for off in offs:
            mask[off : off + size] = True
        assert torch.equal(dst[mask], src[mask]) and bool((dst[~mask] == POISON).all())
    finally:
        engine.close()


def test_copies_wait_for_the_callers_stream():
    """The source is produced on a side stream by slow work queued just before the call: the transfer must
    move the produced bytes, not the ones before (the copy stream waits for the caller's stream)."""
    io, torch = _io(), _torch()
    engine = _engine("order", io.BackendType.XGMI)
    try:
        n = 16 << 20
        src = torch.zeros(n, dtype=torch.uint8, device="cuda")
        dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda")
        ms, md = engine.register_torch_tensor(src), engine.register_torch_tensor(dst)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        side = torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            for _ in range(20):  # ~ms of work ahead of the fill
                a = a @ a
                a = a / a.norm()
            src.fill_(0x3C)
            status = engine.write(ms, 0, md, 0, n, 4)
        _done(status)
        assert bool((dst == 0x3C).all())
    finally:
        engine.close()


def test_two_engines_one_process():
    io, torch = _io(), _torch()
    a, b = _engine("a", io.BackendType.XGMI), _engine("b", io.BackendType.XGMI)
    try:
        a.register_remote_engine(b.get_engine_desc())
        src = _random_bytes(1 << 20, 9)
        _, dst = _view((1 << 20) + 100, 50, 1 << 20)
        ms, md = a.register_torch_tensor(src), b.register_torch_tensor(dst)
        _done(a.write(ms, 0, md, 0, 1 << 20, 1))
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("n", [1, 4097, (4 << 20) + 5, 64 << 20])
def test_gpu_memory_over_tcp(n):
    io, torch = _io(), _torch()
    a, b = _engine("ta", io.BackendType.TCP), _engine("tb", io.BackendType.TCP)
    try:
        a.register_remote_engine(b.get_engine_desc())
        src = _random_bytes(n, n + 1)
        dst_whole, dst = _view(n + 64, 32, n)
        ms, md = a.register_torch_tensor(src), b.register_torch_tensor(dst)
        _done(a.write(ms, 0, md, 0, n, 1))
        torch.cuda.synchronize()
        assert torch.equal(dst, src) and bool((dst_whole[:32] == POISON).all())
        back = torch.full((n,), POISON, dtype=torch.uint8, device="cuda")
        _done(a.read(a.register_torch_tensor(back), 0, md, 0, n, 2))
        assert torch.equal(back, src)
        cpu = torch.full((n,), POISON, dtype=torch.uint8)
        _done(a.read(a.register_torch_tensor(cpu), 0, md, 0, n, 3))  # GPU target -> CPU initiator
        assert torch.equal(cpu, src.cpu())
    finally:
        a.close()
        b.close()


# ---- two processes on one GPU ----

_SUB_OFFSET = 64 << 20  # the registered view starts 64 MiB into its allocation (MORI's sub-allocation test)
_SUB_SIZE = 1 << 20


def _gpu_child(conn):
    import torch

    from mori_compiler import io

    engine = io.IOEngine("child", io.IOEngineConfig("127.0.0.1", 0))
    engine.create_backend(io.BackendType.XGMI)
    whole = torch.full((_SUB_OFFSET + _SUB_SIZE + 4096,), POISON, dtype=torch.uint8, device="cuda")
    view = whole[_SUB_OFFSET : _SUB_OFFSET + _SUB_SIZE]
    view[:] = torch.arange(_SUB_SIZE, device="cuda", dtype=torch.int64).remainder(251).to(torch.uint8)
    torch.cuda.synchronize()
    desc = engine.register_torch_tensor(view)
    conn.send((engine.get_engine_desc().pack(), desc.pack()))
    while True:
        command = conn.recv()
        if command == "dump":
            torch.cuda.synchronize()
            conn.send(whole.cpu().numpy().tobytes())
        else:
            break
    engine.close()


def test_gpu_ipc_between_two_processes_on_one_gpu():
    io, torch = _io(), _torch()
    ctx = multiprocessing.get_context("spawn")
    parent, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_gpu_child, args=(child_conn,), daemon=True)
    proc.start()
    engine = _engine("parent", io.BackendType.XGMI)
    try:
        assert parent.poll(120), "the child engine did not start"
        engine_bytes, mem_bytes = parent.recv()
        remote = io.MemoryDesc.unpack(mem_bytes)
        remote_engine = io.EngineDesc.unpack(engine_bytes)
        assert remote_engine.pid != os.getpid() and remote.ipc_offset >= _SUB_OFFSET
        engine.register_remote_engine(remote_engine)
        expected = torch.arange(_SUB_SIZE, device="cuda", dtype=torch.int64).remainder(251).to(torch.uint8)
        back = torch.full((_SUB_SIZE,), POISON, dtype=torch.uint8, device="cuda")
        mb = engine.register_torch_tensor(back)
        offs = [i * 4096 for i in range(0, 256, 2)]  # strided batch read: honours ipc_offset
        (status,) = engine.batch_read([mb], [offs], [remote], [offs], [[4096] * len(offs)], [1])
        _done(status)
        for off in offs:
            assert torch.equal(back[off : off + 4096], expected[off : off + 4096])
        assert int(back[4096]) == POISON
        src = _random_bytes(100_000, 11)
        _done(engine.write(engine.register_torch_tensor(src), 0, remote, 1000, 100_000, 2))
        parent.send("dump")
        assert parent.poll(60)
        image = torch.frombuffer(bytearray(parent.recv()), dtype=torch.uint8)
        region = image[_SUB_OFFSET : _SUB_OFFSET + _SUB_SIZE]
        assert torch.equal(region[1000:101_000], src.cpu())
        assert torch.equal(region[:1000], expected[:1000].cpu())
        assert torch.equal(region[101_000:], expected[101_000:].cpu())
        assert bool((image[:_SUB_OFFSET] == POISON).all()) and bool((image[_SUB_OFFSET + _SUB_SIZE :] == POISON).all())
        session = engine.create_session(mb, remote)
        assert session is not None
        _done(session.read(0, 1000, 100_000, 3))
        assert torch.equal(back[:100_000], src)
        parent.send("exit")
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        engine.close()
        if proc.is_alive():
            proc.kill()
        proc.join(10)


def test_gpu_ipc_across_devices():
    io, torch = _io(), _torch()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    engine = _engine("x", io.BackendType.XGMI)
    try:
        src = _random_bytes(1 << 20, 12, device="cuda:0")
        dst = torch.full((1 << 20,), POISON, dtype=torch.uint8, device="cuda:1")
        _done(engine.write(engine.register_torch_tensor(src), 0, engine.register_torch_tensor(dst), 0, 1 << 20, 1))
        torch.cuda.synchronize(1)
        assert torch.equal(dst.cpu(), src.cpu())
    finally:
        engine.close()
