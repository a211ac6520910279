"""Where a GPU-IPC (``BackendType.XGMI``) transfer's time goes, in one process on one GPU: median µs of
300 repetitions of each variant, from torch's ``copy_`` through the raw driver calls the backend makes to
the engine's session write (the source of bench/results/session8/xgmi_probe.log), a cProfile of the
engine path, and ``cuMemcpyBatchAsync`` (one call for a strided batch) against one ``cuMemcpyAsync`` per
entry. Needs an NVIDIA GPU, torch and cuda-bindings.

    python bench/io_gpu_ipc_breakdown.py
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch
from cuda.bindings import driver as cu

from mori_compiler import io
from mori_compiler.runtime.driver import default_driver

N_BYTES = 1 << 20
REPS = 300


def median_us(fn, reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    drv = default_driver()
    src = torch.randint(0, 256, (N_BYTES,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    stream, done, caller_event = drv.stream_create(), drv.event_create(), drv.event_create()
    caller = drv.current_stream(0)

    def copy_torch():
        dst.copy_(src)
        torch.cuda.synchronize()

    def copy_pool_stream():
        drv.memcpy_async(dst.data_ptr(), src.data_ptr(), N_BYTES, stream)
        drv.stream_synchronize(stream)

    def copy_after_caller():  # what the backend queues when the caller's stream is busy
        drv.event_record(caller_event, caller)
        drv.stream_wait_event(stream, caller_event)
        drv.memcpy_async(dst.data_ptr(), src.data_ptr(), N_BYTES, stream)
        drv.event_record(done, stream)
        drv.event_synchronize(done)

    engine = io.IOEngine("breakdown", io.IOEngineConfig("127.0.0.1", 0))
    engine.create_backend(io.BackendType.XGMI)
    session = engine.create_session(engine.register_torch_tensor(src), engine.register_torch_tensor(dst))

    def engine_write():
        session.write(0, 0, N_BYTES, 1).Wait()

    for name, fn in (("torch copy_ + synchronize", copy_torch), ("cuMemcpyAsync on a pool stream + sync",
                     copy_pool_stream), ("+ caller-stream wait, event record/sync", copy_after_caller),
                     ("engine session write + Wait", engine_write)):  # fmt: skip
        print(f"{name:45s} {median_us(fn):8.1f} us", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(REPS):
        engine_write()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)

    count, size = 64, 4096
    dsts = [cu.CUdeviceptr(dst.data_ptr() + i * (size + 1)) for i in range(count)]
    srcs = [cu.CUdeviceptr(src.data_ptr() + i * (size + 1)) for i in range(count)]
    attrs = cu.CUmemcpyAttributes()
    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    location = cu.CUmemLocation()
    location.type, location.id = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, 0
    attrs.srcLocHint, attrs.dstLocHint, attrs.flags = location, location, 0

    def batch_call():
        cu.cuMemcpyBatchAsync(dsts, srcs, [size] * count, count, [attrs], [0], 1, stream)
        drv.stream_synchronize(stream)

    def one_call_each():
        for d, s in zip(dsts, srcs):
            drv.memcpy_async(int(d), int(s), size, stream)
        drv.stream_synchronize(stream)

    print(f"batch {count} x {size} B: one cuMemcpyBatchAsync {median_us(batch_call, 100):.1f} us, "
          f"{count} cuMemcpyAsync {median_us(one_call_each, 100):.1f} us")
    engine.close()


if __name__ == "__main__":
    main()
