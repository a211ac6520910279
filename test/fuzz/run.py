"""Command line of the fuzzer: ``python test/fuzz/run.py --seed 1 --runs 1000 --out /tmp/fuzz``
(or ``PYTHONPATH=test python -m fuzz ...``). Prints a table of outcome counts per tool, writes
``summary.json`` and one reproducer folder per failure class under ``--out``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "fuzz"

from fuzz.campaign import TOOLS, run_campaign  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fuzz", description=__doc__)
    p.add_argument("--seed", type=int, default=0, help="campaign seed (mutant i of a tool is a function of it)")
    p.add_argument("--runs", type=int, default=200, help="mutants per tool (default 200)")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    p.add_argument("--out", default=None, help="folder for reproducers and summary.json (default: a new temporary one)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel")
    p.add_argument("--time-budget", type=float, default=None, help="stop generating mutants after S seconds")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a run counts as a hang")
    p.add_argument("--reduce-seconds", type=float, default=20.0, help="minimization budget per failure class")
    p.add_argument("--reduce-total", type=float, default=300.0, help="minimization budget in all")
    p.add_argument("--runner", choices=("fork", "subprocess"), default="fork",
                   help="fork server (fast) or a fresh interpreter per run")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    tools = tuple(t for t in args.tools.split(",") if t)
    unknown = set(tools) - set(TOOLS)
    if unknown:
        print(f"error: unknown tools {sorted(unknown)}; allowed: {', '.join(TOOLS)}", file=sys.stderr)
        return 1

    def progress(done, report):
        print(f"  {done} runs, {len(report.failures())} failure classes", file=sys.stderr, flush=True)

    def new_failure(finding):
        note = "" if finding.confirmed else "  (NOT reproduced in a fresh interpreter)"
        print(f"{finding.verdict.outcome:>10}  {finding.reproducer}{note}\n            {finding.verdict.reason[:200]}",
              flush=True)  # fmt: skip

    out = args.out or tempfile.mkdtemp(prefix=f"mori-fuzz-{args.seed}-")
    report = run_campaign(args.seed, args.runs, tools, out, args.jobs, args.time_budget, args.timeout,
                          args.runner, args.reduce_seconds, args.reduce_total, new_failure, progress)  # fmt: skip
    print(report.table())
    print(f"{sum(report.runs.values())} runs in {report.seconds:.0f} s; {len(report.failures())} failure classes; "
          f"summary in {os.path.join(out, 'summary.json')}")  # fmt: skip
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
