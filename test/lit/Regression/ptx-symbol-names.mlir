// REQUIRES: nvptx-target, amdgpu-target
// RUN: %exit-status mori-compile %s --target sm_90 -o %t.ptx 2>&1 | FileCheck %s
// RUN: mori-compile %s --target gfx942 --emit=llvm -o - | FileCheck %s --check-prefix=AMDGPU
// RUN: %python -c "print(open(r'%s').read().replace('@\"a b\"', '@\"a\\\\00b\"'))" > %t.nul.mlir
// RUN: %exit-status mori-opt %t.nul.mlir 2>&1 | FileCheck %s --check-prefix=NUL

// Regression (issue 11): a kernel named with a character PTX does not accept ended sm_90 compiles in
// "LLVM ERROR: Symbol name with unsupported characters" (an abort). Names are checked per target before
// LLVM sees them: PTX takes identifiers only; an AMDGPU code object any printable name. A NUL in a name
// (an LLVM assertion on every target) is refused when the file is parsed.

// CHECK: error: {{.*}}ptx-symbol-names.mlir:[[@LINE+6]]:5: 'llvm.func': kernel name 'a b' is not a PTX identifier (a letter, '_' or '$' followed by letters, digits, '_' or '$'), as PTX requires
// CHECK-NOT: LLVM ERROR
// CHECK: exit status: 1
// AMDGPU: define amdgpu_kernel void @"a b"()
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @"a b"() kernel {
      gpu.return
    }
  }
}

// NUL: error: {{.*}}.nul.mlir:18:5: 'gpu.func' symbol name 'a\x00b' holds a control character
// NUL: exit status: 1
