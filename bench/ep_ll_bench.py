"""Low-latency EP benchmark (issue 5): IntraNode vs IntraNodeLL vs AsyncLL, and AsyncLL's overlap gain.

Config: one GPU, 8 virtual PEs, hidden 7168, top-8, 256 experts (32 per PE), random routing, 128 tokens per
PE; dispatch bf16 and fp8 (e4m3fn), combine bf16. Every leg is captured in its own CUDA graph and replayed
(median of --reps replays, CUDA events); AsyncLL legs are send + recv, also reported per phase, for each
notification mode. Per leg: µs, GB/s in MORI's accounting (docs/ep-protocols.md) and the roofline ratio
(bytes the kernels read + write per second over the device-to-device copy's, measured in the same run).

Overlap (AsyncLL): t(send; matmul; recv) against t(send; recv) + t(matmul), all graphs, same stream; and
the same with the matmul on a second stream forked from the first (the GPU runs both at once).

    python bench/ep_ll_bench.py --precompile .bundles
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_ll_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ep_bench import EXPERTS, HIDDEN, TOPK, _median_replay_us, capture_graph, copy_bandwidth, make_config  # noqa: E402

MODES = {"quiet": {}, "early": {"early_notify": 1}, "fused": {"early_notify": 1, "fused_recv": 1}}


def variants(args):
    """(label, kind, AsyncLL options or None, blocks) of every op measured."""
    from mori_compiler.ops.asyncll import resolve

    out = [("IntraNode", "IntraNode", None, args.blocks)]
    out += [(f"IntraNodeLL/{b}", "IntraNodeLL", None, b) for b in args.ll_blocks]
    out += [(f"AsyncLL-{m}", "AsyncLL", resolve({}, **flags), args.blocks) for m, flags in MODES.items()]
    return out


def precompile(cache_root, args) -> None:
    from mori_compiler.ops import ep_bundle

    for label, kind, mode, blocks in variants(args):
        cfg = make_config(args.world, args.tokens, blocks, args.warps, kind=kind)
        print(label, ep_bundle(cfg, "sm_90", virtual_pes=True, asyncll=mode, cache_root=cache_root).path)


def measure(label, kind, mode, blocks, args, copy_bps) -> tuple[list[dict], dict | None]:
    import numpy as np
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    W, T = args.world, args.tokens
    cfg = make_config(W, T, blocks, args.warps, kind=kind)
    op = EpDispatchCombineOp(cfg, asyncll=mode)
    shape = ref.EpShape(W, cfg.num_experts_per_rank, TOPK, T)
    idx_np = ref.make_routing("random", [T] * W, shape, 11)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    rows, overlap = [], None
    cblocks = args.combine_blocks if kind != "AsyncLL" else blocks

    def row(leg, dtype, us, totals, elem, moved):
        per_rank = [t * HIDDEN * elem / (us * 1e-6) / 1e9 for t in totals]
        rows.append({"variant": label, "leg": leg, "dtype": dtype, "tokens": T, "us": us,
                     "GBps_mori": sum(per_rank) / W, "roofline": moved / (us * 1e-6) / copy_bps, "blocks": blocks})

    try:
        for dname, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
            xs = [torch.randn(T, HIDDEN, device="cuda").to(dtype) for _ in range(W)]
            ws = [torch.rand(T, TOPK, device="cuda") for _ in range(W)]
            outs = op.dispatch(xs, ws, None, idxs)
            if kind == "AsyncLL":
                ys = [torch.empty(cfg.max_recv, HIDDEN, dtype=torch.bfloat16, device="cuda") for _ in range(W)]
            else:
                ys = op.get_registered_combine_input_buffer(torch.bfloat16)
            for p in range(W):
                ys[p].copy_(outs[p][0].to(torch.bfloat16))
            res = op.combine(ys, None, idxs, block_num=cblocks)
            torch.cuda.synchronize()
            totals = [int(o[4].item()) for o in outs]
            for p in range(min(W, 2)):  # correctness gate: identity expert => U * x
                ref.check_combine(res[p][0][:T].float().cpu().numpy(), xs[p].float().cpu().numpy(), idx_np[p], shape,
                                  "bf16", rank=p)  # fmt: skip
            recv_bytes = sum(totals) * HIDDEN * dtype.itemsize
            copies = 2 if kind == "AsyncLL" else 1  # AsyncLL lands rows in per-source staging, then lays them out
            g = capture_graph(lambda: op.dispatch(xs, ws, None, idxs))
            row("dispatch", dname, _median_replay_us(g, args.reps), totals, dtype.itemsize, 2 * copies * recv_bytes)
            if kind == "AsyncLL":
                gs, gr = _phase_graphs(lambda: op.dispatch_send(xs, ws, None, idxs), op.dispatch_recv)
                for leg, gg in (("dispatch_send", gs), ("dispatch_recv", gr)):
                    row(leg, dname, _median_replay_ordered(gs, gr, gg, args.reps), totals, dtype.itemsize, 2 * recv_bytes)
            if dname != "bf16":
                continue
            comb_bytes = sum(totals) * HIDDEN * 2 * copies + W * T * HIDDEN * 2
            gc = capture_graph(lambda: op.combine(ys, None, idxs, block_num=cblocks))
            row("combine", "bf16", _median_replay_us(gc, args.reps), totals, 2, comb_bytes)
            if kind == "AsyncLL":
                gs, gr = _phase_graphs(lambda: op.combine_send(ys, None, idxs, block_num=cblocks),
                                       lambda: op.combine_recv(block_num=cblocks))  # fmt: skip
                for leg, gg in (("combine_send", gs), ("combine_recv", gr)):
                    row(leg, "bf16", _median_replay_ordered(gs, gr, gg, args.reps), totals, 2, comb_bytes / 2)
                overlap = measure_overlap(op, xs, ws, idxs, args)
    finally:
        op.close()
    return rows, overlap


def _phase_graphs(send, recv):
    """One graph per AsyncLL phase, captured after an eager send + recv (the phase order allows no other)."""
    import torch

    send()
    recv()
    torch.cuda.synchronize()
    gs, gr = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(gs):
        send()
    with torch.cuda.graph(gr):
        recv()
    return gs, gr


def _median_replay_ordered(gs, gr, which, reps: int) -> float:
    """Median time of one phase (``which``) replayed in protocol order (send, recv, send, ...)."""
    import statistics

    import torch

    times = []
    for _ in range(reps):
        for g in (gs, gr):
            if g is which:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
            else:
                g.replay()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def measure_overlap(op, xs, ws, idxs, args) -> dict:
    import torch

    n = args.matmul
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def matmul():
        torch.matmul(a, b, out=c)

    def send_recv():
        op.dispatch_send(xs, ws, None, idxs)
        op.dispatch_recv()

    def send_mm_recv():
        op.dispatch_send(xs, ws, None, idxs)
        matmul()
        op.dispatch_recv()

    def concurrent():  # the matmul forked onto a side stream while send and recv run
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            matmul()
        send_recv()
        torch.cuda.current_stream().wait_stream(side)

    t = {name: _median_replay_us(capture_graph(fn), args.reps)
         for name, fn in (("matmul", matmul), ("send_recv", send_recv), ("send_matmul_recv", send_mm_recv),
                          ("concurrent", concurrent))}  # fmt: skip
    serial = t["send_recv"] + t["matmul"]
    return t | {"matmul_n": n, "gain_same_stream": serial / t["send_matmul_recv"], "gain_side_stream": serial / t["concurrent"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=32, help="blocks per PE (IntraNode dispatch, AsyncLL)")
    ap.add_argument("--ll-blocks", default="32,64,128", help="IntraNodeLL grids to try (one block per token)")
    ap.add_argument("--combine-blocks", type=int, default=32)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--matmul", type=int, default=4096, help="n of the n x n x n bf16 matmul of the overlap test")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    args = ap.parse_args(argv)
    args.ll_blocks = [int(b) for b in args.ll_blocks.split(",")]
    if args.precompile:
        precompile(args.precompile, args)
        return 0
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    heap = 8 * args.world * args.tokens * HIDDEN * 2 + (256 << 20)
    shmem.shmem_init_virtual(args.world, heap_size=heap)
    rows, overlaps = [], {}
    try:
        copy_bps = copy_bandwidth()
        for label, kind, mode, blocks in variants(args):
            r, o = measure(label, kind, mode, blocks, args, copy_bps)
            rows += r
            if o:
                overlaps[label] = o
    finally:
        shmem.shmem_finalize()
    print(f"{torch.cuda.get_device_name()}: {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts, "
          f"{args.tokens} tokens per PE, {args.warps} warps per block, graph replay median of {args.reps}; D2D copy "
          f"{copy_bps / 1e9:.0f} GB/s (read+write)")  # fmt: skip
    print(f"{'variant':<16}{'leg':<15}{'dtype':<6}{'blocks':>7}{'us':>9}{'GB/s (MORI)':>13}{'vs copy':>9}")
    for r in rows:
        print(f"{r['variant']:<16}{r['leg']:<15}{r['dtype']:<6}{r['blocks']:>7}{r['us']:>9.1f}{r['GBps_mori']:>13.1f}"
              f"{r['roofline']:>9.2f}")  # fmt: skip
    for label, o in overlaps.items():
        print(f"{label}: matmul {o['matmul_n']}^3 {o['matmul']:.1f} us; send+recv {o['send_recv']:.1f} us; "
              f"send;matmul;recv {o['send_matmul_recv']:.1f} us (gain {o['gain_same_stream']:.2f}x); matmul on a side "
              f"stream {o['concurrent']:.1f} us (gain {o['gain_side_stream']:.2f}x)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_GBps_rw": copy_bps / 1e9, "rows": rows, "overlap": overlaps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
