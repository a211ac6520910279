"""torch.compile of a MoE layer step over the mori_compiler torch ops (mori_compiler/ops/torch_ops.py) on a GPU.

The step: router (fp32 matmul, top-k) -> dispatch -> expert (each PE's own fp32 [H, H] matmul on every
received row) -> combine; for AsyncLL through the send/receive halves with independent work in between.
Virtual PEs (3 and 8) in one process, odd token counts, inputs from fixed seeds, the op's output buffers
poisoned before every run. Checked, bit for bit:

* the torch ops run eagerly against the op's own methods (views, no copies): same combine output, same count
  and the same multiset of received rows;
* ``torch.compile(fullgraph=True)`` (inductor) against eager, with no graph break;
* ``mode="reduce-overhead"`` (CUDA graphs), replayed with new inputs each time, against eager, with no
  graph break and no CUDA-graph skip.

Bit-exact is the right bar: the tokens and weights are small integers (times powers of two), so every
matmul is exact in fp32 whatever kernel or summation order eager and inductor pick (shape padding, split-K);
the casts, the top-k (no ties: distinct fractions per expert) and the op's kernels (combine sums a token's
rows in a fixed order) are the same; and a row's result does not depend on where the dispatch put it. A mismatch message gives the
largest difference and how many elements differ. ``test_opcheck`` runs ``torch.library.opcheck``'s schema,
fake-tensor and autograd-registration checks on the real op; ``test_copy_cost`` prints what the copies of
the functional outputs cost.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_ep_gpu import _config  # noqa: E402
from virtual_pes import virtual_pes_fixture  # noqa: E402

pytestmark = pytest.mark.gpu

PE_COUNTS = (3, 8)
pes = virtual_pes_fixture(PE_COUNTS)
CASES = {  # kernel type -> (tokens per PE, the config's keywords of test_ep_gpu._config)
    "IntraNode": dict(hidden=4096, k=4, m=16),
    "AsyncLL": dict(hidden=4096, k=4, m=32, kind="AsyncLL"),
}
COUNTS = {3: [7, 0, 13], 8: [1, 15, 3, 0, 9, 16, 5, 11]}  # odd and empty counts among full ones
SEEDS = (11, 12, 13, 14)


def _asyncll_quiet():
    from mori_compiler.ops.asyncll import resolve

    return resolve({}, early_notify=0, fused_recv=0)


def all_configs(pes_counts=PE_COUNTS):
    """(config, AsyncLL options or None) of every op these tests build, for precompiling."""
    for n in pes_counts:
        for kind, kw in CASES.items():
            yield _config(n, **kw), (_asyncll_quiet() if kind == "AsyncLL" else None)


@pytest.fixture(params=list(CASES), ids=list(CASES))
def layer(pes, request):
    """An op of the case's kernel type, its EpTorchOps, and the layer's weights (fixed seeds)."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops.torch_ops import EpTorchOps

    kind = request.param
    cfg = _config(pes, **CASES[kind])
    op = EpDispatchCombineOp(cfg, asyncll=_asyncll_quiet() if kind == "AsyncLL" else None)
    tops = EpTorchOps(op)
    g = torch.Generator(device="cuda").manual_seed(5)
    H, E = cfg.hidden_dim, cfg.world_size * cfg.num_experts_per_rank
    router = (_small_ints((H, E), g), torch.arange(E, device="cuda", dtype=torch.float32) / 256)
    experts = [_small_ints((H, H), g) / 64 for _ in range(pes)]
    for t in (*router, *experts):  # the layer's weights: CUDA graphs read them in place (no copy per replay)
        torch._dynamo.mark_static_address(t)
    try:
        yield op, tops, router, experts
    finally:
        tops.close()
        op.close()


def _small_ints(shape, g):
    """Integers in [-2, 2] as fp32: products and sums of them (and of their power-of-two multiples) are
    exact in fp32 and bf16 inputs, so every matmul result is the same whatever the summation order."""
    import torch

    return torch.randint(-2, 3, shape, device="cuda", generator=g).float()


def _tokens(op, seed):
    import torch

    c = op.config
    counts = [min(n, c.max_num_inp_token_per_rank) for n in COUNTS[c.world_size]]
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [_small_ints((n, c.hidden_dim), g).to(torch.bfloat16) for n in counts]


def _route(xs, router, k):
    """Top-k of the exact logits x @ W + e / 256: the fraction keeps every expert's logit distinct (no tie
    for top-k to break), exactly (|x @ W| <= 4 H = 2^14, so the sum needs 22 of fp32's 24 bits)."""
    import torch

    weights, bias = router
    idxs, ws = [], []
    for x in xs:
        vals, idx = torch.topk(x.float() @ weights + bias, k, dim=1)
        idxs.append(idx.to(torch.int32))
        ws.append(vals)
    return idxs, ws


