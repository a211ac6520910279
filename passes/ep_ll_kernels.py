"""The low-latency EP kernels of ``mori-ep-to-kernels``: IntraNodeLL dispatch and the AsyncLL halves.

Built with the typed builder (``dialects/builder.py``) on the shared EP kernel pieces (the prologue,
per-token routing, per-destination stores, the dispatch round and completion, the token reduction and the
row return), one ``gpu.func`` per kernel opened from its ``ep_schema.KERNELS`` signature. The protocols
(docs/ep-protocols.md), with who writes, who waits, at which scope and in which order:

**IntraNodeLL dispatch** ``ep_dispatch_ll_<dtype>``. One block per token (block-strided). Warp 0 is
the control warp: it routes the token (dedup per destination, a remote slot reservation per destination,
forward map), writes the compact route (count, then (pe, slot) pairs) into a ping-pong LDS buffer, and
stores the ids, weights and source position to every destination. The block is software-pipelined with
one ``gpu.barrier`` per token: in step j the data warps copy token j (route in buffer j % 2) while the
control warp routes token j + 1 into buffer (j + 1) % 2; the barrier ending step j publishes that route,
and the buffer the control warp writes in step j + 1 is the one every data warp finished reading before
that barrier (the first route is made before the loop). Warp 1 first copies the scales; warps 1.. then
split the row into 16-byte vectors, **load each vector once** (four in flight per lane) and store it to
every destination, starting at a per-warp rotated destination so that the links are loaded evenly.
Completion is IntraNode's (grid barrier, then the count handshake with its release/acquire fences), so
IntraNode's combine reads the result unchanged; the counters, signals and round parity are shared with it.

**AsyncLL** (over the P2P store transport). Every PE owns, per round parity and per source PE, a receive
region of Rp records (row, scales, ids, weights, source position) and a combine region of Rp rows; parity
r % 2 of round r double-buffers both, so a peer one round ahead never overwrites what we are still
reading (it can be at most one round ahead: its next send needs our notification of this round). Signals
are epoch-tagged, never reset: the dispatch signal of source s in round r is ``(r + 1) << 32 | count`` in
our ``sig[r % 2][s]``; the combine signal is ``r + 1`` in ``csig``. Round counters live on the device
(``rounds[0]`` dispatch, ``rounds[1]`` combine) and are advanced by the last block to finish the receive
kernel (``rounds[2]``/``[3]`` count the finished blocks), so graph replay is correct.

* ``ep_async_dispatch_send_<dtype>``: one warp per token; a **local** fetch-add on ``cnt[r % 2][pe]``
  gives the slot (slots past Rp are dropped and counted in ``status``); the warp stores row, scales,
  ids, weights and source position into PE pe's region ``[r % 2][me][slot]`` (relaxed system-scope
  stores). Block 0 thread 0 first clears ``cnt[(r + 1) % 2]`` (read by round r - 1's receive, which is
  over). With ``early_notify``: grid barrier, then warp 0 lanes p < W: fence (release: every payload
  store of this PE, ordered by the grid barrier's fences) and store the tagged count into PE p's
  ``sig[r % 2][me]``.
* ``ep_async_dispatch_recv_<dtype>``: without ``early_notify``, block 0 warp 0 lanes p < W first post
  the tagged counts (fence, then store: the send kernel's stores completed at its end, the fence orders
  them before the signal). Then the waits: ``fused_recv`` = per source s, thread 0 of **every** block
  polls ``sig[r % 2][s]`` until it carries tag r + 1, fences (acquire) and a block barrier releases the
  block's copy warps for source s (copies of source 0 start as soon as source 0 is ready); otherwise
  block 0 warp 0 lanes s < W poll all sources, fence, and a grid barrier releases every block. Records
  are copied to ``out`` rows grouped by source in PE order (exclusive prefix sum of the counts), within a
  source in slot order; ``rmap[row] = s * Rp + i`` remembers where each row came from.
* ``ep_async_combine_send_<dtype>``: each received row i goes back to its source s = rmap[i] / Rp into
  s's combine region ``[r % 2][me][rmap[i] % Rp]`` (with its weights); with ``early_notify`` a grid
  barrier and the tagged signal (fence, store into PE p's ``csig[r % 2][me]``) follow.
* ``ep_async_combine_recv_<dtype>``: post (without ``early_notify``), wait (fused: every block's warp 0
  lanes p < W poll, fence, block barrier; else block 0 then a grid barrier), then each token sums its K
  rows from the local combine region (forward map ``pe * R + slot``), as IntraNode's reduction.
"""

from __future__ import annotations

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import Builder, generated_location, new_kernel, verify_generated
from mori_compiler.ep_schema import KERNELS, OP_FAMILIES

from .ep_kernels import EpKernelConfig

LL_UNROLL = 4  # 16-byte vectors each data lane loads before storing them to every destination


def _max_destinations(cfg: EpKernelConfig) -> int:
    """At most one destination per distinct PE among a token's top-k experts."""
    return min(cfg.top_k, cfg.world_size)


def _route_slots(cfg: EpKernelConfig) -> int:
    """Entries of one LDS route buffer: the destination count, then (pe, slot) per destination."""
    return 1 + 2 * _max_destinations(cfg)


# =====================================================================================================
# INTERIM: the shared EP kernel pieces, as builder code, until passes/ep_kernel_parts.py (helper
# `kernels`) lands; then these go and the kernels below build on that module's API.
# =====================================================================================================


