"""Every mori_shmem primitive on a real GPU, with 2, 4 and 8 virtual PEs in one launch.

Each test fills outputs with poison first, draws random data from fixed seeds, launches one kernel of
kernels.py for all PEs at once (grid z = PE) and checks the effect from the host against an expectation
computed on the host. Waits run in bounded-wait mode, so a broken protocol fails with a report instead
of hanging the run.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import kernels  # noqa: E402

pytestmark = pytest.mark.gpu

POISON = 0xA5
WAIT_LIMIT = 1 << 22  # polls (each ~32 ns of back-off): a stuck wait reports in well under a minute
BLOCK_THREADS = {"thread": 1, "warp": 32, "block": 256}


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda n: f"{n}pes")
def world(request, bundle_root):
    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    torch.cuda.init()
    shmem.shmem_init_virtual(request.param)
    try:
        ks = KernelSet(kernels.bundle(bundle_root), wait_limit=WAIT_LIMIT)
        yield request.param, ks
    finally:
        torch.cuda.synchronize()
        shmem.shmem_finalize()


def _sym(nbytes: int, fill: int = POISON):
    """A symmetric uint8 buffer: (handle, [per-PE torch view]) with every PE's copy filled."""
    import torch

    from mori_compiler.runtime import shmem

    handle = shmem.shmem_malloc(nbytes)
    views = [shmem.shmem_tensor(handle, (nbytes,), torch.uint8, pe=p) for p in range(shmem.shmem_npes())]
    for v in views:
        v.fill_(fill)
    return handle, views


def _local_addr(handle: int, pe: int) -> int:
    from mori_compiler.runtime import shmem

    return shmem.shmem_ptr_p2p(handle, 0, pe)


def _random_bytes(n: int, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8, device="cuda")


def _launch(ks, kernel, per_pe_args, threads):
    ks.launch_virtual(kernel, per_pe_args, grid=(1, 1), block=(threads, 1, 1))
    ks.synchronize()


# Sizes in bytes and (dst offset, src offset): aligned, equally misaligned, differently misaligned.
SIZES = [1, 3, 16, 17, 255, 4096 + 5, 1 << 20, 16 << 20]
OFFSETS = [(0, 0), (1, 1), (3, 7)]


