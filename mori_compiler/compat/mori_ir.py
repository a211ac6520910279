"""``mori.ir`` (and ``mori.ir.ops``, ``mori.ir.bitcode``): the device ABI table and the bitcode finder of
mori_compiler.lib_bitcode.

``find_bitcode`` / ``get_bitcode_path`` return the project's device library for the target (or
``MORI_SHMEM_BC``); ``MORI_DEVICE_FUNCTIONS``, ``SIGNAL_SET`` and ``SIGNAL_ADD`` are MORI's names and values.
``mori.ir.triton`` is mori_compiler.clients.triton (imported on first use: it imports Triton), ``mori.ir.flydsl``
mori_compiler.clients.flydsl.
"""

from __future__ import annotations

from mori_compiler.lib_bitcode import find_bitcode, get_bitcode_path
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, SIGNAL_ADD, SIGNAL_SET

__all__ = ["MORI_DEVICE_FUNCTIONS", "SIGNAL_ADD", "SIGNAL_SET", "find_bitcode", "get_bitcode_path"]
__mori_compiler_alias__ = True
__path__: list[str] = []  # mori.ir is a package in MORI


_SUBMODULES = ("ops", "bitcode", "triton", "flydsl")


def __getattr__(name: str):
    """``from mori.ir import triton`` (or ``flydsl``, ``ops``, ``bitcode``): this module's ``__name__`` is not
    ``mori.ir``, so Python's from-import would look for ``mori_compiler.compat.mori_ir.<name>``; the submodule
    is imported here under MORI's name instead."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"mori.ir.{name}")
    raise AttributeError(f"module 'mori.ir' has no attribute {name!r}")
