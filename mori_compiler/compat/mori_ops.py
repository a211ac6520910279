"""``mori.ops`` (and ``mori.ops.dispatch_combine``, ``mori.ops.local_expert_count``): mori_compiler.ops under
MORI's names and signatures.

``EpDispatchCombineOp`` here is the project's op with the few methods whose MORI signature differs from the
project's own adapted to MORI's (``dispatch_send`` and ``combine_send`` take no ``rdma_block_num``
positionally, the standard-MoE calls take their launch arguments positionally) and MORI's size queries added.
The standard-MoE converters run as torch device ops, not as a kernel: their ``block_num`` /
``warp_per_block`` (a launch geometry in MORI, which does not change the result) are checked and have no
kernel to shape. ``launch_local_expert_count`` is the dispatch's local expert count for raw pointers
(local_expert_count.py). What is not offered raises NotImplementedError naming the reason.
"""

from __future__ import annotations

import enum
import logging
import numbers

from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType
from mori_compiler.ops import EpDispatchCombineOp as _ProjectOp

from ._refuse import not_offered
from .local_expert_count import launch_local_expert_count

__all__ = ["EpDispatchCombineConfig", "EpDispatchCombineKernelType", "EpDispatchCombineOp",
           "EpDispatchCombineQuantType", "EpDispatchRoutingHandle", "launch_local_expert_count",
           "warmup_jit_kernels"]  # fmt: skip
__mori_compiler_alias__ = True
__path__: list[str] = []  # mori.ops is a package in MORI

logger = logging.getLogger("mori.ops.dispatch_combine")  # MORI's module logger; the project's op logs nothing


class EpDispatchCombineQuantType(enum.StrEnum):
    """MORI's combine quantization kinds (its member names); each member *is* the string ``quant_type`` takes
    (str() and formatting give that string, so configs, cache keys and JSON see exactly what a string gives)."""

    None_ = "none"
    Fp8DirectCast = "fp8_direct_cast"
    Fp8BlockwiseQuant = "fp8_blockwise"
    Fp4BlockwiseQuant = "fp4_blockwise"


def _geometry(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (value == -1 or value > 0):
        raise ValueError(f"{what} must be -1 (default) or a positive integer, got {value!r}")
    return int(value)


class EpDispatchCombineOp(_ProjectOp):
    """mori_compiler.ops.EpDispatchCombineOp with MORI's method signatures (see the module docstring)."""

    def dispatch_send(self, input, weights, scales, indices, block_num: int = -1, warp_per_block: int = -1,
                      call_local_expert_count: bool = False):  # fmt: skip
        return super().dispatch_send(input, weights, scales, indices, block_num=block_num,
                                     warp_per_block=warp_per_block, call_local_expert_count=call_local_expert_count)

    def combine_send(self, input, weights, indices, block_num: int = -1, warp_per_block: int = -1):
        return super().combine_send(input, weights, indices, block_num=block_num, warp_per_block=warp_per_block)

    def dispatch_standard_moe(self, input, weights, scales, indices, block_num: int = -1, rdma_block_num: int = -1,
                              warp_per_block: int = -1):  # fmt: skip
        return super().dispatch_standard_moe(input, weights, scales, indices, block_num=block_num,
                                             rdma_block_num=rdma_block_num, warp_per_block=warp_per_block)

    def combine_standard_moe(self, input, weights, indices, block_num: int = -1, rdma_block_num: int = -1,
                             warp_per_block: int = -1, call_reset: bool = False):  # fmt: skip
        return super().combine_standard_moe(input, weights, indices, block_num=block_num,
                                            rdma_block_num=rdma_block_num, warp_per_block=warp_per_block,
                                            call_reset=call_reset)  # fmt: skip

    def convert_dispatch_output(self, dispatch_out_x, dispatch_out_topk_idx, block_num: int = -1,
                                warp_per_block: int = -1, *, pe: int | None = None):  # fmt: skip
        _geometry(block_num, "convert_dispatch_output block_num")
        _geometry(warp_per_block, "convert_dispatch_output warp_per_block")
        return super().convert_dispatch_output(dispatch_out_x, dispatch_out_topk_idx, pe=pe)

    def convert_combine_input(self, packed_recv_x, packed_recv_src_info, packed_recv_layout_range,
                              block_num: int = -1, warp_per_block: int = -1, *, pe: int | None = None):  # fmt: skip
        _geometry(block_num, "convert_combine_input block_num")
        _geometry(warp_per_block, "convert_combine_input warp_per_block")
        return super().convert_combine_input(packed_recv_x, packed_recv_src_info, packed_recv_layout_range, pe=pe)

    # ---- MORI's size queries (docs/ep-protocols.md: S = W*M, Rp, R = W*Rp) ----
    def max_num_tokens_to_send_per_rank(self) -> int:
        return self.sizes.max_tokens_per_rank

    def max_num_tokens_to_send(self) -> int:
        return self.sizes.send_stride

    def max_num_tokens_to_recv_per_rank(self) -> int:
        return self.sizes.max_recv_per_rank

    def max_num_tokens_to_recv(self) -> int:
        return self.sizes.recv_capacity

    def decode_send_flat_idx(self, flat_idx):
        """A source position (``get_dispatch_src_token_pos``) as (source PE, token)."""
        return divmod(int(flat_idx), self.max_num_tokens_to_send())

    get_launch_config = not_offered(
        "EpDispatchCombineOp.get_launch_config",
        "each call resolves its grid itself (MORI_EP_LAUNCH_CONFIG_MODE=AUTO reads the shipped tuning tables); "
        "op.config_dict() shows the op's configuration")
    get_debug_time_buf = not_offered(
        "EpDispatchCombineOp.get_debug_time_buf",
        "MORI's debug time buffers are a build option; build the op with trace=True and read "
        "op.kernel_trace(kernel) (docs/tracing.md)")
    get_debug_time_offset = not_offered("EpDispatchCombineOp.get_debug_time_offset",
                                        "as get_debug_time_buf: use trace=True and op.kernel_trace (docs/tracing.md)")


def __getattr__(name: str):
    if name == "EpDispatchRoutingHandle":
        from mori_compiler.ops import EpDispatchRoutingHandle

        return EpDispatchRoutingHandle
    if name == "TOPK_IDX_DTYPE":  # torch is imported on first use only, as the project's ops package does
        from mori_compiler.runtime.extras import import_extra

        return import_extra("torch").int32
    raise AttributeError(f"module 'mori.ops' (mori_compiler's MORI-compatible names) has no attribute '{name}'")


warmup_jit_kernels = not_offered(
    "warmup_jit_kernels",
    "there is no JIT of MORI's HIP kernels; kernels are compiled per config into the cache: build the op once in "
    "the main process, or precompile with `mori-compile --precompile configs.json`")
