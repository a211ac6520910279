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

--quant fp8_direct_cast,fp8_blockwise,fp4_blockwise adds, per tokens point, the push combine (external input
buffer) unquantized and with each wire quantization (issue 15), side by side with the zero-copy combine;
their GB/s are in MORI's accounting of the bf16 row (total_recv x H x 2 / t: the wire's fewer bytes make
a quantized combine's figure higher than the bytes it moves), "physical" the bytes its own loads and
stores move (the expert rows read as bf16, the wire rows written and read, the output rows written).

    python bench/ep_bench.py --precompile .bundles         # where the compiler is
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_bench.py --json out.json --png out.png
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_bench.py --quant fp8_direct_cast,fp8_blockwise,fp4_blockwise
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HIDDEN, TOPK, EXPERTS = 7168, 8, 256


def make_config(world: int, tokens: int, blocks: int, warps: int, *, kind: str = "IntraNode", rank: int = 0,
                quant: str | None = None):
    """The benchmark shape (hidden 7168, top-8 of 256 experts, bf16-wide buffers, zero-copy combine); with
    ``quant`` (a quant_type, or "none"), the push combine (external input buffer) with that quantization."""
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(data_type="bf16", rank=rank, world_size=world, hidden_dim=HIDDEN, scale_dim=0,
                                   scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=tokens,
                                   num_experts_per_rank=EXPERTS // world, num_experts_per_token=TOPK,
                                   warp_num_per_block=warps, block_num=blocks, use_external_inp_buf=quant is not None,
                                   kernel_type=EpDispatchCombineKernelType[kind],
                                   quant_type=quant or "none")  # fmt: skip


def wire_row_bytes(quant: str) -> int:
    """Bytes of one combine row on the wire (the bf16 row unquantized)."""
    from mori_compiler import wire_quant
    from mori_compiler.ops.config import combine_scale_blocks

    blocks = combine_scale_blocks() if quant in wire_quant.BLOCKWISE_QUANT_TYPES else 0
    return wire_quant.wire_row_bytes(quant, HIDDEN, blocks)


def precompile(cache_root, world, tokens_list, blocks, warps, quants=()) -> None:
    from mori_compiler.ops import ep_bundle

    for tokens in tokens_list:
        for quant in (None, *(("none", *quants) if quants else ())):
            b = ep_bundle(make_config(world, tokens, blocks, warps, quant=quant), "sm_90", virtual_pes=True,
                          cache_root=cache_root)  # fmt: skip
            print(tokens, quant or "zero-copy", b.path)


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


