"""Checks on user IR for inputs that make MLIR or LLVM abort (they are built with assertions).

Three layers, each returning ``file:line:col: message`` strings:

``lexical_problems(text)`` runs *before* the first ``ir.Module.parse``. It is a small scanner of MLIR's
token grammar (comments, string literals with their escapes, prefixed identifiers, bare identifiers,
numbers), so it sees exactly the tokens MLIR's lexer sees and never what is inside a comment or a string.
It rejects what crashes the parser or nanobind before any verifier runs:

* a dense array whose element type is ``index`` (``array<index: 1>``, also through a type alias
  ``!t = index``): MLIR's parser asks ``index`` for its bit width and asserts;
* a string literal or quoted name (``"..."``, ``@"..."``) that is not UTF-8 once its ``\\XX`` escapes are
  expanded: nanobind cannot turn it into a Python ``str`` (op names, symbol names, attribute values,
  file names of locations all come back as ``str``). The one exception is the initializer of an LLVM
  global (``llvm.mlir.global ... @name("\\ff\\00")``), which holds raw bytes and is never read as text;
* text that is not representable as UTF-8 at all (lone surrogates from a Python caller);
* brackets nested deeper than ``MAX_NESTING`` levels (MLIR's recursive parser overflows the stack);
* a ``#rocdl.target<...>`` or ``#xevm.target<...>`` that its verifier refuses (``O`` outside 0..3, an
  empty ``chip`` or ``triple``, an ROCDL ``abi`` other than 400/500/600, a ``link`` list holding
  non-strings): their parsers build the attribute with an asserting ``get``; an ``#nvvm.target`` whose
  chip is not an SM name (its verifier drops a 3-character prefix unchecked).

``structural_problems(module_op)`` runs on the module parsed with the project dialects unloaded, before the
real parse and any pass. It rejects what passes, translation or codegen would crash on later:

* an op name without a dialect and an operation part (``"gpu"()``, ``"gpu."()``: MLIR aborts creating an
  op whose name is a loaded dialect's alone);
* a project op (of any project dialect: mori_shmem, mori_comm, mori_ep) in the wrong place: ``mori_ep`` EP
  ops (dispatch, combine, ...) belong directly in a ``gpu.module``; every other project op inside a function (translating one that sits directly in a
  module dereferences a null parent in LLVM);
* symbol names that are empty or hold control characters (LLVM asserts on a NUL in a name);
* launch bounds (``known_block_size``, ``known_grid_size``, ``nvvm.maxntid``, ...) outside what a GPU can
  launch: a negative or too large element makes the NVVM/ROCDL translation build an out-of-range APInt
  (an assertion). Blocks have 1 to 1024 threads per dimension and in all, grids 1 to 2**31 - 1 blocks per
  dimension; the scalar NVVM/ROCDL kernel attributes (``nvvm.maxnreg``, ``rocdl.flat_work_group_size``, ...)
  are checked against their ranges too (LLVM reads them as unsigned numbers).

``target_symbol_problem`` and ``lowered_problems`` are the per-target layer, applied to the lowered
gpu.module before translation to LLVM IR (passes/to_llvm_ir.py), for what LLVM's GPU back ends abort on
("LLVM ERROR", assertions) instead of reporting:

* symbol names: PTX accepts only identifiers (letters, digits, ``_``, ``$``; LLVM aborts with "Symbol name
  with unsupported characters" otherwise), AMDGPU code objects any printable name;
* pointers outside the address spaces both back ends lower everywhere (0 generic, 1 global, 3 shared /
  LDS, 4 constant, 5 local / private): others are "Bad address space" or "Cannot select" aborts;
* 80- and 128-bit floats (``f80``, ``f128``): the back ends have no instructions nor library calls for them;
  integers wider than ``MAX_INT_BITS`` (LLVM asserts beyond 2**23 bits; long before, the GPU back ends
  expand them into endless instruction sequences);
* values (operands, results, arguments) of more than ``MAX_VALUE_ELEMENTS`` array or vector elements:
  the back ends expand them element by element until memory runs out;
* an ``llvm.alloca`` larger than a thread's private memory (LLVM's AMDGPU back end exits on it);
* ``syncscope`` names the target does not define;
* ``llvm.inline_asm`` whose constraint string does not match its operands (an LLVM ``cantFail`` abort).
"""

