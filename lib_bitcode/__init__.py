"""The device side of MORI's shmem ABI: the function table, the device state, and the project's library.

Mirrors ``mori.ir``: ``find_bitcode``, ``get_bitcode_path``, ``MORI_DEVICE_FUNCTIONS``, ``SIGNAL_SET`` and
``SIGNAL_ADD``. Importing this package imports only the standard library (the runtime layer uses
``state`` and ``kernel_abi`` on machines without llvmlite); building the library imports llvmlite lazily.

Two device libraries can be linked into a kernel:

* **the project's own** (default): an implementation of all 98 ABI functions for peer-to-peer peers, built
  per target from ``sources/`` at first use. Its state global ``mori_compiler_shmem_state`` is filled by
  ``mori_compiler.runtime`` after each code-object load (``state.py``).
* **MORI's** ``libmori_shmem_device.bc`` (``mori-compile --bitcode <path>``, ``CompileOptions(bitcode=)``, or
  ``MORI_SHMEM_BC=<path>``, which ``CompileOptions`` takes as its default): it adds RDMA/IBGDA and SDMA
  transports. It is checked against the compile options (triple, GPU, wave size, code object version: its
  ``amdhsa_code_object_version`` flag must equal ``--code-object-version``, 5 for a bitcode from
  ``find_bitcode(cov=5)``, 6 for ``cov=6``) and linked through a prepared copy that keeps its large,
  transport-switching functions out of line (``external.py``); beside it, on AMDGPU, the project links the
  lowering-support bitcode (the ockl work-item queries MLIR's ROCDL lowering calls; ``library.py``), so no
  ROCm install is needed. Its state global ``_ZN4mori5shmem15globalGpuStatesE`` stays exported (in the code
  object's dynamic symbol table): load such a code object with HIP's module API and call
  ``mori.shmem.shmem_module_init(hip_module)`` (it must return 0) after MORI's own shmem init, then launch
  (docs/device-abi.md §3.1 and §4.3).

Built bitcode files in the cache (the library, the lowering support, prepared copies) are verified on every use
and rebuilt when damaged (``cached.py``).
"""

from __future__ import annotations

import os

__all__ = ["MORI_DEVICE_FUNCTIONS", "SIGNAL_ADD", "SIGNAL_SET", "find_bitcode", "get_bitcode_path"]
_ABI_NAMES = ("MORI_DEVICE_FUNCTIONS", "SIGNAL_ADD", "SIGNAL_SET")


def __getattr__(name: str):
    """The ABI table is imported on first use: the runtime imports this package (``state``, ``kernel_abi``)
    on every warm start and needs no table."""
    if name in _ABI_NAMES:
        from . import abi

        return getattr(abi, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _default_target() -> str:
    from mori_compiler.targets import DEFAULT_TARGET

    archs = os.environ.get("MORI_GPU_ARCHS", "").replace(";", ",").split(",")
    return archs[0].strip() or DEFAULT_TARGET


def find_bitcode(cov: int | None = None, *, target: str | None = None) -> str:
    """Path of a device bitcode that implements MORI's ABI, as ``mori.ir.find_bitcode`` returns it.

    ``MORI_SHMEM_BC`` (a MORI bitcode) wins when set; otherwise the project's own library for ``target``
    (default: the first of ``MORI_GPU_ARCHS``, else gfx942), built and cached on first use. ``cov`` (5, 6
    or None) is accepted for parity: the project's library carries no code-object version of its own (the
    link step sets it), so any of them fits.
    """
    from mori_compiler.errors import MoriCompilerError

    if cov not in (None, 5, 6):
        raise MoriCompilerError(f"code object version {cov} is not supported; allowed: 5, 6")
    explicit = os.environ.get("MORI_SHMEM_BC")
    if explicit:
        if not os.path.isfile(explicit):
            raise FileNotFoundError(f"MORI_SHMEM_BC={explicit} does not exist")
        return explicit
    from .library import library_path

    return str(library_path(target or _default_target()))


get_bitcode_path = find_bitcode
