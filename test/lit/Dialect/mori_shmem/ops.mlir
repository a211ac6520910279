// RUN: mori-opt --split-input-file %s | mori-opt --split-input-file | FileCheck %s

// Round trip of every mori_shmem op (22), with the attribute variants each one allows.

// Queries and address translation: no attributes, i32 ranks, !llvm.ptr addresses.
// CHECK-LABEL: func.func @queries(
// CHECK-SAME: %[[ADDR:[^:]+]]: !llvm.ptr, %[[PE:[^:]+]]: i32)
// CHECK: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK: %{{.*}} = "mori_shmem.n_pes"() : () -> i32
// CHECK: %{{.*}} = "mori_shmem.ptr_p2p"(%[[ADDR]], %[[ME]], %[[PE]]) : (!llvm.ptr, i32, i32) -> !llvm.ptr
// CHECK: %{{.*}} = "mori_shmem.ptr"(%[[ADDR]], %[[PE]]) : (!llvm.ptr, i32) -> !llvm.ptr
func.func @queries(%addr: !llvm.ptr, %pe: i32) {
  %me = "mori_shmem.my_pe"() : () -> i32
  %n = "mori_shmem.n_pes"() : () -> i32
  %p = "mori_shmem.ptr_p2p"(%addr, %me, %pe) : (!llvm.ptr, i32, i32) -> !llvm.ptr
  %q = "mori_shmem.ptr"(%addr, %pe) : (!llvm.ptr, i32) -> !llvm.ptr
  return
}

// -----

