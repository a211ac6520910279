"""The wire-quantization helpers of ``mori-comm-to-calls``: quantize_row and accumulate_quantized_rows.

A wire row (layout: ``mori_compiler.wire_quant``; formats and reader rules: ops/quant_reference.py, which these
helpers reproduce bit for bit where the hardware allows, see below) is written by one warp from a local
bf16 row and summed, K rows at a time, by one warp into a bf16 row. Both work in units of 8 elements
(one 16-byte bf16 vector): a unit is 8 fp8 bytes or 4 fp4 bytes of payload.

Conversions per target (``WireCodec``; the op's ``format`` must be the target's, the lowering checks):

* fp8 encode: first HIP's saturation in f32 (finite values clamped to ±max, ±inf to NaN, NaN kept), then
  the target's round-to-nearest-even conversion: sm_90 ``cvt.rn.satfinite.e4m3x2.f32``
  (``nvvm.convert.f32x2.to.f8x2``; its own saturation never triggers after the clamp), AMDGPU
  ``v_cvt_pk_fp8_f32`` (``rocdl.cvt.pk.fp8.f32``: FNUZ on gfx942, OCP on gfx950/gfx1250). The NaN code is
  the hardware's (sm_90: 0x7f; the model's OCP NaN keeps the sign: 0x7f | sign); finite inputs agree.
* fp8 decode: sm_90 ``cvt.rn.f16x2.e4m3x2`` then f16 -> f32 (exact), AMDGPU ``v_cvt_pk_f32_fp8``.
* fp4 encode: gfx950 ``v_cvt_scalef32_pk_fp4_f32`` at scale 1.0 (the block multiplier is applied before,
  in f32, as in the model; element 2j assumed in the low nibble like the instruction's src0, compile-only
  here), sm_90 in integer arithmetic: the E2M1 magnitude code is the number of rounding thresholds
  (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) the magnitude passes, ``>`` at the thresholds whose tie goes down
  to an even code and ``>=`` where it goes up, which is round to nearest even and saturation at 6 (±inf:
  ±6); the sign bit is copied (-0.1 -> 0x8). NaN (refused by the model) becomes a signed zero.
* fp4 decode: gfx950 ``v_cvt_scalef32_pk_f32_fp4`` at scale 1.0 (two codes per instruction); sm_90: the
  code's magnitude bits at f32 bits 22-24 (the value times 2**-126, a denormal for 0 and 0.5) times 2**126,
  exact, and the sign bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from mori_compiler import wire_quant
from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_shmem
from mori_compiler.dialects.builder import Builder

from .helper_functions import Helper

_CMPF = {"oeq": 1, "ogt": 2, "oge": 3, "olt": 4}
_FP4_UP = ((0.25, "ogt"), (0.75, "oge"), (1.25, "ogt"), (1.75, "oge"), (2.5, "ogt"), (3.5, "oge"), (5.0, "ogt"))
UNIT = wire_quant.WIRE_ELEMS_PER_UNIT  # elements per unit (a 16-byte bf16 vector)


# ---- small f32 / vector operations (generic ops: the typed builder has the integer ones) -----------------


def _one(b: Builder, name: str, operands, ty, attributes=None) -> ir.Value:
    """The result of one generic op ``name`` of result type ``ty``."""
    return b.op(name, operands, (ty,), attributes).results[0]


def _i64_attr(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _i32_attr(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), value)


def _mulf(b: Builder, x, y):
    return _one(b, "arith.mulf", (x, y), x.type)


def _divf(b: Builder, x, y):
    return _one(b, "arith.divf", (x, y), x.type)


def _negf(b: Builder, x):
    return _one(b, "arith.negf", (x,), x.type)


def _cmpf(b: Builder, pred: str, x, y):
    return _one(b, "arith.cmpf", (x, y), b.i1, {"predicate": _i64_attr(_CMPF[pred])})


def _fabs(b: Builder, x):
    # The sign bit cleared (integer ops: the NVVM lowering refuses llvm.intr.fabs, which it sends to libdevice).
    return b.bitcast(b.f32, b.andi(b.bitcast(b.i32, x), b.const_i32(0x7FFFFFFF)))


def _maxnum(b: Builder, acc, x):
    """max(acc, x) for a non-NaN ``acc``: a NaN ``x`` is ignored, like fmaxf (``llvm.intr.maxnum``: one
    instruction, sm_90 ``max.f32``, AMDGPU ``v_max_f32``). The amaxes compare magnitudes (never -0), so which
    of two equal operands it returns does not matter."""
    return _one(b, "llvm.intr.maxnum", (acc, x), acc.type)


def _extract(b: Builder, vec, i: int, elem):
    return _one(b, "llvm.extractelement", (vec, b.const_i32(i)), elem)


def _vector_of(b: Builder, values, elem):
    vec = _one(b, "llvm.mlir.undef", (), b.vector(len(values), elem))
    for i, v in enumerate(values):
        vec = _one(b, "llvm.insertelement", (vec, v, b.const_i32(i)), vec.type)
    return vec


def _load_bf16_unit(b: Builder, src, unit) -> list[ir.Value]:
    """The 8 bf16 elements of unit ``unit`` (i64) of the row ``src`` as f32 values."""
    raw = b.load(b.vector(4, b.i32), b.gep(src, b.muli(unit, b.const_i64(16)), b.i8), alignment=16)
    wide = b.extf(b.vector(UNIT, b.f32), b.bitcast(b.vector(UNIT, b.bf16), raw))
    return [_extract(b, wide, i, b.f32) for i in range(UNIT)]


def _warp_max_f32(b: Builder, value, wave: int):
    width = b.const_i32(wave)
    offset = wave // 2
    while offset >= 1:
        value = _maxnum(b, value, b.shuffle("xor", value, b.const_i32(offset), width)[0])
        offset //= 2
    return value


# ---- conversions per target ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WireCodec:
    """The conversion instructions of one target (``chip``) for one wire ``format``."""

    chip: str
    format: str

    @property
    def tag(self) -> str:
        """The format in helper symbols: its element type (e4m3fn, e4m3fnuz, e2m1)."""
        return self.format.rpartition("_")[2]

    @property
    def nvptx(self) -> bool:
        return self.chip.startswith("sm_")

    @property
    def is_fp4(self) -> bool:
        return self.format == "fp4_e2m1"

    @property
    def qmax(self) -> float:
        return wire_quant.FP4_WIRE_MAX if self.is_fp4 else wire_quant.FP8_WIRE_MAX[self.format]

    def unit_bytes(self) -> int:
        return UNIT // 2 if self.is_fp4 else UNIT

    # fp8 -------------------------------------------------------------------------------------------------
    def _hip_saturate(self, b: Builder, x):
        top, bottom = b.const_f32(self.qmax), b.const_f32(-self.qmax)
        c = b.select(_cmpf(b, "ogt", x, top), top, x)  # NaN compares false: kept
        c = b.select(_cmpf(b, "olt", c, bottom), bottom, c)
        inf = _cmpf(b, "oeq", _fabs(b, x), b.const_f32(float("inf")))
        return b.select(inf, b.const_f32(float("nan")), c)

    def _fp8_pair(self, b: Builder, lo, hi, old=None, high_word=False):
        """Two saturated values as two fp8 bytes (lo in the lower byte)."""
        if self.nvptx:  # cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte
            attrs = {"dstTy": ir.TypeAttr.get(ir.Type.parse("f8E4M3FN")), "relu": ir.BoolAttr.get(False),
                     "rnd": ir.Attribute.parse("#nvvm.fp_rnd_mode<rn>"),
                     "sat": ir.Attribute.parse("#nvvm.sat_mode<satfinite>")}  # fmt: skip
            pair = _one(b, "nvvm.convert.f32x2.to.f8x2", (hi, lo), ir.IntegerType.get_signless(16), attrs)
            return b.extui(b.i32, pair)
        return _one(b, "rocdl.cvt.pk.fp8.f32", (lo, hi, old if old is not None else b.const_i32(0)), b.i32,
                    {"wordSel": ir.BoolAttr.get(high_word)})  # fmt: skip

    def fp8_encode4(self, b: Builder, values) -> ir.Value:
        """Four f32 values as four fp8 bytes of an i32 (value 0 in the lowest byte)."""
        v = [self._hip_saturate(b, x) for x in values]
        if self.nvptx:
            lo, hi = self._fp8_pair(b, v[0], v[1]), self._fp8_pair(b, v[2], v[3])
            return b.ori(lo, b.shli(hi, b.const_i32(16)))
        return self._fp8_pair(b, v[2], v[3], old=self._fp8_pair(b, v[0], v[1]), high_word=True)

    def fp8_decode4(self, b: Builder, word) -> list[ir.Value]:
        """The four fp8 bytes of an i32 (lowest first) as f32 values."""
        out = []
        if self.nvptx:
            i16 = ir.IntegerType.get_signless(16)
            attrs = {"srcType": ir.TypeAttr.get(ir.Type.parse("f8E4M3FN")), "relu": ir.BoolAttr.get(False)}
            for half in (word, b.shrui(word, b.const_i32(16))):
                pair = b.bitcast(b.vector(2, b.i8), b.trunci(i16, half))
                h2 = _one(b, "nvvm.convert.f8x2.to.f16x2", (pair,), b.vector(2, ir.F16Type.get()), attrs)
                f2 = b.extf(b.vector(2, b.f32), h2)
                out += [_extract(b, f2, 0, b.f32), _extract(b, f2, 1, b.f32)]
            return out
        for high in (False, True):
            f2 = _one(b, "rocdl.cvt.pk.f32.fp8", (word,), b.vector(2, b.f32), {"wordSel": ir.BoolAttr.get(high)})
            out += [_extract(b, f2, 0, b.f32), _extract(b, f2, 1, b.f32)]
        return out

    # fp4 -------------------------------------------------------------------------------------------------
    def _fp4_code(self, b: Builder, x) -> ir.Value:
        """Software E2M1 code (i32, 4 bits) of an f32 value: RNE, saturating, sign copied."""
        a = _fabs(b, x)
        code = b.const_i32(0)
        for threshold, pred in _FP4_UP:
            code = b.addi(code, b.extui(b.i32, _cmpf(b, pred, a, b.const_f32(threshold))))
        sign = b.andi(b.shrui(b.bitcast(b.i32, x), b.const_i32(28)), b.const_i32(8))
        return b.ori(code, sign)

    def fp4_encode8(self, b: Builder, values) -> ir.Value:
        """Eight f32 values as eight E2M1 codes of an i32 (value 2j in the low nibble of byte j)."""
        if not self.nvptx:  # gfx950: byte j from the instruction, scale 1.0
            word, one = b.const_i32(0), b.const_f32(1.0)
            for j in range(UNIT // 2):
                word = _one(b, "rocdl.cvt.scalef32.pk.fp4.f32", (word, values[2 * j], values[2 * j + 1], one), b.i32,
                            {"dstSelIndex": _i32_attr(j)})  # fmt: skip
            return word
        word = b.const_i32(0)
        for i, x in enumerate(values):
            word = b.ori(word, b.shli(self._fp4_code(b, x), b.const_i32(4 * i)))
        return word

    def fp4_decode8(self, b: Builder, word) -> list[ir.Value]:
        """The eight E2M1 codes of an i32 (lowest nibble first) as f32 values."""
        out = []
        if not self.nvptx:  # gfx950: byte j's two codes by the instruction, scale 1.0 (exact)
            one = b.const_f32(1.0)
            for j in range(UNIT // 2):
                f2 = _one(b, "rocdl.cvt.scalef32.pk.f32.fp4", (word, one), b.vector(2, b.f32),
                          {"srcSelIndex": _i32_attr(j)})  # fmt: skip
                out += [_extract(b, f2, 0, b.f32), _extract(b, f2, 1, b.f32)]
            return out
        # sm_90: a code's 3 magnitude bits put at f32 bits 22-24 read as the value times 2**-126 (exponent
        # e - 127 + 1 and the mantissa bit; e = 0: the denormal 0 or 2**-127), so one exact multiplication
        # by 2**126 decodes them (IEEE denormals: no flush to zero); the sign bit is copied (code 8: -0.0).
        mag_mask, sign_mask, two126 = b.const_i32(7 << 22), b.const_i32(-(1 << 31)), b.const_f32(2.0**126)
        for i in range(UNIT):
            at = 4 * i  # the nibble's lowest bit
            mag = b.shli(word, b.const_i32(22 - at)) if at <= 22 else b.shrui(word, b.const_i32(at - 22))
            sign = b.shli(word, b.const_i32(28 - at)) if at < 28 else word
            bits = b.ori(b.andi(mag, mag_mask), b.andi(sign, sign_mask))
            out.append(_mulf(b, b.bitcast(b.f32, bits), two126))
        return out

    # units -----------------------------------------------------------------------------------------------
    def store_unit(self, b: Builder, values, dst) -> None:
        """Encode 8 f32 values and store the unit's payload bytes at ``dst``."""
        if self.is_fp4:
            b.store(self.fp4_encode8(b, values), dst, alignment=4)
            return
        words = [self.fp8_encode4(b, values[:4]), self.fp8_encode4(b, values[4:])]
        b.store(_vector_of(b, words, b.i32), dst, alignment=8)

    def load_raw_unit(self, b: Builder, src) -> ir.Value:
        """The payload bytes of the unit at ``src`` (fp4: an i32, fp8: a vector<2xi32>)."""
        if self.is_fp4:
            return b.load(b.i32, src, alignment=4)
        return b.load(b.vector(2, b.i32), src, alignment=8)

    def decode_unit(self, b: Builder, raw) -> list[ir.Value]:
        """The 8 decoded f32 values of a unit's payload bytes (``load_raw_unit``)."""
        if self.is_fp4:
            return self.fp4_decode8(b, raw)
        return self.fp8_decode4(b, _extract(b, raw, 0, b.i32)) + self.fp8_decode4(b, _extract(b, raw, 1, b.i32))

    def load_unit(self, b: Builder, src) -> list[ir.Value]:
        """The 8 decoded f32 values of the unit payload at ``src``."""
        return self.decode_unit(b, self.load_raw_unit(b, src))


