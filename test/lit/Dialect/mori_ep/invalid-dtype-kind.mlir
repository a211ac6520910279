// Compiler bug (dialects/mori_ep.py, extra_verify): a dtype that is not a string is reported as
// "got None" (the check reads the value from the string attributes only) instead of the attribute given.
// Today: `'mori_ep.dispatch_send' attribute 'dtype' must be one of 'bf16', 'f32', 'fp8_e4m3fn',
// 'fp8_e4m3fnuz', got None`. Expected: `..., got 3 : i64` (as the IRDL checks print other values).
// RUN: not mori-opt %s 2>&1 | FileCheck %s

module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-dtype-kind.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch_send' attribute 'dtype' must be one of 'bf16', 'f32', 'fp8_e4m3fn', 'fp8_e4m3fnuz', got 3 : i64
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = 3 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}
