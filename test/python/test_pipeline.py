"""The compile pipeline: stages, stop points, the replayable MLIR pipeline, options, outputs, ld.lld lookup."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import struct
import sys
from pathlib import Path

import pytest

from mori_compiler import pipeline
from mori_compiler._mlir import ir
from mori_compiler.codeobject import read_amdgpu_code_object, read_elf_symbols
from mori_compiler.dialects import registry
from mori_compiler.errors import MoriCompilerError, ToolchainError
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
from mori_compiler.options import CompileOptions
from mori_compiler.pass_pipeline import build_pass_manager, make_project_pass, split_top_level
from mori_compiler.passes import codegen
from mori_compiler.targets import TARGETS, get_target

ALL_TARGETS = sorted(TARGETS)
ET_REL, ET_DYN = 1, 3


def _elf_type(data: bytes) -> int:
    assert data[:4] == b"\x7fELF"
    return struct.unpack_from("<H", data, 16)[0]


@pytest.fixture(scope="module")
def full_results(example_source) -> dict:
    """The example compiled to the end for every target (once per module)."""
    return {t: pipeline.compile_source(example_source, CompileOptions(target=t)) for t in ALL_TARGETS}


# ----------------------------------------------------------------------------------------------------
# Whole compiles and stop points
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_compile_source_every_target(full_results, target):
    result = full_results[target]
    t = get_target(target)
    assert result.binary
    assert result.kernels == ("ring_put_signal",)
    assert result.stopped_after == pipeline.stage_names(t)[-1]
    assert list(result.timings) == pipeline.stage_names(t)
    assert all(isinstance(v, float) and v >= 0 for v in result.timings.values())
    assert result.bitcode and all(Path(b).is_file() for b in result.bitcode)
    if t.is_amdgpu:
        assert _elf_type(result.binary) == ET_DYN
        assert read_amdgpu_code_object(result.binary).gfx_name == target
    else:
        assert result.binary.decode().startswith("//")


def test_stage_names():
    assert pipeline.stage_names(get_target("gfx942")) == [
        "mori", "ep", "abi", "rocdl", "llvm-ir", "link", "opt", "isa", "object", "hsaco"]  # fmt: skip
    assert pipeline.stage_names(get_target("sm_90")) == ["mori", "ep", "abi", "nvvm", "llvm-ir", "link", "opt", "ptx"]


def _stop_cases():
    for target in ("gfx942", "sm_90"):
        for stage in pipeline.stage_names(get_target(target)):
            yield target, stage


@pytest.mark.parametrize("target, stage", list(_stop_cases()))
def test_stop_after(example_source, target, stage):
    t = get_target(target)
    names = pipeline.stage_names(t)
    result = pipeline.compile_source(example_source, CompileOptions(target=target), stop_after=stage)
    assert result.stopped_after == stage
    assert list(result.timings) == names[: names.index(stage) + 1]
    if stage == "mori":
        assert '"mori_shmem.putmem_nbi_signal"' in result.mlir
    elif stage == "abi":
        assert '"mori_shmem.' not in result.mlir and "llvm.call @mori_shmem_putmem_nbi_signal_block" in result.mlir
    elif stage in ("rocdl", "nvvm"):
        assert f"{stage}.kernel" in result.mlir and "gpu.func" not in result.mlir
    elif stage == "llvm-ir":
        assert result.llvm_ir and result.linked_llvm_ir is None
        assert "declare i32 @mori_shmem_putmem_nbi_signal_block" in result.llvm_ir
    elif stage in ("link", "opt"):
        assert "define" in result.linked_llvm_ir and result.binary is None
    elif stage == "isa":
        assert ".amdhsa_kernel ring_put_signal" in result.assembly and result.binary is None
    elif stage == "object":
        assert _elf_type(result.binary) == ET_REL
    elif stage == "hsaco":
        assert _elf_type(result.binary) == ET_DYN
    elif stage == "ptx":
        assert ".visible .entry ring_put_signal" in result.binary.decode()


def test_unknown_stage(example_source):
    with pytest.raises(MoriCompilerError, match=r"unknown stage 'ptx' for target gfx942; stages: mori, ep, abi, rocdl"):
        pipeline.compile_source(example_source, CompileOptions(), stop_after="ptx")


def test_want_assembly_keeps_the_binary(example_source):
    result = pipeline.compile_source(example_source, CompileOptions(), want_assembly=True)
    assert ".amdhsa_kernel ring_put_signal" in result.assembly
    assert _elf_type(result.binary) == ET_DYN


def test_input_errors():
    with pytest.raises(MoriCompilerError, match="no kernel"):
        pipeline.compile_source("module attributes {gpu.container_module} {\n gpu.module @m {\n }\n}\n")
    with pytest.raises(MoriCompilerError, match="expected exactly one gpu.module"):
        pipeline.compile_source("module {\n}\n")
    with pytest.raises(MoriCompilerError) as info:
        pipeline.compile_source("module {\n  %0 = arith.constant : i32\n}\n", filename="x.mlir")
    assert info.value.location.startswith("x.mlir:2:")


# ----------------------------------------------------------------------------------------------------
# The MLIR part as one replayable pipeline string
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx942", "gfx1250", "sm_90"])
def test_describe_pipeline_and_replay(example_source, target):
    options = CompileOptions(target=target)
    mlir_pipeline = pipeline.mlir_pipeline_string(options)
    assert mlir_pipeline.startswith("builtin.module(mori-coll-to-kernels{wave-size=")
    description = pipeline.describe_pipeline(options, ["lib.bc"])
    assert f"mlir pipeline: {mlir_pipeline}" in description
    assert "lib.bc" in description
    for stage in pipeline.stage_names(options.gpu_target):
        assert f"\n{stage}: " in "\n" + description, stage

    lowering = "rocdl" if options.gpu_target.is_amdgpu else "nvvm"
    expected = pipeline.compile_source(example_source, options, stop_after=lowering).mlir
    ctx = ir.Context()
    module = registry.parse_source(example_source, ctx)
    build_pass_manager(mlir_pipeline, ctx).run(module.operation)
    assert str(module) == expected


def test_mlir_pipeline_carries_the_options():
    amd = pipeline.mlir_pipeline_string(CompileOptions(target="gfx1250", code_object_version=5))
    assert "chipset=gfx1250" in amd and "chip=gfx1250" in amd and "abi=500" in amd and "wave64=false" in amd
    assert "wave64=true" in pipeline.mlir_pipeline_string(CompileOptions(target="gfx942"))
    nv = pipeline.mlir_pipeline_string(CompileOptions(target="sm_90"))
    assert "convert-gpu-to-nvvm" in nv and "chip=sm_90" in nv and "features=+ptx78" in nv


# ----------------------------------------------------------------------------------------------------
# Pipeline text: splitting and project-pass options
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, parts",
    [
        ("", []),
        ("a", ["a"]),
        ("a,b", ["a", "b"]),
        (" a , b ,", ["a", "b"]),
        ("a{x=1,y=2},b", ["a{x=1,y=2}", "b"]),
        ("gpu.module(c,d{e=[1,2]}),f", ["gpu.module(c,d{e=[1,2]})", "f"]),
        ("x(y(z,w),v),u", ["x(y(z,w),v)", "u"]),
    ],
)
def test_split_top_level(text, parts):
    assert split_top_level(text) == parts


@pytest.mark.parametrize("text", ["a),b", "a(b", "a{b", "gpu.module(a,b))"])
def test_split_top_level_unbalanced(text):
    with pytest.raises(MoriCompilerError, match="unbalanced"):
        split_top_level(text)


@dataclasses.dataclass(frozen=True)
class _FakePass:
    """A project pass with options of every kind (registered only inside the tests below)."""

    level: int = 1
    verbose: bool = False
    mode: str = "fast"
    name = "fake-pass"

    def __call__(self, op, pass_=None):
        pass


@pytest.fixture
def fake_pass(monkeypatch):
    from mori_compiler import passes

    monkeypatch.setitem(passes.ALL_PASSES, "fake-pass", lambda: _FakePass)
    return _FakePass


def test_make_project_pass_options(fake_pass):
    assert make_project_pass("fake-pass") == fake_pass()
    assert make_project_pass("fake-pass{level=3 verbose=true mode=slow}") == fake_pass(3, True, "slow")
    assert make_project_pass("fake-pass{verbose=0}") == fake_pass(verbose=False)
    assert make_project_pass("canonicalize") is None
    assert make_project_pass("gpu.module(convert-gpu-to-rocdl)") is None
    assert type(make_project_pass("mori-shmem-to-abi")).__name__ == "MoriShmemToAbi"


@pytest.mark.parametrize(
    "element, message",
    [
        ("fake-pass{depth=2}", "pass 'fake-pass' has no option 'depth' (options: level, verbose, mode)"),
        ("fake-pass{level=two}", "pass 'fake-pass' option 'level' expects an integer, got 'two'"),
        ("fake-pass{level=1.5}", "option 'level' expects an integer"),
        ("fake-pass{verbose=yes}", "option 'verbose' expects true or false, got 'yes'"),
        ("fake-pass{level}", "option 'level' needs a value"),
        ("fake-pass{level=1", "malformed options for pass 'fake-pass'"),
        ("mori-shmem-to-abi{x=1}", "pass 'mori-shmem-to-abi' has no option 'x' (options: none)"),
    ],
)
def test_make_project_pass_errors(fake_pass, element, message):
    with pytest.raises(MoriCompilerError) as info:
        make_project_pass(element)
    assert message in str(info.value)


def test_build_pass_manager_errors():
    ctx = ir.Context()
    with pytest.raises(MoriCompilerError, match="must be a top-level element"):
        build_pass_manager("builtin.module(gpu.module(mori-shmem-to-abi))", ctx)
    with pytest.raises(MoriCompilerError, match="invalid pass pipeline element 'no-such-pass'"):
        build_pass_manager("no-such-pass", ctx)
    # With or without the builtin.module anchor.
    build_pass_manager("builtin.module(mori-shmem-to-abi,canonicalize)", ctx)
    build_pass_manager("mori-shmem-to-abi,canonicalize", ctx)


# ----------------------------------------------------------------------------------------------------
# CompileOptions
# ----------------------------------------------------------------------------------------------------


def test_compile_options_defaults_and_normalization(tmp_path):
    o = CompileOptions()
    assert (o.target, o.code_object_version, o.opt_level, o.bitcode, o.device_library) == ("gfx942", 6, 3, (), True)
    lib = tmp_path / "lib.bc"
    lib.write_bytes(b"BC")
    assert CompileOptions(bitcode=str(lib)).bitcode == (str(lib),)
    assert CompileOptions(bitcode=lib).bitcode == (str(lib),)
    assert CompileOptions(bitcode=[lib]).bitcode == (str(lib),)
    assert CompileOptions(bitcode=[lib]).to_dict()["bitcode"] == [str(lib)]
    assert "extra" not in o.to_dict()
    assert CompileOptions(extra={"a": 1}) == CompileOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.target = "sm_90"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target": "gfx90a"}, "unknown target 'gfx90a'; allowed targets: gfx942, gfx950, gfx1250, sm_90"),
        ({"code_object_version": 4}, "code object version 4 is not supported; allowed: 5, 6"),
        ({"opt_level": 4}, "optimization level 4 is not supported; allowed: 0, 1, 2, 3"),
        ({"opt_level": -1}, "optimization level -1 is not supported"),
        ({"bitcode": ("/no/such/lib.bc",)}, "device bitcode file not found: /no/such/lib.bc"),
    ],
)
def test_compile_options_validation(kwargs, message):
    with pytest.raises(MoriCompilerError) as info:
        CompileOptions(**kwargs)
    assert message in str(info.value)


# ----------------------------------------------------------------------------------------------------
# What the binaries contain
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "gfx1250"])
def test_hsaco_symbols(full_results, target):
    symbols = read_elf_symbols(full_results[target].binary)
    assert [s.name for s in symbols if s.undefined] == []
    by_name = {s.name: s for s in symbols}
    state = by_name[STATE_SYMBOL]
    assert state.shndx != 0 and state.bind == 1 and state.size == STATE_SIZE  # defined, global
    assert by_name["ring_put_signal"].type == 2 and by_name["ring_put_signal"].bind == 1  # STT_FUNC, STB_GLOBAL
    assert "ring_put_signal.kd" in by_name
    # Everything from the device library is internal: no mori_shmem_* symbol is exported.
    assert not [s.name for s in symbols if s.name.startswith("mori_shmem_") and s.bind == 1]


def test_ptx_contents(full_results):
    ptx = full_results["sm_90"].binary.decode()
    assert ptx.startswith("//")
    assert ".target sm_90" in ptx and ".version 7.8" in ptx
    assert ".visible .global .align 8 .b8 mori_compiler_shmem_state[64]" in ptx
    assert ".visible .entry ring_put_signal" in ptx
    assert ".extern .func" not in ptx  # nothing left for the driver's linker


@pytest.mark.parametrize("cov, abi_version", [(5, 3), (6, 4)])
def test_code_object_version(example_source, cov, abi_version):
    binary = pipeline.compile_source(example_source, CompileOptions(code_object_version=cov)).binary
    info = read_amdgpu_code_object(binary)
    assert info.abi_version == abi_version
    assert info.code_object_version[0] == 1  # AMDHSA metadata version 1.x for v5 and v6


def test_resource_report_of_the_example(full_results):
    info = read_amdgpu_code_object(full_results["gfx942"].binary)
    (kernel,) = info.kernels
    assert kernel.name == "ring_put_signal"
    assert kernel.wavefront_size == 64 and kernel.kernarg_bytes >= 40
    assert kernel.max_flat_workgroup_size == 256  # known_block_size
    assert read_amdgpu_code_object(full_results["gfx1250"].binary).kernels[0].wavefront_size == 32


# ----------------------------------------------------------------------------------------------------
# Finding ld.lld
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_lld_lookup():
    codegen.find_ld_lld.cache_clear()
    yield
    codegen.find_ld_lld.cache_clear()


def test_find_ld_lld_honors_env(fresh_lld_lookup, monkeypatch, tmp_path):
    broken = tmp_path / "ld.lld"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("MORI_COMPILER_LLD", str(broken))
    with pytest.raises(ToolchainError, match=f"MORI_COMPILER_LLD={broken} does not run as ld.lld"):
        codegen.find_ld_lld()
    monkeypatch.setenv("MORI_COMPILER_LLD", str(tmp_path / "missing"))
    codegen.find_ld_lld.cache_clear()
    with pytest.raises(ToolchainError, match="MORI_COMPILER_LLD"):
        codegen.find_ld_lld()


def test_find_ld_lld_uses_a_working_env_value(fresh_lld_lookup, monkeypatch):
    found = codegen.find_ld_lld()  # whatever this machine has
    if len(found) != 1:
        pytest.skip("no stand-alone ld.lld here (only the ziglang one)")
    monkeypatch.setenv("MORI_COMPILER_LLD", found[0])
    codegen.find_ld_lld.cache_clear()
    assert codegen.find_ld_lld() == (found[0],)


def test_find_ld_lld_nothing_found(fresh_lld_lookup, monkeypatch, tmp_path):
    monkeypatch.delenv("MORI_COMPILER_LLD", raising=False)
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setenv("PATH", "")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ziglang" else real_find_spec(name, *a))
    with pytest.raises(ToolchainError) as info:
        codegen.find_ld_lld()
    message = str(info.value)
    for needle in ("MORI_COMPILER_LLD", "ROCM_PATH", "PATH", "ziglang"):
        assert needle in message, needle


def test_find_ld_lld_rocm_path(fresh_lld_lookup, monkeypatch, tmp_path):
    found = codegen.find_ld_lld()
    if len(found) != 1:
        pytest.skip("no stand-alone ld.lld here (only the ziglang one)")
    rocm = tmp_path / "rocm"
    (rocm / "llvm" / "bin").mkdir(parents=True)
    os.symlink(found[0], rocm / "llvm" / "bin" / "ld.lld")
    monkeypatch.delenv("MORI_COMPILER_LLD", raising=False)
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    codegen.find_ld_lld.cache_clear()
    assert codegen.find_ld_lld() == (str(rocm / "llvm" / "bin" / "ld.lld"),)


def test_ziglang_lld_is_run_directly(fresh_lld_lookup, monkeypatch):
    """The ziglang wheel's zig binary itself, not ``python -m ziglang`` (an interpreter start per link)."""
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip("the ziglang package is not installed")
    monkeypatch.delenv("MORI_COMPILER_LLD", raising=False)
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setenv("PATH", "")
    found = codegen.find_ld_lld()
    assert found[1:] == ("ld.lld",) and os.path.basename(found[0]) == "zig", found
    assert found[0] != sys.executable and os.access(found[0], os.X_OK)
    assert codegen._lld_major(list(found)) >= codegen.MIN_LLD_MAJOR


