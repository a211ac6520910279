// Compiler bug (dialects/mori_ep.py, extra_verify): an integer config attribute given as a string is
// accepted. The "must be an integer" check skips every attribute found among the *string* attributes
// (`if field in ints or field in strs: continue`), and the range/relation rules only look at integer
// attributes, so `world_size = "8"` or `wave_size = "64"` verify (and round-trip). mori-ep-to-kernels
// then dies with an internal compiler error (exit status 2: "TypeError: EpKernelConfig.__init__() missing
// 1 required positional argument: 'wave_size'"); the building-block lowering pasted the string into the
// helper text (a string attribute of a mori_comm op: Dialect/mori_comm/invalid.mlir). Expected: the
// same located error as for a float attribute, exit status 1.
// RUN: not mori-opt --split-input-file %s 2>&1 | FileCheck %s
// RUN: %exit-status mori-opt --split-input-file %s 2>&1 | FileCheck %s --check-prefix=EXIT
// EXIT: exit status: 1

// A string wave_size on dispatch.
module attributes {gpu.container_module} {
  gpu.module @ep {
    // CHECK: error: {{.*}}invalid-string-config.mlir:[[# @LINE + 1]]:5: 'mori_ep.dispatch' attribute 'wave_size' must be an integer, got "64"
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = "64"} : () -> ()
  }
}
