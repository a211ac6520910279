"""The torch.library ops of mori_compiler/ops/torch_ops.py on the CPU: registration, schemas, fake
implementations (FakeTensorMode and torch.library.opcheck), and torch.compile(fullgraph=True) of MoE steps
(router -> dispatch -> expert -> combine, and AsyncLL's halves) with no graph break, the graph holding the
ops, and the compiled results bit-identical to eager and to the expected sums.

No GPU here: the ops run over ``EmulatedEpOp``, a CPU model of EpDispatchCombineOp's host API (virtual PEs,
outputs that are views of persistent buffers the next call overwrites, state kept from dispatch to combine,
AsyncLL's send/receive order), which is what torch_ops relies on. The real op on the H200:
test/python/gpu/test_torch_compile_gpu.py.
"""

from __future__ import annotations

import pytest

from mori_compiler.runtime.extras import is_installed, missing_text

if not is_installed("torch"):
    pytest.skip(f"torch ops need torch: {missing_text(['torch'])}", allow_module_level=True)

import torch  # noqa: E402

from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType  # noqa: E402
from mori_compiler.ops import torch_ops  # noqa: E402

H, M, ER, K = 32, 6, 2, 2  # hidden, tokens per PE (max), experts per PE, experts per token


def _config(world: int, kind: str = "IntraNode", *, scale_dim: int = 0) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=world, hidden_dim=H, scale_dim=scale_dim,
                                   scale_type_size=4, max_token_type_size=4, max_num_inp_token_per_rank=M,
                                   num_experts_per_rank=ER, num_experts_per_token=K,
                                   kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip


