// RUN: not mori-opt --split-input-file %s 2>&1 | FileCheck %s --implicit-check-not=error:
// RUN: %exit-status mori-opt --split-input-file %s 2>&1 | FileCheck %s --check-prefix=EXIT

// Every chunk is rejected with `error: <file>:<line>:<col>: '<op>' <field> ...` naming the op, the field
// and what is allowed (the IRDL constraints, then the config rules of dialects/mori_ep.py; the generic blocks'
// errors: Dialect/mori_comm/invalid.mlir); exit status 1.
// EXIT: exit status: 1
// EXIT-NOT: internal compiler error
// CHECK-NOT: Traceback
// CHECK-NOT: internal compiler error

// ---- the generic blocks are not mori_ep ops (they are mori_comm's) ---------------------------------
func.func @block_in_ep(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: unknown op 'mori_ep.grid_barrier'; the mori_ep dialect has: combine, combine_recv, combine_send, dispatch, dispatch_ll, dispatch_recv, dispatch_send, internode_combine, internode_combine_all, internode_dispatch, internode_stage{{$}}
  "mori_ep.grid_barrier"(%d) : (!llvm.ptr) -> ()
  return
}

// -----
// ---- EP ops: config attributes --------------------------------------------------------------------

// dispatch: a dtype outside bf16/f32/fp8 (the allowed ones are listed).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'dtype' must be one of 'bf16', 'f32', 'fp8_e4m3fn', 'fp8_e4m3fnuz', got 'f16'
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "f16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// combine: fp8 is a dispatch dtype only.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'dtype' must be one of 'bf16', 'f32', got 'fp8_e4m3fn'
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// dispatch: a missing config attribute (scale_bytes) and an unknown one, with the allowed names.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:5: 'mori_ep.dispatch' missing attribute 'scale_bytes'
    // CHECK-NEXT: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' unknown attribute 'scale_dim' (allowed: 'world_size', 'hidden', 'dtype', 'top_k', 'experts_per_rank', 'max_tokens_per_rank', 'max_recv_per_rank', 'scale_bytes', 'warps_per_block', 'wave_size', 'any_hidden', 'quant', 'scale_blocks')
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_dim = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// combine: zero_copy is required.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' missing attribute 'zero_copy'
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// top_k must be smaller than the wave size (wave64: 64 is rejected).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'top_k' (64) must be smaller than the wave size (64)
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 64 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// top_k vs wave32: 32 is rejected on combine too.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'top_k' (32) must be smaller than the wave size (32)
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 32 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// world_size above 32 (wave64): the count handshake has one lane per peer and gfx12 runs wave32.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'world_size' must be in [1, 32], got 48
    "mori_ep.dispatch"() {world_size = 48 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// world_size above the wave size (wave32): both rules are reported.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:5: 'mori_ep.combine' attribute 'world_size' must be in [1, 32], got 40
    // CHECK-NEXT: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'world_size' (40) must not exceed the wave size (32)
    "mori_ep.combine"() {world_size = 40 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// wave_size is 32 or 64.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'wave_size' must be 32 or 64, got 48
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 48 : i64} : () -> ()
  }
}

// -----
// A token row that is not a multiple of 16 bytes: 7 x bf16 = 14 bytes.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' a token row (7 x bf16) must be a multiple of 16 bytes
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// The same rule with the element size: 8 x fp8 = 8 bytes is rejected, 8 x bf16 (16 bytes) would not be.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' a token row (8 x fp8_e4m3fnuz) must be a multiple of 16 bytes
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 8 : i64, dtype = "fp8_e4m3fnuz", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// max_recv_per_rank may not exceed max_tokens_per_rank.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'max_recv_per_rank' must not exceed 'max_tokens_per_rank'
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 129 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// zero_copy is 0 or 1.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'zero_copy' must be 0 or 1
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 2 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// any_hidden (optional on every EP op) is 0 or 1.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'any_hidden' must be 0 or 1, got 2
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64, any_hidden = 2 : i64} : () -> ()
  }
}

// -----
// zero_copy is an integer, not a bool.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'zero_copy' must be an integer, got true
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = true, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// Counts are >= 1, scale_bytes >= 0: every violation of one op is reported.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 3]]:5: 'mori_ep.dispatch' attribute 'experts_per_rank' must be >= 1, got 0
    // CHECK-NEXT: {{.*}}invalid.mlir:[[# @LINE + 2]]:5: 'mori_ep.dispatch' attribute 'warps_per_block' must be >= 1, got 0
    // CHECK-NEXT: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'scale_bytes' must be >= 0
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 0 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = -4 : i64, warps_per_block = 0 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// The send/recv halves are verified with the same rules (here: combine dtypes and top_k vs nothing).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine_recv' attribute 'dtype' must be one of 'bf16', 'f32', got 'fp8_e4m3fn'
    "mori_ep.combine_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----
// The AsyncLL notification mode: each flag 0 or 1, and fused_recv only with early_notify.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch_send' attribute 'early_notify' (MORI_ASYNCLL_EARLY_NOTIFY) must be 0 or 1, got 2
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 2 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch_recv' attribute 'fused_recv' = 1 needs 'early_notify' = 1
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 1 : i64} : () -> ()
  }
}

// -----
// The mode is required on every half (IRDL): a half without it is rejected, naming the attribute.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:5: 'mori_ep.combine_send' missing attribute 'early_notify'
    // CHECK-NEXT: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine_send' missing attribute 'fused_recv'
    "mori_ep.combine_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----
// The wire quantization (optional quant / scale_blocks): only on the combines, a known quant type, scale
// blocks exactly when blockwise, bf16 rows, not the zero-copy combine.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'quant' is only for the combines combine, combine_send, combine_recv
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, quant = "fp8_direct_cast"} : () -> ()
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'quant' must be one of 'none', 'fp8_direct_cast', 'fp8_blockwise', 'fp4_blockwise', got 'int8'
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64, quant = "int8", scale_blocks = 0 : i64} : () -> ()
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'scale_blocks' must be in [1, 256] for quant 'fp8_blockwise', got 0
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64, quant = "fp8_blockwise", scale_blocks = 0 : i64} : () -> ()
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine' attribute 'quant' 'fp8_direct_cast' needs zero_copy = 0
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64, quant = "fp8_direct_cast", scale_blocks = 0 : i64} : () -> ()
    // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:5: 'mori_ep.combine_recv' attribute 'quant' 'fp8_blockwise' needs dtype 'bf16' (only the bf16 combine is quantized), got 'f32'
    "mori_ep.combine_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "f32", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64, quant = "fp8_blockwise", scale_blocks = 56 : i64} : () -> ()
  }
}
