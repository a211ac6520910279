// REQUIRES: stock-mlir-opt
// RUN: mori-opt --emit-irdl > %t.irdl
// RUN: mori-opt %s | %mlir-opt --irdl-file=%t.irdl | mori-opt | FileCheck %s
// RUN: not %mlir-opt --irdl-file=%t.irdl --split-input-file %S/Inputs/irdl-invalid.mlir 2>&1 | FileCheck %s --check-prefix=STOCK
// RUN: not mori-opt --split-input-file %S/Inputs/irdl-invalid.mlir 2>&1 | FileCheck %s --check-prefix=MORI

// The IRDL that `mori-opt --emit-irdl` prints is the dialect for stock mlir-opt: what mori-opt prints,
// stock mlir-opt parses, verifies and prints back in a form mori-opt reads again (variadic operands,
// constraint variables shared by several operands, every attribute kind included).
// CHECK-LABEL: func.func @interop(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[C:[^:]+]]: i8)
// CHECK: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK: %{{.*}} = "mori_shmem.ptr_p2p"(%[[D]], %[[ME]], %[[PE]]) : (!llvm.ptr, i32, i32) -> !llvm.ptr
// CHECK: "mori_shmem.put_nbi"(%[[D]], %[[D]], %[[N]], %[[PE]], %[[PE]]) {elem = "double", scope = "warp"}
// CHECK: "mori_shmem.putmem_nbi_signal"(%[[D]], %[[D]], %[[N]], %[[D]], %[[N]], %[[PE]], %[[PE]]) {scope = "block", signal_op = "add"}
// CHECK: "mori_shmem.p"(%[[D]], %[[C]], %[[PE]], %[[PE]]) {c_type = "char"} : (!llvm.ptr, i8, i32, i32) -> ()
// CHECK: %{{.*}} = "mori_shmem.atomic_fetch"(%[[D]], %[[N]], %[[N]], %[[PE]], %[[PE]]) {amo = "compare_swap", elem = "uint64"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
// CHECK: %{{.*}} = "mori_shmem.wait_until"(%[[D]], %[[N]]) {cmp = "greater_than", elem = "int64"} : (!llvm.ptr, i64) -> i64
// CHECK: "mori_shmem.quiet"() : () -> ()
// CHECK: "mori_shmem.fence"(%[[PE]], %[[PE]]) : (i32, i32) -> ()
// CHECK: "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
func.func @interop(%d: !llvm.ptr, %n: i64, %pe: i32, %c: i8) {
  %me = "mori_shmem.my_pe"() : () -> i32
  %p = "mori_shmem.ptr_p2p"(%d, %me, %pe) : (!llvm.ptr, i32, i32) -> !llvm.ptr
  "mori_shmem.put_nbi"(%d, %d, %n, %pe, %pe) {scope = "warp", elem = "double"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.putmem_nbi_signal"(%d, %d, %n, %d, %n, %pe, %pe) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
  "mori_shmem.p"(%d, %c, %pe, %pe) {c_type = "char"} : (!llvm.ptr, i8, i32, i32) -> ()
  %o = "mori_shmem.atomic_fetch"(%d, %n, %n, %pe, %pe) {elem = "uint64", amo = "compare_swap"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
  %w = "mori_shmem.wait_until"(%d, %n) {cmp = "greater_than", elem = "int64"} : (!llvm.ptr, i64) -> i64
  "mori_shmem.quiet"() : () -> ()
  "mori_shmem.fence"(%pe, %pe) : (i32, i32) -> ()
  "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
  return
}

// Stock mlir-opt rejects what mori-opt rejects (a scope outside the enum, operands that share one
// IRDL constraint variable with different widths, a missing attribute) ...
// STOCK: irdl-invalid.mlir:3:3: error: '"grid"' does not satisfy the constraint
// STOCK: irdl-invalid.mlir:8:8: error: expected 'i64' but got 'i32'
// STOCK: irdl-invalid.mlir:13:3: error: 'mori_shmem.barrier_all' op attribute "scope" is expected but not provided

// ... and mori-opt says which op, which field and what is allowed.
// MORI: irdl-invalid.mlir:3:3: 'mori_shmem.putmem_nbi' attribute 'scope' must be one of "thread", "warp", "block", got "grid"
// MORI: irdl-invalid.mlir:8:8: 'mori_shmem.atomic_fetch' operand 'compare' must be i64 because elem = "int64", got i32
// MORI: irdl-invalid.mlir:13:3: 'mori_shmem.barrier_all' missing attribute 'scope' (one of "thread", "block")
