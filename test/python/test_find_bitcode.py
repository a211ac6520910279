"""find_bitcode / get_bitcode_path mirror mori.ir: MORI_SHMEM_BC first, else the project's library."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

from mori_compiler import lib_bitcode
from mori_compiler.errors import MoriCompilerError


def test_exports_mirror_mori_ir():
    assert set(lib_bitcode.__all__) >= {"find_bitcode", "get_bitcode_path", "MORI_DEVICE_FUNCTIONS", "SIGNAL_SET",
                                         "SIGNAL_ADD"}  # fmt: skip
    assert (lib_bitcode.SIGNAL_SET, lib_bitcode.SIGNAL_ADD) == (9, 10)
    assert len(lib_bitcode.MORI_DEVICE_FUNCTIONS) == 89
    assert lib_bitcode.get_bitcode_path is lib_bitcode.find_bitcode


@pytest.mark.parametrize("target, triple", [("gfx942", "amdgcn"), ("gfx1250", "amdgcn"), ("sm_90", "nvptx64")])
def test_project_library_per_target(monkeypatch, target, triple):
    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    path = lib_bitcode.find_bitcode(target=target)
    module = llvm.parse_bitcode(open(path, "rb").read())
    assert module.triple.startswith(triple)
    defined = {f.name for f in module.functions if not f.is_declaration and f.name.startswith("mori_shmem_")}
    assert len(defined) == 98


def test_default_target_from_mori_gpu_archs(monkeypatch):
    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    monkeypatch.setenv("MORI_GPU_ARCHS", "gfx950;gfx942")
    assert "gfx950-" in lib_bitcode.find_bitcode(cov=6)


def test_mori_shmem_bc_wins(monkeypatch, tmp_path):
    bc = tmp_path / "libmori_shmem_device.bc"
    bc.write_bytes(b"BC")
    monkeypatch.setenv("MORI_SHMEM_BC", str(bc))
    assert lib_bitcode.find_bitcode() == str(bc)
    monkeypatch.setenv("MORI_SHMEM_BC", str(tmp_path / "missing.bc"))
    with pytest.raises(FileNotFoundError, match="MORI_SHMEM_BC"):
        lib_bitcode.find_bitcode()


def test_bad_cov(monkeypatch):
    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    with pytest.raises(MoriCompilerError, match="allowed: 5, 6"):
        lib_bitcode.find_bitcode(cov=4)


# ----------------------------------------------------------------------------------------------------
# MORI_SHMEM_BC is the CompileOptions default, recorded in the options (and so in every cache key)
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def stub_bc(tmp_path):
    from mori_compiler.lib_bitcode.stub import write_stub_bitcode

    path = tmp_path / "stub.amdgcn.bc"
    write_stub_bitcode(str(path), "amdgcn-amd-amdhsa")
    return path


def test_mori_shmem_bc_is_the_compile_options_default(monkeypatch, stub_bc, tmp_path):
    from mori_compiler.options import CompileOptions

    monkeypatch.setenv("MORI_SHMEM_BC", str(stub_bc))
    options = CompileOptions()
    assert options.bitcode == (str(stub_bc),)
    assert options.to_dict()["bitcode"] == [str(stub_bc)]
    other = tmp_path / "other.bc"
    other.write_bytes(stub_bc.read_bytes())
    assert CompileOptions(bitcode=str(other)).bitcode == (str(other),)  # an explicit bitcode wins
    assert CompileOptions(device_library=False).bitcode == ()  # no device library at all: nothing linked
    monkeypatch.setenv("MORI_SHMEM_BC", str(tmp_path / "missing.bc"))
    with pytest.raises(MoriCompilerError, match=r"device bitcode file not found \(MORI_SHMEM_BC\): .*missing\.bc"):
        CompileOptions()
    monkeypatch.setenv("MORI_SHMEM_BC", "")
    assert CompileOptions().bitcode == ()


def test_device_bitcode_links_support_beside_external_bitcode(monkeypatch, stub_bc, tmp_path):
    from mori_compiler.lib_bitcode import library
    from mori_compiler.options import CompileOptions, device_bitcode

    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path / "cache"))
    support = str(library.lowering_support_path("gfx942"))
    assert device_bitcode(CompileOptions()) == [str(library.library_path("gfx942"))]
    assert device_bitcode(CompileOptions(device_library=False)) == [support]
    linked = device_bitcode(CompileOptions(bitcode=str(stub_bc)))
    assert len(linked) == 2 and linked[1] == support
    assert linked[0].startswith(str(tmp_path / "cache" / "lib" / "external-")) and linked[0].endswith("stub.amdgcn.bc")
    nvptx = tmp_path / "stub.nvptx.bc"
    from mori_compiler.lib_bitcode.stub import write_stub_bitcode

    write_stub_bitcode(str(nvptx), "nvptx64-nvidia-cuda")
    assert len(device_bitcode(CompileOptions(target="sm_90", bitcode=str(nvptx)))) == 1  # no support on NVPTX
    assert device_bitcode(CompileOptions(target="sm_90", device_library=False)) == []


# ----------------------------------------------------------------------------------------------------
# An external bitcode is checked against the options (triple, GPU, wave size, code object version)
# ----------------------------------------------------------------------------------------------------


def _bitcode_file(tmp_path, name, *, triple="amdgcn-amd-amdhsa", cpu=None, features=None, cov=None, body_size=1):
    attrs = ["nounwind"]
    if cpu:
        attrs.append(f'"target-cpu"="{cpu}"')
    if features:
        attrs.append(f'"target-features"="{features}"')
    lines = [f'target triple = "{triple}"', "define i32 @mori_shmem_my_pe() #0 {", "  %v0 = add i32 0, 1"]
    lines += [f"  %v{i} = add i32 %v{i - 1}, {i}" for i in range(1, body_size)]
    lines += [f"  ret i32 %v{body_size - 1}", "}", "define i32 @mori_shmem_n_pes() #0 {", "  ret i32 8", "}",
              f"attributes #0 = {{ {' '.join(attrs)} }}"]  # fmt: skip
    if cov:
        lines += ["!llvm.module.flags = !{!0}", f'!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {cov * 100}}}']
    path = tmp_path / name
    path.write_bytes(llvm.parse_assembly("\n".join(lines) + "\n").as_bitcode())
    return str(path)


@pytest.mark.parametrize("kwargs, options, message", [
    (dict(cpu="gfx950"), dict(target="gfx942"), r"\.bc was built for gfx950, not gfx942; build or choose the bitcode"),
    (dict(cov=5), dict(target="gfx942"), r"built for code object version 5 \(module flag amdhsa_code_object_version = "
                                         r"500\), but the compile options ask for 6; pass --code-object-version 5"),
    (dict(cov=6), dict(target="gfx942", code_object_version=5), r"code object version 6 .* ask for 5"),
    (dict(features="+wavefrontsize32"), dict(target="gfx942"), r"built for wave32, but gfx942 runs wave64"),
    (dict(features="+wavefrontsize64"), dict(target="gfx1250"), r"built for wave64, but gfx1250 runs wave32"),
    (dict(triple="nvptx64-nvidia-cuda"), dict(target="gfx942"), r"is for 'nvptx64-nvidia-cuda', but target gfx942"),
    (dict(), dict(target="sm_90"), r"is for 'amdgcn-amd-amdhsa', but target sm_90 needs 'nvptx64-nvidia-cuda'"),
])  # fmt: skip
def test_mismatched_bitcode_is_refused(tmp_path, monkeypatch, kwargs, options, message):
    from mori_compiler.options import CompileOptions, device_bitcode

    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    path = _bitcode_file(tmp_path, "built.bc", **kwargs)
    with pytest.raises(MoriCompilerError, match=message):
        device_bitcode(CompileOptions(bitcode=path, **options))


def test_matching_bitcode_is_accepted_and_facts_are_cached(tmp_path, monkeypatch):
    from mori_compiler.lib_bitcode import external
    from mori_compiler.options import CompileOptions, device_bitcode

    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    path = _bitcode_file(tmp_path, "fits.bc", cpu="gfx942", features="+wavefrontsize64", cov=5)
    first = device_bitcode(CompileOptions(bitcode=path, code_object_version=5))
    # A warm lookup reads the recorded facts and the prepared copy: it parses nothing.
    monkeypatch.setattr(external, "_parse", lambda *a: pytest.fail("bitcode parsed again although cached"))
    assert device_bitcode(CompileOptions(bitcode=path, code_object_version=5)) == first
    with pytest.raises(MoriCompilerError, match="ask for 6"):
        device_bitcode(CompileOptions(bitcode=path))


def test_garbage_bitcode_is_a_clear_error(tmp_path, monkeypatch):
    from mori_compiler.options import CompileOptions, device_bitcode

    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    path = tmp_path / "garbage.bc"
    path.write_bytes(b"BC\xc0\xde not really")
    with pytest.raises(MoriCompilerError, match=r"garbage\.bc is not a valid LLVM bitcode file"):
        device_bitcode(CompileOptions(bitcode=str(path)))


def test_prepared_copy_keeps_large_functions_out_of_line(tmp_path, monkeypatch):
    from mori_compiler.lib_bitcode import cached, external
    from mori_compiler.options import CompileOptions, device_bitcode

    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    path = _bitcode_file(tmp_path, "big.bc", body_size=external.OUTLINE_ABOVE + 1)
    prepared = device_bitcode(CompileOptions(bitcode=path))[0]
    module = llvm.parse_bitcode(open(prepared, "rb").read())
    assert "noinline" in external.function_attributes(module.get_function("mori_shmem_my_pe")).split()
    assert "noinline" not in external.function_attributes(module.get_function("mori_shmem_n_pes")).split()
    # A damaged prepared copy is reported once and rebuilt, like the device library.
    cached._warned.clear()
    with open(prepared, "r+b") as f:
        f.truncate(10)
    with pytest.warns(cached.DeviceLibraryCacheWarning, match="prepared copy of .*big.bc"):
        assert device_bitcode(CompileOptions(bitcode=path))[0] == prepared
    assert llvm.parse_bitcode(open(prepared, "rb").read()).get_function("mori_shmem_my_pe")
