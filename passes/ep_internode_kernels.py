"""The inter-node EP kernels (InterNode "V0", InterNodeV1, InterNodeV1LL), built from passes/ep_kernel_parts.py
and the mori_comm blocks. One scheme serves the three kernel types (docs/ep-protocols.md §16):

* **Topology.** W PEs, G per node (``gpu_per_node``), N = W / G nodes. An inter-node send goes to a *hop*:
  V1/V1LL: a remote node, through its rail-aligned proxy ``node * G + me % G`` (the PE of that node with
  this PE's local rank), which forwards to the PEs of its node; V0: a remote PE directly (hop_size 1: the
  "forward" is to itself). There are ``hops`` = W / hop_size hops, ``remote`` of them on other nodes; the
  hop index a target files this PE's records under is ``me / hop_size``. Same-node destinations are
  written directly, as IntraNode does.
* **Transport discipline.** A PE of another node is reached only through ``mori_comm.chunk_send`` (puts
  and a put-with-signal with a queue pair: RDMA when linked with MORI's bitcode); every P2P access
  (row copies, slot reservations, ``mori_shmem.p``/``ptr``, the count handshake and the node barrier)
  names its peer through ``mori_comm.node_pe`` or is to this PE itself (test/python/test_ep_transport.py).

Protocols, with who writes, who waits, the scope and the order:

**Dispatch** (round r = ``round_ctr``, parity r % 2, signal base ``(r + 1) << 32``):

1. ``ep_inter_stage_<dtype>``: one warp per token packs it into ``i_stage[t]`` as a record (row | scales |
   K ids | K weights | source position me * S + t). Plain local stores; the kernel boundary orders them
   before step 2 reads them.
2. ``ep_inter_dispatch_<dtype>``: blocks [0, rdma_blocks) take the inter-node role, the others the
   same-node role (with one node, every block the same-node role).

   * *Chunked send* (inter-node warps, one warp per (remote hop, chunk of ``wave`` tokens)): lane = token;
     the ballot of the tokens the hop needs (V1/V0: an expert on the hop's PEs; V1LL: every live token)
     is the chunk's mask; ``send map[t][hop]`` records each token's packed slot (chunk * wave + rank) or -1.
     ``chunk_send`` puts the runs of selected records into the target's ``i_land[r % 2][my hop]`` at the
     chunk's rows and then **one signal** ``base | count`` into its ``i_flag[r % 2][my hop][chunk]`` (same
     queue pair ``chunk % num_qp``: ordered after the data; P2P: release). Every chunk of ceil(M / wave) is
     signalled, empty ones with count 0, so a target knows when a source is done without a count word.
   * *Receive and forward* (the same warps, after their sends): one warp per (remote source hop, chunk,
     share; a chunk's records are split over CHUNK_SHARES warps): ``chunk_wait`` (every lane polls the
     local flag until it carries this round's base, then fences: acquire) gives the count; each of the
     share's records below it is routed like a token (its K ids; only the
     destinations on this PE's hop group: the node for V1, this PE for V0), a slot reserved on each
     destination's counter (relaxed system-scope fetch-add, through node_pe), and its row, scales, ids,
     weights and source position (the record's) stored to the destination's output row (relaxed
     system-scope stores through node_pe). ``i_pfwd[hop][record]`` keeps the K forward codes for combine.
     Then ``quiet`` (the RDMA puts complete before the staging is reused).
   * *Same-node* (the other blocks): one warp per token, IntraNode's route / copy restricted to the
     destinations on this node (the forward map holds NULL for the others).
   * *Completion*: ``grid_barrier`` (all roles' stores of this PE ordered), then ``node_count_signal``
     among the node's G PEs (flow-controlled count + 1: release fence before, acquire after): the rows a
     node peer wrote to us, directly or forwarded, are visible once its count has arrived; ``total`` is the
     sum. The round counter advances on the device.

   Why a sender is at most one round ahead of a target (so two parities of landing regions and flags
   suffice): a PE's round r + 1 forward phase waits for the round-(r + 1) chunks of its sources, which
   they send only after completing round r, i.e. after reading what this PE sent them in round r.

**Combine** (the op first copies the expert outputs and weights into the registered ``reg_x``/``reg_w``;
combine round c = ``i_rounds[0]``, parity c % 2, base ``(c + 1) << 32``):

1. ``ep_inter_combine_<dtype>``: ``node_device_barrier`` (every node peer's registered rows are written
   before anyone gathers them). Inter-node blocks: one warp per (source hop, chunk, share): for each of the
   share's forwarded records, the rows of the node PEs it was forwarded to (``i_pfwd``) are summed in fp32
   and stored, rounded to the combine dtype, in ``i_fpart`` with their weights (the **per-node
   partial**); the warp fences (release) and counts its share done on the chunk's counter; the warp that
   completes a chunk fences (acquire) and
   ``chunk_send``\\ s the chunk's partials back to the record's source (the hop's PE with our local rank),
   into its ``i_crecv[c % 2][my hop]`` with one signal ``base | count`` (empty chunks too), and resets the
   counter. Same-node blocks: each own token's node partial (its rows on this node's PEs, through the
   forward map) into ``i_part`` (combine dtype). Then ``quiet``.
2. ``ep_inter_combine_all_<dtype>``: ``node_device_barrier`` (every node peer has finished step 1's gathers
   from our registered rows before anyone ends the round and overwrites them). One warp per own token: the
   lanes of the remote hops the token was sent to wait (``chunk_wait``) for the chunk that carries its
   partial, the warp fences (acquire), and the node's own partial and the remote ones are summed in fp32
   into ``out`` (and the weights): the **hierarchical combine**, rounded twice (partials, then the sum) as
   MORI's. Warp 0 of block 0 waits for every chunk of every remote hop, so no PE is two combine rounds
   ahead of another (two parities suffice even with several combines per dispatch). The last block to
   finish advances the combine round (the blocks have all read it by then).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.ep_schema import TRAFFIC_COUNTERS

from .ep_kernel_parts import (EpKernelConfig, ForwardEntry, KernelFrame, TokenInputs, TokenSource, dispatch_round,
                              open_kernel, reduce_tokens, replay_or_reserve, route_token, send_row_to_peers,
                              send_to_destinations, token_inputs, token_source)  # fmt: skip

# The receiving side splits a chunk's records over CHUNK_SHARES warps (record q to share q % CHUNK_SHARES): a
# warp pays one acquire (dispatch) or one release and count (combine) per share, not per record. Measured on
# the H200 (bench/NOTES.md, session 7): one share per record made the G = 2 combine 3.4x slower at 4096
# tokens, and more shares at 128 tokens (22 instead of 4) made it 2.2x slower (more system-scope fences)
# without speeding the dispatch up.
CHUNK_SHARES = 4
TRAFFIC = {name: i for i, name in enumerate(TRAFFIC_COUNTERS)}  # the word of each counter in ``traffic``


class Record(NamedTuple):
    """Byte offsets of an inter-node record's fields at the kernel's dtype, and its size."""

    ids: int
    weights: int
    scales: int
    position: int
    size: int


def _record(cfg: EpKernelConfig) -> Record:
    row, k = cfg.row_bytes, cfg.top_k
    # The scales right after the row and padded to 16 bytes: every field stays aligned for its accesses
    # (16-byte vectors for the row and for scales of a multiple of 16 bytes, 4 bytes for ids, weights and
    # the position), whatever K and the scales' size.
    ids = row + -(-cfg.scale_bytes // 16) * 16
    return Record(ids, ids + 4 * k, row, ids + 8 * k, cfg.sizes.record_bytes)


class Topology(NamedTuple):
    """This PE's hops. Python ints: ``hops``, ``remote`` (hops on other nodes), ``chunks`` (ceil(M / wave)),
    ``shares`` (warps per chunk on the receiving side), ``hop_size``, ``group`` (G). i32 values: ``my_hop``
    (me / hop_size: the hop index targets file this PE's records under), ``first_remote`` (the first remote
    hop, before the modulo), ``b_hops`` and ``b_hop_size`` (the constants)."""

    hops: int
    remote: int
    chunks: int
    shares: int
    hop_size: int
    my_hop: ir.Value
    first_remote: ir.Value
    b_hops: ir.Value
    b_hop_size: ir.Value
    group: int


def _topology(f: KernelFrame) -> Topology:
    b, cfg = f.b, f.cfg
    s = cfg.sizes
    g, hs = s.node_size, s.hop_pes
    gc, hsc = b.const_i32(g), b.const_i32(hs)
    node_base = b.muli(b.divui(f.me, gc), gc)
    my_hop = b.divui(f.me, hsc)
    first_remote = b.addi(b.divui(node_base, hsc), b.const_i32(g // hs))
    chunks = -(-cfg.max_tokens_per_rank // cfg.wave_size)
    return Topology(s.hops, s.hops - g // hs, chunks, CHUNK_SHARES, hs, my_hop, first_remote, b.const_i32(s.hops),
                    hsc, g)  # fmt: skip


def _peer(f: KernelFrame, topo: Topology):
    """The P2P peer naming of the inter-node kernels: ``mori_comm.node_pe`` (the PE of this node)."""
    return lambda pe: mori_comm.node_pe(pe, group_size=topo.group, **f.b.at())


def _remote_hop(f: KernelFrame, topo: Topology, j: ir.Value) -> ir.Value:
    """The j-th remote hop (i32), j in [0, remote): the hops after this node's, cyclically."""
    return f.b.remui(f.b.addi(topo.first_remote, j), topo.b_hops)


