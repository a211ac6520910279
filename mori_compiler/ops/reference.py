"""A NumPy reference model of MORI-EP dispatch/combine and the correctness oracle of its tests.

Everything here follows docs/ep-protocols.md: the index encodings, routing, layout, counts, source
positions, the combine reduction, the reference model and the oracle. The sizes and encodings are the EP
schema's (``EpShape.sizes``, an ``ep_schema.EpSizes``), so the oracle reads what the kernels write. It needs
NumPy and ml_dtypes (the bf16 / fp8 casts; both in the ``test`` extra): functions take and return NumPy arrays.
Callers holding torch tensors convert them with ``t.cpu().numpy()``; torch has no NumPy bfloat16/float8, so
for those dtypes callers pass either

* **values as float32** (``t.float().cpu().numpy()``), where a function computes on values
  (:func:`reference_combine`, :func:`check_combine`, :func:`convert_combine_input_ref`), or
* **raw bit patterns** (``t.view(torch.uint16)`` for bf16, ``t.view(torch.uint8)`` for fp8), where a function
  compares bytes (:func:`check_dispatch`, :func:`convert_dispatch_output_ref`). :func:`to_bits` turns the
  float32 values made by :func:`make_tokens` into the same bit patterns, :func:`from_bits` goes back.

Conventions (ours, stated once):

* Source positions use FlatTokenIndex ``src_rank * S + src_tok`` with ``S = W * M``
  (docs/ep-protocols.md §3); its null is ``W * S`` (:attr:`EpShape.null_src`).
* A forward-map entry encodes (destination PE, recv slot) as ``pe * R + slot`` with null ``W * R``
  (:attr:`EpShape.null_fwd`): our stride is R, like v2 (docs/ep-protocols.md §1), not MORI v1's S.
* Routing: a slot ``k`` is dropped when ``idx < 0`` (sentinel) or ``idx // Er >= W`` (out of range); a token
  goes to each PE once and the lowest ``k`` is the representative (docs/ep-protocols.md §2).
* Standard-MoE ``packed_recv_src_info[e, j]`` holds the dispatch **recv row index** of entry ``j`` of local
  expert ``e`` (MORI stores the dispatch-row index too; the value is our convention). Unused entries are -1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mori_compiler.ep_schema import TRAFFIC_COUNTERS, EpSizes, EpTopology, KernelType, topology_problems
from mori_compiler.runtime.extras import import_extra

ml_dtypes = import_extra("ml_dtypes")  # a missing one names the extra that installs it

__all__ = [
    "EpShape", "route", "destinations", "unique_dest_count", "expected_recv_counts", "RecvOverflow",
    "recv_overflow", "AsyncLLSegment", "asyncll_layout", "check_asyncll_layout", "RecvRow", "expected_recv_rows", "check_dispatch", "reference_combine",
    "reference_combine_weights", "remote_nodes", "INTERNODE_KIND_NAMES", "internode_records",
    "predicted_internode_sends", "row_writers", "predicted_traffic", "hierarchical_combine", "hierarchical_bound", "check_hierarchical_combine",
    "combine_tolerance", "check_combine", "check_combine_weights",
    "convert_dispatch_output_ref", "convert_combine_input_ref", "ROUTING_MODES", "make_routing",
    "make_token_counts", "make_tokens", "make_weights", "make_scales", "DTYPES", "canonical_dtype",
    "to_bits", "from_bits", "quantize", "representable_values",
]  # fmt: skip


# ---- shape ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpShape:
    """The sizes of one EP configuration (docs/ep-protocols.md §1). ``max_total_recv_tokens`` = 0 means no
    receive cap."""

    world_size: int
    num_experts_per_rank: int
    num_experts_per_token: int
    max_num_inp_token_per_rank: int
    max_total_recv_tokens: int = 0

    def __post_init__(self):
        for name in ("world_size", "num_experts_per_rank", "num_experts_per_token", "max_num_inp_token_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"EpShape.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_total_recv_tokens, (int, np.integer)) or self.max_total_recv_tokens < 0:
            raise ValueError(f"EpShape.max_total_recv_tokens must be >= 0, got {self.max_total_recv_tokens!r}")

    # short names of docs/ep-protocols.md §1
    @property
    def W(self) -> int:
        return int(self.world_size)

    @property
    def Er(self) -> int:
        return int(self.num_experts_per_rank)

    @property
    def K(self) -> int:
        return int(self.num_experts_per_token)

    @property
    def M(self) -> int:
        return int(self.max_num_inp_token_per_rank)

    @property
    def num_experts(self) -> int:
        """Global expert count W * Er."""
        return self.W * self.Er

    @functools.cached_property
    def sizes(self) -> EpSizes:
        """The EP schema's sizes and index encodings of this shape (no token rows)."""
        return EpSizes.for_routing(self.W, self.K, self.Er, self.M, int(self.max_total_recv_tokens))

    @property
    def S(self) -> int:
        """MaxNumTokensToSend = W * M, the FlatTokenIndex stride."""
        return self.sizes.send_stride

    @property
    def Rp(self) -> int:
        """Receive capacity per source: min(ceil(cap / W), M) with a cap, else M."""
        return self.sizes.max_recv_per_rank

    @property
    def R(self) -> int:
        """Rows of every receive buffer: W * Rp."""
        return self.sizes.recv_capacity

    @property
    def null_fwd(self) -> int:
        """Null of our forward map ``pe * R + slot``."""
        return self.sizes.null_fwd

    @property
    def null_src(self) -> int:
        """Null FlatTokenIndex ``W * S`` (decodes to pe == W)."""
        return self.sizes.null_src

    def encode_src(self, src_rank: int, src_tok: int) -> int:
        return self.sizes.src_pos(int(src_rank), int(src_tok))

    def decode_src(self, pos: int) -> tuple[int, int]:
        return self.sizes.decode_src_pos(int(pos))

    def encode_fwd(self, pe: int, slot: int) -> int:
        return self.sizes.fwd_code(int(pe), int(slot))

    def decode_fwd(self, value: int) -> tuple[int, int]:
        return self.sizes.decode_fwd(int(value))


# ---- input normalisation --------------------------------------------------------------------------------


def _indices(idx, shape: EpShape, what: str = "indices") -> np.ndarray:
    """``idx`` as an int64 [n, K] array (an empty input becomes [0, K])."""
    a = np.asarray(idx)
    if a.size == 0:
        return np.zeros((0, shape.K), dtype=np.int64)
    if a.ndim != 2 or a.shape[1] != shape.K:
        raise ValueError(f"{what} must have shape [n, K={shape.K}], got {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what} must be an integer array, got {a.dtype}")
    return a.astype(np.int64, copy=False)


def _rank_list(values, shape: EpShape, what: str) -> list:
    values = list(values)
    if len(values) != shape.W:
        raise ValueError(f"{what}: expected one entry per rank (W={shape.W}), got {len(values)}")
    return values


def _all_indices(all_indices, shape: EpShape) -> list[np.ndarray]:
    out = []
    for r, idx in enumerate(_rank_list(all_indices, shape, "all_indices")):
        a = _indices(idx, shape, f"indices of rank {r}")
        if a.shape[0] > shape.M:
            raise ValueError(f"rank {r} has {a.shape[0]} tokens, more than M={shape.M}")
        out.append(a)
    return out


