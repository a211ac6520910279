"""The dispatch features on the host side (ops/dispatch_combine.py, ops/routing_handle.py), without a GPU:
expert ids validated on the device (no host synchronization on a call; ``dispatch_status()`` and the
``validate="debug"`` mode read the status words after the fact), the local expert count (torch ops on the
stream over the received ids), and the routing handle (record, replay, combine; refusals before any
launch). Over the fakes of test_ep_internode_op.py; the kernels' part (what they count and replay) is the
GPU test's (test/python/gpu/test_ep_dispatch_features_gpu.py) and the lit tests'."""

from __future__ import annotations

import operator

import numpy as np
import pytest

from mori_compiler.ep_schema import STATUS_WORDS
from mori_compiler.ops.dispatch_combine import EpDispatchCombineOp
from mori_compiler.ops.routing_handle import EpDispatchRoutingHandle
from test_ep_internode_op import (ER, FAKE_TORCH, H, K, W, FakeDtype, FakeHeap, FakeTensor, config, fakes,  # noqa: F401
                                  launched, tensor)  # fmt: skip

NS = (3, 5, 0, 4)


@pytest.fixture
def torch_ops(monkeypatch):
    """The few more torch calls the local expert count makes, on the NumPy fake."""
    boolean, int64 = FakeDtype("bool", "?"), FakeDtype("int64", "i8")
    monkeypatch.setattr(FAKE_TORCH, "int64", int64, raising=False)
    monkeypatch.setattr(FAKE_TORCH, "zeros", lambda n, dtype, device: FakeTensor(np.zeros(n, dtype.np), dtype),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(FAKE_TORCH, "arange", lambda n, dtype, device: FakeTensor(np.arange(n).astype(dtype.np), dtype),
                        raising=False)  # fmt: skip

    def arith(fn, out=None):
        def op(self, other):
            value = fn(self.a, other.a if isinstance(other, FakeTensor) else other)
            return FakeTensor(np.asarray(value), out or (boolean if value.dtype == bool else self.dtype))
        return op

    for name, fn in (("__sub__", operator.sub), ("__mul__", operator.mul), ("__and__", operator.and_),
                     ("__ge__", operator.ge), ("__lt__", operator.lt)):  # fmt: skip
        monkeypatch.setattr(FakeTensor, name, arith(fn), raising=False)

    def scatter_add_(self, dim, index, src):
        np.add.at(self.a, index.a, src.a.astype(self.a.dtype))
        return self

    extra = {"unsqueeze": lambda self, d: FakeTensor(np.expand_dims(self.a, d), self.dtype),
             "flatten": lambda self: FakeTensor(self.a.reshape(-1), self.dtype),
             "long": lambda self: FakeTensor(self.a.astype(np.int64), int64),
             "int": lambda self: FakeTensor(self.a.astype(np.int32), FAKE_TORCH.int32),
             "scatter_add_": scatter_add_}  # fmt: skip
    for name, fn in extra.items():
        monkeypatch.setattr(FakeTensor, name, fn, raising=False)


def _inputs(pe: int, n: int, *, bad=()):
    x = tensor(np.arange(n * H).reshape(n, H) + 100 * pe, "bfloat16")
    w = tensor(np.full((n, K), 0.5), "float32")
    idx = np.array([[(t + pe) % (W * ER), (t + pe + 3) % (W * ER)] for t in range(n)], dtype=np.int64).reshape(n, K)
    for t, k, value in bad:
        idx[t, k] = value
    return x, w, tensor(idx, "int32")


def _dispatch(op, ns=NS, bad=None, **kw):
    xs, ws, ids = (list(c) for c in zip(*(_inputs(pe, n, bad=(bad or {}).get(pe, ())) for pe, n in enumerate(ns))))
    return op.dispatch(xs, ws, None, ids, **kw), ids


def _status(op, heap, pe: int):
    return heap.bytes_of(op.buffers.handles["status"], pe)[: 4 * len(STATUS_WORDS)].view(np.int32)


# ---- device-side validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL", "InterNodeV1"])
def test_a_dispatch_with_invalid_ids_launches_without_a_host_synchronization(fakes, kind):
    op, _ = fakes(config(kind, **({} if kind == "InterNodeV1" else {"gpu_per_node": 8})))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    _dispatch(op, bad={1: [(0, 0, W * ER), (2, 1, -7)], 3: [(1, 0, 2**31 - 1)]})  # counted on the device
    assert FAKE_TORCH.syncs == [] and len(launched(op)) == (2 if kind in ("AsyncLL", "InterNodeV1") else 1)


def test_dispatch_status_reads_both_words_of_every_pe_after_a_synchronization(fakes):
    op, heap = fakes(config("IntraNode", gpu_per_node=8))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    assert op.dispatch_status() == [{"overflow": 0, "invalid_ids": 0}] * W  # zeroed at construction
    for pe in range(W):
        _status(op, heap, pe)[:] = (10 * pe + 1, 10 * pe + 2)
    syncs = len(FAKE_TORCH.syncs)
    assert op.dispatch_status() == [{"overflow": 10 * pe + 1, "invalid_ids": 10 * pe + 2} for pe in range(W)]
    assert len(FAKE_TORCH.syncs) == syncs + 1 and op.dispatch_overflow() == [10 * pe + 1 for pe in range(W)]
    one, heap1 = fakes(config("IntraNode", gpu_per_node=8, rank=2), virtual=False, rank=2)
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    _status(one, heap1, 2)[:] = (0, 6)
    assert one.dispatch_status() == {"overflow": 0, "invalid_ids": 6}


def _debug_op(monkeypatch, kind="IntraNode", counts=None):
    """An op with validate="debug" whose kernels 'count' ``counts[pe]`` invalid ids per dispatch launch."""
    FakeHeap(monkeypatch, virtual=True)
    op = EpDispatchCombineOp(config(kind, gpu_per_node=8), target="gfx942", validate="debug")
    heap = op.buffers
    record = op.kernels.launch_virtual

    def launch_virtual(name, args, *, grid, block):
        record(name, args, grid=grid, block=block)
        if "dispatch" in name and "recv" not in name:
            for pe, c in (counts or {}).items():
                heap.view("status", pe, (2,), FAKE_TORCH.int32).a[1] += c

    monkeypatch.setattr(op.kernels, "launch_virtual", launch_virtual)
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    return op


@pytest.mark.parametrize("kind", ["IntraNode", "AsyncLL"])
def test_the_debug_mode_synchronizes_and_names_the_pe_and_count(fakes, monkeypatch, kind):
    op = _debug_op(monkeypatch, kind, counts={2: 3})
    with pytest.raises(ValueError, match=r"dispatch: indices\[2\] held 3 expert ids neither -1 nor in \[0, 8\)"):
        _dispatch(op)
    assert len(FAKE_TORCH.syncs) == 1  # the cost: a host synchronization per dispatch
    clean = _debug_op(monkeypatch, kind)
    syncs = len(FAKE_TORCH.syncs)
    _dispatch(clean)
    _dispatch(clean)
    assert len(FAKE_TORCH.syncs) == syncs + 2  # one per dispatch, no error without new invalid ids


def test_the_debug_mode_refuses_a_graph_capture_and_validate_takes_two_values(fakes, monkeypatch):
    op = _debug_op(monkeypatch)
    monkeypatch.setattr(FAKE_TORCH.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="validate='debug' synchronizes after each dispatch"):
        _dispatch(op)
    FakeHeap(monkeypatch, virtual=True)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="validate must be True or 'debug', got"):
            EpDispatchCombineOp(config("IntraNode", gpu_per_node=8), target="gfx942", validate=bad)
    # False would mean nothing (the check is on the device, with no host cost): refused, not ignored.
    with pytest.raises(ValueError, match=r"validate=False: expert ids are always checked on the device"):
        EpDispatchCombineOp(config("IntraNode", gpu_per_node=8), target="gfx942", validate=False)


