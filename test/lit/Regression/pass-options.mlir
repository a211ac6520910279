// RUN: %exit-status mori-opt %s -p 'rocdl-attach-target{chip=gfx942 abi=99999999999 wave64=true}' 2>&1 | FileCheck %s --check-prefix=ABI
// RUN: %exit-status mori-opt %s -p 'nvvm-attach-target{chip=sm_90 O=99}' 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: %exit-status mori-opt %s -p 'nvvm-attach-target{chip=}' 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: %exit-status mori-opt %s -p 'nvvm-attach-target{chip=x}' 2>&1 | FileCheck %s --check-prefix=SM
// RUN: %exit-status mori-opt %s -p 'builtin.module(rocdl-attach-target{chip=gfx942 abi=600 wave64=true})' 2>&1 | FileCheck %s --check-prefix=OK

// Regression (issue 11, found by fuzzing pass options): the *-attach-target passes build their target
// attribute with an asserting get, so an ABI version, optimization level or empty chip its verifier
// refuses aborted mori-opt. The options are checked first and named in the error.

// ABI: error: pass 'rocdl-attach-target' option abi='99999999999' must be one of 400, 500, 600
// ABI: exit status: 1
// OPT: error: pass 'nvvm-attach-target' option O='99' must be 0, 1, 2 or 3
// OPT: exit status: 1
// CHIP: error: pass 'nvvm-attach-target' option chip='' must not be empty
// CHIP: exit status: 1
// SM: error: pass 'nvvm-attach-target' option chip='x' must be an SM name such as sm_90
// SM: exit status: 1
// OK: gpu.module @m [#rocdl.target<chip = "gfx942">]
// OK: exit status: 0
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k() kernel {
      gpu.return
    }
  }
}
