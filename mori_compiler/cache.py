"""Compile once per configuration: bundles keyed by what went into them.

The key is a SHA-256 over the MLIR source, the compile options, the compiler and toolchain versions, a
digest of the compiler's own code-generating sources (passes, dialects, pipeline: a changed lowering must
not reuse binaries of the old one, even at the same version number) and the *content* of every linked
device bitcode (never its path), so a changed input can never reuse an old binary. Bundles live in
``MORI_COMPILER_CACHE_DIR`` (default ``~/.cache/mori_compiler``).

The key is computed without MLIR (versions are read from the installed distributions' folder names), so a
warm start never imports the compiler. Every cached bundle is verified when it is looked up
(mori_compiler/runtime/bundle.py: metadata, target, kernel table, code-object hash, paths); a damaged one is
reported once as a ``DamagedBundleWarning``, discarded and rebuilt, and so is a damaged index entry.
Concurrent compiles of one bundle (ranks of a job) serialize on ``<cache>/locks/<key>.lock``: one compiles,
the others find its result when they get the lock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path

from . import __version__
from .env import cache_dir, exclusive_lock, installed_version
from .errors import MoriCompilerError
from .options import CompileOptions
from .runtime.bundle import (BUNDLE_FORMAT, Bundle, BundleError, DamagedBundleWarning, KernelInfo, KernelParam,
                             bundle_dir, discard, find_bundle, find_bundle_by_request, index_path, indexed_key,
                             publish_bundle, record_request, request_key)  # fmt: skip

# In the request key (runtime lookups) and, through toolchain_fingerprint, the bundle key: a bundle of
# another format is then never looked up (format 3 records parameter names; a format-2 bundle's positional
# arg<i> must not be read as names), rather than found, refused and rebuilt with a warning.
COMPILER_VERSION = f"mori_compiler {__version__} (bundle format {BUNDLE_FORMAT})"


# What generates code: every file of these packages, and these modules (all under mori_compiler).
_CODEGEN_PACKAGES = ("passes", "dialects")
# ep_schema.py: the kernel generators build the EP kernels' parameters from it.
_CODEGEN_MODULES = ("pipeline.py", "pass_pipeline.py", "options.py", "targets.py", "_mlir.py", "ep_schema.py")


def codegen_source_files() -> list[Path]:
    """The compiler's code-generating source files, in a fixed order."""
    import importlib.util

    root = Path(__file__).resolve().parent
    files = [root / m for m in _CODEGEN_MODULES]
    for package in _CODEGEN_PACKAGES:  # located, not imported: package-dir maps them to the top-level folders
        spec = importlib.util.find_spec(f"{__package__}.{package}")
        found = []
        for folder, subfolders, names in os.walk(Path(spec.submodule_search_locations[0]).resolve()):
            subfolders[:] = [d for d in subfolders if d != "__pycache__"]
            found += [Path(folder, n) for n in names if n.endswith((".py", ".mlir"))]
        files += sorted(found)
    return files


def compiler_source_digest() -> str:
    """SHA-256 (16 hex digits) over :func:`codegen_source_files`."""
    h = hashlib.sha256()
    for f in codegen_source_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]




@functools.lru_cache(maxsize=None)
def toolchain_fingerprint() -> str:
    """Versions (and the compiler's source digest) that change generated code; read once per process,
    without importing MLIR (the cache is consulted before the compiler is loaded)."""
    return (f"{COMPILER_VERSION} ({compiler_source_digest()}); "
            f"mlir {installed_version('mlir', 'xtc-mlir-python-bindings')}; "
            f"llvmlite {installed_version('llvmlite', 'llvmlite')}")  # fmt: skip


def bundle_key(source: str, options: CompileOptions, bitcode_paths, extra: dict | None = None) -> str:
    h = hashlib.sha256()
    for part in (toolchain_fingerprint(), json.dumps(options.to_dict() | {"bitcode": None}, sort_keys=True),
                 json.dumps(extra or {}, sort_keys=True), source):  # fmt: skip
        h.update(part.encode())
        h.update(b"\0")
    for path in bitcode_paths:
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    return h.hexdigest()


