"""The expansions of the ``mori_coll`` ops (dialects/mori_coll.py): each collective built in place, before
its op, from ``Builder`` and the mori_comm blocks ``copy_bytes``, ``device_barrier`` (``one_gpu_barrier``
with the option one-gpu), ``barrier_arrive`` / ``barrier_wait`` and ``accumulate_rows``. Sizes and the
workspace layout: dialects/mori_coll_schema.py. docs/collectives.md has the protocols with a figure per
collective; each generator below states its own.

Shared protocol (every collective is one or more rounds of it):

* **Units and pieces.** Warp w of block b is unit ``u = b * warps + w`` of ``U = blocks * warps``. Every
  byte range the collective moves (a chunk of ``c`` bytes) is cut the same way on every PE
  (``Collective.each_piece``): into pieces of ``P = min(R, round_up(ceil(c / U), 16))`` bytes (R: one round
  of copy_bytes, 4 KiB with 32 lanes), unit u owning pieces u, u + U, u + 2U, ... So the bytes block b
  writes on one PE are exactly the bytes block b reads on every other PE, and a per-block
  ``device_barrier`` (block b meets block b of every PE) orders them: no grid barrier is needed. Every PE
  launches the same grid.
* **Place** (who writes: each unit its pieces, and thread 0 of each block one word; scope: this PE's
  workspace): the bytes the peers read are this PE's input itself when the layout allows it
  (``CollSpec.in_place_layout``) and, checked at run time, the input lies wholly in the symmetric heap
  (``mori_shmem.ptr`` of its first and last byte to a peer is not null), is 16-byte aligned and is apart
  from the output (all_gather, broadcast: or is exactly this PE's part of it); otherwise each unit
  ``copy_bytes`` its pieces of the input into this PE's ``stage`` (chunk c at ``c * stride``, plain
  stores). Thread 0 of block b stores the chosen place's offset from the workspace into ``sources[b]``
  (plain store); each PE chooses for itself, at every call.
* **Meet** (``device_barrier``; ``one_gpu_barrier`` when every PE runs on this GPU, virtual PEs: the
  same with the fences at the GPU's scope; every thread of the block): thread p < W fences (release,
  system scope: the block's staging stores, ordered before by the block barrier) and stores the block's
  new epoch into PE p's slot; polls its own slot of PE p until it reaches the epoch; fences (acquire); the
  block meets.
  After it, every PE's ``sources[b]`` and staged pieces of this block are visible to this block (an input
  read in place was written before the kernel, in its PE's stream order, so before the release too).
* **Pull / reduce** (each unit its pieces): at the kernel's start lane l translates the workspace's address
  to PE ``l mod W`` once (``lane_workspace``: with the placing's translations, before any wait); right
  after the first meet it issues the load of that PE's ``sources[b]``, and the address of the PE's placed
  bytes (the workspace plus the offset) is shuffled from its lane where it is used (a translation or load
  per peer inside the loop would be a dependent round trip before each peer's copy); then ``copy_bytes``
  from a peer's placed bytes into the user's output, or ``accumulate_rows`` of the W peers' pieces (fp32
  sums, rounded once) into the output (whole vectors, aligned output: ``CollSpec.sums_into_output``) or
  into this PE's ``reduced`` and then (after a ``gpu.barrier``: the lanes that copy are not the lanes that
  summed) ``copy_bytes`` into the output.
* **Own part** (the movers: all_gather, broadcast's root, all_to_all): this PE's own part of the result,
  which no peer writes or reads in its output, is copied from its input in two halves
  (``meet_copying_own_part``): the first inside the first meet, between its halves (``barrier_arrive``, the
  copy, ``barrier_wait``): it needs no peer, so it fills the wait for them; the second after the loads of
  the peers' places are issued, filling their round trip.
* **Close** (``Collective.close``: a final ``device_barrier``): no PE returns (its input may then change)
  or places the next call's input into its ``stage``, ``sources`` (or overwrites ``reduced``) before every
  peer's block finished reading this call's. With it, calls follow each other on the stream with no host
  sync: the epochs live on the device and only grow (graph replay is correct; nothing is reset). With the
  option one-launch (virtual PEs: every PE is a part of one launch) the launch's end is that point, so
  there is no closing barrier: a call's kernel ends only after every PE's every block finished reading,
  and whatever follows it on the stream starts after that.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import Builder, GeneratorError
from mori_compiler.dialects.mori_coll_schema import VECTOR, CollSpec

GENERATOR = "coll_kernels"


class Collective:
    """The values and steps a collective's expansion shares, built before its op with ``b``."""

    def __init__(self, b: Builder, spec: CollSpec, input_: ir.Value, output: ir.Value, workspace: ir.Value,
                 *splits: ir.Value, wave: int, one_gpu: bool = False, one_launch: bool = False):  # fmt: skip
        self.b, self.spec, self.wave, self.one_launch = b, spec, wave, one_launch
        self.barrier = mori_comm.one_gpu_barrier if one_gpu else mori_comm.device_barrier
        wave_c = b.const_index(wave)
        warps = b.divui(b.block_dim(), wave_c)
        unit = b.addi(b.muli(b.block_id(), warps), b.divui(b.thread_id(), wave_c))
        self.unit = b.index_cast(b.i64, unit)
        self.units = b.index_cast(b.i64, b.muli(b.grid_dim(), warps))
        self.me = mori_shmem.my_pe(**b.at())
        self.input, self.output = input_, output
        self.slots = workspace
        self.epochs = self.at(workspace, spec.epochs_offset)
        self.stage = self.at(workspace, spec.stage_offset)
        self.reduced = self.at(workspace, spec.reduced_offset)
        row = b.muli(b.index_cast(b.i64, b.block_id()), self.i64(8))
        self.my_source_offset = b.addi(row, self.i64(spec.sources_offset))  # this block's sources[b]
        self.my_source = self.at(workspace, self.my_source_offset)
        # Lane l: PE (l mod W)'s workspace, translated once at the start, where its state loads go with the
        # placing's (the workspace is one symmetric allocation: a peer's copy of any of its bytes is at the
        # same offset from it). all_to_all_v reads no places (it translates each peer's sizes and stage).
        self.lane_workspace = self.peer(workspace, self._lane_pe()) if spec.op != "all_to_all_v" else None
        self._source_of = None  # PE -> its placed bytes (_read_places, after the first meet)
        self.scope = "gpu" if one_gpu else "system"  # the split meets' (barrier_arrive / barrier_wait)
        self.splits = splits  # all_to_all_v: (splits, recv_counts)
        self.meets = 0  # device barriers so far (meet k is traced as "meet<k>")
        self.open_step = None  # the trace op that began the work after the last meet ("step<k>")

    def i64(self, value: int) -> ir.Value:
        return self.b.const_i64(value)

    def at(self, base: ir.Value, offset) -> ir.Value:
        """``base + offset`` bytes (offset: an int or an i64 value)."""
        if isinstance(offset, int) and offset == 0:
            return base
        return self.b.gep(base, self.i64(offset) if isinstance(offset, int) else offset, self.b.i8)

    def each_piece(self, nbytes, body: Callable[[ir.Value, ir.Value], None], half: int | None = None,
                   when: ir.Value | None = None) -> None:  # fmt: skip
        """``body(offset, length)`` for each of this unit's pieces of a range of ``nbytes`` (int or i64)
        bytes. The range is cut into C pieces of ``P = min(R, 16 x ceil(ceil(nbytes / 16) / U))`` bytes (R:
        one round of copy_bytes, ``mori_comm.copy_round_bytes``; the last piece may be short) and unit u
        owns pieces u, u + U, u + 2U, ... So at any moment the units of a PE work in one window of the
        range (one memory stream, as a copy's, not U streams far apart; measured: all_to_all 64 MiB 2 %
        faster than with U contiguous slices), a piece is whole rounds, and a range of at most U x R bytes
        is one piece per unit. ``half`` 0 or 1: only the first ceil(J / 2) or the last floor(J / 2) of the
        unit's J pieces (the own part's two halves, each in the order the peers read the same bytes; a
        unit of one piece copies it in the first: no round trip added after the wait). ``when``: only if
        it is true."""
        b, i32 = self.b, self.b.i32
        n = self.i64(nbytes) if isinstance(nbytes, int) else nbytes
        one = b.const_i32(1)

        def ceil_div(x, y):  # 32 bits: a 64-bit division is a long subroutine; counts are <= 2^30 (MAX_BYTES)
            return b.divui(b.addi(x, b.subi(y, one)), y)

        vectors = b.trunci(i32, b.shrui(b.addi(n, self.i64(VECTOR - 1)), self.i64(4)))
        units = b.trunci(i32, self.units)
        round_vectors = b.const_i32(mori_comm.copy_round_bytes(self.wave) // VECTOR)
        per = b.minui(b.maxui(ceil_div(vectors, units), one), round_vectors)
        count = ceil_div(vectors, per)
        first, end = b.trunci(i32, self.unit), count
        if half is not None:  # the unit's J pieces split after ceil(J / 2) (J = 1: all in the first half)
            mine = ceil_div(b.subi(b.maxui(count, first), first), units)
            split = b.addi(first, b.muli(b.shrui(b.addi(mine, one), one), units))
            first, end = (first, split) if half == 0 else (split, count)
        size = b.muli(b.extui(b.i64, per), self.i64(VECTOR))
        idx = b.index

        def loop():
            with b.for_(b.index_cast(idx, first), b.index_cast(idx, end), b.index_cast(idx, units)) as k:
                off = b.muli(b.index_cast(b.i64, k), size)
                body(off, b.minui(b.subi(n, off), size))

        with b.if_(when) if when is not None else nullcontext():  # (the cut outside: equal cuts are one)
            loop()

    def copy(self, dest: ir.Value, source: ir.Value, nbytes, half: int | None = None) -> None:
        """This unit's pieces (``each_piece``) of ``nbytes`` bytes (int or i64) from ``source`` to ``dest``
        (none when they are the same bytes: an in-place all_gather's or broadcast's own part)."""
        b = self.b

        def piece(off, length):
            mori_comm.copy_bytes(self.at(dest, off), self.at(source, off), length, **b.at())

        self.each_piece(nbytes, piece, half, when=b.icmp("ne", dest, source))

    def trace(self, event: str, phase: str) -> ir.Operation:
        """A trace point (``mori_comm.trace``; compiled out unless the compile option ``trace``)."""
        return mori_comm.trace(event, phase, **self.b.at())

    def stage_chunks(self) -> None:
        """Each chunk of the input into this PE's ``stage`` (chunk c at c * stride)."""
        for c, (offset, nbytes) in enumerate(self.spec.chunks()):
            if nbytes:
                self.copy(self.at(self.stage, c * self.spec.stage_stride), self.at(self.input, offset), nbytes)

    def readable_in_place(self) -> ir.Value:
        """i1: this PE's input may be read where it is (the module docstring's rule; uniform over the grid)."""
        b, s = self.b, self.spec
        in_bytes, out_bytes = self.i64(s.input_elems * s.elem_bytes), self.i64(s.output_elems * s.elem_bytes)
        other = b.remui(b.addi(self.me, b.const_i32(1)), b.const_i32(s.world_size))
        null = b.null()
        last = self.at(self.input, s.input_elems * s.elem_bytes - 1)
        in_heap = b.andi(b.icmp("ne", self.peer(self.input, other), null), b.icmp("ne", self.peer(last, other), null))
        i0, o0 = b.ptrtoint(b.i64, self.input), b.ptrtoint(b.i64, self.output)
        aligned = b.cmpi("eq", b.andi(i0, self.i64(VECTOR - 1)), self.i64(0))
        apart = b.ori(b.cmpi("ule", b.addi(i0, in_bytes), o0), b.cmpi("ule", b.addi(o0, out_bytes), i0))
        if s.op in ("all_gather", "broadcast"):  # in place: the input is this PE's part of the output
            part = b.muli(b.extui(b.i64, self.me), in_bytes) if s.op == "all_gather" else self.i64(0)
            apart = b.ori(apart, b.cmpi("eq", i0, b.addi(o0, part)))
        return b.andi(b.andi(in_heap, aligned), apart)

    def place_input(self) -> None:
        """Place: the input where it is, or staged (the module docstring's rule); thread 0 of the block
        stores the place's offset from the workspace into sources[b]. Traced "stage"."""
        b, s = self.b, self.spec
        self.trace("stage", "begin")
        staged = self.i64(s.stage_offset)
        if s.in_place_layout:
            direct = self.readable_in_place()
            with b.if_(b.xori(direct, b.const_i1(True))):
                self.stage_chunks()
            offset = b.select(direct, b.subi(b.ptrtoint(b.i64, self.input), b.ptrtoint(b.i64, self.slots)), staged)
        else:
            self.stage_chunks()
            offset = staged
        with b.if_(b.cmpi("eq", b.index_cast(b.i32, b.thread_id()), b.const_i32(0))):
            b.store(offset, self.my_source, alignment=8)
        self.trace("stage", "end")

    def _lane_pe(self) -> ir.Value:
        return self.b.remui(self.b.index_cast(self.b.i32, self.b.lane_id()), self.b.const_i32(self.spec.world_size))

    def _from_lanes(self, lane_address: Callable[[], ir.Value]) -> Callable[[ir.Value], ir.Value]:
        """``of(pe)``: lane ``pe``'s ``lane_address()`` in every lane (warp-uniform ``pe``), as two i32 halves
        (a shuffle moves 32 bits). ``lane_address`` is built where ``of`` is used (its few integer ops are
        loop-invariant: they are hoisted before the loop), so a load it adds to is waited for there, not
        where it was issued."""
        b = self.b

        def of(pe: ir.Value) -> ir.Value:
            mine = b.ptrtoint(b.i64, lane_address())
            halves = (b.trunci(b.i32, mine), b.trunci(b.i32, b.shrui(mine, self.i64(32))))
            width = b.const_i32(self.wave)
            lo, hi = (b.extui(b.i64, b.shuffle("idx", half, pe, width)[0]) for half in halves)
            return b.inttoptr(b.ptr, b.ori(b.shli(hi, self.i64(32)), lo))

        return of

    def peers_at(self, offset: int) -> Callable[[ir.Value], ir.Value]:
        """PE ``pe``'s workspace + ``offset`` (this PE's address of it), from lane ``pe``'s translation made at
        the kernel's start (``lane_workspace``): no translation where it is used."""
        return self._from_lanes(lambda: self.at(self.lane_workspace, offset))

    def _read_places(self) -> None:
        """After the first meet: lane l issues the load of PE (l mod W)'s sources[b] (the offset of its
        placed bytes from its workspace); ``source`` adds it to that PE's workspace address where used."""
        b = self.b
        offset = b.load(b.i64, self.at(self.lane_workspace, self.my_source_offset), alignment=8)
        self._source_of = self._from_lanes(lambda: self.at(self.lane_workspace, offset))

    def source(self, pe: ir.Value) -> ir.Value:
        """This PE's address of the bytes PE ``pe`` (warp-uniform) placed this call, its input or its stage
        (shuffled from the lane that computed it after the first meet: ``_read_places``)."""
        if self._source_of is None:
            raise GeneratorError(GENERATOR, "source() before the first meet: the places are read after it")
        return self._source_of(pe)

    def meet(self, overlap: Callable[[], None] | None = None, then: Callable[[], None] | None = None) -> None:
        """Block b meets block b of every PE (release before, acquire after). With ``overlap``, the meet in
        its two halves, barrier_arrive, ``overlap()``, barrier_wait: work on what no peer reads or writes
        (this PE's own part of the result) runs while the peers arrive; the arrive publishes only what came
        before it. ``then()`` runs after the meet (the first: after the loads of the peers' places are
        issued, before their values are used: more such work fills their round trip). Traced: "meet<k>"
        around the barrier (with its overlapped work), "step<k>" from the end of meet k - 1 to the start of
        meet k (the pulls or sums between)."""
        s, k, b = self.spec, self.meets, self.b
        if self.open_step is not None:
            self.trace(f"step{k}", "end")
        self.trace(f"meet{k}", "begin")
        if overlap is None:
            self.barrier(self.slots, self.epochs, world_size=s.world_size, max_blocks=s.max_blocks, **b.at())
        else:
            epoch = mori_comm.barrier_arrive(self.slots, self.epochs, world_size=s.world_size, max_blocks=s.max_blocks,
                                             scope=self.scope, **b.at())  # fmt: skip
            overlap()
            mori_comm.barrier_wait(self.slots, epoch, world_size=s.world_size, scope=self.scope, **b.at())
        self.trace(f"meet{k}", "end")
        self.meets = k + 1
        self.open_step = self.trace(f"step{k + 1}", "begin")
        if k == 0 and self.spec.op != "all_to_all_v":
            self._read_places()  # (the peers' addresses: the first work of step 1)
        if then is not None:
            then()

    def close(self) -> None:
        """The closing meet: no PE returns before every peer's block finished reading this call's places.
        With ``one_launch`` (every PE is a part of this one launch: virtual PEs) there is none: the launch ends
        only when every PE's every block has, and that orders the reads before anything that follows on the
        stream (the next call's placing, the user's next write to an input); the last step's trace ends."""
        if not self.one_launch:
            self.meet()
            return
        if self.open_step is not None:
            self.trace(f"step{self.meets}", "end")
            self.open_step = None

    def finish(self) -> None:
        """After the expansion: the step begun after the closing meet holds nothing; its trace point goes."""
        if self.open_step is not None:
            self.open_step.erase()
            self.open_step = None

    def peer(self, base: ir.Value, pe: ir.Value) -> ir.Value:
        """This PE's address of PE ``pe``'s copy of the symmetric ``base``."""
        return mori_shmem.ptr(base, pe, **self.b.at())

    def each_peer(self, body: Callable[[ir.Value], None]) -> None:
        """``body(pe)`` for the other PEs, pe = me + 1, me + 2, ... (mod W): the PEs' reads spread over the
        peers (this PE's own part is copied around the first meet: ``meet_copying_own_part``)."""
        b, w = self.b, self.spec.world_size
        with b.for_(b.const_index(1), b.const_index(w), b.const_index(1)) as i:
            body(b.remui(b.addi(self.me, b.index_cast(b.i32, i)), b.const_i32(w)))

    def meet_copying_own_part(self, dest: ir.Value, source: ir.Value, nbytes: int, when: ir.Value | None = None):
        """The movers' first meet, with this PE's own part of the result, ``nbytes`` of ``source`` (its own
        input, which no peer writes) into ``dest`` (output bytes no peer reads or writes), copied (``when``
        it is true) in two halves of its pieces (``each_piece``): the first inside the meet (it fills the
        wait for the peers), the second after the loads of the peers' places are issued (it fills their round
        trip). The pieces are the ones the peers' pulls of the same bytes use (all_gather, broadcast: a
        byte the peers read too is read by all in the same window, once from memory)."""
        b = self.b

        def part(half: int) -> Callable[[], None]:
            def copy() -> None:
                with b.if_(when) if when is not None else nullcontext():
                    self.copy(dest, source, nbytes, half)

            return copy

        self.meet(part(0), then=part(1))

    def reduce(self, dest: ir.Value, sources: list[ir.Value], nbytes: ir.Value) -> None:
        """This unit's pieces (``each_piece``) of ``dest = sum(sources)`` over ``nbytes`` bytes, in whole
        16-byte vectors (the last piece's tail reads the chunk's padding: the workspace keeps chunks
        16-byte strided)."""
        b = self.b

        def piece(off, length):
            padded = b.andi(b.addi(length, self.i64(VECTOR - 1)), self.i64(-VECTOR))
            elems = b.divui(padded, self.i64(self.spec.elem_bytes))
            mori_comm.accumulate_rows(self.at(dest, off), elems, [self.at(s, off) for s in sources],
                                      dtype=self.spec.dtype, **b.at())  # fmt: skip

        self.each_piece(nbytes, piece)

    def sources_at(self, offset) -> list[ir.Value]:
        """Every PE's address of its placed bytes + ``offset`` (PE order 0 .. W-1)."""
        return [self.at(self.source(self.b.const_i32(p)), offset) for p in range(self.spec.world_size)]

    def sum_into_output(self, offset) -> None:
        """reduce_scatter, one-shot all_reduce: this unit's pieces of ``output = sum of the W sources at
        offset``, straight into the output when its bytes are whole vectors (``sums_into_output``) and it is
        16-byte aligned (run time), else into ``reduced``, a block barrier (the lanes that copy are not the
        lanes that summed), and a copy into the output."""
        b, n = self.b, self.spec.output_elems * self.spec.elem_bytes
        sources = self.sources_at(offset)

        def via_reduced():
            self.reduce(self.reduced, sources, self.i64(n))
            b.barrier()
            self.copy(self.output, self.reduced, n)
            return []

        if not self.spec.sums_into_output:
            via_reduced()
            return
        def into_output():
            self.reduce(self.output, sources, self.i64(n))
            return []

        aligned = b.cmpi("eq", b.andi(b.ptrtoint(b.i64, self.output), self.i64(VECTOR - 1)), self.i64(0))
        b.if_else(aligned, [], into_output, via_reduced)


# ---- the collectives (each: its protocol, then its code) ------------------------------------------------


def _bytes(c: Collective) -> int:
    return c.spec.count * c.spec.elem_bytes


def _share(c: Collective, pe: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(offset, bytes) of PE ``pe``'s chunk of a two-shot all-reduce's input (the last ones may be short)."""
    b, n, cb = c.b, c.i64(_bytes(c)), c.i64(c.spec.stage_stride)
    off = b.minui(b.muli(b.extui(b.i64, pe), cb), n)
    return off, b.minui(b.subi(n, off), cb)


def _mine(c: Collective, nbytes: int) -> ir.Value:
    """``me * nbytes`` (i64): where this PE's part starts."""
    return c.b.muli(c.b.extui(c.b.i64, c.me), c.i64(nbytes))


def all_gather(c: Collective) -> None:
    """Place the input; meet (around it: this PE's own part, its input into ``out[me * n]``); pull every
    peer's placed bytes into ``out[p * n]``; close (then every place is free again)."""
    n, b = _bytes(c), c.b
    own = c.at(c.output, _mine(c, n))

    def pull(pe):
        c.copy(c.at(c.output, b.muli(b.extui(b.i64, pe), c.i64(n))), c.source(pe), n)

    c.place_input()
    c.meet_copying_own_part(own, c.input, n)
    c.each_peer(pull)
    c.close()


def broadcast(c: Collective) -> None:
    """The root places its input; meet (around it: the root copies its input into its own output); every
    other PE pulls the root's placed bytes into its output; close."""
    b, root, n = c.b, c.b.const_i32(c.spec.root), _bytes(c)
    is_root = b.cmpi("eq", c.me, root)
    with b.if_(is_root):
        c.place_input()

    c.meet_copying_own_part(c.output, c.input, n, when=is_root)
    with b.if_(b.xori(is_root, b.const_i1(True))):
        c.copy(c.output, c.source(root), n)
    c.close()


def all_to_all(c: Collective) -> None:
    """Place the input (chunk q, for PE q, at ``q * stride``); meet (around it: this PE's own chunk ``me``,
    ``in[me * n]`` into ``out[me * n]``); pull chunk ``me`` of every peer p into ``out[p * n]``; close."""
    n, b = _bytes(c), c.b
    mine = _mine(c, c.spec.stage_stride)

    def pull(pe):
        c.copy(c.at(c.output, b.muli(b.extui(b.i64, pe), c.i64(n))), c.at(c.source(pe), mine), n)

    c.place_input()
    c.meet_copying_own_part(c.at(c.output, _mine(c, n)), c.at(c.input, _mine(c, n)), n)
    c.each_peer(pull)
    c.close()


def reduce_scatter(c: Collective) -> None:
    """Place the input (chunk q at ``q * stride``); meet; sum chunk ``me`` of every PE into the output
    (fp32; through ``reduced`` unless whole aligned vectors); meet."""
    b = c.b
    c.place_input()
    c.meet()
    c.sum_into_output(b.muli(b.extui(b.i64, c.me), c.i64(c.spec.stage_stride)))
    c.close()


def all_reduce_one_shot(c: Collective) -> None:
    """Place the input; meet; sum every PE's whole input into the output (fp32; through ``reduced`` unless
    whole aligned vectors); meet. One round: the lowest latency, W x the bytes read per PE."""
    c.place_input()
    c.meet()
    c.sum_into_output(0)
    c.close()


def all_reduce_two_shot(c: Collective) -> None:
    """Reduce-scatter then all-gather: place the input (share q at ``q * stride``); meet; sum share ``me``
    of every PE into ``reduced``; meet (release: the sums; acquire: every PE's; overlapped: this PE's own
    share from its ``reduced`` into the output); pull share p from every peer p's ``reduced`` into the
    output; meet. Each PE reads 2 x the bytes once, not W x."""
    off, nbytes = _share(c, c.me)
    c.place_input()
    c.meet()
    c.reduce(c.reduced, c.sources_at(off), nbytes)

    c.meet(lambda: c.copy(c.at(c.output, off), c.reduced, nbytes))
    reduced_of = c.peers_at(c.spec.reduced_offset)

    def pull(pe):
        at, count = _share(c, pe)
        c.copy(c.at(c.output, at), reduced_of(pe), count)

    c.each_peer(pull)
    c.close()


def all_to_all_v(c: Collective) -> None:
    """Variable sizes. Block b publishes this PE's splits (clamped to [0, count]) in its ``sizes[b]`` while each
    unit stages chunk q (``splits[q]`` elements, packed in the input) at ``q * stride``; meet (block b's
    release covers both); each unit walks p = 0 .. W-1, reads PE p's ``sizes[b][me]`` (acquired by the meet)
    and pulls that many elements of chunk ``me`` of PE p's stage to the running output offset; unit 0
    stores the received counts; meet. Stager and puller cut chunk q from the same count: the same pieces."""
    s, b = c.spec, c.b
    es, w, cap = c.i64(s.elem_bytes), s.world_size, c.i64(s.count)
    splits, recv = c.splits
    sizes = c.at(c.slots, s.sizes_offset)
    row = b.muli(b.index_cast(b.i64, b.block_id()), c.i64(w))  # this block's sizes[b]
    tid = b.index_cast(b.i32, b.thread_id())
    def split(q):  # splits[q] clamped to [0, count] (signed: a negative split sends nothing)
        n = b.load(b.i32, b.gep(splits, q, b.i32))
        return b.minui(b.extui(b.i64, b.select(b.cmpi("slt", n, b.const_i32(0)), b.const_i32(0), n)), cap)

    with b.if_(b.cmpi("ult", tid, b.const_i32(w))):
        b.store(split(tid), b.gep(sizes, b.addi(row, b.extui(b.i64, tid)), b.i64))

    def stage(q, at):
        n = split(q)
        c.copy(c.at(c.stage, b.muli(b.extui(b.i64, q), c.i64(s.stage_stride))), c.at(c.input, b.muli(at, es)),
               b.muli(n, es))  # fmt: skip
        return b.addi(at, n)

    def pull(p, at):
        n = b.load(b.i64, b.gep(c.peer(sizes, p), b.addi(row, b.extui(b.i64, c.me)), b.i64))
        source = c.at(c.peer(c.stage, p), b.muli(b.extui(b.i64, c.me), c.i64(s.stage_stride)))
        c.copy(c.at(c.output, b.muli(at, es)), source, b.muli(n, es))
        with b.if_(b.cmpi("eq", b.addi(c.unit, b.index_cast(b.i64, b.lane_id())), c.i64(0))):
            b.store(b.trunci(b.i32, n), b.gep(recv, p, b.i32))
        return b.addi(at, n)

    def each_pe(body):
        lo, hi, one = b.const_i32(0), b.const_i32(w), b.const_i32(1)
        b.for_iter(lo, hi, one, [c.i64(0)], lambda q, at: [body(q, at)])

    each_pe(stage)
    c.meet()
    each_pe(pull)
    c.close()


# (op, algorithm) -> its expansion.
EXPANSIONS: dict[tuple[str, str], Callable[[Collective], None]] = {
    ("all_gather", ""): all_gather,
    ("broadcast", ""): broadcast,
    ("all_to_all", ""): all_to_all,
    ("all_to_all_v", ""): all_to_all_v,
    ("reduce_scatter", ""): reduce_scatter,
    ("all_reduce", "one_shot"): all_reduce_one_shot,
    ("all_reduce", "two_shot"): all_reduce_two_shot,
}
