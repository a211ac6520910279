"""bench/copy_engine_overlap.py: its pure parts (copy lists, gains, driver argument arrays, table, JSON), the
whole run over a pretend GPU (a numpy-backed torch and driver: every copy really moves bytes, so the
verification is exercised, a mechanism that drops a copy is reported wrong and a refused call is reported with
the driver's error), the PTX kernel through ptxas, and the real run on a GPU (``gpu`` marker)."""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import REPO_ROOT

BENCH = REPO_ROOT / "bench" / "copy_engine_overlap.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("copy_engine_overlap", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["copy_engine_overlap"] = module
    spec.loader.exec_module(module)
    return module


ceo = _load_bench()
Copy = ceo.Copy


# ---- copy lists ---------------------------------------------------------------------------------------
def test_routing_has_distinct_sorted_destinations_and_the_expected_mean():
    routing = ceo.asyncll_routing(8, 128, seed=3)
    assert len(routing) == 8 and all(len(toks) == 128 for toks in routing)
    for toks in routing:
        for dests in toks:
            assert dests == sorted(set(dests)) and all(0 <= d < 8 for d in dests) and 1 <= len(dests) <= 8
    mean = sum(len(d) for toks in routing for d in toks) / (8 * 128)
    assert 5.0 < mean < 5.6  # E = 8 (1 - C(224, 8) / C(256, 8)) = 5.28
    with pytest.raises(ValueError, match="split evenly"):
        ceo.asyncll_routing(7, 4)


def _moved(case):
    """{destination byte: source byte} of every byte a case copies (the copies must not overlap)."""
    moved = {}
    for c in case.copies:
        for i in range(c.nbytes):
            assert c.dst + i not in moved, "two copies write one destination byte"
            moved[c.dst + i] = c.src + i
    return moved


