// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s
// RUN: %python -c "import re; print(re.split(r'(?m)^// -----$', open(r'%s').read())[0])" > %t.first.mlir
// RUN: %exit-status mori-compile %t.first.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: %exit-status mori-compile %t.first.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=COMPILE

// Regression (issue 11): `known_block_size = array<i32: 2147483648, 1, 1>` made the NVVM/ROCDL
// translation build an out-of-range APInt (an assertion, abort); `-1` failed without a location. Launch
// bounds are checked when the file is parsed: 1 to 1024 threads per block dimension and in all, 1 to
// 2**31 - 1 blocks per grid dimension, with the op's location.

// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+3]]:5: 'gpu.func' attribute 'known_block_size' elements must be in [1, 1024], got -2147483648
// COMPILE: error: {{.*}}.first.mlir:[[@LINE+2]]:5: 'gpu.func' attribute 'known_block_size' elements must be in [1, 1024], got -2147483648
gpu.module @m {
    gpu.func @k() kernel attributes {known_block_size = array<i32: 2147483648, 1, 1>} {
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+2]]:5: 'gpu.func' attribute 'known_block_size' elements must be in [1, 1024], got -1
gpu.module @m {
    gpu.func @k() kernel attributes {known_block_size = array<i32: -1, 1, 1>} {
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+2]]:5: 'gpu.func' attribute 'known_block_size' [64, 32, 1] has 2048 threads; a block has at most 1024
gpu.module @m {
    gpu.func @k() kernel attributes {known_block_size = array<i32: 64, 32, 1>} {
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+2]]:5: 'gpu.func' attribute 'known_grid_size' elements must be in [1, 2147483647], got 0
gpu.module @m {
    gpu.func @k() kernel attributes {known_grid_size = array<i32: 0, 1, 1>} {
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+1]]:3: 'llvm.func' attribute 'nvvm.maxntid' elements must be in [1, 1024], got -5
  llvm.func @f() attributes {nvvm.maxntid = array<i32: -5, 1, 1>} {
    llvm.return
  }

// -----
// The scalar kernel attributes LLVM reads as unsigned numbers ("can't parse first integer attribute").
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+3]]:5: 'gpu.func' attribute 'rocdl.waves_per_eu' must be in [1, 2147483647], got -1
// CHECK: error: {{.*}}launch-bounds.mlir:[[@LINE+5]]:5: 'gpu.func' attribute 'rocdl.flat_work_group_size' must be "MIN,MAX" with 1 <= MIN <= MAX <= 1024, got "0,99999"
gpu.module @m {
    gpu.func @k() kernel attributes {rocdl.waves_per_eu = -1 : i32} {
      gpu.return
    }
    gpu.func @l() kernel attributes {rocdl.flat_work_group_size = "0,99999"} {
      gpu.return
    }
}

// CHECK-NOT: error:
// CHECK: exit status: 1
// COMPILE-NOT: Assertion
// COMPILE: exit status: 1
