"""The wire-quantization helpers' generated IR run on the CPU, bit for bit against ops/quant_reference.py.

``mori-comm-to-calls`` (chip sm_90) turns quantize_row / accumulate_quantized_rows into helper functions;
this test interprets those functions' IR (arith, scf, llvm memory ops, gpu.lane_id / gpu.shuffle and the two
NVVM fp8 conversions) one warp at a time, every lane in lockstep under an execution mask, and compares the
wire rows and the bf16 sums with the model. It checks the lane / block partition of the helpers (the amax
rounds, the owner-lane hand-over, the multiplier and scale look-ups, the three block-length paths, the
scale flag), at 32 and 64 lanes (the same IR shape the AMDGPU targets get), for block lengths that do and
do not divide the row into whole units, with and without scaled blocks. It also checks that every shuffle
runs with all lanes active and that no load or store leaves its row.

What it does not check: LLVM's and the backends' code generation, and the conversion instructions
themselves (modelled here by the reference's RNE casts: sm_90 ``cvt.rn.satfinite.e4m3x2.f32`` and
``cvt.rn.f16x2.e4m3x2``, exact for the finite values used); the GPU tests (test/python/gpu/) run those.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from mori_compiler._mlir import ir, new_context
from mori_compiler.dialects import registry
from mori_compiler.ops import quant_reference as qr
from mori_compiler.ops.reference import from_bits, to_bits
from mori_compiler.pass_pipeline import build_pass_manager
from mori_compiler.wire_quant import wire_row_bytes, wire_scale_offset

# ---- a lockstep interpreter of the helpers' IR -----------------------------------------------------------

_CMPI = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge", 6: "ult", 7: "ule", 8: "ugt", 9: "uge"}
_CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal}
_UINT = {1: np.bool_, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_GEP_DYNAMIC = -(2**31)


def _scalar_kind(t: ir.Type) -> tuple[str, int]:
    """(kind, bits) of a scalar type: int (iN, index), f32, f16, bf16, ptr."""
    if isinstance(t, ir.IntegerType):
        return "int", t.width
    if isinstance(t, ir.IndexType):
        return "int", 64
    if isinstance(t, ir.F32Type):
        return "f32", 32
    if isinstance(t, ir.F16Type):
        return "f16", 16
    if isinstance(t, ir.BF16Type):
        return "bf16", 16
    if "ptr" in str(t):
        return "ptr", 64
    raise NotImplementedError(f"type {t}")


def _kind(t: ir.Type) -> tuple[str, int, int | None]:
    """(kind, bits, vector length or None)."""
    if isinstance(t, ir.VectorType):
        return (*_scalar_kind(t.element_type), t.shape[0])
    return (*_scalar_kind(t), None)


def _dtype(kind: str, bits: int):
    return {"int": _UINT.get(bits), "f32": np.float32, "f16": np.float16, "bf16": np.uint16, "ptr": np.uint64}[kind]


def _to_bytes(value: np.ndarray, kind: str) -> np.ndarray:
    """[W, n] uint8 of each lane's value."""
    a = np.ascontiguousarray(value)
    if kind == "int" and a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return a.reshape(a.shape[0], -1).view(np.uint8)


def _from_bytes(raw: np.ndarray, kind: str, bits: int, n: int | None) -> np.ndarray:
    a = np.ascontiguousarray(raw).view(_dtype(kind, bits))
    return a.reshape(a.shape[0]) if n is None else a.reshape(a.shape[0], n)


