"""``import mori``: the package of mori_compiler's MORI-compatible modules (mori_compiler.compat).

Its submodules load on first access, as MORI's do (``mori.shmem`` imports the runtime only, ``mori.ops``
the EP operators). ``__version__`` is this project's, not MORI's.
"""

from __future__ import annotations

import importlib

from mori_compiler import __version__

__mori_compiler_alias__ = True  # how mori_compiler.compat tells this package from a real MORI
__path__: list[str] = []  # a package: its submodules come from mori_compiler.compat's finder only

_SUBMODULES = ("cpp", "io", "ir", "ops", "shmem")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"mori.{name}")
    raise AttributeError(f"module 'mori' (mori_compiler's MORI-compatible names) has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
