"""MORI's standalone ``launch_local_expert_count`` (``mori.ops.local_expert_count``, ``mori.cpp``) and the
``mori.cpp.EpDispatchCombineConfig`` record it reads.

In the project the count is part of the dispatch (``call_local_expert_count=True``); this is the same count
for pointers a script holds itself: ``local_expert_count[e]`` = the number of (row < total, k) entries of
the int32 ``indices`` [total, K] whose expert is this rank's local expert ``e`` (``rank*E <= id < (rank+1)*E``).
It runs as torch device ops on ``stream`` (a raw stream handle; 0: the current stream) over views of the raw
device pointers, and reads ``total`` on the host (one synchronization: the rows to count are not known
before), so, unlike MORI's kernel, it cannot be captured in a CUDA graph. ``block_num`` / ``warp_per_block``
are a launch geometry in MORI (the result does not depend on them): checked as MORI checks them, then unused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers


@dataclasses.dataclass
class CppEpDispatchCombineConfig:
    """``mori.cpp.EpDispatchCombineConfig``: MORI's C++ config struct, every field defaulted as there. Here it
    only carries what ``launch_local_expert_count`` reads (rank, num_experts_per_rank, num_experts_per_token,
    warp_num_per_block, block_num); the operator takes ``mori.ops.EpDispatchCombineConfig``."""

    rank: int = 0
    world_size: int = 0
    hidden_dim: int = 0
    scale_dim: int = 0
    scale_type_size: int = 0
    max_token_type_size: int = 0
    max_num_inp_token_per_rank: int = 0
    num_experts_per_rank: int = 0
    num_experts_per_token: int = 0
    warp_num_per_block: int = 0
    block_num: int = 0
    max_total_recv_tokens: int = 0
    use_external_inp_buf: bool = True
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1


def _int(value, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"launch_local_expert_count: {what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class _DeviceInt32Array:
    """A raw device pointer to ``n`` int32 values, as torch.as_tensor takes it (the CUDA array interface)."""

    def __init__(self, pointer: int, n: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i4", "data": (pointer, False), "version": 3,
                                         "strides": None}  # fmt: skip


def launch_local_expert_count(config, indices_ptr, total_recv_token_num_ptr, local_expert_count_ptr,
                              block_num: int = -1, warp_per_block: int = -1, stream=0) -> None:  # fmt: skip
    """Zero ``local_expert_count`` [E], then count the local experts of ``indices`` [total, K] (module
    docstring). Pointers are device addresses (``tensor.data_ptr()``) of int32 arrays."""
    from mori_compiler.runtime.extras import import_extra

    torch = import_extra("torch")
    rank = _int(getattr(config, "rank", None), "config.rank", minimum=0)
    experts = _int(getattr(config, "num_experts_per_rank", None), "config.num_experts_per_rank", minimum=1)
    k = _int(getattr(config, "num_experts_per_token", None), "config.num_experts_per_token", minimum=1)
    for name, override, field in (("block_num", block_num, "block_num"),
                                  ("warp_per_block", warp_per_block, "warp_num_per_block")):  # fmt: skip
        _int(override, name, minimum=-1)
        if override <= 0 and not _int(getattr(config, field, 0), f"config.{field}", minimum=0) > 0:
            raise ValueError(f"launch_local_expert_count: needs a positive {name} (or config.{field}), as MORI's")
    pointers = [_int(p, what, minimum=1) for p, what in ((indices_ptr, "indices_ptr"),
                (total_recv_token_num_ptr, "total_recv_token_num_ptr"),
                (local_expert_count_ptr, "local_expert_count_ptr"))]  # fmt: skip
    stream = _int(stream, "stream", minimum=0)
    on_stream = torch.cuda.stream(torch.cuda.ExternalStream(stream)) if stream else contextlib.nullcontext()
    with on_stream:
        count = torch.as_tensor(_DeviceInt32Array(pointers[2], experts), device="cuda")
        total = torch.as_tensor(_DeviceInt32Array(pointers[1], 1), device="cuda")
        count_local_experts(lambda n: torch.as_tensor(_DeviceInt32Array(pointers[0], n), device="cuda"), total,
                            count, rank=rank, k=k)  # fmt: skip


def count_local_experts(indices, total, count, *, rank: int, k: int) -> None:
    """The count itself, on tensors of any device: ``count`` (int32 [E]) zeroed, then +1 per local expert id
    among the first ``total[0] * k`` int32 values that ``indices(n)`` returns (n values)."""
    import torch

    experts = count.numel()
    count.zero_()
    rows = int(total.reshape(-1)[0].item())  # the host read: the rows to count
    if rows < 0:
        raise ValueError(f"launch_local_expert_count: the token count at total_recv_token_num_ptr is {rows}")
    if rows:
        local = indices(rows * k).to(torch.int64) - rank * experts
        local = local[(local >= 0) & (local < experts)]
        count.add_(torch.bincount(local, minlength=experts).to(count.dtype))
