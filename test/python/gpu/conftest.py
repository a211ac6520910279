"""GPU tests: they carry the ``gpu`` marker and skip, with the reason printed (pytest -ra), where no
NVIDIA GPU with its driver, PyTorch and cuda-bindings is present (CI, the development machines); the
skipping is test/python/conftest.py's, for every gpu-marked test of the suite, and the reason is
``mori_compiler.runtime.extras.cuda_unavailable_reason()``'s: each missing piece (the driver, torch,
cuda-bindings, a visible GPU) with the install command of its extra (``pip install -e '.[cuda]'``).

Kernels come from bundles: compiled on the spot when the compiler is installed, else precompiled into
``MORI_TEST_BUNDLES`` (default ``<repo>/.bundles``) by ``python test/python/gpu/kernels.py .bundles`` on a
machine that has the compiler, and carried to the GPU machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
BUNDLES = Path(os.environ.get("MORI_TEST_BUNDLES", REPO_ROOT / ".bundles"))


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
