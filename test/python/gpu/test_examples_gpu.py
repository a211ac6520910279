"""The examples' GPU runs: examples/moe_layer/moe_layer.py on virtual PEs (its dispatch -> experts ->
combine step against the dense layer, 3 steps of uneven token counts) and under torchrun (one PE per GPU:
needs 2 GPUs of one host). Bundles: ``precompile(cache_root)`` (test/python/gpu/kernels.py calls it)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[3]
MOE = REPO / "examples" / "moe_layer"
VIRTUAL_PES = (2, 3, 4, 8)
TORCHRUN_WORLD = 2


def _moe_module():
    sys.path.insert(0, str(MOE))
    try:
        return importlib.import_module("moe_layer")
    finally:
        sys.path.remove(str(MOE))


def precompile(cache_root, target: str = "sm_90") -> list:
    from mori_compiler.ops import ep_bundle

    m = _moe_module()
    return ([ep_bundle(m.ep_config(n), target, virtual_pes=True, cache_root=cache_root) for n in VIRTUAL_PES]
            + [ep_bundle(m.ep_config(TORCHRUN_WORLD, r), target, virtual_pes=False, cache_root=cache_root)
               for r in range(TORCHRUN_WORLD)])  # fmt: skip


@pytest.mark.parametrize("n_pes", VIRTUAL_PES)
def test_moe_layer_example_on_virtual_pes(n_pes, capsys):
    _moe_module().run_virtual(n_pes, steps=3)
    out = capsys.readouterr().out
    assert out.count("max relative error") == 3, out


def test_moe_layer_example_under_torchrun(bundle_root):
    import torch

    found = torch.cuda.device_count()
    if found < TORCHRUN_WORLD:
        pytest.skip(f"needs {TORCHRUN_WORLD} GPUs of one host (one PE per GPU), found {found}")
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(bundle_root))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(TORCHRUN_WORLD),
                          "--master-port", "29531", str(MOE / "moe_layer.py")], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.count("relative error") == 3 * TORCHRUN_WORLD, run.stdout[-2000:]
