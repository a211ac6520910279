"""Run MORI's own example scripts and tests through mori_compiler's MORI-compatible names.

    python test/mori_upstream/run.py --mori-src DIR [--gpu] [--out LOG] [--timeout S] [--python PY]

``DIR`` is a copy of (part of) MORI's repository (``tests/python/...``, ``examples/...``; never part of this
repository). Each entry of ``SCRIPTS`` says how MORI runs the file (pytest from the repository root, a script,
torchrun) and what it needs; the driver runs those this machine can run through ``python -m mori_compiler.compat
run`` with a timeout, and reports ``pass`` / ``fail`` / ``skip`` with the reason per entry. Before that, for
every file present, ``names`` checks that each ``mori`` name the file uses (its imports and ``mori.x.y``
attribute chains, read with ``ast``) resolves under our names, so files that need more GPUs than the machine
has are still held to the API (and each call of a mori name, ``IOEngine(key=..., config=...)``, binds to our
signature). Exit 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

RUN = ["-m", "mori_compiler.compat", "run"]


@dataclasses.dataclass(frozen=True)
class Script:
    """One upstream file (or a pytest selection of it) and how to run it."""

    name: str  # what the report calls it
    path: str  # relative to --mori-src
    launch: str  # "pytest" (from the repository root, as MORI's CI), "script", "torchrun1" (torchrun, one rank)
    needs: str  # "cpu", "gpu" (one), or why it cannot run on one GPU / here
    select: tuple[str, ...] = ()  # pytest arguments after the path (-k EXPR, --noconftest)
    env: tuple[tuple[str, str], ...] = ()  # environment it runs with


SCRIPTS = (
    Script("io/test_engine_tcp", "tests/python/io/test_engine_tcp.py", "pytest", "cpu"),
    Script("io/test_engine::test_engine_desc", "tests/python/io/test_engine.py", "pytest", "cpu",
           ("-k", "test_engine_desc")),
    Script("io/test_engine::test_mem_desc", "tests/python/io/test_engine.py", "pytest", "gpu",
           ("-k", "test_mem_desc")),
    Script("io/test_engine::rdma_ops", "tests/python/io/test_engine.py", "pytest",
           "2 GPUs: the engine pair registers tensors on cuda:0 and cuda:1", ("-k", "rdma or out_of_range")),
    # ops/conftest.py imports dispatch_combine_test_utils (not fetched: 33 kB, and it needs a newer utils.py) for
    # its 8-rank worker pool, which this file does not use; what else it does (MORI_SHMEM_HEAP_SIZE=32G) is
    # given here instead.
    Script("ops/test_local_expert_count", "tests/python/ops/test_local_expert_count.py", "pytest", "gpu",
           ("--noconftest",), (("MORI_SHMEM_HEAP_SIZE", "32G"),)),
    Script("examples/shmem/ir/test_triton_shmem (1 rank)", "examples/shmem/ir/test_triton_shmem.py", "torchrun1",
           "gpu"),
    Script("shmem/test_api", "tests/python/shmem/test_api.py", "pytest",
           "8 GPUs: world_size 8, one GPU per rank (torch.cuda.set_device(rank), NCCL)"),
    Script("ops/test_dispatch_combine", "tests/python/ops/test_dispatch_combine.py", "pytest",
           "8 GPUs: world_size 8, one GPU per rank (TorchDistProcessManager); also the pytest-assume plugin"),
    Script("examples/shmem/shmem_python_api", "examples/shmem/shmem_python_api.py", "script",
           "2 nodes x 4 GPUs (RANK from the launcher, torch.cuda.set_device(local_rank))"),
    Script("examples/io/example", "examples/io/example.py", "script",
           "2 GPUs: tensors on cuda:0 and cuda:1 (and fixed ports 8080/8081)"),
)


def mori_names(source: str) -> set[str]:
    """The dotted ``mori`` names ``source`` uses: modules it imports, names it imports from them, and the
    ``mori.a.b`` attribute chains (the last part may be a module attribute or a submodule)."""
    tree = ast.parse(source)
    names: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> the mori name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "mori" or alias.name.startswith("mori."):
                    names.add(alias.name)
                    aliases[alias.asname or "mori"] = alias.name if alias.asname else "mori"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "mori" or node.module.startswith("mori.")):  # fmt: skip
            names.add(node.module)
            for alias in node.names:
                if alias.name != "*":
                    names.add(f"{node.module}.{alias.name}")
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):  # every chain and its prefixes: each must resolve
            parts = []
            cur = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases and aliases[cur.id].split(".")[0] == "mori":
                names.add(".".join([aliases[cur.id], *reversed(parts)]))
    return names


def mori_calls(source: str) -> set[tuple[str, int, tuple[str, ...]]]:
    """(mori name, number of positional arguments, keyword names) of every call of a mori name in
    ``source`` (``mori.shmem.shmem_init_attr(a, b, c, d)``, ``IOEngine(key=..., config=...)``); calls with
    ``*args`` / ``**kwargs`` are left out (their arity is not known)."""
    tree = ast.parse(source)
    names = mori_names(source)
    aliases = _aliases(tree)
    calls = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name is None or name not in names:
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        calls.add((name, len(node.args), tuple(sorted(k.arg for k in node.keywords))))
    return calls


def _aliases(tree) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "mori" or alias.name.startswith("mori."):
                    aliases[alias.asname or "mori"] = alias.name if alias.asname else "mori"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "mori" or node.module.startswith("mori.")):  # fmt: skip
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(node, aliases) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


_RESOLVE = r"""
import importlib, json, sys
import mori_compiler.compat as c
c.install()
result = {}
for name in json.loads(sys.argv[1]):
    parts = name.split(".")
    obj, err, import_err = None, None, None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError as exc:
            if import_err is None or "No module named" in import_err:
                import_err = f"{type(exc).__name__}: {exc}"  # a submodule's own refusal says the most
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            err = None
        except AttributeError as exc:
            err = import_err or f"AttributeError: {exc}"
        break
    result[name] = err
