"""The low-latency kernel types on a GPU: IntraNodeLL and AsyncLL (all three notification modes).

Same oracle as test_ep_gpu.py (docs/ep-protocols.md): poisoned outputs, every received row bit-exact with its
source token, combine with the identity expert = U·x and U·w; AsyncLL rows grouped by source PE. Plus
repeated rounds, graph capture of each AsyncLL phase, a compute kernel between send and recv, and the
phase-order and option errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_ep_gpu import _config, _shape, _to_torch, pes, run_round  # noqa: E402,F401  (pes: the fixture)

pytestmark = pytest.mark.gpu

MODES = {  # AsyncLL notification modes, as the MORI_ASYNCLL_* variables would set them
    "quiet": {"early_notify": 0, "fused_recv": 0},
    "early": {"early_notify": 1, "fused_recv": 0},
    "fused": {"early_notify": 1, "fused_recv": 1},
}

CASES = [
    # (routing, token counts, dispatch dtype, combine dtype, hidden, zero-copy, weights, scales); M = 128
    ("random", "random", "bf16", "bf16", 7168, True, True, False),
    ("random", "128", "fp8_e4m3fn", "bf16", 7168, False, True, True),
    ("random", "64", "bf16", "bf16", 4096, True, True, False),
    ("random", "1", "fp8_e4m3fnuz", "bf16", 4096, False, False, False),
    ("random", "zero", "bf16", "bf16", 4096, True, True, False),
    ("random", "mixed", "bf16", "bf16", 7168, True, True, True),  # zero-token peers among busy ones
    ("spread", "128", "bf16", "bf16", 4096, False, True, False),
    ("all_to_one", "random", "f32", "f32", 4096, True, True, False),
    ("sentinel", "random", "bf16", "bf16", 7168, True, True, False),
]


def case_config(n, case, kind):
    routing, counts, dtype, cdtype, hidden, zero_copy, weights, scales = case
    tok = 4 if "f32" in (dtype, cdtype) else 2
    return _config(n, hidden=hidden, m=128, k=n if routing == "spread" else 4, tok=tok, scale_dim=8 if scales else 0,
                   external=not zero_copy, kind=kind, blocks=32)  # fmt: skip


def _async_options(mode: str):
    from mori_compiler.ops.asyncll import resolve

    return resolve({}, **MODES[mode])


def all_configs(pes_counts=(2, 4, 8)):
    """(config, AsyncLL options or None) of every op these tests build, for precompiling."""
    for n in pes_counts:
        for case in CASES:
            yield case_config(n, case, "IntraNodeLL"), None
            for mode in MODES:
                yield case_config(n, case, "AsyncLL"), _async_options(mode)
        for mode in MODES:
            yield _config(n, hidden=4096, k=4, m=32, kind="AsyncLL"), _async_options(mode)
        yield _config(n, hidden=4096, k=4, m=32, kind="IntraNodeLL"), None


def _ids(case):
    return "-".join(str(x) for x in case[:4]) + f"-h{case[4]}-{'zc' if case[5] else 'push'}"


def _check_case(op, case):
    routing, counts, dtype, cdtype, hidden, zero_copy, weights, scales = case
    for seed in (1, 2):
        run_round(op, _shape(op.config), routing=routing, counts=counts, dtype=dtype, combine_dtype=cdtype, seed=seed,
                  weights=weights, scales=scales)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_intranode_ll_oracle(pes, case):
    from mori_compiler.ops import EpDispatchCombineOp

    op = EpDispatchCombineOp(case_config(pes, case, "IntraNodeLL"))
    try:
        _check_case(op, case)
    finally:
        op.close()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_asyncll_oracle(pes, case, mode):
    from mori_compiler.ops import EpDispatchCombineOp

    op = EpDispatchCombineOp(case_config(pes, case, "AsyncLL"), asyncll=MODES[mode])
    try:
        assert op.config_dict()["asyncll"]["mode"] == _async_options(mode).mode
        _check_case(op, case)
    finally:
        op.close()


@pytest.mark.parametrize("kind_mode", ["IntraNodeLL", "AsyncLL-quiet", "AsyncLL-early", "AsyncLL-fused"])
def test_repeated_rounds(pes, kind_mode):
    """60 rounds in a row on fresh data (every 10th checked), so round parities and epochs wrap many times."""
    from mori_compiler.ops import EpDispatchCombineOp

    kind, _, mode = kind_mode.partition("-")
    op = EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind=kind), asyncll=MODES.get(mode))
    try:
        for seed in range(60):
            run_round(op, _shape(op.config), routing="random", counts="random", dtype="bf16", combine_dtype="bf16",
                      seed=seed, check=seed % 10 == 9)  # fmt: skip
    finally:
        op.close()


def _fixed_inputs(op, seed):
    import torch

    from mori_compiler.ops import reference as ref

    c, shape = op.config, _shape(op.config)
    ns = [c.max_num_inp_token_per_rank] * c.world_size
    idx_np = ref.make_routing("random", ns, shape, seed)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    xs = [torch.zeros((n, c.hidden_dim), dtype=torch.bfloat16, device="cuda") for n in ns]
    return ns, idx_np, idxs, xs


@pytest.mark.parametrize("mode", list(MODES))
def test_asyncll_graph_capture_of_each_phase(pes, mode):
    """Each of the four phases captured in its own CUDA graph; replaying them in order on new data gives
    the oracle's combine (the rounds, parities and epochs advance on the device)."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    op = EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind="AsyncLL"), asyncll=MODES[mode])
    shape = _shape(op.config)
    try:
        ns, idx_np, idxs, xs = _fixed_inputs(op, 11)
        outs = op.dispatch(xs, None, None, idxs)  # one eager round: argument tables uploaded
        ys = [o[0] for o in outs]  # the identity expert: combine reads the dispatch output rows in place
        op.combine(ys, None, idxs)
        torch.cuda.synchronize()
        graphs = [torch.cuda.CUDAGraph() for _ in range(4)]
        with torch.cuda.graph(graphs[0]):
            op.dispatch_send(xs, None, None, idxs)
        with torch.cuda.graph(graphs[1]):
            op.dispatch_recv()
        with torch.cuda.graph(graphs[2]):
            results = op.combine_send(ys, None, idxs)
        with torch.cuda.graph(graphs[3]):
            op.combine_recv()
        for rnd in range(4):
            vals = [ref.make_tokens(n, op.config.hidden_dim, "bf16", 500 + 10 * rnd + p) for p, n in enumerate(ns)]
            for p in range(pes):
                xs[p].copy_(_to_torch(vals[p], "bf16"))
            for g in graphs:
                g.replay()
            torch.cuda.synchronize()
            for p in range(pes):
                ref.check_combine(results[p][0][: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16", rank=p)
    finally:
        op.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_asyncll_compute_between_send_and_recv(pes, mode):
    """A matmul on the same stream between each send and its recv (reading the dispatch input, writing its
    own output): both the EP results and the matmul are correct."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    op = EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind="AsyncLL"), asyncll=MODES[mode])
    shape = _shape(op.config)
    try:
        ns, idx_np, idxs, xs = _fixed_inputs(op, 21)
        vals = [ref.make_tokens(n, op.config.hidden_dim, "bf16", 70 + p) for p, n in enumerate(ns)]
        for p in range(pes):
            xs[p].copy_(_to_torch(vals[p], "bf16"))
        a = torch.randn((1024, 1024), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
        want = (a.double() @ a.double()).float()
        for _ in range(3):
            outs = op.dispatch_send(xs, None, None, idxs)
            c1 = a @ a
            op.dispatch_recv()
            res = op.combine_send([o[0] for o in outs], None, idxs)
            c2 = a @ a
            op.combine_recv()
            torch.cuda.synchronize()
            for c in (c1, c2):
                torch.testing.assert_close(c, want, atol=1e-2, rtol=1e-3)
            for p in range(pes):
                ref.check_combine(res[p][0][: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16", rank=p)
    finally:
        op.close()


def test_asyncll_phase_errors_and_options(pes):
    """recv without send, send twice, combine before dispatch, reset while pending, and bad options: clear
    errors before any launch; the op still works afterwards."""
    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops.asyncll import AsyncLLOptionError, AsyncLLPhaseError

    with pytest.raises(AsyncLLOptionError, match="MORI_ASYNCLL_FUSED_RECV"):
        EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind="AsyncLL"), asyncll={"fused_recv": 1})
    with pytest.raises(AsyncLLOptionError, match="0 or 1"):
        EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind="AsyncLL"), asyncll={"early_notify": 2})
    op = EpDispatchCombineOp(_config(pes, hidden=4096, k=4, m=32, kind="AsyncLL"), asyncll=MODES["early"])
    try:
        ns, idx_np, idxs, xs = _fixed_inputs(op, 31)
        with pytest.raises(AsyncLLPhaseError, match="without a pending dispatch_send"):
            op.dispatch_recv()
        with pytest.raises(AsyncLLPhaseError, match="before a dispatch completed"):
            op.combine_send(xs, None, idxs)
        outs = op.dispatch_send(xs, None, None, idxs)
        with pytest.raises(AsyncLLPhaseError, match="called twice"):
            op.dispatch_send(xs, None, None, idxs)
        with pytest.raises(RuntimeError, match="pending"):
            op.reset()
        op.dispatch_recv()
        op.combine([o[0] for o in outs], None, idxs)
        run_round(op, _shape(op.config), routing="random", counts="random", dtype="bf16", combine_dtype="bf16", seed=4)
    finally:
        op.close()
