"""``mori.io`` (and ``mori.io.engine``): mori_compiler.io under MORI's names and signatures.

``IOEngine`` here is the project's engine with MORI's parameter names on the methods whose names differ
(``create_backend(type, config)``, ``register_remote_engine(engine_desc)``, ``deregister_memory(mem_desc)``...).
The FABRIC backend, its allocator and the peer-failure events are not offered: each raises
NotImplementedError naming the reason (a lost peer fails its transfers with ``StatusCode.ERR_RDMA_OP``).
"""

from __future__ import annotations

from mori_compiler.io import *  # noqa: F401,F403 - the alias re-exports the project's MORI-IO names
from mori_compiler.io import IOEngine as _ProjectEngine
from mori_compiler.io import IOEngineSession, MemoryLocationType
from mori_compiler.io import __all__ as _project_names

from ._refuse import not_offered

__mori_compiler_alias__ = True
__path__: list[str] = []  # mori.io is a package in MORI

TORCH_DEVICE_TYPE_MAP = {"cpu": MemoryLocationType.CPU, "cuda": MemoryLocationType.GPU}


class IOEngine(_ProjectEngine):
    """mori_compiler.io.IOEngine with MORI's parameter names (see the module docstring)."""

    def create_backend(self, type, config=None):  # noqa: A002 - MORI's parameter name
        return super().create_backend(type, config)

    def remove_backend(self, type):  # noqa: A002
        return super().remove_backend(type)

    def register_remote_engine(self, engine_desc):
        return super().register_remote_engine(engine_desc)

    def deregister_remote_engine(self, engine_desc):
        return super().deregister_remote_engine(engine_desc)

    def deregister_memory(self, mem_desc):
        return super().deregister_memory(mem_desc)

    pop_peer_failure = not_offered(
        "IOEngine.pop_peer_failure",
        "peer failures are not recorded as events; a lost peer fails its transfers with StatusCode.ERR_RDMA_OP")


_NO_FABRIC = "there is no FABRIC backend (backends: TCP, also serving RDMA, and GPU IPC for XGMI; docs/mori-io.md)"
FabricBackendConfig = not_offered("FabricBackendConfig", _NO_FABRIC)
fabric_alloc = not_offered("fabric_alloc", _NO_FABRIC)
fabric_free = not_offered("fabric_free", _NO_FABRIC)
fabric_torch_allocator = not_offered("fabric_torch_allocator", _NO_FABRIC)
use_fabric_torch_allocator = not_offered("use_fabric_torch_allocator", _NO_FABRIC)
make_fabric_mem_pool = not_offered("make_fabric_mem_pool", _NO_FABRIC)
fabric_mem_pool = not_offered("fabric_mem_pool", _NO_FABRIC)
_NO_PEER_EVENTS = "peer failures are not recorded as events (a lost peer fails its transfers with ERR_RDMA_OP)"
PeerFailureEvent = not_offered("PeerFailureEvent", _NO_PEER_EVENTS)
PeerFailureReason = not_offered("PeerFailureReason", _NO_PEER_EVENTS)

__all__ = sorted({*_project_names, "IOEngine", "IOEngineSession", "TORCH_DEVICE_TYPE_MAP", "FabricBackendConfig",
                  "fabric_alloc", "fabric_free", "fabric_torch_allocator", "use_fabric_torch_allocator",
                  "make_fabric_mem_pool", "fabric_mem_pool", "PeerFailureEvent", "PeerFailureReason"})  # fmt: skip
