"""FlyDSL kernels calling the project's shmem device library (``mori.ir.flydsl``).

Inside a ``@flyc.kernel`` body, every function of ``MORI_DEVICE_FUNCTIONS`` is callable under its MORI name
(``my_pe()``, ``putmem_nbi_signal_thread(dest, src, nbytes, sig, value, SIGNAL_SET, pe, 0)``...). Each is a
FlyDSL extern (``flydsl.expr.extern.ffi``) of the ABI symbol and types of the table (pointers are ``uint64``
addresses), wrapped by ``flydsl.compiler.extern_link.link_extern`` with two link facts: the project's device
library (``get_bitcode_path()``) and the post-load initializer ``shmem_module_init``. FlyDSL links the
bitcode into every kernel that calls one of them, and after it loads the code object (``hipModuleLoad``)
it calls ``shmem_module_init(hip_module)``, which fills the module's ``mori_compiler_shmem_state`` from the
runtime's shmem state (runtime/shmem.py): shmem must be initialized before the first launch.

Which library: the project's library is the same LLVM IR for every AMDGPU target (it asks the hardware for
its wave size and carries no target-cpu and no code object version), so one path serves gfx942, gfx950 and
gfx1250; ``get_bitcode_path`` still checks that FlyDSL lowers for a target the project supports and with a
code object version the library's hidden-argument reads fit (5 or 6). ``MORI_SHMEM_BC`` (MORI's own bitcode)
is refused here: its state only MORI's runtime fills.

Importing this module imports neither FlyDSL nor MLIR: the device functions are built on first access (which
imports FlyDSL). FlyDSL and the compiler's MLIR bindings cannot live in one process: compile FlyDSL kernels
in a process of their own (``flydsl_compile`` runs a script compile-only for a target).
"""

from __future__ import annotations

import os
import re

from mori_compiler.errors import MoriCompilerError
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, SIGNAL_ADD, SIGNAL_SET
from mori_compiler.lib_bitcode.library import SUPPORT_CODE_OBJECT_VERSIONS

__all__ = [*MORI_DEVICE_FUNCTIONS, "SIGNAL_ADD", "SIGNAL_SET", "get_bitcode_path", "install_hook",
           "install_jit_hook", "shmem_module_init"]  # fmt: skip
__path__: list[str] = []  # mori.ir.flydsl is a package in MORI (its .ops and .runtime are this module too)

#: Code object versions the project's library fits (its work-item queries read the v5/v6 hidden arguments).
SUPPORTED_CODE_OBJECT_VERSIONS = SUPPORT_CODE_OBJECT_VERSIONS

_ABI_OPTION = re.compile(r"\babi=(\d+)\b")
#: What FlyDSL 0.5.0 imports without declaring it (its wheel has no dependencies).
UNDECLARED_DEPENDENCIES = ("numpy", "torch")
_UNDECLARED_HINT = ("FlyDSL imports numpy and torch but does not declare them; install both (a CPU build of torch is "
                    "enough to compile: pip install numpy torch --index-url https://download.pytorch.org/whl/cpu)")  # fmt: skip


class FlyDSLClientError(MoriCompilerError):
    """FlyDSL is missing, or lowers for something the project's device library does not fit."""


def import_flydsl(module: str = "flydsl"):
    """Import a FlyDSL module, or raise the error naming what to install."""
    from mori_compiler.runtime.extras import import_extra

    try:
        return import_extra(module)
    except ModuleNotFoundError as exc:
        if exc.name in UNDECLARED_DEPENDENCIES:
            raise FlyDSLClientError(f"cannot import {module}: no module '{exc.name}'. {_UNDECLARED_HINT}") from None
        raise


def flydsl_target():
    """FlyDSL's current ROCm target (``GPUTarget``: arch, warp_size); its error says how to set one."""
    backends = import_flydsl("flydsl.compiler.backends")
    try:
        return backends.current_target()
    except RuntimeError as exc:
        raise FlyDSLClientError(f"FlyDSL has no target GPU: {exc}") from None


def flydsl_code_object_version() -> int:
    """The code object version FlyDSL's ROCm pipeline emits (its ``rocdl-attach-target`` ``abi=`` option)."""
    fragments = import_flydsl("flydsl.compiler.backends").get_backend().pipeline_fragments(compile_hints={})
    found = {int(m.group(1)) for frag in fragments if "rocdl-attach-target" in frag
             for m in [_ABI_OPTION.search(frag)] if m}  # fmt: skip
    if len(found) != 1:
        raise FlyDSLClientError(f"cannot read the code object version from FlyDSL's rocdl-attach-target "
                                f"(expected one abi=N00 option): {fragments}")  # fmt: skip
    return found.pop() // 100


