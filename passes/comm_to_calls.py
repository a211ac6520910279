"""``mori-comm-to-calls``: lower the mori_comm building blocks to calls of helper functions.

Each op has one lowering (``LOWERINGS``: op → the helper it calls, by its variant); the helpers are built
here with the typed builder (dialects/builder.py) and mori_shmem's builders, added to the gpu.module once
per variant (passes/helper_functions.py) and inlined after the link step. Options: see MoriCommToCalls.

Each helper's memory-ordering protocol is written next to it below (the ops' contracts:
dialects/mori_comm.py) and pinned by lit tests (test/lit/Conversion/mori-comm-to-calls*.mlir) and by the
ISA/PTX tests of the EP kernels.

Address spaces: the row copies and accumulate_rows take pointers into global memory (kernel buffer
arguments, symmetric-heap rows and the peer addresses mori_shmem.ptr returns; never LDS or scratch).
With ``global-address-space`` they cast them to ``!llvm.ptr<1>`` before their loads and stores; the device
ABI keeps its generic signatures (the casts are in the helpers, not the ABI lowering). The ordering is the
same in both forms: the copies' stores are plain and are published by the caller's release fence
(``mori_shmem.fence``), which orders every earlier store of the thread whatever its address space (on
AMDGPU global and flat stores both retire through vmcnt, which the fence's wait covers), and a reader's
acquire fence likewise invalidates the caches that global loads read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from mori_compiler import targets, wire_quant
from mori_compiler._mlir import ir, nested_ops
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import Builder, generated_location, new_function
from mori_compiler.errors import MoriCompilerError

from . import comm_quant
from .helper_functions import Helper, replace_by_helper_calls

PREFIX = "__mori_comm_"
_UNROLL = mori_comm.COPY_ROUND_VECTORS


def _function(symbol: str, params: str, results: str = "") -> Callable[[Callable[..., None]], Helper]:
    """Decorator: the Helper ``func.func @symbol(params) -> results`` whose body the decorated
    ``body(b, *arguments)`` builds with Builder ``b``; ``params``/``results`` name Builder types
    ("ptr ptr i64 i32"). The helper's ops are located at their generator."""

    def wrap(body: Callable[..., None]) -> Helper:
        def build(block: ir.Block, before: ir.Operation) -> ir.Operation:
            loc = generated_location(f"mori-comm-to-calls: {symbol}")
            with loc:  # (the entry block's arguments take the ambient location)
                types = Builder(block, loc=loc)
                fn, entry = new_function(block, symbol, [getattr(types, t) for t in params.split()],
                                         [getattr(types, t) for t in results.split()], before=before, loc=loc)  # fmt: skip
                body(Builder(entry, loc=loc), *entry.arguments)
            return fn

        return Helper(symbol, build)

    return wrap


def _global(b: Builder, value: ir.Value, global_space: bool) -> ir.Value:
    """``value`` addressed as global memory (``!llvm.ptr<1>``) when ``global_space``, else itself."""
    return b.addrspacecast(b.ptr_global, value) if global_space else value


# ---- row copies ---------------------------------------------------------------------------------------


def row_copy(symbol: str) -> Helper:
    # A warp-scope put: all lanes cooperate, 16-byte vectors when dest/source alignment allows.
    @_function(symbol, "ptr ptr i64 i32")
    def helper(b, dst, src, nbytes, pe):
        qp = b.const_i32(0)
        mori_shmem.putmem_nbi(dst, src, nbytes, pe, scope="warp", qp=qp, **b.at())
        b.return_()

    return helper


def _lane_address(b: Builder, lo: ir.Value, hi: ir.Value, lane: ir.Value, c32: ir.Value, ptr_type) -> ir.Value:
    """The pointer that lane ``lane`` holds as 32-bit halves ``lo``/``hi``, broadcast to the warp."""
    lo_lane, hi_lane = b.broadcast_lane(lo, lane), b.broadcast_lane(hi, lane)
    lo64, hi64 = b.extui(b.i64, lo_lane), b.extui(b.i64, hi_lane)
    return b.inttoptr(ptr_type, b.ori(b.shli(hi64, c32), lo64))


@dataclass(frozen=True)
class _DestinationLoop:
    """The K destinations of row_copy_to_peers as code that does not grow with K (lane k of lo/hi/send
    names destination k; flags and addresses are broadcast from lane k with ``gpu.subgroup_broadcast``,
    on AMDGPU a v_readlane, so addresses land in SGPRs): the first sending destination (``kfirst``, found
    once per row) is stored to directly, then one loop over the destinations after it. Storing the first
    one outside the loop lets each store wait only for its own load (AMDGPU: rolling vmcnt(N)); a loop
    that used the round's loads first would make the backend wait for all of them, and for every store
    before them, ahead of the loop (a vmcnt(0) drain per round)."""

    max_peers: int
    ptr_type: ir.Type
    lo: ir.Value
    hi: ir.Value
    send: ir.Value  # i32: lane k's send flag
    c0i: ir.Value
    c32: ir.Value
    kfirst: ir.Value  # the first sending destination, K when none sends
    first: ir.Value  # its address
    c1i: ir.Value

    @classmethod
    def begin(cls, b: Builder, max_peers: int, ptr_type, lo, hi, send, c0i, c32) -> tuple["_DestinationLoop", ir.Value]:
        """Find the first sending destination (once per row); returns the loop and whether any sends."""
        kfirst = b.const_i32(max_peers)
        for k in reversed(range(max_peers)):  # the lowest sending k wins
            fk = b.const_i32(k)
            on = b.cmpi("ne", b.broadcast_lane(send, fk), c0i)
            kfirst = b.select(on, fk, kfirst)
        any_sends = b.cmpi("ult", kfirst, b.const_i32(max_peers))
        first = _lane_address(b, lo, hi, b.select(any_sends, kfirst, c0i), c32, ptr_type)
        return cls(max_peers, ptr_type, lo, hi, send, c0i, c32, kfirst, first, b.const_i32(1)), any_sends

    def each(self, b: Builder, store: Callable[[ir.Value], None]) -> None:
        """``store(destination)`` for the first sending destination, then in a loop for every later one
        that sends."""
        store(self.first)
        k1 = b.index_cast(b.index, b.addi(self.kfirst, self.c1i))
        with b.for_(k1, b.const_index(self.max_peers), b.const_index(1)) as k:
            k32 = b.index_cast(b.i32, k)
            on = b.cmpi("ne", b.broadcast_lane(self.send, k32), self.c0i)
            with b.if_(on):
                store(_lane_address(b, self.lo, self.hi, k32, self.c32, self.ptr_type))


