"""Copy engines against compute on an NVIDIA GPU (issue 15): which copy mechanism overlaps a matmul?

AsyncLL splits send and receive so that compute can run in between, but its payload moves by SM stores, which
leave the SMs nothing to hide (overlap gain 1.01x measured on the H200). This probe measures, in one run on
one GPU (and GPU0 -> GPU1 when torch sees two), each way of moving bytes that could become a copy-engine
lowering of the AsyncLL send, against a 4096^3 bf16 torch matmul:

* ``torch_copy``: ``Tensor.copy_`` (cudaMemcpyAsync D2D) on a side stream, one call per copy;
* ``memcpy_async``: ``cuMemcpyAsync`` per copy; ``@low/high``: the copy on a lowest-priority stream and the
  matmul on a highest-priority one;
* ``with_attrs``: ``cuMemcpyWithAttributesAsync`` per copy with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
* ``batch[flag,order]``: one ``cuMemcpyBatchAsync`` for the whole list, flags DEFAULT or
  PREFER_OVERLAP_WITH_COMPUTE, srcAccessOrder STREAM or ANY;
* ``cu_index_copy``: the SM reference: ``index_copy_`` of the gathered rows (what CU stores cost);
* ``sm_lsu_copy[N]`` / ``sm_tma_copy[N]``: small PTX kernels of N CTAs that walk a device-resident (dst, src,
  bytes) list, with 16-byte loads and stores or with Hopper bulk copies (TMA) staged through shared memory: the
  shape of a device-routed lowering that takes only a few SMs (they run last: a fault there cannot spoil the
  rest).

Cases: plain contiguous copies of 128, 1024 and 8192 rows of 14 KiB (1.75, 14 and 112 MiB), and three
AsyncLL-shaped lists for 8 virtual PEs x 128 tokens, top-8 of 256 experts (5.33 destination PEs a token):
``rows`` (one copy per (token, destination): 5456 copies of 14 KiB into per-source receive regions),
``runs`` (the same bytes as W*W contiguous per-(source, destination) runs, i.e. packed staging), ``block``
(each PE's whole [128, H] block to every PE: W*W copies whose addresses the host knows without the routing).

For each (case, mechanism): the copy alone (on its side stream), the matmul alone, both started together
(a sleep kernel holds the GPU while the host enqueues both, so host enqueue time is not measured; both run
after one start event; the end event waits for both streams), medians of --reps; overlap gain =
(t_copy + t_mm) / t_both; ``mm x``: the matmul's own time in the concurrent run over its time alone. Every
copy is checked: the destination is poisoned, copied, compared with the source (alone and concurrent); a
mechanism that did not copy is reported as wrong, never timed. For the AsyncLL cases, ``proj`` is the gain
bound of an AsyncLL whose send is that mechanism: (t_copy + t_mm + t_recv) / (t_both + t_recv), t_recv the
receive phase's second copy of every row (a gather of the received rows into ``out``, measured here). A
mechanism that fails prints the driver's error and the run goes on. The batch API's invalid-value causes are
probed first (zero-initialised attributes, the legacy NULL stream, bad attribute indices, unknown flags).
srcAccessOrder ANY lets the driver read the source before the stream reaches the copy, so the ``batch[...,any]``
rows may start before the start event: their times are lower bounds.

    python bench/copy_engine_overlap.py --json copy_engine_overlap.json

Needs torch with CUDA and cuda-bindings (>= 12.8 for the batch API); the whole run takes ~1-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HIDDEN, TOPK, EXPERTS = 7168, 8, 256  # as bench/ep_bench.py
ROW_BYTES = HIDDEN * 2  # one bf16 token row: 14 KiB
POISON = 0xA5
SIZES_ROWS = (128, 1024, 8192)
PER_CALL_LIMIT = 6000  # copies a per-copy host loop may issue in one enqueue


# ---- copy lists (pure) -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Copy:
    """One copy: byte offsets from the destination / source buffer bases, and its size."""

    dst: int
    src: int
    nbytes: int


@dataclass(frozen=True)
class Case:
    name: str
    copies: tuple[Copy, ...]
    recv_rows: int = 0  # AsyncLL cases: rows the receive phase copies a second time (0: not AsyncLL)
    recv_src_rows: tuple[int, ...] = ()  # landing-buffer rows the receive phase gathers, in output order

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.copies)

    @property
    def span(self) -> tuple[int, int]:
        """Bytes the (destination, source) buffers must have."""
        return (max((c.dst + c.nbytes for c in self.copies), default=0),
                max((c.src + c.nbytes for c in self.copies), default=0))  # fmt: skip


def plain_case(rows: int, row_bytes: int = ROW_BYTES) -> Case:
    n = rows * row_bytes
    return Case(f"copy {n / 2**20:.2f} MiB", (Copy(0, 0, n),))


def asyncll_routing(world: int, tokens: int, experts: int = EXPERTS, top_k: int = TOPK,
                    seed: int = 0) -> list[list[list[int]]]:  # fmt: skip
    """routing[s][t]: the sorted distinct destination PEs of token t of PE s (top_k distinct random experts,
    experts // world per PE), as the EP benches route."""
    if experts % world:
        raise ValueError(f"{experts} experts do not split evenly over {world} PEs")
    per_pe, rng = experts // world, random.Random(seed)
    return [[sorted({e // per_pe for e in rng.sample(range(experts), top_k)}) for _ in range(tokens)]
            for _ in range(world)]  # fmt: skip


def _landing_row(world: int, tokens: int, dst: int, src: int, slot: int) -> int:
    """Row of the landing buffer [dst PE][src PE][slot] (per-source receive regions of ``tokens`` rows)."""
    return (dst * world + src) * tokens + slot


def _slots(routing) -> list[list[list[tuple[int, int]]]]:
    """by_pair[s][d]: (token, slot) of every token of s routed to d, in token order (the sender's slots)."""
    world = len(routing)
    by_pair = [[[] for _ in range(world)] for _ in range(world)]
    for s, toks in enumerate(routing):
        for t, dests in enumerate(toks):
            for d in dests:
                by_pair[s][d].append((t, len(by_pair[s][d])))
    return by_pair


def _recv_order(routing, landing_row) -> tuple[int, ...]:
    """Landing rows each destination gathers into ``out``, destinations one after another, within one
    grouped by source in PE order, within a source in slot order (AsyncLL's output order)."""
    world, by_pair = len(routing), _slots(routing)
    return tuple(landing_row(d, s, t, slot) for d in range(world) for s in range(world)
                 for t, slot in by_pair[s][d])  # fmt: skip


def asyncll_rows_case(routing, row_bytes: int = ROW_BYTES) -> Case:
    """One copy per (token, destination): source row (s, t) into landing [d][s][slot]."""
    world, tokens, by_pair = len(routing), len(routing[0]), _slots(routing)
    copies = tuple(Copy(_landing_row(world, tokens, d, s, slot) * row_bytes, (s * tokens + t) * row_bytes, row_bytes)
                   for s in range(world) for d in range(world) for t, slot in by_pair[s][d])  # fmt: skip
    recv = _recv_order(routing, lambda d, s, t, slot: _landing_row(world, tokens, d, s, slot))
    return Case(f"asyncll rows ({len(copies)} x 14 KiB)", copies, len(recv), recv)


def asyncll_runs_case(routing, row_bytes: int = ROW_BYTES) -> Case:
    """The same bytes as W*W contiguous runs: staging [s][d][0:count] (packed by the sender) into landing
    [d][s][0:count]."""
    world, tokens, by_pair = len(routing), len(routing[0]), _slots(routing)
    copies = tuple(Copy(_landing_row(world, tokens, d, s, 0) * row_bytes, (s * world + d) * tokens * row_bytes,
                        len(by_pair[s][d]) * row_bytes)
                   for s in range(world) for d in range(world) if by_pair[s][d])  # fmt: skip
    recv = _recv_order(routing, lambda d, s, t, slot: _landing_row(world, tokens, d, s, slot))
    return Case(f"asyncll runs ({len(copies)} runs)", copies, len(recv), recv)


def asyncll_block_case(routing, row_bytes: int = ROW_BYTES) -> Case:
    """Routing-free: every PE's whole token block [tokens, H] to every PE, landing [d][s][0:tokens]; the
    receiver then selects its rows (token t of s at landing [d][s][t])."""
    world, tokens = len(routing), len(routing[0])
    copies = tuple(Copy(_landing_row(world, tokens, d, s, 0) * row_bytes, s * tokens * row_bytes, tokens * row_bytes)
                   for s in range(world) for d in range(world))  # fmt: skip
    recv = _recv_order(routing, lambda d, s, t, slot: _landing_row(world, tokens, d, s, t))
    return Case(f"asyncll block ({len(copies)} x {tokens} rows)", copies, len(recv), recv)


def split_copies(copies: Sequence[Copy], max_bytes: int) -> list[Copy]:
    """Each copy cut into pieces of at most ``max_bytes`` (so that a grid of CTAs shares one big copy)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    out = []
    for c in copies:
        for off in range(0, c.nbytes, max_bytes):
            out.append(Copy(c.dst + off, c.src + off, min(max_bytes, c.nbytes - off)))
    return out


def row_indices(copies: Sequence[Copy], row_bytes: int) -> tuple[list[int], list[int]] | None:
    """(source rows, destination rows) that the copies move, when every copy is whole rows; else None."""
    src_rows, dst_rows = [], []
    for c in copies:
        if c.dst % row_bytes or c.src % row_bytes or c.nbytes % row_bytes:
            return None
        n = c.nbytes // row_bytes
        src_rows.extend(range(c.src // row_bytes, c.src // row_bytes + n))
        dst_rows.extend(range(c.dst // row_bytes, c.dst // row_bytes + n))
    return src_rows, dst_rows


def descriptor_bytes(copies: Sequence[Copy], dst_base: int, src_base: int) -> bytes:
    """The device descriptor list of the copy kernels: per copy three little-endian u64 (dst, src, bytes)."""
    return b"".join(struct.pack("<QQQ", dst_base + c.dst, src_base + c.src, c.nbytes) for c in copies)


# ---- driver arguments (pure over a bindings module) -----------------------------------------------------
def memcpy_attributes(cu, *, order: str, overlap: bool, src_device: int, dst_device: int):
    """A CUmemcpyAttributes: srcAccessOrder ``order`` (STREAM / DURING_API_CALL / ANY / INVALID), the
    prefer-overlap flag or none, device location hints (ignored for device memory, set for clarity)."""
    attr = cu.CUmemcpyAttributes()
    attr.srcAccessOrder = getattr(cu.CUmemcpySrcAccessOrder, f"CU_MEMCPY_SRC_ACCESS_ORDER_{order}")
    for name, device in (("srcLocHint", src_device), ("dstLocHint", dst_device)):
        loc = cu.CUmemLocation()
        loc.type, loc.id = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, device
        setattr(attr, name, loc)
    flag = "CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE" if overlap else "CU_MEMCPY_FLAG_DEFAULT"
    attr.flags = int(getattr(cu.CUmemcpyFlags, flag))
    return attr


def batch_arguments(cu, copies: Sequence[Copy], dst_base: int, src_base: int, attr) -> tuple:
    """cuMemcpyBatchAsync's arguments but the stream, one attribute for all copies (cuda-bindings 13:
    dsts, srcs as lists of CUdeviceptr; sizes; count; attrs; attrsIdxs (first entry 0); numAttrs)."""
    if not copies:
        raise ValueError("an empty batch")
    dsts = [cu.CUdeviceptr(dst_base + c.dst) for c in copies]
    srcs = [cu.CUdeviceptr(src_base + c.src) for c in copies]
    return dsts, srcs, [c.nbytes for c in copies], len(copies), [attr], [0], 1


# ---- results (pure) ---------------------------------------------------------------------------------
def overlap_gain(t_copy: float, t_mm: float, t_both: float) -> float:
    """(t_copy + t_mm) / t_both: 1 = no overlap, up to (t_copy + t_mm) / max(t_copy, t_mm) = perfect."""
    if t_both <= 0:
        raise ValueError(f"t_both must be positive, got {t_both}")
    return (t_copy + t_mm) / t_both


def projected_gain(t_copy: float, t_mm: float, t_both: float, t_recv: float) -> float:
    """The gain of send; matmul; recv over apart when the receive phase (t_recv, not hidden) follows."""
    return overlap_gain(t_copy + t_recv, t_mm, t_both + t_recv)


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("no samples")
    return statistics.median(xs)


@dataclass
class Result:
    case: str
    mechanism: str
    copies: int
    nbytes: int
    status: str = "ok"
    t_copy_us: float | None = None
    t_mm_us: float | None = None
    t_both_us: float | None = None
    t_mm_in_both_us: float | None = None
    t_copy_in_both_us: float | None = None
    host_enqueue_us: float | None = None
    t_recv_us: float | None = None
    gate_late: int = 0  # concurrent reps whose start fired before the host had enqueued both
    extra: dict = field(default_factory=dict)

    @property
    def gain(self) -> float | None:
        if None in (self.t_copy_us, self.t_mm_us, self.t_both_us):
            return None
        return overlap_gain(self.t_copy_us, self.t_mm_us, self.t_both_us)

    @property
    def mm_slowdown(self) -> float | None:
        if None in (self.t_mm_in_both_us, self.t_mm_us):
            return None
        return self.t_mm_in_both_us / self.t_mm_us

    @property
    def projected(self) -> float | None:
        if self.gain is None or self.t_recv_us is None:
            return None
        return projected_gain(self.t_copy_us, self.t_mm_us, self.t_both_us, self.t_recv_us)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"} | self.extra
        return d | {"gain": self.gain, "mm_slowdown": self.mm_slowdown, "projected_gain": self.projected,
                    "copy_GBps": None if not self.t_copy_us else self.nbytes / self.t_copy_us / 1e3}  # fmt: skip


COLUMNS = (("case", 30, "case"), ("mechanism", 36, "mechanism"), ("copies", 6, "copies"), ("MiB", 7, "MiB"),
           ("copy us", 8, "t_copy_us"), ("GB/s", 6, "copy_GBps"), ("mm us", 7, "t_mm_us"),
           ("both us", 8, "t_both_us"), ("gain", 5, "gain"), ("mm x", 5, "mm_slowdown"),
           ("proj", 5, "projected_gain"), ("enq us", 7, "host_enqueue_us"), ("status", 0, "status"))  # fmt: skip


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "MiB":
        return f"{value:.2f}"
    if isinstance(value, float):
        return f"{value:.2f}" if key in ("gain", "mm_slowdown", "projected_gain") else f"{value:.1f}"
    return str(value)


def format_table(results: Sequence[Result]) -> str:
    """One line per result, fixed-width columns; '-' where a value is missing."""
    lines = [" ".join(f"{title:<{w}}" if w else title for title, w, _ in COLUMNS)]
    for r in results:
        d = r.as_dict() | {"MiB": r.nbytes / 2**20}
        cells = [f"{_cell(key, d.get(key)):<{w}}" if w else _cell(key, d.get(key)) for _, w, key in COLUMNS]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def summary(results: Sequence[Result]) -> list[str]:
    """Per case, the measured mechanism of the highest overlap gain (and of the highest projected AsyncLL
    gain where there is one)."""
    lines, cases = [], list(dict.fromkeys(r.case for r in results))
    for case in cases:
        timed = [r for r in results if r.case == case and r.gain is not None and r.status.startswith("ok")]
        if not timed:
            lines.append(f"{case}: nothing measured")
            continue
        best = max(timed, key=lambda r: r.gain)
        line = f"{case}: best gain {best.gain:.2f}x by {best.mechanism} (mm x{best.mm_slowdown:.2f})"
        projected = [r for r in timed if r.projected is not None]
        if projected:
            bp = max(projected, key=lambda r: r.projected)
            line += f"; best projected AsyncLL gain {bp.projected:.2f}x by {bp.mechanism} (recv {bp.t_recv_us:.0f} us)"
        lines.append(line)
    return lines


def report_json(meta: dict, results: Sequence[Result], probes: Sequence[dict]) -> str:
    return json.dumps({"meta": meta, "probes": list(probes), "results": [r.as_dict() for r in results]}, indent=1)


# ---- the GPU part -------------------------------------------------------------------------------------
class Unsupported(Exception):
    """The mechanism cannot run here (driver error, missing API, too many copies): the reason is its text."""


LSU_COPY_PTX = r"""
.version 8.0
.target sm_90
.address_size 64

// lsu_copy(desc, count): desc holds count (dst, src, nbytes) u64 triples; block b copies entries b, b +
// nctaid, ...; its threads stride over an entry in 16-byte vectors, four loads in flight before the stores.
.visible .entry lsu_copy(.param .u64 desc, .param .u32 count)
{
    .reg .pred %p<4>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<32>;

    ld.param.u64 %rd1, [desc];
    ld.param.u32 %r1, [count];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %nctaid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %ntid.x;
    cvt.u64.u32 %rd9, %r5;
    shl.b64 %rd13, %rd9, 4;
    shl.b64 %rd21, %rd9, 2;
ENTRY:
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd2, %r2, 24;
    add.u64 %rd3, %rd1, %rd2;
    ld.global.u64 %rd4, [%rd3];
    ld.global.u64 %rd5, [%rd3+8];
    ld.global.u64 %rd6, [%rd3+16];
    cvta.to.global.u64 %rd4, %rd4;
    cvta.to.global.u64 %rd5, %rd5;
    shr.u64 %rd7, %rd6, 4;
    cvt.u64.u32 %rd8, %r4;
QUAD:
    mad.lo.u64 %rd14, %rd9, 3, %rd8;
    setp.ge.u64 %p3, %rd14, %rd7;
    @%p3 bra SINGLE;
    shl.b64 %rd10, %rd8, 4;
    add.u64 %rd11, %rd5, %rd10;
    add.u64 %rd15, %rd11, %rd13;
    add.u64 %rd16, %rd15, %rd13;
    add.u64 %rd17, %rd16, %rd13;
    add.u64 %rd12, %rd4, %rd10;
    add.u64 %rd18, %rd12, %rd13;
    add.u64 %rd19, %rd18, %rd13;
    add.u64 %rd20, %rd19, %rd13;
    ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd11];
    ld.global.nc.v4.u32 {%r10, %r11, %r12, %r13}, [%rd15];
    ld.global.nc.v4.u32 {%r14, %r15, %r16, %r17}, [%rd16];
    ld.global.nc.v4.u32 {%r18, %r19, %r20, %r21}, [%rd17];
    st.global.v4.u32 [%rd12], {%r6, %r7, %r8, %r9};
    st.global.v4.u32 [%rd18], {%r10, %r11, %r12, %r13};
    st.global.v4.u32 [%rd19], {%r14, %r15, %r16, %r17};
    st.global.v4.u32 [%rd20], {%r18, %r19, %r20, %r21};
    add.u64 %rd8, %rd8, %rd21;
    bra QUAD;
SINGLE:
    setp.ge.u64 %p2, %rd8, %rd7;
    @%p2 bra NEXT;
    shl.b64 %rd10, %rd8, 4;
    add.u64 %rd11, %rd5, %rd10;
    add.u64 %rd12, %rd4, %rd10;
    ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd11];
    st.global.v4.u32 [%rd12], {%r6, %r7, %r8, %r9};
    add.u64 %rd8, %rd8, %rd9;
    bra SINGLE;
NEXT:
    add.u32 %r2, %r2, %r3;
    bra ENTRY;
DONE:
    ret;
}
"""

TMA_PIECE = 16 << 10  # bytes of one bulk copy and of one of the two shared-memory stages


def _tma_piece(j: str) -> str:
    """PTX: the descriptor of piece ``j``: %rd11 its destination, %rd12 its source (global), %r20 its size."""
    return f"""    mul.wide.u32 %rd9, {j}, 24;
    add.u64 %rd10, %rd1, %rd9;
    ld.global.u64 %rd11, [%rd10];
    ld.global.u64 %rd12, [%rd10+8];
    ld.global.u32 %r20, [%rd10+16];
    cvta.to.global.u64 %rd11, %rd11;
    cvta.to.global.u64 %rd12, %rd12;
"""


def _tma_load(j: str, stage: str) -> str:
    """PTX: the bulk load of piece ``j`` into shared stage ``stage``, completing on that stage's mbarrier."""
    return _tma_piece(j) + f"""    mad.lo.u32 %r21, {stage}, {TMA_PIECE}, %r5;
    mad.lo.u32 %r22, {stage}, 8, %r6;
    mbarrier.arrive.expect_tx.shared::cta.b64 %rd13, [%r22], %r20;
    cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r21], [%rd12], %r20, [%r22];
"""


# tma_copy(desc, count): thread 0 of block b moves pieces b, b + nctaid, ... (each <= TMA_PIECE bytes) with
# Hopper bulk copies, global -> shared (completion on the stage's mbarrier, expect_tx) -> global (bulk group),
# two stages: piece k + 1 loads while piece k is waited for and stored; a stage is reused only once the store
# that read it has read it (wait_group.read 0). A wait that never completes traps after ~4M polls (no hang).
TMA_COPY_PTX = f"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry tma_copy(.param .u64 desc, .param .u32 count)
{{
    .reg .pred %p<8>;
    .reg .b32 %r<32>;
    .reg .b64 %rd<32>;
    .shared .align 128 .b8 buf[{2 * TMA_PIECE}];
    .shared .align 8 .b64 bar[2];

    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    ld.param.u64 %rd1, [desc];
    ld.param.u32 %r2, [count];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %nctaid.x;
    mov.u32 %r5, buf;
    mov.u32 %r6, bar;
    mbarrier.init.shared::cta.b64 [%r6], 1;
    add.u32 %r7, %r6, 8;
    mbarrier.init.shared::cta.b64 [%r7], 1;
    fence.mbarrier_init.release.cluster;
    fence.proxy.async.shared::cta;
    setp.ge.u32 %p2, %r3, %r2;
    @%p2 bra DONE;
    mov.u32 %r10, 0;
    mov.u32 %r11, 0;
    mov.u32 %r16, 0;
{_tma_load("%r3", "%r16")}
LOOP:
    mad.lo.u32 %r12, %r10, %r4, %r3;
    add.u32 %r13, %r12, %r4;
    and.b32 %r14, %r10, 1;
    xor.b32 %r15, %r14, 1;
    cp.async.bulk.wait_group.read 0;
    setp.lt.u32 %p3, %r13, %r2;
    @!%p3 bra WAIT;
{_tma_load("%r13", "%r15")}
WAIT:
    mad.lo.u32 %r22, %r14, 8, %r6;
    shr.u32 %r23, %r11, %r14;
    and.b32 %r23, %r23, 1;
    mov.u32 %r24, 0;
SPIN:
    mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r22], %r23;
    @%p4 bra LOADED;
    add.u32 %r24, %r24, 1;
    setp.lt.u32 %p5, %r24, 4194304;
    @%p5 bra SPIN;
    trap;
LOADED:
    shl.b32 %r25, 1, %r14;
    xor.b32 %r11, %r11, %r25;
{_tma_piece("%r12")}    mad.lo.u32 %r21, %r14, {TMA_PIECE}, %r5;
    cp.async.bulk.global.shared::cta.bulk_group [%rd11], [%r21], %r20;
    cp.async.bulk.commit_group;
    add.u32 %r10, %r10, 1;
    @%p3 bra LOOP;
    cp.async.bulk.wait_group 0;
DONE:
    ret;
}}
"""


@dataclass(frozen=True)
class CopyKernel:
    """A PTX copy kernel over a device descriptor list: its entry, text, threads per CTA, and the largest
    descriptor it takes (copies are cut to that size so that every CTA gets work)."""

    entry: str
    ptx: str
    threads: int
    piece: int


LSU_COPY = CopyKernel("lsu_copy", LSU_COPY_PTX, 512, 64 << 10)
TMA_COPY = CopyKernel("tma_copy", TMA_COPY_PTX, 32, TMA_PIECE)
COPY_KERNELS = (LSU_COPY, TMA_COPY)


class Gpu:
    """torch, cuda-bindings and the buffers, streams and matmul of the run."""

    def __init__(self, args):
        import torch
        from cuda.bindings import driver as cu

        from mori_compiler.runtime.driver import DriverError, call_checked

        self.torch, self.cu, self.args = torch, cu, args
        self._call_checked, self.DriverError = call_checked, DriverError
        torch.cuda.set_device(0)
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # torch's primary context is current on this thread from here on
        ctx = self.call("cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            self.call("cuCtxSetCurrent", self.call("cuDevicePrimaryCtxRetain", self.call("cuDeviceGet", 0)))
        self.devices = torch.cuda.device_count()
        n = args.buffer_rows * ROW_BYTES
        gen = torch.Generator(device="cuda").manual_seed(1)
        self.src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)
        self.dst = torch.empty_like(self.src)
        self.out = torch.empty(args.buffer_rows * ROW_BYTES, dtype=torch.uint8, device="cuda")
        self.peer_dst = None
        self.kernels: dict = {}  # loaded copy kernels by entry name
        m = args.matmul
        self.a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
        least, greatest = self.call("cuCtxGetStreamPriorityRange")
        self.priority_range = (int(least), int(greatest))
        flags = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self.streams = {"side": torch.cuda.Stream(), "mm": torch.cuda.Stream()}
        for name, prio in (("low", least), ("high", greatest)):
            handle = self.call("cuStreamCreateWithPriority", flags, int(prio))
            self.streams[name] = torch.cuda.ExternalStream(int(handle), device=torch.device("cuda", 0))
        self.cycles_per_us = self._calibrate_sleep()

    def call(self, name: str, *args):
        """``cuda.bindings.driver.<name>(*args)``, checked: raises the project's DriverError (call, error
        name and description)."""
        def error_text(err):
            texts = []
            for fn in ("cuGetErrorName", "cuGetErrorString"):
                try:
                    rc, text = getattr(self.cu, fn)(err)
                    texts.append(text.decode() if isinstance(text, bytes) else str(text))
                except Exception:  # noqa: BLE001 - the error itself is what matters
                    texts.append(str(err))
            return texts[0], texts[1]

        return self._call_checked(self.cu, name, args, success=int(self.cu.CUresult.CUDA_SUCCESS),
                                  error_text=error_text, unavailable="CUDA_DRIVER_UNAVAILABLE", package="cuda-bindings")

    def raw_status(self, name: str, *args) -> str:
        """The CUresult name (and description) of one call, for the probes: never raises."""
        try:
            self.call(name, *args)
            return "CUDA_SUCCESS"
        except self.DriverError as exc:
            return f"{exc.error_name}: {exc.description}"
        except Exception as exc:  # noqa: BLE001 - a binding-level refusal (TypeError ...) is an answer too
            return f"{type(exc).__name__}: {exc}"

    def _calibrate_sleep(self) -> float:
        torch, s = self.torch, self.streams["mm"]
        if not hasattr(torch.cuda, "_sleep"):
            return 0.0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            torch.cuda._sleep(1000)
            start.record(s)
            torch.cuda._sleep(2_000_000)
            end.record(s)
        end.synchronize()
        return 2_000_000 / (start.elapsed_time(end) * 1000.0)

    def gate(self, stream, us: float) -> None:
        """Hold ``stream`` for ``us`` µs (a sleep kernel), so that what the host enqueues behind it starts together."""
        if self.cycles_per_us:
            with self.torch.cuda.stream(stream):
                self.torch.cuda._sleep(int(us * self.cycles_per_us))

    def matmul(self, stream) -> None:
        with self.torch.cuda.stream(stream):
            self.torch.matmul(self.a, self.b, out=self.c)

    def enable_peer(self) -> str | None:
        """Peer access GPU0 -> GPU1 and the destination buffer on GPU1; None, or why not."""
        torch = self.torch
        if self.devices < 2:
            return f"torch sees {self.devices} GPU"
        if not torch.cuda.can_device_access_peer(0, 1):
            return "GPU0 cannot access GPU1 (no peer access)"
        self.peer_dst = torch.empty(self.src.numel(), dtype=torch.uint8, device="cuda:1")
        peer_ctx = self.call("cuDevicePrimaryCtxRetain", self.call("cuDeviceGet", 1))
        status = self.raw_status("cuCtxEnablePeerAccess", peer_ctx, 0)
        if status != "CUDA_SUCCESS" and "ALREADY_ENABLED" not in status:
            return f"cuCtxEnablePeerAccess: {status}"
        return None


@dataclass
class Mechanism:
    """A way to move a case's copies. ``build(gpu, case, dst)`` returns enqueue(stream) or raises Unsupported."""

    name: str
    build: Callable
    copy_stream: str = "side"
    mm_stream: str = "mm"


