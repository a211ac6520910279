"""The pieces every EP kernel family is built from (IntraNode, IntraNodeLL, AsyncLL), on ``Builder``.

API (values are ``ir.Value`` objects; each piece appends ops at the frame's builder and returns the values
later code uses, as a small named tuple):

* ``EpKernelConfig``: the compile-time configuration (the EP op's attributes); derived sizes come from
  ``ep_schema.EpSizes`` (``cfg.sizes``), the one owner of S, R, the null forward code and row bytes.
* ``open_kernel(cfg, family, generator=..., block=..., before=...) -> KernelFrame``: a ``gpu.func``
  ``ep_<family>_<dtype>`` with the parameters of ``ep_schema.KERNELS[family]`` (named, typed, in order), its
  fixed block size, and the shared prologue. ``KernelFrame`` holds the builder ``b``, ``cfg``, the
  parameters by schema name (``f.params.x`` or ``f.params["x"]``) and the prologue values (``qp, me, c0i,
  c1i, false, true, K, W, R, NULL, wave, c0x, c1x, Kx, tid_i, lane_i, lane, bid_i, nb_i, wpb, wave_x,
  warp_in_block, gw, nw, null_ptr, is_k, lane0, row``: the call's row bytes); ``f.present(ptr)`` is ``ptr != null``. Called inside
  the MLIR context (the pass's); the kernel ends with ``f.b.gpu_return()``.
* ``TokenInputs`` / ``token_inputs(f)``: a dispatch's constants (experts per rank, S, row bytes) and
  whether weights / scales are given.
* ``dispatch_round(f) -> DispatchRound``: the round parity, the slot counter of this round, and the
  clearing of the other one (the IntraNode / IntraNodeLL double buffering).
* ``replay_or_reserve(f, replay, recorded, reserve)``: a reservation that replays a routing handle's
  recorded slots (no atomics) when ``replay`` holds.
* ``route_token(f, token, inputs, reserve=..., capacity=, count_dest=) -> Route``: one token's
  destinations (dedup per PE, slot reservation, overflow and invalid-id counts, forward map); ``reserve(f, pe) -> slot``
  builds the reservation, ``reserve_on_peer(slot_ctr)`` is the remote one; ``share=TokenShare(i, n)``
  routes warp i's share of the destinations when n warps serve a token (``token_shares``).
* ``representative_ranks(f, flag32)``: per lane, the flags set below it and their total (compaction).
* ``token_source(f, route, inputs) -> TokenSource``: the token's source row and this lane's weight.
* ``send_row_to_peers(f, route, source, inputs, dbase)``: the row to every destination at once.
* ``send_to_destinations(f, route, source, inputs, dbase, rows=, scales=)``: per destination the row,
  scales, expert ids, weights and source position.
* ``dispatch_completion(f, rnd)``: every block arrives, the last one runs the count handshake and the
  device-side round advance.
* ``reduce_tokens(f, rowc, source_row, uniform=, narrow=)``: the combines' per-token sum of K rows;
  ``source_row(entry: ForwardEntry) -> (row, weight_row)`` gives source k's addresses.
* ``return_rows(f, locate, dst_x, dst_w, rowc, has_iw)``: every received row back to its owner;
  ``locate(i) -> (owner, dest_row)``.
* ``WireRows`` (``cfg.wire``, a quantizing bf16 combine's, else None) and ``combine_row_stride(f, rowc)``:
  the combine's wire quantization (mori_compiler/wire_quant.py): ``return_rows`` quantizes each row as it
  writes it to the owner (``mori_comm.quantize_row``) and ``reduce_tokens`` dequantizes in its fp32 sum
  (``mori_comm.accumulate_quantized_rows``); the staging / combine-region rows are then wire rows,
  ``combine_row_stride`` bytes apart (the callers' ``source_row`` address them so).

Ordering each piece provides (who writes, who waits; docs/ep-protocols.md has the protocols whole):

* ``route_token``: slot reservations are relaxed system-scope fetch-adds on the destination's counter;
  the forward map and the overflow, invalid-id and per-destination counts are local relaxed
  stores/atomics (the status words are read by the host after the call, never waited on). Nothing
  here is published: the kernel's completion (grid barrier + count handshake, or a device barrier)
  orders it.
* ``send_*``: relaxed system-scope stores to the peers (the metadata through peer addresses from
  ``mori_shmem.ptr``, the rows by ``mori_comm.row_copy*``); they become visible to a peer only through a
  later release (the completion's fences).
* ``dispatch_round``: the other parity's counter is cleared by thread 0 of block 0 at the start of round r;
  nobody can touch it then (round r - 1 is complete, and no peer starts round r + 1 before our round-r
  count reaches it, which is after the clear and a release fence).
* ``dispatch_completion``: ``grid_last_arrival`` (each block's release before its arrival, the last
  block's acquire after it) then, in the last block, ``count_signal`` (release fence before the counts,
  acquire fence after waiting for the peers'), so every payload store a peer made to us is visible once
  its count has arrived; the round counter advances on the device (CUDA-graph replay is correct).
* ``return_rows``: relaxed system-scope stores to the owners, published by the barrier the caller puts
  after it (push combine: ``grid_barrier`` then ``device_barrier``).
* ``reduce_tokens``: plain loads of what the barrier before it published (``device_barrier``, or an
  acquire after waiting for the peers' signals).

The pieces build ops in a fixed order (bench/kernel_equivalence.py compares the resulting assembly
across checkouts); a caller that needs a value of a piece takes it from the returned record. This module
imports no kernel family (the families import it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mori_compiler import ep_schema, wire_quant
from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_ep, mori_shmem
from mori_compiler.dialects.builder import Builder, generated_location, new_kernel


class EpKernelConfig(NamedTuple):
    """The compile-time configuration of an EP kernel (the EP op's attributes; immutable)."""

    world_size: int
    hidden: int
    dtype: str
    top_k: int
    experts_per_rank: int
    max_tokens_per_rank: int
    max_recv_per_rank: int
    wave_size: int
    warps_per_block: int = 8
    scale_bytes: int = 0
    zero_copy: int = 1
    max_blocks: int = ep_schema.MAX_BLOCKS
    # The inter-node kernel types (ep_schema.internode_attributes): G, PEs per send target, every token
    # to every remote target (V1LL), queue pairs per peer.
    gpu_per_node: int = 0
    hop_size: int = 0
    send_all: int = 0
    num_qp: int = 1
    # 1: the kernel takes any hidden <= the config's (its rows at the call's ``hidden``, a runtime value);
    # 0: the config's hidden only (rows of constant size: the code measured and pinned by the ISA tests).
    any_hidden: int = 0
    # The bf16 combine's wire quantization (wire_quant.QUANT_TYPES) and its scale blocks per row.
    quant: str = "none"
    scale_blocks: int = 0

    @property
    def elem_bytes(self) -> int:
        return ep_schema.TOKEN_BYTES[self.dtype]

    @property
    def sizes(self) -> ep_schema.EpSizes:
        """The derived sizes, at this kernel's dtype (its rows are ``hidden * elem_bytes`` bytes)."""
        return ep_schema.EpSizes.from_attributes(self._asdict(), self.dtype)  # the op's attributes, read back

    @property
    def row_bytes(self) -> int:
        return self.sizes.row_bytes

    @property
    def recv_capacity(self) -> int:  # R
        return self.sizes.recv_capacity

    @property
    def send_stride(self) -> int:  # S = W * M
        return self.sizes.send_stride

    @property
    def null_fwd(self) -> int:
        return self.sizes.null_fwd

    @property
    def block_size(self) -> tuple[int, int, int]:
        """The kernels' fixed block size: it bounds the AMDGPU workgroup (flat-work-group-size) and the
        NVPTX maxntid, and the launcher uses it."""
        return (self.warps_per_block * self.wave_size, 1, 1)

    @property
    def wire(self) -> "WireRows | None":
        """The combine's wire rows when it quantizes, else None."""
        return None if self.quant == "none" else WireRows(self.quant, self.scale_blocks)

    @classmethod
    def from_op(cls, op: ir.Operation) -> "EpKernelConfig":
        ints = mori_ep.int_attributes(op)
        fields = {f: ints[f] for f in cls._fields if f in ints}
        quant = op.attributes["quant"].value if "quant" in op.attributes else "none"
        return cls(dtype=op.attributes["dtype"].value, quant=quant, **fields)


class WireRows(NamedTuple):
    """A quantizing combine's wire rows (layout: mori_compiler/wire_quant.py): ``quant`` and its scale
    blocks per row. The kernels are target-neutral: their fp8 rows are ``fp8_e4m3``, the target's variant
    (mori-comm-to-calls resolves it: FNUZ on gfx942, OCP elsewhere)."""

    quant: str
    scale_blocks: int

    @property
    def format(self) -> str:
        return "fp4_e2m1" if self.quant == "fp4_blockwise" else "fp8_e4m3"

    @property
    def blocks(self) -> int:
        """Scale blocks per row (0: the direct cast)."""
        return self.scale_blocks if self.quant in wire_quant.BLOCKWISE_QUANT_TYPES else 0

    def elems(self, f: "KernelFrame") -> ir.Value:
        """The call's row in bf16 elements (i64)."""
        return f.b.shrui(f.row, f.b.const_i64(1))

    def stride(self, f: "KernelFrame") -> ir.Value:
        """Bytes between wire rows of the call's row (i64, a multiple of 16): wire_quant.wire_row_bytes, a
        constant in the config-hidden variant."""
        b = f.b
        if not f.cfg.any_hidden:
            return b.const_i64(wire_quant.wire_row_bytes(self.quant, f.cfg.hidden, self.blocks))
        c15, m16 = b.const_i64(15), b.const_i64(-16)
        elems = self.elems(f)
        payload = b.shrui(elems, b.const_i64(1)) if self.format == "fp4_e2m1" else elems
        size = b.andi(b.addi(payload, c15), m16)
        if self.blocks:
            size = b.andi(b.addi(b.addi(size, b.const_i64(4 * self.blocks)), c15), m16)
        return size


def combine_row_stride(f: "KernelFrame", rowc: ir.Value) -> ir.Value:
    """Bytes between the rows a combine stages (push staging, AsyncLL combine region): its wire rows when
    it quantizes, else the call's rows ``rowc``."""
    return rowc if f.cfg.wire is None else f.cfg.wire.stride(f)


class Params:
    """A kernel's parameters by their schema name: ``params.x`` or ``params["x"]``."""

    def __init__(self, names, values):
        self._values = dict(zip(names, values))

    def __getitem__(self, name: str) -> ir.Value:
        return self._values[name]

    def __getattr__(self, name: str) -> ir.Value:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"kernel has no parameter '{name}' (parameters: {', '.join(self._values)})") from None

    def __contains__(self, name: str) -> bool:
        return name in self._values