def _hop_target(f: KernelFrame, topo: Topology, hop: ir.Value) -> ir.Value:
    """The PE of ``hop`` that exchanges with this PE: hop * hop_size + me % hop_size (V1: the rail proxy)."""
    b = f.b
    return b.addi(b.muli(hop, topo.b_hop_size), b.remui(f.me, topo.b_hop_size))


def _count(f: KernelFrame, counter: str, nbytes: ir.Value) -> None:
    """Adds ``nbytes`` (i64) to this PE's traffic counter ``counter`` (relaxed, local; the calling lanes)."""
    b = f.b
    b.atomicrmw("add", b.gep(f.params.traffic, TRAFFIC[counter], b.i64), nbytes, "monotonic")


def _count_lanes(f: KernelFrame, counter: str, lanes: ir.Value, nbytes: ir.Value) -> None:
    """Adds ``nbytes`` (i64) per lane of the warp whose ``lanes`` is set (a warp-uniform call): one atomic, by
    lane 0."""
    b = f.b
    n = b.ctpop(b.ballot(lanes, f.cfg.wave_size))
    with b.if_(f.lane0):
        _count(f, counter, b.muli(n, nbytes))


def _rdma_blocks(f: KernelFrame, topo: Topology) -> ir.Value:
    """The blocks of the inter-node role (index): the call's ``rdma_blocks``, or none when the topology has
    one node (no remote hop: every block then serves the same-node role)."""
    b = f.b
    return b.index_cast(b.index, f.params.rdma_blocks) if topo.remote else f.c0x


