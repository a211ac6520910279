"""Generate the 98 exported functions of the device library from the ABI table.

Each exported function is a thin call into the internal building blocks of ``sources/shmem_core.ll``
with the scope, element size, atomic width or comparison its name stands for. Deriving them from
``abi.ABI_FUNCTIONS`` guarantees the library defines every ABI function with exactly MORI's symbol and
LLVM type; nothing here spells a signature.
"""

from __future__ import annotations

from .abi import ABI_FUNCTIONS, AbiFunction, AtomicType
from .state import WAIT_EQUALS, WAIT_SIGNED_GT, WAIT_UNSIGNED_GT

SCOPE_CODE = {"thread": 0, "warp": 1, "block": 2}
# Bytes per element of a typed transfer, by the C type of its dest pointer.
ELEM_BYTES = {"void*": 1, "uint32_t*": 4, "uint64_t*": 8, "float*": 4, "double*": 8}
VALUE_HELPER = {"i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64", "float": "i32", "double": "i64"}
AMO_ADD, AMO_FETCH_ADD = int(AtomicType.AMO_ADD), int(AtomicType.AMO_FETCH_ADD)


def _scope(fn: AbiFunction) -> int:
    return SCOPE_CODE[fn.symbol.rsplit("_", 1)[1]]


def _width(llvm_type: str) -> int:
    return 64 if llvm_type == "i64" else 32


def _body(fn: AbiFunction) -> list[str]:
    p = {param.name: f"{param.llvm_type} %{param.name}" for param in fn.params}
    family = fn.family
    if family == "query":
        return [f"%r = call i32 @__mc_{fn.symbol.removeprefix('mori_shmem_')}()", "ret i32 %r"]
    if family == "ptr":
        if "myPe" in p:
            return ["%r = call i64 @__mc_ptr_p2p(i64 %destPtr, i32 %myPe, i32 %destPe)", "ret i64 %r"]
        return ["%me = call i32 @__mc_my_pe()", "%r = call i64 @__mc_ptr_p2p(i64 %dest, i32 %me, i32 %destPe)",
                "ret i64 %r"]  # fmt: skip
    if family == "quiet":  # P2P puts are complete once issued: nothing to drain
        return ["ret i32 0"]
    if family == "fence":
        return ["call void @__mc_fence_sc_sys()", "ret i32 0"]
    if family == "barrier":
        helper = "__mc_barrier_all" if fn.symbol.endswith("_thread") else "__mc_barrier_all_block"
        return [f"call void @{helper}()", "ret i32 0"]
    if family in ("put_nbi", "get_nbi", "get"):
        size = ELEM_BYTES[fn.params[0].c_type]
        lines = [] if size == 1 else [f"%bytes = mul i64 %nelems, {size}"]
        helper = "__mc_put" if family == "put_nbi" else "__mc_get"
        return lines + [
            f"%r = call i32 @{helper}(ptr %dest, ptr %source, i64 %bytes, i32 %pe, i32 {_scope(fn)})",
            "ret i32 %r",
        ]
    if family == "put_signal":
        return [
            "%r = call i32 @__mc_put_signal(ptr %dest, ptr %source, i64 %bytes, ptr %signalDest, "
            f"i64 %signalValue, i32 %signalOp, i32 %pe, i32 {_scope(fn)})",
            "ret i32 %r",
        ]
    if family == "put_imm":
        return ["%r = call i32 @__mc_put_imm(ptr %dest, ptr %val, i64 %bytes, i32 %pe)", "ret i32 %r"]
    if family == "p":
        vty = fn.params[1].llvm_type
        helper_ty = VALUE_HELPER[vty]
        lines = [] if helper_ty == vty else [f"%bits = bitcast {vty} %val to {helper_ty}"]
        value = "%val" if helper_ty == vty else "%bits"
        return lines + [f"%r = call i32 @__mc_put_value_{helper_ty}(ptr %dest, {helper_ty} {value}, i32 %pe)",
                        "ret i32 %r"]  # fmt: skip
    if family == "atomic_size_nonfetch":
        return ["%r = call i32 @__mc_amo_size_nonfetch(ptr %dest, ptr %val, i64 %bytes, i32 %amoType, i32 %pe)",
                "ret i32 %r"]  # fmt: skip
    if family in ("atomic_nonfetch", "atomic_add"):
        ty = fn.params[1].llvm_type
        op = "%amoType" if family == "atomic_nonfetch" else str(AMO_ADD)
        return [f"%r = call i32 @__mc_amo_nonfetch{_width(ty)}(ptr %dest, {ty} %val, i32 {op}, i32 %pe)",
                "ret i32 %r"]  # fmt: skip
    if family in ("atomic_fetch", "atomic_fetch_add"):
        ty = fn.params[1].llvm_type
        cmp = f"{ty} %compare" if family == "atomic_fetch" else f"{ty} 0"
        op = "%amoType" if family == "atomic_fetch" else str(AMO_FETCH_ADD)
        return [f"%r = call {ty} @__mc_amo_fetch{_width(ty)}(ptr %dest, {ty} %val, {cmp}, i32 {op}, i32 %pe)",
                f"ret {ty} %r"]  # fmt: skip
    if family == "wait_until":
        ty = fn.params[1].llvm_type
        if fn.symbol.endswith("_equals"):
            kind = WAIT_EQUALS
        else:
            kind = WAIT_UNSIGNED_GT if fn.params[1].c_type.startswith("uint") else WAIT_SIGNED_GT
        call = f"%r = call {ty} @__mc_wait{_width(ty)}(ptr %addr, {ty} %val, i32 {kind})"
        return [call, "ret i32 0" if kind == WAIT_EQUALS else f"ret {ty} %r"]
    raise AssertionError(f"no device library implementation for family {family!r} ({fn.symbol})")


def _convergent(fn: AbiFunction) -> bool:
    """Functions whose body synchronizes lanes or threads must not be made divergent by the optimizer."""
    return fn.family == "put_signal" or fn.symbol == "mori_shmem_barrier_all_block"


def wrapper_definition(fn: AbiFunction) -> str:
    params = ", ".join(f"{p.llvm_type} %{p.name}" for p in fn.params)
    attrs = " convergent" if _convergent(fn) else ""
    body = "\n".join(f"  {line}" for line in _body(fn))
    return f"define {fn.llvm_return} @{fn.symbol}({params}){attrs} {{\n{body}\n}}\n"


def generate_wrappers() -> str:
    header = "; Generated by lib_bitcode/wrappers.py from the ABI table: the 98 exported functions.\n"
    return header + "\n".join(wrapper_definition(fn) for fn in ABI_FUNCTIONS)
