"""The inter-node kernel types' host side (ops/dispatch_combine.py), without a GPU, torch or kernels.

``EpDispatchCombineOp`` is built for real over fakes of what it stands on: a NumPy-backed stand-in for the
few torch calls the op makes (tensors are views of NumPy arrays), the shmem heap (each buffer of each PE a
NumPy byte array; addresses are made up), the bundle (its kernel table is the EP schema's) and the launcher
(a recording KernelSet). The op's own buffers (ep_buffers.EpBuffers) and launches (ep_launch.EpLaunches,
arguments by name from the schema) are the real ones, so a launch records every argument the kernel would
get: the call arguments and the address of every symmetric buffer.
"""

from __future__ import annotations

import struct
import sys
import types

import numpy as np  # a test dependency (the reference model's)
import pytest

from mori_compiler.ep_schema import KERNELS, TRAFFIC_COUNTERS, kernel_signature
from mori_compiler.ops import dispatch_combine
from mori_compiler.ops.bundle import kernel_plan
from mori_compiler.ops.config import EpDispatchCombineConfig, EpDispatchCombineKernelType
from mori_compiler.ops.dispatch_combine import EpDispatchCombineOp, internode_rdma_blocks
from mori_compiler.runtime import launcher, shmem

Kind = EpDispatchCombineKernelType
W, G, H, M, K, ER = 4, 2, 32, 8, 2, 2  # 2 nodes of 2 PEs
BLOCKS = 8
INTERNODE = ("InterNode", "InterNodeV1", "InterNodeV1LL")


# ---- a NumPy-backed stand-in for the torch calls the op makes ------------------------------------------


class FakeDtype:
    def __init__(self, name: str, storage: str):
        self.name, self.np = name, np.dtype(storage)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class FakeTensor:
    """A view of a NumPy array on "cuda:0"; ``data_ptr`` is the array's address (views share it)."""

    def __init__(self, array, dtype: FakeDtype):
        self.a, self.dtype = array, dtype
        self.device = types.SimpleNamespace(type="cuda", index=0)

    shape = property(lambda self: tuple(self.a.shape))

    def dim(self):
        return self.a.ndim

    def is_contiguous(self):
        return self.a.flags.c_contiguous

    def element_size(self):
        return self.dtype.np.itemsize

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    def numel(self):
        return self.a.size

    def max(self):
        return FakeTensor(np.asarray(self.a.max()), self.dtype)

    def min(self):
        return FakeTensor(np.asarray(self.a.min()), self.dtype)

    def __int__(self):
        return int(self.a)

    def __getitem__(self, key):
        return FakeTensor(np.asarray(self.a[key]) if np.isscalar(self.a[key]) else self.a[key], self.dtype)

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], FakeDtype):
            return FakeTensor(self.a.view(shape[0].np), shape[0])
        viewed = self.a.view()
        viewed.shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape  # never a copy
        return FakeTensor(viewed, self.dtype)

    def copy_(self, src):
        FAKE_TORCH.copies.append((src.data_ptr(), self.data_ptr(), src.shape))
        self.a[...] = src.a
        return self

    def zero_(self):
        self.a[...] = 0
        return self

    def clone(self):
        return FakeTensor(self.a.copy(), self.dtype)

    def cpu(self):
        return self

    def tolist(self):
        return self.a.tolist()


def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.Tensor = FakeTensor
    for name, storage in (("bfloat16", "u2"), ("float32", "f4"), ("int32", "i4"), ("uint8", "u1"),
                          ("float8_e4m3fn", "u1"), ("float8_e4m3fnuz", "u1"), ("float4_e2m1fn_x2", "u1")):  # fmt: skip
        setattr(torch, name, FakeDtype(name, storage))
    torch.empty = lambda shape, dtype: FakeTensor(np.empty(shape, dtype.np), dtype)
    torch.copies, torch.syncs = [], []
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0, is_current_stream_capturing=lambda: False,
                                       synchronize=lambda: torch.syncs.append(1))  # fmt: skip
    return torch


FAKE_TORCH = _fake_torch()


def tensor(values, dtype_name: str) -> FakeTensor:
    dtype = getattr(FAKE_TORCH, dtype_name)
    return FakeTensor(np.ascontiguousarray(np.asarray(values).astype(dtype.np)), dtype)


# ---- fake shmem heap, bundle and launcher --------------------------------------------------------------


