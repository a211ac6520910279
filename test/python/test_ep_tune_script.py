"""bench/ep_tune.py on the CPU: the grid under the co-residency bound, MORI's bandwidth, the best pick with its
noise margin, the rules and tables it writes (read back by AUTO mode), the check ratios, the plan it builds
bundles for, its estimate and its CLI's refusals. The GPU measurement itself runs only on the GPU machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import ep_tune  # noqa: E402
from ep_tune import Point  # noqa: E402

from mori_compiler.ops import tuning  # noqa: E402
from mori_compiler.ops.auto_launch import AutoLaunch  # noqa: E402


def _p(blocks, warps, gbps, leg="dispatch", dtype="bf16", tokens=128, zero_copy=None, kind="IntraNode"):
    return Point(kind, leg, dtype, tokens, zero_copy, blocks, warps, 1000.0 / gbps, gbps)


def test_thread_bound_on_the_h200():
    # 132 SMs x 2048 threads shared by 8 PEs: 8 warps (256 threads) -> 8 per SM -> 132 blocks per PE.
    assert ep_tune.thread_bound_blocks(132, 8, 8) == 132
    assert ep_tune.thread_bound_blocks(132, 8, 4) == 264  # 16 blocks of 128 threads per SM
    assert ep_tune.thread_bound_blocks(132, 8, 1) == 528  # the 32-blocks-per-SM bound, not threads
    assert ep_tune.thread_bound_blocks(132, 1, 32) == 264


def test_block_candidates_are_mori_quick_under_the_limit():
    assert ep_tune.block_candidates(33) == [8, 16, 32, 33]
    assert ep_tune.block_candidates(132, min_blocks=16) == [16, 32, 64, 128, 132]
    assert ep_tune.block_candidates(64) == [8, 16, 32, 64]  # the limit is a power of two: once
    assert ep_tune.block_candidates(5) == [5]  # below min_blocks: the largest grid that fits
    assert ep_tune.block_candidates(5000) == [8, 16, 32, 64, 128, 256, 512, 1024]  # MAX_BLOCKS epoch slots
    assert ep_tune.block_candidates(0) == []


def test_mori_bandwidth():
    # 672 rows of 7168 fp8 bytes in 35 µs: the spec's sanity check (~138 GB/s)
    assert ep_tune.mori_gbps([672], 7168, 1, 35.0) == pytest.approx(137.6, abs=0.1)
    assert ep_tune.mori_gbps([100, 300], 1000, 2, 1.0) == pytest.approx(400.0)  # mean over PEs


def test_pick_best_prefers_the_smaller_grid_within_the_margin():
    pts = [_p(64, 8, 300.0), _p(32, 8, 295.0), _p(16, 16, 292.0), _p(128, 4, 250.0)]
    assert ep_tune.pick_best(pts)[5:7] == (16, 16)  # within 3 %: 16 x 16 = 256 warps, the least
    assert ep_tune.pick_best(pts, tolerance=0.02)[5:7] == (32, 8)  # 2 % (6 GB/s): 295 is in, 292 is not
    assert ep_tune.pick_best(pts, tolerance=0.0)[5:7] == (64, 8)
    # MORI's 1.0 GB/s noise margin where 3 % is less (small bandwidths at few tokens)
    assert ep_tune.pick_best([_p(32, 8, 20.0), _p(16, 8, 19.1)])[5] == 16
    assert ep_tune.pick_best([_p(32, 8, 20.0), _p(16, 8, 18.9)])[5] == 32
    with pytest.raises(ValueError, match="no measurements"):
        ep_tune.pick_best([])


def _sweep_points():
    pts = []
    for tokens, best in ((128, (16, 8)), (4096, (32, 4))):
        for blocks, warps in ((8, 8), (16, 8), (32, 8), (32, 4), (64, 4)):
            gbps = 300.0 if (blocks, warps) == best else 200.0 + blocks
            pts.append(_p(blocks, warps, gbps, tokens=tokens))
            pts.append(_p(blocks, warps, gbps / 2, dtype="fp8_e4m3fn", tokens=tokens))
            pts.append(_p(blocks, warps, gbps, leg="combine", tokens=tokens, zero_copy=True))
            pts.append(_p(blocks, warps, gbps - 50, leg="combine", tokens=tokens, zero_copy=False))
    return pts


def test_rules_tables_and_auto_mode_agree(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.TUNING_CONFIG_VAR, raising=False)
    rules = ep_tune.best_rules(_sweep_points())
    assert sorted(rules) == [("IntraNode", "combine"), ("IntraNode", "dispatch")]
    paths = ep_tune.write_tables(rules, tmp_path, "h200", 8)
    assert sorted(p.name for p in paths) == ["sm_90_h200_IntraNode_ep8_combine.json",
                                             "sm_90_h200_IntraNode_ep8_dispatch.json"]  # fmt: skip
    dispatch = tuning.load_tuning_table(tmp_path / "sm_90_h200_IntraNode_ep8_dispatch.json")
    assert {(r.dtype, r.num_tokens): (r.block_num, r.warp_per_block) for r in dispatch.rules} == {
        ("bf16", 128): (16, 8), ("bf16", 4096): (32, 4), ("fp8_e4m3", 128): (16, 8), ("fp8_e4m3", 4096): (32, 4)}
    assert all(r.topk == 8 and r.hidden_dim == 7168 and r.info["bandwidth_gbps"] > 0 for r in dispatch.rules)
    auto = AutoLaunch(ep_tune.make_config("IntraNode", 8, 4096, 8), "sm_90", "h200", search_dirs=[tmp_path])
    assert auto.geometry("dispatch", "fp8_e4m3fn", 128)[::2] == (16, 8)
    assert auto.geometry("dispatch", "bf16", 3000)[::2] == (32, 4)
    assert auto.geometry("combine", "bf16", 4096, zero_copy=False)[::2] == (32, 4)
    # fp8_e4m3fnuz (a dispatch dtype of the op, not measured by the tuner) has no rule: the fallback's 16 warps.
    assert auto.warp_counts() == [4, 8, 16]
    assert auto.explain("dispatch", "fp8_e4m3fnuz", 128) == "fallback"


def test_tables_merge_with_an_earlier_run(tmp_path):
    ep_tune.write_tables(ep_tune.best_rules(_sweep_points()), tmp_path, "h200", 8)
    slower = [p._replace(gbps=p.gbps / 2, blocks=p.blocks * 2) for p in _sweep_points()]
    ep_tune.write_tables(ep_tune.best_rules(slower), tmp_path, "h200", 8)
    dispatch = tuning.load_tuning_table(tmp_path / "sm_90_h200_IntraNode_ep8_dispatch.json")
    assert {r.block_num for r in dispatch.rules} == {16, 32}  # the earlier, faster geometries stay


def test_check_ratios():
    grid = _sweep_points()
    autos = [_p(16, 8, 291.0), _p(8, 8, 150.0, leg="combine", zero_copy=True)]
    ratios = ep_tune.check_ratios(grid, autos)
    assert [round(r["ratio"], 3) for r in ratios] == [0.97, 0.5]
    assert ratios[0]["best"] == [16, 8] and ratios[1]["auto"] == [8, 8]
    with pytest.raises(ValueError, match="no grid measurement"):
        ep_tune.check_ratios(grid, [_p(16, 8, 1.0, tokens=777)])


def test_legs_and_warp_plan():
    assert ep_tune.leg_forms("IntraNode") == [("dispatch", "bf16", None), ("dispatch", "fp8_e4m3fn", None),
                                              ("combine", "bf16", True), ("combine", "bf16", False)]  # fmt: skip
    assert ep_tune.leg_forms("AsyncLL")[2:] == [("combine", "bf16", False)]
    # The grid's warp counts plus what AUTO may pick beyond them (MORI's fallback: 16 warps).
    assert ep_tune.warp_plan("IntraNode", 8, 4096, [4, 8]) == [4, 8, 16]
    assert ep_tune.warp_plan("IntraNodeLL", 8, 4096, [4, 8, 16]) == [4, 8, 16]


def test_estimate_counts_captures_and_replays():
    est = ep_tune.estimate(10, [128] * 5 + [4096] * 5, reps=20, n_ops=2, overhead_s=0.05, op_s=3.0)
    assert (est["points"], est["captures"], est["replays"], est["ops"]) == (10, 10, 210, 2)
    assert est["seconds"] == pytest.approx(6.5 + 21 * (5 * (30 + 25.6) + 5 * (30 + 819.2)) * 1e-6, abs=0.05)


def test_heap_holds_the_largest_op():
    heap = ep_tune.heap_bytes(["IntraNode", "AsyncLL"], 8, 4096, [8])
    rows = 8 * 4096 * 7168 * 2  # one PE's receive buffer of bf16 rows
    assert 3 * rows < heap < 20 * rows


def _cli(*args, env=None):
    import os

    return subprocess.run([sys.executable, str(BENCH / "ep_tune.py"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})  # fmt: skip


def test_cli_dry_run_prints_the_estimate():
    r = _cli("--dry-run", "--kinds", "IntraNode", "--tokens", "128,4096", "--warps", "8", "--reps", "20")
    assert r.returncode == 0, r.stderr
    # 8 warps at the thread bound: 132 blocks per PE -> 8, 16, 32, 64, 128, 132; 4 legs x 2 token counts
    assert "1 ops, 48 graph captures, 1008 replays" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--kinds", "InterNodeV2"], "--kinds 'InterNodeV2' is not allowed; allowed: IntraNode, IntraNodeLL, AsyncLL"),
    (["--tokens", "0"], "--tokens and --warps take positive integers"),
    (["--warps", "x"], "invalid literal"),
    (["--world", "1"], "--world must be in [2, 32]"),
])  # fmt: skip
def test_cli_refuses_bad_options(args, message):
    r = _cli(*args, "--dry-run")
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_cli_refuses_via_op_without_check():
    r = _cli("--dry-run", "--via-op")
    assert r.returncode == 1 and "--via-op measures AUTO's picks: it needs --check" in r.stderr


def test_cli_refuses_auto_mode():
    r = _cli("--dry-run", env={tuning.LAUNCH_MODE_VAR: "auto"})
    assert r.returncode == 1 and "MORI_EP_LAUNCH_CONFIG_MODE=AUTO would override the swept geometry" in r.stderr


class _FakeSweep:
    """The GPU side of one op replaced by a model: co-residency limits per warp count and a bandwidth that
    peaks at 256 warps per PE (fewer are slower, more pay for the grid barrier)."""

    LIMITS = {4: 66, 8: 33, 16: 16}
    built = []

    environ = []

    def __init__(self, kind, world, max_tokens, warps, reps, environ=None):
        self.kind, self.warps = kind, warps
        if environ is not None:
            self.environ.append(environ)
        self.limit = {"dispatch": self.LIMITS[warps], "combine": self.LIMITS[warps] // 2}
        self.built.append((kind, warps, max_tokens))

    def prepare(self, tokens):
        self.tokens = tokens

    given = set()

    def measure(self, leg, dtype, zero_copy, blocks, gate):
        self.given.add(blocks)
        blocks = max(blocks, 1)
        total = blocks * self.warps
        gbps = 300.0 * min(total, 256) / 256 - 0.1 * max(0, total - 256) - (20 if zero_copy is False else 0)
        return Point(self.kind, leg, dtype, self.tokens, zero_copy, blocks, self.warps, 1e3 / gbps, gbps)

    def close(self):
        pass


def test_sweep_tables_and_check_end_to_end(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.TUNING_CONFIG_VAR, raising=False)
    monkeypatch.setattr(ep_tune, "Sweep", _FakeSweep)
    _FakeSweep.built = []
    args = ep_tune.argparse.Namespace(kinds=["IntraNode"], world=8, tokens=[128, 4096], warps=[4, 8, 16],
                                      min_blocks=8, reps=3, tables=str(tmp_path))  # fmt: skip
    grid, limits, skipped = ep_tune.sweep_grid(args, "IntraNode", args.tokens)
    assert not skipped and limits[("combine", 8)] == 16
    # dispatch: blocks 8 16 32 64 66 (4 warps), 8 16 32 33 (8), 8 16 (16); combine: 8 16 32 33, 8 16, 8
    assert len(grid) == 2 * 2 * (5 + 4 + 2) + 2 * 2 * (4 + 2 + 1)
    ep_tune.write_tables(ep_tune.best_rules(grid), tmp_path, "h200", 8)
    picks, tables = ep_tune.auto_picks(args, "IntraNode", "h200", [128, 4096], limits)
    assert sorted(p.name for p in tables) == ["sm_90_h200_IntraNode_ep8_combine.json",
                                              "sm_90_h200_IntraNode_ep8_dispatch.json"]  # fmt: skip
    # Dispatch: 64 x 4, 32 x 8 and 16 x 16 reach the peak (256 warps): the fewest blocks win. Combine: 33 x 4
    # (132 warps, 154.7 GB/s) is the best, and 32 x 4 (150.0) is 3.03 % below it: not within the margin.
    assert picks[("dispatch", "bf16", 128, None)] == (16, 16)
    assert picks[("combine", "bf16", 4096, True)] == (33, 4)
    autos, skipped = ep_tune.measure_picks(args, "IntraNode", picks)
    ratios = ep_tune.check_ratios(grid, autos)
    assert len(ratios) == 8 and all(r["ratio"] == pytest.approx(1.0) for r in ratios)
    assert {k for k, _, _ in _FakeSweep.built} == {"IntraNode"} and {t for _, _, t in _FakeSweep.built} == {4096}
    # --via-op: one op, built in AUTO mode over those tables, called without a geometry
    _FakeSweep.built, _FakeSweep.environ, _FakeSweep.given = [], [], set()
    args.via_op = True
    autos, _ = ep_tune.measure_picks(args, "IntraNode", picks, tables=tables)
    assert len(_FakeSweep.built) == 1 and _FakeSweep.given == {-1}  # the op chose each call's geometry
    assert {(p.leg, p.dtype, p.tokens, p.zero_copy): (p.blocks, p.warps) for p in autos} == picks
    (environ,) = _FakeSweep.environ
    assert environ[tuning.LAUNCH_MODE_VAR] == "AUTO" and sorted(environ[tuning.TUNING_CONFIG_VAR].split(":")) == sorted(
        str(p) for p in tables)  # fmt: skip
    with pytest.raises(ValueError, match="--via-op: no IntraNode table in"):
        ep_tune.measure_picks(args, "IntraNode", picks, tables=[])


def test_budget_leaves_keys_unmeasured(monkeypatch):
    monkeypatch.setattr(ep_tune, "Sweep", _FakeSweep)
    args = ep_tune.argparse.Namespace(kinds=["AsyncLL"], world=8, tokens=[128], warps=[8], min_blocks=8, reps=3)
    grid, _, skipped = ep_tune.sweep_grid(args, "AsyncLL", [128], deadline=0.0)
    assert grid == [] and skipped == {("AsyncLL", "dispatch", "bf16", 128, None),
                                      ("AsyncLL", "dispatch", "fp8_e4m3fn", 128, None),
                                      ("AsyncLL", "combine", "bf16", 128, False)}  # fmt: skip
