"""The collectives of mori_compiler.ops.collectives on one GPU with virtual PEs, against the D2D copy roofline,
with plain inputs and with inputs in the symmetric heap, side by side.

For each collective (all_gather; all_reduce with the automatic algorithm, one_shot and two_shot;
reduce_scatter; broadcast from PE 0; all_to_all; all in bf16, so the reducing ones sum bf16 in fp32), each size
and each input kind, on N virtual PEs (default 8):

* **inputs**: ``plain``: torch tensors (outside the symmetric heap): every PE first copies its input into its
  workspace's stage, where the peers read it (the staged path). ``heap``: ``Collective.heap_input()``, read
  by the peers where it is (the in-place path): no staging copy, so a PE moves its input once less (one read
  and one write of it: all_gather S/W, broadcast S on the root, the others S). Both kinds run on one
  ``Collective`` (one workspace, one kernel: the kernel chooses per PE at every call) against the same
  roofline. A heap row checks ``Collective.placement()`` after its timed calls: where the layout allows it
  (``CollSpec.in_place_layout``) every PE (broadcast: the root) must have been read in place; a row where one
  staged says so in its ``read`` column and a warning follows the table (its time is not the in-place path's).
* **blocks**: blocks per PE of every launch: ``--blocks N`` or the collective's own (``CollSpec.blocks``: one
  per 64 KiB a PE moves, at most 256 / W with virtual PEs, 128 / W for all_to_all); every row says the
  blocks it ran with.
* **size** is nccl-tests' ``S``: the bytes of the larger of a PE's input and output buffer (all_gather: the
  output, W x n; reduce_scatter and all_to_all: the input, W x n; all_reduce and broadcast: the buffer, n;
  n = the bytes of ``count`` elements). A size must be a multiple of 2 x W bytes (whole bf16 chunks).
* **µs per call**: a CUDA graph of ``--calls`` calls back to back (the device-side epochs let calls follow each
  other with no host sync), replayed ``--rounds`` times after one untimed replay; the median replay / calls.
* **algbw** = S / t (nccl-tests' algorithm bandwidth, per PE).
* **moved**: the bytes the collective must move per PE, whatever its algorithm and inputs (nccl-tests' bus
  bytes: what must cross from other PEs' memory into this PE's output):

  ============== ================= =========================================================
  collective     moved per PE      why
  ============== ================= =========================================================
  all_gather     (W-1)/W x S       the W-1 chunks of the output that other PEs hold
  reduce_scatter (W-1)/W x S       the W-1 peers' copies of this PE's chunk (to be summed)
  all_to_all     (W-1)/W x S       the W-1 chunks of the output that come from other PEs
  all_reduce     2 (W-1)/W x S     a reduce-scatter then an all-gather of the result (either
                                   algorithm: what must move, not what one algorithm reads)
  broadcast      S                 every PE's output is the root's buffer (the root copies too)
  ============== ================= =========================================================

* **roofline**: all W PEs run on this one GPU, so the collective moves W x moved bytes through its memory;
  the roofline is a torch copy (``dst.copy_(src)``, same GPU) of that byte count, timed the same way (a graph
  of ``--calls`` copies, median of ``--rounds``) in the same run, per (collective, size), shared by both input
  kinds (the small sizes' launch and latency costs are in the roofline too). **vs copy** = t_copy /
  t_collective: 1.0 is copy speed.
* **caches**: the PEs share one GPU, so bytes several PEs read (every input of all_gather and one-shot
  all_reduce, the root's of broadcast) come from its L2 after the first reader: those collectives can run
  faster than the copy of their bytes (vs copy > 1). A byte only one PE reads (all_to_all, reduce_scatter)
  has no such reuse; an out-of-place all_to_all or all_gather also copies the PE's own chunk, which the
  bus-bytes accounting does not count: W/(W-1) more traffic than the roofline's, so at most (W-1)/W (0.875
  at 8 PEs) for all_to_all at copy speed.
* **all_reduce** (the row variant without a suffix) is ``Collective("all_reduce", ...)`` with no algorithm
  named: ``auto_algorithm`` picks one_shot up to ``ONE_SHOT_MAX_BYTES``, two_shot above (its row says which).
  The lines after the goals judge that choice against the one_shot and two_shot rows of the same run and
  give the measured crossover (the smallest size where two_shot is faster), next to ``ONE_SHOT_MAX_BYTES``.

Every (collective, size, inputs) is validated once before it is timed: random inputs, one eager call, every
PE's output compared byte for byte with ``expected`` (torch, the same fp32 order of the sums), evaluated on the
GPU on the same tensors (a host evaluation of 256 MiB x 8 PEs would take longer than the benchmark). A
mismatch is not timed (a time of wrong results is worthless): the row is reported as failed, as is any other
error of a point (say, a grid that --blocks makes too large to be co-resident), the sweep goes on and the
exit status is 1.

Memory: one Collective is alive at a time (each is closed after its point, so the heap is reused); the heap of
each PE holds the largest point's workspace and, with heap inputs, its input (``heap_bytes``); the torch
tensors (plain inputs, outputs, expected outputs; then the roofline's buffers) are freed after each point.
The default sweep needs about 14 GiB at 8 PEs (``device_bytes``; checked against the GPU's free memory).

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

# (label, op, algorithm) of every variant the sweep measures; all bf16, broadcast from PE 0. all_reduce's
# algorithm "": the automatic one (auto_algorithm), as Collective picks it when none is named.
VARIANTS = (("all_gather", "all_gather", ""), ("all_reduce", "all_reduce", ""),
            ("all_reduce_one_shot", "all_reduce", "one_shot"), ("all_reduce_two_shot", "all_reduce", "two_shot"),
            ("reduce_scatter", "reduce_scatter", ""), ("broadcast", "broadcast", ""),
            ("all_to_all", "all_to_all", ""))  # fmt: skip
LABELS = tuple(v[0] for v in VARIANTS)
INPUT_KINDS = ("plain", "heap")  # torch tensors (staged) / Collective.heap_input() (read in place)
DTYPE, ELEM_BYTES = "bf16", 2
DEFAULT_SIZES = "4KiB,64KiB,1MiB,16MiB,64MiB,256MiB"
TARGET = "sm_90"
WAIT_LIMIT = 1 << 26  # polls per device wait before it gives up: a protocol that never completes is an error
# The measuring run's options. budget_s: the default sweep takes ~25 s on an H200 (session 12's times scaled);
# 180 s leaves room for a slower variant (--blocks) and still lets two runs fit one 8-minute device call.
MEASURE_DEFAULTS = {"calls": 20, "rounds": 5, "budget_s": 180.0}
MEASURE_ONLY = ("json", "png", "inputs", "blocks", *MEASURE_DEFAULTS)  # refused with --precompile
HEAP_SLACK = 1 << 20  # per PE, above what the largest point allocates
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


def _names_list(allowed: tuple[str, ...], what: str):
    """A parser of comma-separated names of ``allowed``, returned in ``allowed``'s order, each once."""

    def parse(text: str) -> list[str]:
        names = [p.strip() for p in text.split(",") if p.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or repr(text)}: not {what} (allowed: "
                                             f"{', '.join(allowed)})")  # fmt: skip
        return [name for name in allowed if name in names]

    return parse


