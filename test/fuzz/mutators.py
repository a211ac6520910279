"""Seeded mutators of MLIR inputs: byte-level, line-level and MLIR-token-aware.

A mutator is ``fn(rng, data, donors) -> bytes``: ``data`` is the input, ``donors`` other corpus inputs
(for splices). Everything random comes from ``rng`` (a ``random.Random``), so a seed gives the same
mutant every time. Text mutators decode with ``surrogateescape`` so that they keep non-UTF-8 bytes.
A mutator that finds nothing to change (no integer in the input, ...) falls back to a byte mutation:
every mutant differs from its input.
"""

from __future__ import annotations

import random
import re
from typing import Callable, Sequence

Mutator = Callable[[random.Random, bytes, Sequence[bytes]], bytes]

BOUNDARY_INTS = ("0", "-1", "1", "2", "7", "2147483647", "2147483648", "-2147483648", "4294967295",
                 "4294967296", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
                 "18446744073709551615", "18446744073709551616", "100000000000000000000000000000",
                 "0x7FFFFFFF", "0xFFFFFFFFFFFFFFFF", "65536", "1024", "1025", "31", "32", "33", "63", "64", "65")  # fmt: skip
FLOATS = ("0.0", "-0.0", "1.5", "1.0e309", "-1.0e309", "3.4028235e38", "1.0e-46", "0x7FC00000",
          "0x7FF8000000000000", "nan", "inf")  # fmt: skip
TYPES = ("i1", "i8", "i16", "i32", "i64", "i128", "si32", "ui64", "f16", "bf16", "f32", "f64", "index",
         "!llvm.ptr", "!llvm.ptr<1>", "!llvm.ptr<3>", "vector<4xi32>", "vector<2x!llvm.ptr>",
         "memref<?xi32>", "tensor<2xf32>", "none", "complex<f32>", "tuple<i32>", "!llvm.struct<(i32)>",
         "!llvm.array<4 x i8>", "(i32) -> i32", "f8E4M3FN", "i0", "i16777215")  # fmt: skip
ATTRIBUTE_VALUES = ('"x"', '"\\ff"', '"\\c3\\28"', '""', '"a b"', "unit", "true", "false", "array<index: 1>",
                    "array<i32: 2147483648, 1, 1>", "array<i32: -1, 1, 1>", "array<i32: 0, 0, 0>",
                    "array<i64: 256, 1, 1>", "array<f32: 1.0>", "array<i1: true>", "array<i32>",
                    "array<i32: 256, 1>", "array<i32: 1, 1, 1, 1>", "dense<1> : vector<2xi32>",
                    "dense<[1, 2]> : tensor<2xi64>", "[1, 2]", "[]", "{a = 1}", "{}", "@sym", "@\"\\ff\"",
                    "1.5 : f32", "7168.0 : f64", "-1 : i64", "0 : i64", "2147483648 : i32", "1 : i1",
                    "18446744073709551616 : i64", "9223372036854775807 : i64", "-9223372036854775808 : i64",
                    "#gpu.address_space<workgroup>", "affine_map<(d0) -> (d0)>", "i32", "index",
                    "#llvm.linkage<internal>", "#nvvm.target", "#rocdl.target<chip = \"gfx900\">",
                    "loc(\"x\":1:2)", "\"bf16\"", "\"f32\"", "\"fp8_e4m3fn\"", "\"none\"", "\"system\"",
                    "\"block\"", "\"warp\"", "\"add\"", "\"set\"", "\"uint64\"", "\"int32\"", "\"greater_than\"")  # fmt: skip
SYMBOL_NAMES = ('@"a b"', '@"\\ff"', '@"\\c3\\28"', '@"\\""', '@""', '@"0"', '@"a.b"', '@"x$y"', "@x$y",
                '@"\\00"', '@"é"', '@"a\\0Ab"', "@" + "a" * 300, '@"-"', "@__mori_shmem_ptr", "@main",
                "@ring_put_signal", "@a.b", "@_", '@"kernel"')  # fmt: skip
STRINGS = ('"\\ff"', '"\\c3\\28"', '"\\ed\\a0\\80"', '""', '"a b"', '"\\00"', '"' + "x" * 500 + '"', '"bf16"',
           '"f32"', '"fp8_e4m3fnuz"', '"i32"', '"none"', '"system"', '"block"', '"warp"', '"gpu"', '"add"',
           '"uint64"', '"\\22"', '"é"')  # fmt: skip
