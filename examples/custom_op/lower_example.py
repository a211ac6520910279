"""``mori-example-to-shmem``: lower the ``mori_example`` ops to mori_shmem ops (docs/extending.md, part 2).

Input: ``mori_example.signal_all`` / ``wait_all`` anywhere in the module. Output: mori_shmem (my_pe, n_pes,
fence, p, wait_until), scf, arith and llvm ops in their place. Options: none.

One rewrite pattern per op, each built with ``dialects/builder.py`` (values are Python objects, nothing is
named in text) at the op's own location. The ordering each lowering provides:

* ``signal_all(flags, value)``: ``fence`` (a release of this thread's earlier stores: quiet alone would not
  order them), then for every PE q a relaxed system-scope store of ``value`` into ``flags[my_pe]`` on q
  (``mori_shmem.p``);
* ``wait_all(flags, value)``: for every PE q, ``wait_until(flags[q] > value - 1)`` (relaxed system-scope
  polls), then ``fence``: the wait has no acquire of its own, the fence is it.

Before::

    "mori_example.signal_all"(%flags, %round) : (!llvm.ptr, i64) -> ()

After::

    "mori_shmem.fence"() : () -> ()
    %me = "mori_shmem.my_pe"() : () -> i32
    %n = "mori_shmem.n_pes"() : () -> i32
    scf.for %q = %c0 to %n_x step %c1 {
      "mori_shmem.p"(%slot, %round, %q32, %qp) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import ir, rewrite
from mori_compiler.dialects import mori_shmem
from mori_compiler.dialects.builder import Builder

import mori_example


def _every_pe(b: Builder):
    """A loop over every PE q (the ``with`` yields q as an index)."""
    n = b.index_cast(b.index, mori_shmem.n_pes(**b.at()))
    return b.for_(b.const_index(0), n, b.const_index(1))


def lower_signal_all(op: ir.Operation, rw: rewrite.PatternRewriter) -> None:
    op = op.operation
    flags, value = op.operands
    with op.location:  # everything built here (ops, loop variables) is located at the op it replaces
        b = Builder(op.block, before=op, loc=op.location)
        mori_shmem.fence(**b.at())
        slot = b.gep(flags, mori_shmem.my_pe(**b.at()), b.i64)
        with _every_pe(b) as q:
            mori_shmem.p(slot, value, b.index_cast(b.i32, q), c_type="uint64", **b.at())
    rw.erase_op(op)


def lower_wait_all(op: ir.Operation, rw: rewrite.PatternRewriter) -> None:
    op = op.operation
    flags, value = op.operands
    with op.location:
        b = Builder(op.block, before=op, loc=op.location)
        before = b.subi(value, b.const_i64(1))
        with _every_pe(b) as q:
            slot = b.gep(flags, b.index_cast(b.i32, q), b.i64)
            mori_shmem.wait_until(slot, before, cmp="greater_than", elem="uint64", **b.at())
        mori_shmem.fence(**b.at())
    rw.erase_op(op)


@dataclass(frozen=True)
class MoriExampleToShmem:
    """Lower mori_example ops (signal_all, wait_all) to mori_shmem ops.

    Input: mori_example, anywhere. Output: mori_shmem, scf, arith, llvm. Options: none.
    """

    name: ClassVar[str] = mori_example.PASS_NAME

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        with op.context:
            patterns = rewrite.RewritePatternSet()
            patterns.add(f"{mori_example.DIALECT_NAME}.signal_all", lower_signal_all)
            patterns.add(f"{mori_example.DIALECT_NAME}.wait_all", lower_wait_all)
            rewrite.walk_and_apply_patterns(op, patterns.freeze())
