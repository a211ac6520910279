"""bench/collectives_bench.py on the CPU: its arguments and refusals, the byte accounting of each collective
(the automatic all_reduce resolved as Collective does), the heap and GPU memory the sweep sizes, the bundles
--precompile builds for a tiny sweep (compiled for sm_90, the keys Collective looks up) and the specs of the
default sweep, the table, the goals, the all_reduce algorithm lines and the JSON document. The measurement
itself runs on the GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import collectives_bench as cb  # noqa: E402

from mori_compiler.dialects.mori_coll_schema import ONE_SHOT_MAX_BYTES, CollSpec, kernel_source  # noqa: E402
from mori_compiler.runtime.heap_allocator import HeapAllocator  # noqa: E402


def _run(*argv):
    return subprocess.run([sys.executable, str(BENCH / "collectives_bench.py"), *argv], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_defaults_are_the_issue_sweep():
    args = cb.parse_args([])
    assert args.pes == 8 and args.collectives == list(cb.LABELS) and args.precompile is None
    assert (args.calls, args.rounds, args.budget_s) == (20, 5, 180.0)
    assert args.inputs == ["plain", "heap"] and args.blocks is None  # None: each collective's own blocks
    assert args.sizes == [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    assert len(cb.points(args.collectives, args.sizes, args.pes)) == 7 * 6
    assert cb.parse_args(["--blocks", "32", "--inputs", "heap"]).blocks == 32


def test_lists_parse_units_dedupe_and_sort():
    assert cb.sizes_list("1MiB, 4k,4096,64B") == [64, 4096, 1 << 20]
    assert cb.sizes_list("2G") == [2 << 30]
    assert cb.collectives_list("all_to_all,all_gather") == ["all_gather", "all_to_all"]  # the sweep's order
    assert cb.inputs_list("heap, plain,heap") == ["plain", "heap"]
    assert cb.inputs_list("heap") == ["heap"]


@pytest.mark.parametrize("argv, message", [
    (["--pes", "1"], "--pes: 1 is not in [2, 32]"),
    (["--pes", "x"], "'x' is not an integer"),
    (["--sizes", "4KB"], "'4KB' is not a size"),
    (["--sizes", ","], "at least one size"),
    (["--sizes", "0"], "at least 1 byte"),
    (["--sizes", "4100"], "--sizes 4100: every size must be a multiple of 16 bytes"),
    (["--pes", "3", "--sizes", "4KiB"], "multiple of 6 bytes"),
    (["--collectives", "all_reduce_auto"], "all_reduce_auto: not a collective of the sweep (allowed: all_gather, "
                                           "all_reduce, all_reduce_one_shot"),
    (["--inputs", "plain,device"], "argument --inputs: device: not an input kind (allowed: plain, heap)"),
    (["--inputs", ","], "argument --inputs: ',': not an input kind (allowed: plain, heap)"),
    (["--blocks", "0"], "argument --blocks: 0 is not in [1, 32]"),
    (["--blocks", "33"], "argument --blocks: 33 is not in [1, 32]"),
    (["--blocks", "many"], "argument --blocks: 'many' is not an integer"),
    (["--calls", "0"], "--calls: 0 is not in [1, 10000]"),
    (["--budget-s", "0"], "'0' must be > 0"),
    (["--precompile", "d", "--json", "x.json", "--calls", "3"], "bundles only: --json, --calls are for the"),
    (["--precompile", "d", "--inputs", "heap", "--blocks", "4"], "bundles only: --inputs, --blocks are for the"),
])  # fmt: skip
def test_bad_arguments_are_refused_with_the_reason(argv, message):
    res = _run(*argv)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_no_gpu_is_a_clear_error_not_a_traceback():
    res = _run("--sizes", "4KiB", "--pes", "2")
    assert res.returncode == 1 and "it measures the GPU" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("label, count, moved, algorithm", [
    # S = 64 KiB per PE, W = 8: count is the op's chunk; moved = the bus bytes per PE.
    ("all_gather", 4096, 7 * 8192, ""),  # output W x n: the 7 peers' chunks
    ("reduce_scatter", 4096, 7 * 8192, ""),  # input W x n: the 7 peers' copies of my chunk
    ("all_to_all", 4096, 7 * 8192, ""),
    ("all_reduce", 32768, 2 * 7 * 8192, "one_shot"),  # automatic: 64 KiB <= ONE_SHOT_MAX_BYTES
    ("all_reduce_one_shot", 32768, 2 * 7 * 8192, "one_shot"),  # 2 (W-1)/W x S, whatever the algorithm
    ("all_reduce_two_shot", 32768, 2 * 7 * 8192, "two_shot"),
    ("broadcast", 32768, 65536, ""),
])  # fmt: skip
def test_byte_accounting(label, count, moved, algorithm):
    (p,) = cb.points([label], [64 << 10], 8)
    assert (p.count, p.moved_bytes, p.resolved_algorithm) == (count, moved, algorithm)
    s = p.spec()
    assert max(s.input_elems, s.output_elems) * s.elem_bytes == p.size  # size: the larger buffer, as nccl-tests
    assert s.dtype == "bf16" and s.root == 0 and s.algorithm == algorithm
    assert p.read_pes == ([0] if label == "broadcast" else list(range(8)))


def test_the_automatic_all_reduce_switches_at_one_shot_max_bytes():
    small, large = cb.points(["all_reduce"], [ONE_SHOT_MAX_BYTES, ONE_SHOT_MAX_BYTES + 16], 8)
    assert (small.spec().algorithm, large.spec().algorithm) == ("one_shot", "two_shot")
    assert small.auto and small.algorithm == "" and not cb.points(["all_reduce_one_shot"], [4096], 8)[0].auto


def _fits(heap: int, pts) -> list[int]:
    """Allocate every point as Collective does (workspace, then the heap input) in a heap of ``heap`` bytes,
    freeing each after it; the bytes left free while each point is alive."""
    alloc, left = HeapAllocator(heap), []
    for p in pts:
        s = p.spec()
        handles = [alloc.alloc(s.workspace_bytes, 256), alloc.alloc(s.input_elems * s.elem_bytes, 256)]
        assert None not in handles, p
        left.append(alloc.bytes_free)
        for h in handles:
            alloc.free(h)
    return left


def test_heap_holds_the_largest_point_and_is_reused():
    args = cb.parse_args([])
    pts = cb.points(args.collectives, args.sizes, args.pes)
    heap = cb.heap_bytes(pts, ["plain", "heap"])
    left = _fits(heap, pts)
    assert min(left) <= cb.HEAP_SLACK  # sized from the largest point, not from the sum of them
    biggest = max(pts, key=lambda p: p.spec().workspace_bytes + p.spec().input_elems * 2)
    assert (biggest.label, biggest.size) == ("all_reduce_one_shot", 256 << 20)  # stage + reduced + heap input
    # plain inputs only: no heap input, the largest workspace alone
    assert heap - cb.heap_bytes(pts, ["plain"]) == 256 << 20
    # every PE's heap and the torch tensors of the largest point fit an H200 with room (8 PEs < 60 GiB)
    assert 8 * heap < cb.device_bytes(pts, ["plain", "heap"]) < 60 << 30
    assert cb.device_bytes(cb.points(["all_gather"], [4 << 10], 8), ["plain"]) < 64 << 20  # sized by the sweep


def test_precompile_specs_cover_the_automatic_all_reduce():
    # all_reduce alone: its one_shot and two_shot bundles, by size
    specs = cb.precompile_specs(cb.points(["all_reduce"], [4 << 10, 1 << 20], 8))
    assert specs == [CollSpec("all_reduce", "bf16", 2048, 8, "one_shot"), CollSpec("all_reduce", "bf16", 1 << 19, 8,
                                                                                    "two_shot")]  # fmt: skip
    # the default sweep: the automatic all_reduce adds no bundle to one_shot's and two_shot's; one per point else
    args = cb.parse_args([])
    pts = cb.points(args.collectives, args.sizes, args.pes)
    specs = cb.precompile_specs(pts)
    assert len(specs) == 6 * 6 and {p.spec() for p in pts} == set(specs)


def test_precompile_builds_exactly_the_sweeps_bundles(tmp_path, monkeypatch):
    """Two PEs, one size: a bundle per collective (the automatic all_reduce's is one_shot's), holding its
    kernel, found again under the key Collective computes (one CollSpec per bundle, virtual PEs)."""
    from mori_compiler.ops.collectives import coll_bundle

    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path / "other"))  # the bundles must go to DIR
    res = _run("--precompile", str(tmp_path / "dir"), "--pes", "2", "--sizes", "4KiB")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(cb.LABELS)
    bundles = sorted(p for p in (tmp_path / "dir" / "bundles").iterdir())
    assert len(bundles) == len(cb.LABELS) - 1
    assert lines[1].split()[2:] == lines[2].split()[2:]  # all_reduce (auto) at 4 KiB: one_shot's kernel and bundle
    for p in cb.points(list(cb.LABELS), [4 << 10], 2):
        spec = CollSpec(p.op, "bf16", p.count, 2, p.resolved_algorithm, 0)  # what Collective builds
        assert spec == p.spec() and spec.kernel_name in res.stdout
        again = coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path / "dir")
        assert str(again.path) in res.stdout  # found, not rebuilt elsewhere
    assert not (tmp_path / "other" / "bundles").exists()  # (its device-library cache may be used)
    assert "mori_coll.all_gather" in kernel_source([cb.points(["all_gather"], [4 << 10], 2)[0].spec()])


def test_the_budget_stops_new_points_and_skips_every_input_kind():
    args = cb.parse_args(["--sizes", "4KiB,1MiB", "--collectives", "all_gather,broadcast", "--budget-s", "150",
                          "--blocks", "4"])  # fmt: skip
    pts = cb.points(args.collectives, args.sizes, args.pes)
    now, seen = [0.0], []

    def clock():
        return now[0]

    def measure(p, kinds, calls, rounds, blocks):  # 60 s a point; the 4 KiB broadcast fails on its heap row
        now[0] += 60.0
        seen.append((p.label, p.size, tuple(kinds), calls, rounds, blocks))
        failed = cb._entries(p, ["heap"], error="wrong results") if p.label == "broadcast" else []
        return [{"label": p.label, "size": p.size, "inputs": k} for k in kinds if not failed or k == "plain"], failed

    rows, skipped, failed = cb.sweep(pts, args, measure, clock)
    both = ("plain", "heap")
    # started at 0, 60 and 120 s; at 180 > 150 none
    assert seen == [("all_gather", 4096, both, 20, 5, 4), ("all_gather", 1 << 20, both, 20, 5, 4),
                    ("broadcast", 4096, both, 20, 5, 4)]  # fmt: skip
    assert [(r["label"], r["inputs"]) for r in rows] == [("all_gather", "plain"), ("all_gather", "heap")] * 2 + [
        ("broadcast", "plain")]  # fmt: skip
    assert [(e["label"], e["size"], e["inputs"]) for e in skipped] == [("broadcast", 1 << 20, "plain"),
                                                                        ("broadcast", 1 << 20, "heap")]  # fmt: skip
    assert [(e["label"], e["inputs"], e["error"]) for e in failed] == [("broadcast", "heap", "wrong results")]


def test_measure_shares_one_roofline_and_reports_a_point_that_cannot_run(monkeypatch):
    import types

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(empty_cache=lambda: None))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)  # measure's only torch call here: empty_cache
    (p,) = cb.points(["all_to_all"], [1 << 20], 8)
    copies = []
    monkeypatch.setattr(cb, "copy_us", lambda nbytes, calls, rounds: copies.append(nbytes) or 5.0)
    monkeypatch.setattr(cb, "_time_collective", lambda *a: ([{"us": 10.0}, {"us": 20.0}], []))
    rows, failed = cb.measure(p, ["plain", "heap"], 20, 5, None)
    assert copies == [8 * p.moved_bytes] and failed == []  # one copy of all PEs' moved bytes for both rows
    assert [(r["copy_us"], r["vs_copy"]) for r in rows] == [(5.0, 0.5), (5.0, 0.25)]

    def not_coresident(*a):
        raise RuntimeError("256 blocks are not co-resident")

    monkeypatch.setattr(cb, "_time_collective", not_coresident)
    rows, failed = cb.measure(p, ["plain", "heap"], 20, 5, 32)
    assert rows == [] and len(copies) == 1  # no roofline for no row
    reason = "RuntimeError: 256 blocks are not co-resident"
    assert [(e["inputs"], e["error"]) for e in failed] == [("plain", reason), ("heap", reason)]


def _row(label, size, us, vs, inputs="plain", read=None, world=8):
    (p,) = cb.points([label], [size], world)
    read = read or ("input" if inputs == "heap" else "stage")
    return {"label": label, "op": p.op, "algorithm": p.resolved_algorithm, "auto": p.auto, "size": size,
            "world": world, "inputs": inputs, "blocks": 16, "in_place_layout": p.spec().in_place_layout,
            "placement": [read] * world, "read": read, "us": us, "algbw_GBps": size / us / 1e3, "copy_us": us * vs,
            "vs_copy": vs}  # fmt: skip


def test_goals_per_input_kind_say_met_or_missed():
    rows = [_row("all_reduce_one_shot", 4 << 10, 9.5, 0.1), _row("all_gather", 16 << 20, 100.0, 0.85),
            _row("all_to_all", 64 << 20, 300.0, 0.5), _row("all_reduce_one_shot", 4 << 10, 12.0, 0.1, "heap"),
            _row("all_gather", 16 << 20, 90.0, 0.9, "heap"),
            _row("all_reduce_one_shot", 16 << 20, 400.0, 0.35, "heap")]  # fmt: skip
    lines = cb.goals(rows)
    assert lines == [
        "[plain] vs copy >= 0.8 at >= 16MiB: missed by 1 of 2 points: all_to_all@64MiB 0.50",
        "[plain] one-shot all_reduce <= 10 us at 4KiB: met (9.50 us)",
        "[heap] vs copy >= 0.8 at >= 16MiB: missed by 1 of 2 points: all_reduce_one_shot@16MiB 0.35",
        "[heap] one-shot all_reduce <= 10 us at 4KiB: missed (12.00 us)",
    ]  # fmt: skip
    met = cb.goals([_row("all_gather", 16 << 20, 1.0, 0.9)])
    assert met == ["[plain] vs copy >= 0.8 at >= 16MiB: met by all 1 points"]


def _ar(sizes_us, inputs="plain"):
    """one_shot and two_shot rows: {size: (one_shot us, two_shot us)}, and the automatic one's."""
    rows = []
    for size, (one, two) in sizes_us.items():
        rows.append(_row("all_reduce_one_shot", size, one, 0.1, inputs))
        rows.append(_row("all_reduce_two_shot", size, two, 0.1, inputs))
        rows.append(_row("all_reduce", size, one if size <= ONE_SHOT_MAX_BYTES else two, 0.1, inputs))
    return rows


