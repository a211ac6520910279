"""Kernel trace points at run time: turn them on, read what the GPU recorded, summarize and export it.

A kernel compiled with trace points (``mori_comm.trace`` ops, compile option ``trace=True``) records, per
warp, the GPU's global timer each time the warp reaches one of them. This module is the runtime half: it
gives a traced kernel its buffer, reads the buffer back, decodes it into ``TraceRecord``s, summarizes the
phases (``phase_summary``, ``format_phase_table``) and writes Chrome trace-event JSON for Perfetto's UI
(``export_to_perfetto``). It imports only the standard library (and the bundle metadata); the KernelSet
methods ``trace()`` (runtime/launcher.py) create a ``KernelTrace``. docs/tracing.md is the user's guide.

The contract with the compiler (the compiler half is passes/ and mori_compiler/cache.py):

* A traced kernel ``K`` has a module global ``__mori_trace_K`` of 8 bytes: the device address of K's trace
  buffer, or 0 (the value after load): tracing is off and the kernel records nothing.
* K's bundle entry has ``"trace": ["<event>:<phase>", ...]``: its E trace slots in order (phase ``begin``,
  ``end`` or ``instant``; checked by runtime/bundle.py into ``KernelInfo.trace_events``).
* The buffer is an array of u64 timer values, slot ``linear_warp * E + slot`` where
  ``linear_warp = linear_block * warps_per_block + flat_thread_id // wave``,
  ``linear_block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)`` and
  ``warps_per_block = ceil(block threads / wave)`` (the target's wave: 32 on sm_90 and gfx1250, 64 on
  gfx942 and gfx950). The lanes of each warp that execute a trace op store the timer into their warp's
  slot (no branch on the lane); a later execution overwrites an earlier one (in a loop the last iteration
  wins); 0 means never executed.
* With virtual PEs blockIdx.z is the PE: a record's PE is ``linear_block // (gridDim.x * gridDim.y)`` and its
  block within the PE the remainder. With a process per PE, the PE is the process's own and the block is
  the whole linear block.
* A timestamp is when the warp issued the trace op, not when the stores before it completed.

The timer: NVIDIA's ``%globaltimer`` counts nanoseconds (``NS_PER_TICK["sm_90"] == 1``). AMD's
``s_memrealtime`` / ``REALTIME`` counts ticks of a constant clock whose rate is the part's (100 MHz on MI300,
10 ns a tick) rather than the ISA's: AMD traces stay in ticks (``Trace.ns_per_tick`` is None) unless the
caller says the rate. Timers of different GPUs are not synchronized with each other: compare times across
processes (one PE each) only through durations, or align them (``export_to_perfetto(align="start")``).
"""

from __future__ import annotations

import array
import dataclasses
import json
import math
import operator
import os
import statistics
import sys
from dataclasses import dataclass
from typing import NamedTuple

from mori_compiler.lib_bitcode.kernel_abi import TRACE_GLOBAL_BYTES, TRACE_GLOBAL_PREFIX, TRACE_SLOT_BYTES, trace_global
from mori_compiler.targets import TARGETS

from .bundle import KernelInfo, split_trace_event
from .driver import DriverError

TRACE_SYMBOL_PREFIX = TRACE_GLOBAL_PREFIX  # the compiler's name for it (lib_bitcode.kernel_abi owns it)
TRACE_POINTER_SIZE = TRACE_GLOBAL_BYTES  # the global: {buffer device address, slots in the buffer}
NS_PER_TICK = {"sm_90": 1.0}  # targets whose timer is in ns; the others (AMD) are recorded in ticks
_WORD = TRACE_SLOT_BYTES  # one u64 timer value


def trace_symbol(kernel: str) -> str:
    """The module global that holds ``kernel``'s trace buffer address."""
    return trace_global(kernel)


class TraceRecord(NamedTuple):
    """One recorded trace point: kernel, PE, block (within the PE), warp (within the block), event, phase,
    and the timer value ``t`` (ns on NVIDIA, ticks on AMD)."""

    kernel: str
    pe: int
    block: int
    warp: int
    event: str
    phase: str
    t: int


