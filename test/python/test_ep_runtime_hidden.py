"""Runtime hidden sizes on the host side (ops/dispatch_combine.py, ops/ep_launch.py), without a GPU: a call
whose hidden is the config's runs the kernel of constant rows, any smaller one (rows of whole 16-byte
vectors) its ``_anyhidden`` variant with the call's ``hidden``; the outputs are [rows, call hidden] views;
fp4 x2 rows (two E2M1 values per byte) move with the 1-byte kernels. Over the fakes of
test_ep_internode_op.py (NumPy-backed torch calls, heap, bundle and a recording launcher)."""

from __future__ import annotations

import numpy as np
import pytest

from test_ep_internode_op import FAKE_TORCH, H, K, M, W, config, fakes, launched, tensor  # noqa: F401 (fixture)


def _tokens(n: int, hidden: int, dtype: str = "bfloat16", pe: int = 0):
    x = tensor(np.arange(n * hidden).reshape(n, hidden) % 251 + pe, dtype)
    w = tensor(np.full((n, K), 0.25), "float32")
    idx = tensor(np.array([[(t + pe) % (W * 2), (t + pe + 1) % (W * 2)] for t in range(n)]).reshape(n, K), "int32")
    return x, w, idx


def _dispatch(op, hidden: int, dtype: str = "bfloat16", ns=(3, 2, 0, 4)):
    xs, ws, ids = (list(c) for c in zip(*(_tokens(n, hidden, dtype, pe) for pe, n in enumerate(ns))))
    return op.dispatch(xs, ws, None, ids), ids


@pytest.mark.parametrize("kind,family", [("IntraNode", "dispatch"), ("IntraNodeLL", "dispatch_ll")])
def test_the_config_hidden_runs_the_constant_kernel_and_a_smaller_one_the_variant(fakes, kind, family):
    op, _ = fakes(config(kind, gpu_per_node=8, use_external_inp_buf=False))
    results, ids = _dispatch(op, H)
    results_small, _ = _dispatch(op, H // 2)
    (full, full_args), (small, small_args) = launched(op)
    assert full == f"ep_{family}_bf16" and all(a["hidden"] == H for a in full_args)
    assert small == f"ep_{family}_bf16_anyhidden" and all(a["hidden"] == H // 2 for a in small_args)
    R = op.config.max_recv
    assert results[1][0].shape == (R, H) and results_small[1][0].shape == (R, H // 2)
    assert results_small[1][0].data_ptr() == results[1][0].data_ptr()  # the same buffer, packed at the call's rows
    # The combine of a smaller hidden: [M, hidden] outputs, the zero-copy rows copied at the call's row size.
    ys = [tensor(np.ones((5, H // 2)), "bfloat16") for _ in range(W)]
    outs = op.combine(ys, None, ids)
    name, args = launched(op)[-1]
    assert name == "ep_combine_pull_bf16_anyhidden" and all(a["hidden"] == H // 2 for a in args)
    assert outs[0][0].shape == (M, H // 2) and outs[0][1] is None
    reg = op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16, H // 2, pe=2)
    assert reg.shape == (op.config.max_recv, H // 2) and (reg.a[:5] == ys[2].a).all()


def test_fp4_rows_move_with_the_one_byte_kernels(fakes):
    # fp4 x2: [n, H / 2] elements of one byte (two E2M1 values each) next to a bf16 combine of H.
    op, _ = fakes(config("IntraNode", gpu_per_node=8, use_external_inp_buf=False))
    results, ids = _dispatch(op, H // 2, "float4_e2m1fn_x2")
    ((name, args),) = launched(op)
    assert name == "ep_dispatch_fp8_e4m3fn_anyhidden" and all(a["hidden"] == H // 2 for a in args)
    out_x = results[0][0]
    assert out_x.dtype is FAKE_TORCH.float4_e2m1fn_x2 and out_x.shape == (op.config.max_recv, H // 2)
    op.combine([tensor(np.ones((4, H)), "bfloat16") for _ in range(W)], None, ids)
    assert launched(op)[-1][0] == "ep_combine_pull_bf16"  # the other leg at the config's hidden
    # An op whose config hidden is the fp4 leg's runs the constant kernel for it.
    op2, _ = fakes(config("IntraNode", gpu_per_node=8, hidden_dim=H // 2, max_token_type_size=1, data_type="fp4_e2m1fn_x2"))
    _dispatch(op2, H // 2, "float4_e2m1fn_x2")
    assert launched(op2)[0][0] == "ep_dispatch_fp8_e4m3fn"


@pytest.mark.parametrize("kind", ["AsyncLL", "InterNodeV1"])
def test_every_half_and_step_gets_the_call_hidden(fakes, kind):
    op, _ = fakes(config(kind, **({} if kind == "InterNodeV1" else {"gpu_per_node": 8})))
    _, ids = _dispatch(op, H // 2)
    op.combine([tensor(np.ones((6, H // 2)), "bfloat16") for _ in range(W)], None, ids)
    for name, args in launched(op):
        assert name.endswith("_anyhidden") and all(a["hidden"] == H // 2 for a in args), name
    assert len(launched(op)) == 4


@pytest.mark.parametrize("hidden,message", [
    (H + 16, r"hidden size 48 must be an int in \[1, config.hidden_dim=32\]"),
    (12, r"hidden size 12 x 2 bytes is not a multiple of 16 bytes .* a multiple of 8"),
])  # fmt: skip
def test_a_hidden_the_kernels_cannot_take_is_refused_before_any_launch(fakes, hidden, message):
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    with pytest.raises(ValueError, match=message):
        _dispatch(op, hidden)
    with pytest.raises(ValueError, match=message.replace("dispatch", "combine")):
        op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16, hidden)
    assert launched(op) == []


def test_pes_with_different_hidden_sizes_are_refused(fakes):
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    xs, ws, ids = (list(c) for c in zip(*(_tokens(2, H if pe else H // 2, pe=pe) for pe in range(W))))
    with pytest.raises(ValueError, match=r"same dtype and hidden size \(bf16 x 16 vs bf16 x 32\)"):
        op.dispatch(xs, ws, None, ids)
    assert launched(op) == []


def test_output_views_are_made_once_per_shape(fakes):
    # Making a view through the CUDA array interface costs tens of µs per PE and output on every call: the
    # op's buffers hand out the same view for the same (buffer, PE, shape, dtype), and none after close().
    op, heap = fakes(config("IntraNode", gpu_per_node=8, use_external_inp_buf=False))
    first, _ = _dispatch(op, H)
    again, _ = _dispatch(op, H)
    smaller, _ = _dispatch(op, H // 2)
    assert first[1][0].data_ptr() == again[1][0].data_ptr() and first[1][4] is again[1][4]  # total: one view
    assert smaller[1][0].shape == (op.config.max_recv, H // 2)
    op.close()
    with pytest.raises(RuntimeError, match=r"freed \(close\(\) was called\)"):
        op.buffers.view("total", 1, (1,), FAKE_TORCH.int32)
