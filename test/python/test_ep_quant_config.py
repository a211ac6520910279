"""The combine wire quantization's host rules (issue 15): config.quant_type per kernel type, zero-copy and
target, the scale-block variable, the module plan's op attributes and the mori_ep attribute checks.

Standard library and MLIR only (no torch, no GPU): every refusal names the field and what is allowed.
"""

from __future__ import annotations

import pytest

from mori_compiler import ep_schema, wire_quant
from mori_compiler.ops.bundle import module_plan
from mori_compiler.ops.config import (ConfigError, EpDispatchCombineConfig, EpDispatchCombineKernelType,
                                      combine_scale_blocks, quant_target_problems, validate_config)  # fmt: skip

K = EpDispatchCombineKernelType
BASE = dict(data_type="bf16", rank=0, world_size=4, hidden_dim=256, scale_dim=0, scale_type_size=0,
            max_token_type_size=2, max_num_inp_token_per_rank=8, num_experts_per_rank=4, num_experts_per_token=2)  # fmt: skip
QUANTS = ("fp8_direct_cast", "fp8_blockwise", "fp4_blockwise")


def config(**overrides) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(**(BASE | overrides))


def rejected(target=None, **overrides) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config(**overrides), 32, target)
    return str(info.value)


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("kind", [K.IntraNode, K.IntraNodeLL])
def test_the_push_combines_take_every_quant_type(kind, quant):
    validate_config(config(kernel_type=kind, quant_type=quant), 32, "sm_90")


@pytest.mark.parametrize("quant", ["fp8_direct_cast", "fp8_blockwise"])
def test_asyncll_takes_the_fp8_quant_types(quant):
    validate_config(config(kernel_type=K.AsyncLL, quant_type=quant), 32, "sm_90")


def test_an_unknown_quant_type_is_refused_naming_the_field():
    assert ("config.quant_type 'fp8' is not allowed (the combine's wire quantization); allowed: 'none', "
            "'fp8_direct_cast', 'fp8_blockwise', 'fp4_blockwise'") in rejected(quant_type="fp8")  # fmt: skip
    assert "config.quant_type None must be a str, not NoneType" in rejected(quant_type=None)


def test_fp4_is_refused_by_asyncll():
    assert ("config.quant_type 'fp4_blockwise' is not supported by kernel type AsyncLL (quantized combines of "
            "'fp4_blockwise': IntraNode, IntraNodeLL)") in rejected(kernel_type=K.AsyncLL, quant_type="fp4_blockwise")  # fmt: skip


@pytest.mark.parametrize("kind", sorted(ep_schema.INTERNODE))
@pytest.mark.parametrize("quant", QUANTS)
def test_the_internode_kernel_types_refuse_every_quant_type(kind, quant):
    message = rejected(kernel_type=kind, quant_type=quant, gpu_per_node=2, block_num=8)
    assert f"config.quant_type {quant!r} is not supported by kernel type {K(kind).name}" in message


@pytest.mark.parametrize("quant", QUANTS)
def test_zero_copy_is_refused_not_ignored(quant):
    # MORI silently ignores fp8_direct_cast with the zero-copy combine: refused here.
    message = rejected(quant_type=quant, use_external_inp_buf=False)
    assert f"config.quant_type {quant!r} needs config.use_external_inp_buf=True" in message


def test_a_quantization_needs_bf16_rows():
    message = rejected(quant_type="fp8_direct_cast", max_token_type_size=1)
    assert "config.max_token_type_size 1 has no bf16 rows (allowed: 2 or 4)" in message


@pytest.mark.parametrize(("target", "ok"), [("gfx950", True), ("sm_90", True), ("gfx942", False), ("gfx1250", False)])
def test_fp4_needs_a_target_with_its_conversion(target, ok):
    cfg = config(quant_type="fp4_blockwise")
    problems = quant_target_problems(cfg, target)
    assert problems == [] if ok else problems == [
        f"config.quant_type 'fp4_blockwise' is not supported on target {target} (fp4 combines: gfx950, sm_90)"]
    if not ok:
        assert "not supported on target" in rejected(target=target, quant_type="fp4_blockwise")


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "gfx1250", "sm_90"])
def test_fp8_runs_on_every_target(target):
    validate_config(config(quant_type="fp8_blockwise"), 32, target)


def test_the_scale_blocks_variable(monkeypatch):
    monkeypatch.delenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, raising=False)
    assert combine_scale_blocks() == 56
    monkeypatch.setenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, " 32 ")
    assert combine_scale_blocks() == 32
    for raw, needle in (("x", "is not an integer"), ("0", "must be in [1, 256]"), ("257", "must be in [1, 256]")):
        monkeypatch.setenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, raw)
        with pytest.raises(ConfigError, match=wire_quant.FP8_COMBINE_SCALE_DIM_ENV) as info:
            combine_scale_blocks()
        assert needle in str(info.value)