collectives_list = _names_list(LABELS, "a collective of the sweep")
inputs_list = _names_list(INPUT_KINDS, "an input kind")


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
    from mori_compiler.dialects.mori_coll_schema import MAX_BLOCKS, MAX_WORLD_SIZE

    ap = _Parser(prog="collectives_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pes", type=_bounded_int(2, MAX_WORLD_SIZE), default=8, help="virtual PEs (default 8)")
    ap.add_argument("--sizes", type=sizes_list, default=sizes_list(DEFAULT_SIZES),
                    help=f"bytes per PE (nccl-tests' size), comma-separated (default {DEFAULT_SIZES})")
    ap.add_argument("--collectives", type=collectives_list, default=list(LABELS),
                    help=f"which of {', '.join(LABELS)} (default all)")
    ap.add_argument("--inputs", type=inputs_list,
                    help=f"which input kinds, comma-separated, of {', '.join(INPUT_KINDS)} (default both)")
    ap.add_argument("--blocks", type=_bounded_int(1, MAX_BLOCKS),
                    help="blocks per PE of every launch (default: each collective's own, CollSpec.blocks)")
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
    if args.precompile:  # blocks and input kinds do not change the kernels: nothing to build for them
        given = [f"--{k.replace('_', '-')}" for k in MEASURE_ONLY if getattr(args, k) is not None]
        if given:
            ap.error(f"--precompile builds bundles only: {', '.join(given)} are for the measuring run")
    for key, value in MEASURE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.inputs is None:
        args.inputs = list(INPUT_KINDS)
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
    algorithm: str  # as Collective gets it: all_reduce's "" is the automatic one
    size: int  # bytes per PE: the larger of its input and output
    world: int

    @property
    def count(self) -> int:
        """Elements per chunk (the op's ``count``)."""
        fold = self.world if self.op in ("all_gather", "reduce_scatter", "all_to_all") else 1
        return self.size // (ELEM_BYTES * fold)

    @property
    def auto(self) -> bool:
        return self.op == "all_reduce" and not self.algorithm

    @property
    def resolved_algorithm(self) -> str:
        """The algorithm the kernel runs: all_reduce's automatic one resolved as Collective does."""
        from mori_compiler.dialects.mori_coll_schema import auto_algorithm

        return auto_algorithm(DTYPE, self.count) if self.auto else self.algorithm

    def spec(self):
        """The CollSpec ``Collective`` builds for this point (its bundle's key)."""
        from mori_compiler.dialects.mori_coll_schema import CollSpec

        return CollSpec(self.op, DTYPE, self.count, self.world, self.resolved_algorithm, 0).check()

    @property
    def moved_bytes(self) -> int:
        """Bytes the collective must move per PE (the module docstring's table)."""
        W, S = self.world, self.size
        if self.op == "broadcast":
            return S
        if self.op == "all_reduce":
            return 2 * (W - 1) * S // W
        return (W - 1) * S // W

    @property
    def read_pes(self) -> list[int]:
        """The PEs whose input the peers read: broadcast's root only."""
        return [0] if self.op == "broadcast" else list(range(self.world))


