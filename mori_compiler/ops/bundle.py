"""Which kernel bundle an EP op loads: the mori_ep module of a config, its kernels, and ``ep_bundle``.

The kernels of a config are the EP schema's families of its kernel type (ep_schema.KERNELS), each for the
dtypes of its leg; their names are ``KernelSignature.kernel_name``. From the config to the kernel, one
typed object after the other: ``cfg.sizes`` (EpSizes) -> ``module_plan(cfg, ...)`` (EpModulePlan: per
kernel, its mori_ep op's attributes as Python ints and strs) -> ``build_kernel_module(plan)`` (the
ir.Module, built with the dialect's builder) -> ``compile_source``. The plan's text (``source()``,
``kernel_module_source``) is only the bundle key's input and what ``mori-opt`` users feed; no compile
parses it.

Kept apart from the op (dispatch_combine.py) because it is the warm-start path: a process that finds the
bundle in the cache imports this, the config and the cache, and neither the op, torch nor the compiler.
"""

from __future__ import annotations

import operator
import os
from collections import namedtuple

from mori_compiler.ep_schema import (INTERNODE, LEGS, MAX_BLOCKS, SIZE_ATTRIBUTES, EpSizes, KernelSignature, families,
                                     internode_attributes, leg_dtypes)
from mori_compiler.wire_quant import BLOCKWISE_QUANT_TYPES, QUANT_COMBINE_DTYPE

from .config import EpDispatchCombineConfig, EpDispatchCombineKernelType, quant_scale_blocks, validate_config

# The combine ops that carry a wire quantization (dialects/mori_ep.py QUANT_OPS; bf16 rows, push or AsyncLL).
_QUANT_OPS = ("combine", "combine_send", "combine_recv")


class PlannedKernel(namedtuple("PlannedKernel", ("signature", "dtype", "any_hidden"), defaults=(0,))):
    """One kernel of a config's bundle: its family's signature (ep_schema.KERNELS), its token dtype, and
    whether it is the variant for any hidden (1) or for the config's (0)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self.signature.kernel_name(self.dtype, self.any_hidden)


def kernel_plan(cfg: EpDispatchCombineConfig) -> list[PlannedKernel]:
    """Every kernel ``cfg`` can launch, in the bundle's order: per variant (the config's hidden, then any
    hidden), per leg, per dtype, the kernel type's families."""
    kind = EpDispatchCombineKernelType(cfg.kernel_type)
    return [PlannedKernel(sig, dtype, any_hidden) for any_hidden in (0, 1) for leg in LEGS
            for dtype in leg_dtypes(leg, cfg.max_token_type_size) for sig in families(kind, leg)]  # fmt: skip


class EpOpPlan(namedtuple("EpOpPlan", ("kernel", "attributes"))):
    """One op of a config's mori_ep module: the kernel it becomes (a PlannedKernel: family signature and
    dtype) and its attributes, ``(name, value)`` pairs in the order the source text writes them, each value
    a Python ``int`` (an ``i64`` attribute) or ``str``."""

    __slots__ = ()

    @property
    def op(self) -> str:
        """The op's short name (dialects/mori_ep.py's EP_OPS), e.g. ``dispatch``."""
        return self.kernel.signature.op

    def source(self) -> str:
        """The op in MLIR's generic form, one line (as the module's text holds it)."""
        attrs = ", ".join(f'{name} = "{value}"' if isinstance(value, str) else f"{name} = {value} : i64"
                          for name, value in self.attributes)  # fmt: skip
        return f'    "mori_ep.{self.op}"() {{{attrs}}} : () -> ()'


class EpModulePlan(namedtuple("EpModulePlan", ("gpu_module", "ops"))):
    """The mori_ep module of one config, as Python values: the ``gpu.module``'s name and its ops (EpOpPlan,
    one per kernel, in the bundle's order). ``source()`` is its text (the bundle key's input, what
    ``mori-opt`` users feed); ``build_kernel_module(plan)`` builds the same module as IR, without text.
    Standard library only: the warm start computes it to find the cached bundle."""

    __slots__ = ()

    def source(self) -> str:
        body = "\n".join(op.source() for op in self.ops)
        return f"module attributes {{gpu.container_module}} {{\n  gpu.module @{self.gpu_module} {{\n{body}\n  }}\n}}\n"

    def kernel_names(self) -> list[str]:
        return [op.kernel.name for op in self.ops]


