"""MORI's module names (``mori``, ``mori.ops``, ``mori.shmem``, ``mori.ir``, ``mori.io``; from ``mori.cpp``
the names clients import from it directly) for this project.

A MORI script runs unchanged once the finder below is installed: ``python -m mori_compiler.compat enable``
writes a ``.pth`` file into the environment's site-packages that installs it at every interpreter start
(``disable`` removes it, ``status`` says what ``import mori`` resolves to); ``python -m mori_compiler.compat run
SCRIPT`` runs one program (and the Python processes it starts) with it, writing nothing (run.py).
docs/mori-compat.md is the guide.

It never shadows a real MORI: the finder sits at the *end* of ``sys.meta_path``, so it is asked for ``mori``
only after every finder before it (the path finder above all) found none; before it serves ``mori`` it asks
every finder appended after it (another ``.pth``, an import hook installed later) and the path finder, and
steps aside if any finds one; it serves ``mori.*`` submodules only while the loaded ``mori`` is ours.
``enable`` refuses when a real ``mori`` is importable, and ``status`` names it.

Each MORI name maps to a thin alias module of this package (``MODULE_MAP``), which re-exports the
project's implementation under MORI's names and raises a clear error for what it does not offer. Importing
this package imports only the standard library (the ``.pth`` imports it in every process of the
environment); ``mori.shmem`` imports the runtime only (no MLIR, no llvmlite).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import threading
from collections import namedtuple

# The finder and loader implement the import protocols (find_spec; create_module/exec_module) without
# subclassing importlib.abc: that import costs importlib.resources, in every process of an enabled environment.

__all__ = ["MODULE_MAP", "NOT_OFFERED", "MoriAliasFinder", "OtherMori", "install", "installed", "is_ours",
           "other_mori"]

_HERE = __name__  # mori_compiler.compat

#: MORI module name -> the alias module of this package that stands for it. MORI's submodules whose names
#: scripts import directly (``mori.shmem.api``, ``mori.ops.dispatch_combine``...) share their package's alias.
MODULE_MAP = {
    "mori": f"{_HERE}.mori_root",
    "mori.ops": f"{_HERE}.mori_ops",
    "mori.ops.dispatch_combine": f"{_HERE}.mori_ops",
    "mori.ops.local_expert_count": f"{_HERE}.mori_ops",
    "mori.shmem": f"{_HERE}.mori_shmem",
    "mori.shmem.api": f"{_HERE}.mori_shmem",
    "mori.shmem.tensor_utils": f"{_HERE}.mori_shmem",
    "mori.ir": f"{_HERE}.mori_ir",
    "mori.ir.ops": f"{_HERE}.mori_ir",
    "mori.ir.bitcode": f"{_HERE}.mori_ir",
    "mori.ir.triton": "mori_compiler.clients.triton",  # imports Triton on first use
    "mori.ir.triton.ops": "mori_compiler.clients.triton_ops",
    "mori.ir.triton.runtime": "mori_compiler.clients.triton_runtime",
    "mori.ir.flydsl": "mori_compiler.clients.flydsl",  # imports FlyDSL on first use of a device function
    "mori.ir.flydsl.ops": "mori_compiler.clients.flydsl",
    "mori.ir.flydsl.runtime": "mori_compiler.clients.flydsl",
    "mori.io": f"{_HERE}.mori_io",
    "mori.io.engine": f"{_HERE}.mori_io",
    "mori.cpp": f"{_HERE}.mori_cpp",  # only the names clients import from MORI's C++ extension directly
}

#: MORI modules this project does not offer (yet), with the reason an import of them reports.
NOT_OFFERED = {
    "mori.ir.triton.cco": "MORI's CCO device API (LSA/SDMA/GDA communicators and windows) needs MORI's CCO runtime, "
                          "which mori_compiler does not have; use mori.ir.triton's shmem device functions",
    "mori.jit": "there is no JIT of MORI's HIP sources: kernels are compiled from MLIR by mori_compiler",
}


def _refusal(fullname: str) -> str | None:
    for name, why in NOT_OFFERED.items():
        if fullname == name or fullname.startswith(name + "."):
            return f"{fullname}: {why} (mori_compiler's MORI-compatible names: {', '.join(sorted(_MODULES))})"
    return None


_PACKAGES = {"mori", "mori.ops", "mori.shmem", "mori.ir", "mori.ir.triton", "mori.ir.flydsl", "mori.io"}
_MODULES = _PACKAGES | {"mori.cpp"}


class _AliasLoader:
    """Loads a MORI name as the (already importable) alias module that stands for it: both names are then
    the same module object, so state (shmem's, the op cache's) exists once."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # executed when it was imported under its own name


