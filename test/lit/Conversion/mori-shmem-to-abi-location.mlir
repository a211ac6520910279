// Errors raised by the mori-shmem-to-abi pass name the input file, line and column like every other
// diagnostic of mori-opt.
// RUN: not mori-opt -p mori-shmem-to-abi %s 2>&1 | FileCheck %s
// CHECK: error: {{.*}}mori-shmem-to-abi-location.mlir:[[# @LINE + 2]]:3: 'mori_shmem_my_pe' is already declared with another type
module {
  llvm.func @mori_shmem_my_pe() -> i64
  func.func @f() -> i32 {
    %0 = "mori_shmem.my_pe"() : () -> i32
    return %0 : i32
  }
}
