"""The IntraNode EP kernels: ``ep_dispatch_<dtype>``, ``ep_combine_pull_<dtype>`` (zero-copy) and
``ep_combine_push_<dtype>`` (external input buffer), built from passes/ep_kernel_parts.py.

The protocols (docs/ep-protocols.md, IntraNode), with who writes, who waits, the scope and the order:

* dispatch: one warp per token, or, with fewer tokens than warps, up to min(K, W) warps per token, warp i
  of n serving the destinations of rank i mod n (each destination's slot, row, metadata, count and forward
  code still written by exactly one warp). Lanes < K read the expert ids, drop invalid ones and duplicates per
  destination PE (lowest k is the representative), reserve a slot on each destination's counter
  (``reserve_slot``: relaxed system-scope fetch-add), and record the forward map (pe * R + slot, or the
  null W * R). The warp copies the token row to every destination at once (``row_copy_to_peers``: each
  vector loaded once, stored to all) and the scales to each (``row_copy``); lanes < K store the K expert
  ids and weights, lane 0 the source position (src_pe * S + token), all as relaxed system-scope stores.
  Then ``grid_last_arrival`` (each block's release before it arrives, the last one's acquire) and, in warp
  0 of the last block, ``count_signal`` (flow-controlled count + 1 per peer: release fence before, acquire
  fence after), so every payload store a peer made to us is visible once its count has arrived. Slot
  counters are double buffered by round parity: round r reserves on counter r % 2 and, at its start,
  clears counter (r + 1) % 2, which nobody can touch then (round r - 1 is complete, and no peer starts round r + 1 before our round-r count reaches it, which is
  after the clear and a release fence). The round counter is incremented on the device at the end, so
  CUDA-graph replay is correct.
* dispatch replay (a routing handle, ``routing`` not null): every slot comes from the handle's recorded
  forward map instead of ``reserve_slot`` (no atomics); everything else is the dispatch above (the same
  stores, ``dest_ctr`` counts and handshake), so the outputs equal the recorded dispatch's. The slot
  counter of the round is left untouched (it was cleared one round before, and the next round clears
  it again); a replay is collective: every PE replays a handle of the same recorded round (a PE that
  reserved while another replays would collide with the replayed slots).
* combine, pull (zero-copy): the expert outputs are already in the registered symmetric buffer
  (``reg_x``); weights, when given, are copied next to them (``reg_w``) by all blocks, then the grid meets
  (``grid_barrier`` on ``combine_grid``: a peer's block b reads weight rows any of our blocks wrote, and the
  device barrier pairs only block b with block b); ``device_barrier`` (release/acquire across PEs); each
  warp sums, per token, the K source rows read directly from the peers (``accumulate_rows``, fp32), and the
  weights.
* combine, push (external input): each received row is written (``row_copy``) into its owner's staging
  row (our PE * M + token); ``grid_barrier`` then ``device_barrier``; each warp sums its tokens' staged
  rows locally.

With ``uniform_addressing`` (AMDGPU) the combines compute the same addresses differently, with no change
to the protocol: the pull combine's peer bases are read once per warp after ``device_barrier`` (the
translation reads only the heap-base table, which the barrier does not change), and a row's peer address
is that base plus the row's offset, exactly what ``mori_shmem.ptr`` of the row gives in a symmetric heap
(one offset on every PE).
"""

from __future__ import annotations

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem

from .ep_kernel_parts import (EpKernelConfig, ForwardEntry, KernelFrame, TokenShare, combine_row_stride,
                              dispatch_completion, dispatch_round, open_kernel, reduce_tokens, replay_or_reserve,
                              reserve_on_peer, return_rows, route_token, send_row_to_peers, send_to_destinations,
                              token_inputs, token_shares, token_source, trace_point)  # fmt: skip


