"""Stages ``isa``, ``object`` and ``hsaco``/``ptx``: code generation and the code-object link.

Input: the optimized llvmlite module. Output: assembly text (AMDGPU ISA or PTX), an AMDGPU ELF
relocatable object, and the final code object: an hsaco (``ld.lld -shared``) or PTX text.

``ld.lld`` is looked up in this order: ``$MORI_COMPILER_LLD``; ``$ROCM_PATH/llvm/bin/ld.lld``;
``ld.lld`` / ``ld.lld-NN`` on PATH (version 18 or newer: code object v6 needs it); the ``ziglang``
package (``pip install mori-compiler[lld]``), which bundles LLD 22 (its ``zig`` binary is run directly).
The lookup, and its version probes, run once per process.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mori_compiler.errors import ToolchainError
from mori_compiler.targets import GPUTarget

from .device_link import target_machine

MIN_LLD_MAJOR = 18


# Code generation rewrites the module it runs on (AMDGPU's structurizer inserts llvm.amdgcn.if/else), so
# a second emission from the same module aborts LLVM: every emission works on its own clone.


def emit_assembly(module, target: GPUTarget, opt_level: int = 3) -> str:
    return target_machine(target, opt_level).emit_assembly(module.clone())


def emit_object(module, target: GPUTarget, opt_level: int = 3) -> bytes:
    return target_machine(target, opt_level).emit_object(module.clone())


def _lld_major(cmd: list[str]) -> int | None:
    try:
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"LLD (\d+)\.", out)
    return int(m.group(1)) if m else None


def _path_candidates() -> list[str]:
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if re.fullmatch(r"ld\.lld(-\d+)?", name):
                found.append(os.path.join(directory, name))
    # Highest version suffix first; an unsuffixed ld.lld last among equals.
    return sorted(found, key=lambda p: -int(p.rsplit("-", 1)[1]) if p[-1].isdigit() else 0)


def _ziglang_binary() -> tuple[str, ...] | None:
    """The ziglang wheel's LLD: its ``zig`` executable run directly (``python -m ziglang`` only execs it,
    after a whole interpreter start: ~20 ms per link)."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None:
        return None
    for directory in spec.submodule_search_locations or ():
        zig = os.path.join(directory, "zig")
        if os.access(zig, os.X_OK):
            return (zig, "ld.lld")
    return (sys.executable, "-m", "ziglang", "ld.lld")


@functools.cache
def find_ld_lld() -> tuple[str, ...]:
    """The command that runs a usable ld.lld, or a ToolchainError naming every option."""
    tried = []
    explicit = os.environ.get("MORI_COMPILER_LLD")
    if explicit:
        if _lld_major([explicit]) is None:
            raise ToolchainError(f"MORI_COMPILER_LLD={explicit} does not run as ld.lld")
        return (explicit,)
    candidates = []
    if os.environ.get("ROCM_PATH"):
        candidates.append(os.path.join(os.environ["ROCM_PATH"], "llvm", "bin", "ld.lld"))
    candidates += _path_candidates()
    for path in candidates:
        if os.path.isfile(path):
            major = _lld_major([path])
            if major is not None and major >= MIN_LLD_MAJOR:
                return (path,)
            tried.append(f"{path} (version {major}, need >= {MIN_LLD_MAJOR})")
    zig = _ziglang_binary()
    if zig is not None:
        return zig

    raise ToolchainError(
        "no ld.lld found to link the AMDGPU code object; set MORI_COMPILER_LLD=/path/to/ld.lld, "
        "or set ROCM_PATH to a ROCm install, or put ld.lld (LLVM >= 18, e.g. Debian's lld-22) on PATH, "
        "or `pip install ziglang==0.17.1`" + (f" (unusable: {'; '.join(tried)})" if tried else "")
    )


def link_code_object(obj: bytes) -> bytes:
    """``ld.lld -shared`` an AMDGPU relocatable object into an hsaco."""
    lld = find_ld_lld()
    with tempfile.TemporaryDirectory(prefix="mori-lld-") as tmp:
        obj_path, out_path = Path(tmp, "kernel.o"), Path(tmp, "kernel.hsaco")
        obj_path.write_bytes(obj)
        proc = subprocess.run([*lld, "-shared", str(obj_path), "-o", str(out_path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"ld.lld failed ({' '.join(lld)}): {proc.stderr.strip()}")
        return out_path.read_bytes()

