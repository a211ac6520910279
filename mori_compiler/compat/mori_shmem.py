"""``mori.shmem`` (and ``mori.shmem.api``, ``mori.shmem.tensor_utils``): the runtime's MORI-compatible shmem
API, mori_compiler.runtime.shmem.

Imports the runtime only: no MLIR, no llvmlite (GPU machines need neither). What MORI offers and the runtime
does not (``shmem_mpi_init``, ``shmem_barrier_on_stream``, allocation flags) raises NotImplementedError
naming what to use instead.
"""

from __future__ import annotations

from mori_compiler.runtime.shmem import *  # noqa: F401,F403 - the alias re-exports the runtime's API
from mori_compiler.runtime.shmem import __all__  # noqa: F401

__mori_compiler_alias__ = True
__path__: list[str] = []  # mori.shmem is a package in MORI (mori.shmem.api, mori.shmem.tensor_utils)