def test_algorithm_lines_judge_the_automatic_pick_and_give_the_crossover():
    limit = f"ONE_SHOT_MAX_BYTES = {ONE_SHOT_MAX_BYTES >> 10}KiB"
    rows = _ar({4 << 10: (9.0, 15.0), 64 << 10: (17.0, 18.0), 1 << 20: (22.1, 20.8), 16 << 20: (370.0, 178.0)})
    assert cb.algorithm_lines(rows) == [
        f"[plain] all_reduce auto ({limit}) picks 4KiB one_shot; 64KiB one_shot; 1MiB two_shot; 16MiB two_shot: "
        "the faster at all 4 sizes",
        "[plain] all_reduce crossover: two_shot is faster from 1MiB (one_shot 22.10 us, two_shot 20.80 us); "
        f"{limit} (one_shot up to it): the data fits a value in [64KiB, 1MiB)",
    ]  # fmt: skip
    # two_shot already faster at 64 KiB, one_shot again at 1 MiB: the pick is wrong there, the line says so
    rows = _ar({4 << 10: (9.0, 15.0), 64 << 10: (18.0, 17.0), 1 << 20: (20.0, 21.0)}, "heap")
    auto, cross = cb.algorithm_lines(rows)
    assert auto.endswith("the faster at 1 of 3 sizes; not at 64KiB (one_shot 18.00 us, two_shot 17.00 us), "
                         "1MiB (one_shot 20.00 us, two_shot 21.00 us)")  # fmt: skip
    assert cross.startswith("[heap] all_reduce crossover: two_shot is faster from 64KiB")
    assert cross.endswith("[4KiB, 64KiB); but one_shot is faster again at 1MiB")
    (_, never) = cb.algorithm_lines(_ar({4 << 10: (9.0, 15.0), 64 << 10: (17.0, 18.0)}))
    assert never == ("[plain] all_reduce crossover: two_shot is faster at none of the sizes measured (4KiB .. 64KiB); "
                     f"{limit}")  # fmt: skip
    assert cb.algorithm_lines([_row("all_reduce_one_shot", 4 << 10, 9.0, 0.1)]) == []  # nothing to compare