class FakeHeap:
    """Symmetric allocations: each a NumPy byte array per PE; PE ``pe``'s copy at ``handle + pe * STRIDE``."""

    STRIDE = 1 << 40

    def __init__(self, monkeypatch, *, virtual: bool, rank: int = 0):
        self.memory: dict[tuple[int, int], np.ndarray] = {}
        self.sizes: dict[int, int] = {}
        self.next, self.rank, self.freed = 0x10_0000, rank, []
        state = types.SimpleNamespace(n_pes=W, virtual=virtual, driver=types.SimpleNamespace(backend="nvvm"))
        for name, fn in (("state", lambda: state), ("current_state", lambda: state), ("shmem_mype", lambda: rank),
                         ("shmem_barrier_all", lambda: None), ("shmem_malloc_align", self.malloc),
                         ("shmem_ptr_p2p", lambda h, me, pe: h + pe * self.STRIDE), ("shmem_tensor", self.tensor),
                         ("shmem_free", self.freed.append)):  # fmt: skip
            monkeypatch.setattr(shmem, name, fn)

    def malloc(self, alignment: int, size: int) -> int:
        handle, self.next = self.next, self.next + (size + alignment - 1) // alignment * alignment
        self.sizes[handle] = size
        return handle

    def bytes_of(self, handle: int, pe: int) -> np.ndarray:
        return self.memory.setdefault((handle, pe), np.full(self.sizes[handle], 0xA5, np.uint8))  # not zeroed

    def tensor(self, handle: int, shape, dtype, pe=None):
        count = int(np.prod(shape)) * dtype.np.itemsize
        raw = self.bytes_of(handle, self.rank if pe is None else pe)[:count]
        return FakeTensor(raw.view(dtype.np).reshape(shape), dtype)


class RecordingKernelSet:
    def __init__(self, bundle):
        self.bundle, self.launches = bundle, []

    def launch_virtual(self, name, args, *, grid, block):
        self.launches.append((name, [tuple(a) for a in args], grid, block, None))

    def launch(self, name, args, *, grid, block, cooperative):
        self.launches.append((name, [tuple(args)], grid, block, cooperative))


def _fake_bundle(config, target, *, virtual_pes, asyncll=None, scale_blocks=None, trace=False):
    """A bundle whose kernel table is the EP schema's signatures of the config's kernels, named."""
    param = types.SimpleNamespace
    kernels = {k.name: param(params=[param(name=p.name, type=p.type, named=True) for p in k.signature.params])
               for k in kernel_plan(config)}  # fmt: skip
    return param(key="f" * 64, kernels=kernels)


def config(kind: str = "InterNodeV1", **fields) -> EpDispatchCombineConfig:
    base = dict(data_type="bf16", rank=0, world_size=W, hidden_dim=H, scale_dim=0, scale_type_size=0,
                max_token_type_size=2, max_num_inp_token_per_rank=M, num_experts_per_rank=ER,
                num_experts_per_token=K, block_num=BLOCKS, gpu_per_node=G, kernel_type=Kind[kind])  # fmt: skip
    return EpDispatchCombineConfig(**(base | fields))


@pytest.fixture
def fakes(monkeypatch):
    """make(config, virtual=True, rank=0) -> (op, heap), over the fake torch, heap, bundle and launcher."""
    monkeypatch.setitem(sys.modules, "torch", FAKE_TORCH)
    FAKE_TORCH.copies.clear()
    FAKE_TORCH.syncs.clear()
    monkeypatch.setattr(dispatch_combine, "ep_bundle", _fake_bundle)
    monkeypatch.setattr(launcher, "KernelSet", RecordingKernelSet)

    def make(cfg, *, virtual: bool = True, rank: int = 0):
        heap = FakeHeap(monkeypatch, virtual=virtual, rank=rank)
        return EpDispatchCombineOp(cfg, target="gfx942"), heap

    return make


def launched(op) -> list[tuple[str, list[dict]]]:
    """The op's launches so far: (kernel name, per PE its arguments by parameter name)."""
    out = []
    for name, args, _, _, _ in op.kernels.launches:
        sig, _ = kernel_signature(name)
        out.append((name, [dict(zip(sig.names, a)) for a in args]))
    return out


def buffer_arguments(op, family: str, pe: int) -> dict:
    """What every buffer parameter of ``family`` must be on PE ``pe``: that buffer's address there."""
    return {p.name: op.buffers.address(p.buffer, pe) for p in KERNELS[family].params if p.buffer is not None}


