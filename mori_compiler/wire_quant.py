"""The combine wire quantization's formats (``quant_type``): the one owner of the wire row layout and of
which target converts which format.

Standard library only, base layer: the building blocks (dialects/mori_comm.py ``quantize_row``,
``accumulate_quantized_rows``; their lowering passes/comm_quant.py), the EP schema (the staging buffers'
row size), the config rules (ops/config.py) and the reference model (ops/quant_reference.py, which
describes the formats and the reader's rules) all read it.

Wire row of ``elems`` elements (a multiple of 8: one unit per 16-byte bf16 vector): the payload (fp8 e4m3:
a byte per element; fp4 e2m1: element 2j in the low nibble of byte j), then, blockwise, ``scale_blocks``
f32 scales at the payload's 16-byte aligned end; the row is padded to a multiple of 16 bytes.
"""

from __future__ import annotations


def _round16(n: int) -> int:
    return -(-n // 16) * 16


# The push combines (IntraNode/IntraNodeLL with an external input buffer) and the AsyncLL combine may carry
# their bf16 rows quantized on the wire.

QUANT_TYPES = ("none", "fp8_direct_cast", "fp8_blockwise", "fp4_blockwise")
WIRE_QUANT_TYPES = QUANT_TYPES[1:]  # the quantizing ones
BLOCKWISE_QUANT_TYPES = ("fp8_blockwise", "fp4_blockwise")
QUANT_COMBINE_DTYPE = "bf16"  # the only combine dtype a wire quantization applies to (MORI: bf16 only)
FP8_COMBINE_SCALE_DIM_ENV = "MORI_FP8_COMBINE_SCALE_DIM"
DEFAULT_COMBINE_SCALE_DIM = 56  # MORI's default: 128-element blocks at hidden 7168
# The most scale blocks per token: each lane keeps its blocks' maxima and multipliers in registers (ptxas,
# sm_90 push combine at hidden 7168: no spill at 256 blocks, 172 bytes of spill stores at 2048).
MAX_COMBINE_SCALE_DIM = 256
# The fp8 e4m3 variant of each target's conversion instructions (gfx942: FNUZ, max 240; the others OCP,
# max 448) and the targets whose fp4 (E2M1) path exists: gfx950's v_cvt_scalef32_pk_fp4_f32, sm_90 in
# software (integer arithmetic; run and checked on H200). gfx942 has no fp4 conversion and LLVM 22 aborts
# selecting gfx950's on gfx1250: both refuse fp4_blockwise.
WIRE_FP8_OF_TARGET = {"gfx942": "fp8_e4m3fnuz", "gfx950": "fp8_e4m3fn", "gfx1250": "fp8_e4m3fn",
                      "sm_90": "fp8_e4m3fn"}  # fmt: skip
FP4_TARGETS = ("gfx950", "sm_90")
FP8_WIRE_MAX = {"fp8_e4m3fn": 448.0, "fp8_e4m3fnuz": 240.0}
FP4_WIRE_MAX = 6.0
WIRE_ELEMS_PER_UNIT = 8  # a row is quantized in units of one 16-byte bf16 vector: hidden a multiple of 8


def wire_payload_bytes(quant: str, elems: int) -> int:
    """Bytes of a wire row's payload: one byte per element (fp8), half a byte (fp4, two per byte)."""
    return -(-elems // 2) if quant == "fp4_blockwise" else elems


def wire_scale_offset(quant: str, elems: int) -> int:
    """Byte offset of a blockwise wire row's f32 scales: after the payload, 16-byte aligned."""
    return _round16(wire_payload_bytes(quant, elems))


def wire_row_bytes(quant: str, elems: int, scale_blocks: int) -> int:
    """Bytes of one wire row (a multiple of 16): payload, then ``scale_blocks`` f32 scales (blockwise);
    ``none``: the bf16 row itself."""
    if quant == "none":
        return elems * 2  # the bf16 row itself
    if quant in BLOCKWISE_QUANT_TYPES:
        return _round16(wire_scale_offset(quant, elems) + 4 * scale_blocks)
    return _round16(wire_payload_bytes(quant, elems))


def wire_block_elems(elems: int, scale_blocks: int) -> int:
    """Elements per scale block of a blockwise row: ``ceil(elems / scale_blocks)`` (trailing blocks may be
    empty, the last non-empty one shorter)."""
    return -(-elems // scale_blocks)
