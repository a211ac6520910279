"""The optional packages behind the GPU runtime and the benchmarks, and the one error for a missing one.

Each optional module belongs to an install extra of ``pyproject.toml``; ``import_extra(module)`` imports it
or raises ``MissingExtraError`` naming the module, its package and the ``pip install`` that provides it:

* ``cuda``: torch and cuda-bindings (``cuda.bindings.driver``), the NVIDIA runtime;
* ``hip``: hip-python (``hip``), the AMD runtime (with a ROCm build of torch, which PyPI does not carry);
* ``bench``: matplotlib, for the benchmarks' plots;
* ``flydsl``: FlyDSL, for FlyDSL kernels that call our shmem (compiled in a process of their own: FlyDSL and
  the MLIR bindings cannot share one);
* ``test``: ml_dtypes, the bf16 / fp8 / fp4 casts of the EP reference model (mori_compiler.ops.reference),
  which the tests and the benchmarks use as their oracle.

``cuda_unavailable_reason()`` says why CUDA GPU work cannot run here (the GPU tests' skip reason), importing
torch only once torch and cuda-bindings are both found.

This module imports only the standard library.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class OptionalPackage:
    distribution: str  # the name pip installs
    extra: str  # the extra of mori-compiler that pins it
    purpose: str  # what needs it, for the message
    note: str = ""  # where the extra is not the way to get it


# Top-level import name -> its package. Submodules (cuda.bindings.driver, torch.distributed) map through
# their top-level name.
OPTIONAL_PACKAGES = {
    "torch": OptionalPackage("torch", "cuda", "GPU tensors and launches",
                             "on ROCm, install a ROCm build of torch from PyTorch's ROCm index instead"),
    "cuda": OptionalPackage("cuda-bindings", "cuda", "CUDA launches (nvvm bundles)"),
    "hip": OptionalPackage("hip-python", "hip", "HIP launches (rocdl bundles)"),
    "matplotlib": OptionalPackage("matplotlib", "bench", "the benchmarks' plots"),
    "flydsl": OptionalPackage("flydsl", "flydsl", "FlyDSL kernels calling our shmem"),
    "triton": OptionalPackage("triton", "triton", "Triton kernels calling our shmem (mori.ir.triton)"),
    "ml_dtypes": OptionalPackage("ml_dtypes", "test", "the EP reference model's bf16 / fp8 / fp4 casts"),
}


def install_hint(extra: str) -> str:
    """The install command for ``extra`` from a checkout (an installed wheel: pip install 'mori-compiler[extra]')."""
    return f"pip install -e '.[{extra}]'"


class MissingExtraError(ModuleNotFoundError):
    """An optional module is not installed; the message names it, its package and the extra to install.
    A ModuleNotFoundError, so callers that tolerate a missing module keep doing so."""

    def __init__(self, module: str, package: OptionalPackage):
        self.module = module
        self.package = package
        super().__init__(f"no module '{module}': {package.purpose} need {package.distribution}, which is not "
                         f"installed; install the extra: {install_hint(package.extra)} in a checkout, else "
                         f"pip install 'mori-compiler[{package.extra}]'"
                         f"{f' ({package.note})' if package.note else ''}", name=module)  # fmt: skip


def _package_of(module: str) -> OptionalPackage:
    try:
        return OPTIONAL_PACKAGES[module.split(".", 1)[0]]
    except KeyError:
        raise ValueError(f"'{module}' is not an optional package of mori_compiler "
                         f"(known: {', '.join(OPTIONAL_PACKAGES)})") from None  # fmt: skip


def import_extra(module: str):
    """``importlib.import_module(module)``, or MissingExtraError when the module (or the package it is
    in) is not installed. A module that is installed but fails on import is reported as it is."""
    package = _package_of(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if isinstance(exc, MissingExtraError) or not (module == missing or module.startswith(f"{missing}.")):
            raise  # something this module itself imports is missing: its own error says what
        raise MissingExtraError(module, package) from None


def is_installed(module: str, find_spec=importlib.util.find_spec) -> bool:
    """Whether ``module`` can be found, without importing it (its parent packages are imported)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing; a module blocked in sys.modules
        return False


def missing_text(modules) -> str:
    """One clause for missing optional modules of one extra: '<packages> not installed (<install command>)'."""
    packages = [_package_of(m) for m in modules]
    extras = sorted({p.extra for p in packages})
    names = " and ".join(p.distribution for p in packages)
    verb = "is" if len(packages) == 1 else "are"
    return f"{names} {verb} not installed ({'; '.join(install_hint(e) for e in extras)})"


CUDA_DRIVER_LIBRARY = "libcuda.so.1"  # the NVIDIA driver's user-space library (what cuda-bindings loads)


def _cuda_driver_loadable() -> bool:
    try:
        ctypes.CDLL(CUDA_DRIVER_LIBRARY)
    except OSError:
        return False
    return True


def _torch_cuda_available() -> bool:
    import torch  # noqa: PLC0415 - only once torch is known to be installed

    return bool(torch.cuda.is_available())


def cuda_unavailable_reason(find_spec=importlib.util.find_spec, driver_loadable=_cuda_driver_loadable,
                            torch_cuda_available=_torch_cuda_available) -> str | None:  # fmt: skip
    """Why CUDA GPU work (torch tensors on an NVIDIA GPU, launched through cuda-bindings) cannot run here,
    every missing piece named; None when it can. With torch and cuda-bindings installed,
    ``torch.cuda.is_available()`` decides (it creates no CUDA context) and the driver probe only names the
    reason; without them the probe says whether a GPU driver is there at all. The probes are parameters so
    that tests can fake them."""
    no_driver = f"no NVIDIA GPU driver ({CUDA_DRIVER_LIBRARY} cannot be loaded)"
    missing = [m for m in ("torch", "cuda.bindings.driver") if not is_installed(m, find_spec)]
    if missing:
        reasons = [missing_text(missing)]
        if not driver_loadable():  # the first reason where there is no GPU at all (CI)
            reasons.insert(0, no_driver)
        return "; ".join(reasons)
    try:
        if torch_cuda_available():
            return None
    except Exception as exc:  # noqa: BLE001 - an unusable torch is a reason too
        return f"torch cannot be used: {type(exc).__name__}: {exc}"
    if not driver_loadable():
        return no_driver
    return "no CUDA GPU visible (torch.cuda.is_available() is False)"
