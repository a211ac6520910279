"""The install extras (cuda, hip, bench, flydsl, triton; ml_dtypes in test): declared with exact pins, and a missing
package named with the extra that provides it, in the drivers, the benchmarks, the reference model and the GPU
tests' skip reason."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import types

import pytest

from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime import extras
from mori_compiler.runtime.extras import MissingExtraError, cuda_unavailable_reason, import_extra


@pytest.fixture(scope="module")
def optional_dependencies(repo_root):
    with open(repo_root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


@pytest.mark.parametrize("extra, packages", [("cuda", {"torch", "cuda-bindings"}), ("hip", {"hip-python"}),
                                             ("bench", {"matplotlib"}), ("flydsl", {"flydsl", "numpy", "torch"}),
                                             ("triton", {"triton"})])  # fmt: skip
def test_extras_are_declared_with_exact_pins(optional_dependencies, extra, packages):
    pins = {}
    for requirement in optional_dependencies[extra]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\d+(\.\d+)+)", requirement)
        assert match, f"[{extra}] {requirement!r} is not an exact pin (name==version)"
        pins[match[1]] = match[2]
    assert set(pins) == packages


def test_the_reference_models_ml_dtypes_is_pinned_in_the_test_extra(optional_dependencies):
    """The casts of the oracle are a function of this version, like the kernels of the compiler's pins."""
    assert [r for r in optional_dependencies["test"] if r.split("==")[0] == "ml_dtypes"] == ["ml_dtypes==0.7.0"]


def test_every_optional_package_names_a_declared_extra(optional_dependencies):
    for module, package in extras.OPTIONAL_PACKAGES.items():
        declared = [r.split("==")[0] for r in optional_dependencies[package.extra]]
        assert package.distribution in declared, (module, package)


def _block(monkeypatch, *modules):
    """Make ``modules`` unimportable, as where their package is not installed."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("module, package, extra", [("cuda.bindings.driver", "cuda-bindings", "cuda"),
                                                    ("torch", "torch", "cuda"), ("hip", "hip-python", "hip"),
                                                    ("matplotlib", "matplotlib", "bench"),
                                                    ("flydsl", "flydsl", "flydsl"), ("triton", "triton", "triton"),
                                                    ("ml_dtypes", "ml_dtypes", "test")])  # fmt: skip
def test_a_missing_module_names_its_package_and_extra(monkeypatch, module, package, extra):
    _block(monkeypatch, module)
    with pytest.raises(MissingExtraError) as info:
        import_extra(module)
    message = str(info.value)
    assert f"no module '{module}'" in message and f"need {package}," in message
    assert f"pip install -e '.[{extra}]'" in message and f"mori-compiler[{extra}]" in message
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == module
    assert ("ROCm build of torch" in message) == (module == "torch")


def test_a_missing_parent_package_is_reported_as_the_extra(monkeypatch):
    def missing_parent(name):
        raise ModuleNotFoundError("No module named 'cuda'", name="cuda")

    monkeypatch.setattr(extras.importlib, "import_module", missing_parent)
    with pytest.raises(MissingExtraError, match=r"need cuda-bindings.*\.\[cuda\]"):
        import_extra("cuda.bindings.driver")


def test_a_broken_dependency_of_an_installed_package_keeps_its_own_error(monkeypatch):
    def broken(name):
        raise ModuleNotFoundError("No module named 'sympy'", name="sympy")

    monkeypatch.setattr(extras.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="sympy") as info:
        import_extra("torch")
    assert not isinstance(info.value, MissingExtraError)


def test_an_installed_module_is_returned_as_it_is(monkeypatch):
    fake = types.ModuleType("matplotlib")
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    assert import_extra("matplotlib") is fake


def test_a_module_that_is_no_optional_package_is_refused():
    with pytest.raises(ValueError, match="'json' is not an optional package of mori_compiler"):
        import_extra("json")


@pytest.mark.parametrize("backend, module, extra", [("nvvm", "cuda.bindings.driver", "cuda"), ("rocdl", "hip", "hip")])
def test_the_drivers_name_the_extra_when_their_bindings_are_missing(monkeypatch, backend, module, extra):
    _block(monkeypatch, module)
    driver_mod._reset_drivers()
    try:
        with pytest.raises(MissingExtraError, match=re.escape(f"pip install -e '.[{extra}]'")):
            driver_mod.get_driver(backend)
    finally:
        driver_mod._reset_drivers()


def test_the_reference_model_names_the_extra_when_ml_dtypes_is_missing():
    """In a process of its own, as where ml_dtypes is not installed (blocked before the first import)."""
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "try:\n    import mori_compiler.ops.reference\n"
            "except ModuleNotFoundError as exc:\n    print(type(exc).__name__, exc)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("MissingExtraError no module 'ml_dtypes': the EP reference model's")
    assert "pip install -e '.[test]'" in result.stdout


# ---- the GPU tests' skip reason, over fake probes ------------------------------------------------------


def _spec_finder(installed):
    def find_spec(name):
        top = name.split(".")[0]
        if top not in installed:
            if "." in name:  # importlib.util.find_spec imports the parent first
                raise ModuleNotFoundError(f"No module named '{top}'", name=top)
            return None
        return object()

    return find_spec


def _reason(installed=("torch", "cuda"), driver=True, gpu=True):
    def torch_cuda_available():
        if isinstance(gpu, Exception):
            raise gpu
        return gpu

    return cuda_unavailable_reason(find_spec=_spec_finder(set(installed)), driver_loadable=lambda: driver,
                                   torch_cuda_available=torch_cuda_available)  # fmt: skip


def test_skip_reason_none_when_everything_is_present():
    assert _reason() is None


def test_skip_reason_on_ci_names_the_missing_gpu_first_and_every_package():
    assert _reason(installed=(), driver=False) == (
        "no NVIDIA GPU driver (libcuda.so.1 cannot be loaded); torch and cuda-bindings are not installed "
        "(pip install -e '.[cuda]')")  # fmt: skip


@pytest.mark.parametrize("installed, missing", [(("cuda",), "torch is not installed"),
                                                (("torch",), "cuda-bindings is not installed")])  # fmt: skip
def test_skip_reason_names_the_one_missing_package(installed, missing):
    assert _reason(installed=installed) == f"{missing} (pip install -e '.[cuda]')"


def test_skip_reason_without_a_visible_gpu():
    assert _reason(gpu=False) == "no CUDA GPU visible (torch.cuda.is_available() is False)"


def test_skip_reason_without_a_driver_but_with_the_packages():
    assert _reason(driver=False, gpu=False) == "no NVIDIA GPU driver (libcuda.so.1 cannot be loaded)"


def test_with_the_packages_torch_decides_not_the_driver_probe():
    assert _reason(driver=False, gpu=True) is None


def test_skip_reason_of_an_unusable_torch():
    assert _reason(gpu=RuntimeError("bad build")) == "torch cannot be used: RuntimeError: bad build"


def test_gpu_tests_here_skip_with_the_true_reason(repo_root):
    """The suite's own decision on this machine (no GPU on CI): every gpu test skips with the reason above."""
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a CUDA GPU is usable here: the GPU tests run")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                             str(repo_root / "test/python/gpu/test_shmem_gpu.py")],
                            capture_output=True, text=True, cwd=repo_root, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"GPU test skipped: {reason}" in result.stdout
    assert " passed" not in result.stdout and "error" not in result.stdout.lower()
