"""Linking and initializing Triton kernels that call the shmem device library (``mori.ir.triton.runtime``).

``get_extern_libs()`` is the ``extern_libs=`` argument of a Triton launch: ``{"mori_shmem": <library>}``.
The library is the project's own (lib_bitcode) for the GPU Triton compiles for, given to Triton as LLVM IR
*text*, not bitcode: Triton 3.6's LLVM (22.0.0git) cannot parse the AMDGPU bitcode written by llvmlite's
LLVM (22.1), while both read the sources' text; Triton's linker takes either (``parseIRFile``). The key
must contain ``mori_shmem``: Triton's AMD backend links an extern library only when a called function's
name contains the key (``amd.need_extern_lib``). MORI's own bitcode (``MORI_SHMEM_BC``) is refused: its
state (``globalGpuStates``) can only be filled by MORI's runtime.

Triton's linker internalizes the library's functions (all inlined) but leaves globals alone, so the state
global ``mori_compiler_shmem_state`` stays exported in the kernel's module (``.visible .global`` in PTX, a
dynamic symbol in the hsaco). ``install_hook()`` adds two Triton 3.6 hooks: ``kernel_load_end_hook`` (called
after every module load, once per kernel and device, also for kernels from Triton's cache) notes the
kernels whose assembly names the state global, and ``launch_enter_hook`` fills such a kernel's state with
``runtime.shmem.shmem_module_init`` before its first launch under the current shmem. Filling at launch
rather than at load lets a kernel be loaded before shmem init, refills it after a re-init, and refuses a
launch without shmem each time (an error raised at load would leave Triton's loaded copy unfilled and
the next launch silently wrong).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mori_compiler.errors import MoriCompilerError

#: The ``extern_libs`` key (see the module docstring for why it must contain "mori_shmem").
LIB_KEY = "mori_shmem"
LIBRARY_TEXT_NAME = "libmori_shmem_device.ll"

_TRITON_BACKENDS = ("cuda", "hip")  # a Triton GPUTarget's backend: arch 90 -> "sm_90", arch "gfx942..." -> "gfx942"


def _target_name(target) -> str:
    """The project's target for ``target``: a name ("sm_90", "gfx942"), a ``triton.backends.compiler.GPUTarget``,
    or None for the GPU Triton's active driver compiles for."""
    from mori_compiler.targets import TARGETS

    if target is None:
        target = _active_triton_target()
    if isinstance(target, str):
        name = target
    elif hasattr(target, "backend") and hasattr(target, "arch"):
        if target.backend not in _TRITON_BACKENDS:
            raise MoriCompilerError(f"Triton backend {target.backend!r} has no shmem device library; supported: "
                                    f"{', '.join(_TRITON_BACKENDS)}")  # fmt: skip
        name = f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch).split(":")[0]
    else:
        raise MoriCompilerError(f"target must be a target name or a triton GPUTarget, got {target!r}")
    if name not in TARGETS:
        raise MoriCompilerError(f"no shmem device library for {name}: the project builds it for {', '.join(TARGETS)}")
    return name


def _active_triton_target():
    try:
        from triton.runtime import driver

        return driver.active.get_current_target()
    except Exception as exc:  # Triton raises RuntimeError (no driver) or a driver error (no GPU)
        raise MoriCompilerError(f"Triton finds no GPU to compile for ({exc}); pass target= (a target name such as "
                                f"'sm_90' or 'gfx942', or a triton GPUTarget)") from None  # fmt: skip


def library_text_path(target) -> str:
    """The cached library IR text for ``target`` (built from lib_bitcode's sources on first use; needs neither
    MLIR nor llvmlite, so it works on a GPU machine with only the runtime's dependencies)."""
    from mori_compiler.env import cache_dir
    from mori_compiler.lib_bitcode.cached import cached_bitcode
    from mori_compiler.lib_bitcode.library import library_hash, library_ir
    from mori_compiler.targets import get_target

    gpu = get_target(_target_name(target))
    path = cache_dir() / "lib" / f"triton-{gpu.name}-{library_hash(gpu)}" / LIBRARY_TEXT_NAME
    what = f"shmem device library text for {gpu.name}"
    return str(cached_bitcode(path, lambda: library_ir(gpu).encode(), what))


