"""The ``mori_comm`` dialect: generic building blocks of GPU communication patterns.

Defined in ``mori_comm.irdl.mlir``. Each op is one reusable step of a communication pattern (an EP
dispatch/combine, an allreduce, an allgather): moving a row, reserving a slot on a peer, a count
handshake, a barrier, summing rows. ``mori-comm-to-calls`` (passes/comm_to_calls.py) lowers each op into
a call of a helper function, written there with mori_shmem, gpu, scf, arith and llvm ops and added to
the gpu.module once per variant:

================= ===================================================== ==================================
op                semantics                                             helper symbol
================= ===================================================== ==================================
row_copy          a warp copies a row to a peer                         ``__mori_comm_row_copy_vec16``,
                                                                        ``__mori_comm_row_copy``
row_copy_to_peers a warp copies one row to up to K peers, loading it    ``__mori_comm_row_copy_to_peers_k{K}``
                  once
copy_bytes        a warp copies bytes between two directly addressable  ``__mori_comm_copy_bytes``
                  addresses (local or a peer's), any alignment
reserve_slot      fetch-add of 1 on a peer's counter (one thread)       ``__mori_comm_reserve_slot``
count_signal      a warp exchanges counts with every PE, with flow      ``__mori_comm_count_signal_w{W}``
                  control
grid_barrier      all blocks of this PE's grid meet                     ``__mori_comm_grid_barrier``
grid_last_arrival every block arrives; true in the last one (in warp 0) ``__mori_comm_grid_last_arrival``
device_barrier    block b of every PE meets block b of every other PE   ``__mori_comm_device_barrier_w{W}``
one_gpu_barrier   device_barrier among PEs on this one GPU (fences at   ``__mori_comm_one_gpu_barrier_w{W}``
                  the GPU's scope)
barrier_arrive    device_barrier's first half: the epoch and the        ``__mori_comm_barrier_arrive_w{W}_{scope}``
                  release signal; returns the epoch
barrier_wait      its second half: the polls, the acquire, the block    ``__mori_comm_barrier_wait_w{W}_{scope}``
                  meeting
accumulate_rows   a warp sums K rows in fp32                            ``__mori_comm_accumulate_rows_{dtype}_k{K}``
quantize_row      a warp writes a bf16 row to a peer as a wire row      ``__mori_comm_quantize_row_{E}_s{S}``
                  (fp8 / fp4, blockwise scales)
accumulate_       a warp sums K wire rows in fp32 into a bf16 row       ``__mori_comm_accumulate_quantized_rows_``
quantized_rows                                                          ``{E}_s{S}_k{K}``
node_pe           the PE of this node with a given local rank (pure)    ``__mori_comm_node_pe_g{G}``
node_count_signal count_signal among the G PEs of this PE's node        ``__mori_comm_count_signal_w{W}_g{G}``
node_device_      device_barrier among the G PEs of this PE's node      ``__mori_comm_device_barrier_w{W}_g{G}``
barrier
chunk_send        a warp puts a chunk's selected records to a PE, then  ``__mori_comm_chunk_send``
                  one signal
chunk_wait        one thread waits for a chunk's signal, acquires, and  ``__mori_comm_chunk_wait``
                  returns its count
trace             a warp records the global timer (a trace point;      none: inline (mori-trace-to-timer),
                  compiled out unless tracing is on)                    erased when tracing is off
================= ===================================================== ==================================

The inter-node kernels (docs/ep-protocols.md §16) reach PEs of other nodes **only** through chunk_send
(puts and put-with-signal with a queue-pair argument: over RDMA with MORI's bitcode); every P2P op they
use (row copies, reservations, ``mori_shmem.p``/``ptr``) names its peer through node_pe, so the peer is on
this node by construction (test/python/test_ep_transport.py checks both).

Each builder below documents its op: semantics, the ordering contract (who writes, who waits, at which
scope, in which order) and the mori_shmem ABI functions its helper calls (the rules of those functions:
docs/device-abi.md). Common to all: the pointers are generic ``!llvm.ptr`` into global memory (kernel
buffers, the symmetric heap, peer addresses from ``mori_shmem.ptr``), never LDS or scratch; "warp" means
every lane of one wave (32 or 64, the lowering's ``wave-size``) calls the op with identical operands
(warp-uniform control flow), "thread" one lane alone, "block" every thread of the block.

The builders take the operands in order, then the attributes and ``loc``/``ip`` as keywords, like
mori_shmem's: ``mori_comm.row_copy(dest, source, nbytes, pe, **b.at())``.
"""