def _routing(pe: int, n: int):
    """n tokens of PE pe: rows of distinct values, two experts each (one on each node), a dropped slot."""
    x = tensor(np.arange(n * H).reshape(n, H) + 1000 * pe, "bfloat16")
    w = tensor(np.full((n, K), 0.5 + pe), "float32")
    idx = np.array([[(t + pe) % (W * ER), (t + pe + ER * G) % (W * ER)] for t in range(n)]).reshape(n, K)
    idx[:1, 1] = -1  # dropped by all three types
    return x, w, tensor(idx, "int32")


def _dispatch(op, ns=(3, 5, 0, 8), **kw):
    """A dispatch of ns[pe] tokens on each PE (none on PE 2); returns (results, xs, ws, ids)."""
    xs, ws, ids = (list(column) for column in zip(*(_routing(pe, n) for pe, n in enumerate(ns))))
    return op.dispatch(xs, ws, None, ids, **kw), xs, ws, ids


# ---- dispatch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", INTERNODE)
def test_dispatch_launches_stage_then_dispatch(fakes, kind):
    op, _ = fakes(config(kind))
    results, xs, ws, ids = _dispatch(op)
    assert [name for name, _ in launched(op)] == ["ep_inter_stage_bf16", "ep_inter_dispatch_bf16"]
    assert all(grid == (BLOCKS, 1) and block == (8 * 64, 1, 1) for _, _, grid, block, _ in op.kernels.launches)
    (_, stage), (_, send) = launched(op)
    for pe in range(W):
        tokens = {"x": xs[pe].data_ptr(), "w": ws[pe].data_ptr(), "s": 0, "idx": ids[pe].data_ptr(),
                  "n": xs[pe].shape[0], "hidden": H}  # fmt: skip
        assert stage[pe] == tokens | buffer_arguments(op, "inter_stage", pe)
        assert send[pe] == (tokens | {"rdma_blocks": BLOCKS // 2, "routing": 0, "routing_pfwd": 0}  # (no routing handle)
                            | buffer_arguments(op, "inter_dispatch", pe))  # fmt: skip
    # The outputs are IntraNode's: views of the receive buffers, [R, H] rows in the input dtype.
    R = op.config.max_recv
    out_x, out_w, out_s, out_idx, total = results[1]
    assert out_x.shape == (R, H) and out_x.dtype is FAKE_TORCH.bfloat16 and out_s is None
    assert out_x.data_ptr() == op.buffers.view("out_x", 1, (1,), FAKE_TORCH.uint8).data_ptr()
    assert (out_w.shape, out_idx.shape, total.shape) == ((R, K), (R, K), (1,))


def test_dispatch_with_scales_passes_them(fakes):
    op, _ = fakes(config("InterNodeV1LL", scale_dim=4, scale_type_size=4))
    xs, ws, ids = zip(*(_routing(pe, 2) for pe in range(W)))
    ss = [tensor(np.ones((2, 4)), "float32") for _ in range(W)]
    results = op.dispatch(list(xs), None, ss, ids, block_num=4, rdma_block_num=3)
    (_, stage), (_, send) = launched(op)
    assert [a["s"] for a in stage] == [s.data_ptr() for s in ss] and [a["w"] for a in send] == [0] * W
    assert {a["rdma_blocks"] for a in send} == {3} and op.kernels.launches[0][2] == (4, 1)
    assert results[0][2].shape == (op.config.max_recv, 4)


def test_a_dispatch_of_another_dtype_launches_its_kernels(fakes):
    op, _ = fakes(config("InterNode"))
    xs, ws, ids = zip(*(_routing(pe, 2) for pe in range(W)))
    fp8 = [FakeTensor(np.zeros((2, H), np.uint8), FAKE_TORCH.float8_e4m3fnuz) for _ in range(W)]
    op.dispatch(fp8, list(ws), None, ids)
    assert [name for name, _ in launched(op)] == ["ep_inter_stage_fp8_e4m3fnuz", "ep_inter_dispatch_fp8_e4m3fnuz"]


def test_a_process_per_pe_launches_cooperatively_with_its_own_addresses(fakes):
    op, heap = fakes(config("InterNodeV1", rank=2), virtual=False, rank=2)
    x, w, idx = _routing(2, 4)
    out = op.dispatch(x, w, None, idx)
    assert isinstance(out, tuple) and len(out) == 5
    assert [(launch[4], len(launch[1])) for launch in op.kernels.launches] == [(True, 1), (True, 1)]
    (_, (stage,)), (_, (send,)) = launched(op)
    assert send["x"] == x.data_ptr() and send["n"] == 4 and send["rdma_blocks"] == 4
    assert send["traffic"] == op.buffers.handles["traffic"]  # a process's own heap: the handle itself
    assert stage["stage"] == op.buffers.handles["i_stage"]


# ---- the inter-node role's blocks ----------------------------------------------------------------------


@pytest.mark.parametrize(("blocks", "call", "configured", "expected"), [
    (8, -1, 0, 4), (8, None, 0, 4), (8, 0, 0, 4),  # half the grid
    (3, -1, 0, 1), (2, -1, 0, 1),  # at least one block, one left for the same-node role
    (8, 7, 0, 7), (8, 1, 0, 1), (8, 3, 5, 3),  # the call's
    (8, -1, 5, 5), (8, 0, 6, 6),  # the config's
])  # fmt: skip
def test_rdma_blocks_resolution(blocks, call, configured, expected):
    for kind in ("InterNodeV1", "InterNodeV1LL"):
        assert internode_rdma_blocks(config(kind, rdma_block_num=configured), blocks, call) == expected
    if blocks % W == 0:
        assert internode_rdma_blocks(config("InterNode", rdma_block_num=configured), blocks, call) == expected


@pytest.mark.parametrize(("kind", "blocks", "call", "configured", "message"), [
    ("InterNodeV1", 8, 8, 0, "rdma_block_num 8 must be in [1, 7] for InterNodeV1 with 8 blocks (the other blocks "
                             "take the same-node role)"),
    ("InterNodeV1LL", 8, 100, 0, "rdma_block_num 100 must be in [1, 7] for InterNodeV1LL with 8 blocks"),
    ("InterNodeV1", 4, -1, 6, "rdma_block_num 6 (config.rdma_block_num) must be in [1, 3] for InterNodeV1 with 4"),
    ("InterNode", 4, 4, 0, "rdma_block_num 4 must be in [1, 3] for InterNode with 4 blocks"),
    ("InterNodeV1", 1, -1, 0, "block_num 1: InterNodeV1 needs >= 2 blocks (at least one for the inter-node role "
                              "and one for the same-node role)"),
    ("InterNode", 6, -1, 0, "block_num 6 must be a multiple of world_size 4 for InterNode (V0 partitions its "
                            "grid per destination PE)"),
    ("InterNodeV1", 8, 2.0, 0, "rdma_block_num must be an int >= -1 (-1 or 0: the config's), got 2.0"),
    ("InterNodeV1", 8, True, 0, "rdma_block_num must be an int >= -1 (-1 or 0: the config's), got True"),
    ("InterNodeV1", 8, -5, 0, "rdma_block_num must be an int >= -1 (-1 or 0: the config's), got -5"),
])  # fmt: skip
def test_rdma_blocks_refusals(kind, blocks, call, configured, message):
    with pytest.raises(ValueError) as info:
        internode_rdma_blocks(config(kind, rdma_block_num=configured), blocks, call)
    assert message in str(info.value)


@pytest.mark.parametrize(("kind", "kw", "message"), [
    ("InterNodeV1", {"rdma_block_num": 8}, "rdma_block_num 8 must be in [1, 7]"),
    ("InterNodeV1", {"block_num": 1}, "block_num 1: InterNodeV1 needs >= 2 blocks"),
    ("InterNode", {"block_num": 6}, "block_num 6 must be a multiple of world_size 4"),
    ("InterNodeV1LL", {"block_num": 2000}, "block_num must be in [1, 1024], got 2000"),
])  # fmt: skip
def test_a_refused_grid_launches_nothing(fakes, kind, kw, message):
    op, _ = fakes(config(kind))
    with pytest.raises(ValueError) as info:
        _dispatch(op, **kw)
    assert message in str(info.value) and op.kernels.launches == []
    _, _, _, ids = _dispatch(op)
    op.kernels.launches.clear()
    ys, ws = _expert_outputs(op)
    with pytest.raises(ValueError) as info:
        op.combine(ys, ws, ids, **kw)
    assert message in str(info.value) and op.kernels.launches == [] and FAKE_TORCH.copies == []


# ---- combine -------------------------------------------------------------------------------------------


def _expert_outputs(op, rows=(6, 0, 9, 3)):
    ys = [tensor(np.arange(r * H).reshape(r, H) + 7 * pe, "bfloat16") for pe, r in enumerate(rows)]
    ws = [tensor(np.arange(r * K).reshape(r, K) / 4 + pe, "float32") for pe, r in enumerate(rows)]
    return ys, ws


@pytest.mark.parametrize("kind", INTERNODE)
@pytest.mark.parametrize("external", [True, False])
def test_combine_copies_into_the_registered_buffers_then_launches_both_steps(fakes, kind, external):
    op, _ = fakes(config(kind, use_external_inp_buf=external))
    _, _, _, ids = _dispatch(op)
    op.kernels.launches.clear()
    ys, ws = _expert_outputs(op)
    results = op.combine(ys, ws, ids, rdma_block_num=2)
    R = op.config.max_recv
    for pe in range(W):
        reg = op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16, pe=pe)
        reg_w = op.buffers.view("reg_w", pe, (R, K), FAKE_TORCH.float32)
        rows = ys[pe].shape[0]
        assert (reg.a[:rows] == ys[pe].a).all() and (reg_w.a[:rows] == ws[pe].a).all()
    assert len(FAKE_TORCH.copies) == 2 * W  # rows and weights of each PE, torch copies on the stream
    ((first, combine), (second, total)) = launched(op)
    assert (first, second) == ("ep_inter_combine_bf16", "ep_inter_combine_all_bf16")
    for pe in range(W):
        n = ids[pe].shape[0]
        assert combine[pe] == {"n": n, "hidden": H, "rdma_blocks": 2, "has_w": 1} | buffer_arguments(op, "inter_combine",
                                                                                                    pe)  # fmt: skip
        assert total[pe] == {"n": n, "hidden": H} | buffer_arguments(op, "inter_combine_all", pe)  # out_w: out_cw
    out, out_w = results[3]
    assert out.shape == (M, H) and out_w.shape == (M, K)
    assert out.data_ptr() == op.buffers.view("out_c", 3, (1,), FAKE_TORCH.uint8).data_ptr()


