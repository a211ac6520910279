"""A fuzzing campaign: generate mutants per tool from a seed, run them, classify the outcomes, reduce
the first instance of each failing signature and write it as a reproducer folder."""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from unittest import mock
from pathlib import Path

from . import argv_mutators, corpus, json_mutators, mutators
from .classify import OUTCOMES, Verdict, classify
from .executor import Case, RunResult, SubprocessRunner, make_runner
from .reduce import reduce_input

TOOLS = ("opt", "compile", "precompile")
COMPILE_TARGETS = ("sm_90", "gfx942")
SEVERITY = ("crash", "internal", "traceback", "hang", "unlocated")  # order of reduction
ARGV_MUTATION_RATE = 0.15  # share of opt/compile runs whose options are mutated too
INPUT = "input.mlir"
CONFIGS = "configs.json"


# ---- generating cases ----------------------------------------------------------------------------
class CaseGenerator:
    """The i-th mutant of a tool for a seed is a function of (seed, tool, i) only."""

    def __init__(self, seed: int):
        self.seed = seed
        self.opt_seeds = corpus.lit_seeds() + corpus.defect_seeds()
        self.compile_seeds = corpus.compile_seeds()
        self.kernel_seeds = corpus.example_seeds()  # what a precompile entry's "kernel": "k.mlir" holds
        self.donors = [s.data for s in self.opt_seeds] + [s.data for s in self.compile_seeds]

    def rng(self, tool: str, index: int) -> random.Random:
        return random.Random(f"{self.seed}:{tool}:{index}")

    def case(self, tool: str, index: int) -> Case:
        return getattr(self, f"_{tool}")(self.rng(tool, index))

    def _mutant(self, rng, seed: corpus.Seed) -> tuple[bytes, list[str]]:
        return mutators.mutate(rng, seed.data, self.donors)

    def _opt(self, rng) -> Case:
        seed = rng.choice(self.opt_seeds)
        data, applied = self._mutant(rng, seed)
        variants = seed.opt_variants if seed.opt_variants and rng.random() < 0.6 else corpus.COMMON_OPT_VARIANTS
        options = list(rng.choice(variants))
        if rng.random() < ARGV_MUTATION_RATE:
            options = argv_mutators.mutate_opt_argv(rng, options)
            applied = [*applied, "argv"]
        if rng.random() < 0.1:  # through stdin
            return Case("opt", ["-", *options], {}, stdin=data, label=f"{seed.name} {'+'.join(applied)}",
                        meta={"seed_input": seed.name, "mutators": applied})  # fmt: skip
        return Case("opt", [INPUT, *options, "-o", "out.mlir"], {INPUT: data},
                    label=f"{seed.name} {'+'.join(applied)}", meta={"seed_input": seed.name, "mutators": applied})  # fmt: skip

    def _compile(self, rng) -> Case:
        seed = rng.choice(self.compile_seeds)
        data, applied = self._mutant(rng, seed)
        target = rng.choice(COMPILE_TARGETS)
        argv = [INPUT, "--target", target, "-o", "out." + ("hsaco" if target.startswith("gfx") else "ptx")]
        if rng.random() < 0.4:
            argv.append("--no-report")
        if rng.random() < ARGV_MUTATION_RATE:
            argv = argv_mutators.mutate_compile_argv(rng, argv, INPUT)
            applied = [*applied, "argv"]
        return Case("compile", argv, {INPUT: data}, label=f"{seed.name} {target} {'+'.join(applied)}",
                    meta={"seed_input": seed.name, "mutators": applied})  # fmt: skip

    def _precompile(self, rng) -> Case:
        data, applied = json_mutators.mutate_configs(rng)
        kernel = rng.choice(self.kernel_seeds)
        files = {CONFIGS: data, "k.mlir": kernel.data if rng.random() < 0.5 else self._mutant(rng, kernel)[0]}
        return Case("compile", ["--precompile", CONFIGS], files, label="+".join(applied),
                    meta={"seed_input": "precompile configs", "mutators": applied})  # fmt: skip


# ---- a campaign ----------------------------------------------------------------------------------
@dataclass
class Finding:
    verdict: Verdict
    case: Case
    result: RunResult
    count: int = 1
    reproducer: str | None = None
    confirmed: bool | None = None  # a fresh interpreter gave the same signature


@dataclass
class Report:
    counts: dict[str, Counter] = field(default_factory=lambda: {t: Counter() for t in TOOLS})
    findings: dict[str, Finding] = field(default_factory=dict)  # signature -> first instance
    seconds: float = 0.0

    @property
    def runs(self) -> dict[str, int]:
        return {t: sum(c.values()) for t, c in self.counts.items()}

    def failures(self) -> list[Finding]:
        return [f for f in self.findings.values() if f.verdict.failed]

    def table(self) -> str:
        header = f"{'tool':<11}" + "".join(f"{o:>11}" for o in OUTCOMES) + f"{'runs':>8}"
        rows = [header]
        for tool, counts in self.counts.items():
            rows.append(f"{tool:<11}" + "".join(f"{counts[o]:>11}" for o in OUTCOMES) + f"{sum(counts.values()):>8}")
        return "\n".join(rows)

    def to_json(self) -> dict:
        return {
            "seconds": round(self.seconds, 1),
            "runs": self.runs,
            "counts": {t: dict(c) for t, c in self.counts.items()},
            "failures": [{"signature": f.verdict.signature, "outcome": f.verdict.outcome, "count": f.count,
                          "reason": f.verdict.reason, "command": f.case.command_line(),
                          "reproducer": f.reproducer, "confirmed": f.confirmed} for f in self.failures()],  # fmt: skip
        }