def test_table_warnings_and_json_shape():
    staged = _row("all_to_all", 1 << 20, 30.0, 0.5, "heap", read="mixed")
    staged["placement"] = ["input", "stage"] + ["input"] * 6
    rows = [_row("broadcast", 1 << 20, 20.0, 0.9), _row("all_reduce", 1 << 20, 21.0, 0.3, "heap"), staged]
    skipped = cb._entries(cb.points(["all_to_all"], [64 << 20], 8)[0], ["plain", "heap"])
    failed = cb._entries(cb.points(["all_gather"], [4 << 10], 8)[0], ["heap"], error="RuntimeError: not co-resident")
    text = cb.table(rows, skipped, failed).splitlines()
    assert text[0].split() == ["collective", "inputs", "size", "blocks", "read", "us", "algbw", "GB/s", "copy", "us",
                               "vs", "copy", "note"]  # fmt: skip
    assert text[1].split() == ["broadcast", "plain", "1MiB", "16", "stage", "20.00", "52.4", "18.00", "0.90"]
    assert text[2].split()[:5] == ["all_reduce", "heap", "1MiB", "16", "input"] and text[2].endswith("auto: two_shot")
    assert text[3].endswith("mixed     30.00        35.0     15.00     0.50  NOT in place: staged on PE 1")
    assert text[4].split() == ["all_to_all", "plain", "64MiB", "skipped", "(--budget-s", "spent)"]
    assert text[5].split()[1:3] == ["heap", "64MiB"] and text[6].endswith("failed: RuntimeError: not co-resident")
    assert cb.warnings(rows) == ["heap inputs staged where in place was expected (their times are the staged "
                                 "path's): all_to_all@1MiB"]  # fmt: skip
    not_in_place = dict(staged, in_place_layout=False)  # (a layout that stages by design is not a warning)
    assert cb.warnings([not_in_place]) == []
    doc = json.loads(json.dumps(cb.report({"device": "H200", "pes": 8}, rows, skipped, failed)))
    assert set(doc) == {"config", "rows", "skipped", "failed"}
    assert doc["rows"][0]["vs_copy"] == 0.9 and doc["rows"][1]["inputs"] == "heap"
    assert doc["skipped"][1] == {"label": "all_to_all", "op": "all_to_all", "algorithm": "", "size": 64 << 20,
                                 "world": 8, "inputs": "heap"}  # fmt: skip
    assert doc["failed"][0]["error"] == "RuntimeError: not co-resident"


def test_plot_has_a_panel_per_input_kind(tmp_path):
    pytest.importorskip("matplotlib")  # the [bench] extra
    import matplotlib.image

    rows = [_row("all_gather", s, 10.0, v, k) for k in ("plain", "heap") for s, v in ((4 << 10, 0.1), (16 << 20, 0.8))]
    cb.plot(tmp_path / "p.png", rows, "test")
    wide = matplotlib.image.imread(tmp_path / "p.png").shape
    cb.plot(tmp_path / "q.png", [r for r in rows if r["inputs"] == "heap"], "test")
    narrow = matplotlib.image.imread(tmp_path / "q.png").shape
    assert wide[1] == 2 * narrow[1] and wide[0] == narrow[0]