def _warps(f: KernelFrame, rdma_blocks: ir.Value) -> tuple[tuple[ir.Value, ir.Value], tuple[ir.Value, ir.Value]]:
    """((first, count) of the inter-node role's warps, (first, count) of the same-node role's): blocks
    [0, rdma_blocks) and the rest."""
    b = f.b
    split = b.muli(rdma_blocks, f.wpb)
    return (f.gw, split), (b.subi(f.gw, split), b.subi(f.nw, split))


def _round_base(f: KernelFrame, round_: ir.Value) -> ir.Value:
    """The signal base of round ``round_`` (i64): (round + 1) << 32, above every older round's signals."""
    b = f.b
    return b.shli(b.addi(round_, b.const_i64(1)), b.const_i64(32))


def _i64(f: KernelFrame, value: ir.Value) -> ir.Value:
    return f.b.extui(f.b.i64, value)


# ---- dispatch -----------------------------------------------------------------------------------------


def stage_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None) -> ir.Operation:
    """``ep_inter_stage_<dtype>``: every token of this PE as a record in ``stage`` (one warp per token)."""
    f = open_kernel(cfg, "inter_stage", generator="ep_internode_kernels.stage_kernel", block=block, before=before)
    b, p = f.b, f.params
    inputs = token_inputs(f)
    rec = _record(cfg)
    recc = b.const_i64(rec.size)
    with b.for_(f.gw, b.index_cast(b.index, p.n), f.nw) as t_x:
        t = b.index_cast(b.i32, t_x)
        t64 = _i64(f, t)
        dst = b.gep(p.stage, b.muli(t64, recc), b.i8)
        mori_comm.row_copy(dst, b.gep(p.x, b.muli(t64, inputs.row), b.i8), inputs.row, f.me, **b.at())
        with b.if_(f.is_k):
            slotidx = b.addi(b.muli(t, f.K), f.lane)
            b.store(b.load(b.i32, b.gep(p.idx, slotidx, b.i32)), b.gep(b.gep(dst, rec.ids, b.i8), f.lane, b.i32))
            wz = b.const_f32(0.0)
            wv = b.if_else(inputs.has_w, [b.f32], lambda: [b.load(b.f32, b.gep(p.w, slotidx, b.f32))], lambda: [wz])[0]
            b.store(wv, b.gep(b.gep(dst, rec.weights, b.i8), f.lane, b.f32))
        if cfg.scale_bytes:
            with b.if_(inputs.has_s):
                sb = b.const_i64(cfg.scale_bytes)
                mori_comm.row_copy(b.gep(dst, rec.scales, b.i8), b.gep(p.s, b.muli(t64, sb), b.i8), sb, f.me, **b.at())
        with b.if_(f.lane0):
            b.store(b.addi(b.muli(f.me, inputs.send_stride), t), b.gep(dst, rec.position, b.i8))
    b.gpu_return()
    return f.func


def dispatch_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None) -> ir.Operation:
    """``ep_inter_dispatch_<dtype>``: chunked sends, receive-and-forward, same-node rows, completion."""
    f = open_kernel(cfg, "inter_dispatch", generator="ep_internode_kernels.dispatch_kernel", block=block,
                    before=before)  # fmt: skip
    b, p = f.b, f.params
    inputs = token_inputs(f)
    rnd = dispatch_round(f)
    topo = _topology(f)
    base = _round_base(f, rnd.round)
    rdma_blocks = _rdma_blocks(f, topo)
    (rw, nrw), (xw, nxw) = _warps(f, rdma_blocks)
    replay = f.present(p.routing)  # a routing handle: every slot from its recorded forward maps
    in_rdma = b.cmpi("ult", f.bid_i, rdma_blocks)
    reserve = _reserve(f, topo, rnd.slot_ctr)
    with b.if_(in_rdma):
        _send_chunks(f, topo, inputs, rnd.par, base, rw, nrw)
        _forward_records(f, topo, inputs, rnd.par, base, rw, nrw, reserve, replay)
        mori_shmem.quiet(**b.at())
    with b.if_(b.xori(in_rdma, f.true)):
        _send_same_node(f, topo, inputs, xw, nxw, reserve, replay)
    mori_comm.grid_barrier(p.grid_ctr, **b.at())
    first_warp = b.andi(rnd.b0, b.cmpi("eq", f.warp_in_block, f.c0x))
    with b.if_(first_warp):
        mori_comm.node_count_signal(p.signals, p.dest_ctr, p.total, world_size=cfg.world_size, group_size=topo.group,
                                    **b.at())  # fmt: skip
        with b.if_(f.lane0):
            b.store(b.addi(rnd.round, rnd.one64), p.round_ctr)
    b.gpu_return()
    return f.func


