"""A NumPy reference model of MORI-EP's combine wire quantization (``quant_type``) and its oracle bounds.

This docstring is the description of the wire formats (docs/ep-protocols.md has none yet; its §12 is the
oracle whose quantized tolerances :func:`quantized_combine_bound` gives). What each function models:

* :func:`fp8_direct_cast` / :func:`fp8_direct_cast_decode`: ``fp8_direct_cast``, every element cast to the
  arch's fp8 e4m3 (OCP ``fp8_e4m3fn``, max 448, gfx950/gfx12; FNUZ ``fp8_e4m3fnuz``, max 240, gfx942) with
  HIP's saturating cast: a finite value is clamped to ±max, then rounded to nearest even. NaN and ±inf are
  not clamped (HIP skips the clamp when the exponent is all ones) and become NaN: OCP ``0x7f | sign``, FNUZ
  ``0x80``. ``-0.0`` stays ``0x80`` in OCP and is ``0x00`` in FNUZ (no negative zero).
* :func:`fp8_blockwise_quantize` / :func:`fp8_blockwise_dequantize`: ``fp8_blockwise``.
* :func:`fp4_e2m1_encode` / :func:`fp4_e2m1_decode`: the packed E2M1 payload.
* :func:`fp4_blockwise_quantize` / :func:`fp4_blockwise_dequantize`: ``fp4_blockwise``.
* :func:`reference_quantized_combine`: the expected combine output, each copy quantized on the wire,
  dequantized by the reader and summed in fp32; :func:`quantized_combine_bound` and
  :func:`check_quantized_combine`: the oracle's tolerance around ``U * x``.

Blockwise layout (both fp8 and fp4; ``S`` = ``scale_dim``, default ``MORI_FP8_COMBINE_SCALE_DIM`` = 56): per
token, ``S`` blocks of ``B = ceil(H / S)`` elements; block ``b`` covers ``[b*B, min((b+1)*B, H))``, so the last
non-empty block may be shorter and, when ``S*B`` overshoots by ``B`` or more (``H < S`` or e.g. H=100, S=56:
B=2, 50 blocks), the trailing blocks are empty. That is what a fixed ``ceil`` block size with ``S`` scale
slots per token implies. An empty block has amax 0, is never scaled and stores scale 1.0. Scales are f32,
``[n, S]``. Per block, ``amax = max |x|`` (NaN ignored, like ``fmaxf``); if ``amax > qmax`` the stored scale is
``amax / qmax`` and the values are multiplied by ``qmax / amax`` (f32) before the saturating cast, else the
scale is 1.0 and the block is a plain cast. If any block of a token was scaled, block 0's stored scale is
negated (block 0 is never empty since H >= 1). The reader applies the scales only when ``scale[0] < 0``
(block 0 with its absolute value); otherwise it decodes the token as a plain cast.

fp4 (our reading of "the same staging/scale layout with a packed E2M1 payload"): the fp8 rule above with
``qmax = 6`` (scale only blocks whose amax exceeds 6, same negated block-0 trick). E2M1 values are
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` with a sign bit (code = sign<<3 | magnitude index); the encoder rounds to
nearest, ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), saturates finite
values and ±inf at ±6, keeps the sign of values that round to zero (-0.1 -> 0x8) and refuses NaN (E2M1 has
no NaN code). The oracle's fp4 bound ``blockMax/6*U + 0.05*|U*x| + 0.01`` is exact for a scaled block
(half of E2M1's widest step, 1, times ``amax/6``) but a plain-cast block with a small amax can exceed it
(a block whose amax is 0.75: 0.75 -> 1.0, error 0.25 > 0.1725); randn blocks of 128 elements do not get
there, and a kernel that scales every block instead would be within it. Packing (torch ``float4_e2m1fn_x2`` / OCP MX order): byte ``j`` holds element ``2j`` in its low
nibble and element ``2j+1`` in its high nibble; an odd H pads the last high nibble with +0.

The kernels (mori_comm.quantize_row / accumulate_quantized_rows, lowered in passes/comm_quant.py; the
layout's one owner is mori_compiler/wire_quant.py) implement exactly these rules, the fp4 one included
(the fp8 rule with max 6 is our reading, not a documented MORI rule: kernels and model agree on it, and
the oracle's bound holds for it). Finite inputs give the same bits; the code of a NaN is the hardware's
(sm_90's conversion writes 0x7f whatever the sign; the model's OCP NaN keeps it), and a NaN fp4 input,
which the model refuses, becomes a signed zero in the kernels.

Values are passed as float32 NumPy arrays (bf16 expert outputs converted to float32); bits come back as
uint8. The casts are ml_dtypes' (``float8_e4m3fn``, ``float8_e4m3fnuz``, ``float4_e2m1fn``) behind the clamps
above (its fp8 casts do not saturate); test_dtype_encoders.py pins them to exact rounding. The f32 arithmetic
(scale, multiply, sum in copy order) is what the kernels do; a kernel summing in another order may differ in
the last f32 bit before the bf16 output rounding.
"""

