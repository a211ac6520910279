"""``mori-virtual-pe-args``: make kernels read their parameters from a per-PE argument table.

Input: gpu.module with gpu.func kernels whose parameters are !llvm.ptr, i64, i32, i16, i8, f64 or f32.
Output: the same kernels taking one ``!llvm.ptr`` (the table); a prologue loads every original
parameter from record ``blockIdx.z`` (llvm.getelementptr + llvm.load) and replaces its uses.
Options: none.

Why: with virtual PEs, one launch runs every PE (the grid's z index is the PE), yet each PE needs its
own arguments (its own input tensors and output buffers). The record layout is
``lib_bitcode.kernel_abi.arg_table_layout`` (natural alignment, stride rounded to 8), which the
runtime's packer shares. Kernels compiled this way must not use the grid's z dimension themselves (the trace
points' record index reads it on purpose: there z is the PE, docs/tracing.md).

Before::

    gpu.func @k(%src: !llvm.ptr, %n: i64) kernel { ... uses %src, %n ... }

After::

    gpu.func @k(%table: !llvm.ptr) kernel attributes {mori.arg_table_stride = 16 : i64} {
      %z = gpu.block_id z
      ... %rec = table + z * 16;  %src = llvm.load (rec + 0);  %n = llvm.load (rec + 8) ...
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import arith, gpu, ir, llvm
from mori_compiler.dialects.irdl_spec import string_value
from mori_compiler.errors import MoriCompilerError, one_line
from mori_compiler.lib_bitcode.kernel_abi import arg_table_layout

from .gpu_kernels import gpu_kernels, kernel_param_types

STRIDE_ATTR = "mori.arg_table_stride"


def rewrite_kernel(fn: ir.Operation) -> None:
    name = string_value(fn.attributes["sym_name"])
    if STRIDE_ATTR in fn.attributes:
        return  # already rewritten: the pass is idempotent
    block = fn.regions[0].blocks[0]
    args = list(block.arguments)
    types, problem = kernel_param_types(fn, role="virtual-PE kernels take")
    if problem:
        raise MoriCompilerError(one_line(problem), fn.location)
    offsets, stride = arg_table_layout(types)
    ptr = ir.Type.parse("!llvm.ptr")
    i8, i64 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(64)
    table = block.add_argument(ptr, fn.location)
    with ir.InsertionPoint.at_block_begin(block), fn.location:
        z = arith.index_cast(i64, gpu.block_id(gpu.Dimension.z))
        offset = arith.muli(z, arith.constant(i64, stride))
        record = llvm.getelementptr(ptr, table, [offset], [-2147483648], i8, 0)
        for arg, off in zip(args, offsets):
            field = llvm.getelementptr(ptr, record, [], [off], i8, 0)
            value = llvm.load(arg.type, field)
            arg.replace_all_uses_with(value)
    for _ in args:
        block.erase_argument(0)
    fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([ptr], []))
    if "arg_attrs" in fn.attributes:
        del fn.attributes["arg_attrs"]
    fn.attributes[STRIDE_ATTR] = ir.IntegerAttr.get(i64, stride)


@dataclass(frozen=True)
class VirtualPeArgs:
    """Make kernels load their parameters from a per-PE argument table indexed by blockIdx.z.

    Input: gpu.func kernels (gpu dialect). Output: gpu.func kernels with one !llvm.ptr parameter, llvm
    loads, arith, gpu.block_id. Options: none.
    """

    name: ClassVar[str] = "mori-virtual-pe-args"

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        with op.context:
            for fn in list(gpu_kernels(op.operation)):
                rewrite_kernel(fn)
