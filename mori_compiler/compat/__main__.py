"""``python -m mori_compiler.compat enable|disable|status [--site-dir DIR]``: MORI's module names on or off;
``python -m mori_compiler.compat run SCRIPT [ARGS...]`` / ``run -m MODULE [ARGS...]``: one program under them
without the set-up step (run.py).

``enable`` writes ``mori_compiler_compat.pth`` into the environment's site-packages (``--site-dir``: another
directory that ``site`` processes); at every start the interpreter then appends mori_compiler.compat's finder
to ``sys.meta_path``. It refuses when a real ``mori`` is importable (ours would never be used), when a
directory named ``mori`` shadows the names from here, and when the directory is not writable. ``disable`` removes the file; ``status`` says whether it is there and what
``import mori`` resolves to. Each is idempotent; exit 0, or 1 with one ``error:`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

from . import is_ours, other_mori

PTH_NAME = "mori_compiler_compat.pth"
# One line, run by site at start-up. Guarded, so that an uninstalled mori_compiler leaves no error behind.
PTH_LINE = ("import importlib.util as _u; _u.find_spec('mori_compiler') is not None and "
            "__import__('mori_compiler.compat').compat.install()\n")  # fmt: skip


class CompatError(Exception):
    pass


def default_site_dir() -> Path:
    """The running environment's site-packages (a venv's own, when run by its interpreter)."""
    return Path(sysconfig.get_paths()["purelib"])


def enable(site_dir: Path) -> str:
    other = other_mori()
    if other is not None and other.kind == "directory":
        raise CompatError(f"a directory named mori ({other.where}) is on the import path (a namespace package, such "
                          f"as a clone of MORI's sources in the current directory): `import mori` gives it here, "
                          f"not mori_compiler's names; run enable (and your scripts) from another directory, or take "
                          f"it off PYTHONPATH")  # fmt: skip
    if other is not None:
        raise CompatError(f"a real MORI is importable here ({other.where}): `import mori` gives it, and mori_compiler's "
                          f"names would never be used; uninstall it (pip uninstall amd-mori) to use "
                          f"mori_compiler under MORI's names")  # fmt: skip
    pth = site_dir / PTH_NAME
    if pth.is_file() and pth.read_text() == PTH_LINE:
        return f"already enabled: {pth}"
    if not site_dir.is_dir():
        raise CompatError(f"{site_dir} is not a directory (pass an existing site-packages with --site-dir)")
    if not os.access(site_dir, os.W_OK):
        raise CompatError(f"cannot write {pth}: {site_dir} is not writable (run as its owner, or activate a "
                          f"virtual environment you own)")  # fmt: skip
    try:
        tmp = pth.with_suffix(".pth.tmp")
        tmp.write_text(PTH_LINE)
        os.replace(tmp, pth)
    except OSError as exc:
        raise CompatError(f"cannot write {pth}: {exc.strerror or exc}") from None
    return f"enabled: {pth} (new interpreters of this environment import MORI's names from mori_compiler)"


def disable(site_dir: Path) -> str:
    pth = site_dir / PTH_NAME
    if not pth.exists():
        return f"not enabled (no {pth})"
    try:
        pth.unlink()
    except OSError as exc:
        raise CompatError(f"cannot remove {pth}: {exc.strerror or exc}") from None
    return f"disabled: removed {pth}"


def status(site_dir: Path) -> str:
    pth = site_dir / PTH_NAME
    lines = [f"set-up file: {pth} ({'present' if pth.is_file() else 'absent'})"]
    other = other_mori()
    if other is not None and other.kind == "directory":
        lines.append(f"import mori: a directory named mori at {other.where}, without __init__.py, shadows "
                     f"mori_compiler's names (run from another directory)")  # fmt: skip
    elif other is not None:
        lines.append(f"import mori: a real MORI at {other.where} (mori_compiler's names are not used)")
    elif pth.is_file() or is_ours(sys.modules.get("mori")):
        lines.append("import mori: mori_compiler's MORI-compatible names (mori_compiler.compat)")
    else:
        lines.append("import mori: ModuleNotFoundError (run `python -m mori_compiler.compat enable`)")
    return "\n".join(lines)


def _usage_error(message: str):
    print(f"error: {message} (usage: python -m mori_compiler.compat enable|disable|status [--site-dir DIR] | "
          "run SCRIPT [ARGS...] | run -m MODULE [ARGS...])",
          file=sys.stderr)  # fmt: skip
    sys.exit(1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "run":  # everything after `run` is the program's: no option of ours is parsed there
        from .run import RunError, run

        try:
            run(argv[1:])
        except RunError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    parser = argparse.ArgumentParser(prog="python -m mori_compiler.compat",
                                     description="MORI's module names (mori, mori.ops, mori.shmem, mori.ir, mori.io) "
                                                 "for mori_compiler, without shadowing a real MORI.")  # fmt: skip
    parser.error = _usage_error  # exit 1 with one error line, as every CLI of the project (2 is reserved)
    parser.add_argument("command", choices=("enable", "disable", "status"))
    parser.add_argument("--site-dir", type=Path, default=None,
                        help="the site-packages directory to use (default: this environment's)")  # fmt: skip
    args = parser.parse_args(argv)
    site_dir = args.site_dir if args.site_dir is not None else default_site_dir()
    try:
        print({"enable": enable, "disable": disable, "status": status}[args.command](site_dir))
    except CompatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
