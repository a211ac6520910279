"""The project's device library: building and caching it, its state layout, and its ABI signatures."""

from __future__ import annotations

import re
import struct
from importlib.resources import files

import pytest

from mori_compiler.lib_bitcode import cached, library, state
from mori_compiler.lib_bitcode.abi import ABI_BY_SYMBOL
from mori_compiler.targets import TARGETS, get_target

llvm = pytest.importorskip("llvmlite.binding")

ALL_TARGETS = sorted(TARGETS)
RECORD = cached.RECORD_SUFFIX
SOURCES = files("mori_compiler.lib_bitcode").joinpath("sources")
PRELUDES = ("prelude_amdgcn.ll", "prelude_nvptx.ll")
CHECKED_FUNCTIONS = (
    "mori_shmem_my_pe",
    "mori_shmem_n_pes",
    "mori_shmem_putmem_nbi_signal_block",
    "mori_shmem_uint64_wait_until_greater_than",
    "mori_shmem_quiet_thread",
    "mori_shmem_fence_thread",
)
STATE_GEP = re.compile(
    r"(%[\w.]+) = getelementptr (?:inbounds )?i8, ptr addrspace\(1\) @" + state.STATE_SYMBOL + r", i64 (\d+)"
)


def _source_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in SOURCES.iterdir() if p.name.endswith(".ll")}


# ----------------------------------------------------------------------------------------------------
# Build and cache
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_library_path_builds_once_and_caches(target, session_cache_dir, monkeypatch):
    path = library.library_path(target)
    assert path.is_file()
    assert path.name == library.LIBRARY_NAME
    assert path.parent.parent == session_cache_dir / "lib"
    assert path.parent.name == f"{target}-{library.library_hash(get_target(target))}"
    mtime = path.stat().st_mtime_ns

    def must_not_build(t):
        raise AssertionError(f"library for {t.name} rebuilt although cached")

    monkeypatch.setattr(library, "build_library", must_not_build)
    assert library.library_path(target) == path
    assert library.library_path(get_target(target)) == path
    assert path.stat().st_mtime_ns == mtime
    # Only the library and its content record: no temporary files.
    assert sorted(p.name for p in path.parent.iterdir()) == [library.LIBRARY_NAME, library.LIBRARY_NAME + RECORD]


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_published_library_is_complete_bitcode(target):
    data = library.library_path(target).read_bytes()
    module = llvm.parse_bitcode(data)
    module.verify()
    t = get_target(target)
    assert module.triple == t.triple
    # The cached file holds what a fresh build holds (the bytes may differ: llvmlite's shared context).
    fresh = llvm.parse_bitcode(library.build_library(t))
    assert sorted(str(f) for f in module.functions) == sorted(str(f) for f in fresh.functions)
    assert sorted(str(g) for g in module.global_variables) == sorted(str(g) for g in fresh.global_variables)


def test_cache_key_follows_the_source_text(monkeypatch, tmp_path):
    """The key covers every file the library is generated from: an edited source (here a copy of the
    prelude with one more comment) gives another key and another, freshly built library."""
    t = get_target("gfx942")
    before_hash, before_path = library.library_hash(t), library.library_path(t)
    files = library._generator_files()
    assert any(f.name == "wrappers.py" for f in files) and any(f.name == "prelude_amdgcn.ll" for f in files)
    edited = tmp_path / "prelude_amdgcn.ll"
    edited.write_text(library._source("prelude_amdgcn.ll") + "\n; an edited comment\n")
    monkeypatch.setattr(library, "_generator_files", lambda: [edited if f.name == edited.name else f for f in files])
    after_hash = library.library_hash(t)
    assert after_hash != before_hash
    after_path = library.library_path(t)
    assert after_path != before_path and after_path.is_file()
    assert after_path.parent.name == f"gfx942-{after_hash}"


def test_cache_key_separates_targets():
    hashes = {library.library_hash(get_target(t)) for t in ALL_TARGETS}
    assert len(hashes) == len(ALL_TARGETS)
    # gfx942 and gfx950 share an IR text but not a library: the hash covers the target name.
    assert library.library_ir(get_target("gfx942")) == library.library_ir(get_target("gfx950"))