# ---- local expert count ----------------------------------------------------------------------------------


def _received(op, pe: int, total: int, rng):
    """Fill PE pe's out_idx with ids (some of other PEs, some -1, garbage past ``total``) and ``total``, as a
    dispatch leaves them; returns the host count of its local experts."""
    R = op.config.max_recv
    ids = rng.integers(-1, W * ER, size=(R, K))
    ids[total:] = pe * ER  # stale rows past total: never counted
    op.buffers.view("out_idx", pe, (R, K), FAKE_TORCH.int32).a[...] = ids
    op.buffers.view("total", pe, (1,), FAKE_TORCH.int32).a[0] = total
    rows = ids[:total].reshape(-1)
    return [int(np.sum(rows == pe * ER + e)) for e in range(ER)]


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL", "InterNodeV1", "InterNode"])
def test_local_expert_counts_equal_a_host_count_of_the_received_ids(fakes, torch_ops, kind):
    op, _ = fakes(config(kind, **({} if kind.startswith("InterNode") else {"gpu_per_node": 8})))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    assert op.local_expert_count[1].a.tolist() == [0] * ER  # zeros before the first count
    rng = np.random.default_rng(7)
    want = [_received(op, pe, total, rng) for pe, total in enumerate((5, 0, 9, 16))]
    _dispatch(op, call_local_expert_count=True)
    assert [c.a.tolist() for c in op.local_expert_count] == want and FAKE_TORCH.syncs == []
    assert all(c.dtype is FAKE_TORCH.int32 and c.shape == (ER,) for c in op.local_expert_count)
    # Zeroed before counting: a second count of fewer rows is not added to the first.
    want = [_received(op, pe, 1, rng) for pe in range(W)]
    _dispatch(op, call_local_expert_count=True)
    assert [c.a.tolist() for c in op.local_expert_count] == want
    _received(op, 0, 16, rng)
    _dispatch(op)  # not asked: left as they are
    assert [c.a.tolist() for c in op.local_expert_count] == want


