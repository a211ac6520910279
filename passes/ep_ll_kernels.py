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
Completion is IntraNode's (every block arrives, the last one runs the count handshake with its
release/acquire fences), so IntraNode's combine reads the result unchanged; the counters, signals and round
parity are shared with it.

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

from collections.abc import Callable
from dataclasses import dataclass

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import generated_location, new_global
from mori_compiler.ep_schema import KERNELS, OP_FAMILIES

from .ep_kernel_parts import (EpKernelConfig, ForwardEntry, KernelFrame, TokenInputs, combine_row_stride,
                              dispatch_completion, dispatch_round, open_kernel, reduce_tokens,
                              representative_ranks, reserve_on_peer, return_rows, route_token, row_vectors,
                              send_to_destinations, token_inputs, token_source, trace_point)  # fmt: skip

LL_UNROLL = 4  # 16-byte vectors each data lane loads before storing them to every destination


def _max_destinations(cfg: EpKernelConfig) -> int:
    """At most one destination per distinct PE among a token's top-k experts."""
    return min(cfg.top_k, cfg.world_size)


def _route_slots(cfg: EpKernelConfig) -> int:
    """Entries of one LDS route buffer: the destination count, then (pe, slot) per destination."""
    return 1 + 2 * _max_destinations(cfg)


