"""Shared pytest set-up for test/python: the skipping of ``gpu``-marked tests, and the cache directory.

Every test session gets its own, empty ``MORI_COMPILER_CACHE_DIR`` so that kernel bundles and device
libraries built by the tests never land in (or come from) the user's ``~/.cache/mori_compiler``. The
variable is set in ``os.environ`` itself, so CLIs run in subprocesses inherit it too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def gpu_unavailable_reason() -> str | None:
    """Why GPU tests cannot run here (None: they can): every missing piece, named by the runtime."""
    from mori_compiler.runtime.extras import cuda_unavailable_reason

    return cuda_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    """Every ``gpu``-marked test skips, with the true reason, where GPU tests cannot run."""
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test skipped: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """Point MORI_COMPILER_CACHE_DIR at a fresh directory for the whole session; restore it afterwards."""
    saved = os.environ.get("MORI_COMPILER_CACHE_DIR")
    cache = tmp_path_factory.mktemp("mori_compiler_cache")
    os.environ["MORI_COMPILER_CACHE_DIR"] = str(cache)
    try:
        yield cache
    finally:
        if saved is None:
            os.environ.pop("MORI_COMPILER_CACHE_DIR", None)
        else:
            os.environ["MORI_COMPILER_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def session_cache_dir(_session_cache_dir) -> Path:
    """The session's MORI_COMPILER_CACHE_DIR."""
    return _session_cache_dir


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def example_source() -> str:
    """MLIR text of the built-in ``ring_put_signal`` example."""
    from mori_compiler import examples

    return examples.example_source("ring_put_signal")
