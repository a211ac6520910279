// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s
// RUN: %exit-status mori-compile %s --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: %exit-status mori-compile %s --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=COMPILE

// Regression (issue 11): a dense array of `index` elements made MLIR's parser assert
// (Type::getIntOrFloatBitWidth) and abort both tools. It is refused before MLIR parses the text, also
// through type aliases, and neither inside a comment nor inside a string.

// CHECK: error: {{.*}}dense-array-index.mlir:[[@LINE+2]]:32: a dense array's element type must be an integer or float type (i1 ... i64, f16 ... f64), got index
// COMPILE: error: {{.*}}dense-array-index.mlir:[[@LINE+1]]:32: a dense array's element type
func.func @f() attributes {a = array<index: 1>} {
  return
}

// -----
// CHECK: error: {{.*}}dense-array-index.mlir:[[@LINE+3]]:32: a dense array's element type {{.*}} got index
!t = index
!u = !t
func.func @g() attributes {a = array<!u>} {
  return
}

// -----
// Found by fuzzing: without spaces, `%3` after `!t` must not read as a redefinition of the alias.
// CHECK: error: {{.*}}dense-array-index.mlir:[[@LINE+1]]:59: a dense array's element type {{.*}} got index
!t=index!u=!t%3=arith.constant 1func.func@g()attributes{a=array<!u

// -----
// Not an array attribute: `array<index: 1>` in a comment and in a string.
func.func @h() attributes {doc = "array<index: 1>"} {
  return
}

// CHECK-NOT: error:
// CHECK-NOT: Assertion
// CHECK: exit status: 1
// COMPILE-NOT: Assertion
// COMPILE: exit status: 1
