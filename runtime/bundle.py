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

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mori_compiler.env import write_atomically
from mori_compiler.lib_bitcode.kernel_abi import PARAM_SIZES

BUNDLE_FORMAT = 1
METADATA_FILE = "bundle.json"


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

    @property
    def param_types(self) -> tuple[str, ...]:
        return tuple(p.type for p in self.params)


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
    virtual_pes: bool = False

    @property
    def binary(self) -> bytes:
        return (self.path / self.binary_file).read_bytes()

    def kernel(self, name: str) -> KernelInfo:
        try:
            return self.kernels[name]
        except KeyError:
            raise BundleError(f"bundle {self.key[:12]} has no kernel '{name}' (has: {', '.join(self.kernels)})") from None


def _metadata_dict(key, target, backend, binary_file, kernels, state_globals, compiler, config,
                   virtual_pes) -> dict:  # fmt: skip
    return {
        "format": BUNDLE_FORMAT,
        "virtual_pes": virtual_pes,
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


def _parse_kernel(path: Path, name: str, k) -> KernelInfo:
    if not isinstance(k, dict) or not isinstance(k.get("params"), list):
        raise BundleError(f"bundle {path}: kernel '{name}' has no parameter list")
    params = []
    for i, p in enumerate(k["params"]):
        if not isinstance(p, dict) or p.get("type") not in PARAM_SIZES:
            allowed = ", ".join(PARAM_SIZES)
            raise BundleError(f"bundle {path}: kernel '{name}' parameter {i} has no valid type (allowed: {allowed})")
        params.append(KernelParam(str(p.get("name", f"arg{i}")), p["type"]))
    block = k.get("block")
    if block is not None and not (isinstance(block, list) and len(block) == 3 and all(isinstance(b, int) for b in block)):
        raise BundleError(f"bundle {path}: kernel '{name}' has a malformed block size {block!r}")
    return KernelInfo(name, tuple(params), tuple(block) if block else None)


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Read a bundle directory; raises BundleError if anything is missing or inconsistent."""
    path = Path(path)
    meta_path = path / METADATA_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise BundleError(f"no kernel bundle at {path} ({METADATA_FILE} missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"corrupt bundle metadata {meta_path}: {exc}") from None
    if not isinstance(meta, dict):
        raise BundleError(f"corrupt bundle metadata {meta_path}: not a JSON object")
    if meta.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"bundle {path} has format {meta.get('format')}, this runtime reads {BUNDLE_FORMAT}")
    missing = [k for k in ("key", "target", "backend", "binary", "kernels") if k not in meta]
    if missing or not isinstance(meta["kernels"], dict):
        raise BundleError(f"corrupt bundle metadata {meta_path}: missing or malformed {', '.join(missing) or 'kernels'}")
    kernels = {name: _parse_kernel(path, name, k) for name, k in meta["kernels"].items()}
    bundle = Bundle(path, meta["key"], meta["target"], meta["backend"], meta["binary"], kernels,
                    tuple(meta.get("state_globals", ())), meta.get("compiler", ""), meta.get("config", {}),
                    bool(meta.get("virtual_pes", False)))  # fmt: skip
    if not (path / bundle.binary_file).is_file():
        raise BundleError(f"bundle {path} lacks its code object {bundle.binary_file}")
    return bundle


def bundle_dir(cache_root: str | os.PathLike, key: str) -> Path:
    return Path(cache_root) / "bundles" / key


def find_bundle(cache_root: str | os.PathLike, key: str) -> Bundle | None:
    path = bundle_dir(cache_root, key)
    return load_bundle(path) if (path / METADATA_FILE).is_file() else None


def request_key(source: str, options: dict, compiler_version: str) -> str:
    """What a runtime can compute without the toolchain: a hash of the kernel source, the compile
    options and the compiler version. The index maps it to the full bundle key."""
    h = hashlib.sha256()
    for part in (compiler_version, json.dumps(options, sort_keys=True), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _index_path(cache_root, request: str) -> Path:
    return Path(cache_root) / "index" / request


def find_bundle_by_request(cache_root, request: str) -> Bundle | None:
    """The bundle a precompile recorded for ``request`` (see ``request_key``), if any."""
    try:
        key = _index_path(cache_root, request).read_text().strip()
    except FileNotFoundError:
        return None
    return find_bundle(cache_root, key)


def publish_bundle(cache_root, key, *, target, backend, binary: bytes, kernels, state_globals=(), compiler="",
                   config=None, virtual_pes=False, request=None) -> Bundle:  # fmt: skip
    """Write a bundle atomically (temporary directory, then rename); returns the bundle as loaded.

    With ``request`` (a ``request_key``), also record it in the index so that a runtime without the
    toolchain finds the bundle."""
    final = bundle_dir(cache_root, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    binary_file = "kernels.hsaco" if backend == "rocdl" else "kernels.ptx"
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{key[:12]}-"))
    try:
        (tmp / binary_file).write_bytes(binary)
        meta = _metadata_dict(key, target, backend, binary_file, kernels, state_globals, compiler, config or {},
                              virtual_pes)  # fmt: skip
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / METADATA_FILE).is_file():  # not a lost race with an identical bundle
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if request:
        record_request(cache_root, request, key)
    return load_bundle(final)


def record_request(cache_root, request: str, key: str) -> None:
    """Index bundle ``key`` under ``request`` (atomically)."""
    write_atomically(_index_path(cache_root, request), key)
