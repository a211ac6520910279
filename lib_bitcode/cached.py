"""A built bitcode file in the cache that is verified on every use.

The device library, the lowering-support bitcode and the prepared copies of external bitcode files are built
once and kept under ``<cache>/lib/``. Each file ``F`` has a record ``F.sha256`` beside it (the hex SHA-256
and the size of ``F``), written after ``F`` itself. A use reads ``F`` and checks it against the record;
anything else (``F`` or its record missing, truncated, empty, garbage, a directory where a file belongs, a
file where the folder belongs) is reported once as a ``DeviceLibraryCacheWarning``, discarded and rebuilt.

Concurrent builders (the ranks of one job) serialize on ``<folder>.lock`` (``env.exclusive_lock``): the first
builds, the others wait, re-check and find its result. Writers publish with a rename, so a reader never sees
a half-written file, and a reader that sees a stale pair re-checks under the lock before rebuilding.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from pathlib import Path

from mori_compiler.env import exclusive_lock, write_atomically
from mori_compiler.errors import MoriCompilerError

RECORD_SUFFIX = ".sha256"


class DeviceLibraryCacheWarning(UserWarning):
    """A cached device bitcode file was damaged; it was discarded and rebuilt."""


def _record_text(data: bytes) -> str:
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}\n"


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


class _Damaged(Exception):
    """Why a cached file cannot be used (the message completes "cached <what> <path> ...")."""


def _verified_bytes(path: Path) -> bytes | None:
    """The content of ``path`` if it matches its record; None when neither exists yet; raises ``_Damaged``
    naming the problem otherwise."""
    record = _record_path(path)
    if not path.exists() and not record.exists():
        return None
    if not path.is_file():
        raise _Damaged("is missing" if not path.exists() else "is not a regular file")
    if not record.is_file():
        raise _Damaged(f"has no content record ({record.name})")
    try:
        data = path.read_bytes()
        expected = record.read_bytes()
    except OSError as exc:
        raise _Damaged(f"cannot be read ({exc.strerror})") from None
    if not data:
        raise _Damaged("is empty")
    if _record_text(data).encode() != expected:
        raise _Damaged(f"does not match its content record ({len(data)} bytes; truncated or overwritten)")
    return data


_warned: set[str] = set()


def _discard(path: Path, problem: str, what: str) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(f"cached {what} {path} {problem}: discarded, rebuilding it", DeviceLibraryCacheWarning,
                      stacklevel=4)  # fmt: skip
    for p in (path, _record_path(path)):
        if p.is_dir() and not p.is_symlink():
            import shutil  # only to discard a damaged entry: not on the warm path

            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink(missing_ok=True)


def _usable_folder(folder: Path, what: str) -> None:
    """A file (or a dangling link) where ``folder`` belongs is damage, not a user error: discard it."""
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        _discard(folder, "is not a directory", what)


def _is_valid(path: Path) -> bool:
    try:
        return _verified_bytes(path) is not None
    except _Damaged:
        return False


def cached_bitcode(path: Path, build: Callable[[], bytes], what: str) -> Path:
    """``path`` holding the verified output of ``build()``: reused when its record matches, else built
    (once across processes) and published with its record.

    Only the lock holder discards: a reader outside the lock may see a pair being replaced (new file, old
    record) and must not delete the new file; it takes the lock and looks again."""
    try:
        if path.parent.is_dir() and _is_valid(path):
            return path
        _usable_folder(path.parent.parent, what)
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(path.parent.with_name(path.parent.name + ".lock")):
            _usable_folder(path.parent, what)
            try:
                if _verified_bytes(path) is not None:  # another process built it while this one waited
                    return path
            except _Damaged as damage:
                _discard(path, str(damage), what)
            path.parent.mkdir(exist_ok=True)
            data = build()
            write_atomically(path, data)
            write_atomically(_record_path(path), _record_text(data))
    except OSError as exc:
        raise MoriCompilerError(f"cannot write the {what} cache at {path.parent}: {exc}") from None
    return path
