// RUN: %exit-status mori-compile --list-examples | FileCheck %s --check-prefix=OK
// RUN: %exit-status mori-compile --target=gfx900 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-compile no_such_example 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-compile --emit=ptx 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-compile -O 7 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-compile --code-object-version=abc 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-compile --frobnicate 2>&1 | FileCheck %s --check-prefix=USER
// RUN: %exit-status mori-opt %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=USER

// Exit status of the CLIs: 0 on success, 1 for every user error (2 would be an internal compiler error,
// which must never be what a bad flag or input produces).

// OK: ring_put_signal
// OK: exit status: 0

// USER-NOT: Traceback
// USER: error:
// USER-NOT: internal compiler error
// USER: exit status: 1
