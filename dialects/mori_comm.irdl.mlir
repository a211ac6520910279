// The `mori_comm` dialect: generic building blocks of GPU communication patterns (row copies, slot
// reservation, count handshake, grid and cross-device barriers, row accumulation), the steps an EP
// dispatch/combine, an allreduce or an allgather are made of.
//
// Each op is lowered by `mori-comm-to-calls` into a call of a helper function written with mori_shmem,
// gpu, scf, arith and llvm ops, one helper per variant, added to the gpu.module once. Semantics,
// ordering contracts and helper symbols: dialects/mori_comm.py. Attributes are integers (`dtype` a
// string); dialects/mori_comm.py checks their ranges.
// (Each attribute has its own irdl.any: IRDL unifies uses of one constraint value.)

irdl.dialect @mori_comm {

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
  // multiple of 16 by construction: a constant, or masked by andi) is read once, 16-byte vectors, and stored to every named destination.
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

  // Every block of this PE's grid arrives once; true (in warp 0) only in the block that arrived last, after
  // its acquire: it has seen every block's stores. That block resets the counter (graph-replay safe).
  irdl.operation @grid_last_arrival {
    %ptr = irdl.is !llvm.ptr
    %i1 = irdl.is i1
    irdl.operands(counter: %ptr)
    irdl.results(last: %i1)
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
  // device_barrier among PEs that share one GPU (virtual PEs): the same protocol, its fences at the GPU's
  // scope instead of the system's.
  irdl.operation @one_gpu_barrier {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(slots: %ptr, epochs: %ptr)
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "max_blocks" = %max_blocks }
  }

  // device_barrier in two halves, so that the block can work on what no peer touches in between:
  // barrier_arrive (the epoch step and the release signal; returns the epoch), then barrier_wait (the polls
  // for that epoch, the acquire, the block meeting). `scope`: "system" (device_barrier's fences) or "gpu"
  // (one_gpu_barrier's: every PE on this one GPU).
  irdl.operation @barrier_arrive {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(slots: %ptr, epochs: %ptr)
    irdl.results(epoch: %i64)
    %world_size = irdl.any
    %max_blocks = irdl.any
    %system = irdl.is "system"
    %gpu = irdl.is "gpu"
    %scope = irdl.any_of(%system, %gpu)
    irdl.attributes { "world_size" = %world_size, "max_blocks" = %max_blocks, "scope" = %scope }
  }
  irdl.operation @barrier_wait {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(slots: %ptr, epoch: %i64)
    %world_size = irdl.any
    %system = irdl.is "system"
    %gpu = irdl.is "gpu"
    %scope = irdl.any_of(%system, %gpu)
    irdl.attributes { "world_size" = %world_size, "scope" = %scope }
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
  // Quantizing row copy (warp): the bf16 row source[0:elems] (local; elems a multiple of 8) written as a
  // wire row at the symmetric `dest` on PE `pe`: the payload in `format` (fp8 e4m3 OCP/FNUZ, or fp8_e4m3:
  // the target's variant: a byte per element; fp4 e2m1: two per byte, element 2j in the low nibble), then,
  // when scale_blocks S >= 1
  // (blockwise), S f32 block scales at the 16-byte aligned end of the payload, block 0's negated when any
  // block was scaled. scale_blocks 0: a direct cast (fp8 only). Layout: mori_compiler/ep_schema.py.
  irdl.operation @quantize_row {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    irdl.operands(dest: %ptr, source: %ptr, elems: %i64, pe: %i32)
    %ocp = irdl.is "fp8_e4m3fn"
    %fnuz = irdl.is "fp8_e4m3fnuz"
    %fp4 = irdl.is "fp4_e2m1"
    %native = irdl.is "fp8_e4m3"
    %format = irdl.any_of(%ocp, %fnuz, %fp4, %native)
    %scale_blocks = irdl.any
    irdl.attributes { "format" = %format, "scale_blocks" = %scale_blocks }
  }
  // Dequantizing accumulation (warp): out[first:first+count] (bf16) = bf16(sum_k dequant(sources[k])),
  // fp32 sums, elements [first, first + count) of wire rows of `elems` elements (first and count
  // multiples of 8; `out` is the output row's start). Each source's block scales apply only when its
  // stored scale[0] is negative.
  irdl.operation @accumulate_quantized_rows {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(out: %ptr, first: %i64, count: %i64, elems: %i64, sources: variadic %ptr)
    %ocp = irdl.is "fp8_e4m3fn"
    %fnuz = irdl.is "fp8_e4m3fnuz"
    %fp4 = irdl.is "fp4_e2m1"
    %native = irdl.is "fp8_e4m3"
    %format = irdl.any_of(%ocp, %fnuz, %fp4, %native)
    %scale_blocks = irdl.any
    irdl.attributes { "format" = %format, "scale_blocks" = %scale_blocks }
  }
  // The PE of this PE's node with the local rank of `pe`: (me / group_size) * group_size + pe % group_size.
  // Every same-node (P2P) access of the inter-node kernels names its peer through it.
  irdl.operation @node_pe {
    %i32 = irdl.is i32
    irdl.operands(pe: %i32)
    irdl.results(result: %i32)
    %group_size = irdl.any
    irdl.attributes { "group_size" = %group_size }
  }
  // count_signal among the group_size PEs of this PE's node (lane p < group_size talks to node_pe(p)).
  irdl.operation @node_count_signal {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(signals: %ptr, counts: %ptr, total: %ptr)
    %world_size = irdl.any
    %group_size = irdl.any
    irdl.attributes { "world_size" = %world_size, "group_size" = %group_size }
  }
  // device_barrier among the group_size PEs of this PE's node.
  irdl.operation @node_device_barrier {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(slots: %ptr, epochs: %ptr)
    %world_size = irdl.any
    %group_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "world_size" = %world_size, "group_size" = %group_size, "max_blocks" = %max_blocks }
  }
  // Chunked send with one signal (warp): the records of a chunk whose bit is set in `mask` (bit j: record
  // j at source + j * record_bytes) are put, one non-blocking put per run of consecutive set bits, packed
  // in bit order at dest on PE `pe` over queue pair `qp`; then one put-with-signal stores
  // signal_base + popcount(mask) into the u64 `signal` on `pe` (release). Returns the bytes put.
  irdl.operation @chunk_send {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    irdl.operands(dest: %ptr, source: %ptr, record_bytes: %i64, mask: %i64, signal: %ptr, signal_base: %i64,
                  pe: %i32, qp: %i32)
    irdl.results(bytes: %i64)
  }
  // The receiving side (one thread): wait until the local u64 `signal` is >= signal_base, acquire, and
  // return the count it carries (its low 32 bits).
  irdl.operation @chunk_wait {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    irdl.operands(signal: %ptr, signal_base: %i64)
    irdl.results(count: %i32)
  }

  // Warp-cooperative copy of `bytes` bytes between two addresses this PE can access directly (local
  // memory, or a peer's from mori_shmem.ptr), any alignment: 16-byte vectors when both are 16-byte aligned,
  // bytes for the rest. Plain loads and stores; ordered by the caller's fences / barriers.
  irdl.operation @copy_bytes {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64)
  }

  // A trace point (warp): the lanes of each warp that reach it store the GPU's global timer into their
  // kernel's trace buffer, slot (event, phase); compiled out unless tracing is on (mori-trace-to-timer).
  // `event` is a string matching [A-Za-z0-9_.]+ (checked in dialects/mori_comm.py).
  irdl.operation @trace {
    %event = irdl.any
    %begin = irdl.is "begin"
    %end = irdl.is "end"
    %instant = irdl.is "instant"
    %phase = irdl.any_of(%begin, %end, %instant)
    irdl.attributes { "event" = %event, "phase" = %phase }
  }
}