def _per_copy_limit(case: Case, limit: int) -> None:
    if len(case.copies) > limit:
        raise Unsupported(f"{len(case.copies)} copies: a host loop of more than {limit} calls is not measured")


def build_torch_copy(gpu: Gpu, case: Case, dst):
    _per_copy_limit(case, 64)
    pairs = [(dst[c.dst:c.dst + c.nbytes], gpu.src[c.src:c.src + c.nbytes]) for c in case.copies]

    def enqueue(stream):
        with gpu.torch.cuda.stream(stream):
            for d, s in pairs:
                d.copy_(s)
    return enqueue


def build_memcpy_async(gpu: Gpu, case: Case, dst):
    _per_copy_limit(case, PER_CALL_LIMIT)
    items = [(dst.data_ptr() + c.dst, gpu.src.data_ptr() + c.src, c.nbytes) for c in case.copies]

    def enqueue(stream):
        h = int(stream.cuda_stream)
        for d, s, n in items:
            gpu.call("cuMemcpyAsync", d, s, n, h)
    return enqueue


def build_with_attrs(gpu: Gpu, case: Case, dst):
    _per_copy_limit(case, PER_CALL_LIMIT)
    attr = memcpy_attributes(gpu.cu, order="STREAM", overlap=True, src_device=0, dst_device=dst.device.index)
    items = [(dst.data_ptr() + c.dst, gpu.src.data_ptr() + c.src, c.nbytes) for c in case.copies]

    def enqueue(stream):
        h = int(stream.cuda_stream)
        for d, s, n in items:
            gpu.call("cuMemcpyWithAttributesAsync", d, s, n, attr, h)
    return enqueue


