"""Finding gpu.func kernels and their parameters in the ABI's terms: types, names, and the KernelInfo that a
bundle records for each kernel (shared by passes and the pipeline)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from mori_compiler._mlir import ir
from mori_compiler.dialects.builder import PARAM_NAME_ATTR
from mori_compiler.dialects.irdl_spec import string_value
from mori_compiler.errors import MoriCompilerError
from mori_compiler.lib_bitcode.kernel_abi import MLIR_PARAM_TYPES

TRACE_EVENTS_ATTR = "mori.trace_events"  # set on traced kernels by mori-trace-to-timer
# Set by mori-coll-to-kernels on a kernel holding collectives: the most blocks (x) its launch grid may have per
# PE, with y = z = 1 (each block owns a device-barrier slot row; grid y or z would make blocks share one).
MAX_BLOCKS_ATTR = "mori.max_blocks"


class ParamSignature(NamedTuple):
    name: str  # the ``mori.name`` argument attribute, or ``arg<i>`` where there is none
    type: str  # an ABI type name (lib_bitcode.kernel_abi.PARAM_SIZES)
    named: bool  # whether ``name`` came from the kernel (False: the positional fallback)


class CompiledKernel(NamedTuple):
    """What a bundle records of a kernel (the driver turns it into the runtime's KernelInfo)."""

    name: str
    params: tuple[ParamSignature, ...]
    block: tuple[int, int, int] | None
    trace_events: tuple[str, ...] = ()  # the kernel's trace slots, "event:phase" (mori-trace-to-timer)
    max_blocks: int | None = None  # MAX_BLOCKS_ATTR: the launch grid's limit, (max_blocks, 1, 1); None: any


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


def kernel_param_names(fn: ir.Operation) -> tuple[list[str | None], str | None]:
    """(each parameter's name, None): its ``mori.name`` argument attribute (set by
    ``dialects.builder.new_kernel`` from the EP schema), None where it has none; or (None, a message) when
    a name is not a non-empty string or names two parameters (a launch by name would be ambiguous)."""
    kernel = string_value(fn.attributes["sym_name"])
    n = len(fn.regions[0].blocks[0].arguments)
    if "arg_attrs" not in fn.attributes:
        return [None] * n, None
    names: list[str | None] = []
    for i, attrs in enumerate(fn.attributes["arg_attrs"]):
        attrs = ir.DictAttr(attrs)
        if PARAM_NAME_ATTR not in attrs:
            names.append(None)
            continue
        attr = attrs[PARAM_NAME_ATTR]
        if not isinstance(attr, ir.StringAttr) or not string_value(attr):
            return None, f"kernel '{kernel}' parameter {i}: {PARAM_NAME_ATTR} must be a non-empty string, got {attr}"
        name = string_value(attr)
        if name in names:
            return None, f"kernel '{kernel}' names two parameters '{name}' ({PARAM_NAME_ATTR})"
        names.append(name)
    return names, None


def signatures_of_module(module, *, strict: bool = True, problems: dict | None = None) -> dict[str, CompiledKernel]:
    """The signature (what bundle.json records) of every gpu.func kernel of an MLIR module: each parameter's
    ABI type and name (``mori.name``; ``arg<i>``, marked unnamed, where the kernel gives none). Only
    ptr/integer/float parameters; with ``strict=False`` kernels with other parameter types are left out
    instead of rejected, and the reason is stored in ``problems[name]`` when a dict is given."""
    kernels = {}
    for fn in gpu_kernels(module.operation):
        name = string_value(fn.attributes["sym_name"])
        types, problem = kernel_param_types(fn, role="bundles support")
        names, name_problem = kernel_param_names(fn) if types is not None else (None, None)
        problem = problem or name_problem
        if problem:
            if strict:
                raise MoriCompilerError(problem)
            if problems is not None:
                problems[name] = problem
            continue
        block = None
        if "known_block_size" in fn.attributes:
            block = tuple(int(x) for x in fn.attributes["known_block_size"])
        params = tuple(ParamSignature(f"arg{i}" if pname is None else pname, ty, pname is not None)
                       for i, (pname, ty) in enumerate(zip(names, types)))  # fmt: skip
        events = ()
        if TRACE_EVENTS_ATTR in fn.attributes:
            events = tuple(string_value(a) for a in ir.ArrayAttr(fn.attributes[TRACE_EVENTS_ATTR]))
        max_blocks = None
        if MAX_BLOCKS_ATTR in fn.attributes:
            max_blocks = ir.IntegerAttr(fn.attributes[MAX_BLOCKS_ATTR]).value
        kernels[name] = CompiledKernel(name, params, block, events, max_blocks)
    return kernels
