// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file | FileCheck %s

// The AsyncLL halves lower to one kernel each (parameters: ep_schema.KERNELS, names as mori.name); the
// notification mode (early_notify, fused_recv) decides who posts the ready signals and how the receive
// waits (protocol: passes/ep_ll_kernels.py). Signals are posted as "fence (release), then a relaxed
// system-scope uint64 store" and awaited as "wait_until, then fence (acquire)". Chunks: count_after_quiet
// (0, 0), early_notify (1, 0), early_notify + fused_recv (1, 1).

// count_after_quiet: the send phase only moves data (a local fetch-add reserves each slot); the receive
// phase posts the counts, then block 0 waits for every source and a grid barrier releases the grid.
// CHECK-LABEL: gpu.func @ep_async_dispatch_send_bf16(
// CHECK: llvm.atomicrmw add %{{.*}}, %{{.*}} monotonic : !llvm.ptr, i32
// CHECK: "mori_comm.row_copy"
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK-NOT: c_type = "uint64"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_dispatch_recv_bf16(
// CHECK-SAME: %arg7: !llvm.ptr {mori.name = "sig"}, %arg8: !llvm.ptr {mori.name = "rounds"}, %arg9: !llvm.ptr {mori.name = "grid_ctr"}
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: "mori_shmem.p"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {c_type = "uint64"}
// CHECK: "mori_shmem.wait_until"(%{{.*}}, %{{.*}}) {cmp = "greater_than", elem = "uint64"}
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.grid_barrier"(%arg9)
// CHECK: scf.for
// CHECK: "mori_comm.row_copy"
// The last block to finish advances the round (fence, arrival fetch-add, then the store).
// CHECK: "mori_shmem.atomic_fetch_add"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_combine_send_bf16(
// CHECK: "mori_comm.row_copy"
// CHECK-NOT: c_type = "uint64"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_combine_recv_bf16(
// CHECK-SAME: %arg5: !llvm.ptr {mori.name = "csig"}, %arg6: !llvm.ptr {mori.name = "rounds"}, %arg7: !llvm.ptr {mori.name = "grid_ctr"}
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: "mori_shmem.p"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {c_type = "uint64"}
// CHECK: "mori_shmem.wait_until"
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.grid_barrier"(%arg7)
// CHECK: "mori_comm.accumulate_rows"
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @asyncll {
    "mori_ep.dispatch_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----

// early_notify: the send phase ends with a grid barrier and the posts; the receive phase only waits.
// CHECK-LABEL: gpu.func @ep_async_dispatch_send_bf16(
// CHECK-SAME: %arg16: !llvm.ptr {mori.name = "grid_ctr"})
// CHECK: "mori_comm.row_copy"
// CHECK: "mori_comm.grid_barrier"(%arg16)
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: "mori_shmem.p"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {c_type = "uint64"}
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_dispatch_recv_bf16(
// CHECK-NOT: c_type = "uint64"
// CHECK: "mori_shmem.wait_until"
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.grid_barrier"(%arg9)
// CHECK: "mori_comm.row_copy"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_combine_send_bf16(
// CHECK-SAME: %arg7: !llvm.ptr {mori.name = "csig"}, %arg8: !llvm.ptr {mori.name = "rounds"}, %arg9: !llvm.ptr {mori.name = "grid_ctr"})
// CHECK: "mori_comm.row_copy"
// CHECK: "mori_comm.grid_barrier"(%arg9)
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: "mori_shmem.p"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {c_type = "uint64"}
// CHECK-LABEL: gpu.func @ep_async_combine_recv_bf16(
// CHECK-NOT: "mori_shmem.p"
// CHECK: "mori_shmem.wait_until"
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.grid_barrier"(%arg7)
// CHECK: "mori_comm.accumulate_rows"
module attributes {gpu.container_module} {
  gpu.module @asyncll {
    "mori_ep.dispatch_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
  }
}

// -----

// early_notify + fused_recv: no grid barrier in the receive phases. Dispatch: per source, thread 0 of
// every block waits, fences, and a block barrier releases that source's copies. Combine: warp 0 of every
// block waits for all sources, fences, and a block barrier releases the reduction.
// CHECK-LABEL: gpu.func @ep_async_dispatch_recv_bf16(
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK: scf.for
// CHECK: "mori_shmem.wait_until"
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: gpu.barrier
// CHECK: "mori_comm.row_copy"
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_async_combine_recv_bf16(
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK: "mori_shmem.wait_until"
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: gpu.barrier
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK: "mori_comm.accumulate_rows"
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @asyncll {
    "mori_ep.dispatch_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 0 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
  }
}