def test_combine_without_weights(fakes):
    op, _ = fakes(config("InterNodeV1LL"))
    _, _, _, ids = _dispatch(op)
    op.kernels.launches.clear()
    ys, _ = _expert_outputs(op)
    results = op.combine(ys, None, ids)
    regs = op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16)
    assert [dst for _, dst, _ in FAKE_TORCH.copies] == [reg.data_ptr() for reg in regs]  # rows only, no weights
    ((_, combine), (_, total)) = launched(op)
    assert {(a["has_w"], a["rdma_blocks"]) for a in combine} == {(0, BLOCKS // 2)}
    assert all(a["out_w"] == 0 for a in total)  # null: no output weights
    assert all(out_w is None for _, out_w in results)


def test_combine_reading_the_registered_buffer_copies_nothing(fakes):
    """A caller that wrote its expert outputs into get_registered_combine_input_buffer() (zero-copy), and
    passes the dispatch's weights view already in reg_w, gets no copy at all."""
    op, _ = fakes(config("InterNodeV1", use_external_inp_buf=False))
    _, _, _, ids = _dispatch(op)
    regs = op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16)
    reg_ws = [op.buffers.view("reg_w", pe, (op.config.max_recv, K), FAKE_TORCH.float32) for pe in range(W)]
    op.combine(regs, reg_ws, ids, use_external_inp_buf=0)
    op.combine([r[:5] for r in regs], None, ids, use_external_inp_buf=1)  # the buffer's first rows
    assert FAKE_TORCH.copies == []
    assert [name for name, _ in launched(op)].count("ep_inter_combine_bf16") == 2


def test_combine_refuses_more_weight_rows_than_the_receive_capacity(fakes):
    op, _ = fakes(config("InterNode"))
    _, _, _, ids = _dispatch(op)
    op.kernels.launches.clear()
    ys, ws = _expert_outputs(op)
    R = op.config.max_recv
    ws[2] = tensor(np.zeros((R + 1, K)), "float32")
    with pytest.raises(ValueError, match=f"weights\\[2\\] has {R + 1} rows, more than the receive capacity {R}"):
        op.combine(ys, ws, ids)
    assert op.kernels.launches == []


def test_combine_standard_moe_takes_either_buffer_form(fakes, monkeypatch):
    """The inter-node combine reads the registered buffer in both forms: combine_standard_moe (which writes
    its converted input there) is not refused for use_external_inp_buf=True, as it is for IntraNode."""
    op, _ = fakes(config("InterNodeV1LL", use_external_inp_buf=True))
    _, _, _, ids = _dispatch(op)
    op.kernels.launches.clear()
    def converted(packed, src_info, layout_range, *, pe):  # (the conversion itself is standard_moe's)
        return op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16, pe=pe)

    monkeypatch.setattr(op, "convert_combine_input", converted)
    out = op.combine_standard_moe([None] * W, None, ids)
    assert len(out) == W and all(w is None for _, w in out) and FAKE_TORCH.copies == []
    assert [name for name, _ in launched(op)] == ["ep_inter_combine_bf16", "ep_inter_combine_all_bf16"]
    intra, _ = fakes(config("IntraNode"))
    with pytest.raises(ValueError, match="combine_standard_moe uses the zero-copy combine"):
        intra.combine_standard_moe([None] * W, None, ids)


