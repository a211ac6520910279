"""The runtime half of kernel trace points (runtime/trace.py): the bundle's ``trace`` field, the buffer
layout and its decoding, KernelSet.trace over the recording driver fakes of test_runtime_fakes (no GPU), the
phase analysis and the Chrome trace-event (Perfetto) export."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
from mori_compiler.lib_bitcode.kernel_abi import TRACE_GLOBAL_BYTES
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime import shmem
from mori_compiler.runtime.bundle import (BUNDLE_FORMAT, METADATA_FILE, BundleError, KernelInfo, KernelParam,
                                          load_bundle, publish_bundle)  # fmt: skip
from mori_compiler.runtime.cuda import CudaDriver
from mori_compiler.runtime.hip import HipDriver
from mori_compiler.runtime.launcher import KernelSet
from mori_compiler.runtime.trace import (Spread, Trace, TraceLayout, TraceRecord, decode_buffer, export_to_perfetto,
                                         format_phase_table, phase_summary, trace_symbol)  # fmt: skip
from test_runtime_fakes import FakeCudaModule, FakeGPU, FakeHipModule

EVENTS = ("copy:begin", "copy:end", "signal:instant")
PTX = b"// PTX text\n.version 7.8\n"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """No torch (the drivers' stream queries then answer 0 at once), no driver or shmem state leaking."""
    monkeypatch.setitem(sys.modules, "torch", None)
    driver_mod._reset_drivers()
    yield
    if shmem.current_state() is not None:
        shmem.shmem_finalize()
    driver_mod._reset_drivers()


def _kernel(name="k", trace=EVENTS, block=(128, 1, 1)):
    return KernelInfo(name, (KernelParam("arg0", "ptr"),), block, tuple(trace))


def _publish(tmp_path, kernels, *, backend="nvvm", virtual=False, state=False, key="e" * 64):
    return publish_bundle(tmp_path / "cache", key, target="sm_90" if backend == "nvvm" else "gfx942",
                          backend=backend, binary=PTX if backend == "nvvm" else b"\x7fELF..", kernels=kernels,
                          state_globals=[{"symbol": STATE_SYMBOL, "size": STATE_SIZE}] if state else [],
                          virtual_pes=virtual)  # fmt: skip


def _words(values: dict[int, int], n: int) -> bytes:
    """``n`` little-endian u64 words, ``values[i]`` at index i, 0 elsewhere."""
    out = [0] * n
    for i, v in values.items():
        out[i] = v
    return struct.pack(f"<{n}Q", *out)


# ---- the bundle's trace field -----------------------------------------------------------------------


def test_trace_field_round_trips_and_is_written_only_when_present(tmp_path):
    b = _publish(tmp_path, [_kernel("traced"), _kernel("plain", trace=())])
    assert b.kernels["traced"].trace_events == EVENTS and b.kernels["plain"].trace_events == ()
    meta = json.loads((b.path / METADATA_FILE).read_text())
    assert meta["format"] == BUNDLE_FORMAT == 3  # the optional field needed no new format
    assert meta["kernels"]["traced"]["trace"] == list(EVENTS)
    assert "trace" not in meta["kernels"]["plain"]


def _edit_trace(bundle, value):
    path = bundle.path / METADATA_FILE
    meta = json.loads(path.read_text())
    meta["kernels"]["k"]["trace"] = value
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("value, problem", [
    ("copy:begin", "must be a list"),
    ({"copy": "begin"}, "must be a list"),
    ([7], "slot 0: trace event 7 is not a string"),
    (["copy:begin", None], "slot 1: trace event None is not a string"),
    (["copy"], "slot 0: trace event 'copy' is not '<event>:<phase>'"),
    ([":begin"], "slot 0: trace event ':begin' is not '<event>:<phase>'"),
    (["co py:begin"], "slot 0: trace event 'co py:begin' is not"),
    (["a:b:begin"], "slot 0: trace event 'a:b:begin' is not"),
    (["copy:start"], "slot 0: trace event 'copy:start' has phase 'start' \\(allowed: begin, end, instant\\)"),
    (["copy:Begin"], "has phase 'Begin'"),
    (["copy:begin", "copy:end", "copy:begin"], "slot 2: 'copy:begin' appears twice"),
])  # fmt: skip
def test_a_bad_trace_field_is_refused_naming_the_kernel_and_field(tmp_path, value, problem):
    b = _publish(tmp_path, [_kernel()])
    _edit_trace(b, value)
    with pytest.raises(BundleError, match=f"kernel 'k' field trace.*{problem}") as info:
        load_bundle(b.path)
    assert info.value.path == b.path


def test_an_absent_or_empty_trace_field_means_not_traced(tmp_path):
    b = _publish(tmp_path, [_kernel()])
    _edit_trace(b, [])
    assert load_bundle(b.path).kernels["k"].trace_events == ()
    path = b.path / METADATA_FILE
    meta = json.loads(path.read_text())
    del meta["kernels"]["k"]["trace"]
    path.write_text(json.dumps(meta))
    assert load_bundle(b.path).kernels["k"].trace_events == ()


def test_publish_refuses_trace_events_the_loader_would_refuse(tmp_path):
    with pytest.raises(BundleError, match="refusing to publish: kernel 'k' field trace slot 1: 'a:end' appears twice"):
        _publish(tmp_path, [_kernel(trace=("a:end", "a:end"))])
    assert not (tmp_path / "cache" / "bundles" / ("e" * 64)).exists()


# ---- the layout and decoding ------------------------------------------------------------------------


def _slots(events=EVENTS):
    return tuple(tuple(e.split(":")) for e in events)


def test_decoding_with_virtual_pes_takes_the_pe_from_the_grid_z():
    # grid (2, 1) x 3 PEs, 96 threads on wave 32: 3 warps a block, 18 warps, 3 slots each
    layout = TraceLayout(_slots(), (2, 1, 3), 96, 32, virtual_pes=True)
    assert layout.warps_per_block == 3 and layout.warps == 18 and layout.nbytes == 18 * 3 * 8
    # linear warp 0: PE 0 block 0 warp 0; 4: PE 0 block 1 warp 1; 14: PE 2 block 0 warp 2 (block 4 = 2*2+0)
    data = _words({0 * 3 + 0: 100, 0 * 3 + 1: 150, 4 * 3 + 2: 7, 14 * 3 + 0: 2**64 - 1}, 18 * 3)
    records = decode_buffer("k", data, layout)
    assert records == [TraceRecord("k", 0, 0, 0, "copy", "begin", 100), TraceRecord("k", 0, 0, 0, "copy", "end", 150),
                       TraceRecord("k", 0, 1, 1, "signal", "instant", 7),
                       TraceRecord("k", 2, 0, 2, "copy", "begin", 2**64 - 1)]  # fmt: skip


def test_decoding_with_a_process_per_pe_uses_its_pe_and_the_whole_linear_block():
    # grid (2, 2, 2) (z is an ordinary dimension here), block (64, 2, 1) on wave 64: 2 warps a block
    layout = TraceLayout(_slots(("x:instant",)), (2, 2, 2), 128, 64, pe=5)
    assert layout.warps_per_block == 2 and layout.warps == 16
    data = _words({1: 11, 7: 77, 15: 1515}, 16)
    assert [(r.pe, r.block, r.warp, r.t) for r in decode_buffer("k", data, layout)] == [
        (5, 0, 1, 11), (5, 3, 1, 77), (5, 7, 1, 1515)]  # fmt: skip


def test_a_partial_last_warp_counts_as_a_warp_and_short_buffers_are_refused():
    layout = TraceLayout(_slots(("x:instant",)), (1, 1, 1), 100, 32)
    assert layout.warps_per_block == 4
    assert [r.warp for r in decode_buffer("k", _words({3: 9}, 4) + bytes(64), layout)] == [3]  # longer: fine
    with pytest.raises(ValueError, match="24 bytes cannot hold grid \\(1, 1, 1\\) x 100 threads \\(32 bytes\\)"):
        decode_buffer("k", bytes(24), layout)


# ---- KernelSet.trace over the fake drivers ----------------------------------------------------------


@pytest.fixture
def gpu():
    g = FakeGPU()
    g.kernels.update({"k": ("ptr",), "plain": ("ptr",)})
    g.globals[trace_symbol("k")] = TRACE_GLOBAL_BYTES  # {buffer address, slots}
    return g


@pytest.fixture
def cuda(gpu):
    return CudaDriver(bindings=FakeCudaModule(gpu))


def _pointer(gpu, ks, kernel="k") -> int:
    address, _ = ks.module.global_address(trace_symbol(kernel))
    return int.from_bytes(gpu.read(address, 8), "little")


def _slot_count(gpu, ks, kernel="k") -> int:
    """The global's second word: how many slots the kernel may write (its bound, whatever the launch)."""
    address, _ = ks.module.global_address(trace_symbol(kernel))
    return int.from_bytes(gpu.read(address + 8, 8), "little")


def _record(gpu, trace, values: dict[int, int]) -> None:
    """What the kernel would store: ``values[word index]``."""
    for index, t in values.items():
        gpu.write(trace.ptr + 8 * index, struct.pack("<Q", t))


def test_enable_writes_the_buffer_address_and_read_decodes_the_launch(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel(), _kernel("plain", trace=())]), driver=cuda)
    assert _pointer(gpu, ks) == 0  # untouched after load: tracing off
    trace = ks.trace("k", grid=(4, 1, 1), block=(64, 1, 1))
    assert trace.enabled and _pointer(gpu, ks) == trace.ptr and trace.nbytes == 4 * 2 * 3 * 8
    assert _slot_count(gpu, ks) == 4 * 2 * 3  # 4 blocks x 2 warps x 3 slots: the kernel's bound
    names = [c[0] for c in gpu.calls]
    zeroed = gpu.calls.index(("cuMemsetD8", trace.ptr, 0, trace.nbytes))
    assert names.index("cuCtxSynchronize", zeroed) > zeroed  # zeroed before any kernel can record
    assert gpu.read(trace.ptr, trace.nbytes) == bytes(trace.nbytes)
    ks.launch("k", [0], grid=(3, 1, 1), block=(64, 1, 1))
    # block 2 warp 1 = linear warp 5: copy begin/end; block 0 warp 0: signal
    _record(gpu, trace, {5 * 3 + 0: 1000, 5 * 3 + 1: 1750, 0 * 3 + 2: 990})
    got = trace.read()
    assert isinstance(got, Trace) and got.grid == (3, 1, 1) and got.block == (64, 1, 1) and got.ns_per_tick == 1.0
    assert got.records == (TraceRecord("k", 0, 0, 0, "signal", "instant", 990),
                           TraceRecord("k", 0, 2, 1, "copy", "begin", 1000),
                           TraceRecord("k", 0, 2, 1, "copy", "end", 1750))  # fmt: skip
    assert any(c[0] == "cuMemcpyDtoHAsync" and c[1:3] == (trace.ptr, 3 * 2 * 3 * 8) for c in gpu.calls)


