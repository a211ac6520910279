// An op inside a kernel that the rocdl stage does not lower (tensor.* here) must be reported with its
// location before the MLIR -> LLVM IR translation, whose C API would crash the process on it.
// REQUIRES: amdgpu-target
// RUN: not mori-compile %s --stop-after=llvm-ir 2>&1 | FileCheck %s
// CHECK-NOT: Segmentation fault
// CHECK: error: {{.*}}unlowered-ops.mlir:{{[0-9]+}}:{{[0-9]+}}: op 'tensor.empty' was not lowered to the LLVM dialect
module attributes {gpu.container_module} {
  gpu.module @unlowered {
    gpu.func @k(%p: !llvm.ptr, %i: index) kernel {
      %t = tensor.empty() : tensor<4xf32>
      %e = tensor.extract %t[%i] : tensor<4xf32>
      llvm.store %e, %p : f32, !llvm.ptr
      gpu.return
    }
  }
}
