"""The compile pipeline as an ordered list of named stages.

    mori → ep → abi → rocdl | nvvm → llvm-ir → link → opt → isa → object → hsaco     (AMDGPU)
    mori → ep → abi → nvvm → llvm-ir → link → opt → ptx                             (NVIDIA)

The MLIR stages are pass-pipeline strings; together they print as one ``builtin.module(...)`` string that
``mori-opt -p`` accepts verbatim, so any failure can be replayed. The LLVM-level stages (llvmlite link and
codegen, ld.lld) are not MLIR passes but are named and printable the same way. Only the driver knows
where to stop (``stop_after``); stages never look at it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ._mlir import ir, new_context
from .codeobject import check_no_undefined_symbols
from .dialects import registry
from .errors import MoriCompilerError, location_text, one_line, with_filename
from .options import CompileOptions, device_bitcode  # noqa: F401 (device_bitcode: re-exported)
from .pass_pipeline import build_pass_manager
from .passes import codegen, device_link
from .passes.gpu_kernels import signatures_of_module
from .passes.to_llvm_ir import gpu_module_to_llvm_ir
from .targets import GPUTarget

MLIR_STAGES = ("ep", "abi", "rocdl", "nvvm")


def mlir_stage_pipelines(options: CompileOptions) -> list[tuple[str, str]]:
    """(stage, pass-pipeline fragment) for every MLIR stage of ``options``' target."""
    t = options.gpu_target
    wave = t.wave_size
    # Two accumulated vectors per lane measured faster on sm_90 (H200); one keeps AMDGPU's loads together.
    # AMDGPU: rows addressed as global memory (global_* accesses, not flat_*) and row_copy_to_peers as a
    # loop over its destinations (compact code); sm_90 keeps the form it was measured with.
    # AMDGPU: the combines' per-token addresses from warp-uniform values (see MoriEpToKernels).
    kernels = f"wave-size={wave}" + (" uniform-addressing=true global-address-space=true" if t.is_amdgpu else "")
    blocks = f"wave-size={wave} vectors-per-lane={2 if t.is_nvptx else 1}"
    if t.is_amdgpu:
        blocks += " global-address-space=true loop-destinations=true"
    blocks += f" chip={t.name}"  # the wire quantization's conversion instructions
    trace = f"mori-trace-to-timer{{enabled={'true' if options.trace else 'false'} wave-size={wave}}}"
    stages = [
        # Virtual PEs all run on this one GPU, in one launch: the collectives' meets fence at its scope
        # (one_gpu_barrier) and the launch's end closes each call (no closing meet).
        ("ep", f"mori-coll-to-kernels{{wave-size={wave}{' one-gpu=true one-launch=true' if options.virtual_pes else ''}}},"
               f"mori-ep-to-kernels{{{kernels}}},"
               f"mori-comm-to-calls{{{blocks}}},{trace}"),
        ("abi", "mori-virtual-pe-args,mori-shmem-to-abi" if options.virtual_pes else "mori-shmem-to-abi"),
    ]
    if t.is_amdgpu:
        stages.append((
            "rocdl",
            f"gpu.module(convert-scf-to-cf,convert-gpu-to-rocdl{{chipset={t.name} index-bitwidth=64}}),"
            f"rocdl-attach-target{{chip={t.name} abi={options.code_object_version * 100}"
            f" wave64={'true' if t.wave_size == 64 else 'false'}}},reconcile-unrealized-casts",
        ))  # fmt: skip
    else:
        stages.append((
            "nvvm",
            "gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm{index-bitwidth=64}),"
            f"nvvm-attach-target{{chip={t.name} features={t.features}}},reconcile-unrealized-casts",
        ))  # fmt: skip
    return stages


def mlir_pipeline_string(options: CompileOptions) -> str:
    return "builtin.module(" + ",".join(p for _, p in mlir_stage_pipelines(options)) + ")"


def stage_names(target: GPUTarget) -> list[str]:
    lowering = "rocdl" if target.is_amdgpu else "nvvm"
    tail = ["isa", "object", "hsaco"] if target.is_amdgpu else ["ptx"]
    return ["mori", "ep", "abi", lowering, "llvm-ir", "link", "opt", *tail]