# ---- traffic counters ----------------------------------------------------------------------------------


def test_internode_traffic_reads_four_u64_per_pe(fakes):
    op, heap = fakes(config("InterNodeV1"))
    assert op.internode_traffic() == [dict.fromkeys(TRAFFIC_COUNTERS, 0)] * W  # zeroed at construction
    values = {pe: [pe * 10**12 + i for i in (1, 2, 3, 2**63 + 4)] for pe in range(W)}
    for pe, counts in values.items():
        heap.bytes_of(op.buffers.handles["traffic"], pe)[:32] = np.frombuffer(struct.pack("<4Q", *counts), np.uint8)
    syncs = len(FAKE_TORCH.syncs)
    traffic = op.internode_traffic()
    assert len(FAKE_TORCH.syncs) == syncs + 1  # synchronizes first
    assert traffic == [dict(zip(("dispatch_rdma", "dispatch_xgmi", "combine_rdma", "combine_xgmi"), values[pe]))
                       for pe in range(W)]  # fmt: skip


def test_internode_traffic_of_one_process_is_one_dict(fakes):
    op, heap = fakes(config("InterNode", rank=1), virtual=False, rank=1)
    heap.bytes_of(op.buffers.handles["traffic"], 1)[:8] = np.frombuffer(struct.pack("<Q", 4096), np.uint8)
    assert op.internode_traffic() == {"dispatch_rdma": 4096, "dispatch_xgmi": 0, "combine_rdma": 0, "combine_xgmi": 0}


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL"])
def test_internode_traffic_is_refused_for_the_intra_node_types(fakes, kind):
    op, _ = fakes(config(kind, gpu_per_node=8))
    with pytest.raises(RuntimeError, match=f"internode_traffic: the {kind} kernel type has no traffic counters"):
        op.internode_traffic()