NON_UTF8 = (b"\xff", b"\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
            b"\xc0\xaf")  # fmt: skip
OPS = ('%fz0 = "mori_shmem.my_pe"() : () -> i32', '%fz1 = "mori_shmem.n_pes"() : () -> i32',
       '"mori_shmem.fence"() : () -> ()', '"mori_shmem.quiet"() : () -> ()',
       '"mori_shmem.barrier_all"() : () -> ()', "gpu.barrier", "gpu.return", "return", "func.return",
       "llvm.return", "scf.yield", '"mori_comm.grid_barrier"(%fz2) : (!llvm.ptr) -> ()',
       "%fz3 = arith.constant 1 : i32", "%fz4 = gpu.thread_id x",
       "gpu.func @fz_k() kernel { gpu.return }", "func.func @fz_f() { return }",
       "gpu.module @fz_m { }", "llvm.func @\"\\ff\"()", "llvm.func @fz_decl(i32) -> i32",
       'func.func @fz_a() attributes {a = array<index: 1>} { return }',
       "gpu.func @fz_b() kernel attributes {known_block_size = array<i32: 2147483648, 1, 1>} { gpu.return }",
       "gpu.func @fz_c() kernel attributes {known_block_size = array<i32: -1, 1, 1>} { gpu.return }",
       '"mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, '
       'experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, '
       'scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()',
       "}", "{", "^bb1:", "cf.br ^bb1", "module {", "module attributes {gpu.container_module} {")  # fmt: skip

_INT = re.compile(r"(?<![\w.%#@^\"-])-?(?:0x[0-9a-fA-F]+|\d+)(?![\w.])")
_FLOAT = re.compile(r"(?<![\w.%#@^])-?\d+\.\d+(?:e[+-]?\d+)?")
_TYPE = re.compile(r"!llvm\.ptr(?:<\d+>)?|\b(?:i\d+|f16|bf16|f32|f64|index)\b|vector<[^>]*>")
_ATTR_VALUE = re.compile(r"(?<=[{,] )(\w+) = ((?:array|dense)<[^>]*>(?: : [\w<>x?]+)?|\"(?:[^\"\\]|\\.)*\"|[^,}\n]+)")
_SYMBOL = re.compile(r"@(?:\"(?:[^\"\\]|\\.)*\"|[\w$.-]+)")
_STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"")
_ARRAY = re.compile(r"array<(\w+)(?:: ([^>]*))?>")
_TERMINATOR = re.compile(r"^\s*(?:gpu\.return|return|func\.return|llvm\.return|scf\.yield|cf\.br\b.*)\s*$|^\s*}\s*$")
_GPU_MODULE = re.compile(r"^(\s*)gpu\.module @")
_REGION_OPENER = re.compile(r"\{\s*$")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


# ---- byte level ------------------------------------------------------------------------------------
def flip_bit(rng, data, donors):
    if not data:
        return insert_bytes(rng, data, donors)
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]


def insert_bytes(rng, data, donors):
    i = rng.randrange(len(data) + 1)
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return data[:i] + junk + data[i:]


def delete_bytes(rng, data, donors):
    if len(data) < 2:
        return insert_bytes(rng, data, donors)
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, min(64, len(data) - i)) :]


def splice_bytes(rng, data, donors):
    donor = rng.choice(donors) if donors else data
    if not donor:
        return insert_bytes(rng, data, donors)
    a = rng.randrange(len(donor))
    piece = donor[a : a + rng.randint(1, 200)]
    i = rng.randrange(len(data) + 1)
    return data[:i] + piece + data[i + rng.randint(0, 32) :]


def insert_non_utf8(rng, data, donors):
    """A byte sequence that is not UTF-8, anywhere, or inside a string or a symbol name."""
    bad = rng.choice(NON_UTF8)
    quotes = [m.start() + 1 for m in re.finditer(rb'"', data)]
    i = rng.choice(quotes) if quotes and rng.random() < 0.6 else rng.randrange(len(data) + 1)
    return data[:i] + bad + data[i:]


def truncate(rng, data, donors):
    if len(data) < 2:
        return insert_bytes(rng, data, donors)
    return data[: rng.randrange(len(data))]


