"""One MoE layer step on EpDispatchCombineOp: route, dispatch, expert FFN, combine; checked against a dense
computation of the same layer on one device.

    python examples/moe_layer/moe_layer.py --pes 4                 # 4 virtual PEs on one GPU, one process
    torchrun --nproc-per-node 2 examples/moe_layer/moe_layer.py    # one PE per process (one GPU each)
    python examples/moe_layer/moe_layer.py --compile-only --pes 4 --world-sizes 2   # build the kernels only

The layer has ``world_size * EXPERTS_PER_PE`` experts, each a bf16 matrix ``[H, H]``; PE p owns experts
``[p * EXPERTS_PER_PE, (p + 1) * EXPERTS_PER_PE)``. A step, per PE:

1. route: router logits ``x @ w_router``, the top-k experts, their softmax weights;
2. ``op.dispatch``: each token goes once to every PE that owns one of its experts (with its ids and weights);
3. experts: each received row is multiplied by each of its *local* experts, scaled by that expert's weight,
   summed (fp32), rounded to bf16 (rows beyond ``total_recv`` are masked: no host synchronization);
4. ``op.combine``: each token's rows from its PEs summed in fp32 (combine applies no weights: step 3 did).

Kernels come from the bundle cache (compiled here when the compiler is installed, else precompiled with
``--compile-only`` on a machine that has it, with the same ``MORI_COMPILER_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import os
import sys

HIDDEN = 512  # a multiple of 8 bf16 values (16-byte rows)
MAX_TOKENS = 48  # per PE
EXPERTS_PER_PE = 4
TOP_K = 3
SEED = 2026


def ep_config(world_size: int, rank: int = 0):
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    return EpDispatchCombineConfig(kernel_type=EpDispatchCombineKernelType.IntraNode, data_type="bf16", rank=rank,
                                   world_size=world_size, hidden_dim=HIDDEN, scale_dim=0, scale_type_size=4,
                                   max_token_type_size=2, max_num_inp_token_per_rank=MAX_TOKENS,
                                   num_experts_per_rank=EXPERTS_PER_PE, num_experts_per_token=TOP_K,
                                   warp_num_per_block=4, block_num=16)  # fmt: skip


class MoeLayer:
    """The layer's parameters, the same on every PE (CPU generator, fixed seed), moved to the GPU."""

    def __init__(self, world_size: int, device: str):
        import torch

        g = torch.Generator().manual_seed(SEED)
        n_experts = world_size * EXPERTS_PER_PE
        self.router = (torch.randn(HIDDEN, n_experts, generator=g) / HIDDEN**0.5).to(device)
        self.experts = (torch.randn(n_experts, HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).bfloat16().to(device)

    def route(self, x):
        """(top-k expert ids int32 [n, K], their softmax weights fp32 [n, K]) of tokens ``x`` [n, H]."""
        import torch

        logits = x.float() @ self.router
        top, ids = torch.topk(logits, TOP_K, dim=1)
        return ids.int(), torch.softmax(top, dim=1)

    def local_experts(self, pe: int, rows, weights, ids, total):
        """Step 3 on PE ``pe``: for each received row, the weighted sum of its local experts' outputs (bf16
        ``[R, H]``). Rows ``[total, R)`` hold no token and give 0; nothing here reads ``total`` on the host."""
        import torch

        valid = (torch.arange(rows.shape[0], device=rows.device) < total)[:, None]  # total: int32 [1], on the device
        rows = torch.where(valid, rows.float(), 0.0)  # the unused rows hold anything (stale rows, poison)
        out = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device)
        for local in range(EXPERTS_PER_PE):
            expert = pe * EXPERTS_PER_PE + local
            coef = ((ids == expert) * weights).sum(dim=1)  # the row's weight of this expert, or 0
            out += coef[:, None] * (rows @ self.experts[expert].float())
        return out.bfloat16()

    def dense(self, x):
        """The same layer on one device, in fp32: sum_k w_k * (x @ W_{e_k}) for every token."""
        import torch

        ids, weights = self.route(x)
        picked = self.experts[ids.long()].float()  # [n, K, H, H]
        return torch.einsum("nh,nkhj,nk->nj", x.float(), picked, weights)


def _tokens(pe: int, n: int, device: str):
    import torch

    g = torch.Generator().manual_seed(SEED + 1 + pe)
    return torch.randn(n, HIDDEN, generator=g).bfloat16().to(device)


