// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// IntraNodeLL's data path (passes/ep_ll_kernels.py): after the block barrier that publishes the token's
// route, each data lane loads its 16-byte vectors once and stores them to every destination (8 here:
// top-8 over 8 PEs, no scales). Pinned: from the first remote store to the end of the token (the next
// barrier) no vector load is repeated: 8 destinations x 2 vectors per lane on gfx942 (7 data warps x 64
// lanes cover the 896 vectors of a 14336-byte row twice), 8 x 4 on sm_90 (7 x 32 lanes, four times).
// On gfx942 the rows are addressed as global memory (mori-ep-to-kernels global-address-space): the
// remote stores are global_store_dwordx4, with no flat 16-byte store among them.

// ISA-LABEL: ep_dispatch_ll_bf16:
// ISA: ds_write_b32
// ISA: s_barrier
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: global_store_dwordx4
// ISA-NOT: {{(global|flat)_load_dwordx4|flat_store_dwordx4}}
// ISA: s_barrier

// PTX-LABEL: .entry ep_dispatch_ll_bf16(
// PTX: .shared .align {{[0-9]+}} .b8 ep_dispatch_ll_bf16_route[136];
// PTX: bar.sync 0;
// PTX-COUNT-4: ld{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: st{{(\.global)?}}.v4.b32
// PTX-NOT: ld{{(\.global)?}}.v4.b32
// PTX: bar.sync 0;

module attributes {gpu.container_module} {
  gpu.module @ll {
    "mori_ep.dispatch_ll"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
  }
}
