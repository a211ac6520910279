"""EpDispatchCombineOp in AUTO launch mode on a GPU (``MORI_EP_LAUNCH_CONFIG_MODE=AUTO``).

The ops are built as MORI users build them and called without ``block_num`` / ``warp_per_block``: every
call's grid and warps come from the shipped H200 tables (mori_compiler/ops/tuning_configs; the tuning shape
of bench/ep_tune.py: hidden 7168, top-8 of 256 experts, EP 8) or, where no rule applies, MORI's fallback
clamped to the co-resident grid. Each launch is recorded (kernel name, grid, block) and compared with the
geometry read here from the table file itself (MORI's bucket rule: the first rule whose ``num_tokens`` holds
the call's, else the largest), so what runs is what the table says. Cases:

* EP 8 (the tables' size), IntraNode, IntraNodeLL and AsyncLL, token counts on and between the table rows
  (1, 77, 128, 300, 1025, 4096), bf16 and fp8 dispatch, the combine in each form the kernel type has
  (zero-copy and push for the intra-node types, AsyncLL's own); then two calls outside the rows: fp8 FNUZ
  (no rule of that dtype: the fallback) and a runtime hidden of 2048 (the lookup's "any hidden" pass);
* EP 4 (no table): every call falls back and still matches the oracle;
* tokens beyond the largest bucket (an op of 5000 tokens per PE): clamped to the 4096 rule;
* a dispatch + combine captured in a CUDA graph in AUTO mode and replayed on new values.

Same oracle as test_ep_gpu.py (ops/reference.py): outputs poisoned before the launches, fixed seeds, random
inputs; every received row bit-exact with its source token, the identity expert's combine = U·x and U·w.
The GPU machine has no compiler: all_configs() lists every bundle these ops load (each config at every warp
count its tables can pick), precompiled by test/python/gpu/kernels.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_ep_gpu import REF_DTYPE, _bits, _shape, _to_torch  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90"
TABLE_MODEL = "h200"  # the shipped sm_90 tables' model (another sm_90 GPU uses them too)
HIDDEN, EXPERTS, TOPK = 7168, 256, 8  # the tables' shape (bench/ep_tune.py)
KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL")
# The ops: (world size, max tokens per PE, compiled warps: one the tables or the fallback pick anyway).
OPS = {
    "ep8": (8, 4096, 8),  # the tables' EP size, sized for their largest bucket
    "ep8_beyond": (8, 5000, 8),  # calls past the largest bucket
    "ep4": (4, 512, 16),  # no table at EP 4: MORI's fallback (16 warps) for every call
}
COUNTS = {"ep8": (1, 77, 128, 300, 1025, 4096), "ep4": (1, 77, 300, 512)}
MORI_DTYPE = {"bf16": "bf16", "fp8_e4m3fn": "fp8_e4m3", "fp8_e4m3fnuz": "fp8_e4m3_fnuz"}  # the tables' names
HEAP = 4 << 30  # per PE: the largest op here (AsyncLL at EP 8, 4096 tokens) takes 2.7 GiB


def _config(kind: str, op_case: str):
    """The tuning shape of bench/ep_tune.py (push staging buffers for the intra-node types, so one op offers
    both combine forms) at the case's world size and token count."""
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    world, tokens, warps = OPS[op_case]
    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType[kind], data_type="bf16", rank=0,
                                   world_size=world, hidden_dim=HIDDEN, scale_dim=0, scale_type_size=4,
                                   max_token_type_size=2, max_num_inp_token_per_rank=tokens,
                                   num_experts_per_rank=EXPERTS // world, num_experts_per_token=TOPK,
                                   warp_num_per_block=warps, block_num=16,
                                   use_external_inp_buf=kind != "AsyncLL")  # fmt: skip


def _asyncll(kind: str):
    """AsyncLL's notification mode: the defaults, not the environment (the precompiled bundles are those)."""
    from mori_compiler.ops.asyncll import resolve

    return resolve({}) if kind == "AsyncLL" else None


OP_CASES = [(kind, case) for case in ("ep8", "ep4") for kind in KINDS] + [("IntraNode", "ep8_beyond")]


