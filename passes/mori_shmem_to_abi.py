"""``mori-shmem-to-abi``: lower ``mori_shmem`` ops to calls of MORI's device ABI.

Input dialects: mori_shmem (inside gpu.module/gpu.func or builtin.module/func.func), arith, llvm.
Output dialects: llvm (``llvm.call`` + ``llvm.func`` declarations), arith (enum constants).
Options: none.

One rewrite pattern per op: the op's OpInfo (dialects/mori_shmem.py) names the ABI function as a
template filled from the op's attributes, and the exact call types come from the ABI table
(lib_bitcode/abi.py). Enum attributes (``amo``, ``signal_op``) become ``i32`` constants at the ABI's
argument position; the two address-translation functions take and return ``i64`` and get
ptrtoint/inttoptr around them. Declarations are added afterwards, once per symbol table.

Before::

    %pe = "mori_shmem.my_pe"() : () -> i32
    "mori_shmem.putmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()

After::

    llvm.func @mori_shmem_my_pe() -> i32
    llvm.func @mori_shmem_putmem_nbi_warp(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
    %pe = llvm.call @mori_shmem_my_pe() : () -> i32
    %0 = llvm.call @mori_shmem_putmem_nbi_warp(%d, %s, %n, %pe, %qp) : (...) -> i32
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import arith, ir, llvm, rewrite
from mori_compiler.dialects import mori_shmem
from mori_compiler.errors import MoriCompilerError, location_text
from mori_compiler.lib_bitcode.abi import AbiFunction, abi_function

_MLIR_TYPE = {"ptr": "!llvm.ptr", "float": "f32", "double": "f64"}
_SYMBOL_TABLES = ("builtin.module", "gpu.module")


def mlir_type(llvm_type: str) -> ir.Type:
    """The MLIR type of an ABI table LLVM type name (``ptr`` → ``!llvm.ptr``, ``float`` → ``f32``)."""
    return ir.Type.parse(_MLIR_TYPE.get(llvm_type, llvm_type))


def llvm_function_type(fn: AbiFunction) -> ir.TypeAttr:
    """``!llvm.func<ret (params)>`` of an ABI function, from the table's exact LLVM types."""
    params = ", ".join(str(mlir_type(t)) for t in fn.llvm_param_types)
    return ir.TypeAttr.get(ir.Type.parse(f"!llvm.func<{mlir_type(fn.llvm_return)} ({params})>"))


def _where(op) -> str:
    """``-:line:col`` (the driver puts the file name in place of MLIR's "-")."""
    return location_text(op.location, "-")


def _symbol_table(op: ir.Operation) -> ir.Operation:
    parent = op.parent
    while parent is not None and parent.operation.name not in _SYMBOL_TABLES:
        parent = parent.parent
    if parent is None:
        raise MoriCompilerError(f"'{op.name}' is not inside a builtin.module or gpu.module", op.location)
    return parent


def _lower_op(info: mori_shmem.OpInfo, used: dict, op: ir.Operation, rw: rewrite.PatternRewriter):
    op = op.operation
    fn = abi_function(mori_shmem.abi_symbol(op))
    with rw.ip, op.location:
        args = list(op.operands)
        if info.enum_arg is not None:
            attr, position = info.enum_arg
            value = mori_shmem.ENUM_VALUES[attr][op.attributes[attr].value]
            args.insert(position, arith.constant(ir.IntegerType.get_signless(32), value))
        if fn.llvm_return == "i64" and fn.llvm_param_types[0] == "i64":  # ptr_p2p / ptr: uint64_t addresses
            args[0] = llvm.ptrtoint(ir.IntegerType.get_signless(64), args[0])
        expected = [mlir_type(t) for t in fn.llvm_param_types]
        if [a.type for a in args] != expected:  # the verifier makes this unreachable for valid IR
            raise MoriCompilerError(f"'{op.name}' does not match {fn.symbol}{fn.llvm_signature}", _where(op))
        call = llvm.call(mlir_type(fn.llvm_return), args, [], [], callee=ir.FlatSymbolRefAttr.get(fn.symbol))
        used.setdefault(_symbol_table(op), set()).add(fn.symbol)
        if not op.results:
            rw.erase_op(op)
        elif str(op.results[0].type) == "!llvm.ptr":
            rw.replace_op(op, [llvm.inttoptr(op.results[0].type, call)])
        elif op.name == "mori_shmem.wait_until" and mori_shmem.string_attributes(op)["cmp"] == "equals":
            rw.replace_op(op, [op.operands[1]])  # the ABI returns 0; the observed value is the awaited one
        else:
            rw.replace_op(op, [call])


def declare_abi_functions(table: ir.Operation, symbols) -> None:
    """Insert external ``llvm.func`` declarations for ``symbols`` at the top of ``table`` (once each)."""
    body = table.regions[0].blocks[0]
    existing = {op.attributes["sym_name"].value: op for op in body.operations if "sym_name" in op.attributes}
    for symbol in sorted(symbols, reverse=True):  # inserted at the top: end up sorted
        fn = abi_function(symbol)
        fn_type = llvm_function_type(fn)
        if symbol in existing:
            have = existing[symbol]
            if have.name != "llvm.func" or str(have.attributes["function_type"]) != str(fn_type):
                raise MoriCompilerError(
                    f"'{symbol}' is already declared with another type; the device ABI has {fn.llvm_signature}",
                    _where(have),
                )
            continue
        with ir.InsertionPoint.at_block_begin(body), table.location:
            ir.Operation.create(
                "llvm.func",
                regions=1,
                attributes={
                    "sym_name": ir.StringAttr.get(symbol),
                    "function_type": fn_type,
                },
            )


@dataclass(frozen=True)
class MoriShmemToAbi:
    """Lower mori_shmem ops to llvm.call of MORI's device ABI and declare the callees.

    Input: mori_shmem, arith, llvm, gpu/func. Output: llvm (call, func, ptrtoint/inttoptr), arith. Options: none.
    """

    name: ClassVar[str] = "mori-shmem-to-abi"

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        used: dict = {}
        with op.context:
            patterns = rewrite.RewritePatternSet()
            for info in mori_shmem.OP_INFO.values():
                patterns.add(info.name, functools.partial(_lower_op, info, used))
            rewrite.walk_and_apply_patterns(op, patterns.freeze())
            for table, symbols in used.items():
                declare_abi_functions(table, symbols)
