"""``python -m mori_compiler.compat run SCRIPT [ARGS...]`` (or ``run -m MODULE [ARGS...]``): one program under
MORI's names, without the set-up step's ``.pth`` file.

The finder is installed in this process, and a boot directory (a temporary directory holding one
``sitecustomize.py``, removed when the program ends) goes first on ``PYTHONPATH`` so that every Python process
the program starts (``torch.multiprocessing.spawn``'s children, ``multiprocessing`` with the spawn method,
``subprocess`` of ``sys.executable``) installs it too; that ``sitecustomize`` then runs the environment's own,
if there is one (_boot.py). ``-m pytest`` runs MORI's pytest files; ``torchrun
-m mori_compiler.compat run SCRIPT`` runs a torchrun script (torchrun starts one process per rank, each
running this). As ``enable``, it refuses when ``import mori`` would give a real MORI or a directory named
``mori`` (ours would never be used).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

from . import install, other_mori
from ._boot import SITECUSTOMIZE

USAGE = "python -m mori_compiler.compat run SCRIPT [ARGS...] | run -m MODULE [ARGS...]"


class RunError(Exception):
    pass


def parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind "script" or "module", the script path or module name, its arguments) of ``run``'s arguments."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise RunError(f"run needs a script or -m MODULE (usage: {USAGE})")
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1] or argv[1].startswith("-"):
            raise RunError(f"-m needs a module name (usage: {USAGE})")
        return "module", argv[1], argv[2:]
    if argv[0].startswith("-"):
        raise RunError(f"unknown option {argv[0]!r} before the script (usage: {USAGE})")
    script = Path(argv[0])
    if not script.exists():
        raise RunError(f"{argv[0]}: no such file (usage: {USAGE})")
    if not script.is_file():
        raise RunError(f"{argv[0]}: not a file (run takes a script file, or -m MODULE; usage: {USAGE})")
    return "script", argv[0], argv[1:]


def make_boot_dir() -> str:
    """A new directory holding the boot ``sitecustomize.py``, removed when this process exits."""
    boot = tempfile.mkdtemp(prefix="mori_compiler_compat_run_")
    Path(boot, "sitecustomize.py").write_text(SITECUSTOMIZE)
    atexit.register(shutil.rmtree, boot, ignore_errors=True)
    return boot


def child_environment(env: dict[str, str], boot: str) -> dict[str, str]:
    """``env`` with ``boot`` first on PYTHONPATH."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join([boot, *parts])}


def check_no_other_mori() -> None:
    other = other_mori()
    if other is not None and other.kind == "directory":
        raise RunError(f"a directory named mori ({other.where}) is on the import path: `import mori` would give it, "
                       f"not mori_compiler's names; run from another directory")  # fmt: skip
    if other is not None:
        raise RunError(f"a real MORI is importable here ({other.where}): `import mori` gives it, and mori_compiler's "
                       f"names would not be used (pip uninstall amd-mori, or run the script as it is)")  # fmt: skip


def run(argv: list[str]) -> None:
    """Run the program as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would, with MORI's names. Its
    ``SystemExit`` and exceptions propagate (the program's own traceback is the program's business)."""
    kind, target, args = parse(argv)
    check_no_other_mori()
    os.environ.update(child_environment(dict(os.environ), make_boot_dir()))
    install()
    if kind == "script":
        sys.argv = [target, *args]
        sys.path[0] = str(Path(target).resolve().parent)  # what `python SCRIPT` puts first
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv = [target, *args]  # run_module replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()  # what `python -m MODULE` puts first
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):  # a parent package that does not exist, or a bad name
            found = False
        if not found:
            raise RunError(f"no module named {target!r} (from {os.getcwd()}; usage: {USAGE})")
        runpy.run_module(target, run_name="__main__", alter_sys=True)
