"""Compile FlyDSL kernels (that call our shmem) compile-only, in a process of their own.

    python -m mori_compiler.clients.flydsl_compile --target gfx942 --out DIR SCRIPT [SCRIPT...]

FlyDSL and the compiler's MLIR bindings cannot share a process, and without an AMD GPU a FlyDSL launch
aborts the process; so each compile runs here, in a fresh interpreter prepared before FlyDSL is imported:
``COMPILE_ONLY=1`` (FlyDSL compiles and never launches), ``FLYDSL_GPU_ARCH=<target>``, and, where no ROCm
``ld.lld`` exists, ``ROCM_PATH`` pointing at a toolkit folder in the cache whose ``llvm/bin/ld.lld`` runs the
project's ld.lld (passes/codegen.py: ``find_ld_lld``; MLIR's ROCDL serializer links with
``$ROCM_PATH/llvm/bin/ld.lld``). Each SCRIPT runs as ``__main__`` and calls ``emit(name, jit_fn, *args)``
for each kernel launcher to compile; the driver writes ``DIR/<name>.hsaco`` and ``DIR/manifest.json``
(target, FlyDSL's arch, wave size and code object version, and per kernel its file, link libraries and
post-load initializers). The staged toolkit has no ROCm device libraries (``amdgcn/bitcode``: ocml, ockl), so
a kernel that needs them (FlyDSL's math functions) compiles only where ROCm is installed.

``compile_scripts(scripts, target=, out_dir=)`` runs that process from any other (the compiler's included)
and returns the manifest. Importing this module imports only the standard library and the errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

from mori_compiler.errors import MoriCompilerError

MANIFEST = "manifest.json"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_emitted: dict[str, dict] = {}  # name -> {"code_object": bytes, ...}: this process's emit() calls
_out_dir: Path | None = None


class FlyDSLCompileError(MoriCompilerError):
    """A FlyDSL compile (or its process) failed; the message says where and why."""


# ---- the parent side ------------------------------------------------------------------------------------


def compile_scripts(scripts, *, target: str, out_dir, timeout: float = 600) -> dict:
    """Run the compile-only driver on ``scripts`` for ``target`` in a fresh interpreter; the manifest."""
    from mori_compiler.runtime.extras import OPTIONAL_PACKAGES, MissingExtraError, is_installed

    if not is_installed("flydsl"):
        raise MissingExtraError("flydsl", OPTIONAL_PACKAGES["flydsl"])
    _amd_target(target)
    cmd = [sys.executable, "-m", __name__, "--target", target, "--out", str(out_dir), *map(str, scripts)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FlyDSLCompileError(f"FlyDSL compile for {target} did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise FlyDSLCompileError(f"FlyDSL compile for {target} failed (exit {proc.returncode}):\n{tail}")
    return json.loads((Path(out_dir) / MANIFEST).read_text())


def _amd_target(name: str):
    from mori_compiler.targets import TARGETS

    target = TARGETS.get(name)
    if target is None or not target.is_amdgpu:
        raise FlyDSLCompileError(f"target '{name}' is not an AMDGPU target of the project; allowed: "
                                 f"{', '.join(t.name for t in TARGETS.values() if t.is_amdgpu)}")  # fmt: skip
    return target


# ---- the child side -------------------------------------------------------------------------------------


def _rocm_lld_present() -> bool:
    roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"]
    return any(r and os.access(os.path.join(r, "llvm", "bin", "ld.lld"), os.X_OK) for r in roots)


def staged_toolkit() -> Path:
    """A folder laid out as MLIR's ROCDL serializer expects a ROCm root (``llvm/bin/ld.lld``), whose ld.lld
    runs the project's (find_ld_lld: MORI_COMPILER_LLD, a system lld, the ziglang wheel's)."""
    from mori_compiler.env import cache_dir
    from mori_compiler.passes.codegen import find_ld_lld

    script = "#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in find_ld_lld()) + ' "$@"\n'
    root = cache_dir() / "flydsl-toolkit"
    lld = root / "llvm" / "bin" / "ld.lld"
    if not lld.is_file() or lld.read_text() != script:
        lld.parent.mkdir(parents=True, exist_ok=True)
        tmp = lld.with_name(f".ld.lld.{os.getpid()}")
        tmp.write_text(script)
        tmp.chmod(0o755)
        tmp.replace(lld)  # atomic: a concurrent compile sees the old script or the new one
    return root


def prepare_environment(target: str) -> None:
    """Set what FlyDSL reads, before it is imported: compile-only, the target, an ld.lld."""
    if sys.modules.get("flydsl") is not None:
        raise FlyDSLCompileError("FlyDSL is already imported: the compile-only environment must be set first")
    _amd_target(target)
    os.environ["COMPILE_ONLY"] = "1"
    os.environ["FLYDSL_GPU_ARCH"] = target
    if not _rocm_lld_present():
        os.environ["ROCM_PATH"] = str(staged_toolkit())


def _code_objects(artifact) -> list[bytes]:
    """The code objects in a compiled FlyDSL artifact (its ``gpu.binary`` ops' first object: what loads)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    found = []

    def visit(op):
        if op.name == "gpu.binary":
            found.append(bytes(gpu.ObjectAttr(ir.ArrayAttr(op.attributes["objects"])[0]).object))
        return ir.WalkResult.ADVANCE

    with _create_mlir_context():
        ir.Module.parse(artifact.ir).operation.walk(visit)
    return found


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def emit(name: str, jit_fn, *args, **kwargs) -> None:
    """Compile ``jit_fn(*args, **kwargs)`` (a ``@flyc.jit`` launcher) compile-only and record its code object
    as ``name``; only inside the driver (``python -m mori_compiler.clients.flydsl_compile``)."""
    if _out_dir is None or os.environ.get("COMPILE_ONLY") != "1":
        raise FlyDSLCompileError("emit() runs inside the compile-only driver: python -m "
                                 "mori_compiler.clients.flydsl_compile --target T --out DIR SCRIPT")  # fmt: skip
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FlyDSLCompileError(f"emit: kernel name {name!r} must be letters, digits, '_', '.', '-'")
    if name in _emitted:
        raise FlyDSLCompileError(f"emit: kernel name '{name}' is emitted twice")
    if not hasattr(jit_fn, "_last_compiled"):
        raise FlyDSLCompileError(f"emit: {jit_fn!r} is not a FlyDSL @flyc.jit function")
    # FlyDSL 0.5.0 (the pinned release) has no public accessor for what a compile-only call built: its
    # JitFunction keeps the last (cache key, CompiledArtifact) in _last_compiled, and the artifact its link
    # libraries and post-load processors in _link_libs / _post_load_processors.
    jit_fn._last_compiled = None
    jit_fn(*args, **kwargs)  # returns None: COMPILE_ONLY compiles and caches, never launches
    compiled = getattr(jit_fn, "_last_compiled", None)
    if compiled is None:
        raise FlyDSLCompileError(f"emit: FlyDSL compiled nothing for '{name}'")
    artifact = compiled[1]
    objects = _code_objects(artifact)
    if len(objects) != 1:
        raise FlyDSLCompileError(f"emit: '{name}' has {len(objects)} GPU code objects; one is expected")
    (_out_dir / f"{name}.hsaco").write_bytes(objects[0])
    _emitted[name] = {
        "file": f"{name}.hsaco",
        "link_libs": [str(p) for p in getattr(artifact, "_link_libs", [])],
        "post_load": [_qualname(p) for p in getattr(artifact, "_post_load_processors", [])],
    }


def _script_error(script: str, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == script]
    where = f"{script}:{frames[-1].lineno}" if frames else script
    return f"{where}: {type(exc).__name__}: {exc}"


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # exit 1 with the usage, not argparse's 2 (2 means an internal compiler error)
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)


