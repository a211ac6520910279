"""Build the project's device library (its own implementation of MORI's device ABI) per target.

Sources are LLVM IR text written by the project (``sources/``): a target prelude with the thread,
barrier and memory-ordering primitives, the target-neutral building blocks (``shmem_core.ll``), and the
98 exported ABI functions generated from the ABI table (``wrappers.py``). ``library_path(target)``
assembles them with llvmlite into ``libmori_shmem_device.bc`` at first use and caches the file under
``<cache>/lib/<target>-<hash>/``, where the hash covers the source text, the target and the llvmlite
version. A build writes to a temporary file and renames it into place, so no reader ever sees a
half-written file and concurrent builders are harmless.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import Path

from mori_compiler.env import cache_dir, write_atomically
from mori_compiler.errors import MoriCompilerError
from mori_compiler.targets import GPUTarget, get_target

LIBRARY_NAME = "libmori_shmem_device.bc"
COMMON_SOURCES = ("shmem_core.ll",)


def _source(name: str) -> str:
    return files("mori_compiler.lib_bitcode").joinpath("sources", name).read_text()


def _prelude_name(target: GPUTarget) -> str:
    return "prelude_amdgcn.ll" if target.is_amdgpu else "prelude_nvptx.ll"


def library_ir(target: GPUTarget) -> str:
    """The library's LLVM IR text for ``target`` (triple set; data layout left to the linker)."""
    from .wrappers import generate_wrappers

    parts = [f'target triple = "{target.triple}"\n', _source(_prelude_name(target))]
    parts += [_source(name) for name in COMMON_SOURCES]
    parts.append(generate_wrappers())
    return "\n".join(parts)


def _llvmlite_version() -> str:
    import llvmlite

    return llvmlite.__version__


def library_hash(target: GPUTarget) -> str:
    h = hashlib.sha256()
    for item in (target.name, target.triple, target.features, _llvmlite_version(), library_ir(target)):
        h.update(item.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def build_library(target: GPUTarget) -> bytes:
    """Assemble and verify the library for ``target``; returns the bitcode bytes."""
    import llvmlite.binding as llvm

    try:
        module = llvm.parse_assembly(library_ir(target))
        module.verify()
    except RuntimeError as exc:  # a bug in our sources, not a user error
        raise RuntimeError(f"device library for {target.name} does not assemble: {exc}") from None
    return module.as_bitcode()


def library_path(target: GPUTarget | str) -> Path:
    """Path of the cached library bitcode for ``target``, built first if needed."""
    if isinstance(target, str):
        target = get_target(target)
    path = cache_dir() / "lib" / f"{target.name}-{library_hash(target)}" / LIBRARY_NAME
    if not path.is_file():
        try:
            write_atomically(path, build_library(target))
        except OSError as exc:
            raise MoriCompilerError(f"cannot write the device library cache at {path.parent}: {exc}") from None
    return path