import inspect
calls = {}
for name, nargs, kwargs in json.loads(sys.argv[2]):
    if result.get(name):
        continue  # the name itself does not resolve: reported above
    obj = importlib.import_module(name.split(".")[0])
    try:
        for part in name.split(".")[1:]:
            obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(f"{obj.__name__}.{part}")
        signature = inspect.signature(obj)
    except (TypeError, ValueError, ImportError, AttributeError):
        continue  # no signature to hold the call to (a builtin, an enum member)
    try:
        signature.bind(*[None] * nargs, **{k: None for k in kwargs})
    except TypeError as exc:
        calls[f"{name}({nargs} positional{''.join(', ' + k + '=' for k in kwargs)})"] = f"TypeError: {exc}"
print(json.dumps([result, calls]))
"""


def check_names(python: str, path: Path) -> tuple[str, str]:
    """("pass" or "fail", detail) of resolving every mori name ``path`` uses under our names, and binding
    each call of one (its positional count and keyword names) to our signature, in a subprocess with the
    finder installed; "skip" when this Python cannot parse the file."""
    try:
        names = sorted(mori_names(path.read_text()))
    except SyntaxError as exc:
        return "skip", f"this Python ({sys.version.split()[0]}) cannot parse it: {exc.msg} at line {exc.lineno}"
    calls = sorted(mori_calls(path.read_text()))
    proc = subprocess.run([python, "-c", _RESOLVE, json.dumps(names), json.dumps(calls)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        return "fail", proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    resolved, bad_calls = json.loads(proc.stdout)
    problems = {n: e for n, e in resolved.items() if e} | bad_calls
    if problems:
        return "fail", "; ".join(f"{n} ({e})" for n, e in problems.items())
    return "pass", f"{len(names)} names resolve, {len(calls)} calls bind: {', '.join(names)}"


def command(python: str, script: Script) -> list[str]:
    if script.launch == "pytest":
        return [python, *RUN, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", script.path, *script.select]
    if script.launch == "script":
        return [python, *RUN, script.path]
    if script.launch == "torchrun1":
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *RUN, script.path]
    raise ValueError(f"unknown launch {script.launch!r}")


def run_one(python: str, src: Path, script: Script, gpu: bool, timeout: float, log) -> tuple[str, str]:
    if not (src / script.path).is_file():
        return "skip", f"not in {src}"
    if script.needs not in ("cpu", "gpu"):
        return "skip", f"needs {script.needs}"
    if script.needs == "gpu" and not gpu:
        return "skip", "needs a GPU (run with --gpu on a GPU machine)"
    argv = command(python, script)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **dict(script.env)})  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write(f"\n===== {script.name}: TIMEOUT after {timeout:g}s\n$ {' '.join(argv)}\n{out}\n")
        return "fail", f"timed out after {timeout:g} s"
    took = time.monotonic() - start
    log.write(f"\n===== {script.name}: exit {proc.returncode} in {took:.1f}s\n$ {' '.join(argv)}\n"
              f"{proc.stdout}\n{proc.stderr}\n")  # fmt: skip
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode == 0:
        if script.launch == "pytest" and " passed" not in tail:
            return "fail", f"pytest ran no test to pass: {tail}"
        return "pass", f"{tail} ({took:.1f} s)".strip()
    err = (proc.stderr.strip().splitlines() or [""])[-1]
    return "fail", f"exit {proc.returncode}: {tail if script.launch == 'pytest' else err}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mori-src", type=Path, required=True, help="a copy of MORI's repository (or part of it)")
    parser.add_argument("--gpu", action="store_true", help="also run what needs one GPU")
    parser.add_argument("--out", type=Path, help="write every run's full output here")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run (default 120)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with mori_compiler installed")
    parser.add_argument("--only", action="append", default=[], help="run only entries whose name contains this")
    args = parser.parse_args(argv)
    src = args.mori_src.resolve()
    if not src.is_dir():
        print(f"error: --mori-src {args.mori_src}: not a directory", file=sys.stderr)
        return 1
    if args.gpu and shutil.which("nvidia-smi") is None and shutil.which("rocm-smi") is None:
        print("note: --gpu given, but neither nvidia-smi nor rocm-smi is on PATH", file=sys.stderr)
    try:
        log = open(args.out, "w") if args.out else open(os.devnull, "w")
    except OSError as exc:
        print(f"error: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 1
    rows = []
    with log:
        for path in sorted({s.path for s in SCRIPTS}):
            if args.only and not any(o in script.name for script in SCRIPTS if script.path == path for o in args.only):
                continue
            if (src / path).is_file():
                rows.append((f"names {path}", *check_names(args.python, src / path)))
        for script in SCRIPTS:
            if args.only and not any(o in script.name for o in args.only):
                continue
            rows.append((script.name, *run_one(args.python, src, script, args.gpu, args.timeout, log)))
        for name, outcome, detail in rows:
            log.write(f"{outcome:4}  {name}: {detail}\n")
    width = max(len(r[0]) for r in rows) if rows else 0
    for name, outcome, detail in rows:
        print(f"{outcome:4}  {name:{width}}  {detail}")
    counts = {k: sum(1 for r in rows if r[1] == k) for k in ("pass", "fail", "skip")}
    print(f"summary: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip")
    if not counts["pass"] and not counts["fail"]:
        print(f"error: nothing ran: none of MORI's files this driver knows is under {src}", file=sys.stderr)
        return 1
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