class KernelFrame(NamedTuple):
    """One EP kernel under construction: its builder, config, parameters and prologue values."""

    b: Builder
    cfg: EpKernelConfig
    family: str
    generator: str
    func: ir.Operation
    params: Params
    qp: ir.Value  # queue pair 0 (i32)
    me: ir.Value  # this PE (i32)
    c0i: ir.Value
    c1i: ir.Value
    false: ir.Value
    true: ir.Value
    K: ir.Value  # top_k (i32)
    W: ir.Value  # world size (i32)
    R: ir.Value  # receive capacity W * Rp (i32)
    NULL: ir.Value  # the null forward code W * R (i32)
    wave: ir.Value  # lanes per wave (i32, the shuffle width)
    c0x: ir.Value
    c1x: ir.Value
    Kx: ir.Value  # top_k (index)
    tid_i: ir.Value  # thread in block (index)
    lane_i: ir.Value
    lane: ir.Value  # lane in wave (i32)
    bid_i: ir.Value
    nb_i: ir.Value  # blocks in the grid (index)
    wpb: ir.Value  # warps per block (index)
    wave_x: ir.Value
    warp_in_block: ir.Value
    gw: ir.Value  # this warp's index in the grid (index)
    nw: ir.Value  # warps in the grid (index)
    null_ptr: ir.Value
    is_k: ir.Value  # lane < K: this lane holds one of the token's K expert slots
    lane0: ir.Value
    row: ir.Value  # the call's row bytes (i64): hidden * elem_bytes, a multiple of 16 (a constant unless any_hidden)

    def present(self, ptr: ir.Value) -> ir.Value:
        """``ptr != null`` (an optional input such as the weights)."""
        return self.b.icmp("ne", ptr, self.null_ptr)