def test_a_launch_larger_than_the_buffer_is_refused_before_it_runs(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel()]), driver=cuda)
    ks.trace("k", grid=(4, 1, 1))  # the bundle's block: 128 threads, 4 warps
    ks.launch("k", [0], grid=(2, 2, 1))  # 16 warps: fits
    ks.launch("k", [0], grid=(8, 1, 1), block=(64, 1, 1))  # 16 warps: fits too
    with pytest.raises(ValueError, match="traced for up to 16 warps .* grid \\(4, 1, 1\\) x block \\(256, 1, 1\\) "
                                         "has 32: trace it again for the larger grid"):
        ks.launch("k", [0], grid=(4, 1, 1), block=(256, 1, 1))
    assert len(gpu.launches) == 2


def test_read_refuses_mixed_launch_shapes_until_reset_or_told_the_shape(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel()]), driver=cuda)
    trace = ks.trace("k", grid=(4, 1, 1), block=(64, 1, 1))
    ks.launch("k", [0], grid=(4, 1, 1), block=(64, 1, 1))
    ks.launch("k", [0], grid=(2, 1, 1), block=(64, 1, 1))
    _record(gpu, trace, {3 * 3 + 1: 5})
    with pytest.raises(ValueError, match="several shapes since the last reset .*reset\\(\\) between them"):
        trace.read()
    assert [(r.block, r.warp) for r in trace.read(grid=(2, 1, 1), block=(64, 1, 1)).records] == [(1, 1)]
    with pytest.raises(ValueError, match="grid must be 3 positive integers"):
        trace.read(grid=(2, 1))
    with pytest.raises(ValueError, match="has 16 warps; the buffer holds 8"):
        trace.read(grid=(8, 1, 1), block=(64, 1, 1))
    trace.reset(stream=9)
    assert ("cuMemsetD8Async", trace.ptr, 0, trace.nbytes, 9) in gpu.calls
    assert trace.read().records == ()
    ks.launch("k", [0], grid=(2, 1, 1), block=(64, 1, 1))
    _record(gpu, trace, {3 * 3 + 1: 5})
    assert trace.read().grid == (2, 1, 1)