def _vector_rounds(b: Builder, wave: int, nbytes: ir.Value, src: ir.Value, targets) -> None:
    """The copy loop of the 16-byte-vector row copies: rounds of 8 lane-strided vectors of ``src``
    (``nbytes`` long), all 8 loads before the stores, each round stored to every destination of
    ``targets``. The tail (fewer than 8 vectors left for the lane) is one more round of 8 loads, all in
    flight together: a unit past the end loads vector 0 (always in the row) and does not store. A
    one-vector remainder loop would wait for each load in turn, since its stores may alias the next load
    (up to 7 round trips per row: on H200 the fixed cost of a 7 KB fp8 row at 128 tokens).

    ``targets``: a list of (guard: an i1 value or None, destination pointer), each stored in turn
    (unrolled), or a ``_DestinationLoop`` (one loop over the destinations: compact code). ``src`` and the
    destinations are in the same address space."""
    vec = b.vector(4, b.i32)

    def store_all(store: Callable[[ir.Value], None]) -> None:
        if isinstance(targets, _DestinationLoop):
            targets.each(b, store)
            return
        for guard, dst in targets:
            if guard is None:
                store(dst)
            else:
                with b.if_(guard):
                    store(dst)

    lane = b.index_cast(b.i64, b.lane_id())
    sixteen = b.const_i64(16)
    zero = b.const_i64(0)
    nvec = b.divui(nbytes, sixteen)
    offs = [b.const_i64(u * wave) for u in range(_UNROLL)]
    step = b.const_i64(_UNROLL * wave)

    def more(j):
        return b.cmpi("ult", b.addi(j, offs[-1]), nvec), [j]

    def round_(j):
        idx, vals = [], []
        for off in offs:
            i = b.addi(j, off)
            idx.append(i)
            vals.append(b.load(vec, b.gep(src, i, vec), alignment=16))

        def store(dst):
            for i, v in zip(idx, vals):
                b.store(v, b.gep(dst, i, vec), alignment=16)

        store_all(store)
        return [b.addi(j, step)]

    (j8,) = b.while_([lane], more, round_)
    with b.if_(b.cmpi("ult", j8, nvec)):
        idx, inside, vals = [], [], []
        for off in offs:
            i = b.addi(j8, off)
            ok = b.cmpi("ult", i, nvec)
            vals.append(b.load(vec, b.gep(src, b.select(ok, i, zero), vec), alignment=16))
            idx.append(i)
            inside.append(ok)

        def store_tail(dst):
            for i, ok, v in zip(idx, inside, vals):
                with b.if_(ok):
                    b.store(v, b.gep(dst, i, vec), alignment=16)

        store_all(store_tail)


def row_copy_vec16(symbol: str, wave: int, global_space: bool) -> Helper:
    # The variant for rows whose size is a constant multiple of 16 bytes (token rows; buffers are
    # 256-byte aligned): the peer address once (mori_shmem.ptr), then rounds of 8 lane-strided 16-byte
    # vectors (_vector_rounds), no byte loops. Plain stores: the caller publishes them (release fence
    # before its signal). ``global_space``: the source and the peer row are addressed as global memory.
    @_function(symbol, "ptr ptr i64 i32")
    def helper(b, dst, src, nbytes, pe):
        peer = mori_shmem.ptr(dst, pe, **b.at())
        src = _global(b, src, global_space)
        peer = _global(b, peer, global_space)
        _vector_rounds(b, wave, nbytes, src, [(None, peer)])
        b.return_()

    return helper


def copy_bytes(symbol: str, wave: int, global_space: bool) -> Helper:
    # Any two directly addressable addresses, any alignment: when both are 16-byte aligned the whole
    # vectors go through the rounds of the row copies (_vector_rounds: 8 loads in flight per lane before
    # the stores), the remaining bytes (and everything when either address is unaligned) one byte per
    # lane and iteration. Plain loads and stores: the caller acquires the source and publishes the
    # destination (no ordering of its own). ``global_space``: both as global memory.
    @_function(symbol, "ptr ptr i64")
    def helper(b, dst, src, nbytes):
        dst, src = _global(b, dst, global_space), _global(b, src, global_space)
        fifteen = b.const_i64(15)
        misaligned = b.andi(b.ori(b.ptrtoint(b.i64, dst), b.ptrtoint(b.i64, src)), fifteen)
        aligned = b.cmpi("eq", misaligned, b.const_i64(0))
        whole = b.select(aligned, b.andi(nbytes, b.const_i64(-16)), b.const_i64(0))
        with b.if_(b.cmpi("ugt", whole, b.const_i64(0))):
            _vector_rounds(b, wave, whole, src, [(None, dst)])
        start = b.addi(b.index_cast(b.index, whole), b.lane_id())
        with b.for_(start, b.index_cast(b.index, nbytes), b.const_index(wave)) as i:
            i64 = b.index_cast(b.i64, i)
            b.store(b.load(b.i8, b.gep(src, i64, b.i8)), b.gep(dst, i64, b.i8))
        b.return_()

    return helper