# ---- IntraNodeLL dispatch ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LdsRoute:
    """The ping-pong route buffers in LDS (``ptr``, !llvm.ptr<3>, i32 entries): buffer j starts at entry
    j * ``half``; ``two`` is the i32 constant 2 (a route entry is a (pe, slot) pair)."""

    ptr: ir.Value
    half: ir.Value
    two: ir.Value

    def pair(self, f: KernelFrame, base1: ir.Value, index: ir.Value) -> ir.Value:
        """The address of destination ``index``'s (pe, slot) pair in the route whose pairs start at entry
        ``base1`` (its buffer's start + 1, past the count)."""
        b = f.b
        return b.gep(self.ptr, b.addi(base1, b.muli(index, self.two)), b.i32)

    def entry(self, f: KernelFrame, base1: ir.Value, index: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Destination ``index`` of that route: (its PE, its slot as i64)."""
        b = f.b
        ppe = self.pair(f, base1, index)
        dpe = b.load(b.i32, ppe)
        dsl = b.load(b.i32, b.gep(ppe, 1, b.i32))
        return dpe, b.extui(b.i64, dsl)


def _control_warp(f: KernelFrame, inputs: TokenInputs, slot_ctr: ir.Value, route: LdsRoute, token: ir.Value,
                  cbase: ir.Value) -> None:  # fmt: skip
    """The control warp's work for one token (index ``token``), its route going to the LDS buffer at entry
    ``cbase``: routing and remote slot reservation, the compact route (count, then (pe, slot) per
    destination; plain LDS stores, published to the data warps by the next block barrier), and the ids,
    weights and source position stored to every destination."""
    b = f.b
    cbase1 = b.addi(cbase, f.c1i)
    r = route_token(f, token, inputs, reserve=reserve_on_peer(slot_ctr))
    source = token_source(f, r, inputs)

    # Compact the route: destination i of the token is the i-th representative lane.
    before, count = representative_ranks(f, r.ok32)
    with b.if_(r.ok):
        ppe = route.pair(f, cbase1, before)
        b.store(r.pe, ppe)
        b.store(r.slot, b.gep(ppe, 1, b.i32))
    with b.if_(f.lane0):
        b.store(count, b.gep(route.ptr, cbase, b.i32))
    send_to_destinations(f, r, source, inputs, b.const_i32(0), rows=False, scales=False)


@dataclass(frozen=True)
class DataPath:
    """The data warps' loop constants: vectors per row (``nvec``), this lane's first vector (``dtid``,
    its thread index past warp 0), the stride of the vector loop (``dstride``), the offsets of the
    LL_UNROLL vectors a lane loads per step, and the warp index (i32) that rotates destinations."""

    nvec: ir.Value
    dtid: ir.Value
    dstride: ir.Value
    unroll_offsets: tuple[ir.Value, ...]
    warp32: ir.Value


def _data_warps(f: KernelFrame, inputs: TokenInputs, route: LdsRoute, data: DataPath, t_x: ir.Value,
                rbase: ir.Value, rbase1: ir.Value, global_space: bool) -> None:  # fmt: skip
    """The data warps' copy of token ``t_x`` (route in the buffer at entry ``rbase``): warp 1 the scales to
    each destination, then every data lane its 16-byte vectors, each loaded once and stored to every
    destination (relaxed stores, published by the completion), starting at destination (d + warp) % nd."""
    b, p, cfg = f.b, f.params, f.cfg
    t64 = b.extui(b.i64, b.index_cast(b.i32, t_x))
    src_row = b.gep(p.x, b.muli(t64, inputs.row), b.i8)
    nd = b.load(b.i32, b.gep(route.ptr, rbase, b.i32))
    nd_x = b.index_cast(b.index, nd)
    if cfg.scale_bytes:
        with b.if_(b.andi(b.cmpi("eq", f.warp_in_block, f.c1x), inputs.has_s)):
            sb = b.const_i64(cfg.scale_bytes)
            ssrc = b.gep(p.s, b.muli(t64, sb), b.i8)
            with b.for_(f.c0x, nd_x, f.c1x) as d:
                dpe, dsl64 = route.entry(f, rbase1, b.index_cast(b.i32, d))
                sdst = b.gep(p.out_s, b.muli(dsl64, sb), b.i8)
                mori_comm.row_copy(sdst, ssrc, sb, dpe, **b.at())
    nd1 = b.maxui(nd, f.c1i)
    # Destination d of this warp is route entry (d + warp) % nd: warps start at different PEs.
    has, peers = [], []
    for d in range(_max_destinations(cfg)):
        dd = b.const_i32(d)
        has.append(b.cmpi("ult", dd, nd))
        dpe, dsl64 = route.entry(f, rbase1, b.remui(b.addi(dd, data.warp32), nd1))
        dst = b.gep(p.out_x, b.muli(dsl64, inputs.row), b.i8)
        peers.append(mori_shmem.ptr(dst, dpe, **b.at()))
    if global_space:
        peers = [b.addrspacecast(b.ptr_global, peer) for peer in peers]
        src_row = b.addrspacecast(b.ptr_global, src_row)
    vec = b.vector(4, b.i32)
    with b.for_(data.dtid, data.nvec, data.dstride) as v0:
        loads = []  # (in the row, vector index, value) of each unrolled vector
        for uo in data.unroll_offsets:
            vi = b.addi(v0, uo)
            inside = b.cmpi("ult", vi, data.nvec)
            vc64 = b.index_cast(b.i64, b.select(inside, vi, v0))
            loads.append((inside, vc64, b.load(vec, b.gep(src_row, vc64, vec), alignment=16)))
        for has_d, peer in zip(has, peers):
            with b.if_(has_d):
                for inside, vc64, val in loads:
                    with b.if_(inside):
                        b.store(val, b.gep(peer, vc64, vec), alignment=16)


def dispatch_ll_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                       global_address_space: bool = False) -> list[ir.Operation]:  # fmt: skip
    """``ep_dispatch_ll_<dtype>`` and its LDS route buffer (``<kernel>_route``), built in ``block`` before
    ``before``; returns both ops.

    global_address_space (AMDGPU): the data path's source row and peer rows as !llvm.ptr<1> (global_*
    loads and stores instead of flat_*; the ordering is unchanged: plain stores, published by the
    completion's release fences like the generic ones)."""
    generator = "ep_ll_kernels.dispatch_ll_kernel"
    half = _route_slots(cfg)
    symbol = KERNELS["dispatch_ll"].kernel_name(cfg.dtype, cfg.any_hidden) + "_route"
    loc = generated_location(generator)
    with loc.context:
        buffers = ir.Type.parse(f"!llvm.array<{2 * half} x i32>")
    lds = new_global(block, symbol, buffers, addr_space=3, before=before, loc=loc)
    f = open_kernel(cfg, "dispatch_ll", generator=generator, block=block, before=before)
    b = f.b
    trace_point(f, "dispatch", "begin")
    inputs = token_inputs(f)
    route = LdsRoute(b.address_of(symbol, b.ptr_lds), b.const_i32(half), b.const_i32(2))
    data_threads = (cfg.warps_per_block - 1) * cfg.wave_size
    nvec = row_vectors(f)
    dstride = b.const_index(data_threads * LL_UNROLL)
    offsets = tuple(b.const_index(u * data_threads) for u in range(LL_UNROLL))
    rnd = dispatch_round(f)
    control = b.cmpi("eq", f.warp_in_block, f.c0x)
    is_data = b.xori(control, f.true)
    warp32 = b.index_cast(b.i32, f.warp_in_block)
    data = DataPath(nvec, b.subi(f.tid_i, f.wave_x), dstride, offsets, warp32)
    n_x = b.index_cast(b.index, f.params.n)
    # Software pipeline, one block barrier per token: while the data warps copy token t (route in buffer
    # t's parity), the control warp routes token t + grid into the other buffer.
    with b.if_(b.andi(control, b.cmpi("ult", f.bid_i, n_x))):
        trace_point(f, "route", "begin")
        _control_warp(f, inputs, rnd.slot_ctr, route, f.bid_i, b.const_i32(0))
        trace_point(f, "route", "end")
    b.barrier()

    def token_step(t_x, buf):
        rbase = b.muli(buf, route.half)
        rbase1 = b.addi(rbase, f.c1i)
        t_next = b.addi(t_x, f.nb_i)
        with b.if_(b.andi(control, b.cmpi("ult", t_next, n_x))):
            _control_warp(f, inputs, rnd.slot_ctr, route, t_next, b.muli(b.xori(buf, f.c1i), route.half))
        with b.if_(is_data):
            _data_warps(f, inputs, route, data, t_x, rbase, rbase1, global_address_space)
        b.barrier()
        return [b.xori(buf, f.c1i)]

    b.for_iter(f.bid_i, n_x, f.nb_i, [f.c0i], token_step)
    trace_point(f, "tokens", "end")
    dispatch_completion(f, rnd)
    trace_point(f, "dispatch", "end")
    b.gpu_return()
    return [lds, f.func]


# ---- AsyncLL ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AsyncRound:
    """An AsyncLL kernel's round r (``round``, i64, read from ``round_ptr`` = &rounds[index]), its parity
    ``par`` and ``parW`` = par * W (the first entry of this parity's [W] signals and counters), the tag
    r + 1, Rp (i32), and the predicates ``t0`` (thread 0 of its block), ``first_thread`` (of the grid), ``w0``
    (warp 0 of its block), ``first_warp`` (of block 0)."""

    round_ptr: ir.Value
    round: ir.Value
    one64: ir.Value
    par: ir.Value
    parW: ir.Value
    tag: ir.Value
    t0: ir.Value
    first_thread: ir.Value
    w0: ir.Value
    first_warp: ir.Value
    Rp: ir.Value


def _async_round(f: KernelFrame, index: int) -> AsyncRound:
    """The round of ``rounds[index]`` (0 dispatch, 1 combine), read once at the kernel's start."""
    b = f.b
    round_ptr = b.gep(f.params.rounds, index, b.i64)
    rnd = b.load(b.i64, round_ptr)
    one64 = b.const_i64(1)
    par = b.trunci(b.i32, b.andi(rnd, one64))
    par_w = b.muli(par, f.W)
    tag = b.addi(rnd, one64)
    tid = b.index_cast(b.i32, f.tid_i)
    b0 = b.cmpi("eq", f.bid_i, f.c0x)
    t0 = b.cmpi("eq", tid, f.c0i)
    first_thread = b.andi(b0, t0)
    w0 = b.cmpi("eq", f.warp_in_block, f.c0x)
    first_warp = b.andi(b0, w0)
    rp_count = b.const_i32(f.cfg.max_recv_per_rank)
    return AsyncRound(round_ptr, rnd, one64, par, par_w, tag, t0, first_thread, w0, first_warp, rp_count)


def _post(f: KernelFrame, r: AsyncRound, signal: ir.Value, value: Callable[[], ir.Value]) -> None:
    """Warp 0 of block 0, lanes p < W: ``value()`` (built per lane), a release fence (every payload store
    this PE made before), then a relaxed system-scope store of the value into PE p's ``signal[r % 2][me]``."""
    b = f.b
    with b.if_(r.first_warp):
        with b.if_(b.cmpi("ult", f.lane, f.W)):
            mine = b.gep(signal, b.addi(r.parW, f.me), b.i64)
            v = value()
            mori_shmem.fence(**b.at())
            mori_shmem.p(mine, v, f.lane, c_type="uint64", qp=f.qp, **b.at())


def _dispatch_count_value(f: KernelFrame, r: AsyncRound) -> ir.Value:
    """Lane p's tagged dispatch signal for PE p: ``(r + 1) << 32 | min(cnt[r % 2][p], Rp)``."""
    b = f.b
    c_raw = b.load(b.i32, b.gep(f.params.cnt, b.addi(r.parW, f.lane), b.i32))
    c64 = b.extui(b.i64, b.minui(c_raw, r.Rp))
    return b.ori(b.shli(r.tag, b.const_i64(32)), c64)


def _wait_all(f: KernelFrame, r: AsyncRound, signal: ir.Value, below: ir.Value, fused: bool) -> None:
    """Poll ``signal[r % 2][p]`` for every source p < W until it is above ``below``, then an acquire fence.
    Fused: warp 0 of every block waits and a block barrier releases the block; otherwise warp 0 of block 0
    waits and a grid barrier releases the grid."""
    b = f.b
    with b.if_(r.w0 if fused else r.first_warp):
        with b.if_(b.cmpi("ult", f.lane, f.W)):
            inp = b.gep(signal, b.addi(r.parW, f.lane), b.i64)
            mori_shmem.wait_until(inp, below, cmp="greater_than", elem="uint64", **b.at())
            mori_shmem.fence(**b.at())
    if fused:
        b.barrier()
    else:
        mori_comm.grid_barrier(f.params.grid_ctr, **b.at())


def _advance_round(f: KernelFrame, r: AsyncRound, index: int) -> None:
    """The last block to finish advances ``rounds[index]`` (its finished-block counter is
    ``rounds[index + 2]``): every block read the round before it arrives (fence, then the arrival); the
    last one resets the counter and stores tag r + 1."""
    b = f.b
    b.barrier()
    with b.if_(r.t0):
        donep = b.gep(f.params.rounds, index + 2, b.i64)
        last_n = b.subi(b.index_cast(b.i64, f.nb_i), r.one64)
        mori_shmem.fence(**b.at())
        arrived = mori_shmem.atomic_fetch_add(donep, r.one64, f.me, elem="uint64", qp=f.qp, **b.at())
        with b.if_(b.cmpi("eq", arrived, last_n)):
            mori_shmem.p(donep, b.const_i64(0), f.me, c_type="uint64", qp=f.qp, **b.at())
            mori_shmem.p(r.round_ptr, r.tag, f.me, c_type="uint64", qp=f.qp, **b.at())


def _local_reserve(cnt_par: ir.Value) -> Callable[[KernelFrame, ir.Value], ir.Value]:
    """AsyncLL's slot reservation: a local relaxed fetch-add on this round's ``cnt[r % 2][pe]``."""
    return lambda f, pe: f.b.atomicrmw("add", f.b.gep(cnt_par, pe, f.b.i32), f.c1i, "monotonic")


def async_dispatch_send_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                               early_notify: bool) -> ir.Operation:  # fmt: skip
    """``ep_async_dispatch_send_<dtype>``: one warp per token, records into the destinations' regions;
    with ``early_notify`` the grid barrier and the tagged counts follow."""
    f = open_kernel(cfg, "async_dispatch_send", generator="ep_ll_kernels.async_dispatch_send_kernel",
                    block=block, before=before)  # fmt: skip
    b, p = f.b, f.params
    r = _async_round(f, 0)
    inputs = token_inputs(f)
    cnt_par = b.gep(p.cnt, r.parW, b.i32)
    other_par_w = b.muli(b.xori(r.par, f.c1i), f.W)
    with b.if_(r.first_thread):  # the other parity's counters: round r - 1's receive is over
        for pe in range(cfg.world_size):
            b.store(f.c0i, b.gep(p.cnt, b.addi(other_par_w, b.const_i32(pe)), b.i32))
    # Records for PE pe land in its region [r % 2][me][slot].
    dbase = b.muli(b.addi(r.parW, f.me), r.Rp)
    n_x = b.index_cast(b.index, p.n)
    with b.for_(f.gw, n_x, f.nw) as t_x:
        route = route_token(f, t_x, inputs, reserve=_local_reserve(cnt_par), capacity=r.Rp, count_dest=False)
        send_to_destinations(f, route, token_source(f, route, inputs), inputs, dbase)
    if early_notify:
        mori_comm.grid_barrier(p.grid_ctr, **b.at())
        _post(f, r, p.sig, lambda: _dispatch_count_value(f, r))
    b.gpu_return()
    return f.func