def _quant_attributes(kernel: PlannedKernel, cfg: EpDispatchCombineConfig, scale_blocks: int) -> list:
    """``quant``/``scale_blocks`` of a combine op: the config's quantization for the bf16 push and AsyncLL
    combines; none (no attributes) for the zero-copy and f32 ones (a quantizing op refuses those calls)."""
    quant = getattr(cfg, "quant_type", "none")
    if quant == "none" or kernel.dtype != QUANT_COMBINE_DTYPE or kernel.signature.zero_copy == 1:
        return []  # absent: no quantization (the text of an unquantized config is unchanged)
    return [("quant", quant), ("scale_blocks", scale_blocks if quant in BLOCKWISE_QUANT_TYPES else 0)]


def _op_attributes(kernel: PlannedKernel, sizes: EpSizes, cfg: EpDispatchCombineConfig, wave_size: int,
                   asyncll, scale_blocks: int = 0) -> tuple:  # fmt: skip
    """The attributes of ``kernel``'s mori_ep op (dialects/mori_ep.py says what each means): the sizes, the
    launch geometry and dtype; the scale bytes on the dispatch leg; the combine's form; the topology of the
    inter-node kernel types (ep_schema.internode_attributes); the barrier's block bound for the kernels
    with the device barrier; AsyncLL's notification mode."""
    sig = kernel.signature
    attrs = [(name, getattr(sizes, name)) for name in SIZE_ATTRIBUTES]
    attrs += [("warps_per_block", cfg.warp_num_per_block), ("wave_size", wave_size), ("dtype", kernel.dtype)]
    if kernel.any_hidden:
        attrs.append(("any_hidden", 1))
    if sig.leg == "dispatch":
        attrs.append(("scale_bytes", sizes.scale_bytes))
    if sig.zero_copy is not None:
        attrs.append(("zero_copy", sig.zero_copy))
    if sig.kinds & INTERNODE:
        kind = EpDispatchCombineKernelType(cfg.kernel_type)
        attrs += list(internode_attributes(kind, cfg.gpu_per_node, cfg.num_qp_per_pe).items())
    if _uses_device_barrier(sig):  # its epoch slots are per block: the grid it may be launched with
        attrs.append(("max_blocks", MAX_BLOCKS))
    if EpDispatchCombineKernelType.AsyncLL in sig.kinds:
        attrs += list(asyncll.ir_attributes().items())
    if sig.op in _QUANT_OPS:
        attrs += _quant_attributes(kernel, cfg, scale_blocks)
    return tuple((name, value if isinstance(value, str) else operator.index(value)) for name, value in attrs)


def _uses_device_barrier(sig: KernelSignature) -> bool:
    return any(p.buffer == "bar_epochs" for p in sig.params)


def _module_name(kind: EpDispatchCombineKernelType) -> str:
    if kind in INTERNODE:
        return "mori_ep_internode"
    return {EpDispatchCombineKernelType.AsyncLL: "mori_ep_asyncll",
            EpDispatchCombineKernelType.IntraNodeLL: "mori_ep_intranode_ll"}.get(kind, "mori_ep_intranode")  # fmt: skip


def module_plan(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None,
                scale_blocks: int | None = None) -> EpModulePlan:
    """The mori_ep module of every kernel this config can launch (one bundle, one module load): one op per
    kernel of ``kernel_plan(cfg)``, its attributes the config's EpSizes. For AsyncLL, ``asyncll`` (an
    AsyncLLOptions; default: resolved from the environment, as ep_bundle does) sets the halves'
    notification mode. ``scale_blocks``: a blockwise quantization's scale blocks per row (default:
    ``$MORI_FP8_COMBINE_SCALE_DIM``, read now). The config is not validated here (ep_bundle does that
    first)."""
    if asyncll is None and EpDispatchCombineKernelType(cfg.kernel_type) == EpDispatchCombineKernelType.AsyncLL:
        from .asyncll import resolve

        asyncll = resolve()
    sizes = cfg.sizes
    blocks = quant_scale_blocks(cfg, scale_blocks)
    ops = tuple(EpOpPlan(k, _op_attributes(k, sizes, cfg, wave_size, asyncll, blocks)) for k in kernel_plan(cfg))
    return EpModulePlan(_module_name(EpDispatchCombineKernelType(cfg.kernel_type)), ops)


def kernel_module_source(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None,
                         scale_blocks: int | None = None) -> str:
    """The text of ``module_plan(cfg, wave_size, asyncll, scale_blocks)``: the op-level IR the bundle key is
    computed from, and what ``mori-opt`` takes."""
    return module_plan(cfg, wave_size, asyncll, scale_blocks).source()


# The name in the locations of the ops build_kernel_module makes (diagnostics say "generated by ...").
MODULE_GENERATOR = "ops.bundle.build_kernel_module"