class Memory:
    """A flat byte heap of named buffers; every access must stay inside one buffer."""

    def __init__(self):
        self.data = np.zeros(1 << 12, dtype=np.uint8)
        self.buffers: list[tuple[int, int, str]] = []
        self.top = 4096  # (address 0 stays unmapped)

    def alloc(self, name: str, content: np.ndarray) -> int:
        raw = np.ascontiguousarray(content).view(np.uint8).reshape(-1)
        base = -(-self.top // 256) * 256
        if base + raw.size > self.data.size:
            self.data = np.concatenate([self.data, np.zeros(base + raw.size + 4096, dtype=np.uint8)])
        self.data[base:base + raw.size] = raw
        self.buffers.append((base, base + raw.size, name))
        self.top = base + raw.size
        return base

    def read(self, name: str, nbytes: int) -> np.ndarray:
        base = next(b for b, _, n in self.buffers if n == name)
        return self.data[base:base + nbytes].copy()

    def _check(self, addrs: np.ndarray, size: int, what: str) -> None:
        for a in np.unique(addrs):
            if not any(lo <= a and a + size <= hi for lo, hi, _ in self.buffers):
                raise AssertionError(f"{what} of {size} bytes at {a:#x} is outside every buffer {self.buffers}")
            if a % size and size in (2, 4, 8, 16):
                raise AssertionError(f"{what} of {size} bytes at {a:#x} is misaligned")

    def load(self, addrs: np.ndarray, size: int) -> np.ndarray:
        self._check(addrs, size, "load")
        idx = addrs.astype(np.int64)[:, None] + np.arange(size)
        return self.data[idx]

    def store(self, addrs: np.ndarray, raw: np.ndarray) -> None:
        self._check(addrs, raw.shape[1], "store")
        idx = (addrs.astype(np.int64)[:, None] + np.arange(raw.shape[1])).reshape(-1)
        if np.unique(idx).size != idx.size:
            raise AssertionError("two lanes store to the same byte in one store")
        self.data[idx] = raw.reshape(-1)


def _fp8_encode(x: np.ndarray) -> np.ndarray:
    """sm_90 cvt.rn.satfinite.e4m3x2.f32 of one value per element (NaN -> 0x7f)."""
    codes = qr.fp8_direct_cast(np.clip(x, -448, 448), "fp8_e4m3fn")
    return np.where(np.isnan(x), np.uint8(0x7F), codes).astype(np.uint8)


class Warp:
    """Runs one func.func of the helpers' IR for ``wave`` lanes in lockstep."""

    def __init__(self, func: ir.Operation, wave: int, memory: Memory):
        self.func, self.wave, self.mem = func, wave, memory
        self.env: dict = {}
        self.lanes = np.arange(wave)
        self.executed: Counter = Counter()  # warp-level executions per op name (a cost measure: bench scripts)

    def run(self, *args) -> None:
        block = self.func.regions[0].blocks[0]
        for arg, value in zip(block.arguments, args):
            kind, bits, n = _kind(arg.type)
            self.env[arg] = np.full(self.wave, value, dtype=_dtype(kind, bits))
        self.block(block, np.ones(self.wave, dtype=bool))

    def v(self, value):
        return self.env[value]

    def block(self, block, mask):
        for op in block.operations:
            op = op.operation
            name = op.name
            self.executed[name] += 1
            if name in ("scf.yield", "func.return"):
                return [self.v(o) for o in op.operands]
            results = self.op(op, mask)
            for r, val in zip(op.results, results):
                self.env[r] = val
        return []

    def op(self, op, mask):  # noqa: C901 (one dispatch)
        name = op.name
        ops = [self.v(o) for o in op.operands]
        rt = op.results[0].type if len(op.results) else None
        if name == "arith.constant":
            kind, bits, n = _kind(rt)
            attr = op.attributes["value"]
            if n is not None:  # a splat vector
                value = ir.IntegerAttr(ir.DenseElementsAttr(attr).get_splat_value()).value & ((1 << bits) - 1)
                return [np.full((self.wave, n), value, dtype=_dtype(kind, bits))]
            value = ir.FloatAttr(attr).value if kind in ("f32", "f16") else ir.IntegerAttr(attr).value
            if kind == "int":
                value &= (1 << bits) - 1
            return [np.full(self.wave, value, dtype=_dtype(kind, bits))]
        if name in ("arith.addi", "arith.subi", "arith.muli", "arith.andi", "arith.ori", "arith.xori"):
            fn = {"addi": np.add, "subi": np.subtract, "muli": np.multiply, "andi": np.bitwise_and,
                  "ori": np.bitwise_or, "xori": np.bitwise_xor}[name[6:]]  # fmt: skip
            if ops[0].dtype == np.bool_ and name[6:] in ("addi", "subi", "muli"):
                raise NotImplementedError(name)
            with np.errstate(over="ignore"):
                return [fn(ops[0], ops[1]).astype(ops[0].dtype)]
        if name in ("arith.shli", "arith.shrui"):
            bits = ops[0].dtype.itemsize * 8
            assert (ops[1] < bits).all(), f"{name} by {ops[1].max()} of a {bits}-bit value"
            fn = np.left_shift if name.endswith("shli") else np.right_shift
            return [fn(ops[0], ops[1].astype(ops[0].dtype)).astype(ops[0].dtype)]
        if name in ("arith.divui", "arith.remui"):
            den = np.where(mask, ops[1], 1)
            assert (den[mask] != 0).all(), f"{name} by zero"
            fn = np.floor_divide if name.endswith("divui") else np.remainder
            return [fn(ops[0], den.astype(ops[0].dtype)).astype(ops[0].dtype)]
        if name == "llvm.intr.maxnum":
            if _kind(rt)[0] == "bf16":  # (bit patterns: through f32, exact)
                wide = [(o.astype(np.uint32) << 16).view(np.float32) for o in ops]
                return [(np.fmax(*wide).view(np.uint32) >> 16).astype(np.uint16)]
            return [np.fmax(ops[0], ops[1])]
        if name in ("arith.maxui", "arith.minui"):
            return [(np.maximum if name.endswith("maxui") else np.minimum)(ops[0], ops[1])]
        if name == "arith.cmpi":
            pred = _CMPI[ir.IntegerAttr(op.attributes["predicate"]).value]
            a, c = ops
            if pred[0] == "s":
                sd = _SINT[a.dtype.itemsize * 8]
                a, c, pred = a.view(sd), c.view(sd), pred[1:]
            elif pred[0] == "u":
                pred = pred[1:]
            fn = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                  "ge": np.greater_equal}[pred]  # fmt: skip
            return [fn(a, c)]
        if name == "arith.cmpf":
            fn = _CMPF[ir.IntegerAttr(op.attributes["predicate"]).value]
            with np.errstate(invalid="ignore"):
                return [fn(ops[0], ops[1])]
        if name == "arith.select":
            c = ops[0] if ops[1].ndim == 1 else ops[0][:, None]
            return [np.where(c, ops[1], ops[2])]
        if name in ("arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui"):
            kind, bits, _ = _kind(rt)
            src_bits = 1 if ops[0].dtype == np.bool_ else ops[0].dtype.itemsize * 8
            x = ops[0].astype(np.uint64)
            if name == "arith.index_cast" and bits > src_bits:  # sign extension
                x = ops[0].view(_SINT[src_bits]).astype(np.int64).view(np.uint64)
            if bits == 1:
                return [(x & 1).astype(bool)]
            return [(x & np.uint64((1 << bits) - 1)).astype(_UINT[bits])]
        if name == "arith.extf":
            kind, bits, n = _kind(rt)
            sk = _kind(op.operands[0].type)[0]
            if sk == "bf16":
                return [(ops[0].astype(np.uint32) << 16).view(np.float32)]
            return [ops[0].astype(np.float32)]
        if name == "arith.truncf":
            kind = _kind(rt)[0]
            assert kind == "bf16", rt
            assert not np.isnan(ops[0][mask]).any()
            return [to_bits(ops[0], "bf16")]
        if name in ("arith.mulf", "arith.divf", "arith.addf"):
            fn = {"mulf": np.multiply, "divf": np.divide, "addf": np.add}[name[6:]]
            with np.errstate(all="ignore"):
                return [fn(ops[0], ops[1]).astype(np.float32)]
        if name == "arith.negf":
            return [(-ops[0]).astype(np.float32)]
        if name == "llvm.bitcast":
            kind, bits, n = _kind(rt)
            sk = _kind(op.operands[0].type)[0]
            return [_from_bytes(_to_bytes(ops[0], sk), kind, bits, n)]
        if name == "llvm.getelementptr":
            raw = list(ir.DenseI32ArrayAttr(op.attributes["rawConstantIndices"]))
            elem = ir.TypeAttr(op.attributes["elem_type"]).value
            size = {"i8": 1, "bf16": 2, "f32": 4, "i32": 4, "i64": 8}[str(elem)]
            if raw[0] == _GEP_DYNAMIC:
                idx = ops[1]
                sd = _SINT[idx.dtype.itemsize * 8]
                index = idx.view(sd).astype(np.int64)
            else:
                index = np.full(self.wave, raw[0], dtype=np.int64)
            return [(ops[0].astype(np.int64) + index * size).astype(np.uint64)]
        if name == "llvm.load":
            kind, bits, n = _kind(rt)
            size = bits // 8 * (n or 1)
            raw = np.zeros((self.wave, size), dtype=np.uint8)
            if mask.any():
                raw[mask] = self.mem.load(ops[0][mask], size)
            return [_from_bytes(raw, kind, bits, n)]
        if name == "llvm.store":
            kind = _kind(op.operands[0].type)[0]
            if mask.any():
                self.mem.store(ops[1][mask], _to_bytes(ops[0], kind)[mask])
            return []
        if name == "llvm.mlir.undef":
            kind, bits, n = _kind(rt)
            return [np.zeros((self.wave, n) if n else self.wave, dtype=_dtype(kind, bits))]
        if name == "llvm.extractelement":
            i = int(ops[1][0])
            assert (ops[1] == i).all()
            return [ops[0][:, i].copy()]
        if name == "llvm.insertelement":
            i = int(ops[2][0])
            out = ops[0].copy()
            out[:, i] = ops[1]
            return [out]
        if name == "gpu.lane_id":
            return [self.lanes.astype(np.uint64)]
        if name == "gpu.shuffle":
            assert mask.all(), "a shuffle under a divergent mask"
            mode = str(op.attributes["mode"])
            off = ops[1].astype(np.int64)
            assert (ops[2] == self.wave).all()
            src = self.lanes ^ off if "xor" in mode else off
            assert "xor" in mode or "idx" in mode, mode
            assert ((0 <= src) & (src < self.wave)).all()
            return [ops[0][src], np.ones(self.wave, dtype=bool)]
        if name == "mori_shmem.ptr":
            return [ops[0]]
        if name == "nvvm.convert.f32x2.to.f8x2":  # (a, b): a in the upper byte
            return [(_fp8_encode(ops[0]).astype(np.uint16) << 8 | _fp8_encode(ops[1])).astype(np.uint16)]
        if name == "nvvm.convert.f8x2.to.f16x2":
            return [from_bits(ops[0], "fp8_e4m3fn").astype(np.float16)]
        if name == "rocdl.cvt.pk.fp8.f32":  # (lo, hi, old) {wordSel}: two fp8 bytes into a half of old
            lo, hi, old = ops
            shift = 16 if ir.BoolAttr(op.attributes["wordSel"]).value else 0
            pair = (_fp8_encode(lo).astype(np.uint32) | _fp8_encode(hi).astype(np.uint32) << 8) << shift
            return [(old & np.uint32(~(0xFFFF << shift) & 0xFFFFFFFF)) | pair]
        if name == "rocdl.cvt.pk.f32.fp8":  # (word) {wordSel}: the two fp8 bytes of a half
            shift = 16 if ir.BoolAttr(op.attributes["wordSel"]).value else 0
            pair = [(ops[0] >> np.uint32(shift + 8 * i)) & np.uint32(0xFF) for i in (0, 1)]
            return [np.stack([from_bits(x.astype(np.uint8), "fp8_e4m3fn") for x in pair], axis=1)]
        if name == "rocdl.cvt.scalef32.pk.fp4.f32":  # (old, a, b, scale) {dstSelIndex j}: byte j = a | b << 4
            old, a, c, scale = ops
            assert (scale == 1).all()
            j = ir.IntegerAttr(op.attributes["dstSelIndex"]).value
            byte = (qr._fp4_codes(a).astype(np.uint32) | qr._fp4_codes(c).astype(np.uint32) << 4) << (8 * j)
            return [(old & np.uint32(~(0xFF << (8 * j)) & 0xFFFFFFFF)) | byte]
        if name == "rocdl.cvt.scalef32.pk.f32.fp4":  # (word, scale) {srcSelIndex j}: byte j's two codes
            word, scale = ops
            assert (scale == 1).all()
            j = ir.IntegerAttr(op.attributes["srcSelIndex"]).value
            codes = [(word >> np.uint32(8 * j + 4 * i)) & np.uint32(0xF) for i in (0, 1)]
            vals = [np.where(c & 8, -qr.FP4_E2M1_VALUES[c & 7], qr.FP4_E2M1_VALUES[c & 7]) for c in codes]
            return [np.stack(vals, axis=1).astype(np.float32)]
        if name == "scf.if":
            cond = ops[0]
            outs = []
            for region, m in zip(op.regions, (mask & cond, mask & ~cond)):
                if len(region.blocks) and m.any():
                    outs.append(self.block(region.blocks[0], m))
                else:
                    outs.append(None)
            results = []
            for i, r in enumerate(op.results):
                t, e = (o[i] if o is not None else None for o in outs)
                if t is None:
                    t = e
                if e is None:
                    e = t
                c = cond if t.ndim == 1 else cond[:, None]
                results.append(np.where(c, t, e))
            return results
        if name == "scf.for":
            lb, ub, step, *carried = ops
            body = op.regions[0].blocks[0]
            iv = lb.astype(np.int64)
            ub, step = ub.astype(np.int64), step.astype(np.int64)
            carried = [c.copy() for c in carried]
            active = mask & (iv < ub)
            while active.any():
                self.env[body.arguments[0]] = iv.astype(np.uint64)
                for a, c in zip(body.arguments[1:], carried):
                    self.env[a] = c
                new = self.block(body, active)
                for i, n in enumerate(new):
                    c = active if n.ndim == 1 else active[:, None]
                    carried[i] = np.where(c, n, carried[i])
                iv = np.where(active, iv + step, iv)
                active = active & (iv < ub)
            return carried
        raise NotImplementedError(f"op {name}")


