"""The ``mori_coll`` dialect: collectives over the PEs of a symmetric heap, one op per collective.

Defined in ``mori_coll.irdl.mlir``; sizes, the workspace layout and the kernel module's text in
``mori_coll_schema.py`` (standard library only). ``mori-coll-to-kernels`` (passes/coll_to_kernels.py) expands
each op in place, in its kernel, into mori_comm blocks and mori_shmem ops (passes/coll_kernels.py); the
protocols (who writes, who waits, at which scope, in which order; how the workspace is reused by the next
call without a host sync) are written there and in docs/collectives.md.

Every op: ``"mori_coll.<op>"(%input, %output, %workspace) {dtype, count, world_size, max_blocks, ...}``

* who: every thread of every block of the kernel's grid (block-uniform, grid-uniform: it contains device
  barriers); the kernel is one-dimensional (``known_block_size`` x a multiple of the wave size, y = z = 1),
  at most ``max_blocks`` blocks per PE, every PE launched with the same grid, all blocks co-resident (the
  kernel is marked ``mori.max_blocks``; the launcher refuses any other grid);
* ``input``/``output``: this PE's tensors (global memory, any alignment; not the workspace). An input in
  the symmetric heap, 16-byte aligned and apart from the output (all_gather, broadcast: or exactly this
  PE's part of it) is read by the peers where it is when ``CollSpec.in_place_layout``; it must then not
  change until the kernel has ended on every PE (in stream order it does not; with the pass option
  one-launch a PE's blocks may return before its peers have read it). Any other input is staged.
  ``workspace``: this PE's address of a symmetric allocation of ``CollSpec.workspace_bytes``, its first
  ``header_bytes`` zeroed once at allocation (the device-barrier slots and epochs; never reset after);
* ordering it gives: when the op returns in a block, that block's share of ``output`` is written (plain
  stores, visible to the block's later code after a ``gpu.barrier``; to others after the kernel ends);
* what it ends in: the ABI functions of mori_comm's ``copy_bytes``, ``device_barrier`` (or, with the pass
  option one-gpu, ``one_gpu_barrier``), ``barrier_arrive`` / ``barrier_wait`` and ``accumulate_rows``
  helpers (``mori_shmem_my_pe``, ``mori_shmem_ptr``, ``mori_shmem_uint64_p``,
  ``mori_shmem_uint64_wait_until_greater_than``) plus ``mori_shmem.ptr`` for the peers' workspaces and
  inputs.

=============== ========================================================= ============================
op              semantics (W = world_size, me = this PE)                   extra attributes
=============== ========================================================= ============================
all_gather      out[p * count + i] = in_p[i]                              (any dtype of ELEMENT_BYTES)
all_reduce      out[i] = sum_p in_p[i]                                    algorithm: one_shot, two_shot
reduce_scatter  out[i] = sum_p in_p[me * count + i]                       (dtype f32 or bf16)
broadcast       out[i] = in_root[i]                                       root in [0, W)
all_to_all      out[p * count + i] = in_p[me * count + i]                 (any dtype)
all_to_all_v    out = concat_p (chunk ``me`` of in_p: splits_p[me] elements,   operands ``splits``,
                chunks packed in PE order on both sides)                  ``recv_counts`` (i32 [W])
=============== ========================================================= ============================
"""

from __future__ import annotations

from mori_compiler._mlir import ir

from .dialect_base import Dialect, OpRules
from .irdl_spec import int_attributes
from .mori_coll_schema import CollSpec


def spec_of(op: ir.Operation) -> CollSpec:
    """The CollSpec an op's attributes describe (verified IR: every attribute present and typed)."""
    op = op.operation
    attrs = op.attributes
    ints = int_attributes(op)
    text = lambda name: attrs[name].value if name in attrs else ""  # noqa: E731
    return CollSpec(op.name.partition(".")[2], text("dtype"), ints.get("count", 0), ints.get("world_size", 0),
                    text("algorithm"), ints.get("root", 0), ints.get("max_blocks", 0))  # fmt: skip


def _create(name: str, operands, spec: CollSpec, *, loc=None, ip=None) -> ir.Operation:
    i64 = ir.IntegerType.get_signless(64)
    attrs = {k: ir.StringAttr.get(v) if isinstance(v, str) else ir.IntegerAttr.get(i64, v)
             for k, v in spec.op_attributes()}  # fmt: skip
    return ir.Operation.create(f"{DIALECT_NAME}.{name}", operands=list(operands), attributes=attrs, loc=loc, ip=ip)


def collective(input_, output, workspace, spec: CollSpec, *splits, loc=None, ip=None) -> ir.Operation:
    """``mori_coll.<spec.op>(input, output, workspace[, splits, recv_counts]) {spec's attributes}`` (checked:
    a ValueError names the field and the allowed values; all_to_all_v takes ``splits`` and ``recv_counts``).
    The semantics of each op: the module docstring."""
    spec.check()
    if len(splits) != len(spec.params) - 3:
        raise ValueError(f"mori_coll.{spec.op} takes {len(spec.params)} operands ({', '.join(spec.params)}), got "
                         f"{3 + len(splits)}")  # fmt: skip
    return _create(spec.op, [input_, output, workspace, *splits], spec, loc=loc, ip=ip)


def extra_verify(op: ir.Operation) -> list[str]:
    """The rules IRDL cannot state: integer attributes, their ranges and relations (CollSpec.problems)."""
    op = op.operation
    rules = OpRules(op)
    ints = int_attributes(op)
    if rules.non_integer(op, ints, ("dtype", "algorithm")):
        return rules.errors
    for problem in spec_of(op).problems():  # "<op>: 'field' must ..." -> "'mori_coll.<op>' attribute 'field' must ..."
        rules.need(False, "attribute " + problem.partition(": ")[2])
    return rules.errors


DIALECT = Dialect("mori_coll", "mori_coll.irdl.mlir", extra_verify)
DIALECT_NAME = DIALECT.name
