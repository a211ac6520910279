// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64},mori-comm-to-calls{wave-size=64}' | FileCheck %s --check-prefix=CALLS
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA

// any_hidden = 1 builds the variant of a kernel for any hidden up to the attribute's: the kernel is named
// ..._anyhidden and its rows are the call's `hidden` argument (i32 elements) times the element size, with
// the low four bits masked off (the host launches whole 16-byte vectors only; the mask states it, so the
// 16-byte row copies still apply). The config-hidden kernel keeps constant rows.
// CHECK-LABEL: gpu.func @ep_dispatch_bf16(
// CHECK-NOT: arith.andi %{{.*}}, %c-16_i64
// CHECK: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64,
// CHECK-LABEL: gpu.func @ep_dispatch_bf16_anyhidden(
// CHECK-SAME: %arg5: i32 {mori.name = "hidden"}
// CHECK: %[[H:.*]] = arith.extui %arg5 : i32 to i64
// CHECK: %[[WIDE:.*]] = arith.muli %[[H]], %c2_i64 : i64
// CHECK: %[[ROW:.*]] = arith.andi %[[WIDE]], %c-16_i64 : i64
// CHECK: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %[[ROW]],
// The combine's rows: the call's too (the vectors of a row: row >> 4).
// CHECK-LABEL: gpu.func @ep_combine_pull_bf16_anyhidden(
// CHECK-SAME: %arg5: i32 {mori.name = "hidden"}
// CHECK: %[[CROW:.*]] = arith.andi %{{.*}}, %c-16_i64 : i64
// CHECK: arith.shrui %[[CROW]], %c4_i64 : i64
// CALLS-LABEL: gpu.func @ep_dispatch_bf16_anyhidden(
// CALLS: func.call @__mori_comm_row_copy_to_peers_k8(
// ISA: .globl ep_dispatch_bf16
// ISA: .globl ep_dispatch_bf16_anyhidden
// ISA: .globl ep_combine_pull_bf16_anyhidden
module attributes {gpu.container_module} {
  gpu.module @bundle {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", any_hidden = 1 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", any_hidden = 1 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
