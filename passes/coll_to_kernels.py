"""``mori-coll-to-kernels``: expand each mori_coll collective in place, in its kernel.

Each op (dialects/mori_coll.py) becomes, before it and in the same block, the steps of its collective
(passes/coll_kernels.py: staging copies, device barriers, pulls from peers, fp32 accumulation), built with
``Builder`` and the mori_comm blocks; the op is then erased. The protocols are written next to the
generators and in docs/collectives.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import ir, nested_ops
from mori_compiler.dialects import mori_coll
from mori_compiler.dialects.builder import Builder, GeneratorError, verify_generated
from mori_compiler.errors import MoriCompilerError

from .coll_kernels import EXPANSIONS, GENERATOR, Collective
from .gpu_kernels import MAX_BLOCKS_ATTR


def _kernel_of(op: ir.Operation) -> ir.Operation | None:
    parent = op.parent
    while parent is not None and parent.name not in ("gpu.func", "func.func", "llvm.func", "gpu.module"):
        parent = parent.parent
    return parent if parent is not None and parent.name == "gpu.func" and "gpu.kernel" in parent.attributes else None


def _block_problem(kernel: ir.Operation, wave: int, world: int) -> str | None:
    """Why the kernel's launch bound does not suit a collective (None: it does)."""
    if "known_block_size" not in kernel.attributes:
        return "needs its kernel to have known_block_size (the warps per block cut its pieces)"
    x, y, z = list(ir.DenseI32ArrayAttr(kernel.attributes["known_block_size"]))
    if y != 1 or z != 1 or x % wave or x < max(wave, world):
        return (f"needs a one-dimensional block whose size is a multiple of the wave size {wave} and at least "
                f"world_size ({world}): the kernel's known_block_size is ({x}, {y}, {z})")  # fmt: skip
    return None


@dataclass(frozen=True)
class MoriCollToKernels:
    """Expand the mori_coll collectives into code built from mori_comm blocks, in their kernels.

    Input: mori_coll ops in gpu.func kernels (``known_block_size`` one-dimensional, a multiple of the wave
    size). Output: in place of each op, its collective's steps (mori_comm ``copy_bytes``,
    ``device_barrier`` or, with one-gpu, ``one_gpu_barrier``, ``barrier_arrive`` / ``barrier_wait``,
    ``accumulate_rows``; mori_shmem ``my_pe``, ``ptr``; gpu, scf, arith, llvm), located
    at the op. Options: wave-size (32 or 64: the target's; the warps that own the pieces); one-gpu (every PE
    runs on this one GPU, virtual PEs: the meets are ``one_gpu_barrier``, fencing at the GPU's scope, not
    ``device_barrier``, at the system's); one-launch (every PE is a part of this one launch, virtual PEs:
    the launch's end closes each call, so there is no closing barrier; coll_kernels.py, "Close"). The
    pipeline sets both with virtual PEs. Each kernel holding a collective gets the attribute
    ``mori.max_blocks`` (the least ``max_blocks`` of its ops; the bundle records it and the launcher refuses a
    grid wider than it, or with y or z > 1 per PE: blocks would share device-barrier slots). An op outside a
    kernel or in a kernel of an unsuitable block size is the user's error (at the op); a kernel that does
    not verify after the expansion is a GeneratorError naming ``coll_kernels`` (an internal error).
    """

    name: ClassVar[str] = "mori-coll-to-kernels"
    wave_size: int = 64
    one_gpu: bool = False
    one_launch: bool = False

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        if self.wave_size not in (32, 64):
            raise MoriCompilerError(f"pass '{self.name}' option wave-size must be 32 or 64, got {self.wave_size}")
        prefix = mori_coll.DIALECT_NAME + "."
        with op.context:
            for gm in op.operation.regions[0].blocks[0].operations:
                if gm.operation.name != "gpu.module":
                    continue
                kernels: list[ir.Operation] = []
                for coll in nested_ops(gm.operation, lambda inner: inner.name.startswith(prefix)):
                    kernel = self._expand(coll)
                    if all(kernel != k for k in kernels):
                        kernels.append(kernel)
                for kernel in kernels:
                    verify_generated(kernel, GENERATOR)

    def _expand(self, op: ir.Operation) -> ir.Operation:
        spec = mori_coll.spec_of(op)
        kernel = _kernel_of(op)
        if kernel is None:
            raise MoriCompilerError(f"'{op.name}' must be inside a gpu.func kernel (every thread of the grid runs "
                                    f"the collective)", op.location)  # fmt: skip
        if op.parent != kernel or len(kernel.regions[0].blocks) != 1:
            raise MoriCompilerError(f"'{op.name}' must be in its kernel's body itself, not inside scf.if, scf.for, "
                                    f"scf.while or another region or block: every thread of the grid must reach "
                                    f"it (its barriers would hang in divergent code)", op.location)  # fmt: skip
        problem = _block_problem(kernel, self.wave_size, spec.world_size)
        if problem:
            raise MoriCompilerError(f"'{op.name}' {problem}", op.location)
        expand = EXPANSIONS[(spec.op, spec.algorithm)]
        try:
            b = Builder(op.block, before=op, loc=op.location)
            collective = Collective(b, spec, *op.operands, wave=self.wave_size, one_gpu=self.one_gpu,
                                    one_launch=self.one_launch)
            expand(collective)
            collective.finish()
        except (GeneratorError, MoriCompilerError):
            raise
        except Exception as exc:  # a generator bug (a wrong builder call): internal, named
            raise GeneratorError(GENERATOR, f"{type(exc).__name__}: {exc}") from exc
        op.erase()
        limit = spec.max_blocks
        if MAX_BLOCKS_ATTR in kernel.attributes:
            limit = min(limit, ir.IntegerAttr(kernel.attributes[MAX_BLOCKS_ATTR]).value)
        kernel.attributes[MAX_BLOCKS_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), limit)
        return kernel
