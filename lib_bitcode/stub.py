"""A stub of MORI's device bitcode, for tests only (never shipped, never linked into a real kernel).

It defines every selected ABI function (``abi.ABI_FUNCTIONS``) with its exact LLVM type and a trivial,
deterministic body, plus the device state global, so that CI without ROCm can prove that linking works and
that undefined symbols are detected. Bodies:

* ``int``-returning functions return 0 (as the real ones do);
* ``my_pe`` returns 3 and ``n_pes`` returns 8 (``STUB_MY_PE``/``STUB_N_PES``);
* fetch atomics and ``*_wait_until_greater_than`` return their ``val`` argument;
* ``ptr_p2p``/``ptr`` return their address argument.

The state global ``@_ZN4mori5shmem15globalGpuStatesE`` is ``[80 x i8]`` in addrspace(1),
``externally_initialized``, zero-initialised, align 8, default visibility (for amdgcn and nvptx alike).
Pointer parameters are flat ``ptr`` (addrspace 0).

Stdlib + llvmlite; llvmlite is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .abi import ABI_FUNCTIONS, MORI_STATE_SIZE, MORI_STATE_SYMBOL, AbiFunction, abi_function

__all__ = ["STUB_MY_PE", "STUB_N_PES", "stub_llvm_ir", "write_stub_bitcode"]

STUB_MY_PE = 3
STUB_N_PES = 8

_SUPPORTED_ARCHS = ("amdgcn", "nvptx64")


def _default_data_layout(triple: str) -> str | None:
    """The target's data layout as llvmlite's LLVM knows it, or None if the target is not built in."""
    import llvmlite.binding as llvm

    try:
        llvm.initialize_all_targets()
        target = llvm.Target.from_triple(triple)
        return str(target.create_target_machine().target_data)
    except Exception:  # target not registered in this llvmlite build: leave the layout unset
        return None


def _stub_body(fn: AbiFunction) -> str:
    """The ``ret`` instruction of the stub for ``fn``."""
    if fn.symbol == "mori_shmem_my_pe":
        return f"ret i32 {STUB_MY_PE}"
    if fn.symbol == "mori_shmem_n_pes":
        return f"ret i32 {STUB_N_PES}"
    if fn.family == "ptr":
        return f"ret i64 %{fn.params[0].name}"
    if fn.c_return != "int":  # fetch atomics, wait_until_greater_than: the value argument
        (val,) = [p for p in fn.params if p.name == "val"]
        assert val.llvm_type == fn.llvm_return, fn.symbol
        return f"ret {fn.llvm_return} %val"
    return "ret i32 0"


def _stub_definition(fn: AbiFunction) -> str:
    params = ", ".join(f"{p.llvm_type} %{p.name}" for p in fn.params)
    return f"define {fn.llvm_return} @{fn.symbol}({params}) {{\nentry:\n  {_stub_body(fn)}\n}}\n"


def stub_llvm_ir(triple: str, *, symbols: Iterable[str] | None = None, define_state: bool = True,
                 data_layout: str | None = None) -> str:
    """LLVM IR text of a stub device library for ``triple`` (``amdgcn-amd-amdhsa``, ``nvptx64-nvidia-cuda``).

    ``symbols`` selects the functions to define (default: all 98, in ABI order; unknown names raise
    ``UnknownAbiSymbolError``). ``define_state=False`` leaves the state global out. ``data_layout`` defaults
    to the target's layout from llvmlite when its LLVM has the target, else none is written.
    """
    arch = triple.split("-", 1)[0]
    if arch not in _SUPPORTED_ARCHS:
        raise ValueError(f"unsupported stub triple '{triple}' (expected amdgcn-* or nvptx64-*)")
    if symbols is None:
        functions = list(ABI_FUNCTIONS)
    else:
        wanted = {abi_function(s).symbol for s in symbols}
        functions = [f for f in ABI_FUNCTIONS if f.symbol in wanted]
    if data_layout is None:
        data_layout = _default_data_layout(triple)

    lines = ["; MORI device ABI stub (tests only; not MORI's implementation)"]
    if data_layout:
        lines.append(f'target datalayout = "{data_layout}"')
    lines.append(f'target triple = "{triple}"')
    lines.append("")
    if define_state:
        lines.append(f"@{MORI_STATE_SYMBOL} = addrspace(1) externally_initialized global "
                     f"[{MORI_STATE_SIZE} x i8] zeroinitializer, align 8")
        lines.append("")
    text = "\n".join(lines) + "\n"
    return text + "\n".join(_stub_definition(f) for f in functions)


def write_stub_bitcode(path, triple: str = "amdgcn-amd-amdhsa", **kw) -> Path:
    """Write the stub as LLVM bitcode to ``path`` (parent folders are created); returns the path."""
    import llvmlite.binding as llvm

    module = llvm.parse_assembly(stub_llvm_ir(triple, **kw))
    module.verify()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(module.as_bitcode())
    return path
