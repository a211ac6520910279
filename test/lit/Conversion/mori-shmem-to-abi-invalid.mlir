// RUN: not mori-opt --split-input-file -p mori-shmem-to-abi %s 2>&1 | FileCheck %s
// RUN: %exit-status mori-opt --split-input-file -p mori-shmem-to-abi %s 2>&1 | FileCheck %s --check-prefix=EXIT
// RUN: not mori-opt -p 'builtin.module(func.func(mori-shmem-to-abi))' %s 2>&1 | FileCheck %s --check-prefix=NESTED

// mori-shmem-to-abi refuses to reuse a symbol that is already declared differently from the device ABI.
// EXIT: exit status: 1
// A project pass nested under an op anchor is rejected with a hint (it runs on the whole module).
// NESTED: error: project pass 'mori-shmem-to-abi' must be a top-level element of the pipeline (it runs on the whole module)
// CHECK-NOT: Traceback
// (The location is not pinned: the pass reports it as `loc("-":L:C)` instead of `<file>:L:C`.)

// An llvm.func with another return type.
// CHECK: error: {{.*}}'mori_shmem_my_pe' is already declared with another type; the device ABI has i32 ()
module {
  llvm.func @mori_shmem_my_pe() -> i64
  func.func @f() -> i32 {
    %0 = "mori_shmem.my_pe"() : () -> i32
    return %0 : i32
  }
}

// -----

// Other parameter types (the ABI's size_t is i64, not i32).
// CHECK: error: {{.*}}'mori_shmem_putmem_nbi_block' is already declared with another type; the device ABI has i32 (ptr, ptr, i64, i32, i32)
module {
  llvm.func @mori_shmem_putmem_nbi_block(!llvm.ptr, !llvm.ptr, i32, i32, i32) -> i32
  func.func @f(%d: !llvm.ptr, %n: i64, %pe: i32) {
    "mori_shmem.putmem_nbi"(%d, %d, %n, %pe, %pe) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
    return
  }
}

// -----

// The right type, but a func.func instead of an llvm.func.
// CHECK: error: {{.*}}'mori_shmem_n_pes' is already declared with another type; the device ABI has i32 ()
module {
  func.func private @mori_shmem_n_pes() -> i32
  func.func @f() -> i32 {
    %0 = "mori_shmem.n_pes"() : () -> i32
    return %0 : i32
  }
}