def _valid_pe(idx: np.ndarray, shape: EpShape) -> np.ndarray:
    """PE of every slot, -1 where the slot is dropped (sentinel or out of range)."""
    pe = np.where(idx >= 0, idx // shape.Er, -1)
    return np.where((pe >= 0) & (pe < shape.W), pe, -1)


# ---- routing (docs/ep-protocols.md §2) ---------------------------------------------------------------------


def route(indices, shape: EpShape) -> list[list[tuple[int, int]]]:
    """Per token, the ``(dest_pe, representative k)`` pairs in k order (docs/ep-protocols.md §2).

    Slots with ``idx < 0`` or ``idx // Er >= W`` are skipped; a PE appears once per token, with the lowest k.
    """
    pes = _valid_pe(_indices(indices, shape), shape)
    result = []
    for row in pes.tolist():
        seen: set[int] = set()
        pairs = []
        for k, pe in enumerate(row):
            if pe >= 0 and pe not in seen:
                seen.add(pe)
                pairs.append((pe, k))
        result.append(pairs)
    return result


def destinations(indices, shape: EpShape) -> np.ndarray:
    """bool [n, W]: ``dest[t, p]`` is True when token t is sent to PE p (p in P(t))."""
    pes = _valid_pe(_indices(indices, shape), shape)
    dest = np.zeros((pes.shape[0], shape.W), dtype=bool)
    rows, ks = np.nonzero(pes >= 0)
    dest[rows, pes[rows, ks]] = True
    return dest


def unique_dest_count(indices, shape: EpShape) -> np.ndarray:
    """int64 [n]: U(t) = |P(t)|, the number of distinct valid destination PEs of each token
    (docs/ep-protocols.md §12)."""
    return destinations(indices, shape).sum(axis=1).astype(np.int64)


def expected_recv_counts(all_indices, shape: EpShape) -> np.ndarray:
    """int64 [W]: rows each rank receives = distinct (src rank, src token) whose P(t) contains it
    (docs/ep-protocols.md §4).

    These are the uncapped counts; see :func:`recv_overflow` for the capacity R.
    """
    counts = np.zeros(shape.W, dtype=np.int64)
    for idx in _all_indices(all_indices, shape):
        counts += destinations(idx, shape).sum(axis=0)
    return counts


class RecvOverflow(NamedTuple):
    counts: np.ndarray  # int64 [W], uncapped
    capped: np.ndarray  # int64 [W], min(counts, R)
    overflow_ranks: list[int]  # ranks whose count exceeds R


def recv_overflow(all_indices, shape: EpShape) -> RecvOverflow:
    """Receive counts against the capacity R = W * Rp: which ranks would overflow a capped configuration."""
    counts = expected_recv_counts(all_indices, shape)
    return RecvOverflow(counts, np.minimum(counts, shape.R), [int(r) for r in np.nonzero(counts > shape.R)[0]])


# ---- AsyncLL receive layout (docs/ep-protocols.md §4) ------------------------------------------------------


class AsyncLLSegment(NamedTuple):
    """The rows one receiver holds from one source PE under AsyncLL."""

    src_rank: int
    start: int  # first output row: exclusive prefix sum of the counts of sources < src_rank
    tokens: list[int]  # the source's token ids, in the sender's slot order

    @property
    def stop(self) -> int:
        return self.start + len(self.tokens)


def asyncll_layout(all_indices, shape: EpShape) -> list[list[AsyncLLSegment]]:
    """Per receiving rank, one segment per source PE (zero-token sources included, as empty segments).

    AsyncLL groups output rows by source PE in PE order; within a source they follow the sender's slot order
    (docs/ep-protocols.md §4). Our sender assigns slots per destination in token order, so ``tokens`` is
    ascending; MORI's slot counter may interleave warps, which :func:`check_asyncll_layout` tolerates with
    ``strict_order=False``.
    """
    per_source = [destinations(idx, shape) for idx in _all_indices(all_indices, shape)]
    layout = []
    for dst in range(shape.W):
        segments, start = [], 0
        for src in range(shape.W):
            tokens = np.nonzero(per_source[src][:, dst])[0].tolist()
            segments.append(AsyncLLSegment(src, start, tokens))
            start += len(tokens)
        layout.append(segments)
    return layout


def check_asyncll_layout(rank: int, src_pos, total_recv: int, layout: list[list[AsyncLLSegment]], shape: EpShape,
                         *, strict_order: bool = True) -> None:  # fmt: skip
    """Assert that ``src_pos[:total_recv]`` (FlatTokenIndex per row) is ``layout[rank]``; raises AssertionError
    naming the rank, the source PE and the first offending row."""
    segments = layout[rank]
    want_total = segments[-1].stop if segments else 0
    assert int(total_recv) == want_total, f"rank {rank}: total_recv {int(total_recv)}, expected {want_total}"
    pos = np.asarray(src_pos).reshape(-1)[:want_total].astype(np.int64)
    for seg in segments:
        got = [shape.decode_src(int(v)) for v in pos[seg.start:seg.stop]]
        for offset, (src, _) in enumerate(got):
            assert src == seg.src_rank, (f"rank {rank}: row {seg.start + offset} comes from PE {src}, but rows "
                                         f"[{seg.start}, {seg.stop}) belong to PE {seg.src_rank}")  # fmt: skip
        tokens = [tok for _, tok in got]
        if strict_order:
            assert tokens == seg.tokens, (f"rank {rank}: rows from PE {seg.src_rank} hold tokens {tokens[:8]}..., "
                                          f"expected {seg.tokens[:8]}... in the sender's order")  # fmt: skip
        else:
            assert sorted(tokens) == seg.tokens, f"rank {rank}: rows from PE {seg.src_rank} hold the wrong token set"


# ---- dispatch oracle (docs/ep-protocols.md §3, §4, §12) ----------------------------------------------------


class RecvRow(NamedTuple):
    """What one received row must hold: the source token's row of each input (w/s None when absent)."""

    x: np.ndarray
    w: np.ndarray | None
    s: np.ndarray | None
    idx: np.ndarray


def _optional_rank_list(values, shape: EpShape, what: str) -> list:
    if values is None:
        return [None] * shape.W
    return _rank_list(values, shape, what)


def expected_recv_rows(all_x, all_w, all_s, all_idx, shape: EpShape) -> list[dict[tuple[int, int], RecvRow]]:
    """Per destination rank, ``{(src_rank, src_tok): RecvRow}``: the multiset the dispatch oracle checks.

    ``all_x`` / ``all_idx`` hold one array per rank; ``all_w`` / ``all_s`` may be None, or lists with None
    entries, when the configuration has no weights / scales. Rows are views into the inputs and keep their
    dtype (pass bf16 / fp8 tokens as bit patterns, :func:`to_bits`, to compare them with a kernel's output).
    """
    xs = _rank_list(all_x, shape, "all_x")
    ws = _optional_rank_list(all_w, shape, "all_w")
    ss = _optional_rank_list(all_s, shape, "all_s")
    idxs = _all_indices(all_idx, shape)
    expected: list[dict[tuple[int, int], RecvRow]] = [{} for _ in range(shape.W)]
    for r in range(shape.W):
        x = np.asarray(xs[r])
        n = idxs[r].shape[0]
        if x.shape[0] != n:
            raise ValueError(f"rank {r}: x has {x.shape[0]} rows but indices have {n}")
        w = None if ws[r] is None else np.asarray(ws[r])
        s = None if ss[r] is None else np.asarray(ss[r])
        for name, a in (("w", w), ("s", s)):
            if a is not None and a.shape[0] != n:
                raise ValueError(f"rank {r}: {name} has {a.shape[0]} rows but indices have {n}")
        dest = destinations(idxs[r], shape)
        for t, p in zip(*np.nonzero(dest)):
            t, p = int(t), int(p)
            expected[p][(r, t)] = RecvRow(x[t], None if w is None else w[t], None if s is None else s[t],
                                          idxs[r][t])  # fmt: skip
    return expected


def _bytes_2d(a: np.ndarray) -> np.ndarray:
    """[n, ...] -> uint8 [n, bytes per row]."""
    a = np.ascontiguousarray(a)
    return a.reshape(a.shape[0], -1).view(np.uint8).reshape(a.shape[0], -1)


def _fmt(v) -> str:
    v = v.item() if isinstance(v, np.generic) else v
    return f"{v} (0x{v:x})" if isinstance(v, int) and v >= 0 else repr(v)


def _first_row_mismatch(name, rank, got, want, rows, src, *, as_bytes=True, atol=0.0, show=None):
    """Raise AssertionError at the first row where got != want (both [n, ...] with equal row counts).

    ``show``: a dtype of the same size to display the differing element in (e.g. float32 for weight bits).
    """
    if got.shape[0] == 0:
        return
    if as_bytes:
        if got.dtype.itemsize != want.dtype.itemsize:
            raise AssertionError(
                f"rank {rank}: {name} element size differs: output {got.dtype} vs expected {want.dtype} "
                f"(pass both as the same representation, e.g. bit patterns from to_bits())")
        gb, wb = _bytes_2d(got), _bytes_2d(want)
        if gb.shape != wb.shape:
            raise AssertionError(f"rank {rank}: {name} row size differs: output {gb.shape[1]} bytes per row, "
                                 f"expected {wb.shape[1]}")
        bad = gb != wb
    else:
        g = got.reshape(got.shape[0], -1).astype(np.float64)
        w = want.reshape(want.shape[0], -1).astype(np.float64)
        if g.shape != w.shape:
            raise AssertionError(f"rank {rank}: {name} row shape differs: output {got.shape[1:]}, "
                                 f"expected {want.shape[1:]}")
        bad = ~(np.abs(g - w) <= atol)
    if not bad.any():
        return
    i = int(np.argmax(bad.any(axis=1)))
    j = int(np.argmax(bad[i]))
    row, (s_rank, s_tok) = rows[i], src[i]
    flat_g = np.ascontiguousarray(got.reshape(got.shape[0], -1)[i])
    flat_w = np.ascontiguousarray(want.reshape(want.shape[0], -1)[i])
    if show is not None:
        flat_g, flat_w = flat_g.view(show), flat_w.view(show)
    if as_bytes:
        elem = j // got.dtype.itemsize
        detail = (f"first differing byte {j} (element {elem}): got 0x{gb[i, j]:02x}, want 0x{wb[i, j]:02x}; "
                  f"element got {_fmt(flat_g[elem])}, want {_fmt(flat_w[elem])}")
    else:
        detail = f"first differing element {j}: got {_fmt(flat_g[j])}, want {_fmt(flat_w[j])} (atol={atol})"
    n_bad = int(bad.any(axis=1).sum())
    raise AssertionError(f"rank {rank}: {name} of recv row {row} (src rank {s_rank}, src token {s_tok}) "
                         f"differs from the source token: {detail}; {n_bad} row(s) differ in all")


def check_dispatch(rank: int, out_x, out_w, out_s, out_idx, src_pos, total_recv, expected, shape: EpShape, *,
                   atol: float = 0, complete: bool = True) -> None:
    """The docs/ep-protocols.md §12 dispatch oracle for one rank; raises AssertionError naming rank, row, (src, tok) and
    the difference.

    * ``out_x`` [>= total_recv, H] any dtype, compared as raw bytes (bf16 as uint16 bits, fp8 as uint8 bits;
      the expected rows must use the same representation). With ``atol > 0``, x is instead compared as numbers
      within ``atol`` (only meaningful for float arrays of values).
    * ``out_w`` [.., K] (compared as float32 bit patterns), ``out_s`` [.., scale_dim] (raw bytes), ``out_idx``
      [.., K] (integer values); each may be None to skip it (no weights / scales in the configuration).
    * ``src_pos`` [>= total_recv] FlatTokenIndex values ``src * S + tok``; ``total_recv`` an int or a 1-element
      array.
    * ``expected``: ``expected_recv_rows(...)[rank]``, or the whole per-rank list (then indexed by ``rank``).

    Checks: total_recv == the expected count (<= R); every src_pos decodes to a token routed here; src_pos are
    unique; every row is equal to its source token's row. Row order is free (arrival order). With
    ``complete=False`` (a receive cap dropped rows) total_recv may be smaller: the rows received are checked,
    the missing ones are not reported.
    """
    if isinstance(expected, (list, tuple)):
        expected = expected[rank]
    total = int(np.asarray(total_recv).reshape(-1)[0])
    pos_all = np.asarray(src_pos).reshape(-1).astype(np.int64)
    want_n = len(expected)
    if total < 0 or total > shape.R:
        raise AssertionError(f"rank {rank}: total_recv = {total} outside [0, R={shape.R}] (expected {want_n})")
    if pos_all.shape[0] < total:
        raise AssertionError(f"rank {rank}: src_pos has {pos_all.shape[0]} entries, fewer than total_recv={total}")
    pos = pos_all[:total]
    decoded = [shape.decode_src(p) for p in pos]

    if total > want_n or (complete and total != want_n):
        got_keys = set(decoded)
        missing = sorted(set(expected) - got_keys)
        extra = sorted(got_keys - set(expected))
        raise AssertionError(f"rank {rank}: total_recv = {total}, expected {want_n} rows; "
                             f"missing (src, tok) {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
                             f"unexpected (src, tok) {extra[:8]}{' ...' if len(extra) > 8 else ''}")

    first_row: dict[tuple[int, int], int] = {}
    for i, (p, key) in enumerate(zip(pos.tolist(), decoded)):
        if p < 0 or p >= shape.null_src or key[1] >= shape.M:
            raise AssertionError(f"rank {rank}: recv row {i}: src_pos {p} does not decode to a valid (src rank, "
                                 f"src token) (S={shape.S}, W={shape.W}, M={shape.M})")
        if key in first_row:
            raise AssertionError(f"rank {rank}: duplicate src_pos {p} = (src {key[0]}, tok {key[1]}) at recv rows "
                                 f"{first_row[key]} and {i}")
        first_row[key] = i
        if key not in expected:
            raise AssertionError(f"rank {rank}: recv row {i}: (src {key[0]}, tok {key[1]}) (src_pos {p}) was not "
                                 f"routed to this rank")
    missing = sorted(set(expected) - set(first_row)) if complete else []
    if missing:  # unreachable with unique keys and equal counts, kept as a guard
        raise AssertionError(f"rank {rank}: rows missing for (src, tok) {missing[:8]}")
    if total == 0:
        return

    rows = list(range(total))
    want = [expected[key] for key in decoded]
    out_x = np.asarray(out_x)
    if out_x.shape[0] < total:
        raise AssertionError(f"rank {rank}: out_x has {out_x.shape[0]} rows, fewer than total_recv={total}")
    _first_row_mismatch("x", rank, out_x[:total], np.stack([np.asarray(r.x) for r in want]), rows, decoded,
                        as_bytes=not atol, atol=float(atol))
    if out_w is not None:
        if any(r.w is None for r in want):
            raise ValueError("out_w given but the expected rows carry no weights")
        got = np.asarray(out_w)[:total].astype(np.float32).view(np.uint32)
        ref = np.stack([np.asarray(r.w) for r in want]).astype(np.float32).view(np.uint32)
        _first_row_mismatch("weights", rank, got, ref, rows, decoded, show=np.float32)
    if out_s is not None:
        if any(r.s is None for r in want):
            raise ValueError("out_s given but the expected rows carry no scales")
        _first_row_mismatch("scales", rank, np.asarray(out_s)[:total], np.stack([np.asarray(r.s) for r in want]),
                            rows, decoded)
    if out_idx is not None:
        got = np.asarray(out_idx)[:total].astype(np.int64)
        ref = np.stack([np.asarray(r.idx) for r in want]).astype(np.int64)
        _first_row_mismatch("indices", rank, got, ref, rows, decoded)


# ---- combine (docs/ep-protocols.md §9, §12) ----------------------------------------------------------------


def _destination_outputs(all_x, all_indices, shape: EpShape, expert) -> tuple[list[np.ndarray], list[dict], int]:
    """(per-rank indices, per rank {(t, p): the row destination p's expert returned for token t}, H): each
    destination p runs ``expert`` on its received rows (float32, ordered by source rank then token)."""
    idxs = _all_indices(all_indices, shape)
    xs = [np.asarray(x, dtype=np.float32) for x in _rank_list(all_x, shape, "all_x")]
    dests = [destinations(idx, shape) for idx in idxs]
    H = next((x.shape[1] for x in xs if x.ndim == 2), 0)
    for r, x in enumerate(xs):
        if x.shape[0] != idxs[r].shape[0]:
            raise ValueError(f"rank {r}: x has {x.shape[0]} rows but indices have {idxs[r].shape[0]}")
    outputs: list[dict] = [{} for _ in range(shape.W)]
    for p in range(shape.W):
        srcs = [(r, t) for r in range(shape.W) for t in np.nonzero(dests[r][:, p])[0].tolist()]
        rows = np.stack([xs[r][t] for r, t in srcs]) if srcs else np.zeros((0, H), dtype=np.float32)
        y = np.asarray(expert(rows))
        if y.shape != rows.shape:
            raise ValueError(f"expert returned shape {y.shape} for input rows of shape {rows.shape}")
        for (r, t), yrow in zip(srcs, y):
            outputs[r][(t, p)] = yrow
    return idxs, outputs, H


def reference_combine(all_x, all_indices, shape: EpShape, *,
                      expert: Callable[[np.ndarray], np.ndarray] = lambda rows: rows) -> list[np.ndarray]:
    """The docs/ep-protocols.md §12 model, end to end: per rank ``out [n, H]`` float32.

    Each destination p runs ``y = expert(rows)`` on its received rows (float32 [n_recv, H], ordered by source
    rank then token; ``expert`` must return the same shape); the owner then sums, unweighted, the rows of
    every p in P(t) (float64 accumulation, one rounding to float32). With the identity expert,
    ``out[t] = U(t) * x[t]``. Tokens with an empty P(t) give zero rows.
    """
    idxs, outputs, H = _destination_outputs(all_x, all_indices, shape, expert)
    acc = [np.zeros((idx.shape[0], H), dtype=np.float64) for idx in idxs]
    for r, rows in enumerate(outputs):
        for (t, _p), yrow in rows.items():
            acc[r][t] += yrow
    return [a.astype(np.float32) for a in acc]


def reference_combine_weights(w, indices, shape: EpShape):
    """``U(t) * w[t]`` (float32), the expected combine ``out_weights`` when the dispatched weights are passed back.

    ``w`` / ``indices`` are one rank's arrays (returns one array) or per-rank lists (returns a list).
    """
    if isinstance(w, (list, tuple)):
        return [reference_combine_weights(wr, ir, shape) for wr, ir in zip(w, indices, strict=True)]
    u = unique_dest_count(indices, shape)
    w = np.asarray(w, dtype=np.float32).reshape(u.shape[0], shape.K)
    return (w.astype(np.float64) * u[:, None]).astype(np.float32)


# ---- nodes: the inter-node kernel types (docs/ep-protocols.md §15) ---------------------------------------


def remote_nodes(indices, shape: EpShape, topology: EpTopology, rank: int) -> list[tuple[int, ...]]:
    """Per token of ``rank``: the nodes other than the rank's own holding a PE of P(t), ascending (where an
    inter-node kernel sends the token, once per node, to the proxy ``topology.proxy(rank, node)``)."""
    _check_topology(shape, topology)
    home = topology.node_of(rank)
    dest = destinations(indices, shape)
    return [tuple(sorted({topology.node_of(p) for p in np.nonzero(row)[0].tolist()} - {home})) for row in dest]


INTERNODE_KIND_NAMES = {KernelType.InterNode: "V0", KernelType.InterNodeV1: "V1", KernelType.InterNodeV1LL: "V1LL"}


def _internode_kind(kind) -> str:
    """``"V0"``, ``"V1"`` or ``"V1LL"`` for one of these names or an inter-node ``KernelType``."""
    if isinstance(kind, KernelType):
        if kind not in INTERNODE_KIND_NAMES:
            raise ValueError(f"{kind.name} is no inter-node kernel type")
        return INTERNODE_KIND_NAMES[kind]
    if kind not in INTERNODE_KIND_NAMES.values():
        raise ValueError(f"kind must be 'V0', 'V1' or 'V1LL' (or an inter-node KernelType), got {kind!r}")
    return kind


def internode_records(all_indices, shape: EpShape, topology: EpTopology, kind) -> np.ndarray:
    """int64 [W, W]: ``records[r, q]`` = the token records source PE r puts to PE q of another node in one
    dispatch (docs/ep-protocols.md §15). ``"V1"``: once per token to the proxy of each remote
    node holding a PE of P(t); ``"V1LL"``: every token to the proxy of every remote node; ``"V0"``: once per
    token to each remote PE of P(t). Sentinel and out-of-range slots are dropped (all three types)."""
    _check_topology(shape, topology)
    name = _internode_kind(kind)
    records = np.zeros((shape.W, shape.W), dtype=np.int64)
    for r, idx in enumerate(_all_indices(all_indices, shape)):
        dest = destinations(idx, shape)
        for node in range(topology.nodes):
            if node == topology.node_of(r):
                continue
            pes = list(topology.node_pes(node))
            if name == "V0":
                records[r, pes] += dest[:, pes].sum(axis=0)
            elif name == "V1":
                records[r, topology.proxy(r, node)] += int(dest[:, pes].any(axis=1).sum())
            else:
                records[r, topology.proxy(r, node)] += idx.shape[0]
    return records


def predicted_internode_sends(all_indices, shape: EpShape, topology: EpTopology, kind) -> np.ndarray:
    """int64 [W]: the token records each source rank sends to other nodes (the "RDMA" count), the row sums
    of :func:`internode_records`: ``"V1"`` sends a token once to each remote node of its P(t); ``"V1LL"`` sends
    every token to every remote node (its 64-token chunks are not filtered); ``"V0"`` sends it once to each
    remote PE of its P(t)."""
    return internode_records(all_indices, shape, topology, kind).sum(axis=1)


def row_writers(all_indices, shape: EpShape, topology: EpTopology, kind) -> np.ndarray:
    """int64 [W]: the output rows each PE writes in one dispatch (and reads back in the combine): a row on a
    PE of the source's node is written by the source itself; one on a remote node by the PE that received
    the record (``"V1"`` / ``"V1LL"``: the node's proxy, which forwards it to its node; ``"V0"``: the
    destination itself). Sums to the receive counts' sum (uncapped)."""
    _check_topology(shape, topology)
    name = _internode_kind(kind)
    writers = np.zeros(shape.W, dtype=np.int64)
    for r, idx in enumerate(_all_indices(all_indices, shape)):
        rows = destinations(idx, shape).sum(axis=0)
        for p in range(shape.W):
            if topology.node_of(p) == topology.node_of(r):
                writers[r] += rows[p]
            else:
                writers[p if name == "V0" else topology.proxy(r, topology.node_of(p))] += rows[p]
    return writers


def _token_elem(dtype_name: str) -> int:
    return {"float32": 4, "bf16": 2, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1}[canonical_dtype(dtype_name)]


def predicted_traffic(all_indices, shape: EpShape, topology: EpTopology, kind, *, hidden: int,
                      dispatch_dtype: str, combine_dtype: str = "bf16", scale_bytes: int = 0,
                      scales_given: bool = True, has_w: bool = True) -> list[dict[str, int]]:
    """Per PE, the bytes one dispatch + combine adds to each inter-node traffic counter (``op.internode_traffic()``
    deltas), keyed by ``ep_schema.TRAFFIC_COUNTERS``, as the kernels count them:

    * ``dispatch_rdma`` (the sender): ``EpSizes.record_bytes`` at the dispatch dtype with the config's
      ``scale_bytes`` (the record layout) per record put to another node (:func:`internode_records`);
    * ``dispatch_xgmi`` (the PE writing the row, :func:`row_writers`): ``H*elem + 8K + 4 + sb`` per output row
      written to a PE of its own node, sb = ``scale_bytes`` (``scales_given=False``: 0, for a count of only the
      scale bytes a call passed; the kernels count the config's for every row);
    * ``combine_rdma`` (the record's receiver, sending a partial back): ``EpSizes.partial_bytes`` at the combine
      dtype per record it received;
    * ``combine_xgmi`` (the PE gathering the row): ``H*elem`` at the combine dtype, ``+ 4K`` when the combine
      was given weights (``has_w``), per row read from a PE of its node.

    Uncapped: rows dropped for want of receive capacity are not modelled.
    """
    records = internode_records(all_indices, shape, topology, kind)
    writers = row_writers(all_indices, shape, topology, kind)
    d_elem, c_elem, K, H = _token_elem(dispatch_dtype), _token_elem(combine_dtype), shape.K, int(hidden)
    base = shape.sizes._replace(hidden=H, gpu_per_node=topology.gpu_per_node)
    record = base._replace(token_bytes=d_elem, scale_bytes=int(scale_bytes)).record_bytes
    partial = base._replace(token_bytes=c_elem).partial_bytes
    sb = int(scale_bytes) if scales_given else 0
    row_in, row_out = H * d_elem + 8 * K + 4 + sb, H * c_elem + 4 * K * bool(has_w)
    sent, received = records.sum(axis=1), records.sum(axis=0)
    return [dict(zip(TRAFFIC_COUNTERS, (int(sent[p]) * record, int(writers[p]) * row_in, int(received[p]) * partial,
                                        int(writers[p]) * row_out)))
            for p in range(shape.W)]  # fmt: skip


def hierarchical_combine(all_x, all_indices, shape: EpShape, topology: EpTopology, dtype_name: str, *,
                         expert: Callable[[np.ndarray], np.ndarray] = lambda rows: rows) -> list[np.ndarray]:
    """InterNodeV1/V1LL's combine, per rank ``out [n, H]`` float32 (values of ``dtype_name``): for each token,
    each node's partial (the fp32 sum of the rows of that node's PEs in P(t)) is stored in ``dtype_name``,
    then the at most N partials are summed in fp32 and rounded once: two roundings where the flat combine
    (``reference_combine``) has one. ``expert`` as in ``reference_combine``."""
    _check_topology(shape, topology)
    idxs, outputs, H = _destination_outputs(all_x, all_indices, shape, expert)
    result = []
    for r, rows in enumerate(outputs):
        partials: dict[tuple[int, int], np.ndarray] = {}  # (token, node) -> fp32 sum
        for (t, p), yrow in rows.items():
            key = (t, topology.node_of(p))
            partials[key] = partials.get(key, np.zeros(H, dtype=np.float32)) + yrow.astype(np.float32)
        out = np.zeros((idxs[r].shape[0], H), dtype=np.float32)
        for (t, _node), partial in sorted(partials.items()):
            out[t] += quantize(partial, dtype_name)
        result.append(quantize(out, dtype_name))
    return result


def _check_topology(shape: EpShape, topology: EpTopology) -> None:
    if topology.world_size != shape.W:
        raise ValueError(f"topology of {topology.world_size} PEs for a shape of {shape.W}")
    problems = topology_problems(topology.world_size, topology.gpu_per_node)
    if problems:
        raise ValueError("; ".join(problems))


# unit roundoff (half an ulp at 1, round to nearest) and smallest positive value of each combine dtype
_ROUNDING = {"float32": (2.0**-24, 2.0**-149), "bf16": (2.0**-8, 2.0**-133), "fp8_e4m3fn": (2.0**-4, 2.0**-9),
             "fp8_e4m3fnuz": (2.0**-4, 2.0**-10)}  # fmt: skip


def hierarchical_bound(dtype_name: str, partials: int) -> tuple[float, float]:
    """(atol, rtol) bounding ``|out - U(t) x[t]|`` of a hierarchical combine with the identity expert
    (:func:`hierarchical_combine`), where ``partials`` bounds the partials summed per token (N for
    V1/V1LL; W covers every scheme).

    With the identity expert node n's partial is ``c_n x`` (exact in fp32: c_n <= G), all of x's sign, so
    ``Σ c_n |x| = U |x|``. Rounding each partial to the dtype errs by at most ``u Σ |c_n x| = u U|x|`` (u the
    unit roundoff); the fp32 sum of at most ``partials`` terms by ``(partials - 1) 2^-24 (1 + u) U|x|``; the
    final rounding by ``u`` of that sum, ``<= u (1 + u + ...) U|x|``. Hence
    ``rtol = 2u + u² + (partials - 1) 2^-24 (1 + u)²`` and, for results in the dtype's subnormal range,
    ``atol`` = its smallest positive value (two half-ulp roundings). The flat combine's single rounding
    (``u U|x|``) is within it.
    """
    u, tiny = _ROUNDING[canonical_dtype(dtype_name)]
    if not isinstance(partials, (int, np.integer)) or partials < 1:
        raise ValueError(f"partials must be a positive integer, got {partials!r}")
    return tiny, 2 * u + u * u + (int(partials) - 1) * 2.0**-24 * (1 + u) ** 2


def check_hierarchical_combine(out, x, indices, shape: EpShape, dtype_name: str, *, copies=None,
                               rank: int | None = None) -> None:
    """The combine check of the inter-node kernel types for one rank: ``out[t] ≈ copies[t] * x[t]`` within
    :func:`hierarchical_bound` (``partials = W``), for t in [0, n). ``copies`` defaults to U(t) (every
    destination received the token); with a receive cap pass the number of PEs that hold a row of each token.
    ``out`` / ``x`` float32 values as in :func:`check_combine`. NaN never passes."""
    idx = _indices(indices, shape)
    n = idx.shape[0]
    x = np.asarray(x, dtype=np.float32)
    if x.shape[0] != n:
        raise ValueError(f"x has {x.shape[0]} rows but indices have {n}")
    c = unique_dest_count(idx, shape) if copies is None else np.asarray(copies, dtype=np.int64).reshape(-1)
    if c.shape[0] != n:
        raise ValueError(f"copies has {c.shape[0]} entries but indices have {n} tokens")
    atol, rtol = hierarchical_bound(dtype_name, shape.W)
    want = x.astype(np.float64) * c[:, None]
    _check_close("combine output", "?" if rank is None else rank, out, want, atol, rtol, n)


def combine_tolerance(dtype_name: str, quant_type: str = "none") -> tuple[float, float]:
    """(atol, rtol) of the docs/ep-protocols.md §12 combine check for an output dtype and a wire quantization."""
    quant = {"none": None, "fp8_direct_cast": 1e-1, "fp8_blockwise": 7e-2}
    if quant_type not in quant:
        raise ValueError(f"no tolerance for quant_type {quant_type!r} (known: {sorted(quant)})")
    if quant[quant_type] is not None:
        return quant[quant_type], quant[quant_type]
    return {"float32": (1e-5, 1e-5), "bf16": (1e-2, 1e-2), "fp8_e4m3fn": (1e-1, 1e-1),
            "fp8_e4m3fnuz": (1e-1, 1e-1)}[canonical_dtype(dtype_name)]  # fmt: skip


def _check_close(what, rank, got, want, atol, rtol, n):
    got = np.asarray(got)
    if got.shape[0] < n:
        raise AssertionError(f"rank {rank}: {what} has {got.shape[0]} rows, fewer than n={n}")
    g = got[:n].astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"rank {rank}: {what} rows have shape {g.shape[1:]}, expected {w.shape[1:]}")
    if n == 0:
        return
    ok = np.abs(g - w) <= atol + rtol * np.abs(w)  # NaN compares False: never passes
    if ok.all():
        return
    bad = ~ok
    t = int(np.argmax(bad.reshape(n, -1).any(axis=1)))
    j = int(np.argmax(bad.reshape(n, -1)[t]))
    gv, wv = float(g.reshape(n, -1)[t, j]), float(w.reshape(n, -1)[t, j])
    raise AssertionError(f"rank {rank}: {what} of token {t}, element {j}: got {gv!r}, expected {wv!r} "
                         f"(|diff| {abs(gv - wv)!r}, atol={atol}, rtol={rtol}); "
                         f"{int(bad.sum())} element(s) of {int(bad.reshape(n, -1).any(axis=1).sum())} token(s) "
                         f"out of tolerance")


