"""The dispatch features on a GPU (docs/ep-protocols.md "Dispatch status", "Local expert count", "Routing
handle"): local expert counts against a host count over the reference routing, the routing replay
bit-exact against the recorded dispatch (rows, weights, ids, source positions, counts) and the combine
with the handle, invalid expert ids counted on the device with the valid rows still exact, the debug
mode's error, and graph capture of a dispatch with the local expert count and of a replay.

Virtual PEs 2, 3 (an odd count), 4 and 8 in one process; inputs from fixed seeds, outputs poisoned before
each call (the oracle of test_ep_gpu.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from virtual_pes import virtual_pes_fixture  # noqa: E402
from mori_compiler.ops import reference as ref  # noqa: E402  (NumPy only)
from test_ep_gpu import _bits, _config, _shape, _to_torch  # noqa: E402

pytestmark = pytest.mark.gpu

PES = (2, 3, 4, 8)
KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL", "InterNodeV1")
ROUTING_KINDS = ("IntraNode", "InterNodeV1")  # the kernel types with a routing handle (MORI's)
HIDDEN, M, ER, K = 2048, 32, 4, 4


pes = virtual_pes_fixture(PES)  # the virtual-PE shmem of each count


def feature_config(n_pes: int, kind: str):
    """The op of each (PE count, kind); InterNodeV1 as nodes of 2 PEs (4 and 8 PEs)."""
    from mori_compiler.ops import EpDispatchCombineKernelType

    cfg = _config(n_pes, hidden=HIDDEN, m=M, er=ER, k=K, kind=kind, blocks=16, warps=4)
    if kind == "InterNodeV1":
        cfg.gpu_per_node, cfg.rdma_block_num = 2, 4
        assert cfg.kernel_type == EpDispatchCombineKernelType.InterNodeV1
    return cfg


def _whole_nodes(n_pes: int) -> bool:
    return n_pes >= 4 and n_pes % 2 == 0


def all_configs():
    """Every op configuration these tests build (precompiled by kernels.py)."""
    for n in PES:
        for kind in KINDS:
            if kind != "InterNodeV1" or _whole_nodes(n):
                yield feature_config(n, kind)


def _op(pes: int, kind: str, **kw):
    from mori_compiler.ops import EpDispatchCombineOp

    if kind == "InterNodeV1" and not _whole_nodes(pes):
        pytest.skip("InterNodeV1 here: at least two whole nodes of 2 PEs")
    return EpDispatchCombineOp(feature_config(pes, kind), **kw)


def _inputs(op, seed: int, routing: str = "sentinel", bad=None, idle_pe: int | None = None):
    """Per PE: tokens (bf16), weights, ids (torch) and their NumPy forms; ``bad``: {pe: [(t, k, id)]} ids
    written over the routing (invalid ones); ``idle_pe``: a PE with no tokens."""
    import torch

    c = op.config
    shape = _shape(c)
    rng = np.random.default_rng(seed)
    ns = [int(v) for v in rng.integers(1, c.max_num_inp_token_per_rank + 1, c.world_size)]
    if idle_pe is not None:
        ns[idle_pe] = 0
    idx_np = ref.make_routing(routing, ns, shape, seed)
    for pe, slots in (bad or {}).items():
        for t, k, value in slots:
            idx_np[pe][t % ns[pe], k] = value
    x_f32 = [ref.make_tokens(n, c.hidden_dim, "bf16", seed * 100 + p) for p, n in enumerate(ns)]
    w_np = [np.random.default_rng(seed + p).random((n, c.num_experts_per_token), dtype=np.float32)
            for p, n in enumerate(ns)]  # fmt: skip
    xs = [_to_torch(v, "bf16") for v in x_f32]
    ws = [torch.from_numpy(v).cuda() for v in w_np]
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    return ns, xs, ws, idxs, idx_np, x_f32, w_np


def _poison(op):
    import torch

    for p in range(op.config.world_size):
        for name in ("out_x", "out_w", "out_idx", "src_pos", "out_c", "out_cw"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(0xA5)


def host_local_counts(idx_np, shape) -> list[list[int]]:
    """Per PE p and local expert e: the (source, token, k) slots whose id is p * Er + e (each such token is
    received by p, carrying all its K ids; no receive cap here)."""
    flat = np.concatenate([i.reshape(-1) for i in idx_np])
    return [[int(np.sum(flat == p * shape.Er + e)) for e in range(shape.Er)] for p in range(shape.W)]


@pytest.mark.parametrize("kind", KINDS)
def test_local_expert_counts_equal_the_host_count(pes, kind):
    import torch

    op = _op(pes, kind)
    try:
        for seed in (1, 2, 3):
            ns, xs, ws, idxs, idx_np, _, _ = _inputs(op, seed, routing="random_dup" if seed == 3 else "sentinel")
            op.dispatch(xs, ws, None, idxs, call_local_expert_count=True)
            torch.cuda.synchronize()
            want = host_local_counts(idx_np, _shape(op.config))
            got = [c.cpu().tolist() for c in op.local_expert_count]
            assert got == want, f"seed {seed}: local expert counts {got} != host {want}"
    finally:
        op.close()


def _snapshot(op, outs):
    """Per PE (total, out_x bits, out_w, out_idx, src_pos) of the valid rows."""
    import torch

    torch.cuda.synchronize()
    src = op.get_dispatch_src_token_pos()
    snap = []
    for p, (out_x, out_w, _, out_idx, total) in enumerate(outs):
        tot = int(total.item())
        snap.append((tot, _bits(out_x[:tot]), out_w[:tot].cpu().numpy().view(np.uint32), out_idx[:tot].cpu().numpy(),
                     src[p].cpu().numpy()))  # fmt: skip
    return snap


def _assert_same(got, want, what):
    for p, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0], f"{what}: PE {p} total {g[0]} != recorded {w[0]}"
        for name, a, b in zip(("out_x", "out_w", "out_idx", "src_pos"), g[1:], w[1:]):
            assert np.array_equal(a, b), f"{what}: PE {p} {name} differs from the recorded dispatch"


def _check_combine(op, res, ns, x_f32, idx_np, shape):
    for p in range(op.config.world_size):
        got = res[p][0][: ns[p]].float().cpu().numpy()
        if op.is_internode:  # two roundings (node partials, then their sum)
            ref.check_hierarchical_combine(got, x_f32[p], idx_np[p], shape, "bf16", rank=p)
        else:
            ref.check_combine(got, x_f32[p], idx_np[p], shape, "bf16", rank=p)


def _checked_dispatch(op, seed: int):
    """A normal dispatch of fresh inputs, checked against the dispatch oracle (rows through src_pos)."""
    import torch

    shape = _shape(op.config)
    ns, xs, ws, idxs, idx_np, _, w_np = _inputs(op, seed)
    _poison(op)
    outs = op.dispatch(xs, ws, None, idxs)
    torch.cuda.synchronize()
    src = op.get_dispatch_src_token_pos()
    expected = ref.expected_recv_rows([_bits(x) for x in xs], w_np, None, idx_np, shape)
    for p, (out_x, out_w, _, out_idx, total) in enumerate(outs):
        tot = int(total.item())
        ref.check_dispatch(p, _bits(out_x[:tot]), out_w[:tot].cpu().numpy(), None, out_idx[:tot].cpu().numpy(),
                             src[p].cpu().numpy(), tot, expected[p], shape)  # fmt: skip


@pytest.mark.parametrize("kind", ROUTING_KINDS)
def test_routing_replay_is_bit_exact_and_combines_with_the_handle(pes, kind):
    import torch

    op = _op(pes, kind)
    shape = _shape(op.config)
    try:
        # The last PE has no tokens: it must replay too (an InterNodeV1 proxy forwards others' records).
        ns, xs, ws, idxs, idx_np, x_f32, _ = _inputs(op, 11, idle_pe=pes - 1)
        _poison(op)
        outs = op.dispatch(xs, ws, None, idxs, return_routing=True)
        handle = outs[0][5]
        recorded = _snapshot(op, [o[:5] for o in outs])
        fwd = [f.cpu().numpy()[: n * K].copy() for f, n in zip(handle.fwd, ns)]
        # Other dispatches in between (other routing, other counts): the handle is the caller's copy.
        _checked_dispatch(op, 5)
        for _ in range(2):  # twice in a row: both round parities replay
            _poison(op)
            replay = op.dispatch(xs, ws, None, idxs, routing=handle)
            _assert_same(_snapshot(op, replay), recorded, "replay")
            for p in range(pes):
                now = op.buffers.view("fwd", p, (ns[p] * K,), torch.int32).cpu().numpy()
                assert np.array_equal(now, fwd[p]), f"PE {p}: the replay's forward map differs from the handle's"
        # Another dispatch, then the combine with the handle (identity expert): U * x per token.
        ys = [replay[p][0][: recorded[p][0]].clone() for p in range(pes)]
        op.dispatch(xs, ws, None, idxs, routing=handle)
        res = op.combine(ys, None, idxs, routing=handle)
        torch.cuda.synchronize()
        _check_combine(op, res, ns, x_f32, idx_np, shape)
        # The counters are ready for normal dispatches after a replay.
        for seed in (6, 7):
            _checked_dispatch(op, seed)
    finally:
        op.close()


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_ids_are_counted_and_the_valid_rows_stay_exact(pes, kind):
    import torch

    op = _op(pes, kind)
    shape = _shape(op.config)
    E = shape.W * shape.Er
    bad = {p: [(0, 1, E + p), (3, 0, -2 - p), (5, 2, 2**30)][: 1 + p % 3] for p in range(pes)}
    try:
        ns, xs, ws, idxs, idx_np, x_f32, w_np = _inputs(op, 21, bad=bad)
        invalid = [int(np.sum((i < -1) | (i >= E))) for i in idx_np]
        assert sum(invalid) > 0
        _poison(op)
        outs = op.dispatch(xs, ws, None, idxs)
        torch.cuda.synchronize()
        status = op.dispatch_status()
        assert [s["invalid_ids"] for s in status] == invalid and all(s["overflow"] == 0 for s in status)
        src = op.get_dispatch_src_token_pos()
        expected = ref.expected_recv_rows([_bits(x) for x in xs], w_np, None, idx_np, shape)  # invalid ids: dropped
        for p in range(pes):
            out_x, out_w, _, out_idx, total = outs[p]
            tot = int(total.item())
            ref.check_dispatch(p, _bits(out_x[:tot]), out_w[:tot].cpu().numpy(), None, out_idx[:tot].cpu().numpy(),
                               src[p].cpu().numpy(), tot, expected[p], shape)  # fmt: skip
        ys = [outs[p][0][: int(outs[p][4].item())].clone() for p in range(pes)]
        res = op.combine(ys, None, idxs)
        torch.cuda.synchronize()
        _check_combine(op, res, ns, x_f32, idx_np, shape)
        # Cumulative: a clean dispatch adds nothing.
        ns, xs, ws, idxs, *_ = _inputs(op, 22)
        op.dispatch(xs, ws, None, idxs)
        assert [s["invalid_ids"] for s in op.dispatch_status()] == invalid
    finally:
        op.close()


def test_the_debug_mode_raises_naming_the_pe(pes):
    op = _op(pes, "IntraNode", validate="debug")
    E = pes * ER
    try:
        ns, xs, ws, idxs, *_ = _inputs(op, 31)
        op.dispatch(xs, ws, None, idxs)  # clean: no error
        ns, xs, ws, idxs, *_ = _inputs(op, 32, bad={pes - 1: [(0, 0, E), (1, 1, -9)]})
        with pytest.raises(ValueError, match=rf"indices\[{pes - 1}\] held 2 expert ids neither -1 nor in \[0, {E}\)"):
            op.dispatch(xs, ws, None, idxs)
    finally:
        op.close()


@pytest.mark.parametrize("kind", ROUTING_KINDS)
def test_graph_capture_of_a_counted_dispatch_and_of_a_replay(pes, kind):
    import torch

    op = _op(pes, kind)
    shape = _shape(op.config)
    try:
        ns, xs, ws, idxs, idx_np, _, _ = _inputs(op, 41)
        recorded_outs = op.dispatch(xs, ws, None, idxs, return_routing=True, call_local_expert_count=True)
        handle = recorded_outs[0][5]
        recorded = _snapshot(op, [o[:5] for o in recorded_outs])
        want = host_local_counts(idx_np, shape)
        counted, replayed = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(counted):
            op.dispatch(xs, ws, None, idxs, call_local_expert_count=True)
        op.dispatch(xs, ws, None, idxs, routing=handle)  # (the eager call before a capture)
        torch.cuda.synchronize()
        with torch.cuda.graph(replayed):
            outs = op.dispatch(xs, ws, None, idxs, routing=handle)
        for _ in range(3):
            for c in op.local_expert_count:
                c.fill_(-1)
            counted.replay()
            torch.cuda.synchronize()
            assert [c.cpu().tolist() for c in op.local_expert_count] == want
            _poison(op)
            replayed.replay()
            _assert_same(_snapshot(op, outs), recorded, "graph replay of the routing replay")
    finally:
        op.close()


@pytest.mark.parametrize("kind", KINDS)
def test_no_call_synchronizes_the_host(pes, kind):
    """torch's sync debug mode "error" raises on any synchronizing torch call (an ``.item()``, a copy to the
    host): none in a dispatch with the local expert count, a recording, a replay, or a combine. The sequence
    runs once before (with virtual PEs the first launch with new tensors uploads their argument table, a
    synchronous copy: the launcher caches it, as a CUDA graph needs the eager call first too)."""
    import torch

    op = _op(pes, kind)
    try:
        ns, xs, ws, idxs, *_ = _inputs(op, 51, bad={0: [(0, 0, 10**6)]})
        routed = kind in ROUTING_KINDS
        outs = op.dispatch(xs, ws, None, idxs, call_local_expert_count=True, return_routing=routed)
        handle = outs[0][5] if routed else None
        torch.cuda.synchronize()
        ys = [outs[p][0][: int(outs[p][4].item())].clone() for p in range(pes)]

        def sequence():
            again = op.dispatch(xs, ws, None, idxs, call_local_expert_count=True, return_routing=routed)
            if routed:  # the recorded handle: replayed, then consumed by the combine
                op.dispatch(xs, ws, None, idxs, routing=handle)
            op.combine(ys, None, idxs, **({"routing": handle} if routed else {}))
            return again

        sequence()  # (warm-up: the argument tables of these calls)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            sequence()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert op.dispatch_status()[0]["invalid_ids"] == (5 if routed else 3)  # (one per dispatch, the replays too)
    finally:
        op.close()
