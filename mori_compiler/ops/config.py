"""The EP configuration (MORI's ``EpDispatchCombineConfig`` and kernel-type enum) and its validation.

Standard library only: the op, the CLI's ``--precompile`` and the reference model all read it. What the
kernels, the buffers and the launches must agree on (dtypes, limits, the kernel-type enum, the derived
sizes) is the EP schema's (mori_compiler/ep_schema.py), re-exported here under MORI's names.
``validate_config`` is table-driven (``_RULES``: each field's type and range, with the reason for each
bound), then checks the relations between fields, some of them per kernel type: the inter-node types
(InterNode = V0, InterNodeV1, InterNodeV1LL) need a topology (``gpu_per_node`` a power of two dividing
``world_size``), a grid with a block for each role (``rdma_block_num`` in [0, ``block_num``)) and, for V0, a
grid that splits evenly over the destination PEs; the intra-node types must keep the defaults of the fields
only the inter-node kernels read (``rdma_block_num`` 0, ``num_qp_per_pe`` 1), so that no value is silently
ignored.
"""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass

from mori_compiler.ep_schema import (COMBINE_DTYPES, DISPATCH_DTYPES, DISPATCH_INPUT_DTYPES, DISPATCH_PAYLOAD_KERNELS,
                                     MAX_BLOCKS, MAX_EXPERTS_PER_RANK,  # noqa: F401
                                     MAX_QP_PER_PE, MAX_HIDDEN_DIM, MAX_SCALE_DIM, MAX_TOKENS_PER_RANK, MAX_WORLD_SIZE, TOKEN_BYTES,
                                     INTERNODE, EpDispatchCombineKernelType, EpSizes, families, recv_per_rank,
                                     topology_problems)
from mori_compiler.wire_quant import (BLOCKWISE_QUANT_TYPES, DEFAULT_COMBINE_SCALE_DIM, FP4_TARGETS,
                                     FP8_COMBINE_SCALE_DIM_ENV, MAX_COMBINE_SCALE_DIM, QUANT_COMBINE_DTYPE, QUANT_TYPES, WIRE_FP8_OF_TARGET)
from mori_compiler.targets import MAX_BLOCK_THREADS

_TORCH_DTYPE_NAMES = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "fp8_e4m3fn",
                      "float8_e4m3fnuz": "fp8_e4m3fnuz", "float4_e2m1fn_x2": "fp4_e2m1fn_x2"}  # fmt: skip


@dataclass
class EpDispatchCombineConfig:
    """MORI's v1 configuration (fields and defaults as ``mori.ops.EpDispatchCombineConfig``).

    ``data_type`` is informative (the kernels follow each call's input dtype); ``max_token_type_size``
    sizes every token buffer; ``use_external_inp_buf=False`` selects the zero-copy combine.
    """

    data_type: object
    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    warp_num_per_block: int = 8
    block_num: int = 80
    max_total_recv_tokens: int = 0
    use_external_inp_buf: bool = True
    kernel_type: EpDispatchCombineKernelType = EpDispatchCombineKernelType.IntraNode
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1
    quant_type: str = "none"

    @property
    def max_recv_per_rank(self) -> int:  # Rp
        return recv_per_rank(self.max_num_inp_token_per_rank, self.max_total_recv_tokens, self.world_size)

    @property
    def max_recv(self) -> int:  # R
        return self.sizes.recv_capacity

    @property
    def sizes(self) -> EpSizes:
        """The kernels' sizes of this configuration (the EP schema's ``EpSizes``); a blockwise quant_type's
        scale blocks from ``$MORI_FP8_COMBINE_SCALE_DIM`` (read now)."""
        return EpSizes.from_config(self, quant_scale_blocks(self))


# The kernel types with kernels: those the EP schema gives a dispatch.
IMPLEMENTED = tuple(k for k in EpDispatchCombineKernelType if families(k, "dispatch"))


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype}; dispatch takes bfloat16, float32, float8_e4m3fn, "
                         f"float8_e4m3fnuz, float4_e2m1fn_x2 and combine bfloat16, float32")  # fmt: skip
    return _TORCH_DTYPE_NAMES[name]