def points(labels, sizes, world: int) -> list[Point]:
    by_label = {v[0]: v for v in VARIANTS}
    return [Point(label, by_label[label][1], by_label[label][2], size, world) for label in labels for size in sizes]


def precompile_specs(pts: list[Point]) -> list:
    """The CollSpecs of the bundles the sweep loads, each once, in the sweep's order (blocks and input kinds
    do not change a kernel; the automatic all_reduce's are one_shot's or two_shot's, by size)."""
    return list(dict.fromkeys(p.spec() for p in pts))


def precompile(cache_root, pts: list[Point]) -> list[tuple[Point, object]]:
    """Build (or find) the bundle of every point, as ``Collective`` loads it: one spec per bundle, virtual PEs."""
    from mori_compiler.ops.collectives import coll_bundle

    bundles = {s: coll_bundle([s], TARGET, virtual_pes=True, cache_root=cache_root) for s in precompile_specs(pts)}
    return [(p, bundles[p.spec()]) for p in pts]


# ---- memory ----------------------------------------------------------------------------------------------
def heap_bytes(pts: list[Point], kinds) -> int:
    """Per PE: the heap of the largest point (one Collective is alive at a time; close() frees its
    workspace and heap inputs, so the next point reuses them): the device barrier's reserved bytes, its
    workspace, with heap inputs its input (each allocation rounded to the granule), and HEAP_SLACK. The
    outputs are torch tensors (not in the heap)."""
    from mori_compiler.runtime.heap_allocator import ALLOC_GRANULE, SYNC_RESERVED_BYTES, round_up

    def need(p: Point) -> int:
        s = p.spec()
        heap_input = round_up(s.input_elems * s.elem_bytes, ALLOC_GRANULE) if "heap" in kinds else 0
        return round_up(s.workspace_bytes, ALLOC_GRANULE) + heap_input

    return SYNC_RESERVED_BYTES + max(need(p) for p in pts) + HEAP_SLACK


