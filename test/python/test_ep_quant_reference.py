"""The combine wire-quantization reference model (mori_compiler/ops/quant_reference.py), on the CPU."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mori_compiler.ops import quant_reference as q
from mori_compiler.ops.reference import quantize, to_bits

OCP, FNUZ = "fp8_e4m3fn", "fp8_e4m3fnuz"


def _randn(seed: int, n: int, hidden: int) -> np.ndarray:
    """bf16-representable randn tokens (the expert outputs are bf16)."""
    return quantize(np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float32), "bf16")


def _plant(x: np.ndarray, value: float, scale_dim: int) -> np.ndarray:
    """MORI's force_scale_active: ±value at the first element of every non-empty block."""
    x = x.copy()
    bs = q.block_size(x.shape[1], scale_dim)
    for b, start in enumerate(range(0, x.shape[1], bs)):
        x[:, start] = value if b % 2 == 0 else -value
    return x


# ---- scale_dim from the environment ----------------------------------------------------------------------


def test_scale_dim_default_and_env(monkeypatch):
    monkeypatch.delenv(q.FP8_COMBINE_SCALE_DIM_ENV, raising=False)
    assert q.fp8_combine_scale_dim() == 56
    monkeypatch.setenv(q.FP8_COMBINE_SCALE_DIM_ENV, "32")
    assert q.fp8_combine_scale_dim() == 32
    x = _plant(_randn(1, 2, 4096), 900.0, 32)
    _, scales = q.fp8_blockwise_quantize(x, OCP)  # scale_dim=None reads the variable
    assert scales.shape == (2, 32)


@pytest.mark.parametrize("raw", ["abc", "1.5", "0", "-3"])
def test_scale_dim_env_refused(monkeypatch, raw):
    monkeypatch.setenv(q.FP8_COMBINE_SCALE_DIM_ENV, raw)
    with pytest.raises(ValueError, match=q.FP8_COMBINE_SCALE_DIM_ENV):
        q.fp8_combine_scale_dim()


# ---- fp8 direct cast -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, mx, maxcode, nan_pos, nan_neg, negzero", [
    (OCP, 448.0, 0x7E, 0x7F, 0xFF, 0x80),
    (FNUZ, 240.0, 0x7F, 0x80, 0x80, 0x00),
])  # fmt: skip
def test_fp8_direct_cast_edges(name, mx, maxcode, nan_pos, nan_neg, negzero):
    x = np.array([0.0, -0.0, mx, -mx, mx * 1.01, -mx * 4, 1e30, np.inf, -np.inf, np.nan], dtype=np.float32)
    got = q.fp8_direct_cast(x, name).tolist()
    assert got == [0x00, negzero, maxcode, maxcode | 0x80, maxcode, maxcode | 0x80, maxcode,
                   nan_pos, nan_neg, nan_pos]  # fmt: skip
    back = q.fp8_direct_cast_decode(np.array(got, dtype=np.uint8), name)
    assert back[2] == mx and back[5] == -mx and np.isnan(back[7:]).all()


@pytest.mark.parametrize("name", [OCP, FNUZ])
def test_fp8_direct_cast_in_range_is_round_to_nearest_even(name):
    x = _randn(2, 64, 128) * 50
    x = np.clip(x, -q.FP8_MAX[name], q.FP8_MAX[name])
    assert (q.fp8_direct_cast(x, name) == to_bits(x, name)).all()
    # a tie: 1 + 1/16 lies halfway between 1 and 1 + 1/8 and goes to the even code (1.0)
    assert q.fp8_direct_cast_decode(q.fp8_direct_cast(np.float32(1.0625), name), name) == 1.0


# ---- fp8 blockwise ---------------------------------------------------------------------------------------


def _fp8_round_trip_bound(x, scales_per_elem):
    """RNE e4m3: relative error <= 2^-4 for normals, half a subnormal step (<= 2^-10 * scale) below."""
    return np.abs(x) * 2.0**-4 + scales_per_elem * 2.0**-10


