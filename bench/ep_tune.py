"""EP launch-geometry tuner: measures a grid of (blocks, warps) per leg and writes MORI v1 tuning tables.

On one GPU with virtual PEs (as bench/ep_bench.py): for each kernel type (IntraNode, IntraNodeLL, AsyncLL),
W PEs, hidden 7168, top-8 of 256 experts, random routing, each token count (default 128 ... 4096), each
dispatch dtype (bf16, fp8_e4m3fn) and the bf16 combine in each form the op offers (zero-copy and push for
the intra-node types; AsyncLL's reads the caller's tensor), every geometry of the grid is timed as a CUDA
graph (median of --reps (30) replays). The grid is MORI's "quick" scope adapted to a GPU shared by W virtual PEs:
warps {4, 8, 16}; blocks the powers of two from --min-blocks up to the co-residency limit, plus the limit
itself (MORI: up to the CU count, plus the CU count). The kernels use grid barriers, so every block of all
PEs must be resident at once: the limit is the driver's occupancy of the leg's kernels x SMs / W
(auto_launch.coresident_blocks; the launcher refuses a larger grid). One op per warp count (MANUAL mode:
``warp_num_per_block`` compiled in, ``block_num`` per call), sized for the largest token count.

The best geometry per (leg, dtype, tokens, form) is MORI's: the highest bandwidth in MORI's accounting
(total_recv x hidden x element size / time per PE, mean over PEs; ranking by LL bandwidth would pick the
same, the routing is fixed per token count) with a noise margin: of the geometries within max(--tolerance
(3 %), 1.0 GB/s, MORI's margin) of the best, the smallest grid (blocks x warps, then blocks). Tables go to
--tables as ``sm_90_<model>_<KernelType>_ep<W>_{dispatch,combine}.json``, merged with existing ones (the
higher bandwidth kept per key). A correctness gate (identity experts: combine = U x) runs at every geometry
for token counts <= 512.

--check re-measures, at 128 and 4096 tokens, every grid geometry and the one AUTO picks from the tables
(mori_compiler/ops/auto_launch.py), and prints auto / best per leg, dtype and form (the goal: >= 0.95);
with --via-op the AUTO side is the op itself in AUTO mode over those tables (no geometry passed).

    python bench/ep_tune.py --precompile .bundles                  # where the compiler is (CPU)
    (the same --kinds/--world/--tokens/--warps for all three: the ops are sized for the largest token count)
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_tune.py --tables OUT/tables --json OUT/tune.json
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_tune.py --check --tables OUT/tables --json OUT/check.json

The pure parts (grid, occupancy bound, best pick, rules, check ratios, estimate) need no GPU and are tested
on the CPU (test/python/test_ep_tune_script.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import namedtuple
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ep_bench import EXPERTS, HIDDEN, TOPK  # noqa: E402

KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL")
DISPATCH_DTYPES = ("bf16", "fp8_e4m3fn")
COMBINE_DTYPE = "bf16"
ELEMENT_BYTES = {"bf16": 2, "fp8_e4m3fn": 1}
CHECK_TOKENS = (128, 4096)
MORI_MARGIN_GBPS = 1.0  # MORI's tuner: a geometry must beat the best by more than this to replace it
TARGET = "sm_90"
# sm_90 (H100/H200) hardware limits per SM: the thread and block bound of the occupancy (registers and
# shared memory can only lower it; the GPU run asks the driver).
SM90_THREADS_PER_SM, SM90_BLOCKS_PER_SM = 2048, 32

# One measurement: the leg ("dispatch"/"combine"), our dtype name, tokens per PE, the combine form
# (zero_copy; None for dispatch), the geometry, the median µs and MORI's GB/s.
Point = namedtuple("Point", ("kind", "leg", "dtype", "tokens", "zero_copy", "blocks", "warps", "us", "gbps"))


# ---- pure parts ---------------------------------------------------------------------------------------------

def thread_bound_blocks(sm_count: int, pes: int, warps: int, wave: int = 32, threads_per_sm: int = SM90_THREADS_PER_SM,
                        blocks_per_sm: int = SM90_BLOCKS_PER_SM) -> int:  # fmt: skip
    """The most blocks per PE of ``warps`` warps that the SMs' thread and block limits let be co-resident
    when ``pes`` PEs launch together (an upper bound: the driver's occupancy also counts registers)."""
    per_sm = min(blocks_per_sm, threads_per_sm // (warps * wave))
    return per_sm * sm_count // pes


def block_candidates(limit: int, min_blocks: int = 8, max_blocks: int | None = None) -> list[int]:
    """MORI's quick block scope under a co-residency ``limit``: powers of two from ``min_blocks`` up to the
    limit, and the limit itself (MORI: powers of two up to the CU count, and the CU count)."""
    from mori_compiler.ep_schema import MAX_BLOCKS

    limit = min(limit, MAX_BLOCKS if max_blocks is None else max_blocks)
    out, b = [], 1
    while b <= limit:
        if b >= min_blocks:
            out.append(b)
        b *= 2
    if limit >= 1 and limit not in out:
        out.append(limit)
    return out


def mori_gbps(totals, hidden: int, elem: int, us: float) -> float:
    """MORI's intra-node bandwidth of a leg: total_recv x hidden x element bytes / time per PE, mean over
    PEs, decimal GB/s."""
    return sum(t * hidden * elem for t in totals) / len(totals) / (us * 1e-6) / 1e9


def pick_best(points, tolerance: float = 0.03, margin: float = MORI_MARGIN_GBPS):
    """The geometry to keep among ``points`` of one key: the smallest grid (blocks x warps, then blocks, then
    warps) among those within max(tolerance x best, margin) GB/s of the best bandwidth."""
    points = list(points)
    if not points:
        raise ValueError("pick_best: no measurements")
    best = max(p.gbps for p in points)
    near = [p for p in points if p.gbps >= best - max(tolerance * best, margin)]
    return min(near, key=lambda p: (p.blocks * p.warps, p.blocks, p.warps))


def leg_key(p) -> tuple:
    return (p.kind, p.leg, p.dtype, p.tokens, p.zero_copy)


def group(points) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(leg_key(p), []).append(p)
    return out


def best_rules(points, tolerance: float = 0.03) -> dict:
    """{(kind, phase): [TuningRule]} of the best geometry of every measured key."""
    from mori_compiler.ops.auto_launch import _tuning_dtype
    from mori_compiler.ops.tuning import TuningRule

    rules: dict = {}
    for (kind, leg, dtype, tokens, zero_copy), pts in sorted(group(points).items(), key=lambda kv: repr(kv[0])):
        best = pick_best(pts, tolerance)
        combine = {"zero_copy": zero_copy, "quant_type": "none"} if leg == "combine" else {}
        rule = TuningRule(dtype=_tuning_dtype(dtype), num_tokens=tokens, hidden_dim=HIDDEN, block_num=best.blocks,
                          rdma_block_num=0, warp_per_block=best.warps, topk=TOPK,
                          info={"bandwidth_gbps": round(best.gbps, 2), "latency_us": round(best.us, 2)}, **combine)
        rules.setdefault((kind, leg), []).append(rule)
    return rules


def write_tables(rules: dict, directory, model: str, world: int) -> list[Path]:
    """Write (merging) one MORI v1 table per (kind, phase) of ``rules`` (best_rules); returns the paths."""
    from mori_compiler.ops.tuning import write_tuning_table

    return [write_tuning_table(directory, TARGET, model, kind, world, leg, rs)
            for (kind, leg), rs in sorted(rules.items())]  # fmt: skip


def check_ratios(grid_points, auto_points) -> list[dict]:
    """Per key of ``auto_points`` (the geometry AUTO picked, measured): auto GB/s over the best of
    ``grid_points`` (every grid geometry, measured in the same run) of that key."""
    grid = group(grid_points)
    out = []
    for p in auto_points:
        pts = grid.get(leg_key(p), [])
        if not pts:
            raise ValueError(f"check: no grid measurement of {leg_key(p)} to compare the AUTO pick with")
        best = max(pts, key=lambda q: q.gbps)
        out.append({"kind": p.kind, "leg": p.leg, "dtype": p.dtype, "tokens": p.tokens, "zero_copy": p.zero_copy,
                    "auto": [p.blocks, p.warps], "auto_gbps": p.gbps, "best": [best.blocks, best.warps],
                    "best_gbps": best.gbps, "ratio": p.gbps / best.gbps})  # fmt: skip
    return out


def leg_forms(kind: str, dispatch_dtypes=DISPATCH_DTYPES) -> list[tuple[str, str, bool | None]]:
    """(leg, dtype, zero_copy) of every leg measured for a kernel type: each dispatch dtype; the bf16
    combine in each form the op offers (AutoLaunch.combine_forms, with the push buffers built)."""
    from mori_compiler.ops.auto_launch import AutoLaunch

    forms = AutoLaunch(make_config(kind, 8, 128, 8), TARGET, search_dirs=[]).combine_forms()
    return [("dispatch", d, None) for d in dispatch_dtypes] + [("combine", COMBINE_DTYPE, z) for z in forms]


def estimate(n_points: int, tokens_of_points, reps: int, n_ops: int = 0, overhead_s: float = 0.05,
             op_s: float = 3.0) -> dict:  # fmt: skip
    """Device-time estimate of a sweep: per point one eager call, one capture and reps + 1 replays; a replay
    costs about 30 µs + 0.2 µs per token (the H200 EP legs at 8 virtual PEs: 40-60 µs at 128 tokens, 400-900
    at 4096); a point's eager call, synchronization, capture and gate ``overhead_s``; each of the ``n_ops``
    ops (one per kernel type and warp count: buffers zeroed, module loaded and JIT-compiled) ``op_s``."""
    replay_s = sum((reps + 1) * (30 + 0.2 * t) * 1e-6 for t in tokens_of_points)
    return {"points": n_points, "captures": n_points, "replays": n_points * (reps + 1), "ops": n_ops,
            "seconds": round(n_points * overhead_s + replay_s + n_ops * op_s, 1)}  # fmt: skip


def make_config(kind: str, world: int, tokens: int, warps: int, blocks: int = 8):
    """The tuning shape: hidden 7168, top-8 of 256 experts, bf16-wide token buffers, push staging buffers
    too (so both combine forms can be measured) for the intra-node types."""
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=world, hidden_dim=HIDDEN, scale_dim=0,
                                   scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=tokens,
                                   num_experts_per_rank=EXPERTS // world, num_experts_per_token=TOPK,
                                   warp_num_per_block=warps, block_num=blocks, use_external_inp_buf=kind != "AsyncLL",
                                   kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip


def asyncll_mode():
    """AsyncLL's notification mode: the defaults, not the environment (the precompiled bundles must match)."""
    from mori_compiler.ops.asyncll import resolve

    return resolve({})


def warp_plan(kind: str, world: int, tokens: int, warps) -> list[int]:
    """The warp counts to build ops (and bundles) for: the grid's and what AUTO may pick beyond it (the
    fallback's, the config's: AutoLaunch.warp_counts without tables is exactly those)."""
    from mori_compiler.ops.auto_launch import AutoLaunch

    auto = AutoLaunch(make_config(kind, world, tokens, warps[0]), TARGET, search_dirs=[])
    return sorted(set(warps) | set(auto.warp_counts()))


# ---- on the GPU -----------------------------------------------------------------------------------------------

def precompile(cache_root, args) -> None:
    from mori_compiler.ops import ep_bundle

    for kind in args.kinds:
        for w in warp_plan(kind, args.world, max(args.tokens), args.warps):
            cfg = make_config(kind, args.world, max(args.tokens), w)
            mode = asyncll_mode() if kind == "AsyncLL" else None
            b = ep_bundle(cfg, TARGET, virtual_pes=True, asyncll=mode, cache_root=cache_root)
            print(kind, f"{w} warps", b.path, flush=True)


@contextlib.contextmanager
def _environ(values: dict):
    """``os.environ`` with ``values`` set, restored afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Sweep:
    """Times legs of one op (one kernel type and warp count) at a token count; owns the op."""

    def __init__(self, kind: str, world: int, max_tokens: int, warps: int, reps: int, environ=None):
        from mori_compiler.ops import EpDispatchCombineOp
        from mori_compiler.ops.auto_launch import coresident_blocks, leg_kernel_names
        from mori_compiler.targets import get_target

        self.kind, self.world, self.warps, self.reps = kind, world, warps, reps
        self.cfg = make_config(kind, world, max_tokens, warps)
        with _environ(environ or {}):  # the op reads its launch mode and tables when it is built
            self.op = EpDispatchCombineOp(self.cfg, target=TARGET,
                                          asyncll=asyncll_mode() if kind == "AsyncLL" else None)  # fmt: skip
        threads = warps * get_target(TARGET).wave_size
        self.limit = {leg: coresident_blocks(self.op.kernels, leg_kernel_names(self.cfg, leg), threads, world)
                      for leg in ("dispatch", "combine")}  # fmt: skip
        self.gate_blocks = max(1, min(8, *self.limit.values()))  # a small grid that fits

    def close(self) -> None:
        self.op.close()

    def prepare(self, tokens: int, seed: int = 11) -> None:
        import numpy as np
        import torch

        from mori_compiler.ops import reference as ref

        self.tokens = tokens
        self.shape = ref.EpShape(self.world, self.cfg.num_experts_per_rank, TOPK, tokens)
        self.idx_np = ref.make_routing("random", [tokens] * self.world, self.shape, seed)
        self.idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in self.idx_np]
        self.ws = [torch.rand(tokens, TOPK, device="cuda") for _ in range(self.world)]
        self.xs = {}
        torch_dtypes = {"bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn}
        for name, dt in torch_dtypes.items():
            self.xs[name] = [torch.randn(tokens, HIDDEN, device="cuda").to(dt) for _ in range(self.world)]
        if self.kind == "AsyncLL":
            self.push = [torch.empty(self.cfg.max_recv, HIDDEN, dtype=torch.bfloat16, device="cuda")
                         for _ in range(self.world)]  # fmt: skip
            self.regs = None
        else:
            self.regs = self.op.get_registered_combine_input_buffer(torch.bfloat16)
            self.push = [torch.empty_like(r) for r in self.regs]
        self.totals = None

    def _dispatch(self, dtype: str, blocks: int):
        return self.op.dispatch(self.xs[dtype], self.ws, None, self.idxs, block_num=blocks)

    def _combine(self, zero_copy: bool, blocks: int):
        if self.kind == "AsyncLL":
            return self.op.combine(self.push, None, self.idxs, block_num=blocks)
        inp = self.regs if zero_copy else self.push
        return self.op.combine(inp, None, self.idxs, block_num=blocks, use_external_inp_buf=int(not zero_copy))

    def _fill_combine_inputs(self, outs) -> None:
        import torch

        for p in range(self.world):  # the received rows, as the identity experts' outputs
            rows = outs[p][0][: self.totals[p]].to(torch.bfloat16)
            self.push[p][: self.totals[p]].copy_(rows)
            if self.regs is not None:
                self.regs[p][: self.totals[p]].copy_(rows)

    def _gate(self, res) -> None:
        """Identity experts: PE 0's combine output must be U x (docs/ep-protocols.md §12)."""
        from mori_compiler.ops import reference as ref

        ref.check_combine(res[0][0][: self.tokens].float().cpu().numpy(), self.xs["bf16"][0].float().cpu().numpy(),
                          self.idx_np[0], self.shape, "bf16", rank=0)  # fmt: skip

    def _time(self, fn) -> float:
        """Median µs of graph replays of ``fn`` (called once eagerly before, by the caller)."""
        import torch

        from ep_bench import _median_replay_us

        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return _median_replay_us(g, self.reps)

    def measure(self, leg: str, dtype: str, zero_copy, blocks: int, gate: bool) -> Point:
        import torch

        if leg == "dispatch":
            outs = self._dispatch(dtype, blocks)
            if self.totals is None:
                torch.cuda.synchronize()
                self.totals = [int(o[4].item()) for o in outs]
            if gate and dtype == "bf16":
                self._fill_combine_inputs(outs)
                self._gate(self._combine(self.regs is not None, self.gate_blocks))
            us = self._time(lambda: self._dispatch(dtype, blocks))
            elem = ELEMENT_BYTES[dtype]
        else:
            if self.totals is None or getattr(self, "_combine_ready", None) != self.tokens:
                outs = self._dispatch("bf16", self.gate_blocks)
                torch.cuda.synchronize()
                self.totals = [int(o[4].item()) for o in outs]
                self._fill_combine_inputs(outs)
                self._combine_ready = self.tokens
            res = self._combine(zero_copy, blocks)
            if gate:
                self._gate(res)
            us = self._time(lambda: self._combine(zero_copy, blocks))
            elem = ELEMENT_BYTES[COMBINE_DTYPE]
        return Point(self.kind, leg, dtype, self.tokens, zero_copy, blocks, self.warps, us,
                     mori_gbps(self.totals, HIDDEN, elem, us))  # fmt: skip


def heap_bytes(kinds, world: int, tokens: int, warps) -> int:
    """The symmetric heap per PE for the largest op of the sweep (ops are built one after the other)."""
    from mori_compiler.ep_schema import buffers_for
    from mori_compiler.ops import EpDispatchCombineKernelType

    def op_bytes(kind):
        sizes = make_config(kind, world, tokens, warps[0]).sizes
        return sum(-(-size // 256) * 256 for _, size in buffers_for(EpDispatchCombineKernelType[kind], sizes))

    return max(op_bytes(k) for k in kinds) + (64 << 20)


def sweep_grid(args, kind: str, token_list, deadline=None):
    """Measure every grid geometry of ``kind``: (points, co-residency limits {(leg, warps): blocks},
    skipped keys (budget reached))."""
    points, limits, skipped = [], {}, set()
    forms = leg_forms(kind)
    for w in args.warps:
        s = Sweep(kind, args.world, max(args.tokens), w, args.reps)
        limits.update({(leg, w): n for leg, n in s.limit.items()})
        print(f"{kind} {w} warps: co-resident limit {s.limit['dispatch']} (dispatch) / {s.limit['combine']} "
              f"(combine) blocks per PE", flush=True)  # fmt: skip
        try:
            if min(s.limit.values()) < 1:  # no block of this size fits an SM (registers): nothing to measure
                continue
            for t in token_list:
                s.prepare(t)
                for leg, dtype, z in forms:
                    for b in block_candidates(s.limit[leg], args.min_blocks):
                        if deadline is not None and time.monotonic() > deadline:
                            skipped.add((kind, leg, dtype, t, z))
                            continue
                        points.append(s.measure(leg, dtype, z, b, gate=t <= 512))
        finally:
            s.close()
    return points, limits, skipped


def measure_picks(args, kind: str, picks: dict, deadline=None, tables=()):
    """Measure the geometries AUTO picked, ``picks[(leg, dtype, tokens, zero_copy)] = (blocks, warps)``,
    one op per warp count; returns (points, skipped keys). ``args.via_op``: instead, the op itself in AUTO
    mode over ``tables`` (MORI_EP_TUNING_CONFIG), called without a geometry (the points keep AUTO's pick)."""
    if getattr(args, "via_op", False):
        return _measure_via_op(args, kind, picks, deadline, tables)
    points, skipped = [], set()
    for w in sorted({w for _, w in picks.values()}):
        s = Sweep(kind, args.world, max(args.tokens), w, args.reps)
        try:
            for t in sorted({key[2] for key in picks}):
                s.prepare(t)
                for (leg, dtype, tokens, z), (b, pw) in sorted(picks.items(), key=repr):
                    if tokens != t or pw != w:
                        continue
                    if deadline is not None and time.monotonic() > deadline:
                        skipped.add((kind, leg, dtype, t, z))
                        continue
                    points.append(s.measure(leg, dtype, z, b, gate=False))
        finally:
            s.close()
    return points, skipped


def _measure_via_op(args, kind: str, picks: dict, deadline, tables):
    from mori_compiler.ops.tuning import LAUNCH_MODE_VAR, TUNING_CONFIG_VAR

    if not tables:
        raise ValueError(f"--via-op: no {kind} table in {args.tables} to give the op")
    environ = {LAUNCH_MODE_VAR: "AUTO", TUNING_CONFIG_VAR: os.pathsep.join(map(str, tables))}
    points, skipped = [], set()
    s = Sweep(kind, args.world, max(args.tokens), args.warps[0], args.reps, environ)
    try:
        for t in sorted({key[2] for key in picks}):
            s.prepare(t)
            for (leg, dtype, tokens, z), (b, w) in sorted(picks.items(), key=repr):
                if tokens != t:
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    skipped.add((kind, leg, dtype, t, z))
                    continue
                points.append(s.measure(leg, dtype, z, -1, gate=t <= 512)._replace(blocks=b, warps=w))
    finally:
        s.close()
    return points, skipped


def limit_of(args, kind: str, limits: dict):
    """``max_blocks(leg, warps)`` for AutoLaunch.bind_coresidency: the limits the grid sweep saw, and for
    another warp count (the fallback's, the config's) the limit of an op built for it."""

    def max_blocks(leg: str, warps: int) -> int:
        if (leg, warps) not in limits:
            s = Sweep(kind, args.world, max(args.tokens), warps, args.reps)
            limits.update({(lg, warps): n for lg, n in s.limit.items()})
            s.close()
        return limits[(leg, warps)]

    return max_blocks


def auto_picks(args, kind: str, model: str, token_list, limits: dict) -> tuple[dict, list]:
    """AUTO's geometry (blocks, warps) of every measured key of ``kind``, from the tables in --tables: the
    op's lookup (AutoLaunch), bound to this GPU's co-residency limits; and the tables' paths."""
    from mori_compiler.ops.auto_launch import AutoLaunch

    cfg = make_config(kind, args.world, max(args.tokens), args.warps[0])  # as warp_plan's (the bundles built)
    auto = AutoLaunch(cfg, TARGET, model, search_dirs=[args.tables])
    print(f"{kind}: AUTO tables {[str(t.path) if t else None for t in auto.tables.values()]}", flush=True)
    auto.bind_coresidency(limit_of(args, kind, limits))
    picks = {}
    for leg, dtype, z in leg_forms(kind):
        for t in token_list:
            g = auto.geometry(leg, dtype, t, zero_copy=z) if leg == "combine" else auto.geometry(leg, dtype, t)
            picks[(leg, dtype, t, z)] = (g.block_num, g.warp_per_block)
    return picks, [t.path for t in auto.tables.values() if t is not None]


def main(argv=None) -> int:
    from mori_compiler.ops.tuning import SHIPPED_DIR

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated kernel types ({', '.join(KINDS)})")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", default="128,256,512,1024,2048,4096")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--min-blocks", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="geometries within this fraction of the best count as equal (the smallest grid wins)")
    ap.add_argument("--tables", default=str(SHIPPED_DIR), help="where tables are written (and --check reads them)")
    ap.add_argument("--model", help="GPU model of the file names (default: from the device name)")
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="stop measuring after this many seconds (what is left is listed, not written)")
    ap.add_argument("--check", action="store_true", help="measure AUTO's picks against the grid at 128 and 4096")
    ap.add_argument("--via-op", action="store_true",
                    help="--check: measure AUTO through the op in AUTO mode (one op, no geometry passed), not "
                         "through its lookup with MANUAL ops")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the device-time estimate only")
    ap.add_argument("--json")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    args = ap.parse_args(argv)
    try:
        args.kinds = [k for k in args.kinds.split(",") if k]
        bad = [k for k in args.kinds if k not in KINDS]
        if bad or not args.kinds:
            raise ValueError(f"--kinds {bad[0] if bad else '(none)'!r} is not allowed; allowed: {', '.join(KINDS)}")
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.warps = [int(w) for w in args.warps.split(",")]
        if not args.tokens or min(args.tokens) < 1 or not args.warps or min(args.warps) < 1:
            raise ValueError("--tokens and --warps take positive integers")
        if not 2 <= args.world <= 32 or args.reps < 1 or args.min_blocks < 1 or not 0 <= args.tolerance < 1:
            raise ValueError("--world must be in [2, 32], --reps and --min-blocks >= 1, --tolerance in [0, 1)")
        if args.via_op and not args.check:
            raise ValueError("--via-op measures AUTO's picks: it needs --check")
    except ValueError as exc:
        print(f"ep_tune: {exc}", file=sys.stderr)
        return 1
    from mori_compiler.ops.tuning import LAUNCH_MODE_VAR, launch_config_mode

    if launch_config_mode() == "AUTO":
        print(f"ep_tune: {LAUNCH_MODE_VAR}=AUTO would override the swept geometry; unset it (the tuner builds its "
              "ops in MANUAL mode)", file=sys.stderr)  # fmt: skip
        return 1
    if args.precompile:
        precompile(args.precompile, args)
        return 0
    token_list = list(CHECK_TOKENS) if args.check else args.tokens
    if args.check and max(args.tokens) < max(CHECK_TOKENS):
        args.tokens = sorted(set(args.tokens) | set(CHECK_TOKENS))
    plan = []  # (tokens of each point) at the thread bound (132 SMs): the estimate before the GPU is asked
    for kind in args.kinds:
        for w in args.warps:
            for leg, _, _ in leg_forms(kind):
                plan += [t for t in token_list for _ in block_candidates(thread_bound_blocks(132, args.world, w),
                                                                         args.min_blocks)]  # fmt: skip
    n_ops = len(args.kinds) * len(args.warps) * (2 if args.check else 1)  # --check: the grid's, then the picks'
    est = estimate(len(plan), plan, args.reps, n_ops)
    print(f"plan (upper bound, 132 SMs, thread-limited occupancy): {est['ops']} ops, {est['points']} graph captures, "
          f"{est['replays']} replays, about {est['seconds']} s of device time; budget {args.budget_s} s",
          flush=True)  # fmt: skip
    if args.dry_run:
        return 0
    import torch

    from mori_compiler.ops.auto_launch import gpu_model_name
    from mori_compiler.runtime import shmem

    torch.cuda.init()
    name = torch.cuda.get_device_name()
    model = args.model or gpu_model_name(name)
    start = time.monotonic()
    heap = heap_bytes(args.kinds, args.world, max(args.tokens), args.warps)
    shmem.shmem_init_virtual(args.world, heap_size=heap)
    grid, autos, skipped = [], [], set()
    try:
        for kind in args.kinds:
            pts, limits, skip = sweep_grid(args, kind, token_list, deadline=start + args.budget_s)
            grid += pts
            skipped |= skip
            if args.check:
                picks, tables = auto_picks(args, kind, model, token_list, limits)
                pts, skip = measure_picks(args, kind, picks, deadline=start + args.budget_s, tables=tables)
                autos += pts
                skipped |= skip
    finally:
        shmem.shmem_finalize()
    elapsed = time.monotonic() - start
    print(f"{name} ({model}): {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts; "
          f"{len(grid) + len(autos)} points in {elapsed:.0f} s; graph replay median of {args.reps}")  # fmt: skip
    result = {"device": name, "model": model, "world": args.world, "reps": args.reps, "elapsed_s": elapsed,
              "points": [p._asdict() for p in grid], "skipped": sorted(map(list, skipped), key=repr)}  # fmt: skip
    if skipped:
        print(f"budget reached: {len(skipped)} legs not (fully) measured, not written: "
              + "; ".join(" ".join(map(str, k)) for k in sorted(skipped, key=repr)))
        grid = [p for p in grid if leg_key(p) not in skipped]
        autos = [p for p in autos if leg_key(p) not in skipped]
    if args.check:
        ratios = check_ratios(grid, autos)
        result["check"] = ratios
        print(f"{'kind':<12}{'leg':<9}{'dtype':<11}{'form':<6}{'tokens':>7}{'auto':>9}{'best':>9}{'auto/best':>10}")
        for r in ratios:
            form = "" if r["zero_copy"] is None else ("zc" if r["zero_copy"] else "push")
            print(f"{r['kind']:<12}{r['leg']:<9}{r['dtype']:<11}{form:<6}{r['tokens']:>7}"
                  f"{'%dx%d' % tuple(r['auto']):>9}{'%dx%d' % tuple(r['best']):>9}{r['ratio']:>10.3f}")
        worst = min((r["ratio"] for r in ratios), default=None)
        if worst is None:
            print("no AUTO picks measured")
        else:
            print(f"worst auto/best: {worst:.3f} ({'meets' if worst >= 0.95 else 'MISSES'} the goal >= 0.95)")
    else:
        rules = best_rules(grid, args.tolerance)
        paths = write_tables(rules, args.tables, model, args.world)
        result["tables"] = [str(p) for p in paths]
        for (kind, leg), rs in sorted(rules.items()):
            for r in rs:
                form = "" if r.zero_copy is None else (" zc" if r.zero_copy else " push")
                print(f"{kind:<12}{leg:<9}{r.dtype:<9}{form:<5}{r.num_tokens:>6}: {r.block_num:>4} x "
                      f"{r.warp_per_block:<3}{r.info['bandwidth_gbps']:>8.1f} GB/s {r.info['latency_us']:>8.1f} us")
        print("wrote", ", ".join(result["tables"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