def row_copy_to_peers(symbol: str, wave: int, max_peers: int, global_space: bool, loop: bool) -> Helper:
    # One row to up to K = max_peers destinations (lane k < K names destination k: its symmetric row
    # address and PE, and whether to send). Each lane resolves its own destination's peer address once
    # (mori_shmem.ptr; a lane that does not send resolves its own PE, so no table read is out of range),
    # then every round (_vector_rounds) loads 8 lane-strided 16-byte vectors of the source once and stores
    # them to each sending destination (addresses and flags broadcast from lane k: warp-uniform branches).
    # Compared with K row_copy calls, the row is read once, not once per destination, and a token costs
    # ceil(vectors / (8 x wave)) load round trips, not K times that. Plain stores: the caller publishes
    # them (release fence before its signal).
    # ``loop``: the K destinations are one loop (gpu.subgroup_broadcast of lane k's flag and address)
    # rather than K unrolled copies (shuffles): a fraction of the code (AMDGPU: K x 14 stores unrolled made
    # a 2,600-instruction dispatch with SGPR spills). ``global_space``: source and destinations are
    # addressed as global memory (AMDGPU: global_* instead of flat_* accesses, whose shared vmcnt/lgkmcnt
    # accounting made each destination's stores start with a full drain).
    @_function(symbol, "ptr ptr i64 i32 i1")
    def helper(b, dst, src, nbytes, pe, send):
        me = mori_shmem.my_pe(**b.at())
        peer = mori_shmem.ptr(dst, b.select(send, pe, me), **b.at())
        as_int = b.ptrtoint(b.i64, peer)
        c32 = b.const_i64(32)
        c0i = b.const_i32(0)
        lo = b.trunci(b.i32, as_int)
        hi = b.trunci(b.i32, b.shrui(as_int, c32))
        send32 = b.extui(b.i32, send)
        width = b.const_i32(wave)
        src = _global(b, src, global_space)
        ptr_type = b.ptr_global if global_space else b.ptr
        if loop:
            dests, any_sends = _DestinationLoop.begin(b, max_peers, ptr_type, lo, hi, send32, c0i, c32)
            with b.if_(any_sends):  # nothing to load when no destination sends
                _vector_rounds(b, wave, nbytes, src, dests)
        else:  # lane k's flag and address shuffled to every lane, destination by destination
            targets = []
            for k in range(max_peers):
                kk = b.const_i32(k)
                on = b.cmpi("ne", b.shuffle("idx", send32, kk, width)[0], c0i)
                lo_k = b.shuffle("idx", lo, kk, width)[0]
                hi_k = b.shuffle("idx", hi, kk, width)[0]
                lo64, hi64 = b.extui(b.i64, lo_k), b.extui(b.i64, hi_k)
                targets.append((on, b.inttoptr(ptr_type, b.ori(b.shli(hi64, c32), lo64))))
            _vector_rounds(b, wave, nbytes, src, targets)
        b.return_()

    return helper


# ---- slots, handshakes, barriers ----------------------------------------------------------------------


def reserve_slot(symbol: str) -> Helper:
    # Relaxed system-scope fetch-add on the peer's counter: slots are unique per destination and round;
    # ordering comes later from the count handshake (release fence + acquire fence).
    @_function(symbol, "ptr i32", "i32")
    def helper(b, ctr, pe):
        qp = b.const_i32(0)
        one = b.const_i32(1)
        b.return_([mori_shmem.atomic_fetch_add(ctr, one, pe, elem="uint32", qp=qp, **b.at())])

    return helper


def _warp_sum_i32(b: Builder, value: ir.Value, wave: int) -> ir.Value:
    """The sum of ``value`` over the warp (xor butterfly: every lane gets it)."""
    width = b.const_i32(wave)
    offset = wave // 2
    while offset >= 1:
        value = b.addi(value, b.shuffle("xor", value, b.const_i32(offset), width)[0])
        offset //= 2
    return value


def count_signal(symbol: str, world: int, wave: int, group: int | None = None) -> Helper:
    # Protocol (one warp; lane p < W talks to PE p), per docs/ep-protocols.md (the count handshake):
    #  send:    wait (remote, relaxed system-scope polls) until PE p's slot signals[me] is 0, i.e. PE p
    #           consumed our previous round (flow control); fence (release: our payload stores to p are
    #           ordered before); relaxed system-scope store of count+1 into PE p's signals[me].
    #  receive: poll our signals[p] until > 0; fence (acquire: PE p's payload is visible); count = v - 1;
    #           reset our slot to 0 with a relaxed system-scope store (PE p polls it next round).
    # Counts travel as count + 1 so that 0 means "nothing yet". The warp sums the counts into *total.
    # The fences are system-scope release / acquire (LLVM fences: fence.acq_rel.sys on sm_90), not the ABI's
    # full mori_shmem_fence (fence.sc.sys): the peers are P2P (every payload store and signal is a memory
    # access, no transport operation to order), and the handshake needs only the release/acquire pairing
    # (measured on the H200 with session 10's completion: 3 % of a 128-token dispatch).
    # With ``group`` G (node_count_signal): lane p < G talks to PE (me / G) * G + p instead, the buffers
    # still indexed by PE.
    @_function(symbol, "ptr ptr ptr")
    def helper(b, signals, counts, total):
        qp = b.const_i32(0)
        lane = b.index_cast(b.i32, b.lane_id())
        world_size = b.const_i32(world if group is None else group)
        me = mori_shmem.my_pe(**b.at())
        peer = lane if group is None else b.addi(_node_base(b, me, group), lane)

        def talk():
            myslot = b.gep(signals, me, b.i64)
            peerslot = mori_shmem.ptr(myslot, peer, **b.at())
            z64 = b.const_i64(0)
            mori_shmem.wait_until(peerslot, z64, cmp="equals", elem="uint64", **b.at())  # PE p took the last one
            cntp = b.gep(counts, peer, b.i32)
            cnt64 = b.extui(b.i64, b.load(b.i32, cntp))
            one64 = b.const_i64(1)
            value = b.addi(cnt64, one64)
            b.fence("release")
            mori_shmem.p(myslot, value, peer, c_type="uint64", qp=qp, **b.at())
            b.store(b.const_i32(0), cntp)
            inslot = b.gep(signals, peer, b.i64)
            seen = mori_shmem.wait_until(inslot, z64, cmp="greater_than", elem="uint64", **b.at())
            b.fence("acquire")
            mori_shmem.p(inslot, z64, me, c_type="uint64", qp=qp, **b.at())
            return [b.trunci(b.i32, b.subi(seen, one64))]

        got = b.if_else(b.cmpi("ult", lane, world_size), [b.i32], talk, lambda: [b.const_i32(0)])[0]
        received = _warp_sum_i32(b, got, wave)
        with b.if_(b.cmpi("eq", lane, b.const_i32(0))):
            b.store(received, total)
        b.return_()

    return helper


