"""Triton kernels calling shmem between PEs: three processes on one GPU, one PE each (runtime/shmem.py's
multi-process mode, peer heaps mapped through CUDA IPC), with the Triton installed on the GPU machine.

Kernels (all Triton, linked with ``get_extern_libs()``, state filled by ``install_hook()``): my_pe / n_pes /
ptr_p2p for every PE; putmem_nbi_{block,warp,thread} and put_uint64_nbi_block around the ring;
putmem_nbi_signal_{block,thread} with SIGNAL_ADD and SIGNAL_SET; uint64_atomic_add_thread from every PE
into every PE, int64_atomic_fetch_add_thread, atomic_uint64_nonfetch_thread (AMO_SET) and
atomic_uint64_fetch_thread (AMO_COMPARE_SWAP) into the next PE; quiet_thread after each. Random data, poisoned
outputs and receive buffers, every result checked on the host. Kernels of processes sharing a GPU are not
guaranteed to run at the same time, so no kernel waits for another PE: the host synchronizes
(``shmem_barrier_all``) between the phases. Also: a shmem kernel launched before shmem init is refused,
and works once shmem is initialized.

Nothing to precompile: the library text is written from lib_bitcode's sources on first use, without MLIR or
llvmlite (test_triton_client.py checks that), into the bundle cache (``MORI_TEST_BUNDLES``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton==3.6.0)")

import triton.language as tl  # noqa: E402

from mori_compiler.clients import triton as mt  # noqa: E402
from mori_compiler.lib_bitcode.abi import AtomicType  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
N_PES = 3
LANES = 32  # num_warps=1: one tensor element per thread, so each *_thread call is made exactly once per lane
CHUNK = 4099  # bytes per lane for the thread-scope puts (odd: no alignment luck)
NBYTES = LANES * CHUNK
POISON = 0xA5
AMO_SET = tl.constexpr(int(AtomicType.AMO_SET))
AMO_COMPARE_SWAP = tl.constexpr(int(AtomicType.AMO_COMPARE_SWAP))


# ---- the kernels ------------------------------------------------------------------------------------------


@triton.jit
def query(buf, out):
    me = mt.my_pe()
    n = mt.n_pes()
    tl.store(out, me)
    tl.store(out + 1, n)
    for p in range(0, n):
        tl.store(out + 2 + p, mt.ptr_p2p(buf, me, p).to(tl.int64))


@triton.jit
def query_before_init(out):
    tl.store(out, mt.my_pe())


@triton.jit
def put_ring(d_block, d_warp, d_thread, d_typed, src, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    me = mt.my_pe()
    peer = (me + 1) % mt.n_pes()
    mt.putmem_nbi_block(d_block, src, nbytes, peer, 0)
    mt.putmem_nbi_warp(d_warp, src, nbytes, peer, 0)  # num_warps=1: the one warp puts it once
    off = tl.arange(0, LANES) * CHUNK
    mt.putmem_nbi_thread(d_thread + off, src + off, CHUNK, peer, 0)  # lane i: chunk i
    mt.put_uint64_nbi_block(d_typed, src.to(tl.pointer_type(tl.uint64)), nbytes // 8, peer, 0)
    mt.quiet_thread()


@triton.jit
def put_signal_ring(d_block, d_thread, src, nbytes, sig_add, sig_set, CHUNK: tl.constexpr, LANES: tl.constexpr):
    me = mt.my_pe()
    peer = (me + 1) % mt.n_pes()
    mt.putmem_nbi_signal_block(d_block, src, nbytes, sig_add, me + 1, mt.SIGNAL_ADD, peer, 0)
    lanes = tl.arange(0, LANES)
    off = lanes * CHUNK
    value = (lanes * 7 + me).to(tl.uint64)
    mt.putmem_nbi_signal_thread(d_thread + off, src + off, CHUNK, sig_set + lanes, value, mt.SIGNAL_SET, peer, 0)
    mt.quiet_thread()


@triton.jit
def atomics(counters, fetch_words, set_words, cas_words, fetched, cas_old, LANES: tl.constexpr):
    me = mt.my_pe()
    n = mt.n_pes()
    lanes = tl.arange(0, LANES)
    for p in range(0, n):  # every PE adds (me + 1) * (lane + 1) to every PE's counters[lane]
        mt.uint64_atomic_add_thread(counters + lanes, ((me + 1) * (lanes + 1)).to(tl.uint64), p, 0)
    peer = (me + 1) % n
    mine = me * LANES + lanes  # the next PE's words only this PE touches
    old = mt.int64_atomic_fetch_add_thread(fetch_words + mine, (lanes + 100).to(tl.int64), peer, 0)
    tl.store(fetched + lanes, old)
    mt.atomic_uint64_nonfetch_thread(set_words + mine, (lanes * 1000 + me).to(tl.uint64), AMO_SET, peer, 0)
    compare = tl.load(cas_old + lanes).to(tl.uint64) + (lanes % 2).to(tl.uint64)  # odd lanes: a wrong compare
    swapped = mt.atomic_uint64_fetch_thread(cas_words + mine, (lanes + 5).to(tl.uint64), compare, AMO_COMPARE_SWAP,
                                            peer, 0)  # fmt: skip
    tl.store(cas_old + lanes, swapped.to(tl.int64))
    mt.quiet_thread()


# ---- the PEs --------------------------------------------------------------------------------------------


def _random(seed: int, n: int, dtype):
    import torch

    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
    return torch.randint(0, 1 << 40, (n,), generator=g, dtype=torch.int64)


def _sym(shape, dtype, fill):
    from mori_compiler.runtime import shmem

    t = shmem.mori_shmem_create_tensor(shape, dtype)
    if isinstance(fill, int):
        t.fill_(fill)
    else:
        t.copy_(fill)
    return t


def _sync():
    import torch

    from mori_compiler.runtime import shmem

    torch.cuda.synchronize()
    shmem.shmem_barrier_all()


def _check_query(rank, world):
    import torch

    from mori_compiler.runtime import shmem

    buf = _sym((64,), torch.uint8, 0)
    out = torch.full((2 + world,), -7, dtype=torch.int64, device="cuda")  # poison
    query[(1,)](buf, out, num_warps=1, extern_libs=mt.get_extern_libs())
    torch.cuda.synchronize()
    want = [rank, world] + [shmem.shmem_ptr_p2p(buf.data_ptr(), rank, p) for p in range(world)]
    assert out.cpu().tolist() == want, f"PE {rank}: my_pe, n_pes, ptr_p2p per PE: {out.cpu().tolist()} != {want}"
    assert want[2 + rank] == buf.data_ptr() and all(want[2:]), f"PE {rank}: ptr_p2p gave {want[2:]}"


def _check_puts(rank, world, prev):
    import torch

    src = _random(10 + rank, NBYTES, torch.uint8).cuda()
    dests = [_sym((NBYTES,), torch.uint8, POISON) for _ in range(4)]
    _sync()
    put_ring[(1,)](*dests, src, NBYTES, CHUNK=CHUNK, LANES=LANES, num_warps=1, extern_libs=mt.get_extern_libs())
    _sync()
    want = _random(10 + prev, NBYTES, torch.uint8)
    for what, d in zip(("putmem_nbi_block", "putmem_nbi_warp", "putmem_nbi_thread", "put_uint64_nbi_block"), dests):
        got = d.cpu()
        bad = (got != want).nonzero()
        assert bad.numel() == 0, (f"PE {rank}: {what} from PE {prev}: {bad.numel()} bytes differ, first at "
                                  f"{bad[0].item()}")  # fmt: skip


def _check_put_signal(rank, world, prev):
    import torch

    src = _random(20 + rank, NBYTES, torch.uint8).cuda()
    d_block, d_thread = (_sym((NBYTES,), torch.uint8, POISON) for _ in range(2))
    sig_add = _sym((1,), torch.int64, 1000)  # ADD must add to it, not overwrite it
    sig_set = _sym((LANES,), torch.int64, -1)
    _sync()
    put_signal_ring[(1,)](d_block, d_thread, src, NBYTES, sig_add, sig_set, CHUNK=CHUNK, LANES=LANES, num_warps=1,
                          extern_libs=mt.get_extern_libs())  # fmt: skip
    _sync()
    want = _random(20 + prev, NBYTES, torch.uint8)
    assert torch.equal(d_block.cpu(), want), f"PE {rank}: putmem_nbi_signal_block data from PE {prev} differs"
    assert torch.equal(d_thread.cpu(), want), f"PE {rank}: putmem_nbi_signal_thread data from PE {prev} differs"
    assert int(sig_add[0]) == 1000 + prev + 1, f"PE {rank}: SIGNAL_ADD word is {int(sig_add[0])}, want {1001 + prev}"
    # Thread scope signals once per wave, from its highest active lane (MORI's P2P semantics,
    # lib_bitcode/sources/shmem_core.ll __mc_put_signal): only that lane's word is set.
    want_set = [-1] * (LANES - 1) + [(LANES - 1) * 7 + prev]
    assert sig_set.cpu().tolist() == want_set, f"PE {rank}: SIGNAL_SET words {sig_set.cpu().tolist()} != {want_set}"


def _check_atomics(rank, world, prev):
    import torch

    def words(seed):  # every PE knows every PE's initial words (same seeds)
        return _random(seed, world * LANES, torch.int64)

    counters = _sym((LANES,), torch.int64, words(30 + rank)[:LANES].cuda())
    fetch_words = _sym((world * LANES,), torch.int64, words(40 + rank).cuda())
    set_words = _sym((world * LANES,), torch.int64, words(50 + rank).cuda())
    cas_words = _sym((world * LANES,), torch.int64, words(60 + rank).cuda())
    nxt = (rank + 1) % world
    mine = slice(rank * LANES, (rank + 1) * LANES)
    cas_old = words(60 + nxt)[mine].clone().cuda()  # in: the compare base; out: the old values
    fetched = torch.full((LANES,), -7, dtype=torch.int64, device="cuda")  # poison
    _sync()
    atomics[(1,)](counters, fetch_words, set_words, cas_words, fetched, cas_old, LANES=LANES, num_warps=1,
                  extern_libs=mt.get_extern_libs())  # fmt: skip
    _sync()
    lanes = torch.arange(LANES, dtype=torch.int64)
    added = (lanes + 1) * (world * (world + 1) // 2)
    assert torch.equal(counters.cpu(), words(30 + rank)[:LANES] + added), f"PE {rank}: uint64_atomic_add_thread sums"
    assert torch.equal(fetched.cpu(), words(40 + nxt)[mine]), f"PE {rank}: int64_atomic_fetch_add_thread old values"
    assert torch.equal(cas_old.cpu(), words(60 + nxt)[mine]), f"PE {rank}: compare-swap old values"
    theirs = slice(prev * LANES, (prev + 1) * LANES)
    want_fetch, want_set, want_cas = words(40 + rank), words(50 + rank), words(60 + rank)
    want_fetch[theirs] += lanes + 100
    want_set[theirs] = lanes * 1000 + prev
    want_cas[theirs] = torch.where(lanes % 2 == 0, lanes + 5, want_cas[theirs])  # odd lanes compared wrong
    assert torch.equal(fetch_words.cpu(), want_fetch), f"PE {rank}: words after PE {prev}'s fetch-adds"
    assert torch.equal(set_words.cpu(), want_set), f"PE {rank}: words after PE {prev}'s AMO_SET"
    assert torch.equal(cas_words.cpu(), want_cas), f"PE {rank}: words after PE {prev}'s compare-swaps"


def _worker(rank: int, world: int, init_file: str):
    import torch
    import torch.distributed as dist

    from mori_compiler.runtime import shmem

    torch.cuda.set_device(0)
    mt.install_hook()
    out = torch.full((1,), -7, dtype=torch.int32, device="cuda")
    for _ in range(2):  # refused at every launch, not only at the one that loaded it
        with pytest.raises(shmem.ShmemStateError, match="calls shmem device functions, but shmem is not initialized"):
            query_before_init[(1,)](out, num_warps=1, extern_libs=mt.get_extern_libs())
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    shmem.shmem_torch_process_group_init("default")
    try:
        # loaded before shmem init: its state is filled at its first launch after it
        query_before_init[(1,)](out, num_warps=1, extern_libs=mt.get_extern_libs())
        torch.cuda.synchronize()
        assert int(out[0]) == rank, f"PE {rank}: a kernel loaded before shmem init reads my_pe {int(out[0])}"
        prev = (rank - 1) % world
        _check_query(rank, world)
        _check_puts(rank, world, prev)
        _check_put_signal(rank, world, prev)
        _check_atomics(rank, world, prev)
        _sync()
    finally:
        shmem.shmem_finalize()
        dist.destroy_process_group()


def test_triton_kernels_call_shmem_between_processes(monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(64 << 20))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(N_PES, os.path.join(tmp, "rendezvous")), nprocs=N_PES, join=True)


def test_triton_shmem_example_runs():
    proc = subprocess.run([sys.executable, "examples/triton_shmem/ring.py", "--pes", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pe, prev in ((0, 1), (1, 0)):
        assert f"PE {pe}: received PE {prev}'s" in proc.stdout, proc.stdout