# ---- the helpers under test ------------------------------------------------------------------------------

_MODULE = """module attributes {{gpu.container_module}} {{
  gpu.module @m {{
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {{
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {{format = "{fmt}", scale_blocks = {s} : i64}} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      "mori_comm.accumulate_quantized_rows"(%d, %n, %n, %n, {srcs}) {{format = "{fmt}", scale_blocks = {s} : i64}} : (!llvm.ptr, i64, i64, i64, {types}) -> ()
      gpu.return
    }}
  }}
}}"""

_CACHE: dict = {}


def _helpers(fmt: str, s: int, k: int, wave: int, chip: str = "sm_90"):
    """(quantize_row, accumulate_quantized_rows) func.func ops of the lowering for ``chip``."""
    key = (fmt, s, k, wave, chip)
    if key not in _CACHE:
        ctx = new_context()
        registry.load_all(ctx)
        with ctx:
            text = _MODULE.format(fmt=fmt, s=s, srcs=", ".join(["%s"] * k), types=", ".join(["!llvm.ptr"] * k))
            module = ir.Module.parse(text)
            build_pass_manager(f"mori-comm-to-calls{{wave-size={wave} chip={chip}}}", ctx).run(module.operation)
            funcs = {}
            for op in module.body.operations[0].regions[0].blocks[0].operations:
                op = op.operation
                if op.name == "func.func":
                    funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
        tag = "e2m1" if fmt == "fp4_e2m1" else "e4m3fn"
        _CACHE[key] = (ctx, module, funcs[f"__mori_comm_quantize_row_{tag}_s{s}"],
                       funcs[f"__mori_comm_accumulate_quantized_rows_{tag}_s{s}_k{k}"])  # fmt: skip
    return _CACHE[key][2:]