def _combine_attrs(cfg, scale_blocks=None) -> dict:
    plan = module_plan(cfg, 32, scale_blocks=scale_blocks)
    return {(op.op, op.kernel.dtype, dict(op.attributes).get("zero_copy")): dict(op.attributes) for op in plan.ops
            if op.op in ("combine", "combine_send", "combine_recv")}  # fmt: skip


@pytest.mark.parametrize("quant", QUANTS)
def test_the_plan_quantizes_the_bf16_push_combine_only(quant, monkeypatch):
    monkeypatch.setenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, "24")
    attrs = _combine_attrs(config(quant_type=quant, max_token_type_size=4))
    blocks = 24 if quant.endswith("blockwise") else 0
    push = attrs[("combine", "bf16", 0)]
    assert (push["quant"], push["scale_blocks"]) == (quant, blocks)
    for key in (("combine", "bf16", 1), ("combine", "f32", 0), ("combine", "f32", 1)):  # zero-copy and f32: plain
        assert "quant" not in attrs[key] and "scale_blocks" not in attrs[key]
    assert _combine_attrs(config(quant_type=quant), scale_blocks=8)[("combine", "bf16", 0)]["scale_blocks"] == (
        8 if blocks else 0)


def test_the_plan_quantizes_both_asyncll_halves():
    attrs = _combine_attrs(config(kernel_type=K.AsyncLL, quant_type="fp8_blockwise"), scale_blocks=56)
    for op in ("combine_send", "combine_recv"):
        assert (attrs[(op, "bf16", None)]["quant"], attrs[(op, "bf16", None)]["scale_blocks"]) == ("fp8_blockwise", 56)


def test_the_plan_of_an_unquantized_config_is_unchanged():
    for attrs in _combine_attrs(config()).values():  # no attribute: the bundle key of every other config kept
        assert "quant" not in attrs and "scale_blocks" not in attrs


def test_the_wire_row_layout():
    # fp8: a byte per element, scales after the 16-byte aligned payload; fp4: two elements per byte.
    assert wire_quant.wire_row_bytes("fp8_direct_cast", 7168, 0) == 7168
    assert wire_quant.wire_row_bytes("fp8_blockwise", 7168, 56) == 7168 + 224
    assert wire_quant.wire_scale_offset("fp4_blockwise", 7168) == 3584
    assert wire_quant.wire_row_bytes("fp4_blockwise", 7168, 56) == 3584 + 224
    assert wire_quant.wire_row_bytes("fp8_blockwise", 24, 56) == 32 + 224  # small rows: the scales dominate
    assert wire_quant.wire_row_bytes("fp4_blockwise", 8, 3) == 16 + 16
    assert wire_quant.wire_row_bytes("none", 64, 0) == 128
    assert wire_quant.wire_block_elems(4096, 56) == 74 and wire_quant.wire_block_elems(100, 56) == 2


@pytest.mark.parametrize(("attrs", "needle"), [
    ({"quant": "fp8"}, "attribute 'quant' must be one of 'none', 'fp8_direct_cast', 'fp8_blockwise', 'fp4_blockwise', got 'fp8'"),
    ({"quant": "fp8_blockwise", "scale_blocks": 0}, "attribute 'scale_blocks' must be in [1, 256] for quant 'fp8_blockwise', got 0"),
    ({"quant": "fp8_direct_cast", "scale_blocks": 4}, "attribute 'scale_blocks' must be 0 for quant 'fp8_direct_cast'"),
    ({"quant": "fp8_direct_cast", "dtype": "f32"}, "attribute 'quant' 'fp8_direct_cast' needs dtype 'bf16'"),
    ({"quant": "fp8_direct_cast", "zero_copy": 1}, "attribute 'quant' 'fp8_direct_cast' needs zero_copy = 0"),
    ({"scale_blocks": 8, "quant": 3}, "attribute 'quant' must be one of"),
])  # fmt: skip
def test_the_combine_op_checks_its_quant_attributes(attrs, needle):
    from mori_compiler._mlir import ir, new_context
    from mori_compiler.dialects import mori_ep, registry

    plan = module_plan(config(quant_type="fp8_direct_cast"), 32)
    push = next(op for op in plan.ops if op.op == "combine" and dict(op.attributes)["zero_copy"] == 0)
    values = dict(push.attributes) | attrs
    ctx = new_context()
    registry.load_all(ctx)
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        op = mori_ep.ep_op("combine", values, ip=ir.InsertionPoint(module.body))
        assert any(needle in e for e in mori_ep.extra_verify(op)), mori_ep.extra_verify(op)
