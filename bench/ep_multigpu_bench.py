"""EP across real GPUs (issue 6): our dispatch/combine against an NCCL all-to-all baseline, one process per GPU.

    python bench/ep_multigpu_bench.py --precompile .bundles --world 8     # where the compiler is
    MORI_COMPILER_CACHE_DIR=.bundles python bench/ep_multigpu_bench.py --world 8 --json out.json
    MORI_COMPILER_CACHE_DIR=.bundles torchrun --nproc-per-node 8 bench/ep_multigpu_bench.py --json out.json

Config: hidden 7168, top-8, 256 experts (256 / W per rank), random routing, tokens per rank 128 / 512 /
4096 / 8192; dispatch bf16 and fp8 (e4m3fn), combine bf16; every leg captured in a CUDA graph and replayed
in lockstep on all ranks (median of --reps; a rank's time is its CUDA-event time, the reported one the
slowest rank's). Ours: the kernel types in --kinds. Baseline, as a PyTorch user without an EP library
would write it: per destination a padded [M, H] slab (tokens deduplicated per destination, in token
order), one NCCL ``all_to_all_single`` for the token counts and one for the slabs, then a local compaction
of the valid rows (dispatch); combine sends the rows back the same way and sums them per token.
GB/s per rank in MORI's accounting (docs/ep-protocols.md): total_recv x H x elem / t. Also the
device-to-device copy bandwidth of GPU 0.

Environment kept as issue 6 asks: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 (set here before NCCL starts); no multicast objects are created.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ep_bench import EXPERTS, HIDDEN, TOPK, _median_replay_us, copy_bandwidth, make_config  # noqa: E402

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _value


def _asyncll_options(kind: str):
    from mori_compiler.ops.asyncll import resolve

    return resolve({}, early_notify=1) if kind == "AsyncLL" else None


def precompile(cache_root, args) -> None:
    from mori_compiler.ops import ep_bundle

    for kind in args.kinds:
        for tokens in args.tokens:
            cfg = make_config(args.world, tokens, args.blocks, args.warps, kind=kind)
            b = ep_bundle(cfg, "sm_90", virtual_pes=False, asyncll=_asyncll_options(kind), cache_root=cache_root)
            print(kind, tokens, b.path)


def _replay_us(graph, reps: int) -> float:
    import torch.distributed as dist

    return _median_replay_us(graph, reps, before_each=dist.barrier)  # ranks replay together: kernels wait for peers


def _capture(fn):
    import torch
    import torch.distributed as dist

    fn()
    torch.cuda.synchronize()
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    return g


class NcclBaseline:
    """Padded all-to-all dispatch/combine with NCCL, the way a PyTorch user without an EP library would
    write it; graph-capturable because every shape is fixed (rows that must not move go to a dump row).
    Token rows travel as bytes (fp8 has no index_copy_)."""

    def __init__(self, world: int, rank: int, tokens: int, elem: int):
        import torch

        W, M, row = world, tokens, HIDDEN * elem
        self.W, self.M = W, M
        dev = torch.device("cuda", torch.cuda.current_device())
        self.send_buf = torch.zeros((W * M + 1, row), dtype=torch.uint8, device=dev)  # last row: dump
        self.recv = torch.zeros((W * M, row), dtype=torch.uint8, device=dev)
        self.out_buf = torch.zeros((W * M + 1, row), dtype=torch.uint8, device=dev)
        self.send_counts = torch.zeros(W, dtype=torch.int64, device=dev)
        self.recv_counts = torch.zeros_like(self.send_counts)
        self.back_send = torch.zeros((W * M, HIDDEN), dtype=torch.bfloat16, device=dev)
        self.back = torch.zeros_like(self.back_send)
        self.combined = torch.zeros((M, HIDDEN), dtype=torch.float32, device=dev)
        self.lane = torch.arange(M, device=dev)
        self.dump = W * M

    def plan(self, idx) -> None:
        """From this rank's [n, K] expert ids: the deduplicated destination mask and each (token,
        destination)'s row in the send slabs (or the dump row)."""
        import torch

        pe = torch.where(idx >= 0, idx // (EXPERTS // self.W), torch.full_like(idx, self.W)).long()
        mask = torch.zeros((idx.shape[0], self.W + 1), dtype=torch.int64, device=idx.device)
        mask.scatter_(1, pe, 1)
        self.mask = mask[:, : self.W]
        slot = torch.cumsum(self.mask, 0) - self.mask
        dest = torch.arange(self.W, device=idx.device) * self.M
        self.send_row = torch.where(self.mask.bool(), dest + slot, torch.full_like(slot, self.dump))
        self.send_counts.copy_(self.mask.sum(0))

    def dispatch(self, x):
        import torch
        import torch.distributed as dist

        n = x.shape[0]
        xb = x.view(torch.uint8).reshape(n, -1)
        self.send_buf.index_copy_(0, self.send_row.reshape(-1), xb.repeat_interleave(self.W, 0))
        dist.all_to_all_single(self.recv_counts, self.send_counts)
        dist.all_to_all_single(self.recv, self.send_buf[: self.dump])
        # compaction: source s's first count[s] rows go to out rows prefix[s] ..., in source order
        prefix = torch.cumsum(self.recv_counts, 0) - self.recv_counts
        valid = self.lane[None, :] < self.recv_counts[:, None]
        self.recv_row = torch.where(valid, prefix[:, None] + self.lane[None, :], torch.full_like(valid, self.dump,
                                                                                                dtype=torch.int64))
        self.out_buf.index_copy_(0, self.recv_row.reshape(-1), self.recv)
        return self.out_buf[: self.dump]

    def combine(self, y):
        """``y``: [W * M, H] bf16 expert outputs in the dispatch output's row order."""
        import torch
        import torch.distributed as dist

        ybuf = torch.cat([y, torch.zeros((1, HIDDEN), dtype=y.dtype, device=y.device)])
        self.back_send.copy_(ybuf[self.recv_row.reshape(-1)])  # back into per-source slabs (dump row = zeros)
        dist.all_to_all_single(self.back, self.back_send)
        n = self.mask.shape[0]
        rows = torch.cat([self.back, torch.zeros((1, HIDDEN), dtype=self.back.dtype, device=y.device)])
        picked = rows[self.send_row.reshape(-1)].float().view(n, self.W, HIDDEN)
        self.combined[:n].copy_(picked.sum(1))
        return self.combined


def _progress(rank: int, t0: float, what: str) -> None:
    if rank == 0:  # one line per step, so that a slow or stuck run shows where it is
        print(f"[{time.perf_counter() - t0:7.1f} s] {what}", flush=True)


def _report(data: dict, args) -> None:
    """Rank 0: the table (and --json), ratios to the NCCL baseline of the same leg, dtype and size."""
    import torch

    base = {(r["leg"], r["dtype"], r["tokens"]): r["us"] for r in data["rows"] if r["impl"] == "nccl-a2a"}
    print(f"{torch.cuda.get_device_name(0)} x {data['world']}: hidden {HIDDEN}, top-{TOPK}, {EXPERTS} experts; D2D copy "
          f"(GPU 0) {data['copy_GBps_rw_gpu0']:.0f} GB/s r+w; slowest rank's median of {args.reps} graph replays")  # fmt: skip
    print(f"{'impl':<12}{'leg':<9}{'dtype':<6}{'tokens':>7}{'us':>9}{'GB/s/rank':>11}{'vs NCCL':>9}")
    for r in data["rows"]:
        ratio = base[(r["leg"], r["dtype"], r["tokens"])] / r["us"]
        r["speedup_vs_nccl"] = ratio
        print(f"{r['impl']:<12}{r['leg']:<9}{r['dtype']:<6}{r['tokens']:>7}{r['us']:>9.1f}{r['GBps_per_rank']:>11.1f}"
              f"{ratio:>9.2f}", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))


