// REQUIRES: nvptx-target
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-kernel-number.json 2>&1 | FileCheck %s --check-prefix=NUMBER
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-kernel-object.json 2>&1 | FileCheck %s --check-prefix=OBJECT
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-kernel-true.json 2>&1 | FileCheck %s --check-prefix=TRUE
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-kernel-list.json 2>&1 | FileCheck %s --check-prefix=LIST
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-kernel-empty.json 2>&1 | FileCheck %s --check-prefix=EMPTY
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-ep-float.json 2>&1 | FileCheck %s --check-prefix=FLOAT
// RUN: %python -c "import json; print(json.dumps([{'kernel': 'ring_put_signal', 'target': 'sm_90'}, {'kernel': r'%S/Inputs/no-kernel.mlir', 'target': 'sm_90'}]))" > %t.glued.json
// RUN: %exit-status mori-compile --precompile %t.glued.json 2>&1 | FileCheck %s --check-prefix=GLUED
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-asyncll.json 2>&1 | FileCheck %s --check-prefix=ASYNCLL

// Regression (issue 11): `--precompile` entries. `"kernel": 5` and `{}` were internal errors (exit 2),
// `true` read file descriptor 1, `[]` and `""` silently compiled the default example, an AsyncLL "ep"
// entry was an internal error (the CLI re-implemented ep_bundle), a float config field failed inside
// generated MLIR, and an error after a built entry was glued to the progress bar. Every field is now
// type-checked, errors name the entry, "ep" entries go through ops.ep_bundle, and the bar's line is
// ended before an error is printed.

// NUMBER: {{^}}error: config 1: "kernel" must be a string, got 5
// NUMBER: exit status: 1
// OBJECT: {{^}}error: config 1: "kernel" must be a string, got {}
// OBJECT: exit status: 1
// TRUE: {{^}}error: config 1: "kernel" must be a string, got true
// TRUE: exit status: 1
// LIST: {{^}}error: config 1: "kernel" must be a string, got []
// LIST: exit status: 1
// EMPTY: {{^}}error: config 1: "kernel" must name an example or an .mlir file, got ""
// EMPTY: exit status: 1
// FLOAT: {{^}}error: config 1: config.hidden_dim 1024.0 must be an int, not float
// FLOAT: exit status: 1
// GLUED: 1/2 <example ring_put_signal> sm_90
// GLUED: {{^}}error: {{.*}}no-kernel.mlir:1:1: config 2: gpu.module @m has no kernel
// GLUED: exit status: 1
// ASYNCLL: 1/1 EP AsyncLL kernels sm_90
// ASYNCLL: exit status: 0

// Options on the command line next to --precompile would be ignored: refused.
// RUN: %exit-status mori-compile --precompile %S/Inputs/precompile-asyncll.json --target gfx942 -O 1 2>&1 | FileCheck %s --check-prefix=IGNORED
// IGNORED: error: --precompile takes every option from its JSON entries; --target, -O would be ignored (give it in the entries)
// IGNORED: exit status: 1