def device_bytes(pts: list[Point], kinds) -> int:
    """GPU memory the sweep needs at most (an estimate, bytes): every PE's heap (allocated once) and the
    largest point's torch tensors, freed after each point: W plain inputs (and one PE's fp32 draw), outputs
    and expected outputs (and one PE's fp32 sums), or later the roofline's source and destination."""
    def tensors(p: Point) -> int:
        s, W = p.spec(), p.world
        in_b, out_b = s.input_elems * s.elem_bytes, s.output_elems * s.elem_bytes
        collective = W * (in_b + 2 * out_b) + 2 * in_b + (4 * out_b if s.op in ("all_reduce", "reduce_scatter") else 0)
        return max(collective, 2 * W * p.moved_bytes)

    return pts[0].world * heap_bytes(pts, kinds) + max(tensors(p) for p in pts)


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


class PointError(Exception):
    """A point that cannot be measured (wrong results, a Collective other than the one precompiled): its row
    is reported as failed, not timed, and the sweep goes on."""


def validate(coll, point: Point, kind: str, inputs, outputs) -> None:
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
            raise PointError(f"wrong results: PE {pe}'s output differs from torch's in {bad} bytes (not timed)")


def differing_bytes(got, want) -> int:
    """How many bytes of ``got`` differ from ``want`` (tensors of one dtype; a size mismatch: all of them)."""
    import torch

    a, b = got.reshape(-1).contiguous().view(torch.uint8), want.reshape(-1).contiguous().view(torch.uint8)
    if a.numel() != b.numel():
        return max(a.numel(), b.numel())
    return int((a != b).sum())


def read_summary(point: Point, placement: list[str]) -> str:
    """Where the peers read the inputs (``Collective.placement()``, of the PEs whose input is read):
    "input" (in place), "stage", or "mixed"."""
    seen = {placement[pe] for pe in point.read_pes}
    return seen.pop() if len(seen) == 1 else "mixed"


def misplaced(row: dict) -> bool:
    """A heap row whose layout allows in place but where a PE staged: its time is not the in-place path's."""
    return row["inputs"] == "heap" and row["in_place_layout"] and row["read"] != "input"


def _time_collective(point: Point, kinds, calls: int, rounds: int, blocks: int | None) -> tuple[list, list]:
    """(rows, failures) of one point, one Collective: per input kind, validated, then timed."""
    import torch

    from mori_compiler.ops.collectives import Collective

    coll = Collective(point.op, torch.bfloat16, point.count, algorithm=point.algorithm, root=0, blocks=blocks,
                      wait_limit=WAIT_LIMIT)  # fmt: skip
    rows, failures = [], []
    try:
        s = coll.spec
        if s != point.spec():  # the bundle --precompile built would not be the one loaded
            raise PointError(f"Collective built {s}, the sweep expects {point.spec()} (precompile would miss it)")
        gen = torch.Generator(device="cuda").manual_seed(point.size + 7 * LABELS.index(point.label))
        plain = [torch.randn(s.input_elems, device="cuda", generator=gen).to(torch.bfloat16)
                 for _ in range(point.world)]  # fmt: skip
        outputs = [torch.empty(s.output_elems, dtype=torch.bfloat16, device="cuda") for _ in range(point.world)]
        for kind in kinds:
            try:
                inputs = plain
                if kind == "heap":
                    inputs = coll.heap_input()
                    for heap, values in zip(inputs, plain):
                        heap.copy_(values)
                validate(coll, point, kind, inputs, outputs)
                us = _graph_us(lambda: coll(inputs, outputs), calls, rounds)
                coll.kernels.check_waits()
                placement = coll.placement()  # of the last timed call
            except Exception as exc:  # noqa: BLE001 - reported in the table; the other kind still counts
                failures += _entries(point, [kind], error=_reason(exc))
                continue
            rows.append({**asdict(point), "algorithm": s.algorithm, "auto": point.auto, "inputs": kind,
                         "count": point.count, "blocks": coll.blocks, "moved_bytes": point.moved_bytes,
                         "in_place_layout": s.in_place_layout, "placement": placement,
                         "read": read_summary(point, placement), "us": us,
                         "algbw_GBps": point.size / (us * 1e-6) / 1e9})  # fmt: skip
        return rows, failures
    finally:
        coll.close()


