"""Run a CLI (`mori-opt` or `mori-compile`) on one input and capture exit status, signal and output.

Two runners with one interface, ``run_many(cases) -> iterator of (case, RunResult)``:

* ``ForkRunner`` imports the CLI modules (and MLIR, llvmlite) once, then ``os.fork()``s a child per
  case that calls ``entry(argv)`` with fds 0/1/2 redirected to files in the case's own work directory.
  A child costs a few milliseconds instead of the 0.3-0.5 s of a fresh interpreter importing MLIR, and
  an abort (SIGABRT from an MLIR assertion or nanobind), a segfault or a hang kills only the child.
* ``SubprocessRunner`` starts ``python -m mori_compiler.tools.<tool>`` per case: what a user gets. The
  tests check that both runners classify a sample alike, and reproducers are confirmed with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Iterable, Iterator

TOOL_MODULES = {"opt": "mori_compiler.tools.opt", "compile": "mori_compiler.tools.compile"}
TOOL_COMMANDS = {"opt": "mori-opt", "compile": "mori-compile"}
OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr kept per run


@dataclass
class Case:
    """One run: a tool, its arguments (file names relative to the run's work directory) and the files."""

    tool: str  # "opt" or "compile" (precompile runs are `compile --precompile`)
    argv: list[str]
    files: dict[str, bytes]
    stdin: bytes = b""
    label: str = ""  # what it came from: seed input and mutators, for the report
    meta: dict = field(default_factory=dict)

    def command_line(self) -> str:
        import shlex

        return " ".join([TOOL_COMMANDS[self.tool], *map(shlex.quote, self.argv)])

    def input_names(self) -> list[str]:
        """The names under which diagnostics may locate the input (the files given, or <stdin>)."""
        names = [a for a in self.argv if a in self.files]
        if "-" in self.argv:
            names.append("<stdin>")
        return names


@dataclass
class RunResult:
    exit_code: int | None  # None when killed by a signal or the timeout
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    seconds: float


def _prepare(case: Case, root: str, index: int) -> str:
    workdir = os.path.join(root, f"run{index}")
    os.makedirs(workdir)
    for name, data in case.files.items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path) or workdir, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    with open(os.path.join(workdir, ".stdin"), "wb") as f:
        f.write(case.stdin)
    return workdir


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(OUTPUT_LIMIT)
    except OSError:
        return b""


def _status(raw: int) -> tuple[int | None, int | None]:
    if os.WIFSIGNALED(raw):
        return None, os.WTERMSIG(raw)
    return os.WEXITSTATUS(raw), None