from __future__ import annotations

import numpy as np

from mori_compiler.wire_quant import DEFAULT_COMBINE_SCALE_DIM, FP8_COMBINE_SCALE_DIM_ENV, QUANT_TYPES
from mori_compiler.ops.config import combine_scale_blocks
from mori_compiler.ops.reference import canonical_dtype, combine_tolerance, from_bits, quantize, to_bits
from mori_compiler.runtime.extras import import_extra

ml_dtypes = import_extra("ml_dtypes")

__all__ = [
    "FP8_COMBINE_SCALE_DIM_ENV", "DEFAULT_SCALE_DIM", "QUANT_TYPES", "FP8_NAMES", "FP8_MAX", "FP4_MAX",
    "FP4_E2M1_VALUES", "fp8_combine_scale_dim", "block_size", "fp8_direct_cast", "fp8_direct_cast_decode",
    "fp8_blockwise_quantize", "fp8_blockwise_dequantize", "fp4_e2m1_encode", "fp4_e2m1_decode",
    "fp4_blockwise_quantize", "fp4_blockwise_dequantize", "reference_quantized_combine",
    "quantized_combine_bound", "check_quantized_combine",
]  # fmt: skip

DEFAULT_SCALE_DIM = DEFAULT_COMBINE_SCALE_DIM
FP8_NAMES = ("fp8_e4m3fn", "fp8_e4m3fnuz")
FP8_MAX = {"fp8_e4m3fn": 448.0, "fp8_e4m3fnuz": 240.0}
FP4_MAX = 6.0
# Magnitude of each code 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
FP4_E2M1_VALUES = np.arange(8, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
FP4_E2M1_VALUES.flags.writeable = False


def fp8_combine_scale_dim() -> int:
    """``scale_dim`` of the blockwise combines: ``$MORI_FP8_COMBINE_SCALE_DIM`` (an integer in [1, 65536]),
    default 56 (the op's reader, ops/config.py ``combine_scale_blocks``; a bad value is a ValueError)."""
    return combine_scale_blocks()


def _fp8_name(fp8_name) -> str:
    try:
        name = canonical_dtype(fp8_name)
    except ValueError:
        name = None
    if name not in FP8_NAMES:
        raise ValueError(f"fp8_name {fp8_name!r} is not an fp8 e4m3 dtype (allowed: {', '.join(FP8_NAMES)})")
    return name


def _scale_dim(scale_dim) -> int:
    if scale_dim is None:
        return fp8_combine_scale_dim()
    if isinstance(scale_dim, bool) or not isinstance(scale_dim, (int, np.integer)) or scale_dim < 1:
        raise ValueError(f"scale_dim must be an integer >= 1, got {scale_dim!r}")
    return int(scale_dim)


def _tokens(x, what: str = "x") -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"{what} must be a 2-D [n, H] array with H >= 1, got shape {a.shape}")
    return a


