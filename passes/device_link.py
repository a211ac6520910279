"""Stages ``link`` and ``opt``: link device bitcode into the kernel module and optimize it (llvmlite).

Input: LLVM IR text of the kernels, the device bitcode files, the target. Output: one optimized
llvmlite module with every device function internalized and inlined, or a clear error:
* a bitcode that is not LLVM bitcode, or was built for another triple or GPU;
* a code object version that differs from the bitcode's (``amdhsa_code_object_version`` flag);
* symbols still undefined after linking (lld would accept them silently; the load would fail later).

This does what MLIR's ROCDL serializer would do (docs/toolchain.md §2): set triple and data layout, add the
code-object-version module flag, link, internalize everything but the kernels and the device-state
globals the runtime fills (they must stay exported), then run the O-level pipeline.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import llvmlite.binding as _binding  # imported with the compiler, not inside the first compile

from mori_compiler.errors import MoriCompilerError
from mori_compiler.lib_bitcode.abi import MORI_STATE_SYMBOL
from mori_compiler.lib_bitcode.kernel_abi import TRACE_GLOBAL_PREFIX
from mori_compiler.lib_bitcode.state import STATE_SYMBOL
from mori_compiler.targets import GPUTarget

# Globals a host runtime looks up by name after loading the code object: never internalize them (they stay in
# the code object's dynamic symbol table). MORI's shmem_module_init fills MORI_STATE_SYMBOL (its bitcode's
# globalGpuStates), mori_compiler.runtime fills STATE_SYMBOL (the project's library); lib_bitcode names both.
# The trace-buffer globals of traced kernels (TRACE_GLOBAL_PREFIX + kernel) are the runtime's too.
PRESERVED_GLOBALS = frozenset({MORI_STATE_SYMBOL, STATE_SYMBOL})


def _preserved(name: str) -> bool:
    return name in PRESERVED_GLOBALS or name.startswith(TRACE_GLOBAL_PREFIX)


@functools.cache
def _llvm():
    _binding.initialize_all_targets()
    _binding.initialize_all_asmprinters()
    return _binding


@functools.cache
def target_machine(target: GPUTarget, opt_level: int = 3):
    llvm = _llvm()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=opt_level, reloc="pic", codemodel="default"
    )


def _arch(triple: str) -> str:
    return triple.split("-", 1)[0]


def _check_bitcode_target(path: str, lib, target: GPUTarget) -> None:
    if lib.triple and _arch(lib.triple) != _arch(target.triple):
        raise MoriCompilerError(
            f"device bitcode {path} is for '{lib.triple}', but target {target.name} needs '{target.triple}'"
        )
    cpus = set(re.findall(r'"target-cpu"="([^"]+)"', str(lib)))
    wrong = sorted(cpus - {target.cpu})
    if wrong:
        raise MoriCompilerError(
            f"device bitcode {path} was built for {', '.join(wrong)}, not {target.cpu}; "
            "build or choose the bitcode for the same GPU"
        )


def load_bitcode(path: str, target: GPUTarget):
    llvm = _llvm()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MoriCompilerError(f"cannot read device bitcode {path}: {exc.strerror}") from None
    try:
        lib = llvm.parse_bitcode(data)
    except RuntimeError as exc:
        raise MoriCompilerError(f"{path} is not a valid LLVM bitcode file ({' '.join(str(exc).split())})") from None
    _check_bitcode_target(path, lib, target)
    return lib


def _code_object_flag_module(target: GPUTarget, version: int):
    text = (
        f'target triple = "{target.triple}"\n'
        "!llvm.module.flags = !{!0}\n"
        f'!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {version * 100}}}\n'
    )
    return _llvm().parse_assembly(text)


def undefined_functions(module) -> list[str]:
    """Declared-but-not-defined functions that are not LLVM intrinsics."""
    return sorted(f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm."))


def link_device_code(llvm_ir: str, kernels, target: GPUTarget, bitcode_paths, *, code_object_version: int = 6,
                     shown_as: dict | None = None):  # fmt: skip
    """Parse the kernels, link the bitcode files, internalize; returns the llvmlite module. ``shown_as``:
    the name an error gives a linked file (the user's path of a prepared copy)."""
    llvm = _llvm()
    module = llvm.parse_assembly(llvm_ir)
    module.triple = target.triple
    module.data_layout = str(target_machine(target).target_data)
    for path in bitcode_paths:
        lib = load_bitcode(path, target)
        lib.triple, lib.data_layout = module.triple, module.data_layout
        try:
            module.link_in(lib)
        except RuntimeError as exc:  # e.g. the bitcode defines a kernel's (or an earlier bitcode's) symbol
            shown = (shown_as or {}).get(path, path)
            raise MoriCompilerError(f"cannot link device bitcode {shown}: {' '.join(str(exc).split())} (a device "
                                    "library must not define the kernels' or another library's symbols)") from None
    if target.is_amdgpu:
        try:
            module.link_in(_code_object_flag_module(target, code_object_version))
        except RuntimeError as exc:
            raise MoriCompilerError(
                f"code object version {code_object_version} conflicts with the linked device bitcode "
                f"({str(exc).strip()}); pass the code object version the bitcode was built for"
            ) from None
    kernels = set(kernels)
    for fn in module.functions:
        if not fn.is_declaration and fn.name not in kernels:
            fn.linkage = "internal"
    for gv in module.global_variables:
        if not gv.is_declaration and not _preserved(gv.name) and not gv.name.startswith("llvm."):
            gv.linkage = "internal"
    module.verify()
    return module


def ir_pipeline_level(target: GPUTarget, opt_level: int) -> int:
    """The speed level of LLVM's IR pipeline for ``opt_level`` (codegen always runs at ``opt_level``).

    AMDGPU: O1 for every level >= 1, without loop unrolling. The kernels' loops are written the way they
    should run (copy rounds unrolled by hand; loops over the K destinations or top-k slots on purpose):
    unrolling those K x 8 times is what made the dispatch 2,600 instructions with SGPR spills and half its
    compile time. With that, O2/O3's extra passes (GVN, jump threading, value propagation, more
    InstCombine rounds) change nothing useful: every EP kernel's instruction mix at O1 is O3's within 1 %,
    for a fifth less optimization time (bench/ep_kernel_resources.py). sm_90 keeps the level asked for,
    the pipeline its PTX was measured with."""
    return min(opt_level, 1) if target.is_amdgpu else opt_level


def optimize(module, target: GPUTarget, opt_level: int) -> None:
    """LLVM's IR pipeline at ``ir_pipeline_level`` (AMDGPU: no loop unrolling; see there)."""
    llvm = _llvm()
    tm = target_machine(target, opt_level)
    pto = llvm.create_pipeline_tuning_options(speed_level=ir_pipeline_level(target, opt_level))
    if target.is_amdgpu:
        pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


def check_resolved(module, what: str) -> None:
    missing = undefined_functions(module)
    if missing:
        raise MoriCompilerError(
            f"{what} calls undefined functions: {', '.join(missing)}; link a device bitcode that "
            "defines them (--bitcode PATH) or use the project's device library"
        )
