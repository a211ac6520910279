"""Kernel bundles: compiled code plus the JSON metadata a runtime needs to load and launch it.

A bundle is a directory ``<cache>/bundles/<key>/`` holding ``bundle.json`` and the code object
(``kernels.hsaco`` for AMDGPU, ``kernels.ptx`` for NVIDIA). Bundles are compiled on a machine with the
compiler (MLIR, llvmlite) and loaded on GPU machines that have neither: this module imports only the
standard library. The compiler side (mori_compiler/cache.py) writes bundles through ``publish_bundle``,
which builds the directory under a temporary name and renames it into place, so a reader sees either
no bundle or a complete one.

``bundle.json`` (format 3)::

    {"format": 3, "key": "<sha256>", "compiler": "mori_compiler 0.1.0 (...)",
     "target": "sm_90", "backend": "nvvm", "binary": "kernels.ptx", "binary_sha256": "<sha256>",
     "kernels": {"ep_dispatch_bf16": {"params": [{"name": "x", "named": true, "type": "ptr", "size": 8}, ...],
                                      "block": [512, 1, 1]},
                 "ring_put_signal": {"params": [{"name": "arg0", "named": false, "type": "ptr", "size": 8}, ...],
                                     "block": [256, 1, 1]}},
     "state_globals": [{"symbol": "mori_compiler_shmem_state", "size": 64}],
     "config": {...the compile options and whatever built the kernels...}}

A kernel compiled with trace points (runtime/trace.py) also has ``"trace": ["<event>:<phase>", ...]``: its
trace events in slot order (event names ``[A-Za-z0-9_.]+``, phase ``begin``, ``end`` or ``instant``, no
duplicates). The field is optional (absent or empty: the kernel is not traced), so it needed no new format:
a runtime that predates it ignores it and the kernel runs with tracing off.

A parameter's ``name`` is the kernel's own (the ``mori.name`` argument attribute; every EP kernel names its
parameters as the EP schema does) where ``named`` is true, else its position ``arg<i>``. Format 3 added
``named``: format-2 bundles recorded only positions, and are refused rather than read as named.

The index ``<cache>/index/<request>`` holds the key of the bundle built for a request (``request_key``):
what a runtime without the compiler looks bundles up by.

**Nothing in a cache is trusted.** ``load_bundle`` checks everything before it returns a ``Bundle``: the
format, every field's type, the key (it must look like a key, and be the directory's name where the caller
knows it), the target and backend (the ones requested), the kernel table (non-empty, well-formed, known
parameter types, the kernels the caller expects), and the code object: a plain file name inside the bundle
directory (no ``/``, no ``..``, never a symlink, never resolved outside the directory), a regular file,
whose SHA-256 is the one recorded at publish time. The verified bytes are kept in the ``Bundle``, so what
was checked is what gets loaded. Any problem is a ``BundleError`` naming the bundle (``exc.path``); the
compiler side discards and rebuilds such a bundle, a runtime refuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mori_compiler.env import write_atomically
from mori_compiler.lib_bitcode.kernel_abi import PARAM_SIZES
from mori_compiler.targets import TARGETS

BUNDLE_FORMAT = 3  # 3: parameter names recorded (``named``)
METADATA_FILE = "bundle.json"
BINARY_FILES = {"rocdl": "kernels.hsaco", "nvvm": "kernels.ptx"}
_HEX = frozenset("0123456789abcdef")
_INDEX_ENTRY_LIMIT = 4096  # an index entry is one key; anything longer is not one
TRACE_PHASES = ("begin", "end", "instant")  # the phases of a trace event (runtime/trace.py)
_TRACE_EVENT_NAME = re.compile(r"[A-Za-z0-9_.]+")


class BundleError(Exception):
    """A bundle (or its index entry) is missing, damaged or of another format; ``path`` names it."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


class DamagedBundleWarning(UserWarning):
    """A damaged cache entry was found and discarded (the compiler rebuilds it)."""


def is_key(text) -> bool:
    """Whether ``text`` looks like a bundle or request key (64 lower-case hex digits)."""
    return isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text)


