"""Host side of examples/shmem_kernel/allgather.mlir (docs/extending.md, part 1).

    python examples/shmem_kernel/run.py --pes 4            # 4 virtual PEs on one GPU, one launch per round
    torchrun --nproc-per-node 2 examples/shmem_kernel/run.py   # one PE per process (one GPU each)
    python examples/shmem_kernel/run.py --compile-only     # build the bundles (no GPU needed)

Each round every PE sends a fresh random row; afterwards every PE's ``dst`` must hold all rows, in PE
order. Kernels come from the bundle cache: compiled here when the compiler is installed, else found
among the bundles ``mori-compile --precompile examples/shmem_kernel/precompile.json`` built elsewhere
(run from the repository root, with the same ``MORI_COMPILER_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("allgather.mlir")
# The "kernel" string of precompile.json: ``--precompile`` records it in the bundle's request, so a runtime
# lookup must pass the same one (``config={"kernel": ...}``) to find the precompiled bundle.
KERNEL_ENTRY = "examples/shmem_kernel/allgather.mlir"
BLOCK = (256, 1, 1)  # the kernel's known_block_size
WAIT_LIMIT = 1 << 22  # bounded waits: a broken protocol reports which PE waited on what instead of hanging


def bundle(target: str = "sm_90", *, virtual_pes: bool, cache_root=None):
    """The kernel bundle (no MLIR is imported when it is cached or precompiled)."""
    from mori_compiler.cache import get_bundle
    from mori_compiler.options import CompileOptions

    options = CompileOptions(target=target, virtual_pes=virtual_pes)
    return get_bundle(SOURCE.read_text(encoding="utf-8"), options, config={"kernel": KERNEL_ENTRY},
                      cache_root=cache_root, what=KERNEL_ENTRY, kernels=("allgather",))  # fmt: skip


def _rows(rnd: int, n_pes: int, nbytes: int):
    """Every PE's row of round ``rnd`` (the same on every process: CPU generator, fixed seeds)."""
    import torch

    gens = [torch.Generator().manual_seed(1000 * rnd + p) for p in range(n_pes)]
    return [torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8) for g in gens]


def run_virtual(n_pes: int, *, rounds: int = 3, nbytes: int = 4096 + 3, cache_root=None) -> None:
    """All PEs in this process: one cooperative launch per round, grid (1, 1) per PE, grid z = PE."""
    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    shmem.shmem_init_virtual(n_pes)
    try:
        kernels = KernelSet(bundle(virtual_pes=True, cache_root=cache_root), wait_limit=WAIT_LIMIT)
        dst = shmem.shmem_malloc(n_pes * nbytes)  # the handle is PE 0's address of the object
        flags = shmem.shmem_malloc(8 * n_pes)
        for p in range(n_pes):  # allocations are not zeroed; the protocol needs flags = 0 before round 1
            shmem.shmem_tensor(flags, (n_pes,), torch.int64, pe=p).zero_()
        torch.cuda.synchronize()
        for rnd in range(1, rounds + 1):
            rows = [r.cuda() for r in _rows(rnd, n_pes, nbytes)]
            # Every PE gets its *own* address of each symmetric object (ptr_p2p from PE 0's handle).
            args = [(rows[p], shmem.shmem_ptr_p2p(dst, 0, p), shmem.shmem_ptr_p2p(flags, 0, p), nbytes, rnd)
                    for p in range(n_pes)]  # fmt: skip
            kernels.launch_virtual("allgather", args, grid=(1, 1), block=BLOCK)
            kernels.synchronize()  # raises WaitTimeoutError naming the PE and the word if a wait gave up
            want = torch.stack(rows)
            for p in range(n_pes):
                got = shmem.shmem_tensor(dst, (n_pes, nbytes), torch.uint8, pe=p)
                assert torch.equal(got, want), f"round {rnd}: PE {p}'s dst differs from the rows sent"
        shmem.shmem_free(flags)
        shmem.shmem_free(dst)
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def run_multiprocess(*, rounds: int = 3, nbytes: int = 4096 + 3, cache_root=None) -> None:
    """One PE per process (under torchrun): one launch per process and round; host barriers between
    rounds, so that no PE overwrites a row a slower PE is still checking."""
    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    shmem.shmem_init_from_env()  # binds GPU LOCAL_RANK, initializes torch.distributed, maps every peer's heap
    try:
        me, n_pes = shmem.shmem_mype(), shmem.shmem_npes()
        kernels = KernelSet(bundle(virtual_pes=False, cache_root=cache_root), wait_limit=WAIT_LIMIT)
        dst = shmem.shmem_malloc(n_pes * nbytes)  # collective: every PE allocates in the same order
        flags = shmem.shmem_malloc(8 * n_pes)
        shmem.shmem_tensor(flags, (n_pes,), torch.int64).zero_()
        torch.cuda.synchronize()
        shmem.shmem_barrier_all()  # every PE zeroed its flags before any peer can write them
        for rnd in range(1, rounds + 1):
            rows = _rows(rnd, n_pes, nbytes)
            kernels.launch("allgather", (rows[me].cuda(), dst, flags, nbytes, rnd), grid=(1, 1, 1), block=BLOCK)
            kernels.synchronize()
            got = shmem.shmem_tensor(dst, (n_pes, nbytes), torch.uint8).cpu()
            assert torch.equal(got, torch.stack(rows)), f"round {rnd}: PE {me}'s dst differs from the rows sent"
            shmem.shmem_barrier_all()
        shmem.shmem_free(flags)
        shmem.shmem_free(dst)
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pes", type=int, default=4, help="virtual PEs (ignored under torchrun)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile-only", action="store_true", help="build both bundles and exit")
    p.add_argument("--target", default="sm_90", help="with --compile-only: the target to build for")
    args = p.parse_args(argv)
    if args.compile_only:
        for virtual_pes in (True, False):
            b = bundle(args.target, virtual_pes=virtual_pes)
            print(f"{b.key[:12]} {args.target} virtual_pes={virtual_pes}: {', '.join(b.kernels)}")
        return 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run_multiprocess(rounds=args.rounds)
    else:
        run_virtual(args.pes, rounds=args.rounds)
    print("allgather: every PE holds every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
