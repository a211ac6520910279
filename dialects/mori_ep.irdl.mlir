// The `mori_ep` dialect: MoE expert-parallel dispatch/combine and the building blocks they are made of.
//
// Building blocks (lowered by `mori-ep-blocks-to-calls` into calls of helper functions written with
// mori_shmem, gpu, scf and llvm ops, one helper per variant, added to the gpu.module once):
//   row_copy, row_copy_to_peers, reserve_slot, count_signal, grid_barrier, device_barrier,
//   accumulate_rows.
// EP ops (expanded by `mori-ep-to-kernels` into gpu.func kernels built from the blocks):
//   dispatch and combine (IntraNode), dispatch_ll (IntraNodeLL), and the AsyncLL send/recv halves
//   dispatch_send, dispatch_recv, combine_send, combine_recv. The halves carry the
//   AsyncLL notification mode, resolved once per op (mori_compiler/ops/asyncll.py): early_notify (the send
//   posts each payload's ready notification right after it) and fused_recv (the receive waits fold into
//   the copy passes; needs early_notify), each 0 or 1.
// Config attributes are integers or strings; dialects/mori_ep.py checks their ranges and relations.
// (Each attribute has its own irdl.any: IRDL unifies uses of one constraint value.)

irdl.dialect @mori_ep {

  // Warp-cooperative copy of `bytes` bytes from local `source` to the symmetric `dest` on PE `pe`
  // (16-byte vectors when aligned). Called uniformly by a whole warp.
  irdl.operation @row_copy {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, pe: %i32)
  }

  // Warp-cooperative copy of one local row to up to `max_peers` destinations: lane k < max_peers with
  // `send` set names one destination, row `dest` (symmetric address) on PE `pe`. The row (`bytes`, a
  // constant multiple of 16) is read once, 16-byte vectors, and stored to every named destination.
  // Called uniformly by a whole warp; plain stores, published by the caller's release fence.
  irdl.operation @row_copy_to_peers {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %i1 = irdl.is i1
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, pe: %i32, send: %i1)
    %max_peers = irdl.any
    irdl.attributes { "max_peers" = %max_peers }
  }

  // Remote slot reservation: relaxed system-scope fetch-add of 1 on PE `pe`'s 32-bit counter at the
  // symmetric `counter`; the result is the reserved slot.
  irdl.operation @reserve_slot {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    irdl.operands(counter: %ptr, pe: %i32)
    irdl.results(slot: %i32)
  }

  // Count handshake with flow control, run by one warp (lane p < world_size talks to PE p):
  // send counts[p] + 1 to PE p's signals[me] once that slot is 0, receive from every PE, reset the
  // local slots and counts, and store the sum of the received counts to `total`.
  irdl.operation @count_signal {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(signals: %ptr, counts: %ptr, total: %ptr)
    %world_size = irdl.any
    irdl.attributes { "world_size" = %world_size }
  }

  // Barrier of all blocks of this PE's grid (sense reversal on two u64 words {arrivals, generation} at
  // `counter`): every block continues once all have arrived. All blocks must be co-resident.
  irdl.operation @grid_barrier {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(counter: %ptr)
  }

  // Cross-device barrier with a device-side monotone epoch per block: block b of every PE meets block b
  // of every other PE (graph-replay safe: the host never writes the epoch).
  irdl.operation @device_barrier {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(slots: %ptr, epochs: %ptr)
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "max_blocks" = %max_blocks }
  }

  // out[0:elems] = cast(sum_k float(sources[k][0:elems])) in fp32, warp-cooperative, 16-byte vectors,
  // all K row loads in flight before the adds. `dtype` is bf16 or f32.
  irdl.operation @accumulate_rows {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(out: %ptr, elems: %i64, sources: variadic %ptr)
    %bf16 = irdl.is "bf16"
    %f32 = irdl.is "f32"
    %dtype = irdl.any_of(%bf16, %f32)
    irdl.attributes { "dtype" = %dtype }
  }

  // ---- EP ops: config as attributes ----------------------------------------------------------------
  // IntraNode dispatch (ep-semantics.md §3.1): every token to each destination PE of its top-k experts,
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
  // IntraNode combine (§3.2): each token's rows summed in fp32 from its destination PEs; lowers to
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
  // IntraNodeLL dispatch (§3.3): same config and outputs as dispatch; lowers to ep_dispatch_ll_<dtype> (one
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
  // AsyncLL halves (§3.6): the config of dispatch/combine plus the notification mode. Send phase of an
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
}
