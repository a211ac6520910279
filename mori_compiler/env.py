"""Environment variables read by mori_compiler, in one place.

| variable                 | meaning                                                        | default                    |
|--------------------------|----------------------------------------------------------------|----------------------------|
| MORI_COMPILER_CACHE_DIR  | kernel bundles and built device libraries                      | ~/.cache/mori_compiler     |
| MORI_COMPILER_LLD        | the ld.lld to link AMDGPU code objects with                    | search (passes/codegen.py) |
| ROCM_PATH                | a ROCm install whose llvm/bin/ld.lld may be used               | unset                      |
| MORI_SHMEM_BC            | a MORI device bitcode linked instead of the project's library  | unset (project library)    |
|                          | (the CompileOptions default: mori-compile, ep_bundle, the API; |                            |
|                          | find_bitcode() returns it)                                     |                            |
| MORI_GPU_ARCHS           | default target of find_bitcode() (first entry)                 | gfx942                     |
| MORI_SHMEM_HEAP_SIZE     | symmetric heap bytes per PE (K/M/G suffixes; runtime)          | 1G                         |
| MORI_COMPILER_BACKEND    | runtime driver: cuda or hip                                    | from the bundle's target   |
| MORI_COMPILER_WAIT_LIMIT | bounded-wait debug mode: polls before a wait reports (runtime) | 0 (wait forever)           |
| MORI_COMPILER_TRACEBACK  | CLIs print the Python traceback of an internal error           | unset                      |
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("MORI_COMPILER_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mori_compiler"


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write ``path`` so that readers see the old file or the whole new one, never a partial one (a temporary
    file in the same folder, then a rename); the temporary file is removed if writing fails."""
    import tempfile  # not at the top: a warm start (bundle found in the cache) writes nothing

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def exclusive_lock(path: Path):
    """Hold an advisory exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Ranks of one job that compile the same bundle or library serialize on it: the first compiles, the
    others wait and then find its published result. ``flock`` (standard library, no dependency for GPU
    machines) is released by the kernel when the process dies, so a killed compile never leaves a stale lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