# ----------------------------------------------------------------------------------------------------
# The buffer layout and its decoding
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceLayout:
    """Where each record of one launch lies in a trace buffer. ``grid`` is the launch's full grid (with
    virtual PEs its z is the number of PEs); ``pe`` is the process's PE (without virtual PEs)."""

    slots: tuple[tuple[str, str], ...]  # (event, phase) per slot
    grid: tuple[int, int, int]
    block_threads: int
    wave: int
    virtual_pes: bool = False
    pe: int = 0

    @property
    def warps_per_block(self) -> int:
        return -(-self.block_threads // self.wave)

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def warps(self) -> int:
        return self.blocks * self.warps_per_block

    @property
    def nbytes(self) -> int:
        return self.warps * len(self.slots) * _WORD

    def locate(self, linear_warp: int) -> tuple[int, int, int]:
        """(PE, block within the PE, warp within the block) of a linear warp index."""
        linear_block, warp = divmod(linear_warp, self.warps_per_block)
        if self.virtual_pes:
            pe, block = divmod(linear_block, self.grid[0] * self.grid[1])
            return pe, block, warp
        return self.pe, linear_block, warp


def slots_of(kernel: KernelInfo) -> tuple[tuple[str, str], ...]:
    return tuple(split_trace_event(text) for text in kernel.trace_events)


def decode_buffer(kernel: str, data: bytes, layout: TraceLayout) -> list[TraceRecord]:
    """The records of a trace buffer's bytes (little-endian u64), in buffer order; slots holding 0 (never
    executed) are skipped. ``data`` may be longer than the layout needs (a buffer sized for a larger grid)."""
    if len(data) < layout.nbytes:
        raise ValueError(f"trace of '{kernel}': {len(data)} bytes cannot hold grid {layout.grid} x "
                         f"{layout.block_threads} threads ({layout.nbytes} bytes)")  # fmt: skip
    words = array.array("Q")
    if words.itemsize != _WORD:  # pragma: no cover - every platform CPython runs on has an 8-byte 'Q'
        raise RuntimeError("array('Q') is not 64-bit on this platform")
    words.frombytes(data[: layout.nbytes])
    if sys.byteorder == "big":  # pragma: no cover
        words.byteswap()
    n_slots = len(layout.slots)
    records = []
    for index, t in enumerate(words):
        if t:
            linear_warp, slot = divmod(index, n_slots)
            event, phase = layout.slots[slot]
            records.append(TraceRecord(kernel, *layout.locate(linear_warp), event, phase, t))
    return records


@dataclass(frozen=True)
class Trace:
    """The records of one kernel launch (or of several launches of it between resets), with what is needed
    to show them: the target, the timer's ns per tick (None: AMD ticks), the slots, and the label and
    start offset (ns) it gets in an export (``placed``)."""

    kernel: str
    records: tuple[TraceRecord, ...]
    target: str
    slots: tuple[tuple[str, str], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    warps_per_block: int
    ns_per_tick: float | None = 1.0
    name: str = ""
    offset_ns: float = 0.0

    @property
    def label(self) -> str:
        return self.name or self.kernel

    @property
    def unit(self) -> str:
        return "ns" if self.ns_per_tick == 1.0 else "ticks"

    def placed(self, name: str | None = None, offset_ns: float | None = None) -> "Trace":
        """This trace under another label and/or start offset in an export."""
        changes = {}
        if name is not None:
            changes["name"] = str(name)
        if offset_ns is not None:
            changes["offset_ns"] = _finite(offset_ns, "offset_ns")
        return dataclasses.replace(self, **changes)


def _shape(value, what: str, kernel: str) -> tuple[int, int, int]:
    """A full grid or block given to ``read``: three positive integers."""
    try:
        out = tuple(operator.index(v) for v in value)
    except TypeError:
        out = ()
    if len(out) != 3 or any(v <= 0 for v in out):
        raise ValueError(f"trace of '{kernel}': {what} must be 3 positive integers (the full launch {what}), "
                         f"got {value!r}")  # fmt: skip
    return out


def _finite(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------------------------------
# A traced kernel of a loaded KernelSet
# ----------------------------------------------------------------------------------------------------


class KernelTrace:
    """Tracing of one kernel of a loaded KernelSet (made by ``KernelSet.trace``): a zeroed device buffer for
    launches up to ``grid`` x ``block``, its address written into the kernel's ``__mori_trace_`` global.

    * ``reset()`` zeroes the buffer (ordered on the stream), ``read()`` copies it back and decodes it,
      ``disable()`` writes 0 into the global and frees the buffer (closing the KernelSet does too).
    * The KernelSet tells the trace about each launch of its kernel (``launched``): a launch that needs more
      warps than the buffer holds is refused before it runs (the kernel cannot know the buffer's size), and
      ``read()`` decodes with the shape of the launches since the last reset.
    """

    def __init__(self, kernels, kernel: KernelInfo, grid: tuple[int, int, int], block: tuple[int, int, int], *,
                 pe: int = 0):  # fmt: skip
        """``grid``: the largest full launch grid to record (with virtual PEs z is the number of PEs);
        ``pe``: this process's PE (without virtual PEs)."""
        bundle = kernels.bundle
        self.kernel = kernel.name
        self.slots = slots_of(kernel)
        if not self.slots:
            raise ValueError(f"kernel '{kernel.name}' has no trace points: compile it with trace=True (bundle "
                             f"{bundle.key[:12]} records no trace events for it)")  # fmt: skip
        self.target = bundle.target
        self.wave = TARGETS[bundle.target].wave_size
        self.ns_per_tick = NS_PER_TICK.get(bundle.target)
        self.virtual_pes = bundle.virtual_pes
        self.symbol = trace_symbol(kernel.name)
        self.grid, self.block, self.pe = tuple(grid), tuple(block), 0 if self.virtual_pes else int(pe)
        self.capacity_warps = self._layout(self.grid, self.block).warps
        self._driver = kernels.driver
        self._launch_shapes: set[tuple[tuple[int, int, int], tuple[int, int, int]]] = set()
        self.ptr = 0
        try:
            address, size = kernels.module.global_address(self.symbol)
        except DriverError as exc:
            raise ValueError(f"kernel '{kernel.name}': bundle {bundle.key[:12]} lists trace events for it but its "
                             f"code object has no global {self.symbol} ({exc}): compiler and runtime "
                             "disagree; rebuild the bundle") from None  # fmt: skip
        if size < TRACE_POINTER_SIZE:
            raise ValueError(f"kernel '{kernel.name}': global {self.symbol} has {size} bytes, a trace buffer "
                             f"address needs {TRACE_POINTER_SIZE} (compiler and runtime disagree)")  # fmt: skip
        self._global = address
        nbytes = self.nbytes
        ptr = self._driver.malloc(nbytes)
        try:
            self._driver.memset_d8(ptr, 0, nbytes)
            # {address, slots}: the kernel stores only below the slot count, so a launch this trace did not see
            # (a CUDA-graph replay of a larger grid) cannot write past the buffer.
            slots = self.capacity_warps * len(self.slots)
            self._driver.memcpy_htod(self._global, ptr.to_bytes(8, "little") + slots.to_bytes(8, "little"))
            # A memset may still run when it returns, and torch's streams do not wait for the legacy default
            # stream: zeroed before any kernel can record.
            self._driver.device_synchronize()
        except BaseException:
            self._driver.free(ptr)
            raise
        self.ptr = ptr

    @staticmethod
    def _threads(block) -> int:
        return block[0] * block[1] * block[2]

    def _layout(self, grid, block) -> TraceLayout:
        return TraceLayout(self.slots, tuple(grid), self._threads(block), self.wave, self.virtual_pes, self.pe)

    @property
    def nbytes(self) -> int:
        return self.capacity_warps * len(self.slots) * _WORD

    @property
    def enabled(self) -> bool:
        return self.ptr != 0

    def _live(self, what: str) -> None:
        if not self.ptr:
            raise RuntimeError(f"trace of '{self.kernel}' was disabled: cannot {what} (enable it again with "
                               f"KernelSet.trace)")  # fmt: skip

    def launched(self, grid, block) -> None:
        """Called by the KernelSet before each launch of the kernel (full grid: with virtual PEs z = PEs):
        refuses a launch whose records would not fit the buffer, else remembers its shape for ``read``."""
        if not self.ptr:
            return
        grid, block = tuple(grid), tuple(block)
        need = self._layout(grid, block).warps
        if need > self.capacity_warps:
            raise ValueError(f"kernel '{self.kernel}' is traced for up to {self.capacity_warps} warps (grid "
                             f"{self.grid} x block {self.block}); this launch of grid {grid} x block {block} has "
                             f"{need}: trace it again for the larger grid (KernelSet.trace)")  # fmt: skip
        self._launch_shapes.add((grid, block))

    def reset(self, stream: int | None = None) -> None:
        """Zero the buffer, ordered on ``stream`` (default: the current stream, as launches)."""
        self._live("reset it")
        if stream is None:
            stream = self._driver.current_stream()
        self._driver.memset_d8(self.ptr, 0, self.nbytes, stream)
        self._launch_shapes.clear()

    def read(self, *, grid=None, block=None, stream: int | None = None) -> Trace:
        """Copy the buffer back (ordered on ``stream``, default the current one) and decode it. The shape is
        the launches' since the last reset, or ``grid``/``block`` (full grid) where given; several launch
        shapes since the reset are refused (their records would be mixed)."""
        self._live("read it")
        if grid is not None or block is not None:
            shape = (_shape(grid if grid is not None else self.grid, "grid", self.kernel),
                     _shape(block if block is not None else self.block, "block", self.kernel))  # fmt: skip
        elif len(self._launch_shapes) > 1:
            shapes = ", ".join(f"{g} x {b}" for g, b in sorted(self._launch_shapes))
            raise ValueError(f"trace of '{self.kernel}': launched with several shapes since the last reset "
                             f"({shapes}): reset() between them, or pass grid= and block=")  # fmt: skip
        elif self._launch_shapes:
            (shape,) = self._launch_shapes
        elif self.virtual_pes:
            # No launch went through the KernelSet since the reset (a CUDA-graph replay does not): the records'
            # PEs depend on the launch's grid, which only the caller knows.
            raise ValueError(f"trace of '{self.kernel}': no launch of it was seen since the last reset (a CUDA-graph "
                             f"replay?): pass read(grid=, block=) with the replayed launch's full grid "
                             f"(gx, gy, PEs) and block")  # fmt: skip
        else:
            shape = (self.grid, self.block)
        layout = self._layout(*shape)
        if layout.warps > self.capacity_warps:
            raise ValueError(f"trace of '{self.kernel}': grid {shape[0]} x block {shape[1]} has {layout.warps} "
                             f"warps; the buffer holds {self.capacity_warps}")  # fmt: skip
        if stream is None:
            stream = self._driver.current_stream()
        data = self._driver.memcpy_dtoh(self.ptr, layout.nbytes, stream)
        records = decode_buffer(self.kernel, data, layout)
        return Trace(self.kernel, tuple(records), self.target, self.slots, shape[0], shape[1],
                     layout.warps_per_block, self.ns_per_tick)  # fmt: skip

    def disable(self) -> None:
        """Turn tracing off (the global is 0 again) and free the buffer, after the device has finished all
        work (a running kernel may still write into it)."""
        if not self.ptr:
            return
        ptr, self.ptr = self.ptr, 0
        self._driver.device_synchronize()
        try:
            self._driver.memcpy_htod(self._global, bytes(TRACE_POINTER_SIZE))
        finally:
            self._driver.free(ptr)

    def __repr__(self):
        state = f"{self.nbytes} bytes at 0x{self.ptr:x}" if self.ptr else "disabled"
        return f"<KernelTrace {self.kernel} grid {self.grid} block {self.block}: {state}>"


# ----------------------------------------------------------------------------------------------------
# Analysis: where the time of a kernel went
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """min / median / max of a value over ``count`` warps."""

    count: int
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values) -> "Spread":
        values = sorted(values)
        return cls(len(values), values[0], statistics.median(values), values[-1])


@dataclass(frozen=True)
class PhaseSummary:
    """One kernel on one PE. ``durations[event]``: end - begin over the warps that recorded both (and whose
    end is not before their begin: ``inverted[event]`` counts those, e.g. a loop whose last iteration began
    but did not end). ``timeline["event:phase"]``: time since ``t0``, the earliest timestamp of the kernel on
    this PE, over the warps that recorded it. Values are in the trace's unit (``unit``)."""

    kernel: str
    pe: int
    warps: int  # warps with at least one record
    t0: int
    durations: dict[str, Spread]
    inverted: dict[str, int]
    timeline: dict[str, Spread]
    unit: str = "ns"


def _as_traces(traces) -> list[Trace]:
    if isinstance(traces, Trace):
        return [traces]
    traces = list(traces)
    if all(isinstance(t, Trace) for t in traces):
        return traces
    if all(isinstance(r, TraceRecord) for r in traces):  # bare records: one trace per kernel, order kept
        by_kernel: dict[str, list[TraceRecord]] = {}
        for r in traces:
            by_kernel.setdefault(r.kernel, []).append(r)
        return [Trace(k, tuple(rs), "", _slot_order(rs), (0, 0, 0), (0, 0, 0), max(r.warp for r in rs) + 1, None)
                for k, rs in by_kernel.items()]  # fmt: skip
    raise TypeError("expected a Trace, a list of Traces or a list of TraceRecords")


def _slot_order(records) -> tuple[tuple[str, str], ...]:
    return tuple(dict.fromkeys((r.event, r.phase) for r in records))


def phase_summary(traces) -> list[PhaseSummary]:
    """Per kernel and PE: the phase durations and the timeline (see PhaseSummary), PEs in order. ``traces``:
    a Trace, several, or bare TraceRecords (their unit is then unknown: "ticks")."""
    summaries = []
    for trace in _as_traces(traces):
        by_pe: dict[int, dict[tuple[int, int], dict[tuple[str, str], int]]] = {}
        for r in trace.records:
            by_pe.setdefault(r.pe, {}).setdefault((r.block, r.warp), {})[(r.event, r.phase)] = r.t
        events = list(dict.fromkeys(event for event, _ in trace.slots))
        for pe in sorted(by_pe):
            warps = by_pe[pe]
            t0 = min(t for slots in warps.values() for t in slots.values())
            durations, inverted = {}, {}
            for event in events:
                pairs = [(s[(event, "begin")], s[(event, "end")]) for s in warps.values()
                         if (event, "begin") in s and (event, "end") in s]  # fmt: skip
                ordered = [end - begin for begin, end in pairs if end >= begin]
                if ordered:
                    durations[event] = Spread.of(ordered)
                if len(ordered) < len(pairs):
                    inverted[event] = len(pairs) - len(ordered)
            timeline = {}
            for event, phase in trace.slots:
                since = [s[(event, phase)] - t0 for s in warps.values() if (event, phase) in s]
                if since:
                    timeline[f"{event}:{phase}"] = Spread.of(since)
            summaries.append(PhaseSummary(trace.kernel, pe, len(warps), t0, durations, inverted, timeline,
                                          trace.unit))  # fmt: skip
    return summaries


def format_phase_table(traces_or_summaries) -> str:
    """A text table of ``phase_summary``: per kernel and PE, each phase's duration and each trace point's
    time since the PE's first timestamp, min / median / max over warps."""
    items = list(traces_or_summaries) if not isinstance(traces_or_summaries, Trace) else [traces_or_summaries]
    summaries = items if items and all(isinstance(s, PhaseSummary) for s in items) else phase_summary(items)
    if not summaries:
        return "(no trace records)\n"
    width = max([len("duration")] + [len(k) + 2 for s in summaries for k in (*s.durations, *s.timeline)])
    head = f"  {'':<{width}} {'warps':>6} {'min':>12} {'median':>12} {'max':>12}"
    lines = []
    for s in summaries:
        lines.append(f"{s.kernel}  PE {s.pe}  ({s.warps} warp{'s' if s.warps != 1 else ''} recorded, {s.unit})")
        lines.append(head)
        if s.durations or s.inverted:
            lines.append("  duration (end - begin)")
            for event, spread in s.durations.items():
                lines.append(_row(event, spread, width))
            for event, count in s.inverted.items():
                lines.append(f"    {event:<{width - 2}} {count:>6} with the end before the begin (not counted)")
        lines.append("  timeline (since the PE's first timestamp)")
        for point, spread in s.timeline.items():
            lines.append(_row(point, spread, width))
        lines.append("")
    return "\n".join(lines)


def _row(name: str, spread: Spread, width: int) -> str:
    return (f"    {name:<{width - 2}} {spread.count:>6} {_number(spread.min):>12} {_number(spread.median):>12} "
            f"{_number(spread.max):>12}")  # fmt: skip


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


# ----------------------------------------------------------------------------------------------------
# Export: Chrome trace-event JSON, which Perfetto's UI (https://ui.perfetto.dev) opens
# ----------------------------------------------------------------------------------------------------


def chrome_trace_events(traces, *, ns_per_tick: float | None = None, align: str = "start") -> list[dict]:
    """The trace events of ``export_to_perfetto`` (see there), as a list: metadata first, then per warp its
    slices in start order (an enclosing slice before those it encloses) and its instants."""
    traces = _as_traces(traces)
    if align not in ("start", "clock"):
        raise ValueError(f"align must be 'start' (each trace from its offset) or 'clock' (one time base), "
                         f"got {align!r}")  # fmt: skip
    scales = [_tick_ns(trace, ns_per_tick) for trace in traces]
    if align == "clock" and len(set(scales)) > 1:
        raise ValueError(f"align='clock' puts all traces on one timer, but their ticks differ ({sorted(set(scales))} "
                         "ns): use align='start'")  # fmt: skip
    # Timer values are large (NVIDIA's: ns since 1970, ~1.7e18, where a float is 256 ns coarse): subtract the
    # zero as integers first, convert after.
    clock_zero = min((r.t for tr in traces for r in tr.records), default=0)
    threads: dict[tuple[int, int], _Thread] = {}
    for trace, scale in zip(traces, scales):
        if not trace.records:
            continue
        zero = clock_zero if align == "clock" else min(r.t for r in trace.records)
        warps: dict[tuple[int, int, int], dict[tuple[str, str], int]] = {}
        for r in trace.records:
            warps.setdefault((r.pe, r.block, r.warp), {})[(r.event, r.phase)] = r.t
        for (pe, block, warp), points in warps.items():
            # tid 0 is the idle thread in Perfetto's process model (a second process's tid 0 is merged into
            # another thread): the warps count from 1
            tid = block * trace.warps_per_block + warp + 1
            thread = threads.setdefault((pe, tid), _Thread(f"block {block} warp {warp}"))
            args = {"kernel": trace.kernel, "block": block, "warp": warp}
            for (event, phase), t in points.items():
                ns = (t - zero) * scale + trace.offset_ns
                if phase == "instant":
                    thread.instants.append((ns, event, trace.label, args))
                elif phase == "begin" and points.get((event, "end"), -1) >= t:
                    thread.slices.append((ns, (points[(event, "end")] - t) * scale, event, trace.label, args))
                elif not (phase == "end" and points.get((event, "begin"), t + 1) <= t):
                    # a begin without its end, an end without its begin, or an end before its begin
                    thread.instants.append((ns, f"{event}:{phase}", trace.label, {**args, "unpaired": True}))
    out = []
    for pe in sorted({pe for pe, _ in threads}):
        out.append({"ph": "M", "name": "process_name", "pid": pe, "tid": 0, "args": {"name": f"PE {pe}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pe, "tid": 0, "args": {"sort_index": pe}})
    for (pe, tid), thread in sorted(threads.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": pe, "tid": tid, "args": {"name": thread.name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pe, "tid": tid, "args": {"sort_index": tid}})
    for (pe, tid), thread in sorted(threads.items()):
        out += thread.events(pe, tid)
    return out


def _tick_ns(trace: Trace, override: float | None) -> float:
    scale = _finite(override, "ns_per_tick") if override is not None else trace.ns_per_tick
    if scale is None:
        raise ValueError(f"trace '{trace.label}' ({trace.target or 'unknown target'}) counts timer ticks, not ns: "
                         "pass ns_per_tick= (MI300's REALTIME clock runs at 100 MHz: 10)")  # fmt: skip
    if scale <= 0:
        raise ValueError(f"ns_per_tick must be > 0, got {scale!r}")
    return scale


class _Thread:
    """One warp's track in the export: its slices (start ns, duration ns, name, cat, args) and instants."""

    def __init__(self, name: str):
        self.name = name
        self.slices: list[tuple] = []
        self.instants: list[tuple] = []

    def events(self, pid: int, tid: int) -> list[dict]:
        """The track's events. Slices of one track must nest (Perfetto drops a slice that starts inside
        another and ends after it): such a slice becomes its begin and end instants, marked ``overlaps``."""
        out, open_ends = [], []  # open_ends: the ends of the enclosing slices, innermost last
        for start, dur, name, cat, args in sorted(self.slices, key=lambda s: (s[0], -s[1])):
            while open_ends and start >= open_ends[-1]:
                open_ends.pop()
            if open_ends and start + dur > open_ends[-1]:
                marked = {**args, "overlaps": True}
                self.instants += [(start, f"{name}:begin", cat, marked), (start + dur, f"{name}:end", cat, marked)]
                continue
            open_ends.append(start + dur)
            out.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start / 1000.0,
                        "dur": dur / 1000.0, "args": args})  # fmt: skip
        for ts, name, cat, args in sorted(self.instants, key=lambda i: i[0]):
            out.append({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts / 1000.0,
                        "args": args})  # fmt: skip
        return out


def export_to_perfetto(path: str | os.PathLike, traces, *, ns_per_tick: float | None = None,
                       align: str = "start") -> dict:  # fmt: skip
    """Write ``traces`` (a Trace, a list of them, or bare TraceRecords) to ``path`` as Chrome trace-event JSON
    (``{"traceEvents": [...], "displayTimeUnit": "ns"}``), which https://ui.perfetto.dev opens.

    Each PE is a process (pid = PE, named "PE p"), each warp a thread (tid = 1 + linear warp within the PE,
    named "block b warp w"). A begin/end pair of a warp is an "X" (complete) event named after the event,
    an instant an "i" event (thread scope). A begin or end without its partner, or an end before its begin,
    is an "i" event named "event:phase" with ``args.unpaired``; a pair that would overlap another slice of
    its warp without nesting in it (Perfetto would drop it) becomes two such instants with
    ``args.overlaps``. Times are µs (floats; ``ts`` is µs whatever ``displayTimeUnit`` says, which only
    asks for ns display). With ``align="start"`` each trace's earliest timestamp is at its ``offset_ns``
    (``Trace.placed``); with ``"clock"`` all traces keep their positions on the timer (meaningful on one
    GPU), the earliest at 0, each shifted by its offset. ``ns_per_tick`` overrides the traces' own (needed
    for AMD's ticks). Returns the number of events written of each kind."""
    events = chrome_trace_events(traces, ns_per_tick=ns_per_tick, align=align)
    doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    counts = {"complete": 0, "instant": 0, "unpaired": 0, "overlapping": 0}
    for e in events:
        if e["ph"] == "X":
            counts["complete"] += 1
        elif e["ph"] == "i":
            kind = "overlapping" if e["args"].get("overlaps") else "unpaired" if e["args"].get("unpaired") else "instant"
            counts[kind] += 1
    return counts
