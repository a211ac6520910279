"""What the EP op's debug mode costs: dispatch + combine per call with ``validate=True`` (expert ids checked on
the device, no host synchronization) against ``validate="debug"`` (a host synchronization after each dispatch,
raising on invalid ids), on one GPU with virtual PEs.

Config: 8 virtual PEs, IntraNode, hidden 7168, top-8 of 256 experts, random routing, bf16, zero-copy combine,
128 and 4096 tokens per PE. Eager calls (no graph: a graph cannot capture the debug mode's synchronization),
``--iters`` back to back after warm-up, timed on the host around the loop with one synchronization at the end;
both modes alternate per round (``--rounds``) so drift falls on both. Reported: µs per dispatch + combine per
mode, their ratio, and the median over rounds.

    python bench/ep_validate_cost.py --precompile .bundles     # where the compiler is
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_validate_cost.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ep_bench import make_config  # noqa: E402  (the benchmark shape)

MODES = (True, "debug")


def _label(mode) -> str:
    return "debug" if mode == "debug" else "device"


def precompile(cache_root, tokens_list, blocks, warps) -> None:
    from mori_compiler.ops import ep_bundle

    for tokens in tokens_list:
        cfg = make_config(8, tokens, blocks, warps)
        print(tokens, ep_bundle(cfg, "sm_90", virtual_pes=True, cache_root=cache_root).path)


def per_call_us(op, xs, idxs, iters: int) -> float:
    """Host µs per dispatch + combine (identity expert in place in the registered buffer), ``iters`` calls."""
    import torch

    ys = [op.get_registered_combine_input_buffer(torch.bfloat16, pe=p) for p in range(len(xs))]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        op.dispatch(xs, None, None, idxs)
        op.combine(ys, None, idxs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def measure(tokens: int, args) -> dict:
    import numpy as np
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    cfg = make_config(8, tokens, args.blocks, args.warps)
    shape = ref.EpShape(cfg.world_size, cfg.num_experts_per_rank, cfg.num_experts_per_token, tokens)
    idx_np = ref.make_routing("random", [tokens] * 8, shape, 1)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    xs = [torch.randn((tokens, cfg.hidden_dim), device="cuda").to(torch.bfloat16) for _ in range(8)]
    ops = {mode: EpDispatchCombineOp(cfg, validate=mode) for mode in MODES}
    try:
        for op in ops.values():  # warm-up (uploads the argument tables)
            per_call_us(op, xs, idxs, 5)
        rounds = {_label(m): [] for m in MODES}
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                rounds[_label(mode)].append(per_call_us(ops[mode], xs, idxs, args.iters))
    finally:
        for op in ops.values():
            op.close()
    device, debug = statistics.median(rounds["device"]), statistics.median(rounds["debug"])
    return {"tokens": tokens, "device_us": device, "debug_us": debug, "ratio": debug / device, "rounds": rounds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="128,4096")
    p.add_argument("--blocks", type=int, default=32)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json")
    p.add_argument("--precompile")
    args = p.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    if args.precompile:
        precompile(args.precompile, tokens_list, args.blocks, args.warps)
        return 0
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    shmem.shmem_init_virtual(8, heap_size=6 << 30)
    try:
        rows = [measure(t, args) for t in tokens_list]
    finally:
        shmem.shmem_finalize()
    print(f"{torch.cuda.get_device_name()}: 8 virtual PEs, IntraNode, hidden 7168, top-8 of 256, bf16, eager "
          f"dispatch + combine, {args.iters} calls x {args.rounds} rounds")  # fmt: skip
    print(f"{'tokens':>7} {'device (us)':>12} {'debug (us)':>11} {'debug/device':>13}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['device_us']:>12.1f} {r['debug_us']:>11.1f} {r['ratio']:>13.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
