"""How fast can any SM kernel move the EP dispatch's bytes? A ceiling for ep_bench.py's "physical" column.

The dispatch reads each token row once and stores it to each of its destinations (5.25 on average for top-8
of 256 experts over 8 PEs: one read to ~5 writes). This script moves exactly those bytes with no control
path at all (no routing, reservation, metadata or completion; the destinations precomputed on the host from
ep_bench.py's routing, seed and shape) in a Triton kernel, and reports the same ratio as ep_bench.py: bytes
read + written per second over the device's copy ceiling (``ep_bench.copy_bandwidth``), measured in the
same run. Two patterns, the best of a small grid of (vector block, warps) each:

* ``fanout``: one program per token row, each block of the row loaded once and stored to every destination
  (the dispatch's pattern);
* ``per_dest``: one program per (row, destination), the row read again per destination (more reads, fewer
  stores per load; the reads mostly hit L2).

If the best of these stays under the goal at some point, the kernels cannot reach it there by their copy's
shape alone. A measurement instrument (Triton, not the compiler), run on the GPU machine:

    python bench/store_fanout_ceiling.py --tokens 128,4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ep_bench import EXPERTS, HIDDEN, TOPK, _median_replay_us, capture_graph, copy_bandwidth  # noqa: E402

WORLD = 8
CONFIGS = ((256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 8))  # (int32 elements per block step, warps)


def destinations(tokens: int, seed: int = 11):
    """For every PE's token rows (PE-major): their destination rows in one receive buffer of W * W * tokens
    rows (PE pe's slot s is row pe * W * tokens + s; slots in order of the sources' rows), as a [rows, K]
    int32 array padded with -1, the number of destinations per row, and the buffer's row count."""
    import numpy as np

    from mori_compiler.ops import reference as ref

    shape = ref.EpShape(WORLD, EXPERTS // WORLD, TOPK, tokens)
    idx = ref.make_routing("random", [tokens] * WORLD, shape, seed)
    cap = WORLD * tokens
    fill = [0] * WORLD
    rows = np.full((WORLD * tokens, TOPK), -1, dtype=np.int32)
    count = np.zeros(WORLD * tokens, dtype=np.int32)
    for src in range(WORLD):
        for t in range(tokens):
            seen = []
            for e in idx[src][t]:
                pe = int(e) // (EXPERTS // WORLD)
                if e >= 0 and pe not in seen:
                    seen.append(pe)
            r = src * tokens + t
            for j, pe in enumerate(seen):
                rows[r, j] = pe * cap + fill[pe]
                fill[pe] += 1
            count[r] = len(seen)
    return rows, count, WORLD * cap


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def fanout(src, dst, dest_rows, counts, ROW: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        c = tl.load(counts + t)
        for off in range(0, ROW, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            inside = cols < ROW
            x = tl.load(src + t * ROW + cols, mask=inside)
            for d in tl.static_range(K):
                if d < c:
                    r = tl.load(dest_rows + t * K + d).to(tl.int64)
                    tl.store(dst + r * ROW + cols, x, mask=inside)

    @triton.jit
    def per_dest(src, dst, pairs_src, pairs_dst, ROW: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64)
        s = tl.load(pairs_src + i).to(tl.int64)
        r = tl.load(pairs_dst + i).to(tl.int64)
        for off in range(0, ROW, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            inside = cols < ROW
            tl.store(dst + r * ROW + cols, tl.load(src + s * ROW + cols, mask=inside), mask=inside)

    return fanout, per_dest


def measure(tokens: int, elem: int, reps: int, copy_bps: float) -> list[dict]:
    import numpy as np
    import torch

    fanout, per_dest = _kernels()
    rows_np, count_np, dst_rows = destinations(tokens)
    row = HIDDEN * elem // 4  # int32 words per row: a byte mover
    src = torch.randint(-(2**31), 2**31 - 1, (WORLD * tokens, row), dtype=torch.int32, device="cuda")
    dst = torch.empty((dst_rows, row), dtype=torch.int32, device="cuda")
    dest_rows = torch.from_numpy(rows_np).cuda()
    counts = torch.from_numpy(count_np).cuda()
    ps, pd = np.nonzero(rows_np >= 0)
    pairs_src = torch.from_numpy(ps.astype(np.int32)).cuda()
    pairs_dst = torch.from_numpy(rows_np[ps, pd]).cuda()
    writes = int(count_np.sum())
    physical = (WORLD * tokens + writes) * HIDDEN * elem
    expect = src.index_select(0, pairs_src.long())
    out = []
    for pattern in ("fanout", "per_dest"):
        best = None
        for block, warps in CONFIGS:
            if pattern == "fanout":
                launch = lambda: fanout[(WORLD * tokens,)](src, dst, dest_rows, counts, ROW=row, BLOCK=block, K=TOPK,  # noqa: E731
                                                           num_warps=warps)  # fmt: skip
            else:
                launch = lambda: per_dest[(writes,)](src, dst, pairs_src, pairs_dst, ROW=row, BLOCK=block,  # noqa: E731
                                                     num_warps=warps)  # fmt: skip
            dst.fill_(-1)
            graph = capture_graph(launch)
            torch.cuda.synchronize()
            if not torch.equal(dst.index_select(0, pairs_dst.long()), expect):  # every destination row, exactly
                raise SystemExit(f"{pattern} block {block} warps {warps}: wrong bytes at {tokens} tokens")
            us = _median_replay_us(graph, reps)
            if best is None or us < best["us"]:
                best = {"pattern": pattern, "tokens": tokens, "elem_bytes": elem, "block": block, "warps": warps,
                        "us": us, "physical": physical / (us * 1e-6) / copy_bps, "writes_per_read": writes / (WORLD * tokens)}  # fmt: skip
        out.append(best)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="128,4096", help="tokens per PE, comma separated")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        tokens_list = [int(v) for v in args.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens {args.tokens!r}: expected comma-separated integers")
    if any(t < 1 for t in tokens_list) or args.reps < 1:
        ap.error("--tokens and --reps must be >= 1")
    import torch

    if not torch.cuda.is_available():
        print("store_fanout_ceiling: no CUDA device visible (it measures the GPU)", file=sys.stderr)
        return 1
    copy_bps = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy ceiling {copy_bps / 1e9:.0f} GB/s (read + write); {WORLD} PEs' "
          f"rows on one GPU, hidden {HIDDEN}, top-{TOPK} of {EXPERTS}")  # fmt: skip
    print(f"{'pattern':9} {'tokens':>6} {'dtype':>5} {'writes/read':>11} {'block':>5} {'warps':>5} {'us':>9} {'physical':>8}")
    rows = []
    for tokens in tokens_list:
        for elem in (2, 1):
            for r in measure(tokens, elem, args.reps, copy_bps):
                rows.append(r)
                print(f"{r['pattern']:9} {tokens:6d} {'bf16' if elem == 2 else 'fp8':>5} {r['writes_per_read']:11.2f} "
                      f"{r['block']:5d} {r['warps']:5d} {r['us']:9.1f} {r['physical']:8.3f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"copy_GBps_rw": copy_bps / 1e9, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
