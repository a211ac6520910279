// RUN: not mori-opt --split-input-file %s 2>&1 | FileCheck %s --implicit-check-not=error:
// RUN: %exit-status mori-opt --split-input-file %s 2>&1 | FileCheck %s --check-prefix=EXIT

// The inter-node ops' topology attributes (dialects/mori_ep.py: gpu_per_node a power of two dividing
// world_size, hop_size gpu_per_node or 1, send_all 0 or 1 and only with hop_size gpu_per_node, num_qp in
// [1, MAX_QP_PER_PE]): each chunk is rejected with a located error naming the op, the attribute and what is
// allowed; exit status 1 (a user error, not an internal one).
// EXIT: exit status: 1
// EXIT-NOT: internal compiler error
// CHECK-NOT: Traceback
// CHECK-NOT: internal compiler error

// gpu_per_node is a power of two (3 is not).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_dispatch' attribute 'gpu_per_node' (3) must be a power of two dividing 'world_size' (8)
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 3 : i64, hop_size = 3 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// gpu_per_node divides world_size: whole nodes (16 PEs per node in a world of 8 is not).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_stage' attribute 'gpu_per_node' (16) must be a power of two dividing 'world_size' (8)
    "mori_ep.internode_stage"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 16 : i64, hop_size = 16 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// hop_size is gpu_per_node (V1, V1LL: the rail proxy serves its node) or 1 (V0: the PE itself).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_dispatch' attribute 'hop_size' must be 'gpu_per_node' (4: V1, V1LL) or 1 (V0), got 2
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 2 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// send_all is a flag.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_dispatch' attribute 'send_all' must be 0 or 1, got 2
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 2 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// send_all = 1 (V1LL) goes through the nodes' proxies: not with hop_size 1 (V0).
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_dispatch' attribute 'send_all' = 1 (V1LL) needs 'hop_size' = 'gpu_per_node'
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 1 : i64, send_all = 1 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// num_qp: at least one queue pair per peer.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_dispatch' attribute 'num_qp' must be in [1, 8], got 0
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 0 : i64} : () -> ()
  }
}

// -----
// num_qp: at most MAX_QP_PER_PE (8) queue pairs per peer.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_combine_all' attribute 'num_qp' must be in [1, 8], got 9
    "mori_ep.internode_combine_all"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 9 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----
// num_qp is required.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_stage' missing attribute 'num_qp'
    "mori_ep.internode_stage"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64} : () -> ()
  }
}

// -----
// internode_combine has the device barrier: max_blocks is required.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_combine' missing attribute 'max_blocks'
    "mori_ep.internode_combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
  }
}

// -----
// The combine ops take the combine dtypes only.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-internode.mlir:[[# @LINE + 1]]:5: 'mori_ep.internode_combine_all' attribute 'dtype' must be one of 'bf16', 'f32', got 'fp8_e4m3fn'
    "mori_ep.internode_combine_all"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