def _experts(outs, experts):
    import torch

    return [(o[0].float() @ w).to(torch.bfloat16) for o, w in zip(outs, experts)]


def moe_step(tops, router, experts, xs):
    """router -> dispatch -> expert -> combine through the torch ops; returns per PE (out [n, H], dispatch
    out_x, out_idx, total, the independent work's result: not compared, its sum order is the compiler's)."""
    idxs, ws = _route(xs, router, tops.config.num_experts_per_token)
    if tops.is_async:
        pending = tops.dispatch_send(xs, ws, None, idxs)
        busy = [x.float() @ router[0] for x in xs]  # independent work while the tokens travel
        outs = tops.dispatch_recv(pending)
        ys = _experts(outs, experts)
        pending_c = tops.combine_send(ys, None, idxs)
        busy = [b.sum() for b in busy]
        res = tops.combine_recv(pending_c)
    else:
        outs = tops.dispatch(xs, ws, None, idxs)
        res = tops.combine(_experts(outs, experts), None, idxs)
        busy = [x.sum() for x in xs]
    return [(r[0][: x.shape[0]], o[0], o[3], o[4], b) for r, o, x, b in zip(res, outs, xs, busy)]


def raw_step(op, router, experts, xs):
    """The same step on the op's own methods (outputs are views of its buffers), results cloned."""
    idxs, ws = _route(xs, router, op.config.num_experts_per_token)
    if op.is_async:
        outs = op.dispatch_send(xs, ws, None, idxs)
        op.dispatch_recv()
        res = op.combine_send(_experts(outs, experts), None, idxs)
        op.combine_recv()
    else:
        outs = op.dispatch(xs, ws, None, idxs)
        res = op.combine(_experts(outs, experts), None, idxs)
    return [(r[0][: x.shape[0]].clone(), o[0].clone(), o[3].clone(), o[4].clone()) for r, o, x in zip(res, outs, xs)]


def poison(op):
    """Fill the op's output buffers with 0xA5 bytes (a NaN-like bf16), so a run that wrote nothing shows."""
    import torch

    for p in range(op.config.world_size):
        for name in ("out_x", "out_w", "out_idx", "out_c"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(0xA5)


def _rows(out_x, total):
    """The received rows [0, total) as a sorted multiset (unique rows of their bits, with counts)."""
    import torch

    rows = out_x[: int(total.item())].view(torch.int16)
    if rows.shape[0] == 0:
        return rows, rows.new_zeros(0)
    return torch.unique(rows, dim=0, return_counts=True)


def _same(tag, got, want):
    import torch

    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{tag}: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs()
        raise AssertionError(f"{tag}: {int((got != want).sum())} of {got.numel()} elements differ, largest "
                             f"difference {float(diff.nan_to_num(float('inf')).max())}")  # fmt: skip


def check_same(tag, got, want):
    """Per PE: the combine output bit-exact, the count equal, the received rows equal as multisets."""
    for p, (g, w) in enumerate(zip(got, want)):
        _same(f"{tag}, PE {p}: combine output", g[0], w[0])
        _same(f"{tag}, PE {p}: total", g[3], w[3])
        for part, a, b in zip(("rows", "row counts"), _rows(g[1], g[3]), _rows(w[1], w[3])):
            _same(f"{tag}, PE {p}: received {part}", a, b)


def _eager_reference(op, tops, router, experts, xs):
    import torch

    poison(op)
    eager = [tuple(t.clone() for t in r) for r in moe_step(tops, router, experts, xs)]
    torch.cuda.synchronize()
    return eager


def _compile_counters():
    import torch

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def _check_no_graph_break():
    import torch

    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    assert breaks == {}, f"graph breaks: {breaks}"


def test_eager_torch_ops_match_the_op(layer):
    import torch

    op, tops, router, experts = layer
    for seed in SEEDS[:2]:
        xs = _tokens(op, seed)
        want = _eager_reference(op, tops, router, experts, xs)
        poison(op)
        got = raw_step(op, router, experts, xs)
        torch.cuda.synchronize()
        check_same(f"{op.kernel_type.name}, seed {seed}: the op's own methods vs the torch ops", got, want)


def test_compiled_matches_eager(layer):
    import torch

    op, tops, router, experts = layer
    _compile_counters()
    compiled = torch.compile(lambda xs: moe_step(tops, router, experts, xs), fullgraph=True)
    for seed in SEEDS[:2]:
        xs = _tokens(op, seed)
        want = _eager_reference(op, tops, router, experts, xs)
        poison(op)
        got = compiled(xs)
        torch.cuda.synchronize()
        check_same(f"compiled, seed {seed}", got, want)
    _check_no_graph_break()


def test_reduce_overhead_replays_match_eager(layer):
    import torch

    op, tops, router, experts = layer
    _compile_counters()
    compiled = torch.compile(lambda xs: moe_step(tops, router, experts, xs), fullgraph=True, mode="reduce-overhead")
    for seed in SEEDS:  # warm-up, recording, then replays, each with new inputs of the same shapes
        xs = _tokens(op, seed)
        want = _eager_reference(op, tops, router, experts, xs)
        poison(op)
        calls = tops.calls
        got = [tuple(t.clone() for t in r) for r in compiled(xs)]  # (a replay's outputs are the next one's)
        torch.cuda.synchronize()
        check_same(f"reduce-overhead, seed {seed}", got, want)
    assert tops.calls == calls, f"the last run called the op {tops.calls - calls} times: it was not a graph replay"
    _check_no_graph_break()
    skips = dict(torch._dynamo.utils.counters["inductor"]).get("cudagraph_skips", 0)
    assert skips == 0, f"CUDA graphs were skipped {skips} time(s) (run with TORCH_LOGS=perf_hints to see why)"


def test_opcheck(layer):
    """torch.library.opcheck on the real op: the schema (no undeclared mutation or aliasing), the fake
    implementations against the real outputs, the autograd registration. Its AOT-dispatch check compares two
    runs' outputs, which legitimately differ: rows [total, R) of a dispatch output are whatever the buffer
    held, and IntraNode's rows come in arrival order."""
    import torch

    op, tops, router, experts = layer
    xs = _tokens(op, SEEDS[0])
    idxs, ws = _route(xs, router, op.config.num_experts_per_token)
    n = op.config.world_size
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.mori_compiler.dispatch.default, (tops.handle, xs, ws, [None] * n, idxs, -1, -1,
                                                                    -1, False), test_utils=checks)  # fmt: skip
    if op.is_async:
        return
    ys = [torch.randn((op.config.max_recv, op.config.hidden_dim), device="cuda").to(torch.bfloat16) for _ in range(n)]
    torch.library.opcheck(torch.ops.mori_compiler.combine.default, (tops.handle, ys, [None] * n, idxs, -1, -1, -1, -1),
                          test_utils=checks)  # fmt: skip