def payload_kernel_dtype(name: str) -> str:
    """The dtype of the kernels that move a row of dtype ``name`` (itself, or the byte mover of its size)."""
    return DISPATCH_PAYLOAD_KERNELS.get(name, name)


def check_call_hidden(hidden, elem_bytes: int, config_hidden: int, what: str) -> None:
    """A call's hidden size (elements of its dtype): an int in [1, config.hidden_dim] whose rows are whole
    16-byte vectors (the kernels copy 16-byte vectors; rows are packed at the call's hidden)."""
    if not _is_int(hidden) or not 1 <= hidden <= config_hidden:
        raise ValueError(f"{what}: hidden size {hidden!r} must be an int in [1, config.hidden_dim={config_hidden}]")
    if hidden * elem_bytes % 16:
        raise ValueError(f"{what}: hidden size {hidden} x {elem_bytes} bytes is not a multiple of 16 bytes (rows "
                         f"are copied as 16-byte vectors: hidden must be a multiple of {16 // elem_bytes})")  # fmt: skip


class ConfigError(ValueError, TypeError):
    """An ``EpDispatchCombineConfig`` the kernels cannot run; one line per problem, each naming
    ``config.<field>``, the value and what is allowed. A ValueError (and a TypeError, for wrong types)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# Upper bounds, and why: the EP schema's (MAX_WORLD_SIZE, MAX_BLOCKS, MAX_HIDDEN_DIM, ...) and these:
MAX_RECV_CAP = 2**31 - 1  # max_total_recv_tokens is a 32-bit count (larger caps change nothing)
MAX_GPU_PER_NODE = 64  # describes the machine; only the inter-node kernel types read it


def _is_int(value) -> bool:
    """An integer that is not a bool (``True`` is not a world size) and not a float (``7168.0`` is not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, numpy_bool_types()))


def numpy_bool_types() -> tuple:
    np = sys.modules.get("numpy")  # NumPy's bool is not an int either; never imported just for this
    return (np.bool_,) if np is not None else ()


@dataclass(frozen=True)
class _Rule:
    """The type of one field (``int``, ``bool``, ``str``, ``kernel_type``, ``dtype``) and, for integers,
    its range [lo, hi] (``hi`` may depend on the target's wave size) or its allowed values."""

    kind: str
    lo: int | None = None
    hi: object = None  # an int, or a function of the wave size
    allowed: tuple = ()
    why: str = ""
    too_large: object = None  # the message for a value above ``hi``: a function of (value, hi)


_RULES: dict[str, _Rule] = {
    "data_type": _Rule("dtype", why="informative: the kernels follow each call's input dtype"),
    "rank": _Rule("int", 0, MAX_WORLD_SIZE - 1),
    "world_size": _Rule("int", 1, lambda wave: min(MAX_WORLD_SIZE, wave), why="one lane per peer in the count handshake"),
    "hidden_dim": _Rule("int", 16, MAX_HIDDEN_DIM),
    "scale_dim": _Rule("int", 0, MAX_SCALE_DIM),
    "scale_type_size": _Rule("int", allowed=(0, 1, 2, 4, 8)),
    "max_token_type_size": _Rule("int", allowed=(1, 2, 4), why="the byte size of the widest token dtype"),
    "max_num_inp_token_per_rank": _Rule("int", 1, MAX_TOKENS_PER_RANK),
    "num_experts_per_rank": _Rule("int", 1, MAX_EXPERTS_PER_RANK),
    "num_experts_per_token": _Rule("int", 1, lambda wave: wave - 1, too_large=lambda v, hi: (
        f"config.num_experts_per_token (top-k {v}) must be smaller than the wave size {hi + 1}")),
    "warp_num_per_block": _Rule("int", 1, lambda wave: MAX_BLOCK_THREADS // wave,
                                why=f"a block has at most {MAX_BLOCK_THREADS} threads"),  # fmt: skip
    "block_num": _Rule("int", 1, MAX_BLOCKS, why="device-barrier epoch slots per PE"),
    "max_total_recv_tokens": _Rule("int", 0, MAX_RECV_CAP, why="0 means no cap"),
    "use_external_inp_buf": _Rule("bool"),
    "kernel_type": _Rule("kernel_type"),
    "gpu_per_node": _Rule("int", 1, MAX_GPU_PER_NODE, why="describes the machine; the intra-node kernels do not read it"),
    "rdma_block_num": _Rule("int", 0, MAX_BLOCKS - 1, why="the inter-node role's blocks; 0: the op chooses"),
    "num_qp_per_pe": _Rule("int", 1, MAX_QP_PER_PE, why="queue pairs per peer of the inter-node kernel types"),
    "quant_type": _Rule("str", allowed=QUANT_TYPES, why="the combine's wire quantization"),
}


