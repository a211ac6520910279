// RUN: %exit-status mori-compile %s --target gfx942 -o %t.hsaco --no-report 2>&1 | FileCheck %s
// RUN: %exit-status mori-compile %s --target sm_90 -o %t.ptx 2>&1 | FileCheck %s
// RUN: %exit-status mori-opt %s 2>&1 | FileCheck %s

// Regression (issue 11, fuzzing seed 2026): an upstream op directly in a gpu.module (here gpu.barrier) is
// lowered in place by convert-gpu-to-rocdl/nvvm and then crashed MLIR's LLVM IR translator (SIGSEGV).
// Only functions, globals, module-level LLVM metadata and the mori_ep kernel ops may stand there.

module attributes {gpu.container_module} {
  gpu.module @a {
    gpu.func @k() kernel {
      gpu.return
    }
    // CHECK: error: {{.*}}gpu-module-level-ops.mlir:[[@LINE+1]]:5: 'gpu.barrier' cannot stand directly in a gpu.module (allowed there: functions, globals and the mori_ep kernel ops); put it inside a gpu.func
    "gpu.barrier"() : () -> ()
  }
}

// CHECK-NOT: error:
// CHECK: exit status: 1
