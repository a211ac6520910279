// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' --split-input-file 2>&1 | FileCheck %s --implicit-check-not=error:
// RUN: %exit-status mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' --split-input-file 2>&1 | FileCheck %s --check-prefix=EXIT

// Inputs the building-block lowering refuses, with one error line naming the file, line, op and operand
// (exit status 1, no traceback).

// row_copy_to_peers copies 16-byte vectors: its row size must be a multiple of 16 by construction.
// CHECK: error: {{.*}}mori-comm-to-calls-invalid.mlir:[[# @LINE + 4]]:7: 'mori_comm.row_copy_to_peers' operand 'bytes' must be a multiple of 16 by construction (a constant, or a value masked with andi -16: the row is copied in 16-byte vectors)
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32, %on: i1) kernel {
      "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %on) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}

// -----

// CHECK: error: {{.*}}mori-comm-to-calls-invalid.mlir:[[# @LINE + 5]]:7: 'mori_comm.row_copy_to_peers' operand 'bytes' must be a multiple of 16 by construction
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32, %on: i1) kernel {
      %n = arith.constant 7176 : i64
      "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %on) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}

// -----

// A mask that keeps bit 3 (andi -8) does not make the size a multiple of 16.
// CHECK: error: {{.*}}mori-comm-to-calls-invalid.mlir:[[# @LINE + 6]]:7: 'mori_comm.row_copy_to_peers' operand 'bytes' must be a multiple of 16 by construction
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32, %on: i1, %h: i64) kernel {
      %m = arith.constant -8 : i64
      %n = arith.andi %h, %m : i64
      "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %on) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}

// EXIT: exit status: 1
// EXIT-NOT: Traceback