# ---- line level ------------------------------------------------------------------------------------
def delete_lines(rng, data, donors):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    del lines[i : i + rng.choice((1, 1, 1, 2, 3))]
    return b"".join(lines) if b"".join(lines) != data else truncate(rng, data, donors)


def duplicate_line(rng, data, donors):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i] if lines[i].endswith(b"\n") else lines[i] + b"\n")
    return b"".join(lines)


def swap_lines(rng, data, donors):
    lines = _lines(data)
    if len(lines) < 2 or len(set(lines)) < 2:
        return duplicate_line(rng, data, donors)
    while True:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        if lines[i] != lines[j]:
            break
    lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def splice_lines(rng, data, donors):
    """Lines of another corpus file inserted at a random line (cross-file splice)."""
    donor = _lines(rng.choice(donors)) if donors else _lines(data)
    a = rng.randrange(len(donor))
    piece = donor[a : a + rng.randint(1, 12)]
    lines = _lines(data)
    i = rng.randrange(len(lines) + 1)
    lines[i:i] = [p if p.endswith(b"\n") else p + b"\n" for p in piece]
    return b"".join(lines)


# ---- MLIR token level ------------------------------------------------------------------------------
def _replace_match(rng, data, donors, pattern: re.Pattern, values: Sequence[str], group: int = 0) -> bytes:
    text = _text(data)
    matches = [m for m in pattern.finditer(text)]
    for _ in range(4):
        if not matches:
            break
        m = rng.choice(matches)
        new = rng.choice(values)
        if new != m.group(group):
            return _bytes(text[: m.start(group)] + new + text[m.end(group) :])
    return flip_bit(rng, data, donors)


def replace_integer(rng, data, donors):
    return _replace_match(rng, data, donors, _INT, BOUNDARY_INTS)


def replace_float(rng, data, donors):
    text = _text(data)
    pattern = _FLOAT if _FLOAT.search(text) else _INT
    return _replace_match(rng, data, donors, pattern, FLOATS)


def replace_type(rng, data, donors):
    return _replace_match(rng, data, donors, _TYPE, TYPES)


def replace_attribute_value(rng, data, donors):
    return _replace_match(rng, data, donors, _ATTR_VALUE, ATTRIBUTE_VALUES, group=2)


def replace_symbol(rng, data, donors):
    return _replace_match(rng, data, donors, _SYMBOL, SYMBOL_NAMES)


def replace_string(rng, data, donors):
    return _replace_match(rng, data, donors, _STRING, STRINGS)


def mutate_dense_array(rng, data, donors):
    """`array<T: v, ...>`: another element type (index, f32, i1, i64) or boundary values."""
    text = _text(data)
    matches = list(_ARRAY.finditer(text))
    if not matches:
        return insert_op(rng, data, donors, ('func.func @fz_a() attributes {a = array<index: 1>} { return }',))
    m = rng.choice(matches)
    kind = rng.choice(("index", "f32", "f64", "i1", "i8", "i64", "i32", "si32", "bf16", m.group(1)))
    count = rng.choice((0, 1, 2, 3, 3, 4))
    values = ", ".join(rng.choice(BOUNDARY_INTS[:14] + ("1", "1", "256", "1.5", "true")) for _ in range(count))
    new = f"array<{kind}: {values}>" if count else f"array<{kind}>"
    return _bytes(text[: m.start()] + new + text[m.end() :])


def insert_op(rng, data, donors, ops: Sequence[str] = OPS):
    """An op (or a brace, a block label, a nested module) at a random line: puts ops where they do not
    belong, e.g. a mori_shmem op directly inside a gpu.module."""
    lines = _lines(data)
    openers = [i + 1 for i, line in enumerate(lines) if _REGION_OPENER.search(_text(line))]
    i = rng.choice(openers) if openers and rng.random() < 0.7 else rng.randrange(len(lines) + 1)
    lines.insert(i, _bytes("  " + rng.choice(ops) + "\n"))
    return b"".join(lines)


def move_op(rng, data, donors):
    """An op line moved into another region (right after some `{`), e.g. out of its function."""
    lines = _lines(data)
    movable = [i for i, line in enumerate(lines) if _text(line).strip() and "{" not in line.decode("latin-1")
               and "}" not in line.decode("latin-1") and not line.lstrip().startswith(b"//")]  # fmt: skip
    openers = [i + 1 for i, line in enumerate(lines) if _REGION_OPENER.search(_text(line))]
    if not movable or not openers:
        return swap_lines(rng, data, donors)
    src = rng.choice(movable)
    line = lines.pop(src)
    dst = rng.choice(openers)
    lines.insert(dst if dst <= src else dst - 1, line)
    out = b"".join(lines)
    return out if out != data else swap_lines(rng, data, donors)