def _ir_level_note(options: CompileOptions) -> str:
    ir_level = device_link.ir_pipeline_level(options.gpu_target, options.opt_level)
    return "" if ir_level == options.opt_level else f" (IR pipeline O{ir_level}, codegen O{options.opt_level})"


def describe_pipeline(options: CompileOptions, bitcode_paths: list[str] | None = None) -> str:
    """One line per stage; the MLIR part is also given as a single replayable pipeline string."""
    t = options.gpu_target
    libs = ", ".join(bitcode_paths) if bitcode_paths is not None else "(device bitcode)"
    lines = [f"mori: verify the input against the project dialects (IRDL constraints)"]
    lines += [f"{name}: {frag}" for name, frag in mlir_stage_pipelines(options)]
    lines += [
        f"llvm-ir: translate the gpu.module to LLVM IR ({t.triple})",
        f"link: llvmlite link {libs}; internalize all but kernels and state globals; check symbols",
        f"opt: LLVM O{options.opt_level} for {t.cpu}{_ir_level_note(options)}",
    ]
    if t.is_amdgpu:
        lines += [
            f"isa: AMDGPU assembly for {t.cpu} (code object v{options.code_object_version})",
            "object: ELF relocatable object",
            "hsaco: ld.lld -shared; reject undefined symbols; read AMDHSA metadata",
        ]
    else:
        lines += [f"ptx: PTX for {t.cpu} ({t.features.lstrip('+')})"]
    lines.append(f"mlir pipeline: {mlir_pipeline_string(options)}")
    return "\n".join(lines)


@dataclass
class CompileResult:
    """Everything a compile produced; fields are filled up to the stage where it stopped."""

    options: CompileOptions
    stopped_after: str
    mlir: str | None = None
    llvm_ir: str | None = None
    linked_llvm_ir: str | None = None
    assembly: str | None = None
    binary: bytes | None = None  # hsaco (AMDGPU) or PTX text bytes (NVIDIA)
    kernels: tuple[str, ...] = ()
    bitcode: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    signatures: dict = field(default_factory=dict)  # kernel name -> gpu_kernels.CompiledKernel, after the ep stage
    signature_problems: dict = field(default_factory=dict)  # kernel name -> why it has no signature


def stage_output(result: CompileResult) -> str | bytes:
    """What the stage ``result`` stopped after produced: IR text, assembly, or the object/code object bytes."""
    stage = result.stopped_after
    if stage in ("mori", *MLIR_STAGES):
        return result.mlir or ""
    if stage == "llvm-ir":
        return result.llvm_ir or ""
    if stage in ("link", "opt"):
        return result.linked_llvm_ir or ""
    if stage in ("isa", "ptx"):
        return result.assembly or ""
    return result.binary or b""


def _check_stage(name: str, target: GPUTarget) -> None:
    names = stage_names(target)
    if name not in names:
        raise MoriCompilerError(f"unknown stage '{name}' for target {target.name}; stages: {', '.join(names)}")


def _raise_problems(errors: list[str]) -> None:
    """One MoriCompilerError for located problems (``file:line:col: message`` each), one line per problem."""
    if errors:
        errors = [one_line(e) for e in errors]
        loc, _, msg = errors[0].partition(": ")
        raise MoriCompilerError("\n".join([msg] + errors[1:]), loc)


def _copy_of_built_module(module: ir.Module, filename: str) -> tuple[ir.Module, ir.Context]:
    """A checked copy of a module built in Python, in its context (the caller's module is left as it is;
    its context is set to run on one thread and gets the project dialects).

    The checks ``registry.parse_source`` makes of text, where they apply to a built module: the structural
    checks (inputs MLIR would abort on), the project ops against their IRDL constraints, then MLIR's
    verifier. The context gets the project dialects (idempotent) and runs on the calling thread, which the
    Python passes need (see ``_mlir.new_context``)."""
    ctx = module.context
    ctx.enable_multithreading(False)
    registry.load_all(ctx)
    where = lambda op: location_text(op.location, filename)  # noqa: E731
    _raise_problems(registry.structural_problems(module.operation, where)
                    or registry.verify_project_ops(module.operation, filename))  # fmt: skip
    try:
        module.operation.verify()
    except ir.MLIRError as exc:
        raise registry.diagnostics_message(exc, filename) from None
    with ctx:
        copy = ir.Module.create(module.operation.location)
        for name in module.operation.attributes:
            copy.operation.attributes[name] = module.operation.attributes[name]
        for op in module.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(copy.body))
    return copy, ctx


