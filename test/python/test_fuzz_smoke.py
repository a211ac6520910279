"""CI smoke run of the fuzzing harness (test/fuzz): a fixed-seed campaign of a few hundred mutants of
mori-opt, mori-compile and --precompile inputs must give no crash, internal error, traceback, hang or
error without a location. Also checks that the fork server classifies like a fresh process.

Set MORI_FUZZ_OUT=DIR to keep the reproducers (default: pytest's tmp_path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # test/: the harness is the package `fuzz`

from fuzz import corpus  # noqa: E402
from fuzz.campaign import CaseGenerator, run_campaign, tool_of  # noqa: E402
from fuzz.classify import classify  # noqa: E402
from fuzz.executor import Case, ForkRunner, SubprocessRunner  # noqa: E402

SEED = 11
RUNS_PER_TOOL = {"opt": 250, "compile": 150, "precompile": 100}
JOBS = 2


def _describe(report) -> str:
    lines = [report.table(), ""]
    for f in report.failures():
        err = f.result.stderr.decode("utf-8", "backslashreplace").strip().splitlines()[:3]
        lines.append(f"{f.verdict.outcome} ({f.count}x): {f.reproducer}\n    $ {f.case.command_line()}\n    "
                     + "\n    ".join(err))  # fmt: skip
    return "\n".join(lines)


@pytest.mark.slow
def test_fuzz_smoke(tmp_path):
    out = Path(os.environ.get("MORI_FUZZ_OUT", tmp_path / "fuzz"))
    reports = {}
    for tool, runs in RUNS_PER_TOOL.items():
        reports[tool] = run_campaign(SEED, runs, (tool,), out / tool, jobs=JOBS, timeout=30.0,
                                     reduce_seconds=3.0, reduce_total=15.0)  # fmt: skip
    for tool, runs in RUNS_PER_TOOL.items():  # never pass on runs that did not happen
        assert reports[tool].runs[tool] == runs, reports[tool].table()
    failures = [f for r in reports.values() for f in r.failures()]
    assert not failures, f"{len(failures)} failure classes:\n" + "\n\n".join(_describe(r) for r in reports.values())


def _sample_cases() -> list[Case]:
    """Mutants of each tool plus the issue's defect seeds: a mix of ok, user errors and failures."""
    generator = CaseGenerator(SEED)
    cases = [generator.case(tool, i) for tool in ("opt", "compile", "precompile") for i in range(4)]
    for seed in corpus.defect_seeds()[:4]:
        cases.append(Case("compile", ["input.mlir", "--target", "sm_90", "-o", "out.ptx"], {"input.mlir": seed.data}))
    cases.append(Case("opt", ["input.mlir"], {"input.mlir": b"func.func @f() {\n  return\n}\n"}))
    cases.append(Case("opt", ["input.mlir"], {"input.mlir": b"func.func @f() {\n  %0 = arith.addi %a : i32\n}\n"}))
    return cases


@pytest.mark.slow
def test_fork_server_classifies_like_a_fresh_process():
    cases = _sample_cases()
    forked = {id(c): classify(c, r) for c, r in ForkRunner(jobs=JOBS, timeout=60.0).run_many(cases)}
    fresh = {id(c): classify(c, r) for c, r in SubprocessRunner(jobs=JOBS, timeout=120.0).run_many(cases)}
    outcomes = {v.outcome for v in fresh.values()}
    assert {"ok", "user_error"} <= outcomes, outcomes  # the sample is not trivial
    differ = [(c.command_line(), tool_of(c), forked[id(c)], fresh[id(c)]) for c in cases
              if forked[id(c)].signature != fresh[id(c)].signature]  # fmt: skip
    assert not differ, "\n".join(f"{cmd} [{tool}]\n  fork:  {a}\n  fresh: {b}" for cmd, tool, a, b in differ)