def test_disable_waits_for_the_device_then_clears_the_global_and_frees(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel()]), driver=cuda)
    trace = ks.trace("k", grid=2)
    ptr, before = trace.ptr, len(gpu.calls)
    trace.disable()
    assert not trace.enabled and _pointer(gpu, ks) == 0 and ptr not in gpu.memory
    names = [c[0] for c in gpu.calls[before:]]
    assert names.index("cuCtxSynchronize") < names.index("cuMemFree")  # no kernel still writes into it
    for call in (trace.read, trace.reset):
        with pytest.raises(RuntimeError, match="trace of 'k' was disabled"):
            call()
    trace.disable()  # twice: nothing more
    ks.launch("k", [0], grid=(64, 1, 1))  # no longer traced: no limit
    assert len(gpu.launches) == 1


def test_tracing_again_replaces_the_buffer_and_close_frees_it(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel()]), driver=cuda)
    first = ks.trace("k", grid=2)
    second = ks.trace("k", grid=8)
    assert not first.enabled and first.ptr == 0 and _pointer(gpu, ks) == second.ptr
    ks.launch("k", [0], grid=8)
    ptr = second.ptr
    ks.close()
    assert not second.enabled and ptr not in gpu.memory


def test_trace_refuses_untraced_unknown_and_inconsistent_kernels(tmp_path, gpu, cuda):
    gpu.kernels["lost"] = ("ptr",)
    ks = KernelSet(_publish(tmp_path, [_kernel(), _kernel("plain", trace=()), _kernel("lost")]), driver=cuda)
    with pytest.raises(ValueError, match="kernel 'plain' has no trace points: compile it with trace=True"):
        ks.trace("plain", grid=1)
    with pytest.raises(BundleError, match="has no kernel 'nope' \\(has: k, lost, plain\\)"):
        ks.trace("nope", grid=1)
    with pytest.raises(ValueError, match="lists trace events for it but its code object has no global "
                                         "__mori_trace_lost .*rebuild the bundle"):
        ks.trace("lost", grid=1)
    with pytest.raises(ValueError, match="grid must be 1..3 positive integers"):
        ks.trace("k", grid=(0, 1))
    with pytest.raises(ValueError, match="n_pes= applies to virtual PEs only"):
        ks.trace("k", grid=1, n_pes=2)
    with pytest.raises(ValueError, match="pe must be a PE number >= 0, got -1"):
        ks.trace("k", grid=1, pe=-1)
    gpu.globals[trace_symbol("k")] = 4
    with pytest.raises(ValueError, match="global __mori_trace_k has 4 bytes"):
        ks.trace("k", grid=1)
    assert not ks._traces and len(gpu.memory) == len(gpu.module_globals)  # nothing allocated was kept


