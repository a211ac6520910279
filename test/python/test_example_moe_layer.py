"""examples/moe_layer/moe_layer.py on the CPU: its kernels build for sm_90 and gfx942 (virtual PEs and one PE
per process), and the layer's own arithmetic (routing, local experts, the dense check) is right: a host
emulation of dispatch and combine (each token once to each PE owning one of its experts, rows summed back)
must reproduce the dense layer. The GPU runs are test/python/gpu/test_examples_gpu.py."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "moe_layer" / "moe_layer.py"


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_moe_layer_kernels_compile(target, tmp_path):
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--compile-only", "--pes", "3", "--world-sizes", "2",
                           "--target", target], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split(": ")[1] for line in lines] == ["3 virtual PEs", "2 processes"], proc.stdout
    for line in lines:  # each printed bundle exists in the cache given
        assert Path(line.split(": ")[0]).is_dir() and str(tmp_path) in line, line


def test_moe_layer_refuses_bad_pe_counts():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--compile-only", "--pes", "0"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "PE counts >= 1" in proc.stderr, proc.stderr  # argparse's usage error


def _layer_module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return importlib.import_module("moe_layer")
    finally:
        sys.path.remove(str(SCRIPT.parent))


@pytest.mark.parametrize("world", [1, 3, 4])
def test_moe_layer_arithmetic_matches_dense_layer(world):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[cuda]')")
    m = _layer_module()
    layer = m.MoeLayer(world, "cpu")
    R = world * m.MAX_TOKENS
    for step in range(2):
        xs = [m._tokens(p, n, "cpu") for p, n in enumerate(m._token_counts(world, step))]
        routes = [layer.route(x) for x in xs]
        received = {q: [] for q in range(world)}  # dispatch: (source PE, token) once per destination PE
        for p, (ids, _) in enumerate(routes):
            for t in range(ids.shape[0]):
                for q in sorted(set((ids[t] // m.EXPERTS_PER_PE).tolist())):
                    received[q].append((p, t))
        outs = [torch.zeros(x.shape[0], m.HIDDEN) for x in xs]
        for q, got in received.items():
            rows = torch.full((R, m.HIDDEN), float("nan"), dtype=torch.bfloat16)  # poison: must be masked
            weights, ids = torch.zeros(R, m.TOP_K), torch.full((R, m.TOP_K), -1, dtype=torch.int32)
            for r, (p, t) in enumerate(got):
                rows[r], weights[r], ids[r] = xs[p][t], routes[p][1][t], routes[p][0][t]
            y = layer.local_experts(q, rows, weights, ids, torch.tensor([len(got)], dtype=torch.int32))
            assert not y.isnan().any(), "rows beyond total_recv leaked into the expert outputs"
            for r, (p, t) in enumerate(got):  # combine: fp32 sum of the rows from every destination
                outs[p][t] += y[r].float()
        for p, x in enumerate(xs):
            assert m.check(p, outs[p].bfloat16(), layer.dense(x)) < 2e-2
        p = max(range(world), key=lambda i: xs[i].shape[0])
        if xs[p].shape[0]:  # the check itself can fail
            with pytest.raises(AssertionError, match="differs from the dense layer"):
                m.check(p, outs[p].bfloat16() * 1.1, layer.dense(xs[p]))
