"""Compile once per configuration: bundles keyed by what went into them.

The key is a SHA-256 over the MLIR source, the compile options, the compiler and toolchain versions and
the *content* of every linked device bitcode (never its path), so a changed input can never reuse an old
binary. Bundles live in ``MORI_COMPILER_CACHE_DIR`` (default ``~/.cache/mori_compiler``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from . import __version__
from .env import cache_dir
from .options import CompileOptions
from .runtime.bundle import Bundle, KernelInfo, KernelParam, find_bundle, publish_bundle

_MLIR_PARAM_TYPE = {"!llvm.ptr": "ptr", "i64": "i64", "i32": "i32", "i16": "i16", "i8": "i8", "f32": "f32",
                    "f64": "f64"}  # fmt: skip


def toolchain_fingerprint() -> str:
    import llvmlite

    from importlib.metadata import PackageNotFoundError, version

    try:
        mlir_version = version("xtc-mlir-python-bindings")
    except PackageNotFoundError:
        mlir_version = "unknown"
    return f"mori_compiler {__version__}; mlir {mlir_version}; llvmlite {llvmlite.__version__}"


def bundle_key(source: str, options: CompileOptions, bitcode_paths, extra: dict | None = None) -> str:
    h = hashlib.sha256()
    for part in (toolchain_fingerprint(), json.dumps(options.to_dict() | {"bitcode": None}, sort_keys=True),
                 json.dumps(extra or {}, sort_keys=True), source):  # fmt: skip
        h.update(part.encode())
        h.update(b"\0")
    for path in bitcode_paths:
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    return h.hexdigest()


def kernel_signatures(source: str) -> dict[str, KernelInfo]:
    """Parameter types and block size of every gpu.func kernel of the (verified) source."""
    from ._mlir import ir
    from .dialects import registry

    ctx = ir.Context()
    module = registry.parse_source(source, ctx)
    kernels = {}
    for gm in module.body.operations:
        if gm.operation.name != "gpu.module":
            continue
        for fn in gm.regions[0].blocks[0].operations:
            if fn.operation.name != "gpu.func" or "gpu.kernel" not in fn.attributes:
                continue
            name = fn.attributes["sym_name"].value
            params = []
            for i, arg in enumerate(fn.regions[0].blocks[0].arguments):
                ty = _MLIR_PARAM_TYPE.get(str(arg.type))
                if ty is None:
                    from .errors import MoriCompilerError

                    raise MoriCompilerError(
                        f"kernel '{name}' parameter {i} has type {arg.type}; bundles support "
                        + ", ".join(_MLIR_PARAM_TYPE)
                    )
                params.append(KernelParam(f"arg{i}", ty))
            block = None
            if "known_block_size" in fn.attributes:
                block = tuple(int(x) for x in fn.attributes["known_block_size"])
            kernels[name] = KernelInfo(name, tuple(params), block)
    return kernels


def compile_bundle(source: str, options: CompileOptions, *, config: dict | None = None, cache_root=None) -> Bundle:
    """The bundle for (source, options): from the cache, or compiled and published now."""
    from .lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
    from .pipeline import compile_source, device_bitcode

    root = Path(cache_root) if cache_root else cache_dir()
    bitcode = device_bitcode(options)
    key = bundle_key(source, options, bitcode, config)
    cached = find_bundle(root, key)
    if cached is not None:
        return cached
    result = compile_source(source, options)
    kernels = kernel_signatures(source)
    state = [{"symbol": STATE_SYMBOL, "size": STATE_SIZE}] if not options.bitcode and options.device_library else []
    return publish_bundle(
        root, key, target=options.target, backend=options.gpu_target.backend, binary=result.binary,
        kernels=list(kernels.values()), state_globals=state, compiler=toolchain_fingerprint(),
        config={"options": options.to_dict(), **(config or {})},
    )  # fmt: skip