def test_a_process_per_pe_records_its_own_pe(tmp_path, gpu, cuda):
    ks = KernelSet(_publish(tmp_path, [_kernel()]), driver=cuda)
    trace = ks.trace("k", grid=(2, 1, 1), block=(32, 1, 1), pe=3)
    ks.launch("k", [0], grid=(2, 1, 1), block=(32, 1, 1))
    _record(gpu, trace, {1 * 3 + 2: 42})
    assert trace.read().records == (TraceRecord("k", 3, 1, 0, "signal", "instant", 42),)


def test_virtual_pes_take_the_grid_z_from_shmem(tmp_path, monkeypatch, gpu):
    module = FakeCudaModule(gpu)
    monkeypatch.setattr(driver_mod, "_drivers", {"nvvm": CudaDriver(bindings=module)})
    shmem.shmem_init_virtual(2, heap_size=1 << 20)
    ks = KernelSet(_publish(tmp_path, [_kernel()], virtual=True, state=True))
    with pytest.raises(ValueError, match="with virtual PEs the PE is the grid's z index"):
        ks.trace("k", grid=(2, 1), pe=1)
    trace = ks.trace("k", grid=(2, 1), block=(64, 1, 1))
    assert trace.grid == (2, 1, 2) and trace.nbytes == 2 * 2 * 2 * 3 * 8
    ks.launch_virtual("k", [[0], [0]], grid=(2, 1), block=(64, 1, 1))
    # linear warp 6 = linear block 3 = PE 1 block 1, warp 0
    _record(gpu, trace, {6 * 3 + 0: 10, 6 * 3 + 1: 30})
    assert [(r.pe, r.block, r.warp, r.phase) for r in trace.read().records] == [(1, 1, 0, "begin"), (1, 1, 0, "end")]
    with pytest.raises(ValueError, match="this launch of grid \\(3, 1, 2\\) x block \\(64, 1, 1\\) has 12"):
        ks.launch_virtual("k", [[0], [0]], grid=(3, 1), block=(64, 1, 1))
    assert ks.trace("k", grid=(2, 1), n_pes=4).grid == (2, 1, 4)


