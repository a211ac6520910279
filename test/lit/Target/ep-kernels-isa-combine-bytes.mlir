// REQUIRES: amdgpu-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s

// Does not hold: the push combine (zero_copy = 0) has byte loops although every row is a multiple of 16
// bytes (14336 here). Its row_copy lowers to mori_shmem.putmem_nbi (scope warp), i.e. the device
// library's generic __mc_copy (lib_bitcode/sources/shmem_core.ll), which checks alignment at run time
// and keeps three byte paths: a byte loop when source and destination are differently aligned, a byte
// head up to 16-byte alignment, and a byte tail. gfx942 ISA of ep_combine_push_bf16 today: a loop
// `global_load_ubyte` + `flat_store_byte` (back-edge s_cbranch_execnz), then a head
// `global_load_ubyte`/`flat_store_byte`, the 16-byte body, and a tail `global_load_ubyte`/`flat_store_byte`.
// (ep_dispatch_bf16 has the same three paths; the pull combine has none: ep-kernels-isa.mlir.)
// CHECK-LABEL: {{^}}ep_combine_push_bf16:
// CHECK-NOT: {{_ubyte|_sbyte|_ushort|_sshort|_byte |_short }}
// CHECK: .amdhsa_kernel ep_combine_push_bf16

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