def check_combine(out, x, indices, shape: EpShape, dtype_name: str, *, atol: float | None = None,
                  rtol: float | None = None, quant_type: str = "none", rank: int | None = None) -> None:
    """The docs/ep-protocols.md §12 combine check for one rank: ``out[t] ≈ cast(U(t) * x[t])`` for t in [0, n).

    ``out`` [>= n, H] holds output values (float32; bf16/fp8 outputs converted to float32 or via
    :func:`from_bits`); ``x`` [n, H] the rank's dispatch input values, ``indices`` its own routing.
    The expectation is rounded to ``dtype_name`` (docs/ep-protocols.md §12: ``(float(x) * U).to(dtype)``).
    Default tolerances come
    from :func:`combine_tolerance`. NaN never passes. ``rank`` only labels the message.
    """
    idx = _indices(indices, shape)
    n = idx.shape[0]
    x = np.asarray(x, dtype=np.float32)
    if x.shape[0] != n:
        raise ValueError(f"x has {x.shape[0]} rows but indices have {n}")
    d_atol, d_rtol = combine_tolerance(dtype_name, quant_type)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    u = unique_dest_count(idx, shape)
    want = quantize((x.astype(np.float64) * u[:, None]).astype(np.float32), dtype_name)
    _check_close("combine output", "?" if rank is None else rank, out, want, atol, rtol, n)


