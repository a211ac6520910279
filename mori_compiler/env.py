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
| MORI_COMPILER_BACKEND    | driver of a shmem init that names none: cuda or hip            | hip with a ROCm torch,     |
|                          | (bundles always use their own target's driver)                 | else cuda                  |
| MORI_COMPILER_WAIT_LIMIT | bounded-wait debug mode: polls before a wait reports (runtime) | 0 (wait forever)           |
| MORI_COMPILER_TRACEBACK  | CLIs print the Python traceback of an internal error           | unset                      |
| MORI_NODE_ID             | MORI-IO: the EngineDesc's node_id                              | boot id, else hostname     |
| MORI_IO_LOG_LEVEL,       | MORI-IO: initial level of the mori_compiler.io logger (MORI's  | error                      |
| MORI_GLOBAL_LOG_LEVEL    | level names)                                                   |                            |
| MORI_IO_*                | MORI-IO: RdmaBackendConfig overrides (QP_PER_TRANSFER,         | the config's values        |
|                          | POST_BATCH_SIZE, NUM_WORKER_THREADS, POLL_CQ_MODE,             |                            |
|                          | ENABLE_NOTIFICATION, ENABLE_CHUNKING, CHUNK_BYTES, MAX_CHUNKS, |                            |
|                          | NUM_NICS_PER_TRANSFER; runtime/io/configs.py)                  |                            |
| MORI_DISABLE_AUTO_XGMI   | MORI-IO: a value starting with 0 adds the GPU-IPC (XGMI)       | unset (no auto-XGMI, as    |
|                          | backend after an RDMA/TCP one (MORI's reading of the variable) | MORI)                      |
| MORI_IO_RDMA_OVER_TCP    | MORI-IO: 0 refuses BackendType.RDMA instead of serving it with | 1 (served by TCP, with a   |
|                          | the TCP transport (the project has no verbs transport)         | warning)                   |
| MORI_EP_LAUNCH_CONFIG_MODE | EP launch geometry: MANUAL, or AUTO (each call's geometry   | MANUAL                     |
|                          | from the tuning tables: ops/auto_launch.py, ops/tuning.py)     |                            |
| MORI_EP_TUNING_CONFIG    | AUTO mode: tuning file(s) instead of ops/tuning_configs/ (one  | unset                      |
|                          | path, or several joined by os.pathsep)                         |                            |
| MORI_ASYNCLL_EARLY_NOTIFY, | AsyncLL notification mode, 0 or 1 each (ops/asyncll.py;     | 0                          |
| MORI_ASYNCLL_FUSED_RECV, | SKIP_RESET is accepted and has no effect)                      |                            |
| MORI_ASYNCLL_SKIP_RESET  |                                                                |                            |
| MORI_ENABLE_SDMA         | AsyncLL: 1 asks for the SDMA transport, refused with the       | 0 (transport p2p)          |
|                          | reason (ops/asyncll.py, docs/asyncll-copy-engine.md)           |                            |
| MORI_FP8_COMBINE_SCALE_DIM | fp8/fp4 blockwise combine: scale blocks per token, 1-256,   | 56                         |
|                          | read when an op is built (compiled in; ops/config.py)          |                            |
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
    # O_NOFOLLOW: a lock "file" planted as a symlink must not create or open a file outside the cache.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"lock file {path} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def installed_version(package: str, distribution: str) -> str:
    """The version of ``distribution`` that provides the importable ``package``, read from the
    ``<distribution>-<version>.dist-info`` folder next to it: neither imported nor looked up with
    importlib.metadata (15-25 ms a call), which is asked only where no such folder is found (another
    install layout); "unknown" if the distribution is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    locations = (spec.submodule_search_locations or []) if spec else []
    prefix = distribution.replace("-", "_") + "-"
    for location in locations:
        site = os.path.dirname(os.path.abspath(location))
        try:
            names = os.listdir(site)
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(".dist-info"):
                return name[len(prefix):-len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"
