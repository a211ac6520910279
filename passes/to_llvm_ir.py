"""Stage ``llvm-ir``: translate the lowered ``gpu.module`` to LLVM IR text.

Input: a builtin.module holding exactly one gpu.module whose body is in the LLVM dialect (after the
rocdl/nvvm stage). Output: LLVM IR text of that gpu.module plus the names of its kernels.

MLIR translates only builtin modules, so the gpu.module body is re-homed into a fresh builtin.module
first (docs/toolchain.md §2). Kernels are the llvm.funcs marked ``rocdl.kernel`` or ``nvvm.kernel``.
Before translating, it refuses (with the op's location) what LLVM would abort on or what cannot make a
code object: ops left unlowered, a gpu.module without kernels, symbol names the target cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from mori_compiler._mlir import TranslationError, ir, nested_ops, translate_module_to_llvm_ir
from mori_compiler.dialects.input_checks import LLVM_MODULE_LEVEL_OPS
from mori_compiler.dialects.irdl_spec import string_value
from mori_compiler.errors import MoriCompilerError, location_text, one_line

KERNEL_MARKERS = ("rocdl.kernel", "nvvm.kernel")


@dataclass(frozen=True)
class DeviceModuleIR:
    name: str
    llvm_ir: str
    kernels: tuple[str, ...]
    location: str = "-"  # file:line:col of the gpu.module, for errors of the later (LLVM-level) stages


def _where(op: ir.Operation, filename: str) -> str:
    return location_text(op.location, filename)


def find_gpu_module(module: ir.Module, filename: str = "-") -> ir.Operation:
    gpu_modules = [op.operation for op in module.body.operations if op.operation.name == "gpu.module"]
    if len(gpu_modules) != 1:
        # Located at the second gpu.module, or at the module that has none.
        at = gpu_modules[1] if gpu_modules else module.operation
        raise MoriCompilerError(
            f"expected exactly one gpu.module in the input, found {len(gpu_modules)}; "
            "kernels are compiled one gpu.module at a time",
            _where(at, filename),
        )
    return gpu_modules[0]


def _targets_nvptx(gpu_module: ir.Operation) -> bool:
    return "targets" in gpu_module.attributes and "#nvvm.target" in str(gpu_module.attributes["targets"])


def check_symbol_names(gpu_module: ir.Operation, filename: str = "-") -> None:
    """Refuse symbol names the target's code object cannot hold (LLVM would abort while emitting them)."""
    from mori_compiler.dialects.input_checks import target_symbol_problem

    nvptx = _targets_nvptx(gpu_module)
    for op in gpu_module.regions[0].blocks[0].operations:
        op = op.operation
        if "sym_name" not in op.attributes or not isinstance(op.attributes["sym_name"], ir.StringAttr):
            continue
        is_kernel = any(m in op.attributes for m in KERNEL_MARKERS + ("gpu.kernel",))
        problem = target_symbol_problem(string_value(op.attributes["sym_name"]), is_kernel=is_kernel, nvptx=nvptx)
        if problem:
            target = "PTX" if nvptx else "an AMDGPU code object"
            raise MoriCompilerError(f"'{op.name}': {problem}, as {target} requires", _where(op, filename))


def kernel_names(gpu_module: ir.Operation) -> tuple[str, ...]:
    names = []
    for op in gpu_module.regions[0].blocks[0].operations:
        if op.operation.name in ("llvm.func", "gpu.func") and any(m in op.attributes for m in KERNEL_MARKERS + ("gpu.kernel",)):
            names.append(string_value(op.attributes["sym_name"]))
    return tuple(names)


TRANSLATABLE_DIALECTS = ("llvm.", "rocdl.", "nvvm.")


def unlowered_ops(op: ir.Operation) -> list[ir.Operation]:
    """Ops nested in ``op`` that LLVM IR translation cannot handle (it would crash the process)."""
    return nested_ops(op, lambda inner: not inner.name.startswith(TRANSLATABLE_DIALECTS))


def gpu_module_to_llvm_ir(module: ir.Module, filename: str = "-") -> DeviceModuleIR:
    gpu_module = find_gpu_module(module, filename)
    body = gpu_module.regions[0].blocks[0]
    # Casts left by partial conversions are symptoms; name the op that was not converted first.
    leftovers = sorted(unlowered_ops(gpu_module), key=lambda op: op.name == "builtin.unrealized_conversion_cast")
    if leftovers:
        names = sorted({op.name for op in leftovers})
        raise MoriCompilerError(
            f"op '{leftovers[0].name}' was not lowered to the LLVM dialect by the pipeline (unlowered: "
            f"{', '.join(names)}); kernels may use the gpu, arith, scf, cf, llvm and project dialects",
            _where(leftovers[0], filename),
        )
    for op in body.operations:
        if op.operation.name not in LLVM_MODULE_LEVEL_OPS:  # a pass left one there: the translator would crash
            raise MoriCompilerError(
                f"'{op.operation.name}' cannot stand directly in a gpu.module (allowed there: functions, globals and "
                "module-level metadata); put it inside a gpu.func", _where(op.operation, filename))  # fmt: skip
    kernels = kernel_names(gpu_module)
    if not kernels:
        name = string_value(gpu_module.attributes["sym_name"])
        raise MoriCompilerError(f"gpu.module @{name} has no kernel (gpu.func ... kernel)", _where(gpu_module, filename))
    check_symbol_names(gpu_module, filename)
    from mori_compiler.dialects.input_checks import lowered_problems

    problems = lowered_problems(gpu_module, lambda op: _where(op, filename), nvptx=_targets_nvptx(gpu_module))
    if problems:
        problems = [one_line(p) for p in problems]
        loc, _, message = problems[0].partition(": ")
        raise MoriCompilerError("\n".join([message, *problems[1:]]), loc)
    with module.context, ir.Location.unknown():
        host = ir.Module.create()
        for op in body.operations:
            host.body.append(op.clone())
        try:
            text = translate_module_to_llvm_ir(host.operation)
        except TranslationError as exc:
            if not exc.diagnostics:
                raise MoriCompilerError(f"MLIR could not translate gpu.module to LLVM IR: {exc}",
                                        _where(gpu_module, filename)) from None  # fmt: skip
            located = [(filename + loc[1:] if loc.startswith("-:") else loc, one_line(msg)) for loc, msg in exc.diagnostics]
            (where, first), *rest = located
            lines = [first] + [f"{loc}: {message}" for loc, message in rest]
            raise MoriCompilerError("\n".join(lines), where) from None
    return DeviceModuleIR(string_value(gpu_module.attributes["sym_name"]), text, kernels, _where(gpu_module, filename))
