"""Shmem benchmark on one GPU: put bandwidth per scope against a device-to-device copy, and the signal
round-trip latency between two virtual PEs.

Run on the GPU machine (bundles precompiled by ``python bench/shmem_kernels.py <dir>`` where the compiler is):

    MORI_COMPILER_CACHE_DIR=<dir> python bench/shmem_bench.py [--json out.json]

Bandwidth is bytes put (or copied) per second, one direction, each byte counted once. The put moves
``--bytes`` from PE 0 to PE 1 (two virtual PEs in one launch; PE 1's units get no work). Timing: CUDA
events around 10 back-to-back launches after a warm-up, median of ``--reps`` such runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import shmem_kernels  # noqa: E402


def _median_ms(fn, reps: int, inner: int = 10) -> float:
    """Median over ``reps`` of the mean time of ``inner`` back-to-back launches (device events), so that
    the host's launch cost overlaps the previous kernel instead of counting as device time."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / inner)
    return statistics.median(times)


def main(argv=None) -> int:
    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bytes", type=int, default=256 << 20)
    ap.add_argument("--blocks", type=int, default=264, help="blocks per PE for the put kernels")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20000, help="ping-pong round trips per launch")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    torch.cuda.init()
    shmem.shmem_init_virtual(2)
    results = {"device": torch.cuda.get_device_name(), "bytes": args.bytes, "blocks": args.blocks}
    try:
        ks = KernelSet(shmem_kernels.bundle())
        nbytes = args.bytes
        dst = shmem.shmem_malloc(nbytes)
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        copy_dst = torch.empty_like(src)
        ms = _median_ms(lambda: copy_dst.copy_(src), args.reps)
        results["d2d_copy_GBps"] = nbytes / ms / 1e6
        threads = 256
        for scope, units in (("thread", args.blocks * threads), ("warp", args.blocks * threads // 32),
                             ("block", args.blocks)):  # fmt: skip
            chunk = nbytes // units // 16 * 16
            moved = chunk * units
            per_pe = [(shmem.shmem_ptr_p2p(dst, 0, 0), src.data_ptr(), chunk, 1),
                      (shmem.shmem_ptr_p2p(dst, 0, 1), src.data_ptr(), 0, 0)]  # fmt: skip
            launch = lambda s=scope, a=per_pe: ks.launch_virtual(f"bench_put_{s}", a, grid=(args.blocks, 1),  # noqa: E731
                                                                 block=(threads, 1, 1))  # fmt: skip
            ms = _median_ms(launch, args.reps)
            got = shmem.shmem_tensor(dst, (moved,), torch.uint8, pe=1)
            assert torch.equal(got, src[:moved]), f"put {scope}: wrong data"
            results[f"put_{scope}_GBps"] = moved / ms / 1e6
            results[f"put_{scope}_vs_copy"] = results[f"put_{scope}_GBps"] / results["d2d_copy_GBps"]
        sig = shmem.shmem_malloc(8)
        for p in range(2):
            shmem.shmem_tensor(sig, (1,), torch.int64, pe=p).zero_()
        iters = args.iters

        def pingpong():
            for p in range(2):
                shmem.shmem_tensor(sig, (1,), torch.int64, pe=p).zero_()
            ks.launch_virtual("pingpong", [(shmem.shmem_ptr_p2p(sig, 0, p), iters, 1 - p) for p in range(2)],
                              grid=(1, 1), block=(1, 1, 1))  # fmt: skip

        ms = _median_ms(pingpong, max(3, args.reps // 4), inner=1)
        results["signal_round_trip_us"] = ms * 1e3 / iters
        ks.synchronize()
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()

    print(f"device: {results['device']}; {nbytes >> 20} MiB, {args.blocks} blocks x 256 threads, median of {args.reps}")
    print(f"{'what':<28}{'GB/s':>10}{'vs D2D copy':>14}")
    print(f"{'cudaMemcpy-class D2D copy':<28}{results['d2d_copy_GBps']:>10.1f}{1.0:>14.2f}")
    for scope in ("thread", "warp", "block"):
        print(f"{'put, ' + scope + ' scope':<28}{results[f'put_{scope}_GBps']:>10.1f}"
              f"{results[f'put_{scope}_vs_copy']:>14.2f}")  # fmt: skip
    print(f"signal round trip (2 virtual PEs, same GPU): {results['signal_round_trip_us']:.2f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
