"""The device ABI table (lib_bitcode/abi.py) against docs/device-abi.md §1.2/§1.3, and the stub bitcode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mori_compiler.lib_bitcode import abi
from mori_compiler.lib_bitcode.stub import STUB_MY_PE, STUB_N_PES, stub_llvm_ir, write_stub_bitcode

SPEC = Path(__file__).resolve().parents[2] / "docs/device-abi.md"
TRIPLES = ("amdgcn-amd-amdhsa", "nvptx64-nvidia-cuda")
NO_METADATA = {"long_p", "longlong_p", "char_p", "short_p", "uint_p", "ulong_p", "ulonglong_p", "uchar_p",
               "ushort_p"}


def _spec_text() -> str:
    return SPEC.read_text(encoding="utf-8")  # the repository's own ABI document: always present


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.index("\n### ", start + len(heading))
    return text[start:end]


def _ws(s: str) -> str:
    return " ".join(s.split())


def _unquote(cell: str) -> str:
    return cell.strip().strip("`").strip()


def _parse_metadata(cell: str) -> tuple[str, list[str], str, bool] | None:
    """``putmem_nbi_signal_thread`: (uint64 ×5, int32 ×3) → int32`` -> (key, args, ret, pure)."""
    cell = cell.strip()
    if cell == "—":
        return None
    m = re.fullmatch(r"`(\w+)`: \(([^)]*)\) → (\w+)(, `pure: True`)?", cell)
    assert m, f"unparsed metadata cell: {cell!r}"
    key, args_text, ret, pure = m.groups()
    args: list[str] = []
    for item in filter(None, (a.strip() for a in args_text.split(","))):
        rep = re.fullmatch(r"(\w+) ×(\d+)", item)
        args.extend([rep.group(1)] * int(rep.group(2)) if rep else [item])
    return key, args, ret, bool(pure)


@pytest.fixture(scope="module")
def spec_rows() -> list[dict]:
    table = _section(_spec_text(), "### 1.2 The 98 exported functions")
    rows = []
    for line in table.splitlines():
        if not re.match(r"\| \d+ \|", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 7, line
        rows.append({
            "index": int(cells[0]),
            "symbol": _unquote(cells[1]),
            "c_return": _unquote(cells[2]),
            "c_params": _ws(_unquote(cells[3])),
            "llvm": _ws(re.sub(r"\s*\[verify:[^\]]*\]", "", _unquote(cells[4]))),
            "metadata": _parse_metadata(cells[5]),
        })
    return rows


def test_row_count(spec_rows):
    assert len(spec_rows) == 98
    assert len(abi.ABI_FUNCTIONS) == 98
    assert [f.index for f in abi.ABI_FUNCTIONS] == list(range(1, 99))


def test_rows_match_spec(spec_rows):
    for row, fn in zip(spec_rows, abi.ABI_FUNCTIONS, strict=True):
        where = f"row {row['index']} ({row['symbol']})"
        assert fn.index == row["index"], where
        assert fn.symbol == row["symbol"], where
        assert fn.c_return == row["c_return"], where
        got_params = ", ".join(f"{p.c_type} {p.name}" for p in fn.params) or "void"
        assert _ws(got_params) == row["c_params"], where
        assert fn.llvm_signature == row["llvm"], where
        assert fn.llvm_declaration() == f"declare {fn.llvm_return} @{fn.symbol}({row['llvm'].split(' (', 1)[1]}", where
        meta = row["metadata"]
        assert fn.metadata_key == (meta[0] if meta else None), where
        if meta:
            key, args, ret, pure = meta
            entry = abi.MORI_DEVICE_FUNCTIONS[key]
            assert entry["symbol"] == fn.symbol, where
            assert entry["args"] == args, where
            assert entry["ret"] == ret, where
            assert entry.get("pure", False) is pure, where
            assert fn.pure is pure, where


def test_table_invariants():
    assert len(abi.ABI_BY_SYMBOL) == 98
    for fn in abi.ABI_FUNCTIONS:
        assert abi.abi_function(fn.symbol) is fn
        assert fn.family in abi.FAMILIES
        assert fn.llvm_param_types == tuple(p.llvm_type for p in fn.params)
        assert fn.llvm_return in ("i32", "i64")
    assert {f.family for f in abi.ABI_FUNCTIONS} == set(abi.FAMILIES)
    assert [f.symbol for f in abi.ABI_FUNCTIONS if f.pure] == ["mori_shmem_n_pes"]
    put = abi.abi_function("mori_shmem_putmem_nbi_signal_thread")
    assert put.param_names == ("dest", "source", "bytes", "signalDest", "signalValue", "signalOp", "pe", "qpId")
    assert put.params[5] == abi.AbiParam("signalOp", "atomicType", "i32")
    assert abi.abi_function("mori_shmem_ptr_p2p").param_names == ("destPtr", "myPe", "destPe")
    assert abi.abi_function("mori_shmem_putmem_nbi_thread").llvm_declaration() == (
        "declare i32 @mori_shmem_putmem_nbi_thread(ptr, ptr, i64, i32, i32)")
    with pytest.raises(KeyError, match="unknown device ABI symbol 'mori_shmem_nope'"):
        abi.abi_function("mori_shmem_nope")


def test_metadata_view():
    meta = abi.MORI_DEVICE_FUNCTIONS
    assert len(meta) == 89
    without = {f.symbol.removeprefix("mori_shmem_") for f in abi.ABI_FUNCTIONS if f.metadata_key is None}
    assert without == NO_METADATA
    assert meta["n_pes"] == {"symbol": "mori_shmem_n_pes", "args": [], "ret": "int32", "pure": True}
    assert [k for k, v in meta.items() if v.get("pure")] == ["n_pes"]
    for key, entry in meta.items():
        assert entry["symbol"] == "mori_shmem_" + key
        assert set(entry) <= {"symbol", "args", "ret", "pure"}


def test_atomic_type_matches_spec():
    section = _section(_spec_text(), "### 1.3 Constants and enums")
    spec = {}
    for value, name in re.findall(r"\| (\d+) \| `(\w+)`", section):
        spec[name] = int(value)
    assert len(spec) == 19
    assert spec == {m.name: m.value for m in abi.AtomicType if m.name in spec}
    assert [m.value for m in abi.AtomicType] == list(range(1, 20))  # canonical members, aliases excluded
    assert abi.SIGNAL_SET == 9 == abi.AtomicType.SIGNAL_SET == abi.AtomicType.AMO_SIGNAL_SET
    assert abi.SIGNAL_ADD == 10 == abi.AtomicType.SIGNAL_ADD == abi.AtomicType.AMO_SIGNAL_ADD
    assert abi.MORI_STATE_SYMBOL == "_ZN4mori5shmem15globalGpuStatesE"
    assert abi.MORI_STATE_SIZE == 80


@pytest.mark.parametrize("triple", TRIPLES)
def test_stub_defines_every_function(triple, tmp_path):
    llvm = pytest.importorskip("llvmlite.binding")
    text = stub_llvm_ir(triple)
    mod = llvm.parse_assembly(text)
    mod.verify()
    assert mod.triple == triple
    mod = llvm.parse_bitcode(mod.as_bitcode())
    for fn in abi.ABI_FUNCTIONS:
        ir_fn = mod.get_function(fn.symbol)
        assert not ir_fn.is_declaration, fn.symbol
        assert str(ir_fn.global_value_type) == fn.llvm_signature, fn.symbol
        assert ir_fn.linkage == llvm.Linkage.external, fn.symbol
        assert ir_fn.visibility == llvm.Visibility.default, fn.symbol
    state = mod.get_global_variable(abi.MORI_STATE_SYMBOL)
    assert str(state.global_value_type) == f"[{abi.MORI_STATE_SIZE} x i8]"
    assert state.visibility == llvm.Visibility.default
    assert "addrspace(1) externally_initialized global [80 x i8] zeroinitializer, align 8" in str(state)

    out = write_stub_bitcode(tmp_path / "sub" / "stub.bc", triple)
    again = llvm.parse_bitcode(out.read_bytes())
    assert sorted(f.name for f in again.functions) == sorted(abi.ABI_BY_SYMBOL)


def test_stub_bodies_and_selection():
    text = stub_llvm_ir("amdgcn-amd-amdhsa", symbols=["mori_shmem_my_pe", "mori_shmem_n_pes",
                                                      "mori_shmem_ptr", "mori_shmem_uint64_wait_until_greater_than",
                                                      "mori_shmem_atomic_uint32_fetch_thread",
                                                      "mori_shmem_putmem_nbi_thread"], define_state=False)
    assert abi.MORI_STATE_SYMBOL not in text
    assert text.count("define ") == 6
    assert f"@mori_shmem_my_pe() {{\nentry:\n  ret i32 {STUB_MY_PE}" in text
    assert f"@mori_shmem_n_pes() {{\nentry:\n  ret i32 {STUB_N_PES}" in text
    assert "@mori_shmem_ptr(i64 %dest, i32 %destPe) {\nentry:\n  ret i64 %dest" in text
    assert "ret i64 %val" in text and "ret i32 %val" in text
    assert "define i32 @mori_shmem_putmem_nbi_thread(ptr %dest, ptr %source, i64 %bytes, i32 %pe, i32 %qpId)" in text
    with pytest.raises(KeyError):
        stub_llvm_ir("amdgcn-amd-amdhsa", symbols=["mori_shmem_bogus"])
    with pytest.raises(ValueError):
        stub_llvm_ir("x86_64-unknown-linux-gnu")