def test_library_path_rejects_unknown_target():
    from mori_compiler.errors import MoriCompilerError

    with pytest.raises(MoriCompilerError, match="unknown target 'gfx1'"):
        library.library_path("gfx1")


# ----------------------------------------------------------------------------------------------------
# A damaged cached library is reported once, discarded and rebuilt; concurrent builders build it once
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path))
    cached._warned.clear()
    return tmp_path


def _damage(path, how: str) -> None:
    import shutil

    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
    elif how == "same-size-garbage":
        path.write_bytes(b"\xde" * len(data))
    elif how == "deleted":
        path.unlink()
    elif how == "record-deleted":
        path.with_name(path.name + RECORD).unlink()
    elif how == "record-garbage":
        path.with_name(path.name + RECORD).write_bytes(b"\xff\xfe not a record")
    elif how == "directory":
        path.unlink()
        path.mkdir()
        (path / "x").write_text("x")
    elif how == "folder-is-a-file":
        shutil.rmtree(path.parent)
        path.parent.write_text("not a folder")
    elif how == "lib-is-a-file":
        shutil.rmtree(path.parent.parent)
        path.parent.parent.write_text("not a folder")
    else:
        raise AssertionError(how)


DAMAGE = ("truncated", "empty", "garbage", "same-size-garbage", "deleted", "record-deleted", "record-garbage",
          "directory", "folder-is-a-file", "lib-is-a-file")  # fmt: skip


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_library_is_warned_once_discarded_and_rebuilt(fresh_cache, how):
    path = library.library_path("gfx942")
    good = path.read_bytes()
    _damage(path, how)
    with pytest.warns(cached.DeviceLibraryCacheWarning) as caught:
        again = library.library_path("gfx942")
    assert again == path
    messages = [str(w.message) for w in caught if issubclass(w.category, cached.DeviceLibraryCacheWarning)]
    assert len(messages) == 1, messages
    assert "device library for gfx942" in messages[0] and "discarded, rebuilding it" in messages[0]
    rebuilt = path.read_bytes()
    assert len(rebuilt) == len(good)
    llvm.parse_bitcode(rebuilt).verify()
    # Once rebuilt it is used as it is: no second warning, no rebuild.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert library.library_path("gfx942") == path
    assert path.read_bytes() == rebuilt


def test_each_damage_names_its_problem(fresh_cache):
    path = library.library_path("gfx942")
    expected = {"truncated": "does not match its content record", "empty": "is empty",
                "record-deleted": "has no content record", "directory": "is not a regular file"}  # fmt: skip
    for how, problem in expected.items():
        cached._warned.clear()
        _damage(path, how)
        with pytest.warns(cached.DeviceLibraryCacheWarning, match=problem):
            library.library_path("gfx942")


def test_unwritable_cache_is_a_clear_error(fresh_cache, monkeypatch):
    from mori_compiler.errors import MoriCompilerError

    (fresh_cache / "lib").mkdir()
    monkeypatch.setattr(cached, "write_atomically", _raise_permission_error)
    with pytest.raises(MoriCompilerError, match="cannot write the device library for gfx942 cache"):
        library.library_path("gfx942")


def _raise_permission_error(path, data):
    raise PermissionError(13, "Permission denied", str(path))


_CONCURRENT_BUILD = """
import sys, time
from mori_compiler.lib_bitcode import library
original = library.build_library
def slow_build(target):
    with open(sys.argv[1], "a") as log:
        log.write("build\\n")
    time.sleep(0.5)  # long enough that the other process arrives while this one builds
    return original(target)
library.build_library = slow_build
print(library.library_path("gfx942"))
"""


def test_concurrent_builders_build_once(fresh_cache, tmp_path):
    import os
    import subprocess
    import sys

    log = tmp_path / "builds.log"
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(fresh_cache))
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT_BUILD, str(log)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]  # fmt: skip
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    assert log.read_text().count("build") == 1, "the library was built more than once"
    assert not any(err.strip() for _, err in outputs), outputs  # nobody saw a damaged file
    data = open(paths.pop(), "rb").read()
    llvm.parse_bitcode(data).verify()


