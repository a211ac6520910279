"""The typed compile path of an EP config: EpSizes -> EpModulePlan -> built ir.Module -> bundle.

``ep_bundle`` keys a bundle by the plan's text (kernel_module_source: unchanged keys, precompiled bundles
still found) and compiles the module built from the plan with mori_ep's op builder; the two must be the
same IR, and no compile may parse the text.
"""

from __future__ import annotations

import re

import pytest

from mori_compiler import cache
from mori_compiler._mlir import ir, new_context
from mori_compiler.dialects import mori_ep, registry
from mori_compiler.errors import MoriCompilerError
from mori_compiler.options import CompileOptions, device_bitcode
from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType, ep_bundle
from mori_compiler.ops.asyncll import AsyncLLOptions
from mori_compiler.ops.bundle import build_kernel_module, kernel_module_source, kernel_plan, module_plan
from mori_compiler.ops.config import ConfigError

ASYNCLL_MODES = (AsyncLLOptions(), AsyncLLOptions(early_notify=True),
                 AsyncLLOptions(early_notify=True, fused_recv=True))  # fmt: skip


def _config(kind="IntraNode", **fields) -> EpDispatchCombineConfig:
    base = dict(data_type="bf16", rank=0, world_size=4, hidden_dim=1024, scale_dim=0, scale_type_size=0,
                max_token_type_size=4, max_num_inp_token_per_rank=16, num_experts_per_rank=4,
                num_experts_per_token=2, kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip
    return EpDispatchCombineConfig(**(base | fields))


INTERNODE_KINDS = ("InterNode", "InterNodeV1", "InterNodeV1LL")


def _matrix():
    """(config, wave, asyncll): every kernel type, every AsyncLL mode, each token size, two shapes; the
    inter-node types in 2 nodes of 2 PEs (the odd shape with 4 PEs, not 3)."""
    shapes = (dict(), dict(world_size=3, hidden_dim=2064, num_experts_per_token=5, num_experts_per_rank=3,
                           max_num_inp_token_per_rank=37, scale_dim=7, scale_type_size=4, max_total_recv_tokens=50))
    for kind in ("IntraNode", "IntraNodeLL", "AsyncLL") + INTERNODE_KINDS:
        for tok in (1, 2, 4):
            for shape in shapes:
                if kind in INTERNODE_KINDS:
                    shape = shape | dict(world_size=4, gpu_per_node=2)
                for wave in (32, 64):
                    for mode in ASYNCLL_MODES if kind == "AsyncLL" else (None,):
                        yield _config(kind, max_token_type_size=tok, **shape), wave, mode


def test_built_module_prints_as_the_parsed_source():
    cases = list(_matrix())
    assert len(cases) == 60 + 36
    assert sum(cfg.kernel_type.name in INTERNODE_KINDS for cfg, _, _ in cases) == 36
    for cfg, wave, mode in cases:
        plan = module_plan(cfg, wave, mode)
        assert kernel_module_source(cfg, wave, mode) == plan.source()
        assert plan.kernel_names() == [k.name for k in kernel_plan(cfg)]
        built = build_kernel_module(plan)
        parsed = registry.parse_source(plan.source(), new_context())
        assert str(built) == str(parsed), (cfg, wave, mode)
        ops = list(built.body.operations[0].regions[0].blocks[0].operations)
        assert [op.operation.name for op in ops] == [f"mori_ep.{op.op}" for op in plan.ops]
        assert all(mori_ep.int_attributes(op.operation)["hidden"] == cfg.hidden_dim for op in ops)
        if cfg.kernel_type.name in INTERNODE_KINDS:
            assert all(mori_ep.int_attributes(op.operation)["gpu_per_node"] == 2 for op in ops)
            # (1-byte token buffers hold no combine dtype: the dispatch kernels only)
            assert {"internode_stage", "internode_dispatch"} <= {op.op for op in plan.ops} <= set(mori_ep.INTERNODE_OPS)


def test_plan_values_are_python_ints_and_strs():
    plan = module_plan(_config("AsyncLL", max_token_type_size=2), 64, ASYNCLL_MODES[2])
    assert plan.gpu_module == "mori_ep_asyncll"
    for op in plan.ops:
        attrs = dict(op.attributes)
        assert type(attrs.pop("dtype")) is str and attrs["early_notify"] == attrs["fused_recv"] == 1
        assert all(type(v) is int for v in attrs.values())


# The text is the bundle key's input: a changed byte would change every bundle key (precompiled bundles
# no longer found). This is the text of a config before the plan existed.
_PINNED_COMMON = ("world_size = 4 : i64, hidden = 1024 : i64, top_k = 2 : i64, experts_per_rank = 4 : i64, "
                  "max_tokens_per_rank = 16 : i64, max_recv_per_rank = 16 : i64, warps_per_block = 8 : i64, "
                  "wave_size = 64 : i64")  # fmt: skip
_PINNED_OPS = (("dispatch", 'dtype = "bf16", scale_bytes = 0 : i64'),
               ("dispatch", 'dtype = "fp8_e4m3fn", scale_bytes = 0 : i64'),
               ("dispatch", 'dtype = "fp8_e4m3fnuz", scale_bytes = 0 : i64'),
               ("combine", 'dtype = "bf16", zero_copy = 1 : i64, max_blocks = 1024 : i64'),
               ("combine", 'dtype = "bf16", zero_copy = 0 : i64, max_blocks = 1024 : i64'))  # fmt: skip


def _any_hidden(rest: str) -> str:
    """The attributes after the sizes of an op's any-hidden variant: ``any_hidden = 1`` right after its dtype."""
    dtype, _, more = rest.partition(", ")
    return f"{dtype}, any_hidden = 1 : i64, {more}"


def test_source_text_is_unchanged():
    # The kernels of the config's hidden as before, then their variants for any hidden.
    pinned = list(_PINNED_OPS) + [(op, _any_hidden(rest)) for op, rest in _PINNED_OPS]
    ops = "".join(f'    "mori_ep.{op}"() {{{_PINNED_COMMON}, {rest}}} : () -> ()\n' for op, rest in pinned)
    expected = f"module attributes {{gpu.container_module}} {{\n  gpu.module @mori_ep_intranode {{\n{ops}  }}\n}}\n"
    assert kernel_module_source(_config(max_token_type_size=2), 64) == expected


def test_asyncll_source_carries_the_mode_last():
    cfg = _config("AsyncLL")
    source = kernel_module_source(cfg, 32, ASYNCLL_MODES[1])
    assert source.count("early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()") == len(kernel_plan(cfg))


@pytest.fixture
def asked(monkeypatch):
    """ep_bundle's requests to get_bundle, answered with a placeholder."""
    calls = []
    monkeypatch.setattr(cache, "get_bundle", lambda source, options, **kw: calls.append((source, options, kw)) or "b")
    return calls


@pytest.mark.parametrize("kind,target", [("IntraNode", "gfx942"), ("IntraNodeLL", "sm_90"), ("AsyncLL", "gfx1250")])
def test_ep_bundle_keys_by_the_text_and_compiles_the_built_module(asked, kind, target):
    from mori_compiler.targets import get_target

    cfg = _config(kind, max_token_type_size=2)
    wave = get_target(target).wave_size
    mode = ASYNCLL_MODES[1] if kind == "AsyncLL" else None
    ep_bundle(cfg, target, virtual_pes=False, asyncll=mode)
    source, options, kw = asked[0]
    assert source == kernel_module_source(cfg, wave, mode)  # the key's input is the old text
    assert kw["kernels"] == [k.name for k in kernel_plan(cfg)]
    built = kw["module"]()
    assert isinstance(built, ir.Module) and str(built) == str(registry.parse_source(source, new_context()))


def test_ep_bundle_compiles_without_parsing_the_ep_text(tmp_path, monkeypatch):
    """A cold ep_bundle builds its module (no ir.Module.parse of mori_ep text) and lands under the key of
    the old text; a warm one finds it without building anything."""
    from mori_compiler import pipeline

    parsed = []
    real_parse = ir.Module.parse

    def spy_parse(text, *args, **kwargs):
        parsed.append(text)
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(ir.Module, "parse", staticmethod(spy_parse))
    cfg = _config(max_token_type_size=1)  # two fp8 dispatch kernels: a quick compile
    bundle = ep_bundle(cfg, "sm_90", virtual_pes=True, cache_root=tmp_path)
    assert parsed and not any("gpu.module @mori_ep" in text for text in parsed)  # (IRDL definitions are)
    options = CompileOptions(target="sm_90", virtual_pes=True)
    assert bundle.key == cache.bundle_key(kernel_module_source(cfg, 32), options, device_bitcode(options))
    assert sorted(bundle.kernels) == sorted(k.name for k in kernel_plan(cfg))

    def no_compile(*args, **kwargs):
        raise AssertionError("a warm ep_bundle compiled")

    monkeypatch.setattr(pipeline, "compile_source", no_compile)
    monkeypatch.setattr("mori_compiler.ops.bundle.build_kernel_module", no_compile)
    assert ep_bundle(cfg, "sm_90", virtual_pes=True, cache_root=tmp_path).key == bundle.key


@pytest.mark.parametrize("bad", [dict(hidden_dim=1001), dict(num_experts_per_token=64), dict(world_size=0),
                                 dict(kernel_type=EpDispatchCombineKernelType.InterNodeV1, gpu_per_node=3),
                                 dict(kernel_type=EpDispatchCombineKernelType.InterNode, gpu_per_node=2, block_num=6)])  # fmt: skip
def test_invalid_configs_are_refused_before_any_mlir(monkeypatch, bad):
    def no_mlir(*args, **kwargs):
        raise AssertionError("MLIR was reached for an invalid config")

    monkeypatch.setattr("mori_compiler.ops.bundle.build_kernel_module", no_mlir)
    monkeypatch.setattr(cache, "get_bundle", no_mlir)
    with pytest.raises(ConfigError):
        ep_bundle(_config(**bad), "gfx942", virtual_pes=False)


# ---- the inter-node kernel types: module text (the dialect's ops are the kernel generators' part) --------

INTERNODE_CASES = [("InterNode", 1, 0), ("InterNodeV1", 2, 0), ("InterNodeV1LL", 2, 1)]  # kind, hop_size, send_all


def _internode_config(kind: str, **fields) -> EpDispatchCombineConfig:
    return _config(kind, **({"max_token_type_size": 2, "gpu_per_node": 2, "num_qp_per_pe": 3, "block_num": 8,
                             "scale_dim": 4, "scale_type_size": 4} | fields))  # fmt: skip


@pytest.mark.parametrize("kind,hop,send_all", INTERNODE_CASES)
def test_internode_module_plan(kind, hop, send_all):
    """Each leg's two kernels per dtype, in launch order; every op carries the sizes, its dtype (and on
    the dispatch leg the scale bytes), the topology (G, the PEs one send target stands for, whether every
    token goes to every target, queue pairs) and, for the combine kernels (device barriers), max_blocks."""
    from mori_compiler.ep_schema import SIZE_ATTRIBUTES

    cfg = _internode_config(kind)
    plan = module_plan(cfg, 64)
    assert plan.gpu_module == "mori_ep_internode"
    dispatch = [(op, dt) for dt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz")
                for op in ("internode_stage", "internode_dispatch")]  # fmt: skip
    one_variant = dispatch + [("internode_combine", "bf16"), ("internode_combine_all", "bf16")]
    assert [(op.op, dict(op.attributes)["dtype"]) for op in plan.ops] == one_variant * 2  # config's hidden, any
    topology = [("gpu_per_node", 2), ("hop_size", hop), ("send_all", send_all), ("num_qp", 3)]
    sizes = [("world_size", 4), ("hidden", 1024), ("top_k", 2), ("experts_per_rank", 4), ("max_tokens_per_rank", 16),
             ("max_recv_per_rank", 16), ("warps_per_block", 8), ("wave_size", 64)]  # fmt: skip
    assert [n for n, _ in sizes[:6]] == list(SIZE_ATTRIBUTES)
    for i, op in enumerate(plan.ops):
        dtype = [("dtype", dict(op.attributes)["dtype"])] + ([("any_hidden", 1)] if i >= len(one_variant) else [])
        tail = {"internode_stage": [("scale_bytes", 16)] + topology, "internode_dispatch": [("scale_bytes", 16)] + topology,
                "internode_combine": topology + [("max_blocks", 1024)],
                "internode_combine_all": topology + [("max_blocks", 1024)]}[op.op]
        assert list(op.attributes) == sizes + dtype + tail, op.op


def test_internode_source_text():
    """The text of the inter-node ops (the bundle key's input) for one V1LL config, pinned."""
    common = _PINNED_COMMON  # the same sizes
    topology = "gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 1 : i64, num_qp = 3 : i64"
    lines = [f'    "mori_ep.internode_stage"() {{{common}, dtype = "bf16", scale_bytes = 16 : i64, {topology}}} : () -> ()',
             f'    "mori_ep.internode_dispatch"() {{{common}, dtype = "bf16", scale_bytes = 16 : i64, {topology}}} : () -> ()',
             f'    "mori_ep.internode_combine"() {{{common}, dtype = "bf16", {topology}, max_blocks = 1024 : i64}} : () -> ()',
             f'    "mori_ep.internode_combine_all"() {{{common}, dtype = "bf16", {topology}, max_blocks = 1024 : i64}} : () -> ()']  # fmt: skip
    source = kernel_module_source(_internode_config("InterNodeV1LL", max_token_type_size=2), 64)
    assert source.startswith("module attributes {gpu.container_module} {\n  gpu.module @mori_ep_internode {\n")
    body = source.splitlines()[2:-2]
    assert [body[0], body[1], body[6], body[7]] == lines and len(body) == 16
    # The any-hidden variants: the same ops, ``any_hidden = 1`` right after the dtype.
    assert body[8:] == [re.sub(r'(dtype = "\w+", )', r"\1any_hidden = 1 : i64, ", line) for line in body[:8]]
    assert not any("any_hidden" in line for line in body[:8])


def test_internode_queue_pairs_and_topology_follow_the_config():
    one = module_plan(_internode_config("InterNodeV1", world_size=8, gpu_per_node=4, num_qp_per_pe=1), 32)
    attrs = dict(one.ops[0].attributes)
    assert (attrs["gpu_per_node"], attrs["hop_size"], attrs["num_qp"], attrs["wave_size"]) == (4, 4, 1, 32)
    flat = dict(module_plan(_internode_config("InterNode", world_size=8, gpu_per_node=8), 64).ops[-1].attributes)
    assert (flat["gpu_per_node"], flat["hop_size"], flat["send_all"]) == (8, 1, 0)


@pytest.mark.parametrize("kind", [k for k, _, _ in INTERNODE_CASES])
def test_ep_bundle_keys_an_internode_config_by_its_text(asked, kind):
    cfg = _internode_config(kind)
    ep_bundle(cfg, "gfx942", virtual_pes=True)
    ((source, options, kw),) = asked
    assert source == kernel_module_source(cfg, 64) and options.virtual_pes
    names = [f"ep_inter_{f}_{dt}" for dt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz")
             for f in ("stage", "dispatch")] + ["ep_inter_combine_bf16", "ep_inter_combine_all_bf16"]  # fmt: skip
    assert kw["kernels"] == names + [name + "_anyhidden" for name in names]


def test_a_built_module_is_checked_as_text_is():
    """Values the dialect refuses (here world_size 0) are refused in a built module too, at its op."""
    from mori_compiler.pipeline import compile_source

    plan = module_plan(_config(), 32)
    op = plan.ops[0]
    bad = plan._replace(ops=(op._replace(attributes=tuple((n, 0 if n == "world_size" else v)
                                                          for n, v in op.attributes)),))  # fmt: skip
    with pytest.raises(MoriCompilerError, match="'world_size' must be in"):
        compile_source(build_kernel_module(bad), CompileOptions(target="sm_90"), stop_after="mori")


@pytest.mark.parametrize("name,attributes,match", [
    ("gather", {}, "no EP op 'gather'"),
    ("dispatch", {"hidden": 1.5}, "'hidden' must be an i64 int or a str"),
    ("dispatch", {"zero_copy": True}, "'zero_copy' must be an i64 int"),
    ("dispatch", {"hidden": 2**64}, "'hidden' must be an i64 int"),
])  # fmt: skip
def test_ep_op_refuses_what_it_cannot_build(name, attributes, match):
    ctx = new_context()
    registry.load_all(ctx)
    with ctx, ir.Location.unknown(), pytest.raises(ValueError, match=match):
        mori_ep.ep_op(name, attributes)


def test_get_bundle_refuses_a_module_that_is_not_callable(example_source):
    with pytest.raises(MoriCompilerError, match="module must be None or a zero-argument callable"):
        cache.get_bundle(example_source, CompileOptions(), module="module {}")