def run_push(world: int, tokens: int, blocks: int, warps: int, reps: int, copy_bps: float, cblocks: int,
             quants: list[str]) -> list[dict]:
    """The push combine, unquantized ("none") and with each quant type, on the same routing and rows: one
    op each (the quantization is compiled into its kernels), a correctness gate per op (the oracle's bound
    of ops/quant_reference.py), then graph replays of the combine alone."""
    import numpy as np
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import quant_reference as qref
    from mori_compiler.ops import reference as ref

    rows = []
    for quant in ("none", *quants):
        cfg = make_config(world, tokens, blocks, warps, quant=quant)
        op = EpDispatchCombineOp(cfg)
        shape = ref.EpShape(world, cfg.num_experts_per_rank, TOPK, tokens)
        idx_np = ref.make_routing("random", [tokens] * world, shape, 11)
        idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
        try:
            xs = [torch.randn(tokens, HIDDEN, device="cuda").to(torch.bfloat16) for _ in range(world)]
            outs = op.dispatch(xs, None, None, idxs)
            ys = [outs[p][0][: int(outs[p][4].item())].clone() for p in range(world)]  # the identity expert
            totals = [y.shape[0] for y in ys]
            res = op.combine(ys, None, idxs, block_num=cblocks)
            torch.cuda.synchronize()
            sdim = qref.fp8_combine_scale_dim() if quant == "fp4_blockwise" else None
            for p in range(min(world, 2)):  # correctness gate: within the quant type's bound of U * x
                x = xs[p].float().cpu().numpy()
                qref.check_quantized_combine(res[p][0][:tokens].float().cpu().numpy(), x,
                                             ref.unique_dest_count(idx_np[p], shape), quant, scale_dim=sdim)
            gc = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gc):
                op.combine(ys, None, idxs, block_num=cblocks)
            us = _median_replay_us(gc, reps)
        finally:
            op.close()
        per_rank = [t * HIDDEN * 2 / (us * 1e-6) / 1e9 for t in totals]
        recv, wire = sum(totals), wire_row_bytes(quant)
        # read the expert rows (bf16), write + read the wire rows, write the output rows (bf16)
        physical = recv * (HIDDEN * 2 + 2 * wire) + world * tokens * HIDDEN * 2
        moved = recv * HIDDEN * 2 + world * tokens * HIDDEN * 2  # the zero-copy combine's roofline bytes
        rows.append({"leg": "push", "dtype": quant, "tokens": tokens, "us": us, "GBps_mori": sum(per_rank) / world,
                     "roofline": moved / (us * 1e-6) / copy_bps, "physical": physical / (us * 1e-6) / copy_bps,
                     "total_recv": totals, "blocks": cblocks, "warps": warps, "wire_row_bytes": wire})  # fmt: skip
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
    ap.add_argument("--quant", default="", help="comma-separated quant types whose push combines are measured "
                    "next to the unquantized push and zero-copy ones (fp8_direct_cast, fp8_blockwise, fp4_blockwise)")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    args = ap.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    cblocks = [int(b) for b in args.combine_blocks.split(",")]
    quants = [q for q in args.quant.split(",") if q]
    from mori_compiler.wire_quant import WIRE_QUANT_TYPES

    bad = [q for q in quants if q not in WIRE_QUANT_TYPES]
    if bad:
        ap.error(f"--quant {','.join(bad)}: not a wire quant type (allowed: {', '.join(WIRE_QUANT_TYPES)})")
    from mori_compiler.runtime.extras import is_installed, missing_text

    if args.png and not args.precompile and not is_installed("matplotlib"):  # known before the minutes of GPU work
        ap.error(f"--png needs matplotlib: {missing_text(['matplotlib'])}")
    if args.precompile:
        precompile(args.precompile, args.world, tokens_list, args.blocks, args.warps, quants)
        return 0
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    max_tokens = max(tokens_list)
    # out_x and reg_x (R = W x M rows each); a push op also has its staging rows (W x M, wire rows <= bf16 rows)
    heap = (args.world * max_tokens * HIDDEN * 2) * (3 if quants else 2) + max_tokens * HIDDEN * 2 + (64 << 20)
    shmem.shmem_init_virtual(args.world, heap_size=heap)
    try:
        copy_bps = copy_bandwidth()
        rows = []
        for tokens in tokens_list:
            rows += run(args.world, tokens, args.blocks, args.warps, args.reps, copy_bps, cblocks)
            if quants:
                rows += run_push(args.world, tokens, args.blocks, args.warps, args.reps, copy_bps, cblocks[0], quants)
    finally:
        shmem.shmem_finalize()
    print(f"{torch.cuda.get_device_name()}: {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts, "
          f"{args.blocks} (dispatch) / {args.combine_blocks} (combine) blocks x {args.warps} warps per PE, graph replay median of {args.reps}; "
          f"D2D copy {copy_bps / 1e9:.0f} GB/s (read+write)")  # fmt: skip
    print(f"{'leg':<9}{'dtype':<16}{'tokens':>7}{'blocks':>7}{'us':>10}{'GB/s (MORI)':>13}{'vs copy':>9}"
          f"{'physical':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['leg']:<9}{r['dtype']:<16}{r['tokens']:>7}{r['blocks']:>7}{r['us']:>10.1f}{r['GBps_mori']:>13.1f}"
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