def block_size(hidden: int, scale_dim: int) -> int:
    """Elements per scale block: ``ceil(hidden / scale_dim)``."""
    return -(-int(hidden) // _scale_dim(scale_dim))


def _block_ids(hidden: int, scale_dim: int) -> np.ndarray:
    """int [H]: the block of each element."""
    return np.arange(hidden) // block_size(hidden, scale_dim)


# ---- fp8 direct cast ------------------------------------------------------------------------------------


def fp8_direct_cast(x_f32, fp8_name) -> np.ndarray:
    """uint8 codes of HIP's saturating fp8 cast (finite: clamp to ±max, round to nearest even; NaN/±inf: NaN)."""
    name = _fp8_name(fp8_name)
    a = np.asarray(x_f32, dtype=np.float32)
    bits = to_bits(a, name, saturate=True)
    # HIP skips the clamp for an all-ones exponent: inf converts like an unclamped overflow, to NaN.
    return np.where(np.isinf(a), to_bits(a, name, saturate=False), bits).astype(np.uint8)


def fp8_direct_cast_decode(bits, fp8_name) -> np.ndarray:
    """float32 values of fp8 codes."""
    return from_bits(np.asarray(bits, dtype=np.uint8), _fp8_name(fp8_name))


# ---- blockwise scaling (shared by fp8 and fp4) -----------------------------------------------------------


def _block_scales(x: np.ndarray, qmax: float, scale_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-element multiplier f32 [n, H], stored scales f32 [n, S]) of the blockwise rule."""
    n, hidden = x.shape
    blk = _block_ids(hidden, scale_dim)
    amax = np.zeros((n, scale_dim), dtype=np.float32)
    np.fmax.at(amax, (slice(None), blk), np.abs(x))  # fmax: NaN ignored, like fmaxf
    scaled = amax > np.float32(qmax)
    with np.errstate(divide="ignore"):
        scale = np.where(scaled, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
        mult = np.where(scaled, np.float32(qmax) / amax, np.float32(1.0)).astype(np.float32)
    scale[:, 0] = np.where(scaled.any(axis=1), -scale[:, 0], scale[:, 0])
    return mult[:, blk], scale


def _reader_scales(scales, n: int, hidden: int) -> np.ndarray:
    """Per-element scale f32 [n, H] the reader applies: |scale[b]| where scale[0] < 0, else 1."""
    s = np.asarray(scales, dtype=np.float32)
    if s.ndim != 2 or s.shape[0] != n or s.shape[1] < 1:
        raise ValueError(f"scales must be [n={n}, scale_dim], got shape {s.shape}")
    active = s[:, :1] < 0
    per_block = np.where(active, np.abs(s), np.float32(1.0))
    return per_block[:, _block_ids(hidden, s.shape[1])]


def fp8_blockwise_quantize(x_f32, fp8_name, scale_dim=None) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [n, H], scales f32 [n, scale_dim]) of ``fp8_blockwise`` (layout in the module docstring)."""
    name = _fp8_name(fp8_name)
    x = _tokens(x_f32)
    mult, scales = _block_scales(x, FP8_MAX[name], _scale_dim(scale_dim))
    return fp8_direct_cast(x * mult, name), scales


def fp8_blockwise_dequantize(bits, scales, fp8_name) -> np.ndarray:
    """float32 [n, H]: the reader's decode (block scales applied only when ``scales[:, 0] < 0``)."""
    b = np.asarray(bits)
    if b.ndim != 2 or b.dtype != np.uint8:
        raise ValueError(f"bits must be a 2-D uint8 [n, H] array, got {b.dtype} shape {b.shape}")
    return fp8_direct_cast_decode(b, fp8_name) * _reader_scales(scales, *b.shape)


# ---- fp4 e2m1 -------------------------------------------------------------------------------------------


def _fp4_codes(x: np.ndarray) -> np.ndarray:
    """uint8 E2M1 codes (one per element, 0..15) of float32 values, by ml_dtypes' round-to-nearest-even cast."""
    if np.isnan(x).any():  # ml_dtypes casts NaN to a zero (-NaN to +0): the model refuses it instead
        raise ValueError("fp4 e2m1 has no NaN encoding: the input contains NaN")
    # ml_dtypes 0.5-0.7 saturate this cast on their own, which they do not document: the clamp states our rule.
    return np.clip(x, -FP4_MAX, FP4_MAX).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)