def kernel_info(signature) -> KernelInfo:
    """The runtime's KernelInfo of a compiled kernel's signature (passes.gpu_kernels.CompiledKernel)."""
    params = tuple(KernelParam(p.name, p.type, p.named) for p in signature.params)
    return KernelInfo(signature.name, params, signature.block, signature.trace_events, signature.max_blocks)


def bundle_request(source: str, options: CompileOptions, config: dict | None = None) -> str:
    """The toolchain-independent request hash under which a bundle is indexed (runtime lookups)."""
    return request_key(source, options.to_dict() | {"config": config or {}}, COMPILER_VERSION)


def compiler_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("mlir", "llvmlite"))


def get_bundle(source: str, options: CompileOptions, *, config: dict | None = None, cache_root=None,
               what: str = "kernel", kernels=(), module=None) -> Bundle:  # fmt: skip
    """The bundle for (source, options): compiled if the compiler is installed, else precompiled.

    ``kernels``: names the bundle must hold (a cached bundle without them is damaged). ``module``: a
    zero-argument callable returning the ``ir.Module`` that ``source`` is the text of (built in Python),
    compiled instead of parsing ``source``; called only on a miss with the compiler installed. The key
    and the index are computed from ``source`` either way (the same bundle, found without MLIR); that the
    module prints as ``source`` parses is the caller's contract (test_ep_module_plan.py pins it for
    ``ep_bundle``). Without the compiler (GPU machines) only bundles recorded by an earlier compile or
    ``mori-compile --precompile`` are found; anything else, and a damaged bundle, is a clear error saying
    how to build it.
    """
    _check_module(module)
    root = Path(cache_root) if cache_root else cache_dir()
    if compiler_available():
        return compile_bundle(source, options, config=config, cache_root=root, kernels=kernels, module=module)
    how = ("build it on a machine with mori_compiler's compiler (`mori-compile --precompile CONFIGS.json`, or run "
           "the same program there) and copy MORI_COMPILER_CACHE_DIR")  # fmt: skip
    try:
        found = find_bundle_by_request(root, bundle_request(source, options, config), target=options.target,
                                       kernels=kernels)  # fmt: skip
    except BundleError as exc:
        raise MoriCompilerError(f"damaged precompiled bundle for {what}: {exc}; the compiler is not installed "
                                f"here to rebuild it: {how} (a compile replaces a damaged bundle)") from None
    if found is None:
        raise MoriCompilerError(
            f"no precompiled bundle for {what} (target {options.target}) in {root}, and the compiler is not "
            f"installed here; {how}"
        )
    if not _same_request(found.config, _recorded_config(source, options, config)):  # an index entry led elsewhere
        raise MoriCompilerError(f"damaged precompiled bundle for {what}: the index of {root} leads to bundle "
                                f"{found.path}, which was built from another source or other options; {how}")
    return found


def _check_module(module) -> None:
    if module is not None and not callable(module):
        raise MoriCompilerError(f"module must be None or a zero-argument callable returning an mlir.ir.Module, "
                                f"got {module!r}")  # fmt: skip


def _report_damage(exc: BundleError) -> None:
    warnings.warn(f"damaged kernel cache entry, discarded and rebuilt: {exc}", DamagedBundleWarning, stacklevel=4)


def _cached_bundle(root: Path, key: str, options: CompileOptions, kernels, *, repair: bool) -> Bundle | None:
    """The verified cached bundle ``key``, or None. A damaged one is None too; with ``repair`` (only under the
    bundle's lock: no writer races it) it is also reported and discarded."""
    try:
        return find_bundle(root, key, target=options.target, kernels=kernels)
    except BundleError as exc:
        if repair:
            _report_damage(exc)
            discard(bundle_dir(root, key))
        return None


