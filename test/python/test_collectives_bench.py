"""bench/collectives_bench.py on the CPU: its arguments and refusals, the byte accounting of each collective,
the bundles --precompile builds for a tiny sweep (compiled for sm_90, the keys Collective looks up), the
table, the goals and the JSON document. The measurement itself runs on the GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import collectives_bench as cb  # noqa: E402

from mori_compiler.dialects.mori_coll_schema import CollSpec, kernel_source  # noqa: E402


def _run(*argv):
    return subprocess.run([sys.executable, str(BENCH / "collectives_bench.py"), *argv], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_defaults_are_the_issue_sweep():
    args = cb.parse_args([])
    assert args.pes == 8 and args.collectives == list(cb.LABELS) and args.precompile is None
    assert (args.calls, args.rounds, args.budget_s) == (20, 5, 90.0)
    assert args.sizes == [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    assert len(cb.points(args.collectives, args.sizes, args.pes)) == 30


def test_sizes_parse_units_dedupe_and_sort():
    assert cb.sizes_list("1MiB, 4k,4096,64B") == [64, 4096, 1 << 20]
    assert cb.sizes_list("2G") == [2 << 30]
    assert cb.collectives_list("all_to_all,all_gather") == ["all_gather", "all_to_all"]  # the sweep's order


@pytest.mark.parametrize("argv, message", [
    (["--pes", "1"], "--pes: 1 is not in [2, 32]"),
    (["--pes", "x"], "'x' is not an integer"),
    (["--sizes", "4KB"], "'4KB' is not a size"),
    (["--sizes", ","], "at least one size"),
    (["--sizes", "0"], "at least 1 byte"),
    (["--sizes", "4100"], "--sizes 4100: every size must be a multiple of 16 bytes"),
    (["--pes", "3", "--sizes", "4KiB"], "multiple of 6 bytes"),
    (["--collectives", "all_reduce"], "all_reduce: not a collective of the sweep (allowed: all_gather"),
    (["--calls", "0"], "--calls: 0 is not in [1, 10000]"),
    (["--budget-s", "0"], "'0' must be > 0"),
    (["--precompile", "d", "--json", "x.json", "--calls", "3"], "--precompile builds bundles only: --json, --calls are"),
])  # fmt: skip
def test_bad_arguments_are_refused_with_the_reason(argv, message):
    res = _run(*argv)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_no_gpu_is_a_clear_error_not_a_traceback():
    res = _run("--sizes", "4KiB", "--pes", "2")
    assert res.returncode == 1 and "it measures the GPU" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("label, count, moved", [
    # S = 64 KiB per PE, W = 8: count is the op's chunk; moved = the bus bytes per PE.
    ("all_gather", 4096, 7 * 8192),  # output W x n: the 7 peers' chunks
    ("reduce_scatter", 4096, 7 * 8192),  # input W x n: the 7 peers' copies of my chunk
    ("all_to_all", 4096, 7 * 8192),
    ("all_reduce_one_shot", 32768, 2 * 7 * 8192),  # 2 (W-1)/W x S, whatever the algorithm
    ("all_reduce_two_shot", 32768, 2 * 7 * 8192),
    ("broadcast", 32768, 65536),
])  # fmt: skip
def test_byte_accounting(label, count, moved):
    (p,) = cb.points([label], [64 << 10], 8)
    assert (p.count, p.moved_bytes) == (count, moved)
    s = p.spec()
    assert max(s.input_elems, s.output_elems) * s.elem_bytes == p.size  # size: the larger buffer, as nccl-tests
    assert s.dtype == "bf16" and s.root == 0 and s.algorithm == ("" if "all_reduce" not in label else label[11:])


def test_heap_holds_the_largest_workspace():
    pts = cb.points(list(cb.LABELS), [4 << 10, 1 << 20], 4)
    biggest = max(p.spec().workspace_bytes for p in pts)
    assert biggest >= 1 << 20 and cb.heap_bytes(pts) == biggest + (64 << 20)


def test_precompile_builds_exactly_the_sweeps_bundles(tmp_path, monkeypatch):
    """Two PEs, one size: a bundle per collective, holding its kernel, found again under the key Collective
    computes (one CollSpec per bundle, virtual PEs)."""
    from mori_compiler.ops.collectives import coll_bundle

    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path / "other"))  # the bundles must go to DIR
    res = _run("--precompile", str(tmp_path / "dir"), "--pes", "2", "--sizes", "4KiB")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(cb.LABELS)
    bundles = sorted(p for p in (tmp_path / "dir" / "bundles").iterdir())
    assert len(bundles) == len(cb.LABELS)
    for p in cb.points(list(cb.LABELS), [4 << 10], 2):
        spec = CollSpec(p.op, "bf16", p.count, 2, p.algorithm, 0)  # what Collective builds
        assert spec == p.spec() and spec.kernel_name in res.stdout
        again = coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path / "dir")
        assert str(again.path) in res.stdout  # found, not rebuilt elsewhere
    assert not (tmp_path / "other" / "bundles").exists()  # (its device-library cache may be used)
    assert "mori_coll.all_gather" in kernel_source([cb.points(["all_gather"], [4 << 10], 2)[0].spec()])


def _row(label, size, us, vs):
    return {"label": label, "size": size, "blocks": 1, "us": us, "algbw_GBps": size / us / 1e3, "copy_us": us * vs,
            "vs_copy": vs}  # fmt: skip


def test_goals_say_met_or_missed():
    rows = [_row("all_reduce_one_shot", 4 << 10, 9.5, 0.1), _row("all_gather", 16 << 20, 100.0, 0.85),
            _row("all_to_all", 64 << 20, 300.0, 0.5)]  # fmt: skip
    lines = cb.goals(rows)
    assert lines[0] == "vs copy >= 0.8 at >= 16MiB: missed by all_to_all@64MiB 0.50"
    assert lines[1] == "one-shot all_reduce <= 10 us at 4KiB: met (9.50 us)"
    assert cb.goals([_row("all_gather", 16 << 20, 1.0, 0.9)]) == ["vs copy >= 0.8 at >= 16MiB: met by all 1 points"]
    assert "missed (12.00 us)" in cb.goals([_row("all_reduce_one_shot", 4 << 10, 12.0, 0.1)])[0]


def test_table_and_json_shape():
    rows = [_row("broadcast", 1 << 20, 20.0, 0.9)]
    skipped = cb.points(["all_to_all"], [64 << 20], 8)
    text = cb.table(rows, skipped)
    assert "broadcast" in text and "1MiB" in text and "0.90" in text
    assert "all_to_all" in text and "64MiB  skipped (--budget-s spent)" in text
    doc = json.loads(json.dumps(cb.report({"device": "H200", "pes": 8}, rows, skipped)))
    assert set(doc) == {"config", "rows", "skipped"}
    assert doc["rows"][0]["vs_copy"] == 0.9
    assert doc["skipped"] == [{"label": "all_to_all", "op": "all_to_all", "algorithm": "", "size": 64 << 20, "world": 8}]