def batch_builder(order: str, overlap: bool):
    def build(gpu: Gpu, case: Case, dst):
        attr = memcpy_attributes(gpu.cu, order=order, overlap=overlap, src_device=0, dst_device=dst.device.index)
        args = batch_arguments(gpu.cu, case.copies, dst.data_ptr(), gpu.src.data_ptr(), attr)

        def enqueue(stream):
            gpu.call("cuMemcpyBatchAsync", *args, int(stream.cuda_stream))
        return enqueue
    return build


def build_cu_index_copy(gpu: Gpu, case: Case, dst):
    torch = gpu.torch
    idx = row_indices(case.copies, ROW_BYTES)
    if idx is None:
        raise Unsupported("copies are not whole rows")
    src_idx, dst_idx = (torch.tensor(i, dtype=torch.int64, device=dst.device) for i in idx)
    src2d = gpu.src.view(-1, ROW_BYTES) if dst.device == gpu.src.device else None
    if src2d is None:
        raise Unsupported("the SM reference runs on one GPU")
    dst2d = dst.view(-1, ROW_BYTES)

    def enqueue(stream):
        with torch.cuda.stream(stream):
            dst2d.index_copy_(0, dst_idx, src2d.index_select(0, src_idx))
    return enqueue


def kernel_builder(kernel: CopyKernel, blocks: int | None):
    """``blocks`` CTAs (None: one per SM) of ``kernel`` over the case's copies, cut to its piece size."""
    def build(gpu: Gpu, case: Case, dst):
        from mori_compiler.runtime.driver import default_driver

        pieces = split_copies(case.copies, kernel.piece)
        if any((dst.data_ptr() + c.dst) % 16 or (gpu.src.data_ptr() + c.src) % 16 or c.nbytes % 16 for c in pieces):
            raise Unsupported("the copy kernels move 16-byte aligned multiples of 16 bytes")
        drv = default_driver()
        if kernel.entry not in gpu.kernels:
            gpu.kernels[kernel.entry] = drv.load_module(kernel.ptx.encode()).function(kernel.entry)
        table = gpu.torch.frombuffer(bytearray(descriptor_bytes(pieces, dst.data_ptr(), gpu.src.data_ptr())),
                                     dtype=gpu.torch.uint8).to("cuda:0")  # fmt: skip
        grid = blocks or gpu.torch.cuda.get_device_properties(0).multi_processor_count
        fn, params = gpu.kernels[kernel.entry], [("ptr", table.data_ptr()), ("i32", len(pieces))]

        def enqueue(stream, _table=table):  # the descriptor table lives as long as the closure
            drv.launch(fn, (grid, 1, 1), (kernel.threads, 1, 1), params, stream=int(stream.cuda_stream))
        return enqueue
    return build


