"""Where the time of an EP dispatch / combine goes: the kernels' phase trace points, per PE (issue 15).

The ep_bench.py shape (8 virtual PEs, hidden 7168, top-8, 256 experts, random routing) with the kernels compiled
with their trace points (``EpDispatchCombineOp(config, trace=True)``, docs/tracing.md). Each leg is captured in
a CUDA graph; after warm-up replays, one replay is recorded and the phase table printed: per event, the time
from the PE's earliest trace point (min / median / max over warps, µs; the "PE max" row is the slowest PE) and
each begin/end pair's duration. The same run times the graph replays with the trace buffer set (recording)
and unset (the traced code, recording nothing), beside the untraced op (the cost of the trace points: issue 17).

    python bench/ep_phase_profile.py --precompile .bundles          # where the compiler is
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_phase_profile.py --perfetto out.json --json out_phases.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ep_bench import EXPERTS, HIDDEN, TOPK, _median_replay_us, capture_graph, make_config  # noqa: E402

KINDS = ("IntraNode", "IntraNodeLL")
DISPATCH_KERNELS = {"IntraNode": "ep_dispatch_{d}", "IntraNodeLL": "ep_dispatch_ll_{d}"}


def precompile(cache_root, world, tokens_list, blocks, warps, kinds) -> None:
    from mori_compiler.ops.bundle import ep_bundle

    for kind in kinds:
        for tokens in tokens_list:
            cfg = make_config(world, tokens, blocks, warps, kind=kind)
            for trace in (False, True):
                print(kind, tokens, "trace" if trace else "plain",
                      ep_bundle(cfg, "sm_90", virtual_pes=True, cache_root=cache_root, trace=trace).path)


def _step(what: str) -> None:
    """Progress on stderr (a hang says where it is)."""
    import time

    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _legs(op, xs, ws, idxs, regs, blocks):
    """[(leg, dtype, graph)]: the dispatch of each dtype and the zero-copy combine, each captured after an eager
    call (ep_bench.capture_graph)."""
    import torch

    def dispatch(x):
        return lambda: op.dispatch(x, ws, None, idxs, block_num=blocks)

    def combine():
        return op.combine(regs, None, idxs, block_num=blocks)

    legs = [("dispatch", name, dispatch(x)) for name, x in xs.items()]
    legs.append(("combine", "bf16", combine))
    out = []
    for leg, dname, fn in legs:
        _step(f"capture {leg} {dname}")
        if leg == "combine":
            outs = op.dispatch(xs["bf16"], ws, None, idxs, block_num=blocks)
            for p, reg in enumerate(regs):
                reg.copy_(outs[p][0].to(torch.bfloat16))
        out.append((leg, dname, capture_graph(fn)))
    return out


def profile(kind: str, world: int, tokens: int, blocks: int, warps: int, reps: int) -> tuple[list[dict], list]:
    import numpy as np
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref
    from mori_compiler.runtime.trace import format_phase_table, phase_summary

    cfg = make_config(world, tokens, blocks, warps, kind=kind)
    shape = ref.EpShape(world, cfg.num_experts_per_rank, TOPK, tokens)
    idx_np = ref.make_routing("random", [tokens] * world, shape, 11)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    gen = torch.Generator(device="cuda").manual_seed(5)
    base = [torch.randn(tokens, HIDDEN, device="cuda", generator=gen) for _ in range(world)]
    xs = {"bf16": [b.to(torch.bfloat16) for b in base], "fp8": [b.to(torch.float8_e4m3fn) for b in base]}
    ws = [torch.rand(tokens, TOPK, device="cuda", generator=gen) for _ in range(world)]
    rows, traces = [], []
    _step(f"{kind} {tokens}: ops")
    plain = EpDispatchCombineOp(cfg)
    traced = EpDispatchCombineOp(cfg, trace=True)
    try:
        plain_legs = _legs(plain, xs, ws, idxs, plain.get_registered_combine_input_buffer(torch.bfloat16), blocks)
        traced_legs = _legs(traced, xs, ws, idxs, traced.get_registered_combine_input_buffer(torch.bfloat16), blocks)
        for (leg, dname, g_plain), (_, _, g_traced) in zip(plain_legs, traced_legs):
            kernel = (DISPATCH_KERNELS[kind] if leg == "dispatch" else "ep_combine_pull_{d}").format(
                d="bf16" if dname == "bf16" else "fp8_e4m3fn")  # fmt: skip
            _step(f"time {leg} {dname}")
            us_plain = _median_replay_us(g_plain, reps)
            us_off = _median_replay_us(g_traced, reps)  # trace code compiled in, the buffer address 0
            _step(f"trace {kernel}")
            tr = traced.kernel_trace(kernel, blocks)
            us_on = _median_replay_us(g_traced, reps)
            _step("record")
            tr.reset()
            g_traced.replay()
            torch.cuda.synchronize()
            # (a graph replay is no launch the KernelSet sees: the trace is told the replayed grid)
            trace = tr.read(grid=(blocks, 1, world), block=(warps * traced.target.wave_size, 1, 1)).placed(
                f"{kind} {leg} {dname} {tokens} tok")
            tr.disable()
            traces.append(trace)
            summary = phase_summary([trace])
            rows.append({"kind": kind, "leg": leg, "dtype": dname, "tokens": tokens, "blocks": blocks, "warps": warps,
                         "kernel": kernel, "us_untraced": us_plain, "us_trace_off": us_off, "us_trace_on": us_on,
                         "phases": [dataclasses.asdict(s) for s in summary]})  # fmt: skip
            print(f"\n== {kind} {leg} {dname}, {tokens} tokens, {blocks}x{warps}: {us_plain:.1f} µs untraced, "
                  f"{us_off:.1f} traced (off), {us_on:.1f} traced (recording)")  # fmt: skip
            print(format_phase_table(summary))
    finally:
        traced.close()
        plain.close()
    return rows, traces


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--perfetto", help="write the recorded replays as Chrome trace-event JSON (Perfetto's UI)")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    ap.add_argument("--hang-s", type=float, default=0, help="print the stacks and exit after this many seconds")
    args = ap.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"--kinds {','.join(bad)}: allowed {', '.join(KINDS)}")
    if args.precompile:
        precompile(args.precompile, args.world, tokens_list, args.blocks, args.warps, kinds)
        return 0
    import faulthandler

    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.trace import export_to_perfetto

    if args.hang_s:
        faulthandler.dump_traceback_later(args.hang_s, exit=True)  # a stuck run prints where it is, then ends
    torch.cuda.init()
    heap = 2 * (args.world * max(tokens_list) * HIDDEN * 2) * 2 + (256 << 20)  # two ops' out_x and reg_x
    shmem.shmem_init_virtual(args.world, heap_size=heap)
    rows, traces = [], []
    try:
        for kind in kinds:
            for tokens in tokens_list:
                r, t = profile(kind, args.world, tokens, args.blocks, args.warps, args.reps)
                rows += r
                traces += t
    finally:
        shmem.shmem_finalize()
    print(f"\n{torch.cuda.get_device_name()}: {args.world} virtual PEs, hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    if args.perfetto:
        export_to_perfetto(args.perfetto, traces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