def _worker(rank: int, world: int, init_file: str | None, args):
    """One rank. ``init_file``: spawn's rendezvous file; None under torchrun (env://, GPU = LOCAL_RANK)."""
    import faulthandler

    import numpy as np
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    if args.stack_dump_s:  # a hung rank prints every thread's stack (and goes on waiting)
        faulthandler.dump_traceback_later(args.stack_dump_s, repeat=True)

    from mori_compiler.ops import EpDispatchCombineOp
    from mori_compiler.ops import reference as ref
    from mori_compiler.runtime import shmem

    local = int(os.environ.get("LOCAL_RANK", rank)) if init_file is None else rank
    torch.cuda.set_device(local)
    init = "env://" if init_file is None else f"file://{init_file}"  # torchrun's environment, or spawn's file
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                            device_id=torch.device("cuda", local))  # fmt: skip
    gloo = dist.new_group(backend="gloo")
    torch._C._distributed_c10d._register_process_group("ep_shmem", gloo)
    max_tokens = max(args.tokens)
    done = False
    shmem.shmem_torch_process_group_init("ep_shmem", heap_size=8 * world * max_tokens * HIDDEN * 2 + (512 << 20))
    rows = []
    try:
        copy_bps = copy_bandwidth() if rank == 0 else 0.0
        for tokens in args.tokens:
            shape = ref.EpShape(world, EXPERTS // world, TOPK, tokens)
            idx_np = ref.make_routing("random", [tokens] * world, shape, 17)
            idx = torch.from_numpy(np.ascontiguousarray(idx_np[rank], dtype=np.int32)).cuda()
            for kind in args.kinds:
                _progress(rank, t0, f"{tokens} tokens: {kind}")
                op = EpDispatchCombineOp(make_config(world, tokens, args.blocks, args.warps, kind=kind, rank=rank),
                                         asyncll=_asyncll_options(kind))  # fmt: skip
                try:
                    for dname, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
                        x = torch.randn(tokens, HIDDEN, device="cuda").to(dtype)
                        outs = op.dispatch(x, None, None, idx)
                        total = int(outs[4].item())
                        y = outs[0][:total].to(torch.bfloat16) if dname == "fp8" else outs[0][:total]
                        reg = op.get_registered_combine_input_buffer(torch.bfloat16)
                        if kind != "AsyncLL":
                            reg[:total].copy_(y)
                        cin = reg if kind != "AsyncLL" else y
                        res = op.combine(cin, None, idx)
                        torch.cuda.synchronize()
                        if dname == "bf16":  # correctness gate: identity expert => U * x
                            ref.check_combine(res[0][:tokens].float().cpu().numpy(), x.float().cpu().numpy(),
                                              idx_np[rank], shape, "bf16", rank=rank)  # fmt: skip
                        gd = _capture(lambda: op.dispatch(x, None, None, idx))
                        rows.append({"impl": kind, "leg": "dispatch", "dtype": dname, "tokens": tokens,
                                     "us": _replay_us(gd, args.reps), "total_recv": total, "elem": dtype.itemsize})
                        if dname == "bf16":
                            gc = _capture(lambda: op.combine(cin, None, idx))
                            rows.append({"impl": kind, "leg": "combine", "dtype": "bf16", "tokens": tokens,
                                         "us": _replay_us(gc, args.reps), "total_recv": total, "elem": 2})
                finally:
                    op.close()
            _progress(rank, t0, f"{tokens} tokens: NCCL all_to_all baseline")
            for dname, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
                base = NcclBaseline(world, rank, tokens, dtype.itemsize)
                base.plan(idx)
                x = torch.randn(tokens, HIDDEN, device="cuda").to(dtype)
                out = base.dispatch(x)
                y = torch.zeros((world * tokens, HIDDEN), dtype=torch.bfloat16, device="cuda")
                recv_total = int(base.recv_counts.sum().item())
                y[:recv_total].copy_(out[:recv_total].view(dtype).to(torch.bfloat16))
                got = base.combine(y)
                torch.cuda.synchronize()
                if dname == "bf16":  # the baseline is checked like ours: identity expert => U * x
                    ref.check_combine(got[:tokens].cpu().numpy(), x.float().cpu().numpy(), idx_np[rank], shape, "bf16",
                                      rank=rank)  # fmt: skip
                gd = _capture(lambda: base.dispatch(x))
                rows.append({"impl": "nccl-a2a", "leg": "dispatch", "dtype": dname, "tokens": tokens,
                             "us": _replay_us(gd, args.reps), "total_recv": recv_total, "elem": dtype.itemsize})
                if dname == "bf16":
                    gc = _capture(lambda: base.combine(y))
                    rows.append({"impl": "nccl-a2a", "leg": "combine", "dtype": "bf16", "tokens": tokens,
                                 "us": _replay_us(gc, args.reps), "total_recv": recv_total, "elem": 2})
            if rank == 0 and args.json:  # this rank's rows so far: kept if a later size does not finish
                Path(args.json + ".partial").write_text(json.dumps(rows, indent=1))
        gathered = [None] * world
        dist.all_gather_object(gathered, rows, group=gloo)
        if rank == 0:
            merged = []
            for i, r in enumerate(rows):
                per_rank = [g[i] for g in gathered]
                us = max(p["us"] for p in per_rank)
                gbps = statistics.mean(p["total_recv"] * HIDDEN * p["elem"] / (us * 1e-6) / 1e9 for p in per_rank)
                merged.append(r | {"us": us, "GBps_per_rank": gbps})
            _report({"world": world, "copy_GBps_rw_gpu0": copy_bps / 1e9, "rows": merged}, args)
        done = True
    finally:
        shmem.shmem_finalize()
        if done:
            # destroy_process_group hung in NCCL teardown on both ranks after graphs had captured NCCL
            # collectives (2 x H200, torch 2.11); the results are written, so the process leaves here.
            torch.cuda.synchronize()
            os._exit(0)
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=0, help="GPUs (default: all visible)")
    ap.add_argument("--tokens", default="128,512,4096,8192")
    ap.add_argument("--kinds", default="IntraNode,IntraNodeLL,AsyncLL")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--stack-dump-s", type=float, default=0, help="dump every rank's stacks after this many s")
    ap.add_argument("--precompile", metavar="CACHE_DIR")
    args = ap.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.kinds = args.kinds.split(",")
    if args.precompile:
        args.world = args.world or 8
        precompile(args.precompile, args)
        return 0
    import torch
    import torch.multiprocessing as mp

    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this is one rank
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
        return 0
    world = args.world or torch.cuda.device_count()
    if world < 2 or torch.cuda.device_count() < world:
        print(f"needs >= 2 GPUs of one host ({torch.cuda.device_count()} visible, {world} asked)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "rendezvous"), args), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