# ---- row geometry (the runtime twin of wire_quant.wire_*) -------------------------------------------------


def _scale_offset(b: Builder, codec: WireCodec, elems) -> ir.Value:
    payload = b.divui(elems, b.const_i64(2)) if codec.is_fp4 else elems  # elems is a multiple of 8
    return b.andi(b.addi(payload, b.const_i64(15)), b.const_i64(-16))


def _block_elems(b: Builder, elems, scale_blocks: int) -> ir.Value:
    s = b.const_i64(scale_blocks)
    return b.divui(b.subi(b.addi(elems, s), b.const_i64(1)), s)


class _BlockOf:
    """The scale block ``e // B`` (i32) of element indices ``e`` (i32) by one multiplication instead of a
    division per unit: ``m = 2**32 // B + 1`` once per call, then ``e * m >> 32``. Exact while ``e * B < 2**32``
    (the error ``e * (m - 2**32 / B) / 2**32 < e / 2**32`` stays below ``1 / B``), which rows of at most 2**16
    elements (ep_schema.MAX_HIDDEN_DIM) guarantee."""

    def __init__(self, b: Builder, blk_elems):
        self.b = b
        size = b.maxui(blk_elems, b.const_i64(1))  # (an empty row: B = 0, no element to place)
        self.magic = b.addi(b.divui(b.const_i64(1 << 32), size), b.const_i64(1))

    def __call__(self, e32) -> ir.Value:
        b = self.b
        return b.trunci(b.i32, b.shrui(b.muli(b.extui(b.i64, e32), self.magic), b.const_i64(32)))