def fp4_e2m1_encode(x_f32) -> np.ndarray:
    """Packed E2M1 uint8 [n, ceil(H/2)] of [n, H] values: element 2j in the low nibble of byte j."""
    x = _tokens(x_f32)
    codes = _fp4_codes(x)
    if codes.shape[1] % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)))
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def fp4_e2m1_decode(packed, hidden: int) -> np.ndarray:
    """float32 [n, hidden] values of packed E2M1 bytes (inverse of :func:`fp4_e2m1_encode`)."""
    p = np.asarray(packed)
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)) or hidden < 1:
        raise ValueError(f"hidden must be an integer >= 1, got {hidden!r}")
    if p.ndim != 2 or p.dtype != np.uint8 or p.shape[1] != -(-hidden // 2):
        raise ValueError(f"packed must be a uint8 [n, ceil(hidden/2)={-(-hidden // 2)}] array, "
                         f"got {p.dtype} shape {p.shape}")  # fmt: skip
    codes = np.stack([p & 0xF, p >> 4], axis=2).reshape(p.shape[0], -1)[:, :hidden]
    return np.ascontiguousarray(codes).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def fp4_blockwise_quantize(x_f32, scale_dim=None) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 [n, ceil(H/2)], scales f32 [n, scale_dim]) of ``fp4_blockwise`` (fp8's rule, max 6)."""
    x = _tokens(x_f32)
    mult, scales = _block_scales(x, FP4_MAX, _scale_dim(scale_dim))
    return fp4_e2m1_encode(x * mult), scales


def fp4_blockwise_dequantize(packed, scales, hidden: int) -> np.ndarray:
    """float32 [n, hidden]: the reader's decode of ``fp4_blockwise`` (scales only when ``scales[:, 0] < 0``)."""
    values = fp4_e2m1_decode(packed, hidden)
    return values * _reader_scales(scales, *values.shape)


# ---- combine ---------------------------------------------------------------------------------------------


def _check_quant_args(quant_type, fp8_name, scale_dim) -> tuple[str | None, int | None]:
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type {quant_type!r} is unknown (allowed: {', '.join(QUANT_TYPES)})")
    uses_fp8 = quant_type.startswith("fp8")
    if uses_fp8 and fp8_name is None:
        raise ValueError(f"quant_type {quant_type!r} needs fp8_name (allowed: {', '.join(FP8_NAMES)})")
    if not uses_fp8 and fp8_name is not None:
        raise ValueError(f"fp8_name is not used by quant_type {quant_type!r}: pass None")
    if not quant_type.endswith("blockwise") and scale_dim is not None:
        raise ValueError(f"scale_dim is not used by quant_type {quant_type!r}: pass None")
    name = _fp8_name(fp8_name) if uses_fp8 else None
    return name, (_scale_dim(scale_dim) if quant_type.endswith("blockwise") else None)


def _wire_round_trip(y: np.ndarray, quant_type: str, fp8_name, scale_dim) -> np.ndarray:
    if quant_type == "none":
        return y
    if quant_type == "fp8_direct_cast":
        return fp8_direct_cast_decode(fp8_direct_cast(y, fp8_name), fp8_name)
    if quant_type == "fp8_blockwise":
        return fp8_blockwise_dequantize(*fp8_blockwise_quantize(y, fp8_name, scale_dim), fp8_name)
    return fp4_blockwise_dequantize(*fp4_blockwise_quantize(y, scale_dim), y.shape[1])


def reference_quantized_combine(contributions, quant_type: str, fp8_name=None, scale_dim=None, *,
                                present=None) -> np.ndarray:
    """float32 [n, H]: ``Σ_u dequant(quant(contributions[u]))`` summed in f32 in copy order.

    ``contributions`` [U, n, H] float32 holds each destination PE's expert row for the token (bf16 values);
    ``present`` [U, n] bool (default: all) says which copies exist (token t has U(t) = present[:, t].sum()).
    ``fp8_name`` is required for the fp8 quant types and refused otherwise; ``scale_dim`` (default
    :func:`fp8_combine_scale_dim`) only for the blockwise ones. The result is not yet rounded to bf16.
    """
    name, sdim = _check_quant_args(quant_type, fp8_name, scale_dim)
    c = np.asarray(contributions, dtype=np.float32)
    if c.ndim != 3 or c.shape[2] < 1:
        raise ValueError(f"contributions must be a 3-D [U, n, H] array with H >= 1, got shape {c.shape}")
    mask = np.ones(c.shape[:2], dtype=bool) if present is None else np.asarray(present)
    if mask.shape != c.shape[:2] or mask.dtype != bool:
        raise ValueError(f"present must be a bool [U, n] = {c.shape[:2]} array, got {mask.dtype} shape {mask.shape}")
    out = np.zeros(c.shape[1:], dtype=np.float32)
    for u in range(c.shape[0]):
        out += np.where(mask[u][:, None], _wire_round_trip(c[u], quant_type, name, sdim), np.float32(0.0))
    return out


def _block_max(x: np.ndarray, scale_dim: int) -> np.ndarray:
    """f32 [n, H]: the amax of each element's block."""
    blk = _block_ids(x.shape[1], scale_dim)
    amax = np.zeros((x.shape[0], scale_dim), dtype=np.float32)
    np.fmax.at(amax, (slice(None), blk), np.abs(x))
    return amax[:, blk]


def quantized_combine_bound(quant_type: str, x, copies, *, scale_dim=None, dtype_name: str = "bf16") -> np.ndarray:
    """float64 [n, H]: the oracle's allowed ``|out - U*x|`` per element for a wire quantization.

    ``x`` [n, H] is the tokens' values, ``copies`` [n] their U. ``none``: the dtype's combine tolerance;
    ``fp8_direct_cast``: atol = rtol = 1e-1; ``fp8_blockwise``: 7e-2 (both ``atol + rtol*|U*x|``);
    ``fp4_blockwise``: ``blockMax/6 * U + 0.05*|U*x| + 0.01`` with blockMax the amax of x's block
    (``scale_dim`` as in the quantizer; refused for the other types).
    """
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type {quant_type!r} is unknown (allowed: {', '.join(QUANT_TYPES)})")
    if quant_type != "fp4_blockwise" and scale_dim is not None:
        raise ValueError(f"scale_dim is not used by the {quant_type!r} bound: pass None")
    xs = _tokens(x)
    u = np.asarray(copies, dtype=np.float64).reshape(-1)
    if u.shape[0] != xs.shape[0]:
        raise ValueError(f"copies has {u.shape[0]} entries but x has {xs.shape[0]} tokens")
    expected = np.abs(xs.astype(np.float64) * u[:, None])
    if quant_type == "fp4_blockwise":
        block_max = _block_max(xs, _scale_dim(scale_dim)).astype(np.float64)
        return block_max / FP4_MAX * u[:, None] + 0.05 * expected + 0.01
    atol, rtol = combine_tolerance(dtype_name, quant_type)
    return atol + rtol * expected


def check_quantized_combine(out, x, copies, quant_type: str, *, scale_dim=None, dtype_name: str = "bf16") -> None:
    """Raise AssertionError unless ``out`` [n, H] is within :func:`quantized_combine_bound` of
    ``round(U*x, dtype_name)`` (MORI's ``(float(x)*U).to(dtype)``). NaN never passes."""
    xs = _tokens(x)
    u = np.asarray(copies, dtype=np.float64).reshape(-1)
    bound = quantized_combine_bound(quant_type, xs, u, scale_dim=scale_dim, dtype_name=dtype_name)
    want = quantize((xs.astype(np.float64) * u[:, None]).astype(np.float32), dtype_name).astype(np.float64)
    got = np.asarray(out, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"combine output has shape {got.shape}, expected {want.shape}")
    bad = ~(np.abs(got - want) <= bound)
    if bad.any():
        t, j = (int(i[0]) for i in np.nonzero(bad))
        raise AssertionError(f"{quant_type} combine output of token {t}, element {j}: got {got[t, j]!r}, "
                             f"expected {want[t, j]!r} within {bound[t, j]!r}; {int(bad.sum())} element(s) "
                             f"out of bound")  # fmt: skip
