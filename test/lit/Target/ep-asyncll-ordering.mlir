// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// The AsyncLL signal protocol in machine code (early_notify + fused_recv; passes/ep_ll_kernels.py;
// count_after_quiet: ep-asyncll-ordering-quiet.mlir).
// Send: the payload stores, the grid barrier, then warp 0 of block 0 fences (release: system scope) and
// stores the tagged count into each peer's signal slot as its last memory operation.
// Receive: thread 0 of each block polls a source's signal (system-scope loads with a back-off sleep),
// fences (acquire), and the block barrier releases the block, which then reads the count; no grid barrier
// (no 64-bit arrival fetch-add) comes before the copies.

// ISA-LABEL: ep_async_dispatch_send_bf16:
// The post: count clamped to the per-source capacity (128), then the signal is the last write.
// ISA: v_min_u32_e32 v{{[0-9]+}}, 0x80, v{{[0-9]+}}
// ISA-NOT: s_barrier
// ISA-NOT: _atomic_
// ISA: flat_store_dwordx2 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}] sc0 sc1
// ISA-NOT: _store_
// ISA-NOT: _atomic_
// ISA: s_endpgm
// ISA-LABEL: ep_async_dispatch_recv_bf16:
// ISA: flat_load_dwordx2 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}] sc0 sc1
// ISA: s_sleep 1
// ISA: buffer_wbl2 sc0 sc1
// ISA: buffer_inv sc0 sc1
// ISA: s_barrier
// ISA-NOT: _atomic_add_x2
// ISA: flat_load_dwordx2 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}] sc0 sc1
// ISA-NOT: _atomic_add_x2
// ISA: {{(global|flat)}}_load_dwordx4

// PTX-LABEL: .entry ep_async_dispatch_send_bf16(
// PTX: st.relaxed.sys.b32
// PTX: bar.sync 0;
// PTX: bar.sync 0;
// PTX: fence.sc.sys;
// PTX-NOT: {{[[:space:]]st\.}}
// PTX-NOT: {{[[:space:]]atom\.}}
// PTX: {{[[:space:]]}}st.relaxed.sys.b64
// PTX-NOT: {{[[:space:]]st\.}}
// PTX-NOT: {{[[:space:]]atom\.}}
// PTX: {{[[:space:]]}}ret;
// PTX-LABEL: .entry ep_async_dispatch_recv_bf16(
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX: ld.relaxed.sys.global.b64
// PTX: nanosleep.u32
// PTX: fence.sc.sys;
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX: bar.sync 0;
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX: ld.relaxed.sys.global.b64
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX: ld{{(\.global)?}}.v4.b32
// Combine send: rows go back, the grid meets, then the epoch-tagged signal is the last write (release).
// PTX-LABEL: .entry ep_async_combine_send_bf16(
// PTX: bar.sync 0;
// PTX: bar.sync 0;
// PTX: fence.sc.sys;
// PTX-NOT: {{[[:space:]]st\.}}
// PTX-NOT: {{[[:space:]]atom\.}}
// PTX: {{[[:space:]]}}st.relaxed.sys.b64
// PTX-NOT: {{[[:space:]]st\.}}
// PTX-NOT: {{[[:space:]]atom\.}}
// PTX: {{[[:space:]]}}ret;
// Combine receive (fused): poll, acquire, block barrier, then the K row loads of the reduction; no grid
// barrier in between.
// PTX-LABEL: .entry ep_async_combine_recv_bf16(
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX: ld.relaxed.sys.global.b64
// PTX: nanosleep.u32
// PTX: fence.sc.sys;
// PTX: bar.sync 0;
// PTX-NOT: atom.relaxed.sys.add.u64
// PTX-COUNT-8: ld{{(\.global)?}}.v4.b32

module attributes {gpu.container_module} {
  gpu.module @asyncll {
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
  }
}