def _field_problem(name: str, value, rule: _Rule, wave_size: int) -> str | None:
    shown = f"config.{name} {value!r}"
    why = f" ({rule.why})" if rule.why else ""
    if rule.kind == "int":
        if not _is_int(value):
            return f"{shown} must be an int, not {type(value).__name__}"
        if rule.allowed:
            if value not in rule.allowed:
                return f"{shown} is not allowed; allowed: {', '.join(map(str, rule.allowed))}{why}"
            return None
        hi = rule.hi(wave_size) if callable(rule.hi) else rule.hi
        if value > hi:
            return rule.too_large(value, hi) if rule.too_large else f"{shown} exceeds {hi}{why}"
        if value < rule.lo:
            return f"{shown} must be >= {rule.lo} (allowed: [{rule.lo}, {hi}]){why}"
    elif rule.kind == "bool":
        if not isinstance(value, bool):
            return f"{shown} must be a bool (True or False), not {type(value).__name__}"
    elif rule.kind == "str":
        if not isinstance(value, str):
            return f"{shown} must be a str, not {type(value).__name__}"
        if value not in rule.allowed:
            return f"{shown} is not allowed{why}; allowed: {', '.join(map(repr, rule.allowed))}"
    elif rule.kind == "kernel_type":
        names = ", ".join(k.name for k in EpDispatchCombineKernelType)
        if not _is_int(value):
            return f"{shown} must be an EpDispatchCombineKernelType ({names}), not {type(value).__name__}"
        try:
            kind = EpDispatchCombineKernelType(value)
        except ValueError:
            return f"{shown} is not a kernel type; allowed: {names}"
        if kind not in IMPLEMENTED:
            return (f"config.kernel_type {kind.name} is not implemented in this version (implemented: "
                    f"{', '.join(k.name for k in IMPLEMENTED)})")  # fmt: skip
    elif rule.kind == "dtype":
        name = str(value).removeprefix("torch.") if isinstance(value, str) or type(value).__name__ == "dtype" else None
        name = _TORCH_DTYPE_NAMES.get(name, name)
        if name not in DISPATCH_INPUT_DTYPES:
            return (f"{shown} is not a supported dtype; allowed: torch.bfloat16, torch.float32, torch.float8_e4m3fn, "
                    f"torch.float8_e4m3fnuz, torch.float4_e2m1fn_x2 (or 'bf16', 'f32', 'fp8_e4m3fn', 'fp8_e4m3fnuz', "
                    f"'fp4_e2m1fn_x2'){why}")  # fmt: skip
    return None


def config_problems(cfg: EpDispatchCombineConfig, wave_size: int) -> list[str]:
    """Every problem of ``cfg`` for a target of ``wave_size`` lanes, one message per problem."""
    if not isinstance(cfg, EpDispatchCombineConfig):
        return [f"config must be an EpDispatchCombineConfig, not {type(cfg).__name__}"]
    if not _is_int(wave_size) or wave_size not in (32, 64):
        return [f"wave_size {wave_size!r} must be 32 or 64 (the target's lanes per wave)"]
    problems, bad = [], set()
    for name, rule in _RULES.items():
        problem = _field_problem(name, getattr(cfg, name), rule, wave_size)
        if problem:
            problems.append(problem)
            bad.add(name)

    def ok(*names: str) -> bool:
        return not bad.intersection(names)

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    if ok("rank", "world_size"):
        need(cfg.rank < cfg.world_size, f"config.rank {cfg.rank} is outside [0, world_size={cfg.world_size})")
    if ok("hidden_dim"):
        need(cfg.hidden_dim % 16 == 0,
             f"config.hidden_dim {cfg.hidden_dim} must be a multiple of 16 (16-byte vectors for every dtype)")
    if ok("scale_dim", "scale_type_size"):
        need(cfg.scale_dim == 0 or cfg.scale_type_size != 0,
             f"config.scale_type_size 0 with config.scale_dim {cfg.scale_dim}: scales need a size of 1, 2, 4 or 8")
    if ok("num_experts_per_token", "num_experts_per_rank", "world_size"):
        total = cfg.world_size * cfg.num_experts_per_rank
        need(cfg.num_experts_per_token <= total,
             f"config.num_experts_per_token {cfg.num_experts_per_token} exceeds the {total} experts "
             f"(world_size x num_experts_per_rank)")  # fmt: skip
    if ok("kernel_type", "warp_num_per_block") and cfg.kernel_type == EpDispatchCombineKernelType.IntraNodeLL:
        need(cfg.warp_num_per_block >= 2, f"config.warp_num_per_block {cfg.warp_num_per_block}: IntraNodeLL needs "
             ">= 2 warps per block (a control warp and at least one data warp)")  # fmt: skip
    if ok("kernel_type"):
        kind = EpDispatchCombineKernelType(cfg.kernel_type)
        problems += (_internode_problems if kind in INTERNODE else _intranode_problems)(cfg, kind, ok)
        if ok("quant_type", "use_external_inp_buf", "max_token_type_size"):
            problems += _quant_problems(cfg, kind)
    return problems