def _reserve(f: KernelFrame, topo: Topology, slot_ctr: ir.Value):
    peer = _peer(f, topo)
    return lambda f_, pe: mori_comm.reserve_slot(slot_ctr, peer(pe), **f_.b.at())


def _send_chunks(f: KernelFrame, topo: Topology, inputs: TokenInputs, par: ir.Value, base: ir.Value,
                 first: ir.Value, count: ir.Value) -> None:  # fmt: skip
    """One warp per (remote hop, chunk): the ballot of the tokens the hop needs, their send-map entries,
    then ``chunk_send`` of their records to the hop's target with one signal."""
    b, p, cfg = f.b, f.params, f.cfg
    s = cfg.sizes
    wave = cfg.wave_size
    rec = _record(cfg)
    recc = b.const_i64(rec.size)
    chunks_x = b.const_index(topo.chunks)
    with b.for_(first, b.const_index(topo.remote * topo.chunks), count) as it:
        j = b.index_cast(b.i32, b.divui(it, chunks_x))
        c = b.index_cast(b.i32, b.remui(it, chunks_x))
        hop = _remote_hop(f, topo, j)
        cbase = b.muli(c, b.const_i32(wave))
        t = b.addi(cbase, f.lane)
        live = b.cmpi("ult", t, p.n)
        if cfg.send_all:
            need = live
        else:
            def expert_on_hop(k, acc):
                e = b.if_else(live, [b.i32], lambda: [b.load(b.i32, b.gep(p.idx, b.addi(b.muli(t, f.K),
                              b.index_cast(b.i32, k)), b.i32))], lambda: [b.const_i32(-1)])[0]  # fmt: skip
                pe = b.divsi(e, inputs.experts_per_rank)
                ok = b.andi(b.cmpi("sge", e, f.c0i), b.cmpi("slt", pe, f.W))
                on_hop = b.cmpi("eq", b.divui(b.select(ok, pe, f.c0i), topo.b_hop_size), hop)
                return [b.ori(acc, b.andi(ok, on_hop))]

            need = b.for_iter(f.c0x, f.Kx, f.c1x, [f.false], expert_on_hop)[0]
        mask = b.ballot(need, wave)
        below = b.subi(b.shli(b.const_i64(1), _i64(f, f.lane)), b.const_i64(1))
        rank = b.trunci(b.i32, b.ctpop(b.andi(mask, below)))
        with b.if_(live):
            slot = b.select(need, b.addi(cbase, rank), b.const_i32(-1))
            b.store(slot, b.gep(p.smap, b.addi(b.muli(t, topo.b_hops), hop), b.i32))
        region = _i64(f, b.addi(b.muli(par, topo.b_hops), topo.my_hop))  # [r % 2][my hop] at the target
        cbase64 = _i64(f, cbase)
        dest = b.gep(p.land, b.muli(b.addi(b.muli(region, b.const_i64(s.chunk_rows)), cbase64), recc), b.i8)
        src = b.gep(p.stage, b.muli(cbase64, recc), b.i8)
        flag = b.gep(p.flag, b.addi(b.muli(region, b.const_i64(s.max_chunks)), _i64(f, c)), b.i64)
        qp = b.remui(c, b.const_i32(cfg.num_qp))
        sent = mori_comm.chunk_send(dest, src, recc, mask, flag, base, _hop_target(f, topo, hop), qp, **b.at())
        with b.if_(f.lane0):
            _count(f, "dispatch_rdma", sent)


def _record_inputs(f: KernelFrame, inputs: TokenInputs) -> TokenInputs:
    """A record always carries weights (0 when the source had none) and its scale bytes."""
    return inputs._replace(has_w=f.true, has_s=f.true)


def _row_meta_bytes(f: KernelFrame) -> ir.Value:
    """Bytes of one row written to a destination (i64): the call's row, K ids, K weights, source position,
    scales."""
    cfg = f.cfg
    return f.b.addi(f.row, f.b.const_i64(8 * cfg.top_k + 4 + cfg.scale_bytes))