def _kill_group(pid: int) -> None:
    """Kill a child and what it started (ld.lld): each child leads its own process group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkRunner:
    """Fork a child per case from a parent that imported the CLIs once (see the module docstring)."""

    def __init__(self, jobs: int = 1, timeout: float = 20.0, warm_up: bool = True):
        self.jobs, self.timeout = max(1, jobs), timeout
        import importlib

        self.entries = {t: importlib.import_module(m).entry for t, m in TOOL_MODULES.items()}
        # The layers a run reaches, imported once so that a child does not pay for them.
        for module in ("mori_compiler._mlir", "mori_compiler.dialects.registry", "mori_compiler.pass_pipeline",
                       "mori_compiler.pipeline", "mori_compiler.cache", "mori_compiler.ops"):  # fmt: skip
            importlib.import_module(module)
        if warm_up:
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile the built-in example once per kind of target in a child: fills the on-disk device-library
        cache that every later child would otherwise rebuild. The parent itself never creates MLIR state:
        a context leaves a native thread behind (measured: 1 -> 2 threads after one mori-opt run), and a
        fork copies only the forking thread."""
        cases = [Case("compile", ["ring_put_signal", "--target", t, "-o", "out", "--no-report"], {})
                 for t in ("gfx942", "sm_90")]  # fmt: skip
        for _ in self.run_many(cases):
            pass

    def run_many(self, cases: Iterable[Case]) -> Iterator[tuple[Case, RunResult]]:
        root = tempfile.mkdtemp(prefix="mori-fuzz-")
        pending = iter(enumerate(cases))
        running: dict[int, tuple[Case, str, float]] = {}
        killed: set[int] = set()  # children past the timeout
        exhausted = False
        try:
            while running or not exhausted:
                while not exhausted and len(running) < self.jobs:
                    item = next(pending, None)
                    if item is None:
                        exhausted = True
                        break
                    index, case = item
                    workdir = _prepare(case, root, index)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        self._child(case, workdir)  # never returns
                    try:
                        os.setpgid(pid, pid)  # also done by the child: whichever runs first
                    except OSError:
                        pass
                    running[pid] = (case, workdir, time.monotonic())
                if not running:
                    break
                pid, raw = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    now = time.monotonic()
                    for p, (_, _, start) in running.items():
                        if p not in killed and now - start > self.timeout:
                            _kill_group(p)
                            killed.add(p)
                    time.sleep(0.002)
                    continue
                if pid not in running:
                    continue
                case, workdir, start = running.pop(pid)
                timed_out = pid in killed
                killed.discard(pid)
                code, sig = _status(raw)
                seconds = self.timeout if timed_out else time.monotonic() - start
                result = RunResult(None if timed_out else code, None if timed_out else sig, timed_out,
                                   _read(os.path.join(workdir, ".stdout")), _read(os.path.join(workdir, ".stderr")),
                                   seconds)  # fmt: skip
                shutil.rmtree(workdir, ignore_errors=True)
                yield case, result
        finally:
            for p in running:
                _kill_group(p)
                try:
                    os.waitpid(p, 0)
                except ChildProcessError:
                    pass
            shutil.rmtree(root, ignore_errors=True)

    def _child(self, case: Case, workdir: str) -> None:
        code = 1
        try:
            import faulthandler

            faulthandler.disable()  # pytest's would print the parent's stack on the terminal for an abort
            os.setpgid(0, 0)
            os.chdir(workdir)
            stdin = os.open(".stdin", os.O_RDONLY)
            out = os.open(".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            err = os.open(".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for fd, target in ((stdin, 0), (out, 1), (err, 2)):
                os.dup2(fd, target)
                os.close(fd)
            # Fresh text streams on fds 0-2 with the error handlers of a real interpreter's (pytest may
            # have replaced sys.stdout/sys.stderr by its capture objects).
            sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
            os.environ.pop("MORI_COMPILER_TRACEBACK", None)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                code = self.entries[case.tool](list(case.argv))
            except SystemExit as exc:  # argparse's --help, or sys.exit() inside the tool
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # what an interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
            code = 0 if code is None else code
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            try:
                traceback.print_exc()
                sys.stderr.flush()
            except BaseException:
                pass
        finally:
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


class SubprocessRunner:
    """A fresh interpreter per case (``python -m mori_compiler.tools.<tool>``), as a user runs the CLI."""

    def __init__(self, jobs: int = 1, timeout: float = 60.0, python: str = sys.executable):
        self.jobs, self.timeout, self.python = max(1, jobs), timeout, python

    def run_one(self, case: Case, root: str, index: int) -> RunResult:
        workdir = _prepare(case, root, index)
        env = {k: v for k, v in os.environ.items() if k != "MORI_COMPILER_TRACEBACK"}
        start = time.monotonic()
        try:
            proc = subprocess.run([self.python, "-m", TOOL_MODULES[case.tool], *case.argv], cwd=workdir,
                                  input=case.stdin, capture_output=True, timeout=self.timeout, env=env)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            return RunResult(None, None, True, (exc.stdout or b"")[:OUTPUT_LIMIT], (exc.stderr or b"")[:OUTPUT_LIMIT],
                             self.timeout)  # fmt: skip
        finally:
            seconds = time.monotonic() - start
        code, sig = (proc.returncode, None) if proc.returncode >= 0 else (None, -proc.returncode)
        return RunResult(code, sig, False, proc.stdout[:OUTPUT_LIMIT], proc.stderr[:OUTPUT_LIMIT], seconds)

    def run_many(self, cases: Iterable[Case]) -> Iterator[tuple[Case, RunResult]]:
        from concurrent.futures import ThreadPoolExecutor

        root = tempfile.mkdtemp(prefix="mori-fuzz-sub-")
        try:
            cases = list(cases)
            with ThreadPoolExecutor(self.jobs) as pool:
                results = pool.map(lambda ic: self.run_one(ic[1], root, ic[0]), enumerate(cases))
                yield from zip(cases, results)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def make_runner(kind: str, jobs: int, timeout: float):
    if kind == "fork":
        return ForkRunner(jobs, timeout)
    if kind == "subprocess":
        return SubprocessRunner(jobs, timeout)
    raise ValueError(f"unknown runner {kind!r}; allowed: fork, subprocess")