def test_lowering_support_bitcode(fresh_cache):
    """The AMDGPU lowering-support bitcode defines exactly the two ockl queries, mergeable (linkonce_odr)."""
    path = library.lowering_support_path("gfx942")
    assert path.parent.parent == fresh_cache / "lib"
    module = llvm.parse_bitcode(path.read_bytes())
    defined = {f.name: f for f in module.functions if not f.is_declaration}
    exported = sorted(n for n, f in defined.items() if f.linkage != llvm.Linkage.internal)
    assert exported == ["__ockl_get_local_size", "__ockl_get_num_groups"]
    assert all(defined[n].linkage == llvm.Linkage.linkonce_odr for n in exported)
    assert library.lowering_support_path("gfx942") == path
    from mori_compiler.errors import MoriCompilerError

    with pytest.raises(MoriCompilerError, match="sm_90 needs no lowering-support bitcode"):
        library.lowering_support_path("sm_90")
    with pytest.raises(MoriCompilerError, match="code object v5/v6; code object version 4 lays them out"):
        library.lowering_support_path("gfx942", 4)


# ----------------------------------------------------------------------------------------------------
# The device state: one layout for the sources, the runtime and the compiler
# ----------------------------------------------------------------------------------------------------


def test_state_offsets_used_by_the_sources_are_fields():
    fields = {f.offset: f for f in state.STATE_FIELDS}
    used = set()
    for name, text in _source_texts().items():
        for m in STATE_GEP.finditer(text):
            value, offset = m.group(1), int(m.group(2))
            assert offset in fields, f"{name}: offset {offset} of {state.STATE_SYMBOL} is no field of STATE_FIELDS"
            used.add(offset)
            # Every load through that pointer reads the field's width.
            field = fields[offset]
            size = struct.calcsize("<" + field.struct_format)
            function_rest = text[m.end() : text.find("\n}", m.end())]
            for load in re.finditer(rf"= load (\w+), ptr addrspace\(1\) {re.escape(value)}\b", function_rest):
                ty = load.group(1)
                width = {"i8": 1, "i16": 2, "i32": 4, "i64": 8, "ptr": 8}[ty]
                assert width == size, f"{name}: {ty} load of field {field.name} ({size} bytes)"
        # A load straight from the global reads field 0.
        direct = re.findall(rf"= load (\w+), ptr addrspace\(1\) @{state.STATE_SYMBOL}\b", text)
        assert all(ty == "i32" for ty in direct) and state.STATE_FIELDS[0].struct_format in "iI", name
        # Every other mention of the global is its definition: no access escapes the checks above.
        mentions = len(re.findall(rf"@{state.STATE_SYMBOL}\b", text))
        definitions = len(re.findall(rf"^@{state.STATE_SYMBOL} = ", text, re.MULTILINE))
        assert mentions == definitions + len(STATE_GEP.findall(text)) + len(direct), name
    assert used, "the sources use no state field"
    assert {state.field_offset("n_pes"), state.field_offset("flags"), state.field_offset("heap_bases")} <= used


@pytest.mark.parametrize("prelude", PRELUDES)
def test_state_global_in_both_preludes(prelude):
    text = SOURCES.joinpath(prelude).read_text()
    decls = re.findall(rf"^@{state.STATE_SYMBOL} = (.*)$", text, re.MULTILINE)
    assert len(decls) == 1, decls
    m = re.fullmatch(r"addrspace\(1\) externally_initialized global \[(\d+) x i8\] zeroinitializer, align (\d+)",
                     decls[0])  # fmt: skip
    assert m, decls[0]
    assert int(m.group(1)) == state.STATE_SIZE == 64
    assert int(m.group(2)) == state.STATE_ALIGN


