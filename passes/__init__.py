"""Lowering passes and the LLVM-level stages of the pipeline.

``ALL_PASSES`` maps each MLIR pass name to a loader of its class (lazy, so listing passes imports
nothing heavy). Every pass is a frozen dataclass whose fields are its options and whose docstring
starts with the contract line "Input: … Output: … Options: …"; ``mori-opt --list-passes`` prints it.
"""

from __future__ import annotations

import importlib
from typing import Callable


def _lazy(module: str, cls: str) -> Callable[[], type]:
    return lambda: getattr(importlib.import_module(f"{__name__}.{module}"), cls)


ALL_PASSES: dict[str, Callable[[], type]] = {
    "mori-shmem-to-abi": _lazy("mori_shmem_to_abi", "MoriShmemToAbi"),
    "mori-virtual-pe-args": _lazy("virtual_pe_args", "VirtualPeArgs"),
    "mori-comm-to-calls": _lazy("comm_to_calls", "MoriCommToCalls"),
    "mori-ep-to-kernels": _lazy("ep_to_kernels", "MoriEpToKernels"),
    "mori-trace-to-timer": _lazy("trace_to_timer", "TraceToTimer"),
    "mori-coll-to-kernels": _lazy("coll_to_kernels", "MoriCollToKernels"),
}


def get_pass_class(name: str) -> type | None:
    loader = ALL_PASSES.get(name)
    return loader() if loader else None