def check_combine_weights(out_w, w, indices, shape: EpShape, *, atol: float = 1e-5, rtol: float = 1e-5,
                          rank: int | None = None) -> None:
    """Combine ``out_weights[t] ≈ U(t) * w[t]`` for t in [0, n) (docs/ep-protocols.md §12: atol = rtol = 1e-5)."""
    want = reference_combine_weights(w, indices, shape)
    _check_close("combine out_weights", "?" if rank is None else rank, out_w, want, atol, rtol, want.shape[0])


# ---- standard-MoE (DeepEP) layout (docs/ep-protocols.md §9) ------------------------------------------------


def convert_dispatch_output_ref(out_x, out_idx, total_recv, rank: int, shape: EpShape):
    """Dispatch output [R, H] -> the per-local-expert layout ``(packed_recv_x, packed_recv_count, src_info)``.

    For each valid recv row i (in row order) and each k (in order) with ``out_idx[i, k] // Er == rank``, row i
    is appended to local expert ``e = out_idx[i, k] % Er``. Returns ``packed_recv_x`` [Er, W*M, H] (the
    dtype of ``out_x``, unused rows zero), ``packed_recv_count`` int32 [Er] and ``packed_recv_src_info``
    int32 [Er, W*M] = the recv row index (our convention, see the module docstring; unused entries -1).
    """
    out_x = np.asarray(out_x)
    total = int(np.asarray(total_recv).reshape(-1)[0])
    idx = _indices(np.asarray(out_idx)[:total], shape, "out_idx")
    cap = shape.S
    H = out_x.shape[1:] if out_x.ndim >= 2 else (0,)
    packed_x = np.zeros((shape.Er, cap, *H), dtype=out_x.dtype)
    count = np.zeros(shape.Er, dtype=np.int32)
    src_info = np.full((shape.Er, cap), -1, dtype=np.int32)
    lo = rank * shape.Er
    for i, row in enumerate(idx.tolist()):
        for e in row:
            if lo <= e < lo + shape.Er:
                le = e - lo
                j = int(count[le])
                if j >= cap:
                    raise ValueError(f"local expert {le} of rank {rank} receives more than W*M={cap} entries")
                packed_x[le, j] = out_x[i]
                src_info[le, j] = i
                count[le] += 1
    return packed_x, count, src_info


