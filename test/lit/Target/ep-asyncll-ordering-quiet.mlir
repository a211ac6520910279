// REQUIRES: nvptx-target
// RUN: mori-compile %s --target=sm_90 --emit=ptx -o - | FileCheck %s

// count_after_quiet (passes/ep_ll_kernels.py): the receive phase posts the counts itself: fence (release:
// the send kernel's payload stores, complete at its end) before the tagged count is stored to each peer,
// then it polls every source (system-scope loads, back-off), fences (acquire) and a grid barrier (64-bit
// arrival fetch-add) releases the copies.
// CHECK-LABEL: .entry ep_async_dispatch_recv_bf16(
// CHECK: fence.sc.sys;
// CHECK-NOT: ld.relaxed.sys
// CHECK: {{[[:space:]]}}st.relaxed.sys.b64
// CHECK: ld.relaxed.sys.global.b64
// CHECK: nanosleep.u32
// CHECK: fence.sc.sys;
// CHECK: bar.sync 0;
// CHECK: atom.relaxed.sys.add.u64
// CHECK: bar.sync 0;
// CHECK: ld{{(\.global)?}}.v4.b32

module attributes {gpu.container_module} {
  gpu.module @asyncll {
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}