def mechanisms(one_gpu: bool) -> list[Mechanism]:
    ms = [Mechanism("torch_copy", build_torch_copy),
          Mechanism("memcpy_async", build_memcpy_async),
          Mechanism("memcpy_async@low/high", build_memcpy_async, "low", "high"),
          Mechanism("with_attrs[overlap]", build_with_attrs),
          Mechanism("batch[default,stream]", batch_builder("STREAM", False)),
          Mechanism("batch[overlap,stream]", batch_builder("STREAM", True)),
          Mechanism("batch[overlap,any]", batch_builder("ANY", True)),
          Mechanism("batch[overlap,stream]@low/high", batch_builder("STREAM", True), "low", "high")]  # fmt: skip
    if one_gpu:
        ms.append(Mechanism("cu_index_copy", build_cu_index_copy))
    return ms


def kernel_mechanisms() -> list[Mechanism]:
    return [Mechanism("sm_lsu_copy[8 CTAs]", kernel_builder(LSU_COPY, 8)),
            Mechanism("sm_lsu_copy[32 CTAs]", kernel_builder(LSU_COPY, 32)),
            Mechanism("sm_lsu_copy[8 CTAs]@high/mm", kernel_builder(LSU_COPY, 8), "high", "mm"),
            Mechanism("sm_lsu_copy[all SMs]", kernel_builder(LSU_COPY, None)),
            Mechanism("sm_tma_copy[8 CTAs]", kernel_builder(TMA_COPY, 8)),
            Mechanism("sm_tma_copy[32 CTAs]", kernel_builder(TMA_COPY, 32)),
            Mechanism("sm_tma_copy[all SMs]", kernel_builder(TMA_COPY, None))]  # fmt: skip


