"""The collectives of mori_compiler.ops.collectives on one GPU with virtual PEs, against the D2D copy roofline.

For each collective (all_gather, all_reduce one_shot and two_shot, reduce_scatter, broadcast from PE 0,
all_to_all; all in bf16, so the reducing ones sum bf16 in fp32) and each size, on N virtual PEs (default 8):

* **size** is nccl-tests' ``S``: the bytes of the larger of a PE's input and output buffer (all_gather: the
  output, W x n; reduce_scatter and all_to_all: the input, W x n; all_reduce and broadcast: the buffer, n;
  n = the bytes of ``count`` elements). A size must be a multiple of 2 x W bytes (whole bf16 chunks).
* **µs per call**: a CUDA graph of ``--calls`` calls back to back (the device-side epochs let calls follow each
  other with no host sync), replayed ``--rounds`` times after one untimed replay; the median replay / calls.
* **algbw** = S / t (nccl-tests' algorithm bandwidth, per PE).
* **moved**: the bytes the collective must move per PE, whatever its algorithm (nccl-tests' bus bytes: what
  must cross from other PEs' memory into this PE's output):

  ============== ================= =========================================================
  collective     moved per PE      why
  ============== ================= =========================================================
  all_gather     (W-1)/W x S       the W-1 chunks of the output that other PEs hold
  reduce_scatter (W-1)/W x S       the W-1 peers' copies of this PE's chunk (to be summed)
  all_to_all     (W-1)/W x S       the W-1 chunks of the output that come from other PEs
  all_reduce     2 (W-1)/W x S     a reduce-scatter then an all-gather of the result (one-shot
                                   reads more, (W-1) x S: the lower bound is the algorithm's)
  broadcast      S                 every PE's output is the root's buffer (the root copies too)
  ============== ================= =========================================================

* **roofline**: all W PEs run on this one GPU, so the collective moves W x moved bytes through its memory;
  the roofline is a torch copy (``dst.copy_(src)``, same GPU) of that byte count, timed the same way (a graph
  of ``--calls`` copies, median of ``--rounds``) in the same run, per size (the small sizes' launch and
  latency costs are in the roofline too). **vs copy** = t_copy / t_collective: 1.0 is copy speed.

Every (collective, size) is validated once before it is timed: random inputs, one eager call, every PE's
output compared byte for byte with ``expected`` (torch, the same fp32 order of the sums), evaluated on the GPU
on the same tensors (a host evaluation of 64 MiB x 8 PEs would take longer than the benchmark). A mismatch
stops the run (a benchmark of wrong results is worthless).

    python bench/collectives_bench.py --precompile .bundles         # where the compiler is (no GPU needed)
    MORI_COMPILER_CACHE_DIR=.bundles python bench/collectives_bench.py --json out.json --png out.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# (label, op, algorithm) of every variant the sweep measures; all bf16, broadcast from PE 0.
VARIANTS = (("all_gather", "all_gather", ""), ("all_reduce_one_shot", "all_reduce", "one_shot"),
            ("all_reduce_two_shot", "all_reduce", "two_shot"), ("reduce_scatter", "reduce_scatter", ""),
            ("broadcast", "broadcast", ""), ("all_to_all", "all_to_all", ""))  # fmt: skip
LABELS = tuple(v[0] for v in VARIANTS)
DTYPE, ELEM_BYTES = "bf16", 2
DEFAULT_SIZES = "4KiB,64KiB,1MiB,16MiB,64MiB"
TARGET = "sm_90"
WAIT_LIMIT = 1 << 26  # polls per device wait before it gives up: a protocol that never completes is an error
MEASURE_DEFAULTS = {"calls": 20, "rounds": 5, "budget_s": 90.0}  # the measuring run's options
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


# ---- arguments -------------------------------------------------------------------------------------------
def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (an integer with an optional unit: B, K/KiB, "
                                         f"M/MiB, G/GiB; e.g. 4KiB)")  # fmt: skip
    value = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least 1 byte")
    return value


def sizes_list(text: str) -> list[int]:
    """``--sizes``: comma-separated sizes (bytes per PE), each once, in increasing order."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected at least one size, e.g. 4KiB,1MiB")
    return sorted({_size(p) for p in parts})


