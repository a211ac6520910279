"""The device ABI of MORI's shmem bitcode (``libmori_shmem_device.bc``): the one table of its 98 functions.

Everything in ``mori_compiler`` that names a MORI device function (the dialect lowering, the link checks,
the stub bitcode for tests) reads this table; nothing else spells a symbol or a signature. The source is
``docs/device-abi.md`` §1.2 (functions), §1.3 (enums) and §3.1 (the state global).

How the table is built
----------------------
Each function is written once as its C declaration (return type, parameter list) in the spec's order; the
rows that differ only by execution scope (``thread``/``warp``/``block``) or by element type
(``uint32``/``uint64``/``float``/``double``...) come from small loops. Everything else is *derived* from the
C types, so a row cannot drift between its C, LLVM and metadata views:

* **LLVM types** follow the LP64 rules shared by x86-64 and amdgcn: every ``void*``/``T*`` is ``ptr``
  (addrspace 0, i.e. flat on AMDGPU); ``size_t``, ``uint64_t``, ``int64_t``, ``long``, ``long long`` and their
  unsigned forms are ``i64``; ``int``, ``unsigned int``, ``int32_t``, ``uint32_t`` and the ``atomicType`` enum
  are ``i32``; ``short`` is ``i16``; ``char`` is ``i8``; ``float``/``double`` are unchanged; ``const`` is
  dropped. (Clang may add ``signext``/``zeroext`` to the ``char``/``short`` parameters of the ``*_p``
  functions; the types themselves are ``i8``/``i16``.)
* **Pointers are real pointers.** Declare ``ptr`` and ``inttoptr`` an ``i64`` address at the call site. The
  exceptions are ``mori_shmem_ptr_p2p`` and ``mori_shmem_ptr``, which take and return ``uint64_t``
  (``i64``) addresses.
* **Return values:** every ``int``-returning function returns the constant 0 (the value exists only for
  Triton's elementwise externs); ``*_fetch*`` and ``*_wait_until_greater_than`` return the fetched/observed
  value; ``my_pe``/``n_pes`` return the rank and world size; ``ptr_p2p``/``ptr`` return the translated address
  (or 0).
* **Metadata view** (``MORI_DEVICE_FUNCTIONS``, mirroring ``mori.ir.MORI_DEVICE_FUNCTIONS``): the Triton/FlyDSL
  view of 89 of the 98 functions, keyed by the symbol without its ``mori_shmem_`` prefix, where every pointer
  (and ``size_t``) is ``uint64``, ``int``/enums are ``int32`` and ``float``/``double`` are
  ``float32``/``float64``. The nine legacy-typed immediate puts (``long_p``, ``longlong_p``, ``char_p``,
  ``short_p``, ``uint_p``, ``ulong_p``, ``ulonglong_p``, ``uchar_p``, ``ushort_p``) have no metadata entry.
  Only ``n_pes`` is ``pure``.

This module is stdlib-only (it must not import MLIR or llvmlite).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mori_compiler.errors import MoriCompilerError

__all__ = [
    "ABI_BY_SYMBOL",
    "ABI_FUNCTIONS",
    "FAMILIES",
    "MORI_DEVICE_FUNCTIONS",
    "MORI_STATE_SIZE",
    "MORI_STATE_SYMBOL",
    "SIGNAL_ADD",
    "SIGNAL_SET",
    "SYMBOL_PREFIX",
    "AbiFunction",
    "AbiParam",
    "AtomicType",
    "TransportType",
    "UnknownAbiSymbolError",
    "abi_function",
]

SYMBOL_PREFIX = "mori_shmem_"

#: The family names used in ``AbiFunction.family``.
FAMILIES = (
    "query", "ptr", "quiet", "fence", "barrier", "put_nbi", "get_nbi", "get", "put_signal", "put_imm", "p",
    "atomic_nonfetch", "atomic_fetch", "atomic_add", "atomic_fetch_add", "atomic_size_nonfetch", "wait_until",
)

# ----------------------------------------------------------------------------------------------------------
# Enums and constants (docs/device-abi.md §1.3, §3)
# ----------------------------------------------------------------------------------------------------------


class AtomicType(enum.IntEnum):
    """``mori::core::atomicType``: an ``int``-sized enum, passed as ``i32``."""

    AMO_ACK = 1
    AMO_INC = 2
    AMO_SET = 3
    AMO_ADD = 4
    AMO_AND = 5
    AMO_OR = 6
    AMO_XOR = 7
    AMO_SIGNAL = 8
    SIGNAL_SET = 9
    SIGNAL_ADD = 10
    AMO_END_OF_NONFETCH = 11
    AMO_FETCH = 12
    AMO_FETCH_INC = 13
    AMO_FETCH_ADD = 14
    AMO_FETCH_AND = 15
    AMO_FETCH_OR = 16
    AMO_FETCH_XOR = 17
    AMO_SWAP = 18
    AMO_COMPARE_SWAP = 19
    # Aliases spelled as in the C++ enum.
    AMO_SIGNAL_SET = 9
    AMO_SIGNAL_ADD = 10


#: The signal operations ``mori.ir`` exposes for put-with-signal (SET: 3 or 9, ADD: 4 or 10 are accepted).
SIGNAL_SET = 9
SIGNAL_ADD = 10


class TransportType(enum.IntEnum):
    """Per-peer transport chosen by the host at init (``globalGpuStates.transportTypes[pe]``)."""

    RDMA = 0
    P2P = 1
    SDMA = 2


#: Mangled name of ``mori::shmem::globalGpuStates``, the per-code-object device state (addrspace 1).
MORI_STATE_SYMBOL = "_ZN4mori5shmem15globalGpuStatesE"
#: ``sizeof(mori::shmem::GpuStates)`` under LP64 in the layout of docs/device-abi.md §3.1: the least a MORI bitcode
#: defines (MORI 1.2.4's, with more fields, is 200 bytes).
MORI_STATE_SIZE = 80

# ----------------------------------------------------------------------------------------------------------
# Type derivation
# ----------------------------------------------------------------------------------------------------------

_LLVM_SCALAR = {
    "char": "i8", "unsigned char": "i8",
    "short": "i16", "unsigned short": "i16",
    "int": "i32", "unsigned int": "i32", "int32_t": "i32", "uint32_t": "i32", "atomicType": "i32",
    "long": "i64", "unsigned long": "i64", "long long": "i64", "unsigned long long": "i64",
    "int64_t": "i64", "uint64_t": "i64", "size_t": "i64",
    "float": "float", "double": "double",
}

# Metadata (Triton/FlyDSL) type names; pointers are "uint64". Only the types used by rows with metadata.
_META_SCALAR = {
    "int": "int32", "int32_t": "int32", "atomicType": "int32",
    "uint32_t": "uint32", "uint64_t": "uint64", "size_t": "uint64", "int64_t": "int64",
    "float": "float32", "double": "float64",
}


def _base_type(c_type: str) -> str:
    """``c_type`` without ``const`` qualifiers and with single spaces."""
    return " ".join(w for w in c_type.split() if w != "const")


def _llvm_type(c_type: str) -> str:
    base = _base_type(c_type)
    if base.endswith("*"):
        return "ptr"
    return _LLVM_SCALAR[base]


def _meta_type(c_type: str) -> str:
    base = _base_type(c_type)
    if base.endswith("*"):
        return "uint64"
    return _META_SCALAR[base]


# ----------------------------------------------------------------------------------------------------------
# Data model
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AbiParam:
    """One parameter: its C name, its C type as declared (``const`` kept) and its LLVM type."""

    name: str
    c_type: str
    llvm_type: str

    @property
    def c_decl(self) -> str:
        """``"const void* source"``."""
        return f"{self.c_type} {self.name}"


@dataclass(frozen=True)
class AbiFunction:
    """One exported function of the device bitcode (a row of docs/device-abi.md §1.2)."""

    index: int
    symbol: str
    c_return: str
    llvm_return: str
    params: tuple[AbiParam, ...]
    metadata_key: str | None
    family: str
    pure: bool = False

    @property
    def llvm_param_types(self) -> tuple[str, ...]:
        return tuple(p.llvm_type for p in self.params)

    @property
    def llvm_signature(self) -> str:
        """The function type as the spec writes it, e.g. ``"i32 (ptr, ptr, i64, i32, i32)"``."""
        return f"{self.llvm_return} ({', '.join(self.llvm_param_types)})"

    @property
    def c_params(self) -> str:
        """The C parameter list as the spec writes it (``"void"`` when empty)."""
        return ", ".join(p.c_decl for p in self.params) or "void"

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def has_metadata(self) -> bool:
        return self.metadata_key is not None

    @property
    def returns_zero(self) -> bool:
        """True for the ``int``-returning functions, whose result is always 0 (not for my_pe/n_pes)."""
        return self.c_return == "int" and self.family != "query"

    def llvm_declaration(self) -> str:
        """``"declare i32 @mori_shmem_putmem_nbi_thread(ptr, ptr, i64, i32, i32)"``."""
        return f"declare {self.llvm_return} @{self.symbol}({', '.join(self.llvm_param_types)})"

    def metadata(self) -> dict | None:
        """This function's entry of ``MORI_DEVICE_FUNCTIONS`` (a fresh dict), or None without metadata."""
        if self.metadata_key is None:
            return None
        entry: dict = {
            "symbol": self.symbol,
            "args": [_meta_type(p.c_type) for p in self.params],
            "ret": _meta_type(self.c_return),
        }
        if self.pure:
            entry["pure"] = True
        return entry