def _unit_blocks(b: Builder, e0, blk_elems) -> list[ir.Value]:
    """The scale block (i32) of each of the 8 elements from ``e0`` (i64): one 32-bit division, then a step
    per element (consecutive elements cross at most one block boundary, whatever the block size). Rows
    have at most 2**16 elements (ep_schema.MAX_HIDDEN_DIM), so 32 bits hold every index. (The general path
    of blocks shorter than a unit; units of longer blocks cross at most one boundary.)"""
    e, size = b.trunci(b.i32, e0), b.trunci(b.i32, blk_elems)
    c1 = b.const_i32(1)
    blk = b.divui(e, size)
    nxt = b.muli(b.addi(blk, c1), size)  # the first element of the next block
    blocks = [blk]
    for i in range(1, UNIT):
        cross = b.cmpi("uge", b.addi(e, b.const_i32(i)), nxt)
        blk = b.select(cross, b.addi(blk, c1), blk)
        nxt = b.select(cross, b.addi(nxt, size), nxt)
        blocks.append(blk)
    return blocks


def _cast(b: Builder, value, global_space: bool):
    return b.addrspacecast(b.ptr_global, value) if global_space else value


def _load_raw_unit(b: Builder, src, unit) -> ir.Value:
    """The 16 bytes of bf16 unit ``unit`` (i64) of the row ``src`` (a vector<4xi32>)."""
    return b.load(b.vector(4, b.i32), b.gep(src, b.muli(unit, b.const_i64(16)), b.i8), alignment=16)