def collectives_list(text: str) -> list[str]:
    """``--collectives``: comma-separated labels of VARIANTS, in VARIANTS' order."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [n for n in names if n not in LABELS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{','.join(bad) or repr(text)}: not a collective of the sweep "
                                         f"(allowed: {', '.join(LABELS)})")  # fmt: skip
    return [label for label in LABELS if label in names]


def _bounded_int(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not in [{low}, {high}]" if high is not None else
                                             f"{value} must be >= {low}")  # fmt: skip
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad argument is the user's error: exit 1 (2 means an internal error here)
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    from mori_compiler.dialects.mori_coll_schema import MAX_WORLD_SIZE

    ap = _Parser(prog="collectives_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pes", type=_bounded_int(2, MAX_WORLD_SIZE), default=8, help="virtual PEs (default 8)")
    ap.add_argument("--sizes", type=sizes_list, default=sizes_list(DEFAULT_SIZES),
                    help=f"bytes per PE (nccl-tests' size), comma-separated (default {DEFAULT_SIZES})")
    ap.add_argument("--collectives", type=collectives_list, default=list(LABELS),
                    help=f"which of {', '.join(LABELS)} (default all)")
    ap.add_argument("--calls", type=_bounded_int(1, 10000),
                    help=f"calls per graph (default {MEASURE_DEFAULTS['calls']})")
    ap.add_argument("--rounds", type=_bounded_int(1, 1000),
                    help=f"timed replays, their median (default {MEASURE_DEFAULTS['rounds']})")
    ap.add_argument("--budget-s", type=_positive_float,
                    help=f"start no new point after this many seconds (default {MEASURE_DEFAULTS['budget_s']:g}); "
                         f"the rest is reported as skipped")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the rows and the config as JSON")
    ap.add_argument("--png", type=Path, help="plot vs copy per size (needs matplotlib: the [bench] extra)")
    ap.add_argument("--precompile", metavar="DIR", type=Path,
                    help="build the bundles the sweep loads into the cache DIR and exit (no GPU needed)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments, checked together (sizes against --pes); a refusal prints the usage and the reason and
    exits with status 1 (never a traceback)."""
    ap = parser()
    args = ap.parse_args(argv)
    step = ELEM_BYTES * args.pes
    bad = [s for s in args.sizes if s % step]
    if bad:
        ap.error(f"--sizes {','.join(map(str, bad))}: every size must be a multiple of {step} bytes (bf16 chunks "
                 f"of {args.pes} PEs)")  # fmt: skip
    if args.precompile:
        given = [f"--{k.replace('_', '-')}" for k in ("json", "png", *MEASURE_DEFAULTS) if getattr(args, k) is not None]
        if given:
            ap.error(f"--precompile builds bundles only: {', '.join(given)} are for the measuring run")
    for key, value in MEASURE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.png and not args.precompile:
        from mori_compiler.runtime.extras import is_installed, missing_text

        if not is_installed("matplotlib"):  # known before the GPU work
            ap.error(f"--png needs matplotlib: {missing_text(['matplotlib'])}")
    return args


# ---- what each point is ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    label: str
    op: str
    algorithm: str
    size: int  # bytes per PE: the larger of its input and output
    world: int

    @property
    def count(self) -> int:
        """Elements per chunk (the op's ``count``)."""
        fold = self.world if self.op in ("all_gather", "reduce_scatter", "all_to_all") else 1
        return self.size // (ELEM_BYTES * fold)

    def spec(self):
        from mori_compiler.dialects.mori_coll_schema import CollSpec

        return CollSpec(self.op, DTYPE, self.count, self.world, self.algorithm, 0).check()

    @property
    def moved_bytes(self) -> int:
        """Bytes the collective must move per PE (the module docstring's table)."""
        W, S = self.world, self.size
        if self.op == "broadcast":
            return S
        if self.op == "all_reduce":
            return 2 * (W - 1) * S // W
        return (W - 1) * S // W