def _forward_records(f: KernelFrame, topo: Topology, inputs: TokenInputs, par: ir.Value, base: ir.Value,
                     first: ir.Value, count: ir.Value, reserve, replay: ir.Value) -> None:  # fmt: skip
    """One warp per (remote source hop, chunk, share): wait for the chunk, then forward its records
    q = share, share + shares, ... to the destinations on this PE's hop group (with ``replay``, to the
    slots recorded in ``routing_pfwd`` at the record's place)."""
    b, p, cfg = f.b, f.params, f.cfg
    s = cfg.sizes
    wave = cfg.wave_size
    rec = _record(cfg)
    recc = b.const_i64(rec.size)
    rinputs = _record_inputs(f, inputs)
    peer = _peer(f, topo)
    with _chunk_shares(f, topo, first, count) as (j, c, share):
        hop = _remote_hop(f, topo, j)
        region = _i64(f, b.addi(b.muli(par, topo.b_hops), hop))
        flag = b.gep(p.flag, b.addi(b.muli(region, b.const_i64(s.max_chunks)), _i64(f, c)), b.i64)
        got = mori_comm.chunk_wait(flag, base, **b.at())  # every lane: the fence acquires for each
        with b.for_(share, b.index_cast(b.index, got), b.const_index(topo.shares)) as q_x:
            q = b.index_cast(b.i32, q_x)
            slot64 = _i64(f, b.addi(b.muli(c, b.const_i32(wave)), q))  # record row in the source's region
            record = b.gep(p.land, b.muli(b.addi(b.muli(region, b.const_i64(s.chunk_rows)), slot64), recc), b.i8)
            kept = b.addi(b.muli(_i64(f, hop), b.const_i64(s.chunk_rows)), slot64)  # [hop][record] of i_pfwd
            fwd_row = b.gep(p.pfwd, b.muli(kept, b.const_i64(cfg.top_k)), b.i32)
            accept = lambda pe: b.cmpi("eq", b.divui(pe, topo.b_hop_size), topo.my_hop)  # noqa: E731
            recorded = lambda: b.gep(b.gep(p.routing_pfwd, b.muli(kept, b.const_i64(cfg.top_k)), b.i32),  # noqa: E731
                                     f.lane, b.i32)  # fmt: skip
            route = route_token(f, b.index_cast(b.index, q), rinputs,
                                reserve=replay_or_reserve(f, replay, recorded, reserve),
                                ids=b.gep(record, rec.ids, b.i8), fwd_row=fwd_row, accept=accept,
                                count_invalid=False)  # (the source counted them)  # fmt: skip
            wv = b.if_else(f.is_k, [b.f32], lambda: [b.load(b.f32, b.gep(b.gep(record, rec.weights, b.i8), f.lane,
                           b.f32))], lambda: [b.const_f32(0.0)])[0]  # fmt: skip
            source = TokenSource(b.const_i64(0), record, wv)
            send_row_to_peers(f, route, source, rinputs, f.c0i, peer=peer)
            position = b.load(b.i32, b.gep(record, rec.position, b.i8))
            send_to_destinations(f, route, source, rinputs, f.c0i, rows=False, peer=peer,
                                 scale_source=b.gep(record, rec.scales, b.i8), position=position)  # fmt: skip
            _count_lanes(f, "dispatch_xgmi", route.ok, _row_meta_bytes(f))


@contextlib.contextmanager
def _chunk_shares(f: KernelFrame, topo: Topology, first: ir.Value, count: ir.Value):
    """A loop over the work items (remote hop j, chunk c, share) of the warps [first, first + count):
    yields j and c (i32) and the share (index, in [0, topo.shares))."""
    b = f.b
    shares = b.const_index(topo.shares)
    per_hop = b.const_index(topo.chunks * topo.shares)
    with b.for_(first, b.const_index(topo.remote * topo.chunks * topo.shares), count) as it:
        r = b.remui(it, per_hop)
        yield b.index_cast(b.i32, b.divui(it, per_hop)), b.index_cast(b.i32, b.divui(r, shares)), b.remui(r, shares)


def _send_same_node(f: KernelFrame, topo: Topology, inputs: TokenInputs, first: ir.Value, count: ir.Value,
                    reserve, replay: ir.Value) -> None:  # fmt: skip
    """One warp per own token: IntraNode's route and copies, to the destinations on this node only (with
    ``replay``, to the slots recorded in ``routing``, row t)."""
    b, p = f.b, f.params
    peer = _peer(f, topo)
    gc = b.const_i32(topo.group)
    my_node = b.divui(f.me, gc)
    with b.for_(first, b.index_cast(b.index, p.n), count) as t_x:
        accept = lambda pe: b.cmpi("eq", b.divui(pe, gc), my_node)  # noqa: E731
        recorded = lambda: b.gep(p.routing, b.addi(b.muli(b.index_cast(b.i32, t_x), f.K), f.lane), b.i32)  # noqa: E731
        route = route_token(f, t_x, inputs, reserve=replay_or_reserve(f, replay, recorded, reserve), accept=accept)
        source = token_source(f, route, inputs)
        send_row_to_peers(f, route, source, inputs, f.c0i, peer=peer)
        send_to_destinations(f, route, source, inputs, f.c0i, rows=False, peer=peer)
        _count_lanes(f, "dispatch_xgmi", route.ok, _row_meta_bytes(f))


# ---- combine ------------------------------------------------------------------------------------------


def combine_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None) -> ir.Operation:
    """``ep_inter_combine_<dtype>``: the node meets; the forwarded records' partials go back to their
    sources (inter-node blocks); each own token's node partial (same-node blocks)."""
    f = open_kernel(cfg, "inter_combine", generator="ep_internode_kernels.combine_kernel", block=block,
                    before=before)  # fmt: skip
    b, p = f.b, f.params
    topo = _topology(f)
    mori_comm.node_device_barrier(p.bar_slots, p.bar_epochs, world_size=cfg.world_size, group_size=topo.group,
                                  max_blocks=cfg.max_blocks, **b.at())  # fmt: skip
    one64 = b.const_i64(1)
    dpar = b.trunci(b.i32, b.andi(b.subi(b.load(b.i64, p.round_ctr), one64), one64))  # the dispatch's parity
    cround = b.load(b.i64, p.rounds)
    cpar = b.trunci(b.i32, b.andi(cround, one64))
    base = _round_base(f, cround)
    has_w = b.cmpi("ne", p.has_w, f.c0i)
    rdma_blocks = _rdma_blocks(f, topo)
    (rw, nrw), (xw, nxw) = _warps(f, rdma_blocks)
    in_rdma = b.cmpi("ult", f.bid_i, rdma_blocks)
    with b.if_(in_rdma):
        _return_partials(f, topo, dpar, cpar, base, has_w, rw, nrw)
        mori_shmem.quiet(**b.at())
    with b.if_(b.xori(in_rdma, f.true)):
        _node_partials(f, topo, has_w, xw, nxw)
    b.gpu_return()
    return f.func