def _bf16_values(b: Builder, raw) -> list[ir.Value]:
    """The 8 bf16 elements of a raw unit as f32 values."""
    wide = b.extf(b.vector(UNIT, b.f32), b.bitcast(b.vector(UNIT, b.bf16), raw))
    return [_extract(b, wide, i, b.f32) for i in range(UNIT)]


def _load_bf16_unit(b: Builder, src, unit) -> list[ir.Value]:
    """The 8 bf16 elements of unit ``unit`` (i64) of the row ``src`` as f32 values."""
    return _bf16_values(b, _load_raw_unit(b, src, unit))


def _pick(b: Builder, values, index):
    """``values[index]`` for an i32 ``index`` (the first value past the end)."""
    out = values[0]
    for i, v in enumerate(values[1:], 1):
        out = b.select(b.cmpi("eq", index, b.const_i32(i)), v, out)
    return out


# ---- the amax pass: blocks in parallel ------------------------------------------------------------------

AMAX_LANES = 4  # the fewest lanes per block in the amax pass (their units: 64 contiguous bytes per load)
AMAX_UNROLL = 4  # units each lane loads before reducing them (loads in flight)
CONVERT_ROUNDS = 2  # rounds of units the conversion pass loads before converting them


def amax_lanes(scale_blocks: int, wave: int) -> int:
    """Lanes per block in the amax pass: 4, or more (a power of two) while every block still fits one round
    (e.g. 32 for one block on 32 lanes)."""
    g = AMAX_LANES
    while 2 * g <= wave and 2 * g * scale_blocks <= wave:
        g *= 2
    return g


