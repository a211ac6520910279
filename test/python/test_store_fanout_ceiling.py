"""bench/store_fanout_ceiling.py's host part on the CPU: the destination rows it precomputes are the dispatch's
(one row per distinct destination PE of each token, in that PE's block of the receive buffer, no row written
twice), and its flags are checked before any GPU work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))
import store_fanout_ceiling as ceiling  # noqa: E402

from mori_compiler.ops import reference as ref  # noqa: E402


@pytest.mark.parametrize("tokens", [1, 7, 128])
def test_destinations_are_the_dispatch_destinations(tokens):
    rows, count, total_rows = ceiling.destinations(tokens)
    world, per_rank = ceiling.WORLD, ceiling.EXPERTS // ceiling.WORLD
    cap = world * tokens
    assert rows.shape == (world * tokens, ceiling.TOPK) and total_rows == world * cap
    shape = ref.EpShape(world, per_rank, ceiling.TOPK, tokens)
    idx = ref.make_routing("random", [tokens] * world, shape, 11)
    written = rows[rows >= 0]
    assert len(np.unique(written)) == len(written) == int(count.sum())  # no destination row twice
    for src in range(world):
        for t in range(tokens):
            r = src * tokens + t
            pes = {int(e) // per_rank for e in idx[src][t] if e >= 0}
            got = rows[r, : count[r]]
            assert count[r] == len(pes) and (rows[r, count[r]:] == -1).all()
            assert {int(v) // cap for v in got} == pes  # each in its destination PE's block
    for pe in range(world):  # a PE's slots are 0 .. received - 1
        slots = np.sort(written[written // cap == pe] % cap)
        assert (slots == np.arange(len(slots))).all()


@pytest.mark.parametrize("args, message", [(["--tokens", "x"], "comma-separated integers"),
                                           (["--tokens", "0"], "must be >= 1"),
                                           (["--reps", "0"], "must be >= 1")])  # fmt: skip
def test_bad_flags_are_refused_by_name(args, message):
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "store_fanout_ceiling.py"), *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and message in proc.stderr