def _count_gathered(f: KernelFrame, lanes: ir.Value, has_w: ir.Value) -> None:
    """Counts the rows gathered from this node by the warp's lanes set in ``lanes`` (a warp-uniform call):
    each the row and, with weights, its K weights (one atomic, by lane 0)."""
    b, cfg = f.b, f.cfg
    n = b.ctpop(b.ballot(lanes, cfg.wave_size))
    per_row = b.select(has_w, b.addi(f.row, b.const_i64(4 * cfg.top_k)), f.row)
    with b.if_(f.lane0):
        _count(f, "combine_xgmi", b.muli(n, per_row))


def _return_partials(f: KernelFrame, topo: Topology, dpar: ir.Value, cpar: ir.Value, base: ir.Value,
                     has_w: ir.Value, first: ir.Value, count: ir.Value) -> None:  # fmt: skip
    b, p, cfg = f.b, f.params, f.cfg
    s = cfg.sizes
    wave = cfg.wave_size
    rowc, kb = f.row, b.const_i64(4 * cfg.top_k)  # the registered rows are packed at the call's row
    prec = b.const_i64(s.partial_bytes)  # a partial keeps the config's layout (its weights after the widest row)
    peer = _peer(f, topo)
    with _chunk_shares(f, topo, first, count) as (j, c, share):
        hop = _remote_hop(f, topo, j)
        dregion = _i64(f, b.addi(b.muli(dpar, topo.b_hops), hop))
        dflag = b.gep(p.flag, b.addi(b.muli(dregion, b.const_i64(s.max_chunks)), _i64(f, c)), b.i64)
        # The dispatch's count (its chunk_wait acquired it): a relaxed atomic load, as the word is written by
        # the network with RDMA (never a cached copy of an older round).
        got = b.trunci(b.i32, b.load(b.i64, dflag, alignment=8, ordering="monotonic"))
        crow = b.muli(c, b.const_i32(wave))
        with b.for_(share, b.index_cast(b.index, got), b.const_index(topo.shares)) as q_x:
            kept = b.addi(b.muli(_i64(f, hop), b.const_i64(s.chunk_rows)),
                          _i64(f, b.addi(crow, b.index_cast(b.i32, q_x))))  # fmt: skip
            _sum_forwarded(f, topo, b.gep(p.pfwd, b.muli(kept, b.const_i64(cfg.top_k)), b.i32),
                           b.gep(p.fpart, b.muli(kept, prec), b.i8), rowc, kb, has_w, peer)  # fmt: skip
        mori_shmem.fence(**b.at())  # release: this share's partials, before the share is counted done
        counter = b.gep(p.done, b.addi(b.muli(_i64(f, hop), b.const_i64(s.max_chunks)), _i64(f, c)), b.i32)
        old = b.if_else(f.lane0, [b.i32], lambda: [b.atomicrmw("add", counter, f.c1i, "monotonic")],
                        lambda: [f.c0i])[0]  # fmt: skip
        old = b.shuffle("idx", old, f.c0i, f.wave)[0]
        with b.if_(b.cmpi("eq", b.addi(old, f.c1i), b.const_i32(topo.shares))):  # the chunk's last share
            mori_shmem.fence(**b.at())  # acquire: every share's partials of the chunk
            full = b.cmpi("uge", got, b.const_i32(64))
            ones = b.subi(b.shli(b.const_i64(1), _i64(f, b.select(full, f.c0i, got))), b.const_i64(1))
            mask = b.select(full, b.const_i64(-1), ones)
            region = _i64(f, b.addi(b.muli(cpar, topo.b_hops), topo.my_hop))
            dest = b.gep(p.crecv, b.muli(b.addi(b.muli(region, b.const_i64(s.chunk_rows)), _i64(f, crow)), prec),
                         b.i8)  # fmt: skip
            src_kept = b.addi(b.muli(_i64(f, hop), b.const_i64(s.chunk_rows)), _i64(f, crow))
            src = b.gep(p.fpart, b.muli(src_kept, prec), b.i8)
            cflag = b.gep(p.cflag, b.addi(b.muli(region, b.const_i64(s.max_chunks)), _i64(f, c)), b.i64)
            qp = b.remui(c, b.const_i32(cfg.num_qp))
            sent = mori_comm.chunk_send(dest, src, prec, mask, cflag, base, _hop_target(f, topo, hop), qp, **b.at())
            with b.if_(f.lane0):
                b.store(f.c0i, counter)  # every share of the chunk is done: ready for the next round
                _count(f, "combine_rdma", sent)