def convert_combine_input_ref(packed_recv_x, packed_recv_src_info, packed_recv_count, out_idx, out_w, total_recv,
                              rank: int, shape: EpShape) -> np.ndarray:
    """Expert outputs in the per-local-expert layout -> the combine input [R, H] float32.

    Row i (< total_recv) = ``Σ_k out_w[i, k] * packed_recv_x[e_k][j]`` over the k whose expert is local, where
    j is the position of row i in expert ``e_k``'s list (found through ``packed_recv_src_info``; a row listed
    twice under one expert is matched occurrence by occurrence in k order). float64 accumulation, rounded once
    to float32; rows >= total_recv are zero. With identity experts row i = (Σ_{k local} w[i, k]) * x[i].
    """
    px = np.asarray(packed_recv_x, dtype=np.float32)
    info = np.asarray(packed_recv_src_info).astype(np.int64)
    count = np.asarray(packed_recv_count).astype(np.int64).reshape(-1)
    total = int(np.asarray(total_recv).reshape(-1)[0])
    idx = _indices(np.asarray(out_idx)[:total], shape, "out_idx")
    w = np.asarray(out_w, dtype=np.float32)[:total].reshape(total, shape.K)
    H = px.shape[2:]
    result = np.zeros((shape.R, *H), dtype=np.float64)
    positions: dict[tuple[int, int], list[int]] = {}
    for e in range(shape.Er):
        for j in range(int(count[e])):
            positions.setdefault((e, int(info[e, j])), []).append(j)
    lo = rank * shape.Er
    for i, row in enumerate(idx.tolist()):
        for k, ge in enumerate(row):
            if lo <= ge < lo + shape.Er:
                le = ge - lo
                slots = positions.get((le, i))
                if not slots:
                    raise ValueError(f"recv row {i}, k={k}: no entry for local expert {le} in packed_recv_src_info")
                result[i] += float(w[i, k]) * px[le, slots.pop(0)].astype(np.float64)
    return result.astype(np.float32)