def measure(point: Point, kinds, calls: int, rounds: int, blocks: int | None) -> tuple[list, list]:
    """(rows, failures) of one point (a row per input kind, one Collective), the rows with their shared
    roofline; a point that fails as a whole (say, its Collective cannot be built) fails for every kind."""
    import torch

    try:
        rows, failures = _time_collective(point, kinds, calls, rounds, blocks)
        torch.cuda.empty_cache()  # the point's tensors are gone: the roofline's buffers may reuse the memory
        if rows:
            roof = copy_us(point.world * point.moved_bytes, calls, rounds)
            torch.cuda.empty_cache()
            for r in rows:
                r.update(copy_us=roof, vs_copy=roof / r["us"])
    except Exception as exc:  # noqa: BLE001 - reported in the table; the other points still count
        return [], _entries(point, kinds, error=_reason(exc))
    return rows, failures


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PointError) else f"{type(exc).__name__}: {exc}"


def _entries(p: Point, kinds, **extra) -> list[dict]:
    return [{**asdict(p), "inputs": kind, **extra} for kind in kinds]


# ---- the report ------------------------------------------------------------------------------------------
def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _human_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 1 << 30 else f"{n / 2**20:.0f} MiB"


def _note(row: dict) -> str:
    notes = [f"auto: {row['algorithm']}"] if row["auto"] else []
    if misplaced(row):
        staged = [pe for pe, where in enumerate(row["placement"]) if where != "input"]
        notes.append(f"NOT in place: staged on PE {','.join(map(str, staged))}")
    return "; ".join(notes)


def table(rows: list[dict], skipped: list[dict], failed: list[dict]) -> str:
    lines = [f"{'collective':<21}{'inputs':>7}{'size':>8}{'blocks':>7}{'read':>7}{'us':>10}{'algbw GB/s':>12}"
             f"{'copy us':>10}{'vs copy':>9}  note"]  # fmt: skip
    for r in rows:
        lines.append(f"{r['label']:<21}{r['inputs']:>7}{_human(r['size']):>8}{r['blocks']:>7}{r['read']:>7}"
                     f"{r['us']:>10.2f}{r['algbw_GBps']:>12.1f}{r['copy_us']:>10.2f}{r['vs_copy']:>9.2f}  "
                     f"{_note(r)}".rstrip())  # fmt: skip
    lines += [f"{p['label']:<21}{p['inputs']:>7}{_human(p['size']):>8}  skipped (--budget-s spent)" for p in skipped]
    lines += [f"{p['label']:<21}{p['inputs']:>7}{_human(p['size']):>8}  failed: {p['error']}" for p in failed]
    return "\n".join(lines)


def warnings(rows: list[dict]) -> list[str]:
    bad = [f"{r['label']}@{_human(r['size'])}" for r in rows if misplaced(r)]
    if not bad:
        return []
    return [f"heap inputs staged where in place was expected (their times are the staged path's): {', '.join(bad)}"]


GOAL_RATIO, GOAL_RATIO_FROM = 0.8, 16 << 20  # issue 17: >= 0.8 of the roofline at >= 16 MiB
GOAL_LATENCY_US, GOAL_LATENCY_SIZE = 10.0, 4 << 10  # and one-shot all_reduce <= 10 µs at 4 KiB


def _kinds(rows: list[dict]) -> list[str]:
    return [k for k in INPUT_KINDS if any(r["inputs"] == k for r in rows)]


