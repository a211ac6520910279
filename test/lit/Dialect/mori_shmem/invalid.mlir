// RUN: not mori-opt --split-input-file %s 2>&1 | FileCheck %s
// RUN: %exit-status mori-opt --split-input-file %s 2>&1 | FileCheck %s --check-prefix=EXIT

// Every chunk is rejected with one line `error: <file>:<line>:<col>: '<op>' <field> ...`; exit status 1.
// EXIT: exit status: 1
// CHECK-NOT: Traceback

// Wrong operand type: `bytes` is i64.
func.func @operand_type(%d: !llvm.ptr, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.putmem_nbi' operand 'bytes' must be i64, got i32
  "mori_shmem.putmem_nbi"(%d, %d, %pe, %pe, %pe) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i32, i32, i32) -> ()
  return
}

// -----
// Wrong operand count: the message lists the operand names.
func.func @operand_count(%d: !llvm.ptr, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.ptr' expected 2 operands (addr, dest_pe), got 3
  %p = "mori_shmem.ptr"(%d, %pe, %pe) : (!llvm.ptr, i32, i32) -> !llvm.ptr
  return
}

// -----
// Wrong result type.
func.func @result_type() {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.my_pe' result 'pe' must be i32, got i64
  %m = "mori_shmem.my_pe"() : () -> i64
  return
}

// -----
// Wrong attribute value: the allowed scopes are listed.
func.func @scope_value(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.putmem_nbi' attribute 'scope' must be one of "thread", "warp", "block", got "grid"
  "mori_shmem.putmem_nbi"(%d, %d, %n, %pe, %pe) {scope = "grid"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  return
}

// -----
// barrier_all has no warp scope; an integer is not a scope either.
func.func @barrier_scope() {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.barrier_all' attribute 'scope' must be one of "thread", "block", got "warp"
  "mori_shmem.barrier_all"() {scope = "warp"} : () -> ()
  return
}

// -----
func.func @barrier_scope_int() {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.barrier_all' attribute 'scope' must be one of "thread", "block", got 1 : i32
  "mori_shmem.barrier_all"() {scope = 1 : i32} : () -> ()
  return
}

// -----
// A non-fetching amo on atomic_fetch: the fetch variants are listed.
func.func @fetch_amo(%d: !llvm.ptr, %v: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.atomic_fetch' attribute 'amo' must be one of "fetch", "fetch_inc", "fetch_add", "fetch_and", "fetch_or", "fetch_xor", "swap", "compare_swap", got "inc"
  %o = "mori_shmem.atomic_fetch"(%d, %v, %v, %pe, %pe) {elem = "int64", amo = "inc"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
  return
}

// -----
// Missing attribute: named with its allowed values.
func.func @missing_attr(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.put_nbi' missing attribute 'elem' (one of "uint32", "uint64", "float", "double")
  "mori_shmem.put_nbi"(%d, %d, %n, %pe, %pe) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  return
}

// -----
// Unknown attribute: the allowed attribute names are listed.
func.func @unknown_attr(%d: !llvm.ptr, %v: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.wait_until' unknown attribute 'order' (allowed: 'cmp', 'elem')
  %o = "mori_shmem.wait_until"(%d, %v) {cmp = "equals", elem = "uint64", order = "acquire"} : (!llvm.ptr, i64) -> i64
  return
}

// -----
// Unknown op: the dialect's ops are listed.
func.func @unknown_op() {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: unknown op 'mori_shmem.put_signal'; the mori_shmem dialect has: atomic_add, atomic_fetch, {{.*}}, putmem_nbi_signal, quiet, wait_until
  "mori_shmem.put_signal"() : () -> ()
  return
}

// -----
// p: the value's width must be that of c_type.
func.func @p_width(%d: !llvm.ptr, %v: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.p' operand 'value' must be i32 because c_type = "int", got i64
  "mori_shmem.p"(%d, %v, %pe, %pe) {c_type = "int"} : (!llvm.ptr, i64, i32, i32) -> ()
  return
}

// -----
// Atomics: value and result must have elem's width (one error each).
func.func @atomic_elem(%d: !llvm.ptr, %v: i32, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:8: 'mori_shmem.atomic_fetch_add' operand 'value' must be i64 because elem = "uint64", got i32
  // CHECK-NEXT: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.atomic_fetch_add' result must be i64 because elem = "uint64", got i32
  %o = "mori_shmem.atomic_fetch_add"(%d, %v, %pe, %pe) {elem = "uint64"} : (!llvm.ptr, i32, i32, i32) -> i32
  return
}

// -----
// atomic_fetch: compare must have elem's width too.
func.func @atomic_compare(%d: !llvm.ptr, %v: i64, %c: i32, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.atomic_fetch' operand 'compare' must be i64 because elem = "int64", got i32
  %o = "mori_shmem.atomic_fetch"(%d, %v, %c, %pe, %pe) {elem = "int64", amo = "compare_swap"} : (!llvm.ptr, i64, i32, i32, i32) -> i64
  return
}

// -----
// wait_until: value and result must have elem's width.
func.func @wait_elem(%d: !llvm.ptr, %v: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_shmem.wait_until' operand 'value' must be i32 because elem = "int32", got i64
  %o = "mori_shmem.wait_until"(%d, %v) {cmp = "equals", elem = "int32"} : (!llvm.ptr, i64) -> i64
  return
}

// -----
// quiet takes at most (pe, qp).
func.func @quiet_three(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_shmem.quiet' takes at most 2 operands (pe, qp), got 3
  "mori_shmem.quiet"(%pe, %pe, %pe) : (i32, i32, i32) -> ()
  return
}

// -----
// Malformed IR: the parser's message with its line:col.
func.func @malformed(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:30: expected ')' to end operand list
  "mori_shmem.quiet"(%pe, %pe : (i32, i32) -> ()
  return
}

// Nothing else: no traceback after the last error either.
// CHECK-NOT: Traceback
