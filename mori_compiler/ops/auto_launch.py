"""AUTO launch configuration of the EP op: each call's grid from the tuning tables (MORI's AUTO mode).

In AUTO mode (``MORI_EP_LAUNCH_CONFIG_MODE=AUTO``) MORI takes a call's geometry from the first that applies:
a tuning rule of the kernel type's table for the call (mori_compiler/ops/tuning.py: file, lookup), else its
hard-coded fallback (``tuning.auto_fallback``); both win over the call's own ``block_num``/``warp_per_block``.

Here the warps per block are compiled into the kernels (one bundle per warp count) while ``block_num`` and
``rdma_block_num`` are per call, so ``AutoLaunch`` is built once per op, before its bundles:

* ``warp_counts()``: every warp count a call may get (the warp counts of the rules the op can reach, the
  fallback's where some dtype or combine form has no rule, and the config's): the op builds a bundle and
  launches for each, over one set of buffers;
* ``geometry(leg, dtype, tokens, hidden=..., zero_copy=..., quant_type=...)``: the call's
  ``LaunchGeometry`` (block_num, rdma_block_num, warp_per_block), cached per key (a dict hit per call);
* ``bind_coresidency(max_blocks)``: once the bundles are loaded, the largest grid per PE whose blocks are
  all resident at once (the kernels' grid barriers need that; ``coresident_blocks`` asks the driver).

Every rule of the tables is checked at construction against the config's limits (``config_problems`` of
the config with the rule's geometry: block and warp ranges, IntraNodeLL's two warps, the inter-node grid
rules) and, once bound, every rule the op can reach against co-residency: a rule that cannot run is a
``TuningTableError`` naming the file and the rule, never a launch. The fallback is MORI's guess, not a
measurement: it is clamped to what fits (a grid of at most the co-resident blocks; V0's grid a multiple of
world_size; the RDMA share scaled with it).
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

from mori_compiler.ep_schema import DISPATCH_PAYLOAD_KERNELS, INTERNODE, LEGS, MAX_BLOCKS, leg_dtypes

from .config import EpDispatchCombineConfig, EpDispatchCombineKernelType, _is_int, config_problems, validate_config
from .tuning import (_MODEL, MORI_DTYPES, PHASES, QUANT_TYPES, TuningRule, TuningTableError, auto_fallback,
                     tuning_table_for)  # fmt: skip

_OUR_TO_MORI = {ours: mori for mori, ours in MORI_DTYPES.items() if ours}
_MAX_CACHED = 1 << 14  # geometry() keys kept (token counts vary per call; a full cache starts over)


class LaunchGeometry(NamedTuple):
    """A call's launch geometry (MORI's order): grid blocks per PE, the inter-node role's blocks (0 for the
    intra-node types, and "the op's default" for the inter-node ones), warps per block."""

    block_num: int
    rdma_block_num: int
    warp_per_block: int


# Words of a device name that name the vendor or the product line, not the model.
_NOT_MODEL = {"nvidia", "amd", "tesla", "geforce", "quadro", "instinct", "radeon"}


def gpu_model_name(device_name: str) -> str:
    """The model part of a tuning file name from a device name as torch reports it: "NVIDIA H200" ->
    "h200", "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB" -> "a100", "AMD Instinct MI300X" ->
    "mi300x" (MORI takes the AMD model from the PCI id; the device name gives the same here). A ValueError
    when the name holds no model (lower-case letters and digits)."""
    if not isinstance(device_name, str):
        raise ValueError(f"GPU device name must be a str, got {type(device_name).__name__}")
    words = [w for w in device_name.lower().split() if w not in _NOT_MODEL]
    if len(words) > 1 and words[0] in ("rtx", "gtx"):  # "GeForce RTX 4090": the line is part of the model
        words = [words[0] + words[1]]
    model = words[0].split("-")[0] if words else ""
    if not _MODEL.fullmatch(model):
        raise ValueError(f"GPU device name {device_name!r}: no model name (lower-case letters and digits, e.g. h200) "
                         "in it; pass the model explicitly")  # fmt: skip
    return model


def device_gpu_model(device=None) -> str | None:
    """The model of torch's current (or given) GPU for the tuning file names: ``gpu_model_name`` of its
    device name, or None when the name holds no model (then any model's table of the arch is used, MORI's
    fallback)."""
    import torch

    try:
        return gpu_model_name(torch.cuda.get_device_name(device))
    except ValueError:
        return None


def _tuning_dtype(dtype) -> str | None:
    """MORI's name of one of our token dtypes (or a MORI name itself); None for ours without one."""
    if dtype in MORI_DTYPES:
        return dtype
    if dtype in _OUR_TO_MORI:
        return _OUR_TO_MORI[dtype]
    return None


