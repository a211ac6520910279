"""Runtime hidden sizes and fp4 x2 dispatch on a GPU (docs/ep-protocols.md, "Runtime hidden").

Every kernel type runs calls of several hidden sizes h <= the config's (16, odd multiples of 16, the
config's) on one op: the config's h runs the constant-row kernels, any other their ``_anyhidden`` variants.
Same oracle as test_ep_gpu.py: outputs poisoned, every received row bit-exact with its source token at the
call's h, combine with the identity expert = U·x at h. fp4 x2 tokens (random bytes, two E2M1 values each)
are compared as bytes; their combine leg is bf16 at the config's hidden (the production pairing: fp4
dispatch, bf16 expert outputs), built from each received row's source token. Plus graph capture of a
runtime-hidden dispatch + combine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_ep_gpu import REF_DTYPE, _bits, _shape, _to_torch  # noqa: E402

pytestmark = pytest.mark.gpu

HIDDEN = 2048  # the configs' hidden (bf16 elements)
KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL", "InterNodeV1", "InterNodeV1LL", "InterNode")
INTERNODE = ("InterNodeV1", "InterNodeV1LL", "InterNode")


def _config(kind: str, n_pes: int, *, zero_copy: bool = True, m: int = 32):
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    inter = kind in INTERNODE
    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType[kind], data_type="bf16", rank=0,
                                   world_size=n_pes, hidden_dim=HIDDEN, scale_dim=4, scale_type_size=4,
                                   max_token_type_size=2, max_num_inp_token_per_rank=m, num_experts_per_rank=4,
                                   num_experts_per_token=4, warp_num_per_block=4, block_num=16,
                                   use_external_inp_buf=not zero_copy, gpu_per_node=2 if inter else 8,
                                   rdma_block_num=8 if inter else 0)  # fmt: skip


PES = {kind: (4, 8) if kind in INTERNODE else (2, 3, 4, 8) for kind in KINDS}
CASES = [(kind, n, zc) for kind in KINDS for n in PES[kind] for zc in ((True, False) if kind in ("IntraNode",
         "IntraNodeLL") else (True,))]  # fmt: skip


def all_configs():
    """Every op configuration these tests build (the GPU machine finds their kernels precompiled)."""
    for kind, n, zc in CASES:
        yield _config(kind, n, zero_copy=zc)


@pytest.fixture
def op_of():
    """make(config) -> op, in a virtual-PE shmem of the config's world size (finalized afterwards)."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.runtime import shmem

    made = []

    def make(cfg):
        torch.cuda.init()
        shmem.shmem_init_virtual(cfg.world_size, heap_size=1 << 30)
        made.append(EpDispatchCombineOp(cfg))
        return made[-1]

    yield make
    for op in made:
        torch.cuda.synchronize()
        op.close()
    if made:
        shmem.shmem_finalize()


