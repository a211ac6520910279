"""Which kernel bundle an EP op loads: the mori_ep module of a config, its kernels, and ``ep_bundle``.

The kernels of a config are the EP schema's families of its kernel type (ep_schema.KERNELS), each for the
dtypes of its leg; their names are ``KernelSignature.kernel_name``.

Kept apart from the op (dispatch_combine.py) because it is the warm-start path: a process that finds the
bundle in the cache imports this, the config and the cache, and neither the op, torch nor the compiler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mori_compiler.ep_schema import LEGS, MAX_BLOCKS, SIZE_ATTRIBUTES, EpSizes, KernelSignature, families, leg_dtypes

from .config import EpDispatchCombineConfig, EpDispatchCombineKernelType, validate_config


@dataclass(frozen=True)
class PlannedKernel:
    """One kernel of a config's bundle: its family's signature (ep_schema.KERNELS) and its token dtype."""

    signature: KernelSignature
    dtype: str

    @property
    def name(self) -> str:
        return self.signature.kernel_name(self.dtype)


def kernel_plan(cfg: EpDispatchCombineConfig) -> list[PlannedKernel]:
    """Every kernel ``cfg`` can launch, in the bundle's order: per leg, per dtype, the kernel type's families."""
    kind = EpDispatchCombineKernelType(cfg.kernel_type)
    return [PlannedKernel(sig, dtype) for leg in LEGS for dtype in leg_dtypes(leg, cfg.max_token_type_size)
            for sig in families(kind, leg)]  # fmt: skip


def _op_text(kernel: PlannedKernel, sizes: EpSizes, cfg: EpDispatchCombineConfig, wave_size: int, asyncll) -> str:
    sig = kernel.signature
    attrs = [f"{name} = {getattr(sizes, name)} : i64" for name in SIZE_ATTRIBUTES]
    attrs += [f"warps_per_block = {cfg.warp_num_per_block} : i64", f"wave_size = {wave_size} : i64",
              f'dtype = "{kernel.dtype}"']  # fmt: skip
    if sig.leg == "dispatch":
        attrs.append(f"scale_bytes = {sizes.scale_bytes} : i64")
    if sig.zero_copy is not None:
        attrs += [f"zero_copy = {sig.zero_copy} : i64", f"max_blocks = {MAX_BLOCKS} : i64"]
    if EpDispatchCombineKernelType.AsyncLL in sig.kinds:
        attrs += [f"{k} = {v} : i64" for k, v in asyncll.ir_attributes().items()]
    return f'    "mori_ep.{sig.op}"() {{{", ".join(attrs)}}} : () -> ()'


def _module_name(kind: EpDispatchCombineKernelType) -> str:
    return {EpDispatchCombineKernelType.AsyncLL: "mori_ep_asyncll",
            EpDispatchCombineKernelType.IntraNodeLL: "mori_ep_intranode_ll"}.get(kind, "mori_ep_intranode")  # fmt: skip


def kernel_module_source(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None) -> str:
    """The mori_ep module of every kernel this config can launch (one bundle, one module load): the op-level
    IR, one op per kernel, its attributes the config's EpSizes. For AsyncLL, ``asyncll`` (an
    AsyncLLOptions) sets the halves' notification mode."""
    sizes = cfg.sizes
    body = "\n".join(_op_text(k, sizes, cfg, wave_size, asyncll) for k in kernel_plan(cfg))
    name = _module_name(EpDispatchCombineKernelType(cfg.kernel_type))
    return f"module attributes {{gpu.container_module}} {{\n  gpu.module @{name} {{\n{body}\n  }}\n}}\n"


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


def ep_bundle(config: EpDispatchCombineConfig, target: str, *, virtual_pes: bool, asyncll=None, cache_root=None,
              bitcode=None):  # fmt: skip
    """The kernel bundle ``EpDispatchCombineOp`` loads for ``config`` on ``target``: from the cache, or
    compiled now where the compiler is installed. The one place that maps a config to its bundle, so that
    precompiling scripts build exactly what the op will look up. ``asyncll``: the AsyncLL notification
    mode (default: resolved from the environment); ignored by the other kernel types. ``bitcode``: a path,
    or a tuple of paths, of device bitcode (e.g. MORI's ``libmori_shmem_device.bc``) linked instead of the
    project's device library; None leaves the choice to ``CompileOptions``. A cached bundle is verified
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
    validate_config(config, gpu_target.wave_size)
    kind = EpDispatchCombineKernelType(config.kernel_type)
    if kind == EpDispatchCombineKernelType.AsyncLL:
        from .asyncll import AsyncLLOptions, resolve

        asyncll = resolve() if asyncll is None else asyncll
        if not isinstance(asyncll, AsyncLLOptions):
            raise MoriCompilerError(f"ep_bundle: asyncll must be None or an AsyncLLOptions, got {asyncll!r}")
    source = kernel_module_source(config, gpu_target.wave_size, asyncll)
    choice = {} if bitcode is None else {"bitcode": _bitcode_paths(bitcode)}
    options = CompileOptions(target=gpu_target.name, virtual_pes=virtual_pes, **choice)
    return get_bundle(source, options, cache_root=cache_root, what=f"EP {kind.name} kernels ({gpu_target.name})",
                      kernels=kernel_names(config))  # fmt: skip