def main(argv=None) -> int:
    global _out_dir
    parser = _ArgumentParser(prog="python -m mori_compiler.clients.flydsl_compile",
                                     description="Compile FlyDSL kernel scripts compile-only for one AMDGPU target.")
    parser.add_argument("--target", required=True, help="gfx942, gfx950 or gfx1250")
    parser.add_argument("--out", required=True, help="folder for <name>.hsaco and manifest.json")
    parser.add_argument("scripts", nargs="+", help="Python scripts that call emit(name, jit_fn, *args)")
    args = parser.parse_args(argv)
    try:
        prepare_environment(args.target)
        scripts = [os.path.abspath(s) for s in args.scripts]
        for script in scripts:
            if not os.path.isfile(script):
                raise FlyDSLCompileError(f"no script {script}")
        _out_dir = Path(args.out)
        _out_dir.mkdir(parents=True, exist_ok=True)
        from mori_compiler.clients.flydsl import flydsl_code_object_version, flydsl_target, import_flydsl
        from mori_compiler.runtime.extras import OPTIONAL_PACKAGES, MissingExtraError, is_installed

        if not is_installed("flydsl"):  # (found without importing it: the scripts import what they use)
            raise MissingExtraError("flydsl", OPTIONAL_PACKAGES["flydsl"])
        for script in scripts:
            try:
                runpy.run_path(script, run_name="__main__")
            except MoriCompilerError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's script: reported with its location
                raise FlyDSLCompileError(_script_error(script, exc)) from None
        if not _emitted:
            raise FlyDSLCompileError(f"no kernel emitted by {', '.join(scripts)} (call emit(name, jit_fn, *args))")
        fly_target = flydsl_target()
        manifest = {"target": args.target, "flydsl_version": import_flydsl("flydsl").__version__, "flydsl_arch": fly_target.arch,
                    "flydsl_warp_size": fly_target.warp_size, "code_object_version": flydsl_code_object_version(),
                    "kernels": _emitted}  # fmt: skip
        (_out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    except (MoriCompilerError, ModuleNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run the importable copy of this module, so that the scripts' ``emit`` (imported by name) is the one
    # whose state main() sets.
    from mori_compiler.clients import flydsl_compile

    sys.exit(flydsl_compile.main())
