"""Quantized combines on a GPU (issue 15): the wire quantization of the push combine (IntraNode and
IntraNodeLL with an external input buffer) and of AsyncLL, against the oracle (docs/ep-protocols.md;
ops/quant_reference.py).

Virtual PEs (2, 4, 8 and the odd 5) in one process; every PE's tokens come from fixed seeds; the identity
expert returns each received row, so every copy of token t is x[t] and the combine must give U(t)·x[t]
within the quant type's bound (fp8_direct_cast atol = rtol = 1e-1, fp8_blockwise 7e-2, fp4_blockwise
blockMax/6·U + 0.05·|U·x| + 0.01) and, bit for bit, the reference model's wire round trip summed in fp32
and rounded to bf16 (the kernels quantize and dequantize as ops/quant_reference.py does on sm_90: OCP fp8,
E2M1 in software). Inputs: standard normal rows, and for the blockwise types "force_scale_active" rows,
±2·448 planted in every scale block (every block scaled, block 0's scale negated). Hidden sizes: 7168
(128-element blocks), 4096 (not a multiple of the 56 blocks: 74-element blocks), 1040 (an odd multiple of
16) and 112 (2-element blocks, trailing blocks empty). Outputs are poisoned before each combine; rows past
a PE's tokens must stay poisoned. Calls of a smaller hidden than the config's (2048 -> 1040, 112, 16) run
the _anyhidden kernels, whose wire rows follow the call's hidden. Each kind is also captured in a CUDA
graph and replayed on new values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from virtual_pes import virtual_pes_fixture  # noqa: E402
from test_ep_gpu import _bits, _shape, _to_torch  # noqa: E402

pytestmark = pytest.mark.gpu

FP8 = "fp8_e4m3fn"  # sm_90's wire fp8 (mori_compiler.wire_quant.WIRE_FP8_OF_TARGET)
SCALE_BLOCKS = 56  # MORI_FP8_COMBINE_SCALE_DIM's default; one case uses SMALL_BLOCKS
SMALL_BLOCKS = 5
PLANT = 2 * 448.0  # force_scale_active: ±2·fp8Max in every block
POISON = 0xA5

# (kind, quant type, hidden, inputs, scale blocks)
CASES = [
    ("IntraNode", "fp8_direct_cast", 7168, "randn", SCALE_BLOCKS),
    ("IntraNode", "fp8_blockwise", 7168, "randn", SCALE_BLOCKS),
    ("IntraNode", "fp8_blockwise", 4096, "force_scale_active", SCALE_BLOCKS),
    ("IntraNode", "fp4_blockwise", 7168, "randn", SCALE_BLOCKS),
    ("IntraNode", "fp4_blockwise", 1040, "force_scale_active", SCALE_BLOCKS),
    ("IntraNode", "fp8_blockwise", 112, "force_scale_active", SCALE_BLOCKS),
    ("IntraNode", "fp8_blockwise", 1040, "randn", SMALL_BLOCKS),
    ("IntraNodeLL", "fp8_direct_cast", 1040, "randn", SCALE_BLOCKS),
    ("IntraNodeLL", "fp8_blockwise", 7168, "force_scale_active", SCALE_BLOCKS),
    ("IntraNodeLL", "fp4_blockwise", 4096, "force_scale_active", SCALE_BLOCKS),
    ("AsyncLL", "fp8_direct_cast", 4096, "randn", SCALE_BLOCKS),
    ("AsyncLL", "fp8_blockwise", 7168, "force_scale_active", SCALE_BLOCKS),
    ("AsyncLL", "fp8_blockwise", 112, "randn", SCALE_BLOCKS),
]
PES = (2, 4, 8, 5)


pes = virtual_pes_fixture(PES)  # the virtual-PE shmem of each count


def quant_config(n_pes, kind, quant, hidden, *, m=32, er=4, k=4, external=True, tok=2):
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType[kind], data_type="bf16", rank=0,
                                   world_size=n_pes, hidden_dim=hidden, scale_dim=0, scale_type_size=0,
                                   max_token_type_size=tok, max_num_inp_token_per_rank=m, num_experts_per_rank=er,
                                   num_experts_per_token=k, warp_num_per_block=4, block_num=16,
                                   use_external_inp_buf=external, quant_type=quant)  # fmt: skip


def all_configs(pes_counts=PES):
    """(config, scale blocks) of every op these tests build (kernels.py precompiles them)."""
    for n in pes_counts:
        for kind, quant, hidden, _inputs, blocks in CASES:
            yield quant_config(n, kind, quant, hidden), blocks
        for kind, quant in RUNTIME_CASES:
            yield quant_config(n, kind, quant, RUNTIME_HIDDEN[0]), SCALE_BLOCKS
        for kind, quant in GRAPH_CASES:
            yield quant_config(n, kind, quant, graph_hidden(kind)), SCALE_BLOCKS
        yield quant_config(n, "IntraNode", "fp8_blockwise", 1040, tok=4), SCALE_BLOCKS  # the f32 refusal


def precompile(cache_root, target: str = "sm_90", pes_counts=PES) -> list:
    """The bundles of all_configs(), each with its scale blocks (as the op finds them)."""
    from mori_compiler.ops import ep_bundle

    bundles = (ep_bundle(c, target, virtual_pes=True, cache_root=cache_root, scale_blocks=s)
               for c, s in all_configs(pes_counts))  # fmt: skip
    return list({b.key: b for b in bundles}.values())


def make_inputs(n: int, hidden: int, inputs: str, blocks: int, seed: int) -> np.ndarray:
    """float32 [n, H] bf16 values: standard normal, or with ±PLANT at a random element of every block."""
    from mori_compiler.ops import quant_reference as qref
    from mori_compiler.ops import reference as ref

    x = ref.make_tokens(n, hidden, "bf16", seed)
    if inputs == "force_scale_active" and n:
        rng = np.random.default_rng(seed + 99)
        size = qref.block_size(hidden, blocks)
        for b in range(blocks):
            lo, hi = b * size, min((b + 1) * size, hidden)
            if lo >= hi:
                break  # the trailing blocks are empty
            cols = rng.integers(lo, hi, n)
            x[np.arange(n), cols] = np.where(rng.random(n) < 0.5, -PLANT, PLANT)
    return x


def expected_output(x: np.ndarray, copies: np.ndarray, quant: str, blocks: int) -> np.ndarray:
    """float32 [n, H]: the model's combine of U(t) identical copies of x[t], rounded to bf16."""
    from mori_compiler.ops import quant_reference as qref
    from mori_compiler.ops import reference as ref

    u_max = max(int(copies.max()) if copies.size else 0, 1)
    contributions = np.broadcast_to(x, (u_max, *x.shape))
    present = np.arange(u_max)[:, None] < copies[None, :]
    fp8 = FP8 if quant.startswith("fp8") else None
    sdim = blocks if quant.endswith("blockwise") else None
    out = qref.reference_quantized_combine(contributions, quant, fp8, sdim, present=present)
    return ref.quantize(out, "bf16")


