// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=32}' | FileCheck %s
// RUN: not mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' 2>&1 | FileCheck %s --check-prefix=WAVE
// RUN: %exit-status mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' 2>&1 | FileCheck %s --check-prefix=EXIT

// The op's wave_size must be the target's (the pass option). An f32 zero-copy combine configured for
// wave32 expands under wave-size=32 (32-lane shuffles, K = 2 sources) and is refused under wave-size=64.
// WAVE: error: {{.*}}mori-ep-to-kernels-wave.mlir:19:5: 'mori_ep.combine' was configured for wave size 32, the target runs 64
// WAVE-NOT: Traceback
// EXIT: exit status: 1
// CHECK-LABEL: gpu.module @wave32
// CHECK: gpu.func @ep_combine_pull_f32(
// CHECK: %[[LANES:.*]] = arith.constant 32 : i32
// CHECK: "mori_comm.device_barrier"(%{{.*}}, %{{.*}}) {max_blocks = 80 : i64, world_size = 16 : i64}
// CHECK: gpu.shuffle idx %{{.*}}, %{{.*}}, %[[LANES]] : i32
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NOT: "mori_ep.combine"
module attributes {gpu.container_module} {
  gpu.module @wave32 {
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 1 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
  }
}
