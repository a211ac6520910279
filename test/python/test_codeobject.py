"""Tests for mori_compiler.codeobject, on code objects built here from LLVM IR.

The kernels are compiled with llvmlite's AMDGPU backend and linked with the ld.lld that ships in
the ziglang wheel, so nothing binary is committed and the code objects are as real as the
compiler's own. llvm-readelf-22 serves as the independent reference where it is installed.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mori_compiler.codeobject import (
    CodeObjectError,
    CodeObjectInfo,
    ElfSymbol,
    KernelResources,
    check_no_undefined_symbols,
    decode_msgpack,
    format_resource_report,
    read_amdgpu_code_object,
    read_elf_symbols,
)
from mori_compiler.errors import MoriCompilerError

llvm = pytest.importorskip("llvmlite.binding")

READELF = "/usr/bin/llvm-readelf-22"
TRIPLE = "amdgcn-amd-amdhsa"
CPUS = ["gfx942", "gfx950", "gfx1250"]

ONE_KERNEL_IR = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @k(ptr addrspace(1) %p) {
  store i32 1, ptr addrspace(1) %p
  ret void
}
"""

# Two kernels, the second with 4 KiB of LDS that it really uses (so it is not optimized away).
TWO_KERNELS_LDS_IR = """
target triple = "amdgcn-amd-amdhsa"
@lds = internal addrspace(3) global [1024 x i32] undef, align 4
define amdgpu_kernel void @plain(ptr addrspace(1) %p) {
  store i32 1, ptr addrspace(1) %p
  ret void
}
define amdgpu_kernel void @with_lds(ptr addrspace(1) %p, i32 %i) {
  %slot = getelementptr [1024 x i32], ptr addrspace(3) @lds, i32 0, i32 %i
  store i32 %i, ptr addrspace(3) %slot
  %v = load volatile i32, ptr addrspace(3) @lds
  store i32 %v, ptr addrspace(1) %p
  ret void
}
"""

