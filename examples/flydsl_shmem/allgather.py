"""A peer-to-peer allgather written in FlyDSL over the project's shmem.

Every PE contributes ``nbytes`` (its ``src``); afterwards every PE's ``dst`` holds the n contributions in PE
order. The grid has one block per PE: block b of PE p puts p's data into slot p of ``dst`` on PE b and adds 1
to ``flags[p]`` there (put with signal, the signal ordered after the data), then waits until its own
``flags[b]`` reached 1: PE b's contribution has arrived in slot b. ``flags`` are n 64-bit words, zero at the
start; ``dst``, ``src`` and ``flags`` are symmetric addresses passed as 64-bit integers.

Compile-only, for each target:

    python -m mori_compiler.clients.flydsl_compile --target gfx1250 --out /tmp/ag examples/flydsl_shmem/allgather.py
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

from mori_compiler.clients import flydsl as shmem
from mori_compiler.clients.flydsl_compile import emit

BLOCK = 256
FLAG_BYTES = 8  # one uint64 signal word per PE


@flyc.kernel
def allgather(dst: fx.Int64, src: fx.Int64, flags: fx.Int64, nbytes: fx.Int64):
    pe = fx.Int64(shmem.my_pe())
    peer = fx.block_idx.x
    shmem.putmem_nbi_signal_block(dst + pe * nbytes, src, nbytes, flags + pe * FLAG_BYTES, 1, shmem.SIGNAL_ADD,
                                  peer, 0)  # fmt: skip
    shmem.quiet_thread_pe(peer)
    shmem.uint64_wait_until_equals(flags + fx.Int64(peer) * FLAG_BYTES, 1)  # PE peer's slot is here


@flyc.jit
def launch(dst: fx.Int64, src: fx.Int64, flags: fx.Int64, nbytes: fx.Int64, n_pes: fx.Constexpr[int]):
    allgather(dst, src, flags, nbytes).launch(grid=(n_pes, 1, 1), block=(BLOCK, 1, 1))


if __name__ == "__main__":
    emit("allgather", launch, 0, 0, 0, 1 << 16, 8)  # compile-only: placeholder addresses, 8 PEs
