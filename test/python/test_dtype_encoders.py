"""The reference model's bf16 / fp8 / fp4 encoders and decoders (ml_dtypes' casts behind the model's own
clamps) against an exact rounding oracle, bit for bit, over more than 400k float32 inputs.

The oracle below is the reference semantics written out, independent of ml_dtypes and of any table search:
a value's binade comes from ``frexp``, its quotient by the binade's quantum is exact in float64 and ``rint``
rounds it to the nearest integer, ties to even; the magnitude code is then ``(binade - emin) << mantissa_bits``
plus that integer (one formula for subnormals, normals and the carry into the next binade). What happens
beyond the largest finite code, to ±inf, NaN and signed zeros is each format's rule, stated in ``FORMATS``
and in the flavours of the tests (plain cast, saturating cast, HIP's direct cast). The inputs: every bf16 bit
pattern, random float32 bit patterns (every binade, NaN payloads), log-uniform values around each format's
range, and for each format every representable value, every midpoint between neighbours (the ties, the
overflow threshold above the largest value and the half of the smallest subnormal included) and the float32
neighbours of each midpoint. The fp8 flavours are the project's two (``ops.reference.DTYPES``: OCP e4m3fn,
FNUZ e4m3fnuz of gfx942); no e5m2 is used anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from mori_compiler.ops import quant_reference as qr
from mori_compiler.ops import reference as ref


@dataclass(frozen=True)
class Format:
    name: str  # the reference model's dtype name
    exp_bits: int
    man_bits: int
    bias: int
    max_code: int  # the largest finite magnitude code
    neg_zero: bool  # whether a zero keeps the sign bit
    nan_code: int | None  # the NaN a NaN input gives (None: no NaN code)
    signed_nan: bool  # whether that NaN carries the input's sign
    inf_code: int | None = None  # None: no infinity

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.man_bits)


BF16 = Format("bf16", 8, 7, 127, 0x7F7F, True, 0x7FC0, True, inf_code=0x7F80)
E4M3FN = Format("fp8_e4m3fn", 4, 3, 7, 0x7E, True, 0x7F, True)  # 0x7f / 0xff are NaN, no infinity
E4M3FNUZ = Format("fp8_e4m3fnuz", 4, 3, 8, 0x7F, False, 0x80, False)  # 0x80 (the "-0") is the one NaN
E2M1 = Format("fp4_e2m1", 2, 1, 1, 0x7, True, None, False)
FORMATS = (BF16, E4M3FN, E4M3FNUZ, E2M1)


def magnitude_code(fmt: Format, v: np.ndarray) -> np.ndarray:
    """int64: round-to-nearest-even of finite ``v >= 0`` onto the format's grid, as a magnitude code (a code
    above ``max_code`` is an overflow)."""
    _, x = np.frexp(v)  # v = f * 2**x with 0.5 <= f < 1: the binade of v is x - 1
    binade = np.where(v == 0, fmt.emin, np.maximum(x - 1, fmt.emin))  # subnormals use the lowest binade
    steps = np.rint(np.ldexp(v, fmt.man_bits - binade))  # v / quantum is exact; rint ties to even
    return ((binade - fmt.emin).astype(np.int64) << fmt.man_bits) + steps.astype(np.int64)


def oracle_encode(fmt: Format, x: np.ndarray, *, overflow: str, infinity: str) -> np.ndarray:
    """int64 codes of float32 ``x``. ``overflow`` (finite values beyond the largest) and ``infinity`` (±inf)
    each become ``"max"`` (±largest finite), ``"nan"`` or ``"inf"``."""
    with np.errstate(invalid="ignore"):  # signalling NaN inputs
        v = x.astype(np.float64)
    nan, inf, neg = np.isnan(v), np.isinf(v), np.signbit(v)
    finite = ~nan & ~inf
    code = magnitude_code(fmt, np.where(finite, np.abs(v), 0.0))
    sign = np.where(neg & (fmt.neg_zero | (code != 0)), fmt.sign_bit, 0)
    for mask, rule in ((finite & (code > fmt.max_code), overflow), (inf, infinity)):
        replacement = {"max": fmt.max_code, "inf": fmt.inf_code, "nan": fmt.nan_code}[rule]
        assert replacement is not None, (fmt.name, rule)
        nan = nan | (mask & (rule == "nan"))
        code = np.where(mask, replacement, code)
        sign = np.where(mask, np.where(neg, fmt.sign_bit, 0), sign)
    if fmt.nan_code is not None:
        nan_sign = np.where(neg, fmt.sign_bit, 0) if fmt.signed_nan else 0
        code, sign = np.where(nan, fmt.nan_code, code), np.where(nan, nan_sign, sign)
    return code | sign


def oracle_values(fmt: Format, codes: np.ndarray) -> np.ndarray:
    """float64 value of each code, NaN for the NaN codes (the formats here have no infinity but bf16's,
    whose decoder is checked bitwise instead)."""
    c = codes.astype(np.int64)
    e = (c >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    m = c & ((1 << fmt.man_bits) - 1)
    mag = np.where(e == 0, m, m + (1 << fmt.man_bits)) * np.exp2(np.maximum(e, 1) - fmt.bias - fmt.man_bits)
    val = np.where(c & fmt.sign_bit, -mag, mag)
    nan_codes = np.zeros(c.shape, dtype=bool)
    if fmt.nan_code is not None:
        nan_codes = (c & ~fmt.sign_bit) == fmt.nan_code if fmt.signed_nan else c == fmt.nan_code
    return np.where(nan_codes, np.nan, val)


def _grid(fmt: Format) -> np.ndarray:
    """float64: the format's finite non-negative values in increasing order, then the virtual next one."""
    values = oracle_values(fmt, np.arange(fmt.max_code + 1))
    return np.append(values, values[-1] + (values[-1] - values[-2]))