# Calls a device function nobody defines: -shared links it anyway, leaving it undefined.
UNDEFINED_CALL_IR = """
target triple = "amdgcn-amd-amdhsa"
declare i32 @mori_shmem_missing()
define amdgpu_kernel void @k(ptr addrspace(1) %p) {
  %v = call i32 @mori_shmem_missing()
  store i32 %v, ptr addrspace(1) %p
  ret void
}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(ir, cpu, *ld_args) -> (hsaco path, bytes); cached, as each build costs ~0.2 s."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    out_dir = tmp_path_factory.mktemp("hsaco")
    cache: dict = {}

    def _build(ir: str, cpu: str, *ld_args: str) -> tuple[Path, bytes]:
        key = (ir, cpu, ld_args)
        if key not in cache:
            tm = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=cpu, opt=2, reloc="pic")
            stem = out_dir / f"k{len(cache)}_{cpu}"
            obj, hsaco = stem.with_suffix(".o"), stem.with_suffix(".hsaco")
            obj.write_bytes(tm.emit_object(llvm.parse_assembly(ir)))
            subprocess.run([sys.executable, "-m", "ziglang", "ld.lld", "-shared", *ld_args,
                            str(obj), "-o", str(hsaco)], check=True, capture_output=True)
            cache[key] = (hsaco, hsaco.read_bytes())
        return cache[key]

    return _build


def readelf(*args: str) -> str:
    if not os.path.exists(READELF):
        pytest.skip("llvm-readelf-22 not installed")
    return subprocess.run([READELF, *args], check=True, capture_output=True, text=True).stdout


def readelf_kernel_notes(path: Path) -> dict[str, dict[str, str]]:
    """Kernel-level keys of `llvm-readelf --notes` (YAML), by kernel name; .args are skipped."""
    kernels, current = {}, None
    for line in readelf("--notes", str(path)).splitlines():
        # Kernel keys sit at indent 4 ("  - " starts a new kernel); argument keys are deeper.
        match = re.match(r"^  (- |  )\.(\w+):\s+(\S+)$", line)
        if line.startswith("  - ."):
            current = {}
        if match and current is not None:
            current[match.group(2)] = match.group(3)
            if match.group(2) == "name":
                kernels[match.group(3)] = current
    return kernels


def readelf_symtab_sizes(path: Path) -> dict[str, int]:
    """FUNC symbol sizes from the .symtab part of `llvm-readelf -s`."""
    sizes, in_symtab = {}, False
    for line in readelf("-s", str(path)).splitlines():
        if line.startswith("Symbol table"):
            in_symtab = "'.symtab'" in line
        fields = line.split()
        if in_symtab and len(fields) == 8 and fields[3] == "FUNC":
            sizes[fields[7]] = int(fields[2], 0)
    return sizes


# --------------------------------------------------------------------------------------------
# Real code objects


@pytest.mark.parametrize("cpu", CPUS)
def test_resources_match_llvm_readelf(build, cpu):
    path, data = build(TWO_KERNELS_LDS_IR, cpu)
    info = read_amdgpu_code_object(data)
    notes = readelf_kernel_notes(path)
    sizes = readelf_symtab_sizes(path)
    assert sorted(k.name for k in info.kernels) == sorted(notes) == ["plain", "with_lds"]
    for kernel in info.kernels:
        expected = notes[kernel.name]
        assert kernel.vgpr_count == int(expected["vgpr_count"])
        assert kernel.sgpr_count == int(expected["sgpr_count"])
        assert kernel.agpr_count == int(expected.get("agpr_count", 0))
        assert kernel.kernarg_bytes == int(expected["kernarg_segment_size"])
        assert kernel.lds_bytes == int(expected["group_segment_fixed_size"])
        assert kernel.scratch_bytes == int(expected["private_segment_fixed_size"])
        assert kernel.wavefront_size == int(expected["wavefront_size"])
        assert kernel.max_flat_workgroup_size == int(expected["max_flat_workgroup_size"])
        assert kernel.code_bytes == sizes[kernel.name] > 0


@pytest.mark.parametrize("cpu, wave", [("gfx942", 64), ("gfx950", 64), ("gfx1250", 32)])
def test_target_wave_size_and_version(build, cpu, wave):
    _, data = build(ONE_KERNEL_IR, cpu)
    info = read_amdgpu_code_object(data)
    assert info.gfx_name == cpu
    assert info.target == f"{TRIPLE}--{cpu}"
    assert info.abi_version == 4  # llvmlite's default is code object v6
    assert info.code_object_version == (1, 2)
    assert [k.name for k in info.kernels] == ["k"]
    assert info.kernels[0].wavefront_size == wave
    assert info.kernels[0].lds_bytes == 0
    assert info.undefined_symbols() == []
    assert isinstance(info.metadata["amdhsa.kernels"], list)
    check_no_undefined_symbols(data)  # does not raise


def test_lds_and_two_kernels(build):
    _, data = build(TWO_KERNELS_LDS_IR, "gfx942")
    kernels = {k.name: k for k in read_amdgpu_code_object(data).kernels}
    assert set(kernels) == {"plain", "with_lds"}
    assert kernels["with_lds"].lds_bytes >= 4096
    assert kernels["plain"].lds_bytes == 0
    assert all(isinstance(k, KernelResources) for k in kernels.values())


def test_resource_report_lists_every_kernel(build):
    _, data = build(TWO_KERNELS_LDS_IR, "gfx942")
    info = read_amdgpu_code_object(data)
    header, columns, *rows = format_resource_report(info).splitlines()
    assert f"{TRIPLE}--gfx942" in header and "code object v6" in header
    for name in ("VGPR", "AGPR", "SGPR", "scratch", "LDS", "kernarg", "wave", "code bytes", "spills"):
        assert name in columns
    assert len(rows) == 2
    lds_row = next(r.split() for r in rows if r.split()[0] == "with_lds")
    k = next(k for k in info.kernels if k.name == "with_lds")
    assert lds_row[1:] == [str(v) for v in (
        k.vgpr_count, k.agpr_count, k.sgpr_count, k.scratch_bytes, k.lds_bytes, k.kernarg_bytes,
        k.wavefront_size, k.max_flat_workgroup_size, k.code_bytes, k.vgpr_spill_count,
        k.sgpr_spill_count)]


def test_undefined_symbol_is_reported(build):
    _, data = build(UNDEFINED_CALL_IR, "gfx942")
    info = read_amdgpu_code_object(data)
    assert info.undefined_symbols() == ["mori_shmem_missing"]
    undefined = [s for s in read_elf_symbols(data) if s.undefined]
    assert [s.name for s in undefined] == ["mori_shmem_missing"]
    with pytest.raises(CodeObjectError, match=r"kernel\.hsaco has undefined symbols: mori_shmem_missing;"):
        check_no_undefined_symbols(data, what="kernel.hsaco")


def test_stripped_code_object_uses_dynsym(build):
    # Without .symtab the dynamic symbol table still exposes kernels and undefined symbols.
    _, data = build(UNDEFINED_CALL_IR, "gfx942", "--strip-all")
    info = read_amdgpu_code_object(data)
    assert info.kernels[0].code_bytes > 0
    with pytest.raises(CodeObjectError, match="mori_shmem_missing"):
        check_no_undefined_symbols(data)


def test_elf_symbol_undefined_property():
    assert ElfSymbol("f", 0, 0, 0, 1, 0).undefined
    assert not ElfSymbol("", 0, 0, 0, 0, 0).undefined  # the null symbol
    assert not ElfSymbol("f", 16, 4, 2, 1, 5).undefined
    assert not ElfSymbol("abs", 1, 0, 0, 0, 0xFFF1).undefined  # SHN_ABS


# --------------------------------------------------------------------------------------------
# Note alignment, via a minimal hand-built ELF around the real metadata


def _metadata_descriptor(hsaco: bytes) -> bytes:
    """The msgpack descriptor of the AMDGPU note of a linked (4-byte aligned notes) hsaco."""
    name_at = hsaco.index(b"AMDGPU\0\0")
    _, descsz, note_type = struct.unpack_from("<III", hsaco, name_at - 12)
    assert note_type == 32
    return hsaco[name_at + 8:name_at + 8 + descsz]


def _minimal_elf(notes: bytes, align: int, machine: int = 224) -> bytes:
    """ELF64 header + one SHT_NOTE section + null and note section headers; no symbols."""
    notes_at = 64
    shoff = notes_at + len(notes) + (-len(notes) % 8)
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01\x40\x04" + b"\0" * 7,
                         3, machine, 1, 0, 0, shoff, 0x54C, 64, 56, 0, 64, 2, 0)
    null = b"\0" * 64
    note_section = struct.pack("<IIQQQQIIQQ", 0, 7, 2, 0, notes_at, len(notes), 0, 0, align, 0)
    return header + notes + b"\0" * (shoff - notes_at - len(notes)) + null + note_section


def _note(owner: bytes, note_type: int, desc: bytes, align: int) -> bytes:
    name = owner + b"\0"
    head = struct.pack("<III", len(name), len(desc), note_type) + name
    head += b"\0" * (-len(head) % align)
    return head + desc + b"\0" * (-len(desc) % align)


@pytest.mark.parametrize("align", [4, 8])
def test_note_alignment(build, align):
    desc = _metadata_descriptor(build(ONE_KERNEL_IR, "gfx950")[1])
    # A foreign note first, so that the second note's offset depends on the padding rules.
    notes = _note(b"GNU", 5, b"\1\2\3", align) + _note(b"AMDGPU", 32, desc, align)
    info = read_amdgpu_code_object(_minimal_elf(notes, align))
    assert info.gfx_name == "gfx950"
    assert info.abi_version == 4
    assert info.symbols == ()
    assert [(k.name, k.code_bytes) for k in info.kernels] == [("k", 0)]


# --------------------------------------------------------------------------------------------
# Bad input: always a CodeObjectError with a clear message, never IndexError / struct.error


def test_not_an_elf():
    for data in (b"", b"\x7fEL", b"hello world, this is not an ELF file at all" * 4):
        with pytest.raises(CodeObjectError, match="not an ELF file"):
            read_amdgpu_code_object(data)
        with pytest.raises(CodeObjectError, match="not an ELF file"):
            check_no_undefined_symbols(data)


def test_truncated_elf(build):
    _, data = build(ONE_KERNEL_IR, "gfx942")
    with pytest.raises(CodeObjectError, match="truncated"):
        read_amdgpu_code_object(data[:40])
    with pytest.raises(CodeObjectError, match="truncated"):
        read_amdgpu_code_object(data[:len(data) - 100])  # section headers are at the end


def test_every_truncation_and_corruption_is_a_code_object_error(build):
    _, data = build(TWO_KERNELS_LDS_IR, "gfx942")
    for end in range(0, len(data), 97):
        with pytest.raises(CodeObjectError):
            read_amdgpu_code_object(data[:end])
    # Flipped bytes may or may not break parsing, but must never raise anything else.
    for offset in range(0, len(data), 13):
        corrupt = bytearray(data)
        corrupt[offset] ^= 0xFF
        try:
            read_amdgpu_code_object(bytes(corrupt))
        except CodeObjectError:
            pass


def test_x86_elf_is_rejected():
    true = Path("/bin/true").resolve().read_bytes()
    assert struct.unpack_from("<H", true, 18)[0] == 62  # EM_X86_64
    with pytest.raises(CodeObjectError, match=r"not an AMDGPU code object: ELF machine is 62 \(x86-64\)"):
        read_amdgpu_code_object(true)
    # Symbols of any ELF64 are readable, and it is still an error the lead can catch generically.
    assert isinstance(read_elf_symbols(true), list)
    assert issubclass(CodeObjectError, MoriCompilerError)


def test_32_bit_and_big_endian_elf_are_rejected():
    with pytest.raises(CodeObjectError, match="not a 64-bit ELF"):
        read_amdgpu_code_object(b"\x7fELF\x01\x01\x01" + b"\0" * 60)
    with pytest.raises(CodeObjectError, match="not a little-endian ELF"):
        read_amdgpu_code_object(b"\x7fELF\x02\x02\x01" + b"\0" * 60)


def test_amdgpu_elf_without_metadata_note():
    with pytest.raises(CodeObjectError, match="no AMDGPU metadata note"):
        read_amdgpu_code_object(_minimal_elf(_note(b"GNU", 5, b"1234", 4), 4))


def test_code_object_info_is_frozen_and_gfx_name_drops_features():
    info = CodeObjectInfo("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", (1, 2), 4, 0, (), (), {})
    assert info.gfx_name == "gfx942"
    with pytest.raises(AttributeError):
        info.target = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# decode_msgpack


@pytest.mark.parametrize("encoded, value", [
    (b"\xc0", None), (b"\xc2", False), (b"\xc3", True),
    # positive and negative fixint
    (b"\x00", 0), (b"\x7f", 127), (b"\xff", -1), (b"\xe0", -32),
    # uint8..64
    (b"\xcc\xff", 255), (b"\xcd\x01\x00", 256), (b"\xce\x00\x01\x00\x00", 65536),
    (b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 2**64 - 1),
    # int8..64
    (b"\xd0\x80", -128), (b"\xd1\xff\x7f", -129), (b"\xd2\x80\x00\x00\x00", -2**31),
    (b"\xd3\xff\xff\xff\xff\xff\xff\xff\xfe", -2),
    # float32/64
    (b"\xca\x3f\xc0\x00\x00", 1.5), (b"\xcb\xc0\x04\x00\x00\x00\x00\x00\x00", -2.5),
    # fixstr, str8/16/32
    (b"\xa0", ""), (b"\xa3abc", "abc"), (b"\xd9\x02hi", "hi"),
    (b"\xda\x01\x00" + b"x" * 256, "x" * 256), (b"\xdb\x00\x00\x00\x02\xc3\xa9", "\u00e9"),
    # bin8/16/32
    (b"\xc4\x02\x00\x01", b"\x00\x01"), (b"\xc5\x00\x01\xff", b"\xff"), (b"\xc6\x00\x00\x00\x00", b""),
    # fixarray, array16/32
    (b"\x90", []), (b"\x93\x01\xa1a\xc0", [1, "a", None]), (b"\xdc\x00\x02\x01\x02", [1, 2]),
    (b"\xdd\x00\x00\x00\x01\x91\x07", [[7]]),
    # fixmap, map32, array keys become tuples
    (b"\x80", {}), (b"\x82\xa1a\x01\xa1b\x92\xff\xc3", {"a": 1, "b": [-1, True]}),
    (b"\xdf\x00\x00\x00\x01\xa1k\x80", {"k": {}}), (b"\x81\x92\x01\x02\xc0", {(1, 2): None}),
])
def test_decode_msgpack(encoded, value):
    decoded = decode_msgpack(encoded)
    assert decoded == value and type(decoded) is type(value)


def test_decode_msgpack_map16():
    encoded = b"\xde\x00\x11" + b"".join(bytes([0xA1, ord("a") + i, i]) for i in range(17))
    assert decode_msgpack(encoded) == {chr(ord("a") + i): i for i in range(17)}


@pytest.mark.parametrize("encoded, message", [
    (b"", "truncated"), (b"\xcd\x01", "truncated"), (b"\xa5abc", "truncated"),
    (b"\xdd\xff\xff\xff\xff", "truncated"),  # a huge count must fail fast, not allocate
    (b"\x92\x01", "truncated"), (b"\x81\xa1a", "truncated"),
    (b"\xd4\x01\x00", "ext type"), (b"\xc7\x01\x05\x00", "ext type"), (b"\xc1", "invalid"),
    (b"\xa2\xff\xfe", "UTF-8"), (b"\x01\x02", "trailing"), (b"\x91" * 1000 + b"\xc0", "nested"),
])
def test_decode_msgpack_errors(encoded, message):
    with pytest.raises(CodeObjectError, match=message):
        decode_msgpack(encoded)