def dispatch_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None) -> ir.Operation:
    """``ep_dispatch_<dtype>``: one warp per (token, share of its destinations), grid-strided, then the
    completion handshake."""
    f = open_kernel(cfg, "dispatch", generator="ep_intranode_kernels.dispatch_kernel", block=block, before=before)
    b = f.b
    trace_point(f, "dispatch", "begin")
    inputs = token_inputs(f)
    rnd = dispatch_round(f)
    n_x = b.index_cast(b.index, f.params.n)
    replay = f.present(f.params.routing)
    # Work items are (token, share): with fewer tokens than warps, several warps split a token's destinations.
    shares = token_shares(f, f.params.n)
    items = b.muli(n_x, b.index_cast(b.index, shares))
    with b.for_(f.gw, items, f.nw) as item:
        item32 = b.index_cast(b.i32, item)
        t32 = b.divui(item32, shares)
        t_x = b.index_cast(b.index, t32)
        share = TokenShare(b.remui(item32, shares), shares)
        recorded = lambda: b.gep(f.params.routing, b.addi(b.muli(t32, f.K), f.lane), b.i32)  # noqa: E731
        trace_point(f, "route", "begin")
        route = route_token(f, t_x, inputs, reserve=replay_or_reserve(f, replay, recorded, reserve_on_peer(rnd.slot_ctr)),
                            share=share)  # fmt: skip
        trace_point(f, "route", "end")
        source = token_source(f, route, inputs)
        dbase = b.const_i32(0)  # IntraNode: a destination's rows start at 0
        send_row_to_peers(f, route, source, inputs, dbase)
        trace_point(f, "copy", "end")
        send_to_destinations(f, route, source, inputs, dbase, rows=False)
        trace_point(f, "meta", "end")
    dispatch_completion(f, rnd)
    trace_point(f, "dispatch", "end")
    b.gpu_return()
    return f.func


def _combine_constants(f: KernelFrame) -> tuple[ir.Value, ir.Value]:
    """(the call's row bytes, weight-row bytes 4 * K), both i64."""
    return f.row, f.b.const_i64(4 * f.cfg.top_k)


def _peer_bases(f: KernelFrame, buffers: tuple[ir.Value, ...]) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]]]:
    """Once per warp (pull combine, uniform addressing): lane p < W holds PE p's address of each buffer
    (other lanes their own PE's), split in 32-bit halves for broadcasts. Returns (the i64 constant 32,
    [(low, high) per buffer])."""
    b = f.b
    pb_pe = b.select(b.cmpi("ult", f.lane, f.W), f.lane, f.me)
    c32 = b.const_i64(32)
    halves = []
    for buf in buffers:
        addr = b.ptrtoint(b.i64, mori_shmem.ptr(buf, pb_pe, **b.at()))
        halves.append((b.trunci(b.i32, addr), b.trunci(b.i32, b.shrui(addr, c32))))
    return c32, halves


def _peer_base(f: KernelFrame, c32: ir.Value, halves: tuple[ir.Value, ir.Value], pe: ir.Value) -> ir.Value:
    """PE ``pe``'s base of one buffer, from the per-warp halves broadcast from lane ``pe`` (warp-uniform)."""
    b = f.b
    lo = b.broadcast_lane(halves[0], pe)
    hi = b.broadcast_lane(halves[1], pe)
    lo64, hi64 = b.extui(b.i64, lo), b.extui(b.i64, hi)
    return b.inttoptr(b.ptr, b.ori(b.shli(hi64, c32), lo64))