def test_asyncll_counts_on_the_receive_and_bad_flags_are_refused(fakes, torch_ops):
    op, _ = fakes(config("AsyncLL", gpu_per_node=8))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    with pytest.raises(ValueError, match="AsyncLL counts the local experts once the rows are received"):
        op.dispatch_send(*[list(c) for c in zip(*(_inputs(pe, 2) for pe in range(W)))][:2], None,
                         [_inputs(pe, 2)[2] for pe in range(W)], call_local_expert_count=True)  # fmt: skip
    rng = np.random.default_rng(1)
    xs, ws, ids = (list(c) for c in zip(*(_inputs(pe, 2) for pe in range(W))))
    op.dispatch_send(xs, ws, None, ids)
    want = [_received(op, pe, 6, rng) for pe in range(W)]
    op.dispatch_recv(call_local_expert_count=True)
    assert [c.a.tolist() for c in op.local_expert_count] == want
    intra, _ = fakes(config("IntraNode", gpu_per_node=8))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    with pytest.raises(ValueError, match="call_local_expert_count must be a bool, got 'yes'"):
        _dispatch(intra, call_local_expert_count="yes")
    assert launched(intra) == []


def test_one_process_gets_its_own_count(fakes, torch_ops):
    op, _ = fakes(config("IntraNode", gpu_per_node=8, rank=3), virtual=False, rank=3)
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    want = _received(op, 3, 7, np.random.default_rng(3))
    x, w, idx = _inputs(3, 4)
    op.dispatch(x, w, None, idx, call_local_expert_count=True)
    assert op.local_expert_count.a.tolist() == want


# ---- routing handle --------------------------------------------------------------------------------------


def _recorded(op):
    """A dispatch with return_routing=True after filling each PE's forward map with known codes (what the
    kernel would have written); returns (handle, results, ids, the codes)."""
    codes = {}
    for pe, n in enumerate(NS):
        codes[pe] = np.arange(n * K, dtype=np.int32) * 3 + pe
        op.buffers.view("fwd", pe, (n * K,), FAKE_TORCH.int32).a[...] = codes[pe]
    results, ids = _dispatch(op, return_routing=True)
    return results[0][5], results, ids, codes