@dataclass(frozen=True)
class KernelParam:
    name: str
    type: str  # one of PARAM_SIZES
    named: bool = False  # the name is the kernel's (mori.name), not the positional arg<i>

    @property
    def size(self) -> int:
        return PARAM_SIZES[self.type]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[KernelParam, ...]
    block: tuple[int, int, int] | None = None
    trace_events: tuple[str, ...] = ()  # "<event>:<phase>" per trace slot; empty: not traced
    max_blocks: int | None = None  # a kernel with collectives: grid (at most this, 1, 1) per PE; None: any grid

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
    binary_sha256: str = ""
    code: bytes | None = field(default=None, repr=False, compare=False)  # the verified code object

    @property
    def binary(self) -> bytes:
        """The code object: the bytes ``load_bundle`` verified (read again only for hand-made Bundles)."""
        if self.code is not None:
            return self.code
        return _read_plain_file(self.path, self.binary_file, "code object")

    def kernel(self, name: str) -> KernelInfo:
        try:
            return self.kernels[name]
        except KeyError:
            raise BundleError(f"bundle {self.key[:12]} has no kernel '{name}' (has: {', '.join(self.kernels)})") from None


# ----------------------------------------------------------------------------------------------------
# Reading files of a bundle without following anything out of it
# ----------------------------------------------------------------------------------------------------


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read_plain_file(directory: Path, name, what: str, *, dir_fd: int | None = None, owner: Path | None = None,
                     limit: int = -1) -> bytes:  # fmt: skip
    """The bytes of the regular file ``name`` directly inside ``directory`` (opened relative to ``dir_fd``, an
    open descriptor of it, where given: all files of one bundle then come from the same directory even if it
    is renamed meanwhile); a BundleError naming ``owner`` (default: ``directory``) if ``name`` is not a plain
    file name, resolves outside the directory, is a symlink or not a regular file (a FIFO would block), or
    cannot be read."""
    owner = directory if owner is None else owner
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise BundleError(f"bundle {owner}: {what} {name!r} is not a plain file name inside the bundle directory",
                          owner)  # fmt: skip
    path = directory / name
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise BundleError(f"bundle {owner}: {what} {name} resolves outside the bundle directory", owner)
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd) if dir_fd is not None else os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise BundleError(f"bundle {owner}: {what} {name} is missing", owner) from None
    except OSError as exc:
        kind = "a symlink (never followed)" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise BundleError(f"bundle {owner}: {what} {name} is {kind}", owner) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"bundle {owner}: {what} {name} is not a regular file", owner)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    except OSError as exc:
        raise BundleError(f"bundle {owner}: {what} {name} is unreadable ({exc.strerror})", owner) from None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------------------


def _metadata_dict(key, target, backend, binary_file, binary_sha256, kernels, state_globals, compiler, config,
                   virtual_pes) -> dict:  # fmt: skip
    return {
        "format": BUNDLE_FORMAT,
        "virtual_pes": virtual_pes,
        "key": key,
        "compiler": compiler,
        "target": target,
        "backend": backend,
        "binary": binary_file,
        "binary_sha256": binary_sha256,
        "kernels": {
            k.name: {"params": [{"name": p.name, "named": p.named, "type": p.type, "size": p.size} for p in k.params],
                     "block": list(k.block) if k.block else None,
                     **({"trace": list(k.trace_events)} if k.trace_events else {}),
                     **({"max_blocks": k.max_blocks} if k.max_blocks is not None else {})}
            for k in kernels
        },  # fmt: skip
        "state_globals": list(state_globals),
        "config": config,
    }