def drop_terminator(rng, data, donors):
    lines = _lines(data)
    terminators = [i for i, line in enumerate(lines) if _TERMINATOR.match(_text(line))]
    if not terminators:
        return delete_lines(rng, data, donors)
    del lines[rng.choice(terminators)]
    return b"".join(lines)


def _gpu_module_spans(lines: list[bytes]) -> list[tuple[int, int]]:
    """(first, last+1) line ranges of each `gpu.module @x {` ... its closing `}` at the same indent."""
    spans = []
    for i, line in enumerate(lines):
        m = _GPU_MODULE.match(_text(line))
        if not m:
            continue
        indent = m.group(1)
        for j in range(i + 1, len(lines)):
            if re.match(re.escape(indent) + r"}\s*$", _text(lines[j])):
                spans.append((i, j + 1))
                break
    return spans


def _drop_one_return(rng, lines: list[bytes]) -> list[bytes]:
    returns = [k for k, line in enumerate(lines) if re.match(r"^\s*(?:gpu\.return|return)\s*$", _text(line))]
    return [line for k, line in enumerate(lines) if not returns or k != rng.choice(returns)] if returns else lines


def duplicate_gpu_module(rng, data, donors):
    """A second copy of a gpu.module (renamed or not), often with a function's terminator dropped in one or
    both: MLIR then verifies the two modules on several threads."""
    lines = _lines(data)
    spans = _gpu_module_spans(lines)
    if not spans:
        return insert_op(rng, data, donors, ("gpu.module @fz_m { gpu.func @k() kernel { } }",
                                             "gpu.module @fz_n { gpu.func @k() kernel { } }"))  # fmt: skip
    a, b = rng.choice(spans)
    original, copy = lines[a:b], list(lines[a:b])
    if rng.random() < 0.7:
        copy[0] = re.sub(rb"gpu\.module @[\w\"$.-]+", b"gpu.module @fz_copy%d" % rng.randrange(100), copy[0])
    if rng.random() < 0.6:
        copy = _drop_one_return(rng, copy)
        if rng.random() < 0.5:
            original = _drop_one_return(rng, original)
    lines[a:b] = original + copy
    return b"".join(lines)


def strip_comments(rng, data, donors):
    """Drop `//` comment lines (RUN/CHECK), keeping the `// -----` split markers."""
    lines = [line for line in _lines(data) if not line.lstrip().startswith(b"//") or line.startswith(b"// -----")]
    out = b"".join(lines)
    return out if out != data else replace_integer(rng, data, donors)


OP_NAMES = ('"mori_shmem.my_pe"', '"mori_shmem.n_pes"', '"mori_shmem.fence"', '"mori_shmem.quiet"',
            '"mori_shmem.putmem_nbi"', '"mori_shmem.wait_until"', '"mori_shmem.ptr"', '"mori_shmem.atomic_add"',
            '"mori_comm.row_copy"', '"mori_comm.reserve_slot"', '"mori_comm.grid_barrier"', '"mori_comm.count_signal"',
            '"mori_ep.dispatch"', '"mori_ep.combine"', '"mori_comm.accumulate_rows"', '"mori_shmem.nope"',
            '"mori_ep."', '"mori_comm."', '"gpu.nope"', '"gpu.barrier"', '"gpu.return"', '"func.return"',
            '"llvm.nope"', '"a"', '"."', '""', '"mori_shmem"', '"arith.addi"', '"scf.yield"', '"builtin.module"')  # fmt: skip
_GENERIC_OP = re.compile(r'"[\w.$-]*"(?=\()')
_ATTR_DICT = re.compile(r"\{(\w+ = [^{}\n]*)\}")
_OPERANDS = re.compile(r'(?<=")\(((?:%[\w#]+)(?:, %[\w#]+)*)\)')


def replace_op_name(rng, data, donors):
    """A generic op's name replaced by another op of the project, an unknown op or a malformed name."""
    return _replace_match(rng, data, donors, _GENERIC_OP, OP_NAMES)


