"""The GPU tests' one-PE-per-process set-up: a spawned worker binds GPU ``rank``, joins a gloo group through
a file rendezvous and initializes shmem over it; one definition for the tests that run across GPUs."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def multi_gpu_shmem(rank: int, world: int, init_file: str, bundle_root: str):
    """Inside: shmem of ``world`` PEs, this process PE ``rank`` on GPU ``rank``, kernels from ``bundle_root``;
    shmem and the process group are torn down after."""
    import torch
    import torch.distributed as dist

    from mori_compiler.runtime import shmem

    os.environ["MORI_COMPILER_CACHE_DIR"] = bundle_root
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch._C._distributed_c10d._register_process_group("default", dist.group.WORLD)
    shmem.shmem_torch_process_group_init("default")
    try:
        yield
    finally:
        shmem.shmem_finalize()
        dist.destroy_process_group()