def test_rows_runs_and_block_cases_deliver_every_routed_row_where_the_receiver_reads_it():
    routing = [[[0, 1], [1]], [[0], [0, 1]]]  # 2 PEs, 2 tokens each
    rb, world, tokens = 4, 2, 2
    rows, runs, block = (f(routing, row_bytes=rb) for f in (ceo.asyncll_rows_case, ceo.asyncll_runs_case,
                                                           ceo.asyncll_block_case))  # fmt: skip
    assert len(rows.copies) == 6 and rows.nbytes == 6 * rb
    assert len(runs.copies) == 4 and runs.nbytes == rows.nbytes  # the same bytes as W*W runs
    assert len(block.copies) == world * world and block.nbytes == world * world * tokens * rb
    assert rows.recv_rows == runs.recv_rows == block.recv_rows == 6
    # The receiver gathers, per destination, by source then slot: source row (s, t) must be what it reads.
    want = [(s, t) for d in range(world) for s in range(world) for t in range(tokens) if d in routing[s][t]]
    for case, staged in ((rows, False), (block, False)):
        moved = _moved(case)
        got = [moved[r * rb] // rb for r in case.recv_src_rows]
        assert got == [s * tokens + t for s, t in want], case.name
    # runs copy from the sender's staging [s][d][slot]; the slot order is the token order
    moved = _moved(runs)
    staging = [moved[r * rb] // rb for r in runs.recv_src_rows]
    assert staging == [(s * world + d) * tokens + slot for d in range(world) for s in range(world)
                       for slot in range(sum(d in routing[s][t] for t in range(tokens)))]  # fmt: skip


def test_plain_case_and_spans():
    case = ceo.plain_case(3, row_bytes=10)
    assert case.copies == (Copy(0, 0, 30),) and case.span == (30, 30) and case.recv_rows == 0
    assert "MiB" in ceo.plain_case(128).name


def test_split_copies_cuts_big_copies_and_keeps_small_ones():
    out = ceo.split_copies([Copy(100, 1000, 10), Copy(0, 0, 3)], 4)
    assert out == [Copy(100, 1000, 4), Copy(104, 1004, 4), Copy(108, 1008, 2), Copy(0, 0, 3)]
    with pytest.raises(ValueError, match="positive"):
        ceo.split_copies([Copy(0, 0, 1)], 0)


def test_row_indices_expands_whole_rows_and_refuses_partial_ones():
    assert ceo.row_indices([Copy(20, 0, 20), Copy(0, 40, 10)], 10) == ([0, 1, 4], [2, 3, 0])
    assert ceo.row_indices([Copy(5, 0, 10)], 10) is None
    assert ceo.row_indices([Copy(0, 0, 15)], 10) is None


def test_descriptor_bytes_are_dst_src_size_triples():
    blob = ceo.descriptor_bytes([Copy(1, 2, 3), Copy(10, 20, 30)], 1 << 40, 1 << 41)
    assert len(blob) == 48
    assert np.frombuffer(blob, dtype="<u8").tolist() == [(1 << 40) + 1, (1 << 41) + 2, 3,
                                                          (1 << 40) + 10, (1 << 41) + 20, 30]  # fmt: skip


# ---- gains, table, JSON -------------------------------------------------------------------------------
def test_gains():
    assert ceo.overlap_gain(100, 200, 300) == 1.0
    assert ceo.overlap_gain(100, 200, 200) == 1.5
    assert ceo.projected_gain(100, 200, 200, 100) == pytest.approx(400 / 300)
    with pytest.raises(ValueError):
        ceo.overlap_gain(1, 1, 0)
    r = ceo.Result("c", "m", 1, 2**20, t_copy_us=100.0, t_mm_us=200.0, t_both_us=240.0, t_mm_in_both_us=220.0,
                   t_recv_us=50.0)  # fmt: skip
    assert r.gain == pytest.approx(1.25) and r.mm_slowdown == pytest.approx(1.1)
    assert r.projected == pytest.approx(350 / 290)
    assert ceo.Result("c", "m", 1, 1).gain is None and ceo.Result("c", "m", 1, 1).projected is None


def test_table_json_and_summary():
    ok = ceo.Result("copy 14.00 MiB", "batch[overlap,stream]", 1, 14 << 20, t_copy_us=10.0, t_mm_us=20.0,
                    t_both_us=20.0, t_mm_in_both_us=21.0, host_enqueue_us=5.0)  # fmt: skip
    bad = ceo.Result("copy 14.00 MiB", "torch_copy", 1, 14 << 20, status="unsupported: x failed: E")
    lines = ceo.format_table([ok, bad]).splitlines()
    assert lines[0].split()[:3] == ["case", "mechanism", "copies"] and len(lines) == 3
    assert "1.50" in lines[1] and "14.00" in lines[1] and lines[2].endswith("unsupported: x failed: E")
    assert lines[2].count(" - ") >= 5  # missing values shown as '-'
    data = json.loads(ceo.report_json({"device": "X"}, [ok, bad], [{"variant": "v", "result": "r"}]))
    assert data["meta"] == {"device": "X"} and data["probes"][0]["result"] == "r"
    assert data["results"][0]["gain"] == 1.5 and data["results"][1]["gain"] is None
    assert data["results"][0]["copy_GBps"] == pytest.approx((14 << 20) / 10.0 / 1e3)
    assert ceo.summary([ok, bad]) == ["copy 14.00 MiB: best gain 1.50x by batch[overlap,stream] (mm x1.05)"]
    assert ceo.summary([bad]) == ["copy 14.00 MiB: nothing measured"]


# ---- the driver's argument arrays, over a pretend cuda.bindings.driver ----------------------------------
class FakeResult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


class FakeDevicePtr:
    def __init__(self, value=0):
        self.value = int(value)

    def __int__(self):
        return self.value


class FakeLocation:
    def __init__(self):
        self.type, self.id = 0, 0


class FakeAttributes:
    def __init__(self):
        self.srcAccessOrder, self.flags = FakeOrder.CU_MEMCPY_SRC_ACCESS_ORDER_INVALID, 0
        self.srcLocHint, self.dstLocHint = FakeLocation(), FakeLocation()


FakeOrder = enum.IntEnum("CUmemcpySrcAccessOrder", {"CU_MEMCPY_SRC_ACCESS_ORDER_INVALID": 0,
                                                    "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM": 1,
                                                    "CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL": 2,
                                                    "CU_MEMCPY_SRC_ACCESS_ORDER_ANY": 3})  # fmt: skip
FakeFlags = enum.IntEnum("CUmemcpyFlags", {"CU_MEMCPY_FLAG_DEFAULT": 0, "CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE": 1})
FakeLocType = enum.IntEnum("CUmemLocationType", {"CU_MEM_LOCATION_TYPE_DEVICE": 1})


def test_attributes_and_batch_arguments():
    cu = types.SimpleNamespace(CUmemcpyAttributes=FakeAttributes, CUmemLocation=FakeLocation, CUmemcpyFlags=FakeFlags,
                               CUmemLocationType=FakeLocType, CUmemcpySrcAccessOrder=FakeOrder,
                               CUdeviceptr=FakeDevicePtr)  # fmt: skip
    attr = ceo.memcpy_attributes(cu, order="ANY", overlap=True, src_device=0, dst_device=1)
    assert attr.srcAccessOrder == FakeOrder.CU_MEMCPY_SRC_ACCESS_ORDER_ANY and attr.flags == 1
    assert (attr.srcLocHint.type, attr.srcLocHint.id, attr.dstLocHint.id) == (1, 0, 1)
    assert ceo.memcpy_attributes(cu, order="STREAM", overlap=False, src_device=0, dst_device=0).flags == 0
    dsts, srcs, sizes, count, attrs, idxs, n_attrs = ceo.batch_arguments(
        cu, [Copy(16, 32, 8), Copy(0, 64, 4)], 1000, 5000, attr)
    assert [int(d) for d in dsts] == [1016, 1000] and [int(s) for s in srcs] == [5032, 5064]
    assert all(isinstance(d, FakeDevicePtr) for d in dsts + srcs)
    assert (sizes, count, attrs, idxs, n_attrs) == ([8, 4], 2, [attr], [0], 1)
    with pytest.raises(ValueError, match="empty"):
        ceo.batch_arguments(cu, [], 0, 0, attr)


# ---- the whole run over a pretend GPU ---------------------------------------------------------------------
class Memory:
    """Device memory of the pretend GPUs: allocations at fake addresses, each a numpy byte array."""

    def __init__(self):
        self.next, self.blocks, self.calls_seen = 1 << 32, [], False

    def alloc(self, nbytes):
        buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
        base, self.next = self.next, self.next + ((nbytes >> 20) + 2 << 20)
        self.blocks.append((base, buf))
        return base, buf

    def view(self, addr, n):
        for base, buf in self.blocks:
            if base <= addr and addr + n <= base + buf.size:
                return buf[addr - base:addr - base + n]
        raise AssertionError(f"address {addr:#x} + {n} outside every allocation")

    def copy(self, dst, src, n):
        self.view(dst, n)[:] = self.view(src, n)


class FakeDevice:
    def __init__(self, spec="cuda", index=None):
        if isinstance(spec, str) and ":" in spec:
            spec, index = spec.split(":")
        self.index = 0 if index is None else int(index)

    def __eq__(self, other):
        return isinstance(other, FakeDevice) and other.index == self.index

    def __hash__(self):
        return self.index


class FakeTensor:
    """A byte tensor of the pretend GPU: a numpy view, and the allocation it lives in (None: host data)."""

    def __init__(self, torch, arr, device, root=None):
        self.t, self.arr, self.device, self.root = torch, arr, device, root

    @classmethod
    def alloc(cls, torch, n, device, dtype=np.uint8):
        addr, buf = torch.memory.alloc(n * np.dtype(dtype).itemsize)
        return cls(torch, buf.view(dtype)[:n], device, (addr, buf))

    def data_ptr(self):
        addr, buf = self.root
        return addr + self.arr.__array_interface__["data"][0] - buf.__array_interface__["data"][0]

    def __getitem__(self, key):
        return FakeTensor(self.t, self.arr[key], self.device, self.root)

    def view(self, *shape):
        return FakeTensor(self.t, self.arr.reshape(shape), self.device, self.root)

    def numel(self):
        return self.arr.size

    def fill_(self, value):
        self.arr[...] = value
        return self

    def copy_(self, src):
        self.arr[...] = src.arr
        return self

    def index_select(self, dim, idx):
        assert dim == 0
        return FakeTensor(self.t, self.arr[idx.arr].copy(), self.device)

    def index_copy_(self, dim, idx, src):
        assert dim == 0
        self.arr[idx.arr] = src.arr
        return self

    def to(self, device):
        device = FakeDevice(device) if isinstance(device, str) else device
        moved = FakeTensor.alloc(self.t, self.arr.size, device, self.arr.dtype)
        moved.arr = moved.arr.reshape(self.arr.shape)
        moved.arr[...] = self.arr
        return moved

    def __ne__(self, other):
        return FakeTensor(self.t, self.arr != other.arr, self.device)

    def any(self, dim):
        return FakeTensor(self.t, self.arr.any(axis=dim), self.device)

    def nonzero(self):
        return FakeTensor(self.t, np.argwhere(self.arr), self.device)

    def flatten(self):
        return FakeTensor(self.t, self.arr.reshape(-1), self.device)

    def __int__(self):
        return int(self.arr)


class FakeEvent:
    clock = [0.0]

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        FakeEvent.clock[0] += 0.01
        self.t = FakeEvent.clock[0]

    def query(self):
        return False  # the pretend GPU is always still in the gate when the host is done

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


class FakeStream:
    handles = [100]

    def __init__(self, priority=0, device=None):
        FakeStream.handles[0] += 1
        self.cuda_stream = FakeStream.handles[0]

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass


def fake_torch(memory, gpus):
    torch = types.ModuleType("torch")
    torch.memory = memory
    torch.__version__, torch.version = "0-fake", types.SimpleNamespace(cuda="13.0", hip=None)
    torch.uint8, torch.int64, torch.bfloat16 = np.uint8, np.int64, np.float32

    def dev(device):
        return device if isinstance(device, FakeDevice) else FakeDevice(device or "cuda")

    torch.device = FakeDevice
    torch.Generator = lambda device=None: types.SimpleNamespace(manual_seed=lambda s: None)
    torch.zeros = lambda *shape, device=None, dtype=np.uint8: FakeTensor.alloc(torch, int(np.prod(shape)), dev(device))

    def randint(lo, hi, shape, dtype=None, device=None, generator=None):
        t = FakeTensor.alloc(torch, shape[0], dev(device))
        t.arr[:] = np.random.default_rng(7).integers(lo, hi, shape[0], dtype=np.uint8)
        return t

    torch.randint = randint
    torch.empty = lambda *shape, dtype=np.uint8, device=None: FakeTensor.alloc(torch, int(np.prod(shape)), dev(device))
    torch.empty_like = lambda t: FakeTensor.alloc(torch, t.numel(), t.device)
    torch.randn = lambda *shape, device=None, dtype=None: FakeTensor.alloc(torch, int(np.prod(shape)), dev(device))
    torch.matmul = lambda a, b, out=None: out

    def tensor(values, dtype=None, device=None):
        t = FakeTensor.alloc(torch, len(values), dev(device), np.int64)
        t.arr[:] = values
        return t

    torch.tensor = tensor

    def frombuffer(data, dtype=None):
        t = FakeTensor.alloc(torch, len(data), FakeDevice("cpu", 0))
        t.arr[:] = np.frombuffer(bytes(data), dtype=np.uint8)
        return t

    torch.frombuffer = frombuffer
    torch.equal = lambda a, b: bool(np.array_equal(a.arr, b.arr))

    def index_select(src, dim, idx, out=None):
        out.arr[...] = src.arr[idx.arr]
        return out

    torch.index_select = index_select
    cuda = types.SimpleNamespace(
        is_available=lambda: True, set_device=lambda d: None, init=lambda: None, device_count=lambda: gpus,
        get_device_name=lambda d=0: "Pretend GPU", synchronize=lambda d=None: None,
        get_device_properties=lambda d: types.SimpleNamespace(multi_processor_count=4),
        can_device_access_peer=lambda a, b: True, _sleep=lambda cycles: None, Event=FakeEvent,
        Stream=FakeStream, ExternalStream=lambda handle, device=None: FakeStream(), stream=lambda s: contextlib.nullcontext())  # fmt: skip
    torch.cuda = cuda
    return torch


def fake_driver(memory, *, drop_last_batch_copy=False, refuse_overlap_flag=False, with_attrs_raises=False):
    """A cuda.bindings.driver whose copies move the pretend GPU's bytes and whose batch call checks what
    the real one is documented to check (attribute order, legacy NULL stream, attribute indices)."""
    cu = types.ModuleType("cuda.bindings.driver")
    cu.CUresult, cu.CUdeviceptr = FakeResult, FakeDevicePtr
    cu.CUmemcpyAttributes, cu.CUmemLocation, cu.CUmemcpyFlags = FakeAttributes, FakeLocation, FakeFlags
    cu.CUmemLocationType, cu.CUmemcpySrcAccessOrder = FakeLocType, FakeOrder
    cu.CUstream_flags = enum.IntEnum("CUstream_flags", {"CU_STREAM_DEFAULT": 0, "CU_STREAM_NON_BLOCKING": 1})
    ok, bad = (FakeResult.CUDA_SUCCESS,), (FakeResult.CUDA_ERROR_INVALID_VALUE,)
    cu.calls = []
    cu.cuGetErrorName = lambda err: (FakeResult.CUDA_SUCCESS, FakeResult(err).name.encode())
    cu.cuGetErrorString = lambda err: (FakeResult.CUDA_SUCCESS, b"invalid argument" if err else b"no error")
    cu.cuCtxGetCurrent = lambda: (FakeResult.CUDA_SUCCESS, 1)
    cu.cuCtxGetStreamPriorityRange = lambda: (FakeResult.CUDA_SUCCESS, 0, -5)
    cu.cuStreamCreateWithPriority = lambda flags, prio: (FakeResult.CUDA_SUCCESS, FakeStream().cuda_stream)
    cu.cuDriverGetVersion = lambda: (FakeResult.CUDA_SUCCESS, 13000)
    cu.cuDeviceGet = lambda i: (FakeResult.CUDA_SUCCESS, i)
    cu.cuDevicePrimaryCtxRetain = lambda d: (FakeResult.CUDA_SUCCESS, 10 + d)
    cu.cuCtxEnablePeerAccess = lambda ctx, flags: (FakeResult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,)

    def memcpy_async(dst, src, n, stream):
        memory.copy(int(dst), int(src), n)
        return ok

    cu.cuMemcpyAsync = memcpy_async
    def with_attrs(dst, src, n, attr, stream):
        if with_attrs_raises and memory.calls_seen:  # the build and first call pass, the timing fails
            raise TypeError("an integer is required")
        memory.calls_seen = True
        return memcpy_async(dst, src, n, stream)

    cu.cuMemcpyWithAttributesAsync = with_attrs

    def batch(dsts, srcs, sizes, count, attrs, idxs, n_attrs, stream):
        cu.calls.append(("batch", count, int(stream)))
        valid = (int(stream) != 0 and count > 0 and len(dsts) == len(srcs) == len(sizes) == count
                 and n_attrs == len(attrs) == len(idxs) and n_attrs <= count and idxs[0] == 0
                 and all(a.srcAccessOrder != 0 and a.flags in (0, 1) for a in attrs))  # fmt: skip
        if not valid or (refuse_overlap_flag and any(a.flags for a in attrs)):
            return bad
        for d, s, n in list(zip(dsts, srcs, sizes))[:count - 1 if drop_last_batch_copy else count]:
            memory.copy(int(d), int(s), n)
        return ok

    cu.cuMemcpyBatchAsync = batch
    return cu


def run_pretend(monkeypatch, tmp_path, gpus=1, kernels=False, on_memory=None, **driver_faults):
    memory = Memory()
    if on_memory:
        on_memory(memory)
    torch, cu = fake_torch(memory, gpus), fake_driver(memory, **driver_faults)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver, bindings.__version__ = cu, "13.3.0-fake"
    cuda_pkg = types.ModuleType("cuda")
    cuda_pkg.bindings = bindings
    for name, module in (("torch", torch), ("cuda", cuda_pkg), ("cuda.bindings", bindings),
                         ("cuda.bindings.driver", cu)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    out = tmp_path / "r.json"
    rc = ceo.main(["--reps", "2", "--world", "4", "--tokens", "6", "--sizes-rows", "2,5", "--matmul", "8",
                   "--json", str(out)] + ([] if kernels else ["--no-sm-kernel"]))  # fmt: skip
    return rc, json.loads(out.read_text()), cu


def _by(data, case_prefix, mechanism):
    return next(r for r in data["results"] if r["case"].startswith(case_prefix) and r["mechanism"] == mechanism)


def test_pretend_gpu_run_measures_and_verifies_every_mechanism(monkeypatch, tmp_path, capsys):
    rc, data, cu = run_pretend(monkeypatch, tmp_path)
    assert rc == 0
    text = capsys.readouterr().out
    assert "elapsed" in text and "best gain" in text and "peer copies GPU0 -> GPU1 not measured" in text
    cases = list(dict.fromkeys(r["case"] for r in data["results"]))
    assert len(cases) == 5 and cases[2].startswith("asyncll rows")
    mechs = {r["mechanism"] for r in data["results"]}
    assert {"torch_copy", "memcpy_async@low/high", "batch[overlap,any]", "cu_index_copy"} <= mechs
    assert _by(data, "asyncll rows", "torch_copy")["status"].startswith("not run: 88 copies")  # > 64 copy_ calls
    for r in data["results"]:
        if r["case"].startswith("asyncll rows") and r["mechanism"] == "torch_copy":
            continue
        assert r["status"] == "ok", (r["case"], r["mechanism"], r["status"])
        assert r["gain"] > 0 and r["t_mm_us"] > 0 and r["mm_slowdown"] > 0
        assert (r["projected_gain"] is not None) == r["case"].startswith("asyncll")
    probes = {p["variant"]: p["result"] for p in data["probes"]}
    assert probes["reference: overlap flag, order STREAM, side stream"] == "CUDA_SUCCESS"
    for variant in ("zero-initialised attributes (srcAccessOrder INVALID)", "legacy NULL stream (torch's default stream)",
                    "attrsIdxs = [1] (must start at 0)", "numAttrs = 2 > count = 1", "count = 0"):
        assert probes[variant].startswith("CUDA_ERROR_INVALID_VALUE"), variant
    assert data["meta"]["driver_version"] == 13000 and data["meta"]["asyncll_rows"] > 0


def test_pretend_gpu_reports_a_dropped_copy_as_wrong_and_a_refusal_with_the_driver_error(monkeypatch, tmp_path):
    rc, data, _ = run_pretend(monkeypatch, tmp_path, drop_last_batch_copy=True)
    assert rc == 0
    rows = _by(data, "asyncll rows", "batch[overlap,stream]")
    assert rows["status"].startswith("WRONG COPY") and rows["gain"] is None
    assert _by(data, "asyncll rows", "memcpy_async")["status"] == "ok"
    rc, data, _ = run_pretend(monkeypatch, tmp_path, refuse_overlap_flag=True, with_attrs_raises=True)
    assert rc == 0
    assert _by(data, "copy", "with_attrs[overlap]")["status"] == "error: TypeError: an integer is required"
    assert _by(data, "asyncll block", "memcpy_async")["status"] == "ok"  # the run went on
    refused = _by(data, "copy", "batch[overlap,stream]")
    assert refused["status"].startswith("unsupported: cuMemcpyBatchAsync failed: CUDA_ERROR_INVALID_VALUE")
    assert _by(data, "copy", "batch[default,stream]")["status"] == "ok"


def test_pretend_two_gpus_measure_peer_copies_into_the_second_gpu(monkeypatch, tmp_path):
    rc, data, _ = run_pretend(monkeypatch, tmp_path, gpus=2)
    peer = [r for r in data["results"] if r["mechanism"].startswith("peer:")]
    assert rc == 0 and len(peer) == 8 * 5
    assert all(r["status"] == "ok" for r in peer if not r["status"].startswith("not run: 88 copies")), peer
    assert "peer:cu_index_copy" not in {r["mechanism"] for r in peer}


def test_pretend_gpu_flags_runs_whose_gate_ended_before_the_host_had_enqueued(monkeypatch, tmp_path):
    monkeypatch.setattr(FakeEvent, "query", lambda self: True)
    rc, data, _ = run_pretend(monkeypatch, tmp_path)
    row = _by(data, "copy", "torch_copy")
    assert rc == 0 and row["status"] == "ok (gate late in 2/2)" and row["gate_late"] == 2


def test_bad_arguments_are_refused(capsys):
    for argv in (["--reps", "0"], ["--sizes-rows", "a,b"], ["--sizes-rows", "0"]):
        with pytest.raises(SystemExit) as exc:
            ceo.main(argv)
        assert exc.value.code == 2
    assert "--sizes-rows" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("kernel", ceo.COPY_KERNELS, ids=lambda k: k.entry)
def test_copy_kernels_assemble_for_sm90_within_static_shared_memory(kernel, tmp_path):
    ptx = tmp_path / f"{kernel.entry}.ptx"
    ptx.write_text(kernel.ptx)
    done = subprocess.run(["ptxas", "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Compiling entry function '{kernel.entry}'" in done.stdout + done.stderr
    smem = [int(n) for n in re.findall(r"(\d+) bytes smem", done.stdout + done.stderr)]
    assert sum(smem) <= 48 << 10  # static shared memory: no opt-in attribute needed at launch


class FakeKernelDriver:
    """The runtime driver as the copy kernels use it: a launch does what the kernel is for (every descriptor
    of the table in device memory, copied), so the table's address, layout and count are what is tested."""

    def __init__(self, memory):
        self.memory, self.launches = memory, []

    def load_module(self, image):
        return types.SimpleNamespace(function=lambda name: name if f".entry {name}(" in image.decode() else None)

    def launch(self, fn, grid, block, params, *, stream=None):
        assert fn is not None and grid[0] >= 1 and block[0] >= 32 and stream
        (kind_t, table), (kind_n, count) = params
        assert (kind_t, kind_n) == ("ptr", "i32")
        triples = np.frombuffer(self.memory.view(table, 24 * count).tobytes(), dtype="<u8").reshape(-1, 3)
        for dst, src, n in triples.tolist():
            self.memory.copy(dst, src, n)
        self.launches.append((fn, grid[0], count))


def test_pretend_gpu_runs_the_copy_kernels_over_their_descriptor_tables(monkeypatch, tmp_path):
    import mori_compiler.runtime.driver as driver_module

    fake = {}
    monkeypatch.setattr(driver_module, "default_driver", lambda: fake["driver"])
    rc, data, _ = run_pretend(monkeypatch, tmp_path, kernels=True, on_memory=lambda m: fake.update(driver=FakeKernelDriver(m)))
    assert rc == 0
    rows = [r for r in data["results"] if r["mechanism"].startswith("sm_")]
    assert len(rows) == 7 * 5 and all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    launches = fake["driver"].launches
    assert {fn for fn, _, _ in launches} == {"lsu_copy", "tma_copy"} and {g for _, g, _ in launches} == {8, 32, 4}


@pytest.mark.gpu
def test_copy_engine_overlap_runs_on_the_gpu(tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH), "--reps", "3", "--json", str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(out.read_text())
    wrong = [r for r in data["results"] if r["status"].startswith("WRONG")]
    assert not wrong, wrong
    assert any(r["gain"] for r in data["results"] if r["mechanism"] == "torch_copy")
