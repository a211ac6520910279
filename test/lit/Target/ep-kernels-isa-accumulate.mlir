// REQUIRES: amdgpu-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s

// Does not hold since b952e49 ("accumulate 2 vectors (2K loads) per lane per iteration"): the gfx942
// accumulate loop of the combine kernels no longer has its K = 8 16-byte source loads in flight before
// its first wait (before b952e49 the loop started with the 8 loads, then `s_waitcnt vmcnt(0)`).
// Today (bf16, hidden 7168, top-k 8, wave64; 128/132 VGPRs):
//   ep_combine_pull_bf16: the loop head waits first (`s_waitcnt vmcnt(0) lgkmcnt(0)`), issues 7
//     flat_load_dwordx4, waits again (`s_waitcnt vmcnt(0) lgkmcnt(0)`) and only then issues the 8th load
//     of the first vector; the 8 loads of the second vector are interleaved with the bf16 math of the
//     first: at most 8 loads are in flight, never the 2K = 16 the helper asks for.
//   ep_combine_push_bf16: 6 global_load_dwordx4, then `s_waitcnt vmcnt(5)`, then the other 2 loads
//     interleaved with waits (vmcnt(5), vmcnt(4), ...).
// (sm_90 PTX does issue the 16 loads first: ep-kernels-isa.mlir.)
//
// (The pull combine's peer rows are read with global_load_dwordx4 since the AMDGPU lowering addresses
// them as global memory; they were flat loads before.)
// The property: the loop (a label that some branch targets again) starts with the K = 8 16-byte loads
// of one vector, with only address arithmetic (VALU / scalar moves and adds) between them and no
// s_waitcnt before the 8th.
// CHECK-LABEL: {{^}}ep_combine_pull_bf16:
// CHECK: {{^}}[[PULL_LOOP:\.LBB[0-9]+_[0-9]+]]:{{(([[:space:]]+(v_|s_mov|s_add|s_lshl|s_and_b|s_or_b|s_nop).*)*[[:space:]]+global_load_dwordx4 v.*){8}[[:space:]]}}
// CHECK: {{s_cbranch_execnz|s_cbranch_vccnz|s_cbranch_scc[01]|s_branch}} [[PULL_LOOP]]{{$}}
// CHECK-LABEL: {{^}}ep_combine_push_bf16:
// (Past the device barrier's poll: before it, the push kernel's row copies also start with 8 loads.)
// CHECK: s_sleep
// CHECK: {{^}}[[PUSH_LOOP:\.LBB[0-9]+_[0-9]+]]:{{(([[:space:]]+(v_|s_mov|s_add|s_lshl|s_and_b|s_or_b|s_nop).*)*[[:space:]]+global_load_dwordx4 v.*){8}[[:space:]]}}
// CHECK: {{s_cbranch_execnz|s_cbranch_vccnz|s_cbranch_scc[01]|s_branch}} [[PUSH_LOOP]]{{$}}

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