def _comm_step(ops, xs, ws, idxs, *, views: bool):
    """dispatch then combine of the received rows as they are (no expert: the communication and, through
    the torch ops, their copies), on the op's own methods (``views``) or the torch ops; per PE the combine
    output."""
    if ops.is_async:
        if views:
            outs = ops.dispatch_send(xs, ws, None, idxs)
            ops.dispatch_recv()
            res = ops.combine_send([o[0] for o in outs], None, idxs)
            ops.combine_recv()
        else:
            outs = ops.dispatch_recv(ops.dispatch_send(xs, ws, None, idxs))
            res = ops.combine_recv(ops.combine_send([o[0] for o in outs], None, idxs))
    else:
        outs = ops.dispatch(xs, ws, None, idxs)
        res = ops.combine([o[0] for o in outs], None, idxs)
    return [r[0][: x.shape[0]] for r, x in zip(res, xs)]


def test_copy_cost(layer, capsys):
    """What the functional outputs cost: dispatch + combine (no expert) timed with CUDA events over 20 steps
    after warm-up, on the op's own methods (views), through the torch ops eagerly, and compiled with CUDA
    graphs; printed. Every timed variant must give the same combine output, bit for bit."""
    import torch

    op, tops, router, _ = layer
    xs = _tokens(op, SEEDS[0])
    idxs, ws = _route(xs, router, op.config.num_experts_per_token)
    _compile_counters()
    graphed = torch.compile(lambda xs, ws, idxs: _comm_step(tops, xs, ws, idxs, views=False), fullgraph=True,
                            mode="reduce-overhead")  # fmt: skip
    steps = {"op's views, eager": lambda: _comm_step(op, xs, ws, idxs, views=True),
             "torch ops, eager": lambda: _comm_step(tops, xs, ws, idxs, views=False),
             "torch ops, reduce-overhead": lambda: graphed(xs, ws, idxs)}  # fmt: skip
    times, results = {}, {}
    for name, step in steps.items():
        for _ in range(3):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(20):
            out = step()
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / 20 * 1000
        results[name] = [o.clone() for o in out]
    for name, got in results.items():
        for p, (g, w) in enumerate(zip(got, results["op's views, eager"])):
            _same(f"{name}, PE {p}: combine output", g, w)
    _check_no_graph_break()
    c = op.config
    with capsys.disabled():
        print(f"\n[torch ops cost] {op.kernel_type.name}, {c.world_size} virtual PEs, H={c.hidden_dim} bf16, "
              f"R={c.max_recv}, tokens {[x.shape[0] for x in xs]}: "
              + ", ".join(f"{k} {v:.1f} us/step" for k, v in times.items()))  # fmt: skip
    assert all(v > 0 for v in times.values())
