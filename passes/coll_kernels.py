"""The expansions of the ``mori_coll`` ops (dialects/mori_coll.py): each collective built in place, before
its op, from ``Builder`` and the mori_comm blocks ``copy_bytes``, ``device_barrier`` and
``accumulate_rows``. Sizes and the workspace layout: dialects/mori_coll_schema.py. docs/collectives.md has
the protocols with a figure per collective; each generator below states its own.

Shared protocol (every collective is one or more rounds of it):

* **Units and slices.** Warp w of block b is unit ``u = b * warps + w`` of ``U = blocks * warps``. Every
  byte range the collective moves (a chunk of ``c`` bytes) is cut the same way on every PE: unit u owns
  ``[u * S, u * S + S)`` with ``S = round_up(ceil(c / U), 16)``. So the bytes block b writes on one PE are
  exactly the bytes block b reads on every other PE, and a per-block ``device_barrier`` (block b meets
  block b of every PE) orders them: no grid barrier is needed. Every PE launches the same grid.
* **Stage** (who writes: each unit its slices; scope: this PE's workspace): ``copy_bytes`` from the
  user's input into this PE's ``stage`` (chunk c at ``c * stride``), plain stores.
* **Meet** (``device_barrier``, every thread of the block): thread p < W fences (release, system scope:
  the block's staging stores, ordered before by the block barrier) and stores the block's new epoch into
  PE p's slot; polls its own slot of PE p until it reaches the epoch; fences (acquire); the block meets.
  After it, every PE's staged slices of this block are visible to this block.
* **Pull / reduce** (each unit its slices): ``copy_bytes`` from a peer's ``stage`` (its address from
  ``mori_shmem.ptr``) into the user's output, or ``accumulate_rows`` of the W peers' slices (fp32 sums,
  rounded once) into this PE's ``reduced``, then (after a ``gpu.barrier``: the lanes that copy are not the
  lanes that summed) ``copy_bytes`` into the output.
* **Release the workspace** (a final ``device_barrier``): no PE stages the next call's input into its
  ``stage`` (or overwrites ``reduced``) before every peer's block finished reading this call's. With it,
  calls follow each other on the stream with no host sync: the epochs live on the device and only grow
  (graph replay is correct; nothing is reset).
"""

from __future__ import annotations

from collections.abc import Callable

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import Builder
from mori_compiler.dialects.mori_coll_schema import VECTOR, CollSpec

GENERATOR = "coll_kernels"