def goals(rows: list[dict]) -> list[str]:
    """Issue 17's goals on one GPU per input kind, each line saying met or missed (only for the points
    measured)."""
    out = []
    for kind in _kinds(rows):
        mine = [r for r in rows if r["inputs"] == kind]
        big = [r for r in mine if r["size"] >= GOAL_RATIO_FROM]
        if big:
            low = [r for r in big if r["vs_copy"] < GOAL_RATIO]
            named = ", ".join(f"{r['label']}@{_human(r['size'])} {r['vs_copy']:.2f}" for r in low)
            out.append(f"[{kind}] vs copy >= {GOAL_RATIO} at >= {_human(GOAL_RATIO_FROM)}: " +
                       (f"missed by {len(low)} of {len(big)} points: {named}" if low else
                        f"met by all {len(big)} points"))  # fmt: skip
        for r in mine:
            if r["label"] == "all_reduce_one_shot" and r["size"] == GOAL_LATENCY_SIZE:
                verdict = "met" if r["us"] <= GOAL_LATENCY_US else "missed"
                out.append(f"[{kind}] one-shot all_reduce <= {GOAL_LATENCY_US:g} us at {_human(GOAL_LATENCY_SIZE)}: "
                           f"{verdict} ({r['us']:.2f} us)")  # fmt: skip
    return out


