// RUN: %python -c "print('module {}')" > %t.empty.mlir
// RUN: %python -c "import os, subprocess, sys; r = subprocess.run([sys.executable, '-m', 'mori_compiler.tools.opt', r'%t.empty.mlir', '-p', os.fsdecode(b'\xff\xfe')], capture_output=True, text=True); print(r.stderr, 'exit status:', r.returncode)" | FileCheck %s --check-prefix=PIPELINE
// RUN: %python -c "import re; p = re.split(r'(?m)^// -----$', open(r'%s').read()); print(chr(10) * sum(c.count(chr(10)) for c in p[:1]) + p[1])" > %t.name.mlir
// RUN: %exit-status mori-compile %t.name.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=NAME
// RUN: %python -c "import re; p = re.split(r'(?m)^// -----$', open(r'%s').read()); print(chr(10) * sum(c.count(chr(10)) for c in p[:2]) + p[2])" > %t.bundle.mlir
// RUN: %exit-status mori-compile %t.bundle.mlir --target gfx942 --emit=bundle 2>&1 | FileCheck %s --check-prefix=BUNDLE
// RUN: %exit-status mori-compile %t.bundle.mlir --target gfx942 --emit=bundle -o %t.out 2>&1 | FileCheck %s --check-prefix=OUTPUT

// Regression (issue 11, found by helper B's command-line fuzzing): a pass pipeline that is not UTF-8 (a
// command line's raw bytes) reached nanobind (exit 2); a name holding an escaped newline split its error
// into two `error:` lines; with --emit=bundle the second and later errors were located in "-", not the
// file; -o was silently ignored by --emit=bundle.

// PIPELINE: error: option -p/--pass-pipeline '\udcff\udcfe' is not valid text (the command line holds characters that cannot be encoded)
// PIPELINE: exit status: 1

// -----
// NAME: error: {{.*}}.name.mlir:[[@LINE+3]]:3: op name '\nan' is not of the form 'dialect.operation'
// NAME-NEXT: exit status: 1
gpu.module @m {
  "\nan"() : () -> i32
}

// -----
// BUNDLE: error: {{.*}}.bundle.mlir:[[@LINE+4]]:5: 'mori_ep.dispatch' missing attribute 'scale_bytes' (anything)
// BUNDLE-NEXT: error: {{.*}}.bundle.mlir:[[@LINE+3]]:5: 'mori_ep.dispatch' unknown attribute 'scale_d64'
// BUNDLE-NEXT: exit status: 1
gpu.module @ep {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 16 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_d64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
}

// OUTPUT: error: -o does not apply to --emit=bundle (the bundle is written into the cache and its path printed)
// OUTPUT: exit status: 1