class UnknownAbiSymbolError(MoriCompilerError, KeyError):
    """A symbol that is not one of the 98 device ABI functions."""


# ----------------------------------------------------------------------------------------------------------
# The table, in spec order
# ----------------------------------------------------------------------------------------------------------

_SCOPES = ("thread", "warp", "block")
# Element types of the typed put/get variants; None is the untyped "*mem*" (byte count) variant.
_XFER_ELEMS: tuple[tuple[str | None, str | None], ...] = (
    (None, None), ("uint32", "uint32_t"), ("uint64", "uint64_t"), ("float", "float"), ("double", "double"),
)
# Immediate puts "<name>_p": (name, C type, has metadata).
_P_ELEMS = (
    ("int", "int", True), ("long", "long", False), ("longlong", "long long", False),
    ("float", "float", True), ("double", "double", True), ("char", "char", False), ("short", "short", False),
    ("uint", "unsigned int", False), ("ulong", "unsigned long", False),
    ("ulonglong", "unsigned long long", False), ("uchar", "unsigned char", False),
    ("ushort", "unsigned short", False),
    ("int32", "int32_t", True), ("int64", "int64_t", True), ("uint32", "uint32_t", True),
    ("uint64", "uint64_t", True),
)
_ATOMIC_ELEMS = (("uint32", "uint32_t"), ("uint64", "uint64_t"), ("int64", "int64_t"))
_WAIT_ELEMS = (("uint32", "uint32_t"), ("uint64", "uint64_t"), ("int32", "int32_t"), ("int64", "int64_t"))


