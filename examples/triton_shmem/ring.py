"""A Triton kernel calling shmem: each PE puts a row into the next PE's symmetric buffer, with a signal.

    python examples/triton_shmem/ring.py --pes 2                    # 2 processes on GPU 0, one PE each
    python examples/triton_shmem/ring.py --compile-only --target gfx942   # no GPU needed (sm_90, gfx942...)

The device functions come from ``mori_compiler.clients.triton`` (MORI's ``mori.ir.triton``: the same script
runs with ``from mori.ir import triton as mt`` under the MORI-compatible names). Two things make a Triton
kernel a shmem kernel: the launch links the device library (``extern_libs=mt.get_extern_libs()``), and
``mt.install_hook()`` fills each such kernel's device state when Triton loads it (after shmem init).

Processes sharing one GPU are not guaranteed to run their kernels at the same time, so no kernel waits for
another PE: the host synchronizes (``shmem_barrier_all``) between the put and the check.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import triton
import triton.language as tl

from mori_compiler.clients import triton as mt


@triton.jit
def put_row_to_next(dest, src, nbytes, signal):
    """All threads of the program put ``src`` into the next PE's ``dest`` together (``*_block``), then
    add 1 to the next PE's ``signal`` (released after the data); quiet waits for completion."""
    me = mt.my_pe()
    peer = (me + 1) % mt.n_pes()
    mt.putmem_nbi_signal_block(dest, src, nbytes, signal, 1, mt.SIGNAL_ADD, peer, 0)
    mt.quiet_thread()


SIGNATURE = {"dest": "*u8", "src": "*u8", "nbytes": "i64", "signal": "*u64"}
TRITON_TARGETS = {"sm_90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64),
                  "gfx1250": ("hip", "gfx1250", 32)}  # (Triton's backend, arch, warp size)


def compile_only(target: str = "sm_90"):
    """Compile the kernel for ``target`` without a GPU; returns Triton's compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gpu = GPUTarget(*TRITON_TARGETS[target])
    return triton.compile(ASTSource(put_row_to_next, SIGNATURE, {}), target=gpu,
                          options={"extern_libs": tuple(mt.get_extern_libs(gpu).items()), "num_warps": 4})  # fmt: skip


def _row(pe: int, nbytes: int):
    import torch

    return torch.randint(0, 256, (nbytes,), generator=torch.Generator().manual_seed(77 + pe), dtype=torch.uint8)


def _pe_main(rank: int, world: int, init_file: str, nbytes: int) -> None:
    import torch
    import torch.distributed as dist

    from mori_compiler.runtime import shmem

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    shmem.shmem_torch_process_group_init("default")
    mt.install_hook()
    try:
        dest = shmem.mori_shmem_create_tensor((nbytes,), torch.uint8)
        signal = shmem.mori_shmem_create_tensor((1,), torch.int64)  # the device's uint64 word
        dest.fill_(0xA5)  # poison: a missed put cannot pass for data
        signal.zero_()
        src = _row(rank, nbytes).cuda()
        torch.cuda.synchronize()
        shmem.shmem_barrier_all()  # every PE's buffers are ready before anyone puts

        put_row_to_next[(1,)](dest, src, nbytes, signal, num_warps=4, extern_libs=mt.get_extern_libs())
        torch.cuda.synchronize()
        shmem.shmem_barrier_all()  # every put is complete (quiet) before anyone checks

        prev = (rank - 1) % world
        assert torch.equal(dest.cpu(), _row(prev, nbytes)), f"PE {rank}: the row from PE {prev} differs"
        assert int(signal[0]) == 1, f"PE {rank}: signal is {int(signal[0])}, expected 1 (one put from PE {prev})"
        print(f"PE {rank}: received PE {prev}'s {nbytes} bytes and its signal")
    finally:
        shmem.shmem_finalize()
        dist.destroy_process_group()


def run(n_pes: int = 2, nbytes: int = (1 << 16) + 3) -> None:
    """``n_pes`` processes on GPU 0, one PE each, around the ring."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_pe_main, args=(n_pes, os.path.join(tmp, "rendezvous"), nbytes), nprocs=n_pes, join=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pes", type=int, default=2, help="processes (PEs) on GPU 0 (default 2)")
    parser.add_argument("--compile-only", action="store_true", help="compile for --target only (no GPU)")
    parser.add_argument("--target", choices=sorted(TRITON_TARGETS), default="sm_90")
    args = parser.parse_args(argv)
    if args.compile_only:
        k = compile_only(args.target)
        binary = "cubin" if args.target.startswith("sm_") else "hsaco"
        print(f"{args.target}: put_row_to_next compiled ({len(k.asm[binary])} bytes of {binary})")
        return 0
    if args.pes < 2:
        parser.error("--pes must be at least 2 (a ring)")
    run(args.pes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
