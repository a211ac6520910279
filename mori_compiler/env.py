"""Environment variables read by mori_compiler, in one place.

| variable                 | meaning                                                        | default                    |
|--------------------------|----------------------------------------------------------------|----------------------------|
| MORI_COMPILER_CACHE_DIR  | kernel bundles and built device libraries                      | ~/.cache/mori_compiler     |
| MORI_COMPILER_LLD        | the ld.lld to link AMDGPU code objects with                    | search (passes/codegen.py) |
| ROCM_PATH                | a ROCm install whose llvm/bin/ld.lld may be used               | unset                      |
| MORI_DUMP_IR             | write every stage's IR to this folder (compile pipeline)       | unset                      |
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("MORI_COMPILER_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mori_compiler"


def dump_ir_dir() -> Path | None:
    value = os.environ.get("MORI_DUMP_IR")
    return Path(value) if value else None
