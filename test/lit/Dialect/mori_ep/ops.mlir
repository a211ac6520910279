// RUN: mori-opt --split-input-file %s | mori-opt --split-input-file | FileCheck %s

// Round trip of every mori_ep op (the 7 intra-node EP ops, the 4 inter-node ones; the generic blocks they expand into:
// Dialect/mori_comm/ops.mlir): config attributes kept, printed sorted by name.

// EP ops at the top of a gpu.module, the whole config in attributes: dispatch for every dtype (fp8 with
// scales), combine zero-copy and push for both combine dtypes, wave 32 and 64.
// CHECK: module attributes {gpu.container_module}
// CHECK-LABEL: gpu.module @ep
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "bf16", experts_per_rank = 32 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "f32", {{.*}}, wave_size = 32 : i64, world_size = 32 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "fp8_e4m3fn", {{.*}}, scale_bytes = 224 : i64,
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "fp8_e4m3fnuz", {{.*}}, hidden = 16 : i64, {{.*}}, top_k = 1 : i64, {{.*}}, world_size = 1 : i64}
// CHECK-NEXT: "mori_ep.combine"() {dtype = "bf16", experts_per_rank = 32 : i64, hidden = 7168 : i64, max_blocks = 1024 : i64, max_recv_per_rank = 64 : i64, max_tokens_per_rank = 128 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64, zero_copy = 1 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "bf16", {{.*}}, zero_copy = 0 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "f32", {{.*}}, wave_size = 32 : i64, {{.*}}, zero_copy = 1 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "f32", {{.*}}, zero_copy = 0 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 32 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 31 : i64, experts_per_rank = 4 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 16 : i64, wave_size = 32 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 224 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 1 : i64, hidden = 16 : i64, dtype = "fp8_e4m3fnuz", top_k = 1 : i64, experts_per_rank = 1 : i64, max_tokens_per_rank = 1 : i64, max_recv_per_rank = 1 : i64, scale_bytes = 0 : i64, warps_per_block = 1 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 64 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 1 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 0 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
  }
}

// -----

// The AsyncLL send/recv halves parse and print (their lowering: Conversion/mori-ep-to-kernels-asyncll.mlir).
// CHECK-LABEL: gpu.module @halves
// The AsyncLL notification mode (early_notify, fused_recv) is part of each half: all three allowed pairs.
// CHECK-NEXT: "mori_ep.dispatch_send"() {dtype = "bf16", early_notify = 0 : i64, experts_per_rank = 32 : i64, fused_recv = 0 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch_recv"() {dtype = "fp8_e4m3fn", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 0 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine_send"() {dtype = "bf16", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 1 : i64, hidden = 4096 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, top_k = 4 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 16 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine_recv"() {dtype = "f32", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 1 : i64, hidden = 4096 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, top_k = 4 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 16 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @halves {
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 4 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
  }
}

// -----

// dispatch_ll (IntraNodeLL): the config of dispatch.
// CHECK-LABEL: gpu.module @ll
// CHECK-NEXT: "mori_ep.dispatch_ll"() {dtype = "bf16", experts_per_rank = 32 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 16 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @ll {
    "mori_ep.dispatch_ll"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 16 : i64, wave_size = 64 : i64} : () -> ()
  }
}

// -----

// The inter-node ops (InterNodeV1, InterNodeV1LL, InterNode "V0"): the sizes, the dtype, the topology
// (gpu_per_node, hop_size, send_all, num_qp) and, for internode_combine, max_blocks.
// CHECK-LABEL: gpu.module @internode
// CHECK-NEXT: "mori_ep.internode_stage"() {dtype = "bf16", experts_per_rank = 32 : i64, gpu_per_node = 8 : i64, hidden = 7168 : i64, hop_size = 8 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, num_qp = 2 : i64, scale_bytes = 224 : i64, send_all = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 16 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.internode_dispatch"() {dtype = "fp8_e4m3fn", {{.*}}, gpu_per_node = 8 : i64, {{.*}}, hop_size = 8 : i64, {{.*}}, num_qp = 8 : i64, {{.*}}, send_all = 1 : i64, {{.*}}, wave_size = 32 : i64, world_size = 32 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.internode_combine"() {dtype = "bf16", {{.*}}, gpu_per_node = 2 : i64, {{.*}}, hop_size = 1 : i64, max_blocks = 80 : i64, {{.*}}, num_qp = 1 : i64, send_all = 0 : i64, {{.*}}, world_size = 4 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.internode_combine_all"() {dtype = "f32", {{.*}}, gpu_per_node = 1 : i64, {{.*}}, hop_size = 1 : i64, {{.*}}, num_qp = 1 : i64, send_all = 0 : i64, {{.*}}, world_size = 1 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @internode {
    "mori_ep.internode_stage"() {world_size = 16 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 224 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 8 : i64, hop_size = 8 : i64, send_all = 0 : i64, num_qp = 2 : i64} : () -> ()
    "mori_ep.internode_dispatch"() {world_size = 32 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 16 : i64, wave_size = 32 : i64, gpu_per_node = 8 : i64, hop_size = 8 : i64, send_all = 1 : i64, num_qp = 8 : i64} : () -> ()
    "mori_ep.internode_combine"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 2 : i64, experts_per_rank = 4 : i64, max_tokens_per_rank = 16 : i64, max_recv_per_rank = 16 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 80 : i64} : () -> ()
    "mori_ep.internode_combine_all"() {world_size = 1 : i64, hidden = 16 : i64, dtype = "f32", top_k = 1 : i64, experts_per_rank = 1 : i64, max_tokens_per_rank = 1 : i64, max_recv_per_rank = 1 : i64, warps_per_block = 1 : i64, wave_size = 64 : i64, gpu_per_node = 1 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