class KernelFrame:
    """One kernel being built: its builder ``b``, config ``cfg``, parameters by schema name (``p``) and the
    prologue's values as attributes (``f.me``, ``f.lane``, ...)."""

    def __init__(self, b: Builder, cfg: EpKernelConfig, func: ir.Operation, params: dict):
        self.b, self.cfg, self.func, self.p = b, cfg, func, params


def open_kernel(block: ir.Block, family: str, cfg: EpKernelConfig, *, before=None) -> KernelFrame:
    """A ``gpu.func`` of kernel family ``family`` (its ep_schema signature, parameter names recorded),
    with the shared prologue built."""
    sig = KERNELS[family]
    name = sig.kernel_name(cfg.dtype)
    loc = generated_location(name)
    with loc:
        types = {"ptr": ir.Type.parse("!llvm.ptr"), "i32": ir.IntegerType.get_signless(32)}
        func, entry = new_kernel(block, name, [types[t] for t in sig.types], param_names=sig.names,
                                 block_size=(cfg.warps_per_block * cfg.wave_size, 1, 1), before=before, loc=loc)
        b = Builder(entry, loc=loc)
    f = KernelFrame(b, cfg, func, dict(zip(sig.names, entry.arguments)))
    _prologue(f)
    return f


def _prologue(f: KernelFrame) -> None:
    b, cfg = f.b, f.cfg
    f.qp = b.const_i32(0)
    f.me = mori_shmem.my_pe(**b.at())
    f.c0i, f.c1i = b.const_i32(0), b.const_i32(1)
    f.false, f.true = b.const_i1(False), b.const_i1(True)
    f.K, f.W = b.const_i32(cfg.top_k), b.const_i32(cfg.world_size)
    f.R, f.NULL = b.const_i32(cfg.recv_capacity), b.const_i32(cfg.null_fwd)
    f.wave = b.const_i32(cfg.wave_size)
    f.c0x, f.c1x, f.Kx = b.const_index(0), b.const_index(1), b.const_index(cfg.top_k)
    f.tid_i = b.thread_id()
    lane_i = b.lane_id()
    f.lane = b.index_cast(b.i32, lane_i)
    f.bid_i, f.nb_i = b.block_id(), b.grid_dim()
    wpb = b.const_index(cfg.warps_per_block)
    f.wave_x = b.const_index(cfg.wave_size)
    f.warp_in_block = b.divui(f.tid_i, f.wave_x)
    f.gw = b.addi(b.muli(f.bid_i, wpb), f.warp_in_block)
    f.nw = b.muli(f.nb_i, wpb)
    f.null_ptr = b.null()
    f.is_k = b.cmpi("ult", f.lane, f.K)
    f.lane0 = b.cmpi("eq", f.lane, f.c0i)


class Route:
    """route_token's values: token t (i32), this lane's expert id e, destination pe, slot, ok (i1), ok32,
    slotidx (t * K + lane)."""

    def __init__(self, **values):
        self.__dict__.update(values)


def route_token(f: KernelFrame, token: ir.Value, *, reserve=None, capacity=None, count_dest: bool = True) -> Route:
    """Route one token (one warp; lanes < K hold one expert slot each): read the expert id, drop invalid ids
    and duplicates per destination PE (the lowest k represents it), reserve a slot on the destination
    (``reserve(pe)``; default: ``reserve_slot`` on the peer's ``f.slot_ctr``), drop and count (status)
    reservations at or past ``capacity`` (default R), store the forward map (pe * R + slot, or the null
    code) and, with ``count_dest``, count the token per destination."""
    b = f.b
    t = b.index_cast(b.i32, token)
    slotidx = b.addi(b.muli(t, f.K), f.lane)
    e = b.if_else(f.is_k, [b.i32], lambda: [b.load(b.i32, b.gep(f.p["idx"], slotidx, b.i32))],
                  lambda: [b.const_i32(-1)])[0]  # fmt: skip
    nonneg = b.cmpi("sge", e, f.c0i)
    pe_raw = b.divsi(e, f.Er)
    inrange = b.cmpi("slt", pe_raw, f.W)
    valid = b.andi(b.andi(nonneg, inrange), f.is_k)
    pe = b.select(valid, pe_raw, f.W)

    def seen_before(j, dup):
        j32 = b.index_cast(b.i32, j)
        pj, _ = b.shuffle("idx", pe, j32, f.wave)
        earlier = b.cmpi("ult", j32, f.lane)
        same = b.cmpi("eq", pj, pe)
        return [b.ori(dup, b.andi(earlier, same))]

    dup = b.for_iter(f.c0x, f.Kx, f.c1x, [f.false], seen_before)[0]
    rep = b.andi(valid, b.xori(dup, f.true))
    reserve = reserve or (lambda pe_: mori_comm.reserve_slot(f.slot_ctr, pe_, **b.at()))
    slot = b.if_else(rep, [b.i32], lambda: [reserve(pe)], lambda: [f.c0i])[0]
    fits = b.cmpi("ult", slot, capacity if capacity is not None else f.R)
    ok = b.andi(rep, fits)
    overflow = b.andi(rep, b.xori(fits, f.true))
    with b.if_(overflow):
        b.atomicrmw("add", f.p["status"], f.c1i)
    with b.if_(f.is_k):
        code = b.select(ok, b.addi(b.muli(pe, f.R), slot), f.NULL)
        b.store(code, b.gep(f.p["fwd"], slotidx, b.i32))
    if count_dest:
        with b.if_(ok):
            b.atomicrmw("add", b.gep(f.p["dest_ctr"], pe, b.i32), f.c1i)
    ok32 = b.extui(b.i32, ok)
    return Route(t=t, e=e, pe=pe, slot=slot, ok=ok, ok32=ok32, slotidx=slotidx)