def tool_of(case: Case) -> str:
    return "precompile" if "--precompile" in case.argv else case.tool


def _main_input(case: Case) -> str | None:
    """The file the reducer shrinks: the .mlir input, or the config list of a precompile run."""
    if "--precompile" in case.argv:
        return CONFIGS
    return INPUT if INPUT in case.files else None


def _with_input(case: Case, data: bytes) -> Case:
    name = _main_input(case)
    if name is None:
        return Case(case.tool, case.argv, case.files, data, case.label, case.meta)
    return Case(case.tool, case.argv, {**case.files, name: data}, case.stdin, case.label, case.meta)


def minimize(case: Case, verdict: Verdict, runner, seconds: float) -> Case:
    name = _main_input(case)
    data = case.files[name] if name else case.stdin

    def still_fails(candidate: bytes) -> bool:
        trial = _with_input(case, candidate)
        (_, result), = runner.run_many([trial])
        return classify(trial, result).signature == verdict.signature

    # A config list is one entry per line: removing lines is what matters; bytes mostly break the JSON.
    return _with_input(case, reduce_input(data, still_fails, seconds, bytes_too=name != CONFIGS))


def write_reproducer(out: Path, finding: Finding, confirm: tuple[Verdict, RunResult] | None) -> str:
    v, case = finding.verdict, finding.case
    digest = hashlib.sha1(v.signature.encode()).hexdigest()[:10]
    folder = out / f"{v.outcome}-{tool_of(case)}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    if case.stdin:
        (folder / "stdin").write_bytes(case.stdin)
    command = case.command_line() + (" < stdin" if case.stdin else "")
    script = f"#!/bin/sh\n# run in this folder\ncd \"$(dirname \"$0\")\" && {command}\n"
    (folder / "command.sh").write_bytes(os.fsencode(script))  # argv words may be non-UTF-8 bytes
    (folder / "stderr.txt").write_bytes(finding.result.stderr)
    info = {"outcome": v.outcome, "reason": v.reason, "signature": v.signature, "command": command,
            "label": case.label, "meta": case.meta, "count": finding.count,
            "exit_code": finding.result.exit_code, "signal": finding.result.signal}  # fmt: skip
    if confirm:
        info["fresh_process"] = {"outcome": confirm[0].outcome, "exit_code": confirm[1].exit_code,
                                 "signal": confirm[1].signal, "same_signature": confirm[0].signature == v.signature}  # fmt: skip
    (folder / "outcome.json").write_text(json.dumps(info, indent=2, ensure_ascii=True) + "\n")
    return str(folder)


def run_campaign(seed: int, runs: int, tools=TOOLS, out: str | Path | None = None, jobs: int = 2,
                 time_budget: float | None = None, timeout: float = 20.0, runner_kind: str = "fork",
                 reduce_seconds: float = 20.0, reduce_total: float = 300.0, on_new_failure=None,
                 progress=None) -> Report:  # fmt: skip
    """``runs`` mutants per tool (fewer when ``time_budget`` seconds run out). New failure signatures
    are minimized (``reduce_seconds`` each, ``reduce_total`` in all, the most severe classes first),
    confirmed in a fresh process and written under ``out``."""
    start = time.monotonic()
    out = Path(out) if out else Path(tempfile.mkdtemp(prefix="mori-fuzz-out-"))
    out.mkdir(parents=True, exist_ok=True)
    # The runs' own cache, never the user's MORI_COMPILER_CACHE_DIR (fuzzed bundles must not land there); the
    # forked and fresh children inherit it from this process's environment, restored afterwards.
    with mock.patch.dict(os.environ, {"MORI_COMPILER_CACHE_DIR": str(out / "cache")}):
        generator = CaseGenerator(seed)
        runner = make_runner(runner_kind, jobs, timeout)
        reducer = make_runner(runner_kind, 1, timeout) if runner_kind == "subprocess" else runner
        report = Report()

        def cases():
            for index in range(runs):  # interleaved so that a time budget cuts every tool alike
                for tool in tools:
                    if time_budget is not None and time.monotonic() - start > time_budget:
                        return
                    yield generator.case(tool, index)

        new: list[Finding] = []
        done = 0
        for case, result in runner.run_many(cases()):
            verdict = classify(case, result)
            report.counts[tool_of(case)][verdict.outcome] += 1
            done += 1
            if progress and done % 100 == 0:
                progress(done, report)
            if verdict.failed:
                if verdict.signature in report.findings:
                    report.findings[verdict.signature].count += 1
                else:
                    report.findings[verdict.signature] = finding = Finding(verdict, case, result)
                    new.append(finding)
        # Reduce after the run (a fork runner runs one batch at a time).
        fresh = SubprocessRunner(1, max(timeout, 60.0))
        reduce_deadline = time.monotonic() + reduce_total
        for finding in sorted(new, key=lambda f: SEVERITY.index(f.verdict.outcome)):
            seconds = min(reduce_seconds, reduce_deadline - time.monotonic())
            if seconds > 0:
                finding.case = minimize(finding.case, finding.verdict, reducer, seconds)
                (_, finding.result), = reducer.run_many([finding.case])
            (_, result), = fresh.run_many([finding.case])
            fresh_verdict = classify(finding.case, result)
            finding.confirmed = fresh_verdict.signature == finding.verdict.signature
            finding.reproducer = write_reproducer(out, finding, (fresh_verdict, result))
            if on_new_failure:
                on_new_failure(finding)
        report.seconds = time.monotonic() - start
        (out / "summary.json").write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=True) + "\n")
        return report
