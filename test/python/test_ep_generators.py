"""The EP kernel generators of mori-ep-to-kernels: headers from the EP schema, ops located by their
generator, and a generator bug reported as an internal error that names the generator (never a location
in the user's file)."""

from __future__ import annotations

import contextlib

import pytest

from mori_compiler import ep_schema
from mori_compiler._mlir import ir, new_context
from mori_compiler.dialects import builder as bld
from mori_compiler.dialects import registry
from mori_compiler.dialects.builder import PARAM_NAME_ATTR, GeneratorError
from mori_compiler.pass_pipeline import build_pass_manager
from mori_compiler.passes import ep_intranode_kernels, ep_kernel_parts
from mori_compiler.tools import compile as mori_compile
from mori_compiler.tools import opt as mori_opt

_CONFIG = ('world_size = 4 : i64, hidden = 1024 : i64, top_k = 4 : i64, experts_per_rank = 2 : i64, '
           'max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, '
           'wave_size = 64 : i64')  # fmt: skip
INTRANODE = f"""module attributes {{gpu.container_module}} {{
  gpu.module @ep {{
    "mori_ep.dispatch"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64}} : () -> ()
    "mori_ep.combine"() {{{_CONFIG}, dtype = "bf16", zero_copy = 1 : i64, max_blocks = 64 : i64}} : () -> ()
    "mori_ep.combine"() {{{_CONFIG}, dtype = "bf16", zero_copy = 0 : i64, max_blocks = 64 : i64}} : () -> ()
  }}
}}
"""
LOW_LATENCY = f"""module attributes {{gpu.container_module}} {{
  gpu.module @ep {{
    "mori_ep.dispatch_ll"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64}} : () -> ()
    "mori_ep.dispatch_send"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64, early_notify = 1 : i64, fused_recv = 1 : i64}} : () -> ()
    "mori_ep.dispatch_recv"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64, early_notify = 1 : i64, fused_recv = 1 : i64}} : () -> ()
    "mori_ep.combine_send"() {{{_CONFIG}, dtype = "bf16", early_notify = 0 : i64, fused_recv = 0 : i64}} : () -> ()
    "mori_ep.combine_recv"() {{{_CONFIG}, dtype = "bf16", early_notify = 0 : i64, fused_recv = 0 : i64}} : () -> ()
  }}
}}
"""
_TOPOLOGY = "gpu_per_node = 2 : i64, num_qp = 2 : i64"


def _internode(hop_send: str) -> str:
    """The four inter-node ops (2 nodes of 2 PEs) with the hop size and send_all of one kernel type."""
    topo = f"{_TOPOLOGY}, {hop_send}"
    return f"""module attributes {{gpu.container_module}} {{
  gpu.module @ep {{
    "mori_ep.internode_stage"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64, {topo}}} : () -> ()
    "mori_ep.internode_dispatch"() {{{_CONFIG}, dtype = "bf16", scale_bytes = 16 : i64, {topo}}} : () -> ()
    "mori_ep.internode_combine"() {{{_CONFIG}, dtype = "bf16", {topo}, max_blocks = 64 : i64}} : () -> ()
    "mori_ep.internode_combine_all"() {{{_CONFIG}, dtype = "bf16", {topo}, max_blocks = 64 : i64}} : () -> ()
  }}
}}
"""


INTERNODE = {"v1": _internode("hop_size = 2 : i64, send_all = 0 : i64"),
             "v1ll": _internode("hop_size = 2 : i64, send_all = 1 : i64"),
             "v0": _internode("hop_size = 1 : i64, send_all = 0 : i64")}  # fmt: skip
INTERNODE_FAMILIES = {"ep_inter_stage_bf16": "inter_stage", "ep_inter_dispatch_bf16": "inter_dispatch",
                      "ep_inter_combine_bf16": "inter_combine", "ep_inter_combine_all_bf16": "inter_combine_all"}
FAMILIES = {"ep_dispatch_bf16": "dispatch", "ep_combine_pull_bf16": "combine_pull",
            "ep_combine_push_bf16": "combine_push", "ep_dispatch_ll_bf16": "dispatch_ll",
            "ep_async_dispatch_send_bf16": "async_dispatch_send", "ep_async_dispatch_recv_bf16": "async_dispatch_recv",
            "ep_async_combine_send_bf16": "async_combine_send", "ep_async_combine_recv_bf16": "async_combine_recv"}  # fmt: skip
_TYPES = {"ptr": "!llvm.ptr", "i32": "i32"}


def _expand(source: str, options: str = "wave-size=64") -> ir.Module:
    ctx = new_context()
    module = registry.parse_source(source, ctx, "input.mlir")
    build_pass_manager(f"builtin.module(mori-ep-to-kernels{{{options}}})", ctx).run(module.operation)
    return module