def token_source(f: KernelFrame, r: Route) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Token r.t's (t64, source row in x, this lane's weight: 0.0 without weights or past K)."""
    b = f.b
    t64 = b.extui(b.i64, r.t)
    src_row = b.gep(f.p["x"], b.muli(t64, f.row), b.i8)

    def lane_weight():
        wz = b.const_f32(0.0)
        return b.if_else(f.has_w, [b.f32], lambda: [b.load(b.f32, b.gep(f.p["w"], r.slotidx, b.f32))],
                         lambda: [wz])  # fmt: skip

    wv = b.if_else(f.is_k, [b.f32], lane_weight, lambda: [b.const_f32(0.0)])[0]
    return t64, src_row, wv


def send_to_destinations(f: KernelFrame, r: Route, t64, src_row, wv, dbase, *, rows: bool = True,
                         scales: bool = True) -> None:  # fmt: skip
    """For each destination of the token (the K representatives, broadcast from their lanes): the row
    (``rows``: row_copy to row dbase + slot of out_x), the scales (``scales``: to out_s), the K expert
    ids and weights (lanes < K) and the source position me * S + t (lane 0), relaxed system-scope."""
    b, cfg = f.b, f.cfg
    with b.for_(f.c0x, f.Kx, f.c1x) as k:
        k32 = b.index_cast(b.i32, k)
        okk, _ = b.shuffle("idx", r.ok32, k32, f.wave)
        pek, _ = b.shuffle("idx", r.pe, k32, f.wave)
        slk, _ = b.shuffle("idx", r.slot, k32, f.wave)
        with b.if_(b.cmpi("ne", okk, f.c0i)):
            drow = b.addi(dbase, slk)
            sl64 = b.extui(b.i64, drow)
            if rows:
                dst_row = b.gep(f.p["out_x"], b.muli(sl64, f.row), b.i8)
                mori_comm.row_copy(dst_row, src_row, f.row, pek, **b.at())
            if scales and cfg.scale_bytes:
                with b.if_(f.has_s):
                    sb = b.const_i64(cfg.scale_bytes)
                    sdst = b.gep(f.p["out_s"], b.muli(sl64, sb), b.i8)
                    ssrc = b.gep(f.p["s"], b.muli(t64, sb), b.i8)
                    mori_comm.row_copy(sdst, ssrc, sb, pek, **b.at())
            with b.if_(f.is_k):
                mi = b.addi(b.muli(drow, f.K), f.lane)
                mori_shmem.p(b.gep(f.p["out_idx"], mi, b.i32), r.e, pek, c_type="int32", qp=f.qp, **b.at())
                with b.if_(f.has_w):
                    mori_shmem.p(b.gep(f.p["out_w"], mi, b.f32), wv, pek, c_type="float", qp=f.qp, **b.at())
            with b.if_(f.lane0):
                pos = b.addi(b.muli(f.me, f.S), r.t)
                mori_shmem.p(b.gep(f.p["src_pos"], drow, b.i32), pos, pek, c_type="int32", qp=f.qp, **b.at())


def dispatch_round(f: KernelFrame) -> None:
    """The IntraNode/IntraNodeLL dispatch round: its parity selects the slot counter (double-buffered),
    and thread 0 of block 0 clears the other one."""
    b = f.b
    f.round = b.load(b.i64, f.p["round_ctr"])
    f.one64 = b.const_i64(1)
    f.par = b.trunci(b.i32, b.andi(f.round, f.one64))
    f.slot_ctr = b.gep(f.p["slot_ctrs"], f.par, b.i32)
    other = b.xori(f.par, f.c1i)
    tid = b.index_cast(b.i32, f.tid_i)
    f.b0 = b.cmpi("eq", f.bid_i, f.c0x)
    f.t0 = b.cmpi("eq", tid, f.c0i)
    with b.if_(b.andi(f.b0, f.t0)):
        octr = b.gep(f.p["slot_ctrs"], other, b.i32)
        mori_shmem.p(octr, f.c0i, f.me, c_type="uint32", qp=f.qp, **b.at())


def dispatch_completion(f: KernelFrame) -> None:
    """The end of an IntraNode/IntraNodeLL dispatch: the grid meets (its fences publish every payload
    store of this PE), warp 0 of block 0 runs the count handshake, and the round advances on the device."""
    b = f.b
    mori_comm.grid_barrier(f.p["grid_ctr"], **b.at())
    w0 = b.cmpi("eq", f.warp_in_block, f.c0x)
    with b.if_(b.andi(f.b0, w0)):
        mori_comm.count_signal(f.p["signals"], f.p["dest_ctr"], f.p["total"], world_size=f.cfg.world_size, **b.at())
        with b.if_(f.lane0):
            b.store(b.addi(f.round, f.one64), f.p["round_ctr"])


def return_rows(f: KernelFrame, locate, dst_x: ir.Value, dst_w: ir.Value) -> None:
    """Every received row i < total (one warp each) goes back to its owner: ``locate(i)`` gives (owner,
    drow); the warp copies input row i into row drow of ``dst_x`` on the owner and lanes < K store its
    weights into ``dst_w`` (relaxed system scope). Needs f.has_iw, f.rowc."""
    b = f.b
    tot_x = b.index_cast(b.index, b.load(b.i32, f.p["total"]))
    with b.for_(f.gw, tot_x, f.nw) as i_x:
        i = b.index_cast(b.i32, i_x)
        i64 = b.extui(b.i64, i)
        owner, drow = locate(i)
        drow64 = b.extui(b.i64, drow)
        dst = b.gep(dst_x, b.muli(drow64, f.rowc), b.i8)
        src = b.gep(f.p["inp"], b.muli(i64, f.rowc), b.i8)
        mori_comm.row_copy(dst, src, f.rowc, owner, **b.at())
        with b.if_(b.andi(f.has_iw, f.is_k)):
            wi = b.addi(b.muli(i, f.K), f.lane)
            wv = b.load(b.f32, b.gep(f.p["inp_w"], wi, b.f32))
            dwi = b.addi(b.muli(drow, f.K), f.lane)
            mori_shmem.p(b.gep(dst_w, dwi, b.f32), wv, owner, c_type="float", qp=f.qp, **b.at())


class Source:
    """A token's source k in reduce_tokens: its forward entry decoded (pe, slot, slot64, valid)."""

    def __init__(self, **values):
        self.__dict__.update(values)