def build_kernel_module(plan: EpModulePlan, context=None):
    """``plan`` as an ``ir.Module`` (``builtin.module {gpu.container_module}`` holding the gpu.module and
    the mori_ep ops), built with the dialect's typed builder (dialects/mori_ep.py ``ep_op``): no text, no
    parse. Prints as the parse of ``plan.source()`` does. In ``context`` (default: a new one, project
    dialects loaded); imports MLIR, so only a compile calls it."""
    from mori_compiler._mlir import ir, new_context
    from mori_compiler.dialects import mori_ep, registry
    from mori_compiler.dialects.builder import generated_location, new_gpu_module

    ctx = context if context is not None else new_context()
    registry.load_all(ctx)
    with ctx, generated_location(MODULE_GENERATOR) as loc:
        module, body = new_gpu_module(plan.gpu_module)
        ip = ir.InsertionPoint(body)
        for op in plan.ops:
            mori_ep.ep_op(op.op, dict(op.attributes), loc=loc, ip=ip)
    return module


def kernel_names(cfg: EpDispatchCombineConfig) -> list[str]:
    """The kernels the bundle of ``cfg`` holds (the names the op launches)."""
    return [k.name for k in kernel_plan(cfg)]


def _bitcode_paths(bitcode) -> tuple[str, ...]:
    from mori_compiler.errors import MoriCompilerError

    paths = (bitcode,) if isinstance(bitcode, (str, os.PathLike)) else bitcode
    if not isinstance(paths, (tuple, list)) or not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise MoriCompilerError(f"ep_bundle: bitcode must be None, a path or a non-empty tuple of paths (str or "
                                f"os.PathLike) to device bitcode files, got {bitcode!r}")  # fmt: skip
    return tuple(os.fspath(p) for p in paths)


def device_target(state) -> str:
    """The target whose kernels the shmem ``state``'s driver loads when the caller names none: sm_90 on
    CUDA (the H200s the project runs on), gfx942 on HIP."""
    return "sm_90" if state.driver.backend in ("nvvm", "cuda") else "gfx942"


def ep_bundle(config: EpDispatchCombineConfig, target: str, *, virtual_pes: bool, asyncll=None, cache_root=None,
              bitcode=None, scale_blocks: int | None = None, trace: bool = False):  # fmt: skip
    """The kernel bundle ``EpDispatchCombineOp`` loads for ``config`` on ``target``: from the cache, or
    compiled now where the compiler is installed. The one place that maps a config to its bundle, so that
    precompiling scripts build exactly what the op will look up. ``asyncll``: the AsyncLL notification
    mode (default: resolved from the environment); ignored by the other kernel types. ``bitcode``: a path,
    or a tuple of paths, of device bitcode (e.g. MORI's ``libmori_shmem_device.bc``) linked instead of the
    project's device library; None leaves the choice to ``CompileOptions``. ``scale_blocks``: a blockwise
    ``quant_type``'s scale blocks per row (default: ``$MORI_FP8_COMBINE_SCALE_DIM``). ``trace``: the kernels'
    phase trace points compiled in (CompileOptions.trace; docs/tracing.md). A cached bundle is verified
    (target, kernel table, code-object hash) before it is returned; see mori_compiler/cache.py."""
    from mori_compiler.cache import get_bundle
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.options import CompileOptions
    from mori_compiler.targets import TARGETS, get_target

    if not isinstance(target, str):
        raise MoriCompilerError(f"ep_bundle: target must be a target name ({', '.join(TARGETS)}), got {target!r}")
    if cache_root is not None and not isinstance(cache_root, (str, os.PathLike)):
        raise MoriCompilerError(f"ep_bundle: cache_root must be None or a path, got {cache_root!r}")
    gpu_target = get_target(target)
    validate_config(config, gpu_target.wave_size, gpu_target.name)
    kind = EpDispatchCombineKernelType(config.kernel_type)
    if kind == EpDispatchCombineKernelType.AsyncLL:
        from .asyncll import AsyncLLOptions, resolve

        asyncll = resolve() if asyncll is None else asyncll
        if not isinstance(asyncll, AsyncLLOptions):
            raise MoriCompilerError(f"ep_bundle: asyncll must be None or an AsyncLLOptions, got {asyncll!r}")
    plan = module_plan(config, gpu_target.wave_size, asyncll, scale_blocks)
    choice = {} if bitcode is None else {"bitcode": _bitcode_paths(bitcode)}
    if not isinstance(trace, bool):
        raise MoriCompilerError(f"ep_bundle: trace must be a bool, got {trace!r}")
    options = CompileOptions(target=gpu_target.name, virtual_pes=virtual_pes, trace=trace, **choice)
    # Keyed by the plan's text (unchanged keys, precompiled bundles found), compiled from the built module.
    return get_bundle(plan.source(), options, cache_root=cache_root, what=f"EP {kind.name} kernels ({gpu_target.name})",
                      kernels=plan.kernel_names(), module=lambda: build_kernel_module(plan))  # fmt: skip