class Collective:
    """The values and steps a collective's expansion shares, built before its op with ``b``."""

    def __init__(self, b: Builder, spec: CollSpec, input_: ir.Value, output: ir.Value, workspace: ir.Value,
                 *splits: ir.Value, wave: int):  # fmt: skip
        self.b, self.spec = b, spec
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

    def slice(self, nbytes: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(offset, length) of this unit's slice of a range of ``nbytes`` (i64) bytes (length 0: none)."""
        b = self.b
        per = b.divui(b.addi(nbytes, b.subi(self.units, self.i64(1))), self.units)
        size = b.andi(b.addi(per, self.i64(VECTOR - 1)), self.i64(-VECTOR))
        off = b.minui(b.muli(self.unit, size), nbytes)
        return off, b.minui(b.subi(nbytes, off), size)

    def copy(self, dest: ir.Value, source: ir.Value, nbytes) -> None:
        """This unit's slice of ``nbytes`` bytes (int or i64) from ``source`` to ``dest``."""
        off, length = self.slice(self.i64(nbytes) if isinstance(nbytes, int) else nbytes)
        mori_comm.copy_bytes(self.at(dest, off), self.at(source, off), length, **self.b.at())

    def trace(self, event: str, phase: str) -> ir.Operation:
        """A trace point (``mori_comm.trace``; compiled out unless the compile option ``trace``)."""
        return mori_comm.trace(event, phase, **self.b.at())

    def stage_chunks(self) -> None:
        """Stage: each chunk of the input into this PE's ``stage`` (chunk c at c * stride); traced "stage"."""
        self.trace("stage", "begin")
        for c, (offset, nbytes) in enumerate(self.spec.chunks()):
            if nbytes:
                self.copy(self.at(self.stage, c * self.spec.stage_stride), self.at(self.input, offset), nbytes)
        self.trace("stage", "end")

    def meet(self) -> None:
        """Block b meets block b of every PE (release before, acquire after). Traced: "meet<k>" around the
        barrier, "step<k>" from the end of meet k - 1 to the start of meet k (the pulls or sums between)."""
        s, k = self.spec, self.meets
        if self.open_step is not None:
            self.trace(f"step{k}", "end")
        self.trace(f"meet{k}", "begin")
        mori_comm.device_barrier(self.slots, self.epochs, world_size=s.world_size, max_blocks=s.max_blocks, **self.b.at())
        self.trace(f"meet{k}", "end")
        self.meets = k + 1
        self.open_step = self.trace(f"step{k + 1}", "begin")

    def finish(self) -> None:
        """After the expansion: the step begun after the closing meet holds nothing; its trace point goes."""
        if self.open_step is not None:
            self.open_step.erase()
            self.open_step = None

    def peer(self, base: ir.Value, pe: ir.Value) -> ir.Value:
        """This PE's address of PE ``pe``'s copy of the symmetric ``base``."""
        return mori_shmem.ptr(base, pe, **self.b.at())

    def each_peer(self, body: Callable[[ir.Value], None]) -> None:
        """``body(pe)`` for pe = me + 1, me + 2, ... (mod W), me last: the PEs' reads spread over the peers."""
        b, w = self.b, self.spec.world_size
        with b.for_(b.const_index(1), b.const_index(w + 1), b.const_index(1)) as i:
            body(b.remui(b.addi(self.me, b.index_cast(b.i32, i)), b.const_i32(w)))

    def reduce(self, dest: ir.Value, sources: list[ir.Value], nbytes: ir.Value) -> None:
        """This unit's slice of ``dest = sum(sources)`` over ``nbytes`` bytes, in whole 16-byte vectors (the
        last slice's tail reads the chunk's padding: the workspace keeps chunks 16-byte strided)."""
        b = self.b
        off, length = self.slice(nbytes)
        padded = b.andi(b.addi(length, self.i64(VECTOR - 1)), self.i64(-VECTOR))
        elems = b.divui(padded, self.i64(self.spec.elem_bytes))
        with b.if_(b.cmpi("ugt", length, self.i64(0))):
            mori_comm.accumulate_rows(self.at(dest, off), elems, [self.at(s, off) for s in sources],
                                      dtype=self.spec.dtype, **b.at())  # fmt: skip

    def peers_at(self, base: ir.Value, offset) -> list[ir.Value]:
        """Every PE's address of ``base + offset`` (PE order 0 .. W-1)."""
        return [self.at(self.peer(base, self.b.const_i32(p)), offset) for p in range(self.spec.world_size)]


# ---- the collectives (each: its protocol, then its code) ------------------------------------------------


def _bytes(c: Collective) -> int:
    return c.spec.count * c.spec.elem_bytes


def _share(c: Collective, pe: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(offset, bytes) of PE ``pe``'s chunk of a two-shot all-reduce's input (the last ones may be short)."""
    b, n, cb = c.b, c.i64(_bytes(c)), c.i64(c.spec.stage_stride)
    off = b.minui(b.muli(b.extui(b.i64, pe), cb), n)
    return off, b.minui(b.subi(n, off), cb)


def all_gather(c: Collective) -> None:
    """Stage the input; meet; pull every PE's stage into ``out[p * n]``; meet (the stage is free again)."""
    n, b = _bytes(c), c.b

    def pull(pe):
        c.copy(c.at(c.output, b.muli(b.extui(b.i64, pe), c.i64(n))), c.peer(c.stage, pe), n)

    c.stage_chunks()
    c.meet()
    c.each_peer(pull)
    c.meet()


def broadcast(c: Collective) -> None:
    """The root stages its input; meet; every PE pulls the root's stage into its output; meet."""
    b, root = c.b, c.b.const_i32(c.spec.root)
    with b.if_(b.cmpi("eq", c.me, root)):
        c.stage_chunks()
    c.meet()
    c.copy(c.output, c.peer(c.stage, root), _bytes(c))
    c.meet()


def all_to_all(c: Collective) -> None:
    """Stage chunk q (for PE q) at ``q * stride``; meet; pull chunk ``me`` of every PE p into ``out[p * n]``;
    meet."""
    n, b = _bytes(c), c.b
    mine = b.muli(b.extui(b.i64, c.me), c.i64(c.spec.stage_stride))

    def pull(pe):
        c.copy(c.at(c.output, b.muli(b.extui(b.i64, pe), c.i64(n))), c.at(c.peer(c.stage, pe), mine), n)

    c.stage_chunks()
    c.meet()
    c.each_peer(pull)
    c.meet()


def reduce_scatter(c: Collective) -> None:
    """Stage chunk q at ``q * stride``; meet; sum chunk ``me`` of every PE into ``reduced`` (fp32); block
    barrier (lanes hand the sums over); copy ``reduced`` to the output; meet."""
    n, b = _bytes(c), c.b
    mine = b.muli(b.extui(b.i64, c.me), c.i64(c.spec.stage_stride))
    c.stage_chunks()
    c.meet()
    c.reduce(c.reduced, c.peers_at(c.stage, mine), c.i64(n))
    b.barrier()
    c.copy(c.output, c.reduced, n)
    c.meet()


def all_reduce_one_shot(c: Collective) -> None:
    """Stage the input; meet; sum every PE's whole stage into ``reduced`` (fp32); block barrier; copy
    ``reduced`` to the output; meet. One round: the lowest latency, W x the bytes read per PE."""
    n = _bytes(c)
    c.stage_chunks()
    c.meet()
    c.reduce(c.reduced, c.peers_at(c.stage, 0), c.i64(n))
    c.b.barrier()
    c.copy(c.output, c.reduced, n)
    c.meet()


def all_reduce_two_shot(c: Collective) -> None:
    """Reduce-scatter then all-gather: stage the input (share q at ``q * stride``); meet; sum share ``me``
    of every PE into ``reduced``; meet (release: the sums; acquire: every PE's); pull share p from PE p's
    ``reduced`` into the output; meet. Each PE reads 2 x the bytes once, not W x."""
    off, nbytes = _share(c, c.me)
    c.stage_chunks()
    c.meet()
    c.reduce(c.reduced, c.peers_at(c.stage, off), nbytes)
    c.meet()

    def pull(pe):
        at, count = _share(c, pe)
        c.copy(c.at(c.output, at), c.peer(c.reduced, pe), count)

    c.each_peer(pull)
    c.meet()


def all_to_all_v(c: Collective) -> None:
    """Variable sizes. Block b publishes this PE's splits (clamped to [0, count]) in its ``sizes[b]`` while each
    unit stages chunk q (``splits[q]`` elements, packed in the input) at ``q * stride``; meet (block b's
    release covers both); each unit walks p = 0 .. W-1, reads PE p's ``sizes[b][me]`` (acquired by the meet)
    and pulls that many elements of chunk ``me`` of PE p's stage to the running output offset; unit 0
    stores the received counts; meet. Stager and puller cut chunk q from the same count: the same slices."""
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
    c.meet()


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