def combine_pull_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                        uniform_addressing: bool = False) -> ir.Operation:  # fmt: skip
    """``ep_combine_pull_<dtype>``: weights next to the registered rows, the PEs meet, then each token sums
    its K rows read from the peers' registered buffers (peer k's address of ``reg_x[slot]``).
    ``uniform_addressing``: from per-warp peer bases instead of 2K ``mori_shmem.ptr`` per token."""
    f = open_kernel(cfg, "combine_pull", generator="ep_intranode_kernels.combine_pull_kernel", block=block,
                    before=before)  # fmt: skip
    b, p = f.b, f.params
    trace_point(f, "combine", "begin")
    rowc, kb = _combine_constants(f)
    has_iw = f.present(p.inp_w)
    # Weights to send back (optional) go next to the registered rows, then the PEs meet.
    with b.if_(has_iw):
        nwk_x = b.index_cast(b.index, b.muli(b.load(b.i32, p.total), f.K))
        bdim = b.block_dim("x")
        gt = b.addi(b.muli(f.bid_i, bdim), f.tid_i)
        gs = b.muli(f.nb_i, bdim)
        with b.for_(gt, nwk_x, gs) as i:
            i32 = b.index_cast(b.i32, i)
            v = b.load(b.f32, b.gep(p.inp_w, i32, b.f32))
            b.store(v, b.gep(p.reg_w, i32, b.f32))
        # Peers read weight rows any of this PE's blocks wrote, and the device barrier pairs each block only
        # with the same block of every PE: the grid meets first (its release covers every block's stores).
        mori_comm.grid_barrier(p.grid_ctr, **b.at())
    trace_point(f, "device_barrier", "begin")
    mori_comm.device_barrier(p.bar_slots, p.bar_epochs, world_size=cfg.world_size, max_blocks=cfg.max_blocks,
                             **b.at())  # fmt: skip
    trace_point(f, "device_barrier", "end")
    if uniform_addressing:
        c32, (xb, wb) = _peer_bases(f, (p.reg_x, p.reg_w))

        def source_row(s: ForwardEntry) -> tuple[ir.Value, ir.Value]:
            pc = b.select(s.valid, s.pe, f.me)  # a valid PE's lane (an invalid source reads the zero row)
            xbase = _peer_base(f, c32, xb, pc)
            wbase = _peer_base(f, c32, wb, pc)
            xr = b.gep(xbase, b.muli(s.slot64, rowc), b.i8)
            row = b.select(s.valid, xr, p.zero_row)
            return row, b.gep(wbase, b.muli(s.slot64, kb), b.i8)

        reduce_tokens(f, rowc, source_row, uniform=True, narrow=True)
    else:

        def source_row(s: ForwardEntry) -> tuple[ir.Value, ir.Value]:
            xr = mori_shmem.ptr(b.gep(p.reg_x, b.muli(s.slot64, rowc), b.i8), s.pe, **b.at())
            row = b.select(s.valid, xr, p.zero_row)
            return row, mori_shmem.ptr(b.gep(p.reg_w, b.muli(s.slot64, kb), b.i8), s.pe, **b.at())

        reduce_tokens(f, rowc, source_row)
    trace_point(f, "combine", "end")
    b.gpu_return()
    return f.func


def combine_push_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None, *,
                        uniform_addressing: bool = False) -> ir.Operation:  # fmt: skip
    """``ep_combine_push_<dtype>``: each received row goes to its owner's staging row (our PE * M + token);
    the grid and the PEs meet; then each token sums its K staged rows locally."""
    f = open_kernel(cfg, "combine_push", generator="ep_intranode_kernels.combine_push_kernel", block=block,
                    before=before)  # fmt: skip
    b, p = f.b, f.params
    trace_point(f, "combine", "begin")
    rowc, kb = _combine_constants(f)
    S = b.const_i32(cfg.send_stride)
    M = b.const_i32(cfg.max_tokens_per_rank)
    has_iw = f.present(p.inp_w)

    def locate(i: ir.Value) -> tuple[ir.Value, ir.Value]:
        # Received row i belongs to token tok of PE owner (its source position owner * S + tok).
        pos = b.load(b.i32, b.gep(p.src_pos, i, b.i32))
        owner = b.divui(pos, S)
        tok = b.remui(pos, S)
        return owner, b.addi(b.muli(f.me, M), tok)

    return_rows(f, locate, p.stage_x, p.stage_w, rowc, has_iw)
    trace_point(f, "grid_barrier", "begin")
    mori_comm.grid_barrier(p.grid_ctr, **b.at())
    trace_point(f, "device_barrier", "begin")
    mori_comm.device_barrier(p.bar_slots, p.bar_epochs, world_size=cfg.world_size, max_blocks=cfg.max_blocks,
                             **b.at())  # fmt: skip
    trace_point(f, "device_barrier", "end")

    stage = combine_row_stride(f, rowc)  # staging rows: the call's rows, or its wire rows when quantizing

    def source_row(s: ForwardEntry) -> tuple[ir.Value, ir.Value]:
        srow64 = b.extui(b.i64, b.addi(b.muli(s.pe, M), s.t))  # our staging row on PE pe: pe * M + t
        return b.gep(p.stage_x, b.muli(srow64, stage), b.i8), b.gep(p.stage_w, b.muli(srow64, kb), b.i8)

    reduce_tokens(f, rowc, source_row, uniform=uniform_addressing, narrow=uniform_addressing)
    trace_point(f, "combine", "end")
    b.gpu_return()
    return f.func