def test_a_replay_the_trace_did_not_see_is_decoded_only_with_its_grid(tmp_path, monkeypatch, gpu):
    """A CUDA-graph replay goes past the KernelSet: with virtual PEs the records' PEs depend on the replayed grid,
    so read() refuses to guess it; told the grid, it decodes (here a replay of 1 block per PE into a buffer for 2)."""
    module = FakeCudaModule(gpu)
    monkeypatch.setattr(driver_mod, "_drivers", {"nvvm": CudaDriver(bindings=module)})
    shmem.shmem_init_virtual(2, heap_size=1 << 20)
    ks = KernelSet(_publish(tmp_path, [_kernel()], virtual=True, state=True))
    trace = ks.trace("k", grid=(2, 1), block=(64, 1, 1))
    _record(gpu, trace, {2 * 3 + 0: 10})  # linear warp 2 of a (1, 1, 2) grid = PE 1 block 0 warp 0
    with pytest.raises(ValueError, match="no launch of it was seen since the last reset"):
        trace.read()
    got = trace.read(grid=(1, 1, 2), block=(64, 1, 1))
    assert [(r.pe, r.block, r.warp) for r in got.records] == [(1, 0, 0)]


def test_amd_wave64_and_its_timer_in_ticks(tmp_path, gpu):
    ks = KernelSet(_publish(tmp_path, [_kernel()], backend="rocdl"), driver=HipDriver(bindings=FakeHipModule(gpu)))
    trace = ks.trace("k", grid=1, block=(128, 1, 1))
    assert trace.capacity_warps == 2  # 128 threads / 64 lanes
    _record(gpu, trace, {1 * 3 + 2: 5})
    got = trace.read()
    assert got.records == (TraceRecord("k", 0, 0, 1, "signal", "instant", 5),)
    assert got.ns_per_tick is None and got.unit == "ticks" and got.target == "gfx942"


