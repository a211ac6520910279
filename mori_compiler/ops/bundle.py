"""Which kernel bundle an EP op loads: the mori_ep module of a config, its kernel names, and ``ep_bundle``.

Kept apart from the op (dispatch_combine.py) because it is the warm-start path: a process that finds the
bundle in the cache imports this, the config and the cache, and neither the op, torch nor the compiler.
"""

from __future__ import annotations

import os

from .config import (COMBINE_DTYPES, DISPATCH_DTYPES, MAX_BLOCKS, _TOKEN_BYTES, EpDispatchCombineConfig,
                     EpDispatchCombineKernelType, validate_config)  # fmt: skip


def _kernel_plan(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None) -> tuple[list[str], list[str]]:
    """The mori_ep ops of every kernel this config can launch, and the names of the kernels they become."""
    kind = EpDispatchCombineKernelType(cfg.kernel_type)
    common = (f"world_size = {cfg.world_size} : i64, hidden = {cfg.hidden_dim} : i64, top_k = "
              f"{cfg.num_experts_per_token} : i64, experts_per_rank = {cfg.num_experts_per_rank} : i64, "
              f"max_tokens_per_rank = {cfg.max_num_inp_token_per_rank} : i64, max_recv_per_rank = "
              f"{cfg.max_recv_per_rank} : i64, warps_per_block = {cfg.warp_num_per_block} : i64, "
              f"wave_size = {wave_size} : i64")  # fmt: skip
    scale_bytes = cfg.scale_dim * cfg.scale_type_size
    dispatch_dtypes = [d for d in DISPATCH_DTYPES if _TOKEN_BYTES[d] <= cfg.max_token_type_size]
    combine_dtypes = [d for d in COMBINE_DTYPES if _TOKEN_BYTES[d] <= cfg.max_token_type_size]
    ops, names = [], []
    if kind == EpDispatchCombineKernelType.AsyncLL:
        mode = ", ".join(f"{k} = {v} : i64" for k, v in asyncll.ir_attributes().items())
        for dtype in dispatch_dtypes:
            for half in ("dispatch_send", "dispatch_recv"):
                ops.append(f'    "mori_ep.{half}"() {{{common}, dtype = "{dtype}", scale_bytes = {scale_bytes} : i64, '
                           f"{mode}}} : () -> ()")  # fmt: skip
                names.append(f"ep_async_{half}_{dtype}")
        for dtype in combine_dtypes:
            for half in ("combine_send", "combine_recv"):
                ops.append(f'    "mori_ep.{half}"() {{{common}, dtype = "{dtype}", {mode}}} : () -> ()')
                names.append(f"ep_async_{half}_{dtype}")
    else:
        dispatch = "dispatch_ll" if kind == EpDispatchCombineKernelType.IntraNodeLL else "dispatch"
        for dtype in dispatch_dtypes:
            ops.append(f'    "mori_ep.{dispatch}"() {{{common}, dtype = "{dtype}", scale_bytes = {scale_bytes} : i64}} : () -> ()')
            names.append(f"ep_{dispatch}_{dtype}")
        for dtype in combine_dtypes:
            for zero_copy in (1, 0):
                ops.append(f'    "mori_ep.combine"() {{{common}, dtype = "{dtype}", zero_copy = {zero_copy} : i64, '
                           f"max_blocks = {MAX_BLOCKS} : i64}} : () -> ()")  # fmt: skip
                names.append(f"ep_combine_{'pull' if zero_copy else 'push'}_{dtype}")
    return ops, names


def _module_name(kind: EpDispatchCombineKernelType) -> str:
    return {EpDispatchCombineKernelType.AsyncLL: "mori_ep_asyncll",
            EpDispatchCombineKernelType.IntraNodeLL: "mori_ep_intranode_ll"}.get(kind, "mori_ep_intranode")  # fmt: skip


def kernel_module_source(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None) -> str:
    """The mori_ep module of every kernel this config can launch (one bundle, one module load). For
    AsyncLL, ``asyncll`` (an AsyncLLOptions) sets the halves' notification mode."""
    ops, _ = _kernel_plan(cfg, wave_size, asyncll)
    body = "\n".join(ops)
    name = _module_name(EpDispatchCombineKernelType(cfg.kernel_type))
    return f"module attributes {{gpu.container_module}} {{\n  gpu.module @{name} {{\n{body}\n  }}\n}}\n"


def kernel_names(cfg: EpDispatchCombineConfig, wave_size: int, asyncll=None) -> list[str]:
    """The kernels the bundle of ``cfg`` holds (the names the op launches)."""
    return _kernel_plan(cfg, wave_size, asyncll)[1]


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
                      kernels=kernel_names(config, gpu_target.wave_size, asyncll))  # fmt: skip
