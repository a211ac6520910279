"""The EP configuration (MORI's ``EpDispatchCombineConfig`` and kernel-type enum) and its validation.

Standard library only: the op, the CLI's ``--precompile`` and the reference model all read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DISPATCH_DTYPES = ("bf16", "f32", "fp8_e4m3fn", "fp8_e4m3fnuz")
COMBINE_DTYPES = ("bf16", "f32")
_TOKEN_BYTES = {"bf16": 2, "f32": 4, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1}
MAX_BLOCKS = 1024  # device-barrier epoch slots per PE: the largest grid a combine may use
_TORCH_DTYPE_NAMES = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "fp8_e4m3fn",
                      "float8_e4m3fnuz": "fp8_e4m3fnuz"}  # fmt: skip


class EpDispatchCombineKernelType(enum.IntEnum):
    """MORI's kernel types (values as MORI's enum). Implemented: IntraNode, IntraNodeLL, AsyncLL."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5


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
        m = self.max_num_inp_token_per_rank
        cap = self.max_total_recv_tokens
        return min(-(-cap // self.world_size), m) if cap > 0 else m

    @property
    def max_recv(self) -> int:  # R
        return self.world_size * self.max_recv_per_rank


IMPLEMENTED = (EpDispatchCombineKernelType.IntraNode, EpDispatchCombineKernelType.IntraNodeLL,
               EpDispatchCombineKernelType.AsyncLL)  # fmt: skip


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype}; dispatch takes bfloat16, float32, float8_e4m3fn, "
                         f"float8_e4m3fnuz and combine bfloat16, float32")  # fmt: skip
    return _TORCH_DTYPE_NAMES[name]


def validate_config(cfg: EpDispatchCombineConfig, wave_size: int) -> None:
    """A clear ValueError for any config the kernels cannot support."""
    try:
        kind = EpDispatchCombineKernelType(cfg.kernel_type)
    except ValueError:
        raise ValueError(f"config.kernel_type {cfg.kernel_type!r} is not a kernel type; allowed: "
                         f"{', '.join(k.name for k in EpDispatchCombineKernelType)}") from None  # fmt: skip
    if kind not in IMPLEMENTED:
        raise ValueError(f"kernel_type {kind.name} is not implemented in this version (implemented: "
                         f"{', '.join(k.name for k in IMPLEMENTED)})")  # fmt: skip
    if kind == EpDispatchCombineKernelType.IntraNodeLL and cfg.warp_num_per_block < 2:
        raise ValueError(f"config.warp_num_per_block {cfg.warp_num_per_block}: IntraNodeLL needs >= 2 warps per "
                         "block (a control warp and at least one data warp)")  # fmt: skip
    if cfg.quant_type != "none":
        raise ValueError(f"quant_type '{cfg.quant_type}' is not implemented in this version (only 'none')")
    positive = ("world_size", "hidden_dim", "max_token_type_size", "max_num_inp_token_per_rank",
                "num_experts_per_rank", "num_experts_per_token", "warp_num_per_block", "block_num")  # fmt: skip
    for name in positive:
        if int(getattr(cfg, name)) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.rank < cfg.world_size:
        raise ValueError(f"config.rank {cfg.rank} is outside [0, world_size={cfg.world_size})")
    if cfg.world_size > min(32, wave_size):
        raise ValueError(f"config.world_size {cfg.world_size} exceeds {min(32, wave_size)} (one lane per peer in the "
                         "count handshake)")  # fmt: skip
    if cfg.num_experts_per_token >= wave_size:
        raise ValueError(f"config.num_experts_per_token (top-k {cfg.num_experts_per_token}) must be smaller than the "
                         f"wave size {wave_size}")  # fmt: skip
    if cfg.max_token_type_size not in (1, 2, 4):
        raise ValueError(f"config.max_token_type_size must be 1, 2 or 4, got {cfg.max_token_type_size}")
    if cfg.hidden_dim % 16:
        raise ValueError(f"config.hidden_dim {cfg.hidden_dim} must be a multiple of 16 (16-byte vectors for every dtype)")
    if cfg.scale_dim < 0 or (cfg.scale_dim and cfg.scale_type_size not in (1, 2, 4, 8)):
        raise ValueError(f"config.scale_dim/scale_type_size {cfg.scale_dim}/{cfg.scale_type_size} are invalid")
    if cfg.block_num > MAX_BLOCKS:
        raise ValueError(f"config.block_num {cfg.block_num} exceeds {MAX_BLOCKS}")
    if cfg.max_total_recv_tokens < 0:
        raise ValueError("config.max_total_recv_tokens must be >= 0")
