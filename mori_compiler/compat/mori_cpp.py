"""``mori.cpp``: the names of MORI's C++ extension that Python clients import from it directly.

MORI-IO's types (``TransferStatus``, which KV-transfer connectors take from ``mori.cpp``, ``StatusCode``,
``MemoryDesc``...), shmem's init flags, the EP enums (the same objects as under ``mori.io``, ``mori.shmem``
and ``mori.ops``), and ``launch_local_expert_count`` with the C++ config struct it reads. Everything else of
the extension (UMBP, the raw EP handle API, ...) does not exist here: an attribute access names what is
offered instead.
"""

from __future__ import annotations

from mori_compiler.io import *  # noqa: F401,F403 - MORI-IO's types are C++ classes in MORI
from mori_compiler.io import __all__ as _io_names
from mori_compiler.ops import EpDispatchCombineKernelType
from mori_compiler.runtime.shmem import MORI_SHMEM_INIT_WITH_MPI_COMM, MORI_SHMEM_INIT_WITH_UNIQUEID

from .local_expert_count import CppEpDispatchCombineConfig as EpDispatchCombineConfig
from .local_expert_count import launch_local_expert_count
from .mori_ops import EpDispatchCombineQuantType

__all__ = sorted({*_io_names, "EpDispatchCombineConfig", "EpDispatchCombineKernelType", "EpDispatchCombineQuantType",
                  "launch_local_expert_count",
                  "MORI_SHMEM_INIT_WITH_MPI_COMM", "MORI_SHMEM_INIT_WITH_UNIQUEID"})  # fmt: skip
__mori_compiler_alias__ = True


def __getattr__(name: str):
    raise AttributeError(f"mori.cpp.{name}: MORI's C++ extension does not exist in mori_compiler; its mori.cpp "
                         f"offers only {', '.join(__all__)} (the rest of MORI's API is in mori.ops, mori.shmem, "
                         f"mori.ir and mori.io)")  # fmt: skip
