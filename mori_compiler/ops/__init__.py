"""MoE expert-parallel operators with MORI's Python API (``mori.ops``), on kernels compiled from mori_ep.

Importing this package imports neither MLIR nor torch; building an op needs torch and an initialized
shmem (mori_compiler.runtime.shmem), and the compiler only when its kernels are not precompiled.
``reference`` holds the NumPy reference model and correctness oracle (ep-semantics.md §2.9, §4).
"""

from .dispatch_combine import (
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    EpDispatchCombineOp,
    ep_bundle,
    kernel_module_source,
    validate_config,
)

__all__ = [
    "EpDispatchCombineConfig",
    "EpDispatchCombineKernelType",
    "EpDispatchCombineOp",
    "ep_bundle",
    "kernel_module_source",
    "validate_config",
]
