"""EP dispatch/combine (IntraNode, IntraNodeLL, AsyncLL, and the inter-node types with the GPUs split into two
emulated nodes) across real GPUs: one PE per process (torch.multiprocessing), shmem heaps
shared through CUDA IPC, the same oracle as the virtual-PE tests (docs/ep-protocols.md).

Needs at least two GPUs of one host (skips with the reason otherwise); runs on 2, 4 and 8 when present.
Every process regenerates all PEs' inputs from the shared seeds and checks its own outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import test_ep_gpu as ep  # noqa: E402
from multi_gpu import multi_gpu_shmem  # noqa: E402

pytestmark = pytest.mark.gpu
ROUTINGS = ("random", "sentinel", "all_to_one")


KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL", "InterNode", "InterNodeV1", "InterNodeV1LL")
INTERNODE_KINDS = KINDS[3:]


def multi_gpu_config(world: int, rank: int, kind: str = "IntraNode"):
    cfg = ep._config(world, hidden=7168, k=4, m=64, tok=2, kind=kind)
    cfg.rank = rank
    if kind in INTERNODE_KINDS:  # two nodes of world / 2 GPUs (one GPU each with 2): the records cross GPUs
        cfg.gpu_per_node, cfg.rdma_block_num = max(1, world // 2), cfg.block_num // 2
    return cfg


def _worker(rank: int, world: int, init_file: str, bundle_root: str):
    with multi_gpu_shmem(rank, world, init_file, bundle_root):
        _check_every_kind(rank, world)


def _check_every_kind(rank: int, world: int) -> None:
    """This PE's part of the oracle for every kernel type and routing (shmem initialized, one PE per GPU)."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref

    for kind in KINDS:
        cfg = multi_gpu_config(world, rank, kind)
        op = EpDispatchCombineOp(cfg)
        shape = ep._shape(cfg)
        for seed, routing in enumerate(ROUTINGS, 1):
            ns = ep._counts("mixed" if seed % 2 else "max", world, cfg.max_num_inp_token_per_rank, seed)
            idx_np = ref.make_routing(routing, ns, shape, seed)
            x_f32 = [ref.make_tokens(n, cfg.hidden_dim, "bf16", seed * 100 + p) for p, n in enumerate(ns)]
            w_np = [np.random.default_rng(seed + p).random((n, 4), dtype=np.float32) for p, n in enumerate(ns)]
            x = ep._to_torch(x_f32[rank], "bf16")
            idx = torch.from_numpy(np.ascontiguousarray(idx_np[rank], dtype=np.int32)).cuda()
            w = torch.from_numpy(w_np[rank]).cuda()
            out_x, out_w, _, out_idx, total = op.dispatch(x, w, None, idx)
            src_pos = op.get_dispatch_src_token_pos()
            x_bits = [ep._bits(ep._to_torch(v, "bf16")) for v in x_f32]
            expected = ref.expected_recv_rows(x_bits, w_np, None, idx_np, shape)
            tot = int(total.item())
            ref.check_dispatch(rank, ep._bits(out_x[:tot]), out_w[:tot].cpu().numpy(), None, out_idx[:tot].cpu().numpy(),
                               src_pos.cpu().numpy(), tot, expected[rank], shape)  # fmt: skip
            y = out_x[:tot].clone()
            out, out_cw = op.combine(y, out_w[:tot].clone(), idx)
            torch.cuda.synchronize()
            check = ref.check_hierarchical_combine if kind in INTERNODE_KINDS else ref.check_combine
            check(out[: ns[rank]].float().cpu().numpy(), x_f32[rank], idx_np[rank], shape, "bf16", rank=rank)
            np.testing.assert_allclose(out_cw[: ns[rank]].cpu().numpy(),
                                       ref.reference_combine_weights(w_np[rank], idx_np[rank], shape), atol=1e-5,
                                       rtol=1e-5)  # fmt: skip
        op.close()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ep_across_gpus(world, bundle_root):
    import torch
    import torch.multiprocessing as mp

    found = torch.cuda.device_count()
    if found < world:
        pytest.skip(f"needs {world} GPUs of one host, found {found}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "rendezvous"), str(bundle_root)), nprocs=world, join=True)


def test_ep_under_torchrun(bundle_root):
    """The torchrun path of the runtime (shmem_init_from_env): 2 processes started by torchrun, each
    binding GPU LOCAL_RANK, the same oracle."""
    import torch

    found = torch.cuda.device_count()
    if found < 2:
        pytest.skip(f"needs 2 GPUs of one host, found {found}")
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(bundle_root))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          "29517", __file__], env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.count("torchrun rank ok") == 2, run.stdout[-2000:]


if __name__ == "__main__":  # one rank under torchrun (test_ep_under_torchrun)
    from mori_compiler.runtime import shmem

    gpu = shmem.shmem_init_from_env()
    try:
        _check_every_kind(shmem.shmem_mype(), shmem.shmem_npes())
    finally:
        shmem.shmem_finalize()
    print(f"torchrun rank ok (PE {os.environ['RANK']}, GPU {gpu})", flush=True)
