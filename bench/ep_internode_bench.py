"""EP inter-node benchmark (issue 13): InterNodeV1, InterNodeV1LL and InterNode (V0) beside IntraNode, on one
GPU with virtual PEs split into emulated nodes.

Config: 8 virtual PEs, G = gpu_per_node in --gpn (default 8, 4, 2: N = 1, 2, 4 nodes), hidden 7168, top-8 of
256 experts (32 per PE), random routing (the same for every kind), tokens per PE in --tokens (128, 4096),
dispatch bf16 and fp8 (e4m3fn), combine bf16 (zero-copy: the identity expert's rows are in the registered
buffer, no weights). Each leg is captured in its own CUDA graph and replayed (median of --reps, CUDA events).

Reported per (kind, G, tokens, leg, dtype):

* µs of the leg;
* GB/s in MORI's accounting (docs/ep-protocols.md §13, MORI's inter-node benchmark): "xgmi" = total_recv x H x
  elem / t per rank, mean over ranks; "rdma algo" = rdma_algo_tokens x H x elem / t per rank, mean over ranks,
  where rdma_algo_tokens = the unique (token, destination node) pairs, the token's own node included (V1LL:
  tokens x N, it sends every token everywhere); "rdma phys" = algo x (N - 1) / N. The combine uses the same
  counts at the combine dtype;
* the traffic counters' growth over one replay of the leg (``op.internode_traffic()``, summed over PEs: bytes
  put to other nodes, "rdma", and stored to / read from PEs of the same node, "xgmi"), and those bytes / t;
* the share of each kernel of the leg (stage vs dispatch; combine vs combine_all), from torch.profiler's
  device times of eager calls (the same kernels the graphs replay), and their sum against the graph's time.

What this measures, and what not: the emulation runs every PE on this one GPU, so every "RDMA" byte is a copy
within one GPU's memory (HBM to HBM through the SMs), not a NIC transfer: there is no network bandwidth or
latency, no queue pairs, no proxy contention across hosts. The RDMA columns are therefore not RDMA numbers.
What it does measure is the kernels' own cost on real hardware: the bytes each scheme moves (records,
forwarding, partials: V1LL's unfiltered sends, V0's per-PE records), its synchronisation steps (chunk signals,
barriers) and the phases' balance, side by side with IntraNode on the same GPU and routing.

    python bench/ep_internode_bench.py --precompile .bundles         # where the compiler is (no GPU)
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_internode_bench.py --json internode.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ep_bench import EXPERTS, HIDDEN, TOPK, _median_replay_us, capture_graph, make_config  # noqa: E402

INTER_KINDS = ("InterNodeV1", "InterNodeV1LL", "InterNode")
DTYPES = (("bf16", "bfloat16"), ("fp8", "float8_e4m3fn"))
HEAP_SLACK = 256 << 20


def variants(args) -> list[tuple[str, int]]:
    """(kind, G) of every op measured: IntraNode once (it has no nodes), each inter-node kind per G."""
    out = [("IntraNode", args.world)] if "IntraNode" in args.kinds else []
    return out + [(kind, g) for kind in args.kinds if kind != "IntraNode" for g in args.gpn]


def bench_config(kind: str, gpn: int, tokens: int, args):
    cfg = make_config(args.world, tokens, args.blocks, args.warps, kind=kind)
    if kind == "IntraNode":
        return cfg
    return dataclasses.replace(cfg, gpu_per_node=gpn, rdma_block_num=args.rdma_blocks, num_qp_per_pe=1)


def precompile(cache_root, args) -> None:
    from mori_compiler.ops import ep_bundle

    for tokens in args.tokens:
        for kind, gpn in variants(args):
            b = ep_bundle(bench_config(kind, gpn, tokens, args), "sm_90", virtual_pes=True, cache_root=cache_root)
            print(kind, f"G={gpn}", tokens, b.path)


def heap_size(args) -> int:
    """Bytes per PE for the largest op measured (one op lives at a time), from the EP schema's buffer table."""
    from mori_compiler.ep_schema import EpSizes, KernelType, buffers_for

    need = 0
    for tokens in args.tokens:
        for kind, gpn in variants(args):
            cfg = bench_config(kind, gpn, tokens, args)
            table = buffers_for(KernelType(cfg.kernel_type), EpSizes.from_config(cfg))
            need = max(need, sum(-(-size // 256) * 256 for _, size in table))
    return -(-(need + HEAP_SLACK) // (1 << 20)) << 20


def rdma_algo_tokens(idx_np, shape, kind: str, gpn: int) -> list[int]:
    """Per rank, MORI's RDMA token count: unique (token, destination node) pairs, own node included; V1LL
    counts every token on every node."""
    import numpy as np

    from mori_compiler.ops import reference as ref

    nodes = shape.W // gpn
    if kind == "InterNodeV1LL":
        return [idx.shape[0] * nodes for idx in idx_np]
    out = []
    for idx in idx_np:
        dest = ref.destinations(idx, shape)  # [n, W]
        per_node = dest.reshape(dest.shape[0], nodes, gpn).any(axis=2)
        out.append(int(np.sum(per_node)))
    return out


def _traffic(op):
    import numpy as np

    from mori_compiler.ep_schema import TRAFFIC_COUNTERS

    return np.array([[int(d[c]) for c in TRAFFIC_COUNTERS] for d in op.internode_traffic()], dtype=np.int64)


def kernel_times(fn, iters: int = 5) -> dict[str, float] | str:
    """µs per call of each EP kernel family ``fn`` launches (torch.profiler device time of ``iters`` eager
    calls, after one warm-up), or the reason it could not be measured."""
    import torch

    from mori_compiler.ep_schema import kernel_signature

    fn()
    torch.cuda.synchronize()
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        times: dict[str, float] = {}
        for evt in prof.key_averages():
            try:
                sig, _ = kernel_signature(evt.key)
            except KeyError:
                continue  # not an EP kernel (copies, fills)
            total = getattr(evt, "device_time_total", None)
            total = evt.cuda_time_total if total is None else total
            times[sig.family] = times.get(sig.family, 0.0) + total / iters
        return times or "the profiler saw no EP kernel"
    except Exception as e:  # the profiler is optional: say why, keep the timings
        return f"profiler failed: {type(e).__name__}: {e}"


def measure(kind: str, gpn: int, tokens: int, args) -> list[dict]:
    import numpy as np
    import torch

    from mori_compiler.ep_schema import TRAFFIC_COUNTERS
    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    W = args.world
    cfg = bench_config(kind, gpn, tokens, args)
    op = EpDispatchCombineOp(cfg)
    shape = ref.EpShape(W, cfg.num_experts_per_rank, TOPK, tokens)
    idx_np = ref.make_routing("random", [tokens] * W, shape, 11)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    inter = kind != "IntraNode"
    nodes = W // gpn if inter else 1
    algo = rdma_algo_tokens(idx_np, shape, kind, gpn) if inter else None
    rows = []
    try:
        regs = op.get_registered_combine_input_buffer(torch.bfloat16)
        for dname, tname in DTYPES:
            dtype = getattr(torch, tname)
            xs = [torch.randn(tokens, HIDDEN, device="cuda").to(dtype) for _ in range(W)]
            ws = [torch.rand(tokens, TOPK, device="cuda") for _ in range(W)]

            def dispatch():
                return op.dispatch(xs, ws, None, idxs)

            def combine():
                return op.combine(regs, None, idxs)

            outs = dispatch()  # eager: uploads argument tables; the identity expert's rows, in bf16
            for p in range(W):
                regs[p].copy_(outs[p][0].to(torch.bfloat16))
            res = combine()
            torch.cuda.synchronize()
            totals = [int(o[4].item()) for o in outs]
            assert totals == ref.expected_recv_counts(idx_np, shape).tolist(), "receive counts"
            for p in range(min(W, 2)):  # correctness gate at every point: identity expert => U * x
                ref.check_hierarchical_combine(res[p][0][:tokens].float().cpu().numpy(), xs[p].float().cpu().numpy(),
                                               idx_np[p], shape, "bf16", rank=p)  # fmt: skip
            legs = [("dispatch", dname, dtype.itemsize, capture_graph(dispatch), dispatch)]
            if dname == "bf16":  # the combine input is bf16 for both dispatch dtypes: measure it once
                legs.append(("combine", "bf16", 2, capture_graph(combine), combine))
            for leg, dt, elem, graph, fn in legs:
                us = _median_replay_us(graph, args.reps)
                secs = us * 1e-6
                row = {"kind": kind, "gpu_per_node": gpn if inter else None, "nodes": nodes, "tokens": tokens,
                       "leg": leg, "dtype": dt, "us": us, "total_recv": totals,
                       "xgmi_GBps": statistics.mean(t * HIDDEN * elem / secs / 1e9 for t in totals)}  # fmt: skip
                if inter:
                    row["rdma_algo_tokens"] = algo
                    row["rdma_algo_GBps"] = statistics.mean(a * HIDDEN * elem / secs / 1e9 for a in algo)
                    row["rdma_phys_GBps"] = row["rdma_algo_GBps"] * (nodes - 1) / nodes
                    torch.cuda.synchronize()
                    before = _traffic(op)
                    graph.replay()
                    torch.cuda.synchronize()
                    grown = (_traffic(op) - before).sum(axis=0)
                    pick = {"dispatch": (0, 1), "combine": (2, 3)}[leg]
                    row["traffic_bytes"] = {TRAFFIC_COUNTERS[j]: int(grown[j]) for j in pick}
                    row["traffic_GBps"] = sum(int(grown[j]) for j in pick) / secs / 1e9
                times = kernel_times(fn)
                row["kernel_us"] = times
                if isinstance(times, dict):
                    total = sum(times.values())
                    row["phase_share"] = {f: t / total for f, t in times.items()} if total else None
                    row["kernels_vs_graph"] = total / us
                rows.append(row)
    finally:
        op.close()
    return rows


def _fmt_share(row) -> str:
    share = row.get("phase_share")
    if not share:
        return row["kernel_us"] if isinstance(row.get("kernel_us"), str) else "-"
    return " ".join(f"{f.removeprefix('inter_')}={s:.0%}" for f, s in share.items())


def print_table(rows) -> None:
    head = (f"{'kind':<14}{'G':>3}{'tokens':>7} {'leg':<9}{'dtype':<6}{'us':>9}{'xgmi GB/s':>11}{'rdma algo':>11}"
            f"{'rdma phys':>11}{'cnt rdma MB':>12}{'cnt xgmi MB':>12}{'cnt GB/s':>10}  phases")  # fmt: skip
    print(head)
    for r in rows:
        tb = r.get("traffic_bytes") or {}
        rdma = sum(v for k, v in tb.items() if k.endswith("rdma"))
        xgmi = sum(v for k, v in tb.items() if k.endswith("xgmi"))
        opt = (lambda key, f: f"{r[key]:{f}}" if r.get(key) is not None else "-")
        print(f"{r['kind']:<14}{r['gpu_per_node'] or '-':>3}{r['tokens']:>7} {r['leg']:<9}{r['dtype']:<6}"
              f"{r['us']:>9.1f}{r['xgmi_GBps']:>11.1f}{opt('rdma_algo_GBps', '.1f'):>11}"
              f"{opt('rdma_phys_GBps', '.1f'):>11}"
              f"{(f'{rdma / 1e6:.1f}' if tb else '-'):>12}{(f'{xgmi / 1e6:.1f}' if tb else '-'):>12}"
              f"{opt('traffic_GBps', '.1f'):>10}  {_fmt_share(r)}")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad argument is the user's error: exit 1 (2 means an internal error here)
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def parse_args(argv=None):
    ap = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--gpn", default="8,4,2", help="gpu_per_node values (each a power of two dividing --world)")
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--kinds", default="IntraNode," + ",".join(INTER_KINDS))
    ap.add_argument("--blocks", type=int, default=16, help="blocks per PE (InterNode: a multiple of --world; every "
                    "PE's blocks must be co-resident on the one GPU: 8 PEs x 16 fit an H200's 132 SMs)")
    ap.add_argument("--rdma-blocks", type=int, default=8, help="blocks per PE doing the inter-node work")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--precompile", metavar="CACHE_DIR", help="only build the bundles (no GPU needed)")
    args = ap.parse_args(argv)
    try:
        args.gpn = [int(g) for g in args.gpn.split(",")]
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError as e:
        ap.error(f"--gpn and --tokens take comma-separated integers ({e})")
    args.kinds = [k for k in args.kinds.split(",") if k]
    known = ("IntraNode", *INTER_KINDS)
    bad = [k for k in args.kinds if k not in known]
    if bad:
        ap.error(f"unknown --kinds {bad} (known: {', '.join(known)})")
    from mori_compiler.ep_schema import MAX_WORLD_SIZE, topology_problems

    if not 2 <= args.world <= MAX_WORLD_SIZE:
        ap.error(f"--world {args.world}: must be in [2, {MAX_WORLD_SIZE}]")
    if any(t < 1 for t in args.tokens) or args.reps < 1:
        ap.error("--tokens and --reps must be positive")
    for g in args.gpn:
        problems = topology_problems(args.world, g)
        if problems:
            ap.error(f"--gpn {g}: {'; '.join(problems)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.precompile:
        precompile(args.precompile, args)
        return 0
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    shmem.shmem_init_virtual(args.world, heap_size=heap_size(args))
    rows = []
    try:
        for tokens in args.tokens:
            for kind, gpn in variants(args):
                rows += measure(kind, gpn, tokens, args)
    finally:
        shmem.shmem_finalize()
    print(f"{torch.cuda.get_device_name()}: {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK} of {EXPERTS} "
          f"experts, {args.blocks} blocks ({args.rdma_blocks} inter-node) x {args.warps} warps per PE, graph "
          f"replay median of {args.reps}. All PEs share this GPU: RDMA columns are bytes copied within its memory, "
          "not RDMA.")  # fmt: skip
    print_table(rows)
    if args.json:
        meta = {"world": args.world, "hidden": HIDDEN, "top_k": TOPK, "experts": EXPERTS, "blocks": args.blocks,
                "rdma_blocks": args.rdma_blocks, "warps": args.warps, "reps": args.reps,
                "device": torch.cuda.get_device_name()}  # fmt: skip
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