@pytest.mark.parametrize("name", [OCP, FNUZ])
def test_fp8_blockwise_all_small_is_a_plain_cast(name):
    x = _randn(3, 8, 7168)
    bits, scales = q.fp8_blockwise_quantize(x, name, 56)
    assert scales.dtype == np.float32 and scales.shape == (8, 56)
    assert (scales == 1.0).all()  # block 0 not negated
    assert (bits == q.fp8_direct_cast(x, name)).all()
    assert (q.fp8_blockwise_dequantize(bits, scales, name) == q.fp8_direct_cast_decode(bits, name)).all()


@pytest.mark.parametrize("name", [OCP, FNUZ])
@pytest.mark.parametrize("hidden, scale_dim", [(7168, 56), (4096, 32), (7169, 56), (7, 56), (100, 56), (7, 3)])
def test_fp8_blockwise_force_scale_active(name, hidden, scale_dim):
    mx = q.FP8_MAX[name]
    x = _plant(_randn(4, 4, hidden), 2 * mx, scale_dim)
    bits, scales = q.fp8_blockwise_quantize(x, name, scale_dim)
    bs = q.block_size(hidden, scale_dim)
    used = -(-hidden // bs)
    assert used <= scale_dim
    # every non-empty block has amax 2*max -> scale 2; block 0 negated; empty trailing blocks store 1
    assert (scales[:, 0] == -2.0).all()
    assert (scales[:, 1:used] == 2.0).all()
    assert (scales[:, used:] == 1.0).all()
    got = q.fp8_blockwise_dequantize(bits, scales, name)
    assert (got[:, ::bs] == x[:, ::bs]).all()  # ±2max scaled to ±max exactly
    assert (np.abs(got - x) <= _fp8_round_trip_bound(x, 2.0)).all()
    # the plain reader (scale ignored) would be wrong by a factor 2 on every scaled block
    plain = q.fp8_direct_cast_decode(bits, name)
    assert (np.abs(plain[:, ::bs] - x[:, ::bs]) == mx).all()


def test_fp8_blockwise_layout_of_odd_hidden():
    # H=7169, S=56: blocks of 129; 55 full blocks, the 56th has 7169 - 55*129 = 74 elements
    assert q.block_size(7169, 56) == 129
    x = np.zeros((1, 7169), np.float32)
    x[0, -1] = 1000.0  # only the last block is scaled
    _, scales = q.fp8_blockwise_quantize(x, OCP, 56)
    assert scales[0, 55] == np.float32(1000.0) / np.float32(448.0)
    assert scales[0, 0] == -1.0 and (scales[0, 1:55] == 1.0).all()
    # H=7, S=56: seven one-element blocks, 49 empty ones
    x = np.array([[1.0, 2.0, 3.0, 500.0, 5.0, 6.0, 7.0]], np.float32)
    bits, scales = q.fp8_blockwise_quantize(x, OCP, 56)
    assert scales[0, 3] == np.float32(500.0) / np.float32(448.0) and scales[0, 0] == -1.0
    assert (np.delete(scales[0], [0, 3]) == 1.0).all()
    assert (q.fp8_blockwise_dequantize(bits, scales, OCP)[0, [0, 1, 2, 4, 5, 6]] == x[0, [0, 1, 2, 4, 5, 6]]).all()


@pytest.mark.parametrize("name", [OCP, FNUZ])
def test_fp8_negated_scale_trick_read_back(name):
    mx = q.FP8_MAX[name]
    x = _randn(5, 3, 4096)
    x[0, 0] = 3 * mx  # token 0: block 0 itself scaled
    x[1, 1000] = -5 * mx  # token 1: block 7 (of 128) scaled, block 0 not
    bits, scales = q.fp8_blockwise_quantize(x, name, 32)
    assert scales[0, 0] == -np.float32(3 * mx) / np.float32(mx) and (scales[0, 1:] == 1.0).all()
    assert scales[1, 0] == -1.0 and scales[1, 7] == np.float32(5 * mx) / np.float32(mx)
    assert (scales[2] == 1.0).all()
    got = q.fp8_blockwise_dequantize(bits, scales, name)
    assert got[0, 0] == 3 * mx and got[1, 1000] == -5 * mx
    # with block 0's sign cleared the reader treats the token as a plain cast and ignores block 7's scale
    cleared = scales.copy()
    cleared[1, 0] = 1.0
    assert q.fp8_blockwise_dequantize(bits, cleared, name)[1, 1000] == -mx


# ---- fp4 e2m1 --------------------------------------------------------------------------------------------


def test_fp4_every_code_round_trips():
    codes = np.arange(16, dtype=np.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)[None, :]
    values = q.fp4_e2m1_decode(packed, 16)[0]
    assert values[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert values[8:].tolist() == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert np.signbit(values[8]) and not np.signbit(values[0])
    assert (q.fp4_e2m1_encode(values[None, :]) == packed).all()


def test_fp4_ties_to_even_and_saturation():
    x = np.array([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.26, 4.9, 5.1, 6.5, 1e9, np.inf, -np.inf, -0.1]],
                 np.float32)  # fmt: skip
    got = q.fp4_e2m1_decode(q.fp4_e2m1_encode(x), x.shape[1])[0]
    assert got.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.5, 4.0, 6.0, 6.0, 6.0, 6.0, -6.0, -0.0]
    assert np.signbit(got[-1])
    with pytest.raises(ValueError, match="NaN"):
        q.fp4_e2m1_encode(np.array([[1.0, np.nan]], np.float32))


