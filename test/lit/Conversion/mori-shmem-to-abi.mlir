// RUN: mori-opt --split-input-file -p mori-shmem-to-abi %s | FileCheck %s

// Queries and address translation: exact declarations (sorted, at the top of the symbol table);
// ptr_p2p / ptr take and return uint64_t, so the pointer goes through ptrtoint / inttoptr.
// CHECK-LABEL: module @queries {
// CHECK-NEXT: llvm.func @mori_shmem_my_pe() -> i32
// CHECK-NEXT: llvm.func @mori_shmem_n_pes() -> i32
// CHECK-NEXT: llvm.func @mori_shmem_ptr(i64, i32) -> i64
// CHECK-NEXT: llvm.func @mori_shmem_ptr_p2p(i64, i32, i32) -> i64
// CHECK: func.func @f(%[[ADDR:[^:]+]]: !llvm.ptr, %[[PE:[^:]+]]: i32)
// CHECK-NEXT: %[[ME:.*]] = llvm.call @mori_shmem_my_pe() : () -> i32
// CHECK-NEXT: %[[N:.*]] = llvm.call @mori_shmem_n_pes() : () -> i32
// CHECK-NEXT: %[[A1:.*]] = llvm.ptrtoint %[[ADDR]] : !llvm.ptr to i64
// CHECK-NEXT: %[[R1:.*]] = llvm.call @mori_shmem_ptr_p2p(%[[A1]], %[[ME]], %[[PE]]) : (i64, i32, i32) -> i64
// CHECK-NEXT: %[[P1:.*]] = llvm.inttoptr %[[R1]] : i64 to !llvm.ptr
// CHECK-NEXT: %[[A2:.*]] = llvm.ptrtoint %[[ADDR]] : !llvm.ptr to i64
// CHECK-NEXT: %[[R2:.*]] = llvm.call @mori_shmem_ptr(%[[A2]], %[[PE]]) : (i64, i32) -> i64
// CHECK-NEXT: %[[P2:.*]] = llvm.inttoptr %[[R2]] : i64 to !llvm.ptr
// CHECK-NEXT: return %[[ME]], %[[N]], %[[P1]], %[[P2]]
module @queries {
  func.func @f(%addr: !llvm.ptr, %pe: i32) -> (i32, i32, !llvm.ptr, !llvm.ptr) {
    %me = "mori_shmem.my_pe"() : () -> i32
    %n = "mori_shmem.n_pes"() : () -> i32
    %p = "mori_shmem.ptr_p2p"(%addr, %me, %pe) : (!llvm.ptr, i32, i32) -> !llvm.ptr
    %q = "mori_shmem.ptr"(%addr, %pe) : (!llvm.ptr, i32) -> !llvm.ptr
    return %me, %n, %p, %q : i32, i32, !llvm.ptr, !llvm.ptr
  }
}

// -----

// Transfers: the symbol encodes op, element type and scope; the five operands pass through unchanged.
// CHECK-LABEL: module @transfers {
// CHECK-DAG: llvm.func @mori_shmem_putmem_nbi_thread(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_put_uint64_nbi_block(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_getmem_nbi_warp(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_get_float_nbi_thread(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_getmem_block(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_get_double_warp(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK: func.func @f(%[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK-NEXT: llvm.call @mori_shmem_putmem_nbi_thread(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]]) : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_put_uint64_nbi_block(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_getmem_nbi_warp(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_get_float_nbi_thread(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_getmem_block(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_get_double_warp(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: return
module @transfers {
  func.func @f(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32, %qp: i32) {
    "mori_shmem.putmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "thread"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.put_nbi"(%d, %s, %n, %pe, %qp) {scope = "block", elem = "uint64"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.getmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.get_nbi"(%d, %s, %n, %pe, %qp) {scope = "thread", elem = "float"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.getmem"(%d, %s, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.get"(%d, %s, %n, %pe, %qp) {scope = "warp", elem = "double"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    return
  }
}

// -----

// Put with signal: signal_op set -> 9, add -> 10 as the 6th argument (after signalValue, before pe);
// immediate puts: put_size_imm_nbi and `p` named after c_type, with the value's exact type.
// CHECK-LABEL: module @signal_and_immediate {
// CHECK-DAG: llvm.func @mori_shmem_putmem_nbi_signal_warp(!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_putmem_nbi_signal_block(!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_put_size_imm_nbi_thread(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_ushort_p(!llvm.ptr, i16, i32, i32) -> i32
// CHECK-DAG: llvm.func @mori_shmem_double_p(!llvm.ptr, f64, i32, i32) -> i32
// CHECK: func.func @f(%[[D:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32, %[[H:[^:]+]]: i16, %[[G:[^:]+]]: f64)
// CHECK-NEXT: %[[SET:.*]] = arith.constant 9 : i32
// CHECK-NEXT: llvm.call @mori_shmem_putmem_nbi_signal_warp(%[[D]], %[[D]], %[[N]], %[[D]], %[[N]], %[[SET]], %[[PE]], %[[QP]])
// CHECK-NEXT: %[[ADD:.*]] = arith.constant 10 : i32
// CHECK-NEXT: llvm.call @mori_shmem_putmem_nbi_signal_block(%[[D]], %[[D]], %[[N]], %[[D]], %[[N]], %[[ADD]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_put_size_imm_nbi_thread(%[[D]], %[[D]], %[[N]], %[[PE]], %[[QP]])
// CHECK-NEXT: llvm.call @mori_shmem_ushort_p(%[[D]], %[[H]], %[[PE]], %[[QP]]) : (!llvm.ptr, i16, i32, i32) -> i32
// CHECK-NEXT: llvm.call @mori_shmem_double_p(%[[D]], %[[G]], %[[PE]], %[[QP]]) : (!llvm.ptr, f64, i32, i32) -> i32
module @signal_and_immediate {
  func.func @f(%d: !llvm.ptr, %n: i64, %pe: i32, %qp: i32, %h: i16, %g: f64) {
    "mori_shmem.putmem_nbi_signal"(%d, %d, %n, %d, %n, %pe, %qp) {scope = "warp", signal_op = "set"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.putmem_nbi_signal"(%d, %d, %n, %d, %n, %pe, %qp) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.put_size_imm_nbi"(%d, %d, %n, %pe, %qp) : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    "mori_shmem.p"(%d, %h, %pe, %qp) {c_type = "ushort"} : (!llvm.ptr, i16, i32, i32) -> ()
    "mori_shmem.p"(%d, %g, %pe, %qp) {c_type = "double"} : (!llvm.ptr, f64, i32, i32) -> ()
    return
  }
}