def _sum_forwarded(f: KernelFrame, topo: Topology, fwd_row: ir.Value, part: ir.Value, rowc: ir.Value, kb: ir.Value,
                   has_w: ir.Value, peer) -> None:  # fmt: skip
    """The partial of one forwarded record: its rows on the node's PEs (K forward codes at ``fwd_row``)
    summed in fp32 into ``part`` (row, then K weights when ``has_w``)."""
    b, p, cfg = f.b, f.params, f.cfg
    code = b.if_else(f.is_k, [b.i32], lambda: [b.load(b.i32, b.gep(fwd_row, f.lane, b.i32))], lambda: [f.NULL])[0]
    # A record reaches at most one row per PE of the hop group (dedup per PE): sum only that many sources,
    # the valid codes taken in lane order from the ballot (the others would read the zero row).
    left = b.ballot(b.cmpi("ne", code, f.NULL), cfg.wave_size)
    zero, one = b.const_i64(0), b.const_i64(1)
    rows, wrows, valids = [], [], []
    for _ in range(min(cfg.top_k, topo.hop_size)):
        lowest = b.andi(left, b.subi(zero, left))
        ck = b.shuffle("idx", code, b.trunci(b.i32, b.ctpop(b.subi(lowest, one))), f.wave)[0]
        ck = b.select(b.cmpi("ne", left, zero), ck, f.NULL)  # no set bit left: the shuffle read lane 0; NULL
        left = b.andi(left, b.subi(left, one))
        valid = b.cmpi("ne", ck, f.NULL)
        pe = peer(b.divui(ck, f.R))
        slot64 = _i64(f, b.remui(ck, f.R))
        row = mori_shmem.ptr(b.gep(p.reg_x, b.muli(slot64, rowc), b.i8), pe, **b.at())
        rows.append(b.select(valid, row, p.zero_row))
        wrow = mori_shmem.ptr(b.gep(p.reg_w, b.muli(slot64, kb), b.i8), pe, **b.at())
        wrows.append(b.select(valid, wrow, p.zero_row))
        valids.append(valid)
    mori_comm.accumulate_rows(part, _call_elements(f), rows, dtype=cfg.dtype, **b.at())
    with b.if_(b.andi(has_w, f.is_k)):
        cur = b.const_f32(0.0)
        for wrow in wrows:
            cur = b.addf(cur, b.load(b.f32, b.gep(wrow, f.lane, b.f32)))
        b.store(cur, b.gep(b.gep(part, cfg.row_bytes, b.i8), f.lane, b.f32))
    _count_gathered(f, b.andi(f.is_k, b.cmpi("ne", code, f.NULL)), has_w)


def _node_partials(f: KernelFrame, topo: Topology, has_w: ir.Value, first: ir.Value, count: ir.Value) -> None:
    """Each own token's rows on this node's PEs (the forward map: NULL for the other nodes) summed into
    ``i_part`` (rows [M, H], then weights [M, K])."""
    b, p, cfg = f.b, f.params, f.cfg
    rowc, kb = f.row, b.const_i64(4 * cfg.top_k)
    peer = _peer(f, topo)
    part_w = _part_weights(f)

    def source_row(s: ForwardEntry) -> tuple[ir.Value, ir.Value]:
        pe = peer(s.pe)
        row = mori_shmem.ptr(b.gep(p.reg_x, b.muli(s.slot64, rowc), b.i8), pe, **b.at())
        return row, mori_shmem.ptr(b.gep(p.reg_w, b.muli(s.slot64, kb), b.i8), pe, **b.at())

    part_row = b.const_i64(cfg.row_bytes)  # i_part's rows keep the config's stride
    reduce_tokens(f, part_row, source_row, out=p.part, out_w=b.select(has_w, part_w, f.null_ptr), warps=(first, count))
    with b.for_(first, b.index_cast(b.index, p.n), count) as t_x:  # the rows gathered from this node
        code = b.if_else(f.is_k, [b.i32], lambda: [b.load(b.i32, b.gep(p.fwd, b.addi(b.muli(
            b.index_cast(b.i32, t_x), f.K), f.lane), b.i32))], lambda: [f.NULL])[0]  # fmt: skip
        _count_gathered(f, b.cmpi("ne", code, f.NULL), has_w)


def _call_elements(f: KernelFrame) -> ir.Value:
    """Elements of the call's row (i64), for ``accumulate_rows``: a constant in the config-hidden variant."""
    if not f.cfg.any_hidden:
        return f.b.const_i64(f.cfg.hidden)
    return f.b.divui(f.row, f.b.const_i64(f.cfg.elem_bytes))


def _part_weights(f: KernelFrame) -> ir.Value:
    """The weights [M, K] f32 of ``i_part``, after its rows [M, H]."""
    b, cfg = f.b, f.cfg
    return b.gep(f.params.part, b.const_i64(cfg.max_tokens_per_rank * cfg.row_bytes), b.i8)