class AutoLaunch:
    """The AUTO mode of one op: its tables (``tables[phase]``: a TuningTable or None), the fallback, and
    the per-call geometry. ``gpu_model`` None: any model's table of the target's arch (as MORI's fallback);
    ``search_dirs``: where tables are looked for (default the shipped directory; ``MORI_EP_TUNING_CONFIG``
    overrides, see tuning.find_tuning_table)."""

    def __init__(self, config: EpDispatchCombineConfig, target: str, gpu_model: str | None = None, *,
                 search_dirs=None):  # fmt: skip
        from mori_compiler.targets import get_target

        self.target = get_target(target)
        validate_config(config, self.target.wave_size)
        self.config = config
        self.kind = EpDispatchCombineKernelType(config.kernel_type)
        self.tables = {phase: tuning_table_for(self.target.name, gpu_model, self.kind, config.world_size, phase,
                                               search_dirs) for phase in PHASES}  # fmt: skip
        self.fallback = LaunchGeometry(*auto_fallback(self.kind))
        self._max_blocks = None  # bind_coresidency: (leg, warps) -> the largest co-resident grid per PE
        self._cache: dict[tuple, tuple[LaunchGeometry, str]] = {}
        self._forms = {"dispatch": [(None, None)],
                       "combine": [(z, config.quant_type) for z in self.combine_forms()]}  # fmt: skip
        self._reachable = {leg: self._reachable_rules(leg) for leg in LEGS}
        for leg in LEGS:  # every rule, reachable or not: a table is for this kind of op
            for rule in self.tables[leg].rules if self.tables[leg] else ():
                problem = self._geometry_problem(rule.block_num, rule.rdma_block_num, rule.warp_per_block)
                if problem:
                    raise self._rule_error(leg, rule, problem)

    # ---- what the op can reach ------------------------------------------------------------------------
    def combine_forms(self) -> tuple[bool, ...]:
        """The combine forms a call can take (the tables' ``zero_copy`` key): AsyncLL's combine reads the
        caller's tensor (never the registered buffer); the intra-node types offer the push form only when
        built with its staging buffers (``use_external_inp_buf``); the inter-node types accept both."""
        if self.kind == EpDispatchCombineKernelType.AsyncLL:
            return (False,)
        if self.kind in INTERNODE or self.config.use_external_inp_buf:
            return (True, False)
        return (True,)

    def _leg_dtypes(self, leg: str) -> list[str]:
        """The dtypes a call of ``leg`` may have: the kernels' (within the token size) and, for dispatch, the
        payload dtypes that move with the 1-byte kernels (fp4 x2)."""
        dtypes = leg_dtypes(leg, self.config.max_token_type_size)
        return dtypes + (list(DISPATCH_PAYLOAD_KERNELS) if leg == "dispatch" else [])

    def _reachable_rules(self, leg: str) -> list[TuningRule]:
        """The rules of the leg's table a call of this op can be given: of a dtype the op's kernels take
        and, for combine, a form it offers with the config's quant type."""
        table = self.tables[leg]
        if table is None:
            return []
        dtypes = {_tuning_dtype(d) for d in self._leg_dtypes(leg)} - {None}
        forms = set(self._forms[leg])
        return [r for r in table.rules if r.dtype in dtypes and (r.zero_copy, r.quant_type) in forms]

    def _needs_fallback(self, leg: str) -> bool:
        """Whether some dtype or combine form of the leg has no rule (a lookup finds one whenever the table
        has a rule of the dtype and form: the passes end with "any hidden, any top-k", the buckets clamp)."""
        table = self.tables[leg]
        for dtype in self._leg_dtypes(leg):
            name = _tuning_dtype(dtype)
            for zero_copy, quant in self._forms[leg]:
                if table is None or name is None or (quant is not None and quant not in QUANT_TYPES):
                    return True
                if table.lookup(name, 1, self.config.hidden_dim, zero_copy=zero_copy, quant_type=quant) is None:
                    return True
        return False

    def warp_counts(self) -> list[int]:
        """Every warp count a call may be given, ascending: the op needs a bundle (and launches) for each."""
        counts = {self.config.warp_num_per_block}
        for leg in LEGS:
            counts |= {r.warp_per_block for r in self._reachable[leg]}
            if self._needs_fallback(leg):
                counts.add(self.fallback.warp_per_block)
        return sorted(counts)

    # ---- limits ---------------------------------------------------------------------------------------
    def _geometry_problem(self, blocks: int, rdma: int, warps: int) -> str | None:
        """Why the config cannot launch this geometry (its own validation with the geometry put in: one
        owner for the block, warp and inter-node grid rules), or None. A call's rdma_block_num 0 means the
        config's (see dispatch_combine.internode_rdma_blocks)."""
        effective_rdma = rdma if rdma > 0 else self.config.rdma_block_num
        trial = dataclasses.replace(self.config, block_num=blocks, warp_num_per_block=warps,
                                    rdma_block_num=effective_rdma)
        problems = config_problems(trial, self.target.wave_size)
        if problems:
            return "; ".join(p.replace("config.", "") for p in problems)
        return None

    def _rule_error(self, leg: str, rule: TuningRule, problem: str) -> TuningTableError:
        table = self.tables[leg]
        key = f"dtype {rule.dtype}, num_tokens {rule.num_tokens}, hidden_dim {rule.hidden_dim}"
        if rule.zero_copy is not None:
            key += f", zero_copy {str(rule.zero_copy).lower()}, quant_type {rule.quant_type}"
        return TuningTableError(f"tuning file {table.path}: rule {rule.index} ({key}) cannot run on this "
                                f"{self.kind.name} op (block_num {rule.block_num}, rdma_block_num "
                                f"{rule.rdma_block_num}, warp_per_block {rule.warp_per_block}): {problem}")  # fmt: skip

    def bind_coresidency(self, max_blocks) -> None:
        """Set the co-residency limit: ``max_blocks(leg, warps)`` is the largest grid per PE whose blocks
        all fit on the GPU at once (``coresident_blocks``). Every reachable rule is checked against it (a
        TuningTableError naming the file and rule), and the fallback is clamped to it from now on."""
        for leg in LEGS:
            for rule in self._reachable[leg]:
                fits = max_blocks(leg, rule.warp_per_block)
                if rule.block_num > fits:
                    raise self._rule_error(leg, rule, f"only {fits} blocks of {rule.warp_per_block} warps per PE fit "
                                           "co-resident on this GPU (the kernels' grid barriers need every block "
                                           "resident); tune the table on this machine (bench/ep_tune.py)")  # fmt: skip
        self._max_blocks = max_blocks
        self._cache.clear()

    def _fallback_for(self, leg: str) -> LaunchGeometry:
        """MORI's fallback, clamped to what this op can launch (see the module docstring)."""
        blocks, rdma, warps = self.fallback
        limit = MAX_BLOCKS if self._max_blocks is None else min(MAX_BLOCKS, self._max_blocks(leg, warps))
        if blocks > limit:
            blocks = limit
            if self.kind == EpDispatchCombineKernelType.InterNode:  # V0 splits its grid per destination PE
                blocks -= blocks % self.config.world_size
            if rdma:
                rdma = max(1, min(blocks - 1, rdma * blocks // self.fallback.block_num))
        problem = self._geometry_problem(blocks, rdma, warps) if blocks >= 1 else f"no grid of {warps} warps fits"
        if problem:
            raise ValueError(f"AUTO launch of {self.kind.name} {leg}: no rule applies and the fallback geometry "
                             f"{tuple(self.fallback)} clamped to {limit} co-resident blocks cannot run: {problem}")
        return LaunchGeometry(blocks, rdma, warps)

    # ---- per call -------------------------------------------------------------------------------------
    def geometry(self, leg: str, dtype: str, tokens: int, *, hidden: int | None = None, zero_copy: bool | None = None,
                 quant_type: str | None = None) -> LaunchGeometry:  # fmt: skip
        """The geometry of a call: ``leg`` dispatch or combine, the token ``dtype`` (this project's name, e.g.
        bf16, fp8_e4m3fn), ``tokens`` this PE's tokens of the call (for combine: those its
        dispatch sent), ``hidden`` the call's row width (default the config's), for combine ``zero_copy``
        (default: the op's form, see combine_forms) and ``quant_type`` (default the config's)."""
        key = (leg, dtype, tokens, hidden, zero_copy, quant_type)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._resolve(*key)
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[key] = hit
        return hit[0]

    def explain(self, leg: str, dtype: str, tokens: int, **kw) -> str:
        """Where ``geometry(...)`` comes from: "rule I of FILE" or "fallback"."""
        self.geometry(leg, dtype, tokens, **kw)
        return self._cache[(leg, dtype, tokens, kw.get("hidden"), kw.get("zero_copy"), kw.get("quant_type"))][1]

    def _resolve(self, leg, dtype, tokens, hidden, zero_copy, quant_type) -> tuple[LaunchGeometry, str]:
        c = self.config
        if leg not in LEGS:
            raise ValueError(f"AUTO launch: leg {leg!r} is not one of {', '.join(LEGS)}")
        if dtype not in self._leg_dtypes(leg):
            raise ValueError(f"AUTO launch: {leg} dtype {dtype!r} is not one this op's kernels take; allowed: "
                             f"{', '.join(self._leg_dtypes(leg))}")  # fmt: skip
        if not _is_int(tokens) or tokens < 0:
            raise ValueError(f"AUTO launch: tokens {tokens!r} must be an int >= 0")
        hidden = c.hidden_dim if hidden is None else hidden
        if not _is_int(hidden) or not 1 <= hidden <= c.hidden_dim:
            raise ValueError(f"AUTO launch: hidden {hidden!r} must be an int in [1, config.hidden_dim={c.hidden_dim}]")
        if leg == "dispatch":
            if zero_copy is not None or quant_type is not None:
                raise ValueError("AUTO launch: zero_copy and quant_type key combine geometries only")
            form = (None, None)
        else:
            forms = self.combine_forms()
            zero_copy = forms[0] if zero_copy is None else zero_copy
            if not isinstance(zero_copy, bool) or zero_copy not in forms:
                raise ValueError(f"AUTO launch: zero_copy {zero_copy!r} is not a combine form of this op; allowed: "
                                 f"{', '.join(str(f) for f in forms)}")  # fmt: skip
            quant_type = c.quant_type if quant_type is None else quant_type
            if quant_type not in QUANT_TYPES and quant_type != c.quant_type:
                raise ValueError(f"AUTO launch: quant_type {quant_type!r} is not allowed; allowed: "
                                 f"{', '.join(sorted(set(QUANT_TYPES) | {c.quant_type}))}")  # fmt: skip
            # A quant type with no MORI name (ours only) is in no table: the fallback.
            form = (zero_copy, quant_type) if quant_type in QUANT_TYPES else None
        table, name = self.tables[leg], _tuning_dtype(dtype)
        rule = None
        if table is not None and name is not None and form is not None:
            rule = table.lookup(name, max(tokens, 1), hidden, topk=c.num_experts_per_token, zero_copy=form[0],
                                quant_type=form[1])  # fmt: skip
        if rule is None:
            return self._fallback_for(leg), "fallback"
        origin = f"rule {rule.index} of {table.path}"
        return LaunchGeometry(rule.block_num, rule.rdma_block_num, rule.warp_per_block), origin


def leg_kernel_names(config: EpDispatchCombineConfig, leg: str) -> list[str]:
    """The kernels of ``config``'s bundle that a ``leg`` call launches (every dtype)."""
    from .bundle import kernel_plan

    return [k.name for k in kernel_plan(config) if k.signature.leg == leg]


def coresident_blocks(kernels, kernel_names, block_threads: int, pes_per_gpu: int) -> int:
    """The largest grid per PE whose blocks of ``block_threads`` threads are all resident at once on the
    GPU for every kernel of ``kernel_names`` in the loaded bundle ``kernels`` (a runtime KernelSet): the
    driver's occupancy (registers, shared memory, threads) x SMs, shared by the ``pes_per_gpu`` PEs that
    launch together (the virtual PEs; 1 for a process per GPU). What the launcher checks before a launch."""
    driver = kernels.driver
    per_sm = min(driver.max_active_blocks_per_sm(kernels.module.function(name), block_threads, 0)
                 for name in kernel_names)  # fmt: skip
    return per_sm * driver.multiprocessor_count() // pes_per_gpu