def check_output(p: int, out_bf16, x: np.ndarray, copies: np.ndarray, quant: str, blocks: int) -> None:
    """Within the oracle's bound of U·x, and bit-exact with the model."""
    from mori_compiler.ops import quant_reference as qref

    n = x.shape[0]
    got = out_bf16[:n].float().cpu().numpy()
    qref.check_quantized_combine(got, x, copies, quant, scale_dim=blocks if quant == "fp4_blockwise" else None)
    want = expected_output(x, copies, quant, blocks)
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))
    if bad[0].size:
        t, j = int(bad[0][0]), int(bad[1][0])
        raise AssertionError(f"PE {p} {quant} combine: token {t} element {j}: got {got[t, j]!r}, the model gives "
                             f"{want[t, j]!r} ({bad[0].size} element(s) differ)")  # fmt: skip
    rest = _bits(out_bf16[n:]).view(np.uint8)
    assert (rest == POISON).all(), f"PE {p}: the combine wrote rows past its {n} tokens"


class Round:
    """One PE set's tokens and routing, dispatched; the identity expert's rows ready to combine."""

    def __init__(self, op, inputs: str, blocks: int, seed: int, hidden: int | None = None):
        import torch

        from mori_compiler.ops import reference as ref

        c = op.config
        self.shape = _shape(c)
        n_pes, H = c.world_size, hidden or c.hidden_dim  # the call's hidden (<= the config's)
        rng = np.random.default_rng(seed)
        self.ns = [int(v) for v in rng.integers(1, c.max_num_inp_token_per_rank + 1, n_pes)]
        self.idx_np = ref.make_routing("random", self.ns, self.shape, seed)
        self.x = [make_inputs(n, H, inputs, blocks, seed * 100 + p) for p, n in enumerate(self.ns)]
        self.w = [np.random.default_rng(seed + p).random((n, c.num_experts_per_token), dtype=np.float32)
                  for p, n in enumerate(self.ns)]  # fmt: skip
        self.xs = [_to_torch(v, "bf16") for v in self.x]
        self.ws = [torch.from_numpy(v).cuda() for v in self.w]
        self.idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in self.idx_np]
        self.copies = [ref.unique_dest_count(v, self.shape) for v in self.idx_np]


