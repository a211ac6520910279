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