class Runner:
    def __init__(self, gpu: Gpu, args):
        self.gpu, self.args, self.torch = gpu, args, gpu.torch
        self.mm_alone: dict[str, list[float]] = {}

    def _events(self, n: int):
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(n)]

    def time_alone(self, stream, fn, reps: int, gate_us: float) -> list[float]:
        times = []
        for _ in range(reps):
            start, end = self._events(2)
            self.gpu.gate(stream, gate_us)
            start.record(stream)
            fn(stream)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return times

    def matmul_alone(self, stream_name: str) -> float:
        """The matmul's median time alone on that stream, measured anew next to each concurrent run (clocks
        drift over a run); ``mm_alone`` keeps every value for the report."""
        s = self.gpu.streams[stream_name]
        self.time_alone(s, self.gpu.matmul, 2, 100)
        t = median(self.time_alone(s, self.gpu.matmul, self.args.reps, 100))
        self.mm_alone.setdefault(stream_name, []).append(t)
        return t

    def time_both(self, copy_stream, mm_stream, fn, reps: int, gate_us: float):
        both, mm_in, copy_in, late = [], [], [], 0
        for _ in range(reps):
            start, copy_end, mm_end, end = self._events(4)
            self.gpu.gate(mm_stream, gate_us)
            start.record(mm_stream)
            copy_stream.wait_event(start)
            fn(copy_stream)
            copy_end.record(copy_stream)
            self.gpu.matmul(mm_stream)
            mm_end.record(mm_stream)
            mm_stream.wait_event(copy_end)
            end.record(mm_stream)
            late += bool(start.query())  # the gate ended before the host had enqueued both
            end.synchronize()
            both.append(start.elapsed_time(end) * 1000.0)
            mm_in.append(start.elapsed_time(mm_end) * 1000.0)
            copy_in.append(start.elapsed_time(copy_end) * 1000.0)
        return median(both), median(mm_in), median(copy_in), late

    def verify(self, case: Case, dst, run: Callable[[], None]) -> str | None:
        """Poison the destination, run, compare every copy with its source; None, or what is wrong."""
        torch = self.torch
        dst[:case.span[0]].fill_(POISON)
        torch.cuda.synchronize(dst.device)
        run()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(dst.device)
        idx = row_indices(case.copies, ROW_BYTES)
        if idx is not None:
            src_rows = torch.tensor(idx[0], dtype=torch.int64, device=self.gpu.src.device)
            dst_rows = torch.tensor(idx[1], dtype=torch.int64, device=dst.device)
            got = dst.view(-1, ROW_BYTES).index_select(0, dst_rows).to(self.gpu.src.device)
            want = self.gpu.src.view(-1, ROW_BYTES).index_select(0, src_rows)
            bad = (got != want).any(dim=1).nonzero().flatten()
            if bad.numel():
                return f"{bad.numel()} of {len(idx[0])} rows differ (first: destination row {idx[1][int(bad[0])]})"
            return None
        for i, c in enumerate(case.copies):
            if not torch.equal(dst[c.dst:c.dst + c.nbytes].to(self.gpu.src.device), self.gpu.src[c.src:c.src + c.nbytes]):
                return f"copy {i} of {len(case.copies)} differs"
        return None

    def recv_time(self, case: Case) -> float | None:
        """The receive phase's second copy: a gather of the received rows from the landing buffer into out."""
        if not case.recv_rows:
            return None
        torch, s = self.torch, self.gpu.streams["side"]
        idx = torch.tensor(case.recv_src_rows, dtype=torch.int64, device="cuda:0")
        land, out = self.gpu.dst.view(-1, ROW_BYTES), self.gpu.out.view(-1, ROW_BYTES)[:case.recv_rows]

        def gather(stream):
            with torch.cuda.stream(stream):
                torch.index_select(land, 0, idx, out=out)
        self.time_alone(s, gather, 3, 100)
        return median(self.time_alone(s, gather, self.args.reps, 100))

    def measure(self, case: Case, mech: Mechanism, dst, label: str, t_recv: float | None) -> Result:
        gpu, torch, reps = self.gpu, self.torch, self.args.reps
        res = Result(case.name, label, len(case.copies), case.nbytes, t_recv_us=t_recv)
        try:
            fn = mech.build(gpu, case, dst)
        except Unsupported as exc:
            res.status = f"not run: {exc}"
            return res
        except (gpu.DriverError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
            res.status = f"unsupported: {exc}"
            return res
        cs, ms = gpu.streams[mech.copy_stream], gpu.streams[mech.mm_stream]
        try:
            fn(cs)  # the first call also loads lazily what the mechanism needs
            cs.synchronize()
            t0 = time.perf_counter()
            fn(cs)
            res.host_enqueue_us = (time.perf_counter() - t0) * 1e6
            cs.synchronize()
            wrong = self.verify(case, dst, lambda: fn(cs))
            if wrong:
                res.status = f"WRONG COPY: {wrong}"
                return res
            gate = 2.0 * res.host_enqueue_us + 300.0
            self.time_alone(cs, fn, 2, gate)
            res.t_copy_us = median(self.time_alone(cs, fn, reps, gate))
            res.t_mm_us = self.matmul_alone(mech.mm_stream)
            self.time_both(cs, ms, fn, 2, gate)
            res.t_both_us, res.t_mm_in_both_us, res.t_copy_in_both_us, res.gate_late = self.time_both(cs, ms, fn, reps, gate)
            wrong = self.verify(case, dst, lambda: self.time_both(cs, ms, fn, 1, gate))
            if wrong:
                res.status = f"WRONG COPY (concurrent): {wrong}"
            elif res.gate_late:
                res.status = f"ok (gate late in {res.gate_late}/{reps})"
        except (gpu.DriverError, RuntimeError) as exc:  # a driver refusal, or torch's report of a CUDA error
            res.status = f"unsupported: {exc}"
            try:
                torch.cuda.synchronize()
            except RuntimeError as sticky:
                res.status += f" (then: {sticky})"
        return res


def batch_probes(gpu: Gpu) -> list[dict]:
    """Why cuMemcpyBatchAsync can answer CUDA_ERROR_INVALID_VALUE: one 14 KiB copy, one variation each."""
    cu, src, dst = gpu.cu, gpu.src.data_ptr(), gpu.dst.data_ptr()
    one = (Copy(0, 0, ROW_BYTES),)
    side = int(gpu.streams["side"].cuda_stream)

    def attrs(order="STREAM", overlap=True):
        return memcpy_attributes(cu, order=order, overlap=overlap, src_device=0, dst_device=0)

    def args(attr):
        return batch_arguments(cu, one, dst, src, attr)

    zero = cu.CUmemcpyAttributes()  # srcAccessOrder left at 0 = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID
    bad_flags = attrs()
    bad_flags.flags = 2
    d, s, n, count, a, _, _ = args(attrs())
    variants = [
        ("reference: overlap flag, order STREAM, side stream", (*args(attrs()), side)),
        ("order ANY", (*args(attrs("ANY")), side)),
        ("order DURING_API_CALL (device source)", (*args(attrs("DURING_API_CALL")), side)),
        ("flags DEFAULT", (*args(attrs(overlap=False)), side)),
        ("zero-initialised attributes (srcAccessOrder INVALID)", (*args(zero), side)),
        ("legacy NULL stream (torch's default stream)", (*args(attrs()), 0)),
        ("attrsIdxs = [1] (must start at 0)", (d, s, n, count, a, [1], 1, side)),
        ("numAttrs = 2 > count = 1", (d, s, n, count, a * 2, [0, 1], 2, side)),
        ("unknown flag bit 0x2", (*args(bad_flags), side)),
        ("count = 0", ([], [], [], 0, a, [0], 1, side)),
    ]
    out = []
    for what, call_args in variants:
        status = gpu.raw_status("cuMemcpyBatchAsync", *call_args)
        out.append({"variant": what, "result": status})
    gpu.torch.cuda.synchronize()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions (medians)")
    ap.add_argument("--matmul", type=int, default=4096, help="n of the n x n x n bf16 matmul")
    ap.add_argument("--world", type=int, default=8, help="virtual PEs of the AsyncLL-shaped cases")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per PE of the AsyncLL-shaped cases")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop starting measurements after this many seconds")
    ap.add_argument("--sizes-rows", default=",".join(map(str, SIZES_ROWS)),
                    help="row counts (14 KiB rows) of the plain contiguous copies")
    ap.add_argument("--no-sm-kernel", action="store_true", help="leave out the PTX copy kernels")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    for name in ("reps", "matmul", "world", "tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        sizes = [int(v) for v in args.sizes_rows.split(",")]
    except ValueError:
        ap.error(f"--sizes-rows takes comma-separated row counts, got {args.sizes_rows!r}")
    if not sizes or min(sizes) < 1:
        ap.error("--sizes-rows: every row count must be at least 1")
    routing = asyncll_routing(args.world, args.tokens)
    cases = [plain_case(r) for r in sizes] + [
        asyncll_rows_case(routing), asyncll_runs_case(routing), asyncll_block_case(routing)]
    args.buffer_rows = max(max(c.span) for c in cases) // ROW_BYTES + 1
    t_start = time.perf_counter()
    try:
        import torch  # noqa: F401
        from cuda.bindings import driver  # noqa: F401

        import mori_compiler.runtime.driver  # noqa: F401 - the driver calls and the PTX loads go through it
    except ImportError as exc:
        print(f"copy_engine_overlap: needs torch with CUDA, cuda-bindings and mori_compiler installed: {exc}",
              file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("copy_engine_overlap: torch sees no CUDA GPU", file=sys.stderr)
        return 1
    gpu = Gpu(args)
    runner = Runner(gpu, args)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "driver_version": int(gpu.call("cuDriverGetVersion")), "gpus": gpu.devices,
            "stream_priority_range": gpu.priority_range, "sleep_cycles_per_us": gpu.cycles_per_us,
            "matmul_n": args.matmul, "row_bytes": ROW_BYTES, "world": args.world, "tokens": args.tokens,
            "asyncll_rows": cases[-1].recv_rows, "reps": args.reps}  # fmt: skip
    try:
        import cuda.bindings as cb

        meta["cuda_bindings"] = getattr(cb, "__version__", "?")
    except ImportError:
        pass
    print("copy_engine_overlap:", json.dumps(meta), flush=True)
    results: list[Result] = []
    probes = batch_probes(gpu)
    print("\ncuMemcpyBatchAsync probes (one 14 KiB copy):")
    for p in probes:
        print(f"  {p['variant']:<55s} -> {p['result']}")
    sys.stdout.flush()

    def over_budget() -> bool:
        return time.perf_counter() - t_start > args.budget_s

    def run_all(label_prefix: str, mechs: list[Mechanism], dst) -> None:
        for case in cases:
            try:
                t_recv = runner.recv_time(case) if dst is gpu.dst and not over_budget() else None
            except RuntimeError as exc:  # a CUDA error left by an earlier mechanism: the rows say so
                t_recv = None
                print(f"receive-copy timing of {case.name} failed: {exc}")
            for mech in mechs:
                label = label_prefix + mech.name
                res = Result(case.name, label, len(case.copies), case.nbytes, status="skipped: time budget")
                if not over_budget():
                    try:
                        res = runner.measure(case, mech, dst, label, t_recv)
                    except Exception as exc:  # noqa: BLE001 - one mechanism's failure must not end the run
                        res.status = f"error: {type(exc).__name__}: {exc}"
                results.append(res)
                print(format_table([res]).splitlines()[1], flush=True)

    print("\n" + format_table([]), flush=True)
    try:
        run_all("", mechanisms(True), gpu.dst)
        try:
            why = gpu.enable_peer()
        except (gpu.DriverError, RuntimeError) as exc:
            why = f"setting up GPU1 failed: {exc}"
        if why:
            print(f"\npeer copies GPU0 -> GPU1 not measured: {why}")
            meta["peer"] = why
        else:
            run_all("peer:", mechanisms(False), gpu.peer_dst)
        if not args.no_sm_kernel:
            run_all("", kernel_mechanisms(), gpu.dst)
    finally:
        meta["elapsed_s"] = time.perf_counter() - t_start
        print("\n" + format_table(results))
        print("\n" + "\n".join(summary(results)))
        spread = {k: f"median {median(v):.1f}, min {min(v):.1f}, max {max(v):.1f} ({len(v)} runs)"
                  for k, v in runner.mm_alone.items()}  # fmt: skip
        print(f"\nmatmul alone (us) per stream: {json.dumps(spread)}")
        meta["matmul_alone_us"] = runner.mm_alone
        print(f"elapsed {meta['elapsed_s']:.1f} s")
        if args.json:
            Path(args.json).write_text(report_json(meta, results, probes))
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