def _index(root: Path, request: str, key: str) -> None:
    """Make the index name ``key`` for ``request`` (runtime lookups); a damaged entry is reported and replaced."""
    try:
        if indexed_key(root, request) == key:
            return
    except BundleError:
        with exclusive_lock(_lock_path(root, key)):
            try:
                indexed_key(root, request)
            except BundleError as exc:
                _report_damage(exc)
                discard(index_path(root, request))
    record_request(root, request, key)


def _lock_path(root: Path, key: str) -> Path:
    return root / "locks" / f"{key}.lock"


def compile_bundle(source: str, options: CompileOptions, *, config: dict | None = None, cache_root=None,
                   kernels=(), module=None) -> Bundle:  # fmt: skip
    """The bundle for (source, options): from the cache (verified), or compiled and published now.

    The cache is consulted before the compiler is imported (a warm start loads no MLIR). Processes that
    miss the same bundle serialize on its lock file and look again once they hold it, so one compiles and
    the others load its result; a damaged bundle is reported once (DamagedBundleWarning), discarded and
    rebuilt. ``kernels``: names the bundle must hold; ``module``: as get_bundle's.
    """
    from .options import device_bitcode

    _check_module(module)
    root = Path(cache_root) if cache_root else cache_dir()
    bitcode = device_bitcode(options)
    key = bundle_key(source, options, bitcode, config)
    request = bundle_request(source, options, config)
    bundle = _cached_bundle(root, key, options, kernels, repair=False)
    try:
        if bundle is None:
            with exclusive_lock(_lock_path(root, key)):
                bundle = _cached_bundle(root, key, options, kernels, repair=True)
                if bundle is None:
                    bundle = _compile_and_publish(root, key, source, options, config, kernels, module)
        _index(root, request, key)
    except OSError as exc:  # a read-only or full cache, a path that is a file...
        raise MoriCompilerError(f"cannot write the kernel cache at {root}: {exc}") from None
    return bundle


def _compile_and_publish(root: Path, key: str, source: str, options: CompileOptions, config, kernels,
                         module) -> Bundle:  # fmt: skip
    from .lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
    from .pipeline import compile_source

    result = compile_source(source if module is None else module(), options)
    signatures = result.signatures
    missing = sorted(set(result.kernels) - set(signatures))
    if missing:  # a kernel parameter the bundle format cannot carry (or a kernel that is not a gpu.func)
        raise MoriCompilerError(result.signature_problems.get(missing[0]) or (
            f"kernel '{missing[0]}' cannot go into a bundle: bundles take gpu.func kernels"))
    if not signatures:
        raise MoriCompilerError("the module defines no gpu.func kernel: there is nothing to put in a bundle")
    absent = [name for name in kernels if name not in signatures]
    if absent:
        raise MoriCompilerError(f"the compiled module lacks the expected kernels {', '.join(absent)} "
                                f"(has: {', '.join(signatures)})")  # fmt: skip
    state = [{"symbol": STATE_SYMBOL, "size": STATE_SIZE}] if not options.bitcode and options.device_library else []
    return publish_bundle(
        root, key, target=options.target, backend=options.gpu_target.backend, binary=result.binary,
        kernels=[kernel_info(s) for s in signatures.values()], state_globals=state, compiler=toolchain_fingerprint(),
        config=_recorded_config(source, options, config), virtual_pes=options.virtual_pes,
    )  # fmt: skip


def _recorded_config(source: str, options: CompileOptions, config: dict | None) -> dict:
    """What ``bundle.json`` records of the request: the options, the caller's config and a digest of the
    source, so that a runtime lookup can check that an index entry leads to the bundle it asked for."""
    return {"options": options.to_dict(), "source_sha256": hashlib.sha256(source.encode()).hexdigest(), **(config or {})}


def _same_request(recorded: dict, expected: dict) -> bool:
    """Recorded and expected config agree; bitcode paths aside (the key covers their content, not their path)."""
    strip = lambda c: c | {"options": {**c.get("options", {}), "bitcode": None}}  # noqa: E731
    return isinstance(recorded, dict) and isinstance(recorded.get("options"), dict) and strip(recorded) == strip(expected)