def test_amdgpu_ir_pipeline_level():
    """AMDGPU runs LLVM's O1 IR pipeline for every level >= 1 (codegen keeps the level); sm_90 the level."""
    from mori_compiler.passes.device_link import ir_pipeline_level
    from mori_compiler.targets import get_target

    for name in ("gfx942", "gfx950", "gfx1250"):
        assert [ir_pipeline_level(get_target(name), level) for level in range(4)] == [0, 1, 1, 1]
    assert [ir_pipeline_level(get_target("sm_90"), level) for level in range(4)] == [0, 1, 2, 3]


def test_link_error_is_a_toolchain_error(fresh_lld_lookup, monkeypatch, tmp_path):
    fake = tmp_path / "ld.lld"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'LLD 22.1.0'; exit 0; fi\necho boom >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MORI_COMPILER_LLD", str(fake))
    with pytest.raises(ToolchainError, match="ld.lld failed .*boom"):
        codegen.link_code_object(b"\x7fELF")


# ----------------------------------------------------------------------------------------------------
# compile_source of a module built in Python (dialects/builder.py): no text in between
# ----------------------------------------------------------------------------------------------------


def _built_put_kernel(*, misplaced_op: bool = False, bad_shmem_type: bool = False) -> ir.Module:
    """``put_next(dst, value)``: PE p stores ``value`` into ``dst`` on PE (p + 1) % n, built with the Builder."""
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import mori_shmem
    from mori_compiler.dialects.builder import Builder, new_gpu_module, new_kernel

    ctx = new_context()
    registry.load_all(ctx)
    with ctx, ir.Location.unknown():
        module, body = new_gpu_module("m")
        b = Builder(body)
        if misplaced_op:
            b.const_i32(1)  # an op directly in the gpu.module
        _, entry = new_kernel(body, "put_next", [b.ptr, b.i32], block_size=(64, 1, 1), param_names=["dst", "value"])
        k = Builder(entry)
        me, n = mori_shmem.my_pe(**k.at()), mori_shmem.n_pes(**k.at())
        nxt = k.remui(k.addi(me, k.const_i32(1)), n)
        value = entry.arguments[1]
        if bad_shmem_type:
            value = k.const_i64(7)  # mori_shmem.p with c_type int32 takes an i32 value
        mori_shmem.p(entry.arguments[0], value, nxt, c_type="int32", **k.at())
        k.gpu_return()
    return module


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_compile_source_takes_a_built_module(target):
    module = _built_put_kernel()
    before = str(module)
    result = pipeline.compile_source(module, CompileOptions(target=target))
    assert result.kernels == ("put_next",)
    sig = result.signatures["put_next"]
    assert [(p.name, p.type, p.named) for p in sig.params] == [("dst", "ptr", True), ("value", "i32", True)]
    assert sig.block == (64, 1, 1)
    if target == "sm_90":
        assert ".entry put_next" in result.binary.decode()
    else:
        assert "put_next" in {s.name for s in read_elf_symbols(result.binary)}
    assert str(module) == before  # compiled from a copy: the caller's module is not lowered


def test_built_module_gets_the_checks_of_text():
    with pytest.raises(MoriCompilerError, match="cannot stand directly in a gpu.module"):
        pipeline.compile_source(_built_put_kernel(misplaced_op=True), CompileOptions(target="sm_90"))
    with pytest.raises(MoriCompilerError, match="mori_shmem.p"):
        pipeline.compile_source(_built_put_kernel(bad_shmem_type=True), CompileOptions(target="sm_90"))
    with pytest.raises(MoriCompilerError, match="MLIR text or an mlir.ir.Module, not bytes"):
        pipeline.compile_source(b"module {}", CompileOptions(target="sm_90"))