def _kernels(module: ir.Module) -> dict[str, ir.Operation]:
    """The module's gpu.func ops by name (valid while ``module`` is alive)."""
    body = module.body.operations[0].regions[0].blocks[0]
    return {op.attributes["sym_name"].value: op.operation for op in body.operations if op.operation.name == "gpu.func"}


def _assert_headers_are_the_schema(kernels: dict, families: dict) -> None:
    """Each kernel's gpu.func parameters (names, types) and block size are its family's in the EP schema."""
    for name, fn in kernels.items():
        sig = ep_schema.KERNELS[families[name]]
        names = tuple(ir.DictAttr(a)[PARAM_NAME_ATTR].value for a in fn.attributes["arg_attrs"])
        types = tuple(str(t) for t in ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
        assert names == sig.names, name
        assert types == tuple(_TYPES[t] for t in sig.types), name
        assert list(fn.attributes["known_block_size"]) == [4 * 64, 1, 1]


@pytest.mark.parametrize("source", [INTRANODE, LOW_LATENCY], ids=["intranode", "low-latency"])
@pytest.mark.parametrize("uniform", [False, True], ids=["default", "uniform-addressing"])
def test_kernel_parameters_are_the_schema(uniform, source):
    flag = "true" if uniform else "false"
    module = _expand(source, f"wave-size=64 uniform-addressing={flag} global-address-space={flag}")
    kernels = _kernels(module)
    assert set(kernels) == {n for n, family in FAMILIES.items() if (source is LOW_LATENCY) == (
        family == "dispatch_ll" or family.startswith("async"))}  # fmt: skip
    _assert_headers_are_the_schema(kernels, FAMILIES)


@pytest.mark.parametrize("source", list(INTERNODE.values()), ids=list(INTERNODE))
@pytest.mark.parametrize("uniform", [False, True], ids=["default", "uniform-addressing"])
def test_internode_kernel_parameters_are_the_schema(uniform, source):
    flag = "true" if uniform else "false"
    module = _expand(source, f"wave-size=64 uniform-addressing={flag} global-address-space={flag}")
    kernels = _kernels(module)
    assert list(kernels) == list(INTERNODE_FAMILIES)  # one kernel per op, in the ops' (the launch) order
    _assert_headers_are_the_schema(kernels, INTERNODE_FAMILIES)


def _locations(op: ir.Operation) -> set[str]:
    """The locations of ``op`` and of every op nested in it."""
    seen = {op.location.name_str if op.location.is_a_name() else str(op.location)}
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                seen |= _locations(inner.operation)
    return seen


def test_internode_ops_name_their_generator():
    generators = {"inter_stage": "stage_kernel", "inter_dispatch": "dispatch_kernel",
                  "inter_combine": "combine_kernel", "inter_combine_all": "combine_all_kernel"}  # fmt: skip
    module = _expand(INTERNODE["v1"])  # kept alive: the kernels' ops are valid only while it is
    for name, fn in _kernels(module).items():
        want = f"generated by ep_internode_kernels.{generators[INTERNODE_FAMILIES[name]]}"
        assert _locations(fn) == {want}, name


def test_generated_ops_name_their_generator():
    module = _expand(INTRANODE)
    kernels = _kernels(module)
    expected = {"ep_dispatch_bf16": "dispatch_kernel", "ep_combine_pull_bf16": "combine_pull_kernel",
                "ep_combine_push_bf16": "combine_push_kernel"}  # fmt: skip
    for name, fn in kernels.items():
        want = f"generated by ep_intranode_kernels.{expected[name]}"
        seen = set()

        def walk(op):
            seen.add(op.location.name_str if op.location.is_a_name() else str(op.location))
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner.operation)

        walk(fn)
        assert seen == {want}, name


def _break_dispatch_completion(monkeypatch):
    """The dispatch generator with a bug: its completion adds an i32 to an i64 (IR that does not verify)."""

    def broken(f, rnd):
        f.b.op("arith.addi", (f.c0i, rnd.one64), (f.b.i32,))

    monkeypatch.setattr(ep_intranode_kernels, "dispatch_completion", broken)


def test_invalid_ir_from_a_generator_is_a_generator_error(monkeypatch):
    _break_dispatch_completion(monkeypatch)
    with pytest.raises(GeneratorError) as info:
        _expand(INTRANODE)
    assert info.value.generator == "ep_intranode_kernels.dispatch_kernel"
    assert "input.mlir" not in str(info.value)


