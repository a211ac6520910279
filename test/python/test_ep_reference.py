"""The NumPy EP reference model and oracle (mori_compiler/ops/reference.py) against docs/ep-protocols.md.

Property tests over many seeded routings, a small docs/ep-protocols.md §12 dispatch/combine simulator with a
shuffled arrival order (written here, independently of the module) whose output the oracles must accept,
corruptions of it that they must reject, and exact checks of the bf16 / fp8 encoders. CPU only, NumPy only.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mori_compiler.ops import reference as ref
from mori_compiler.ops.reference import EpShape

WS, ERS, KS = (2, 4, 8), (1, 4, 32), (1, 4, 8)
CONFIGS = [(W, Er, K) for W, Er, K in itertools.product(WS, ERS, KS) if K <= W * Er]
FP8 = ("fp8_e4m3fn", "fp8_e4m3fnuz")


def _id(cfg):
    return "W{}-Er{}-K{}".format(*cfg)


def _shape(cfg, M=16, cap=0):
    W, Er, K = cfg
    return EpShape(W, Er, K, M, cap)


# ---- an independent brute-force model ------------------------------------------------------------------


def brute_route(idx_row, W, Er):
    """(pe, k) pairs of one token, written as plainly as possible."""
    pairs = []
    for k, e in enumerate(int(v) for v in idx_row):
        if e < 0:
            continue
        pe = e // Er
        if pe >= W:
            continue
        if any(pe == p for p, _ in pairs):
            continue
        pairs.append((pe, k))
    return pairs


def simulate_dispatch(xs, ws, ss, idxs, shape, seed, garbage=0xA5):
    """The docs/ep-protocols.md §12 dispatch with a random arrival order per destination.

    Returns per rank a dict with out_x/out_w/out_s/out_idx [R, ...] (unused rows filled with garbage bytes),
    src_pos [R], total_recv, and per source rank the forward map fwd [n, K] (pe * R + slot, null W * R).
    """
    rng = np.random.default_rng(seed)
    W, K, R = shape.W, shape.K, shape.R
    arrivals = [[] for _ in range(W)]  # per destination: (src rank, src tok, k)
    for r in range(W):
        for t in range(idxs[r].shape[0]):
            for pe, k in brute_route(idxs[r][t], W, shape.Er):
                arrivals[pe].append((r, t, k))
    fwd = [np.full((idxs[r].shape[0], K), shape.null_fwd, dtype=np.int64) for r in range(W)]

    def buffer(like, cols):
        a = np.empty((R, *cols), dtype=like.dtype)
        a.view(np.uint8)[...] = garbage
        return a

    outs = []
    for p in range(W):
        order = rng.permutation(len(arrivals[p]))
        assert len(order) <= R, "test configuration overflows the receive capacity"
        o = {
            "out_x": buffer(xs[0], xs[0].shape[1:]),
            "out_w": None if ws is None else buffer(ws[0], ws[0].shape[1:]),
            "out_s": None if ss is None else buffer(ss[0], ss[0].shape[1:]),
            "out_idx": np.full((R, K), -7, dtype=np.int32),
            "src_pos": np.full(R, shape.null_src, dtype=np.int32),
            "total_recv": np.array([len(order)], dtype=np.int32),
        }
        for slot, a in enumerate(order):
            r, t, k = arrivals[p][a]
            o["out_x"][slot] = xs[r][t]
            if ws is not None:
                o["out_w"][slot] = ws[r][t]
            if ss is not None:
                o["out_s"][slot] = ss[r][t]
            o["out_idx"][slot] = idxs[r][t]
            o["src_pos"][slot] = r * shape.S + t
            fwd[r][t, k] = p * R + slot
        outs.append(o)
    return outs, fwd


def simulate_combine(ys, fwd, shape, H):
    """Owner-side docs/ep-protocols.md §12 combine: float32 sum over the non-null forward entries of each token."""
    out = []
    for f in fwd:
        o = np.zeros((f.shape[0], H), dtype=np.float32)
        for t, k in zip(*np.nonzero(f != shape.null_fwd)):
            pe, slot = divmod(int(f[t, k]), shape.R)
            o[t] += ys[pe][slot]
        out.append(o)
    return out


def make_inputs(shape, H, dtype, mode, seed, *, counts=None, scales=True, weights=True):
    counts = counts if counts is not None else ref.make_token_counts(shape, seed)
    idxs = ref.make_routing(mode, counts, shape, seed)
    vals = [ref.make_tokens(n, H, dtype, seed + 100 + r) for r, n in enumerate(counts)]
    bits = [ref.to_bits(v, dtype) for v in vals]
    ws = [ref.make_weights(n, shape.K, seed + 200 + r) for r, n in enumerate(counts)] if weights else None
    ss = [ref.make_scales(n, 3, seed + 300 + r, 1) for r, n in enumerate(counts)] if scales else None
    return counts, idxs, vals, bits, ws, ss


# ---- EpShape ---------------------------------------------------------------------------------------------


def test_shape_sizes():
    s = EpShape(8, 32, 8, 128)
    assert (s.S, s.Rp, s.R, s.null_fwd, s.null_src, s.num_experts) == (1024, 128, 1024, 8 * 1024, 8 * 1024, 256)
    # the recv-cap test configurations of docs/ep-protocols.md §12
    assert EpShape(8, 32, 8, 32, 256).Rp == 32
    assert EpShape(8, 32, 8, 1, 128).Rp == 1
    assert EpShape(8, 32, 8, 16, 128).Rp == 16
    assert EpShape(8, 32, 8, 32, 100).R == 8 * 13
    assert EpShape(8, 32, 8, 32, 10**6).R == 8 * 32  # the cap is clamped to W * M
    assert s.decode_src(s.encode_src(5, 77)) == (5, 77)
    assert s.decode_fwd(s.encode_fwd(7, 1023)) == (7, 1023)
    assert s.decode_src(s.null_src)[0] == s.W and s.decode_fwd(s.null_fwd)[0] == s.W
    for bad in ((0, 1, 1, 1), (2, 0, 1, 1), (2, 1, -1, 1), (2, 1, 1, 0)):
        with pytest.raises(ValueError):
            EpShape(*bad)
    with pytest.raises(ValueError):
        EpShape(2, 1, 1, 1, -1)


# ---- routing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_route_invariants(cfg):
    W, Er, K = cfg
    shape = _shape(cfg)
    for seed, mode in itertools.product(range(3), ("random", "random_dup", "sentinel", "round_robin")):
        counts = ref.make_token_counts(shape, seed, low=0)
        for r, idx in enumerate(ref.make_routing(mode, counts, shape, seed)):
            assert idx.dtype == np.int32 and idx.shape == (counts[r], K)
            # plant out-of-range experts: they must be dropped like sentinels
            idx = idx.copy()
            if idx.size:
                idx.reshape(-1)[::5] = W * Er + np.arange(idx.reshape(-1)[::5].size)
            routed = ref.route(idx, shape)
            dest = ref.destinations(idx, shape)
            u = ref.unique_dest_count(idx, shape)
            assert dest.shape == (counts[r], W) and u.shape == (counts[r],)
            for t in range(counts[r]):
                pairs = routed[t]
                assert pairs == brute_route(idx[t], W, Er)
                pes = [p for p, _ in pairs]
                assert len(set(pes)) == len(pes), "a token goes to each PE at most once"
                assert [k for _, k in pairs] == sorted(k for _, k in pairs), "pairs are in k order"
                for pe, k in pairs:
                    assert idx[t, k] >= 0 and idx[t, k] // Er == pe
                    lower = [kk for kk in range(k) if 0 <= idx[t, kk] < W * Er and idx[t, kk] // Er == pe]
                    assert not lower, "the representative is the lowest k"
                valid = {int(e) // Er for e in idx[t] if 0 <= e < W * Er}
                assert set(pes) == valid
                assert set(np.nonzero(dest[t])[0].tolist()) == valid and u[t] == len(valid)


def test_route_examples():
    shape = EpShape(4, 2, 4, 8)
    idx = np.array([[3, 2, 7, 0], [-1, -1, -1, -1], [5, 9, -3, 4], [1, 1, 1, 1]], dtype=np.int32)
    assert ref.route(idx, shape) == [[(1, 0), (3, 2), (0, 3)], [], [(2, 0)], [(0, 0)]]
    assert ref.unique_dest_count(idx, shape).tolist() == [3, 0, 1, 1]
    assert ref.route(np.zeros((0, 4), np.int32), shape) == []
    assert ref.destinations([], shape).shape == (0, 4)
    with pytest.raises(ValueError):
        ref.route(np.zeros((2, 3), np.int32), shape)


@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_recv_counts(cfg):
    shape = _shape(cfg)
    for seed, mode in itertools.product(range(3), ("random", "random_dup", "sentinel", "round_robin")):
        counts = ref.make_token_counts(shape, seed, low=0)
        idxs = ref.make_routing(mode, counts, shape, seed)
        recv = ref.expected_recv_counts(idxs, shape)
        assert recv.sum() == sum(int(ref.unique_dest_count(i, shape).sum()) for i in idxs)
        brute = np.zeros(shape.W, dtype=int)
        for idx in idxs:
            for row in idx:
                for pe, _ in brute_route(row, shape.W, shape.Er):
                    brute[pe] += 1
        assert recv.tolist() == brute.tolist()
        rows = ref.expected_recv_rows(ref.make_routing(mode, counts, shape, seed), None, None, idxs, shape)
        assert [len(d) for d in rows] == recv.tolist()


@pytest.mark.parametrize("W", WS)
def test_spread_goes_everywhere(W):
    for Er in ERS:
        shape = EpShape(W, Er, W, 16)
        n = 16
        idxs = ref.make_routing("spread", [n] * W, shape, seed=W * Er)
        for idx in idxs:
            assert (np.sort(idx // Er, axis=1) == np.arange(W)).all()
        assert ref.expected_recv_counts(idxs, shape).tolist() == [W * n] * W
        assert (ref.unique_dest_count(idxs[0], shape) == W).all()
    with pytest.raises(ValueError, match="K == W"):
        ref.make_routing("spread", [1] * W, EpShape(W, 4, W - 1, 4), 0)


def test_recv_overflow_with_cap():
    shape = EpShape(8, 32, 8, 32, 64)  # Rp = 8, R = 64
    idxs = ref.make_routing("spread", [32] * 8, shape, 1)
    ov = ref.recv_overflow(idxs, shape)
    assert ov.counts.tolist() == [256] * 8 and ov.capped.tolist() == [64] * 8 and ov.overflow_ranks == list(range(8))
    idxs = ref.make_routing("all_to_one", [8] * 8, shape, 1)
    ov = ref.recv_overflow(idxs, shape)
    assert ov.counts.tolist() == [64] + [0] * 7 and ov.overflow_ranks == []


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c[2] <= c[1]], ids=_id)
def test_all_to_one(cfg):
    shape = _shape(cfg)
    counts = ref.make_token_counts(shape, 3, low=0)
    idxs = ref.make_routing("all_to_one", counts, shape, 3)
    for idx in idxs:
        assert ((idx >= 0) & (idx < shape.Er)).all()
        assert all(len(set(row.tolist())) == shape.K for row in idx), "experts are distinct"
    assert ref.expected_recv_counts(idxs, shape).tolist() == [sum(counts)] + [0] * (shape.W - 1)


def test_routing_modes_and_generators():
    shape = EpShape(4, 4, 4, 64)
    rnd = ref.make_routing("random", [64] * 4, shape, 5)
    assert all(len(set(row.tolist())) == 4 for idx in rnd for row in idx)
    assert all(((i >= 0) & (i < 16)).all() for i in rnd)
    assert [a.tolist() for a in rnd] == [a.tolist() for a in ref.make_routing("random", [64] * 4, shape, 5)]
    assert [a.tolist() for a in rnd] != [a.tolist() for a in ref.make_routing("random", [64] * 4, shape, 6)]
    sen = ref.make_routing("sentinel", [64] * 4, shape, 5)
    frac = np.mean([(i < 0).mean() for i in sen])
    assert 0.2 < frac < 0.5
    assert all((i < 0).all(axis=1).any() for i in sen), "some tokens are all -1"
    rr = ref.make_routing("round_robin", [3, 0, 2, 1], shape, 0)
    assert rr[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] and rr[1].shape == (0, 4)
    rem = ref.make_routing("remote_round_robin", [64] * 4, shape, 0)
    for r, idx in enumerate(rem):
        assert not (idx // 4 == r).any() and all(len(set(row.tolist())) == 4 for row in idx)
    with pytest.raises(ValueError):
        ref.make_routing("nope", [1] * 4, shape, 0)
    with pytest.raises(ValueError):
        ref.make_routing("random", [65, 0, 0, 0], shape, 0)
    with pytest.raises(ValueError):
        ref.make_routing("all_to_one", [1] * 4, EpShape(4, 2, 4, 4), 0)
    assert ref.make_token_counts(shape, 0, use_max=True) == [64] * 4
    c = ref.make_token_counts(shape, 0)
    assert all(1 <= n <= 64 for n in c)
    w = ref.make_weights(5, 4, 0)
    assert w.dtype == np.float32 and w.shape == (5, 4) and ((w >= 0) & (w < 1)).all()
    s1, s4 = ref.make_scales(5, 3, 0, 1), ref.make_scales(5, 3, 0, 4)
    assert s1.dtype == np.uint8 and s4.dtype == np.float32
    assert np.array_equal(ref.from_bits(s1, "fp8_e4m3fnuz"), ref.quantize(s4, "fp8_e4m3fnuz"))


# ---- dispatch oracle -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("float32", "bf16", *FP8))
@pytest.mark.parametrize("cfg", [(2, 4, 4), (4, 1, 4), (8, 32, 8), (8, 4, 1)], ids=_id)
def test_check_dispatch_accepts_simulation(cfg, dtype):
    shape = _shape(cfg)
    for seed, mode in itertools.product(range(2), ("random", "random_dup", "sentinel")):
        counts, idxs, vals, bits, ws, ss = make_inputs(shape, 24, dtype, mode, seed)
        expected = ref.expected_recv_rows(bits, ws, ss, idxs, shape)
        outs, _ = simulate_dispatch(bits, ws, ss, idxs, shape, seed)
        for p, o in enumerate(outs):
            ref.check_dispatch(p, o["out_x"], o["out_w"], o["out_s"], o["out_idx"], o["src_pos"], o["total_recv"],
                               expected, shape)
            n = int(o["total_recv"][0])  # sliced outputs and a plain int count work too
            ref.check_dispatch(p, o["out_x"][:n], None, None, o["out_idx"][:n], o["src_pos"][:n], n, expected[p],
                               shape)


@pytest.mark.parametrize("n", (0, 1, 16))
def test_check_dispatch_token_count_edges(n):
    shape = EpShape(4, 4, 4, 16)
    counts, idxs, vals, bits, ws, ss = make_inputs(shape, 8, "bf16", "random", 9, counts=[n] * 4, scales=False,
                                                   weights=False)
    assert all(b.shape == (n, 8) for b in bits)
    expected = ref.expected_recv_rows(bits, None, None, idxs, shape)
    outs, _ = simulate_dispatch(bits, None, None, idxs, shape, 9)
    for p, o in enumerate(outs):
        ref.check_dispatch(p, o["out_x"], None, None, o["out_idx"], o["src_pos"], o["total_recv"], expected, shape)
    if n == 0:
        assert all(int(o["total_recv"][0]) == 0 for o in outs)


@pytest.fixture
def dispatched():
    shape = EpShape(4, 4, 4, 16)
    counts, idxs, vals, bits, ws, ss = make_inputs(shape, 24, "bf16", "random", 11, counts=[16] * 4)
    expected = ref.expected_recv_rows(bits, ws, ss, idxs, shape)
    outs, _ = simulate_dispatch(bits, ws, ss, idxs, shape, 11)
    p = 2
    o = {k: (None if v is None else v.copy()) for k, v in outs[p].items()}
    assert int(o["total_recv"][0]) >= 4

    def check(**over):
        a = {**o, **over}
        ref.check_dispatch(p, a["out_x"], a["out_w"], a["out_s"], a["out_idx"], a["src_pos"], a["total_recv"],
                           expected, shape)

    check()
    return o, check, shape


def _src_of(o, row, shape):
    return divmod(int(o["src_pos"][row]), shape.S)


def test_check_dispatch_rejects_flipped_byte(dispatched):
    o, check, shape = dispatched
    row = 3
    src, tok = _src_of(o, row, shape)
    x = o["out_x"].copy()
    x.view(np.uint8)[row, 17] ^= 0x10
    with pytest.raises(AssertionError, match=rf"rank 2: x of recv row {row} \(src rank {src}, src token {tok}\).*"
                                             r"first differing byte 17 \(element 8\)"):
        check(out_x=x)
    for name, byte in (("out_w", 5), ("out_s", 1), ("out_idx", 0)):
        a = o[name].copy()
        a.view(np.uint8).reshape(a.shape[0], -1)[row, byte] ^= 0x01
        label = {"out_w": "weights", "out_s": "scales", "out_idx": "indices"}[name]
        with pytest.raises(AssertionError, match=rf"rank 2: {label} of recv row {row} \(src rank {src}"):
            check(**{name: a})


def test_check_dispatch_rejects_duplicate_src_pos(dispatched):
    o, check, shape = dispatched
    pos = o["src_pos"].copy()
    pos[2] = pos[0]
    src, tok = _src_of(o, 0, shape)
    with pytest.raises(AssertionError, match=rf"duplicate src_pos {pos[0]} = \(src {src}, tok {tok}\) at recv rows 0 "
                                             r"and 2"):
        check(src_pos=pos)


def test_check_dispatch_rejects_missing_row(dispatched):
    o, check, shape = dispatched
    n = int(o["total_recv"][0])
    gone = _src_of(o, 1, shape)
    keep = [i for i in range(n) if i != 1]
    a = {k: o[k][keep] for k in ("out_x", "out_w", "out_s", "out_idx", "src_pos")}
    with pytest.raises(AssertionError, match=rf"total_recv = {n - 1}, expected {n} rows; missing \(src, tok\) "
                                             rf"\[\({gone[0]}, {gone[1]}\)\]"):
        check(**a, total_recv=np.array([n - 1], np.int32))


def test_check_dispatch_rejects_wrong_count(dispatched):
    o, check, shape = dispatched
    n = int(o["total_recv"][0])
    with pytest.raises(AssertionError, match=rf"total_recv = {n + 1}, expected {n} rows"):
        check(total_recv=n + 1)
    with pytest.raises(AssertionError, match=rf"total_recv = {n - 1}, expected {n} rows"):
        check(total_recv=n - 1)
    with pytest.raises(AssertionError, match="outside"):
        check(total_recv=shape.R + 1)


def test_check_dispatch_rejects_foreign_and_invalid_rows(dispatched):
    o, check, shape = dispatched
    pos = o["src_pos"].copy()
    routed = {divmod(int(p), shape.S) for p in pos[: int(o["total_recv"][0])]}
    foreign = next((r, t) for r in range(4) for t in range(16) if (r, t) not in routed)
    pos[1] = foreign[0] * shape.S + foreign[1]
    with pytest.raises(AssertionError, match=rf"recv row 1: \(src {foreign[0]}, tok {foreign[1]}\) .*not routed"):
        check(src_pos=pos)
    pos[1] = shape.null_src
    with pytest.raises(AssertionError, match="recv row 1: src_pos .* does not decode"):
        check(src_pos=pos)
    # rows swapped between two slots while src_pos stays: the data no longer matches its source
    x = o["out_x"].copy()
    x[[0, 1]] = x[[1, 0]]
    with pytest.raises(AssertionError, match="x of recv row 0"):
        check(out_x=x)


def test_check_dispatch_representation_mismatch(dispatched):
    o, check, shape = dispatched
    with pytest.raises(AssertionError, match="element size differs"):
        check(out_x=ref.from_bits(o["out_x"], "bf16"))


# ---- combine -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("float32", "bf16"))
@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c[0] != 2 or c[1] != 32], ids=_id)
def test_combine_identity_expert(cfg, dtype):
    shape = _shape(cfg, M=8)
    H = 16
    mode = "sentinel" if cfg[2] > 1 else "random"
    counts, idxs, vals, bits, ws, ss = make_inputs(shape, H, dtype, mode, sum(cfg), scales=False)
    counts[0] = 0  # n = 0 on one rank
    idxs[0], vals[0], bits[0], ws[0] = idxs[0][:0], vals[0][:0], bits[0][:0], ws[0][:0]
    outs, fwd = simulate_dispatch(vals, ws, None, idxs, shape, 5)
    ys = [o["out_x"] for o in outs]  # identity expert: combine input = dispatch output
    got = [ref.quantize(c, dtype) for c in simulate_combine(ys, fwd, shape, H)]
    got_w = simulate_combine([o["out_w"] for o in outs], fwd, shape, shape.K)
    model = ref.reference_combine(vals, idxs, shape)
    for r in range(shape.W):
        u = ref.unique_dest_count(idxs[r], shape)
        np.testing.assert_allclose(model[r], vals[r] * u[:, None], rtol=1e-6)
        ref.check_combine(got[r], vals[r], idxs[r], shape, dtype, rank=r)
        ref.check_combine(model[r], vals[r], idxs[r], shape, dtype, rank=r)
        ref.check_combine_weights(got_w[r], ws[r], idxs[r], shape, rank=r)
    assert [a.tolist() for a in ref.reference_combine_weights(ws, idxs, shape)] == \
        [(w.astype(np.float64) * ref.unique_dest_count(i, shape)[:, None]).astype(np.float32).tolist()
         for w, i in zip(ws, idxs)]  # fmt: skip


def test_reference_combine_with_expert():
    shape = EpShape(4, 4, 4, 8)
    counts, idxs, vals, *_ = make_inputs(shape, 8, "float32", "random", 3)
    twice = ref.reference_combine(vals, idxs, shape, expert=lambda rows: 2 * rows)
    for r in range(4):
        u = ref.unique_dest_count(idxs[r], shape)
        np.testing.assert_allclose(twice[r], 2 * u[:, None] * vals[r], rtol=1e-6)
    with pytest.raises(ValueError, match="expert returned shape"):
        ref.reference_combine(vals, idxs, shape, expert=lambda rows: rows[:, :2])


@pytest.fixture
def combined():
    shape = EpShape(4, 4, 4, 8)
    counts, idxs, vals, *_ = make_inputs(shape, 32, "bf16", "random", 21, counts=[8] * 4)
    out = ref.quantize(ref.reference_combine(vals, idxs, shape)[1], "bf16")
    return shape, idxs[1], vals[1], out


def test_check_combine_rejects_perturbed(combined):
    shape, idx, x, out = combined
    ref.check_combine(out, x, idx, shape, "bf16", rank=1)
    bad = out.copy()
    bad[5, 7] += 0.5 + abs(bad[5, 7]) * 0.05
    with pytest.raises(AssertionError, match=r"rank 1: combine output of token 5, element 7: got .* expected"):
        ref.check_combine(bad, x, idx, shape, "bf16", rank=1)
    # a unit-weight slip (U-1 instead of U) is caught too
    u = ref.unique_dest_count(idx, shape)
    with pytest.raises(AssertionError, match="token"):
        ref.check_combine(x * (u[:, None] - 1), x, idx, shape, "bf16")
    # rows beyond n are ignored
    ref.check_combine(np.concatenate([out, np.full((3, 32), np.nan, np.float32)]), x, idx, shape, "bf16")


def test_check_combine_rejects_nan(combined):
    shape, idx, x, out = combined
    bad = out.copy()
    bad[2, 3] = np.nan
    with pytest.raises(AssertionError, match=r"token 2, element 3: got nan"):
        ref.check_combine(bad, x, idx, shape, "bf16", rank=1)
    with pytest.raises(AssertionError):
        ref.check_combine(bad, x, idx, shape, "bf16", atol=1e9, rtol=1e9)


def test_combine_tolerances():
    assert ref.combine_tolerance("bf16") == (1e-2, 1e-2)
    assert ref.combine_tolerance("torch.bfloat16", "fp8_direct_cast") == (1e-1, 1e-1)
    assert ref.combine_tolerance("bf16", "fp8_blockwise") == (7e-2, 7e-2)
    assert ref.combine_tolerance("float32") == (1e-5, 1e-5)
    shape = EpShape(2, 1, 1, 4)
    idx = np.array([[0], [1]], np.int32)
    x = np.array([[1.0], [2.0]], np.float32)
    ref.check_combine(x * (1 + 5e-6), x, idx, shape, "float32")
    with pytest.raises(AssertionError):
        ref.check_combine(x * (1 + 5e-5), x, idx, shape, "float32")
    ref.check_combine(x * (1 + 5e-3), x, idx, shape, "bf16")
    ref.check_combine(np.zeros((4, 1), np.float32)[:0], x[:0], idx[:0], shape, "bf16")  # n = 0
    with pytest.raises(AssertionError, match="fewer than n"):
        ref.check_combine(x[:1], x, idx, shape, "bf16")
    with pytest.raises(ValueError):
        ref.combine_tolerance("bf16", "fp4_blockwise")


# ---- standard-MoE layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [(2, 4, 4), (4, 1, 4), (8, 4, 8), (8, 32, 8), (4, 4, 1)], ids=_id)
@pytest.mark.parametrize("mode", ("random", "random_dup", "sentinel"))
def test_standard_moe_convert(cfg, mode):
    shape = _shape(cfg, M=8)
    H = 8
    counts, idxs, vals, bits, ws, ss = make_inputs(shape, H, "float32", mode, sum(cfg), scales=False)
    outs, fwd = simulate_dispatch(vals, ws, None, idxs, shape, 7)
    combine_in = []
    for p, o in enumerate(outs):
        n = int(o["total_recv"][0])
        px, cnt, info = ref.convert_dispatch_output_ref(o["out_x"], o["out_idx"], o["total_recv"], p, shape)
        assert px.shape == (shape.Er, shape.W * shape.M, H) and cnt.dtype == np.int32 and info.dtype == np.int32
        local = [(i, k, int(o["out_idx"][i, k]) - p * shape.Er) for i in range(n) for k in range(shape.K)
                 if o["out_idx"][i, k] >= 0 and o["out_idx"][i, k] // shape.Er == p]  # fmt: skip
        assert cnt.sum() == len(local)
        for e in range(shape.Er):
            listed = [i for i, _, le in local if le == e]
            assert cnt[e] == len(listed) and info[e, : cnt[e]].tolist() == listed
            assert (info[e, cnt[e]:] == -1).all()
            assert np.array_equal(px[e, : cnt[e]], o["out_x"][listed]) and not px[e, cnt[e]:].any()
        # identity experts
        ci = ref.convert_combine_input_ref(px, info, cnt, o["out_idx"], o["out_w"], o["total_recv"], p, shape)
        assert ci.shape == (shape.R, H) and ci.dtype == np.float32 and not ci[n:].any()
        wsum = np.array([sum(float(o["out_w"][i, k]) for i2, k, _ in local if i2 == i) for i in range(n)])
        np.testing.assert_allclose(ci[:n], wsum[:, None] * o["out_x"][:n], rtol=1e-6, atol=1e-7)
        combine_in.append(ci)
    # the full standard-MoE pipeline: unweighted combine of the weighted rows gives (Σ_{valid k} w) · x
    out = simulate_combine(combine_in, fwd, shape, H)
    for r in range(shape.W):
        valid = (idxs[r] >= 0) & (idxs[r] < shape.num_experts)
        want = (ws[r] * valid).sum(axis=1, dtype=np.float64)[:, None] * vals[r]
        np.testing.assert_allclose(out[r], want, rtol=1e-5, atol=1e-6)


def test_standard_moe_convert_examples():
    shape = EpShape(2, 2, 3, 2)  # R = 4, experts of rank 1: 2, 3
    out_x = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    out_idx = np.array([[2, 0, 3], [3, 3, 1], [1, 2, -1], [9, 9, 9]], np.int32)
    px, cnt, info = ref.convert_dispatch_output_ref(out_x, out_idx, 3, 1, shape)
    assert cnt.tolist() == [2, 3]
    assert info.tolist() == [[0, 2, -1, -1], [0, 1, 1, -1]]
    w = np.array([[0.5, 9, 0.25], [1, 2, 9], [9, 4, 9], [9, 9, 9]], np.float32)
    ci = ref.convert_combine_input_ref(px, info, cnt, out_idx, w, 3, 1, shape)
    assert ci.tolist() == [[0.75 * 0, 0.75 * 1], [3 * 2, 3 * 3], [4 * 4, 4 * 5], [0, 0]]
    # an expert stage that scales expert 3's rows by 10 (local expert 1)
    px2 = px.copy()
    px2[1] *= 10
    ci2 = ref.convert_combine_input_ref(px2, info, cnt, out_idx, w, 3, 1, shape)
    assert ci2[0].tolist() == [0.5 * 0 + 0.25 * 0, 0.5 * 1 + 0.25 * 10]
    with pytest.raises(ValueError, match="no entry"):
        ref.convert_combine_input_ref(px, np.full_like(info, -1), cnt, out_idx, w, 3, 1, shape)


# ---- dtypes and bit patterns ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ("bf16", *FP8))
def test_encoders_round_trip_every_value(dtype):
    width = 16 if dtype == "bf16" else 8
    codes = np.arange(1 << width).astype(np.uint16 if width == 16 else np.uint8)
    vals = ref.from_bits(codes, dtype)
    assert vals.dtype == np.float32
    finite = np.isfinite(vals)
    assert np.array_equal(ref.to_bits(vals[finite], dtype), codes[finite])
    assert ref.to_bits(vals[finite], dtype).dtype == codes.dtype
    nfinite = {"bf16": 65536 - 2 * 128, "fp8_e4m3fn": 254, "fp8_e4m3fnuz": 255}[dtype]
    assert finite.sum() == nfinite == ref.representable_values(dtype).size


def test_known_encodings():
    enc = ref.to_bits
    assert enc([448.0, -448.0, 1.0, 2.0**-9, -0.0, 0.0, 0.5, -1.5], "fp8_e4m3fn").tolist() == \
        [0x7E, 0xFE, 0x38, 0x01, 0x80, 0x00, 0x30, 0xBC]  # fmt: skip
    assert enc([240.0, -240.0, 1.0, 2.0**-10, -0.0, 0.0, 0.5], "fp8_e4m3fnuz").tolist() == \
        [0x7F, 0xFF, 0x40, 0x01, 0x00, 0x00, 0x38]  # fmt: skip
    f32_max = np.finfo(np.float32).max
    assert enc([1.0, -2.0, 0.0, -0.0, np.inf, f32_max], "bf16").tolist() == [0x3F80, 0xC000, 0, 0x8000, 0x7F80, 0x7F80]
    assert enc([1.0], "float32").tolist() == [0x3F800000] and enc([1.0], "float32").dtype == np.uint32
    # NaN
    assert enc([np.nan], "fp8_e4m3fn")[0] & 0x7F == 0x7F and enc([np.nan], "fp8_e4m3fnuz").tolist() == [0x80]
    assert np.isnan(ref.from_bits(np.array([0x7F, 0xFF], np.uint8), "fp8_e4m3fn")).all()
    assert np.isnan(ref.from_bits(np.array([0x80], np.uint8), "fp8_e4m3fnuz")).all()
    assert enc([np.nan], "bf16")[0] & 0x7FFF == 0x7FC0
    # round to nearest even, overflow and saturation
    assert enc([1 + 2.0**-8, 1 + 3 * 2.0**-8], "bf16").tolist() == [0x3F80, 0x3F82]
    assert enc([464.0, 463.0, 465.0, 1e4, -np.inf], "fp8_e4m3fn").tolist() == [0x7E, 0x7E, 0x7F, 0x7F, 0xFF]
    assert enc([465.0, 1e4, -np.inf], "fp8_e4m3fn", saturate=True).tolist() == [0x7E, 0x7E, 0xFE]
    assert enc([247.0, 248.0, np.inf], "fp8_e4m3fnuz").tolist() == [0x7F, 0x80, 0x80]
    assert enc([248.0, -1e9], "fp8_e4m3fnuz", saturate=True).tolist() == [0x7F, 0xFF]
    assert enc([1.0625, 1.1875, 2.0**-10], "fp8_e4m3fn").tolist() == [0x38, 0x3A, 0x00]  # ties to even
    assert enc([-2.0**-12], "fp8_e4m3fnuz").tolist() == [0x00]  # underflow to +0: no negative zero
    assert ref.from_bits(np.array([0x3F80], np.uint16), "bfloat16").tolist() == [1.0]
    assert ref.from_bits(np.array([0x7E, 0x01], np.uint8), "float8_e4m3fn").tolist() == [448.0, 2.0**-9]
    assert ref.from_bits(np.array([0x7F, 0x08], np.uint8), "fp8_fnuz").tolist() == [240.0, 2.0**-7]
    with pytest.raises(ValueError):
        ref.to_bits([1.0], "int8")


@pytest.mark.parametrize("dtype", ("bf16", *FP8))
def test_encoders_round_to_nearest(dtype):
    rng = np.random.default_rng(4)
    top = {"bf16": 1e30, "fp8_e4m3fn": 448.0, "fp8_e4m3fnuz": 240.0}[dtype]
    v = (rng.standard_normal(20000) * np.exp(rng.uniform(-12, np.log(top), 20000))).astype(np.float32)
    v = v[np.abs(v) <= top]
    q = ref.from_bits(ref.to_bits(v, dtype), dtype).astype(np.float64)
    grid = np.unique(ref.representable_values(dtype).astype(np.float64))
    j = np.clip(np.searchsorted(grid, v), 1, grid.size - 1)
    best = np.minimum(np.abs(grid[j] - v), np.abs(grid[j - 1] - v))
    assert (np.abs(q - v) == best).all(), "every value goes to a nearest representable value"


@pytest.mark.parametrize("dtype", ("float32", "bf16", *FP8))
@pytest.mark.parametrize("n", (0, 1, 7))
def test_make_tokens_representable(dtype, n):
    x = ref.make_tokens(n, 33, dtype, seed=n)
    assert x.shape == (n, 33) and x.dtype == np.float32 and np.isfinite(x).all()
    assert np.array_equal(ref.quantize(x, dtype), x)
    assert np.array_equal(ref.from_bits(ref.to_bits(x, dtype), dtype), x)
    assert np.array_equal(x, ref.make_tokens(n, 33, dtype, seed=n))
    if dtype in FP8 and n:
        assert np.isin(x, ref.representable_values(dtype)).all()
