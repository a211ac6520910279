"""Kernel bundles: compiled code plus the JSON metadata a runtime needs to load and launch it.

A bundle is a directory ``<cache>/bundles/<key>/`` holding ``bundle.json`` and the code object
(``kernels.hsaco`` for AMDGPU, ``kernels.ptx`` for NVIDIA). Bundles are compiled on a machine with the
compiler (MLIR, llvmlite) and loaded on GPU machines that have neither: this module imports only the
standard library. The compiler side (mori_compiler/cache.py) writes bundles through ``publish_bundle``,
which builds the directory under a temporary name and renames it into place, so a reader sees either
no bundle or a complete one.

``bundle.json`` (format 1)::

    {"format": 1, "key": "<sha256>", "compiler": "mori_compiler 0.1.0",
     "target": "sm_90", "backend": "nvvm", "binary": "kernels.ptx",
     "kernels": {"ring_put_signal": {"params": [{"name": "arg0", "type": "ptr", "size": 8}, ...],
                                     "block": [256, 1, 1]}},
     "state_globals": [{"symbol": "mori_compiler_shmem_state", "size": 64}],
     "config": {...the compile options and whatever built the kernels...}}
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BUNDLE_FORMAT = 1
METADATA_FILE = "bundle.json"
PARAM_SIZES = {"ptr": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "f64": 8, "f32": 4}


class BundleError(Exception):
    """A bundle is missing, incomplete or of another format."""


@dataclass(frozen=True)
class KernelParam:
    name: str
    type: str  # one of PARAM_SIZES

    @property
    def size(self) -> int:
        return PARAM_SIZES[self.type]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[KernelParam, ...]
    block: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Bundle:
    path: Path
    key: str
    target: str
    backend: str
    binary_file: str
    kernels: dict[str, KernelInfo]
    state_globals: tuple[dict, ...] = ()
    compiler: str = ""
    config: dict = field(default_factory=dict)

    @property
    def binary(self) -> bytes:
        return (self.path / self.binary_file).read_bytes()

    def kernel(self, name: str) -> KernelInfo:
        try:
            return self.kernels[name]
        except KeyError:
            raise BundleError(f"bundle {self.key[:12]} has no kernel '{name}' (has: {', '.join(self.kernels)})") from None


def _metadata_dict(key, target, backend, binary_file, kernels, state_globals, compiler, config) -> dict:
    return {
        "format": BUNDLE_FORMAT,
        "key": key,
        "compiler": compiler,
        "target": target,
        "backend": backend,
        "binary": binary_file,
        "kernels": {
            k.name: {"params": [{"name": p.name, "type": p.type, "size": p.size} for p in k.params],
                     "block": list(k.block) if k.block else None}
            for k in kernels
        },  # fmt: skip
        "state_globals": list(state_globals),
        "config": config,
    }


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Read a bundle directory; raises BundleError if anything is missing or inconsistent."""
    path = Path(path)
    meta_path = path / METADATA_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise BundleError(f"no kernel bundle at {path} ({METADATA_FILE} missing)") from None
    except json.JSONDecodeError as exc:
        raise BundleError(f"corrupt bundle metadata {meta_path}: {exc}") from None
    if meta.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"bundle {path} has format {meta.get('format')}, this runtime reads {BUNDLE_FORMAT}")
    kernels = {
        name: KernelInfo(name, tuple(KernelParam(p["name"], p["type"]) for p in k["params"]),
                         tuple(k["block"]) if k.get("block") else None)
        for name, k in meta["kernels"].items()
    }  # fmt: skip
    bundle = Bundle(path, meta["key"], meta["target"], meta["backend"], meta["binary"], kernels,
                    tuple(meta.get("state_globals", ())), meta.get("compiler", ""), meta.get("config", {}))  # fmt: skip
    if not (path / bundle.binary_file).is_file():
        raise BundleError(f"bundle {path} lacks its code object {bundle.binary_file}")
    return bundle


def bundle_dir(cache_root: str | os.PathLike, key: str) -> Path:
    return Path(cache_root) / "bundles" / key


def find_bundle(cache_root: str | os.PathLike, key: str) -> Bundle | None:
    path = bundle_dir(cache_root, key)
    return load_bundle(path) if (path / METADATA_FILE).is_file() else None


def publish_bundle(cache_root, key, *, target, backend, binary: bytes, kernels, state_globals=(), compiler="",
                   config=None) -> Bundle:  # fmt: skip
    """Write a bundle atomically (temporary directory, then rename); returns the bundle as loaded."""
    final = bundle_dir(cache_root, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    binary_file = "kernels.hsaco" if backend == "rocdl" else "kernels.ptx"
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{key[:12]}-"))
    try:
        (tmp / binary_file).write_bytes(binary)
        meta = _metadata_dict(key, target, backend, binary_file, kernels, state_globals, compiler, config or {})
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / METADATA_FILE).is_file():  # not a lost race with an identical bundle
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return load_bundle(final)
