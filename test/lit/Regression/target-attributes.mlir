// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s

// Regression (issue 11, found by probing attribute syntax): the parsers of #rocdl.target and #xevm.target
// build the attribute with an asserting get, so an ABI, optimization level or empty chip their verifier
// refuses aborted both tools; #nvvm.target's verifier asserts on a chip shorter than "sm_". The tokens are
// checked before MLIR parses them.

// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #rocdl.target 'abi' must be "400", "500" or "600", got "7"
gpu.module @m [#rocdl.target<chip = "gfx942", abi = "7">] {
}

// -----
// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #rocdl.target 'chip' must not be empty
gpu.module @m [#rocdl.target<O = 3, chip = "">] {
}

// -----
// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #rocdl.target 'O' must be 0, 1, 2 or 3
gpu.module @m [#rocdl.target<O = 9, chip = "gfx942">] {
}

// -----
// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #xevm.target 'O' must be 0, 1, 2 or 3
gpu.module @m [#xevm.target<O = 9>] {
}

// -----
// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #rocdl.target 'link' must be a list of strings
gpu.module @m [#rocdl.target<link = [1]>] {
}

// -----
// CHECK: error: {{.*}}target-attributes.mlir:[[@LINE+1]]:16: #nvvm.target 'chip' must be an SM name such as "sm_90", got "x"
gpu.module @m [#nvvm.target<chip = "x">] {
}

// -----
// Accepted: every field as its verifier wants it.
// CHECK-NOT: error:
// CHECK: gpu.module @m [#rocdl.target<O = 0, chip = "gfx942", abi = "500", link = ["a.bc"]>]
gpu.module @m [#rocdl.target<O = 0, chip = "gfx942", abi = "500", link = ["a.bc"]>] {
}

// CHECK: exit status: 1