def _model_quantize(x: np.ndarray, fmt: str, s: int) -> tuple[np.ndarray, np.ndarray]:
    if fmt == "fp4_e2m1":
        return qr.fp4_blockwise_quantize(x[None], s)
    return qr.fp8_blockwise_quantize(x[None], "fp8_e4m3fn", s)


def _wire_row(x: np.ndarray, fmt: str, s: int) -> np.ndarray:
    """The wire row bytes the model writes (payload, scales at the aligned offset, zero padding)."""
    quant = "fp4_blockwise" if fmt == "fp4_e2m1" else "fp8_blockwise"
    payload, scales = _model_quantize(x, fmt, s)
    row = np.zeros(wire_row_bytes(quant, x.size, s), dtype=np.uint8)
    row[:payload.shape[1]] = payload[0]
    off = wire_scale_offset(quant, x.size)
    row[off:off + 4 * s] = scales[0].astype(np.float32).view(np.uint8)
    return row


def _bf16_row(rng, elems: int, fmt: str, s: int, planted: float) -> np.ndarray:
    """A random bf16-exact row; with ``planted`` > 0, ±planted at a random element of each non-empty block."""
    qmax = 6.0 if fmt == "fp4_e2m1" else 448.0
    x = np.clip(rng.standard_normal(elems).astype(np.float32) * 2, -0.9 * qmax, 0.9 * qmax)
    x = from_bits(to_bits(x, "bf16"), "bf16")
    if planted:
        blk = qr.block_size(elems, s)
        for b0 in range(0, elems, blk):
            i = rng.integers(b0, min(b0 + blk, elems))
            x[i] = planted * rng.choice([-1.0, 1.0]) * rng.uniform(1.0, 3.0)
        x = from_bits(to_bits(x, "bf16"), "bf16")
    return x