def async_dispatch_recv_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                               early_notify: bool, fused_recv: bool) -> ir.Operation:  # fmt: skip
    """``ep_async_dispatch_recv_<dtype>``: (post,) wait, copy the records grouped by source, store the
    total, advance the dispatch round."""
    f = open_kernel(cfg, "async_dispatch_recv", generator="ep_ll_kernels.async_dispatch_recv_kernel",
                    block=block, before=before)  # fmt: skip
    b, p = f.b, f.params
    r = _async_round(f, 0)
    row = f.row
    below = b.subi(b.shli(r.tag, b.const_i64(32)), r.one64)  # a signal above it carries tag r + 1
    if not early_notify:
        _post(f, r, p.sig, lambda: _dispatch_count_value(f, r))
    if not fused_recv:
        _wait_all(f, r, p.sig, below, fused=False)
    mask32 = b.const_i64(0xFFFFFFFF)
    w_x = b.index_cast(b.index, f.W)

    # Rows grouped by source in PE order: source s starts at the sum of the counts of sources < s.
    def copy_source(s_x, base):
        src = b.index_cast(b.i32, s_x)
        si = b.addi(r.parW, src)
        sp = b.gep(p.sig, si, b.i64)
        if fused_recv:  # thread 0 of every block waits for source s; the block barrier releases its copies
            with b.if_(r.t0):
                mori_shmem.wait_until(sp, below, cmp="greater_than", elem="uint64", **b.at())
                mori_shmem.fence(**b.at())
            b.barrier()
        seen = mori_shmem.wait_until(sp, below, cmp="greater_than", elem="uint64", **b.at())
        count = b.trunci(b.i32, b.andi(seen, mask32))
        count_x = b.index_cast(b.index, count)
        region0 = b.muli(si, r.Rp)
        with b.for_(f.gw, count_x, f.nw) as i_x:
            i = b.index_cast(b.i32, i_x)
            srow = b.addi(region0, i)
            orow = b.addi(base, i)
            srow64, orow64 = b.extui(b.i64, srow), b.extui(b.i64, orow)
            sx = b.gep(p.rx, b.muli(srow64, row), b.i8)
            ox = b.gep(p.out_x, b.muli(orow64, row), b.i8)
            mori_comm.row_copy(ox, sx, row, f.me, **b.at())
            if cfg.scale_bytes:
                sb = b.const_i64(cfg.scale_bytes)
                ssrc = b.gep(p.rs, b.muli(srow64, sb), b.i8)
                sdst = b.gep(p.out_s, b.muli(orow64, sb), b.i8)
                mori_comm.row_copy(sdst, ssrc, sb, f.me, **b.at())
            with b.if_(f.is_k):
                sk = b.addi(b.muli(srow, f.K), f.lane)
                ok = b.addi(b.muli(orow, f.K), f.lane)
                b.store(b.load(b.i32, b.gep(p.ridx, sk, b.i32)), b.gep(p.out_idx, ok, b.i32))
                b.store(b.load(b.f32, b.gep(p.rw, sk, b.f32)), b.gep(p.out_w, ok, b.f32))
            with b.if_(f.lane0):
                b.store(b.load(b.i32, b.gep(p.rpos, srow, b.i32)), b.gep(p.src_pos, orow, b.i32))
                b.store(b.addi(b.muli(src, r.Rp), i), b.gep(p.rmap, orow, b.i32))  # rmap = s * Rp + i
        return [b.addi(base, count)]

    total = b.for_iter(f.c0x, w_x, f.c1x, [f.c0i], copy_source)[0]
    with b.if_(r.first_thread):
        b.store(total, p.total)
    _advance_round(f, r, 0)
    b.gpu_return()
    return f.func