def _boundaries(fmt: Format) -> np.ndarray:
    grid = _grid(fmt)
    points = np.concatenate([grid[:-1], (grid[1:] + grid[:-1]) / 2]).astype(np.float32)  # midpoints are exact
    points = np.concatenate([points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(0))])
    return np.concatenate([points, -points])


@pytest.fixture(scope="module")
def inputs() -> np.ndarray:
    rng = np.random.default_rng(16)
    every_bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    random_bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):  # bf16's range reaches past float32's: those become ±inf
        around = [np.float32(rng.choice([-1, 1], 20_000))
                  * np.exp2(rng.uniform(f.emin - f.man_bits - 3, f.bias + 4, 20_000)).astype(np.float32)
                  for f in FORMATS]  # fmt: skip
    special = np.array([0.0, np.inf, np.nan, np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                        np.finfo(np.float32).smallest_subnormal], np.float32)  # fmt: skip
    payload_nans = np.array([0x7F800001, 0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF], np.uint32).view(np.float32)
    x = np.concatenate([every_bf16, random_bits, *around, *map(_boundaries, FORMATS), special, -special,
                        payload_nans, -payload_nans])  # fmt: skip
    assert x.size >= 400_000
    return x


def _check(got, want, x, what: str) -> None:
    got, want = np.asarray(got).astype(np.int64), np.asarray(want).astype(np.int64)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (f"{what}: {bad.size} of {x.size} inputs differ, e.g. "
                           + ", ".join(f"{x[i]!r} (bits {x[i:i + 1].view(np.uint32)[0]:#010x}): got {got[i]:#x}, "
                                       f"want {want[i]:#x}" for i in bad[:5]))  # fmt: skip


def test_the_oracle_rounds_the_documented_examples():
    """Ties to even and the largest values, as the reference model's docstrings state them."""
    fp4 = oracle_encode(E2M1, np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, 7.0], np.float32),
                        overflow="max", infinity="max")  # fmt: skip
    assert oracle_values(E2M1, fp4).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, 6.0]
    assert fp4[7] == 0x8  # -0.1 keeps its sign
    e4m3 = oracle_encode(E4M3FN, np.array([464.0, 464.5, 2.0**-10, 2.0**-9 * 1.5], np.float32), overflow="nan",
                         infinity="nan")  # fmt: skip
    assert e4m3.tolist() == [0x7E, 0x7F, 0x00, 0x02]  # 464 ties to 448; 2^-10 ties to 0; 1.5 * 2^-9 to 2^-8
    fnuz = oracle_encode(E4M3FNUZ, np.array([248.0, -0.0, -1e-9, np.nan], np.float32), overflow="max", infinity="max")
    assert fnuz.tolist() == [0x7F, 0x00, 0x00, 0x80]
    bf16 = oracle_encode(BF16, np.array([1.0 + 2.0**-8, -np.nan, 3.4e38], np.float32), overflow="inf", infinity="inf")
    assert bf16.tolist() == [0x3F80, 0xFFC0, 0x7F80]  # the tie to even; -NaN keeps its sign; past bf16's max


