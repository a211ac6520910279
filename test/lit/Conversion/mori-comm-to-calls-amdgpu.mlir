// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64 global-address-space=true loop-destinations=true}' --split-input-file | FileCheck %s
// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=64 loop-destinations=maybe}' 2>&1 | FileCheck %s --check-prefix=BADOPT

// The AMDGPU forms of the blocks (the pipeline sets both options for gfx942/gfx950/gfx1250; see
// ep-kernels-isa-global.mlir for the instructions they become). global-address-space: the helpers cast
// the generic pointers they are given (kernel arguments, mori_shmem.ptr results: device and peer global
// memory) to !llvm.ptr<1> and load/store through those; their signatures stay generic.
// BADOPT: error: pass 'mori-comm-to-calls' option 'loop-destinations' expects true or false, got 'maybe'

// row_copy_to_peers, K = 2, loop-destinations: the first sending destination (the lowest lane k whose
// flag is set, by one broadcast per lane: K when none sends) and its address once; nothing is loaded
// when no destination sends. Each round loads 8 vectors from the global source, stores them to the first
// destination, then loops over the destinations after it (flag, then address, broadcast from lane k).
// CHECK-LABEL: func.func @__mori_comm_row_copy_to_peers_k2(
// CHECK-SAME: %[[DST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[BYTES:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[SEND:[^:]+]]: i1) {
// CHECK: %[[PEER:.*]] = "mori_shmem.ptr"(%[[DST]], %{{.*}}) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK: %[[FLAG:.*]] = arith.extui %[[SEND]] : i1 to i32
// CHECK: %[[GSRC:.*]] = llvm.addrspacecast %[[SRC]] : !llvm.ptr to !llvm.ptr<1>
// CHECK: gpu.subgroup_broadcast %[[FLAG]],  specific_lane %{{.*}} : i32
// CHECK: gpu.subgroup_broadcast %[[FLAG]],  specific_lane %{{.*}} : i32
// CHECK: %[[FIRST:.*]] = arith.select %{{.*}} : i32
// CHECK-NEXT: %{{.*}} = arith.constant 2 : i32
// CHECK-NEXT: %[[ANY:.*]] = arith.cmpi ult, %[[FIRST]], %{{.*}} : i32
// CHECK: %[[D0:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<1>
// CHECK-NOT: gpu.shuffle
// CHECK: scf.if %[[ANY]] {
// CHECK: scf.while
// CHECK: } do {
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK: llvm.getelementptr %[[D0]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, vector<4xi32>
// CHECK-COUNT-8: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: %[[K1:.*]] = arith.addi %[[FIRST]], %{{.*}} : i32
// CHECK-NEXT: %[[K1X:.*]] = arith.index_cast %[[K1]] : i32 to index
// CHECK: scf.for %[[K:.*]] = %[[K1X]] to %{{.*}} step %{{.*}} {
// CHECK-NEXT: %[[K32:.*]] = arith.index_cast %[[K]] : index to i32
// CHECK-NEXT: %[[SK:.*]] = gpu.subgroup_broadcast %[[FLAG]],  specific_lane %[[K32]] : i32
// CHECK-NEXT: %[[ON:.*]] = arith.cmpi ne, %[[SK]], %{{.*}} : i32
// CHECK-NEXT: scf.if %[[ON]] {
// CHECK: %[[DK:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<1>
// CHECK-NEXT: llvm.getelementptr %[[DK]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, vector<4xi32>
// CHECK-COUNT-8: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NOT: llvm.load
// CHECK: scf.yield
// The tail round: 8 clamped loads, guarded stores to the first destination, then the same loop.
// CHECK: scf.if
// CHECK-COUNT-8: llvm.load %{{.*}} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK: scf.for
// CHECK-NOT: llvm.load
// CHECK: return
module attributes {gpu.container_module} {
  gpu.module @row_copy_to_peers {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32, %send: i1) kernel {
      %n = arith.constant 7168 : i64
      "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %send) {max_peers = 2 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}

// -----

// row_copy_vec16: source and peer row cast to the global space; loads and stores through them.
// CHECK-LABEL: func.func @__mori_comm_row_copy_vec16(
// CHECK-SAME: %[[DST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[BYTES:[^:]+]]: i64, %[[PE:[^:]+]]: i32) {
// CHECK-NEXT: %[[PEER:.*]] = "mori_shmem.ptr"(%[[DST]], %[[PE]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK-NEXT: %[[GSRC:.*]] = llvm.addrspacecast %[[SRC]] : !llvm.ptr to !llvm.ptr<1>
// CHECK-NEXT: %[[GPEER:.*]] = llvm.addrspacecast %[[PEER]] : !llvm.ptr to !llvm.ptr<1>
// CHECK: } do {
// CHECK: llvm.getelementptr %[[GSRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, vector<4xi32>
// CHECK-COUNT-8: llvm.load %{{.*}} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.getelementptr %[[GPEER]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, vector<4xi32>
// CHECK-COUNT-8: llvm.store %{{.*}} : vector<4xi32>, !llvm.ptr<1>
// CHECK: return
module attributes {gpu.container_module} {
  gpu.module @row_copy_vec16 {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32) kernel {
      %n = arith.constant 7168 : i64
      "mori_comm.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
  }
}

// -----

// accumulate_rows bf16, K = 2: the sources and the output cast once; the K loads and the store global.
// Row copies of other sizes (putmem_nbi: the device ABI's own pointers) keep the generic space.
// CHECK-LABEL: func.func @__mori_comm_row_copy(
// CHECK-NOT: !llvm.ptr<1>
// CHECK: return
// CHECK-LABEL: func.func @__mori_comm_accumulate_rows_bf16_k2(
// CHECK-SAME: %[[OUT:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[A:[^:]+]]: !llvm.ptr, %[[B:[^:]+]]: !llvm.ptr) {
// CHECK-NEXT: %[[GA:.*]] = llvm.addrspacecast %[[A]] : !llvm.ptr to !llvm.ptr<1>
// CHECK-NEXT: %[[GB:.*]] = llvm.addrspacecast %[[B]] : !llvm.ptr to !llvm.ptr<1>
// CHECK-NEXT: %[[GOUT:.*]] = llvm.addrspacecast %[[OUT]] : !llvm.ptr to !llvm.ptr<1>
// CHECK: scf.for
// CHECK: llvm.getelementptr %[[GA]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NEXT: llvm.getelementptr %[[GB]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.getelementptr %[[GOUT]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
module attributes {gpu.container_module} {
  gpu.module @accumulate {
    gpu.func @k(%out: !llvm.ptr, %a: !llvm.ptr, %b: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.accumulate_rows"(%out, %n, %a, %b) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.row_copy"(%out, %a, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
  }
}

// -----

// grid_barrier: the counter words are this PE's own, so the arrival fetch-add, the reset and the
// publication are LLVM atomics (relaxed, system scope: what the ABI functions do after translating our
// own address to itself) on the global-space words; the fences and the generation poll stay ABI ops,
// in the same order as the generic form (mori-comm-to-calls.mlir).
// CHECK-LABEL: func.func @__mori_comm_grid_barrier(
// CHECK-SAME: %[[CTR:[^:]+]]: !llvm.ptr) {
// CHECK-NOT: mori_shmem.my_pe
// CHECK: gpu.barrier
// CHECK: %[[GENP:.*]] = llvm.getelementptr %[[CTR]][1] : (!llvm.ptr) -> !llvm.ptr, i64
// CHECK-NEXT: %[[GCTR:.*]] = llvm.addrspacecast %[[CTR]] : !llvm.ptr to !llvm.ptr<1>
// CHECK-NEXT: %[[GGEN:.*]] = llvm.getelementptr %[[GCTR]][1] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: %[[G:.*]] = llvm.load %[[GENP]] atomic monotonic {alignment = 8 : i64} : !llvm.ptr -> i64
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: %[[OLD:.*]] = llvm.atomicrmw add %[[GCTR]], %{{.*}} monotonic : !llvm.ptr<1>, i64
// CHECK: scf.if
// CHECK-NEXT: llvm.store %{{.*}}, %[[GCTR]] atomic monotonic {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: %[[G1:.*]] = arith.addi %[[G]], %{{.*}} : i64
// CHECK-NEXT: llvm.store %[[G1]], %[[GGEN]] atomic monotonic {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: } else {
// CHECK-NEXT: "mori_shmem.wait_until"(%[[GENP]], %[[G]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: }
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NOT: mori_shmem.atomic_fetch_add
// CHECK-NOT: mori_shmem.p
module attributes {gpu.container_module} {
  gpu.module @grid {
    gpu.func @k(%c: !llvm.ptr) kernel {
      "mori_comm.grid_barrier"(%c) : (!llvm.ptr) -> ()
      gpu.return
    }
  }
}
