// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64 uniform-addressing=true}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' | FileCheck %s --check-prefix=DEFAULT

// uniform-addressing (the pipeline sets it for AMDGPU): the pull combine resolves each peer's base of the
// registered rows and weights once per warp, after the device barrier (lane p < W: PE p; other lanes:
// our PE), and builds each token's K source addresses from those bases broadcast from the source PE's
// lane; the forward entries are broadcast with gpu.subgroup_broadcast (uniform); the work-item divisions
// are 32-bit (4096 tokens x 896 vectors fit). No mori_shmem.ptr in the token loop.
// CHECK-LABEL: gpu.func @ep_combine_pull_bf16(
// CHECK-SAME: %{{[^:]+}}: !llvm.ptr {mori.name = "inp_w"}, %[[REGX:[^:]+]]: !llvm.ptr {mori.name = "reg_x"}, %[[REGW:[^:]+]]: !llvm.ptr {mori.name = "reg_w"},
// CHECK: "mori_comm.device_barrier"
// CHECK: %[[PBPE:.*]] = arith.select %{{.*}} : i32
// CHECK: "mori_shmem.ptr"(%[[REGX]], %[[PBPE]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK: "mori_shmem.ptr"(%[[REGW]], %[[PBPE]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK-NOT: mori_shmem.ptr
// CHECK: arith.divui %{{.*}}, %{{.*}} : i32
// CHECK: scf.for
// CHECK-NOT: : index{{$}}
// CHECK: arith.divui %{{.*}}, %{{.*}} : i32
// CHECK: arith.remui %{{.*}}, %{{.*}} : i32
// CHECK: %[[F0:.*]] = gpu.subgroup_broadcast %{{.*}},  specific_lane %{{.*}} : i32
// CHECK: %[[PC0:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : i32
// CHECK-NEXT: gpu.subgroup_broadcast %{{.*}},  specific_lane %[[PC0]] : i32
// CHECK-NEXT: gpu.subgroup_broadcast %{{.*}},  specific_lane %[[PC0]] : i32
// CHECK: gpu.subgroup_broadcast %{{.*}},  specific_lane %[[PC0]] : i32
// CHECK-NEXT: gpu.subgroup_broadcast %{{.*}},  specific_lane %[[PC0]] : i32
// CHECK: gpu.subgroup_broadcast %{{.*}},  specific_lane %{{.*}} : i32
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: mori_shmem.ptr
// CHECK: "mori_comm.accumulate_rows"
// CHECK: gpu.return
// Without the option: the shuffles and 2K translations per token that sm_90 was measured with.
// DEFAULT-LABEL: gpu.func @ep_combine_pull_bf16(
// DEFAULT: "mori_comm.device_barrier"
// DEFAULT-NOT: mori_shmem.ptr
// DEFAULT: arith.divui %{{.*}}, %{{.*}} : index
// DEFAULT: scf.for
// DEFAULT: gpu.shuffle idx
// DEFAULT: "mori_shmem.ptr"
// DEFAULT: "mori_shmem.ptr"
// DEFAULT: gpu.shuffle idx
// DEFAULT-NOT: subgroup_broadcast

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 2 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