def get_extern_libs(target=None) -> dict[str, str]:
    """``extern_libs`` for a Triton launch of a kernel calling shmem functions (``triton_ops``):
    ``kernel[grid](..., extern_libs=get_extern_libs())``. ``target``: see ``_target_name`` (default: the
    GPU Triton's active driver compiles for)."""
    if os.environ.get("MORI_SHMEM_BC"):
        raise MoriCompilerError(f"MORI_SHMEM_BC={os.environ['MORI_SHMEM_BC']} names MORI's own device bitcode, whose "
                                f"state only MORI's runtime fills; mori_compiler's Triton client links the project's "
                                f"library (unset MORI_SHMEM_BC, or use MORI's mori.ir.triton)")  # fmt: skip
    return {LIB_KEY: library_text_path(target)}


def _uses_shmem(metadata_group: dict, name: str) -> bool | None:
    """Whether the kernel's own assembly (in Triton's cache) names the state global; None if none is found."""
    from mori_compiler.lib_bitcode.state import STATE_SYMBOL

    for ext in ("ptx", "amdgcn", "llir"):
        path = (metadata_group or {}).get(f"{name}.{ext}")
        if path and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                return STATE_SYMBOL in f.read()
    return None


@dataclass
class LoadedKernel:
    """A loaded Triton kernel that calls shmem functions (or may: ``uses_shmem`` None when its assembly was
    not found), and the shmem whose state its module holds (None: not filled yet)."""

    module: int
    name: str
    uses_shmem: bool | None
    filled_for: object = None


#: Function handle -> the loaded shmem kernel (Triton never unloads a kernel's module).
LOADED: dict[int, LoadedKernel] = {}


def on_kernel_load(module, function, name, metadata_group, hash) -> None:  # noqa: A002 (Triton's names)
    """``kernel_load_end_hook``: remember a just-loaded kernel that calls shmem functions."""
    uses = _uses_shmem(metadata_group, name)
    if uses is not False:
        LOADED[int(function)] = LoadedKernel(int(module), name, uses)


def _shmem():
    """runtime.shmem, imported on first use (~0.1 s: not for compile-only users) and then looked up once."""
    global _SHMEM
    if _SHMEM is None:
        from mori_compiler.runtime import shmem

        _SHMEM = shmem
    return _SHMEM


_SHMEM = None


def on_launch(metadata) -> None:
    """``launch_enter_hook``: before a shmem kernel runs, make its module hold the current shmem's state
    (filled at its first launch, again after a shmem re-init); refuse the launch when there is no shmem."""
    data = getattr(metadata, "data", None) or {}  # LazyDict's eager part: the user's launch_metadata stays lazy
    kernel = LOADED.get(data.get("function"))
    if kernel is None:
        return
    shmem = _shmem()
    current = shmem.current_state()
    if current is not None and kernel.filled_for is current:
        return
    if current is None or current.virtual:
        if kernel.uses_shmem:
            why = ("shmem is not initialized in this process (call shmem_init_attr / shmem_torch_process_group_init "
                   "first)") if current is None else \
                  ("shmem runs virtual PEs in this process; Triton kernels run with multi-process shmem (one PE "
                   "per process)")  # fmt: skip
            raise shmem.ShmemStateError(f"Triton kernel {kernel.name} calls shmem device functions, but {why}")
        return  # its assembly was not found: without shmem there is nothing to fill anyway
    if shmem.shmem_module_init(kernel.module) != 0:  # -1: the module has no shmem state after all
        del LOADED[data["function"]]
        return
    kernel.filled_for = current


def install_hook() -> None:
    """Give every Triton kernel that calls shmem functions the device state of this process's shmem:
    Triton's load hook notes such a kernel, its launch hook fills the module's state before the first
    launch (after shmem init) and again after a shmem re-init, and refuses a launch without shmem. Call
    once, before or after shmem init but before the first launch of a shmem kernel (a kernel loaded earlier
    goes unnoticed); calling again changes nothing; other hooks in the chains are kept.
    Cost per launch of any kernel: the hook's own is one dictionary lookup (plus a state check for shmem
    kernels), but any launch hook makes Triton build each launch's metadata, and Inductor's static launcher
    steps aside while one is installed (its kernels take Triton's slower launch path): install it in the
    processes that run shmem kernels, and ``uninstall_hook()`` when done."""
    from triton import knobs

    knobs.runtime.kernel_load_end_hook.add(on_kernel_load)
    knobs.runtime.launch_enter_hook.add(on_launch)


def uninstall_hook() -> None:
    from triton import knobs

    knobs.runtime.kernel_load_end_hook.remove(on_kernel_load)
    knobs.runtime.launch_enter_hook.remove(on_launch)
