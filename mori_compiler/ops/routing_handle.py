"""MORI's ``EpDispatchRoutingHandle``: a dispatch's slot assignment, recorded to be replayed.

``dispatch(..., return_routing=True)`` returns one as the sixth result: caller-owned copies (torch clones
on the stream, no host synchronization) of each PE's forward map ``fwd`` (the codes ``pe * R + slot`` or
null that the dispatch's reservations produced: ``[n * K]`` int32, at least ``K`` so that a PE without tokens
still passes a non-null map and replays; InterNodeV1: also its proxy forward map ``i_pfwd``, the slots of the
records it forwarded, which a PE without tokens of its own may hold), with the token count of each PE, the
op that recorded it and that op's configuration. ``dispatch(..., routing=h)``
replays it: the kernel takes every destination slot from the handle instead of reserving one (no
atomics), so with the same inputs its outputs (rows, weights, scales, ids, source positions, counts) are
those of the recorded dispatch; ``combine(..., routing=h)`` takes its forward map from the handle. A
handle is refused (a ValueError naming the field, before any launch) by an op of another configuration,
by another op, or for a call with another token count. Kernel types: IntraNode and InterNodeV1, as MORI's
(docs/ep-protocols.md §17).
"""

from __future__ import annotations

import dataclasses
import itertools

_OP_IDS = itertools.count(1)


def new_op_id() -> int:
    """A number naming one op for the handles it records (never reused, unlike ``id()``)."""
    return next(_OP_IDS)


class EpDispatchRoutingHandle:
    """A recorded dispatch routing (see the module docstring). ``fwd``: per local PE (one with a process
    per PE, W with virtual PEs) the forward map, ``[max(n, 1) * K]`` int32 device tensors owned by the handle
    (rows past n unused); ``n``: each PE's token count; ``pes``: the PEs; ``pfwd`` (InterNodeV1, else None):
    per PE the forward map of the records it forwarded as a proxy (``i_pfwd``)."""

    __slots__ = ("op_id", "config", "pes", "n", "fwd", "pfwd")

    def __init__(self, op_id: int, config, pes: list[int], n: list[int], fwd: list, pfwd=None):
        self.op_id, self.config, self.pes = op_id, config, tuple(pes)
        self.n, self.fwd = tuple(n), tuple(fwd)
        self.pfwd = None if pfwd is None else tuple(pfwd)

    def kernel_arguments(self) -> list[dict]:
        """Per PE, the dispatch kernel's replay arguments: ``routing`` (the recorded forward map) and, for
        InterNodeV1, ``routing_pfwd`` (the recorded proxy forward map)."""
        return [{"routing": f.data_ptr(), **({} if self.pfwd is None else {"routing_pfwd": p.data_ptr()})}
                for f, p in zip(self.fwd, self.pfwd or self.fwd)]  # fmt: skip

    def __repr__(self) -> str:
        return f"EpDispatchRoutingHandle(op #{self.op_id}, PEs {list(self.pes)}, n {list(self.n)})"

    def check(self, op_id: int, config, pes: list[int], ns: list[int], what: str) -> None:
        """Refuse this handle for ``what`` (a call of op ``op_id`` with ``config``, on PEs ``pes`` with token
        counts ``ns``) unless it recorded that op's routing of those counts: a ValueError naming the field."""
        if dataclasses.asdict(self.config) != dataclasses.asdict(config):
            mine, theirs = dataclasses.asdict(self.config), dataclasses.asdict(config)
            field = next(k for k in mine if mine[k] != theirs.get(k))
            raise ValueError(f"{what}: the routing handle was recorded with config.{field}={mine[field]!r}, this "
                             f"op has config.{field}={theirs[field]!r} (a handle replays only on the op that "
                             "recorded it)")  # fmt: skip
        if self.op_id != op_id:
            raise ValueError(f"{what}: the routing handle was recorded by another EpDispatchCombineOp (op #{self.op_id}, "
                             f"this is op #{op_id}); a handle replays only on the op that recorded it")  # fmt: skip
        if tuple(pes) != self.pes:
            raise ValueError(f"{what}: the routing handle holds PEs {list(self.pes)}, the call runs {list(pes)}")
        for pe, recorded, n in zip(pes, self.n, ns):
            if recorded != n:
                raise ValueError(f"{what}: indices[{pe}] has {n} tokens, the routing handle recorded {recorded} "
                                 f"(routing.n of PE {pe}); replay the routing with the inputs it was recorded for")  # fmt: skip