def _transfer_cases(scope: str, elem: str | None):
    esize = kernels.ELEM_BYTES[elem]
    for size, (doff, soff) in itertools.product(SIZES, OFFSETS):
        if elem is not None:  # typed: element-aligned offsets, whole elements
            size = max(esize, size // esize * esize)
            doff, soff = doff * esize, soff * esize
            if size > (1 << 20):
                continue
        if scope == "thread" and size > (1 << 20) and (doff, soff) != (0, 0):
            continue  # one thread moving 16 MiB byte by byte is slow and adds nothing
        yield size, doff, soff


@pytest.mark.parametrize("op", ["put", "get_nbi", "get"])
@pytest.mark.parametrize("scope", kernels.SCOPES)
@pytest.mark.parametrize("elem", kernels.ELEMS, ids=lambda e: e or "mem")
def test_transfer(world, op, scope, elem):
    n_pes, ks = world
    from mori_compiler.runtime import shmem

    esize = kernels.ELEM_BYTES[elem]
    cap = (16 << 20) + 64
    handle, sym = _sym(cap)
    try:
        for case, (size, doff, soff) in enumerate(_transfer_cases(scope, elem)):
            for v in sym:
                v.fill_(POISON)
            src = [_random_bytes(cap, seed=1000 * case + p) for p in range(n_pes)]
            local = [_random_bytes(cap, seed=7 + p) for p in range(n_pes)]  # get destinations: noise to keep
            before = [t.clone() for t in local]
            count = size // esize
            if op == "put":  # PE p writes its src into dst on PE p+1
                args = [(_local_addr(handle, p) + doff, src[p].data_ptr() + soff, count, (p + 1) % n_pes)
                        for p in range(n_pes)]  # fmt: skip
            else:  # PE p reads the symmetric buffer of PE p+1 into its local buffer
                for p in range(n_pes):
                    sym[p].copy_(src[p])
                args = [(local[p].data_ptr() + doff, _local_addr(handle, p) + soff, count, (p + 1) % n_pes)
                        for p in range(n_pes)]  # fmt: skip
            _launch(ks, f"{op}_{scope}_{elem or 'mem'}", args, BLOCK_THREADS[scope])
            for p in range(n_pes):
                if op == "put":
                    got, want_from, untouched = sym[(p + 1) % n_pes], src[p], POISON
                    assert bool((got[:doff] == untouched).all()) and bool((got[doff + size:] == untouched).all()), \
                        f"{op} {scope} size={size} offsets={doff},{soff}: bytes outside the target were written"
                else:
                    got, want_from = local[p], src[(p + 1) % n_pes]
                    assert bool((got[:doff] == before[p][:doff]).all()) and bool(
                        (got[doff + size:] == before[p][doff + size:]).all()), "get wrote outside its target"
                assert bool((got[doff:doff + size] == want_from[soff:soff + size]).all()), (
                    f"{op} {scope} elem={elem} size={size} offsets={doff},{soff} PE {p}: payload differs")
    finally:
        shmem.shmem_free(handle)


@pytest.mark.parametrize("scope", kernels.SCOPES)
@pytest.mark.parametrize("signal_op", ["set", "add"])
@pytest.mark.parametrize("threads", [None, "all"], ids=["one-caller", "whole-block"])
def test_put_signal(world, scope, signal_op, threads):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    size = 4096 + 17
    handle, sym = _sym(size)
    sig_handle, _ = _sym(8 * n_pes, fill=0)
    sig = [shmem.shmem_tensor(sig_handle, (n_pes,), torch.int64, pe=p) for p in range(n_pes)]
    try:
        for p in range(n_pes):
            sig[p].fill_(1000)
        src = [_random_bytes(size, seed=50 + p) for p in range(n_pes)]
        sigval = [11 * (p + 1) for p in range(n_pes)]
        nthreads = BLOCK_THREADS[scope] if threads is None else 256
        if scope == "thread" and threads is None:
            nthreads = 1
        args = [(_local_addr(handle, p), src[p].data_ptr(), size, _local_addr(sig_handle, p) + 8 * p, sigval[p],
                 (p + 1) % n_pes) for p in range(n_pes)]  # fmt: skip
        ks.launch_virtual(f"put_signal_{scope}_{signal_op}", args, grid=(1, 1), block=(nthreads, 1, 1))
        ks.synchronize()
        # Thread scope signals once per wave (MORI's P2P semantics): a 256-thread block has 8 warps of 32.
        signals = (nthreads + 31) // 32 if scope == "thread" else (nthreads + 31) // 32 if scope == "warp" else 1
        for p in range(n_pes):
            q = (p + 1) % n_pes
            assert torch.equal(sym[q], src[p]), f"put_signal {scope}: payload on PE {q} differs"
            want = sigval[p] if signal_op == "set" else 1000 + signals * sigval[p]
            assert int(sig[q][p]) == want, f"signal on PE {q}: {int(sig[q][p])} != {want}"
    finally:
        shmem.shmem_free(handle)
        shmem.shmem_free(sig_handle)


def test_ring_put_signal_example(world, bundle_root):
    """The built-in example: put+signal to the next PE, then wait for the previous PE's signal and fence."""
    import torch

    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.launcher import KernelSet

    n_pes, _ = world
    ring = KernelSet(kernels.ring_bundle(bundle_root), wait_limit=WAIT_LIMIT)
    size = (1 << 20) + 3
    handle, sym = _sym(size)
    sig_handle, _ = _sym(8, fill=0)
    try:
        for rnd in range(1, 4):
            src = [_random_bytes(size, seed=rnd * 100 + p) for p in range(n_pes)]
            args = [(src[p].data_ptr(), _local_addr(handle, p), _local_addr(sig_handle, p), size, rnd)
                    for p in range(n_pes)]  # fmt: skip
            ring.launch_virtual("ring_put_signal", args, grid=(1, 1), block=(256, 1, 1))
            ring.synchronize()
            for p in range(n_pes):
                assert torch.equal(sym[(p + 1) % n_pes], src[p]), f"round {rnd}: payload on PE {(p + 1) % n_pes}"
                sig = shmem.shmem_tensor(sig_handle, (1,), torch.int64, pe=p)
                assert int(sig[0]) == rnd
    finally:
        shmem.shmem_free(handle)
        shmem.shmem_free(sig_handle)


_P_VALUES = {"i8": (1, -7), "i16": (2, -1234), "i32": (4, -123456789), "i64": (8, -(1 << 40) - 5)}


@pytest.mark.parametrize("c_type", list(kernels.P_TYPES))
def test_immediate_put(world, c_type):
    import struct

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    ty = kernels.P_TYPES[c_type]
    handle, sym = _sym(16 * n_pes)
    try:
        args, expect = [], {}
        for p in range(n_pes):
            if ty.startswith("f"):
                value = 1.25 * (p + 1) - 3.0
                raw = struct.pack("<f" if ty == "f32" else "<d", value)
            else:
                size, base = _P_VALUES[ty]
                value = base + p
                raw = value.to_bytes(size, "little", signed=True)
            args.append((_local_addr(handle, p) + 16 * p, value, (p + 1) % n_pes))
            expect[(p + 1) % n_pes] = (16 * p, raw)
        ks.launch_virtual(f"p_{c_type}", args, grid=(1, 1), block=(1, 1, 1))
        ks.synchronize()
        for q, (off, raw) in expect.items():
            got = bytes(sym[q][off:off + 16].cpu().tolist())
            assert got[:len(raw)] == raw and set(got[len(raw):]) == {POISON}, f"{c_type} on PE {q}: {got.hex()}"
    finally:
        shmem.shmem_free(handle)


def test_put_size_imm(world):
    from mori_compiler.runtime import shmem

    n_pes, ks = world
    for nbytes in (1, 2, 4, 8, 16):
        handle, sym = _sym(32 * n_pes)
        vals = [_random_bytes(16, seed=nbytes * 10 + p) for p in range(n_pes)]
        try:
            args = [(_local_addr(handle, p) + 32 * p, vals[p].data_ptr(), nbytes, (p + 1) % n_pes)
                    for p in range(n_pes)]  # fmt: skip
            ks.launch_virtual("put_imm", args, grid=(1, 1), block=(1, 1, 1))
            ks.synchronize()
            for p in range(n_pes):
                got = sym[(p + 1) % n_pes][32 * p:32 * p + 32].cpu()
                assert got[:nbytes].tolist() == vals[p][:nbytes].cpu().tolist()
                assert set(got[nbytes:].tolist()) == {POISON}
        finally:
            shmem.shmem_free(handle)


_MASK = {"uint32": (1 << 32) - 1, "uint64": (1 << 64) - 1, "int64": (1 << 64) - 1}
_DTYPE = {"uint32": "int32", "uint64": "int64", "int64": "int64"}


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _fold(op: str, init: int, values, mask: int) -> int:
    acc = init
    for v in values:
        acc = {"add": acc + v, "inc": acc + 1, "and": acc & v, "or": acc | v, "xor": acc ^ v}[op] & mask
    return acc


def _serializable(init, olds, values, apply) -> bool:
    """Is there an order of the PEs' updates in which each PE saw its reported old value?
    (Depth-first over the remaining PEs: old values may repeat, e.g. for and/or, so no greedy pick.)"""

    def search(cur, left: frozenset) -> bool:
        if not left:
            return True
        return any(olds[p] == cur and search(apply(cur, values[p]), left - {p}) for p in left)

    return search(init, frozenset(range(len(olds))))


def _atomic_world(n_pes, elem, seed):
    import random

    rnd = random.Random(seed)
    bits = 32 if elem == "uint32" else 64
    init = rnd.getrandbits(bits - 2) | 1
    values = [rnd.getrandbits(bits - 4) | 1 for _ in range(n_pes)]
    return bits, init, values


@pytest.mark.parametrize("elem", list(kernels.ATOMIC_ELEMS))
@pytest.mark.parametrize("kind_amo", [("nonfetch", a) for a in kernels.NONFETCH_AMOS] + [("add", None)] +
                         [("fetch", a) for a in kernels.FETCH_AMOS] + [("fetch_add", None)],
                         ids=lambda ka: f"{ka[0]}-{ka[1]}" if ka[1] else ka[0])  # fmt: skip
def test_atomics(world, elem, kind_amo):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    kind, amo = kind_amo
    bits, init, values = _atomic_world(n_pes, elem, seed=hash((elem, kind, amo)) & 0xFFFF)
    mask = (1 << bits) - 1
    dtype = getattr(torch, _DTYPE[elem])
    handle, _ = _sym(8)
    word = [shmem.shmem_tensor(handle, (1,), dtype, pe=p) for p in range(n_pes)]
    out = torch.full((n_pes,), -1, dtype=dtype, device="cuda")
    try:
        word[0].fill_(_signed(init, bits))
        esize = bits // 8
        cmp = init
        args = [(_local_addr(handle, p), _signed(values[p], bits), _signed(cmp, bits), out.data_ptr() + esize * p, 0)
                for p in range(n_pes)]  # fmt: skip
        name = f"atomic_{kind}_{elem}" + (f"_{amo}" if amo else "")
        ks.launch_virtual(name, args, grid=(1, 1), block=(1, 1, 1))
        ks.synchronize()
        final = int(word[0][0]) & mask
        olds = [int(x) & mask for x in out.cpu().tolist()]
        op = "add" if kind in ("add", "fetch_add") else amo.removeprefix("fetch_") if amo != "fetch" else "fetch"
        if op in ("add", "inc", "and", "or", "xor"):
            assert final == _fold(op, init, values, mask), f"{name}: final {final:#x}"
            if kind in ("fetch", "fetch_add"):
                assert _serializable(init, olds, values, lambda a, v: _fold(op, a, [v], mask)), (
                    f"{name}: olds {olds} are not a serialization of the updates from {init:#x}")
        elif op in ("set", "swap"):
            assert final in values, f"{name}: final {final:#x} is no PE's value"
            if kind == "fetch":
                assert sorted(olds + [final]) == sorted([init] + values)
        elif op == "fetch":
            assert final == init and olds == [init] * n_pes
        elif amo == "compare_swap":
            winners = [p for p in range(n_pes) if olds[p] == init]
            assert len(winners) == 1 and final == values[winners[0]], f"cas: olds {olds}, final {final:#x}"
        else:
            raise AssertionError(f"unchecked atomic {name}")
    finally:
        shmem.shmem_free(handle)


def test_atomic_size_nonfetch(world):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    for nbytes, dtype in ((4, torch.int32), (8, torch.int64)):
        handle, _ = _sym(8, fill=0)
        word = shmem.shmem_tensor(handle, (1,), dtype, pe=0)
        vals = torch.tensor([3 * p + 1 for p in range(n_pes)], dtype=dtype, device="cuda")
        try:
            args = [(_local_addr(handle, p), vals.data_ptr() + nbytes * p, nbytes, 0) for p in range(n_pes)]
            ks.launch_virtual("atomic_size_nonfetch_size_add", args, grid=(1, 1), block=(1, 1, 1))
            ks.synchronize()
            assert int(word[0]) == int(vals.sum())
        finally:
            shmem.shmem_free(handle)


@pytest.mark.parametrize("elem", list(kernels.WAIT_ELEMS))
@pytest.mark.parametrize("cmp", ["equals", "greater_than"])
def test_wait_until(world, elem, cmp):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    signed = elem.startswith("int")
    dtype = torch.int32 if elem.endswith("32") else torch.int64
    init, until, setv = (-10, -5, 3) if signed else (0, 5, 7)
    if cmp == "equals":
        until = setv
    handle, _ = _sym(8)
    flags = [shmem.shmem_tensor(handle, (1,), dtype, pe=p) for p in range(n_pes)]
    out = torch.full((n_pes,), 99, dtype=dtype, device="cuda")
    try:
        for f in flags:
            f.fill_(init)
        esize = 4 if dtype == torch.int32 else 8
        args = [(_local_addr(handle, p), setv, until, out.data_ptr() + esize * p, (p + 1) % n_pes)
                for p in range(n_pes)]  # fmt: skip
        ks.launch_virtual(f"wait_{elem}_{cmp}", args, grid=(1, 1), block=(1, 1, 1))
        ks.synchronize()
        assert out.cpu().tolist() == [setv] * n_pes
    finally:
        shmem.shmem_free(handle)


@pytest.mark.parametrize("scope", ["thread", "block"])
def test_barrier_all(world, scope):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    rounds = 6
    handle, _ = _sym(8 * n_pes, fill=0)
    outs = [torch.full((rounds,), -1, dtype=torch.int64, device="cuda") for _ in range(n_pes)]
    try:
        args = [(_local_addr(handle, p), outs[p].data_ptr(), rounds, (p + 1) % n_pes) for p in range(n_pes)]
        ks.launch_virtual(f"barrier_{scope}", args, grid=(1, 1), block=(BLOCK_THREADS[scope], 1, 1))
        ks.synchronize()
        for p in range(n_pes):
            prev = (p - 1) % n_pes
            assert outs[p].cpu().tolist() == [r * 1000 + prev for r in range(rounds)], f"PE {p}"
    finally:
        shmem.shmem_free(handle)


def test_queries_and_ptr_p2p(world):
    import torch

    from mori_compiler.runtime import shmem

    n_pes, ks = world
    handle, _ = _sym(256)
    outside = torch.zeros(16, dtype=torch.int64, device="cuda")
    outs = [torch.full((2 * n_pes + 3,), -1, dtype=torch.int64, device="cuda") for _ in range(n_pes)]
    try:
        args = [(_local_addr(handle, p) + 40, outside.data_ptr(), outs[p].data_ptr()) for p in range(n_pes)]
        ks.launch_virtual("query", args, grid=(1, 1), block=(1, 1, 1))
        ks.synchronize()
        for p in range(n_pes):
            got = outs[p].cpu().tolist()
            assert got[0] == p and got[1] == n_pes
            want = [_local_addr(handle, q) + 40 for q in range(n_pes)]
            assert got[2:2 + n_pes] == want, "ptr_p2p"
            assert got[2 + n_pes:2 + 2 * n_pes] == want, "ptr"
            assert got[2 + 2 * n_pes] == 0, "ptr_p2p of an address outside the heap must be 0"
            assert shmem.shmem_ptr_p2p(outside.data_ptr(), 0, p) == 0
    finally:
        shmem.shmem_free(handle)
