// RUN: mori-opt --split-input-file -p mori-shmem-to-abi %s | FileCheck %s

// mori-shmem-to-abi for the synchronising ops: atomics (amo -> atomicType enum constant at the ABI's
// argument position), waits, quiet / fence / barrier_all.

// Non-fetching atomics: inc -> 2, set -> 3, xor -> 7 as the 3rd argument; atomic_size_nonfetch's amo is
// the 4th (after bytes); atomic_add has no enum.
// CHECK-LABEL: module @nonfetch {
// CHECK-DAG: llvm.func @mori_shmem_atomic_uint32_nonfetch_thread(!llvm.ptr, i32, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_atomic_int64_nonfetch_thread(!llvm.ptr, i64, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_atomic_size_nonfetch_thread(!llvm.ptr, !llvm.ptr, i64, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_uint64_atomic_add_thread(!llvm.ptr, i64, i32, i32) -> i32
// CHECK: func.func @f(%[[D:[^:]+]]: !llvm.ptr, %[[W:[^:]+]]: i32, %[[X:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK-NEXT: %[[INC:.*]] = arith.constant 2 : i32
// CHECK-NEXT: llvm.call @mori_shmem_atomic_uint32_nonfetch_thread(%[[D]], %[[W]], %[[INC]], %[[PE]], %[[QP]]) : (!llvm.ptr, i32, i32, i32, i32) -> i32
// CHECK-NEXT: %[[XOR:.*]] = arith.constant 7 : i32
// CHECK-NEXT: llvm.call @mori_shmem_atomic_int64_nonfetch_thread(%[[D]], %[[X]], %[[XOR]], %[[PE]], %[[QP]]) : (!llvm.ptr, i64, i32, i32, i32) -> i32
// CHECK-NEXT: %[[SET:.*]] = arith.constant 3 : i32
// CHECK-NEXT: llvm.call @mori_shmem_atomic_size_nonfetch_thread(%[[D]], %[[D]], %[[X]], %[[SET]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_uint64_atomic_add_thread(%[[D]], %[[X]], %[[PE]], %[[QP]]) : (!llvm.ptr, i64, i32, i32) -> i32
module @nonfetch {
  func.func @f(%d: !llvm.ptr, %w: i32, %x: i64, %pe: i32, %qp: i32) {
    "mori_shmem.atomic_nonfetch"(%d, %w, %pe, %qp) {elem = "uint32", amo = "inc"} : (!llvm.ptr, i32, i32, i32) -> ()
    "mori_shmem.atomic_nonfetch"(%d, %x, %pe, %qp) {elem = "int64", amo = "xor"} : (!llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.atomic_size_nonfetch"(%d, %d, %x, %pe, %qp) {amo = "set"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.atomic_add"(%d, %x, %pe, %qp) {elem = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
    return
  }
}

// -----

// Fetching atomics return the old value: fetch_add -> 14, swap -> 18, compare_swap -> 19 as the 4th
// argument (after compare); atomic_fetch_add returns the call's result.
// CHECK-LABEL: module @fetch {
// CHECK-DAG: llvm.func @mori_shmem_atomic_uint64_fetch_thread(!llvm.ptr, i64, i64, i32, i32, i32) -> i64
// CHECK-DAG: llvm.func @mori_shmem_atomic_uint32_fetch_thread(!llvm.ptr, i32, i32, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_int64_atomic_fetch_add_thread(!llvm.ptr, i64, i32, i32) -> i64
// CHECK: func.func @f(%[[D:[^:]+]]: !llvm.ptr, %[[W:[^:]+]]: i32, %[[X:[^:]+]]: i64, %[[Y:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK-NEXT: %[[FADD:.*]] = arith.constant 14 : i32
// CHECK-NEXT: %[[O1:.*]] = llvm.call @mori_shmem_atomic_uint64_fetch_thread(%[[D]], %[[X]], %[[Y]], %[[FADD]], %[[PE]], %[[QP]]) : (!llvm.ptr, i64, i64, i32, i32, i32) -> i64
// CHECK-NEXT: %[[SWAP:.*]] = arith.constant 18 : i32
// CHECK-NEXT: %[[O2:.*]] = llvm.call @mori_shmem_atomic_uint32_fetch_thread(%[[D]], %[[W]], %[[W]], %[[SWAP]], %[[PE]], %[[QP]]) : (!llvm.ptr, i32, i32, i32, i32, i32) -> i32
// CHECK-NEXT: %[[CAS:.*]] = arith.constant 19 : i32
// CHECK-NEXT: %[[O3:.*]] = llvm.call @mori_shmem_atomic_uint64_fetch_thread(%[[D]], %[[X]], %[[Y]], %[[CAS]], %[[PE]], %[[QP]])
// CHECK-NEXT: %[[O4:.*]] = llvm.call @mori_shmem_int64_atomic_fetch_add_thread(%[[D]], %[[X]], %[[PE]], %[[QP]]) : (!llvm.ptr, i64, i32, i32) -> i64
// CHECK-NEXT: return %[[O1]], %[[O2]], %[[O3]], %[[O4]] : i64, i32, i64, i64
module @fetch {
  func.func @f(%d: !llvm.ptr, %w: i32, %x: i64, %y: i64, %pe: i32, %qp: i32) -> (i64, i32, i64, i64) {
    %0 = "mori_shmem.atomic_fetch"(%d, %x, %y, %pe, %qp) {elem = "uint64", amo = "fetch_add"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
    %1 = "mori_shmem.atomic_fetch"(%d, %w, %w, %pe, %qp) {elem = "uint32", amo = "swap"} : (!llvm.ptr, i32, i32, i32, i32) -> i32
    %2 = "mori_shmem.atomic_fetch"(%d, %x, %y, %pe, %qp) {elem = "uint64", amo = "compare_swap"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
    %3 = "mori_shmem.atomic_fetch_add"(%d, %x, %pe, %qp) {elem = "int64"} : (!llvm.ptr, i64, i32, i32) -> i64
    return %0, %1, %2, %3 : i64, i32, i64, i64
  }
}

// -----

// wait_until: greater_than returns the observed value from the call; equals (the ABI returns 0) is
// replaced by the awaited value itself.
// CHECK-LABEL: module @waits {
// CHECK-DAG: llvm.func @mori_shmem_uint64_wait_until_greater_than(!llvm.ptr, i64) -> i64
// CHECK-DAG: llvm.func @mori_shmem_int32_wait_until_equals(!llvm.ptr, i32) -> i32
// CHECK: func.func @f(%[[D:[^:]+]]: !llvm.ptr, %[[X:[^:]+]]: i64, %[[W:[^:]+]]: i32)
// CHECK-NEXT: %[[GT:.*]] = llvm.call @mori_shmem_uint64_wait_until_greater_than(%[[D]], %[[X]]) : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: llvm.call @mori_shmem_int32_wait_until_equals(%[[D]], %[[W]]) : (!llvm.ptr, i32) -> i32
// CHECK-NEXT: return %[[GT]], %[[W]] : i64, i32
module @waits {
  func.func @f(%d: !llvm.ptr, %x: i64, %w: i32) -> (i64, i32) {
    %0 = "mori_shmem.wait_until"(%d, %x) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
    %1 = "mori_shmem.wait_until"(%d, %w) {cmp = "equals", elem = "int32"} : (!llvm.ptr, i32) -> i32
    return %0, %1 : i64, i32
  }
}

// -----

// quiet / fence with 0, 1, 2 operands pick _thread, _thread_pe, _thread_pe_qp; barrier_all by scope.
// Declarations go into each gpu.module (the nearest symbol table), once; an identical one is reused.
// CHECK-LABEL: gpu.module @kernels {
// CHECK-NEXT: llvm.func @mori_shmem_barrier_all_block() -> i32
// CHECK-NEXT: llvm.func @mori_shmem_barrier_all_thread() -> i32
// CHECK-NEXT: llvm.func @mori_shmem_fence_thread() -> i32
// CHECK-NEXT: llvm.func @mori_shmem_fence_thread_pe(i32) -> i32
// CHECK-NEXT: llvm.func @mori_shmem_fence_thread_pe_qp(i32, i32) -> i32
// CHECK-NEXT: llvm.func @mori_shmem_quiet_thread_pe(i32) -> i32
// CHECK-NEXT: llvm.func @mori_shmem_quiet_thread_pe_qp(i32, i32) -> i32
// CHECK-NEXT: llvm.func @mori_shmem_quiet_thread() -> i32
// CHECK-NEXT: gpu.func @k(%[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32) kernel {
// CHECK-NEXT: llvm.call @mori_shmem_quiet_thread() : () -> i32
// CHECK-NEXT: llvm.call @mori_shmem_quiet_thread_pe(%[[PE]]) : (i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_quiet_thread_pe_qp(%[[PE]], %[[QP]]) : (i32, i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_fence_thread() : () -> i32
// CHECK-NEXT: llvm.call @mori_shmem_fence_thread_pe(%[[PE]]) : (i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_fence_thread_pe_qp(%[[PE]], %[[QP]]) : (i32, i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_barrier_all_thread() : () -> i32
// CHECK-NEXT: llvm.call @mori_shmem_barrier_all_block() : () -> i32
// CHECK-LABEL: gpu.module @other {
// CHECK-NEXT: llvm.func @mori_shmem_barrier_all_block() -> i32
// CHECK-NEXT: gpu.func @k2() kernel {
module attributes {gpu.container_module} {
  gpu.module @kernels {
    llvm.func @mori_shmem_quiet_thread() -> i32
    gpu.func @k(%pe: i32, %qp: i32) kernel {
      "mori_shmem.quiet"() : () -> ()
      "mori_shmem.quiet"(%pe) : (i32) -> ()
      "mori_shmem.quiet"(%pe, %qp) : (i32, i32) -> ()
      "mori_shmem.fence"() : () -> ()
      "mori_shmem.fence"(%pe) : (i32) -> ()
      "mori_shmem.fence"(%pe, %qp) : (i32, i32) -> ()
      "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
      "mori_shmem.barrier_all"() {scope = "block"} : () -> ()
      gpu.return
    }
  }
  gpu.module @other {
    gpu.func @k2() kernel {
      "mori_shmem.barrier_all"() {scope = "block"} : () -> ()
      gpu.return
    }
  }
}