from __future__ import annotations

import functools

import re

from mori_compiler._mlir import ir
from mori_compiler.targets import MAX_BLOCK_THREADS

from . import mori_ep
from .irdl_spec import string_value

EP_OPS_AT_MODULE_TOP = tuple(f"{mori_ep.DIALECT_NAME}.{name}" for name in mori_ep.EP_OPS)
FUNCTION_OPS = ("gpu.func", "func.func", "llvm.func")
MODULE_OPS = ("builtin.module", "gpu.module")
# What LLVM IR is translated from may hold directly: symbols and module-level metadata. Any other op there
# (a gpu.barrier written at gpu.module level, lowered in place) crashes MLIR's LLVM IR translator.
LLVM_MODULE_LEVEL_OPS = ("llvm.func", "llvm.mlir.global", "llvm.mlir.alias", "llvm.mlir.ifunc", "llvm.comdat",
                         "llvm.mlir.global_ctors", "llvm.mlir.global_dtors", "llvm.module_flags",
                         "llvm.linker_options")  # fmt: skip
GPU_MODULE_LEVEL_OPS = FUNCTION_OPS + ("memref.global",) + LLVM_MODULE_LEVEL_OPS
# Launch-bound attributes (dense i32 arrays) of kernels: per block (threads) and per grid (blocks).
BLOCK_BOUND_ATTRS = ("known_block_size", "gpu.known_block_size", "nvvm.maxntid", "nvvm.reqntid",
                     "rocdl.reqd_work_group_size")  # fmt: skip
GRID_BOUND_ATTRS = ("known_grid_size", "gpu.known_grid_size", "nvvm.cluster_dim")
MAX_LAUNCH_DIM = 2**31 - 1  # grid and block dimensions are 32-bit signed in NVVM and ROCDL

# ---------------------------------------------------------------------------------------------------
# Lexical layer
# ---------------------------------------------------------------------------------------------------

_HEX2 = re.compile(r"[0-9a-fA-F]{2}")


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _string_bytes(text: str, start: int) -> tuple[bytes, int]:
    """The bytes of the string literal whose opening quote is at ``start``, and the index after it
    (MLIR's escapes: \\\\, \\", \\n, \\t and two hex digits). An unterminated literal ends the scan: the
    parser reports it."""
    out = bytearray()
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return bytes(out), i + 1
        if c == "\n":
            break
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt in '"\\':
                out += nxt.encode()
                i += 2
                continue
            if nxt in "nt":
                out += b"\n" if nxt == "n" else b"\t"
                i += 2
                continue
            if _HEX2.fullmatch(text, i + 1, i + 3):
                out.append(int(text[i + 1 : i + 3], 16))
                i += 3
                continue
        out += c.encode("utf-8", "surrogatepass")
        i += 1
    return bytes(out), n