# ---- the intra-node types keep their launches -----------------------------------------------------------


@pytest.mark.parametrize("kind,family", [("IntraNode", "dispatch"), ("IntraNodeLL", "dispatch_ll")])
@pytest.mark.parametrize("external", [True, False])
def test_intra_node_launches_are_unchanged(fakes, kind, family, external):
    op, _ = fakes(config(kind, gpu_per_node=8, use_external_inp_buf=external))
    _, xs, ws, ids = _dispatch(op, rdma_block_num=3)  # (ignored by the intra-node kernels, as MORI's)
    ys, cws = _expert_outputs(op)
    op.combine(ys, cws, ids)
    (d, dispatch), (c, combine) = launched(op)
    push = "combine_push" if external else "combine_pull"
    assert (d, c) == (f"ep_{family}_bf16", f"ep_{push}_bf16")
    assert dispatch[0] == ({"x": xs[0].data_ptr(), "w": ws[0].data_ptr(), "s": 0, "idx": ids[0].data_ptr(),
                           "n": 3, "hidden": H} | buffer_arguments(op, family, 0)
                           | ({"routing": 0} if kind == "IntraNode" else {}))  # (no routing handle)  # fmt: skip
    inputs = {"inp": ys[1].data_ptr()} if external else {}
    assert combine[1] == inputs | {"inp_w": cws[1].data_ptr(), "n": 5, "hidden": H} | buffer_arguments(op, push, 1)
    assert len(FAKE_TORCH.copies) == (0 if external else W)  # the pull combine copies rows into reg_x only
