"""The ``mori_shmem`` dialect: MORI's device shmem primitives.

The ops are defined in ``mori_shmem.irdl.mlir`` (IRDL; ``DIALECT`` loads it, see dialect_base.py). This
module documents each op (semantics, an IR example, the device ABI symbol it lowers to) in a thin
builder class, and states the cross-field rules IRDL cannot express (``extra_verify``).

Our abstraction: queue pairs, transports and the address arithmetic of the symmetric heap stay inside
the device library; an op names *what* moves (bytes or typed elements), *who* cooperates (``scope``)
and *which* PE is the peer. Every op lowers to exactly one ABI function (``SYMBOL``, a template filled
from the op's attributes); the lowering (passes/mori_shmem_to_abi.py) takes the exact C-derived types
of that function from ``mori_compiler.lib_bitcode.abi``.

Memory ordering contract (docs/device-abi.md §2.11) for code that uses these ops:
* ``putmem_nbi``/``put_nbi`` are only ordered by a later ``fence`` (quiet + system-scope fence);
  ``quiet`` alone is *not* a fence.
* ``putmem_nbi_signal`` publishes its payload before the signal (release at system scope).
* ``wait_until`` has no acquire of its own: code that reads payload after it needs ``fence``
  (our library's fence is a system-scope acq_rel fence, so it serves as that acquire).
* warp/block-scope ops must be called uniformly by the whole wave/block with identical arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import ir
from mori_compiler.lib_bitcode.abi import SIGNAL_ADD, SIGNAL_SET, AtomicType

from .dialect_base import Dialect
from .irdl_spec import string_attributes

# --------------------------------------------------------------------------------------------------
# Op classes. Each has NAME, SYMBOL (the ABI function, formatted with the op's string attributes) and,
# where the ABI takes an enum the op carries as an attribute, ENUM_ARG = (attribute, ABI position).
# --------------------------------------------------------------------------------------------------

_SIGNLESS_WIDTH = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "f32": 32, "f64": 64}


def _ptr() -> ir.Type:
    return ir.Type.parse("!llvm.ptr")


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _create(name, operands, attributes=None, results=(), loc=None, ip=None) -> ir.Operation:
    attrs = {k: ir.StringAttr.get(v) for k, v in (attributes or {}).items()}
    return ir.Operation.create(name, results=list(results), operands=list(operands), attributes=attrs, loc=loc, ip=ip)


@dataclass(frozen=True)
class OpInfo:
    """What the lowering needs to know about one op (kept next to the op's documentation)."""

    name: str
    symbol: str
    enum_arg: tuple[str, int] | None = None


class MyPeOp:
    """``mori_shmem.my_pe`` → i32: the calling PE's rank.

    ``%pe = "mori_shmem.my_pe"() : () -> i32``. Lowers to ``mori_shmem_my_pe``.
    """

    INFO: ClassVar = OpInfo("mori_shmem.my_pe", "mori_shmem_my_pe")


class NPesOp:
    """``mori_shmem.n_pes`` → i32: the number of PEs. Lowers to ``mori_shmem_n_pes`` (pure)."""

    INFO: ClassVar = OpInfo("mori_shmem.n_pes", "mori_shmem_n_pes")


class PtrP2POp:
    """``mori_shmem.ptr_p2p(addr, my_pe, dest_pe)`` → ptr: ``addr`` as mapped for direct loads/stores to PE
    ``dest_pe``; ``addr`` itself when ``dest_pe == my_pe``; null when ``addr`` is outside the symmetric heap
    or the peer is not reachable by P2P. Lowers to ``mori_shmem_ptr_p2p`` (which takes and returns
    ``uint64_t``: the lowering converts with ptrtoint/inttoptr)."""

    INFO: ClassVar = OpInfo("mori_shmem.ptr_p2p", "mori_shmem_ptr_p2p")


class PtrOp:
    """``mori_shmem.ptr(addr, dest_pe)`` → ptr: ``ptr_p2p`` with this PE as ``my_pe``.
    Lowers to ``mori_shmem_ptr``."""

    INFO: ClassVar = OpInfo("mori_shmem.ptr", "mori_shmem_ptr")


class PutmemNbiOp:
    """``mori_shmem.putmem_nbi(dest, source, bytes, pe, qp) {scope}``: copy ``bytes`` bytes from the local
    ``source`` to the symmetric ``dest`` on PE ``pe``. Non-blocking: nothing is guaranteed visible before
    a ``fence``. ``scope`` = thread (each lane its own copy), warp or block (all lanes cooperate, identical
    arguments).

    ``"mori_shmem.putmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()``

    Lowers to ``mori_shmem_putmem_nbi_{thread,warp,block}``."""

    INFO: ClassVar = OpInfo("mori_shmem.putmem_nbi", "mori_shmem_putmem_nbi_{scope}")


class PutNbiOp:
    """``mori_shmem.put_nbi {scope, elem}``: typed ``putmem_nbi``; ``nelems`` counts elements of ``elem``
    (uint32, uint64, float, double). Lowers to ``mori_shmem_put_{elem}_nbi_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.put_nbi", "mori_shmem_put_{elem}_nbi_{scope}")


class GetmemNbiOp:
    """``mori_shmem.getmem_nbi(dest, source, bytes, pe, qp) {scope}``: copy from the symmetric ``source`` on
    PE ``pe`` into the local ``dest``; complete after a ``quiet``. Lowers to ``mori_shmem_getmem_nbi_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.getmem_nbi", "mori_shmem_getmem_nbi_{scope}")


class GetNbiOp:
    """``mori_shmem.get_nbi {scope, elem}``: typed ``getmem_nbi``. Lowers to ``mori_shmem_get_{elem}_nbi_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.get_nbi", "mori_shmem_get_{elem}_nbi_{scope}")


class GetmemOp:
    """``mori_shmem.getmem {scope}``: blocking get; the data is in ``dest`` when the op returns.
    Lowers to ``mori_shmem_getmem_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.getmem", "mori_shmem_getmem_{scope}")


class GetOp:
    """``mori_shmem.get {scope, elem}``: typed blocking get. Lowers to ``mori_shmem_get_{elem}_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.get", "mori_shmem_get_{elem}_{scope}")


class PutmemNbiSignalOp:
    """``mori_shmem.putmem_nbi_signal(dest, source, bytes, signal, signal_value, pe, qp) {scope, signal_op}``:
    put, then update the 64-bit word at the symmetric ``signal`` on PE ``pe`` (``set`` stores
    ``signal_value``, ``add`` adds it) with release ordering at system scope, so a reader that sees the
    signal and then acquires sees the payload. Thread scope: call from one lane per wave (P2P signals once
    per wave). Lowers to ``mori_shmem_putmem_nbi_signal_{scope}`` with SIGNAL_SET (9) / SIGNAL_ADD (10)."""

    INFO: ClassVar = OpInfo(
        "mori_shmem.putmem_nbi_signal", "mori_shmem_putmem_nbi_signal_{scope}", enum_arg=("signal_op", 5)
    )


class PutSizeImmNbiOp:
    """``mori_shmem.put_size_imm_nbi(dest, value, bytes, pe, qp)``: store the ``bytes`` (1, 2, 4, 8 or 16)
    bytes at the local pointer ``value`` to ``dest`` on ``pe`` as one store. Thread scope.
    Lowers to ``mori_shmem_put_size_imm_nbi_thread``."""

    INFO: ClassVar = OpInfo("mori_shmem.put_size_imm_nbi", "mori_shmem_put_size_imm_nbi_thread")


class POp:
    """``mori_shmem.p(dest, value, pe, qp) {c_type}``: store one scalar ``value`` to ``dest`` on ``pe``.
    ``c_type`` names the C type of the ABI function (int, long, …, uint64) and must match the value's
    width. Lowers to ``mori_shmem_{c_type}_p``."""

    INFO: ClassVar = OpInfo("mori_shmem.p", "mori_shmem_{c_type}_p")


class AtomicNonfetchOp:
    """``mori_shmem.atomic_nonfetch(dest, value, pe, qp) {elem, amo}``: atomically apply ``amo`` (inc, set,
    add, and, or, xor) with ``value`` to the ``elem`` word at ``dest`` on ``pe``, at system scope.
    Lowers to ``mori_shmem_atomic_{elem}_nonfetch_thread``."""

    INFO: ClassVar = OpInfo(
        "mori_shmem.atomic_nonfetch", "mori_shmem_atomic_{elem}_nonfetch_thread", enum_arg=("amo", 2)
    )


class AtomicFetchOp:
    """``mori_shmem.atomic_fetch(dest, value, compare, pe, qp) {elem, amo}`` → old value: fetch-and-op
    (fetch, fetch_inc, fetch_add, fetch_and, fetch_or, fetch_xor, swap, compare_swap) at system scope.
    Lowers to ``mori_shmem_atomic_{elem}_fetch_thread``."""

    INFO: ClassVar = OpInfo(
        "mori_shmem.atomic_fetch", "mori_shmem_atomic_{elem}_fetch_thread", enum_arg=("amo", 3)
    )


class AtomicAddOp:
    """``mori_shmem.atomic_add(dest, value, pe, qp) {elem}``: remote atomic add.
    Lowers to ``mori_shmem_{elem}_atomic_add_thread``."""

    INFO: ClassVar = OpInfo("mori_shmem.atomic_add", "mori_shmem_{elem}_atomic_add_thread")


class AtomicFetchAddOp:
    """``mori_shmem.atomic_fetch_add(dest, value, pe, qp) {elem}`` → old value.
    Lowers to ``mori_shmem_{elem}_atomic_fetch_add_thread``."""

    INFO: ClassVar = OpInfo("mori_shmem.atomic_fetch_add", "mori_shmem_{elem}_atomic_fetch_add_thread")


class AtomicSizeNonfetchOp:
    """``mori_shmem.atomic_size_nonfetch(dest, value, bytes, pe, qp) {amo}``: non-fetching atomic on a
    4- or 8-byte word whose operand is read from the local pointer ``value``.
    Lowers to ``mori_shmem_atomic_size_nonfetch_thread``."""

    INFO: ClassVar = OpInfo(
        "mori_shmem.atomic_size_nonfetch", "mori_shmem_atomic_size_nonfetch_thread", enum_arg=("amo", 3)
    )


class WaitUntilOp:
    """``mori_shmem.wait_until(addr, value) {cmp, elem}`` → observed value: spin on the local word ``addr``
    (system-scope loads the compiler cannot hoist) until it ``equals`` / is ``greater_than`` ``value``.
    No acquire: follow it with ``fence`` before reading payload. Lowers to
    ``mori_shmem_{elem}_wait_until_{cmp}``; for ``equals`` the ABI returns 0 and the op's result is ``value``."""

    INFO: ClassVar = OpInfo("mori_shmem.wait_until", "mori_shmem_{elem}_wait_until_{cmp}")


class QuietOp:
    """``mori_shmem.quiet(pe?, qp?)``: wait until this thread's outstanding non-blocking operations (to all
    PEs, to ``pe``, or to ``pe`` on queue pair ``qp``) are complete. Not a memory fence.
    Lowers to ``mori_shmem_quiet_thread``, ``…_thread_pe`` or ``…_thread_pe_qp``."""

    INFO: ClassVar = OpInfo("mori_shmem.quiet", "mori_shmem_quiet_thread{targets}")


class FenceOp:
    """``mori_shmem.fence(pe?, qp?)``: ``quiet`` followed by a system-scope fence: orders and publishes
    this thread's earlier puts before its later ones. Lowers to ``mori_shmem_fence_thread[_pe[_qp]]``."""

    INFO: ClassVar = OpInfo("mori_shmem.fence", "mori_shmem_fence_thread{targets}")


class BarrierAllOp:
    """``mori_shmem.barrier_all {scope}``: all PEs meet; prior puts are complete and visible after it.
    Exactly one thread (thread scope) or one block (block scope) per PE may take part.
    Lowers to ``mori_shmem_barrier_all_{scope}``."""

    INFO: ClassVar = OpInfo("mori_shmem.barrier_all", "mori_shmem_barrier_all_{scope}")


OP_CLASSES = (
    MyPeOp, NPesOp, PtrP2POp, PtrOp,
    PutmemNbiOp, PutNbiOp, GetmemNbiOp, GetNbiOp, GetmemOp, GetOp,
    PutmemNbiSignalOp, PutSizeImmNbiOp, POp,
    AtomicNonfetchOp, AtomicFetchOp, AtomicAddOp, AtomicFetchAddOp, AtomicSizeNonfetchOp,
    WaitUntilOp, QuietOp, FenceOp, BarrierAllOp,
)  # fmt: skip
OP_INFO: dict[str, OpInfo] = {cls.INFO.name: cls.INFO for cls in OP_CLASSES}

# Attribute value → the ABI's atomicType enum value (docs/device-abi.md §1.3), e.g. "fetch_add" → AMO_FETCH_ADD.
_AMO_NAMES = ("inc", "set", "add", "and", "or", "xor",
              "fetch", "fetch_inc", "fetch_add", "fetch_and", "fetch_or", "fetch_xor", "swap", "compare_swap")  # fmt: skip
AMO_ENUM = {n: int(AtomicType["AMO_" + n.upper()]) for n in _AMO_NAMES}
SIGNAL_ENUM = {"set": SIGNAL_SET, "add": SIGNAL_ADD}
ENUM_VALUES = {"amo": AMO_ENUM, "signal_op": SIGNAL_ENUM}

# Width of the value a C type / element name stands for.
C_TYPE_VALUE = {
    "char": "i8", "uchar": "i8", "short": "i16", "ushort": "i16",
    "int": "i32", "uint": "i32", "int32": "i32", "uint32": "i32",
    "long": "i64", "ulong": "i64", "longlong": "i64", "ulonglong": "i64", "int64": "i64", "uint64": "i64",
    "float": "f32", "double": "f64",
}  # fmt: skip
ELEM_VALUE = {"int32": "i32", "uint32": "i32", "int64": "i64", "uint64": "i64"}


def abi_symbol(op: ir.Operation) -> str:
    """The device ABI function ``op`` lowers to, from its OpInfo template and attributes."""
    op = op.operation
    info = OP_INFO[op.name]
    fields = string_attributes(op)
    fields["targets"] = ("", "_pe", "_pe_qp")[len(op.operands)] if info.symbol.endswith("{targets}") else ""
    return info.symbol.format(**fields)


def extra_verify(op: ir.Operation) -> list[str]:
    """Rules across fields that IRDL cannot state; messages name the op and the field."""
    op = op.operation
    name = op.name
    attrs = string_attributes(op)
    errors: list[str] = []

    def value_must_be(field: str, ty: ir.Type, expected: str, because: str) -> None:
        if str(ty) != expected:
            errors.append(f"'{name}' {field} must be {expected} because {because}, got {ty}")

    if name == "mori_shmem.p" and "c_type" in attrs and attrs["c_type"] in C_TYPE_VALUE:
        value_must_be("operand 'value'", op.operands[1].type, C_TYPE_VALUE[attrs["c_type"]],
                      f"c_type = \"{attrs['c_type']}\"")  # fmt: skip
    elif name in ("mori_shmem.atomic_nonfetch", "mori_shmem.atomic_fetch", "mori_shmem.atomic_add",
                  "mori_shmem.atomic_fetch_add", "mori_shmem.wait_until") and attrs.get("elem") in ELEM_VALUE:  # fmt: skip
        expected = ELEM_VALUE[attrs["elem"]]
        because = f"elem = \"{attrs['elem']}\""
        value_must_be("operand 'value'", op.operands[1].type, expected, because)
        if name == "mori_shmem.atomic_fetch" and len(op.operands) > 2:
            value_must_be("operand 'compare'", op.operands[2].type, expected, because)
        for r in op.results:
            value_must_be("result", r.type, expected, because)
    elif name in ("mori_shmem.quiet", "mori_shmem.fence") and len(op.operands) > 2:
        errors.append(f"'{name}' takes at most 2 operands (pe, qp), got {len(op.operands)}")
    return errors


DIALECT = Dialect("mori_shmem", "mori_shmem.irdl.mlir", extra_verify)
DIALECT_NAME = DIALECT.name


# --------------------------------------------------------------------------------------------------
# Builders: one snake_case function per op. `qp` defaults to queue pair 0.
# --------------------------------------------------------------------------------------------------


def _qp(qp, loc, ip):
    if qp is not None:
        return qp
    from mori_compiler._mlir import arith

    return arith.constant(_i32(), 0, loc=loc, ip=ip)


def my_pe(*, loc=None, ip=None) -> ir.Value:
    return _create("mori_shmem.my_pe", [], results=[_i32()], loc=loc, ip=ip).result


def n_pes(*, loc=None, ip=None) -> ir.Value:
    return _create("mori_shmem.n_pes", [], results=[_i32()], loc=loc, ip=ip).result


def ptr_p2p(addr, my_pe_, dest_pe, *, loc=None, ip=None) -> ir.Value:
    return _create("mori_shmem.ptr_p2p", [addr, my_pe_, dest_pe], results=[_ptr()], loc=loc, ip=ip).result


def ptr(addr, dest_pe, *, loc=None, ip=None) -> ir.Value:
    return _create("mori_shmem.ptr", [addr, dest_pe], results=[_ptr()], loc=loc, ip=ip).result


def _transfer(op_name, dest, source, count, pe, scope, elem, qp, loc, ip) -> ir.Operation:
    attrs = {"scope": scope} | ({"elem": elem} if elem else {})
    return _create(op_name, [dest, source, count, pe, _qp(qp, loc, ip)], attrs, loc=loc, ip=ip)


def putmem_nbi(dest, source, nbytes, pe, *, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.putmem_nbi", dest, source, nbytes, pe, scope, None, qp, loc, ip)


def put_nbi(dest, source, nelems, pe, *, elem, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.put_nbi", dest, source, nelems, pe, scope, elem, qp, loc, ip)


def getmem_nbi(dest, source, nbytes, pe, *, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.getmem_nbi", dest, source, nbytes, pe, scope, None, qp, loc, ip)


def get_nbi(dest, source, nelems, pe, *, elem, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.get_nbi", dest, source, nelems, pe, scope, elem, qp, loc, ip)


def getmem(dest, source, nbytes, pe, *, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.getmem", dest, source, nbytes, pe, scope, None, qp, loc, ip)


def get(dest, source, nelems, pe, *, elem, scope="thread", qp=None, loc=None, ip=None) -> ir.Operation:
    return _transfer("mori_shmem.get", dest, source, nelems, pe, scope, elem, qp, loc, ip)


def putmem_nbi_signal(dest, source, nbytes, signal, signal_value, pe, *, signal_op="set", scope="thread",
                      qp=None, loc=None, ip=None) -> ir.Operation:  # fmt: skip
    operands = [dest, source, nbytes, signal, signal_value, pe, _qp(qp, loc, ip)]
    return _create("mori_shmem.putmem_nbi_signal", operands, {"scope": scope, "signal_op": signal_op}, loc=loc, ip=ip)


def put_size_imm_nbi(dest, value_ptr, nbytes, pe, *, qp=None, loc=None, ip=None) -> ir.Operation:
    operands = [dest, value_ptr, nbytes, pe, _qp(qp, loc, ip)]
    return _create("mori_shmem.put_size_imm_nbi", operands, loc=loc, ip=ip)


_DEFAULT_C_TYPE = {"i8": "char", "i16": "short", "i32": "int32", "i64": "int64", "f32": "float", "f64": "double"}


def p(dest, value, pe, *, c_type=None, qp=None, loc=None, ip=None) -> ir.Operation:
    c_type = c_type or _DEFAULT_C_TYPE.get(str(value.type), "int32")
    return _create("mori_shmem.p", [dest, value, pe, _qp(qp, loc, ip)], {"c_type": c_type}, loc=loc, ip=ip)


def atomic_nonfetch(dest, value, pe, *, elem, amo, qp=None, loc=None, ip=None) -> ir.Operation:
    operands = [dest, value, pe, _qp(qp, loc, ip)]
    return _create("mori_shmem.atomic_nonfetch", operands, {"elem": elem, "amo": amo}, loc=loc, ip=ip)


def atomic_fetch(dest, value, compare, pe, *, elem, amo, qp=None, loc=None, ip=None) -> ir.Value:
    operands = [dest, value, compare, pe, _qp(qp, loc, ip)]
    attrs = {"elem": elem, "amo": amo}
    return _create("mori_shmem.atomic_fetch", operands, attrs, results=[value.type], loc=loc, ip=ip).result


def atomic_add(dest, value, pe, *, elem, qp=None, loc=None, ip=None) -> ir.Operation:
    return _create("mori_shmem.atomic_add", [dest, value, pe, _qp(qp, loc, ip)], {"elem": elem}, loc=loc, ip=ip)


def atomic_fetch_add(dest, value, pe, *, elem, qp=None, loc=None, ip=None) -> ir.Value:
    operands = [dest, value, pe, _qp(qp, loc, ip)]
    op = _create("mori_shmem.atomic_fetch_add", operands, {"elem": elem}, results=[value.type], loc=loc, ip=ip)
    return op.result


def atomic_size_nonfetch(dest, value_ptr, nbytes, pe, *, amo, qp=None, loc=None, ip=None) -> ir.Operation:
    operands = [dest, value_ptr, nbytes, pe, _qp(qp, loc, ip)]
    return _create("mori_shmem.atomic_size_nonfetch", operands, {"amo": amo}, loc=loc, ip=ip)


def wait_until(addr, value, *, cmp, elem, loc=None, ip=None) -> ir.Value:
    attrs = {"cmp": cmp, "elem": elem}
    return _create("mori_shmem.wait_until", [addr, value], attrs, results=[value.type], loc=loc, ip=ip).result


def quiet(*targets, loc=None, ip=None) -> ir.Operation:
    return _create("mori_shmem.quiet", list(targets), loc=loc, ip=ip)


def fence(*targets, loc=None, ip=None) -> ir.Operation:
    return _create("mori_shmem.fence", list(targets), loc=loc, ip=ip)


def barrier_all(*, scope="thread", loc=None, ip=None) -> ir.Operation:
    return _create("mori_shmem.barrier_all", [], {"scope": scope}, loc=loc, ip=ip)


__all__ = [
    "DIALECT",
    "DIALECT_NAME",
    "OP_CLASSES",
    "OP_INFO",
    "abi_symbol",
    "atomic_add",
    "atomic_fetch",
    "atomic_fetch_add",
    "atomic_nonfetch",
    "atomic_size_nonfetch",
    "barrier_all",
    "extra_verify",
    "fence",
    "get",
    "get_nbi",
    "getmem",
    "getmem_nbi",
    "my_pe",
    "n_pes",
    "p",
    "ptr",
    "ptr_p2p",
    "put_nbi",
    "put_size_imm_nbi",
    "putmem_nbi",
    "putmem_nbi_signal",
    "quiet",
    "wait_until",
]