def _token_counts(world_size: int, step: int) -> list[int]:
    """Per-PE token counts of a step: uneven on purpose (0 and the maximum appear), odd where possible."""
    return [(7 * p + 13 * step) % (MAX_TOKENS + 1) for p in range(world_size)]


def check(pe: int, got, want) -> float:
    """The relative error of PE ``pe``'s combined rows; raises when it exceeds bf16's rounding of the expert
    outputs (each PE's partial sum is rounded to bf16 once before the fp32 combine)."""
    if want.shape[0] == 0:
        return 0.0
    err = float((got.float() - want).abs().max() / want.abs().max().clamp(min=1e-6))
    if not err < 2e-2:
        raise AssertionError(f"PE {pe}: combined output differs from the dense layer (relative error {err:.3g})")
    return err


def run_virtual(n_pes: int, steps: int = 3) -> None:
    """All PEs in this process (``shmem_init_virtual``): every op argument and result is a list per PE."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.runtime import shmem

    torch.cuda.init()
    shmem.shmem_init_virtual(n_pes)
    try:
        op = EpDispatchCombineOp(ep_config(n_pes))
        layer = MoeLayer(n_pes, "cuda")
        for step in range(steps):
            xs = [_tokens(p, n, "cuda") for p, n in enumerate(_token_counts(n_pes, step))]
            routes = [layer.route(x) for x in xs]
            outs = op.dispatch(xs, [w for _, w in routes], None, [ids for ids, _ in routes])
            ys = [layer.local_experts(p, rows, w, ids, total) for p, (rows, w, _, ids, total) in enumerate(outs)]
            combined = op.combine(ys, None, [ids for ids, _ in routes])
            errors = [check(p, out[: x.shape[0]], layer.dense(x)) for p, ((out, _), x) in enumerate(zip(combined, xs))]
            print(f"step {step}: tokens {[x.shape[0] for x in xs]}, max relative error {max(errors):.2e}")
        op.close()
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def run_multiprocess(steps: int = 3) -> None:
    """One PE per process (torchrun): the op takes and returns this PE's tensors, as MORI's does."""
    import torch

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.runtime import shmem

    shmem.shmem_init_from_env()  # binds GPU LOCAL_RANK, initializes torch.distributed, maps every peer's heap
    try:
        me, n_pes = shmem.shmem_mype(), shmem.shmem_npes()
        op = EpDispatchCombineOp(ep_config(n_pes, me))
        layer = MoeLayer(n_pes, "cuda")
        for step in range(steps):
            x = _tokens(me, _token_counts(n_pes, step)[me], "cuda")
            ids, weights = layer.route(x)
            rows, w, _, recv_ids, total = op.dispatch(x, weights, None, ids)
            y = layer.local_experts(me, rows, w, recv_ids, total)
            out, _ = op.combine(y, None, ids)
            err = check(me, out[: x.shape[0]], layer.dense(x))
            print(f"PE {me} step {step}: {x.shape[0]} tokens, relative error {err:.2e}", flush=True)
            shmem.shmem_barrier_all()  # the next step's dispatch overwrites buffers a slower PE may still read
        op.close()
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def compile_only(pes: list[int], world_sizes: list[int], target: str) -> None:
    """The bundles that the virtual-PE runs (``pes``) and the torchrun runs (``world_sizes``) load."""
    from mori_compiler.ops import ep_bundle

    for n in pes:
        print(f"{ep_bundle(ep_config(n), target, virtual_pes=True).path}: {n} virtual PEs")
    for n in world_sizes:
        print(f"{ep_bundle(ep_config(n), target, virtual_pes=False).path}: {n} processes")


def _counts(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of PE counts >= 1, got {text!r}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pes", type=_counts, default=[4], help="virtual PE counts (one run each; not under torchrun)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compile-only", action="store_true", help="build the bundles and exit (no GPU needed)")
    p.add_argument("--world-sizes", type=_counts, default=[], help="with --compile-only: torchrun world sizes")
    p.add_argument("--target", default="sm_90", help="with --compile-only: the target to build for")
    args = p.parse_args(argv)
    if args.compile_only:
        compile_only(args.pes, args.world_sizes, args.target)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run_multiprocess(args.steps)
    else:
        for n in args.pes:
            run_virtual(n, args.steps)
            print(f"moe layer on {n} virtual PEs: every PE's output matches the dense layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