def test_return_routing_records_each_pe_forward_map_and_a_replay_passes_it(fakes):
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    handle, results, ids, codes = _recorded(op)
    assert all(len(r) == 6 and r[5] is handle for r in results) and isinstance(handle, EpDispatchRoutingHandle)
    assert handle.n == NS and handle.pes == tuple(range(W)) and FAKE_TORCH.syncs == []
    for pe in range(W):
        assert handle.fwd[pe].a[: NS[pe] * K].tolist() == codes[pe].tolist()  # a copy the handle owns
        # At least one token's entries: a PE without tokens (PE 2) passes a non-null map and replays (torch
        # gives an empty tensor a null data pointer; an InterNodeV1 proxy would then reserve slots).
        assert handle.fwd[pe].numel() == max(NS[pe], 1) * K
        assert handle.fwd[pe].data_ptr() != op.buffers.view("fwd", pe, (1,), FAKE_TORCH.int32).data_ptr()
    (_, first), = launched(op)
    assert [a["routing"] for a in first] == [0] * W  # the recording dispatch reserves
    op.buffers.view("fwd", 1, (NS[1] * K,), FAKE_TORCH.int32).a[...] = -5  # later dispatches overwrite fwd
    replayed, _ = _dispatch(op, routing=handle)
    assert len(replayed[0]) == 5 and FAKE_TORCH.syncs == []
    _, replay = launched(op)[-1]
    assert [a["routing"] for a in replay] == [handle.fwd[pe].data_ptr() for pe in range(W)]
    # combine(routing=h): the handle's forward map is copied into the op's before the combine launch.
    ys = [tensor(np.ones((4, H)), "bfloat16") for _ in range(W)]
    FAKE_TORCH.copies.clear()
    op.combine(ys, None, ids, routing=handle)
    assert (handle.fwd[1].data_ptr(), op.buffers.view("fwd", 1, (1,), FAKE_TORCH.int32).data_ptr(),
            (NS[1] * K,)) in FAKE_TORCH.copies  # fmt: skip
    assert op.buffers.view("fwd", 1, (NS[1] * K,), FAKE_TORCH.int32).a.tolist() == codes[1].tolist()
    assert launched(op)[-1][0] == "ep_combine_push_bf16"  # (the config default: the external input buffer)


def test_a_handle_of_another_op_config_or_token_count_is_refused_before_any_launch(fakes):
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    handle, _, ids, _ = _recorded(op)
    # (two more ops on the same fake heap)
    other = EpDispatchCombineOp(config("IntraNode", gpu_per_node=8), target="gfx942")
    bigger = EpDispatchCombineOp(config("IntraNode", gpu_per_node=8, hidden_dim=2 * H), target="gfx942")
    FAKE_TORCH.syncs.clear()  # (their construction synchronizes)
    for target, ns, message in (
        (other, NS, r"dispatch: the routing handle was recorded by another EpDispatchCombineOp \(op #\d+, this is op #\d+\)"),
        (bigger, NS, r"dispatch: the routing handle was recorded with config.hidden_dim=32, this op has "
                     r"config.hidden_dim=64"),
        (op, (3, 4, 0, 4), r"dispatch: indices\[1\] has 4 tokens, the routing handle recorded 5 \(routing.n of PE 1\)"),
    ):  # fmt: skip
        before = len(launched(target))
        with pytest.raises(ValueError, match=message):
            _dispatch(target, ns, routing=handle)
        assert len(launched(target)) == before
    # A refused call leaves the last routing: the combine of the recorded indices still runs.
    ys = [tensor(np.ones((2, H)), "bfloat16") for _ in range(W)]
    op.combine(ys, None, ids, routing=handle)
    short = [tensor(np.zeros((n, K)), "int32") for n in (3, 5, 0, 3)]
    with pytest.raises(ValueError, match=r"indices\[3\] has 3 tokens but the last dispatch sent 4"):
        op.combine(ys, None, short, routing=handle)
    _, other_ids = _dispatch(other)
    before = len(launched(other))
    with pytest.raises(ValueError, match=r"combine: the routing handle was recorded by another EpDispatchCombineOp"):
        other.combine(ys, None, other_ids, routing=handle)
    assert len(launched(other)) == before and FAKE_TORCH.syncs == []
    with pytest.raises(ValueError, match="routing must be an EpDispatchRoutingHandle .* got str"):
        _dispatch(op, routing="h")


