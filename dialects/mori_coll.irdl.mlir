// The `mori_coll` dialect: collectives over the PEs of a symmetric heap, one op per collective.
//
// Each op stands in a gpu.func kernel (every thread of every block of the grid reaches it) and takes this
// PE's `input` and `output` (any global addresses, any alignment) and `workspace` (this PE's address of a
// symmetric allocation laid out by dialects/mori_coll_schema.py; its header zeroed once). `count` is the
// op's element count (its meaning per op: dialects/mori_coll_schema.py), `world_size` the PEs,
// `max_blocks` the most blocks per PE a launch may use. `mori-coll-to-kernels` expands each op in place
// into staging copies, mori_comm device barriers, pulls from peers and fp32 accumulation
// (passes/coll_kernels.py; protocols: docs/collectives.md). Ranges and relations: dialects/mori_coll.py.
// (Each attribute has its own irdl.any: IRDL unifies uses of one constraint value.)

irdl.dialect @mori_coll {

  // out[p * count + i] = in_p[i]: every PE's count elements to every PE (a mover: any dtype).
  irdl.operation @all_gather {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr)
    %u8_t = irdl.is "u8"
    %i8_t = irdl.is "i8"
    %bool_t = irdl.is "bool"
    %fp8_e4m3fn_t = irdl.is "fp8_e4m3fn"
    %fp8_e4m3fnuz_t = irdl.is "fp8_e4m3fnuz"
    %i16_t = irdl.is "i16"
    %f16_t = irdl.is "f16"
    %bf16_t = irdl.is "bf16"
    %i32_t = irdl.is "i32"
    %f32_t = irdl.is "f32"
    %i64_t = irdl.is "i64"
    %f64_t = irdl.is "f64"
    %dtype = irdl.any_of(%u8_t, %i8_t, %bool_t, %fp8_e4m3fn_t, %fp8_e4m3fnuz_t, %i16_t, %f16_t, %bf16_t, %i32_t, %f32_t, %i64_t, %f64_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks }
  }

  // out[i] = sum_p in_p[i], fp32 sums rounded once; algorithm one_shot (every PE pulls every peer's
  // whole input and sums) or two_shot (reduce-scatter of W chunks, then all-gather of the sums).
  irdl.operation @all_reduce {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr)
    %f32_t = irdl.is "f32"
    %bf16_t = irdl.is "bf16"
    %dtype = irdl.any_of(%f32_t, %bf16_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    %one_shot = irdl.is "one_shot"
    %two_shot = irdl.is "two_shot"
    %algorithm = irdl.any_of(%one_shot, %two_shot)
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks, "algorithm" = %algorithm }
  }

  // out[i] = sum_p in_p[me * count + i] (input W * count elements), fp32 sums rounded once.
  irdl.operation @reduce_scatter {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr)
    %f32_t = irdl.is "f32"
    %bf16_t = irdl.is "bf16"
    %dtype = irdl.any_of(%f32_t, %bf16_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks }
  }

  // out[i] = in_root[i]: the root's count elements to every PE (a mover: any dtype).
  irdl.operation @broadcast {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr)
    %u8_t = irdl.is "u8"
    %i8_t = irdl.is "i8"
    %bool_t = irdl.is "bool"
    %fp8_e4m3fn_t = irdl.is "fp8_e4m3fn"
    %fp8_e4m3fnuz_t = irdl.is "fp8_e4m3fnuz"
    %i16_t = irdl.is "i16"
    %f16_t = irdl.is "f16"
    %bf16_t = irdl.is "bf16"
    %i32_t = irdl.is "i32"
    %f32_t = irdl.is "f32"
    %i64_t = irdl.is "i64"
    %f64_t = irdl.is "f64"
    %dtype = irdl.any_of(%u8_t, %i8_t, %bool_t, %fp8_e4m3fn_t, %fp8_e4m3fnuz_t, %i16_t, %f16_t, %bf16_t, %i32_t, %f32_t, %i64_t, %f64_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    %root = irdl.any
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks, "root" = %root }
  }

  // out[p * count + i] = in_p[me * count + i] (input and output W * count elements; a mover).
  irdl.operation @all_to_all {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr)
    %u8_t = irdl.is "u8"
    %i8_t = irdl.is "i8"
    %bool_t = irdl.is "bool"
    %fp8_e4m3fn_t = irdl.is "fp8_e4m3fn"
    %fp8_e4m3fnuz_t = irdl.is "fp8_e4m3fnuz"
    %i16_t = irdl.is "i16"
    %f16_t = irdl.is "f16"
    %bf16_t = irdl.is "bf16"
    %i32_t = irdl.is "i32"
    %f32_t = irdl.is "f32"
    %i64_t = irdl.is "i64"
    %f64_t = irdl.is "f64"
    %dtype = irdl.any_of(%u8_t, %i8_t, %bool_t, %fp8_e4m3fn_t, %fp8_e4m3fnuz_t, %i16_t, %f16_t, %bf16_t, %i32_t, %f32_t, %i64_t, %f64_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks }
  }

  // Variable sizes: in_p holds W chunks packed, chunk q of splits_p[q] <= count elements (for PE q); out holds
  // the chunks for me packed in PE order; recv_counts[p] = splits_p[me] (splits, recv_counts: i32 [W], local).
  irdl.operation @all_to_all_v {
    %ptr = irdl.is !llvm.ptr
    irdl.operands(input: %ptr, output: %ptr, workspace: %ptr, splits: %ptr, recv_counts: %ptr)
    %u8_t = irdl.is "u8"
    %i8_t = irdl.is "i8"
    %bool_t = irdl.is "bool"
    %fp8_e4m3fn_t = irdl.is "fp8_e4m3fn"
    %fp8_e4m3fnuz_t = irdl.is "fp8_e4m3fnuz"
    %i16_t = irdl.is "i16"
    %f16_t = irdl.is "f16"
    %bf16_t = irdl.is "bf16"
    %i32_t = irdl.is "i32"
    %f32_t = irdl.is "f32"
    %i64_t = irdl.is "i64"
    %f64_t = irdl.is "f64"
    %dtype = irdl.any_of(%u8_t, %i8_t, %bool_t, %fp8_e4m3fn_t, %fp8_e4m3fnuz_t, %i16_t, %f16_t, %bf16_t, %i32_t, %f32_t, %i64_t, %f64_t)
    %count = irdl.any
    %world_size = irdl.any
    %max_blocks = irdl.any
    irdl.attributes { "dtype" = %dtype, "count" = %count, "world_size" = %world_size, "max_blocks" = %max_blocks }
  }
}