def grid_barrier(symbol: str, global_space: bool) -> Helper:
    # Protocol (sense-reversal on {arrivals, generation}, two u64 words): the block meets (gpu.barrier);
    # thread 0 reads the generation g, fences (release: the block's stores), and adds 1 to the arrival
    # count (relaxed, system scope). The last block to arrive resets the count to 0 and then publishes
    # g + 1 (after a fence); the others poll the generation until it passes g, then fence (acquire). The
    # block meets again. Works for any grid size per launch; no host reset (graph-replay safe).
    # The words are this PE's own: the ABI calls (atomic_fetch_add and p on our PE) translate their
    # address to itself. ``global_space`` (AMDGPU): the count and the generation are written with the LLVM
    # atomics those ABI functions are made of (relaxed, system scope) on the global-space words, without
    # that translation (a quarter of a dispatch kernel's code); fences and the poll stay ABI calls.
    @_function(symbol, "ptr")
    def helper(b, ctr):
        qp = b.const_i32(0)
        b.barrier()
        with b.if_(b.cmpi("eq", b.thread_id(), b.const_index(0))):
            blocks = b.index_cast(b.i64, b.grid_dim())
            me = None if global_space else mori_shmem.my_pe(**b.at())
            one = b.const_i64(1)
            zero = b.const_i64(0)
            genp = b.gep(ctr, 1, b.i64)
            if global_space:
                gctr = b.addrspacecast(b.ptr_global, ctr)
                ggen = b.gep(gctr, 1, b.i64)
            g = b.load(b.i64, genp, alignment=8, ordering="monotonic")
            mori_shmem.fence(**b.at())  # release
            if global_space:
                old = b.atomicrmw("add", gctr, one, "monotonic")
            else:
                old = mori_shmem.atomic_fetch_add(ctr, one, me, elem="uint64", qp=qp, **b.at())

            def last():  # reset the arrivals, then publish the next generation
                if global_space:
                    b.store(zero, gctr, alignment=8, ordering="monotonic")
                else:
                    mori_shmem.p(ctr, zero, me, c_type="uint64", qp=qp, **b.at())
                mori_shmem.fence(**b.at())
                g1 = b.addi(g, one)
                if global_space:
                    b.store(g1, ggen, alignment=8, ordering="monotonic")
                else:
                    mori_shmem.p(genp, g1, me, c_type="uint64", qp=qp, **b.at())
                return []

            def wait():
                mori_shmem.wait_until(genp, g, cmp="greater_than", elem="uint64", **b.at())
                return []

            b.if_else(b.cmpi("eq", old, b.subi(blocks, one)), [], last, wait)
            mori_shmem.fence(**b.at())  # acquire
        b.barrier()
        b.return_()

    return helper


def grid_last_arrival(symbol: str, global_space: bool, wave: int) -> Helper:
    # Protocol (one u64 arrival count): the block meets (gpu.barrier); thread 0 fences (release, system
    # scope: the block's stores, peers' included) and adds 1 to the count (relaxed, system scope); the block
    # that sees blocks - 1 is the last: it resets the count to 0 (relaxed: untouched until the next launch)
    # and fences (acquire, system scope: every other block's stores, released before its add, are
    # visible); the block meets again (thread 0's acquire then covers every thread of the block). No block
    # waits for another. The flag is broadcast from lane 0 of each
    # warp, so it is true in warp 0 of the last block only. ``global_space`` (AMDGPU): the
    # add and the reset are the LLVM atomics the ABI calls are made of, on the global-space word (as
    # grid_barrier's).
    @_function(symbol, "ptr", "i1")
    def helper(b, ctr):
        qp = b.const_i32(0)
        b.barrier()

        def arrive():
            blocks = b.index_cast(b.i64, b.grid_dim())
            one = b.const_i64(1)
            b.fence("release")
            if global_space:
                gctr = b.addrspacecast(b.ptr_global, ctr)
                old = b.atomicrmw("add", gctr, one, "monotonic")
            else:
                me = mori_shmem.my_pe(**b.at())
                old = mori_shmem.atomic_fetch_add(ctr, one, me, elem="uint64", qp=qp, **b.at())
            last = b.cmpi("eq", old, b.subi(blocks, one))
            with b.if_(last):
                if global_space:
                    b.store(b.const_i64(0), gctr, alignment=8, ordering="monotonic")
                else:
                    mori_shmem.p(ctr, b.const_i64(0), me, c_type="uint64", qp=qp, **b.at())
                b.fence("acquire")
            return [b.extui(b.i32, last)]

        t0 = b.cmpi("eq", b.thread_id(), b.const_index(0))
        flag = b.if_else(t0, [b.i32], arrive, lambda: [b.const_i32(0)])[0]
        # Thread 0's acquire reaches the other threads through the block barrier (a shuffle orders no memory):
        # the lanes of the warp that runs the handshake read what every block released.
        b.barrier()
        lane0_flag = b.shuffle("idx", flag, b.const_i32(0), b.const_i32(wave))[0]
        b.return_([b.cmpi("ne", lane0_flag, b.const_i32(0))])

    return helper


def _node_base(b: Builder, me: ir.Value, group: int) -> ir.Value:
    """The first PE of ``me``'s node of ``group`` consecutive PEs: (me / G) * G."""
    g = b.const_i32(group)
    return b.muli(b.divui(me, g), g)