from __future__ import annotations

import re

from mori_compiler._mlir import ir
from mori_compiler.targets import MIN_WAVE_SIZE
from mori_compiler.wire_quant import MAX_COMBINE_SCALE_DIM

from .dialect_base import Dialect, OpRules
from .irdl_spec import int_attributes

# The lane-per-peer ops (count_signal, device_barrier, row_copy_to_peers) give each peer one lane of a
# wave, and the smallest wave of the targets (gfx12's and sm_90's 32 lanes) bounds the peers.
MAX_LANE_PEERS = MIN_WAVE_SIZE
COPY_ROUND_VECTORS = 8  # 16-byte vectors per lane and round of the row copies: all loaded before any store


def copy_round_bytes(wave: int) -> int:
    """Bytes one round of copy_bytes (and the row copies) moves: COPY_ROUND_VECTORS x wave x 16."""
    return COPY_ROUND_VECTORS * wave * 16


def _i64(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _create(name, operands, attributes=None, results=(), *, loc=None, ip=None) -> ir.Operation:
    return ir.Operation.create(f"{DIALECT_NAME}.{name}", results=list(results), operands=list(operands),
                               attributes=attributes or {}, loc=loc, ip=ip)  # fmt: skip


def row_copy(dest, source, nbytes, pe, *, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.row_copy(dest, source, bytes: i64, pe: i32)``: copy ``bytes`` bytes from the local
    ``source`` to the symmetric address ``dest`` on PE ``pe``.

    Who: a warp (every lane, identical operands), the lanes striding over the row. Order: none of its
    own; the stores are non-blocking (or plain stores to the peer's mapped memory), complete and visible
    to PE ``pe`` only after the caller's ``mori_shmem.fence`` (release, system scope), which must come
    before whatever signal tells ``pe`` the row is there.

    Helper: ``__mori_comm_row_copy_vec16`` when ``bytes`` is a multiple of 16 by construction (a constant
    one, or a value masked with ``arith.andi`` by a constant with its low four bits clear; the peer address
    once with ``mori_shmem_ptr``, then rounds of 8 lane-strided 16-byte vector loads in flight before
    their plain stores), else ``__mori_comm_row_copy`` (``mori_shmem_putmem_nbi_warp``).
    """
    return _create("row_copy", [dest, source, nbytes, pe], loc=loc, ip=ip)


def row_copy_to_peers(dest, source, nbytes, pe, send, *, max_peers: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.row_copy_to_peers(dest, source, bytes: i64, pe: i32, send: i1) {max_peers = K}``: copy
    one local row to up to K destinations. Lane k < K names destination k: row ``dest`` (a symmetric
    address) on PE ``pe``, copied when its ``send`` is set; the operands of lanes >= K are ignored.

    Who: a warp (every lane calls it; ``bytes`` and ``source`` identical in all lanes). ``bytes`` must be
    a multiple of 16 by construction (a constant one, or masked with ``arith.andi`` by a constant with its
    low four bits clear: the lowering refuses anything else); K in [1, 32]. Each 16-byte vector of
    the row is loaded once and stored to every sending destination: the row is read once, not K times.
    Order: plain stores, published like row_copy's by the caller's release fence.

    Helper: ``__mori_comm_row_copy_to_peers_k{K}`` (``mori_shmem_my_pe``, one ``mori_shmem_ptr`` per lane,
    the addresses and flags broadcast from lane k; a lane that does not send resolves its own PE).
    """
    return _create("row_copy_to_peers", [dest, source, nbytes, pe, send], {"max_peers": _i64(max_peers)}, loc=loc, ip=ip)


def copy_bytes(dest, source, nbytes, *, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.copy_bytes(dest, source, bytes: i64)``: copy ``bytes`` bytes from ``source`` to ``dest``,
    two addresses this PE loads and stores directly: its own memory, or a peer's through ``mori_shmem.ptr``
    (a pull: ``source`` on a peer; or a push: ``dest`` on a peer). Any alignment and any size: the pull
    of a collective into a user's tensor at an odd offset.

    Who: a warp (every lane, identical operands), the lanes striding over the bytes. Order: none of its
    own: plain loads and stores. The caller acquires the source first (e.g. a device_barrier after the
    peer wrote it) and publishes the destination itself (a release fence or barrier before its signal).

    Helper: ``__mori_comm_copy_bytes`` (no ABI call): when both addresses are 16-byte aligned, the
    16-byte-vector rounds of row_copy_vec16 for the whole vectors (``COPY_ROUND_VECTORS`` per lane and
    round: ``copy_round_bytes(wave)`` bytes a round; a remainder smaller than a round takes a slower
    path, each vector's store guarded), then one byte per lane for the rest; otherwise bytes only.
    """
    return _create("copy_bytes", [dest, source, nbytes], loc=loc, ip=ip)


def reserve_slot(counter, pe, *, loc=None, ip=None) -> ir.Value:
    """``mori_comm.reserve_slot(counter, pe: i32) -> i32``: the old value of PE ``pe``'s 32-bit counter at
    the symmetric ``counter``, after adding 1 to it: a slot unique among every caller of this round.

    Who: one thread per reservation. Order: relaxed at system scope (the slot is unique, nothing else is
    published); the data written into the slot is ordered later, by the pattern's handshake (e.g.
    count_signal's release and acquire fences). The counter is reset by its owner between rounds.

    Helper: ``__mori_comm_reserve_slot`` (``mori_shmem_uint32_atomic_fetch_add_thread``).
    """
    return _create("reserve_slot", [counter, pe], results=[ir.IntegerType.get_signless(32)], loc=loc, ip=ip).result


def count_signal(signals, counts, total, *, world_size: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.count_signal(signals, counts, total) {world_size = W}``: tell every PE p how many items
    this PE sent it (``counts[p]``, local i32), learn how many each sent us, and store the sum to the
    local i32 ``*total``. ``signals`` is a symmetric array of W u64 words, zero at allocation.

    Who: one warp; lane p < W talks to PE p (W in [1, 32], at most the wave size). Protocol, per lane p:
    wait (relaxed system-scope polls) until PE p's ``signals[me]`` is 0, i.e. PE p consumed our previous
    round (flow control); fence (release: every store this PE made visible to the warp before the
    call, e.g. the payload rows behind a grid_barrier, is ordered before the signal); store ``count + 1``
    into PE p's ``signals[me]`` (relaxed, system scope: 0 means "nothing yet"); reset ``counts[p]`` to 0.
    Then poll our ``signals[p]`` until it is > 0; fence (acquire: PE p's payload is visible); reset
    it to 0 (PE p polls it next round). The warp sums the received counts; lane 0 stores the total.
    The fences are LLVM's system-scope release and acquire fences (sm_90 ``fence.acq_rel.sys``), not the
    ABI's ``mori_shmem_fence`` (``fence.sc.sys``): the peers are reached by loads and stores (P2P), so
    there is no transport operation to order. Not for peers behind a network transport.

    Helper: ``__mori_comm_count_signal_w{W}`` (``mori_shmem_my_pe``, ``mori_shmem_ptr``,
    ``mori_shmem_uint64_wait_until_equals``, ``mori_shmem_uint64_wait_until_greater_than``,
    ``mori_shmem_uint64_p``).
    """
    return _create("count_signal", [signals, counts, total], {"world_size": _i64(world_size)}, loc=loc, ip=ip)


def grid_barrier(counter, *, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.grid_barrier(counter)``: every block of this PE's grid continues once all have
    arrived. ``counter`` points at two u64 words {arrivals, generation} of this PE, zero once at
    allocation (never reset by the host: graph-replay safe, any grid size per launch).

    Who: every thread of every block (the block meets with gpu.barrier before and after); all blocks
    must be co-resident. Order (thread 0 of each block): read the generation g; ``fence`` (release: the
    block's earlier stores); add 1 to the arrivals (relaxed, system scope). The last block resets the
    arrivals to 0, fences, and publishes g + 1; the others poll the generation until it passes g. Then
    ``fence`` (acquire): every block's stores before the barrier are visible to every block after it.

    Helper: ``__mori_comm_grid_barrier`` (``mori_shmem_fence_thread``,
    ``mori_shmem_uint64_wait_until_greater_than``; the arrival and the publication are
    ``mori_shmem_uint64_atomic_fetch_add_thread`` / ``mori_shmem_uint64_p`` on this PE (``mori_shmem_my_pe``),
    or, with the lowering's ``global-address-space``, the relaxed system-scope LLVM atomics those are made
    of).
    """
    return _create("grid_barrier", [counter], loc=loc, ip=ip)


def device_barrier(slots, epochs, *, world_size: int, max_blocks: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.device_barrier(slots, epochs) {world_size = W, max_blocks = B}``: block b of this PE
    meets block b of every PE. ``slots`` is a symmetric ``[B][W]`` array of u64 words and ``epochs`` a
    local ``[B]`` array of u64 words (this PE's epoch per block), all zero once at allocation; the grid
    must have at most B blocks (a host check at launch). B is that size contract: the helper itself does
    not read it.

    Who: every thread of the block (the block meets with gpu.barrier before and after). Order: each
    thread reads e0 = epochs[b]; thread 0 stores e = e0 + 1 back. Threads p < W: fence (release:
    everything this PE's block wrote before the barrier), store e into ``slots[b][me]`` on PE p (relaxed,
    system scope), poll our ``slots[b][p]`` until it is >= e, fence (acquire). Epochs only grow and
    live on the device: graph replay is correct and nothing is reset. The fences are LLVM's system-scope
    release / acquire fences, as count_signal's (P2P peers; not for peers behind a network transport).

    Helper: ``__mori_comm_device_barrier_w{W}`` (``mori_shmem_my_pe``, ``mori_shmem_uint64_p``,
    ``mori_shmem_uint64_wait_until_greater_than``).
    """
    attrs = {"world_size": _i64(world_size), "max_blocks": _i64(max_blocks)}
    return _create("device_barrier", [slots, epochs], attrs, loc=loc, ip=ip)


def one_gpu_barrier(slots, epochs, *, world_size: int, max_blocks: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.one_gpu_barrier(slots, epochs) {world_size = W, max_blocks = B}``: device_barrier among
    PEs that all run on this one GPU (virtual PEs: every PE a block range of one launch). The same
    operands, contract and order as ``device_barrier``, with its release and acquire fences at the GPU's
    scope (sm_90 ``fence.acq_rel.gpu``, AMDGPU agent scope: all of an MI300's XCDs) instead of the
    system's: no peer is another device, so nothing needs to reach system scope. Wrong (the peers may miss
    this PE's stores) when a peer is another GPU or the host.

    Helper: ``__mori_comm_one_gpu_barrier_w{W}`` (``mori_shmem_my_pe``, ``mori_shmem_uint64_p``,
    ``mori_shmem_uint64_wait_until_greater_than``); needs the lowering's ``chip`` (the scope's name).
    """
    attrs = {"world_size": _i64(world_size), "max_blocks": _i64(max_blocks)}
    return _create("one_gpu_barrier", [slots, epochs], attrs, loc=loc, ip=ip)


def barrier_arrive(slots, epochs, *, world_size: int, max_blocks: int, scope: str, loc=None, ip=None) -> ir.Value:
    """``mori_comm.barrier_arrive(slots, epochs) {world_size, max_blocks, scope} -> i64``: the first half of
    a device barrier (``device_barrier``'s operands and contract; ``scope`` "system": its fences, "gpu":
    ``one_gpu_barrier``'s). Returns the block's epoch e, which ``barrier_wait`` takes; the block may work
    in between on what no peer reads or writes until the wait (its own part of a result, say).

    Who: every thread of the block. Order: each thread reads e0 = epochs[b], the block meets, thread 0
    stores e = e0 + 1; threads p < W fence (release: everything the block wrote before the arrive) and
    store e into ``slots[b][me]`` on PE p (relaxed, system scope). A peer that sees e has every store this
    block made before the arrive; stores made after it (before the wait) are not published by it.

    Helper: ``__mori_comm_barrier_arrive_w{W}_{scope}`` (``mori_shmem_my_pe``, ``mori_shmem_uint64_p``); "gpu"
    needs the lowering's ``chip``.
    """
    attrs = {"world_size": _i64(world_size), "max_blocks": _i64(max_blocks), "scope": ir.StringAttr.get(scope)}
    return _create("barrier_arrive", [slots, epochs], attrs, [ir.IntegerType.get_signless(64)], loc=loc, ip=ip).result


def barrier_wait(slots, epoch, *, world_size: int, scope: str, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.barrier_wait(slots, epoch: i64) {world_size, scope}``: the second half of the device
    barrier ``barrier_arrive`` began (``epoch`` is what it returned, in the same block; one wait per
    arrive, in order, before the next arrive on the same slots).

    Who: every thread of the block. Order: threads p < W poll our ``slots[b][p]`` until it is >= epoch
    (relaxed, system scope), fence (acquire); the block meets. After it, every peer's block b stores made
    before its arrive are visible to the block, and no peer's block b is still before its arrive.

    Helper: ``__mori_comm_barrier_wait_w{W}_{scope}`` (``mori_shmem_uint64_wait_until_greater_than``); "gpu"
    needs the lowering's ``chip``.
    """
    attrs = {"world_size": _i64(world_size), "scope": ir.StringAttr.get(scope)}
    return _create("barrier_wait", [slots, epoch], attrs, loc=loc, ip=ip)


def accumulate_rows(out, elems, sources, *, dtype: str, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.accumulate_rows(out, elems: i64, sources...) {dtype}``: ``out[0:elems] =
    cast(sum_k float(sources[k][0:elems]))``, summed in fp32, rounded once; ``dtype`` is bf16 or f32.

    Who: a warp, lane-strided 16-byte vectors (``elems`` a multiple of 8 for bf16, of 4 for f32: whole
    vectors); for each vector all K source loads are in flight before the adds. Order: none of its own:
    the caller has acquired the sources (e.g. after a device_barrier) and publishes ``out`` itself.

    Helper: ``__mori_comm_accumulate_rows_{dtype}_k{K}`` (no ABI call).
    """
    return _create("accumulate_rows", [out, elems, *sources], {"dtype": ir.StringAttr.get(dtype)}, loc=loc, ip=ip)


WIRE_FORMATS = ("fp8_e4m3fn", "fp8_e4m3fnuz", "fp4_e2m1", "fp8_e4m3")  # fp8_e4m3: the target's variant
MAX_SCALE_BLOCKS = MAX_COMBINE_SCALE_DIM  # the quantizing lanes keep their blocks' maxima in registers


def quantize_row(dest, source, elems, pe, *, format: str, scale_blocks: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.quantize_row(dest, source, elems: i64, pe: i32) {format, scale_blocks = S}``: write the
    local bf16 row ``source[0:elems]`` as a wire row at the symmetric ``dest`` on PE ``pe``.

    Wire row (``ep_schema.wire_*``, the model: ops/quant_reference.py): the payload, one ``format`` code
    per element (``fp8_e4m3fn``/``fp8_e4m3fnuz``: a byte each, ``fp8_e4m3`` the target's variant of the two,
    as the target-neutral EP kernels write it; ``fp4_e2m1``: element 2j in the low nibble of byte j); with
    S >= 1 (blockwise) S f32 scales follow at the payload's 16-byte aligned end. Blocks
    are ``ceil(elems / S)`` elements; a block whose amax (NaN ignored) exceeds the format's max (448 OCP,
    240 FNUZ, 6 fp4) is multiplied by ``max / amax`` before the cast and stores ``amax / max``, others
    store 1.0; block 0's scale is stored negated when any block was scaled (the reader's flag). fp8 casts
    saturate like HIP's: finite values clamp to ±max then round to nearest even, ±inf become NaN (the fp8
    conversion instruction of the target: sm_90 ``cvt.rn.satfinite.e4m3x2.f32``, AMDGPU
    ``v_cvt_pk_fp8_f32``). fp4 rounds to nearest even and saturates at ±6 (gfx950
    ``v_cvt_scalef32_pk_fp4_f32`` at scale 1, sm_90 integer arithmetic); NaN has no fp4 code (the model
    refuses it; the software path writes a signed zero). S = 0: a direct cast (fp8 only).

    Who: a warp (identical operands); ``elems`` a multiple of 8 (16-byte bf16 vectors). Order: plain
    stores to the peer's mapped memory, published like row_copy's by the caller's release fence.

    Helper: ``__mori_comm_quantize_row_{E}_s{S}`` (E: the element type, e4m3fn, e4m3fnuz or e2m1;
    ``mori_shmem_ptr``); the lowering's ``chip`` option
    picks the conversion instructions and must run the format (gfx942: FNUZ; gfx950, gfx1250, sm_90:
    OCP; fp4: gfx950 and sm_90).
    """
    attrs = {"format": ir.StringAttr.get(format), "scale_blocks": _i64(scale_blocks)}
    return _create("quantize_row", [dest, source, elems, pe], attrs, loc=loc, ip=ip)


def accumulate_quantized_rows(out, first, count, elems, sources, *, format: str, scale_blocks: int, loc=None,
                              ip=None) -> ir.Operation:  # fmt: skip
    """``mori_comm.accumulate_quantized_rows(out, first: i64, count: i64, elems: i64, sources...) {format,
    scale_blocks = S}``: ``out[first:first+count] = bf16(sum_k dequant(sources[k])[first:first+count])``.

    ``sources`` are wire rows of ``elems`` elements (quantize_row's layout, the same format and S);
    ``out`` is the bf16 output row (elements from 0); ``first`` and ``count`` are multiples of 8 (a slice
    of whole 16-byte output vectors). A source's scales apply (``|scale[block]|`` times the decoded
    value) only when its stored scale[0] is negative, else it decodes as a plain cast. Summed in fp32 in
    source order, rounded once to bf16.

    Who: a warp, lane-strided 8-element units. Order: none of its own: the caller has acquired the
    sources (e.g. after a device_barrier). A row of zeros is a valid source of zeros (scale[0] = 0).

    Helper: ``__mori_comm_accumulate_quantized_rows_{E}_s{S}_k{K}`` (no ABI call).
    """
    attrs = {"format": ir.StringAttr.get(format), "scale_blocks": _i64(scale_blocks)}
    return _create("accumulate_quantized_rows", [out, first, count, elems, *sources], attrs, loc=loc, ip=ip)


def node_pe(pe, *, group_size: int, loc=None, ip=None) -> ir.Value:
    """``mori_comm.node_pe(pe: i32) {group_size = G} -> i32``: ``(me / G) * G + pe % G``, the PE of this PE's
    node (G consecutive PEs) with the local rank of ``pe``; ``pe`` itself when it is on this node.

    Who: any thread; pure (no memory access). Why an op: the inter-node kernels name every same-node
    (P2P) peer through it, which makes "P2P only within the node" a property of the IR that a test checks.

    Helper: ``__mori_comm_node_pe_g{G}`` (``mori_shmem_my_pe``).
    """
    return _create("node_pe", [pe], {"group_size": _i64(group_size)}, results=[ir.IntegerType.get_signless(32)],
                   loc=loc, ip=ip).result  # fmt: skip


def node_count_signal(signals, counts, total, *, world_size: int, group_size: int, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.node_count_signal(signals, counts, total) {world_size = W, group_size = G}``: count_signal
    (same protocol, same buffers indexed by PE) among the G PEs of this PE's node only: lane p < G talks
    to PE ``(me / G) * G + p``; counts for PEs of other nodes are neither sent nor reset.

    Helper: ``__mori_comm_count_signal_w{W}_g{G}`` (count_signal's ABI calls).
    """
    attrs = {"world_size": _i64(world_size), "group_size": _i64(group_size)}
    return _create("node_count_signal", [signals, counts, total], attrs, loc=loc, ip=ip)


def node_device_barrier(slots, epochs, *, world_size: int, group_size: int, max_blocks: int, loc=None,
                        ip=None) -> ir.Operation:  # fmt: skip
    """``mori_comm.node_device_barrier(slots, epochs) {world_size = W, group_size = G, max_blocks = B}``:
    device_barrier (same protocol and buffers) among the G PEs of this PE's node: thread p < G talks to
    PE ``(me / G) * G + p``.

    Helper: ``__mori_comm_device_barrier_w{W}_g{G}`` (device_barrier's ABI calls).
    """
    attrs = {"world_size": _i64(world_size), "group_size": _i64(group_size), "max_blocks": _i64(max_blocks)}
    return _create("node_device_barrier", [slots, epochs], attrs, loc=loc, ip=ip)


def chunk_send(dest, source, record_bytes, mask, signal, signal_base, pe, qp, *, loc=None, ip=None) -> ir.Value:
    """``mori_comm.chunk_send(dest, source, record_bytes: i64, mask: i64, signal, signal_base: i64, pe: i32,
    qp: i32) -> i64``: send the selected records of one chunk to PE ``pe`` and signal it once.

    Record j of the chunk is ``source + j * record_bytes`` (local, in the symmetric heap: an RDMA source
    must be); it is sent when bit j of ``mask`` is set, to ``dest + rank_j * record_bytes`` on ``pe`` where
    rank_j is the number of set bits below j (the selected records packed in order). Result: the bytes
    put (popcount(mask) * record_bytes).

    Who: a warp (every lane, identical operands). Protocol: one ``putmem_nbi`` (warp scope, queue pair
    ``qp``) per run of consecutive set bits, then one ``putmem_nbi_signal`` (warp scope, 0 bytes, SET,
    the same ``pe`` and ``qp``) of ``signal_base + popcount(mask)`` into the u64 ``signal`` on ``pe``: over
    one queue pair the signal is ordered after the data (RDMA), and over P2P every lane fences (release,
    system scope) before lane 0 stores it. The signal is sent also when ``mask`` is 0 (count 0: the
    receiver learns the chunk is empty). ``signal_base`` carries the round (``(round + 1) << 32``), so
    signals are never reset: a reader of round r waits for a value >= its base.

    Helper: ``__mori_comm_chunk_send`` (``mori_shmem_putmem_nbi_warp``, ``mori_shmem_putmem_nbi_signal_warp``).
    """
    operands = [dest, source, record_bytes, mask, signal, signal_base, pe, qp]
    return _create("chunk_send", operands, results=[ir.IntegerType.get_signless(64)], loc=loc, ip=ip).result


def chunk_wait(signal, signal_base, *, loc=None, ip=None) -> ir.Value:
    """``mori_comm.chunk_wait(signal, signal_base: i64) -> i32``: the receiving side of chunk_send: poll
    the local u64 ``signal`` (relaxed, system scope) until it is >= ``signal_base``, ``fence`` (acquire:
    the chunk's records are visible), and return its low 32 bits (the record count).

    Who: one thread (its fence orders its own later loads; it publishes the count to others itself).

    Helper: ``__mori_comm_chunk_wait`` (``mori_shmem_uint64_wait_until_greater_than``, ``mori_shmem_fence_thread``).
    """
    return _create("chunk_wait", [signal, signal_base], results=[ir.IntegerType.get_signless(32)], loc=loc,
                   ip=ip).result  # fmt: skip


TRACE_PHASES = ("begin", "end", "instant")
TRACE_EVENT_PATTERN = r"[A-Za-z0-9_.]+"


def trace(event: str, phase: str, *, loc=None, ip=None) -> ir.Operation:
    """``mori_comm.trace {event, phase}``: a trace point. ``phase`` is ``begin``, ``end`` or ``instant``;
    ``event`` names it (``[A-Za-z0-9_.]+``); the pair (event, phase) is one slot of the kernel's trace.

    Who: a warp, or the lanes of it that reach the point (they store to the same slot: no branch on the lane,
    so a trace point never splits a warp). What: with tracing on (the compile option ``trace``), the lanes
    store the GPU's global timer (``llvm.readsteadycounter``: sm_90 ``%globaltimer``, ns; AMDGPU
    ``s_memrealtime`` / gfx12 ``s_sendmsg_rtn_b64 REALTIME``, ticks) into their warp's slot of the kernel's
    trace buffer, whose address and slot count the runtime writes into the module global
    ``__mori_trace_<kernel>`` (address 0: nothing is recorded; a slot past the count is not written); the last
    execution of a slot wins. With tracing off the op is erased: no code. Order: none. Each lane reads the
    timer when it gets there: stores issued before it may still be in flight (a phase ends where its fence
    or barrier does). Layout: docs/tracing.md.

    Helper: none (``mori-trace-to-timer`` lowers it inline: a timer read, two global loads, one store).
    """
    attrs = {"event": ir.StringAttr.get(event), "phase": ir.StringAttr.get(phase)}
    return _create("trace", [], attrs, loc=loc, ip=ip)


def grid_last_arrival(counter, *, loc=None, ip=None) -> ir.Value:
    """``mori_comm.grid_last_arrival(counter) -> i1``: every block of this PE's grid arrives once; the
    result is true in warp 0 of the block that arrived last (false in its other warps and in every other
    block). ``counter`` is this PE's u64 arrival count (0 before the launch; the last block leaves it 0).

    Who: every thread of every block (block-uniform call). Protocol: the block meets (``gpu.barrier``);
    thread 0 fences (release, system scope: the block's stores, ordered before by the block barrier) and
    adds 1 to the count (relaxed, system scope); the block whose add returns blocks - 1 is the last: its
    thread 0 resets the count (relaxed store: nobody touches it until the next launch on the stream) and
    fences (acquire, system scope: every block's stores before its arrival are visible to it); the block
    meets again, so the acquire covers all its threads. The others do not wait for one another: a block
    that is not last may exit. Use: a completion that only the last block performs (the EP dispatch's
    count handshake), where a grid barrier would make every block wait for it. The fences are LLVM's
    release / acquire fences (as count_signal's), not the ABI's full fence.

    Helper: ``__mori_comm_grid_last_arrival`` (``mori_shmem_my_pe``, ``mori_shmem_uint64_atomic_fetch_add_thread``,
    ``mori_shmem_uint64_p``; with ``global-address-space`` no ABI call: the add and the reset are LLVM's
    relaxed system-scope atomics on the global-space word, as grid_barrier's).
    """
    return _create("grid_last_arrival", [counter], results=[ir.IntegerType.get_signless(1)], loc=loc, ip=ip).result


def extra_verify(op: ir.Operation) -> list[str]:
    """The ranges IRDL cannot state: integer attributes and their bounds, at least one source row."""
    op = op.operation
    name = op.name
    short = name.split(".", 1)[1]
    ints = int_attributes(op)
    rules = OpRules(op)
    if rules.non_integer(op, ints, ("dtype", "format", "event", "phase", "scope")):
        return rules.errors
    need = rules.need

    if "world_size" in ints:
        need(1 <= ints["world_size"] <= MAX_LANE_PEERS, f"attribute 'world_size' must be in [1, {MAX_LANE_PEERS}], "
             f"got {ints['world_size']}")  # fmt: skip
    if "max_blocks" in ints:
        need(ints["max_blocks"] >= 1, f"attribute 'max_blocks' must be >= 1, got {ints['max_blocks']}")
    if short == "row_copy_to_peers" and "max_peers" in ints:
        need(1 <= ints["max_peers"] <= MAX_LANE_PEERS, f"attribute 'max_peers' must be in [1, {MAX_LANE_PEERS}] "
             f"(one lane per destination), got {ints['max_peers']}")  # fmt: skip
    if short == "trace" and "event" in op.attributes:
        event = op.attributes["event"]
        need(isinstance(event, ir.StringAttr) and re.fullmatch(TRACE_EVENT_PATTERN, event.value) is not None,
             f"attribute 'event' must match {TRACE_EVENT_PATTERN}, got {event}")  # fmt: skip
    if short == "accumulate_rows":
        need(len(op.operands) >= 3, "needs at least one source row")
    if short == "accumulate_quantized_rows":
        need(len(op.operands) >= 5, "needs at least one source row")
    if "scale_blocks" in ints:
        sb = ints["scale_blocks"]
        need(0 <= sb <= MAX_SCALE_BLOCKS, f"attribute 'scale_blocks' must be in [0, {MAX_SCALE_BLOCKS}], got {sb}")
        fmt = op.attributes["format"].value if "format" in op.attributes else None
        need(not (fmt == "fp4_e2m1" and sb == 0), "attribute 'scale_blocks' must be >= 1 for format 'fp4_e2m1' "
             "(fp4 is blockwise only: there is no fp4 direct cast)")  # fmt: skip
    if "group_size" in ints:
        g = ints["group_size"]
        need(1 <= g <= MAX_LANE_PEERS and not g & (g - 1), f"attribute 'group_size' must be a power of two in "
             f"[1, {MAX_LANE_PEERS}], got {g}")  # fmt: skip
        if "world_size" in ints and 1 <= g:
            need(ints["world_size"] % g == 0, f"attribute 'group_size' ({g}) must divide 'world_size' "
                 f"({ints['world_size']}): whole nodes")  # fmt: skip
    return rules.errors


DIALECT = Dialect("mori_comm", "mori_comm.irdl.mlir", extra_verify)
DIALECT_NAME = DIALECT.name
