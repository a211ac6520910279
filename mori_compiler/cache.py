"""Compile once per configuration: bundles keyed by what went into them.

The key is a SHA-256 over the MLIR source, the compile options, the compiler and toolchain versions, a
digest of the compiler's own code-generating sources (passes, dialects, pipeline: a changed lowering must
not reuse binaries of the old one, even at the same version number) and the *content* of every linked
device bitcode (never its path), so a changed input can never reuse an old binary. Bundles live in ``MORI_COMPILER_CACHE_DIR`` (default ``~/.cache/mori_compiler``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from . import __version__
from .env import cache_dir
from .options import CompileOptions
from .errors import MoriCompilerError
from .runtime.bundle import (Bundle, KernelInfo, KernelParam, find_bundle, find_bundle_by_request,
                             publish_bundle, record_request, request_key)  # fmt: skip

COMPILER_VERSION = f"mori_compiler {__version__}"


# What generates code: every file of these packages, and these modules (all under mori_compiler).
_CODEGEN_PACKAGES = ("passes", "dialects")
_CODEGEN_MODULES = ("pipeline.py", "pass_pipeline.py", "options.py", "targets.py", "_mlir.py")


def codegen_source_files() -> list[Path]:
    """The compiler's code-generating source files, in a fixed order."""
    import importlib

    root = Path(__file__).resolve().parent
    files = [root / m for m in _CODEGEN_MODULES]
    for package in _CODEGEN_PACKAGES:  # located by import: package-dir maps them to the top-level folders
        base = Path(importlib.import_module(f"{__package__}.{package}").__file__).resolve().parent
        files += sorted(f for f in base.rglob("*") if f.suffix in (".py", ".mlir") and "__pycache__" not in f.parts)
    return files


def compiler_source_digest() -> str:
    """SHA-256 (16 hex digits) over :func:`codegen_source_files`."""
    h = hashlib.sha256()
    for f in codegen_source_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def toolchain_fingerprint() -> str:
    """Versions (and the compiler's source digest) that change generated code; read once per process."""
    import llvmlite

    from importlib.metadata import PackageNotFoundError, version

    try:
        mlir_version = version("xtc-mlir-python-bindings")
    except PackageNotFoundError:
        mlir_version = "unknown"
    return (f"mori_compiler {__version__} ({compiler_source_digest()}); mlir {mlir_version}; "
            f"llvmlite {llvmlite.__version__}")  # fmt: skip


def bundle_key(source: str, options: CompileOptions, bitcode_paths, extra: dict | None = None) -> str:
    h = hashlib.sha256()
    for part in (toolchain_fingerprint(), json.dumps(options.to_dict() | {"bitcode": None}, sort_keys=True),
                 json.dumps(extra or {}, sort_keys=True), source):  # fmt: skip
        h.update(part.encode())
        h.update(b"\0")
    for path in bitcode_paths:
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    return h.hexdigest()


def signatures_of_module(module, *, strict: bool = True, problems: dict | None = None) -> dict[str, KernelInfo]:
    """KernelInfo of every gpu.func kernel of an MLIR module (ptr/integer/float parameters only; with
    ``strict=False`` kernels with other parameter types are left out instead of rejected, and the reason is
    stored in ``problems[name]`` when a dict is given)."""
    from .passes.gpu_kernels import gpu_kernels, kernel_param_types

    kernels = {}
    for fn in gpu_kernels(module.operation):
        name = fn.attributes["sym_name"].value
        types, problem = kernel_param_types(fn, role="bundles support")
        if problem:
            if strict:
                raise MoriCompilerError(problem)
            if problems is not None:
                problems[name] = problem
            continue
        block = None
        if "known_block_size" in fn.attributes:
            block = tuple(int(x) for x in fn.attributes["known_block_size"])
        kernels[name] = KernelInfo(name, tuple(KernelParam(f"arg{i}", ty) for i, ty in enumerate(types)), block)
    return kernels


def bundle_request(source: str, options: CompileOptions, config: dict | None = None) -> str:
    """The toolchain-independent request hash under which a bundle is indexed (runtime lookups)."""
    return request_key(source, options.to_dict() | {"config": config or {}}, COMPILER_VERSION)


def compiler_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("mlir", "llvmlite"))


def get_bundle(source: str, options: CompileOptions, *, config: dict | None = None, cache_root=None,
               what: str = "kernel") -> Bundle:  # fmt: skip
    """The bundle for (source, options): compiled if the compiler is installed, else precompiled.

    Without the compiler (GPU machines) only bundles recorded by an earlier compile or
    ``mori-compile --precompile`` are found; anything else is a clear error saying how to build it.
    """
    root = Path(cache_root) if cache_root else cache_dir()
    if compiler_available():
        return compile_bundle(source, options, config=config, cache_root=root)
    found = find_bundle_by_request(root, bundle_request(source, options, config))
    if found is None:
        raise MoriCompilerError(
            f"no precompiled bundle for {what} (target {options.target}) in {root}, and the compiler is not "
            "installed here; build it on a machine with mori_compiler's compiler (`mori-compile --precompile "
            "CONFIGS.json`, or run the same program there) and copy MORI_COMPILER_CACHE_DIR"
        )
    return found


def compile_bundle(source: str, options: CompileOptions, *, config: dict | None = None, cache_root=None) -> Bundle:
    """The bundle for (source, options): from the cache, or compiled and published now."""
    from .lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
    from .options import device_bitcode
    from .pipeline import compile_source

    root = Path(cache_root) if cache_root else cache_dir()
    bitcode = device_bitcode(options)
    key = bundle_key(source, options, bitcode, config)
    request = bundle_request(source, options, config)
    cached = find_bundle(root, key)
    if cached is not None:
        if find_bundle_by_request(root, request) is None:
            record_request(root, request, key)
        return cached
    result = compile_source(source, options)
    kernels = result.signatures
    missing = sorted(set(result.kernels) - set(kernels))
    if missing:  # a kernel parameter the bundle format cannot carry (or a kernel that is not a gpu.func)
        raise MoriCompilerError(result.signature_problems.get(missing[0]) or (
            f"kernel '{missing[0]}' cannot go into a bundle: bundles take gpu.func kernels"))
    state = [{"symbol": STATE_SYMBOL, "size": STATE_SIZE}] if not options.bitcode and options.device_library else []
    return publish_bundle(
        root, key, target=options.target, backend=options.gpu_target.backend, binary=result.binary,
        kernels=list(kernels.values()), state_globals=state, compiler=toolchain_fingerprint(),
        config={"options": options.to_dict(), **(config or {})}, virtual_pes=options.virtual_pes, request=request,
    )  # fmt: skip