// Contiguous transfers: each scope, each element type, operands kept in order.
// CHECK-LABEL: func.func @transfers(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK: "mori_shmem.putmem_nbi"(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]]) {scope = "thread"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
// CHECK: "mori_shmem.put_nbi"(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]]) {elem = "uint32", scope = "warp"}
// CHECK: "mori_shmem.getmem_nbi"(%[[D]], %[[S]], %[[N]], %[[PE]], %[[QP]]) {scope = "block"}
// CHECK: "mori_shmem.get_nbi"({{.*}}) {elem = "uint64", scope = "thread"}
// CHECK: "mori_shmem.getmem"({{.*}}) {scope = "warp"}
// CHECK: "mori_shmem.get"({{.*}}) {elem = "float", scope = "block"}
// CHECK: "mori_shmem.get"({{.*}}) {elem = "double", scope = "thread"}
func.func @transfers(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32, %qp: i32) {
  "mori_shmem.putmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "thread"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.put_nbi"(%d, %s, %n, %pe, %qp) {scope = "warp", elem = "uint32"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.getmem_nbi"(%d, %s, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.get_nbi"(%d, %s, %n, %pe, %qp) {scope = "thread", elem = "uint64"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.getmem"(%d, %s, %n, %pe, %qp) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.get"(%d, %s, %n, %pe, %qp) {scope = "block", elem = "float"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.get"(%d, %s, %n, %pe, %qp) {scope = "thread", elem = "double"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  return
}

// -----

// Put with signal (both signal ops) and the two immediate puts; `p` with several C types and widths.
// CHECK-LABEL: func.func @signal_and_immediate(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[C:[^:]+]]: i8, %[[H:[^:]+]]: i16, %[[F:[^:]+]]: f32, %[[G:[^:]+]]: f64)
// CHECK: "mori_shmem.putmem_nbi_signal"(%[[D]], %[[D]], %[[N]], %[[D]], %[[N]], %[[PE]], %[[PE]]) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
// CHECK: "mori_shmem.putmem_nbi_signal"({{.*}}) {scope = "warp", signal_op = "set"}
// CHECK: "mori_shmem.put_size_imm_nbi"(%[[D]], %[[D]], %[[N]], %[[PE]], %[[PE]]) : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[C]], %[[PE]], %[[PE]]) {c_type = "uchar"} : (!llvm.ptr, i8, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[H]], %[[PE]], %[[PE]]) {c_type = "short"} : (!llvm.ptr, i16, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[PE]], %[[PE]], %[[PE]]) {c_type = "uint"} : (!llvm.ptr, i32, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[N]], %[[PE]], %[[PE]]) {c_type = "longlong"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[F]], %[[PE]], %[[PE]]) {c_type = "float"} : (!llvm.ptr, f32, i32, i32) -> ()
// CHECK: "mori_shmem.p"(%[[D]], %[[G]], %[[PE]], %[[PE]]) {c_type = "double"} : (!llvm.ptr, f64, i32, i32) -> ()
func.func @signal_and_immediate(%d: !llvm.ptr, %n: i64, %pe: i32, %c: i8, %h: i16, %f: f32, %g: f64) {
  "mori_shmem.putmem_nbi_signal"(%d, %d, %n, %d, %n, %pe, %pe) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.putmem_nbi_signal"(%d, %d, %n, %d, %n, %pe, %pe) {scope = "warp", signal_op = "set"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.put_size_imm_nbi"(%d, %d, %n, %pe, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.p"(%d, %c, %pe, %pe) {c_type = "uchar"} : (!llvm.ptr, i8, i32, i32) -> ()
  "mori_shmem.p"(%d, %h, %pe, %pe) {c_type = "short"} : (!llvm.ptr, i16, i32, i32) -> ()
  "mori_shmem.p"(%d, %pe, %pe, %pe) {c_type = "uint"} : (!llvm.ptr, i32, i32, i32) -> ()
  "mori_shmem.p"(%d, %n, %pe, %pe) {c_type = "longlong"} : (!llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.p"(%d, %f, %pe, %pe) {c_type = "float"} : (!llvm.ptr, f32, i32, i32) -> ()
  "mori_shmem.p"(%d, %g, %pe, %pe) {c_type = "double"} : (!llvm.ptr, f64, i32, i32) -> ()
  return
}

// -----

// Atomics (32- and 64-bit, signed and unsigned elements, fetching and not) and waits (both comparisons).
// CHECK-LABEL: func.func @atomics_and_waits(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[W:[^:]+]]: i32, %[[X:[^:]+]]: i64, %[[PE:[^:]+]]: i32)
// CHECK: "mori_shmem.atomic_nonfetch"(%[[D]], %[[W]], %[[PE]], %[[PE]]) {amo = "inc", elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> ()
// CHECK: "mori_shmem.atomic_nonfetch"(%[[D]], %[[X]], %[[PE]], %[[PE]]) {amo = "xor", elem = "int64"}
// CHECK: %{{.*}} = "mori_shmem.atomic_fetch"(%[[D]], %[[X]], %[[X]], %[[PE]], %[[PE]]) {amo = "compare_swap", elem = "uint64"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
// CHECK: %{{.*}} = "mori_shmem.atomic_fetch"(%[[D]], %[[W]], %[[W]], %[[PE]], %[[PE]]) {amo = "fetch_or", elem = "uint32"} : (!llvm.ptr, i32, i32, i32, i32) -> i32
// CHECK: "mori_shmem.atomic_add"(%[[D]], %[[X]], %[[PE]], %[[PE]]) {elem = "int64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK: %{{.*}} = "mori_shmem.atomic_fetch_add"(%[[D]], %[[W]], %[[PE]], %[[PE]]) {elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> i32
// CHECK: "mori_shmem.atomic_size_nonfetch"(%[[D]], %[[D]], %[[X]], %[[PE]], %[[PE]]) {amo = "set"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
// CHECK: %{{.*}} = "mori_shmem.wait_until"(%[[D]], %[[X]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK: %{{.*}} = "mori_shmem.wait_until"(%[[D]], %[[W]]) {cmp = "equals", elem = "int32"} : (!llvm.ptr, i32) -> i32
func.func @atomics_and_waits(%d: !llvm.ptr, %w: i32, %x: i64, %pe: i32) {
  "mori_shmem.atomic_nonfetch"(%d, %w, %pe, %pe) {elem = "uint32", amo = "inc"} : (!llvm.ptr, i32, i32, i32) -> ()
  "mori_shmem.atomic_nonfetch"(%d, %x, %pe, %pe) {elem = "int64", amo = "xor"} : (!llvm.ptr, i64, i32, i32) -> ()
  %0 = "mori_shmem.atomic_fetch"(%d, %x, %x, %pe, %pe) {elem = "uint64", amo = "compare_swap"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
  %1 = "mori_shmem.atomic_fetch"(%d, %w, %w, %pe, %pe) {elem = "uint32", amo = "fetch_or"} : (!llvm.ptr, i32, i32, i32, i32) -> i32
  "mori_shmem.atomic_add"(%d, %x, %pe, %pe) {elem = "int64"} : (!llvm.ptr, i64, i32, i32) -> ()
  %2 = "mori_shmem.atomic_fetch_add"(%d, %w, %pe, %pe) {elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> i32
  "mori_shmem.atomic_size_nonfetch"(%d, %d, %x, %pe, %pe) {amo = "set"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  %3 = "mori_shmem.wait_until"(%d, %x) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
  %4 = "mori_shmem.wait_until"(%d, %w) {cmp = "equals", elem = "int32"} : (!llvm.ptr, i32) -> i32
  return
}

// -----

// Completion and ordering: quiet/fence with 0, 1 and 2 targets; barrier_all at both scopes.
// CHECK-LABEL: func.func @ordering(
// CHECK-SAME: %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK: "mori_shmem.quiet"() : () -> ()
// CHECK: "mori_shmem.quiet"(%[[PE]]) : (i32) -> ()
// CHECK: "mori_shmem.quiet"(%[[PE]], %[[QP]]) : (i32, i32) -> ()
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_shmem.fence"(%[[PE]]) : (i32) -> ()
// CHECK: "mori_shmem.fence"(%[[PE]], %[[QP]]) : (i32, i32) -> ()
// CHECK: "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
// CHECK: "mori_shmem.barrier_all"() {scope = "block"} : () -> ()
func.func @ordering(%pe: i32, %qp: i32) {
  "mori_shmem.quiet"() : () -> ()
  "mori_shmem.quiet"(%pe) : (i32) -> ()
  "mori_shmem.quiet"(%pe, %qp) : (i32, i32) -> ()
  "mori_shmem.fence"() : () -> ()
  "mori_shmem.fence"(%pe) : (i32) -> ()
  "mori_shmem.fence"(%pe, %qp) : (i32, i32) -> ()
  "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
  "mori_shmem.barrier_all"() {scope = "block"} : () -> ()
  return
}