# The kernel types whose combine may quantize, and with which quant types (MORI's host rules,
# python/mori/ops/dispatch_combine.py: blockwise only IntraNode/IntraNodeLL, fp8_blockwise also AsyncLL;
# fp8_direct_cast IntraNode push and AsyncLL; the inter-node combines are not quantized in this version).
QUANT_KINDS = {
    EpDispatchCombineKernelType.IntraNode: ("fp8_direct_cast", "fp8_blockwise", "fp4_blockwise"),
    EpDispatchCombineKernelType.IntraNodeLL: ("fp8_direct_cast", "fp8_blockwise", "fp4_blockwise"),
    EpDispatchCombineKernelType.AsyncLL: ("fp8_direct_cast", "fp8_blockwise"),
}


def _quant_problems(cfg: EpDispatchCombineConfig, kind: EpDispatchCombineKernelType) -> list[str]:
    """The kernel-type rules of a wire quantization (target rules: quant_target_problems)."""
    q = cfg.quant_type
    if q == "none":
        return []
    allowed = QUANT_KINDS.get(kind, ())
    if q not in allowed:
        where = ", ".join(k.name for k, types in QUANT_KINDS.items() if q in types)
        return [f"config.quant_type {q!r} is not supported by kernel type {kind.name} (quantized combines of {q!r}: "
                f"{where})"]  # fmt: skip
    problems = []
    if kind != EpDispatchCombineKernelType.AsyncLL and not cfg.use_external_inp_buf:
        problems.append(f"config.quant_type {q!r} needs config.use_external_inp_buf=True: rows are quantized as "
                        f"they are pushed into the owner's staging buffer; the zero-copy combine reads the expert "
                        f"output unquantized (MORI ignores the quantization there; refused here)")  # fmt: skip
    if cfg.max_token_type_size < 2:
        problems.append(f"config.quant_type {q!r} quantizes the {QUANT_COMBINE_DTYPE} combine, but "
                        f"config.max_token_type_size {cfg.max_token_type_size} has no {QUANT_COMBINE_DTYPE} "
                        f"rows (allowed: 2 or 4)")  # fmt: skip
    return problems


def quant_target_problems(cfg: EpDispatchCombineConfig, target: str) -> list[str]:
    """What a wire quantization needs of the target: its conversion instructions (fp4_blockwise:
    gfx950, or sm_90 in software; fp8: every target, FNUZ on gfx942, OCP elsewhere)."""
    q = getattr(cfg, "quant_type", "none")
    if q == "fp4_blockwise" and target not in FP4_TARGETS:
        return [f"config.quant_type 'fp4_blockwise' is not supported on target {target} (fp4 combines: "
                f"{', '.join(FP4_TARGETS)})"]  # fmt: skip
    if q != "none" and target not in WIRE_FP8_OF_TARGET:
        return [f"config.quant_type {q!r}: target {target} has no wire quantization"]
    return []