def points(labels, sizes, world: int) -> list[Point]:
    by_label = {v[0]: v for v in VARIANTS}
    return [Point(label, by_label[label][1], by_label[label][2], size, world) for label in labels for size in sizes]


def precompile(cache_root, pts: list[Point]) -> list[tuple[Point, object]]:
    """Build (or find) the bundle of every point, as ``Collective`` loads it: one spec per bundle, virtual PEs."""
    from mori_compiler.ops.collectives import coll_bundle

    return [(p, coll_bundle([p.spec()], TARGET, virtual_pes=True, cache_root=cache_root)) for p in pts]


# ---- the measurement (GPU) -------------------------------------------------------------------------------
def _graph_us(fn, calls: int, rounds: int) -> float:
    """µs per call of ``fn``: a graph of ``calls`` calls (after one eager call), one untimed replay, then the
    median of ``rounds`` timed replays over ``calls``."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def copy_us(nbytes: int, calls: int, rounds: int) -> float:
    """The roofline: µs of a same-GPU torch copy of ``nbytes``, timed as the collectives are."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return _graph_us(lambda: dst.copy_(src), calls, rounds)


def validate(coll, point: Point, inputs, outputs) -> None:
    """One eager call, every PE's output byte for byte against ``expected`` (torch on the same GPU tensors)."""
    import torch

    from mori_compiler.ops.collectives import expected

    for t in outputs:  # poisoned: a byte the kernel does not write shows
        t.fill_(float("nan"))
    coll(inputs, outputs)
    torch.cuda.synchronize()
    coll.kernels.check_waits()
    for pe, (got, exp) in enumerate(zip(outputs, expected(coll.spec, inputs))):
        bad = differing_bytes(got, exp)
        if bad:
            raise SystemExit(f"collectives_bench: {point.label} at {point.size} bytes per PE: PE {pe}'s output "
                             f"differs from torch's in {bad} bytes: not timed (wrong results)")  # fmt: skip


def differing_bytes(got, want) -> int:
    """How many bytes of ``got`` differ from ``want`` (tensors of one dtype; a size mismatch: all of them)."""
    import torch

    a, b = got.reshape(-1).contiguous().view(torch.uint8), want.reshape(-1).contiguous().view(torch.uint8)
    if a.numel() != b.numel():
        return max(a.numel(), b.numel())
    return int((a != b).sum())