def test_bf16_encoder(inputs):
    _check(ref.to_bits(inputs, "bf16"), oracle_encode(BF16, inputs, overflow="inf", infinity="inf"), inputs, "bf16")


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ], ids=lambda f: f.name)
def test_fp8_plain_cast(inputs, fmt):
    """A torch-like cast: overflow and ±inf give NaN."""
    _check(ref.to_bits(inputs, fmt.name), oracle_encode(fmt, inputs, overflow="nan", infinity="nan"), inputs,
           f"{fmt.name} cast")  # fmt: skip


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ], ids=lambda f: f.name)
def test_fp8_saturating_cast(inputs, fmt):
    _check(ref.to_bits(inputs, fmt.name, saturate=True), oracle_encode(fmt, inputs, overflow="max", infinity="max"),
           inputs, f"{fmt.name} saturating cast")  # fmt: skip


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ], ids=lambda f: f.name)
def test_fp8_direct_cast_of_the_wire(inputs, fmt):
    """HIP's cast on the wire: finite values clamp to ±max, ±inf become NaN (its clamp skips them)."""
    _check(qr.fp8_direct_cast(inputs, fmt.name), oracle_encode(fmt, inputs, overflow="max", infinity="nan"),
           inputs, f"{fmt.name} direct cast")  # fmt: skip


def test_fp4_encoder_and_its_packing(inputs):
    """Finite values and ±inf saturate at ±6; element 2j goes to the low nibble of byte j."""
    x = inputs[~np.isnan(inputs)]
    x = x[: x.size // 2 * 2]
    want = oracle_encode(E2M1, x, overflow="max", infinity="max").reshape(-1, 2)
    packed = qr.fp4_e2m1_encode(x.reshape(-1, 2))
    assert packed.shape == (x.size // 2, 1) and packed.dtype == np.uint8
    _check(packed[:, 0], want[:, 0] | (want[:, 1] << 4), x[::2], "fp4 e2m1")
    with pytest.raises(ValueError, match="no NaN encoding"):
        qr.fp4_e2m1_encode(np.array([[0.5, -np.nan]], np.float32))


def _same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal as values, the sign of zeros and NaNs included."""
    return np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got, want, equal_nan=True) and \
        np.array_equal(np.signbit(got), np.signbit(want))  # fmt: skip


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ], ids=lambda f: f.name)
def test_fp8_decoder(fmt):
    """Every code's exact value; a NaN code gives a NaN with the code's sign bit, so every code round-trips."""
    codes = np.arange(256, dtype=np.uint8)
    got = ref.from_bits(codes, fmt.name)
    want = oracle_values(fmt, codes)
    want = np.where(np.isnan(want), np.copysign(np.nan, np.where(codes & 0x80, -1.0, 1.0)), want)
    assert got.dtype == np.float32 and _same_values(got.astype(np.float64), want)
    assert np.array_equal(ref.to_bits(got, fmt.name), codes)


def test_bf16_decoder_is_the_upper_half_of_float32():
    """Every bf16 pattern, NaN payloads included, is the float32 with the same upper 16 bits."""
    codes = np.arange(1 << 16, dtype=np.uint32)
    got = ref.from_bits(codes.astype(np.uint16), "bf16")
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), codes << 16)
    assert np.array_equal(ref.from_bits(codes | 0xABCD0000, "bf16").view(np.uint32), codes << 16)  # low 16 bits


def test_fp4_decoder_and_its_values():
    codes = np.arange(16, dtype=np.uint8)
    got = qr.fp4_e2m1_decode((codes[0::2] | (codes[1::2] << 4)).reshape(1, 8), 16)[0]
    assert _same_values(got.astype(np.float64), oracle_values(E2M1, codes))
    assert qr.FP4_E2M1_VALUES.tolist() == oracle_values(E2M1, codes[:8]).tolist()


@pytest.mark.parametrize("dtype, big", [(ml_dtypes.float8_e4m3fn, 1000.0), (ml_dtypes.float8_e4m3fnuz, 300.0)])
def test_the_saturating_casts_need_their_clamp(dtype, big):
    """Why ``to_bits(saturate=True)`` and the direct cast clamp before ml_dtypes' cast: it does not saturate."""
    assert np.isnan(np.array([big], np.float32).astype(dtype).astype(np.float32)).all()


def test_saturate_is_refused_where_it_means_nothing():
    for name in ("bf16", "float32"):
        with pytest.raises(ValueError, match=f"saturate=True is only for the fp8 dtypes, not {name}"):
            ref.to_bits([1.0], name, saturate=True)
