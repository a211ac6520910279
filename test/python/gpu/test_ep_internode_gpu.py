"""EP inter-node dispatch/combine (InterNode = V0, InterNodeV1, InterNodeV1LL) on one GPU against the oracle
of docs/ep-protocols.md §12 and §15, with the nodes emulated by virtual PEs.

W virtual PEs in one process are split into N = W / G "nodes" of G = gpu_per_node PEs, for the (W, G) pairs
(4, 2), (8, 4), (8, 2), (16, 8). Per round: inputs regenerated from seeds, outputs poisoned, every received
row compared bit-exactly with its source token (through the source positions), the identity-expert combine
checked against U·x within the hierarchical combine's double-rounding bound (reference.hierarchical_bound)
and its weights against U·w, and the traffic counters' deltas (``op.internode_traffic()``) against
reference.predicted_traffic. Also: 20 rounds on one op, CUDA-graph replay, a DeepSeek-like shape, and a receive
cap that drops rows (counted, never a hang; the rest exact).

Not here: two processes on one GPU. Every leg of these kernels waits on other PEs (the count handshake, the
chunk signals, the device barrier), and two processes' kernels on one GPU are not guaranteed to run at the
same time (no MPS: time slices), so a cross-process spin wait may never be satisfied; the part that waits on
nobody (the stage kernel) is not launchable alone through the op. test_ep_multigpu.py covers processes.

Kernels: ``all_configs()`` lists every configuration (one bundle each), ``python test/python/gpu/kernels.py
.bundles`` precompiles them with the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_ep_gpu import REF_DTYPE, TORCH_DTYPE, _bits, _counts, _to_torch  # noqa: E402

pytestmark = pytest.mark.gpu

TOPOLOGIES = [(4, 2), (8, 4), (8, 2), (16, 8)]  # (W, G)
KINDS = ("InterNode", "InterNodeV1", "InterNodeV1LL")
SHORT = {"InterNode": "V0", "InterNodeV1": "V1", "InterNodeV1LL": "V1LL"}
EXPERTS_PER_RANK = 8
SCALE_DIM = 56  # DeepSeek's fp8 block scales: 7168 / 128 float32 per token
BLOCKS = 16  # a multiple of every W here (V0 needs block_num % W == 0)
RDMA_BLOCKS = 8
WARPS = 4
DEEPSEEK_TOPOLOGY = (8, 4)
HEAP_SLACK = 256 << 20


def _config(kind: str, W: int, G: int, *, hidden=7168, m=64, er=EXPERTS_PER_RANK, k=None, scale_dim=SCALE_DIM,
            cap=0, scale_type_size=4):  # fmt: skip
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType[kind], data_type="bf16", rank=0,
                                   world_size=W, hidden_dim=hidden, scale_dim=scale_dim,
                                   scale_type_size=scale_type_size,
                                   max_token_type_size=2, max_num_inp_token_per_rank=m, num_experts_per_rank=er,
                                   num_experts_per_token=min(W, 8) if k is None else k, warp_num_per_block=WARPS,
                                   block_num=BLOCKS, max_total_recv_tokens=cap, use_external_inp_buf=False,
                                   gpu_per_node=G, rdma_block_num=RDMA_BLOCKS, num_qp_per_pe=1)  # fmt: skip


# The configurations (each one bundle), shared by the tests: one per (kind, W, G, hidden).
def main_config(kind, W, G):  # hidden 7168, M = 64, 56 x 4-byte scales
    return _config(kind, W, G)


def small_config(kind, W, G):  # hidden 4096, M = 32, no scales
    return _config(kind, W, G, hidden=4096, m=32, scale_dim=0)


def deepseek_config(kind):  # DeepSeek-like: hidden 7168, top-8 of 256 experts (32 per PE), M = 128, fp8 scales
    W, G = DEEPSEEK_TOPOLOGY
    return _config(kind, W, G, m=128, er=256 // W, k=8)


def cap_config(kind, W, G):  # a receive cap of a quarter of the tokens per source: spread routing overflows
    m = 16
    return _config(kind, W, G, hidden=4096, m=m, scale_dim=0, cap=W * m // 4)


ODD_TOPOLOGY = (8, 2)


def odd_config(kind):  # odd sizes: hidden 2064, M 37 (a partial chunk), top-5 of 3 experts per PE, 3 one-byte scales
    W, G = ODD_TOPOLOGY
    return _config(kind, W, G, hidden=2064, m=37, er=3, k=5, scale_dim=3, scale_type_size=1)


def all_configs():
    """Every op configuration these tests build (the GPU machine finds their kernels precompiled)."""
    for kind in KINDS:
        for W, G in TOPOLOGIES:
            yield main_config(kind, W, G)
            yield small_config(kind, W, G)
            yield cap_config(kind, W, G)
        yield deepseek_config(kind)
        yield odd_config(kind)


def heap_size(W: int, G: int) -> int:
    """Bytes per PE for the largest op of this topology (ops are closed after each test), from the EP
    schema's buffer table, plus slack for the shmem runtime's own reserve."""
    from mori_compiler.ep_schema import EpSizes, KernelType, buffers_for
    from mori_compiler.ops.ep_buffers import ALIGNMENT

    need = 0
    for cfg in all_configs():
        if (cfg.world_size, cfg.gpu_per_node) == (W, G):
            table = buffers_for(KernelType(cfg.kernel_type), EpSizes.from_config(cfg))
            need = max(need, sum(-(-size // ALIGNMENT) * ALIGNMENT for _, size in table))
    return -(-(need + HEAP_SLACK) // (1 << 20)) << 20


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=lambda t: f"W{t[0]}-G{t[1]}")
def topo(request):
    import torch

    from mori_compiler.runtime import shmem

    W, G = request.param
    torch.cuda.init()
    shmem.shmem_init_virtual(W, heap_size=heap_size(W, G))
    try:
        yield W, G
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def _shape(c):
    from mori_compiler.ops import reference as ref

    return ref.EpShape(c.world_size, c.num_experts_per_rank, c.num_experts_per_token, c.max_num_inp_token_per_rank,
                       c.max_total_recv_tokens)  # fmt: skip


def _topology(c):
    from mori_compiler.ep_schema import EpTopology

    return EpTopology(c.world_size, c.gpu_per_node)


def _traffic(op) -> np.ndarray:
    """int64 [W, 4]: the cumulative counters, in ep_schema.TRAFFIC_COUNTERS order."""
    from mori_compiler.ep_schema import TRAFFIC_COUNTERS

    counters = op.internode_traffic()
    assert len(counters) == op.config.world_size
    return np.array([[int(d[name]) for name in TRAFFIC_COUNTERS] for d in counters], dtype=np.int64)


def _check_traffic(op, before, want: list[dict], what: str) -> None:
    from mori_compiler.ep_schema import TRAFFIC_COUNTERS

    delta = _traffic(op) - before
    expected = np.array([[d[name] for name in TRAFFIC_COUNTERS] for d in want], dtype=np.int64)
    if not (delta == expected).all():
        p, j = (int(v[0]) for v in np.nonzero(delta != expected))
        raise AssertionError(f"{what}: PE {p} counter {TRAFFIC_COUNTERS[j]} grew by {delta[p, j]} bytes, predicted "
                             f"{expected[p, j]} (all PEs: got {delta.tolist()}, want {expected.tolist()})")  # fmt: skip


class Inputs:
    """One round's inputs on every PE: the host values (the oracle's; NumPy only, so the CPU tests build the
    same rounds) and, after ``upload()``, their device tensors."""

    def __init__(self, cfg, shape, *, routing, counts, dtype, seed, weights, scales):
        from mori_compiler.ops import reference as ref

        W, H, K, M = cfg.world_size, cfg.hidden_dim, cfg.num_experts_per_token, cfg.max_num_inp_token_per_rank
        self.cfg, self.shape = cfg, shape
        self.dtype, self.has_w, self.has_s = dtype, weights, scales
        self.ns = _counts(counts, W, M, seed)
        self.idx = ref.make_routing(routing, self.ns, shape, seed)
        self.x = [ref.make_tokens(n, H, REF_DTYPE[dtype], seed * 100 + p) for p, n in enumerate(self.ns)]
        self.w = [ref.make_weights(n, K, seed * 100 + 50 + p) for p, n in enumerate(self.ns)]
        self.s = [ref.make_scales(n, cfg.scale_dim, seed * 100 + 70 + p, cfg.scale_type_size or 4)
                  for p, n in enumerate(self.ns)]  # fmt: skip
        self.xs = self.idxs = self.ws = self.ss = None

    def upload(self) -> "Inputs":
        import torch

        self.xs = [_to_torch(v, self.dtype) for v in self.x]
        self.idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in self.idx]
        self.ws = [torch.from_numpy(v).cuda() for v in self.w] if self.has_w else None
        self.ss = [torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in self.s] if self.has_s else None
        return self

    def expected_rows(self):
        """Per PE the rows it must receive, as bit patterns (what ``_bits`` makes of the outputs)."""
        from mori_compiler.ops import reference as ref

        x_bits = [ref.to_bits(x, REF_DTYPE[self.dtype]) for x in self.x]
        s_bits = [v.view(np.uint8) for v in self.s] if self.has_s else None
        return ref.expected_recv_rows(x_bits, self.w if self.has_w else None, s_bits, self.idx, self.shape)

    def predicted_traffic(self, *, has_w):
        """The counters' expected growth. A written row is counted with the config's scale bytes whether or
        not the call passed scales (the kernels' constant row size: passes/ep_internode_kernels.py)."""
        from mori_compiler.ops import reference as ref

        cfg = self.cfg
        return ref.predicted_traffic(self.idx, self.shape, _topology(cfg), SHORT[cfg.kernel_type.name],
                                     hidden=cfg.hidden_dim, dispatch_dtype=REF_DTYPE[self.dtype], combine_dtype="bf16",
                                     scale_bytes=cfg.scale_dim * cfg.scale_type_size, scales_given=True,
                                     has_w=has_w)  # fmt: skip


def poison(op) -> None:
    """Fill every output buffer a call may write with 0xA5 on every PE."""
    import torch

    for p in range(op.config.world_size):
        for name in ("out_x", "out_w", "out_s", "out_idx", "src_pos", "out_c", "out_cw"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(0xA5)


def check_dispatch_outputs(op, shape, inputs: Inputs, outs, *, complete=True) -> list[int]:
    """The dispatch oracle on every PE; returns the totals."""
    import torch

    from mori_compiler.ops import reference as ref

    expected = inputs.expected_rows()
    src_pos = op.get_dispatch_src_token_pos()
    totals = []
    for p in range(op.config.world_size):
        out_x, out_w, out_s, out_idx, total = outs[p]
        tot = int(total.item())
        totals.append(tot)
        ref.check_dispatch(p, _bits(out_x[:tot]), out_w[:tot].cpu().numpy() if inputs.has_w else None,
                           out_s[:tot].contiguous().view(torch.uint8).cpu().numpy() if inputs.has_s else None,
                           out_idx[:tot].cpu().numpy(), src_pos[p].cpu().numpy(), tot, expected[p], shape,
                           complete=complete)  # fmt: skip
    return totals


def identity_expert(outs, totals, hidden):
    """The combine input of the identity expert: each PE's received rows, in bf16."""
    import torch

    return [outs[p][0][:t].to(torch.bfloat16).contiguous() if t else
            torch.empty((0, hidden), dtype=torch.bfloat16, device="cuda") for p, t in enumerate(totals)]  # fmt: skip


def check_combine_outputs(op, shape, inputs: Inputs, res, *, has_w, copies=None) -> None:
    """out ≈ c·x within the hierarchical bound and out_w ≈ c·w, c = U(t) (or ``copies`` under a cap)."""
    from mori_compiler.ops import reference as ref

    for p in range(op.config.world_size):
        out, out_w = res[p]
        n = inputs.ns[p]
        c = None if copies is None else copies[p]
        ref.check_hierarchical_combine(out[:n].float().cpu().numpy(), inputs.x[p], inputs.idx[p], shape, "bf16",
                                       copies=c, rank=p)  # fmt: skip
        if has_w:
            u = ref.unique_dest_count(inputs.idx[p], shape) if c is None else np.asarray(c)
            want = (inputs.w[p].astype(np.float64) * u[:, None]).astype(np.float32)
            np.testing.assert_allclose(out_w[:n].cpu().numpy(), want, atol=1e-5, rtol=1e-5,
                                       err_msg=f"combine weights on PE {p}")  # fmt: skip


def run_round(op, *, routing, counts, dtype, seed, weights=True, scales=False, check_rows=True) -> Inputs:
    """One dispatch + identity-expert combine (weights passed back when ``weights``) on every PE, checked
    against the oracle and the predicted traffic."""
    from mori_compiler.ops import reference as ref

    cfg = op.config
    shape = _shape(cfg)
    inputs = Inputs(cfg, shape, routing=routing, counts=counts, dtype=dtype, seed=seed, weights=weights,
                    scales=scales).upload()  # fmt: skip
    poison(op)
    op.kernels.synchronize()
    before = _traffic(op)
    outs = op.dispatch(inputs.xs, inputs.ws, inputs.ss, inputs.idxs)
    op.kernels.synchronize()  # with MORI_COMPILER_WAIT_LIMIT set, a wait that gave up is reported here
    if check_rows:
        totals = check_dispatch_outputs(op, shape, inputs, outs)
    else:
        totals = [int(o[4].item()) for o in outs]
        assert totals == ref.expected_recv_counts(inputs.idx, shape).tolist(), "receive counts per PE"
    ys = identity_expert(outs, totals, cfg.hidden_dim)
    wys = [outs[p][1][:t].clone() for p, t in enumerate(totals)] if weights else None
    res = op.combine(ys, wys, inputs.idxs)
    op.kernels.synchronize()
    check_combine_outputs(op, shape, inputs, res, has_w=weights)
    _check_traffic(op, before, inputs.predicted_traffic(has_w=weights), f"round seed {seed}")
    return inputs


CASES = [
    # (config, routing, token counts, dispatch dtype, weights, scales)
    ("main", "random", "random", "bf16", True, True),
    ("main", "random", "mixed", "fp8_e4m3fn", True, True),
    ("main", "spread_pes", "max", "bf16", True, True),
    ("main", "all_to_one", "random", "fp8_e4m3fn", True, False),  # the config has scales, the call passes none
    ("main", "sentinel", "random", "bf16", True, True),
    ("main", "random", "zero", "bf16", True, True),
    ("main", "random", "one", "fp8_e4m3fn", False, True),
    ("small", "random", "max", "bf16", True, False),
    ("small", "sentinel", "mixed", "fp8_e4m3fn", False, False),
    ("small", "spread_pes", "random", "fp8_e4m3fn", True, False),
]
CONFIGS = {"main": main_config, "small": small_config}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c[:4]) +
                         ("-w" if c[4] else "") + ("-s" if c[5] else ""))  # fmt: skip
