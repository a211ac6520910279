"""MoE expert-parallel operators with MORI's Python API (``mori.ops``), on kernels compiled from mori_ep.

Importing this package imports neither MLIR nor torch; building an op needs torch and an initialized
shmem (mori_compiler.runtime.shmem), and the compiler only when its kernels are not precompiled.
``EpDispatchCombineOp`` is loaded on first access: a warm start (``ep_bundle`` finding its bundle in the
cache) imports only the config, ``bundle`` and the cache. ``reference`` holds the NumPy reference model
and correctness oracle (docs/ep-protocols.md; its bf16/fp8/fp4 casts are ml_dtypes'). ``EpTorchOps``
(torch_ops.py, loaded on first access: it imports torch) registers an op for the ``torch.ops.mori_compiler``
custom ops that torch.compile keeps in its graphs (docs/torch-compile.md). ``Collective`` and ``coll_bundle``
(collectives.py, loaded on first access) run the ``mori_coll`` collectives on torch tensors (docs/collectives.md).
"""

from .bundle import ep_bundle, kernel_module_source
from .config import EpDispatchCombineConfig, EpDispatchCombineKernelType, validate_config

__all__ = [
    "Collective",
    "EpDispatchCombineConfig",
    "EpDispatchCombineKernelType",
    "EpDispatchCombineOp",
    "EpDispatchRoutingHandle",
    "EpTorchOps",
    "coll_bundle",
    "ep_bundle",
    "kernel_module_source",
    "validate_config",
]


def __getattr__(name: str):
    if name == "EpDispatchCombineOp":
        from .dispatch_combine import EpDispatchCombineOp

        return EpDispatchCombineOp
    if name == "EpDispatchRoutingHandle":
        from .routing_handle import EpDispatchRoutingHandle

        return EpDispatchRoutingHandle
    if name == "EpTorchOps":
        from .torch_ops import EpTorchOps

        return EpTorchOps
    if name in ("Collective", "coll_bundle"):
        from . import collectives

        return getattr(collectives, name)
    raise AttributeError(f"module 'mori_compiler.ops' has no attribute '{name}'")