class EmulatedEpOp:
    """EpDispatchCombineOp's host API on the CPU, for ``n`` local PEs (virtual, or one process's PE when
    ``virtual=False``, world_size 1): a token goes once to each PE among its experts', in (source PE, token)
    order; combine sums in fp32 the rows its destinations return. Outputs are views of buffers kept here.
    ``seen`` records the addresses of the tensors each call received."""

    def __init__(self, config, *, virtual: bool = True):
        self.config = config
        self.sizes = config.sizes
        self.virtual = virtual
        self.n_local = config.world_size if virtual else 1
        self.kernel_type = EpDispatchCombineKernelType(config.kernel_type)
        self.is_async = self.kernel_type == EpDispatchCombineKernelType.AsyncLL
        c, R = config, self.sizes.recv_capacity
        n = self.n_local
        H, M, K, self.experts_per_pe = c.hidden_dim, c.max_num_inp_token_per_rank, c.num_experts_per_token, \
            c.num_experts_per_rank  # fmt: skip
        self.out_x = [torch.full((R * H * 4,), 0xA5, dtype=torch.uint8) for _ in range(n)]
        self.out_w = [torch.full((R, K), -7.0) for _ in range(n)]
        self.out_s = [torch.full((R, max(c.scale_dim, 1)), -7.0) for _ in range(n)]
        self.out_idx = [torch.full((R, K), -7, dtype=torch.int32) for _ in range(n)]
        self.total = [torch.full((1,), -1, dtype=torch.int32) for _ in range(n)]
        self.reg_x = [torch.zeros(R * H * 4, dtype=torch.uint8) for _ in range(n)]
        self.out_c = [torch.full((M * H * 4,), 0xA5, dtype=torch.uint8) for _ in range(n)]
        self.out_cw = [torch.full((M, K), -7.0) for _ in range(n)]
        self.counts = [torch.zeros(self.experts_per_pe, dtype=torch.int32) for _ in range(n)]
        self.routes = None  # per destination PE: [(source PE, token)] of its rows
        self.phase = None  # AsyncLL: the pending send
        self.seen = []
        self.calls = []

    def _l(self, v):
        return [None] * self.n_local if v is None else (list(v) if self.virtual else [v])

    def _out(self, items):
        return items if self.virtual else items[0]

    @property
    def local_expert_count(self):
        return self._out(self.counts)

    def get_registered_combine_input_buffer(self, dtype, hidden_dim=-1, *, pe=None):
        rows = self.sizes.recv_capacity
        size = torch.empty((), dtype=dtype).element_size()
        return self.reg_x[pe or 0][: rows * hidden_dim * size].view(dtype).view(rows, hidden_dim)

    def _views(self, p, dtype, hidden, has_s):
        R = self.sizes.recv_capacity
        x = self.out_x[p][: R * hidden * torch.empty((), dtype=dtype).element_size()].view(dtype).view(R, hidden)
        return (x, self.out_w[p], self.out_s[p][:, : self.config.scale_dim] if has_s else None, self.out_idx[p],
                self.total[p])  # fmt: skip

    def dispatch(self, input, weights, scales, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                 call_local_expert_count=False):  # fmt: skip
        self.calls.append("dispatch")
        ER = self.experts_per_pe
        xs, ws, ss, ids = self._l(input), self._l(weights), self._l(scales), self._l(indices)
        self.seen.append(tuple(t.data_ptr() for t in (*xs, *ids) if t is not None))
        pes = range(self.config.world_size)
        self.routes = [[(s, t) for s in range(self.n_local) for t in range(xs[s].shape[0])
                        if any(int(e) >= 0 and int(e) // ER == p for e in ids[s][t])] for p in pes]  # fmt: skip
        results = []
        for p in range(self.n_local):
            x, w, s, idx, total = self._views(p, xs[0].dtype, xs[0].shape[1], ss[0] is not None)
            for row, (src, t) in enumerate(self.routes[p]):
                x[row] = xs[src][t]
                idx[row] = ids[src][t]
                if ws[src] is not None:
                    w[row] = ws[src][t]
                if s is not None:
                    s[row] = ss[src][t]
            total[0] = len(self.routes[p])
            if call_local_expert_count:
                got = idx[: len(self.routes[p])]
                local = (got >= p * ER) & (got < (p + 1) * ER)
                self.counts[p].copy_(torch.bincount((got - p * ER)[local].long(), minlength=ER).int())
            results.append((x, w, s, idx, total))
        return self._out(results)

    def combine(self, input, weights, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                use_external_inp_buf=-1):  # fmt: skip
        self.calls.append("combine")
        M, K = self.config.max_num_inp_token_per_rank, self.config.num_experts_per_token
        ys, ws = self._l(input), self._l(weights)
        self.seen.append(tuple(t.data_ptr() for t in ys))
        results = []
        for s in range(self.n_local):
            dtype, hidden = ys[0].dtype, ys[0].shape[1]
            out = self.out_c[s][: M * hidden * torch.empty((), dtype=dtype).element_size()].view(dtype).view(M, hidden)
            acc = torch.zeros((M, hidden))
            wacc = torch.zeros((M, K))
            for p in range(self.n_local):
                for row, (src, t) in enumerate(self.routes[p]):
                    if src == s:
                        acc[t] += ys[p][row].float()
                        if ws[p] is not None:
                            wacc[t] += ws[p][row]
            out.copy_(acc.to(dtype))
            self.out_cw[s].copy_(wacc)
            results.append((out, self.out_cw[s] if ws[s] is not None else None))
        return self._out(results)

    def dispatch_send(self, input, weights, scales, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1):
        assert self.phase is None, "a send while another is pending"
        self.phase = "dispatch"
        return self.dispatch(input, weights, scales, indices)

    def dispatch_recv(self, block_num=-1, warp_per_block=-1, call_local_expert_count=False):
        assert self.phase == "dispatch", "dispatch_recv without its send"
        self.phase = None
        self.calls.append("dispatch_recv")

    def combine_send(self, input, weights, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                     use_external_inp_buf=-1):  # fmt: skip
        assert self.phase is None, "a send while another is pending"
        self.phase = "combine"
        return self.combine(input, weights, indices)

    def combine_recv(self, block_num=-1, warp_per_block=-1):
        assert self.phase == "combine", "combine_recv without its send"
        self.phase = None
        self.calls.append("combine_recv")


@pytest.fixture
def tops():
    made = []

    def make(world=3, kind="IntraNode", *, virtual=True, scale_dim=0):
        op = EmulatedEpOp(_config(world, kind, scale_dim=scale_dim), virtual=virtual)
        t = torch_ops.EpTorchOps(op, device="cpu")
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def _inputs(world, counts, seed, *, n_experts=None):
    g = torch.Generator().manual_seed(seed)
    n_experts = n_experts or world * ER
    xs = [torch.randn((n, H), generator=g).to(torch.bfloat16) for n in counts]
    router = torch.randn((H, n_experts), generator=g)
    experts = [torch.randn((H, H), generator=g) / H for _ in range(world)]
    return xs, router, experts


def moe_step(tops, xs, router, experts):
    """router -> dispatch -> expert matmul (each PE's own weights) -> combine, on every PE."""
    idxs, ws = [], []
    for x in xs:
        vals, idx = torch.topk(x.float() @ router, K, dim=1)
        idxs.append(idx.to(torch.int32))
        ws.append(vals)
    outs = tops.dispatch(xs, ws, None, idxs)
    ys = [(o[0].float() @ w).to(torch.bfloat16) for o, w in zip(outs, experts)]
    res = tops.combine(ys, [o[1] for o in outs], idxs)
    return [r[0][: x.shape[0]] for r, x in zip(res, xs)], [r[1] for r in res], [o[4] for o in outs]


def asyncll_step(tops, xs, router, experts):
    """moe_step through AsyncLL's halves, with independent work between each send and its receive."""
    idxs, ws = [], []
    for x in xs:
        vals, idx = torch.topk(x.float() @ router, K, dim=1)
        idxs.append(idx.to(torch.int32))
        ws.append(vals)
    pending = tops.dispatch_send(xs, ws, None, idxs)
    side = [x.float().sum() for x in xs]  # independent work while the tokens are in flight
    outs = tops.dispatch_recv(pending, call_local_expert_count=True)
    ys = [(o[0].float() @ w).to(torch.bfloat16) for o, w in zip(outs, experts)]
    pending_c = tops.combine_send(ys, None, idxs)
    side2 = [y.float().mean() for y in ys]
    res = tops.combine_recv(pending_c)
    return [r[0][: x.shape[0]] for r, x in zip(res, xs)], [o[5] for o in outs], side, side2


def _expected_combine(xs, router, experts, world):
    """Each token's rows summed over its distinct destination PEs, in fp32 (the emulated combine's order)."""
    out = []
    for x in xs:
        _, idx = torch.topk(x.float() @ router, K, dim=1)
        acc = torch.zeros((x.shape[0], H))
        for p in range(world):
            goes = ((idx // ER) == p).any(dim=1)
            acc[goes] += (x[goes].float() @ experts[p]).to(torch.bfloat16).float()
        out.append(acc.to(torch.bfloat16))
    return out


class Recorder:
    """A torch.compile backend (AOTAutograd, no codegen) that records the mori_compiler calls of each forward
    graph after functionalization (what inductor would receive), then runs that graph."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        def forward(graph, inputs):
            self.graphs.append([str(n.target) for n in graph.graph.nodes if "mori_compiler" in str(n.target)])
            return make_boxed_func(graph.forward)

        return aot_autograd(fw_compiler=forward)(gm, example_inputs)


def _compile(fn, backend):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return torch.compile(fn, fullgraph=True, backend=backend)


def _graph_breaks() -> dict:
    return dict(torch._dynamo.utils.counters["graph_break"])


def test_every_op_is_registered_with_its_schema():
    schemas = {name: str(getattr(torch.ops.mori_compiler, name).default._schema) for name in torch_ops.OPS}
    assert schemas["dispatch"] == (
        "mori_compiler::dispatch(SymInt handle, Tensor[] x, Tensor?[] weights, Tensor?[] scales, Tensor[] indices, "
        "SymInt block_num, SymInt rdma_block_num, SymInt warp_per_block, bool call_local_expert_count) -> Tensor[]")
    assert schemas["dispatch_recv"].startswith("mori_compiler::dispatch_recv(SymInt handle, Tensor token, SymInt hidden, "
                                               "ScalarType dtype, bool[] weights_given")
    for name, schema in schemas.items():  # functional: no argument is mutated or aliased
        assert "!" not in schema and "(a" not in schema, schema
        assert torch.fx.node.has_side_effect is None or getattr(torch.ops.mori_compiler, name).default in \
            torch.fx.node._side_effectful_functions, f"{name} may be removed as dead code"  # fmt: skip


def test_fake_outputs_match_the_real_ones(tops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = tops(3, scale_dim=4)
    xs, router, _ = _inputs(3, [5, 0, 6], 1)
    ids = [torch.topk(x.float() @ router, K, dim=1)[1].int() for x in xs]
    ws = [torch.rand((x.shape[0], K)) for x in xs]
    ss = [torch.rand((x.shape[0], 4)) for x in xs]
    args = (t.handle, xs, ws, ss, ids, -1, -1, -1, True)
    real = torch.ops.mori_compiler.dispatch(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.mori_compiler.dispatch(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else
                                                  [mode.from_tensor(x) for x in a] if isinstance(a, list) else a
                                                  for a in args])  # fmt: skip
    assert len(real) == len(fake) == 3 * 6
    for r, f in zip(real, fake):
        assert (r.shape, r.dtype, r.stride(), r.device) == (f.shape, f.dtype, f.stride(), f.device)
    R = t.recv_capacity
    assert [tuple(r.shape) for r in real[:6]] == [(R, H), (R, K), (R, 4), (R, K), (1,), (ER,)]


def test_opcheck_dispatch_and_combine(tops):
    t = tops(3)
    xs, router, experts = _inputs(3, [4, 2, 5], 2)
    ids = [torch.topk(x.float() @ router, K, dim=1)[1].int() for x in xs]
    ws = [torch.rand((x.shape[0], K)) for x in xs]
    torch.library.opcheck(torch.ops.mori_compiler.dispatch.default, (t.handle, xs, ws, [None] * 3, ids, -1, -1, -1,
                                                                    False))  # fmt: skip
    ys = [torch.randn((t.recv_capacity, H)).to(torch.bfloat16) for _ in range(3)]
    torch.library.opcheck(torch.ops.mori_compiler.combine.default, (t.handle, ys, [None] * 3, ids, -1, -1, -1, -1))


@pytest.mark.parametrize("virtual", [True, False], ids=["3vpes", "1pe"])
def test_compiled_moe_step_has_no_graph_break_and_matches_eager(tops, virtual):
    world = 3 if virtual else 1
    t = tops(world, virtual=virtual)
    recorder = Recorder()
    counts = [5, 0, 6] if virtual else [5]
    step = (lambda xs, r, e: moe_step(t, xs, r, e)) if virtual else \
        (lambda x, r, e: moe_step(_Single(t), [x], r, e))  # fmt: skip
    compiled = _compile(step, recorder)
    for seed in (3, 4):
        xs, router, experts = _inputs(world, counts, seed)
        args = (xs, router, experts) if virtual else (xs[0], router, experts)
        eager = step(*args)
        got = compiled(*args)
        for a, b in zip(eager[0] + eager[2], got[0] + got[2]):
            assert torch.equal(a, b)
        for a, want in zip(got[0], _expected_combine(xs, router, experts, world)):
            assert torch.equal(a, want)
    assert _graph_breaks() == {}
    assert recorder.graphs == [["mori_compiler.dispatch.default", "mori_compiler.combine.default"]]
    assert t.calls == 8  # 2 inputs x (eager, compiled) x (dispatch, combine): the compiled graph ran the ops


class _Single:
    """moe_step's list interface over a process-per-PE EpTorchOps (single tensors in and out)."""

    def __init__(self, tops):
        self.tops = tops

    def dispatch(self, xs, ws, ss, ids):
        return [self.tops.dispatch(xs[0], ws[0], None, ids[0])]

    def combine(self, ys, ws, ids):
        return [self.tops.combine(ys[0], ws[0], ids[0])]


def test_compiled_asyncll_halves(tops):
    t = tops(3, "AsyncLL")
    recorder = Recorder()
    compiled = _compile(lambda xs, r, e: asyncll_step(t, xs, r, e), recorder)
    xs, router, experts = _inputs(3, [6, 1, 3], 5)
    eager = asyncll_step(t, xs, router, experts)
    got = compiled(xs, router, experts)
    for a, b in zip(eager[0] + eager[1], got[0] + got[1]):
        assert torch.equal(a, b)
    for a, want in zip(got[0], _expected_combine(xs, router, experts, 3)):
        assert torch.equal(a, want)
    assert _graph_breaks() == {}
    assert recorder.graphs == [[f"mori_compiler.{n}.default" for n in
                                ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")]]  # fmt: skip
    assert t.op.calls[-4:] == ["dispatch", "dispatch_recv", "combine", "combine_recv"]


def test_outputs_are_fresh_and_inputs_staged_at_fixed_addresses(tops):
    t = tops(3)
    a = _inputs(3, [4, 4, 4], 6)
    b = _inputs(3, [4, 4, 4], 7)
    first = moe_step(t, *a)
    kept = [o.clone() for o in first[0]]
    moe_step(t, *b)  # overwrites the op's buffers
    assert all(torch.equal(x, y) for x, y in zip(first[0], kept)), "an output aliases the op's buffers"
    assert t.op.seen[0] == t.op.seen[2] and t.op.seen[1] == t.op.seen[3], "the op saw moving input addresses"
    assert not set(t.op.seen[0]) & {x.data_ptr() for x in a[0]}, "the op was handed the caller's tensors"


def test_refusals(tops):
    t = tops(3)
    xs, router, _ = _inputs(3, [2, 2, 2], 8)
    ids = [torch.zeros((2, K), dtype=torch.int32)] * 3
    with pytest.raises(ValueError, match="routing handle"):
        t.dispatch(xs, None, None, ids, return_routing=True)
    with pytest.raises(ValueError, match="AsyncLL"):
        t.dispatch_send(xs, None, None, ids)
    with pytest.raises(ValueError, match="list of 3 tensors"):
        t.dispatch(xs[:2], None, None, ids)
    with pytest.raises(ValueError, match="no backward"):
        t.dispatch([x.float().requires_grad_() for x in xs], None, None, ids)
    with pytest.raises(ValueError, match="more than the op's limit"):
        t.dispatch([torch.zeros((M + 1, H), dtype=torch.bfloat16)] * 3, None, None, [torch.zeros((M + 1, K), dtype=torch.int32)] * 3)
    a = tops(3, "AsyncLL")
    with pytest.raises(RuntimeError, match="without a pending dispatch_send"):
        torch.ops.mori_compiler.dispatch_recv(a.handle, torch.empty(0, dtype=torch.uint8), H, torch.bfloat16,
                                              [False] * 3, [False] * 3, None, -1, -1, False)  # fmt: skip
    t.close()
    with pytest.raises(RuntimeError, match=f"no op is registered under handle {t.handle}"):
        t.dispatch(xs, None, None, ids)


@pytest.mark.slow
def test_inductor_compiles_the_step(tops):
    """The default backend (inductor, CPU code generated and built here: ~30 s) runs the ops as fallback
    kernels; bit-identical to eager on two inputs."""
    t = tops(3)
    compiled = _compile(lambda xs, r, e: moe_step(t, xs, r, e), "inductor")
    for seed in (9, 10):
        xs, router, experts = _inputs(3, [5, 0, 6], seed)
        eager = moe_step(t, xs, router, experts)
        got = compiled(xs, router, experts)
        for a, b in zip(eager[0] + eager[1] + eager[2], got[0] + got[1] + got[2]):
            assert torch.equal(a, b)
    assert _graph_breaks() == {}


def test_first_calls_run_in_a_thread_of_their_own():
    """(What keeps a first call's allocations out of a CUDA-graph warm-up's pool, which is per thread.)"""
    import threading

    caller = threading.get_ident()
    assert torch_ops.run_in_own_thread(lambda: threading.get_ident()) != caller

    def fails():
        raise KeyError("from the worker")

    with pytest.raises(KeyError, match="from the worker"):
        torch_ops.run_in_own_thread(fails)
