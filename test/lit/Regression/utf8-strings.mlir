// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s
// RUN: %exit-status mori-compile %s --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: %python -c "open(r'%t.bin.mlir', 'wb').write(b'module {\n  // caf\xe9\n}\n')"
// RUN: %exit-status mori-opt %t.bin.mlir 2>&1 | FileCheck %s --check-prefix=FILE
// RUN: %exit-status mori-opt - < %t.bin.mlir 2>&1 | FileCheck %s --check-prefix=STDIN

// Regression (issue 11): a name or string that is not UTF-8 once its escapes are expanded made
// nanobind's string conversion fail (exit 2, an internal error) in the parse-time check and in passes; a
// file that is not UTF-8 was reported without a line. Both are now located errors (exit 1).

// CHECK: error: {{.*}}utf8-strings.mlir:[[@LINE+3]]:13: this quoted name is not valid UTF-8 after its escapes are expanded (byte 0xff at offset 0)
// COMPILE: error: {{.*}}utf8-strings.mlir:[[@LINE+2]]:13: this quoted name is not valid UTF-8
gpu.module @m {
  llvm.func @"\ff"()
}

// -----
// CHECK: error: {{.*}}utf8-strings.mlir:[[@LINE+2]]:188: this string is not valid UTF-8 after its escapes are expanded (byte 0xc3 at offset 0)
gpu.module @n {
  "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, dtype = "\c3\28", scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
}

// -----
// The initializer of an LLVM global holds raw bytes: accepted.
gpu.module @o {
  llvm.mlir.global internal constant @bytes("\ff\00") {addr_space = 0 : i32} : !llvm.array<2 x i8>
}

// CHECK-NOT: error:
// CHECK: exit status: 1
// COMPILE: exit status: 1

// FILE: error: {{.*}}.bin.mlir:2:9: byte 0xe9 is not valid UTF-8 (input files must be UTF-8 text)
// FILE: exit status: 1
// STDIN: error: <stdin>:2:9: byte 0xe9 is not valid UTF-8
// STDIN: exit status: 1
