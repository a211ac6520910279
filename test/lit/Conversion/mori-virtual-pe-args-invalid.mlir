// RUN: not mori-opt %s -p mori-virtual-pe-args 2>&1 | FileCheck %s

// A parameter type the argument table cannot carry is reported with the kernel's location and its index.
// CHECK: error: {{.*}}mori-virtual-pe-args-invalid.mlir:[[@LINE+3]]:5: kernel 'k' parameter 1 has type index; virtual-PE kernels take !llvm.ptr, i64, i32, i16, i8, f64, f32
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%buf: !llvm.ptr, %i: index) kernel {
      gpu.return
    }
  }
}
