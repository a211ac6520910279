"""A quantizing op on the host side, without a GPU (issue 15): its bundle and buffers, the calls it launches
and those it refuses before any launch. Over the fakes of test_ep_internode_op.py (NumPy-backed torch
calls, heap, bundle and a recording launcher); the kernels themselves run in gpu/test_ep_quant_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from test_ep_internode_op import H, K, W, FakeHeap, config, fakes, launched, tensor  # noqa: F401 (fixture)

from mori_compiler import wire_quant
from mori_compiler.ops.config import ConfigError
from mori_compiler.ops.dispatch_combine import EpDispatchCombineOp


def _quant_config(kind="IntraNode", quant="fp8_blockwise", **fields):
    return config(kind, gpu_per_node=8, quant_type=quant, **fields)


def _dispatch(op, ns=(3, 2, 0, 4)):
    ids = [tensor(np.array([[(t + pe) % (W * 2), (t + pe + 1) % (W * 2)] for t in range(n)]).reshape(n, K), "int32")
           for pe, n in enumerate(ns)]  # fmt: skip
    xs = [tensor(np.ones((n, H)), "bfloat16") for n in ns]
    return op.dispatch(xs, None, None, ids), ids


@pytest.mark.parametrize("kind,family", [("IntraNode", "combine_push"), ("IntraNodeLL", "combine_push"),
                                         ("AsyncLL", "async_combine_recv")])
def test_a_quantizing_op_launches_its_combine_and_sizes_the_wire_rows(fakes, monkeypatch, kind, family):
    monkeypatch.setenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, "56")
    op, _ = fakes(_quant_config(kind))
    assert op.sizes.combine_quant == "fp8_blockwise" and op.sizes.scale_blocks == 56
    # hidden 32: a wire row is 32 payload bytes + 56 f32 scales = 256 bytes, more than the 64-byte bf16 row
    wire = wire_quant.wire_row_bytes("fp8_blockwise", H, 56)
    assert wire == 256 > 2 * H and op.sizes.combine_row_bytes == wire
    assert op.buffers.sizes["zero_row"] >= wire
    staged = "a_cx" if kind == "AsyncLL" else "stage_x"
    rows = op.sizes.async_slots if kind == "AsyncLL" else W * op.config.max_num_inp_token_per_rank
    assert op.buffers.sizes[staged] >= rows * wire
    _, ids = _dispatch(op)
    op.combine([tensor(np.ones((5, H)), "bfloat16") for _ in range(W)], None, ids)
    name, args = launched(op)[-1]
    assert name == f"ep_{family}_bf16" and all(a["hidden"] == H for a in args)


def test_an_unquantized_op_keeps_its_buffer_sizes(fakes):
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    assert op.sizes.combine_row_bytes == op.sizes.row_bytes
    assert op.buffers.sizes["stage_x"] == W * op.config.max_num_inp_token_per_rank * op.sizes.row_bytes


def test_f32_and_zero_copy_combines_are_refused_before_any_launch(fakes):
    op, _ = fakes(_quant_config(max_token_type_size=4))
    _, ids = _dispatch(op)
    before = len(launched(op))
    with pytest.raises(ValueError, match="config.quant_type 'fp8_blockwise' quantizes bf16 combines; input\\[0\\] is"):
        op.combine([tensor(np.ones((5, H)), "float32") for _ in range(W)], None, ids)
    with pytest.raises(ValueError, match="config.quant_type 'fp8_blockwise' needs the push combine"):
        op.combine([tensor(np.ones((5, H)), "bfloat16") for _ in range(W)], None, ids, use_external_inp_buf=0)
    assert len(launched(op)) == before


def test_fp4_needs_a_target_with_its_conversion(fakes, monkeypatch):
    fakes(config("IntraNode", gpu_per_node=8))  # installs the fakes
    FakeHeap(monkeypatch, virtual=True)
    with pytest.raises(ConfigError, match="config.quant_type 'fp4_blockwise' is not supported on target gfx942"):
        EpDispatchCombineOp(_quant_config(quant="fp4_blockwise"), target="gfx942")
    op = EpDispatchCombineOp(_quant_config(quant="fp4_blockwise"), target="sm_90")
    assert op.sizes.combine_quant == "fp4_blockwise"


def test_a_bad_scale_block_variable_is_refused_at_construction(fakes, monkeypatch):
    monkeypatch.setenv(wire_quant.FP8_COMBINE_SCALE_DIM_ENV, "lots")
    with pytest.raises(ConfigError, match="MORI_FP8_COMBINE_SCALE_DIM='lots' is not an integer"):
        fakes(_quant_config())
    fakes(_quant_config(quant="fp8_direct_cast"))  # not blockwise: the variable is not read