def _quantize(x: np.ndarray, fmt: str, s: int, wave: int, chip: str) -> np.ndarray:
    quant_fn, _ = _helpers(fmt, s, 1, wave, chip)
    quant = "fp4_blockwise" if fmt == "fp4_e2m1" else "fp8_blockwise"
    mem = Memory()
    src = mem.alloc("src", to_bits(x, "bf16"))
    dst = mem.alloc("dst", np.full(wire_row_bytes(quant, x.size, s), 0xA5, dtype=np.uint8))
    Warp(quant_fn, wave, mem).run(dst, src, x.size, 0)
    return mem.read("dst", wire_row_bytes(quant, x.size, s))


# (elems, S): whole-unit blocks (7168/56: 128, 1024/8, 4096/16, 7168/100: 72, 72/10: 8 and an empty one),
# blocks longer than a unit but not a multiple of it (4096/56: 74, 1040/56: 19, 2048/3), shorter ones
# (112/56: 2, 40/256: 1 and empty ones, 16/3: 6), one block (512/1), and S past the wave (200, 256).
_SHAPES = [(7168, 56), (1024, 8), (4096, 16), (7168, 100), (72, 10), (4096, 56), (1040, 56), (2048, 3),
           (112, 56), (40, 256), (16, 3), (512, 1), (1600, 200), (2048, 256), (1032, 129)]  # fmt: skip


