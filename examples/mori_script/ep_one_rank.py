"""A MORI script run through mori_compiler's MORI-compatible names: EP dispatch and combine on one rank.

It is written against MORI's module names only (``import mori.shmem``, ``from mori.ops import ...``), in
MORI's style: shmem initialized from a unique id (no torch.distributed), one ``EpDispatchCombineOp``, MORI's
dispatch/combine calls and checks. Run it, on a machine with an NVIDIA GPU, with

    python -m mori_compiler.compat run examples/mori_script/ep_one_rank.py [--tokens N] [--rounds R]

(or ``python -m mori_compiler.compat enable`` once, then ``python examples/mori_script/ep_one_rank.py``).
Where the compiler is not installed (a GPU machine without MLIR), precompile its kernels first, on a machine
with the compiler, into the cache the GPU machine uses:

    MORI_COMPILER_CACHE_DIR=.bundles mori-compile --precompile examples/mori_script/precompile.json

``--show-config`` prints the configuration and MORI's size queries of it and exits (no GPU needed).
"""

import argparse
import sys

import torch

import mori.shmem
from mori.ops import EpDispatchCombineConfig, EpDispatchCombineOp

# One rank (world_size 1): every expert is local, so each token comes back once and combines to itself.
CONFIG = dict(
    data_type=torch.bfloat16, rank=0, world_size=1, hidden_dim=2048, scale_dim=0, scale_type_size=4,
    max_token_type_size=2, max_num_inp_token_per_rank=32, num_experts_per_rank=8, num_experts_per_token=4,
    warp_num_per_block=8, block_num=16,
)


def make_config() -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(**CONFIG)


def make_tokens(config, tokens: int, generator):
    """(input [T, H] bf16, weights [T, K] f32, indices [T, K] int32: K distinct experts per token)."""
    experts = config.num_experts_per_rank * config.world_size
    indices = torch.stack([torch.randperm(experts, generator=generator, device="cuda")[: config.num_experts_per_token]
                           for _ in range(tokens)]).to(torch.int32)  # fmt: skip
    weights = torch.rand(tokens, config.num_experts_per_token, generator=generator, device="cuda")
    inp = torch.randn(tokens, config.hidden_dim, generator=generator, device="cuda").to(config.data_type)
    return inp, weights, indices


def round_trip(op, config, tokens: int, generator) -> None:
    inp, weights, indices = make_tokens(config, tokens, generator)
    out, out_weights, _, out_indices, total_recv = op.dispatch(inp, weights, None, indices)
    torch.cuda.synchronize()
    received = int(total_recv[0])
    assert received == tokens, f"one rank receives each of its {tokens} tokens once, got {received}"
    positions = op.get_dispatch_src_token_pos().long()
    assert sorted(positions.tolist()) == list(range(tokens)), "each token arrives exactly once"
    assert torch.equal(out[:received], inp[positions]), "dispatched rows are the tokens"
    assert torch.equal(out_weights[:received], weights[positions]), "dispatched weights"
    assert torch.equal(out_indices[:received], indices[positions]), "dispatched expert ids"
    combined = op.combine(out, out_weights, out_indices)[0]
    torch.cuda.synchronize()
    # Each token's experts are all on this rank: it is combined from one rank, so it is itself.
    assert torch.allclose(combined[:tokens].float(), inp.float(), atol=1e-2, rtol=1e-2), "combine"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=CONFIG["max_num_inp_token_per_rank"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--show-config", action="store_true", help="print the configuration and exit")
    args = parser.parse_args(argv)
    config = make_config()
    if not 1 <= args.tokens <= config.max_num_inp_token_per_rank:
        print(f"error: --tokens must be in [1, {config.max_num_inp_token_per_rank}], got {args.tokens}", file=sys.stderr)
        return 1
    if args.show_config:
        print(f"config: {config}")
        print(f"mori module: {mori.__name__} ({type(mori).__name__}); shmem: {mori.shmem.__name__}")
        return 0
    if not torch.cuda.is_available():
        print("error: this example needs a GPU (torch.cuda.is_available() is False); --show-config runs without one",
              file=sys.stderr)  # fmt: skip
        return 1
    torch.cuda.set_device(0)
    uid = mori.shmem.shmem_get_unique_id()  # rank 0's id; with more ranks it is handed to each of them
    mori.shmem.shmem_init_attr(mori.shmem.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, uid)
    try:
        print(f"PE {mori.shmem.shmem_mype()} of {mori.shmem.shmem_npes()}")
        op = EpDispatchCombineOp(config)
        generator = torch.Generator(device="cuda")
        generator.manual_seed(7)
        for r in range(args.rounds):
            round_trip(op, config, args.tokens, generator)
            print(f"round {r}: dispatch and combine of {args.tokens} tokens PASS")
        del op
    finally:
        torch.cuda.synchronize()
        mori.shmem.shmem_finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
