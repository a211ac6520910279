"""``mori-trace-to-timer``: lower ``mori_comm.trace`` points to global-timer stores, or erase them.

Input: gpu.module with gpu.func kernels holding ``mori_comm.trace {event, phase}`` ops (anywhere in the
kernel body, in scf regions too). Output (``enabled``): per traced kernel K a 16-byte global
``__mori_trace_K`` (addrspace 1, externally initialized to 0: the runtime writes the trace buffer's address
and its slot count there; lib_bitcode.kernel_abi), the kernel attribute ``mori.trace_events`` (its E slots,
``"event:phase"`` in order of first appearance), and in place of each op: each lane reads the timer
(``llvm.readsteadycounter``), loads the buffer address and, when it is not 0, stores the value to its warp's
slot ``linear_warp * E + e`` if that slot is below the count (scf, arith, gpu, llvm). The active lanes store
to the same word (one store; no branch on the lane, so that no warp-collective code after a trace point is
split across lanes). Not ``enabled``: every trace op erased, nothing else changes. Options: enabled (default
false), wave-size (32 or 64: the lanes of a warp, for the warp index).

Record layout (docs/tracing.md): linear_block = bid.x + grid.x * (bid.y + grid.y * bid.z) (with virtual PEs
bid.z is the PE), linear_warp = linear_block * ceil(block threads / wave) + flat thread id / wave. The last
execution of a slot by a warp wins (between the lanes of one execution, whichever store lands last: their timer
values differ by nanoseconds); 0 means never executed (the runtime zeroes the buffer). The timer is read first,
so the global load's latency is not part of the phase that follows.

Why a global and not a kernel parameter: tracing changes no kernel signature (the EP schema owns those), the
same launches run traced and untraced, and a 0 switches a traced kernel off at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import ir, nested_ops
from mori_compiler.dialects.builder import Builder
from mori_compiler.dialects.irdl_spec import string_value
from mori_compiler.errors import MoriCompilerError
from mori_compiler.lib_bitcode.kernel_abi import TRACE_GLOBAL_BYTES, TRACE_SLOT_BYTES, trace_global

from .gpu_kernels import TRACE_EVENTS_ATTR, gpu_kernels

TRACE_OP = "mori_comm.trace"


def _slot_name(op: ir.Operation) -> str:
    return f"{string_value(op.attributes['event'])}:{string_value(op.attributes['phase'])}"


def _lower_point(op: ir.Operation, symbol: str, slot: int, slots: int, wave: int) -> None:
    b = Builder(op.block, before=op, loc=op.location)
    now = b.op("llvm.call_intrinsic", (), (b.i64,), {"intrin": ir.StringAttr.get("llvm.readsteadycounter"),
                                                     "op_bundle_sizes": ir.DenseI32ArrayAttr.get([])}).results[0]
    gptr = ir.Type.parse("!llvm.ptr<1>")
    switch = b.address_of(symbol, gptr)
    buf = b.load(b.i64, switch, alignment=8)
    # Every active lane stores to its warp's slot (one coalesced store), and the only branch is on the buffer
    # address, which is the same for the whole kernel: a trace point never splits a warp. (A lane-0 branch
    # let LLVM duplicate the warp-collective code after it into a lane-0 copy and a copy for the other
    # lanes: on sm_90 the dispatch's shuffles then waited for each other at different instructions.)
    with b.if_(b.cmpi("ne", buf, b.const_i64(0))):
        i64 = lambda v: b.index_cast(b.i64, v)  # noqa: E731
        gx, gy = i64(b.grid_dim("x")), i64(b.grid_dim("y"))
        block = b.addi(i64(b.block_id("x")), b.muli(gx, b.addi(i64(b.block_id("y")), b.muli(gy, i64(b.block_id("z"))))))
        bx, by, bz = i64(b.block_dim("x")), i64(b.block_dim("y")), i64(b.block_dim("z"))
        thread = b.addi(i64(b.thread_id("x")), b.muli(bx, b.addi(i64(b.thread_id("y")), b.muli(by, i64(b.thread_id("z"))))))
        w = b.const_i64(wave)
        warps = b.divui(b.addi(b.muli(b.muli(bx, by), bz), b.const_i64(wave - 1)), w)
        warp = b.addi(b.muli(block, warps), b.divui(thread, w))
        index = b.addi(b.muli(warp, b.const_i64(slots)), b.const_i64(slot))
        capacity = b.load(b.i64, b.gep(switch, 1, b.i64), alignment=8)
        with b.if_(b.cmpi("ult", index, capacity)):  # (warp-uniform) nothing past the buffer, whatever the grid
            dst = b.gep(b.inttoptr(gptr, buf), b.muli(index, b.const_i64(TRACE_SLOT_BYTES)), b.i8)
            b.store(now, dst, alignment=TRACE_SLOT_BYTES)
    op.erase()


def _add_global(symbol: str, before: ir.Operation) -> None:
    words = TRACE_GLOBAL_BYTES // 8
    text = (f"llvm.mlir.global external @{symbol}(dense<0> : tensor<{words}xi64>) {{addr_space = 1 : i32, "
            f"alignment = 8 : i64, externally_initialized}} : !llvm.array<{words} x i64>")  # fmt: skip
    ir.InsertionPoint(before).insert(ir.Operation.parse(text))


@dataclass(frozen=True)
class TraceToTimer:
    """Lower mori_comm.trace points to stores of the global timer into a per-kernel trace buffer (or erase
    them).

    Input: gpu.func kernels with mori_comm.trace ops (a trace op outside a kernel is an error). Output
    (enabled): scf.if, arith, gpu ids / dims, llvm.call_intrinsic llvm.readsteadycounter,
    llvm.load / llvm.store, an llvm.mlir.global per traced kernel, the kernel attribute mori.trace_events;
    not enabled: the trace ops erased. Options: enabled (bool, default false), wave-size (32 or 64).
    """

    name: ClassVar[str] = "mori-trace-to-timer"
    enabled: bool = False
    wave_size: int = 64

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        if self.wave_size not in (32, 64):
            raise MoriCompilerError(f"pass '{self.name}' option wave-size must be 32 or 64, got {self.wave_size}")
        with op.context:
            kernels = list(gpu_kernels(op.operation))
            for point in nested_ops(op.operation, lambda inner: inner.name == TRACE_OP):
                owner = point.parent
                while owner is not None and owner.name != "gpu.func":
                    owner = owner.parent
                if owner is None or "gpu.kernel" not in owner.attributes:
                    raise MoriCompilerError(f"{TRACE_OP} must be inside a gpu.func kernel (the trace buffer is the "
                                            f"kernel's)", point.location)  # fmt: skip
            for fn in kernels:
                points = nested_ops(fn, lambda inner: inner.name == TRACE_OP)
                if not points:
                    continue
                if not self.enabled:
                    for point in points:
                        point.erase()
                    continue
                slots: dict[str, int] = {}
                for point in points:
                    slots.setdefault(_slot_name(point), len(slots))
                symbol = trace_global(string_value(fn.attributes["sym_name"]))
                _add_global(symbol, fn)
                for point in points:
                    _lower_point(point, symbol, slots[_slot_name(point)], len(slots), self.wave_size)
                fn.attributes[TRACE_EVENTS_ATTR] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in slots])
