"""A cache that cannot be tricked: every damaged entry is found, reported once, discarded and rebuilt (compiler
present) or refused with an error naming it (runtime only); nothing outside the cache is ever read; concurrent
compiles of one bundle compile it once; a warm start imports no MLIR.

The compiler path recompiles many times here, so ``pipeline.compile_source`` is replaced by a counter that
returns one real compile of the ring example (made once per module): every rebuilt bundle holds real code.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mori_compiler import cache, pipeline
from mori_compiler.errors import MoriCompilerError
from mori_compiler.options import CompileOptions
from mori_compiler.runtime import bundle as rt
from mori_compiler.runtime.bundle import BundleError, DamagedBundleWarning, load_bundle

OPTIONS = CompileOptions(target="gfx942")
OUTSIDE = b"a file outside the cache that no lookup may read\n"


@pytest.fixture(scope="module")
def real_result(example_source):
    return pipeline.compile_source(example_source, OPTIONS)


@pytest.fixture
def compiles(monkeypatch, real_result):
    """Counts compiles; each returns the real result made once for this module."""
    calls = []

    def counted(source, options=None, **kwargs):
        calls.append(options.target)
        return real_result

    monkeypatch.setattr(pipeline, "compile_source", counted)
    return calls


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside" / "secret.bin"
    path.parent.mkdir()
    path.write_bytes(OUTSIDE)
    return path


@pytest.fixture
def root(tmp_path):
    return tmp_path / "cache"


def _meta(path: Path) -> dict:
    return json.loads((path / "bundle.json").read_text())


def _set_meta(path: Path, **changes) -> None:
    meta = _meta(path) | changes
    (path / "bundle.json").write_text(json.dumps(meta))


def _relative_to_outside(bundle_path: Path, outside: Path) -> str:
    return os.path.relpath(outside, bundle_path)


# Each damage takes (bundle dir, outside file) and breaks the bundle the way its name says.
def _truncate(path: Path, name: str) -> None:
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])


def _garbage(path: Path, name: str) -> None:
    size = (path / name).stat().st_size
    (path / name).write_bytes(bytes((i * 131 + 7) % 256 for i in range(size)))


def _dir_to_file(path: Path, _outside) -> None:
    shutil.rmtree(path)
    path.write_text("not a bundle")


def _symlinked_code(path: Path, outside: Path) -> None:
    # The symlink's target even holds the right bytes: it must be refused for being a symlink.
    outside.write_bytes((path / "kernels.hsaco").read_bytes())
    os.unlink(path / "kernels.hsaco")
    os.symlink(outside, path / "kernels.hsaco")


def _drop_field(path: Path, name: str) -> None:
    meta = _meta(path)
    del meta[name]
    (path / "bundle.json").write_text(json.dumps(meta))


def _kernel_param_type(path: Path, _outside) -> None:
    meta = _meta(path)
    meta["kernels"]["ring_put_signal"]["params"][0]["type"] = "index"
    (path / "bundle.json").write_text(json.dumps(meta))


DAMAGES = {
    "bundle.json truncated": lambda p, o: _truncate(p, "bundle.json"),
    "bundle.json empty": lambda p, o: (p / "bundle.json").write_bytes(b""),
    "bundle.json garbage": lambda p, o: _garbage(p, "bundle.json"),
    "bundle.json not an object": lambda p, o: (p / "bundle.json").write_text("[1, 2]"),
    "bundle.json nested too deep": lambda p, o: (p / "bundle.json").write_text("[" * 100_000),
    "bundle.json not UTF-8": lambda p, o: (p / "bundle.json").write_bytes(b'{"format": "\xff"}'),
    "metadata deleted": lambda p, o: os.unlink(p / "bundle.json"),
    "code object deleted": lambda p, o: os.unlink(p / "kernels.hsaco"),
    "bundle dir replaced by a file": _dir_to_file,
    "bundle dir empty": lambda p, o: (shutil.rmtree(p), p.mkdir()),
    "code object truncated": lambda p, o: _truncate(p, "kernels.hsaco"),
    "code object empty": lambda p, o: (p / "kernels.hsaco").write_bytes(b""),
    "code object garbage": lambda p, o: _garbage(p, "kernels.hsaco"),
    "code object a directory": lambda p, o: (os.unlink(p / "kernels.hsaco"), (p / "kernels.hsaco").mkdir()),
    "empty kernel table": lambda p, o: _set_meta(p, kernels={}),
    "kernel with an unknown parameter type": _kernel_param_type,
    "changed target": lambda p, o: _set_meta(p, target="gfx950"),
    "backend not the target's": lambda p, o: _set_meta(p, backend="nvvm"),
    "old bundle format": lambda p, o: _set_meta(p, format=1),
    "key other than the directory": lambda p, o: _set_meta(p, key="0" * 64),
    "key not a key": lambda p, o: _set_meta(p, key="../../elsewhere"),
    "hash missing": lambda p, o: _drop_field(p, "binary_sha256"),
    "binary with ../ traversal": lambda p, o: _set_meta(p, binary=_relative_to_outside(p, o)),
    "binary an absolute path": lambda p, o: _set_meta(p, binary=str(o)),
    "binary a symlink": _symlinked_code,
    "binary the directory itself": lambda p, o: _set_meta(p, binary="."),
}


def _compile(example_source, root, **kw) -> rt.Bundle:
    return cache.compile_bundle(example_source, OPTIONS, cache_root=root, **kw)


def _only_damage_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DamagedBundleWarning)]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_compiler_reports_discards_and_rebuilds(damage, example_source, root, outside, compiles, real_result, opened):
    first = _compile(example_source, root)
    assert compiles == ["gfx942"]
    DAMAGES[damage](first.path, outside)
    opened.clear()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rebuilt = _compile(example_source, root)
    messages = _only_damage_warnings(record)
    assert len(messages) == 1, messages
    assert str(first.path) in messages[0] and "discarded and rebuilt" in messages[0]
    assert compiles == ["gfx942", "gfx942"]
    assert str(outside.resolve()) not in opened, "a file outside the cache was opened"
    assert rebuilt.path == first.path
    again = load_bundle(rebuilt.path, key=first.key, target="gfx942")
    assert again.binary == real_result.binary == rebuilt.binary
    assert set(again.kernels) == {"ring_put_signal"}
    assert outside.read_bytes() in (OUTSIDE, real_result.binary)  # never written through the cache
    assert not [p for p in (root / "bundles").iterdir() if p.name.startswith((".tmp-", ".discarded-"))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the repaired bundle is used silently, not compiled again
        assert _compile(example_source, root) == rebuilt
    assert len(compiles) == 2


@pytest.fixture
def opened(monkeypatch):
    """Every path opened through os.open or open() while the fixture is active (resolved)."""
    seen = []
    real_os_open, real_open = os.open, builtins.open

    def os_open(path, *args, dir_fd=None, **kwargs):
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else ""
        seen.append(os.path.realpath(os.path.join(base, path)))
        return real_os_open(path, *args, dir_fd=dir_fd, **kwargs)

    def py_open(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)):
            seen.append(os.path.realpath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    return seen


def _runtime_only(monkeypatch):
    monkeypatch.setattr(cache, "compiler_available", lambda: False)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_runtime_refuses_a_damaged_bundle(damage, example_source, root, outside, compiles, monkeypatch, opened):
    first = _compile(example_source, root)
    DAMAGES[damage](first.path, outside)
    _runtime_only(monkeypatch)
    opened.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(MoriCompilerError) as info:
            cache.get_bundle(example_source, OPTIONS, cache_root=root, what="ring_put_signal")
    message = str(info.value)
    assert str(first.path) in message, message
    assert "damaged precompiled bundle for ring_put_signal" in message
    assert "mori-compile --precompile" in message and "compiler is not installed" in message
    assert OUTSIDE.decode().strip() not in message
    assert str(outside.resolve()) not in opened, "a file outside the cache was opened"
    assert all(p.startswith(str(root.resolve())) for p in opened), opened
    assert os.path.lexists(first.path)  # a runtime refuses; it does not delete what it cannot rebuild
    assert len(compiles) == 1


def test_runtime_loads_an_intact_bundle_through_the_index(example_source, root, compiles, monkeypatch):
    first = _compile(example_source, root)
    _runtime_only(monkeypatch)
    found = cache.get_bundle(example_source, OPTIONS, cache_root=root, kernels=("ring_put_signal",))
    assert found == first and found.binary == first.binary
    with pytest.raises(MoriCompilerError, match=r"lacks the expected kernels nope"):
        cache.get_bundle(example_source, OPTIONS, cache_root=root, kernels=("nope",))


# ----------------------------------------------------------------------------------------------------
# The index
# ----------------------------------------------------------------------------------------------------


def test_runtime_refuses_an_index_entry_that_leads_to_another_valid_bundle(example_source, root, compiles,
                                                                            monkeypatch):  # fmt: skip
    """Kernel names alone do not tell two configs apart (an EP bundle for hidden 256 has the names of one for
    hidden 7168): an index entry that names another intact bundle is refused, not launched."""
    other_source = example_source + "\n// another source, the same kernels\n"
    first, other = _compile(example_source, root), _compile(other_source, root)
    assert first.key != other.key and set(first.kernels) == set(other.kernels)
    _index_file(root, example_source).write_text(other.key)
    _runtime_only(monkeypatch)
    with pytest.raises(MoriCompilerError, match="built from another source or other options") as info:
        cache.get_bundle(example_source, OPTIONS, cache_root=root, what="ring_put_signal", kernels=("ring_put_signal",))
    assert str(other.path) in str(info.value)
    assert cache.get_bundle(other_source, OPTIONS, cache_root=root) == other  # its own entry still works


def _index_file(root: Path, example_source: str) -> Path:
    return rt.index_path(root, cache.bundle_request(example_source, OPTIONS))


INDEX_DAMAGES = {
    "garbage": lambda p, o: p.write_bytes(b"\xff\xfe garbage \x00"),
    "a relative path": lambda p, o: p.write_text("../../../../outside"),
    "an absolute path": lambda p, o: p.write_text(str(o.parent)),
    "empty": lambda p, o: p.write_text(""),
    "a key too short": lambda p, o: p.write_text("ab" * 20),
    "a symlink out of the cache": lambda p, o: (os.unlink(p), os.symlink(o, p)),
    "a directory": lambda p, o: (os.unlink(p), p.mkdir()),
    "a key whose bundle is missing": lambda p, o: p.write_text("cd" * 32),
}


@pytest.mark.parametrize("damage", sorted(INDEX_DAMAGES))
def test_damaged_index_entry(damage, example_source, root, outside, compiles, monkeypatch, opened):
    first = _compile(example_source, root)
    entry = _index_file(root, example_source)
    INDEX_DAMAGES[damage](entry, outside)
    # Runtime only: a clear error naming the entry (or the bundle it names), nothing outside read.
    _runtime_only(monkeypatch)
    opened.clear()
    with pytest.raises(MoriCompilerError) as info:
        cache.get_bundle(example_source, OPTIONS, cache_root=root)
    assert str(entry) in str(info.value)
    assert str(outside.resolve()) not in opened and str(outside.parent.resolve()) not in opened
    # Compiler present: the bundle is intact, so it is reused; a damaged entry is reported once and rewritten.
    monkeypatch.setattr(cache, "compiler_available", lambda: True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = cache.get_bundle(example_source, OPTIONS, cache_root=root)
    messages = _only_damage_warnings(record)
    if damage == "a key whose bundle is missing":
        assert messages == []  # a well-formed entry, just stale: rewritten silently
    else:
        assert len(messages) == 1 and str(entry) in messages[0], messages
    assert again == first and len(compiles) == 1
    assert entry.read_text() == first.key
    _runtime_only(monkeypatch)
    assert cache.get_bundle(example_source, OPTIONS, cache_root=root) == first


def test_lookups_never_use_a_non_key_as_a_path(root):
    for bad in ("../x", "/etc", "AB" * 32, "ab" * 31, ""):
        with pytest.raises(ValueError, match="64 hex digits"):
            rt.find_bundle(root, bad)
        with pytest.raises(ValueError, match="64 hex digits"):
            rt.find_bundle_by_request(root, bad)
        with pytest.raises(ValueError, match="64 hex digits"):
            rt.record_request(root, "ab" * 32, bad)


def test_publish_refuses_what_it_could_not_load(root):
    kernel = rt.KernelInfo("k", (rt.KernelParam("arg0", "ptr"),))
    common = dict(target="gfx942", backend="rocdl", kernels=[kernel])
    with pytest.raises(BundleError, match="not an ELF file"):
        rt.publish_bundle(root, "ab" * 32, binary=b"garbage", **common)
    with pytest.raises(BundleError, match="is empty"):
        rt.publish_bundle(root, "ab" * 32, binary=b"", **common)
    with pytest.raises(BundleError, match="no kernels"):
        rt.publish_bundle(root, "ab" * 32, binary=b"\x7fELF", target="gfx942", backend="rocdl", kernels=[])
    assert not (root / "bundles" / ("ab" * 32)).exists()


def test_a_fifo_is_refused_without_blocking(root, example_source, compiles):
    first = _compile(example_source, root)
    os.unlink(first.path / "kernels.hsaco")
    os.mkfifo(first.path / "kernels.hsaco")
    with pytest.raises(BundleError, match="kernels.hsaco is not a regular file"):
        load_bundle(first.path)


# ----------------------------------------------------------------------------------------------------
# Concurrent compiles of one bundle
# ----------------------------------------------------------------------------------------------------


def _compile_in_child(source: str, root: str, marker: str, barrier) -> tuple[str, str, int]:
    """A rank: count its real compiles in ``marker``, start with the others, compile the same bundle; returns
    the bundle's key, its code object's SHA-256 and how many damage warnings this rank saw."""
    import time

    from mori_compiler import cache as child_cache
    from mori_compiler import pipeline as child_pipeline

    real = child_pipeline.compile_source

    def counted(*args, **kwargs):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # a slow compile: the other ranks are waiting on the lock meanwhile
        return real(*args, **kwargs)

    child_pipeline.compile_source = counted
    barrier.wait()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        bundle = child_cache.compile_bundle(source, CompileOptions(target="gfx942"), cache_root=root)
    return bundle.key, hashlib.sha256(bundle.binary).hexdigest(), len(_only_damage_warnings(record))


def _run_ranks(ranks: int, source: str, root: Path, marker: Path) -> list[tuple[str, str, int]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(ranks)
    with ctx.Pool(ranks) as pool:
        return pool.starmap(_compile_in_child, [(source, str(root), str(marker), barrier)] * ranks)


@pytest.mark.slow
def test_concurrent_ranks_compile_a_bundle_once(tmp_path, example_source):
    marker, root = tmp_path / "compiles.txt", tmp_path / "cache"
    results = _run_ranks(3, example_source, root, marker)
    assert len(marker.read_text().splitlines()) == 1, marker.read_text()
    assert len(set(results)) == 1
    key, digest, warned = results[0]
    assert warned == 0
    bundle = load_bundle(root / "bundles" / key, key=key, target="gfx942")
    assert hashlib.sha256(bundle.binary).hexdigest() == digest
    assert sorted(p.name for p in (root / "bundles").iterdir()) == [key]


@pytest.mark.slow
def test_concurrent_ranks_repair_a_damaged_bundle_once(tmp_path, example_source):
    """Ranks that all find the same damaged bundle: one reports it, discards it and compiles; the others
    wait on the lock and load the new one."""
    root = tmp_path / "cache"
    first = cache.compile_bundle(example_source, OPTIONS, cache_root=root)
    _garbage(first.path, "kernels.hsaco")
    marker = tmp_path / "compiles.txt"
    results = _run_ranks(3, example_source, root, marker)
    assert len(marker.read_text().splitlines()) == 1, marker.read_text()
    assert sum(warned for _, _, warned in results) == 1
    assert {(key, digest) for key, digest, _ in results} == {(first.key, hashlib.sha256(first.binary).hexdigest())}
    assert sorted(p.name for p in (root / "bundles").iterdir()) == [first.key]


# ----------------------------------------------------------------------------------------------------
# Warm start: the cache is consulted before the compiler is imported
# ----------------------------------------------------------------------------------------------------

_WARM = r"""
import json, sys
from mori_compiler.ops import EpDispatchCombineConfig, ep_bundle
b = ep_bundle(EpDispatchCombineConfig(**json.loads(sys.argv[2])), "sm_90", virtual_pes=True, cache_root=sys.argv[1])
loaded = sorted(m for m in ("mlir", "llvmlite", "numpy", "torch", "importlib.metadata", "mori_compiler.pipeline",
                            "mori_compiler.passes", "mori_compiler.ops.dispatch_combine") if m in sys.modules)