# ---- analysis ---------------------------------------------------------------------------------------


def _records():
    """Kernel k on two PEs (virtual PEs: one clock). PE 0: three warps, one of which ended its copy before
    it began (a loop's last iteration that began but did not end), PE 1: one warp."""
    r = TraceRecord
    return [r("k", 0, 0, 0, "copy", "begin", 1000), r("k", 0, 0, 0, "copy", "end", 1300),
            r("k", 0, 0, 0, "signal", "instant", 1400),
            r("k", 0, 0, 1, "copy", "begin", 1010), r("k", 0, 0, 1, "copy", "end", 1110),
            r("k", 0, 1, 0, "copy", "begin", 1200), r("k", 0, 1, 0, "copy", "end", 1100),
            r("k", 0, 1, 0, "signal", "instant", 1500),
            r("k", 1, 0, 0, "copy", "begin", 5000), r("k", 1, 0, 0, "copy", "end", 5600)]  # fmt: skip


def _trace(records=None, **kw):
    args = dict(kernel="k", records=tuple(_records() if records is None else records), target="sm_90",
                slots=_slots(), grid=(2, 1, 2), block=(64, 1, 1), warps_per_block=2, ns_per_tick=1.0)  # fmt: skip
    args.update(kw)
    return Trace(**args)


def test_phase_summary_gives_durations_per_pe_and_the_timeline_since_the_pes_first_timestamp():
    pe0, pe1 = phase_summary(_trace())
    assert (pe0.kernel, pe0.pe, pe0.warps, pe0.t0, pe0.unit) == ("k", 0, 3, 1000, "ns")
    # copy: 300 and 100 (the inverted warp is counted apart, not as -100)
    assert pe0.durations == {"copy": Spread(2, 100, 200, 300)} and pe0.inverted == {"copy": 1}
    assert pe0.timeline == {"copy:begin": Spread(3, 0, 10, 200), "copy:end": Spread(3, 100, 110, 300),
                            "signal:instant": Spread(2, 400, 450, 500)}  # fmt: skip
    assert (pe1.pe, pe1.t0, pe1.warps) == (1, 5000, 1)
    assert pe1.durations == {"copy": Spread(1, 600, 600, 600)} and pe1.inverted == {}
    assert pe1.timeline == {"copy:begin": Spread(1, 0, 0, 0), "copy:end": Spread(1, 600, 600, 600)}


def test_phase_summary_of_bare_records_groups_them_by_kernel_in_ticks():
    extra = [TraceRecord("other", 2, 0, 0, "x", "instant", 77)]
    summaries = phase_summary(_records() + extra)
    assert [(s.kernel, s.pe, s.unit) for s in summaries] == [("k", 0, "ticks"), ("k", 1, "ticks"),
                                                             ("other", 2, "ticks")]  # fmt: skip
    assert summaries[0].durations == phase_summary(_trace())[0].durations
    assert summaries[2].timeline == {"x:instant": Spread(1, 0, 0, 0)} and summaries[2].durations == {}
    with pytest.raises(TypeError, match="expected a Trace"):
        phase_summary([1, 2])


def test_format_phase_table_shows_each_number():
    table = format_phase_table(_trace())
    lines = table.splitlines()
    assert lines[0] == "k  PE 0  (3 warps recorded, ns)"
    row = next(line for line in lines if line.strip().startswith("copy ") and "the end before" not in line)
    assert row.split() == ["copy", "2", "100", "200", "300"]
    assert any(line.split() == ["signal:instant", "2", "400", "450", "500"] for line in lines)
    assert any("copy" in line and "1 with the end before the begin" in line for line in lines)
    assert "k  PE 1  (1 warp recorded, ns)" in lines
    assert format_phase_table(phase_summary(_trace())) == table  # summaries or traces: the same table
    assert format_phase_table(_trace(records=())) == "(no trace records)\n"