def async_combine_send_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                              early_notify: bool) -> ir.Operation:  # fmt: skip
    """``ep_async_combine_send_<dtype>``: every received row back into its source's combine region; with
    ``early_notify`` the grid barrier and the tagged signal follow."""
    f = open_kernel(cfg, "async_combine_send", generator="ep_ll_kernels.async_combine_send_kernel",
                    block=block, before=before)  # fmt: skip
    b, p = f.b, f.params
    r = _async_round(f, 1)
    rowc = f.row
    value = b.addi(r.round, r.one64)
    has_iw = f.present(p.inp_w)
    # Row i returns to its source s into s's combine region [r % 2][me][slot].
    dbase = b.muli(b.addi(r.parW, f.me), r.Rp)

    def locate(i: ir.Value) -> tuple[ir.Value, ir.Value]:
        # Received row i came from source owner = rmap[i] / Rp, slot rmap[i] % Rp.
        m = b.load(b.i32, b.gep(p.rmap, i, b.i32))
        owner = b.divui(m, r.Rp)
        return owner, b.addi(dbase, b.remui(m, r.Rp))

    return_rows(f, locate, p.cx, p.cw, rowc, has_iw)
    if early_notify:
        mori_comm.grid_barrier(p.grid_ctr, **b.at())
        _post(f, r, p.csig, lambda: value)
    b.gpu_return()
    return f.func


