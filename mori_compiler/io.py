"""``from mori_compiler.io import ...``: the names of MORI's ``mori.io`` (and ``TransferStatus``, which MORI's
tests take from ``mori.cpp``), implemented in ``mori_compiler.runtime.io``.

The enums, configs, descriptors, ``TransferStatus``, ``wait_all``, ``set_log_level``, ``IOEngine`` and
``IOEngineSession`` (backends: TCP, also serving RDMA, and GPU IPC for XGMI; CPU and GPU memory), plus our
``TcpBackendConfig``; ``FabricBackendConfig``, ``fabric_alloc`` and ``fabric_free`` are out of scope (no
FABRIC backend). docs/mori-io.md is the guide.
"""

from __future__ import annotations

from mori_compiler.runtime.io.configs import (IOEngineConfig, RdmaBackendConfig, TcpBackendConfig,
                                              XgmiBackendConfig)  # fmt: skip
from mori_compiler.runtime.io.descriptors import EngineDesc, MemoryDesc
from mori_compiler.runtime.io.engine import IOEngine, IOEngineSession
from mori_compiler.runtime.io.enums import BackendType, MemoryLocationType, PollCqMode, StatusCode
from mori_compiler.runtime.io.log import set_log_level
from mori_compiler.runtime.io.status import TransferStatus, wait_all

__all__ = [
    "BackendType", "EngineDesc", "IOEngine", "IOEngineConfig", "IOEngineSession", "MemoryDesc",
    "MemoryLocationType", "PollCqMode", "RdmaBackendConfig", "StatusCode", "TcpBackendConfig", "TransferStatus", "XgmiBackendConfig",
    "set_log_level", "wait_all",
]  # fmt: skip
