// The `mori_ep` dialect: MoE expert-parallel dispatch/combine, one op per kernel family with the whole
// configuration as attributes.
//
// Expanded by `mori-ep-to-kernels` into gpu.func kernels built from the generic communication blocks of
// the `mori_comm` dialect (row copies, slot reservation, count handshake, barriers, row accumulation):
//   dispatch and combine (IntraNode), dispatch_ll (IntraNodeLL), the AsyncLL send/recv halves
//   dispatch_send, dispatch_recv, combine_send, combine_recv, and the inter-node steps (InterNode,
//   InterNodeV1, InterNodeV1LL) internode_stage, internode_dispatch, internode_combine,
//   internode_combine_all. The halves carry the
//   AsyncLL notification mode, resolved once per op (mori_compiler/ops/asyncll.py): early_notify (the send
//   posts each payload's ready notification right after it) and fused_recv (the receive waits fold into
//   the copy passes; needs early_notify), each 0 or 1.
// Every op may also carry any_hidden (0 or 1): 1 builds its kernels' variant for any hidden up to the
// attribute's (the call's hidden is a kernel argument; the kernel names end in _anyhidden).
// The bf16 combines (combine, combine_send, combine_recv) may carry the wire quantization of their rows
// in two optional attributes (IRDL has none: declared in dialects/mori_ep.py): quant (none,
// fp8_direct_cast, fp8_blockwise, fp4_blockwise) and scale_blocks (the blockwise scales per row, else 0).
// Config attributes are integers or strings; dialects/mori_ep.py checks their ranges and relations.
// Semantics of each op: docs/ep-protocols.md.
// (Each attribute has its own irdl.any: IRDL unifies uses of one constraint value.)

