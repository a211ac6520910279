"""EP IntraNode dispatch/combine on a GPU against the oracle of docs/ep-protocols.md.

Virtual PEs (2, 4, 8) in one process: every PE's inputs are regenerated from fixed seeds on the host, the
outputs are poisoned before each call, and every received row is compared bit-exactly with its source
token (through the source positions); combine with the identity expert must give U·x and U·w.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from virtual_pes import virtual_pes_fixture  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH_DTYPE = {"bf16": "bfloat16", "f32": "float32", "fp8_e4m3fn": "float8_e4m3fn",
               "fp8_e4m3fnuz": "float8_e4m3fnuz"}  # fmt: skip
REF_DTYPE = {"bf16": "bf16", "f32": "float32", "fp8_e4m3fn": "fp8_e4m3fn", "fp8_e4m3fnuz": "fp8_e4m3fnuz"}
BITS = {"bf16": "int16", "f32": "int32", "fp8_e4m3fn": "uint8", "fp8_e4m3fnuz": "uint8"}


pes = virtual_pes_fixture((2, 4, 8))  # the virtual-PE shmem of each count


def _config(n_pes, *, hidden=7168, m=64, er=4, k=4, tok=2, scale_dim=0, scale_type_size=4, external=False, cap=0,
            blocks=16, warps=4, kind="IntraNode"):  # fmt: skip
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType[kind], data_type="bf16", rank=0, world_size=n_pes, hidden_dim=hidden, scale_dim=scale_dim,
                                   scale_type_size=scale_type_size, max_token_type_size=tok,
                                   max_num_inp_token_per_rank=m, num_experts_per_rank=er, num_experts_per_token=k,
                                   warp_num_per_block=warps, block_num=blocks, max_total_recv_tokens=cap,
                                   use_external_inp_buf=external)  # fmt: skip


def _to_torch(values_f32: np.ndarray, dtype: str):
    import torch

    from mori_compiler.ops import reference as ref

    if dtype == "f32":
        return torch.from_numpy(np.ascontiguousarray(values_f32, dtype=np.float32)).cuda()
    bits = ref.to_bits(values_f32, REF_DTYPE[dtype])
    t = torch.from_numpy(np.ascontiguousarray(bits).view(getattr(np, BITS[dtype]))).cuda()
    return t.view(getattr(torch, TORCH_DTYPE[dtype]))


def _bits(t) -> np.ndarray:
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(width).cpu().numpy()


def _counts(mode: str, n_pes: int, m: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    if mode.isdigit():  # the same fixed count on every PE
        return [min(int(mode), m)] * n_pes
    if mode == "zero":
        return [0] * n_pes
    if mode == "one":
        return [1] * n_pes
    if mode == "max":
        return [m] * n_pes
    if mode == "mixed":  # 0, 1 and M among the PEs
        return [[0, 1, m][p % 3] for p in range(n_pes)]
    return [int(x) for x in rng.integers(0, m + 1, n_pes)]


def run_round(op, shape, *, routing: str, counts: str, dtype: str, combine_dtype: str, seed: int, weights=True,
              scales=False, check=True):  # fmt: skip
    """One dispatch + identity-expert combine on every PE; checks both against the oracle."""
    import torch

    from mori_compiler.ops import reference as ref

    c = op.config
    n_pes, H, K = c.world_size, c.hidden_dim, c.num_experts_per_token
    ns = _counts(counts, n_pes, c.max_num_inp_token_per_rank, seed)
    idx_np = ref.make_routing(routing, ns, shape, seed)
    x_f32 = [ref.make_tokens(n, H, REF_DTYPE[dtype], seed * 100 + p) for p, n in enumerate(ns)]
    w_np = [np.random.default_rng(seed + p).random((n, K), dtype=np.float32) for p, n in enumerate(ns)]
    s_np = [np.random.default_rng(seed + 7 + p).random((n, c.scale_dim), dtype=np.float32) for p, n in enumerate(ns)]
    xs = [_to_torch(v, dtype) for v in x_f32]
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    ws = [torch.from_numpy(v).cuda() for v in w_np] if weights else None
    ss = [torch.from_numpy(v).cuda() for v in s_np] if scales else None
    for p in range(n_pes):  # poison every output row the kernels may write
        for name in ("out_x", "out_w", "out_idx", "src_pos", "out_c", "out_cw"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(0xA5)
    outs = op.dispatch(xs, ws, ss, idxs)
    if not check:
        return outs
    op.kernels.synchronize()  # with MORI_COMPILER_WAIT_LIMIT set, a wait that gave up is reported here
    src_pos = op.get_dispatch_src_token_pos()
    if op.is_async:  # rows grouped by source PE in PE order (within a source: slot order, not checked)
        layout = ref.asyncll_layout(idx_np, shape)
        for p in range(n_pes):
            ref.check_asyncll_layout(p, src_pos[p].cpu().numpy(), len(src_pos[p]), layout, shape, strict_order=False)
    x_bits = [_bits(x) for x in xs]
    s_bits = [v.view(np.uint8) for v in s_np] if scales else None
    expected = ref.expected_recv_rows(x_bits, w_np if weights else None, s_bits, idx_np, shape)
    ys, wys, totals = [], [], []
    for p in range(n_pes):
        out_x, out_w, out_s, out_idx, total = outs[p]
        tot = int(total.item())
        totals.append(tot)
        ref.check_dispatch(p, _bits(out_x[:tot]), out_w[:tot].cpu().numpy() if weights else None,
                           out_s[:tot].contiguous().view(torch.uint8).cpu().numpy() if scales else None,
                           out_idx[:tot].cpu().numpy(), src_pos[p].cpu().numpy(), tot, expected[p], shape)  # fmt: skip
        y = out_x[:tot].to(getattr(torch, TORCH_DTYPE[combine_dtype])) if tot else \
            torch.empty((0, H), dtype=getattr(torch, TORCH_DTYPE[combine_dtype]), device="cuda")  # fmt: skip
        ys.append(y.contiguous())
        wys.append(out_w[:tot].clone() if weights else None)
    res = op.combine(ys, wys if weights else None, idxs)
    op.kernels.synchronize()
    for p in range(n_pes):
        out, out_w = res[p]
        n = ns[p]
        ref.check_combine(out[:n].float().cpu().numpy(), x_f32[p], idx_np[p], shape, REF_DTYPE[combine_dtype], rank=p)
        if weights:
            want = ref.reference_combine_weights(w_np[p], idx_np[p], shape)
            np.testing.assert_allclose(out_w[:n].cpu().numpy(), want, atol=1e-5, rtol=1e-5,
                                       err_msg=f"combine weights on PE {p}")  # fmt: skip
    return totals


def _shape(c):
    from mori_compiler.ops import reference as ref

    return ref.EpShape(c.world_size, c.num_experts_per_rank, c.num_experts_per_token, c.max_num_inp_token_per_rank,
                       c.max_total_recv_tokens)  # fmt: skip


CASES = [
    # (routing, token counts, dispatch dtype, combine dtype, hidden, zero-copy, weights, scales)
    ("random", "random", "bf16", "bf16", 7168, True, True, False),
    ("random", "max", "bf16", "bf16", 4096, False, True, True),
    ("random", "mixed", "fp8_e4m3fn", "bf16", 7168, True, True, True),
    ("random", "random", "fp8_e4m3fnuz", "bf16", 4096, False, False, False),
    ("random", "max", "f32", "f32", 4096, True, True, False),
    ("random", "one", "f32", "f32", 7168, False, True, False),
    ("spread", "max", "bf16", "bf16", 7168, True, True, False),
    ("all_to_one", "random", "bf16", "bf16", 4096, False, True, False),
    ("sentinel", "random", "bf16", "bf16", 7168, True, True, False),
    ("random", "zero", "bf16", "bf16", 4096, True, True, False),
]


def all_configs(pes_counts=(2, 4, 8)):
    """Every op configuration these tests build (the GPU machine finds their kernels precompiled)."""
    for n in pes_counts:
        for case in CASES:
            routing, counts, dtype, cdtype, hidden, zero_copy, weights, scales = case
            tok = 4 if "f32" in (dtype, cdtype) else 2
            yield _config(n, hidden=hidden, k=n if routing == "spread" else 4, tok=tok, scale_dim=8 if scales else 0,
                          external=not zero_copy)  # fmt: skip
        yield _config(n, hidden=4096, k=4, m=32)
        yield _config(n, hidden=4096, k=n, m=16, cap=n * 16 // 2)
        yield _config(n, hidden=4096, k=4, m=8)
        yield _config(n, hidden=4096, k=4, m=16)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c[:4]) + f"-h{c[4]}-{'zc' if c[5] else 'push'}")
def test_oracle(pes, case):
    from mori_compiler.ops import EpDispatchCombineOp

    routing, counts, dtype, cdtype, hidden, zero_copy, weights, scales = case
    k = pes if routing == "spread" else 4
    tok = 4 if "f32" in (dtype, cdtype) else 2
    cfg = _config(pes, hidden=hidden, k=k, tok=tok, scale_dim=8 if scales else 0, external=not zero_copy)
    op = EpDispatchCombineOp(cfg)
    try:
        for seed in (1, 2):
            run_round(op, _shape(cfg), routing=routing, counts=counts, dtype=dtype, combine_dtype=cdtype, seed=seed,
                      weights=weights, scales=scales)  # fmt: skip
    finally:
        op.close()


def test_repeated_calls_and_graph_replay(pes):
    """50 eager rounds in a row on fresh data, then dispatch+combine captured once and replayed."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp

    cfg = _config(pes, hidden=4096, k=4, m=32)
    op = EpDispatchCombineOp(cfg)
    shape = _shape(cfg)
    try:
        for seed in range(50):
            check = seed % 10 == 9
            run_round(op, shape, routing="random", counts="max", dtype="bf16", combine_dtype="bf16", seed=seed,
                      check=check)  # fmt: skip
        torch.cuda.synchronize()
        # Graph: fixed input tensors, refilled in place before each replay.
        from mori_compiler.ops import reference as ref

        ns = [cfg.max_num_inp_token_per_rank] * pes
        idx_np = ref.make_routing("random", ns, shape, 7)
        idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
        xs = [torch.zeros((n, cfg.hidden_dim), dtype=torch.bfloat16, device="cuda") for n in ns]
        ys = [op.get_registered_combine_input_buffer(torch.bfloat16, pe=p) for p in range(pes)]

        def step():
            outs = op.dispatch(xs, None, None, idxs)
            for p in range(pes):  # identity expert, written in place into the registered buffer
                ys[p].copy_(outs[p][0])
            return op.combine([y for y in ys], None, idxs)

        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results = step()
        for rnd in range(3):
            vals = [ref.make_tokens(n, cfg.hidden_dim, "bf16", 1000 + rnd * 10 + p) for p, n in enumerate(ns)]
            for p in range(pes):
                xs[p].copy_(_to_torch(vals[p], "bf16"))
            graph.replay()
            torch.cuda.synchronize()
            for p in range(pes):
                ref.check_combine(results[p][0][: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16", rank=p)
    finally:
        op.close()


def test_receive_cap_overflow_is_reported(pes):
    """spread routing with a receive cap: rows beyond a receiver's capacity are dropped, counted, never
    written out of bounds; what was received is still exact."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp

    m = 16
    cfg = _config(pes, hidden=4096, k=pes, m=m, cap=pes * m // 2)
    op = EpDispatchCombineOp(cfg)
    try:
        outs = run_round(op, _shape(cfg), routing="spread", counts="max", dtype="bf16", combine_dtype="bf16", seed=3,
                         check=False)  # fmt: skip
        torch.cuda.synchronize()
        totals = [int(o[4].item()) for o in outs]
        assert all(t <= cfg.max_recv for t in totals)
        dropped = op.dispatch_overflow()
        assert sum(dropped) == pes * pes * m - sum(totals) > 0
    finally:
        op.close()


def test_bad_inputs_raise_before_launch(pes):
    import torch

    from mori_compiler.ops import EpDispatchCombineOp

    cfg = _config(pes, hidden=4096, k=4, m=8)
    op = EpDispatchCombineOp(cfg)
    n, H = 4, cfg.hidden_dim
    x = [torch.zeros((n, H), dtype=torch.bfloat16, device="cuda") for _ in range(pes)]
    idx = [torch.zeros((n, 4), dtype=torch.int32, device="cuda") for _ in range(pes)]
    try:
        bad = [
            (dict(input=[torch.zeros((n, H + 16), dtype=torch.bfloat16, device="cuda") for _ in x]), "hidden size"),
            (dict(input=[torch.zeros((n, 12), dtype=torch.bfloat16, device="cuda") for _ in x]), "multiple of 16 bytes"),
            (dict(input=[t.float().to(torch.float64) for t in x]), "dtype"),
            (dict(input=[t.t() for t in x]), "contiguous"),
            (dict(input=[t.cpu() for t in x]), "CUDA"),
            (dict(indices=[t.long() for t in idx]), "dtype"),
            # (invalid expert ids are counted on the device, not refused: test_ep_dispatch_features_gpu.py)
            (dict(input=[torch.zeros((9, H), dtype=torch.bfloat16, device="cuda")] * pes,
                  indices=[torch.zeros((9, 4), dtype=torch.int32, device="cuda")] * pes), "more than"),
            (dict(input=x[:1]), "list of"),
        ]  # fmt: skip
        for change, needle in bad:
            kw = dict(input=x, weights=None, scales=None, indices=idx) | change
            with pytest.raises(ValueError, match=needle):
                op.dispatch(**kw)
        with pytest.raises(ValueError, match="wave size"):
            EpDispatchCombineOp(_config(pes, hidden=4096, k=40, er=16, m=8))
        with pytest.raises(ValueError, match="must be a power of two"):
            from mori_compiler.ops import EpDispatchCombineKernelType

            c = _config(pes, hidden=4096, m=8)
            c.kernel_type, c.gpu_per_node = EpDispatchCombineKernelType.InterNodeV1, 3
            EpDispatchCombineOp(c)
    finally:
        op.close()


def test_standard_moe_layout(pes):
    """dispatch_standard_moe / combine_standard_moe against the NumPy reference: identity experts give
    (sum of local weights) * x per received row, and combine then sums over destination PEs."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    cfg = _config(pes, hidden=4096, k=4, m=16)
    op = EpDispatchCombineOp(cfg)
    shape = _shape(cfg)
    try:
        ns = [cfg.max_num_inp_token_per_rank] * pes
        idx_np = ref.make_routing("random", ns, shape, 5)
        vals = [ref.make_tokens(n, cfg.hidden_dim, "bf16", 50 + p) for p, n in enumerate(ns)]
        xs = [_to_torch(v, "bf16") for v in vals]
        ws = [torch.from_numpy(np.random.default_rng(p).random((n, 4), dtype=np.float32)).cuda() for p, n in enumerate(ns)]
        idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
        conv = op.dispatch_standard_moe(xs, ws, None, idxs)
        torch.cuda.synchronize()
        for p in range(pes):
            packed, counts, src_info, _ = conv[p]
            out_idx = op.buffers.view("out_idx", p, (cfg.max_recv, 4), torch.int32).cpu().numpy()
            out_x = op.buffers.view("out_x", p, (cfg.max_recv * cfg.hidden_dim * 2,), torch.uint8).view(torch.bfloat16)
            out_x = out_x.view(cfg.max_recv, cfg.hidden_dim).float().cpu().numpy()
            total = int(op.buffers.view("total", p, (1,), torch.int32).item())
            rx, rc, rs = ref.convert_dispatch_output_ref(out_x, out_idx, total, p, shape)
            assert counts.cpu().tolist() == rc.tolist(), f"PE {p} expert counts"
            assert np.array_equal(src_info.cpu().numpy(), rs), f"PE {p} src info"
            assert np.array_equal(packed.float().cpu().numpy(), rx), f"PE {p} packed rows"
        res = op.combine_standard_moe([c[0] for c in conv], None, idxs)
        torch.cuda.synchronize()
        for p in range(pes):
            wsum = np.zeros(ns[p], dtype=np.float64)
            w_np = ws[p].cpu().numpy()
            for t in range(ns[p]):  # every valid k's expert ran on the token's destination PE
                wsum[t] = sum(float(w_np[t, k]) for k in range(4) if idx_np[p][t, k] >= 0)
            want = vals[p] * wsum[:, None]
            got = res[p][0][: ns[p]].float().cpu().numpy()
            np.testing.assert_allclose(got, want, atol=5e-2, rtol=5e-2, err_msg=f"PE {p}")
    finally:
        op.close()
