"""Kernel bundles and their cache: keys, reuse, bundle.json, atomic publishing and load errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mori_compiler import cache, pipeline
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
from mori_compiler.lib_bitcode.stub import write_stub_bitcode
from mori_compiler.options import CompileOptions
from mori_compiler.runtime import bundle as rt
from mori_compiler.runtime.bundle import BundleError, KernelInfo, KernelParam, load_bundle, publish_bundle

KERNEL = KernelInfo("k", (KernelParam("arg0", "ptr"), KernelParam("arg1", "i64")), (64, 1, 1))


def _tmp_entries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


def _publish(root, key="ab" * 32, binary=b"\x7fELF-test", **kw):
    args = dict(target="gfx942", backend="rocdl", binary=binary, kernels=[KERNEL], state_globals=(),
                compiler="test", config={"why": "test"})  # fmt: skip
    args.update(kw)
    return publish_bundle(root, key, **args)


# ----------------------------------------------------------------------------------------------------
# compile_bundle: reuse and keys
# ----------------------------------------------------------------------------------------------------


def test_compile_bundle_twice_reuses_the_bundle(tmp_path, example_source, monkeypatch):
    options = CompileOptions(target="gfx942")
    first = cache.compile_bundle(example_source, options, cache_root=tmp_path)
    assert first.path.parent == tmp_path / "bundles"
    mtime = (first.path / "bundle.json").stat().st_mtime_ns

    def must_not_compile(*args, **kwargs):
        raise AssertionError("compile_source called for a cached bundle")

    monkeypatch.setattr(pipeline, "compile_source", must_not_compile)
    second = cache.compile_bundle(example_source, options, cache_root=tmp_path)
    assert second.path == first.path and second.key == first.key
    assert second.binary == first.binary
    assert (first.path / "bundle.json").stat().st_mtime_ns == mtime
    assert _tmp_entries(tmp_path) == []


def test_compile_bundle_uses_the_session_cache_by_default(example_source, session_cache_dir):
    b = cache.compile_bundle(example_source, CompileOptions(target="sm_90"))
    assert b.path.parent == session_cache_dir / "bundles"
    assert b.path.name == b.key


def test_bundle_json_fields(tmp_path, example_source):
    b = cache.compile_bundle(example_source, CompileOptions(target="gfx942"), config={"kernel": "ring"},
                             cache_root=tmp_path)  # fmt: skip
    meta = json.loads((b.path / "bundle.json").read_text())
    assert meta["format"] == rt.BUNDLE_FORMAT == 3
    assert meta["key"] == b.key == b.path.name
    assert meta["target"] == "gfx942" and meta["backend"] == "rocdl" and meta["binary"] == "kernels.hsaco"
    assert meta["compiler"] == cache.toolchain_fingerprint()
    kernel = meta["kernels"]["ring_put_signal"]
    assert [p["type"] for p in kernel["params"]] == ["ptr", "ptr", "ptr", "i64", "i64"]
    assert [p["size"] for p in kernel["params"]] == [8, 8, 8, 8, 8]
    assert [p["name"] for p in kernel["params"]] == ["arg0", "arg1", "arg2", "arg3", "arg4"]  # no mori.name
    assert [p["named"] for p in kernel["params"]] == [False] * 5
    assert kernel["block"] == [256, 1, 1]
    assert meta["state_globals"] == [{"symbol": STATE_SYMBOL, "size": STATE_SIZE}]
    assert meta["config"]["kernel"] == "ring"
    assert meta["config"]["options"]["target"] == "gfx942"
    assert (b.path / "kernels.hsaco").read_bytes()[:4] == b"\x7fELF"
    code_hash = hashlib.sha256((b.path / "kernels.hsaco").read_bytes()).hexdigest()
    assert meta["binary_sha256"] == code_hash == b.binary_sha256
    # What load_bundle makes of it.
    assert b.kernel("ring_put_signal").params[3] == KernelParam("arg3", "i64")
    assert b.kernel("ring_put_signal").block == (256, 1, 1)
    assert b.state_globals == ({"symbol": STATE_SYMBOL, "size": STATE_SIZE},)
    with pytest.raises(BundleError, match="has no kernel 'nope'"):
        b.kernel("nope")


def test_nvptx_bundle(tmp_path, example_source):
    b = cache.compile_bundle(example_source, CompileOptions(target="sm_90"), cache_root=tmp_path)
    assert (b.target, b.backend, b.binary_file) == ("sm_90", "nvvm", "kernels.ptx")
    assert b.binary.decode().startswith("//")


def test_bundle_with_foreign_bitcode_declares_no_state_global(tmp_path, example_source):
    lib = write_stub_bitcode(tmp_path / "stub.bc", "amdgcn-amd-amdhsa")
    b = cache.compile_bundle(example_source, CompileOptions(bitcode=(str(lib),)), cache_root=tmp_path / "c")
    assert b.state_globals == ()


@pytest.fixture(scope="module")
def stub_libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("stubs")
    a = write_stub_bitcode(d / "a.bc", "amdgcn-amd-amdhsa")
    a_copy = d / "elsewhere" / "a.bc"
    a_copy.parent.mkdir()
    a_copy.write_bytes(a.read_bytes())
    b = write_stub_bitcode(d / "b.bc", "amdgcn-amd-amdhsa", define_state=False)
    return a, a_copy, b


def test_bundle_key_depends_on_what_goes_in(example_source, stub_libs):
    a, a_copy, b = stub_libs
    base = CompileOptions()
    key = cache.bundle_key(example_source, base, [str(a)])
    assert len(key) == 64 and key == cache.bundle_key(example_source, base, [str(a)])
    different = {
        "opt level": cache.bundle_key(example_source, CompileOptions(opt_level=2), [str(a)]),
        "target": cache.bundle_key(example_source, CompileOptions(target="gfx950"), [str(a)]),
        "code object version": cache.bundle_key(example_source, CompileOptions(code_object_version=5), [str(a)]),
        "device library flag": cache.bundle_key(example_source, CompileOptions(device_library=False), [str(a)]),
        "source": cache.bundle_key(example_source + "\n// changed\n", base, [str(a)]),
        "bitcode content": cache.bundle_key(example_source, base, [str(b)]),
        "no bitcode": cache.bundle_key(example_source, base, []),
        "config": cache.bundle_key(example_source, base, [str(a)], {"kernel": "x"}),
    }
    for what, other in different.items():
        assert other != key, what
    assert len(set(different.values())) == len(different)
    # The bitcode's content counts, never its path.
    assert cache.bundle_key(example_source, base, [str(a_copy)]) == key
    assert cache.bundle_key(example_source, CompileOptions(bitcode=(str(a),)), [str(a)]) == cache.bundle_key(
        example_source, CompileOptions(bitcode=(str(a_copy),)), [str(a_copy)])  # fmt: skip


def test_bundle_key_follows_the_toolchain(example_source, monkeypatch):
    key = cache.bundle_key(example_source, CompileOptions(), [])
    monkeypatch.setattr(cache, "toolchain_fingerprint", lambda: "another toolchain")
    assert cache.bundle_key(example_source, CompileOptions(), []) != key


def test_bundle_key_follows_the_compilers_own_sources(tmp_path, monkeypatch):
    """A changed lowering (same version number) must not reuse binaries of the old one."""
    files = cache.codegen_source_files()
    names = {(f.parent.name, f.name) for f in files}
    assert {("passes", "ep_ll_kernels.py"), ("passes", "gpu_kernels.py"), ("dialects", "mori_ep.irdl.mlir"),
            ("mori_compiler", "pipeline.py"), ("mori_compiler", "ep_schema.py")} <= names  # fmt: skip
    digest = cache.compiler_source_digest()
    assert digest in cache.toolchain_fingerprint()
    copy = tmp_path / files[-1].name
    copy.write_bytes(files[-1].read_bytes())
    monkeypatch.setattr(cache, "codegen_source_files", lambda: files[:-1] + [copy])
    assert cache.compiler_source_digest() == digest
    copy.write_bytes(copy.read_bytes() + b"# an edit")
    assert cache.compiler_source_digest() != digest


def test_changed_bitcode_content_recompiles(tmp_path, example_source):
    lib = tmp_path / "lib.bc"
    write_stub_bitcode(lib, "amdgcn-amd-amdhsa")
    first = cache.compile_bundle(example_source, CompileOptions(bitcode=(str(lib),)), cache_root=tmp_path / "c")
    write_stub_bitcode(lib, "amdgcn-amd-amdhsa", define_state=False)  # same path, other content
    second = cache.compile_bundle(example_source, CompileOptions(bitcode=(str(lib),)), cache_root=tmp_path / "c")
    assert second.key != first.key
    assert len(list((tmp_path / "c" / "bundles").iterdir())) == 2


# ----------------------------------------------------------------------------------------------------
# publish_bundle
# ----------------------------------------------------------------------------------------------------


def test_publish_leaves_no_temporary_directories(tmp_path):
    b = _publish(tmp_path)
    assert b.path == tmp_path / "bundles" / ("ab" * 32)
    assert sorted(p.name for p in b.path.iterdir()) == ["bundle.json", "kernels.hsaco"]
    assert _tmp_entries(tmp_path) == []
    assert b.binary == b"\x7fELF-test"
    assert b.kernels == {"k": KERNEL}


def test_publish_keeps_an_existing_bundle(tmp_path):
    first = _publish(tmp_path, binary=b"\x7fELF first")
    inode = first.path.stat().st_ino
    mtime = (first.path / "bundle.json").stat().st_mtime_ns
    second = _publish(tmp_path, binary=b"\x7fELF second")  # lost the race against an identical bundle
    assert second.path == first.path
    assert first.path.stat().st_ino == inode
    assert (first.path / "bundle.json").stat().st_mtime_ns == mtime
    assert second.binary == b"\x7fELF first"
    assert _tmp_entries(tmp_path) == []


def test_publish_failure_cleans_up(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(rt.os, "rename", fail)
    with pytest.raises(OSError, match="disk full"):
        _publish(tmp_path)
    assert _tmp_entries(tmp_path) == []
    assert not (tmp_path / "bundles" / ("ab" * 32)).exists()


def test_publish_ptx_bundle(tmp_path):
    b = _publish(tmp_path, backend="nvvm", target="sm_90", binary=b"// ptx\n")
    assert b.binary_file == "kernels.ptx" and (b.path / "kernels.ptx").read_bytes() == b"// ptx\n"


def test_find_bundle(tmp_path):
    assert rt.find_bundle(tmp_path, "cd" * 32) is None
    b = _publish(tmp_path, key="cd" * 32)
    assert rt.find_bundle(tmp_path, "cd" * 32) == b


# ----------------------------------------------------------------------------------------------------
# load_bundle errors
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def published(tmp_path):
    return _publish(tmp_path / "cache").path


def _rewrite_meta(path: Path, change) -> None:
    meta = json.loads((path / "bundle.json").read_text())
    change(meta)
    (path / "bundle.json").write_text(json.dumps(meta))


def test_load_bundle_roundtrip(published):
    b = load_bundle(published)
    assert b.key == "ab" * 32 and b.target == "gfx942" and b.config == {"why": "test"}
    assert load_bundle(str(published)) == b


def test_load_missing_directory(tmp_path):
    with pytest.raises(BundleError, match=r"no kernel bundle at .*nothing \(missing\)"):
        load_bundle(tmp_path / "nothing")


def test_load_corrupt_json(published):
    (published / "bundle.json").write_text('{"format": 2, "key": ')
    with pytest.raises(BundleError, match="corrupt metadata bundle.json"):
        load_bundle(published)


def test_load_wrong_format(published):
    _rewrite_meta(published, lambda m: m.update(format=1))
    with pytest.raises(BundleError, match="has format 1, this runtime reads 3"):
        load_bundle(published)
    _rewrite_meta(published, lambda m: m.pop("format"))
    with pytest.raises(BundleError, match="has format None"):
        load_bundle(published)


def test_a_format_2_bundle_is_never_read_as_named(published):
    # Format 2 recorded positions (arg0, ...) as names: refused, not read as the kernel's own names.
    def to_format_2(meta):
        meta["format"] = 2
        for k in meta["kernels"].values():
            for p in k["params"]:
                p.pop("named")

    _rewrite_meta(published, to_format_2)
    with pytest.raises(BundleError, match="has format 2, this runtime reads 3"):
        load_bundle(published)
    # Neither is it looked up: the format is part of the request and bundle keys.
    assert f"bundle format {rt.BUNDLE_FORMAT}" in cache.COMPILER_VERSION
    assert cache.COMPILER_VERSION in cache.toolchain_fingerprint()


@pytest.mark.parametrize("param, problem", [
    ({"type": "ptr", "named": True}, "parameter 0 needs a name"),
    ({"name": "x", "type": "ptr"}, "parameter 0 needs a name .* and named"),
    ({"name": "x", "type": "ptr", "named": "yes"}, "parameter 0 needs a name .* and named"),
    ({"name": "", "type": "ptr", "named": True}, "parameter 0 needs a name"),
])  # fmt: skip
def test_load_refuses_malformed_parameter_names(published, param, problem):
    _rewrite_meta(published, lambda m: m["kernels"]["k"].update(params=[param]))
    with pytest.raises(BundleError, match=f"kernel 'k' {problem}"):
        load_bundle(published)


@pytest.mark.parametrize("value", [0, -3, 2.5, "8", True, [8]])
def test_load_refuses_a_malformed_max_blocks(published, value):
    """A kernel's max_blocks (its launch grid's limit, kernels with collectives) must be a positive integer."""
    _rewrite_meta(published, lambda m: m["kernels"]["k"].update(max_blocks=value))
    with pytest.raises(BundleError, match=f"kernel 'k' field max_blocks must be a positive integer, got {value!r}"
                       .replace("[", r"\[").replace("]", r"\]")):  # fmt: skip
        load_bundle(published)


def test_max_blocks_round_trips_through_the_bundle(tmp_path):
    import dataclasses

    assert _publish(tmp_path / "none").kernel("k").max_blocks is None  # none recorded: any grid
    limited = dataclasses.replace(KERNEL, max_blocks=12)
    bundle = _publish(tmp_path / "cache", kernels=[limited])
    assert json.loads((bundle.path / "bundle.json").read_text())["kernels"]["k"]["max_blocks"] == 12
    assert load_bundle(bundle.path).kernel("k").max_blocks == 12
    with pytest.raises(BundleError, match="refusing to publish: kernel 'k' max_blocks must be a positive integer, got 0"):
        _publish(tmp_path / "bad", kernels=[dataclasses.replace(KERNEL, max_blocks=0)])


def test_load_refuses_a_name_given_twice(published):
    twice = [{"name": "x", "type": "ptr", "named": True}, {"name": "x", "type": "i64", "named": True}]
    _rewrite_meta(published, lambda m: m["kernels"]["k"].update(params=twice))
    with pytest.raises(BundleError, match="kernel 'k' names two parameters 'x'"):
        load_bundle(published)


def test_parameter_names_go_into_the_bundle(tmp_path):
    source = """module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%dst: !llvm.ptr {mori.name = "dst"}, %n: i32, %src: !llvm.ptr {mori.name = "src"}) kernel {
      gpu.return
    }
  }
}
"""
    b = cache.compile_bundle(source, CompileOptions(target="sm_90"), cache_root=tmp_path)
    assert b.kernel("k").params == (KernelParam("dst", "ptr", True), KernelParam("arg1", "i32", False),
                                    KernelParam("src", "ptr", True))  # fmt: skip
    meta = json.loads((b.path / "bundle.json").read_text())
    assert [(p["name"], p["named"]) for p in meta["kernels"]["k"]["params"]] == [
        ("dst", True), ("arg1", False), ("src", True)]
    for bad, problem in (('{mori.name = 3}', "mori.name must be a non-empty string, got 3"),
                         ('{mori.name = "dst"}', "names two parameters 'dst'")):  # fmt: skip
        with pytest.raises(cache.MoriCompilerError, match=f"kernel 'k' (parameter 1: )?{problem}"):
            cache.compile_bundle(source.replace("%n: i32", f"%n: i32 {bad}"), CompileOptions(target="sm_90"),
                                 cache_root=tmp_path)  # fmt: skip


def test_load_missing_binary(published):
    os.unlink(published / "kernels.hsaco")
    with pytest.raises(BundleError, match="code object kernels.hsaco is missing"):
        load_bundle(published)




@pytest.mark.parametrize("broken", ["missing kernels", "not an object", "kernel without params"])
def test_load_schema_errors_are_bundle_errors(published, broken):
    if broken == "missing kernels":
        _rewrite_meta(published, lambda m: m.pop("kernels"))
    elif broken == "not an object":
        (published / "bundle.json").write_text("[1, 2, 3]")
    else:
        _rewrite_meta(published, lambda m: m.update(kernels={"k": {}}))
    with pytest.raises(BundleError):
        load_bundle(published)


def test_load_path_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BundleError):
        load_bundle(tmp_path / "afile")


def test_kernel_parameter_a_bundle_cannot_carry_is_named(tmp_path):
    source = """module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%a: !llvm.ptr, %n: index) kernel {
      gpu.return
    }
  }
}
"""
    with pytest.raises(cache.MoriCompilerError, match=r"kernel 'k' parameter 1 has type index; bundles support"):
        cache.compile_bundle(source, CompileOptions(target="gfx942"), cache_root=tmp_path)
    assert not list(tmp_path.rglob("*.json"))  # nothing published


# ----------------------------------------------------------------------------------------------------
# ep_bundle: what it asks the cache for
# ----------------------------------------------------------------------------------------------------


def _ep_config(kind="IntraNode", **fields):
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType

    base = dict(data_type="bf16", rank=0, world_size=4, hidden_dim=1024, scale_dim=0, scale_type_size=0,
                max_token_type_size=4, max_num_inp_token_per_rank=16, num_experts_per_rank=4,
                num_experts_per_token=2, kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip
    return EpDispatchCombineConfig(**(base | fields))


@pytest.fixture
def asked(monkeypatch):
    """ep_bundle's requests to get_bundle, answered with a placeholder."""
    calls = []

    def fake_get_bundle(source, options, **kwargs):
        calls.append((source, options, kwargs))
        return "bundle"

    monkeypatch.setattr(cache, "get_bundle", fake_get_bundle)
    return calls


