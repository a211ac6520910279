// RUN: %exit-status mori-opt %s 2>&1 | FileCheck %s
// RUN: %exit-status mori-compile %s --target sm_90 -o %t.ptx 2>&1 | FileCheck %s

// Regression (issue 11): with several gpu.modules whose gpu.func lacks its terminator, MLIR's
// multi-threaded verifier reported from worker threads without the GIL and nanobind aborted the process
// ("GIL was not held"). Every MLIR context of the compiler runs on one thread (_mlir.new_context), so the
// diagnostics arrive in order, each located, and the tool exits 1. (The race needs more cores than CI
// machines have to show on the old code; this pins the outcome.)
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK: error: {{.*}}many-modules-diagnostics.mlir:{{[0-9]+}}:10: block with no terminator
// CHECK-NOT: error:
// CHECK: exit status: 1

gpu.module @m0 {
  gpu.func @k() kernel {
    %c = arith.constant 0 : i32
  }
}
gpu.module @m1 {
  gpu.func @k() kernel {
    %c = arith.constant 1 : i32
  }
}
gpu.module @m2 {
  gpu.func @k() kernel {
    %c = arith.constant 2 : i32
  }
}
gpu.module @m3 {
  gpu.func @k() kernel {
    %c = arith.constant 3 : i32
  }
}
gpu.module @m4 {
  gpu.func @k() kernel {
    %c = arith.constant 4 : i32
  }
}
gpu.module @m5 {
  gpu.func @k() kernel {
    %c = arith.constant 5 : i32
  }
}
gpu.module @m6 {
  gpu.func @k() kernel {
    %c = arith.constant 6 : i32
  }
}
gpu.module @m7 {
  gpu.func @k() kernel {
    %c = arith.constant 7 : i32
  }
}
gpu.module @m8 {
  gpu.func @k() kernel {
    %c = arith.constant 8 : i32
  }
}
gpu.module @m9 {
  gpu.func @k() kernel {
    %c = arith.constant 9 : i32
  }
}
gpu.module @m10 {
  gpu.func @k() kernel {
    %c = arith.constant 10 : i32
  }
}
gpu.module @m11 {
  gpu.func @k() kernel {
    %c = arith.constant 11 : i32
  }
}
gpu.module @m12 {
  gpu.func @k() kernel {
    %c = arith.constant 12 : i32
  }
}
gpu.module @m13 {
  gpu.func @k() kernel {
    %c = arith.constant 13 : i32
  }
}
gpu.module @m14 {
  gpu.func @k() kernel {
    %c = arith.constant 14 : i32
  }
}
gpu.module @m15 {
  gpu.func @k() kernel {
    %c = arith.constant 15 : i32
  }
}