def _lane_block_amax(b: Builder, src, start, end, last_unit, sub, group: int, whole, packed: bool) -> ir.Value:
    """This lane's share of ``max |x|`` over the elements [start, end) (i32; an empty range gives 0).

    The block's units ``start // 8 ..= (end - 1) // 8`` are strided over the ``group`` lanes (``sub`` in
    [0, group)), AMAX_UNROLL loads at a time (an index past the end is clamped to the last unit: a unit
    counted twice does not change a max). Unless the blocks are whole units (``whole``, warp-uniform: B a
    multiple of 8), the two end units, which may hold elements of the neighbour blocks, are left out of the
    strided loop and masked, the head by the even lanes, the tail by the odd ones (both by a lane alone).
    Unit indices are clamped to ``last_unit`` (an empty block may start past the row). ``packed`` (sm_90):
    the strided units' maxima on the packed bf16 values, two per instruction (|x| by clearing the sign bits,
    ``max.bf16x2``, NaN ignored like fmaxf: the same maximum, bf16 -> f32 being exact and monotonic)."""
    zero = b.const_f32(0.0)
    c0, c1, c3 = b.const_i32(0), b.const_i32(1), b.const_i32(3)
    nonempty = b.cmpi("slt", start, end)
    u_lo = b.minui(b.shrui(start, c3), last_unit)
    u_hi = b.minui(b.shrui(b.select(nonempty, b.subi(end, c1), start), c3), last_unit)
    inner = b.select(whole, c0, c1)  # the end units strided (whole units) or masked apart
    first = b.addi(u_lo, inner)
    top = b.subi(u_hi, inner)  # the strided units: [first, top]
    lower = b.addi(first, sub)
    upper = b.select(nonempty, b.addi(top, c1), lower)

    def strided(t, acc):
        t32 = b.index_cast(b.i32, t)
        units = [b.minui(b.addi(t32, b.const_i32(j * group)), top) for j in range(AMAX_UNROLL)]
        loaded = [_load_raw_unit(b, src, b.extui(b.i64, u)) for u in units]
        if packed:
            bf16s = b.vector(UNIT, b.bf16)
            signless = _one(b, "arith.constant", (), loaded[0].type,
                            {"value": ir.DenseElementsAttr.get_splat(loaded[0].type, _i32_attr(0x7FFF7FFF))})
            mags = [b.bitcast(bf16s, b.andi(raw, signless)) for raw in loaded]
            most = mags[0]
            for m in mags[1:]:
                most = _one(b, "llvm.intr.maxnum", (most, m), bf16s)
            wide = b.extf(b.vector(UNIT, b.f32), most)
            for i in range(UNIT):
                acc = _maxnum(b, acc, _extract(b, wide, i, b.f32))
            return [acc]
        for raw in loaded:
            for x in _bf16_values(b, raw):
                acc = _maxnum(b, acc, _fabs(b, x))
        return [acc]

    (acc,) = b.for_iter(b.index_cast(b.index, lower), b.index_cast(b.index, upper),
                        b.const_index(group * AMAX_UNROLL), [zero], strided)  # fmt: skip

    def masked():
        ends = [u_lo, u_hi] if group == 1 else [b.select(b.cmpi("eq", b.andi(sub, c1), c1), u_hi, u_lo)]
        out = acc
        for u in ends:
            e0 = b.shli(u, c3)
            lo, hi = b.subi(start, e0), b.subi(end, e0)  # element i of the unit is in the block: lo <= i < hi
            for i, x in enumerate(_load_bf16_unit(b, src, b.extui(b.i64, u))):
                ci = b.const_i32(i)
                inside = b.andi(b.cmpi("sle", lo, ci), b.cmpi("sgt", hi, ci))
                out = _maxnum(b, out, b.select(inside, _fabs(b, x), zero))
        return [out]

    return b.if_else(whole, [b.f32], lambda: [acc], masked)[0]


