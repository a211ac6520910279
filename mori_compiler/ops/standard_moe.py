"""The standard-MoE (DeepEP) layout of an EP op's dispatch output and combine input, in torch.

Per local expert e, the received (row, k) pairs whose expert is e, in (row, k) order:
``packed_recv_x[e, j] = out[row]``, ``packed_recv_src_info[e, j] = row`` (our convention: the receive row),
``packed_recv_count[e]`` = the number of pairs; every expert has room for ``S = W * M`` pairs. Built with
device tensor ops only (no host synchronization), so it can be captured in a CUDA graph. The NumPy oracle
of both conversions is ``reference.convert_dispatch_output_ref`` / ``convert_combine_input_ref``.
"""

from __future__ import annotations

from mori_compiler.ep_schema import EpSizes


def local_pairs(sizes: EpSizes, out_idx, total, rank: int):
    """For every (row, k) of ``out_idx`` [R, K] in order: whether it is a valid pair of a local expert of
    ``rank`` (row < total, expert local), its local expert (``Er`` for the others), its position in that
    expert's list; and each expert's pair count, and the row of every pair."""
    import torch

    R, K, Er = out_idx.shape[0], sizes.top_k, sizes.experts_per_rank
    rows = torch.arange(R, device=out_idx.device)
    valid = (rows < total.to(rows.dtype)).unsqueeze(1) & (out_idx >= 0) & (out_idx // Er == rank)
    expert = torch.where(valid, out_idx % Er, torch.full_like(out_idx, Er)).reshape(-1).long()
    onehot = torch.nn.functional.one_hot(expert, Er + 1).int()
    pos = (torch.cumsum(onehot, 0) - 1).gather(1, expert.unsqueeze(1)).squeeze(1)
    counts = onehot[:, :Er].sum(0, dtype=torch.int32)
    return valid.reshape(-1), expert, pos, counts, rows.repeat_interleave(K)


def dispatch_output_to_standard(sizes: EpSizes, out_x, out_idx, total, rank: int):
    """(packed_recv_x [Er, S, H], packed_recv_count [Er], packed_recv_src_info [Er, S], packed_recv_layout_range
    (empty)) of one PE's dispatch output rows ``out_x`` [R, H], expert ids ``out_idx`` [R, K] and row count
    ``total`` (a one-element device tensor)."""
    import torch

    valid, expert, pos, counts, rows = local_pairs(sizes, out_idx, total, rank)
    cap, H, Er = sizes.send_stride, out_x.shape[1], sizes.experts_per_rank  # the call's hidden
    dev = out_x.device
    packed = torch.zeros((Er + 1, cap, H), dtype=out_x.dtype, device=dev)  # row Er: the pairs of other PEs
    src_info = torch.full((Er + 1, cap), -1, dtype=torch.int32, device=dev)
    slot = torch.where(valid, pos, torch.zeros_like(pos)).clamp_(max=cap - 1)
    packed[expert, slot] = out_x[rows]
    src_info[expert, slot] = rows.to(torch.int32)
    return packed[:Er], counts, src_info[:Er], torch.empty(0, dtype=torch.int64, device=dev)


def standard_to_combine_input(sizes: EpSizes, packed_recv_x, out_idx, out_w, total, rank: int, registered):
    """Write into ``registered`` [R, H] (the zero-copy combine's input) each received row i as the sum over
    its local experts k of ``out_w[i, k] * packed_recv_x[e_k][position of row i]`` (fp32 accumulation);
    ``out_idx``/``out_w`` [R, K] and ``total`` are the dispatch's. Returns ``registered``."""
    import torch

    valid, expert, pos, _, rows = local_pairs(sizes, out_idx, total, rank)
    cap = packed_recv_x.shape[1]
    slot = torch.where(valid, pos, torch.zeros_like(pos)).clamp_(max=cap - 1)
    e = torch.where(valid, expert, torch.zeros_like(expert))
    contrib = packed_recv_x[e, slot].float() * (out_w.reshape(-1) * valid).unsqueeze(1)
    acc = torch.zeros((sizes.recv_capacity, packed_recv_x.shape[-1]), dtype=torch.float32, device=packed_recv_x.device)
    acc.index_add_(0, rows, contrib)
    registered.copy_(acc.to(packed_recv_x.dtype))
    return registered