def algorithm_lines(rows: list[dict]) -> list[str]:
    """Per input kind: the automatic all_reduce's pick judged against the one_shot and two_shot rows of the
    same sizes, and the measured crossover (the smallest size where two_shot is faster) next to
    ONE_SHOT_MAX_BYTES."""
    from mori_compiler.dialects.mori_coll_schema import ONE_SHOT_MAX_BYTES, auto_algorithm

    out = []
    limit = f"ONE_SHOT_MAX_BYTES = {_human(ONE_SHOT_MAX_BYTES)}"
    for kind in _kinds(rows):
        us = {(r["label"], r["size"]): r["us"] for r in rows if r["inputs"] == kind}
        both = sorted(size for (label, size) in us if label == "all_reduce_one_shot"
                      and ("all_reduce_two_shot", size) in us)  # fmt: skip
        if not both:
            continue
        faster = {s: "two_shot" if us["all_reduce_two_shot", s] < us["all_reduce_one_shot", s] else "one_shot"
                  for s in both}  # fmt: skip
        wrong = [s for s in both if auto_algorithm(DTYPE, s // ELEM_BYTES) != faster[s]]
        picks = "; ".join(f"{_human(s)} {auto_algorithm(DTYPE, s // ELEM_BYTES)}" for s in both)
        verdict = (f"the faster at all {len(both)} sizes" if not wrong else f"the faster at {len(both) - len(wrong)} "
                   f"of {len(both)} sizes; not at " + ", ".join(
                       f"{_human(s)} (one_shot {us['all_reduce_one_shot', s]:.2f} us, two_shot "
                       f"{us['all_reduce_two_shot', s]:.2f} us)" for s in wrong))  # fmt: skip
        out.append(f"[{kind}] all_reduce auto ({limit}) picks {picks}: {verdict}")
        two = [s for s in both if faster[s] == "two_shot"]
        if not two:
            out.append(f"[{kind}] all_reduce crossover: two_shot is faster at none of the sizes measured "
                       f"({_human(both[0])} .. {_human(both[-1])}); {limit}")  # fmt: skip
            continue
        cross = two[0]
        below = [s for s in both if s < cross]
        again = [s for s in both if s > cross and faster[s] == "one_shot"]
        where = (f"fits a value in [{_human(below[-1])}, {_human(cross)})" if below else
                 f"two_shot is faster from the smallest size measured")  # fmt: skip
        text = (f"[{kind}] all_reduce crossover: two_shot is faster from {_human(cross)} (one_shot "
                f"{us['all_reduce_one_shot', cross]:.2f} us, two_shot {us['all_reduce_two_shot', cross]:.2f} us); "
                f"{limit} (one_shot up to it): the data {where}")  # fmt: skip
        if again:
            text += f"; but one_shot is faster again at {', '.join(map(_human, again))}"
        out.append(text)
    return out


def report(config: dict, rows: list[dict], skipped: list[dict], failed: list[dict]) -> dict:
    """The JSON document: the config (machine included), the measured rows, the points not reached, those
    that failed (with the error)."""
    return {"config": config, "rows": rows, "skipped": skipped, "failed": failed}


def plot(path: Path, rows: list[dict], title: str) -> None:
    """vs copy per size, one panel per input kind (same axes), a line per collective."""
    from mori_compiler.runtime.extras import import_extra

    import_extra("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    kinds = _kinds(rows) or ["plain"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for label in LABELS:
            pts = [r for r in rows if r["label"] == label and r["inputs"] == kind]
            if not pts:
                continue
            style = {"ls": ":", "marker": "x", "c": "black"} if label == "all_reduce" else {"marker": "o"}
            ax.plot([p["size"] for p in pts], [p["vs_copy"] for p in pts], label=label if label !=
                              "all_reduce" else "all_reduce (auto)", **style)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per PE")
        ax.axhline(GOAL_RATIO, ls="--", c="gray")
        ax.set_title(f"{kind} inputs ({'read in place' if kind == 'heap' else 'staged'})", fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("D2D copy time of the moved bytes / collective time")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep(pts: list[Point], args, measure_point=measure, clock=time.monotonic) -> tuple[list, list, list]:
    """(rows, skipped, failed) of the points in order; no point starts after ``args.budget_s`` seconds (the
    rest is skipped, every input kind)."""
    start = clock()
    rows, skipped, failed = [], [], []
    for p in pts:
        if clock() - start > args.budget_s:
            skipped += _entries(p, args.inputs)
            continue
        measured, failures = measure_point(p, args.inputs, args.calls, args.rounds, args.blocks)
        rows += measured
        failed += failures
    return rows, skipped, failed


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
    need, (free, _) = device_bytes(pts, args.inputs), torch.cuda.mem_get_info()
    if need > free:
        print(f"collectives_bench: the sweep needs about {need / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} "
              f"GiB are free: fewer --pes or smaller --sizes", file=sys.stderr)  # fmt: skip
        return 1
    start = time.monotonic()
    shmem.shmem_init_virtual(args.pes, heap_size=heap_bytes(pts, args.inputs))
    try:
        rows, skipped, failed = sweep(pts, args)
    finally:
        shmem.shmem_finalize()
    props = torch.cuda.get_device_properties(0)
    from mori_compiler.dialects.mori_coll_schema import ONE_SHOT_MAX_BYTES

    config = {"device": props.name, "sms": props.multi_processor_count, "pes": args.pes, "dtype": DTYPE,
              "inputs": args.inputs, "blocks": args.blocks or "default (CollSpec.blocks)",
              "calls_per_graph": args.calls, "rounds": args.rounds, "one_shot_max_bytes": ONE_SHOT_MAX_BYTES,
              "heap_bytes_per_pe": heap_bytes(pts, args.inputs), "device_bytes_estimate": need,
              "torch": torch.__version__, "wall_s": round(time.monotonic() - start, 1)}  # fmt: skip
    blocks = f"{args.blocks} blocks per PE" if args.blocks else "each collective's default blocks"
    title = f"{config['device']} ({config['sms']} SMs): {args.pes} virtual PEs, {DTYPE}, {blocks}"
    print(f"{title}; inputs {', '.join(args.inputs)}; graph of {args.calls} calls, median of {args.rounds} replays; "
          f"roofline: a torch D2D copy of the moved bytes (all PEs'), same run; heap "
          f"{_human_bytes(config['heap_bytes_per_pe'])} per PE, ~{_human_bytes(need)} of GPU memory; "
          f"{config['wall_s']} s")  # fmt: skip
    print(table(rows, skipped, failed))
    for line in warnings(rows):
        print(f"warning: {line}")
    for line in goals(rows):
        print(f"goal: {line}")
    for line in algorithm_lines(rows):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(report(config, rows, skipped, failed), indent=1))
    if args.png:
        plot(args.png, rows, title)
    if failed:
        print(f"collectives_bench: {len(failed)} rows failed (see the table)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