def _poison(op):
    import torch

    for p in range(op.config.world_size):
        for name in ("out_x", "out_w", "out_idx", "src_pos", "out_c", "out_cw", "reg_x"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(0xA5)


def _round(op, *, hidden: int, dtype: str, seed: int):
    """One dispatch of ``dtype`` rows of ``hidden`` elements and an identity-expert bf16 combine (of the same
    hidden; for fp4, of the config's hidden); checked against the oracle."""
    import torch

    from mori_compiler.ops import reference as ref

    c = op.config
    n_pes, K, shape = c.world_size, c.num_experts_per_token, _shape(c)
    rng = np.random.default_rng(seed)
    ns = [int(v) for v in rng.integers(1, c.max_num_inp_token_per_rank + 1, n_pes)]
    idx_np = ref.make_routing("random", ns, shape, seed)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    w_np = [rng.random((n, K), dtype=np.float32) for n in ns]
    s_np = [rng.random((n, c.scale_dim), dtype=np.float32) for n in ns]
    fp4 = dtype == "fp4"
    comb_h = c.hidden_dim if fp4 else hidden
    # The values the combine leg sums (bf16 at comb_h) and the dispatched rows.
    vals = [ref.make_tokens(n, comb_h, "bf16", seed * 100 + p) for p, n in enumerate(ns)]
    if fp4:
        raw = [rng.integers(0, 256, (n, hidden), dtype=np.uint8) for n in ns]
        xs = [torch.from_numpy(r).cuda().view(torch.float4_e2m1fn_x2) for r in raw]
        x_bits = raw
    else:
        tok = [ref.make_tokens(n, hidden, REF_DTYPE[dtype], seed * 100 + p) for p, n in enumerate(ns)] if dtype != "bf16" \
            else vals  # fmt: skip
        xs = [_to_torch(v, dtype) for v in tok]
        x_bits = [_bits(x) for x in xs]
    ws = [torch.from_numpy(v).cuda() for v in w_np]
    ss = [torch.from_numpy(v).cuda() for v in s_np]
    _poison(op)
    outs = op.dispatch(xs, ws, ss, idxs)
    op.kernels.synchronize()
    src_pos = op.get_dispatch_src_token_pos()
    expected = ref.expected_recv_rows(x_bits, w_np, [v.view(np.uint8) for v in s_np], idx_np, shape)
    ys = []
    for p in range(n_pes):
        out_x, out_w, out_s, out_idx, total = outs[p]
        tot = int(total.item())
        assert out_x.shape == (c.max_recv, hidden)
        got = out_x[:tot].contiguous().view(torch.uint8).cpu().numpy() if fp4 else _bits(out_x[:tot])
        ref.check_dispatch(p, got, out_w[:tot].cpu().numpy(), out_s[:tot].contiguous().view(torch.uint8).cpu().numpy(),
                           out_idx[:tot].cpu().numpy(), src_pos[p].cpu().numpy(), tot, expected[p], shape)  # fmt: skip
        # The identity expert's output of each received row: its source token's bf16 values.
        rows = [vals[r][t] for r, t in (shape.decode_src(int(v)) for v in src_pos[p].cpu().numpy())]
        y = np.stack(rows) if rows else np.zeros((0, comb_h), np.float32)
        ys.append(_to_torch(y, "bf16").reshape(tot, comb_h))
    res = op.combine(ys, None, idxs)
    op.kernels.synchronize()
    for p in range(n_pes):
        out = res[p][0]
        assert out.shape == (c.max_num_inp_token_per_rank, comb_h)
        if op.is_internode:
            ref.check_hierarchical_combine(out[: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16")
        else:
            ref.check_combine(out[: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16", rank=p)


@pytest.mark.parametrize("kind,n_pes,zero_copy", CASES, ids=lambda v: str(v))
def test_runtime_hidden_sizes_and_fp4(op_of, kind, n_pes, zero_copy):
    op = op_of(_config(kind, n_pes, zero_copy=zero_copy))
    calls = [(HIDDEN, "bf16"), (16, "bf16"), (528, "bf16"), (HIDDEN // 2, "fp4"), (16, "fp4"), (1040, "fp8_e4m3fn"),
             (HIDDEN, "bf16")]  # back to the constant kernel after the variants  # fmt: skip
    for seed, (hidden, dtype) in enumerate(calls, start=1):
        _round(op, hidden=hidden, dtype=dtype, seed=seed)


@pytest.mark.parametrize("kind", ("IntraNode", "AsyncLL", "InterNodeV1"))
def test_runtime_hidden_graph_replay(op_of, kind):
    """A dispatch + combine at hidden 528 captured in a CUDA graph and replayed on new values."""
    import torch

    from mori_compiler.ops import reference as ref

    op = op_of(_config(kind, 4))
    c, h = op.config, 528
    shape = _shape(c)
    ns = [c.max_num_inp_token_per_rank] * c.world_size
    idx_np = ref.make_routing("random", ns, shape, 9)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    xs = [torch.zeros((n, h), dtype=torch.bfloat16, device="cuda") for n in ns]
    ys = [torch.zeros((c.max_recv, h), dtype=torch.bfloat16, device="cuda") for _ in ns]

    def step():
        outs = op.dispatch(xs, None, None, idxs)
        for p in range(c.world_size):  # identity expert (rows past total_recv are ignored by the combine)
            ys[p].copy_(outs[p][0])
        return op.combine(ys, None, idxs)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = step()
    for rnd in range(3):
        vals = [ref.make_tokens(n, h, "bf16", 500 + 10 * rnd + p) for p, n in enumerate(ns)]
        for p in range(c.world_size):
            xs[p].copy_(_to_torch(vals[p], "bf16"))
        graph.replay()
        torch.cuda.synchronize()
        for p in range(c.world_size):
            out = results[p][0][: ns[p]].float().cpu().numpy()
            if op.is_internode:
                ref.check_hierarchical_combine(out, vals[p], idx_np[p], shape, "bf16")
            else:
                ref.check_combine(out, vals[p], idx_np[p], shape, "bf16", rank=p)