irdl.dialect @mori_ep {

  // IntraNode dispatch (docs/ep-protocols.md §8): every token to each destination PE of its top-k experts,
  // once per PE; lowers to the kernel ep_dispatch_<dtype> (one warp per token).
  irdl.operation @dispatch {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank, "max_recv_per_rank" = %max_recv_per_rank,
                      "scale_bytes" = %scale_bytes, "warps_per_block" = %warps_per_block, "wave_size" = %wave_size }
  }
  // IntraNode combine (docs/ep-protocols.md §9): each token's rows summed in fp32 from its destination PEs; lowers to
  // ep_combine_pull_<dtype> (zero_copy = 1: read the peers' registered buffers) or ep_combine_push_<dtype>.
  irdl.operation @combine {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %zero_copy = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank, "max_recv_per_rank" = %max_recv_per_rank,
                      "zero_copy" = %zero_copy, "warps_per_block" = %warps_per_block, "wave_size" = %wave_size, "max_blocks" = %max_blocks }
  }
  // IntraNodeLL dispatch (docs/ep-protocols.md §8): same config and outputs as dispatch; lowers to ep_dispatch_ll_<dtype> (one
  // block per token, each 16-byte vector loaded once and stored to every destination).
  irdl.operation @dispatch_ll {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "scale_bytes" = %scale_bytes,
                      "warps_per_block" = %warps_per_block, "wave_size" = %wave_size }
  }
  // AsyncLL halves (docs/ep-protocols.md §10): the config of dispatch/combine plus the notification mode. Send phase of an
  // AsyncLL dispatch: records into each destination's per-source region; lowers to
  // ep_async_dispatch_send_<dtype>.
  irdl.operation @dispatch_send {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %early_notify = irdl.any
    %fused_recv = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "scale_bytes" = %scale_bytes,
                      "warps_per_block" = %warps_per_block, "wave_size" = %wave_size, "early_notify" = %early_notify,
                      "fused_recv" = %fused_recv }
  }
  // Receive phase of an AsyncLL dispatch: wait for every source, lay rows out grouped by source PE;
  // lowers to ep_async_dispatch_recv_<dtype>.
  irdl.operation @dispatch_recv {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %early_notify = irdl.any
    %fused_recv = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "scale_bytes" = %scale_bytes,
                      "warps_per_block" = %warps_per_block, "wave_size" = %wave_size, "early_notify" = %early_notify,
                      "fused_recv" = %fused_recv }
  }
  // Send phase of an AsyncLL combine: each received row back to its source; ep_async_combine_send_<dtype>.
  irdl.operation @combine_send {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %early_notify = irdl.any
    %fused_recv = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "warps_per_block" = %warps_per_block,
                      "wave_size" = %wave_size, "early_notify" = %early_notify, "fused_recv" = %fused_recv }
  }
  // Receive phase of an AsyncLL combine: wait, then sum each token's rows; ep_async_combine_recv_<dtype>.
  irdl.operation @combine_recv {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %early_notify = irdl.any
    %fused_recv = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "warps_per_block" = %warps_per_block,
                      "wave_size" = %wave_size, "early_notify" = %early_notify, "fused_recv" = %fused_recv }
  }
  // Inter-node dispatch, step 1 (docs/ep-protocols.md §16): every token packed as a record; ep_inter_stage_<dtype>.
  // The inter-node ops carry gpu_per_node (G), hop_size (PEs per send target: G for V1/V1LL, 1 for V0),
  // send_all (1: V1LL, every token to every remote node) and num_qp (queue pairs per peer).
  irdl.operation @internode_stage {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %gpu_per_node = irdl.any
    %hop_size = irdl.any
    %send_all = irdl.any
    %num_qp = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "scale_bytes" = %scale_bytes,
                      "warps_per_block" = %warps_per_block, "wave_size" = %wave_size, "gpu_per_node" = %gpu_per_node,
                      "hop_size" = %hop_size, "send_all" = %send_all, "num_qp" = %num_qp }
  }
  // Inter-node dispatch, step 2: chunked sends with one signal per chunk, receive-and-forward on the
  // targets, same-node rows, the node's count handshake; ep_inter_dispatch_<dtype>.
  irdl.operation @internode_dispatch {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %scale_bytes = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %gpu_per_node = irdl.any
    %hop_size = irdl.any
    %send_all = irdl.any
    %num_qp = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "scale_bytes" = %scale_bytes,
                      "warps_per_block" = %warps_per_block, "wave_size" = %wave_size, "gpu_per_node" = %gpu_per_node,
                      "hop_size" = %hop_size, "send_all" = %send_all, "num_qp" = %num_qp }
  }
  // Inter-node combine, step 1: per-node partials of the forwarded records back to their sources, the
  // own tokens' node partials; ep_inter_combine_<dtype>.
  irdl.operation @internode_combine {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %gpu_per_node = irdl.any
    %hop_size = irdl.any
    %send_all = irdl.any
    %num_qp = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "warps_per_block" = %warps_per_block,
                      "wave_size" = %wave_size, "gpu_per_node" = %gpu_per_node, "hop_size" = %hop_size,
                      "send_all" = %send_all, "num_qp" = %num_qp, "max_blocks" = %max_blocks }
  }
  // Inter-node combine, step 2: the node meets, then the hierarchical sum of each token's node partials;
  // ep_inter_combine_all_<dtype>.
  irdl.operation @internode_combine_all {
    %world_size = irdl.any
    %hidden = irdl.any
    %dtype = irdl.any
    %top_k = irdl.any
    %experts_per_rank = irdl.any
    %max_tokens_per_rank = irdl.any
    %max_recv_per_rank = irdl.any
    %warps_per_block = irdl.any
    %wave_size = irdl.any
    %gpu_per_node = irdl.any
    %hop_size = irdl.any
    %send_all = irdl.any
    %num_qp = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "hidden" = %hidden, "dtype" = %dtype, "top_k" = %top_k,
                      "experts_per_rank" = %experts_per_rank, "max_tokens_per_rank" = %max_tokens_per_rank,
                      "max_recv_per_rank" = %max_recv_per_rank, "warps_per_block" = %warps_per_block,
                      "wave_size" = %wave_size, "gpu_per_node" = %gpu_per_node, "hop_size" = %hop_size,
                      "send_all" = %send_all, "num_qp" = %num_qp, "max_blocks" = %max_blocks }
  }
}
