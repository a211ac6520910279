// RUN: %python -c "import subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=open('/dev/full', 'w'), stderr=subprocess.PIPE, text=True); print(r.stderr, 'exit status:', r.returncode)" %python -m mori_compiler.tools.opt %s | FileCheck %s
// RUN: %exit-status mori-opt %s -o /dev/full 2>&1 | FileCheck %s --check-prefix=FILE
// RUN: %exit-status mori-opt /dev/zero 2>&1 | FileCheck %s --check-prefix=ZERO

// Regression (issue 11): output to a full device was an internal error (exit 2, an OSError), and an
// endless input (/dev/zero) was read until memory ran out.

// CHECK: error: cannot write to stdout: No space left on device
// CHECK: exit status: 1
// FILE: error: cannot write /dev/full: No space left on device
// FILE: exit status: 1
// ZERO: error: /dev/zero is larger than 256 MiB; inputs are MLIR text files
// ZERO: exit status: 1
module {
}
