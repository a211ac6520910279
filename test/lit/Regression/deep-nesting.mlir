// RUN: %python -c "d = 20000; print('func.func @f() attributes {a = ' + '[' * d + ']' * d + '} {\n  return\n}')" > %t.attr.mlir
// RUN: %exit-status mori-opt %t.attr.mlir 2>&1 | FileCheck %s --check-prefix=ATTR
// RUN: %python -c "d = 3000; print('func.func @f() {\n' + 'scf.execute_region {\n' * d + 'scf.yield\n}\n' * d + 'return\n}')" > %t.regions.mlir
// RUN: %exit-status mori-opt %t.regions.mlir 2>&1 | FileCheck %s --check-prefix=REGIONS
// RUN: %exit-status mori-compile %t.regions.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=REGIONS

// Regression (issue 11, found by fuzzing): deeply nested brackets overflowed the stack of MLIR's
// recursive parser (a segfault) and nested regions the Python recursion of the dialect check (exit 2).
// More than 256 levels are refused at the first bracket too deep; the dialect check walks iteratively.

// ATTR: error: {{.*}}.attr.mlir:1:287: nesting deeper than 256 levels of brackets (regions, attributes, types)
// ATTR: exit status: 1
// REGIONS: error: {{.*}}.regions.mlir:257:20: nesting deeper than 256 levels of brackets
// REGIONS: exit status: 1
