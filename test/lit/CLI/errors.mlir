// RUN: not mori-compile --target=gfx900 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not mori-compile %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=NO-FILE
// RUN: not mori-compile no_such_example 2>&1 | FileCheck %s --check-prefix=EXAMPLE
// RUN: not mori-compile --emit=obj 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: not mori-compile --emit=ptx --target=gfx942 2>&1 | FileCheck %s --check-prefix=PTX-ON-AMD
// RUN: not mori-compile --emit=hsaco --target=sm_90 2>&1 | FileCheck %s --check-prefix=HSACO-ON-NV
// RUN: not mori-compile -O 7 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not mori-compile -O fast 2>&1 | FileCheck %s --check-prefix=OPT-INT
// RUN: not mori-compile --code-object-version=4 2>&1 | FileCheck %s --check-prefix=COV
// RUN: not mori-compile --code-object-version=v6 2>&1 | FileCheck %s --check-prefix=COV-INT
// RUN: not mori-compile --stop-after=ptx 2>&1 | FileCheck %s --check-prefix=STAGE
// RUN: not mori-compile --frobnicate 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not mori-opt %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=OPT-NO-FILE
// RUN: not mori-opt --frobnicate 2>&1 | FileCheck %s --check-prefix=OPT-FLAG

// Every user error of the CLIs is one `error:` line naming what is wrong and what is allowed; never a
// Python traceback. (CLI/exit-codes.mlir pins the exit status, 1.)

// Unknown target: the allowed targets are listed.
// TARGET-NOT: Traceback
// TARGET: error: unknown target 'gfx900'; allowed targets: gfx942, gfx950, gfx1250, sm_90

// Missing input file / unknown built-in example.
// NO-FILE-NOT: Traceback
// NO-FILE: error: no such file: {{.*}}does-not-exist.mlir
// EXAMPLE-NOT: Traceback
// EXAMPLE: error: 'no_such_example' is neither a file nor a built-in example (ring_put_signal{{(, [a-z_0-9]+)*}})

// --emit: unknown kind (allowed kinds listed); an output kind of the other GPU vendor.
// EMIT-NOT: Traceback
// EMIT: error: unknown --emit 'obj'; allowed: hsaco, ptx, isa, llvm, mlir, bundle
// PTX-ON-AMD-NOT: Traceback
// PTX-ON-AMD: error: --emit=ptx does not apply to target gfx942
// HSACO-ON-NV-NOT: Traceback
// HSACO-ON-NV: error: --emit=hsaco does not apply to target sm_90

// -O and --code-object-version: out of range (allowed values listed) and not an integer.
// OPT-NOT: Traceback
// OPT: error: optimization level 7 is not supported; allowed: 0, 1, 2, 3
// OPT-INT-NOT: Traceback
// OPT-INT: error: argument -O: invalid int value: 'fast' (see mori-compile --help)
// COV-NOT: Traceback
// COV: error: code object version 4 is not supported; allowed: 5, 6
// COV-INT-NOT: Traceback
// COV-INT: error: argument --code-object-version: invalid int value: 'v6' (see mori-compile --help)

// --stop-after: a stage of another target (the target's stages are listed).
// STAGE-NOT: Traceback
// STAGE: error: unknown stage 'ptx' for target gfx942; stages: mori, ep, abi, rocdl, llvm-ir, link, opt, isa, object, hsaco

// Unknown flags, for both tools.
// FLAG-NOT: Traceback
// FLAG: error: unrecognized arguments: --frobnicate (see mori-compile --help)
// OPT-FLAG-NOT: Traceback
// OPT-FLAG: error: unrecognized arguments: --frobnicate (see mori-opt --help)
// OPT-NO-FILE-NOT: Traceback
// OPT-NO-FILE: error: no such file: {{.*}}does-not-exist.mlir