def compile_source(
    source: str | ir.Module,
    options: CompileOptions | None = None,
    *,
    filename: str = "-",
    stop_after: str | None = None,
    want_assembly: bool = False,
) -> CompileResult:
    """Compile one gpu.module through the pipeline (up to ``stop_after``): MLIR text, or an ``ir.Module``
    built in Python (e.g. with dialects/builder.py; checked as text is, and compiled from a copy, so the
    caller's module is not lowered; ``filename`` names it in messages)."""
    if not isinstance(source, (str, ir.Module)):
        raise MoriCompilerError(f"compile_source takes MLIR text or an mlir.ir.Module, not {type(source).__name__}")
    options = options or CompileOptions()
    target = options.gpu_target
    final = stage_names(target)[-1]
    stop_after = stop_after or final
    _check_stage(stop_after, target)
    result = CompileResult(options, stop_after)
    clock = time.perf_counter()

    def lap(stage: str) -> bool:
        nonlocal clock
        now = time.perf_counter()
        result.timings[stage] = now - clock
        clock = now
        return stage == stop_after

    if isinstance(source, ir.Module):
        module, ctx = _copy_of_built_module(source, filename)
    else:
        ctx = new_context()
        module = registry.parse_source(source, ctx, filename)
    if lap("mori"):
        result.mlir = str(module)
        return result
    for stage, fragment in mlir_stage_pipelines(options):
        pm = build_pass_manager(f"builtin.module({fragment})", ctx)
        try:
            pm.run(module.operation)
        except MoriCompilerError as exc:
            raise with_filename(exc, filename) from None
        except ir.MLIRError as exc:
            err = registry.diagnostics_message(exc, filename)
            raise MoriCompilerError(
                f"stage '{stage}' failed: {err.message}\n  replay: mori-opt -p '{mlir_pipeline_string(options)}' "
                f"{filename} --mlir-print-ir-after-all",
                err.location,
            ) from None
        if stage == "ep":  # host-visible kernel signatures, before argument tables replace them
            result.signatures = signatures_of_module(module, strict=False, problems=result.signature_problems)
        if lap(stage):
            result.mlir = str(module)
            return result

    device = gpu_module_to_llvm_ir(module, filename)
    result.llvm_ir, result.kernels = device.llvm_ir, device.kernels  # gpu_module_to_llvm_ir refuses no kernel
    if lap("llvm-ir"):
        return result

    result.bitcode = tuple(device_bitcode(options))
    shown_as = dict(zip(result.bitcode, options.bitcode or ()))  # prepared copies -> the user's paths
    llvm_module = device_link.link_device_code(
        device.llvm_ir, device.kernels, target, result.bitcode, code_object_version=options.code_object_version,
        shown_as=shown_as,
    )
    if lap("link"):
        result.linked_llvm_ir = str(llvm_module)
        return result

    device_link.optimize(llvm_module, target, options.opt_level)
    device_link.check_resolved(llvm_module, f"gpu.module @{device.name}")
    result.linked_llvm_ir = str(llvm_module)
    if lap("opt"):
        return result

    if target.is_nvptx:
        ptx = codegen.emit_assembly(llvm_module, target, options.opt_level)
        result.assembly, result.binary = ptx, ptx.encode()
        lap("ptx")
        return result

    if want_assembly or stop_after == "isa":
        result.assembly = codegen.emit_assembly(llvm_module, target, options.opt_level)
    if lap("isa"):
        return result
    obj = codegen.emit_object(llvm_module, target, options.opt_level)
    if lap("object"):
        result.binary = obj
        return result
    hsaco = codegen.link_code_object(obj)
    check_no_undefined_symbols(hsaco, f"code object of gpu.module @{device.name}")
    result.binary = hsaco
    lap("hsaco")
    return result