def open_kernel(cfg: EpKernelConfig, family: str, *, generator: str, block: ir.Block,
                before: ir.Operation | None = None) -> KernelFrame:  # fmt: skip
    """Open kernel ``ep_<family>_<dtype>`` in ``block`` (a gpu.module body, before ``before``): its header
    from ``ep_schema.KERNELS[family]`` (parameter names as ``mori.name``, ``known_block_size``), its ops
    located as made by ``generator``, and the prologue. The caller ends it with ``f.b.gpu_return()``."""
    sig = ep_schema.KERNELS[family]
    loc = generated_location(generator, block.owner.context)
    with loc.context:
        types = {"ptr": ir.Type.parse("!llvm.ptr"), "i32": ir.IntegerType.get_signless(32)}
    op, entry = new_kernel(block, sig.kernel_name(cfg.dtype, cfg.any_hidden), [types[t] for t in sig.types],
                           block_size=cfg.block_size, param_names=sig.names, before=before, loc=loc)  # fmt: skip
    b = Builder(entry, loc=loc)
    v: dict[str, ir.Value] = {}
    v["qp"] = b.const_i32(0)
    v["me"] = mori_shmem.my_pe(**b.at())
    v["c0i"] = b.const_i32(0)
    v["c1i"] = b.const_i32(1)
    v["false"] = b.const_i1(False)
    v["true"] = b.const_i1(True)
    v["K"] = b.const_i32(cfg.top_k)
    v["W"] = b.const_i32(cfg.world_size)
    v["R"] = b.const_i32(cfg.recv_capacity)
    v["NULL"] = b.const_i32(cfg.null_fwd)
    v["wave"] = b.const_i32(cfg.wave_size)
    v["c0x"] = b.const_index(0)
    v["c1x"] = b.const_index(1)
    v["Kx"] = b.const_index(cfg.top_k)
    v["tid_i"] = b.thread_id("x")
    v["lane_i"] = b.lane_id()
    v["lane"] = b.index_cast(b.i32, v["lane_i"])
    v["bid_i"] = b.block_id("x")
    v["nb_i"] = b.grid_dim("x")
    v["wpb"] = b.const_index(cfg.warps_per_block)
    v["wave_x"] = b.const_index(cfg.wave_size)
    v["warp_in_block"] = b.divui(v["tid_i"], v["wave_x"])
    v["gw"] = b.addi(b.muli(v["bid_i"], v["wpb"]), v["warp_in_block"])
    v["nw"] = b.muli(v["nb_i"], v["wpb"])
    v["null_ptr"] = b.null()
    v["is_k"] = b.cmpi("ult", v["lane"], v["K"])
    v["lane0"] = b.cmpi("eq", v["lane"], v["c0i"])
    if cfg.any_hidden:
        v["row"] = call_row_bytes(b, dict(zip(sig.names, entry.arguments))["hidden"], cfg.elem_bytes)
    else:  # the host launches this variant only with the config's hidden
        v["row"] = b.const_i64(cfg.row_bytes)
    return KernelFrame(b=b, cfg=cfg, family=family, generator=generator, func=op,
                       params=Params(sig.names, entry.arguments), **v)  # fmt: skip


def trace_point(f: KernelFrame, event: str, phase: str) -> None:
    """A trace point of the kernel (``mori_comm.trace``; compiled out unless the compile option ``trace``):
    the phase boundaries the EP kernels mark are listed in docs/tracing.md."""
    mori_comm.trace(event, phase, **f.b.at())


