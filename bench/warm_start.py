"""Warm start: how long a new process takes to get the EP op's kernel bundle when it is already cached.

Two paths, each measured in N fresh processes per version, interleaved (this checkout, the base checkout,
this checkout, ...), every process timing itself from just before its first ``mori_compiler`` import to
holding the ``Bundle`` (interpreter start excluded; torch is not imported: ``ep_bundle`` does not need it):

* **op path**: ``ep_bundle(config, target, virtual_pes=True)`` on a machine with the compiler, i.e. what
  ``EpDispatchCombineOp`` does at construction: compute the bundle key, find and verify the bundle;
* **runtime path**: the same call on a GPU machine that has only the runtime (no MLIR, no llvmlite): there
  ``compiler_available()`` is false and ``get_bundle`` looks the bundle up through the index
  (``<cache>/index/<request>``) written when it was compiled. Simulated by making ``mlir`` and
  ``llvmlite`` unimportable in the child (``sys.modules[name] = None``), which is exactly what such a
  machine sees, for both versions alike.

Each version uses its own cache directory, filled by that version (one cold compile, not timed). Bytecode
lives in a private ``PYTHONPYCACHEPREFIX`` per mode and version, filled by untimed runs (neither checkout is
touched, and stray ``__pycache__`` folders in them are never read): ``cached`` is the normal case of an
installed package (every module has its ``.pyc``); ``none`` drops the project's own ``.pyc`` files, so its
modules are compiled from source at every import while the standard library and the venv's packages keep
theirs, as in an environment with ``PYTHONDONTWRITEBYTECODE=1`` (this sandbox's default); ``both``
measures the two.

    .venv/bin/python bench/warm_start.py [--runs 10] [--targets gfx942,sm_90] [--base /work/base] [--bytecode both]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CONFIG = dict(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0, scale_type_size=0,
              max_token_type_size=2, max_num_inp_token_per_rank=128, num_experts_per_rank=32,
              num_experts_per_token=8)  # fmt: skip

# Runs in the child: argv[1] = JSON {"target", "config", "runtime_only"}; prints one JSON line.
CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
if args["runtime_only"]:  # a GPU machine without the compiler: neither package can be imported
    sys.modules["mlir"] = None
    sys.modules["llvmlite"] = None
t0, c0 = time.perf_counter(), time.process_time()
from mori_compiler.ops import EpDispatchCombineConfig, ep_bundle
bundle = ep_bundle(EpDispatchCombineConfig(**args["config"]), args["target"], virtual_pes=True)
t1, c1 = time.perf_counter(), time.process_time()
tops = {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
heavy = sorted(tops & {"mlir", "llvmlite", "numpy"})
print(json.dumps({"ms": (t1 - t0) * 1e3, "cpu_ms": (c1 - c0) * 1e3, "key": bundle.key,
                  "kernels": len(bundle.kernels), "heavy": heavy}))
"""


