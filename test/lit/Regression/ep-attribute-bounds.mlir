// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s

// Regression (issue 11, found by fuzzing): mori_ep config attributes had lower bounds only. A huge
// max_tokens_per_rank failed inside the generated kernels' text (an error pointing at an unrelated line
// of the input), a huge hidden or warps_per_block silently produced kernels that cannot run. The bounds
// are those of validate_config (32-bit indices, 256 KiB rows, 1024 threads per block).

// CHECK: error: {{.*}}ep-attribute-bounds.mlir:[[@LINE+2]]:3: 'mori_ep.dispatch' attribute 'max_tokens_per_rank' must be <= 65536, got 1099511627776
gpu.module @m {
  "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 1099511627776 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
}

// -----
// CHECK: error: {{.*}}ep-attribute-bounds.mlir:[[@LINE+2]]:3: 'mori_ep.dispatch' attribute 'hidden' must be <= 65536, got 1099511627776
gpu.module @m {
  "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 1099511627776 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
}

// -----
// CHECK: error: {{.*}}ep-attribute-bounds.mlir:[[@LINE+2]]:3: 'mori_ep.combine' attribute 'warps_per_block' (64) must be <= 32: a block has at most 1024 threads
gpu.module @m {
  "mori_ep.combine"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 1 : i64, warps_per_block = 64 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
}

// -----
// The relations validate_config states hold for ops written by hand too.
// CHECK: error: {{.*}}ep-attribute-bounds.mlir:[[@LINE+3]]:3: 'mori_ep.dispatch_ll' attribute 'warps_per_block' (1) must be >= 2: the LL dispatch has a control warp and at least one data warp
// CHECK: error: {{.*}}ep-attribute-bounds.mlir:[[@LINE+2]]:3: 'mori_ep.dispatch_ll' attribute 'top_k' (2) exceeds the 1 experts (world_size x experts_per_rank)
gpu.module @m {
  "mori_ep.dispatch_ll"() {world_size = 1 : i64, hidden = 16 : i64, top_k = 2 : i64, experts_per_rank = 1 : i64, max_tokens_per_rank = 1 : i64, max_recv_per_rank = 1 : i64, warps_per_block = 1 : i64, dtype = "bf16", wave_size = 32 : i64, scale_bytes = 0 : i64} : () -> ()
}

// CHECK-NOT: error:
// CHECK: exit status: 1
