"""Finding gpu.func kernels and their parameter types in the ABI's terms (shared by passes and the cache)."""

from __future__ import annotations

from collections.abc import Iterator

from mori_compiler._mlir import ir
from mori_compiler.dialects.irdl_spec import string_value
from mori_compiler.lib_bitcode.kernel_abi import MLIR_PARAM_TYPES


def gpu_kernels(module_op: ir.Operation) -> Iterator[ir.Operation]:
    """Every ``gpu.func`` kernel of every ``gpu.module`` at the top of ``module_op``."""
    for gm in module_op.regions[0].blocks[0].operations:
        if gm.operation.name != "gpu.module":
            continue
        for fn in gm.regions[0].blocks[0].operations:
            if fn.operation.name == "gpu.func" and "gpu.kernel" in fn.attributes:
                yield fn.operation


def kernel_param_types(fn: ir.Operation, *, role: str) -> tuple[list[str] | None, str | None]:
    """(the ABI type name of each parameter, None) or (None, a message naming the first parameter whose
    type has no ABI mapping; ``role`` says who needs it, e.g. "bundles support")."""
    name = string_value(fn.attributes["sym_name"])
    types = []
    for i, arg in enumerate(fn.regions[0].blocks[0].arguments):
        ty = MLIR_PARAM_TYPES.get(str(arg.type))
        if ty is None:
            return None, f"kernel '{name}' parameter {i} has type {arg.type}; {role} " + ", ".join(MLIR_PARAM_TYPES)
        types.append(ty)
    return types, None