def edit_attribute_dict(rng, data, donors):
    """An item of an attribute dictionary dropped or repeated (split at ", ": an attribute, or an element
    of an array value): missing, duplicate and malformed attributes."""
    text = _text(data)
    matches = list(_ATTR_DICT.finditer(text))
    if not matches:
        return replace_attribute_value(rng, data, donors)
    m = rng.choice(matches)
    items = m.group(1).split(", ")
    k = rng.randrange(len(items))
    if rng.random() < 0.5 and len(items) > 1:
        del items[k]
    else:
        items.insert(rng.randrange(len(items) + 1), items[k])
    return _bytes(text[: m.start(1)] + ", ".join(items) + text[m.end(1) :])


def edit_operands(rng, data, donors):
    """A generic op's operand list with one operand dropped, duplicated or swapped (types left as they were)."""
    text = _text(data)
    matches = list(_OPERANDS.finditer(text))
    if not matches:
        return replace_integer(rng, data, donors)
    m = rng.choice(matches)
    ops = m.group(1).split(", ")
    k = rng.randrange(len(ops))
    choice = rng.randrange(3)
    if choice == 0 and len(ops) > 1:
        del ops[k]
    elif choice == 1:
        ops.insert(k, ops[k])
    else:
        j = rng.randrange(len(ops))
        ops[k], ops[j] = ops[j], ops[k]
    return _bytes(text[: m.start(1)] + ", ".join(ops) + text[m.end(1) :])


def _always_changes(fn: Mutator) -> Mutator:
    """``fn``, falling back to inserting bytes when it happened to return its input unchanged."""

    def mutator(rng, data, donors):
        out = fn(rng, data, donors)
        return out if out != data else insert_bytes(rng, data, donors)

    mutator.__name__, mutator.__doc__ = fn.__name__, fn.__doc__
    return mutator


BYTE_MUTATORS: dict[str, Mutator] = {
    "flip_bit": flip_bit, "insert_bytes": insert_bytes, "delete_bytes": delete_bytes,
    "splice_bytes": splice_bytes, "insert_non_utf8": insert_non_utf8, "truncate": truncate,
}  # fmt: skip
LINE_MUTATORS: dict[str, Mutator] = {
    "delete_lines": delete_lines, "duplicate_line": duplicate_line, "swap_lines": swap_lines,
    "splice_lines": splice_lines,
}  # fmt: skip
TOKEN_MUTATORS: dict[str, Mutator] = {
    "replace_integer": replace_integer, "replace_float": replace_float, "replace_type": replace_type,
    "replace_attribute_value": replace_attribute_value, "replace_symbol": replace_symbol,
    "replace_string": replace_string, "mutate_dense_array": mutate_dense_array, "insert_op": insert_op,
    "move_op": move_op, "drop_terminator": drop_terminator, "duplicate_gpu_module": duplicate_gpu_module,
    "strip_comments": strip_comments, "replace_op_name": replace_op_name,
    "edit_attribute_dict": edit_attribute_dict, "edit_operands": edit_operands,
}  # fmt: skip
MUTATORS: dict[str, Mutator] = {name: _always_changes(fn) for name, fn in
                                {**BYTE_MUTATORS, **LINE_MUTATORS, **TOKEN_MUTATORS}.items()}  # fmt: skip
# Token-level mutators find most: they keep the input parseable enough to reach the verifiers and passes.
WEIGHTS = {**{n: 1 for n in BYTE_MUTATORS}, **{n: 1 for n in LINE_MUTATORS}, **{n: 3 for n in TOKEN_MUTATORS}}


def mutate(rng: random.Random, data: bytes, donors: Sequence[bytes] = (), max_stack: int = 3,
           names: Sequence[str] | None = None) -> tuple[bytes, list[str]]:  # fmt: skip
    """Apply 1..max_stack mutators chosen by weight; the mutant and the mutators' names."""
    pool = list(names or MUTATORS)
    weights = [WEIGHTS.get(n, 1) for n in pool]
    applied = []
    depth = rng.choices(range(1, max_stack + 1), [2 ** (max_stack - k) for k in range(1, max_stack + 1)])[0]
    for _ in range(depth):  # mostly one mutation: stacked ones mostly break the parse
        name = rng.choices(pool, weights)[0]
        data = MUTATORS[name](rng, data, donors)
        applied.append(name)
    return data, applied