def combine_all_kernel(cfg: EpKernelConfig, block: ir.Block, before: ir.Operation | None = None) -> ir.Operation:
    """``ep_inter_combine_all_<dtype>``: per own token, the node partials summed in fp32 (one warp each)."""
    f = open_kernel(cfg, "inter_combine_all", generator="ep_internode_kernels.combine_all_kernel", block=block,
                    before=before)  # fmt: skip
    b, p = f.b, f.params
    s = cfg.sizes
    topo = _topology(f)
    # Every node peer has finished step 1 (its gathers from our registered rows) before any PE ends this
    # round's combine and copies the next round's rows over them.
    mori_comm.node_device_barrier(p.bar_slots, p.bar_epochs, world_size=cfg.world_size, group_size=topo.group,
                                  max_blocks=cfg.max_blocks, **b.at())  # fmt: skip
    one64 = b.const_i64(1)
    cround = b.load(b.i64, p.rounds)
    cpar = b.trunci(b.i32, b.andi(cround, one64))
    base = _round_base(f, cround)
    rowc = b.const_i64(cfg.row_bytes)  # the node partials' row stride (the config's)
    prec = b.const_i64(s.partial_bytes)
    part_w = _part_weights(f)
    want_w = f.present(p.out_w)
    is_remote = b.cmpi("ult", f.lane, b.const_i32(topo.remote))
    lane_hop = _remote_hop(f, topo, f.lane)
    with b.for_(f.gw, b.index_cast(b.index, p.n), f.nw) as t_x:
        t = b.index_cast(b.i32, t_x)
        t64 = _i64(f, t)
        # Lane j < remote: the slot of the token's record at remote hop j (-1: not sent there).
        slot = b.if_else(is_remote, [b.i32], lambda: [b.load(b.i32, b.gep(p.smap, b.addi(b.muli(t, topo.b_hops),
                         lane_hop), b.i32))], lambda: [b.const_i32(-1)])[0]  # fmt: skip
        sent = b.cmpi("sge", slot, f.c0i)
        region = _i64(f, b.addi(b.muli(cpar, topo.b_hops), lane_hop))
        with b.if_(sent):
            chunk = b.divui(slot, b.const_i32(cfg.wave_size))
            mori_comm.chunk_wait(b.gep(p.cflag, b.addi(b.muli(region, b.const_i64(s.max_chunks)), _i64(f, chunk)),
                                       b.i64), base, **b.at())  # fmt: skip
        mori_shmem.fence(**b.at())  # acquire for every lane (the waits' fences acquired for their own lanes)
        rows = [b.gep(p.part, b.muli(t64, rowc), b.i8)]
        wrows = [b.gep(part_w, b.muli(t64, b.const_i64(4 * cfg.top_k)), b.i8)]
        for j in range(topo.remote):
            jj = b.const_i32(j)
            sj = b.shuffle("idx", slot, jj, f.wave)[0]
            rj = b.shuffle("idx", b.trunci(b.i32, region), jj, f.wave)[0]
            ok = b.cmpi("sge", sj, f.c0i)
            at = b.addi(b.muli(_i64(f, rj), b.const_i64(s.chunk_rows)), _i64(f, b.select(ok, sj, f.c0i)))
            prow = b.gep(p.crecv, b.muli(at, prec), b.i8)
            rows.append(b.select(ok, prow, p.zero_row))
            wrows.append(b.select(ok, b.gep(prow, cfg.row_bytes, b.i8), p.zero_row))
        mori_comm.accumulate_rows(b.gep(p.out, b.muli(t64, f.row), b.i8), _call_elements(f), rows, dtype=cfg.dtype,
                                  **b.at())  # fmt: skip
        with b.if_(b.andi(want_w, f.is_k)):
            cur = b.const_f32(0.0)
            for wrow in wrows:
                cur = b.addf(cur, b.load(b.f32, b.gep(wrow, f.lane, b.f32)))
            b.store(cur, b.gep(p.out_w, b.addi(b.muli(t, f.K), f.lane), b.f32))
    _wait_every_chunk(f, topo, cpar, base)
    _advance_combine_round(f, cround)
    b.gpu_return()
    return f.func


def _wait_every_chunk(f: KernelFrame, topo: Topology, cpar: ir.Value, base: ir.Value) -> None:
    """Warp 0 of block 0 waits for every chunk signal of this round from every remote hop (each sends all
    of them, empty chunks too), even those no own token needs: the round cannot end before every target
    has sent its partials, so no PE gets more than one combine round ahead of another (two parities of
    ``i_crecv``/``i_cflag`` suffice even when combine runs several times per dispatch)."""
    b, p, s = f.b, f.params, f.cfg.sizes
    first = b.andi(b.cmpi("eq", f.bid_i, f.c0x), b.cmpi("eq", f.warp_in_block, f.c0x))
    with b.if_(first):
        with b.for_(f.lane_i, b.const_index(topo.remote * topo.chunks), f.wave_x) as it:
            j = b.index_cast(b.i32, b.divui(it, b.const_index(topo.chunks)))
            c = b.index_cast(b.i32, b.remui(it, b.const_index(topo.chunks)))
            region = _i64(f, b.addi(b.muli(cpar, topo.b_hops), _remote_hop(f, topo, j)))
            flag = b.gep(p.cflag, b.addi(b.muli(region, b.const_i64(s.max_chunks)), _i64(f, c)), b.i64)
            mori_comm.chunk_wait(flag, base, **b.at())


def _advance_combine_round(f: KernelFrame, cround: ir.Value) -> None:
    """The last block to finish advances ``rounds[0]`` (every block read it at its start) and resets the
    finished-block count ``rounds[1]``; the next combine's kernels see both (kernel boundary)."""
    b, p = f.b, f.params
    b.barrier()
    with b.if_(b.cmpi("eq", f.tid_i, f.c0x)):
        one64 = b.const_i64(1)
        finished = b.gep(p.rounds, 1, b.i64)
        old = b.atomicrmw("add", finished, one64, "acq_rel")
        with b.if_(b.cmpi("eq", old, b.subi(b.index_cast(b.i64, f.nb_i), one64))):
            b.store(b.const_i64(0), finished)
            b.store(b.addi(cround, one64), p.rounds)
