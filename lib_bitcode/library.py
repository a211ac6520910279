"""Build the project's device library (its own implementation of MORI's device ABI) per target.

Sources are LLVM IR text written by the project (``sources/``): a target prelude with the thread,
barrier and memory-ordering primitives, the target-neutral building blocks (``shmem_core.ll``), and the
98 exported ABI functions generated from the ABI table (``wrappers.py``). ``library_path(target)``
assembles them with llvmlite into ``libmori_shmem_device.bc`` at first use and caches the file under
``<cache>/lib/<target>-<hash>/``, where the hash covers the source text, the target and the llvmlite
version. The cached file is verified on every use against the content record written beside it, and
concurrent builders build it once (``cached.py``: damaged files are reported, discarded and rebuilt).

``lowering_support_path(target)`` is the small AMDGPU bitcode (``sources/lowering_support_amdgcn.ll``) with
the ockl work-item queries MLIR's ROCDL lowering calls; the project's library has them in its prelude, so it
is linked only beside other device bitcode (``options.device_bitcode``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mori_compiler.env import cache_dir
from mori_compiler.errors import MoriCompilerError
from mori_compiler.targets import GPUTarget, get_target

from .cached import cached_bitcode

LIBRARY_NAME = "libmori_shmem_device.bc"
COMMON_SOURCES = ("shmem_core.ll",)
SUPPORT_NAME = "libmori_compiler_lowering_support.bc"
SUPPORT_SOURCE = "lowering_support_amdgcn.ll"


_PACKAGE_DIR = Path(__file__).resolve().parent  # a plain path: importlib.resources costs ~7 ms of imports


def _source(name: str) -> str:
    return (_PACKAGE_DIR / "sources" / name).read_text(encoding="utf-8")


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
    from mori_compiler.env import installed_version  # read from its dist-info: a warm start imports no llvmlite

    return installed_version("llvmlite", "llvmlite")


CACHE_FORMAT = "verified-1"  # part of the hash: entries of an older layout (no content record) are not looked at


def _generator_files() -> list[Path]:
    """Every file the library's IR is a function of (the sources and the Python that generates the wrappers)."""
    return sorted(_PACKAGE_DIR.glob("*.py")) + sorted((_PACKAGE_DIR / "sources").glob("*.ll"))


def library_hash(target: GPUTarget) -> str:
    """Hash of what the library for ``target`` is built from: hashing the generator files rather than the
    generated IR keeps a warm start from generating 98 wrappers just to find the cached file."""
    h = hashlib.sha256()
    for item in (CACHE_FORMAT, target.name, target.triple, target.features, _llvmlite_version()):
        h.update(item.encode())
        h.update(b"\0")
    for f in _generator_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _assemble(text: str, what: str) -> bytes:
    import llvmlite.binding as llvm

    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:  # a bug in our sources, not a user error
        raise RuntimeError(f"{what} does not assemble: {exc}") from None
    return module.as_bitcode()


def build_library(target: GPUTarget) -> bytes:
    """Assemble and verify the library for ``target``; returns the bitcode bytes."""
    return _assemble(library_ir(target), f"device library for {target.name}")


def library_path(target: GPUTarget | str) -> Path:
    """Path of the cached, verified library bitcode for ``target``, built first if needed."""
    if isinstance(target, str):
        target = get_target(target)
    path = cache_dir() / "lib" / f"{target.name}-{library_hash(target)}" / LIBRARY_NAME
    return cached_bitcode(path, lambda: build_library(target), f"device library for {target.name}")


def lowering_support_ir(target: GPUTarget) -> str:
    if not target.is_amdgpu:
        raise MoriCompilerError(f"target {target.name} needs no lowering-support bitcode (AMDGPU only)")
    return f'target triple = "{target.triple}"\n' + _source(SUPPORT_SOURCE)


SUPPORT_CODE_OBJECT_VERSIONS = (5, 6)  # the hidden-argument layout its definitions read (see the source)


def lowering_support_path(target: GPUTarget | str, code_object_version: int = 6) -> Path:
    """Path of the cached, verified lowering-support bitcode for the AMDGPU ``target``."""
    if isinstance(target, str):
        target = get_target(target)
    if code_object_version not in SUPPORT_CODE_OBJECT_VERSIONS:
        raise MoriCompilerError(
            f"the lowering-support bitcode reads the hidden kernel arguments of code object v5/v6; code object "
            f"version {code_object_version} lays them out differently")  # fmt: skip
    text = lowering_support_ir(target)
    digest = hashlib.sha256("\0".join((target.triple, _llvmlite_version(), text)).encode()).hexdigest()[:16]
    path = cache_dir() / "lib" / f"support-{target.triple}-{digest}" / SUPPORT_NAME
    return cached_bitcode(path, lambda: _assemble(text, "lowering-support bitcode"), "lowering-support bitcode")
