"""Lower ops to calls of helper functions that are added to their gpu.module once.

The mechanism behind passes whose ops each stand for a piece of device code (``mori-comm-to-calls``):
the lowering of an op names a helper (its symbol, and how to build its ``func.func``); the first op that
needs a symbol adds the helper to the gpu.module, every op becomes a ``func.call`` of it with the op's
operands and result types, at the op's location. Helpers are ordinary functions: after the link step every
non-kernel function is internal and inlined, so a helper costs nothing at run time and is built once per
module, not once per use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mori_compiler._mlir import ir
from mori_compiler.dialects.builder import verify_generated


@dataclass(frozen=True)
class Helper:
    """A helper function: ``symbol`` and ``build(block, before)``, which adds the ``func.func @symbol`` to
    ``block`` before the op ``before`` and returns it."""

    symbol: str
    build: Callable[[ir.Block, ir.Operation], ir.Operation]


def replace_by_helper_calls(gpu_module: ir.Operation, ops: Iterable[ir.Operation],
                            helper_of: Callable[[ir.Operation], Helper]) -> None:  # fmt: skip
    """Replace each op of ``ops`` (inside ``gpu_module``) by a call of the helper ``helper_of(op)`` names.

    A helper is built the first time its symbol is needed and placed at the top of the module (so the
    latest new helper comes first); a symbol the module already defines is called, not built again.
    A helper that does not verify raises GeneratorError (a compiler bug), named by its symbol.
    """
    body = gpu_module.regions[0].blocks[0]
    defined = {o.attributes["sym_name"].value for o in body.operations if "sym_name" in o.attributes}
    for op in ops:
        helper = helper_of(op)
        if helper.symbol not in defined:
            verify_generated(helper.build(body, body.operations[0]), helper.symbol)
            defined.add(helper.symbol)
        with ir.InsertionPoint(op), op.location:
            call = ir.Operation.create("func.call", results=[r.type for r in op.results], operands=list(op.operands),
                                       attributes={"callee": ir.FlatSymbolRefAttr.get(helper.symbol)})  # fmt: skip
        for old, new in zip(op.results, call.results):
            old.replace_all_uses_with(new)
        op.erase()