def measure(point: Point, calls: int, rounds: int) -> dict:
    import torch

    from mori_compiler.ops.collectives import Collective

    coll = Collective(point.op, torch.bfloat16, point.count, algorithm=point.algorithm, root=0,
                      wait_limit=WAIT_LIMIT)  # fmt: skip
    try:
        s = coll.spec
        gen = torch.Generator(device="cuda").manual_seed(point.size + 7 * LABELS.index(point.label))
        inputs = [torch.randn(s.input_elems, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(point.world)]
        outputs = [torch.empty(s.output_elems, dtype=torch.bfloat16, device="cuda") for _ in range(point.world)]
        validate(coll, point, inputs, outputs)
        us = _graph_us(lambda: coll(inputs, outputs), calls, rounds)
        coll.kernels.check_waits()
    finally:
        coll.close()
    roof = copy_us(point.world * point.moved_bytes, calls, rounds)
    return {**asdict(point), "count": point.count, "blocks": s.blocks, "moved_bytes": point.moved_bytes, "us": us,
            "algbw_GBps": point.size / (us * 1e-6) / 1e9, "copy_us": roof, "vs_copy": roof / us}  # fmt: skip


def heap_bytes(pts: list[Point]) -> int:
    """Per PE: the largest workspace of the sweep (one collective alive at a time) and headroom."""
    return max(p.spec().workspace_bytes for p in pts) + (64 << 20)


def table(rows: list[dict], skipped: list[Point]) -> str:
    lines = [f"{'collective':<22}{'size':>10}{'blocks':>7}{'us':>10}{'algbw GB/s':>12}{'copy us':>10}{'vs copy':>9}"]
    for r in rows:
        lines.append(f"{r['label']:<22}{_human(r['size']):>10}{r['blocks']:>7}{r['us']:>10.2f}{r['algbw_GBps']:>12.1f}"
                     f"{r['copy_us']:>10.2f}{r['vs_copy']:>9.2f}")  # fmt: skip
    lines += [f"{p.label:<22}{_human(p.size):>10}  skipped (--budget-s spent)" for p in skipped]
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


GOAL_RATIO, GOAL_RATIO_FROM = 0.8, 16 << 20  # issue 17: >= 0.8 of the roofline at >= 16 MiB
GOAL_LATENCY_US, GOAL_LATENCY_SIZE = 10.0, 4 << 10  # and one-shot all_reduce <= 10 µs at 4 KiB


def goals(rows: list[dict]) -> list[str]:
    """Issue 17's goals on one GPU, each line saying met or missed (only for the points measured)."""
    out = []
    big = [r for r in rows if r["size"] >= GOAL_RATIO_FROM]
    if big:
        low = [f"{r['label']}@{_human(r['size'])} {r['vs_copy']:.2f}" for r in big if r["vs_copy"] < GOAL_RATIO]
        out.append(f"vs copy >= {GOAL_RATIO} at >= {_human(GOAL_RATIO_FROM)}: " +
                   (f"missed by {', '.join(low)}" if low else f"met by all {len(big)} points"))  # fmt: skip
    for r in rows:
        if r["label"] == "all_reduce_one_shot" and r["size"] == GOAL_LATENCY_SIZE:
            verdict = "met" if r["us"] <= GOAL_LATENCY_US else "missed"
            out.append(f"one-shot all_reduce <= {GOAL_LATENCY_US:g} us at 4KiB: {verdict} ({r['us']:.2f} us)")
    return out


def report(config: dict, rows: list[dict], skipped: list[Point]) -> dict:
    """The JSON document: the config (machine included), the measured rows, the points not reached."""
    return {"config": config, "rows": rows, "skipped": [asdict(p) for p in skipped]}


def plot(path: Path, rows: list[dict], title: str) -> None:
    from mori_compiler.runtime.extras import import_extra

    import_extra("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label in LABELS:
        pts = [r for r in rows if r["label"] == label]
        if pts:
            ax.plot([p["size"] for p in pts], [p["vs_copy"] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per PE")
    ax.set_ylabel("D2D copy time of the moved bytes / collective time")
    ax.axhline(0.8, ls="--", c="gray")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    args = parse_args(argv)
    pts = points(args.collectives, args.sizes, args.pes)
    if args.precompile:
        for p, bundle in precompile(args.precompile, pts):
            print(f"{p.label:<22}{_human(p.size):>10}  {p.spec().kernel_name}  {bundle.path}")
        return 0
    from mori_compiler.runtime.extras import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason:
        print(f"collectives_bench: {reason} (it measures the GPU; --precompile needs none)", file=sys.stderr)
        return 1
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.init()
    start = time.monotonic()
    rows, skipped = [], []
    shmem.shmem_init_virtual(args.pes, heap_size=heap_bytes(pts))
    try:
        for p in pts:
            if time.monotonic() - start > args.budget_s:
                skipped.append(p)
                continue
            rows.append(measure(p, args.calls, args.rounds))
    finally:
        shmem.shmem_finalize()
    props = torch.cuda.get_device_properties(0)
    config = {"device": props.name, "sms": props.multi_processor_count, "pes": args.pes, "dtype": DTYPE,
              "calls_per_graph": args.calls, "rounds": args.rounds, "torch": torch.__version__,
              "wall_s": round(time.monotonic() - start, 1)}  # fmt: skip
    title = f"{config['device']} ({config['sms']} SMs): {args.pes} virtual PEs, {DTYPE}"
    print(f"{title}; graph of {args.calls} calls, median of {args.rounds} replays; roofline: a torch D2D copy of "
          f"the moved bytes (all PEs'), same run; {config['wall_s']} s")  # fmt: skip
    print(table(rows, skipped))
    for line in goals(rows):
        print(f"goal: {line}")
    if args.json:
        args.json.write_text(json.dumps(report(config, rows, skipped), indent=1))
    if args.png:
        plot(args.png, rows, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