def run_child(python: str, env: dict, target: str, runtime_only: bool, cwd: str) -> dict:
    arg = json.dumps({"target": target, "config": CONFIG, "runtime_only": runtime_only})
    proc = subprocess.run([python, "-c", CHILD, arg], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"error: child failed ({python}, runtime_only={runtime_only}):\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The project's source folders (pyproject.toml package-dir): in bytecode mode "none" these are compiled at
# every import, while the standard library and the venv's packages keep their bytecode.
PROJECT_DIRS = ("mori_compiler", "runtime", "passes", "dialects", "lib_bitcode")


def child_env(cache: Path, pycache: Path, *, write_bytecode: bool) -> dict:
    """The environment of a child: its cache, and bytecode only from (and, when asked, into) ``pycache``
    (PYTHONPYCACHEPREFIX), so that stray ``__pycache__`` folders in a checkout are never read."""
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(cache), PYTHONPYCACHEPREFIX=str(pycache))
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def prepare_bytecode(python: str, cache: Path, pycache: Path, root: Path, targets, cwd: str, mode: str) -> None:
    """Fill ``pycache`` by untimed runs of both paths; for mode "none", then drop the project's own bytecode."""
    for target in targets:
        for runtime_only in (False, True):
            run_child(python, child_env(cache, pycache, write_bytecode=True), target, runtime_only, cwd)
    if mode == "none":
        for folder in PROJECT_DIRS:
            shutil.rmtree(pycache / root.relative_to(root.anchor) / folder, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per path, target and version (>= 10)")
    parser.add_argument("--targets", default="gfx942,sm_90", help="comma-separated (gfx942, gfx950, gfx1250, sm_90)")
    parser.add_argument("--base", default="/work/base", help="checkout to compare with (its own .venv)")
    parser.add_argument("--bytecode", default="both", choices=("cached", "none", "both"))
    parser.add_argument("--work-dir", help="where the caches go (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be >= 10")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - {"gfx942", "gfx950", "gfx1250", "sm_90"})
    if unknown or not targets:
        parser.error(f"--targets: unknown {', '.join(unknown) or 'nothing given'}")
    versions = {"this": HERE}
    base = Path(args.base)
    if (base / ".venv" / "bin" / "python").is_file():
        versions["base"] = base
    else:
        print(f"note: no {base}/.venv/bin/python: measuring this checkout only", file=sys.stderr)
    modes = ("cached", "none") if args.bytecode == "both" else (args.bytecode,)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="warm-start-"))
    work.mkdir(parents=True, exist_ok=True)
    cwd = str(work)  # neutral: the children import the package installed in each venv
    pythons = {name: str(root / ".venv" / "bin" / "python") for name, root in versions.items()}
    caches = {name: work / f"cache-{name}" for name in versions}
    for name in versions:  # fill each cache with that version's bundles (cold compiles, not timed)
        for target in targets:
            first = run_child(pythons[name], child_env(caches[name], work / "pyc-build", write_bytecode=True), target,
                              False, cwd)  # fmt: skip
            print(f"{name} ({versions[name]}): {target} bundle {first['key'][:12]}, {first['kernels']} kernels",
                  file=sys.stderr)  # fmt: skip
    pycaches = {(mode, name): work / f"pyc-{mode}-{name}" for mode in modes for name in versions}
    for (mode, name), pycache in pycaches.items():
        prepare_bytecode(pythons[name], caches[name], pycache, versions[name], targets, cwd, mode)

    paths = {"op": False, "runtime": True}
    wall: dict[tuple, list[float]] = {}
    cpu: dict[tuple, list[float]] = {}
    heavy: dict[tuple, set] = {}
    for mode in modes:
        for _ in range(args.runs):  # interleaved: this, base, this, base, ...
            for target in targets:
                for path, runtime_only in paths.items():
                    for name in versions:
                        env = child_env(caches[name], pycaches[(mode, name)], write_bytecode=False)
                        r = run_child(pythons[name], env, target, runtime_only, cwd)
                        row = (mode, target, path, name)
                        wall.setdefault(row, []).append(r["ms"])
                        cpu.setdefault(row, []).append(r["cpu_ms"])
                        heavy.setdefault(row, set()).update(r["heavy"])

    print(f"warm start of ep_bundle(target, virtual_pes=True), IntraNode bf16 config, {args.runs} fresh processes "
          f"each: ms from the first mori_compiler import to the Bundle; wall clock median (min-max) and the "
          f"process's CPU time (median)")  # fmt: skip
    header = " ".join(f"{name + ' wall':>20} {name + ' cpu':>9}" for name in versions)
    ratio_header = "  wall ratio  cpu ratio" if "base" in versions else ""
    print(f"{'bytecode':8} {'target':7} {'path':7} {header}{ratio_header}  heavy imports (this)")
    for mode in modes:
        for target in targets:
            for path in paths:
                cells, med_wall, med_cpu = [], {}, {}
                for name in versions:
                    xs = wall[(mode, target, path, name)]
                    med_wall[name] = statistics.median(xs)
                    med_cpu[name] = statistics.median(cpu[(mode, target, path, name)])
                    spread = f"{med_wall[name]:.1f} ({min(xs):.1f}-{max(xs):.1f})"
                    cells.append(f"{spread:>20} {med_cpu[name]:9.1f}")
                ratios = ""
                if "base" in versions:
                    ratios = (f"  {med_wall['this'] / med_wall['base']:9.2f}x "
                              f"{med_cpu['this'] / med_cpu['base']:9.2f}x")  # fmt: skip
                loaded = ", ".join(sorted(heavy[(mode, target, path, "this")])) or "none"
                print(f"{mode:8} {target:7} {path:7} " + " ".join(cells) + ratios + f"  {loaded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