def async_combine_recv_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                              early_notify: bool, fused_recv: bool,
                              uniform_addressing: bool = False) -> ir.Operation:  # fmt: skip
    """``ep_async_combine_recv_<dtype>``: (post,) wait, sum each token's K rows from the local combine
    region, advance the combine round."""
    f = open_kernel(cfg, "async_combine_recv", generator="ep_ll_kernels.async_combine_recv_kernel",
                    block=block, before=before)  # fmt: skip
    b, p = f.b, f.params
    r = _async_round(f, 1)
    rowc = f.row
    kb = b.const_i64(4 * cfg.top_k)
    value = b.addi(r.round, r.one64)
    if not early_notify:
        _post(f, r, p.csig, lambda: value)
    _wait_all(f, r, p.csig, r.round, fused=fused_recv)

    region = combine_row_stride(f, rowc)  # combine-region rows: the call's rows, or its wire rows

    def source_row(s: ForwardEntry) -> tuple[ir.Value, ir.Value]:
        # The rows of the token's destination pe are in our combine region [r % 2][pe][slot].
        cr64 = b.extui(b.i64, b.addi(b.muli(b.addi(r.parW, s.pe), r.Rp), s.slot))
        return b.gep(p.cx, b.muli(cr64, region), b.i8), b.gep(p.cw, b.muli(cr64, kb), b.i8)

    reduce_tokens(f, rowc, source_row, uniform=uniform_addressing, narrow=uniform_addressing)
    _advance_round(f, r, 1)
    b.gpu_return()
    return f.func


def async_kernels_for(op_name: str, cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                      early_notify: bool, fused_recv: bool,
                      uniform_addressing: bool = False) -> ir.Operation:  # fmt: skip
    """The kernel of AsyncLL half ``op_name`` (``mori_ep.dispatch_send`` ... ``combine_recv``), built in
    ``block`` before ``before``; the notification mode comes from the op's attributes,
    ``uniform_addressing`` from the pass (see MoriEpToKernels)."""
    family = OP_FAMILIES[op_name.split(".", 1)[1]]
    if family == "async_dispatch_send":
        return async_dispatch_send_kernel(cfg, block, before, early_notify=early_notify)
    if family == "async_dispatch_recv":
        return async_dispatch_recv_kernel(cfg, block, before, early_notify=early_notify, fused_recv=fused_recv)
    if family == "async_combine_send":
        return async_combine_send_kernel(cfg, block, before, early_notify=early_notify)
    if family == "async_combine_recv":
        return async_combine_recv_kernel(cfg, block, before, early_notify=early_notify, fused_recv=fused_recv,
                                         uniform_addressing=uniform_addressing)  # fmt: skip
    raise ValueError(f"'{op_name}' is not an AsyncLL half (its kernel family is {family})")