print(b.key, ",".join(loaded) or "-")
"""

WARM_CONFIG = dict(data_type="bf16", rank=0, world_size=2, hidden_dim=256, scale_dim=0, scale_type_size=0,
                   max_token_type_size=2, max_num_inp_token_per_rank=8, num_experts_per_rank=2,
                   num_experts_per_token=2)  # fmt: skip


def test_warm_start_imports_no_compiler(tmp_path):
    """A new process that finds the op's bundle in the cache loads neither MLIR, the passes, the op class nor
    importlib.metadata: the key is computed and the bundle verified first."""
    from mori_compiler.ops import EpDispatchCombineConfig, ep_bundle

    first = ep_bundle(EpDispatchCombineConfig(**WARM_CONFIG), "sm_90", virtual_pes=True, cache_root=tmp_path / "c")
    proc = subprocess.run([sys.executable, "-c", _WARM, str(tmp_path / "c"), json.dumps(WARM_CONFIG)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [first.key, "-"]


def test_toolchain_versions_are_read_without_importlib_metadata(monkeypatch):
    from importlib.metadata import version

    assert cache.installed_version("mlir", "xtc-mlir-python-bindings") == version("xtc-mlir-python-bindings")
    assert cache.installed_version("llvmlite", "llvmlite") == version("llvmlite")
    assert cache.installed_version("no_such_package_here", "nothing") == "unknown"


def test_a_bundle_replaced_while_it_is_read_is_never_mixed_with_the_new_one(root, example_source, compiles,
                                                                            monkeypatch):  # fmt: skip
    """Metadata and code object come from one directory, even if it is renamed and replaced in between."""
    first = _compile(example_source, root)
    real_loads = rt.json.loads

    def swap_then_parse(raw):
        aside = first.path.parent / ".aside"
        os.rename(first.path, aside)
        shutil.copytree(aside, first.path)
        _garbage(first.path, "kernels.hsaco")  # the replacement's code object does not match the old metadata
        return real_loads(raw)

    monkeypatch.setattr(rt.json, "loads", swap_then_parse)
    loaded = load_bundle(first.path, key=first.key)
    assert loaded.binary == first.binary


def test_an_unwritable_cache_is_a_clear_error(tmp_path, example_source, compiles):
    root = tmp_path / "cache"
    root.mkdir()
    (root / "bundles").write_text("a file where the bundles folder should be")
    with pytest.raises(MoriCompilerError, match=r"cannot write the kernel cache at .*cache"):
        _compile(example_source, root)