def combine_scale_blocks() -> int:
    """The blockwise combines' scale blocks per token: ``$MORI_FP8_COMBINE_SCALE_DIM`` (an integer in
    [1, MAX_COMBINE_SCALE_DIM], held in registers by the quantizing lanes), default 56. Read once where an op is built and compiled into its kernels (part of
    the bundle key); a bad value is a ConfigError naming the variable."""
    import os

    raw = os.environ.get(FP8_COMBINE_SCALE_DIM_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_COMBINE_SCALE_DIM
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError([f"{FP8_COMBINE_SCALE_DIM_ENV}={raw!r} is not an integer (expected an integer in "
                           f"[1, {MAX_COMBINE_SCALE_DIM}])"]) from None  # fmt: skip
    if not 1 <= value <= MAX_COMBINE_SCALE_DIM:
        raise ConfigError([f"{FP8_COMBINE_SCALE_DIM_ENV}={raw!r} must be in [1, {MAX_COMBINE_SCALE_DIM}] (scale blocks "
                           f"per token; each quantizing lane keeps its blocks' maxima in registers)"])  # fmt: skip
    return value


def quant_scale_blocks(cfg: EpDispatchCombineConfig, scale_blocks: int | None = None) -> int:
    """The scale blocks compiled into ``cfg``'s combine: for a blockwise quant type ``scale_blocks``
    (default: ``combine_scale_blocks()``), else 0."""
    if getattr(cfg, "quant_type", "none") not in BLOCKWISE_QUANT_TYPES:
        return 0
    return combine_scale_blocks() if scale_blocks is None else scale_blocks


def _internode_problems(cfg: EpDispatchCombineConfig, kind: EpDispatchCombineKernelType, ok) -> list[str]:
    """What an inter-node kernel type needs of the topology and the grid (the op's per-call checks are
    dispatch_combine.internode_rdma_blocks's)."""
    problems = []
    if ok("world_size", "gpu_per_node"):
        problems += [f"config.{p} ({kind.name} splits the PEs into nodes of gpu_per_node PEs)"
                     for p in topology_problems(cfg.world_size, cfg.gpu_per_node)]  # fmt: skip
    if not ok("block_num"):
        return problems
    blocks = cfg.block_num
    if blocks < 2:
        problems.append(f"config.block_num {blocks}: {kind.name} needs >= 2 blocks (at least one for the inter-node "
                        "role and one for the same-node role)")  # fmt: skip
    elif ok("rdma_block_num") and cfg.rdma_block_num >= blocks:
        problems.append(f"config.rdma_block_num {cfg.rdma_block_num} must be in [0, block_num={blocks}) for "
                        f"{kind.name} (0: the op chooses; the other blocks take the same-node role)")  # fmt: skip
    if kind == EpDispatchCombineKernelType.InterNode and ok("world_size") and blocks % cfg.world_size:
        problems.append(f"config.block_num {blocks} must be a multiple of world_size {cfg.world_size} for InterNode "
                        "(V0 partitions its grid per destination PE)")  # fmt: skip
    return problems


def _intranode_problems(cfg: EpDispatchCombineConfig, kind: EpDispatchCombineKernelType, ok) -> list[str]:
    """The fields only the inter-node kernels read keep their defaults (a value would be silently ignored)."""
    problems = []
    if ok("rdma_block_num") and cfg.rdma_block_num != 0:
        problems.append(f"config.rdma_block_num {cfg.rdma_block_num} is not allowed for {kind.name}; allowed: 0 "
                        "(intra-node kernel types use no RDMA blocks)")  # fmt: skip
    if ok("num_qp_per_pe") and cfg.num_qp_per_pe != 1:
        problems.append(f"config.num_qp_per_pe {cfg.num_qp_per_pe} is not allowed for {kind.name}; allowed: 1 "
                        "(intra-node kernel types use no RDMA queue pairs)")  # fmt: skip
    return problems


def validate_config(cfg: EpDispatchCombineConfig, wave_size: int, target: str | None = None) -> None:
    """Raise a ConfigError listing every field of ``cfg`` the kernels cannot support (see ``_RULES``), and,
    with ``target``, what the target cannot run (``quant_target_problems``)."""
    problems = config_problems(cfg, wave_size)
    if not problems and target is not None:
        problems = quant_target_problems(cfg, target)
    if problems:
        raise ConfigError(problems)