# sm_90's IR at its 32 lanes and at 64, gfx950's (wave 64; ROCDL conversions, f32 amax instead of sm_90's
# packed bf16 one).
_TARGETS = [("sm_90", 32), ("sm_90", 64), ("gfx950", 64)]


@pytest.mark.parametrize(("chip", "wave"), _TARGETS)
@pytest.mark.parametrize(("elems", "s"), _SHAPES)
def test_quantize_row_is_the_model_bit_for_bit(elems, s, chip, wave):
    rng = np.random.default_rng(elems * 1000 + s + wave)
    for fmt, planted in (("fp8_e4m3fn", 0.0), ("fp8_e4m3fn", 448.0), ("fp4_e2m1", 0.0), ("fp4_e2m1", 6.0)):
        if fmt == "fp4_e2m1" and elems * s > 2_000_000:  # (the slowest shapes: fp8 covers their partition)
            continue
        x = _bf16_row(rng, elems, fmt, s, planted)
        if planted and elems >= 64:  # some blocks left unscaled: only every other one planted
            blk = qr.block_size(elems, s)
            for b0 in range(blk, elems, 2 * blk):
                x[b0:b0 + blk] = np.clip(x[b0:b0 + blk], -planted / 2, planted / 2)
        got = _quantize(x, fmt, s, wave, chip)
        want = _wire_row(x, fmt, s)
        quant = "fp4_blockwise" if fmt == "fp4_e2m1" else "fp8_blockwise"
        off = wire_scale_offset(quant, elems)
        pay = -(-elems // 2) if fmt == "fp4_e2m1" else elems
        assert np.array_equal(got[:pay], want[:pay]), (fmt, planted, np.nonzero(got[:pay] != want[:pay])[0][:8])
        gs, ws = got[off:off + 4 * s].view(np.float32), want[off:off + 4 * s].view(np.float32)
        assert np.array_equal(gs.view(np.uint32), ws.view(np.uint32)), (fmt, planted, gs[:4], ws[:4])
        assert (ws[0] < 0) == bool(planted), "the input was meant to (not) scale a block"
        assert (got[pay:off] == 0xA5).all() and (got[off + 4 * s:] == 0xA5).all(), "bytes outside the row's fields"


@pytest.mark.parametrize(("chip", "wave"), _TARGETS)
@pytest.mark.parametrize(("elems", "s"), [(7168, 56), (4096, 56), (1040, 56), (112, 56), (40, 256), (2048, 3),
                                          (1600, 200)])  # fmt: skip
@pytest.mark.parametrize("fmt", ["fp8_e4m3fn", "fp4_e2m1"])
def test_accumulate_quantized_rows_is_the_model_bit_for_bit(fmt, elems, s, chip, wave):
    rng = np.random.default_rng(elems + 7 * s + wave + len(fmt))
    qmax = 6.0 if fmt == "fp4_e2m1" else 448.0
    k = 3
    _, acc_fn = _helpers(fmt, s, k, wave, chip)
    quant = "fp4_blockwise" if fmt == "fp4_e2m1" else "fp8_blockwise"
    for planted in ((0.0, 0.0, 0.0), (qmax, 0.0, qmax), (qmax, qmax, qmax)):
        xs = [_bf16_row(rng, elems, fmt, s, p) for p in planted]
        rows = [_wire_row(x, fmt, s) for x in xs]
        nunits = elems // 8
        u0 = int(rng.integers(0, nunits))
        u1 = int(rng.integers(u0 + 1, nunits + 1))
        first, count = 8 * u0, 8 * (u1 - u0)
        mem = Memory()
        out = mem.alloc("out", np.full(elems * 2, 0x5A, dtype=np.uint8))
        ptrs = [mem.alloc(f"src{j}", r) for j, r in enumerate(rows)]
        Warp(acc_fn, wave, mem).run(out, first, count, elems, *ptrs)
        got = mem.read("out", elems * 2).view(np.uint16)
        total = np.zeros(elems, dtype=np.float32)
        for x in xs:
            if fmt == "fp4_e2m1":
                total += qr.fp4_blockwise_dequantize(*qr.fp4_blockwise_quantize(x[None], s), elems)[0]
            else:
                total += qr.fp8_blockwise_dequantize(*qr.fp8_blockwise_quantize(x[None], "fp8_e4m3fn", s),
                                                     "fp8_e4m3fn")[0]  # fmt: skip
        want = to_bits(total, "bf16")
        assert np.array_equal(got[first:first + count], want[first:first + count]), (planted, first, count)
        untouched = np.r_[got[:first], got[first + count:]]
        assert (untouched == 0x5A5A).all(), "the slice's outside was written"