def split_trace_event(text: str) -> tuple[str, str]:
    """(event, phase) of a trace slot ``"<event>:<phase>"``; ValueError saying what is wrong otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"trace event {text!r} is not a string")
    event, sep, phase = text.rpartition(":")
    if not sep or not _TRACE_EVENT_NAME.fullmatch(event):
        raise ValueError(f"trace event {text!r} is not '<event>:<phase>' with an event name of [A-Za-z0-9_.]+")
    if phase not in TRACE_PHASES:
        raise ValueError(f"trace event {text!r} has phase {phase!r} (allowed: {', '.join(TRACE_PHASES)})")
    return event, phase


def check_trace_events(kernel: str, events) -> tuple[str, ...]:
    """``events`` (a kernel's ``trace`` field) checked: a list of distinct ``"<event>:<phase>"`` strings;
    ValueError naming the kernel and the problem otherwise."""
    if not isinstance(events, (list, tuple)):
        raise ValueError(f"kernel '{kernel}' field trace must be a list of '<event>:<phase>' strings, "
                         f"got {type(events).__name__}")  # fmt: skip
    seen = set()
    for i, text in enumerate(events):
        try:
            split_trace_event(text)
        except ValueError as exc:
            raise ValueError(f"kernel '{kernel}' field trace slot {i}: {exc}") from None
        if text in seen:
            raise ValueError(f"kernel '{kernel}' field trace slot {i}: {text!r} appears twice")
        seen.add(text)
    return tuple(events)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_max_blocks(value) -> bool:
    """A kernel's ``max_blocks``: None (any grid) or a positive integer."""
    return value is None or (_is_int(value) and value > 0)


def _parse_kernel(path: Path, name, k) -> KernelInfo:
    if not isinstance(name, str) or not name or "\0" in name:
        raise BundleError(f"bundle {path}: kernel name {name!r} is not a symbol name", path)
    if not isinstance(k, dict) or not isinstance(k.get("params"), list):
        raise BundleError(f"bundle {path}: kernel '{name}' has no parameter list", path)
    params = []
    for i, p in enumerate(k["params"]):
        if not isinstance(p, dict) or p.get("type") not in PARAM_SIZES:
            allowed = ", ".join(PARAM_SIZES)
            raise BundleError(f"bundle {path}: kernel '{name}' parameter {i} has no valid type (allowed: {allowed})",
                              path)  # fmt: skip
        if "size" in p and p["size"] != PARAM_SIZES[p["type"]]:
            raise BundleError(f"bundle {path}: kernel '{name}' parameter {i} of type {p['type']} has size "
                              f"{p['size']!r}, not {PARAM_SIZES[p['type']]}", path)  # fmt: skip
        if not isinstance(p.get("name"), str) or not p["name"] or not isinstance(p.get("named"), bool):
            raise BundleError(f"bundle {path}: kernel '{name}' parameter {i} needs a name (a non-empty string) and "
                              "named (true or false)", path)  # fmt: skip
        if p["named"] and any(q.named and q.name == p["name"] for q in params):
            raise BundleError(f"bundle {path}: kernel '{name}' names two parameters '{p['name']}'", path)
        params.append(KernelParam(p["name"], p["type"], p["named"]))
    block = k.get("block")
    if block is not None and not (isinstance(block, list) and len(block) == 3
                                  and all(_is_int(b) and b > 0 for b in block)):  # fmt: skip
        raise BundleError(f"bundle {path}: kernel '{name}' has a malformed block size {block!r}", path)
    try:
        trace = check_trace_events(name, k.get("trace", []))
    except ValueError as exc:
        raise BundleError(f"bundle {path}: {exc}", path) from None
    max_blocks = k.get("max_blocks")
    if not _valid_max_blocks(max_blocks):
        raise BundleError(f"bundle {path}: kernel '{name}' field max_blocks must be a positive integer, got "
                          f"{max_blocks!r}", path)  # fmt: skip
    return KernelInfo(name, tuple(params), tuple(block) if block else None, trace, max_blocks)


def _check_state_globals(path: Path, state) -> tuple[dict, ...]:
    if not isinstance(state, list) or not all(
        isinstance(g, dict) and isinstance(g.get("symbol"), str) and g["symbol"] and _is_int(g.get("size"))
        and g["size"] > 0 for g in state
    ):  # fmt: skip
        raise BundleError(f"bundle {path}: malformed state_globals {state!r} (a list of {{symbol, size}})", path)
    return tuple(state)


def _code_problem(backend: str, code: bytes) -> str | None:
    """What makes ``code`` unfit to be ``backend``'s code object (a cheap sanity check), or None."""
    if not code:
        return "is empty"
    if backend == "rocdl" and code[:4] != b"\x7fELF":
        return "is not an ELF file"
    if backend == "nvvm" and b"\0" in code:
        return "is not PTX text"
    return None


def _check_code(path: Path, backend: str, name: str, code: bytes, recorded: str) -> None:
    if code and hashlib.sha256(code).hexdigest() != recorded:
        raise BundleError(f"bundle {path}: code object {name} does not match the SHA-256 recorded in "
                          f"{METADATA_FILE} (truncated or altered)", path)  # fmt: skip
    problem = _code_problem(backend, code)
    if problem:
        raise BundleError(f"bundle {path}: code object {name} {problem}", path)


def load_bundle(path: str | os.PathLike, *, key: str | None = None, target: str | None = None,
                kernels=()) -> Bundle:  # fmt: skip
    """Read and verify a bundle directory; raises BundleError if anything is missing, inconsistent or other
    than asked: ``key`` (the bundle must carry it), ``target`` (built for it) and ``kernels`` (names it
    must contain), where given."""
    path = Path(path)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        what = "missing" if not os.path.lexists(path) else "not a directory"
        raise BundleError(f"no kernel bundle at {path} ({what})", path) from None
    try:
        return _load(path, dir_fd, key, target, kernels)
    finally:
        os.close(dir_fd)


def _load(path: Path, dir_fd: int, key: str | None, target: str | None, kernels) -> Bundle:
    raw = _read_plain_file(path, METADATA_FILE, "metadata", dir_fd=dir_fd)
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested beyond the parser's depth
        problem = str(exc) or type(exc).__name__
        raise BundleError(f"bundle {path}: corrupt metadata {METADATA_FILE}: {problem}", path) from None
    if not isinstance(meta, dict):
        raise BundleError(f"bundle {path}: corrupt metadata {METADATA_FILE}: not a JSON object", path)
    if meta.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"bundle {path} has format {meta.get('format')!r}, this runtime reads {BUNDLE_FORMAT} "
                          "(written by another mori_compiler version: rebuild it)", path)  # fmt: skip
    missing = [k for k in ("key", "target", "backend", "binary", "binary_sha256", "kernels") if k not in meta]
    if missing:
        raise BundleError(f"bundle {path}: corrupt metadata {METADATA_FILE}: missing {', '.join(missing)}", path)
    if not is_key(meta["key"]):
        raise BundleError(f"bundle {path}: metadata key {meta['key']!r} is not a bundle key (64 hex digits)", path)
    if key is not None and meta["key"] != key:
        raise BundleError(f"bundle {path}: metadata key {meta['key'][:12]}… is not the directory's key {key[:12]}…",
                          path)  # fmt: skip
    gpu_target = TARGETS.get(meta["target"]) if isinstance(meta["target"], str) else None
    if gpu_target is None:
        raise BundleError(f"bundle {path}: unknown target {meta['target']!r} (allowed: {', '.join(TARGETS)})", path)
    if target is not None and meta["target"] != target:
        raise BundleError(f"bundle {path} is built for {meta['target']}, not the requested {target}", path)
    if meta["backend"] != gpu_target.backend:
        raise BundleError(f"bundle {path}: backend {meta['backend']!r} is not {gpu_target.name}'s "
                          f"({gpu_target.backend})", path)  # fmt: skip
    if not is_key(meta["binary_sha256"]):
        raise BundleError(f"bundle {path}: malformed binary_sha256 {meta['binary_sha256']!r}", path)
    if not isinstance(meta["kernels"], dict) or not meta["kernels"]:
        raise BundleError(f"bundle {path}: the kernel table is empty or not an object", path)
    table = {name: _parse_kernel(path, name, k) for name, k in meta["kernels"].items()}
    absent = [name for name in kernels if name not in table]
    if absent:
        raise BundleError(f"bundle {path} lacks the expected kernels {', '.join(absent)} (has: {', '.join(table)})",
                          path)  # fmt: skip
    state = _check_state_globals(path, meta.get("state_globals", []))
    extras = {"compiler": (str, ""), "config": (dict, {}), "virtual_pes": (bool, False)}
    for name, (ty, default) in extras.items():
        if not isinstance(meta.get(name, default), ty):
            raise BundleError(f"bundle {path}: metadata field {name} must be a {ty.__name__}", path)
    code = _read_plain_file(path, meta["binary"], "code object", dir_fd=dir_fd)
    _check_code(path, meta["backend"], meta["binary"], code, meta["binary_sha256"])
    return Bundle(path, meta["key"], meta["target"], meta["backend"], meta["binary"], table, state,
                  meta.get("compiler", ""), meta.get("config", {}), meta.get("virtual_pes", False),
                  meta["binary_sha256"], code)  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# The cache: bundles by key, the index by request
