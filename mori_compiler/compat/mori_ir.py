"""``mori.ir`` (and ``mori.ir.ops``, ``mori.ir.bitcode``): the device ABI table and the bitcode finder of
mori_compiler.lib_bitcode.

``find_bitcode`` / ``get_bitcode_path`` return the project's device library for the target (or
``MORI_SHMEM_BC``); ``MORI_DEVICE_FUNCTIONS``, ``SIGNAL_SET`` and ``SIGNAL_ADD`` are MORI's names and values.
``mori.ir.triton`` and ``mori.ir.flydsl`` are not offered yet (mori_compiler.compat.NOT_OFFERED).
"""

from __future__ import annotations

from mori_compiler.lib_bitcode import find_bitcode, get_bitcode_path
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, SIGNAL_ADD, SIGNAL_SET

__all__ = ["MORI_DEVICE_FUNCTIONS", "SIGNAL_ADD", "SIGNAL_SET", "find_bitcode", "get_bitcode_path"]
__mori_compiler_alias__ = True
__path__: list[str] = []  # mori.ir is a package in MORI
