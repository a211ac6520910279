"""The GPU tests' virtual-PE shmem fixture, one definition for the test modules that run on virtual PEs."""

from __future__ import annotations

import pytest


def virtual_pes_fixture(counts, heap_size: int = 1 << 30):
    """A module-scoped fixture ``pes``: for each PE count of ``counts`` in turn, a virtual-PE shmem of that
    many PEs (``heap_size`` bytes each), finalized after the module's tests; its value is the count."""

    @pytest.fixture(scope="module", params=tuple(counts), ids=lambda n: f"{n}pes")
    def pes(request):
        import torch

        from mori_compiler.runtime import shmem

        torch.cuda.init()
        shmem.shmem_init_virtual(request.param, heap_size=heap_size)
        try:
            yield request.param
        finally:
            torch.cuda.synchronize()
            shmem.shmem_finalize()

    return pes