_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>//[^\n]*)
      | (?P<string>@?"(?:[^"\\\n]|\\.)*"?)
      | (?P<prefixed>[%@#!^][A-Za-z0-9_$.\-]+)
      | (?P<number>0x[0-9a-fA-F]+|[0-9]+)
      | (?P<id>[A-Za-z_][A-Za-z0-9_$.]*)
      | (?P<punct>.)""",
    re.VERBOSE,
)
_PREFIX_KIND = {"@": "symbol", "#": "attribute", "%": "value", "^": "block"}
_CLOSED_STRING = re.compile(r'@?"(?:[^"\\\n]|\\.)*"')


def _tokens(text: str):
    """(kind, text, position) for the tokens that matter here: 'id' (bare identifier), 'alias' (``!name``),
    'dialect-type' (``!dialect.type``), 'attribute' (``#name``), 'symbol', 'string' (its bytes, escapes
    expanded; also for ``@"..."``), 'value' (``%name``), 'block' (``^name``), 'number' (digits, without
    sign), 'punct' (one character). Comments and whitespace are skipped. One regular expression: the scan
    is linear."""
    for m in _TOKEN.finditer(text):
        kind, value, pos = m.lastgroup, m.group(), m.start()
        if kind in ("space", "comment"):
            continue
        if kind == "string":
            yield "string", _string_bytes(text, pos + (value[0] == "@"))[0], pos
        elif kind == "prefixed":
            sigil, name = value[0], value[1:]
            if sigil == "!":
                yield ("dialect-type" if "." in name else "alias"), name, pos
            elif sigil in _PREFIX_KIND:
                yield _PREFIX_KIND[sigil], name, pos
        else:
            yield kind, value, pos


def lexical_problems(text: str, filename: str = "-") -> list[str]:
    """Located problems found by scanning ``text`` as MLIR tokens (see the module docstring)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line, col = _line_col(text, exc.start)
        return [f"{filename}:{line}:{col}: the input holds a character that is not valid UTF-8 text"]
    problems: list[str] = []
    for m in _TOKEN.finditer(text):
        # MLIR refuses a string literal open at the end of its line, but after some types (``!llvm.ptr"`` at
        # the end of the input) the error is lost on a path that aborts (fuzzing, session 13): refused first.
        if m.lastgroup == "string" and not _CLOSED_STRING.fullmatch(m.group()):
            line, col = _line_col(text, m.start())
            return [f"{filename}:{line}:{col}: a string literal is not closed before the end of its line"]
    tokens = list(_tokens(text))
    aliases: dict[str, list[tuple[str, str]]] = {}  # every definition (a redefinition is MLIR's error)
    for k in range(len(tokens) - 2):
        (kind, value, _), (_, eq, _), (nkind, nvalue, _) = tokens[k : k + 3]
        if kind == "alias" and eq == "=" and nkind in ("id", "alias"):
            aliases.setdefault(value, []).append((nkind, nvalue))

    def is_index(kind: str, value: str) -> bool:  # through any chain of aliases (iteratively: chains may be long)
        pending, seen = [(kind, value)], set()
        while pending:
            kind, value = pending.pop()
            if kind == "id" and value == "index":
                return True
            if kind == "alias" and value not in seen:
                seen.add(value)
                pending += aliases.get(value, ())
        return False

    deepest = _deepest_nesting(tokens)
    if deepest is not None:
        where = "{}:{}:{}".format(filename, *_line_col(text, deepest))
        return [f"{where}: nesting deeper than {MAX_NESTING} levels of brackets (regions, attributes, types)"]
    def at(pos: int) -> str:
        return "{}:{}:{}".format(filename, *_line_col(text, pos))

    for k, (kind, value, pos) in enumerate(tokens):
        if kind == "id" and value == "array" and k + 2 < len(tokens) and tokens[k + 1][1] == "<":
            ekind, evalue, _ = tokens[k + 2]
            if is_index(ekind, evalue):
                problems.append(f"{at(pos)}: a dense array's element type must be an integer or float type "
                                f"(i1 ... i64, f16 ... f64), got index")  # fmt: skip
        elif kind == "attribute" and value in _CHECKED_TARGET_ATTRS and k + 1 < len(tokens) and tokens[k + 1][1] == "<":
            problems += [f"{at(pos)}: #{value} {p}" for p in _target_attr_problems(value, tokens, k + 2)]
        elif kind == "string":
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                if _is_global_initializer(tokens, k):
                    continue
                what = "quoted name" if text[pos] == "@" else "string"
                problems.append(f"{at(pos)}: this {what} is not valid UTF-8 after its escapes are expanded (byte "
                                f"0x{value[exc.start]:02x} at offset {exc.start}); names and strings must be UTF-8")  # fmt: skip
    return problems


# Target attributes whose parser builds the attribute with an asserting get (MLIR 22): their verifier's
# rules are checked on the tokens first. (#nvvm.target reports its own errors.)
_CHECKED_TARGET_ATTRS = ("rocdl.target", "xevm.target", "nvvm.target")
# #nvvm.target verifies its fields itself, but reads the SM number of its chip by dropping a 3-character
# prefix without checking the length (an assertion): its chip must be an SM name.
NVVM_CHIP = re.compile(r"(sm|compute)_[0-9]+[a-z]?")
_ROCDL_ABIS = (b"400", b"500", b"600")


def _target_attr_problems(name: str, tokens, start: int) -> list[str]:
    """Problems of the ``key = value`` pairs of a target attribute whose body starts at ``tokens[start]``."""
    problems, depth, k = [], 0, start
    while k < len(tokens):
        kind, value, _ = tokens[k]
        if value in ("<", "{", "[", "("):
            depth += 1
        elif value in (">", "}", "]", ")"):
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and kind == "id" and k + 2 < len(tokens) and tokens[k + 1][1] == "=":
            vkind, v, _ = tokens[k + 2]
            if name == "nvvm.target" and value != "chip":
                pass  # the attribute's own verifier reports the other fields
            elif value == "O" and (v == "-" or (vkind == "number" and int(v, 16 if v.startswith("0x") else 10) > 3)):
                problems.append("'O' must be 0, 1, 2 or 3")
            elif name == "nvvm.target":
                if value == "chip" and vkind == "string" and not NVVM_CHIP.fullmatch(v.decode(errors="replace")):
                    problems.append(f"'chip' must be an SM name such as \"sm_90\", got \"{v.decode(errors='replace')}\"")
            elif value in ("chip", "triple") and vkind == "string" and not v:
                problems.append(f"'{value}' must not be empty")
            elif value == "abi" and name == "rocdl.target" and vkind == "string" and v not in _ROCDL_ABIS:
                problems.append(f"'abi' must be \"400\", \"500\" or \"600\", got \"{v.decode(errors='replace')}\"")
            elif value == "link" and v == "[":
                j = k + 3
                while j < len(tokens) and tokens[j][1] != "]":
                    if tokens[j][0] != "string" and tokens[j][1] != ",":
                        problems.append("'link' must be a list of strings (bitcode file names)")
                        break
                    j += 1
        k += 1
    return problems


MAX_NESTING = 256  # MLIR's parser recurses per level (a stack overflow near 10**4); real IR nests < 30


def _deepest_nesting(tokens) -> int | None:
    """Position of the first bracket nested deeper than MAX_NESTING, or None. The ``>`` of ``->`` and the
    ``<``/``>`` of affine ``<=``/``>=`` are not brackets."""
    depth = 0
    for k, (kind, value, pos) in enumerate(tokens):
        if kind != "punct":
            continue
        next_is_eq = k + 1 < len(tokens) and tokens[k + 1][1] == "=" and tokens[k + 1][2] == pos + 1
        if value in "{[(" or (value == "<" and not next_is_eq):
            depth += 1
            if depth > MAX_NESTING:
                return pos
        elif value in "}])" or (value == ">" and not next_is_eq and not (k and tokens[k - 1][1] == "-")):
            depth = max(0, depth - 1)
    return None


def op_location(text: str, filename: str, op_name: str, symbol: str) -> str | None:
    """``file:line:col`` of the op ``op_name @symbol`` in ``text`` (custom form), or None: for errors of
    the LLVM-level stages, which know a gpu.module by its name only."""
    tokens = list(_tokens(text))
    for k in range(len(tokens) - 1):
        kind, value, pos = tokens[k]
        if kind == "id" and value == op_name and tokens[k + 1][0] == "symbol" and tokens[k + 1][1] == symbol:
            return "{}:{}:{}".format(filename, *_line_col(text, pos))
    return None


def _is_global_initializer(tokens, k: int) -> bool:
    """``llvm.mlir.global ... @name("bytes")``: the string right after ``@name(``."""
    return k >= 2 and tokens[k - 1][1] == "(" and tokens[k - 2][0] == "symbol" and any(
        t[0] == "id" and t[1] == "llvm.mlir.global" for t in tokens[max(0, k - 12) : k]
    )


def file_not_utf8_message(data: bytes, filename: str, exc: UnicodeDecodeError) -> str:
    """``file:line:col: ...`` for the first byte of ``data`` that is not UTF-8."""
    prefix = data[: exc.start]
    line = prefix.count(b"\n") + 1
    col = exc.start - (prefix.rfind(b"\n") + 1) + 1
    return f"{filename}:{line}:{col}: byte 0x{data[exc.start]:02x} is not valid UTF-8 (input files must be UTF-8 text)"


# ---------------------------------------------------------------------------------------------------
# Structural layer
# ---------------------------------------------------------------------------------------------------


def _enclosing(op: ir.Operation, names: tuple[str, ...]) -> str | None:
    """Name of the nearest ancestor of ``op`` that is one of ``names`` or a module/function op."""
    parent = op.parent
    while parent is not None:
        name = parent.name
        if name in names or name in MODULE_OPS or name in FUNCTION_OPS:
            return name
        parent = parent.parent
    return None


def _placement_problem(op: ir.Operation) -> str | None:
    name = op.name
    parent = op.parent
    if name in EP_OPS_AT_MODULE_TOP:
        if parent is None or parent.name != "gpu.module":
            where = parent.name if parent is not None else "the top level"
            return (f"'{name}' must be placed directly in a gpu.module (mori-ep-to-kernels replaces it by kernels "
                    f"there), not in {where}")  # fmt: skip
        return None
    if _enclosing(op, ()) not in FUNCTION_OPS:
        where = parent.name if parent is not None else "the top level"
        return f"'{name}' must be placed inside a function (gpu.func, func.func or llvm.func), not directly in {where}"
    return None


def _has_control_char(name: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)


def _launch_bound_problems(op: ir.Operation) -> list[str]:
    problems = []
    for attr_name in BLOCK_BOUND_ATTRS + GRID_BOUND_ATTRS:
        if attr_name not in op.attributes:
            continue
        attr = op.attributes[attr_name]
        if not isinstance(attr, ir.DenseI32ArrayAttr):
            continue  # the gpu dialect's verifier reports other kinds
        values = list(attr)
        per_block = attr_name in BLOCK_BOUND_ATTRS
        limit = MAX_BLOCK_THREADS if per_block else MAX_LAUNCH_DIM
        bad = [v for v in values if not 1 <= v <= limit]
        if bad:
            problems.append(f"'{op.name}' attribute '{attr_name}' elements must be in [1, {limit}], got {bad[0]}")
        elif per_block:
            total = 1
            for v in values:
                total *= v
            if total > MAX_BLOCK_THREADS:
                problems.append(f"'{op.name}' attribute '{attr_name}' {values} has {total} threads; a block "
                                f"has at most {MAX_BLOCK_THREADS}")  # fmt: skip
    return problems


# Scalar kernel attributes of the NVVM/ROCDL dialects: (lo, hi). LLVM parses them as unsigned numbers
# (a negative one is an unlocated "can't parse ... attribute" error, or silently a huge limit).
SCALAR_KERNEL_ATTRS = {
    "nvvm.maxnreg": (1, 255),  # PTX .maxnreg: at most 255 registers per thread
    "nvvm.minctasm": (1, MAX_LAUNCH_DIM),
    "nvvm.cluster_max_blocks": (1, MAX_LAUNCH_DIM),
    "rocdl.max_flat_work_group_size": (1, MAX_BLOCK_THREADS),
    "rocdl.waves_per_eu": (1, MAX_LAUNCH_DIM),
}


def _scalar_kernel_attr_problems(op: ir.Operation) -> list[str]:
    problems = []
    for name, (lo, hi) in SCALAR_KERNEL_ATTRS.items():
        if name in op.attributes and isinstance(op.attributes[name], ir.IntegerAttr):
            value = op.attributes[name].value
            if not lo <= value <= hi:
                problems.append(f"'{op.name}' attribute '{name}' must be in [{lo}, {hi}], got {value}")
    if "rocdl.flat_work_group_size" in op.attributes and isinstance(op.attributes["rocdl.flat_work_group_size"], ir.StringAttr):
        text = string_value(op.attributes["rocdl.flat_work_group_size"])
        bounds = text.split(",")
        if not (len(bounds) == 2 and all(b.strip().isdigit() for b in bounds)
                and 1 <= int(bounds[0]) <= int(bounds[1]) <= MAX_BLOCK_THREADS):  # fmt: skip
            problems.append(f"'{op.name}' attribute 'rocdl.flat_work_group_size' must be \"MIN,MAX\" with "
                            f"1 <= MIN <= MAX <= {MAX_BLOCK_THREADS}, got \"{text}\"")  # fmt: skip
    return problems


def structural_problems(module_op: ir.Operation, where, project_prefixes: tuple[str, ...]) -> list[str]:
    """Problems of every op nested in ``module_op``; ``where(op)`` formats the op's location;
    ``project_prefixes``: ``"<dialect>."`` of every project dialect (registry.project_prefixes())."""
    problems: list[str] = []

    def visit(op):
        op = op.operation
        name = op.name
        found: list[str] = []
        dialect, dot, short = name.partition(".")
        if not (dialect and dot and short):
            found.append(f"op name {name!r} is not of the form 'dialect.operation'")
        if name.startswith(project_prefixes):
            problem = _placement_problem(op)
            if problem:
                found.append(problem)
        elif not found and op.parent is not None and op.parent.name == "gpu.module" and name not in GPU_MODULE_LEVEL_OPS:
            found.append(f"{name!r} cannot stand directly in a gpu.module (allowed there: functions, globals and "
                         "the mori_ep kernel ops); put it inside a gpu.func")  # fmt: skip
        if "sym_name" in op.attributes:
            attr = op.attributes["sym_name"]
            if isinstance(attr, ir.StringAttr) and _has_control_char(string_value(attr)):
                found.append(f"'{name}' symbol name {string_value(attr)!r} holds a control character")
        found += _launch_bound_problems(op) + _scalar_kernel_attr_problems(op)
        problems.extend(f"{where(op)}: {p}" for p in found)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return problems


# ---------------------------------------------------------------------------------------------------
# Per-target symbol names
# ---------------------------------------------------------------------------------------------------

# PTX identifiers (PTX ISA "Identifiers"): a letter then letters, digits, '_' or '$'; or '_'/'$' then at least
# one of those. LLVM's NVPTX backend renames '.' in non-kernel names; a kernel keeps its name, which the
# runtime looks up, so it must already be a PTX identifier.
_PTX_KERNEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_$]*|[_$][A-Za-z0-9_$]+")
_PTX_SYMBOL_NAME = re.compile(r"[A-Za-z_$.][A-Za-z0-9_$.]*")


def target_symbol_problem(name: str, *, is_kernel: bool, nvptx: bool) -> str | None:
    """Why ``name`` cannot be a symbol of a code object for the target, or None."""
    if not name:
        return "symbol names must not be empty"
    if _has_control_char(name):
        return f"symbol name {name!r} holds a control character"
    if not nvptx:
        return None
    if name.startswith("llvm."):
        return None  # intrinsic declarations are not emitted as symbols
    pattern = _PTX_KERNEL_NAME if is_kernel else _PTX_SYMBOL_NAME
    if not pattern.fullmatch(name):
        kind = "kernel" if is_kernel else "symbol"
        return (f"{kind} name {name!r} is not a PTX identifier (a letter, '_' or '$' followed by letters, digits, "
                f"'_' or '$'{'' if is_kernel else ', or .'})")  # fmt: skip
    return None


# ---------------------------------------------------------------------------------------------------
# Lowered IR, per target
# ---------------------------------------------------------------------------------------------------

ADDRESS_SPACES = (0, 1, 3, 4, 5)
_PTR_SPACE = re.compile(r"!llvm\.ptr<(\d+)>")
_WIDE_FLOAT = re.compile(r"(?<![\w.])(f80|f128)(?![\w.])")
SYNC_SCOPES = {
    True: ("", "singlethread", "block", "cluster", "device"),  # NVPTX
    False: ("", "singlethread", "wavefront", "workgroup", "agent", "cluster", "one-as", "singlethread-one-as",
            "wavefront-one-as", "workgroup-one-as", "agent-one-as", "cluster-one-as"),  # AMDGPU
}  # fmt: skip


MAX_INT_BITS = 1024
_INT_TYPE = re.compile(r"(?<![\w.])[su]?i(\d+)(?![\w.])")


MAX_VALUE_ELEMENTS = 1 << 16
_ARRAY_COUNT = re.compile(r"array<(\d+) x ")
_VECTOR_SHAPE = re.compile(r"vector<((?:\[?\d+\]?x)+)")


@functools.lru_cache(maxsize=4096)  # type texts repeat across a lowered kernel's values
def _value_type_problem(text: str) -> str | None:
    """Why a value (operand, result, argument) of this type cannot be compiled: the back ends expand
    aggregates element by element, so a 2**31-element array argument exhausts memory instead of failing."""
    counts = [int(n) for n in _ARRAY_COUNT.findall(text)]
    for shape in _VECTOR_SHAPE.findall(text):
        total = 1
        for dim in re.findall(r"\d+", shape):
            total *= int(dim)
        counts.append(total)
    if any(n > MAX_VALUE_ELEMENTS for n in counts):
        return (f"a value of type {text[:80]} has {max(counts)} elements; values (operands, results, arguments) "
                f"may hold at most {MAX_VALUE_ELEMENTS} (put large data in memory)")  # fmt: skip
    return _type_problem(text)


@functools.lru_cache(maxsize=4096)  # a lowered kernel repeats a few type texts thousands of times
def _type_problem(text: str) -> str | None:
    for m in _PTR_SPACE.finditer(text):
        if int(m.group(1)) not in ADDRESS_SPACES:
            return (f"pointer address space {m.group(1)} is not supported by the GPU back ends (allowed: "
                    f"{', '.join(map(str, ADDRESS_SPACES))})")  # fmt: skip
    m = _WIDE_FLOAT.search(text)
    if m:
        return f"type {m.group(1)} is not supported by the GPU back ends (floats are at most 64 bits)"
    for m in _INT_TYPE.finditer(text):
        if int(m.group(1)) > MAX_INT_BITS:
            return (f"integer type {m.group()} is wider than {MAX_INT_BITS} bits, which the GPU back ends do not "
                    "support (LLVM asserts beyond 2**23 bits)")  # fmt: skip
    return None


def _inline_asm_problem(op: ir.Operation) -> str | None:
    attr = op.attributes["constraints"] if "constraints" in op.attributes else None
    if not isinstance(attr, ir.StringAttr):
        return None
    constraints = string_value(attr)
    parts = [p for p in constraints.split(",") if p]
    inputs = [p for p in parts if not p.startswith(("=", "~"))]
    outputs = [p for p in parts if p.startswith("=")]
    if len(inputs) != len(op.operands) or len(outputs) > 1 and not op.results:
        return (f"'llvm.inline_asm' constraints \"{constraints}\" name {len(inputs)} input(s) but the op has "
                f"{len(op.operands)} operand(s)")  # fmt: skip
    if bool(outputs) != bool(op.results):
        return f"'llvm.inline_asm' constraints \"{constraints}\" and the op's results disagree on whether it has outputs"
    return None


# Private (per-thread) memory a function may allocate: AMDGPU's scratch limit per lane (131056 bytes, LLVM
# stops with "stack frame size exceeds limit" and exits), NVPTX's local memory (512 KiB per thread).
MAX_PRIVATE_BYTES = {False: 131056, True: 512 << 10}
_SCALAR_BYTES = re.compile(r"(?<![\w.])(?:[su]?i(\d+)|f(16|32|64)|bf16|!llvm\.ptr(?:<\d+>)?)(?![\w.])")


def _type_bytes(text: str) -> int | None:
    """Bytes of an (array of) scalar type, or None for anything else (structs, vectors: not estimated)."""
    count = 1
    while True:
        m = re.fullmatch(r"!llvm\.array<(\d+) x (.*)>", text) or re.fullmatch(r"array<(\d+) x (.*)>", text)
        if not m:
            break
        count, text = count * int(m.group(1)), m.group(2)
    m = _SCALAR_BYTES.fullmatch(text)
    if not m:
        return None
    bits = int(m.group(1)) if m.group(1) else int(m.group(2)) if m.group(2) else 16 if text == "bf16" else 64
    return count * max(1, -(-bits // 8))


def _alloca_bytes(op: ir.Operation) -> int | None:
    if op.name != "llvm.alloca" or "elem_type" not in op.attributes or not op.operands:
        return None
    size = _type_bytes(str(ir.TypeAttr(op.attributes["elem_type"]).value))
    owner = op.operands[0].owner
    count = None
    if isinstance(owner, ir.Operation) or hasattr(owner, "attributes"):
        attrs = owner.attributes
        if "value" in attrs and isinstance(attrs["value"], ir.IntegerAttr):
            count = attrs["value"].value
    return size * count if size is not None and count is not None else None


def lowered_problems(gpu_module: ir.Operation, where, *, nvptx: bool) -> list[str]:
    """Located problems of a lowered gpu.module that LLVM's back end for the target would abort on."""
    problems: list[str] = []
    scopes = SYNC_SCOPES[nvptx]

    def visit(op):
        op = op.operation
        found = None
        values = [str(v.type) for v in op.operands] + [str(r.type) for r in op.results]
        for region in op.regions:
            for block in region.blocks:
                values += [str(a.type) for a in block.arguments]
        for text in values:
            found = found or _value_type_problem(text)
        for name in ("function_type", "global_type", "elem_type"):
            if name in op.attributes:
                found = found or _type_problem(str(op.attributes[name]))
        if not found and op.name == "llvm.mlir.global" and "addr_space" in op.attributes:
            space = op.attributes["addr_space"]
            if isinstance(space, ir.IntegerAttr) and space.value not in ADDRESS_SPACES:
                found = _type_problem(f"!llvm.ptr<{space.value}>")
        if not found and "syncscope" in op.attributes:
            scope = op.attributes["syncscope"]
            if isinstance(scope, ir.StringAttr) and string_value(scope) not in scopes:
                found = (f"'{op.name}' syncscope \"{string_value(scope)}\" is not defined for this target (allowed: "
                         f"{', '.join(repr(s) for s in scopes)})")  # fmt: skip
        if not found and op.name == "llvm.inline_asm":
            found = _inline_asm_problem(op)
        if not found and op.name == "llvm.alloca":
            size = _alloca_bytes(op)
            if size is not None and size > MAX_PRIVATE_BYTES[nvptx]:
                found = (f"'llvm.alloca' of {size} bytes exceeds the {MAX_PRIVATE_BYTES[nvptx]} bytes of private memory "
                         "a GPU thread may have")  # fmt: skip
        if found:
            problems.append(f"{where(op)}: {found}")
        return ir.WalkResult.ADVANCE

    gpu_module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return problems