def test_ep_bundle_bitcode_choice(asked, stub_libs):
    from mori_compiler.ops import ep_bundle

    a, _, b = stub_libs
    ep_bundle(_ep_config(), "gfx942", virtual_pes=True)
    ep_bundle(_ep_config(), "gfx942", virtual_pes=True, bitcode=a)
    ep_bundle(_ep_config(), "gfx942", virtual_pes=False, bitcode=(str(a), b))
    options = [opts for _, opts, _ in asked]
    assert options[0].bitcode == () and options[0].virtual_pes
    assert options[1].bitcode == (str(a),)
    assert options[2].bitcode == (str(a), str(b)) and not options[2].virtual_pes
    assert asked[0][0] == asked[1][0]  # the same kernels, another library


@pytest.mark.parametrize("bad", [5, b"lib.bc", [], (), ["a.bc", 3], {"a.bc"}, True])
def test_ep_bundle_refuses_a_wrong_bitcode(asked, bad):
    from mori_compiler.ops import ep_bundle

    with pytest.raises(cache.MoriCompilerError, match=r"ep_bundle: bitcode must be None, a path or a non-empty tuple"):
        ep_bundle(_ep_config(), "gfx942", virtual_pes=True, bitcode=bad)
    assert asked == []


def test_ep_bundle_missing_bitcode_file_is_named(asked, tmp_path):
    from mori_compiler.ops import ep_bundle

    with pytest.raises(cache.MoriCompilerError, match=r"device bitcode file not found: .*nope\.bc"):
        ep_bundle(_ep_config(), "gfx942", virtual_pes=True, bitcode=tmp_path / "nope.bc")


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL"])
def test_ep_bundle_expects_the_kernels_its_source_defines(asked, kind):
    """The kernel names ep_bundle makes the cache check are the kernels the module compiles to."""
    from mori_compiler.ops import ep_bundle
    from mori_compiler.ops.asyncll import AsyncLLOptions

    asyncll = AsyncLLOptions() if kind == "AsyncLL" else None
    ep_bundle(_ep_config(kind), "sm_90", virtual_pes=True, asyncll=asyncll)
    (source, options, kwargs), = asked
    compiled = pipeline.compile_source(source, options, stop_after="ep")
    assert sorted(kwargs["kernels"]) == sorted(compiled.signatures)
    assert len(kwargs["kernels"]) >= 4


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL"])
def test_ep_kernels_take_the_schemas_parameters(kind):
    """Every kernel of a config's bundle has the parameters the EP schema gives its family (what the op's
    launches pass by name): count, types, and names where the kernel names them."""
    from types import SimpleNamespace

    from mori_compiler.ops.asyncll import AsyncLLOptions
    from mori_compiler.ops.bundle import kernel_module_source, kernel_plan
    from mori_compiler.ops.ep_launch import bundle_problems

    cfg = _ep_config(kind)
    source = kernel_module_source(cfg, 32, AsyncLLOptions() if kind == "AsyncLL" else None)
    compiled = pipeline.compile_source(source, CompileOptions(target="sm_90"), stop_after="ep")
    bundle = SimpleNamespace(key="0" * 64, kernels={n: cache.kernel_info(s) for n, s in compiled.signatures.items()})
    assert bundle_problems(bundle, kernel_plan(cfg)) == []


@pytest.mark.parametrize("bad", [dict(target=["gfx942"]), dict(target=5), dict(cache_root=3),
                                 dict(kind="AsyncLL", asyncll={"early_notify": True})])  # fmt: skip
def test_ep_bundle_refuses_wrong_arguments(asked, bad):
    from mori_compiler.ops import ep_bundle

    kind = bad.pop("kind", "IntraNode")
    target = bad.pop("target", "gfx942")
    with pytest.raises(cache.MoriCompilerError, match=r"ep_bundle: (target|cache_root|asyncll) must be"):
        ep_bundle(_ep_config(kind), target, virtual_pes=True, **bad)
    assert asked == []
