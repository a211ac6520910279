"""Two processes on one GPU sharing symmetric memory through CUDA IPC handles.

Each process is one PE (shmem_torch_process_group_init over a gloo group). Checked: IPC-mapped peer
heaps hold the peer's data (host-visible through tensor views), ptr_p2p, a put kernel and a remote
atomic from each PE into the other, and that an allocation-order mismatch is reported on both PEs.
No kernel spins on the other process: two processes on one GPU are not guaranteed to run concurrently.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import kernels  # noqa: E402

pytestmark = pytest.mark.gpu
NBYTES = (1 << 20) + 5


def _pattern(rank: int, n: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(4242 + rank)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8, device="cuda")


def _worker(rank: int, world: int, init_file: str, bundle_root: str):
    import torch
    import torch.distributed as dist

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch._C._distributed_c10d._register_process_group("default", dist.group.WORLD)
    shmem.shmem_torch_process_group_init("default")
    try:
        assert shmem.shmem_mype() == rank and shmem.shmem_npes() == world
        peer = 1 - rank
        a = shmem.shmem_malloc(NBYTES)
        b = shmem.shmem_malloc(NBYTES)
        word = shmem.shmem_malloc(8)
        shmem.shmem_tensor(a, (NBYTES,), torch.uint8).copy_(_pattern(rank, NBYTES))
        shmem.shmem_tensor(b, (NBYTES,), torch.uint8).fill_(0xA5)
        shmem.shmem_tensor(word, (1,), torch.int64).fill_(100)
        torch.cuda.synchronize()
        shmem.shmem_barrier_all()

        # The peer's heap, mapped through its IPC handle, is visible from the host side.
        seen = shmem.shmem_tensor(a, (NBYTES,), torch.uint8, pe=peer)
        assert torch.equal(seen, _pattern(peer, NBYTES)), f"PE {rank}: peer heap contents differ"
        assert shmem.shmem_ptr_p2p(a, rank, rank) == a
        mapped = shmem.shmem_ptr_p2p(a, rank, peer)
        assert mapped not in (0, a) and mapped == seen.data_ptr()
        assert shmem.shmem_ptr_p2p(_pattern(0, 16).data_ptr(), rank, peer) == 0

        # Device side: put my pattern into the peer's `b`, and add rank+1 to the peer's word.
        ks = KernelSet(kernels.bundle(bundle_root, virtual_pes=False))
        src = _pattern(10 + rank, NBYTES)
        ks.launch("put_block_mem", [b, src, NBYTES, peer], grid=(1, 1, 1), block=(256, 1, 1))
        out = torch.zeros(1, dtype=torch.int64, device="cuda")
        ks.launch("atomic_add_uint64", [word, rank + 1, 0, out, peer], grid=(1, 1, 1), block=(1, 1, 1))
        ks.synchronize()
        torch.cuda.synchronize()
        shmem.shmem_barrier_all()
        assert torch.equal(shmem.shmem_tensor(b, (NBYTES,), torch.uint8), _pattern(10 + peer, NBYTES))
        assert int(shmem.shmem_tensor(word, (1,), torch.int64)[0]) == 100 + peer + 1

        # Both PEs must allocate the same sequence; a mismatch is an error on both, not corruption.
        with pytest.raises((shmem.ShmemError, shmem.ShmemStateError), match="allocation mismatch"):
            shmem.shmem_malloc(256 if rank == 0 else 512)
    finally:
        shmem.shmem_finalize()
        dist.destroy_process_group()


def test_two_processes_share_symmetric_memory(bundle_root):
    import torch.multiprocessing as mp

    kernels.bundle(bundle_root, virtual_pes=False)  # compile (or find) before the workers need it
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_worker, args=(2, init_file, str(bundle_root)), nprocs=2, join=True)