def _block_amaxes(b: Builder, src, elems32, blk32, last_unit, scale_blocks: int, wave: int,
                  packed: bool) -> list[ir.Value]:  # fmt: skip
    """Every block's amax in the owner layout: lane l's register r holds block ``r * wave + l``
    (``ceil(S / wave)`` registers; blocks past S: 0).

    Rounds of ``wave / G`` blocks (G = amax_lanes): lane group g (lanes g*G ..) reduces block
    ``round * wave / G + g``, its lanes' shares combined by an xor butterfly inside the group (log2 G
    shuffles), then one idx shuffle hands each block to its owner lane. A round's blocks share one owner
    register (wave / G divides wave), so the hand-over is one select per register."""
    group = amax_lanes(scale_blocks, wave)
    per_round = wave // group
    rounds = -(-scale_blocks // per_round)
    regs = -(-scale_blocks // wave)
    lane = b.index_cast(b.i32, b.lane_id())
    sub = b.andi(lane, b.const_i32(group - 1))
    grp = b.shrui(lane, b.const_i32(group.bit_length() - 1))
    width = b.const_i32(wave)
    wmask = b.const_i32(wave - 1)
    whole = b.cmpi("eq", b.andi(blk32, b.const_i32(UNIT - 1)), b.const_i32(0))

    def one_round(r, held):
        first = b.muli(r, b.const_i32(per_round))  # the round's first block
        start = b.muli(b.addi(first, grp), blk32)
        end = b.minui(b.addi(start, blk32), elems32)
        amax = _lane_block_amax(b, src, start, end, last_unit, sub, group, whole, packed)
        offset = group // 2
        while offset >= 1:
            amax = _maxnum(b, amax, b.shuffle("xor", amax, b.const_i32(offset), width)[0])
            offset //= 2
        g = b.andi(b.subi(lane, first), wmask)  # the group holding this lane's block of the round, if < wave / G
        v = b.shuffle("idx", amax, b.andi(b.muli(g, b.const_i32(group)), wmask), width)[0]
        mine = b.cmpi("ult", g, b.const_i32(per_round))
        reg = b.shrui(first, b.const_i32(wave.bit_length() - 1))
        return [b.select(b.andi(mine, b.cmpi("eq", reg, b.const_i32(i))), v, h) for i, h in enumerate(held)]

    def step(r, *held):
        return one_round(b.index_cast(b.i32, r), held)

    return b.for_iter(b.const_index(0), b.const_index(rounds), b.const_index(1), [b.const_f32(0.0)] * regs, step)


# ---- the helpers -----------------------------------------------------------------------------------------


def _by_block_length(b: Builder, blk_elems, loop, whole_units, two_blocks, per_element) -> None:
    """``loop(body)`` with the body for the row's block length B (warp-uniform branches; one path when the
    row length is a constant): ``whole_units`` (B a multiple of 8: a unit lies in one block), ``two_blocks``
    (B > 8: a unit lies in at most two), ``per_element`` (B < 8)."""
    c8 = b.const_i64(UNIT)
    aligned = b.cmpi("eq", b.andi(blk_elems, b.const_i64(UNIT - 1)), b.const_i64(0))
    long_blocks = b.cmpi("uge", blk_elems, c8)

    def unaligned():
        return b.if_else(long_blocks, [], lambda: loop(two_blocks), lambda: loop(per_element))

    b.if_else(b.andi(aligned, long_blocks), [], lambda: loop(whole_units), unaligned)


def _always_inlined(helper: Helper) -> Helper:
    """``helper`` marked alwaysinline: the K-source and two-path loops make these helpers larger than LLVM's
    inlining threshold once a module calls them twice (the constant-rows and ``_anyhidden`` kernels), and a
    call keeps the kernel from its registers (AMDGPU: the callee's conservative VGPR count and scratch)."""

    def build(block: ir.Block, before: ir.Operation) -> ir.Operation:
        fn = helper.build(block, before)
        fn.attributes["passthrough"] = ir.ArrayAttr.get([ir.StringAttr.get("alwaysinline")])
        return fn

    return Helper(helper.symbol, build)



def quantize_row(symbol: str, function, codec: WireCodec, scale_blocks: int, wave: int, global_space: bool) -> Helper:
    # One warp. Direct cast: lane-strided units, load 8 bf16, saturate + convert, store the unit's bytes.
    # Blockwise (S blocks of B = ceil(elems / S)): (1) the blocks' amaxes, blocks in parallel across the warp
    # (_block_amaxes: lane l ends with blocks r * wave + l, r < ceil(S / wave) registers); (2) each lane's
    # blocks' scale (amax / max or 1) stored after the payload, block 0's negated when any block of the row
    # was scaled (a ballot), and their multipliers (max / amax or 1); (3) warp-uniform rounds of
    # lane-strided units (coalesced stores), two rounds a step with their loads first, the values
    # multiplied, converted and stored. A unit of a block of B >= 8 elements lies in one block (B a multiple
    # of 8) or at most two (b0 = its first element's, b0 + 1): one or two multipliers read from their owner
    # lanes, an idx shuffle each (fetcher), and then one select per element. Shorter blocks (B < 8: rows
    # of fewer than 8 * S elements): each element's multiplier read alone (a shuffle per owner register).
    # Plain stores to the peer's row: the caller's release fence publishes them.
    @function(symbol, "ptr ptr i64 i32")
    def helper(b, dst, src, elems, pe):
        peer = _cast(b, mori_shmem.ptr(dst, pe, **b.at()), global_space)
        src = _cast(b, src, global_space)
        lane32 = b.index_cast(b.i32, b.lane_id())
        lane = b.extui(b.i64, lane32)
        nunits = b.divui(elems, b.const_i64(UNIT))
        ubytes = b.const_i64(codec.unit_bytes())
        if scale_blocks == 0:
            with b.for_(b.index_cast(b.index, lane), b.index_cast(b.index, nunits), b.const_index(wave)) as u:
                u64 = b.index_cast(b.i64, u)
                codec.store_unit(b, _load_bf16_unit(b, src, u64), b.gep(peer, b.muli(u64, ubytes), b.i8))
            b.return_()
            return
        regs = -(-scale_blocks // wave)
        blk_elems = _block_elems(b, elems, scale_blocks)
        elems32, blk32 = b.trunci(b.i32, elems), b.trunci(b.i32, blk_elems)
        zero = b.const_f32(0.0)
        last_unit = b.subi(b.trunci(b.i32, nunits), b.const_i32(1))
        amaxes = b.if_else(b.cmpi("ne", nunits, b.const_i64(0)), [b.f32] * regs,
                           lambda: _block_amaxes(b, src, elems32, blk32, last_unit, scale_blocks, wave, codec.nvptx),
                           lambda: [zero] * regs)  # fmt: skip
        qmax = b.const_f32(codec.qmax)
        one = b.const_f32(1.0)
        scaled = [_cmpf(b, "ogt", a, qmax) for a in amaxes]
        any_lane = scaled[0]
        for s in scaled[1:]:
            any_lane = b.ori(any_lane, s)
        any_scaled = b.cmpi("ne", b.ballot(any_lane, wave), b.const_i64(0))
        soff = _scale_offset(b, codec, elems)
        mults = []
        for r, (a, on) in enumerate(zip(amaxes, scaled)):
            blk = b.addi(b.const_i64(r * wave), lane)
            scale = b.select(on, _divf(b, a, qmax), one)
            scale = b.select(b.andi(any_scaled, b.cmpi("eq", blk, b.const_i64(0))), _negf(b, scale), scale)
            mults.append(b.select(on, _divf(b, qmax, a), one))
            with b.if_(b.cmpi("ult", blk, b.const_i64(scale_blocks))):
                b.store(scale, b.gep(peer, b.addi(soff, b.muli(blk, b.const_i64(4))), b.i8), alignment=4)
        width = b.const_i32(wave)
        wmask = b.const_i32(wave - 1)
        wave_bits = b.const_i32(wave.bit_length() - 1)
        block_of = _BlockOf(b, blk_elems)

        def rounds(body):
            # CONVERT_ROUNDS rounds of units a step, their loads first (in flight together)
            span = CONVERT_ROUNDS * wave
            with b.for_(b.const_index(0), b.index_cast(b.index, nunits), b.const_index(span)) as ux:
                units = []
                for r in range(CONVERT_ROUNDS):
                    u0 = b.addi(b.index_cast(b.i64, ux), b.const_i64(r * wave))
                    u = b.addi(u0, lane)
                    inside = b.cmpi("ult", u, nunits)
                    u_safe = b.select(inside, u, b.const_i64(0))  # a lane past the end reads unit 0, stores nothing
                    units.append((u0, u, inside, u_safe, _load_raw_unit(b, src, u_safe)))
                for u0, u, inside, u_safe, raw in units:
                    scaled_values = body(b.trunci(b.i32, u0), u_safe, _bf16_values(b, raw))
                    with b.if_(inside):
                        codec.store_unit(b, scaled_values, b.gep(peer, b.muli(u, ubytes), b.i8))

        def fetcher(u0):
            """The multiplier of block ``bk`` (i32) from its owner lane, for the blocks of the round from unit u0
            (B >= 8). With several owner registers, each lane offers the one of the round's block it owns: the
            round's blocks (from its first element's, bmin) are at most ``wave`` consecutive ones (8 * wave
            elements), so lane l owns exactly one of them, ``bmin + ((l - bmin) mod wave)``: one idx shuffle."""
            offered = mults[0]
            if regs > 1:
                bmin = block_of(b.muli(u0, b.const_i32(UNIT)))
                mine = b.addi(bmin, b.andi(b.subi(lane32, bmin), wmask))
                offered = _pick(b, mults, b.shrui(mine, wave_bits))
            return lambda bk: b.shuffle("idx", offered, b.andi(bk, wmask), width)[0]

        def one_block(u0, u_safe, values):  # B a multiple of 8: each unit inside one block
            m0 = fetcher(u0)(block_of(b.trunci(b.i32, b.muli(u_safe, b.const_i64(UNIT)))))
            return [_mulf(b, x, m0) for x in values]

        def two_blocks(u0, u_safe, values):
            e0 = b.trunci(b.i32, b.muli(u_safe, b.const_i64(UNIT)))
            b0 = block_of(e0)
            b1 = b.addi(b0, b.const_i32(1))
            split = b.subi(b.muli(b1, blk32), e0)  # elements i < split are in b0, the others in b0 + 1
            fetch = fetcher(u0)
            m0, m1 = fetch(b0), fetch(b1)
            return [_mulf(b, x, b.select(b.cmpi("sgt", split, b.const_i32(i)), m0, m1)) for i, x in enumerate(values)]

        def per_element(u0, u_safe, values):
            out = []
            for x, blk in zip(values, _unit_blocks(b, b.muli(u_safe, b.const_i64(UNIT)), blk_elems)):
                owner, reg = b.andi(blk, wmask), b.shrui(blk, wave_bits)
                mult = b.shuffle("idx", mults[0], owner, width)[0]
                for r in range(1, regs):
                    other = b.shuffle("idx", mults[r], owner, width)[0]
                    mult = b.select(b.cmpi("eq", reg, b.const_i32(r)), other, mult)
                out.append(_mulf(b, x, mult))
            return out

        _by_block_length(b, blk_elems, lambda body: rounds(body) or [], one_block, two_blocks, per_element)
        b.return_()

    return _always_inlined(helper)


def accumulate_quantized_rows(symbol: str, function, codec: WireCodec, scale_blocks: int, k: int, wave: int,
                              global_space: bool) -> Helper:  # fmt: skip
    # One warp, lane-strided units of the slice [first, first + count): per unit, the K sources' payloads
    # loaded first (K loads in flight), decoded, multiplied by |scale[block]| for a source whose scale[0] < 0
    # (the factor 1.0 for the others), summed in fp32 in source order from 0.0, rounded once to bf16 and
    # stored as one 16-byte vector. When no source's scale[0] is negative (the reader's flag, read once per
    # call: a warp-uniform branch), the loop is the plain cast's, without scales. A unit of a block of B >= 8
    # elements lies in one block (B a multiple of 8: one scale load per source and unit, branch-free: a source
    # without the flag loads scale[0] and uses 1.0) or at most two (two loads under a per-source warp-uniform
    # branch on the flag, one select per element); shorter blocks: a scale load per element (same branch).
    # No ordering of its own: the caller acquired the sources.
    @function(symbol, "ptr i64 i64 i64" + " ptr" * k)
    def helper(b, out, first, count, elems, *sources):
        out = _cast(b, out, global_space)
        sources = [_cast(b, s, global_space) for s in sources]
        lane = b.index_cast(b.i64, b.lane_id())
        unit = b.const_i64(UNIT)
        ubytes = b.const_i64(codec.unit_bytes())
        u_first = b.divui(first, unit)
        u_end = b.divui(b.addi(first, count), unit)
        one = b.const_f32(1.0)

        def units(body):
            """The loop over the lane's units; ``body(u, raw payloads)`` returns the unit's 8 sums."""
            lower = b.index_cast(b.index, b.addi(u_first, lane))
            with b.for_(lower, b.index_cast(b.index, u_end), b.const_index(wave)) as ux:
                u = b.index_cast(b.i64, ux)
                raws = [codec.load_raw_unit(b, b.gep(s, b.muli(u, ubytes), b.i8)) for s in sources]
                packed = b.truncf(b.vector(UNIT, b.bf16), _vector_of(b, body(u, raws), b.f32))
                b.store(b.bitcast(b.vector(4, b.i32), packed), b.gep(out, b.muli(u, b.const_i64(16)), b.i8),
                        alignment=16)  # fmt: skip

        def summed(products):
            """Each source's 8 products (an iterable, source order) summed in fp32 from 0.0."""
            acc = [b.const_f32(0.0)] * UNIT
            for vals in products:  # (a generator: each source's products summed as they come)
                acc = [b.addf(a, v) for a, v in zip(acc, vals)]
            return acc

        def plain(u, raws):
            return summed(codec.decode_unit(b, raw) for raw in raws)

        if not scale_blocks:
            units(plain)
            b.return_()
            return
        soff = _scale_offset(b, codec, elems)
        blk_elems = _block_elems(b, elems, scale_blocks)
        blk32 = b.trunci(b.i32, blk_elems)
        block_of = _BlockOf(b, blk_elems)
        active = [_cmpf(b, "olt", b.load(b.f32, b.gep(s, soff, b.i8), alignment=4), b.const_f32(0.0))
                  for s in sources]  # fmt: skip
        any_active = active[0]
        for a in active[1:]:
            any_active = b.ori(any_active, a)

        def factor(j, blk):
            """|scale[blk]| of source j when its flag is set, else 1.0 (the load then reads scale[0])."""
            off = b.select(active[j], b.addi(soff, b.muli(b.extui(b.i64, blk), b.const_i64(4))), soff)
            s = _fabs(b, b.load(b.f32, b.gep(sources[j], off, b.i8), alignment=4))
            return b.select(active[j], s, one)

        def one_block(u, raws):  # B a multiple of 8: each unit inside one block
            b0 = block_of(b.trunci(b.i32, b.muli(u, unit)))

            def products():
                for j, raw in enumerate(raws):
                    f0 = factor(j, b0)
                    yield [_mulf(b, v, f0) for v in codec.decode_unit(b, raw)]

            return summed(products())

        def branched_factors(j, scales):
            """Source j's 8 factors: ``scales()`` (its loads) under a warp-uniform branch on its flag, else 1.0.
            (The rare paths: a branch per source keeps the compiler from hoisting every source's scale loads at
            once, which took sm_90's kernels past 128 registers.)"""
            return b.if_else(active[j], [b.f32] * UNIT, scales, lambda: [one] * UNIT)

        def scaled_sums(raws, factors_of):
            def products():
                for j, raw in enumerate(raws):
                    factors = branched_factors(j, lambda j=j: factors_of(j))
                    yield [_mulf(b, v, f) for v, f in zip(codec.decode_unit(b, raw), factors)]

            return summed(products())

        def scale_of(j, blk):
            return _fabs(b, b.load(b.f32, b.gep(sources[j], b.addi(soff, b.muli(b.extui(b.i64, blk), b.const_i64(4))),
                                                b.i8), alignment=4))  # fmt: skip

        def two_blocks(u, raws):
            e0 = b.trunci(b.i32, b.muli(u, unit))
            b0 = block_of(e0)
            b1 = b.addi(b0, b.const_i32(1))
            split = b.subi(b.muli(b1, blk32), e0)  # elements i < split are in b0, the others in b0 + 1
            crosses = b.cmpi("slt", split, b.const_i32(UNIT))

            def factors(j):
                f0 = scale_of(j, b0)
                f1 = scale_of(j, b.select(crosses, b1, b0))  # (b0 + 1 may be past the row's S scales)
                return [b.select(b.cmpi("sgt", split, b.const_i32(i)), f0, f1) for i in range(UNIT)]

            return scaled_sums(raws, factors)

        def per_element(u, raws):  # B < 8: a unit holds up to 8 blocks, a scale load per element
            blocks = _unit_blocks(b, b.muli(u, unit), blk_elems)
            return scaled_sums(raws, lambda j: [scale_of(j, blk) for blk in blocks])

        def scaled():
            _by_block_length(b, blk_elems, lambda body: units(body) or [], one_block, two_blocks, per_element)
            return []

        b.if_else(any_active, [], scaled, lambda: units(plain) or [])
        b.return_()

    return _always_inlined(helper)