def test_oracle(topo, kind, case):
    from mori_compiler.ops import EpDispatchCombineOp

    config, routing, counts, dtype, weights, scales = case
    op = EpDispatchCombineOp(CONFIGS[config](kind, *topo))
    try:
        run_round(op, routing=routing, counts=counts, dtype=dtype, seed=len(routing) + len(counts), weights=weights,
                  scales=scales)  # fmt: skip
    finally:
        op.close()


@pytest.mark.parametrize("kind", KINDS)
def test_repeated_rounds_and_graph_replay(topo, kind):
    """20 eager rounds in a row on one op with changing inputs and routings, then dispatch+combine captured
    once (after an eager call) and replayed with inputs and routing refilled in place: the outputs and the
    counters follow every replay."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp

    cfg = small_config(kind, *topo)
    op = EpDispatchCombineOp(cfg)
    shape = _shape(cfg)
    W = cfg.world_size
    try:
        for seed in range(20):
            run_round(op, routing=("random", "sentinel", "spread_pes")[seed % 3], counts="random",
                      dtype=("bf16", "fp8_e4m3fn")[seed % 2], seed=seed,
                      check_rows=seed % 4 == 3 or seed == 19)  # fmt: skip
        torch.cuda.synchronize()
        # Graph: fixed input tensors (M tokens on every PE), refilled in place before each replay.
        first = Inputs(cfg, shape, routing="random", counts="max", dtype="bf16", seed=100, weights=True,
                       scales=False).upload()  # fmt: skip
        xs, ws, idxs = first.xs, first.ws, first.idxs
        ys = [op.get_registered_combine_input_buffer(torch.bfloat16, pe=p) for p in range(W)]  # zero-copy

        def step():
            outs = op.dispatch(xs, ws, None, idxs)
            for p in range(W):  # identity expert, written in place into the registered buffer
                ys[p].copy_(outs[p][0])
            return outs, op.combine(ys, None, idxs)

        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs, results = step()
        for rnd in range(3):
            new = Inputs(cfg, shape, routing=("random", "sentinel", "spread_pes")[rnd], counts="max", dtype="bf16",
                         seed=200 + rnd, weights=True, scales=False).upload()  # fmt: skip
            for p in range(W):
                xs[p].copy_(new.xs[p])
                ws[p].copy_(new.ws[p])
                idxs[p].copy_(new.idxs[p])
            poison(op)
            torch.cuda.synchronize()
            before = _traffic(op)
            graph.replay()
            torch.cuda.synchronize()
            check_dispatch_outputs(op, shape, new, outs)
            check_combine_outputs(op, shape, new, results, has_w=False)
            _check_traffic(op, before, new.predicted_traffic(has_w=False), f"graph replay {rnd}")
    finally:
        op.close()


@pytest.mark.parametrize("topo", [DEEPSEEK_TOPOLOGY], indirect=True, ids=lambda t: f"W{t[0]}-G{t[1]}")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp8_e4m3fn", "bf16"])
def test_deepseek_shape(topo, kind, dtype):
    """hidden 7168, top-8 of 256 experts, 128 tokens per PE, 56 fp32 scales, two nodes of 4."""
    from mori_compiler.ops import EpDispatchCombineOp

    op = EpDispatchCombineOp(deepseek_config(kind))
    try:
        run_round(op, routing="random", counts="max", dtype=dtype, seed=7, weights=True, scales=True)
        run_round(op, routing="random", counts="random", dtype=dtype, seed=8, weights=True, scales=True)
    finally:
        op.close()


@pytest.mark.parametrize("kind", KINDS)
def test_receive_cap_overflow(topo, kind):
    """A receive cap of a quarter of the tokens per source, every token to K PEs: rows beyond a receiver's
    capacity are dropped and counted (dispatch_overflow), never a hang or a fault; every row received is
    still exact, and the combine sums exactly the copies that were received."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    cfg = cap_config(kind, *topo)
    op = EpDispatchCombineOp(cfg)
    shape = _shape(cfg)
    W = cfg.world_size
    try:
        inputs = Inputs(cfg, shape, routing="spread_pes", counts="max", dtype="bf16", seed=3, weights=True,
                        scales=False).upload()  # fmt: skip
        poison(op)
        outs = op.dispatch(inputs.xs, inputs.ws, None, inputs.idxs)
        op.kernels.synchronize()
        totals = check_dispatch_outputs(op, shape, inputs, outs, complete=False)
        assert all(t <= cfg.max_recv for t in totals), (totals, cfg.max_recv)
        wanted = int(ref.expected_recv_counts(inputs.idx, shape).sum())
        dropped = op.dispatch_overflow()
        assert sum(dropped) == wanted - sum(totals) > 0, (dropped, wanted, totals)
        copies = [np.zeros(n, dtype=np.int64) for n in inputs.ns]  # the PEs holding a row of each token
        for p, pos in enumerate(op.get_dispatch_src_token_pos()):
            for v in pos.cpu().numpy().tolist():
                src, tok = shape.decode_src(v)
                copies[src][tok] += 1
        ys = identity_expert(outs, totals, cfg.hidden_dim)
        wys = [outs[p][1][:t].clone() for p, t in enumerate(totals)]
        res = op.combine(ys, wys, inputs.idxs)
        op.kernels.synchronize()
        check_combine_outputs(op, shape, inputs, res, has_w=True, copies=copies)
        torch.cuda.synchronize()
    finally:
        op.close()


@pytest.mark.parametrize("topo", [ODD_TOPOLOGY], indirect=True, ids=lambda t: f"W{t[0]}-G{t[1]}")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3fn"])
def test_odd_sizes(topo, kind, dtype):
    """A partial last chunk (M 37), top-5 over 3 experts per PE, hidden 2064 and 3 one-byte scales per token
    (a record whose scales are not a multiple of 4 bytes), several rounds."""
    from mori_compiler.ops import EpDispatchCombineOp

    op = EpDispatchCombineOp(odd_config(kind))
    try:
        for seed, (routing, counts) in enumerate([("random", "max"), ("random", "mixed"), ("sentinel", "random")]):
            run_round(op, routing=routing, counts=counts, dtype=dtype, seed=300 + seed, weights=seed != 1,
                      scales=True)  # fmt: skip
    finally:
        op.close()