def _project_target(arch: str):
    from mori_compiler.targets import TARGETS

    base = arch.split(":", 1)[0].split("-", 1)[0]  # gfx942:sramecc+ / gfx1250-strict -> the processor
    target = TARGETS.get(base)
    if target is None or not target.is_amdgpu:
        supported = ", ".join(t.name for t in TARGETS.values() if t.is_amdgpu)
        raise FlyDSLClientError(f"FlyDSL compiles for {arch}, which the project's device library does not "
                                f"support; supported: {supported}")  # fmt: skip
    return target


def get_bitcode_path() -> str:
    """The project's device library for FlyDSL's target, built and cached on first use (MORI's
    ``get_bitcode_path``). Refuses a target or code object version the library does not fit, and
    ``MORI_SHMEM_BC``."""
    if os.environ.get("MORI_SHMEM_BC"):
        raise FlyDSLClientError(f"MORI_SHMEM_BC={os.environ['MORI_SHMEM_BC']} is set: MORI's bitcode holds MORI's "
                                f"device state, which only MORI's runtime fills; FlyDSL kernels of this project "
                                f"link the project's library (unset MORI_SHMEM_BC)")  # fmt: skip
    target = _project_target(flydsl_target().arch)
    cov = flydsl_code_object_version()
    if cov not in SUPPORTED_CODE_OBJECT_VERSIONS:
        raise FlyDSLClientError(f"FlyDSL emits code object v{cov}; the project's device library reads the hidden "
                                f"kernel arguments of v{' / v'.join(map(str, SUPPORTED_CODE_OBJECT_VERSIONS))}")  # fmt: skip
    from mori_compiler.lib_bitcode import find_bitcode

    return find_bitcode(target=target.name)


def shmem_module_init(hip_module: int):
    """Fill the shmem device state of a code object FlyDSL loaded (``hip_module``: its ``hipModule_t``);
    FlyDSL calls it after each load of a kernel that calls a shmem function. 0: filled; -1: the module holds
    no shmem state. Needs the runtime's shmem initialized (on the HIP driver) before the first launch."""
    from mori_compiler.runtime import shmem
    from mori_compiler.runtime.driver import canonical_backend

    backend = canonical_backend(shmem.state().driver.backend)  # state(): refuses before shmem init
    if backend != "rocdl":
        raise FlyDSLClientError(f"shmem_module_init: FlyDSL loads HIP modules (hipModule_t), but shmem runs on the "
                                f"{backend} driver; initialize shmem on an AMD GPU (the HIP driver) to launch "
                                f"FlyDSL kernels")  # fmt: skip
    return shmem.shmem_module_init(hip_module)


def install_hook() -> None:
    """Nothing to install: each device function carries ``shmem_module_init`` as its FlyDSL post-load
    initializer (``link_extern(module_init_fn=)``), so every kernel that calls one gets its state filled."""
    return None


def install_jit_hook() -> None:
    """The same as ``install_hook`` (MORI's other name for it)."""
    return install_hook()


# ---- the device functions, built on first access ---------------------------------------------------------

_device_functions: dict | None = None


def _build_device_functions() -> dict:
    """One FlyDSL extern per ``MORI_DEVICE_FUNCTIONS`` entry, linked with the library and the initializer.
    The library path is resolved per call (FlyDSL's target may change between compiles)."""
    extern = import_flydsl("flydsl.expr.extern")
    extern_link = import_flydsl("flydsl.compiler.extern_link")

    class _ShmemExtern(extern_link.LinkedExternFunction):
        @property
        def bitcode_path(self):
            return get_bitcode_path()

        @bitcode_path.setter
        def bitcode_path(self, value):  # LinkedExternFunction's constructor sets it (None): the getter decides
            if value is not None:
                raise FlyDSLClientError("the shmem device functions link the project's library; their "
                                        "bitcode path cannot be set")

        def __repr__(self):
            return f"mori_compiler shmem extern {self.symbol}"

    return {name: _ShmemExtern(extern.ffi(meta["symbol"], meta["args"], meta["ret"], is_pure=meta.get("pure", False)),
                               module_init_fn=shmem_module_init)
            for name, meta in MORI_DEVICE_FUNCTIONS.items()}  # fmt: skip


def device_functions() -> dict:
    """MORI name -> the FlyDSL callable of that device function (imports FlyDSL on the first call)."""
    global _device_functions
    if _device_functions is None:
        _device_functions = _build_device_functions()
    return _device_functions


def __getattr__(name: str):
    if name in MORI_DEVICE_FUNCTIONS:
        return device_functions()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
