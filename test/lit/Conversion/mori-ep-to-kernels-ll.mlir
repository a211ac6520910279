// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64 global-address-space=true}' | FileCheck %s --check-prefix=GLOBAL

// global-address-space (AMDGPU): the data path casts each destination's peer row (mori_shmem.ptr) and the
// source row to !llvm.ptr<1> and loads and stores through those; the LDS route keeps address space 3.
// GLOBAL-LABEL: gpu.func @ep_dispatch_ll_bf16(
// (The data path starts where the data warps read the route's count from LDS.)
// GLOBAL: llvm.load %{{.*}} : !llvm.ptr<3> -> i32
// GLOBAL: %[[P0:.*]] = "mori_shmem.ptr"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i32) -> !llvm.ptr
// GLOBAL: llvm.addrspacecast %[[P0]] : !llvm.ptr to !llvm.ptr<1>
// GLOBAL-COUNT-7: llvm.addrspacecast %{{.*}} : !llvm.ptr to !llvm.ptr<1>
// GLOBAL-NEXT: %[[SRC:.*]] = llvm.addrspacecast %{{.*}} : !llvm.ptr to !llvm.ptr<1>
// GLOBAL: scf.for
// GLOBAL: llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, vector<4xi32>
// GLOBAL: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// GLOBAL: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// GLOBAL-NOT: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr{{$}}
// GLOBAL: gpu.barrier

// mori_ep.dispatch_ll (IntraNodeLL, passes/ep_ll_kernels.py): world 8, top-8 (8 destinations at most),
// hidden 7168 bf16 = 896 16-byte vectors, 8 warps of 64 lanes. The kernel keeps two routes (count + 8 x
// (pe, slot) = 17 entries each) in an LDS global; the control warp routes the first token before the loop
// (remote slot reservation), one block barrier publishes it; in the loop the control warp routes the next
// token while the data warps resolve the 8 peer addresses once and load each vector before storing it to
// every destination; a block barrier ends each token; completion is IntraNode's.
// CHECK: llvm.mlir.global internal @ep_dispatch_ll_bf16_route() {addr_space = 3 : i32} : !llvm.array<34 x i32>
// The parameters are ep_schema.KERNELS["dispatch_ll"] (names as mori.name), e.g. those the completion uses:
// CHECK-LABEL: gpu.func @ep_dispatch_ll_bf16(
// CHECK-SAME: %arg4: i32 {mori.name = "n"}
// CHECK-SAME: %arg12: !llvm.ptr {mori.name = "signals"}, %arg13: !llvm.ptr {mori.name = "grid_ctr"}
// CHECK-SAME: %arg16: !llvm.ptr {mori.name = "dest_ctr"}, %arg17: !llvm.ptr {mori.name = "total"}
// CHECK: %[[ROUTE:.*]] = llvm.mlir.addressof @ep_dispatch_ll_bf16_route : !llvm.ptr<3>
// CHECK: "mori_comm.reserve_slot"
// CHECK: llvm.store %{{.*}}, %{{.*}} : i32, !llvm.ptr<3>
// CHECK: gpu.barrier
// CHECK: scf.for %{{.*}} = %block_id_x to %{{.*}} step %grid_dim_x
// CHECK: "mori_comm.reserve_slot"
// CHECK-COUNT-8: "mori_shmem.ptr"
// CHECK: scf.for %{{.*}} = %{{.*}} to %c896 step %c1792
// CHECK-COUNT-4: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NOT: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK: gpu.barrier
// CHECK: %[[LAST:.*]] = "mori_comm.grid_last_arrival"(%arg13)
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK: "mori_comm.count_signal"(%arg12, %arg16, %arg17) {world_size = 8 : i64}
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @ll {
    "mori_ep.dispatch_ll"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}