def test_fp4_packing_order_and_odd_hidden():
    # element 0 in the low nibble: [1.0 (code 2), -6.0 (code 0xF)] -> 0xF2
    assert q.fp4_e2m1_encode(np.array([[1.0, -6.0]], np.float32)).tolist() == [[0xF2]]
    packed = q.fp4_e2m1_encode(np.array([[0.5, 3.0, -1.5]], np.float32))
    assert packed.shape == (1, 2) and packed.tolist() == [[0x51, 0x0B]]  # odd H: high nibble padded with +0
    assert q.fp4_e2m1_decode(packed, 3).tolist() == [[0.5, 3.0, -1.5]]
    with pytest.raises(ValueError, match="ceil"):
        q.fp4_e2m1_decode(packed, 5)


@pytest.mark.parametrize("hidden, scale_dim", [(7168, 56), (7169, 56), (7, 56), (4096, 32)])
def test_fp4_blockwise(hidden, scale_dim):
    small = _randn(6, 4, hidden) * 0.5
    small = np.clip(small, -5.9, 5.9)
    packed, scales = q.fp4_blockwise_quantize(small, scale_dim)
    assert packed.shape == (4, -(-hidden // 2)) and (scales == 1.0).all()  # amax <= 6: plain cast
    assert (packed == q.fp4_e2m1_encode(small)).all()
    big = _plant(_randn(6, 4, hidden), 12.0, scale_dim)
    packed, scales = q.fp4_blockwise_quantize(big, scale_dim)
    used = -(-hidden // q.block_size(hidden, scale_dim))
    assert (scales[:, 0] == -2.0).all() and (scales[:, 1:used] == 2.0).all() and (scales[:, used:] == 1.0).all()
    got = q.fp4_blockwise_dequantize(packed, scales, hidden)
    # E2M1's largest half-step is 1 (between 4 and 6), times the block scale 2 = blockMax / 6
    assert (np.abs(got - big) <= 12.0 / 6).all()
    assert (np.abs(q.fp4_e2m1_decode(packed, hidden) - big).max()) > 12.0 / 6  # scales matter


def test_fp4_plain_cast_of_a_small_block_can_exceed_the_oracle_bound():
    # the documented limit of "scale only when amax > 6": a lone 0.75 rounds (tie, even code) to 1.0
    x = np.array([[0.75, 0.0]], np.float32)
    out = q.reference_quantized_combine(x[None], "fp4_blockwise", None, 1)
    assert out.tolist() == [[1.0, 0.0]]
    with pytest.raises(AssertionError, match="out of bound"):
        q.check_quantized_combine(out, x, [1], "fp4_blockwise", scale_dim=1)


# ---- the combine and its bound ---------------------------------------------------------------------------

CASES = [("fp8_direct_cast", OCP), ("fp8_direct_cast", FNUZ), ("fp8_blockwise", OCP), ("fp8_blockwise", FNUZ),
         ("fp4_blockwise", None), ("none", None)]  # fmt: skip


def _scale_dim_for(quant_type):
    return 56 if quant_type.endswith("blockwise") else None


@pytest.mark.parametrize("quant_type, name", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_combine_within_bound_on_random_inputs(quant_type, name, seed):
    n, hidden, max_u = 16, 7168, 8
    x = _randn(seed, n, hidden)
    if quant_type != "fp8_direct_cast" and seed == 1:
        qmax = q.FP4_MAX if quant_type == "fp4_blockwise" else q.FP8_MAX.get(name, 448.0)
        x = _plant(x, 2 * qmax, 56)  # force_scale_active
    copies = np.random.default_rng(seed + 10).integers(1, max_u + 1, size=n)
    present = np.arange(max_u)[:, None] < copies[None, :]
    sdim = _scale_dim_for(quant_type)
    out = q.reference_quantized_combine(np.broadcast_to(x, (max_u, n, hidden)), quant_type, name, sdim,
                                        present=present)  # fmt: skip
    out = quantize(out, "bf16")
    q.check_quantized_combine(out, x, copies, quant_type, scale_dim=sdim if quant_type == "fp4_blockwise" else None)


@pytest.mark.parametrize("quant_type, name", [c for c in CASES if c[0] != "none"])
def test_combine_bound_catches_a_wrong_dequantize(quant_type, name):
    n, hidden, u = 8, 7168, 4
    x = _randn(7, n, hidden)
    if quant_type == "fp8_direct_cast":
        # decoding with the other fp8 format (FNUZ's bias is one more: half the value, or twice)
        other = FNUZ if name == OCP else OCP
        wrong = q.fp8_direct_cast_decode(q.fp8_direct_cast(x, name), other) * u
        bound_sdim = None
    else:
        qmax = q.FP4_MAX if quant_type == "fp4_blockwise" else q.FP8_MAX[name]
        x = _plant(x, 2 * qmax, 56)
        if quant_type == "fp8_blockwise":
            bits, _ = q.fp8_blockwise_quantize(x, name, 56)
            wrong = q.fp8_direct_cast_decode(bits, name) * u  # scales ignored
        else:
            packed, _ = q.fp4_blockwise_quantize(x, 56)
            wrong = q.fp4_e2m1_decode(packed, hidden) * u  # scales ignored
        bound_sdim = 56 if quant_type == "fp4_blockwise" else None
    right = q.reference_quantized_combine(np.broadcast_to(x, (u, n, hidden)), quant_type, name,
                                          _scale_dim_for(quant_type))  # fmt: skip
    copies = np.full(n, u)
    q.check_quantized_combine(quantize(right, "bf16"), x, copies, quant_type, scale_dim=bound_sdim)
    with pytest.raises(AssertionError, match="out of bound"):
        q.check_quantized_combine(quantize(wrong, "bf16"), x, copies, quant_type, scale_dim=bound_sdim)


def test_quantized_combine_bound_values():
    x = np.array([[1.0, -2.0, 0.5, 12.0]], np.float32)
    assert np.allclose(q.quantized_combine_bound("fp8_direct_cast", x, [2]), 0.1 + 0.1 * np.abs(2 * x))
    assert np.allclose(q.quantized_combine_bound("fp8_blockwise", x, [2]), 0.07 + 0.07 * np.abs(2 * x))
    # fp4, blocks of 2: blockMax 2 and 12
    fp4 = q.quantized_combine_bound("fp4_blockwise", x, [2], scale_dim=2)
    assert np.allclose(fp4, np.array([2, 2, 12, 12]) / 6 * 2 + 0.05 * np.abs(2 * x) + 0.01)
    assert np.allclose(q.quantized_combine_bound("none", x, [1]), 0.01 + 0.01 * np.abs(x))


def test_reference_combine_none_is_the_f32_sum():
    c = _randn(8, 3 * 2, 33).reshape(3, 2, 33)
    assert (q.reference_quantized_combine(c, "none") == (c[0] + c[1]) + c[2]).all()


# ---- bad input -------------------------------------------------------------------------------------------


def test_bad_arguments_are_refused():
    x = np.ones((2, 8), np.float32)
    c = x[None]
    with pytest.raises(ValueError, match="quant_type 'fp16_cast' is unknown.*fp8_blockwise"):
        q.reference_quantized_combine(c, "fp16_cast")
    with pytest.raises(ValueError, match="quant_type .* is unknown"):
        q.quantized_combine_bound("nope", x, [1, 1])
    with pytest.raises(ValueError, match="fp8_name 'bf16' is not an fp8.*fp8_e4m3fnuz"):
        q.fp8_direct_cast(x, "bf16")
    with pytest.raises(ValueError, match="fp8_name 'e5m2'"):
        q.fp8_blockwise_quantize(x, "e5m2", 4)
    with pytest.raises(ValueError, match="needs fp8_name"):
        q.reference_quantized_combine(c, "fp8_blockwise", None, 4)
    with pytest.raises(ValueError, match="fp8_name is not used"):
        q.reference_quantized_combine(c, "fp4_blockwise", OCP, 4)
    with pytest.raises(ValueError, match="scale_dim is not used"):
        q.reference_quantized_combine(c, "fp8_direct_cast", OCP, 4)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="scale_dim must be an integer >= 1"):
            q.fp8_blockwise_quantize(x, OCP, bad)
    with pytest.raises(ValueError, match=r"x must be a 2-D \[n, H\]"):
        q.fp8_blockwise_quantize(np.ones(8, np.float32), OCP, 4)
    with pytest.raises(ValueError, match="contributions must be a 3-D"):
        q.reference_quantized_combine(x, "none")
    with pytest.raises(ValueError, match="present must be a bool"):
        q.reference_quantized_combine(c, "none", present=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="scales must be"):
        q.fp8_blockwise_dequantize(np.zeros((2, 8), np.uint8), np.ones((3, 4), np.float32), OCP)
    with pytest.raises(ValueError, match="bits must be a 2-D uint8"):
        q.fp8_blockwise_dequantize(np.zeros((2, 8), np.int32), np.ones((2, 4), np.float32), OCP)
    with pytest.raises(ValueError, match="copies has 1 entries"):
        q.quantized_combine_bound("fp8_blockwise", x, [1])


# ---- against torch's casts (only where torch is installed; CI has none) ----------------------------------

_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not _TORCH, reason="torch is not installed (the CI image has no torch)")


@needs_torch
@pytest.mark.parametrize("name", [OCP, FNUZ])
def test_fp8_direct_cast_matches_torch_in_range(name):
    import torch

    dtype = getattr(torch, "float8_" + name.removeprefix("fp8_"), None)
    if dtype is None:
        pytest.skip(f"this torch has no float8_{name.removeprefix('fp8_')}")
    x = np.clip(_randn(9, 32, 256) * 100, -q.FP8_MAX[name], q.FP8_MAX[name])  # torch does not saturate
    want = torch.from_numpy(x).to(dtype).view(torch.uint8).numpy()
    assert (q.fp8_direct_cast(x, name) == want).all()


@needs_torch
def test_fp4_packing_matches_torch():
    import torch

    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    codes = np.arange(16, dtype=np.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)[None, :]
    t = torch.from_numpy(packed).view(torch.float4_e2m1fn_x2)
    try:
        values = t.to(torch.float32).numpy()
    except (RuntimeError, NotImplementedError, TypeError) as e:
        pytest.skip(f"torch cannot convert float4_e2m1fn_x2 to float32 here: {e}")
    if values.size != 16:  # a conversion that does not unpack the pairs says nothing about nibble order
        pytest.skip(f"torch converts float4_e2m1fn_x2 without unpacking ({values.size} values for 8 bytes)")
    assert (values.reshape(-1) == q.fp4_e2m1_decode(packed, 16).reshape(-1)).all()
