"""A FlyDSL kernel calling the project's shmem: each PE sends a buffer to its right neighbour on a ring.

PE p writes ``nbytes`` from its ``src`` into ``dst`` on PE (p + 1) % n and, once that data is delivered, sets
the word ``flag`` on that PE to 1 (put with signal: the signal is ordered after the data); then it waits
until its own ``flag`` is 1, i.e. until its left neighbour's data has arrived in its ``dst``. ``dst``, ``src``
and ``flag`` are symmetric addresses (the runtime's shmem_malloc), passed as 64-bit integers: MORI's
device functions take pointers as uint64 addresses.

Compile-only (no AMD GPU needed), for each target:

    python -m mori_compiler.clients.flydsl_compile --target gfx942 --out /tmp/ring examples/flydsl_shmem/ring_put_signal.py

writes /tmp/ring/ring_put_signal.hsaco (the project's device library linked in, ``mori_compiler_shmem_state``
exported for the runtime's shmem_module_init) and /tmp/ring/manifest.json.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

from mori_compiler.clients import flydsl as shmem
from mori_compiler.clients.flydsl_compile import emit

BLOCK = 256  # threads; the put is block-scope, so every thread of the block takes part


@flyc.kernel
def ring_put_signal(dst: fx.Int64, src: fx.Int64, flag: fx.Int64, nbytes: fx.Int64):
    pe = shmem.my_pe()
    right = (pe + 1) % shmem.n_pes()
    shmem.putmem_nbi_signal_block(dst, src, nbytes, flag, 1, shmem.SIGNAL_SET, right, 0)
    shmem.quiet_thread_pe(right)
    shmem.uint64_wait_until_equals(flag, 1)  # the left neighbour's data is in dst


@flyc.jit
def launch(dst: fx.Int64, src: fx.Int64, flag: fx.Int64, nbytes: fx.Int64):
    ring_put_signal(dst, src, flag, nbytes).launch(grid=(1, 1, 1), block=(BLOCK, 1, 1))


if __name__ == "__main__":
    emit("ring_put_signal", launch, 0, 0, 0, 4096)  # compile-only: the addresses are placeholders