_ASKING = threading.local()  # set while this thread asks the other finders for ``mori``


def _spec_elsewhere(finders) -> object | None:
    """The first spec for ``mori`` that one of ``finders`` (ours skipped) gives, or None."""
    for finder in finders:
        if isinstance(finder, MoriAliasFinder) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("mori", None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


class MoriAliasFinder:
    """Serves MODULE_MAP's names, and refuses NOT_OFFERED's, when no other finder has a real ``mori``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "mori" and not fullname.startswith("mori."):
            return None
        if fullname == "mori" and self._mori_found_elsewhere():
            return None
        if fullname != "mori" and not is_ours(sys.modules.get("mori")):
            return None  # a real MORI is loaded: its own submodules (or their absence) are its business
        alias = MODULE_MAP.get(fullname)
        if alias is None:
            reason = _refusal(fullname) or (f"{fullname} is not one of mori_compiler's MORI-compatible modules "
                                            f"({', '.join(sorted(_MODULES))}); docs/mori-compat.md lists them")
            raise ModuleNotFoundError(reason, name=fullname)
        is_package = fullname in _PACKAGES
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(alias), is_package=is_package)

    def _mori_found_elsewhere(self) -> bool:
        """Whether a finder after this one in ``sys.meta_path`` (one appended after start-up), or the path finder,
        finds a ``mori``. A finder that asks the import system in turn re-enters here and is answered None."""
        if getattr(_ASKING, "active", False):
            return True  # asked again while asking the others: not ours to serve
        meta = list(sys.meta_path)
        later = meta[meta.index(self) + 1 :] if self in meta else []
        _ASKING.active = True
        try:
            return _spec_elsewhere([*later, importlib.machinery.PathFinder]) is not None
        finally:
            _ASKING.active = False


def is_ours(module) -> bool:
    """Whether ``module`` (a loaded ``mori``) is this project's alias rather than MORI."""
    return module is not None and getattr(module, "__mori_compiler_alias__", False) is True


def installed() -> bool:
    return any(isinstance(f, MoriAliasFinder) for f in sys.meta_path)


def install() -> None:
    """Append the finder to ``sys.meta_path`` (idempotent). What the ``.pth`` file runs at start-up."""
    if not installed():
        sys.meta_path.append(MoriAliasFinder())


#: What ``import mori`` gives instead of mori_compiler's names: ``kind`` "package" (a real MORI; ``where`` its
#: ``__init__.py``) or "directory" (directories named ``mori`` without ``__init__.py``, which Python imports as
#: a namespace package: a clone of MORI's sources in the current directory, say; ``where`` lists them).
#: (A collections namedtuple: typing is not imported at start-up.)
OtherMori = namedtuple("OtherMori", "kind where")


def other_mori() -> OtherMori | None:
    """What a finder other than ours gives for ``mori`` (or the ``mori`` already loaded, if not ours), or None."""
    loaded = sys.modules.get("mori")
    if loaded is not None and not is_ours(loaded):
        if getattr(loaded, "__file__", None):
            return OtherMori("package", loaded.__file__)
        locations = list(getattr(loaded, "__path__", None) or [])
        return OtherMori("directory", ", ".join(locations)) if locations else OtherMori("package", repr(loaded))
    spec = _spec_elsewhere(sys.meta_path)
    if spec is None:
        return None
    if spec.origin not in (None, "namespace"):
        return OtherMori("package", spec.origin)
    locations = list(spec.submodule_search_locations or [])
    return OtherMori("directory", ", ".join(locations) or repr(spec))
