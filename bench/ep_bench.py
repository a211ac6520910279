"""EP IntraNode dispatch/combine benchmark on one GPU with virtual PEs.

Config (issue 4): 8 virtual PEs, hidden 7168, top-8, 256 experts (32 per PE), random routing, tokens per PE
128 / 512 / 4096, dispatch bf16 and fp8 (e4m3fn), combine bf16 (zero-copy), launch geometry from --blocks /
--warps. Each leg is captured in its own CUDA graph and replayed (median of --reps replays, CUDA events).

Reported per leg: µs; GB/s in MORI's accounting (docs/ep-protocols.md: total_recv x H x elem / t per rank,
mean over ranks); the roofline ratio ("vs copy"): the leg's bytes, each received row read once and written
once (docs/ep-protocols.md §13), per second (all PEs run on this one GPU) over the device-to-device copy's
read + write bytes per second, measured in the same run; and "physical": the bytes the kernel's own loads
and stores move (the dispatch reads each token row once for all its destinations, so it moves fewer bytes
than the roofline count and its ratio can pass 1).

    python bench/ep_bench.py --precompile .bundles         # where the compiler is
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_bench.py --json out.json --png out.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HIDDEN, TOPK, EXPERTS = 7168, 8, 256


def make_config(world: int, tokens: int, blocks: int, warps: int, *, kind: str = "IntraNode", rank: int = 0):
    """The benchmark shape (hidden 7168, top-8 of 256 experts, bf16-wide buffers, zero-copy combine)."""
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(data_type="bf16", rank=rank, world_size=world, hidden_dim=HIDDEN, scale_dim=0,
                                   scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=tokens,
                                   num_experts_per_rank=EXPERTS // world, num_experts_per_token=TOPK,
                                   warp_num_per_block=warps, block_num=blocks, use_external_inp_buf=False,
                                   kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip


def precompile(cache_root, world, tokens_list, blocks, warps) -> None:
    from mori_compiler.ops import ep_bundle

    for tokens in tokens_list:
        b = ep_bundle(make_config(world, tokens, blocks, warps), "sm_90", virtual_pes=True, cache_root=cache_root)
        print(tokens, b.path)


def capture_graph(fn):
    """A CUDA graph of ``fn()``, after one eager call (which uploads the launches' argument tables)."""
    import torch

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _median_replay_us(graph, reps: int, before_each=None) -> float:
    """Median µs of ``reps`` timed replays (after one untimed); ``before_each()`` runs before each (e.g. a
    barrier that keeps several processes in lockstep)."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before_each is not None:
            before_each()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """The device's copy ceiling: (read + write) bytes per second of the faster of cudaMemcpy (a graph
    memcpy node) and an SM copy kernel (torch's elementwise copy), 1 GiB, median of 20 replays each."""
    import torch

    n = 1 << 30
    src = torch.empty(n // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    best = 0.0
    for op in (lambda: dst.copy_(src), lambda: torch.mul(src, 1.0, out=dst)):
        op()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            op()
        best = max(best, 2 * n / (_median_replay_us(g, 20) * 1e-6))
    return best


def run(world: int, tokens: int, blocks: int, warps: int, reps: int, copy_bps: float,
        cblocks_list: list[int]) -> list[dict]:
    import numpy as np
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    cfg = make_config(world, tokens, blocks, warps)
    op = EpDispatchCombineOp(cfg)
    shape = ref.EpShape(world, cfg.num_experts_per_rank, TOPK, tokens)
    idx_np = ref.make_routing("random", [tokens] * world, shape, 11)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    rows = []
    try:
        for dname, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
            xs = [torch.randn(tokens, HIDDEN, device="cuda").to(dtype) for _ in range(world)]
            ws = [torch.rand(tokens, TOPK, device="cuda") for _ in range(world)]
            regs = op.get_registered_combine_input_buffer(torch.bfloat16)
            outs = op.dispatch(xs, ws, None, idxs)  # eager warm-up: uploads argument tables
            for p in range(world):
                regs[p].copy_(outs[p][0].to(torch.bfloat16))
            res = op.combine(regs, None, idxs, block_num=cblocks_list[0])
            torch.cuda.synchronize()
            totals = [int(o[4].item()) for o in outs]
            # correctness gate at every point: identity expert => U * x
            for p in range(min(world, 2)):
                ref.check_combine(res[p][0][:tokens].float().cpu().numpy(), xs[p].float().cpu().numpy(), idx_np[p],
                                  shape, "bf16", rank=p)  # fmt: skip
            gd = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gd):
                op.dispatch(xs, ws, None, idxs)
            legs = [("dispatch", gd, dtype.itemsize, blocks)]
            for cblocks in cblocks_list if dname == "bf16" else ():
                try:
                    op.combine(regs, None, idxs, block_num=cblocks)  # eager first: argument tables, co-residency
                except ValueError as e:  # the grid does not fit co-resident: say so, measure the others
                    print(f"combine with {cblocks} blocks per PE skipped: {e}")
                    continue
                torch.cuda.synchronize()
                gc = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gc):
                    op.combine(regs, None, idxs, block_num=cblocks)
                legs.append(("combine", gc, 2, cblocks))
            for leg, graph, elem, grid in legs:
                us = _median_replay_us(graph, reps)
                per_rank = [t * HIDDEN * elem / (us * 1e-6) / 1e9 for t in totals]
                # The roofline bytes (docs/ep-protocols.md §13: each received byte read once and written once):
                # dispatch 2 x received rows; combine the received rows read and the token rows written.
                moved = sum(totals) * HIDDEN * elem * 2
                # What the kernel's own loads and stores move: the dispatch reads each token row once (and
                # stores it to every destination), so it moves less than the roofline bytes (ratio > 1 is
                # possible); the combine moves the roofline bytes.
                physical = (world * tokens + sum(totals)) * HIDDEN * elem
                if leg == "combine":
                    moved = physical = sum(totals) * HIDDEN * elem + world * tokens * HIDDEN * elem
                rows.append({"leg": leg, "dtype": dname if leg == "dispatch" else "bf16", "tokens": tokens,
                             "us": us, "GBps_mori": sum(per_rank) / world,
                             "roofline": moved / (us * 1e-6) / copy_bps,
                             "physical": physical / (us * 1e-6) / copy_bps, "total_recv": totals,
                             "blocks": grid, "warps": warps})  # fmt: skip
    finally:
        op.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", default="128,512,4096")
    ap.add_argument("--blocks", type=int, default=32, help="blocks per PE for dispatch")
    ap.add_argument("--combine-blocks", default="32",
                    help="blocks per PE for combine, comma-separated, each measured (a grid that does not fit "
                         "co-resident is reported and skipped)")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    args = ap.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    cblocks = [int(b) for b in args.combine_blocks.split(",")]
    if args.precompile:
        precompile(args.precompile, args.world, tokens_list, args.blocks, args.warps)
        return 0
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    max_tokens = max(tokens_list)
    heap = (args.world * max_tokens * HIDDEN * 2) * 2 + max_tokens * HIDDEN * 2 + (64 << 20)
    shmem.shmem_init_virtual(args.world, heap_size=heap)
    try:
        copy_bps = copy_bandwidth()
        rows = []
        for tokens in tokens_list:
            rows += run(args.world, tokens, args.blocks, args.warps, args.reps, copy_bps, cblocks)
    finally:
        shmem.shmem_finalize()
    print(f"{torch.cuda.get_device_name()}: {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts, "
          f"{args.blocks} (dispatch) / {args.combine_blocks} (combine) blocks x {args.warps} warps per PE, graph replay median of {args.reps}; "
          f"D2D copy {copy_bps / 1e9:.0f} GB/s (read+write)")  # fmt: skip
    print(f"{'leg':<9}{'dtype':<6}{'tokens':>7}{'blocks':>7}{'us':>10}{'GB/s (MORI)':>13}{'vs copy':>9}"
          f"{'physical':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['leg']:<9}{r['dtype']:<6}{r['tokens']:>7}{r['blocks']:>7}{r['us']:>10.1f}{r['GBps_mori']:>13.1f}"
              f"{r['roofline']:>9.2f}{r['physical']:>10.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_GBps_rw": copy_bps / 1e9, "rows": rows}, indent=1))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for leg, dt in (("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16")):
            pts = [r for r in rows if r["leg"] == leg and r["dtype"] == dt and r["blocks"] in (args.blocks, cblocks[0])]
            ax.plot([p["tokens"] for p in pts], [p["roofline"] for p in pts], marker="o", label=f"{leg} {dt}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per PE")
        ax.set_ylabel("bytes moved / D2D copy bandwidth")
        ax.axhline(0.8, ls="--", c="gray")
        ax.legend()
        ax.set_title("EP IntraNode on one H200, 8 virtual PEs")
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
