// Compiler bug (passes/ep_kernels.py, MoriEpToKernels.__call__): for the send/recv halves the pass builds
// EpKernelConfig.from_op(ep) *before* kernels_for(ep) can raise its "has no lowering in this version"
// error; the halves only carry world_size/hidden/dtype/top_k (the IRDL allows no others), so from_op
// raises a TypeError and mori-opt reports "internal compiler error: TypeError: EpKernelConfig.__init__()
// missing 4 required positional arguments: 'experts_per_rank', 'max_tokens_per_rank',
// 'max_recv_per_rank', and 'wave_size'" with exit status 2. Expected: the user error below, exit 1.
// RUN: not mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file 2>&1 | FileCheck %s
// RUN: %exit-status mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file 2>&1 | FileCheck %s --check-prefix=EXIT

// Each half is refused with a message naming it (one error per chunk), never an internal error.
// CHECK-NOT: internal compiler error
// CHECK: error: {{.*}}'mori_ep.dispatch_send' has no lowering in this version
// CHECK: error: {{.*}}'mori_ep.dispatch_recv' has no lowering in this version
// CHECK: error: {{.*}}'mori_ep.combine_send' has no lowering in this version
// CHECK: error: {{.*}}'mori_ep.combine_recv' has no lowering in this version
// CHECK-NOT: internal compiler error
// EXIT: exit status: 1
module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.combine_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.combine_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}