def reduce_tokens(f: KernelFrame, source_row, *, uniform: bool = False, narrow: bool = False) -> None:
    """Per token: K source rows (valid ones from ``source_row(src) -> (row, weight row)``, else the zero
    row) summed in fp32, and the K weight vectors. ``uniform``: lane k's forward entry is broadcast with
    gpu.subgroup_broadcast instead of a shuffle. ``narrow``: work-item divisions in 32 bits where they fit."""
    b, cfg = f.b, f.cfg
    nvec_n = cfg.row_bytes // 16
    narrow = narrow and cfg.max_tokens_per_rank * nvec_n < 2**31

    def div(op, x, y):
        if not narrow:
            return getattr(b, op)(x, y)
        xa, ya = b.index_castui(b.i32, x), b.index_castui(b.i32, y)
        return b.index_castui(b.index, getattr(b, op)(xa, ya))

    n_x = b.index_cast(b.index, f.p["n"])
    nvec = b.const_index(nvec_n)
    n1 = b.maxui(n_x, f.c1x)
    spt0 = div("divui", f.nw, n1)
    spt = b.minui(b.maxui(spt0, f.c1x), nvec)
    chunk1 = b.subi(b.addi(nvec, spt), f.c1x)
    chunk = div("divui", chunk1, spt)
    items = b.muli(n_x, spt)
    zero_row = f.p["zero_row"]
    with b.for_(f.gw, items, f.nw) as it:
        t_x = div("divui", it, spt)
        sl_x = div("remui", it, spt)
        v0 = b.muli(sl_x, chunk)
        v1 = b.minui(b.addi(v0, chunk), nvec)
        with b.if_(b.cmpi("ult", v0, v1)):
            t = b.index_cast(b.i32, t_x)
            t64 = b.extui(b.i64, t)
            fidx = b.addi(b.muli(t, f.K), f.lane)
            fl = b.if_else(f.is_k, [b.i32], lambda: [b.load(b.i32, b.gep(f.p["fwd"], fidx, b.i32))],
                           lambda: [f.NULL])[0]  # fmt: skip
            srcs, wsrcs = [], []
            for k in range(cfg.top_k):
                kk = b.const_i32(k)
                fk = b.broadcast_lane(fl, kk) if uniform else b.shuffle("idx", fl, kk, f.wave)[0]
                valid = b.cmpi("ne", fk, f.NULL)
                pe = b.divui(fk, f.R)
                sl = b.remui(fk, f.R)
                sl64 = b.extui(b.i64, sl)
                row, wrow = source_row(Source(k=k, pe=pe, slot=sl, slot64=sl64, valid=valid, t=t))
                srcs.append(b.select(valid, row, zero_row))
                wsrcs.append(b.select(valid, wrow, zero_row))
            boff = b.muli(b.index_cast(b.i64, v0), b.const_i64(16))
            nv64 = b.index_cast(b.i64, b.subi(v1, v0))
            elems = b.muli(nv64, b.const_i64(16 // cfg.elem_bytes))
            srco = [b.gep(s, boff, b.i8) for s in srcs]
            orow = b.gep(f.p["out"], b.addi(b.muli(t64, f.rowc), boff), b.i8)
            mori_comm.accumulate_rows(orow, elems, srco, dtype=cfg.dtype, **b.at())
            want_w = b.icmp("ne", f.p["out_w"], f.null_ptr)
            first_slice = b.cmpi("eq", sl_x, f.c0x)
            with b.if_(b.andi(b.andi(want_w, f.is_k), first_slice)):
                cur = b.const_f32(0.0)
                for w in wsrcs:
                    if uniform:  # AMDGPU: the weight rows as global memory too
                        w = b.addrspacecast(b.ptr_global, w)
                    cur = b.addf(cur, b.load(b.f32, b.gep(w, f.lane, b.f32)))
                b.store(cur, b.gep(f.p["out_w"], fidx, b.f32))


# =====================================================================================================
# IntraNodeLL dispatch
# =====================================================================================================


def _route_entry(f: KernelFrame, base1: ir.Value, index: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Route entry ``index`` of the LDS buffer whose entries start at ``base1``: (destination PE, its slot
    as i64)."""
    b = f.b
    ppe = b.gep(f.route, b.addi(base1, b.muli(index, f.c2i)), b.i32)
    dpe = b.load(b.i32, ppe)
    dsl = b.load(b.i32, b.gep(ppe, 1, b.i32))
    return dpe, b.extui(b.i64, dsl)


def _control_warp(f: KernelFrame, token: ir.Value, cbase: ir.Value) -> None:
    """The control warp's work for one token, its route going to the LDS buffer at ``cbase``: routing and
    slot reservation, the compact route (count, then (pe, slot) per destination), and the ids, weights and
    source position stored to every destination."""
    b = f.b
    cbase1 = b.addi(cbase, f.c1i)
    r = route_token(f, token)
    t64, src_row, wv = token_source(f, r)

    # Compact the route: destination i of the token is the i-th representative lane.
    def count_representatives(j, before, count):
        j32 = b.index_cast(b.i32, j)
        okj, _ = b.shuffle("idx", r.ok32, j32, f.wave)
        earlier = b.cmpi("ult", j32, f.lane)
        add = b.select(earlier, okj, f.c0i)
        return [b.addi(before, add), b.addi(count, okj)]

    before, count = b.for_iter(f.c0x, f.Kx, f.c1x, [f.c0i, f.c0i], count_representatives)
    with b.if_(r.ok):
        ppe = b.gep(f.route, b.addi(cbase1, b.muli(before, f.c2i)), b.i32)
        b.store(r.pe, ppe)
        b.store(r.slot, b.gep(ppe, 1, b.i32))
    with b.if_(f.lane0):
        b.store(count, b.gep(f.route, cbase, b.i32))
    send_to_destinations(f, r, t64, src_row, wv, b.const_i32(0), rows=False, scales=False)


def _data_warps(f: KernelFrame, t_x: ir.Value, rbase: ir.Value, rbase1: ir.Value, global_space: bool) -> None:
    """The data warps' copy of token ``t_x`` (route in the buffer at ``rbase``): warp 1 the scales to each
    destination, then every data lane its 16-byte vectors, each loaded once and stored to every
    destination, starting at destination (d + warp) % nd."""
    b, cfg = f.b, f.cfg
    t = b.index_cast(b.i32, t_x)
    t64 = b.extui(b.i64, t)
    src_row = b.gep(f.p["x"], b.muli(t64, f.row), b.i8)
    nd = b.load(b.i32, b.gep(f.route, rbase, b.i32))
    nd_x = b.index_cast(b.index, nd)
    if cfg.scale_bytes:
        with b.if_(b.andi(b.cmpi("eq", f.warp_in_block, f.c1x), f.has_s)):
            sb = b.const_i64(cfg.scale_bytes)
            ssrc = b.gep(f.p["s"], b.muli(t64, sb), b.i8)
            with b.for_(f.c0x, nd_x, f.c1x) as d:
                dpe, dsl64 = _route_entry(f, rbase1, b.index_cast(b.i32, d))
                sdst = b.gep(f.p["out_s"], b.muli(dsl64, sb), b.i8)
                mori_comm.row_copy(sdst, ssrc, sb, dpe, **b.at())
    nd1 = b.maxui(nd, f.c1i)
    # Destination d of this warp is route entry (d + warp) % nd: warps start at different PEs.
    has, peers = [], []
    for d in range(_max_destinations(cfg)):
        dd = b.const_i32(d)
        has.append(b.cmpi("ult", dd, nd))
        dr = b.remui(b.addi(dd, f.warp32), nd1)
        dpe, dsl64 = _route_entry(f, rbase1, dr)
        dst = b.gep(f.p["out_x"], b.muli(dsl64, f.row), b.i8)
        peers.append(mori_shmem.ptr(dst, dpe, **b.at()))
    if global_space:
        peers = [b.addrspacecast(b.ptr_global, peer) for peer in peers]
        src_row = b.addrspacecast(b.ptr_global, src_row)
    vec = b.vector(4, b.i32)
    with b.for_(f.dtid, f.nvec, f.dstride) as v0:
        loads = []
        for uo in f.unroll_offsets:
            vi = b.addi(v0, uo)
            inside = b.cmpi("ult", vi, f.nvec)
            vc64 = b.index_cast(b.i64, b.select(inside, vi, v0))
            loads.append((inside, vc64, b.load(vec, b.gep(src_row, vc64, vec), alignment=16)))
        for has_d, peer in zip(has, peers):
            with b.if_(has_d):
                for inside, vc64, val in loads:
                    with b.if_(inside):
                        b.store(val, b.gep(peer, vc64, vec), alignment=16)


def _lds_route_buffer(block: ir.Block, name: str, entries: int, *, before=None, loc=None) -> str:
    """The kernel's LDS route buffer: an internal ``llvm.mlir.global`` of ``entries`` i32 in address
    space 3 (workgroup memory); returns its symbol."""
    symbol = f"{name}_route"
    b = Builder(block, before=before, loc=loc)
    i32 = b.i32
    attrs = {
        "sym_name": ir.StringAttr.get(symbol),
        "global_type": ir.TypeAttr.get(ir.Type.parse(f"!llvm.array<{entries} x i32>")),
        "linkage": ir.Attribute.parse("#llvm.linkage<internal>"),
        "addr_space": ir.IntegerAttr.get(i32, 3),
        "unnamed_addr": ir.IntegerAttr.get(b.i64, 0),
        "visibility_": ir.IntegerAttr.get(b.i64, 0),
    }
    b.op("llvm.mlir.global", attributes=attrs, regions=1)
    return symbol


def build_dispatch_ll(cfg: EpKernelConfig, block: ir.Block, *, before=None, global_address_space: bool = False):
    """Build ``ep_dispatch_ll_<dtype>`` and its LDS route buffer into ``block`` (before ``before``).

    global_address_space (AMDGPU): the data path's source row and peer rows as !llvm.ptr<1> (global_*
    loads and stores instead of flat_*; the ordering is unchanged: plain stores, published by the
    completion's release fences like the generic ones)."""
    name = KERNELS["dispatch_ll"].kernel_name(cfg.dtype)
    with generated_location(name):  # block arguments take the ambient location
        _dispatch_ll(cfg, block, name, before, global_address_space)


def _dispatch_ll(cfg: EpKernelConfig, block: ir.Block, name: str, before, global_address_space: bool) -> None:
    half = _route_slots(cfg)
    symbol = _lds_route_buffer(block, name, 2 * half, before=before, loc=generated_location(name))
    f = open_kernel(block, "dispatch_ll", cfg, before=before)
    b = f.b
    data_threads = (cfg.warps_per_block - 1) * cfg.wave_size
    f.Er = b.const_i32(cfg.experts_per_rank)
    f.S = b.const_i32(cfg.send_stride)
    f.row = b.const_i64(cfg.row_bytes)
    f.c2i = b.const_i32(2)
    f.has_w = b.icmp("ne", f.p["w"], f.null_ptr)
    f.has_s = b.icmp("ne", f.p["s"], f.null_ptr)
    f.route = b.address_of(symbol, b.ptr_lds)
    half_v = b.const_i32(half)
    f.nvec = b.const_index(cfg.row_bytes // 16)
    f.dstride = b.const_index(data_threads * LL_UNROLL)
    f.unroll_offsets = [b.const_index(u * data_threads) for u in range(LL_UNROLL)]
    dispatch_round(f)
    control = b.cmpi("eq", f.warp_in_block, f.c0x)
    data = b.xori(control, f.true)
    f.warp32 = b.index_cast(b.i32, f.warp_in_block)
    f.dtid = b.subi(f.tid_i, f.wave_x)
    n_x = b.index_cast(b.index, f.p["n"])
    # Software pipeline, one block barrier per token: while the data warps copy token t (route in buffer
    # t's parity), the control warp routes token t + grid into the other buffer.
    with b.if_(b.andi(control, b.cmpi("ult", f.bid_i, n_x))):
        _control_warp(f, f.bid_i, b.const_i32(0))
    b.barrier()

    def token_step(t_x, buf):
        rbase = b.muli(buf, half_v)
        rbase1 = b.addi(rbase, f.c1i)
        t_next = b.addi(t_x, f.nb_i)
        with b.if_(b.andi(control, b.cmpi("ult", t_next, n_x))):
            _control_warp(f, t_next, b.muli(b.xori(buf, f.c1i), half_v))
        with b.if_(data):
            _data_warps(f, t_x, rbase, rbase1, global_address_space)
        b.barrier()
        return [b.xori(buf, f.c1i)]

    b.for_iter(f.bid_i, n_x, f.nb_i, [f.c0i], token_step)
    dispatch_completion(f)
    b.gpu_return()
    verify_generated(f.func, name)


# =====================================================================================================
# AsyncLL
# =====================================================================================================


def _async_round(f: KernelFrame, index: int) -> None:
    """The AsyncLL kernels' round r (``rounds[index]``), its parity, tag r + 1 and the usual predicates."""
    b = f.b
    f.rp = b.gep(f.p["rounds"], index, b.i64)
    f.round = b.load(b.i64, f.rp)
    f.one64 = b.const_i64(1)
    f.par = b.trunci(b.i32, b.andi(f.round, f.one64))
    f.parW = b.muli(f.par, f.W)
    f.tag = b.addi(f.round, f.one64)
    tid = b.index_cast(b.i32, f.tid_i)
    b0 = b.cmpi("eq", f.bid_i, f.c0x)
    f.t0 = b.cmpi("eq", tid, f.c0i)
    f.first_thread = b.andi(b0, f.t0)
    f.w0 = b.cmpi("eq", f.warp_in_block, f.c0x)
    f.first_warp = b.andi(b0, f.w0)
    f.Rp = b.const_i32(f.cfg.max_recv_per_rank)


def _post(f: KernelFrame, signal: ir.Value, value) -> None:
    """Warp 0 of block 0, lanes p < W: release fence, then ``value()`` into PE p's ``signal[r % 2][me]``."""
    b = f.b
    with b.if_(f.first_warp):
        with b.if_(b.cmpi("ult", f.lane, f.W)):
            mine = b.gep(signal, b.addi(f.parW, f.me), b.i64)
            v = value()
            mori_shmem.fence(**b.at())
            mori_shmem.p(mine, v, f.lane, c_type="uint64", qp=f.qp, **b.at())


def _dispatch_count_value(f: KernelFrame) -> ir.Value:
    """This lane's tagged dispatch count for PE lane: ``(r + 1) << 32 | min(cnt[r % 2][lane], Rp)``."""
    b = f.b
    c_raw = b.load(b.i32, b.gep(f.p["cnt"], b.addi(f.parW, f.lane), b.i32))
    c64 = b.extui(b.i64, b.minui(c_raw, f.Rp))
    tagged = b.shli(f.tag, b.const_i64(32))
    return b.ori(tagged, c64)


def _wait_all(f: KernelFrame, signal: ir.Value, below: ir.Value, fused: bool) -> None:
    """Poll ``signal[r % 2][p]`` for every source p < W until it is above ``below``, then acquire. Fused:
    warp 0 of every block waits and a block barrier releases the block; otherwise warp 0 of block 0 waits
    and a grid barrier releases the grid."""
    b = f.b
    with b.if_(f.w0 if fused else f.first_warp):
        with b.if_(b.cmpi("ult", f.lane, f.W)):
            inp = b.gep(signal, b.addi(f.parW, f.lane), b.i64)
            mori_shmem.wait_until(inp, below, cmp="greater_than", elem="uint64", **b.at())
            mori_shmem.fence(**b.at())
    if fused:
        b.barrier()
    else:
        mori_comm.grid_barrier(f.p["grid_ctr"], **b.at())


def _advance_round(f: KernelFrame, index: int) -> None:
    """The last block to finish advances ``rounds[index]`` (its finished-block counter is
    ``rounds[index + 2]``): every block read the round before it arrives (fence, then the arrival)."""
    b = f.b
    b.barrier()
    with b.if_(f.t0):
        donep = b.gep(f.p["rounds"], index + 2, b.i64)
        last_n = b.subi(b.index_cast(b.i64, f.nb_i), f.one64)
        mori_shmem.fence(**b.at())
        arrived = mori_shmem.atomic_fetch_add(donep, f.one64, f.me, elem="uint64", qp=f.qp, **b.at())
        with b.if_(b.cmpi("eq", arrived, last_n)):
            mori_shmem.p(donep, b.const_i64(0), f.me, c_type="uint64", qp=f.qp, **b.at())
            mori_shmem.p(f.rp, f.tag, f.me, c_type="uint64", qp=f.qp, **b.at())


def _local_reserve(f: KernelFrame):
    """AsyncLL's slot reservation: a local fetch-add on this round's ``cnt[r % 2][pe]``."""
    b = f.b
    return lambda pe: b.atomicrmw("add", b.gep(f.cnt_par, pe, b.i32), f.c1i)


def async_dispatch_send_kernel(cfg: EpKernelConfig, block: ir.Block, *, before=None, early_notify: bool) -> None:
    f = open_kernel(block, "async_dispatch_send", cfg, before=before)
    b, cnt = f.b, f.p["cnt"]
    _async_round(f, 0)
    f.Er = b.const_i32(cfg.experts_per_rank)
    f.S = b.const_i32(cfg.send_stride)
    f.row = b.const_i64(cfg.row_bytes)
    f.has_w = b.icmp("ne", f.p["w"], f.null_ptr)
    f.has_s = b.icmp("ne", f.p["s"], f.null_ptr)
    f.cnt_par = b.gep(cnt, f.parW, b.i32)
    other_parW = b.muli(b.xori(f.par, f.c1i), f.W)
    with b.if_(f.first_thread):
        for p in range(cfg.world_size):
            b.store(f.c0i, b.gep(cnt, b.addi(other_parW, b.const_i32(p)), b.i32))
    # Records for PE pe land in its region [r % 2][me][slot].
    dbase = b.muli(b.addi(f.parW, f.me), f.Rp)
    n_x = b.index_cast(b.index, f.p["n"])
    with b.for_(f.gw, n_x, f.nw) as t_x:
        r = route_token(f, t_x, reserve=_local_reserve(f), capacity=f.Rp, count_dest=False)
        t64, src_row, wv = token_source(f, r)
        send_to_destinations(f, r, t64, src_row, wv, dbase)
    if early_notify:
        mori_comm.grid_barrier(f.p["grid_ctr"], **b.at())
        _post(f, f.p["sig"], lambda: _dispatch_count_value(f))
    b.gpu_return()
    verify_generated(f.func, KERNELS["async_dispatch_send"].kernel_name(cfg.dtype))


def async_dispatch_recv_kernel(cfg: EpKernelConfig, block: ir.Block, *, before=None, early_notify: bool,
                               fused_recv: bool) -> None:  # fmt: skip
    f = open_kernel(block, "async_dispatch_recv", cfg, before=before)
    b, p = f.b, f.p
    _async_round(f, 0)
    row = b.const_i64(cfg.row_bytes)
    below = b.subi(b.shli(f.tag, b.const_i64(32)), f.one64)  # tag r + 1 in the high half
    if not early_notify:
        _post(f, p["sig"], lambda: _dispatch_count_value(f))
    if not fused_recv:
        _wait_all(f, p["sig"], below, fused=False)
    mask32 = b.const_i64(0xFFFFFFFF)
    w_x = b.index_cast(b.index, f.W)

    # Rows grouped by source in PE order: source s starts at the sum of the counts of sources < s.
    def copy_source(s_x, base):
        src = b.index_cast(b.i32, s_x)
        si = b.addi(f.parW, src)
        sp = b.gep(p["sig"], si, b.i64)
        if fused_recv:
            with b.if_(f.t0):
                mori_shmem.wait_until(sp, below, cmp="greater_than", elem="uint64", **b.at())
                mori_shmem.fence(**b.at())
            b.barrier()
        v = mori_shmem.wait_until(sp, below, cmp="greater_than", elem="uint64", **b.at())
        c = b.trunci(b.i32, b.andi(v, mask32))
        c_x = b.index_cast(b.index, c)
        region0 = b.muli(si, f.Rp)
        with b.for_(f.gw, c_x, f.nw) as i_x:
            i = b.index_cast(b.i32, i_x)
            srow = b.addi(region0, i)
            orow = b.addi(base, i)
            srow64, orow64 = b.extui(b.i64, srow), b.extui(b.i64, orow)
            sx = b.gep(p["rx"], b.muli(srow64, row), b.i8)
            ox = b.gep(p["out_x"], b.muli(orow64, row), b.i8)
            mori_comm.row_copy(ox, sx, row, f.me, **b.at())
            if cfg.scale_bytes:
                sb = b.const_i64(cfg.scale_bytes)
                ssrc = b.gep(p["rs"], b.muli(srow64, sb), b.i8)
                sdst = b.gep(p["out_s"], b.muli(orow64, sb), b.i8)
                mori_comm.row_copy(sdst, ssrc, sb, f.me, **b.at())
            with b.if_(f.is_k):
                sk = b.addi(b.muli(srow, f.K), f.lane)
                okk = b.addi(b.muli(orow, f.K), f.lane)
                iv = b.load(b.i32, b.gep(p["ridx"], sk, b.i32))
                b.store(iv, b.gep(p["out_idx"], okk, b.i32))
                wv = b.load(b.f32, b.gep(p["rw"], sk, b.f32))
                b.store(wv, b.gep(p["out_w"], okk, b.f32))
            with b.if_(f.lane0):
                pos = b.load(b.i32, b.gep(p["rpos"], srow, b.i32))
                b.store(pos, b.gep(p["src_pos"], orow, b.i32))
                m = b.addi(b.muli(src, f.Rp), i)
                b.store(m, b.gep(p["rmap"], orow, b.i32))
        return [b.addi(base, c)]

    total = b.for_iter(f.c0x, w_x, f.c1x, [f.c0i], copy_source)[0]
    with b.if_(f.first_thread):
        b.store(total, p["total"])
    _advance_round(f, 0)
    b.gpu_return()
    verify_generated(f.func, KERNELS["async_dispatch_recv"].kernel_name(cfg.dtype))


def async_combine_send_kernel(cfg: EpKernelConfig, block: ir.Block, *, before=None, early_notify: bool) -> None:
    f = open_kernel(block, "async_combine_send", cfg, before=before)
    b, p = f.b, f.p
    _async_round(f, 1)
    f.rowc = b.const_i64(cfg.row_bytes)
    value = b.addi(f.round, f.one64)
    f.has_iw = b.icmp("ne", p["inp_w"], f.null_ptr)
    # Row i returns to its source s into s's combine region [r % 2][me][slot].
    dbase = b.muli(b.addi(f.parW, f.me), f.Rp)

    def locate(i):
        # Received row i came from source owner = rmap[i] / Rp, slot rmap[i] % Rp.
        m = b.load(b.i32, b.gep(p["rmap"], i, b.i32))
        owner = b.divui(m, f.Rp)
        return owner, b.addi(dbase, b.remui(m, f.Rp))

    return_rows(f, locate, p["cx"], p["cw"])
    if early_notify:
        mori_comm.grid_barrier(p["grid_ctr"], **b.at())
        _post(f, p["csig"], lambda: value)
    b.gpu_return()
    verify_generated(f.func, KERNELS["async_combine_send"].kernel_name(cfg.dtype))


def async_combine_recv_kernel(cfg: EpKernelConfig, block: ir.Block, *, before=None, early_notify: bool,
                              fused_recv: bool, uniform_addressing: bool = False) -> None:  # fmt: skip
    f = open_kernel(block, "async_combine_recv", cfg, before=before)
    b, p = f.b, f.p
    _async_round(f, 1)
    f.rowc = b.const_i64(cfg.row_bytes)
    kb = b.const_i64(4 * cfg.top_k)
    value = b.addi(f.round, f.one64)
    if not early_notify:
        _post(f, p["csig"], lambda: value)
    _wait_all(f, p["csig"], f.round, fused=fused_recv)

    def source_row(src):
        # Rows of the token's destination pe are in our combine region [r % 2][pe][slot].
        cr64 = b.extui(b.i64, b.addi(b.muli(b.addi(f.parW, src.pe), f.Rp), src.slot))
        return b.gep(p["cx"], b.muli(cr64, f.rowc), b.i8), b.gep(p["cw"], b.muli(cr64, kb), b.i8)

    f.kb = kb
    reduce_tokens(f, source_row, uniform=uniform_addressing, narrow=uniform_addressing)
    _advance_round(f, 1)
    b.gpu_return()
    verify_generated(f.func, KERNELS["async_combine_recv"].kernel_name(cfg.dtype))


def build_async(op_name: str, cfg: EpKernelConfig, block: ir.Block, *, before=None, early_notify: bool,
                fused_recv: bool, uniform_addressing: bool = False) -> None:  # fmt: skip
    """Build the kernel of one AsyncLL half into ``block`` (the notification mode comes from the op's
    attributes; ``uniform_addressing``: see MoriEpToKernels)."""
    family = OP_FAMILIES[op_name.split(".", 1)[1]]
    with generated_location(KERNELS[family].kernel_name(cfg.dtype)):  # block arguments take the ambient one
        if family == "async_dispatch_send":
            async_dispatch_send_kernel(cfg, block, before=before, early_notify=early_notify)
        elif family == "async_dispatch_recv":
            async_dispatch_recv_kernel(cfg, block, before=before, early_notify=early_notify, fused_recv=fused_recv)
        elif family == "async_combine_send":
            async_combine_send_kernel(cfg, block, before=before, early_notify=early_notify)
        else:
            async_combine_recv_kernel(cfg, block, before=before, early_notify=early_notify, fused_recv=fused_recv,
                                      uniform_addressing=uniform_addressing)  # fmt: skip


# INTERIM bridge to the text-based pass of passes/ep_kernels.py (goes with the interim section above).
def _as_text(build) -> str:
    module = ir.Module.parse("gpu.module @tmp {}")
    body = module.body.operations[0].regions[0].blocks[0]
    build(body)
    return "\n".join(str(op) for op in body.operations) + "\n"


def dispatch_ll_kernel(cfg: EpKernelConfig, global_address_space: bool = False) -> str:
    return _as_text(lambda block: build_dispatch_ll(cfg, block, global_address_space=global_address_space))


def async_kernels_for(op_name: str, cfg: EpKernelConfig, early_notify: bool, fused_recv: bool,
                      uniform_addressing: bool = False) -> str:  # fmt: skip
    return _as_text(lambda block: build_async(op_name, cfg, block, early_notify=early_notify, fused_recv=fused_recv,
                                              uniform_addressing=uniform_addressing))