def test_a_median_between_two_warps_is_shown_with_its_fraction():
    records = [TraceRecord("k", 0, 0, w, "copy", p, t) for w, (b, e) in enumerate([(0, 3), (0, 4)])
               for p, t in (("begin", b), ("end", e))]  # fmt: skip
    (s,) = phase_summary(_trace(records))
    assert s.durations["copy"] == Spread(2, 3, 3.5, 4)
    assert any(line.split() == ["copy", "2", "3", "3.5", "4"] for line in format_phase_table([s]).splitlines())


# ---- the Perfetto (Chrome trace-event JSON) export ------------------------------------------------


def _export(tmp_path, traces, **kw):
    path = tmp_path / "trace.json"
    counts = export_to_perfetto(path, traces, **kw)
    doc = json.loads(path.read_text())
    assert set(doc) == {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] == "ns"
    for e in doc["traceEvents"]:  # the trace-event format's required fields, by kind
        assert e["ph"] in ("X", "i", "M") and isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M" or e["name"].startswith("thread_"):
            assert e["tid"] >= 1  # Perfetto's tid 0 is the idle thread: a second PE's would be merged away
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
        if e["ph"] == "i":
            assert isinstance(e["ts"], float) and e["s"] == "t"
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
    return doc["traceEvents"], counts


def _by(events, ph):
    return [e for e in events if e["ph"] == ph]


def test_export_writes_complete_instant_and_metadata_events(tmp_path):
    events, counts = _export(tmp_path, _trace())
    assert counts == {"complete": 3, "instant": 2, "unpaired": 2, "overlapping": 0}
    complete = sorted((e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in _by(events, "X"))
    # µs since the trace's earliest timestamp (1000 ns); tid = 1 + block * 2 warps + warp
    assert complete == [(0, 1, "copy", 0.0, 0.3), (0, 2, "copy", 0.01, 0.1), (1, 1, "copy", 4.0, 0.6)]
    instants = sorted((e["pid"], e["tid"], e["name"], e["ts"], e["args"].get("unpaired", False))
                      for e in _by(events, "i"))  # fmt: skip
    assert instants == [(0, 1, "signal", 0.4, False), (0, 3, "copy:begin", 0.2, True), (0, 3, "copy:end", 0.1, True),
                        (0, 3, "signal", 0.5, False)]  # fmt: skip
    x = _by(events, "X")[0]
    assert x["cat"] == "k" and x["args"] == {"kernel": "k", "block": 0, "warp": 0}
    names = {(e["name"], e["pid"], e["tid"]): e["args"] for e in _by(events, "M")}
    assert names[("process_name", 0, 0)] == {"name": "PE 0"} and names[("process_name", 1, 0)] == {"name": "PE 1"}
    assert names[("thread_name", 0, 3)] == {"name": "block 1 warp 0"}
    assert names[("thread_name", 0, 2)] == {"name": "block 0 warp 1"}
    assert sum(1 for e in _by(events, "M") if e["name"] == "thread_name") == 4  # each warp named once


def test_export_places_several_traces_by_offset_or_on_one_clock(tmp_path):
    first = _trace()
    later = _trace([TraceRecord("k", 0, 0, 0, "copy", "begin", 3000), TraceRecord("k", 0, 0, 0, "copy", "end", 3500)])
    events, _ = _export(tmp_path, [first, later.placed(name="k again", offset_ns=10_000)])
    again = [e for e in _by(events, "X") if e["cat"] == "k again"]
    assert [(e["ts"], e["dur"]) for e in again] == [(10.0, 0.5)]  # its own start at its offset
    events, _ = _export(tmp_path, [first, later.placed(offset_ns=500)], align="clock")
    assert sorted((e["ts"], e["dur"]) for e in _by(events, "X") if e["pid"] == 0 and e["tid"] == 1) == [
        (0.0, 0.3), (2.5, 0.5)]  # fmt: skip
    assert sum(1 for e in _by(events, "M") if e["name"] == "thread_name" and e["tid"] == 1 and e["pid"] == 0) == 1
    with pytest.raises(ValueError, match="align must be 'start' .* or 'clock'"):
        export_to_perfetto(tmp_path / "x.json", first, align="pe")
    with pytest.raises(ValueError, match="offset_ns must be a finite number"):
        first.placed(offset_ns=float("nan"))


def test_export_of_amd_ticks_needs_the_tick_length(tmp_path):
    amd = _trace(target="gfx942", ns_per_tick=None)
    with pytest.raises(ValueError, match="trace 'k' \\(gfx942\\) counts timer ticks, not ns: pass ns_per_tick="):
        export_to_perfetto(tmp_path / "x.json", amd)
    assert not (tmp_path / "x.json").exists()
    events, _ = _export(tmp_path, amd, ns_per_tick=10)
    assert sorted((e["ts"], e["dur"]) for e in _by(events, "X"))[0] == (0.0, 3.0)  # 300 ticks of 10 ns
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ValueError, match="ns_per_tick"):
            export_to_perfetto(tmp_path / "x.json", amd, ns_per_tick=bad)