@pytest.mark.parametrize("kind,message", [
    ("AsyncLL", "is not offered for the AsyncLL kernel type (MORI's routing handle exists for IntraNode and "
                "InterNodeV1 only)"),
    ("IntraNodeLL", "is not offered for the IntraNodeLL kernel type"),
    ("InterNodeV1LL", "is not offered for the InterNodeV1LL kernel type"),
    ("InterNode", "is not offered for the InterNode kernel type"),
])  # fmt: skip
def test_the_routing_handle_is_refused_clearly_where_it_is_not_offered(fakes, kind, message):
    op, _ = fakes(config(kind, **({} if kind.startswith("InterNode") else {"gpu_per_node": 8})))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    for kw, field in (({"return_routing": True}, "return_routing"), ({"routing": object()}, "routing")):
        with pytest.raises(ValueError) as info:
            _dispatch(op, **kw)
        assert f"dispatch: {field}= {message}" in str(info.value)
    _, ids = _dispatch(op)
    before = len(launched(op))
    with pytest.raises(ValueError) as info:
        op.combine([tensor(np.ones((2, H)), "bfloat16") for _ in range(W)], None, ids, routing=object())
    assert f"combine: routing= {message}" in str(info.value) and len(launched(op)) == before


def test_internode_v1_records_and_replays_both_forward_maps(fakes):
    """InterNodeV1: the handle also holds each PE's proxy forward map (i_pfwd, the slots of the records it
    forwarded); a replay passes both to ep_inter_dispatch, and the combine copies both back."""
    op, _ = fakes(config("InterNodeV1"))
    FAKE_TORCH.syncs.clear()  # (the construction synchronizes once)
    s = op.sizes
    size = s.hops * s.chunk_rows * s.top_k
    for pe in range(W):
        op.buffers.view("i_pfwd", pe, (size,), FAKE_TORCH.int32).a[...] = np.arange(size) + 1000 * pe
    handle, _, ids, codes = _recorded(op)
    assert handle.pfwd is not None and FAKE_TORCH.syncs == []
    assert [p.a.tolist() for p in handle.pfwd] == [(np.arange(size) + 1000 * pe).tolist() for pe in range(W)]
    assert [a["routing"] + a["routing_pfwd"] for a in launched(op)[-1][1]] == [0] * W
    _dispatch(op, routing=handle)
    (stage, _), (name, replay) = launched(op)[-2:]
    assert stage == "ep_inter_stage_bf16" and name == "ep_inter_dispatch_bf16"
    assert [(a["routing"], a["routing_pfwd"]) for a in replay] == [(f.data_ptr(), p.data_ptr())
                                                                    for f, p in zip(handle.fwd, handle.pfwd)]
    for pe in range(W):  # the combine's copies restore both maps
        op.buffers.view("i_pfwd", pe, (size,), FAKE_TORCH.int32).a[...] = -1
    op.combine([tensor(np.ones((3, H)), "bfloat16") for _ in range(W)], None, ids, routing=handle)
    for pe in range(W):
        assert op.buffers.view("i_pfwd", pe, (size,), FAKE_TORCH.int32).a.tolist() == handle.pfwd[pe].a.tolist()
        assert op.buffers.view("fwd", pe, (NS[pe] * K,), FAKE_TORCH.int32).a.tolist() == codes[pe].tolist()
    assert [name for name, _ in launched(op)[-2:]] == ["ep_inter_combine_bf16", "ep_inter_combine_all_bf16"]