def test_a_python_error_in_a_generator_is_a_generator_error(monkeypatch):
    def broken(f, route, source, inputs, dbase):
        raise TypeError("wrong builder call")

    monkeypatch.setattr(ep_intranode_kernels, "send_row_to_peers", broken)
    with pytest.raises(GeneratorError, match="generator 'ep_intranode_kernels.dispatch_kernel'.*wrong builder call"):
        _expand(INTRANODE)


@pytest.mark.parametrize("tool", ["mori-opt", "mori-compile"])
def test_generator_bug_is_an_internal_error_of_the_cli(tool, monkeypatch, tmp_path, capsys):
    _break_dispatch_completion(monkeypatch)
    monkeypatch.delenv("MORI_COMPILER_TRACEBACK", raising=False)
    src = tmp_path / "input.mlir"
    src.write_text(INTRANODE)
    if tool == "mori-opt":
        code = mori_opt.entry([str(src), "-p", "mori-ep-to-kernels{wave-size=64}"])
    else:
        code = mori_compile.entry([str(src), "--target", "gfx942", "--stop-after", "ep", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "internal compiler error" in err
    assert "generator 'ep_intranode_kernels.dispatch_kernel'" in err
    assert "input.mlir" not in err and "Traceback" not in err


def test_kernel_config_sizes_come_from_the_schema():
    cfg = ep_kernel_parts.EpKernelConfig(world_size=3, hidden=100, dtype="fp8_e4m3fn", top_k=2, experts_per_rank=2,
                                         max_tokens_per_rank=7, max_recv_per_rank=5, wave_size=32)  # fmt: skip
    sizes = ep_schema.EpSizes(world_size=3, hidden=100, top_k=2, experts_per_rank=2, max_tokens_per_rank=7,
                              max_recv_per_rank=5, token_bytes=1)  # fmt: skip
    assert (cfg.row_bytes, cfg.recv_capacity, cfg.send_stride, cfg.null_fwd) == (
        sizes.row_bytes, sizes.recv_capacity, sizes.send_stride, sizes.null_fwd) == (100, 15, 21, 45)
    assert cfg.block_size == (8 * 32, 1, 1)


# ---- the builder details the generators rely on -------------------------------------------------------


@contextlib.contextmanager
def _builder_before_return():
    """(module, entry block, a Builder inserting before the return) of an empty ``func.func``."""
    ctx = new_context()
    module = registry.parse_source("func.func @f() {\n  return\n}\n", ctx, "-")
    with ctx, ir.Location.unknown():
        entry = module.body.operations[0].regions[0].blocks[0]
        yield module, entry, bld.Builder(entry, before=entry.operations[0])


def test_builder_insertion_point_is_restored_after_a_region():
    with _builder_before_return() as (module, entry, b):
        cond = b.const_i1(True)
        with b.if_(cond):
            b.const_i32(1)
        b.const_i32(2)  # after the scf.if, still before the return
        names = [op.operation.name for op in entry.operations]
        assert names == ["arith.constant", "scf.if", "arith.constant", "func.return"]
        assert module.operation.verify()


def test_builder_refuses_constants_that_would_wrap():
    with _builder_before_return() as (_, _entry, b):
        assert b.const_i32(2**32 - 1) is not None and b.const_i32(-(2**31)) is not None  # both readings fit
        with pytest.raises(ValueError, match="constant 8589934592 does not fit i32"):
            b.const_i32(2**33)
        with pytest.raises(ValueError, match="does not fit i64"):
            b.const_i64(2**64)
        with pytest.raises(ValueError, match="constant GEP index -2147483648 is outside"):
            b.gep(b.null(), -(2**31), b.i32)


def test_new_global_is_the_parsed_form():
    ctx = new_context()
    text = "gpu.module @g {\n  llvm.mlir.global internal @route() {addr_space = 3 : i32} : !llvm.array<18 x i32>\n}"
    parsed = registry.parse_source(text, ctx, "-")
    built = registry.parse_source("gpu.module @g {\n}", ctx, "-")
    with ctx, ir.Location.unknown():
        body = built.body.operations[0].regions[0].blocks[0]
        bld.new_global(body, "route", ir.Type.parse("!llvm.array<18 x i32>"), addr_space=3)
        assert str(built) == str(parsed)
        assert built.operation.verify()


def test_every_kernel_family_has_a_generator():
    from mori_compiler.passes import ep_to_kernels

    assert set(ep_to_kernels.GENERATORS) == set(ep_schema.KERNELS)
    families = {ep_to_kernels.kernel_family(f"mori_ep.{op}", None) for op in ep_schema.OP_FAMILIES}
    assert families | {"combine_pull", "combine_push"} == set(ep_schema.KERNELS)
