"""GPU tests: they carry the ``gpu`` marker and skip, with the reason printed (pytest -ra), where no
NVIDIA GPU with its driver, PyTorch and cuda-bindings is present (CI, the development machines).

Kernels come from bundles: compiled on the spot when the compiler is installed, else precompiled into
``MORI_TEST_BUNDLES`` (default ``<repo>/.bundles``) by ``python test/python/gpu/kernels.py .bundles`` on a
machine that has the compiler, and carried to the GPU machine.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
BUNDLES = Path(os.environ.get("MORI_TEST_BUNDLES", REPO_ROOT / ".bundles"))


def gpu_unavailable_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return "cuda-bindings is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no NVIDIA GPU (torch.cuda.is_available() is False); GPU tests run on the H200 machines"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test skipped: {reason}"))


@pytest.fixture(scope="session")
def bundle_root() -> Path:
    return BUNDLES


@pytest.fixture(scope="module", autouse=True)
def _gpu_bundle_cache(_session_cache_dir):
    """GPU tests load (or, with the compiler, build) their kernels in BUNDLES, not the session's fresh
    cache: on the GPU machine that is where the precompiled bundles are."""
    saved = os.environ.get("MORI_COMPILER_CACHE_DIR")
    os.environ["MORI_COMPILER_CACHE_DIR"] = str(BUNDLES)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MORI_COMPILER_CACHE_DIR", None)
        else:
            os.environ["MORI_COMPILER_CACHE_DIR"] = saved