def row_vectors(f: KernelFrame) -> ir.Value:
    """The 16-byte vectors of the call's row (index): a constant in the config-hidden variant."""
    b = f.b
    if not f.cfg.any_hidden:
        return b.const_index(f.cfg.row_bytes // 16)
    return b.index_cast(b.index, b.shrui(f.row, b.const_i64(4)))


def call_row_bytes(b: Builder, hidden: ir.Value, elem_bytes: int) -> ir.Value:
    """The row bytes of a call (i64) from its ``hidden`` (i32 elements): ``hidden * elem_bytes`` with the low
    four bits cleared. The host only launches a hidden whose rows are whole 16-byte vectors, so the mask
    changes no value; it states the alignment in the IR, where mori-comm-to-calls' 16-byte row copies see it."""
    wide = b.muli(b.extui(b.i64, hidden), b.const_i64(elem_bytes))
    return b.andi(wide, b.const_i64(-16))


# ---- dispatch ---------------------------------------------------------------------------------------


class TokenInputs(NamedTuple):
    """A dispatch's constants and optional inputs: experts per rank (i32), S = W * M (i32), the row bytes
    (i64), and whether weights (``w``) and scales (``s``) are given (i1)."""

    experts_per_rank: ir.Value
    send_stride: ir.Value
    row: ir.Value
    has_w: ir.Value
    has_s: ir.Value


def token_inputs(f: KernelFrame) -> TokenInputs:
    """The dispatch constants, then the presence of the weights and the scales (parameters w and s)."""
    b, cfg = f.b, f.cfg
    er = b.const_i32(cfg.experts_per_rank)
    s = b.const_i32(cfg.send_stride)
    return TokenInputs(er, s, f.row, f.present(f.params.w), f.present(f.params.s))


class DispatchRound(NamedTuple):
    """This dispatch round (``round``, i64, from ``round_ctr``), its parity (i32) and slot counter, and the
    predicates the kernels reuse: ``b0`` (block 0), ``t0`` (thread 0 of its block), ``first_thread``."""

    round: ir.Value
    one64: ir.Value
    par: ir.Value
    slot_ctr: ir.Value
    tid: ir.Value
    b0: ir.Value
    t0: ir.Value
    first_thread: ir.Value


def dispatch_round(f: KernelFrame) -> DispatchRound:
    """The IntraNode/IntraNodeLL round: its parity selects this round's slot counter (``slot_ctrs[r % 2]``,
    double-buffered), and thread 0 of block 0 clears the other one (a relaxed store; see the module
    docstring for why nobody touches it then)."""
    b, p = f.b, f.params
    rnd = b.load(b.i64, p.round_ctr)
    one64 = b.const_i64(1)
    par = b.trunci(b.i32, b.andi(rnd, one64))
    slot_ctr = b.gep(p.slot_ctrs, par, b.i32)
    other = b.xori(par, f.c1i)
    tid = b.index_cast(b.i32, f.tid_i)
    b0 = b.cmpi("eq", f.bid_i, f.c0x)
    t0 = b.cmpi("eq", tid, f.c0i)
    first_thread = b.andi(b0, t0)
    with b.if_(first_thread):
        octr = b.gep(p.slot_ctrs, other, b.i32)
        mori_shmem.p(octr, f.c0i, f.me, c_type="uint32", qp=f.qp, **b.at())
    return DispatchRound(rnd, one64, par, slot_ctr, tid, b0, t0, first_thread)


class Route(NamedTuple):
    """Token ``t`` (i32) routed by one warp; per lane k < K: ``slotidx`` = t * K + k, the expert id ``e``,
    whether it is a valid id (``valid``), its destination ``pe`` (W when invalid), the reserved ``slot``,
    and ``ok`` (this lane represents a destination that has a slot; ``ok32`` as i32)."""

    t: ir.Value
    slotidx: ir.Value
    e: ir.Value
    valid: ir.Value
    pe: ir.Value
    slot: ir.Value
    ok: ir.Value
    ok32: ir.Value


def reserve_on_peer(slot_ctr: ir.Value) -> Callable[[KernelFrame, ir.Value], ir.Value]:
    """The remote reservation: ``mori_comm.reserve_slot`` on PE pe's ``slot_ctr`` (relaxed, system scope)."""
    return lambda f, pe: mori_comm.reserve_slot(slot_ctr, pe, **f.b.at())


def replay_or_reserve(f: KernelFrame, replay: ir.Value, recorded: Callable[[], ir.Value],
                      reserve: Callable[[KernelFrame, ir.Value], ir.Value]) -> Callable[[KernelFrame, ir.Value], ir.Value]:  # fmt: skip
    """A reservation for ``route_token`` that replays a routing handle when ``replay`` (i1) holds: the slot
    the recorded dispatch got, decoded from the recorded forward code at ``recorded()`` (this lane's
    address, built only on that path), with no atomic; a null code (the recorded send overflowed) or one
    naming another PE gives R, past the capacity, so the send is dropped and counted as then. Otherwise
    ``reserve``."""
    b = f.b

    def take(f_: KernelFrame, pe: ir.Value) -> ir.Value:
        def from_handle():
            code = b.load(b.i32, recorded())
            mine = b.cmpi("eq", b.divui(code, f.R), pe)  # (NULL = W * R decodes to W: never a destination)
            return [b.select(mine, b.remui(code, f.R), f.R)]

        return b.if_else(replay, [b.i32], from_handle, lambda: [reserve(f_, pe)])[0]

    return take


def representative_ranks(f: KernelFrame, flag32: ir.Value) -> tuple[ir.Value, ir.Value]:
    """For a per-lane 0/1 ``flag32`` (i32) over lanes < K: (the flags of the lanes below this one, their
    total), both i32 (a token's destination i is the representative lane of rank i)."""
    b = f.b

    def add_lane(j, before, count):
        j32 = b.index_cast(b.i32, j)
        fj, _ = b.shuffle("idx", flag32, j32, f.wave)
        below = b.select(b.cmpi("ult", j32, f.lane), fj, f.c0i)
        return [b.addi(before, below), b.addi(count, fj)]

    before, count = b.for_iter(f.c0x, f.Kx, f.c1x, [f.c0i, f.c0i], add_lane)
    return before, count


class TokenShare(NamedTuple):
    """Warp ``index`` of the ``count`` warps that route one token (both i32, warp-uniform): it serves the
    destinations whose rank among the token's representatives is ``index`` modulo ``count``."""

    index: ir.Value
    count: ir.Value


def token_shares(f: KernelFrame, tokens: ir.Value) -> ir.Value:
    """How many warps route each of ``tokens`` (i32) tokens: the grid's warps per token, at least 1 and
    at most the number of destinations a token can have (min(K, W)). With fewer tokens than warps, a
    token's destinations are split over several warps: a warp's copy time grows with its destinations
    (up to K rows stored), and at 128 tokens on a 32 x 8 grid one warp per token left half the grid idle
    while the warps with 8 destinations ran 4x longer than those with 2. (Items fetched from a work
    counter instead of the static stride were measured on the H200: no change at 4096 tokens, 6 % slower
    fp8 at 128: the static stride stays.)"""
    b = f.b
    nw32 = b.index_cast(b.i32, f.nw)
    per_token = b.divui(nw32, b.maxui(tokens, f.c1i))
    most = b.const_i32(min(f.cfg.top_k, f.cfg.world_size))
    return b.minui(b.maxui(per_token, f.c1i), most)


def route_token(f: KernelFrame, token: ir.Value, inputs: TokenInputs, *,
                reserve: Callable[[KernelFrame, ir.Value], ir.Value], capacity: ir.Value | None = None,
                count_dest: bool = True, ids: ir.Value | None = None, fwd_row: ir.Value | None = None,
                accept: Callable[[ir.Value], ir.Value] | None = None, count_invalid: bool = True,
                share: "TokenShare | None" = None) -> Route:  # fmt: skip
    """Route token ``token`` (index; one warp, lanes < K hold one expert slot each): read the expert id
    (``idx``), drop invalid ids and duplicates per destination PE (the lowest k represents it), reserve
    a slot on the destination (``reserve(f, pe)`` returns it), drop and count (``status``) reservations at
    or past ``capacity`` (default R), store the forward map (pe * R + slot, or NULL) in ``fwd``, and,
    with ``count_dest``, count the tokens sent to each PE (``dest_ctr``). The inter-node kernels route
    records: ``ids`` (the token's K ids, default row t of ``idx``), ``fwd_row`` (where its K forward codes
    go, default row t of ``fwd``) and ``accept(pe) -> i1`` (the destinations this warp serves; the others
    get NULL and are no duplicates of anything). With ``count_invalid`` (every kernel's own tokens, once
    each; not the inter-node forwarding of records another PE routed and counted), lanes whose id is
    neither -1 nor a valid expert add 1 to the status word ``invalid_ids`` (a relaxed local atomic: the
    host reads it after the fact, no host synchronization on the call). With ``share``, this warp is one
    of several routing the same token: it reserves, counts and forwards only its share of the
    destinations (``TokenShare``), writes the forward codes of those lanes (share 0 also the NULL codes
    of invalid and duplicate lanes) and counts invalid ids only in share 0, so every output is written
    once, as with one warp per token."""
    b, p = f.b, f.params
    first_share = f.true if share is None else b.cmpi("eq", share.index, f.c0i)
    t = b.index_cast(b.i32, token)
    slotidx = b.addi(b.muli(t, f.K), f.lane)
    def load_id():
        return [b.load(b.i32, b.gep(p.idx, slotidx, b.i32) if ids is None else b.gep(ids, f.lane, b.i32))]

    e = b.if_else(f.is_k, [b.i32], load_id, lambda: [b.const_i32(-1)])[0]
    nonneg = b.cmpi("sge", e, f.c0i)
    pe_raw = b.divsi(e, inputs.experts_per_rank)
    inrange = b.cmpi("slt", pe_raw, f.W)
    valid = b.andi(b.andi(nonneg, inrange), f.is_k)
    if count_invalid:
        legal = b.ori(b.andi(nonneg, inrange), b.cmpi("eq", e, b.const_i32(-1)))
        with b.if_(b.andi(b.andi(f.is_k, b.xori(legal, f.true)), first_share)):
            word = b.const_i32(ep_schema.STATUS_WORDS.index("invalid_ids"))
            b.atomicrmw("add", b.gep(p.status, word, b.i32), f.c1i, "monotonic")
    if accept is not None:
        valid = b.andi(valid, accept(b.select(valid, pe_raw, f.c0i)))
    pe = b.select(valid, pe_raw, f.W)

    def earlier_same(j, d):
        j32 = b.index_cast(b.i32, j)
        pj, _ = b.shuffle("idx", pe, j32, f.wave)
        earlier = b.cmpi("ult", j32, f.lane)
        same = b.cmpi("eq", pj, pe)
        return [b.ori(d, b.andi(earlier, same))]

    dup = b.for_iter(f.c0x, f.Kx, f.c1x, [f.false], earlier_same)[0]
    rep = b.andi(valid, b.xori(dup, f.true))
    writes_code = f.true
    if share is not None:
        rank, _ = representative_ranks(f, b.extui(b.i32, rep))
        mine = b.cmpi("eq", b.remui(rank, share.count), share.index)
        writes_code = b.select(rep, mine, first_share)
        rep = b.andi(rep, mine)
    slot = b.if_else(rep, [b.i32], lambda: [reserve(f, pe)], lambda: [f.c0i])[0]
    fits = b.cmpi("ult", slot, capacity if capacity is not None else f.R)
    ok = b.andi(rep, fits)
    overflow = b.andi(rep, b.xori(fits, f.true))
    with b.if_(overflow):
        b.atomicrmw("add", p.status, f.c1i, "monotonic")
    with b.if_(b.andi(f.is_k, writes_code)):
        code = b.select(ok, b.addi(b.muli(pe, f.R), slot), f.NULL)
        b.store(code, b.gep(p.fwd, slotidx, b.i32) if fwd_row is None else b.gep(fwd_row, f.lane, b.i32))
    if count_dest:
        with b.if_(ok):
            b.atomicrmw("add", b.gep(p.dest_ctr, pe, b.i32), f.c1i, "monotonic")
    ok32 = b.extui(b.i32, ok)
    return Route(t, slotidx, e, valid, pe, slot, ok, ok32)


class TokenSource(NamedTuple):
    """Token t's row in ``x`` (``src_row``; ``t64`` = t as i64) and this lane's weight ``wv`` (f32; 0.0
    without weights or past K)."""

    t64: ir.Value
    src_row: ir.Value
    wv: ir.Value


def token_source(f: KernelFrame, route: Route, inputs: TokenInputs) -> TokenSource:
    """The routed token's source row (parameter ``x``) and this lane's weight (parameter ``w``)."""
    b, p = f.b, f.params
    t64 = b.extui(b.i64, route.t)
    src_row = b.gep(p.x, b.muli(t64, inputs.row), b.i8)

    def weight():
        wz = b.const_f32(0.0)
        return b.if_else(inputs.has_w, [b.f32], lambda: [b.load(b.f32, b.gep(p.w, route.slotidx, b.f32))],
                         lambda: [wz])  # fmt: skip

    wv = b.if_else(f.is_k, [b.f32], weight, lambda: [b.const_f32(0.0)])[0]
    return TokenSource(t64, src_row, wv)


def send_row_to_peers(f: KernelFrame, route: Route, source: TokenSource, inputs: TokenInputs,
                      dbase: ir.Value, *, peer: Callable[[ir.Value], ir.Value] | None = None) -> None:  # fmt: skip
    """The token row to all its destinations at once (``mori_comm.row_copy_to_peers``: lane k < K names
    destination k, row dbase + slot of ``out_x`` on PE pe, when ``ok``); each vector is loaded once and
    stored to every destination. ``peer(pe)``: the PE value the copy names (the inter-node kernels'
    ``mori_comm.node_pe``); default ``pe`` itself."""
    b = f.b
    ldrow64 = b.extui(b.i64, b.addi(dbase, route.slot))
    ldst = b.gep(f.params.out_x, b.muli(ldrow64, inputs.row), b.i8)
    pe = route.pe if peer is None else peer(route.pe)
    mori_comm.row_copy_to_peers(ldst, source.src_row, inputs.row, pe, route.ok, max_peers=f.cfg.top_k,
                                **b.at())  # fmt: skip


class _LanePointer(NamedTuple):
    """A pointer each lane holds (lane k: destination k's), as 32-bit halves for broadcasts."""

    lo: ir.Value
    hi: ir.Value

    @classmethod
    def of(cls, f: "KernelFrame", ptr: ir.Value) -> "_LanePointer":
        b = f.b
        addr = b.ptrtoint(b.i64, ptr)
        return cls(b.trunci(b.i32, addr), b.trunci(b.i32, b.shrui(addr, b.const_i64(32))))

    def of_lane(self, f: "KernelFrame", k: ir.Value) -> ir.Value:
        """Lane ``k``'s pointer in every lane (warp-uniform ``k``; the whole warp calls it)."""
        b = f.b
        lo = b.extui(b.i64, b.shuffle("idx", self.lo, k, f.wave)[0])
        hi = b.extui(b.i64, b.shuffle("idx", self.hi, k, f.wave)[0])
        return b.inttoptr(b.ptr, b.ori(b.shli(hi, b.const_i64(32)), lo))


def send_to_destinations(f: KernelFrame, route: Route, source: TokenSource, inputs: TokenInputs,
                         dbase: ir.Value, *, rows: bool = True, scales: bool = True,
                         peer: Callable[[ir.Value], ir.Value] | None = None, scale_source: ir.Value | None = None,
                         position: ir.Value | None = None) -> None:  # fmt: skip
    """For each destination of the token (the K representatives, broadcast from their lanes), to row
    dbase + slot on its PE: the row (``rows``: ``mori_comm.row_copy`` into ``out_x``), the scales
    (``scales``, when the config has them and ``s`` is given: into ``out_s``), the K expert ids and
    weights (lanes < K, into ``out_idx`` / ``out_w``) and the source position me * S + t (lane 0, into
    ``src_pos``), all relaxed system-scope stores. The inter-node kernels forward records: ``peer(pe)``
    names the PE (``mori_comm.node_pe``), ``scale_source`` is the token's scales (default row t of ``s``)
    and ``position`` its source position (default me * S + t).

    The metadata addresses are resolved once per token: lane k translates destination k's ``out_idx`` /
    ``out_w`` rows and ``src_pos`` entry (``mori_shmem.ptr``, all lanes at once; a lane that sends nothing
    resolves its own PE's, so no table read is out of range), and the loop over the destinations
    broadcasts them. (A ``mori_shmem.p`` per store re-read the heap table for every destination: on sm_90
    a chain of dependent loads each time, 3-6 µs of a 128-token dispatch.)"""
    b, p, cfg = f.b, f.params, f.cfg
    chosen = b.select(route.ok, route.pe, f.me)
    tpe = chosen if peer is None else peer(chosen)  # (inter-node: the PE is node_pe's, on this node by construction)
    drow_lane = b.addi(dbase, b.select(route.ok, route.slot, f.c0i))
    meta_row = b.muli(drow_lane, f.K)
    idx_dst = _LanePointer.of(f, mori_shmem.ptr(b.gep(p.out_idx, meta_row, b.i32), tpe, **b.at()))
    w_dst = _LanePointer.of(f, mori_shmem.ptr(b.gep(p.out_w, meta_row, b.f32), tpe, **b.at()))
    pos_dst = _LanePointer.of(f, mori_shmem.ptr(b.gep(p.src_pos, drow_lane, b.i32), tpe, **b.at()))
    pos = b.addi(b.muli(f.me, inputs.send_stride), route.t) if position is None else position
    with b.for_(f.c0x, f.Kx, f.c1x) as k:
        k32 = b.index_cast(b.i32, k)
        okk, _ = b.shuffle("idx", route.ok32, k32, f.wave)
        with b.if_(b.cmpi("ne", okk, f.c0i)):
            if rows or (scales and cfg.scale_bytes):
                pek, _ = b.shuffle("idx", route.pe, k32, f.wave)
                if peer is not None:
                    pek = peer(pek)
                slk, _ = b.shuffle("idx", route.slot, k32, f.wave)
                sl64 = b.extui(b.i64, b.addi(dbase, slk))
            if rows:
                dst_row = b.gep(p.out_x, b.muli(sl64, inputs.row), b.i8)
                mori_comm.row_copy(dst_row, source.src_row, inputs.row, pek, **b.at())
            if scales and cfg.scale_bytes:
                with b.if_(inputs.has_s):
                    sb = b.const_i64(cfg.scale_bytes)
                    sdst = b.gep(p.out_s, b.muli(sl64, sb), b.i8)
                    ssrc = b.gep(p.s, b.muli(source.t64, sb), b.i8) if scale_source is None else scale_source
                    mori_comm.row_copy(sdst, ssrc, sb, pek, **b.at())
            idx_row = idx_dst.of_lane(f, k32)
            with b.if_(f.is_k):
                b.store(route.e, b.gep(idx_row, f.lane, b.i32), alignment=4, ordering="monotonic")
            with b.if_(inputs.has_w):
                w_row = w_dst.of_lane(f, k32)
                with b.if_(f.is_k):
                    b.store(source.wv, b.gep(w_row, f.lane, b.f32), alignment=4, ordering="monotonic")
            pos_at = pos_dst.of_lane(f, k32)
            with b.if_(f.lane0):
                b.store(pos, pos_at, alignment=4, ordering="monotonic")


def dispatch_completion(f: KernelFrame, rnd: DispatchRound) -> None:
    """The end of an IntraNode/IntraNodeLL dispatch: every block arrives (``grid_last_arrival`` on
    ``grid_ctr``: release by each block, acquire by the last), and warp 0 of the block that arrived last
    runs the count handshake (``count_signal`` of ``dest_ctr`` through ``signals``, the received count into
    ``total``) and its lane 0 advances ``round_ctr`` on the device. The other blocks exit without waiting
    (a grid barrier there made every block wait for the last one, then woke block 0 for the handshake: two
    more round trips on the critical path, about 4 µs of a 128-token dispatch on sm_90)."""
    b, p = f.b, f.params
    trace_point(f, "arrival", "begin")
    last = mori_comm.grid_last_arrival(p.grid_ctr, **b.at())
    with b.if_(last):
        trace_point(f, "count_signal", "begin")
        mori_comm.count_signal(p.signals, p.dest_ctr, p.total, world_size=f.cfg.world_size, **b.at())
        trace_point(f, "count_signal", "end")
        with b.if_(f.lane0):
            b.store(b.addi(rnd.round, rnd.one64), p.round_ctr)


# ---- combine ----------------------------------------------------------------------------------------


class ForwardEntry(NamedTuple):
    """Source k of token ``t`` (i32) in a combine: its forward code (pe * R + slot, or NULL), ``valid``
    (code != NULL), the PE ``pe``, ``slot`` (i32) and ``slot64`` (i64)."""

    k: int
    t: ir.Value
    code: ir.Value
    valid: ir.Value
    pe: ir.Value
    slot: ir.Value
    slot64: ir.Value


def reduce_tokens(f: KernelFrame, rowc: ir.Value,
                  source_row: Callable[[ForwardEntry], tuple[ir.Value, ir.Value]], *, uniform: bool = False,
                  narrow: bool = False, out: ir.Value | None = None, out_w: ir.Value | None = None,
                  warps: tuple[ir.Value, ir.Value] | None = None) -> None:  # fmt: skip
    """Per token t < ``n``: the K source rows (``source_row(entry)`` gives source k's row and weight-row
    addresses; invalid sources read ``zero_row``) summed in fp32 into row t of ``out``
    (``mori_comm.accumulate_rows``), and the K weight vectors summed into ``out_w`` when given. Rows of
    ``out`` are ``rowc`` bytes apart; each sums the call's row (``f.row`` bytes).

    Work items are (token, slice of the row): with few tokens several warps share a token, so that every
    warp of the grid has loads in flight (a row's latency is split, not serialized). ``uniform``: lane
    k's forward entry is broadcast with ``gpu.subgroup_broadcast`` (AMDGPU: v_readlane into SGPRs, the
    per-token address arithmetic is scalar) instead of a shuffle, and the weight rows are read as global
    memory. ``narrow``: the work-item divisions in 32 bits when every index fits (64-bit division is ~100
    instructions on AMDGPU). Values a ``source_row`` needs once per warp are built before the call.
    The inter-node combine writes its node partials elsewhere: ``out``/``out_w`` (default the parameters
    ``out``/``out_w``; ``out_w`` null: no weights), on the warps ``warps`` = (first, count) (default all)."""
    b, p, cfg = f.b, f.params, f.cfg
    out = p.out if out is None else out
    out_w = p.out_w if out_w is None else out_w
    gw, nw = (f.gw, f.nw) if warps is None else warps
    per_vec = 16 // cfg.elem_bytes
    narrow = narrow and cfg.max_tokens_per_rank * (cfg.row_bytes // 16) < 2**31  # the config's row bounds the call's

    def div(op: str, a: ir.Value, c: ir.Value) -> ir.Value:
        fn = getattr(b, op)
        if not narrow:
            return fn(a, c)
        a32, c32 = b.index_castui(b.i32, a), b.index_castui(b.i32, c)
        return b.index_castui(b.index, fn(a32, c32))

    n_x = b.index_cast(b.index, p.n)
    nvec_x = row_vectors(f)
    n1 = b.maxui(n_x, f.c1x)
    spt0 = div("divui", nw, n1)
    spt = b.minui(b.maxui(spt0, f.c1x), nvec_x)  # row slices per token
    chunk1 = b.subi(b.addi(nvec_x, spt), f.c1x)
    chunk = div("divui", chunk1, spt)  # vectors per slice
    items = b.muli(n_x, spt)
    with b.for_(gw, items, nw) as it:
        t_x = div("divui", it, spt)
        sl_x = div("remui", it, spt)
        v0 = b.muli(sl_x, chunk)
        v1 = b.minui(b.addi(v0, chunk), nvec_x)
        with b.if_(b.cmpi("ult", v0, v1)):
            t = b.index_cast(b.i32, t_x)
            t64 = b.extui(b.i64, t)
            fidx = b.addi(b.muli(t, f.K), f.lane)
            fl = b.if_else(f.is_k, [b.i32], lambda: [b.load(b.i32, b.gep(p.fwd, fidx, b.i32))],
                           lambda: [f.NULL])[0]  # fmt: skip
            srcs, wsrcs = [], []
            for k in range(cfg.top_k):
                kk = b.const_i32(k)
                code = b.broadcast_lane(fl, kk) if uniform else b.shuffle("idx", fl, kk, f.wave)[0]
                valid = b.cmpi("ne", code, f.NULL)
                pe = b.divui(code, f.R)
                sl = b.remui(code, f.R)
                sl64 = b.extui(b.i64, sl)
                row, wrow = source_row(ForwardEntry(k, t, code, valid, pe, sl, sl64))
                srcs.append(b.select(valid, row, p.zero_row))
                wsrcs.append(b.select(valid, wrow, p.zero_row))
            v0_64 = b.index_cast(b.i64, v0)
            boff = b.muli(v0_64, b.const_i64(16))
            nv64 = b.index_cast(b.i64, b.subi(v1, v0))
            elems = b.muli(nv64, b.const_i64(per_vec))
            if cfg.wire is None:
                offs = [b.gep(src, boff, b.i8) for src in srcs]
                orow = b.gep(out, b.addi(b.muli(t64, rowc), boff), b.i8)
                mori_comm.accumulate_rows(orow, elems, offs, dtype=cfg.dtype, **b.at())
            else:  # wire rows: the slice [v0, v1) of vectors, dequantized from whole source rows
                first = b.muli(v0_64, b.const_i64(per_vec))
                mori_comm.accumulate_quantized_rows(b.gep(out, b.muli(t64, rowc), b.i8), first, elems,
                                                    cfg.wire.elems(f), srcs, format=cfg.wire.format,
                                                    scale_blocks=cfg.wire.blocks, **b.at())  # fmt: skip
            want_w = f.present(out_w)
            first_slice = b.cmpi("eq", sl_x, f.c0x)
            lane_w = b.andi(b.andi(want_w, f.is_k), first_slice)
            with b.if_(lane_w):
                cur = b.const_f32(0.0)
                for wsrc in wsrcs:
                    if uniform:  # AMDGPU: the weight rows as global memory too
                        wsrc = b.addrspacecast(b.ptr_global, wsrc)
                    cur = b.addf(cur, b.load(b.f32, b.gep(wsrc, f.lane, b.f32)))
                b.store(cur, b.gep(out_w, fidx, b.f32))


def return_rows(f: KernelFrame, locate: Callable[[ir.Value], tuple[ir.Value, ir.Value]], dst_x: ir.Value,
                dst_w: ir.Value, rowc: ir.Value, has_iw: ir.Value) -> None:  # fmt: skip
    """Every received row i < ``*total`` (one warp each; ``inp`` row i) goes back to its owner:
    ``locate(i)`` returns (owner PE, destination row); the warp copies the row into that row of ``dst_x``
    on the owner (``mori_comm.row_copy``) and, when ``has_iw``, lanes < K store its weights (``inp_w``)
    into ``dst_w`` (relaxed system-scope stores, published by the caller's later barrier). A quantizing
    combine (``cfg.wire``) writes wire rows instead (``mori_comm.quantize_row``; ``dst_x`` rows
    ``combine_row_stride`` bytes apart): quantized on the write, as MORI does."""
    b, p = f.b, f.params
    wire = f.cfg.wire
    stride = combine_row_stride(f, rowc)
    elems = None if wire is None else wire.elems(f)
    tot_x = b.index_cast(b.index, b.load(b.i32, p.total))
    with b.for_(f.gw, tot_x, f.nw) as i_x:
        i = b.index_cast(b.i32, i_x)
        i64 = b.extui(b.i64, i)
        owner, drow = locate(i)
        drow64 = b.extui(b.i64, drow)
        dst = b.gep(dst_x, b.muli(drow64, stride), b.i8)
        src = b.gep(p.inp, b.muli(i64, rowc), b.i8)
        if wire is None:
            mori_comm.row_copy(dst, src, rowc, owner, **b.at())
        else:
            mori_comm.quantize_row(dst, src, elems, owner, format=wire.format, scale_blocks=wire.blocks, **b.at())
        with b.if_(b.andi(has_iw, f.is_k)):
            wi = b.addi(b.muli(i, f.K), f.lane)
            wv = b.load(b.f32, b.gep(p.inp_w, wi, b.f32))
            dwi = b.addi(b.muli(drow, f.K), f.lane)
            mori_shmem.p(b.gep(dst_w, dwi, b.f32), wv, owner, c_type="float", qp=f.qp, **b.at())