def poison(op) -> None:
    import torch

    for p in range(op.config.world_size):
        for name in ("out_c", "out_cw"):
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(POISON)


def dispatch_and_combine(op, rnd: Round, weights: bool):
    import torch

    outs = op.dispatch(rnd.xs, rnd.ws if weights else None, None, rnd.idxs)  # AsyncLL: send and receive
    ys = [outs[p][0][: int(outs[p][4].item())].clone() for p in range(op.config.world_size)]  # identity expert
    wys = [outs[p][1][: ys[p].shape[0]].clone() for p in range(op.config.world_size)] if weights else None
    poison(op)
    res = op.combine(ys, wys, rnd.idxs)
    torch.cuda.synchronize()
    return res


def _ids(case):
    kind, quant, hidden, inputs, blocks = case
    return f"{kind}-{quant}-h{hidden}-{inputs}-s{blocks}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_quantized_combine(pes, case, monkeypatch):
    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    kind, quant, hidden, inputs, blocks = case
    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", str(blocks))  # read once, by the op's constructor
    op = EpDispatchCombineOp(quant_config(pes, kind, quant, hidden))
    weights = kind != "AsyncLL"  # AsyncLL returns no combine weights
    try:
        for seed in (1, 2):
            rnd = Round(op, inputs, blocks, seed)
            res = dispatch_and_combine(op, rnd, weights)
            for p in range(pes):
                check_output(p, res[p][0], rnd.x[p], rnd.copies[p], quant, blocks)
                if weights:  # the weights are not quantized: U·w
                    n = rnd.ns[p]
                    want = ref.reference_combine_weights(rnd.w[p], rnd.idx_np[p], rnd.shape)
                    np.testing.assert_allclose(res[p][1][:n].cpu().numpy(), want, atol=1e-5, rtol=1e-5,
                                               err_msg=f"combine weights on PE {p}")  # fmt: skip
    finally:
        op.close()


# Calls of a smaller hidden than the config's (2048: 37-element blocks) run the _anyhidden kernels, whose
# wire rows are computed from the call's hidden: 1040 (19-element blocks), 112 (2), 16 (1; 40 blocks empty).
RUNTIME_HIDDEN = (2048, 1040, 112, 16)
RUNTIME_CASES = [("IntraNode", "fp8_blockwise"), ("IntraNodeLL", "fp4_blockwise"), ("AsyncLL", "fp8_blockwise"),
                 ("IntraNode", "fp8_direct_cast")]  # fmt: skip


@pytest.mark.parametrize("kind, quant", RUNTIME_CASES, ids=lambda v: str(v))
def test_quantized_combine_at_runtime_hidden(pes, kind, quant, monkeypatch):
    from mori_compiler.ops import EpDispatchCombineOp

    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", str(SCALE_BLOCKS))
    op = EpDispatchCombineOp(quant_config(pes, kind, quant, RUNTIME_HIDDEN[0]))
    try:
        for seed, hidden in enumerate(RUNTIME_HIDDEN):
            inputs = "force_scale_active" if quant.endswith("blockwise") else "randn"
            rnd = Round(op, inputs, SCALE_BLOCKS, 20 + seed, hidden=hidden)
            res = dispatch_and_combine(op, rnd, weights=False)
            for p in range(pes):
                assert res[p][0].shape[1] == hidden
                check_output(p, res[p][0], rnd.x[p], rnd.copies[p], quant, SCALE_BLOCKS)
    finally:
        op.close()