@pytest.mark.parametrize("target", ["gfx942", "sm_90"])
def test_state_global_in_the_library(target):
    module = llvm.parse_bitcode(library.library_path(target).read_bytes())
    gv = module.get_global_variable(state.STATE_SYMBOL)
    assert str(gv.global_value_type) == f"[{state.STATE_SIZE} x i8]"
    assert not gv.is_declaration
    assert "addrspace(1)" in str(gv)


def test_state_layout_is_packed_and_ordered():
    offset = 0
    for f in state.STATE_FIELDS:
        assert f.offset == offset, f.name
        offset += struct.calcsize("<" + f.struct_format)
    assert offset == state.STATE_SIZE == struct.calcsize(state.STATE_FORMAT)
    assert len({f.name for f in state.STATE_FIELDS}) == len(state.STATE_FIELDS)


def test_pack_unpack_round_trip():
    values = {"rank": 3, "n_pes": 8, "flags": state.FLAG_VIRTUAL_PES, "heap_size": 1 << 30,
              "heap_bases": 0x7F00_0000_1000, "sync_words": 0x7F00_0000_2000, "wait_limit": 10**6,
              "wait_report": 0x7F00_0000_3000}  # fmt: skip
    data = state.pack_state(**values)
    assert len(data) == state.STATE_SIZE
    assert state.unpack_state(data) == {f.name: values.get(f.name, 0) for f in state.STATE_FIELDS}
    # Little endian, at the documented offsets.
    assert data[state.field_offset("n_pes") : state.field_offset("n_pes") + 4] == (8).to_bytes(4, "little")
    assert data[state.field_offset("heap_size") : state.field_offset("heap_size") + 8] == (1 << 30).to_bytes(8, "little")
    assert state.pack_state() == bytes(state.STATE_SIZE)
    assert state.unpack_state(data + b"trailing") == state.unpack_state(data)
    assert state.pack_state(rank=-1)[:4] == b"\xff\xff\xff\xff"


def test_pack_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown device state fields: bogus, other"):
        state.pack_state(rank=1, bogus=2, other=3)


# ----------------------------------------------------------------------------------------------------
# The library's functions have exactly the ABI's types
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ALL_TARGETS)
def library_module(request):
    return request.param, llvm.parse_bitcode(library.library_path(request.param).read_bytes())


def test_library_defines_functions_with_abi_types(library_module):
    target, module = library_module
    for symbol in CHECKED_FUNCTIONS:
        fn = module.get_function(symbol)
        assert not fn.is_declaration, f"{target}: {symbol} is only declared"
        assert str(fn.global_value_type) == ABI_BY_SYMBOL[symbol].llvm_signature, (target, symbol)


def test_every_exported_library_function_is_an_abi_function(library_module):
    target, module = library_module
    exported = {f.name for f in module.functions if not f.is_declaration and f.linkage == llvm.Linkage.external}
    # Besides the ABI, the AMDGPU library defines the two ROCm ockl work-item queries that MLIR's
    # gpu.block_dim / gpu.grid_dim lowering calls (prelude_amdgcn.ll).
    ockl = {"__ockl_get_local_size", "__ockl_get_num_groups"} if target.startswith("gfx") else set()
    assert exported - ockl <= set(ABI_BY_SYMBOL), sorted(exported - ockl - set(ABI_BY_SYMBOL))
    for name in exported - ockl:
        assert str(module.get_function(name).global_value_type) == ABI_BY_SYMBOL[name].llvm_signature, name
    missing_helpers = sorted(f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm."))
    assert missing_helpers == [], f"{target}: the library calls undefined functions {missing_helpers}"


def test_barrier_own_epoch_slot_is_max_pes():
    # sources/shmem_core.ll spells the own-epoch slot as a literal; it must stay state.MAX_PES, the slot
    # after the per-PE announcements, inside the reserved head of the heap.
    text = files("mori_compiler.lib_bitcode").joinpath("sources/shmem_core.ll").read_text()
    slots = re.findall(r"%own = getelementptr i64, ptr %area, i64 (\d+)", text)
    assert slots == [str(state.MAX_PES)]
    assert (state.MAX_PES + 1) * 8 <= state.SYNC_RESERVED_BYTES