def _parse_params(decl: str) -> tuple[AbiParam, ...]:
    """``"void* dest, const void* source"`` -> params; ``"void"`` -> ()."""
    if decl.strip() == "void":
        return ()
    params = []
    for item in decl.split(","):
        c_type, name = item.strip().rsplit(" ", 1)
        c_type = " ".join(c_type.split())
        params.append(AbiParam(name, c_type, _llvm_type(c_type)))
    return tuple(params)


def _build_table() -> tuple[AbiFunction, ...]:
    rows: list[AbiFunction] = []

    def add(name: str, c_return: str, c_params: str, family: str, *, metadata: bool = True,
            pure: bool = False) -> None:
        assert family in FAMILIES, family
        rows.append(AbiFunction(
            index=len(rows) + 1,
            symbol=SYMBOL_PREFIX + name,
            c_return=c_return,
            llvm_return=_llvm_type(c_return),
            params=_parse_params(c_params),
            metadata_key=name if metadata else None,
            family=family,
            pure=pure,
        ))

    # 1-8: quiet, fence, device barriers.
    for family in ("quiet", "fence"):
        add(f"{family}_thread", "int", "void", family)
        add(f"{family}_thread_pe", "int", "int pe", family)
        add(f"{family}_thread_pe_qp", "int", "int pe, int qpId", family)
    for scope in ("thread", "block"):
        add(f"barrier_all_{scope}", "int", "void", "barrier")

    # 9-53: put nbi, get nbi, blocking get; each by scope, then by element type.
    for op, nbi, family in (("put", True, "put_nbi"), ("get", True, "get_nbi"), ("get", False, "get")):
        for scope in _SCOPES:
            suffix = f"_nbi_{scope}" if nbi else f"_{scope}"
            for elem, c_elem in _XFER_ELEMS:
                if elem is None:
                    add(f"{op}mem{suffix}", "int",
                        "void* dest, const void* source, size_t bytes, int pe, int qpId", family)
                else:
                    add(f"{op}_{elem}{suffix}", "int",
                        f"{c_elem}* dest, const {c_elem}* source, size_t nelems, int pe, int qpId", family)

    # 54-56: put with signal.
    for scope in _SCOPES:
        add(f"putmem_nbi_signal_{scope}", "int",
            "void* dest, const void* source, size_t bytes, void* signalDest, uint64_t signalValue, "
            "atomicType signalOp, int pe, int qpId", "put_signal")

    # 57-73: immediate puts (value passed by pointer, then by value).
    add("put_size_imm_nbi_thread", "int", "void* dest, void* val, size_t bytes, int pe, int qpId", "put_imm")
    for elem, c_elem, metadata in _P_ELEMS:
        add(f"{elem}_p", "int", f"{c_elem}* dest, {c_elem} val, int pe, int qpId", "p", metadata=metadata)

    # 74-86: atomics (thread scope only).
    add("atomic_size_nonfetch_thread", "int",
        "void* dest, void* val, size_t bytes, atomicType amoType, int pe, int qpId", "atomic_size_nonfetch")
    for elem, c_elem in _ATOMIC_ELEMS:
        add(f"atomic_{elem}_nonfetch_thread", "int",
            f"{c_elem}* dest, {c_elem} val, atomicType amoType, int pe, int qpId", "atomic_nonfetch")
    for elem, c_elem in _ATOMIC_ELEMS:
        add(f"atomic_{elem}_fetch_thread", c_elem,
            f"{c_elem}* dest, {c_elem} val, {c_elem} compare, atomicType amoType, int pe, int qpId",
            "atomic_fetch")
    for elem, c_elem in _ATOMIC_ELEMS:
        add(f"{elem}_atomic_add_thread", "int", f"{c_elem}* dest, {c_elem} val, int pe, int qpId", "atomic_add")
        add(f"{elem}_atomic_fetch_add_thread", c_elem, f"{c_elem}* dest, {c_elem} val, int pe, int qpId",
            "atomic_fetch_add")

    # 87-94: local waits.
    for elem, c_elem in _WAIT_ELEMS:
        add(f"{elem}_wait_until_greater_than", c_elem, f"{c_elem}* addr, {c_elem} val", "wait_until")
        add(f"{elem}_wait_until_equals", "int", f"{c_elem}* addr, {c_elem} val", "wait_until")

    # 95-98: queries and pointer translation (addresses as uint64_t here, not pointers).
    add("my_pe", "int", "void", "query")
    add("n_pes", "int", "void", "query", pure=True)
    add("ptr_p2p", "uint64_t", "const uint64_t destPtr, const int myPe, int destPe", "ptr")
    add("ptr", "uint64_t", "uint64_t dest, int destPe", "ptr")

    assert len(rows) == 98, len(rows)
    return tuple(rows)


ABI_FUNCTIONS: tuple[AbiFunction, ...] = _build_table()
ABI_BY_SYMBOL: dict[str, AbiFunction] = {f.symbol: f for f in ABI_FUNCTIONS}

#: The Triton/FlyDSL metadata view (89 entries), keyed like ``mori.ir.MORI_DEVICE_FUNCTIONS``.
MORI_DEVICE_FUNCTIONS: dict[str, dict] = {
    f.metadata_key: f.metadata() for f in ABI_FUNCTIONS if f.metadata_key is not None
}

assert len(ABI_BY_SYMBOL) == 98 and len(MORI_DEVICE_FUNCTIONS) == 89


def abi_function(symbol: str) -> AbiFunction:
    """The ABI entry for ``symbol`` (``"mori_shmem_..."``); raises ``UnknownAbiSymbolError`` otherwise."""
    try:
        return ABI_BY_SYMBOL[symbol]
    except KeyError:
        raise UnknownAbiSymbolError(f"unknown device ABI symbol '{symbol}'") from None