GRAPH_CASES = [("IntraNode", "fp8_blockwise"), ("IntraNodeLL", "fp4_blockwise"), ("IntraNode", "fp8_direct_cast"),
               ("AsyncLL", "fp8_blockwise"), ("AsyncLL", "fp8_direct_cast")]  # fmt: skip


def graph_hidden(kind: str) -> int:
    return 4096 if kind != "IntraNode" else 7168


@pytest.mark.parametrize("kind, quant", GRAPH_CASES, ids=lambda v: str(v))
def test_quantized_combine_graph_replay(pes, kind, quant, monkeypatch):
    """dispatch + identity expert + quantized combine captured once, replayed on new token values (written
    in place), each replay checked against the model."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp

    hidden = graph_hidden(kind)
    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", str(SCALE_BLOCKS))
    op = EpDispatchCombineOp(quant_config(pes, kind, quant, hidden))
    try:
        rnd = Round(op, "force_scale_active" if quant.endswith("blockwise") else "randn", SCALE_BLOCKS, 5)
        ys = [torch.empty((op.config.max_recv, hidden), dtype=torch.bfloat16, device="cuda") for _ in range(pes)]
        totals = {}

        def step():
            outs = op.dispatch(rnd.xs, None, None, rnd.idxs)
            for p in range(pes):
                ys[p].copy_(outs[p][0][: op.config.max_recv])
            if not totals:  # the routing is fixed: the first eager call gives every PE's row count
                torch.cuda.synchronize()
                totals.update({p: int(outs[p][4].item()) for p in range(pes)})
            return op.combine([ys[p][: totals[p]] for p in range(pes)], None, rnd.idxs)

        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results = step()
        for replay in range(3):
            vals = [make_inputs(n, hidden, "force_scale_active" if quant.endswith("blockwise") else "randn",
                                SCALE_BLOCKS, 1000 + 10 * replay + p) for p, n in enumerate(rnd.ns)]  # fmt: skip
            for p in range(pes):
                rnd.xs[p].copy_(_to_torch(vals[p], "bf16"))
            poison(op)
            graph.replay()
            torch.cuda.synchronize()
            for p in range(pes):
                check_output(p, results[p][0], vals[p], rnd.copies[p], quant, SCALE_BLOCKS)
    finally:
        op.close()


def test_quantized_ops_refuse_what_they_cannot_do(pes, monkeypatch):
    """An f32 combine call and a zero-copy call on a quantizing op, fp4 for a target without its
    conversion, an unknown quant type: clear errors naming the field, nothing launched."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops.config import ConfigError

    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", str(SCALE_BLOCKS))
    with pytest.raises(ConfigError, match="config.quant_type 'fp4_blockwise' is not supported on target gfx942"):
        EpDispatchCombineOp(quant_config(pes, "IntraNode", "fp4_blockwise", 1040), target="gfx942")
    with pytest.raises(ConfigError, match="config.quant_type 'fp8' is not allowed"):
        EpDispatchCombineOp(quant_config(pes, "IntraNode", "fp8", 1040))
    with pytest.raises(ConfigError, match="needs config.use_external_inp_buf=True"):
        EpDispatchCombineOp(quant_config(pes, "IntraNode", "fp8_direct_cast", 1040, external=False))
    op = EpDispatchCombineOp(quant_config(pes, "IntraNode", "fp8_blockwise", 1040, tok=4))
    try:
        rnd = Round(op, "randn", SCALE_BLOCKS, 3)
        outs = op.dispatch(rnd.xs, None, None, rnd.idxs)
        torch.cuda.synchronize()
        ys = [outs[p][0][: int(outs[p][4].item())] for p in range(pes)]
        poison(op)
        with pytest.raises(ValueError, match="quant_type 'fp8_blockwise' quantizes bf16 combines"):
            op.combine([y.float() for y in ys], None, rnd.idxs)
        with pytest.raises(ValueError, match="quant_type 'fp8_blockwise' needs the push combine"):
            op.combine(ys, None, rnd.idxs, use_external_inp_buf=0)
        torch.cuda.synchronize()
        for p in range(pes):  # nothing ran: the outputs are still poisoned
            assert (_bits(op.buffers.view("out_c", p, (op.buffers.sizes["out_c"],), torch.uint8)) == POISON).all()
    finally:
        op.close()
