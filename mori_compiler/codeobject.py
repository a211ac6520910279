"""Reader for AMDGPU code objects (hsaco): ELF symbols, AMDHSA metadata, per-kernel resources.

The compiler links its kernels into an hsaco and then wants two things from the result without
depending on ROCm tools: a resource report (registers, LDS, scratch, spills per kernel) and a hard
error when the link left symbols undefined (a device library call that no linked bitcode defines
would otherwise only fail at load time on the GPU). Both need only a little of the ELF format and
of MessagePack, so this module implements exactly that, with the standard library alone.

Every malformed input is reported as ``CodeObjectError``; an ``IndexError`` or ``struct.error``
escaping from here is a bug.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mori_compiler.errors import MoriCompilerError

__all__ = [
    "CodeObjectError",
    "ElfSymbol",
    "KernelResources",
    "CodeObjectInfo",
    "read_elf_symbols",
    "read_amdgpu_code_object",
    "check_no_undefined_symbols",
    "format_resource_report",
    "decode_msgpack",
]

# ELF constants (System V gABI and the AMDGPU ELF ABI, llvm.org/docs/AMDGPUUsage.html).
ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EI_CLASS, EI_DATA, EI_ABIVERSION = 4, 5, 8
EM_AMDGPU = 224
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 7, 8, 11
PT_NOTE = 4
SHN_UNDEF, SHN_XINDEX = 0, 0xFFFF
STT_FUNC = 2
STB_GLOBAL, STB_WEAK = 1, 2
STV_DEFAULT, STV_PROTECTED = 0, 3
NT_AMDGPU_METADATA = 32
AMDGPU_NOTE_OWNER = "AMDGPU"

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_PHDR = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
_NHDR = struct.Struct("<III")  # Elf64_Nhdr: the same 3 x u32 as in ELF32

# Some common machines, only to make the "not an AMDGPU code object" message useful.
_MACHINE_NAMES = {3: "x86", 40: "ARM", 62: "x86-64", 183: "AArch64", 190: "CUDA", 243: "RISC-V"}


class CodeObjectError(MoriCompilerError):
    """The bytes are not a readable (AMDGPU) ELF code object, or it is unusable (undefined symbols)."""


@dataclass(frozen=True)
class ElfSymbol:
    """One entry of an ELF symbol table."""

    name: str
    value: int
    size: int
    type: int  # STT_*
    bind: int  # STB_*
    shndx: int  # section index; 0 (SHN_UNDEF) means "defined elsewhere"
    visibility: int = STV_DEFAULT  # STV_* (the low bits of st_other)

    @property
    def undefined(self) -> bool:
        """True for a named symbol that this object references but does not define."""
        return self.shndx == SHN_UNDEF and self.name != ""

    @property
    def exported(self) -> bool:
        """Defined, global or weak, and visible to the loader (default or protected visibility)."""
        return (self.shndx != SHN_UNDEF and self.bind in (STB_GLOBAL, STB_WEAK)
                and self.visibility in (STV_DEFAULT, STV_PROTECTED))  # fmt: skip


@dataclass(frozen=True)
class KernelResources:
    """What one kernel uses, as recorded by the AMDGPU backend in the code object metadata."""

    name: str
    vgpr_count: int
    agpr_count: int
    sgpr_count: int
    scratch_bytes: int
    lds_bytes: int
    kernarg_bytes: int
    wavefront_size: int
    code_bytes: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    max_flat_workgroup_size: int


@dataclass(frozen=True)
class CodeObjectInfo:
    """Everything this module extracts from an AMDGPU code object."""

    target: str
    code_object_version: tuple[int, ...]
    abi_version: int
    e_flags: int
    symbols: tuple[ElfSymbol, ...]
    kernels: tuple[KernelResources, ...]
    metadata: dict = field(compare=False)
    dynamic_symbols: tuple[ElfSymbol, ...] = ()  # .dynsym: what the loader (hipModuleGetGlobal) can find

    def undefined_symbols(self) -> list[str]:
        """Sorted, de-duplicated names of the symbols referenced but not defined."""
        return _undefined_names(self.symbols)

    def exported_symbols(self) -> dict[str, ElfSymbol]:
        """The dynamic symbols a host runtime can look up by name after loading the code object."""
        return {s.name: s for s in self.dynamic_symbols if s.exported}

    @property
    def gfx_name(self) -> str:
        """The processor, e.g. "gfx942" from "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"."""
        # Features follow the processor after ":" and may contain "-" ("xnack-"): cut them first.
        return self.target.split(":", 1)[0].rpartition("-")[2]


# --------------------------------------------------------------------------------------------
# ELF


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    align: int
    entsize: int


class _Elf:
    """A bounds-checked view of an ELF64 little-endian file: header, sections, segments."""

    def __init__(self, data: bytes, what: str):
        self.data = bytes(data)
        self.what = what
        self._check_ident()
        (_, self.e_type, self.e_machine, _, _, e_phoff, e_shoff, self.e_flags, _,
         e_phentsize, e_phnum, e_shentsize, e_shnum, _) = self.unpack(_EHDR, 0, "ELF header")
        self.abi_version = self.data[EI_ABIVERSION]
        self.sections = self._read_sections(e_shoff, e_shentsize, e_shnum)
        self.segments = self._read_segments(e_phoff, e_phentsize, e_phnum)

    def error(self, message: str) -> CodeObjectError:
        return CodeObjectError(f"{self.what}: {message}")

    def _check_ident(self) -> None:
        if self.data[:4] != ELF_MAGIC:
            raise self.error("not an ELF file (bad magic bytes)")
        if len(self.data) < _EHDR.size:
            raise self.error(f"truncated ELF file ({len(self.data)} bytes, header needs {_EHDR.size})")
        if self.data[EI_CLASS] != ELFCLASS64:
            raise self.error("not a 64-bit ELF file (AMDGPU code objects are ELF64)")
        if self.data[EI_DATA] != ELFDATA2LSB:
            raise self.error("not a little-endian ELF file (AMDGPU code objects are little-endian)")

    def unpack(self, fmt: struct.Struct, offset: int, what: str) -> tuple:
        if offset < 0 or offset + fmt.size > len(self.data):
            raise self.error(f"truncated or corrupt ELF file: {what} at offset {offset} is past the end "
                             f"({len(self.data)} bytes)")
        return fmt.unpack_from(self.data, offset)

    def blob(self, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(self.data):
            raise self.error(f"truncated or corrupt ELF file: {what} ({size} bytes at offset {offset}) "
                             f"is past the end ({len(self.data)} bytes)")
        return self.data[offset:offset + size]

    def _read_sections(self, shoff: int, entsize: int, count: int) -> list[_Section]:
        if shoff == 0:
            return []  # no section headers (allowed: loaders only need segments)
        if entsize < _SHDR.size:
            raise self.error(f"corrupt ELF file: section header size {entsize} < {_SHDR.size}")

        def header(i: int) -> _Section:
            (_, type_, _, _, offset, size, link, _, align, ent) = self.unpack(
                _SHDR, shoff + i * entsize, f"section header {i}")
            return _Section(type_, offset, size, link, align, ent)

        # Extended numbering: with >= 0xff00 sections the real count lives in section header 0.
        first = header(0)
        if count == 0:
            count = first.size
        if count * entsize > len(self.data):
            raise self.error(f"truncated or corrupt ELF file: {count} section headers do not fit")
        return [first] + [header(i) for i in range(1, count)]

    def _read_segments(self, phoff: int, entsize: int, count: int) -> list[tuple]:
        if phoff == 0 or count == 0:
            return []
        if entsize < _PHDR.size:
            raise self.error(f"corrupt ELF file: program header size {entsize} < {_PHDR.size}")
        return [self.unpack(_PHDR, phoff + i * entsize, f"program header {i}") for i in range(count)]

    def section_data(self, section: _Section, what: str) -> bytes:
        if section.type == SHT_NOBITS:
            return b""
        return self.blob(section.offset, section.size, what)

    def string_at(self, table: bytes, offset: int, what: str) -> str:
        if offset >= len(table) and offset != 0:
            raise self.error(f"corrupt ELF file: {what} name offset {offset} outside its string table")
        end = table.find(b"\0", offset)
        return table[offset:end if end >= 0 else len(table)].decode("utf-8", errors="replace")

    def symbols(self, kinds=(SHT_SYMTAB, SHT_DYNSYM)) -> list[ElfSymbol]:
        # .symtab is the complete table; a stripped object only keeps the dynamic one.
        for wanted in kinds:
            tables = [s for s in self.sections if s.type == wanted]
            if tables:
                return [sym for table in tables for sym in self._symbol_table(table)]
        return []

    def _symbol_table(self, table: _Section) -> list[ElfSymbol]:
        entsize = table.entsize or _SYM.size
        if entsize < _SYM.size:
            raise self.error(f"corrupt ELF file: symbol entry size {entsize} < {_SYM.size}")
        if not 0 <= table.link < len(self.sections):
            raise self.error(f"corrupt ELF file: symbol table links to missing section {table.link}")
        raw = self.section_data(table, "symbol table")
        names = self.section_data(self.sections[table.link], "symbol string table")
        symbols = []
        for offset in range(0, len(raw) - _SYM.size + 1, entsize):
            name, info, other, shndx, value, size = _SYM.unpack_from(raw, offset)
            symbols.append(ElfSymbol(name=self.string_at(names, name, "symbol"), value=value, size=size,
                                     type=info & 0xF, bind=info >> 4, shndx=shndx, visibility=other & 0x3))
        return symbols

    def notes(self) -> list[tuple[str, int, bytes]]:
        """(owner, type, descriptor) of every note, from note sections or else note segments."""
        regions = [(s.offset, s.size, s.align) for s in self.sections if s.type == SHT_NOTE]
        if not regions:  # section headers stripped: the PT_NOTE segments cover the same bytes
            regions = [(p[2], p[5], p[7]) for p in self.segments if p[0] == PT_NOTE]
        notes = []
        for offset, size, align in regions:
            notes.extend(self._parse_notes(self.blob(offset, size, "note"), align))
        return notes

    def _parse_notes(self, raw: bytes, align: int) -> list[tuple[str, int, bytes]]:
        # hsaco notes are 4-byte aligned; 8 is the other alignment the gABI tools accept (as LLVM,
        # treat anything else as 4). Name and descriptor are each padded to it.
        align = 8 if align == 8 else 4
        notes, pos = [], 0
        while pos + _NHDR.size <= len(raw):
            namesz, descsz, note_type = _NHDR.unpack_from(raw, pos)
            desc_start = _align_up(pos + _NHDR.size + namesz, align)
            desc_end = desc_start + descsz
            if desc_end > len(raw):
                raise self.error(f"corrupt ELF file: note at offset {pos} overruns its section")
            owner = raw[pos + _NHDR.size:pos + _NHDR.size + namesz].rstrip(b"\0")
            notes.append((owner.decode("utf-8", errors="replace"), note_type, raw[desc_start:desc_end]))
            pos = _align_up(desc_end, align)
        return notes


def _align_up(value: int, align: int) -> int:
    return (value + align - 1) & ~(align - 1)


def _undefined_names(symbols) -> list[str]:
    return sorted({s.name for s in symbols if s.undefined})


def read_elf_symbols(data: bytes) -> list[ElfSymbol]:
    """The symbols of any ELF64 little-endian file: .symtab, or .dynsym if it was stripped."""
    return _Elf(data, "ELF file").symbols()


def check_no_undefined_symbols(data: bytes, what: str = "code object") -> None:
    """Raise CodeObjectError naming every undefined symbol of the ELF file ``data``.

    The GPU loader cannot resolve device symbols against anything, so an undefined symbol in an
    hsaco (a called device library function that no linked bitcode defines) is always an error.
    """
    undefined = _undefined_names(_Elf(data, what).symbols())
    if undefined:
        raise CodeObjectError(
            f"{what} has undefined symbols: {', '.join(undefined)}; link a device bitcode that "
            f"defines them (--bitcode) or remove the calls")


# --------------------------------------------------------------------------------------------
# AMDHSA metadata


def read_amdgpu_code_object(data: bytes) -> CodeObjectInfo:
    """Parse an AMDGPU code object (v3 and later): target, version, symbols and kernel resources."""
    elf = _Elf(data, "code object")
    if elf.e_machine != EM_AMDGPU:
        machine = _MACHINE_NAMES.get(elf.e_machine, "unknown")
        raise elf.error(f"not an AMDGPU code object: ELF machine is {elf.e_machine} ({machine}), "
                        f"expected EM_AMDGPU ({EM_AMDGPU})")
    metadata = _read_metadata(elf)
    symbols = tuple(elf.symbols())
    kernels = metadata.get("amdhsa.kernels", [])
    if not isinstance(kernels, list):
        raise elf.error("corrupt metadata: amdhsa.kernels is not a list")
    return CodeObjectInfo(
        target=_metadata_str(elf, metadata, "amdhsa.target"),
        code_object_version=_metadata_version(elf, metadata),
        abi_version=elf.abi_version,
        e_flags=elf.e_flags,
        symbols=symbols,
        kernels=tuple(_kernel_resources(elf, k, symbols) for k in kernels),
        metadata=metadata,
        dynamic_symbols=tuple(elf.symbols((SHT_DYNSYM,))),
    )


def _read_metadata(elf: _Elf) -> dict:
    for owner, note_type, desc in elf.notes():
        if owner == AMDGPU_NOTE_OWNER and note_type == NT_AMDGPU_METADATA:
            try:
                metadata, end = _Msgpack(desc).read(0)
            except CodeObjectError as e:
                raise elf.error(f"corrupt AMDGPU metadata note: {e}") from None
            # Tolerate zero padding after the map, which some writers include in descsz.
            if desc[end:].strip(b"\0") or not isinstance(metadata, dict):
                raise elf.error("corrupt AMDGPU metadata note: not a single msgpack map")
            return metadata
    raise elf.error(f"no AMDGPU metadata note (owner {AMDGPU_NOTE_OWNER!r}, type NT_AMDGPU_METADATA = "
                    f"{NT_AMDGPU_METADATA}); code objects before v3 are not supported")


def _metadata_str(elf: _Elf, metadata: dict, key: str) -> str:
    value = metadata.get(key, "")
    if not isinstance(value, str):
        raise elf.error(f"corrupt metadata: {key} is not a string")
    return value


def _metadata_version(elf: _Elf, metadata: dict) -> tuple[int, ...]:
    version = metadata.get("amdhsa.version")
    if not isinstance(version, list) or not version or not all(_is_int(v) for v in version):
        raise elf.error(f"corrupt metadata: amdhsa.version is {version!r}, expected [major, minor]")
    return tuple(version)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kernel_resources(elf: _Elf, kernel: object, symbols: tuple[ElfSymbol, ...]) -> KernelResources:
    if not isinstance(kernel, dict) or not isinstance(kernel.get(".name"), str):
        raise elf.error("corrupt metadata: an amdhsa.kernels entry is not a map with a .name")
    name = kernel[".name"]

    def get(key: str, default: int | None = None) -> int:
        value = kernel.get(key, default)
        if value is None:
            raise elf.error(f"corrupt metadata: kernel {name!r} has no {key}")
        if not _is_int(value):
            raise elf.error(f"corrupt metadata: kernel {name!r} has a non-integer {key}: {value!r}")
        return value

    # ".symbol" names the kernel descriptor ("<name>.kd"); the machine code is the FUNC "<name>".
    code = [s.size for s in symbols if s.name == name and s.type == STT_FUNC and not s.undefined]
    return KernelResources(
        name=name,
        vgpr_count=get(".vgpr_count"),
        agpr_count=get(".agpr_count", 0),  # only emitted for targets with AGPRs
        sgpr_count=get(".sgpr_count"),
        scratch_bytes=get(".private_segment_fixed_size"),
        lds_bytes=get(".group_segment_fixed_size"),
        kernarg_bytes=get(".kernarg_segment_size"),
        wavefront_size=get(".wavefront_size"),
        code_bytes=code[0] if code else 0,  # 0: no symbol table left to tell
        vgpr_spill_count=get(".vgpr_spill_count", 0),
        sgpr_spill_count=get(".sgpr_spill_count", 0),
        max_flat_workgroup_size=get(".max_flat_workgroup_size"),
    )


# Report columns: (header, how to get the cell from a KernelResources).
_REPORT_COLUMNS = (
    ("kernel", lambda k: k.name),
    ("VGPR", lambda k: k.vgpr_count),
    ("AGPR", lambda k: k.agpr_count),
    ("SGPR", lambda k: k.sgpr_count),
    ("scratch", lambda k: k.scratch_bytes),
    ("LDS", lambda k: k.lds_bytes),
    ("kernarg", lambda k: k.kernarg_bytes),
    ("wave", lambda k: k.wavefront_size),
    ("max WG", lambda k: k.max_flat_workgroup_size),
    ("code bytes", lambda k: k.code_bytes),
    ("VGPR spills", lambda k: k.vgpr_spill_count),
    ("SGPR spills", lambda k: k.sgpr_spill_count),
)


def format_resource_report(info: CodeObjectInfo) -> str:
    """A human-readable table: a header line, then one row of resources per kernel."""
    version = ".".join(str(v) for v in info.code_object_version)
    # For the AMDHSA OS ABI, EI_ABIVERSION n means code object v(n + 2) (1 = v3 ... 4 = v6).
    code_object = f"v{info.abi_version + 2}" if info.abi_version >= 1 else "version unknown"
    lines = [f"{info.target or '(unknown target)'}: code object {code_object} "
             f"(ELF ABI version {info.abi_version}, metadata version {version}), "
             f"{len(info.kernels)} kernel(s)"]
    rows = [[header for header, _ in _REPORT_COLUMNS]]
    rows += [[str(cell(k)) for _, cell in _REPORT_COLUMNS] for k in info.kernels]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_REPORT_COLUMNS))]
    for row in rows:
        # Name left-aligned, numbers right-aligned so that magnitudes line up.
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# MessagePack (the AMDHSA metadata encoding): decoding only, and only what the spec defines
# besides the ext types, which the metadata never uses.

_MAX_DEPTH = 100  # nesting deeper than this is corrupt input, not metadata; avoids RecursionError


class _Msgpack:
    """A recursive-descent MessagePack decoder over one buffer."""

    # Fixed-size scalars: type byte -> struct format (big-endian, as MessagePack is).
    _SCALARS = {
        0xCA: ">f", 0xCB: ">d",
        0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
        0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
    }
    # Length-prefixed items: type byte -> (kind, length format).
    _SIZED = {
        0xD9: ("str", ">B"), 0xDA: ("str", ">H"), 0xDB: ("str", ">I"),
        0xC4: ("bin", ">B"), 0xC5: ("bin", ">H"), 0xC6: ("bin", ">I"),
        0xDC: ("array", ">H"), 0xDD: ("array", ">I"),
        0xDE: ("map", ">H"), 0xDF: ("map", ">I"),
    }
    _EXT = {0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8}

    def __init__(self, data: bytes):
        self.data = bytes(data)

    def _take(self, pos: int, size: int) -> bytes:
        if pos + size > len(self.data):
            raise CodeObjectError(f"msgpack data truncated: need {size} bytes at offset {pos}, "
                                  f"have {len(self.data) - pos}")
        return self.data[pos:pos + size]

    def _unpack(self, fmt: str, pos: int) -> tuple[object, int]:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._take(pos, size))[0], pos + size

    def read(self, pos: int, depth: int = 0) -> tuple[object, int]:
        """Decode the object at ``pos``; return it and the offset just after it."""
        if depth > _MAX_DEPTH:
            raise CodeObjectError(f"msgpack data nested deeper than {_MAX_DEPTH} levels")
        tag = self._take(pos, 1)[0]
        pos += 1
        if tag <= 0x7F:  # positive fixint
            return tag, pos
        if tag >= 0xE0:  # negative fixint
            return tag - 0x100, pos
        if 0xA0 <= tag <= 0xBF:  # fixstr
            return self._str(pos, tag & 0x1F)
        if 0x90 <= tag <= 0x9F:  # fixarray
            return self._array(pos, tag & 0x0F, depth)
        if 0x80 <= tag <= 0x8F:  # fixmap
            return self._map(pos, tag & 0x0F, depth)
        if tag in (0xC0, 0xC2, 0xC3):
            return {0xC0: None, 0xC2: False, 0xC3: True}[tag], pos
        if tag in self._SCALARS:
            return self._unpack(self._SCALARS[tag], pos)
        if tag in self._SIZED:
            kind, length_fmt = self._SIZED[tag]
            length, pos = self._unpack(length_fmt, pos)
            if kind == "str":
                return self._str(pos, length)
            if kind == "bin":
                return self._take(pos, length), pos + length
            if kind == "array":
                return self._array(pos, length, depth)
            return self._map(pos, length, depth)
        if tag in self._EXT:
            raise CodeObjectError(f"msgpack ext type 0x{tag:02x} at offset {pos - 1} is not supported")
        raise CodeObjectError(f"invalid msgpack type byte 0x{tag:02x} at offset {pos - 1}")

    def _str(self, pos: int, length: int) -> tuple[str, int]:
        try:
            return self._take(pos, length).decode("utf-8"), pos + length
        except UnicodeDecodeError:
            raise CodeObjectError(f"msgpack string at offset {pos} is not valid UTF-8") from None

    def _array(self, pos: int, count: int, depth: int) -> tuple[list, int]:
        # Append one by one rather than preallocating: a corrupt count must not allocate 4 G slots.
        items = []
        for _ in range(count):
            item, pos = self.read(pos, depth + 1)
            items.append(item)
        return items, pos

    def _map(self, pos: int, count: int, depth: int) -> tuple[dict, int]:
        result = {}
        for _ in range(count):
            key, pos = self.read(pos, depth + 1)
            value, pos = self.read(pos, depth + 1)
            result[_hashable(key)] = value
        return result, pos


def _hashable(key: object) -> object:
    """Map keys may be arrays or maps in MessagePack; Python dict keys must be hashable."""
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, dict):
        return tuple((k, _hashable(v)) for k, v in key.items())
    return key


def decode_msgpack(data: bytes) -> object:
    """Decode one MessagePack object that spans all of ``data``; raise CodeObjectError if invalid.

    Supported: nil, bool, all ints, float32/64, str, bin, array and map; ext types are rejected.
    """
    decoder = _Msgpack(data)
    value, end = decoder.read(0)
    if end != len(decoder.data):
        raise CodeObjectError(f"msgpack data has {len(decoder.data) - end} trailing bytes after the object")
    return value