def all_configs():
    """(config, AsyncLL options or None) of every bundle these tests' ops load: each op's config at every
    warp count its AUTO mode can pick over the shipped tables (the op builds a bundle for each)."""
    from mori_compiler.ops.auto_launch import AutoLaunch

    for kind, case in OP_CASES:
        cfg = _config(kind, case)
        for warps in AutoLaunch(cfg, TARGET, TABLE_MODEL).warp_counts():
            yield dataclasses.replace(cfg, warp_num_per_block=warps), _asyncll(kind)


# ---- the op in AUTO mode, and its launches ------------------------------------------------------------------


@pytest.fixture
def auto_op(monkeypatch):
    """make(kind, op case) -> (op, its launch record): the op built in AUTO mode over the shipped tables, in a
    virtual-PE shmem of its world size (finalized afterwards)."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.runtime import shmem

    made = []

    def make(kind: str, op_case: str):
        cfg = _config(kind, op_case)
        torch.cuda.init()
        shmem.shmem_init_virtual(cfg.world_size, heap_size=HEAP)
        made.append(None)
        with monkeypatch.context() as env:  # the op reads its launch mode and tables once, here
            env.setenv("MORI_EP_LAUNCH_CONFIG_MODE", "AUTO")
            env.delenv("MORI_EP_TUNING_CONFIG", raising=False)
            made[-1] = EpDispatchCombineOp(cfg, target=TARGET, asyncll=_asyncll(kind))
        op = made[-1]
        assert op.auto is not None, "the op is not in AUTO mode"
        for leg in ("dispatch", "combine"):  # EP 8 reads the shipped table of its kind, EP 4 has none
            want = _table_path(kind, cfg.world_size, leg)
            got = op.auto.tables[leg]
            assert (got.path.resolve() if got else None) == (want.resolve() if want.is_file() else None), leg
        return op, LaunchRecord(op, monkeypatch)

    yield make
    for op in made:
        if op is not None:
            torch.cuda.synchronize()
            op.close()
    if made:
        shmem.shmem_finalize()


class LaunchRecord:
    """Every kernel launch of an op, over all its kernel sets (one per warp count): (kernel name, grid, block),
    recorded on the way to the real launch."""

    def __init__(self, op, monkeypatch):
        self.launches: list[tuple[str, tuple, tuple]] = []
        for launches in op._launches.values():
            kernels = launches.kernels
            monkeypatch.setattr(kernels, "launch_virtual", self._spy(kernels.launch_virtual))

    def _spy(self, launch):
        def launch_virtual(kernel, per_pe_args, *, grid, block, **kw):
            self.launches.append((kernel, tuple(grid), tuple(block)))
            return launch(kernel, per_pe_args, grid=grid, block=block, **kw)

        return launch_virtual

    def take(self) -> list[tuple[str, tuple, tuple]]:
        out, self.launches = self.launches, []
        return out


def _table_path(kind: str, world: int, leg: str) -> Path:
    from mori_compiler.ops import tuning

    return tuning.SHIPPED_DIR / tuning.file_name(TARGET, TABLE_MODEL, kind, world, leg)


def expected_geometry(op, leg: str, dtype: str, tokens: int, zero_copy: bool | None) -> tuple[int, int, str]:
    """(blocks, warps, where from) the tables give a call of ``tokens`` (the most of any PE), read from the
    table file here: the rules of the call's dtype and combine form; the first whose num_tokens >= tokens,
    else the largest (MORI's clamp). The shipped rules are all of hidden 7168 and top-8, so a call of another
    hidden finds the same rules (the lookup's "any hidden" pass). Without a rule: MORI's fallback, 128 blocks
    of 16 warps, clamped to the grid whose blocks are all co-resident (the driver's occupancy x SMs / W)."""
    from mori_compiler.ops.auto_launch import coresident_blocks, leg_kernel_names

    c = op.config
    path = _table_path(op.kernel_type.name, c.world_size, leg)
    if leg == "combine" and zero_copy is None:  # AsyncLL's combine reads the caller's rows: the push form's rules
        zero_copy = False
    rules = []
    if path.is_file():
        rules = [r for r in json.loads(path.read_text())["rules"] if r["dtype"] == MORI_DTYPE.get(dtype)
                 and (leg == "dispatch" or (r["zero_copy"] == zero_copy and r["quant_type"] == "none"))]  # fmt: skip
    if rules:
        assert all(r["hidden_dim"] == HIDDEN and r.get("topk") == TOPK for r in rules), path
        rules.sort(key=lambda r: r["num_tokens"])
        rule = next((r for r in rules if max(tokens, 1) <= r["num_tokens"]), rules[-1])
        return rule["block_num"], rule["warp_per_block"], f"{path.name} rule of {rule['num_tokens']} tokens"
    blocks, warps = 128, 16
    fits = coresident_blocks(op._launches[warps].kernels, leg_kernel_names(c, leg), warps * op.target.wave_size,
                             c.world_size)  # fmt: skip
    return min(blocks, fits), warps, f"fallback (co-resident limit {fits})"


def _kernel_names(op, leg: str, dtype: str, hidden: int, zero_copy: bool | None) -> list[str]:
    """The kernels a call launches, in order (the any-hidden variants for a hidden other than the config's)."""
    suffix = f"_{dtype}" + ("" if hidden == op.config.hidden_dim else "_anyhidden")
    if op.is_async:
        return [f"ep_async_{leg}_{half}{suffix}" for half in ("send", "recv")]
    if leg == "combine":
        return [f"ep_combine_{'pull' if zero_copy else 'push'}{suffix}"]
    return [f"ep_dispatch{'_ll' if op.kernel_type.name == 'IntraNodeLL' else ''}{suffix}"]


def expected_launches(op, leg: str, dtype: str, tokens: int, hidden: int, zero_copy: bool | None):
    """([(kernel, grid, block)] of a call as the tables give it, where the geometry comes from)."""
    blocks, warps, origin = expected_geometry(op, leg, dtype, tokens, zero_copy)
    block = (warps * op.target.wave_size, 1, 1)
    return [(name, (blocks, 1), block) for name in _kernel_names(op, leg, dtype, hidden, zero_copy)], origin


def check_launches(op, record, leg: str, dtype: str, tokens: int, hidden: int, zero_copy: bool | None) -> None:
    """The launches since the last check are the call's kernels, each with the tables' geometry."""
    want, origin = expected_launches(op, leg, dtype, tokens, hidden, zero_copy)
    got = record.take()
    assert got == want, (f"{leg} of {tokens} tokens ({dtype}, hidden {hidden}, zero_copy {zero_copy}): launched "
                         f"{got}; the tables give {want} ({origin})")  # fmt: skip


# ---- one checked round ----------------------------------------------------------------------------------------


def _synchronize(op) -> None:
    for launches in op._launches.values():  # (each kernel set releases its launch buffers and checks its waits)
        launches.kernels.synchronize()


def _poison(op) -> None:
    """Every output the kernels write, and the registered combine input: dispatch outputs with 0xA5 (compared
    bit for bit), combine outputs and input rows with 0xFF (NaN in bf16 and f32: a row not written, or read
    past what was written, never passes)."""
    import torch

    for p in range(op.config.world_size):
        for name, byte in (("out_x", 0xA5), ("out_w", 0xA5), ("out_idx", 0xA5), ("src_pos", 0xA5), ("out_c", 0xFF),
                           ("out_cw", 0xFF), ("reg_x", 0xFF)):  # fmt: skip
            op.buffers.view(name, p, (op.buffers.sizes[name],), torch.uint8).fill_(byte)


def _token_counts(tokens: int, world: int, seed: int) -> list[int]:
    """``tokens`` on one PE (which one varies with the seed), random counts up to min(tokens, 512) on the
    others: a call's lookups take the most of any PE, and the oracle's host work stays small at 4096."""
    ns = [int(v) for v in np.random.default_rng(seed).integers(0, min(tokens, 512) + 1, world)]
    ns[seed % world] = tokens
    return ns


def run_round(op, record, *, tokens: int, dtype: str, zero_copy: bool | None, seed: int, hidden: int | None = None,
              **call_geometry) -> None:  # fmt: skip
    """One dispatch of ``dtype`` rows and one identity-expert bf16 combine (``zero_copy`` True: the registered
    buffer; False: push; None: AsyncLL's), launched with the tables' geometry and checked against the oracle.
    ``call_geometry``: block_num / warp_per_block passed to both calls (AUTO takes the tables' anyway)."""
    import torch

    from mori_compiler.ops import reference as ref

    c = op.config
    W, K, H, shape = c.world_size, c.num_experts_per_token, hidden or c.hidden_dim, _shape(c)
    rng = np.random.default_rng(seed)
    ns = _token_counts(tokens, W, seed)
    idx_np = ref.make_routing("random", ns, shape, seed)
    x_f32 = [ref.make_tokens(n, H, REF_DTYPE[dtype], seed * 100 + p) for p, n in enumerate(ns)]
    w_np = [rng.random((n, K), dtype=np.float32) for n in ns]
    xs = [_to_torch(v, dtype) for v in x_f32]
    ws = [torch.from_numpy(v).cuda() for v in w_np]
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    _poison(op)
    record.take()
    outs = op.dispatch(xs, ws, None, idxs, **call_geometry)
    _synchronize(op)
    check_launches(op, record, "dispatch", dtype, tokens, H, None)
    src_pos = op.get_dispatch_src_token_pos()
    if op.is_async:  # rows grouped by source PE
        layout = ref.asyncll_layout(idx_np, shape)
        for p in range(W):
            ref.check_asyncll_layout(p, src_pos[p].cpu().numpy(), len(src_pos[p]), layout, shape, strict_order=False)
    expected = ref.expected_recv_rows([_bits(x) for x in xs], w_np, None, idx_np, shape)
    regs = op.get_registered_combine_input_buffer(torch.bfloat16, H) if zero_copy else None
    ys, wys = [], []
    for p in range(W):
        out_x, out_w, _, out_idx, total = outs[p]
        tot = int(total.item())
        assert out_x.shape == (c.max_recv, H)
        ref.check_dispatch(p, _bits(out_x[:tot]), out_w[:tot].cpu().numpy(), None, out_idx[:tot].cpu().numpy(),
                           src_pos[p].cpu().numpy(), tot, expected[p], shape)  # fmt: skip
        y = out_x[:tot].to(torch.bfloat16)  # the identity expert's output rows
        if regs is not None:  # zero-copy: written into the registered buffer, which is the combine's input
            regs[p][:tot].copy_(y)
            y = regs[p]
        ys.append(y.contiguous())
        wys.append(out_w[:tot].clone())
    form = {} if zero_copy is None else {"use_external_inp_buf": int(not zero_copy)}
    res = op.combine(ys, wys, idxs, **form, **call_geometry)
    _synchronize(op)
    check_launches(op, record, "combine", "bf16", tokens, H, zero_copy)
    for p in range(W):
        out, out_w = res[p]
        n = ns[p]
        ref.check_combine(out[:n].float().cpu().numpy(), x_f32[p], idx_np[p], shape, "bf16", rank=p)
        ref.check_combine_weights(out_w[:n].cpu().numpy(), w_np[p], idx_np[p], shape, rank=p)


def _forms(op) -> tuple:
    """The combine forms of the op: zero-copy and push (intra-node types), AsyncLL's own (None)."""
    return (None,) if op.is_async else (True, False)


# ---- the tests --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,op_case", [(k, c) for k, c in OP_CASES if c != "ep8_beyond"], ids=lambda v: str(v))
def test_auto_geometry_and_oracle(auto_op, kind, op_case):
    """Token counts on and between the table rows, both dispatch dtypes, each combine form: every launch has
    the tables' geometry (EP 4: the fallback's) and the results are the oracle's."""
    op, record = auto_op(kind, op_case)
    forms = _forms(op)
    seed = 1
    for tokens in COUNTS[op_case]:
        for i, dtype in enumerate(("bf16", "fp8_e4m3fn")):
            run_round(op, record, tokens=tokens, dtype=dtype, zero_copy=forms[i % len(forms)], seed=seed)
            seed += 1
    # No rule of the dtype (fp8 FNUZ): the fallback; block_num / warp_per_block of the call do not win (MORI's).
    run_round(op, record, tokens=77, dtype="fp8_e4m3fnuz", zero_copy=forms[-1], seed=seed, block_num=3,
              warp_per_block=4)  # fmt: skip
    # A hidden the tables do not hold (2048, the any-hidden kernels): the rule of the call's token bucket.
    run_round(op, record, tokens=300, dtype="bf16", zero_copy=forms[0], seed=seed + 1, hidden=2048)


def test_tokens_beyond_the_largest_bucket(auto_op):
    """Calls of more tokens than the tables' largest row (4096) take that row's geometry, and are correct."""
    op, record = auto_op("IntraNode", "ep8_beyond")
    run_round(op, record, tokens=5000, dtype="bf16", zero_copy=True, seed=41)
    run_round(op, record, tokens=4097, dtype="fp8_e4m3fn", zero_copy=False, seed=42)


@pytest.mark.parametrize("kind,op_case", [(k, c) for k, c in OP_CASES if c != "ep8_beyond"], ids=lambda v: str(v))
def test_auto_graph_capture_and_replay(auto_op, kind, op_case):
    """A dispatch + identity-expert combine captured in a CUDA graph in AUTO mode (the capture launches with
    the tables' geometry) and replayed on new tokens and weights: the oracle's combine each time."""
    import torch

    from mori_compiler.ops import reference as ref

    op, record = auto_op(kind, op_case)
    c = op.config
    W, K, H, shape = c.world_size, c.num_experts_per_token, c.hidden_dim, _shape(c)
    tokens, zero_copy = 300, _forms(op)[0]
    ns = _token_counts(tokens, W, 51)
    idx_np = ref.make_routing("random", ns, shape, 51)
    idxs = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)).cuda() for v in idx_np]
    xs = [torch.zeros((n, H), dtype=torch.bfloat16, device="cuda") for n in ns]
    ws = [torch.zeros((n, K), dtype=torch.float32, device="cuda") for n in ns]
    regs = op.get_registered_combine_input_buffer(torch.bfloat16) if zero_copy else None

    def step():
        outs = op.dispatch(xs, ws, None, idxs)
        if regs is None:  # AsyncLL: the combine reads the dispatch output rows in place (the identity expert)
            return op.combine([o[0] for o in outs], [o[1] for o in outs], idxs)
        for p in range(W):  # the identity expert, written into the registered buffer
            regs[p].copy_(outs[p][0])
        return op.combine(regs, [o[1] for o in outs], idxs, use_external_inp_buf=0)

    def fill(rnd: int):
        vals = [ref.make_tokens(n, H, "bf16", 600 + 10 * rnd + p) for p, n in enumerate(ns)]
        w_np = [np.random.default_rng(700 + 10 * rnd + p).random((n, K), dtype=np.float32) for p, n in enumerate(ns)]
        for p in range(W):
            xs[p].copy_(_to_torch(vals[p], "bf16"))
            ws[p].copy_(torch.from_numpy(w_np[p]))
        return vals, w_np

    def check(results, vals, w_np):
        for p in range(W):
            out, out_w = results[p]
            ref.check_combine(out[: ns[p]].float().cpu().numpy(), vals[p], idx_np[p], shape, "bf16", rank=p)
            ref.check_combine_weights(out_w[: ns[p]].cpu().numpy(), w_np[p], idx_np[p], shape, rank=p)

    (dispatch, origin_d), (combine, origin_c) = (expected_launches(op, "dispatch", "bf16", tokens, H, None),
                                                 expected_launches(op, "combine", "bf16", tokens, H, zero_copy))
    want = dispatch + combine  # the dispatch's launches, then the combine's

    vals, w_np = fill(0)  # one eager round: the argument tables are uploaded before the capture
    _poison(op)
    record.take()
    results = step()
    _synchronize(op)
    got = record.take()
    assert got == want, f"eager step launched {got}; the tables give {want} ({origin_d}; {origin_c})"
    check(results, vals, w_np)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = step()
    got = record.take()
    assert got == want, f"the capture launched {got}; the tables give {want} ({origin_d}; {origin_c})"
    for rnd in range(1, 4):
        vals, w_np = fill(rnd)
        _poison(op)
        graph.replay()
        _synchronize(op)
        check(results, vals, w_np)