class _BarrierSide:
    """The pieces of device_barrier's protocol, shared by it and by its split form (barrier_arrive, then
    barrier_wait), emitted in device_barrier's order: thread p < W of block b talks to PE p (group G:
    PE (me / G) * G + p)."""

    def __init__(self, b: Builder, world: int, group: int | None, syncscope: str | None):
        self.b, self.world, self.group, self.syncscope = b, world, group, syncscope
        self.qp = b.const_i32(0)
        self.block = b.index_cast(b.i64, b.block_id())
        self.one = self.tid = self.world64 = None

    def epoch(self, epochs: ir.Value) -> ir.Value:
        """Every thread reads e0 = epochs[b], the block meets, thread 0 stores e = e0 + 1 back; returns e."""
        b = self.b
        epp = b.gep(epochs, self.block, b.i64)
        e0 = b.load(b.i64, epp)
        b.barrier()
        self.one = b.const_i64(1)
        e = b.addi(e0, self.one)
        self.tid = b.index_cast(b.i32, b.thread_id())
        with b.if_(b.cmpi("eq", self.tid, b.const_i32(0))):
            b.store(e, epp)
        return e

    def talking(self):
        """``with``: the body runs in threads p < W (G with a group)."""
        b = self.b
        if self.tid is None:  # (barrier_wait: no epoch step before)
            self.one, self.tid = b.const_i64(1), b.index_cast(b.i32, b.thread_id())
        world_size = b.const_i32(self.world if self.group is None else self.group)
        self.world64 = b.const_i64(self.world)
        return b.if_(b.cmpi("ult", self.tid, world_size))

    def signal(self, slots: ir.Value, e: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Fence (release), then e into slots[b][me] on PE p (relaxed, system scope); returns (row, p)."""
        b = self.b
        me = mori_shmem.my_pe(**b.at())
        me64 = b.extui(b.i64, me)
        peer = self.tid if self.group is None else b.addi(_node_base(b, me, self.group), self.tid)
        p64 = b.extui(b.i64, peer)
        row = b.muli(self.block, self.world64)
        outslot = b.gep(slots, b.addi(row, me64), b.i64)
        b.fence("release", self.syncscope)
        mori_shmem.p(outslot, e, peer, c_type="uint64", qp=self.qp, **b.at())
        return row, p64

    def poll(self, slots: ir.Value, e: ir.Value, row: ir.Value, p64: ir.Value) -> None:
        """Poll our slots[b][p] until it is >= e (relaxed polls), then fence (acquire)."""
        b = self.b
        inslot = b.gep(slots, b.addi(row, p64), b.i64)
        mori_shmem.wait_until(inslot, b.subi(e, self.one), cmp="greater_than", elem="uint64", **b.at())
        b.fence("acquire", self.syncscope)


def device_barrier(symbol: str, world: int, group: int | None = None, syncscope: str | None = None) -> Helper:
    # Protocol (block b of PE me meets block b of every PE): every thread reads epoch e0 = epochs[b]
    # (this PE's private counter for block b), the block meets, thread 0 stores e = e0 + 1 back (no one
    # reads it again this round). Threads p < W: fence (release: everything this PE wrote before the
    # barrier), relaxed system-scope store of e into slots[b][me] on PE p; poll our slots[b][p] until
    # >= e; fence (acquire). The block meets. Epochs only grow and are kept on the device, so graph
    # replay is correct and no reset is needed. The op's max_blocks sizes the slot arrays; blocks beyond
    # it are a launch error (host check). The fences are system-scope release / acquire (P2P peers), as
    # count_signal's; with ``syncscope`` (one_gpu_barrier: every PE on this GPU) at that scope.
    @_function(symbol, "ptr ptr")
    def helper(b, slots, epochs):
        side = _BarrierSide(b, world, group, syncscope)
        e = side.epoch(epochs)
        with side.talking():
            side.poll(slots, e, *side.signal(slots, e))
        b.barrier()
        b.return_()

    return helper


def barrier_arrive(symbol: str, world: int, syncscope: str | None) -> Helper:
    # device_barrier's first half: the epoch step and the signal (release fence, e into slots[b][me] on
    # every PE p); returns e. The block may then work on what no peer reads or writes before barrier_wait.
    @_function(symbol, "ptr ptr", "i64")
    def helper(b, slots, epochs):
        side = _BarrierSide(b, world, None, syncscope)
        e = side.epoch(epochs)
        with side.talking():
            side.signal(slots, e)
        b.return_([e])

    return helper


def barrier_wait(symbol: str, world: int, syncscope: str | None) -> Helper:
    # device_barrier's second half: thread p polls slots[b][p] until >= e (the epoch barrier_arrive
    # returned), fences (acquire); the block meets.
    @_function(symbol, "ptr i64")
    def helper(b, slots, e):
        side = _BarrierSide(b, world, None, syncscope)
        with side.talking():
            side.poll(slots, e, b.muli(side.block, side.world64), b.extui(b.i64, side.tid))
        b.barrier()
        b.return_()

    return helper


def node_pe(symbol: str, group: int) -> Helper:
    # Pure: (me / G) * G + pe % G. No memory access, no ordering.
    @_function(symbol, "i32", "i32")
    def helper(b, pe):
        me = mori_shmem.my_pe(**b.at())
        b.return_([b.addi(_node_base(b, me, group), b.remui(pe, b.const_i32(group)))])

    return helper


# ---- chunked sends (the inter-node kernels) ----------------------------------------------------------


def chunk_send(symbol: str) -> Helper:
    # Protocol (one warp, identical operands): for each run of consecutive set bits of `mask` (low bit
    # first; warp-uniform loop), one putmem_nbi_warp of run * record bytes from source + start * record
    # to dest + rank * record (rank = set bits below start) on `pe`, queue pair `qp`. Then one
    # putmem_nbi_signal_warp of 0 bytes with SET of signal_base + popcount(mask) on the same pe and qp:
    # over RDMA the signal's work request follows the data's on that queue pair; over P2P the library's
    # warp variant has every lane fence (release, system scope) before lane 0's release store. The
    # reader: chunk_wait (wait >= signal_base, then an acquire fence).
    @_function(symbol, "ptr ptr i64 i64 ptr i64 i32 i32", "i64")
    def helper(b, dest, source, rec, mask, signal, base, pe, qp):
        zero, one = b.const_i64(0), b.const_i64(1)
        count = b.ctpop(mask)

        def before(rem):
            return b.cmpi("ne", rem, zero), [rem]

        def after(rem):
            low = b.andi(rem, b.subi(zero, rem))  # lowest set bit: the start of the next run
            below = b.subi(low, one)
            start = b.ctpop(below)
            rest = b.shrui(rem, start)
            run = b.ctpop(b.subi(b.andi(b.xori(rest, b.const_i64(-1)), b.addi(rest, one)), one))  # trailing ones
            rank = b.ctpop(b.andi(mask, below))
            dst = b.gep(dest, b.muli(rank, rec), b.i8)
            src = b.gep(source, b.muli(start, rec), b.i8)
            mori_shmem.putmem_nbi(dst, src, b.muli(run, rec), pe, scope="warp", qp=qp, **b.at())
            return [b.andi(rem, b.addi(rem, low))]  # the run cleared (the carry lands on a clear bit)

        b.while_([mask], before, after)
        mori_shmem.putmem_nbi_signal(dest, source, zero, signal, b.addi(base, count), pe, signal_op="set",
                                     scope="warp", qp=qp, **b.at())  # fmt: skip
        b.return_([b.muli(count, rec)])

    return helper


def chunk_wait(symbol: str) -> Helper:
    # Protocol (one thread): poll the local u64 signal (relaxed, system scope) until it is >= base (the
    # round's tag; older rounds carry smaller tags), fence (acquire), return the low 32 bits (the count).
    @_function(symbol, "ptr i64", "i32")
    def helper(b, signal, base):
        seen = mori_shmem.wait_until(signal, b.subi(base, b.const_i64(1)), cmp="greater_than", elem="uint64",
                                     **b.at())  # fmt: skip
        mori_shmem.fence(**b.at())  # acquire
        b.return_([b.trunci(b.i32, seen)])

    return helper


# ---- row accumulation ---------------------------------------------------------------------------------


def _load_vectors(b: Builder, rows: Sequence[ir.Value], off: ir.Value) -> list[ir.Value]:
    """The 16-byte vector at byte offset ``off`` of each row, all loads issued before any use."""
    vec = b.vector(4, b.i32)
    return [b.load(vec, b.gep(row, off, b.i8), alignment=16) for row in rows]


def _sum_vectors(b: Builder, dtype: str, loaded: Sequence[ir.Value]) -> ir.Value:
    """The vectors of ``loaded`` (4 x i32 holding ``dtype`` elements) summed in fp32, rounded once, as
    4 x i32."""
    vec = b.vector(4, b.i32)
    if dtype == "bf16":
        wide = [b.extf(b.vector(8, b.f32), b.bitcast(b.vector(8, b.bf16), v)) for v in loaded]
    else:
        wide = [b.bitcast(b.vector(4, b.f32), v) for v in loaded]
    acc = wide[0]
    for w in wide[1:]:
        acc = b.addf(acc, w)
    if dtype == "bf16":
        return b.bitcast(vec, b.truncf(b.vector(8, b.bf16), acc))
    return b.bitcast(vec, acc)


def accumulate_rows(symbol: str, dtype: str, k: int, wave: int, global_space: bool, vectors_per_lane: int) -> Helper:
    # Warp-cooperative, lane-strided 16-byte vectors; for each vector all K source loads are issued
    # before the fp32 adds, then one rounding to the output dtype. No ordering of its own: the caller
    # has acquired the sources (device barrier) before. ``global_space``: sources and output as global
    # memory. ``vectors_per_lane`` 2: two vectors per lane and iteration (j and j + wave), all 2K loads
    # before the adds; when the second vector is past the end it re-reads the first (loads stay
    # unconditional) and is not stored.
    @_function(symbol, "ptr i64" + " ptr" * k)
    def helper(b, out, elems, *sources):
        if global_space:
            sources = [b.addrspacecast(b.ptr_global, s) for s in sources]
            out = b.addrspacecast(b.ptr_global, out)
        lane = b.index_cast(b.i64, b.lane_id())
        nvec = b.divui(elems, b.const_i64(8 if dtype == "bf16" else 4))  # elements per 16-byte vector
        lower, upper = b.index_cast(b.index, lane), b.index_cast(b.index, nvec)
        step = b.const_index(vectors_per_lane * wave)
        sixteen = b.const_i64(16)
        if vectors_per_lane == 1:
            with b.for_(lower, upper, step) as j:
                off = b.muli(b.index_cast(b.i64, j), sixteen)
                total = _sum_vectors(b, dtype, _load_vectors(b, sources, off))
                b.store(total, b.gep(out, off, b.i8), alignment=16)
        else:
            wave64 = b.const_i64(wave)
            with b.for_(lower, upper, step) as j:
                ja = b.index_cast(b.i64, j)
                jb0 = b.addi(ja, wave64)
                second = b.cmpi("ult", jb0, nvec)
                jb = b.select(second, jb0, ja)
                offa, offb = b.muli(ja, sixteen), b.muli(jb, sixteen)
                loaded_a, loaded_b = _load_vectors(b, sources, offa), _load_vectors(b, sources, offb)
                total_a, total_b = _sum_vectors(b, dtype, loaded_a), _sum_vectors(b, dtype, loaded_b)
                b.store(total_a, b.gep(out, offa, b.i8), alignment=16)
                with b.if_(second):
                    b.store(total_b, b.gep(out, offb, b.i8), alignment=16)
        b.return_()

    return helper


# ---- the lowering of each op --------------------------------------------------------------------------


def _constant(value: ir.Value) -> int | None:
    owner = value.owner
    if not isinstance(owner, ir.Block) and owner.name == "arith.constant":
        attr = owner.attributes["value"]
        return attr.value if isinstance(attr, ir.IntegerAttr) else None
    return None


def _known_multiple_of_16(value: ir.Value, depth: int = 4) -> bool:
    """Whether ``value`` is a multiple of 16 by construction: a constant one, ``andi`` with a constant whose
    low four bits are clear (how the EP kernels state a call's row bytes), ``muli``/``shli`` of such a
    factor or by 16 (a shift of 4 or more), or ``addi`` of two such values. A bounded look through the
    defining ops; anything else is not known."""
    const = _constant(value)
    if const is not None:
        return const % 16 == 0
    owner = value.owner
    if depth == 0 or isinstance(owner, ir.Block):
        return False
    ops = list(owner.operands)
    if owner.name == "arith.andi":
        return any((c := _constant(v)) is not None and c % 16 == 0 for v in ops)
    if owner.name == "arith.muli":
        return any(_known_multiple_of_16(v, depth - 1) for v in ops)
    if owner.name == "arith.shli":
        shift = _constant(ops[1])
        return (shift is not None and shift >= 4) or _known_multiple_of_16(ops[0], depth - 1)
    if owner.name == "arith.addi":
        return all(_known_multiple_of_16(v, depth - 1) for v in ops)
    return False


def _int_attr(op: ir.Operation, name: str) -> int:
    return op.attributes[name].value


def _lower_row_copy(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    if _known_multiple_of_16(op.operands[2]):
        return row_copy_vec16(f"{PREFIX}row_copy_vec16", p.wave_size, p.global_address_space)
    return row_copy(f"{PREFIX}row_copy")


def _lower_row_copy_to_peers(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    if not _known_multiple_of_16(op.operands[2]):
        raise MoriCompilerError(f"'{op.name}' operand 'bytes' must be a multiple of 16 by construction (a constant, "
                                f"or a value masked with andi -16: the row is copied in 16-byte vectors)",
                                op.location)  # fmt: skip
    k = _int_attr(op, "max_peers")
    return row_copy_to_peers(f"{PREFIX}row_copy_to_peers_k{k}", p.wave_size, k, p.global_address_space,
                             p.loop_destinations)  # fmt: skip


def _lower_count_signal(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world = _int_attr(op, "world_size")
    return count_signal(f"{PREFIX}count_signal_w{world}", world, p.wave_size)


def _lower_device_barrier(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world = _int_attr(op, "world_size")
    return device_barrier(f"{PREFIX}device_barrier_w{world}", world)


def _lower_node_count_signal(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world, group = _int_attr(op, "world_size"), _int_attr(op, "group_size")
    return count_signal(f"{PREFIX}count_signal_w{world}_g{group}", world, p.wave_size, group)


def _lower_one_gpu_barrier(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world = _int_attr(op, "world_size")
    return device_barrier(f"{PREFIX}one_gpu_barrier_w{world}", world, syncscope=_target_of(op, p).device_syncscope)


def _split_barrier_scope(op: ir.Operation, p: "MoriCommToCalls") -> tuple[int, str, str | None]:
    """(world, scope, LLVM syncscope) of barrier_arrive / barrier_wait."""
    scope = op.attributes["scope"].value
    return _int_attr(op, "world_size"), scope, (_target_of(op, p).device_syncscope if scope == "gpu" else None)


def _lower_barrier_arrive(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world, scope, syncscope = _split_barrier_scope(op, p)
    return barrier_arrive(f"{PREFIX}barrier_arrive_w{world}_{scope}", world, syncscope)


def _lower_barrier_wait(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world, scope, syncscope = _split_barrier_scope(op, p)
    return barrier_wait(f"{PREFIX}barrier_wait_w{world}_{scope}", world, syncscope)


def _target_of(op: ir.Operation, p: "MoriCommToCalls") -> targets.GPUTarget:
    """The pass's ``chip`` as a target (ops whose lowering depends on it: an error at the op without it)."""
    if p.chip not in targets.TARGETS:
        raise MoriCompilerError(f"'{op.name}' needs the pass option chip, one of {', '.join(targets.TARGETS)} (the "
                                f"target: its lowering depends on it), got {p.chip!r}", op.location)  # fmt: skip
    return targets.TARGETS[p.chip]


def _lower_node_device_barrier(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    world, group = _int_attr(op, "world_size"), _int_attr(op, "group_size")
    return device_barrier(f"{PREFIX}device_barrier_w{world}_g{group}", world, group)


def _lower_accumulate_rows(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    dtype, k = op.attributes["dtype"].value, len(op.operands) - 2
    return accumulate_rows(f"{PREFIX}accumulate_rows_{dtype}_k{k}", dtype, k, p.wave_size, p.global_address_space,
                           p.vectors_per_lane)  # fmt: skip


def _wire_codec(op: ir.Operation, p: "MoriCommToCalls") -> tuple[comm_quant.WireCodec, int]:
    """The target's conversions for the op's wire format (refused where the target does not run it)."""
    fmt, blocks = op.attributes["format"].value, _int_attr(op, "scale_blocks")
    if not p.chip:
        raise MoriCompilerError(f"'{op.name}' needs the pass option chip (the target, e.g. chip=sm_90): the wire "
                                f"conversions are the target's instructions", op.location)  # fmt: skip
    if p.chip not in wire_quant.WIRE_FP8_OF_TARGET:
        raise MoriCompilerError(f"pass 'mori-comm-to-calls' option chip={p.chip!r} is not a known target (allowed: "
                                f"{', '.join(wire_quant.WIRE_FP8_OF_TARGET)})", op.location)  # fmt: skip
    if fmt == "fp8_e4m3":  # the target's variant (the target-neutral EP kernels name it so)
        fmt = wire_quant.WIRE_FP8_OF_TARGET[p.chip]
    if fmt == "fp4_e2m1":
        if p.chip not in wire_quant.FP4_TARGETS:
            raise MoriCompilerError(f"'{op.name}' attribute 'format' fp4_e2m1 is not supported on {p.chip} (fp4 wire "
                                    f"rows: {', '.join(wire_quant.FP4_TARGETS)})", op.location)  # fmt: skip
    elif fmt != wire_quant.WIRE_FP8_OF_TARGET[p.chip]:
        raise MoriCompilerError(f"'{op.name}' attribute 'format' {fmt} is not {p.chip}'s fp8 (its conversion "
                                f"instructions make {wire_quant.WIRE_FP8_OF_TARGET[p.chip]})", op.location)  # fmt: skip
    return comm_quant.WireCodec(p.chip, fmt), blocks


def _lower_quantize_row(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    codec, blocks = _wire_codec(op, p)
    return comm_quant.quantize_row(f"{PREFIX}quantize_row_{codec.tag}_s{blocks}", _function, codec, blocks,
                                   p.wave_size, p.global_address_space)  # fmt: skip


def _lower_accumulate_quantized_rows(op: ir.Operation, p: "MoriCommToCalls") -> Helper:
    codec, blocks = _wire_codec(op, p)
    k = len(op.operands) - 4
    return comm_quant.accumulate_quantized_rows(f"{PREFIX}accumulate_quantized_rows_{codec.tag}_s{blocks}_k{k}",
                                                _function, codec, blocks, k, p.wave_size,
                                                p.global_address_space)  # fmt: skip


# op → the helper its call goes to (by the op's variant and the pass options).
LOWERINGS: dict[str, Callable[[ir.Operation, "MoriCommToCalls"], Helper]] = {
    "mori_comm.row_copy": _lower_row_copy,
    "mori_comm.row_copy_to_peers": _lower_row_copy_to_peers,
    "mori_comm.copy_bytes": lambda op, p: copy_bytes(f"{PREFIX}copy_bytes", p.wave_size, p.global_address_space),
    "mori_comm.reserve_slot": lambda op, p: reserve_slot(f"{PREFIX}reserve_slot"),
    "mori_comm.count_signal": _lower_count_signal,
    "mori_comm.grid_barrier": lambda op, p: grid_barrier(f"{PREFIX}grid_barrier", p.global_address_space),
    "mori_comm.device_barrier": _lower_device_barrier,
    "mori_comm.one_gpu_barrier": _lower_one_gpu_barrier,
    "mori_comm.barrier_arrive": _lower_barrier_arrive,
    "mori_comm.barrier_wait": _lower_barrier_wait,
    "mori_comm.grid_last_arrival": lambda op, p: grid_last_arrival(f"{PREFIX}grid_last_arrival", p.global_address_space,
                                                                    p.wave_size),
    "mori_comm.accumulate_rows": _lower_accumulate_rows,
    "mori_comm.node_pe": lambda op, p: node_pe(f"{PREFIX}node_pe_g{_int_attr(op, 'group_size')}",
                                               _int_attr(op, "group_size")),
    "mori_comm.node_count_signal": _lower_node_count_signal,
    "mori_comm.node_device_barrier": _lower_node_device_barrier,
    "mori_comm.chunk_send": lambda op, p: chunk_send(f"{PREFIX}chunk_send"),
    "mori_comm.chunk_wait": lambda op, p: chunk_wait(f"{PREFIX}chunk_wait"),
    "mori_comm.quantize_row": _lower_quantize_row,
    "mori_comm.accumulate_quantized_rows": _lower_accumulate_quantized_rows,
}


@dataclass(frozen=True)
class MoriCommToCalls:
    """Lower mori_comm building blocks to calls of helper functions added to the gpu.module.

    Input: mori_comm ops in gpu.module. Output: func.call + func.func helpers using mori_shmem, gpu, scf,
    arith, llvm, and for the wire conversions of quantize_row / accumulate_quantized_rows the target's
    nvvm or rocdl ops (one helper per variant, added once). Options: wave-size (32 or 64: the lane count of the
    warp-cooperative helpers); vectors-per-lane (1 or 2: 16-byte vectors each lane accumulates per
    iteration; 2 doubles the loads in flight, measured faster on sm_90, while on AMDGPU the scheduler then
    splits the loads around a wait, so the pipeline picks 1 there); global-address-space (the row copies
    and accumulate_rows address their rows as ``!llvm.ptr<1>``, casting the generic pointers they get:
    AMDGPU global memory, where every buffer and peer row lives; the pipeline sets it for AMDGPU);
    loop-destinations (row_copy_to_peers loops over its K destinations instead of unrolling them: compact
    code; the pipeline sets it for AMDGPU, while sm_90 keeps the unrolled form it was measured with);
    chip (the target, e.g. gfx942 or sm_90: the wire conversions of quantize_row and
    accumulate_quantized_rows are its instructions, passes/comm_quant.py; those ops need it).
    """

    name: ClassVar[str] = "mori-comm-to-calls"
    wave_size: int = 64
    vectors_per_lane: int = 1
    global_address_space: bool = False
    loop_destinations: bool = False
    chip: str = ""

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        if self.wave_size not in (32, 64):
            raise MoriCompilerError(f"pass '{self.name}' option wave-size must be 32 or 64, got {self.wave_size}")
        if self.vectors_per_lane not in (1, 2):
            raise MoriCompilerError(f"pass '{self.name}' option vectors-per-lane must be 1 or 2, got "
                                    f"{self.vectors_per_lane}")  # fmt: skip
        with op.context:
            for gm in op.operation.regions[0].blocks[0].operations:
                if gm.operation.name == "gpu.module":
                    found = nested_ops(gm.operation, lambda inner: inner.name in LOWERINGS)
                    replace_by_helper_calls(gm.operation, found, lambda block_op: LOWERINGS[block_op.name](block_op, self))