def test_an_empty_trace_exports_an_empty_event_list(tmp_path):
    events, counts = _export(tmp_path, _trace(records=()))
    assert events == [] and counts == {"complete": 0, "instant": 0, "unpaired": 0, "overlapping": 0}


def test_slices_of_a_warp_that_overlap_without_nesting_become_marked_instants(tmp_path):
    # Perfetto drops a slice of a track that starts inside another and ends after it: "late" here.
    spans = {"outer": (0, 100), "inner": (0, 20), "late": (50, 150), "next": (100, 120)}
    records = [TraceRecord("k", 0, 0, 0, name, phase, 1000 + t) for name, (b, e) in spans.items()
               for phase, t in (("begin", b), ("end", e))]  # fmt: skip
    slots = tuple((name, phase) for name in spans for phase in ("begin", "end"))
    events, counts = _export(tmp_path, _trace(records, slots=slots))
    assert counts == {"complete": 3, "instant": 0, "unpaired": 0, "overlapping": 2}
    # slices in start order, an enclosing one before those it encloses (same start: the longer first)
    assert [(e["name"], e["ts"], e["dur"]) for e in _by(events, "X")] == [
        ("outer", 0.0, 0.1), ("inner", 0.0, 0.02), ("next", 0.1, 0.02)]  # fmt: skip
    assert [(e["name"], e["ts"], e["args"]["overlaps"]) for e in _by(events, "i")] == [
        ("late:begin", 0.05, True), ("late:end", 0.15, True)]  # fmt: skip
    # the analysis keeps its true duration
    (s,) = phase_summary(_trace(records, slots=slots))
    assert s.durations["late"] == Spread(1, 100, 100, 100)


def test_export_keeps_ns_of_timestamps_as_large_as_nvidias(tmp_path):
    # %globaltimer counts ns since 1970 (~1.7e18), where a float is 256 ns coarse: the export subtracts the
    # start as integers before converting.
    base = 1_700_000_000_000_000_000
    records = [TraceRecord("k", 0, 0, w, "copy", phase, base + t)
               for w, times in enumerate([(135, 1036), (7, 8)]) for phase, t in zip(("begin", "end"), times)]
    for align in ("start", "clock"):
        events, _ = _export(tmp_path, _trace(records), align=align)
        assert sorted((e["tid"], round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in _by(events, "X")) == [
            (1, 128, 901), (2, 0, 1)]  # fmt: skip
    with pytest.raises(ValueError, match="align='clock' puts all traces on one timer, but their ticks differ"):
        export_to_perfetto(tmp_path / "x.json", [_trace(records), _trace(records, ns_per_tick=2.0)], align="clock")


def test_the_table_in_docs_tracing_md_is_what_format_phase_table_prints():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tracing.md").read_text(encoding="utf-8")
    shown = doc.split("For the synthetic records of", 1)[1].split("```", 2)[1].strip("\n")
    printed = format_phase_table(_trace()).split("\n\n")[0]  # PE 0's part
    assert shown == printed