# ----------------------------------------------------------------------------------------------------


def bundle_dir(cache_root: str | os.PathLike, key: str) -> Path:
    if not is_key(key):
        raise ValueError(f"{key!r} is not a bundle key (64 hex digits)")
    return Path(cache_root) / "bundles" / key


def find_bundle(cache_root: str | os.PathLike, key: str, *, target: str | None = None, kernels=()) -> Bundle | None:
    """The verified bundle ``key``, or None if there is none; a BundleError if it is damaged."""
    path = bundle_dir(cache_root, key)
    if not os.path.lexists(path):
        return None
    return load_bundle(path, key=key, target=target, kernels=kernels)


def request_key(source: str, options: dict, compiler_version: str) -> str:
    """What a runtime can compute without the toolchain: a hash of the kernel source, the compile
    options and the compiler version. The index maps it to the full bundle key."""
    h = hashlib.sha256()
    for part in (compiler_version, json.dumps(options, sort_keys=True), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def index_path(cache_root, request: str) -> Path:
    if not is_key(request):
        raise ValueError(f"{request!r} is not a request key (64 hex digits)")
    return Path(cache_root) / "index" / request


def indexed_key(cache_root, request: str) -> str | None:
    """The bundle key the index holds for ``request``; None without an entry; a BundleError (naming the
    entry) if the entry is not a key: it is never used as a path then."""
    path = index_path(cache_root, request)
    if not os.path.lexists(path):
        return None
    raw = _read_plain_file(path.parent, path.name, "index entry", owner=path, limit=_INDEX_ENTRY_LIMIT)
    text = raw.decode("ascii", "replace").strip()
    if not is_key(text):
        raise BundleError(f"index entry {path} is damaged: it holds {text[:40]!r}, not a bundle key", path)
    return text


def find_bundle_by_request(cache_root, request: str, *, target: str | None = None, kernels=()) -> Bundle | None:
    """The verified bundle a compile or precompile recorded for ``request`` (see ``request_key``); None if
    none was recorded; a BundleError if the entry or the bundle it names is damaged or missing."""
    key = indexed_key(cache_root, request)
    if key is None:
        return None
    path = bundle_dir(cache_root, key)
    if not os.path.lexists(path):
        raise BundleError(f"index entry {index_path(cache_root, request)} names bundle {path}, which is missing",
                          path)  # fmt: skip
    return load_bundle(path, key=key, target=target, kernels=kernels)


def discard(path: Path) -> None:
    """Remove a damaged bundle or index entry: renamed aside first (one atomic step, so a reader sees the
    damaged entry or none, and a new one can be published at once), then deleted. Safe when another
    process discards it too (whoever renames it first deletes it)."""
    import shutil
    import uuid

    aside = path.parent / f".discarded-{path.name[:16]}-{uuid.uuid4().hex[:12]}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # already gone
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.unlink(aside)


def publish_bundle(cache_root, key, *, target, backend, binary: bytes, kernels, state_globals=(), compiler="",
                   config=None, virtual_pes=False) -> Bundle:  # fmt: skip
    """Write a bundle atomically (temporary directory, then rename); returns the bundle as loaded (the
    caller indexes it with ``record_request``)."""
    import shutil
    import tempfile

    final = bundle_dir(cache_root, key)
    if not kernels:
        raise BundleError(f"bundle {final}: nothing to publish (no kernels)", final)
    if backend not in BINARY_FILES:
        raise BundleError(f"bundle {final}: unknown backend {backend!r} (allowed: {', '.join(BINARY_FILES)})", final)
    problem = _code_problem(backend, binary)
    if problem:
        raise BundleError(f"bundle {final}: refusing to publish a code object that {problem}", final)
    for k in kernels:  # what load_bundle would refuse is never written
        try:
            check_trace_events(k.name, k.trace_events)
        except ValueError as exc:
            raise BundleError(f"bundle {final}: refusing to publish: {exc}", final) from None
        if not _valid_max_blocks(k.max_blocks):
            raise BundleError(f"bundle {final}: refusing to publish: kernel '{k.name}' max_blocks must be a "
                              f"positive integer, got {k.max_blocks!r}", final)  # fmt: skip
    final.parent.mkdir(parents=True, exist_ok=True)
    binary_file = BINARY_FILES[backend]
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{key[:12]}-"))
    try:
        (tmp / binary_file).write_bytes(binary)
        meta = _metadata_dict(key, target, backend, binary_file, hashlib.sha256(binary).hexdigest(), kernels,
                              state_globals, compiler, config or {}, virtual_pes)  # fmt: skip
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.lexists(final):  # not a lost race with another publisher
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return load_bundle(final, key=key, target=target)


def record_request(cache_root, request: str, key: str) -> None:
    """Index bundle ``key`` under ``request`` (atomically)."""
    if not is_key(key):
        raise ValueError(f"{key!r} is not a bundle key (64 hex digits)")
    write_atomically(index_path(cache_root, request), key)