# ---- dtypes and bit patterns ----------------------------------------------------------------------------

DTYPES = ("float32", "bf16", "fp8_e4m3fn", "fp8_e4m3fnuz")
_ALIASES = {
    "float32": "float32", "f32": "float32", "fp32": "float32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp8_e4m3fn": "fp8_e4m3fn", "float8_e4m3fn": "fp8_e4m3fn", "fp8_ocp": "fp8_e4m3fn", "e4m3fn": "fp8_e4m3fn",
    "fp8_e4m3fnuz": "fp8_e4m3fnuz", "float8_e4m3fnuz": "fp8_e4m3fnuz", "fp8_fnuz": "fp8_e4m3fnuz",
    "e4m3fnuz": "fp8_e4m3fnuz",
}  # fmt: skip
# The ml_dtypes type of each narrow dtype: its numpy casts round to nearest even and are our encoders and
# decoders (test_dtype_encoders.py pins them bit for bit to exact rounding).
_ML_DTYPE = {"bf16": ml_dtypes.bfloat16, "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
             "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz}  # fmt: skip
_BITS = {"bf16": np.uint16, "fp8_e4m3fn": np.uint8, "fp8_e4m3fnuz": np.uint8}


def canonical_dtype(dtype_name: str) -> str:
    """One of :data:`DTYPES` for a name or alias (``torch.bfloat16`` style ``"torch.bfloat16"`` accepted too)."""
    key = str(dtype_name).lower().removeprefix("torch.")
    if key not in _ALIASES:
        raise ValueError(f"unknown dtype {dtype_name!r} (known: {', '.join(DTYPES)})")
    return _ALIASES[key]


def to_bits(values, dtype_name: str, *, saturate: bool = False) -> np.ndarray:
    """Bit patterns of ``values`` (first cast to float32) in a dtype, rounding to nearest even.

    float32 -> uint32 (a view of the values); bf16 -> uint16 (NaN -> quiet NaN 0x7fc0 with the sign);
    fp8_e4m3fn -> uint8 (bias 7, max 448, no inf, NaN 0x7f/0xff; -0 = 0x80); fp8_e4m3fnuz -> uint8 (bias 8,
    max 240, no inf, NaN 0x80 only, no negative zero). fp8 overflow (including ±inf) gives NaN like a torch
    cast, or ±max with ``saturate=True`` (HIP's saturating cast); fp8 values whose rounding stays at max
    (e4m3fn: |x| <= 464) give max.
    """
    name = canonical_dtype(dtype_name)
    a = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    if name == "float32":
        if saturate:
            raise ValueError("saturate=True is only for the fp8 dtypes, not float32")
        return a.view(np.uint32).copy()
    if saturate:
        if name == "bf16":
            raise ValueError("saturate=True is only for the fp8 dtypes, not bf16")
        # ml_dtypes' cast does not saturate (overflow is NaN); clamping first is HIP's saturating cast.
        fp8_max = float(ml_dtypes.finfo(_ML_DTYPE[name]).max)
        a = np.clip(a, -fp8_max, fp8_max)
    with np.errstate(invalid="ignore"):  # the bf16 cast of a NaN warns; it gives the quiet NaN documented above
        return a.astype(_ML_DTYPE[name]).view(_BITS[name])


def from_bits(bits, dtype_name: str) -> np.ndarray:
    """float32 values of bit patterns (uint32 / uint16 / uint8 as produced by :func:`to_bits`; of a wider
    integer only the low 16 bits count for bf16, the low 8 for fp8). A NaN code gives a NaN with the code's
    sign bit (e4m3fn 0x7f / 0xff: +NaN / -NaN; FNUZ 0x80: -NaN), so ``to_bits(from_bits(c))`` is ``c`` for
    every fp8 code."""
    name = canonical_dtype(dtype_name)
    b = np.asarray(bits)
    if not np.issubdtype(b.dtype, np.integer):
        raise ValueError(f"bits must be an integer array, got {b.dtype}")
    if name == "float32":
        return np.ascontiguousarray(b.astype(np.uint32)).view(np.float32)
    low_bits = b.astype(np.int64) & np.iinfo(_BITS[name]).max
    return low_bits.astype(_BITS[name]).view(_ML_DTYPE[name]).astype(np.float32)


def quantize(values, dtype_name: str) -> np.ndarray:
    """float32 values rounded to a dtype and back (identity for float32)."""
    if canonical_dtype(dtype_name) == "float32":
        return np.asarray(values, dtype=np.float32).copy()
    return from_bits(to_bits(values, dtype_name), dtype_name)


def representable_values(dtype_name: str) -> np.ndarray:
    """float32: every finite value of a bf16 / fp8 dtype, one per code (so +0 and -0 both where they exist)."""
    name = canonical_dtype(dtype_name)
    if name == "float32":
        raise ValueError("representable_values is only for bf16 and fp8 dtypes")
    codes = np.arange(1 << 16 if name == "bf16" else 256)
    vals = from_bits(codes.astype(np.uint16 if name == "bf16" else np.uint8), name)
    return vals[np.isfinite(vals)]


# ---- input generators (docs/ep-protocols.md §12) -----------------------------------------------------------

ROUTING_MODES = ("random", "random_dup", "spread", "spread_pes", "all_to_one", "sentinel", "round_robin",
                 "remote_round_robin")


def _distinct(rng: np.random.Generator, n: int, pool: int, k: int) -> np.ndarray:
    """[n, k] rows of k distinct values from [0, pool), each row a random permutation prefix."""
    if k > pool:
        raise ValueError(f"cannot pick {k} distinct experts out of {pool}")
    if n == 0:
        return np.zeros((0, k), dtype=np.int64)
    return np.argsort(rng.random((n, pool)), axis=1)[:, :k]


def make_routing(mode: str, n_tokens_per_rank: Sequence[int], shape: EpShape, seed: int) -> list[np.ndarray]:
    """Per-rank int32 [n_r, K] global expert ids, seeded (``np.random.default_rng(seed)``).

    * ``random``: per token K distinct experts out of W*Er (a random permutation prefix).
    * ``random_dup``: K independent draws (duplicate experts within a token possible, as in the v2 tests).
    * ``spread``: K == W (else ValueError); one expert on each rank in a random slot order: every token goes
      everywhere, recv = Σ n.
    * ``spread_pes``: K <= W; one expert on each of K distinct ranks (a random choice per token): every token
      reaches K PEs, the most a top-K routing can (``spread`` when K == W).
    * ``all_to_one``: K distinct experts of rank 0 (needs K <= Er).
    * ``sentinel``: ``random``, then about 1/4 of the slots set to -1 and about 1/8 of the tokens (at least one
      when n >= 4) entirely -1.
    * ``round_robin``: slot k of token t on rank r gets expert ``((r*M + t)*K + k) % (W*Er)``.
    * ``remote_round_robin``: round robin over the experts of the other ranks only (needs W >= 2 and
      K <= (W-1)*Er).
    """
    W, Er, K, M = shape.W, shape.Er, shape.K, shape.M
    counts = [int(n) for n in _rank_list(n_tokens_per_rank, shape, "n_tokens_per_rank")]
    for r, n in enumerate(counts):
        if not 0 <= n <= M:
            raise ValueError(f"rank {r}: token count {n} outside [0, M={M}]")
    if mode not in ROUTING_MODES:
        raise ValueError(f"unknown routing mode {mode!r} (known: {', '.join(ROUTING_MODES)})")
    if mode == "spread" and K != W:
        raise ValueError(f"spread routing needs K == W (K={K}, W={W})")
    if mode == "spread_pes" and K > W:
        raise ValueError(f"spread_pes routing needs K <= W (K={K}, W={W})")
    if mode == "all_to_one" and K > Er:
        raise ValueError(f"all_to_one routing needs K <= Er (K={K}, Er={Er})")
    if mode == "remote_round_robin" and (W < 2 or K > (W - 1) * Er):
        raise ValueError(f"remote_round_robin needs W >= 2 and K <= (W-1)*Er (W={W}, Er={Er}, K={K})")
    rng = np.random.default_rng(seed)
    E = W * Er
    result = []
    for r, n in enumerate(counts):
        if mode in ("random", "sentinel"):
            idx = _distinct(rng, n, E, K)
        elif mode == "random_dup":
            idx = rng.integers(0, E, size=(n, K))
        elif mode == "spread":
            local = rng.integers(0, Er, size=(n, W))
            order = _distinct(rng, n, W, W)  # slot k -> rank order[t, k]
            idx = order * Er + np.take_along_axis(local, order, axis=1)
        elif mode == "spread_pes":
            idx = _distinct(rng, n, W, K) * Er + rng.integers(0, Er, size=(n, K))
        elif mode == "all_to_one":
            idx = _distinct(rng, n, Er, K)
        elif mode == "round_robin":
            g = (r * M + np.arange(n)[:, None]) * K + np.arange(K)[None, :]
            idx = g % E
        else:  # remote_round_robin
            g = np.arange(n)[:, None] * K + np.arange(K)[None, :] + r * M * K
            pe = (r + 1 + g % (W - 1)) % W
            idx = pe * Er + (g // (W - 1)) % Er
        idx = np.asarray(idx, dtype=np.int64).reshape(n, K)
        if mode == "sentinel" and n:
            idx = np.where(rng.random((n, K)) < 0.25, -1, idx)
            all_neg = rng.random(n) < 0.125
            if n >= 4 and not all_neg.any():
                all_neg[rng.integers(0, n)] = True
            idx[all_neg] = -1
        result.append(idx.astype(np.int32))
    return result


def make_token_counts(shape: EpShape, seed: int, *, use_max: bool = False, low: int = 1) -> list[int]:
    """Per-rank token counts: uniform in [low, M] (docs/ep-protocols.md §12: ``randint(0, M]``), or all
    M with ``use_max``."""
    if use_max:
        return [shape.M] * shape.W
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.integers(low, shape.M + 1, size=shape.W)]


def make_tokens(n: int, H: int, dtype_name: str, seed: int) -> np.ndarray:
    """float32 [n, H] values exactly representable in ``dtype_name``.

    float32 and bf16: standard normal (bf16 rounded to nearest even); fp8: uniform over the finite
    representable values. Use :func:`to_bits` for the kernel's bit patterns.
    """
    name = canonical_dtype(dtype_name)
    rng = np.random.default_rng(seed)
    if name in ("float32", "bf16"):
        return quantize(rng.standard_normal((n, H), dtype=np.float32), name)
    return rng.choice(representable_values(name), size=(n, H)).astype(np.float32)


def make_weights(n: int, K: int, seed: int) -> np.ndarray:
    """float32 [n, K] uniform in [0, 1) (docs/ep-protocols.md §12 ``rand``)."""
    return np.random.default_rng(seed).random((n, K), dtype=np.float32)


def make_scales(n: int, scale_dim: int, seed: int, scale_type_size: int = 4) -> np.ndarray:
    """Scales [n, scale_dim]: float32 ``rand`` (size 4), or its fp8 FNUZ bit patterns as uint8 (size 1)
    (docs/ep-protocols.md §12)."""
    s = np.random.default_rng(seed).random((n, scale_dim), dtype=np.float32)
    if scale_type_size == 4:
        return s
    if scale_type_size == 1:
        return to_bits(s, "fp8_e4m3fnuz")
    raise ValueError(f"scale_type_size must be 1 or 4, got {scale_type_size}")
