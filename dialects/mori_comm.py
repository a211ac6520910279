"""STUB (being replaced by the mori_comm dialect helper): typed builders of the generic comm blocks.

Until the ``mori_comm`` dialect lands these create the blocks under their current ``mori_ep`` names;
the signatures are final: ``(operands..., *, attributes..., loc, ip)`` like mori_shmem's builders, so a
generator calls ``mori_comm.row_copy(dst, src, nbytes, pe, **b.at())``.
"""

from __future__ import annotations

from mori_compiler._mlir import ir

DIALECT_PREFIX = "mori_ep"  # becomes "mori_comm"


def _i64(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _create(name, operands, attributes=None, results=(), *, loc=None, ip=None) -> ir.Operation:
    return ir.Operation.create(f"{DIALECT_PREFIX}.{name}", results=list(results), operands=list(operands),
                               attributes=attributes or {}, loc=loc, ip=ip)  # fmt: skip


def row_copy(dest, source, nbytes, pe, *, loc=None, ip=None) -> ir.Operation:
    return _create("row_copy", [dest, source, nbytes, pe], loc=loc, ip=ip)


def row_copy_to_peers(dest, source, nbytes, pe, send, *, max_peers: int, loc=None, ip=None) -> ir.Operation:
    return _create("row_copy_to_peers", [dest, source, nbytes, pe, send], {"max_peers": _i64(max_peers)}, loc=loc, ip=ip)


def reserve_slot(counter, pe, *, loc=None, ip=None) -> ir.Value:
    return _create("reserve_slot", [counter, pe], results=[ir.IntegerType.get_signless(32)], loc=loc, ip=ip).result


def count_signal(signals, counts, total, *, world_size: int, loc=None, ip=None) -> ir.Operation:
    return _create("count_signal", [signals, counts, total], {"world_size": _i64(world_size)}, loc=loc, ip=ip)


def grid_barrier(counter, *, loc=None, ip=None) -> ir.Operation:
    return _create("grid_barrier", [counter], loc=loc, ip=ip)


def device_barrier(slots, epochs, *, world_size: int, max_blocks: int, loc=None, ip=None) -> ir.Operation:
    attrs = {"world_size": _i64(world_size), "max_blocks": _i64(max_blocks)}
    return _create("device_barrier", [slots, epochs], attrs, loc=loc, ip=ip)


def accumulate_rows(out, elems, sources, *, dtype: str, loc=None, ip=None) -> ir.Operation:
    return _create("accumulate_rows", [out, elems, *sources], {"dtype": ir.StringAttr.get(dtype)}, loc=loc, ip=ip)
