// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file | FileCheck %s
// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64},mori-comm-to-calls{wave-size=64}' --split-input-file | FileCheck %s --check-prefix=CALLS

// mori-ep-to-kernels replaces every mori_ep.dispatch / mori_ep.combine at the top of a gpu.module by
// IntraNode gpu.func kernels written with the generic comm building blocks. The wave-size check is in
// mori-ep-to-kernels-wave.mlir; the IntraNodeLL and AsyncLL kernels in mori-ep-to-kernels-ll.mlir and
// mori-ep-to-kernels-asyncll.mlir.

// The default IntraNode bundle for bf16 (world 8, hidden 7168 = 14336-byte rows, top-k 8, 32 experts
// per rank, wave64): dispatch, zero-copy combine (pull) and external-buffer combine (push), in op order,
// with their parameter lists as ep_schema.KERNELS names them (20, 12 and 15 parameters, each named by its
// mori.name attribute; the token count n and the call's hidden are the i32s) and the block size (8 warps of 64 lanes).
// CHECK-LABEL: gpu.module @bundle
// CHECK-NOT: "mori_ep.dispatch"
// CHECK-NOT: "mori_ep.combine"
// CHECK-LABEL: gpu.func @ep_dispatch_bf16(
// CHECK-SAME: {{^}}%arg0: !llvm.ptr {mori.name = "x"}, %arg1: !llvm.ptr {mori.name = "w"}, %arg2: !llvm.ptr {mori.name = "s"}, %arg3: !llvm.ptr {mori.name = "idx"}, %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: !llvm.ptr {mori.name = "out_x"}, %arg7: !llvm.ptr {mori.name = "out_w"}, %arg8: !llvm.ptr {mori.name = "out_s"}, %arg9: !llvm.ptr {mori.name = "out_idx"}, %arg10: !llvm.ptr {mori.name = "src_pos"}, %arg11: !llvm.ptr {mori.name = "slot_ctrs"}, %arg12: !llvm.ptr {mori.name = "signals"}, %arg13: !llvm.ptr {mori.name = "grid_ctr"}, %arg14: !llvm.ptr {mori.name = "round_ctr"}, %arg15: !llvm.ptr {mori.name = "fwd"}, %arg16: !llvm.ptr {mori.name = "dest_ctr"}, %arg17: !llvm.ptr {mori.name = "total"}, %arg18: !llvm.ptr {mori.name = "status"}, %arg19: !llvm.ptr {mori.name = "routing"}) kernel attributes {known_block_size = array<i32: 512, 1, 1>} {
// Round parity selects the slot counter (slot_ctrs = %arg11); valid representatives reserve a slot on
// their destination PE, the warp copies the row to all its destinations at once (14336 bytes; lane k
// names destination k: its row address, its PE and whether it sends), then the grid and the PEs meet.
// CHECK: %[[ROW:.*]] = arith.constant 14336 : i64
// CHECK: %{{.*}} = llvm.load %arg14 : !llvm.ptr -> i64
// CHECK: %[[CTR:.*]] = llvm.getelementptr %arg11[%{{.*}}] : (!llvm.ptr, i32) -> !llvm.ptr, i32
// A routing handle (routing = %arg19, not null) replays recorded slots. Expert ids neither -1 nor valid
// add 1 to status word 1 (invalid_ids; status = %arg18), a relaxed local atomic the host reads later.
// CHECK: %[[REPLAY:.*]] = llvm.icmp "ne" %arg19, %{{.*}} : !llvm.ptr
// With fewer tokens than warps, warps share a token: shares = min(max(warps / max(n, 1), 1), 8) (8 =
// min(K, W)); the work items are n * shares, item i is (token i / shares, share i % shares).
// CHECK: %[[NMAX:.*]] = arith.maxui %arg4, %{{.*}} : i32
// CHECK-NEXT: %[[PER:.*]] = arith.divui %{{.*}}, %[[NMAX]] : i32
// CHECK-NEXT: %[[MOST:.*]] = arith.constant 8 : i32
// CHECK-NEXT: %[[PER1:.*]] = arith.maxui %[[PER]], %{{.*}} : i32
// CHECK-NEXT: %[[SH:.*]] = arith.minui %[[PER1]], %[[MOST]] : i32
// CHECK-NEXT: %[[SHX:.*]] = arith.index_cast %[[SH]] : i32 to index
// CHECK-NEXT: %[[ITEMS:.*]] = arith.muli %{{.*}}, %[[SHX]] : index
// CHECK-NEXT: scf.for %[[ITX:.*]] = %{{.*}} to %[[ITEMS]] step %{{.*}} {
// CHECK-NEXT: %[[IT:.*]] = arith.index_cast %[[ITX]] : index to i32
// CHECK-NEXT: arith.divui %[[IT]], %[[SH]] : i32
// CHECK: %[[SHARE:.*]] = arith.remui %[[IT]], %[[SH]] : i32
// CHECK: %[[BAD:.*]] = llvm.getelementptr %arg18[%c1_i32{{.*}}] : (!llvm.ptr, i32) -> !llvm.ptr, i32
// CHECK-NEXT: llvm.atomicrmw add %[[BAD]], %{{.*}} monotonic : !llvm.ptr, i32
// A warp reserves (and sends, counts, forwards) only its share: the representatives whose rank among the
// token's representatives (shuffled in) is its share modulo shares.
// CHECK: %[[RANK:.*]]:2 = scf.for
// CHECK: gpu.shuffle  idx
// CHECK: %[[RMOD:.*]] = arith.remui %[[RANK]]#0, %[[SH]] : i32
// CHECK-NEXT: %[[MINE:.*]] = arith.cmpi eq, %[[RMOD]], %[[SHARE]] : i32
// CHECK: %[[REP:.*]] = arith.andi %{{.*}}, %[[MINE]] : i1
// CHECK-NEXT: scf.if %[[REP]] -> (i32) {
// The slot: the handle's recorded code of (t, k) decoded (code % R, R = 32768; R when it names another
// PE or is null: dropped), with no atomic; else the reservation.
// CHECK: scf.if %[[REPLAY]] -> (i32) {
// CHECK: llvm.getelementptr %arg19[%{{.*}}] : (!llvm.ptr, i32) -> !llvm.ptr, i32
// CHECK: arith.remui %{{.*}}, %c32768_i32 : i32
// CHECK-NOT: "mori_comm.reserve_slot"
// CHECK: } else {
// CHECK: %{{.*}} = "mori_comm.reserve_slot"(%[[CTR]], %{{.*}}) : (!llvm.ptr, i32) -> i32
// CHECK: %[[DST:.*]] = llvm.getelementptr %arg6[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%[[DST]], %{{.*}}, %[[ROW]], %{{.*}}, %{{.*}}) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
// CHECK-NOT: "mori_comm.row_copy
// Completion: every block arrives; warp 0 of the last one runs the count handshake (no grid barrier).
// CHECK-NOT: "mori_comm.grid_barrier"
// CHECK: %[[LAST:.*]] = "mori_comm.grid_last_arrival"(%arg13) : (!llvm.ptr) -> i1
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK: "mori_comm.count_signal"(%arg12, %arg16, %arg17) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: llvm.store %{{.*}}, %arg14 : i64, !llvm.ptr
// CHECK: gpu.return
// Pull: (the weights' grid barrier,) the PEs meet (device barrier), then each token sums its K = 8 rows read from the peers'
// registered buffers (mori_shmem.ptr addresses) with one accumulate_rows per (token, row slice).
// CHECK-LABEL: gpu.func @ep_combine_pull_bf16(
// CHECK-SAME: {{^}}%arg0: !llvm.ptr {mori.name = "inp_w"}, %arg1: !llvm.ptr {mori.name = "reg_x"}, %arg2: !llvm.ptr {mori.name = "reg_w"}, %arg3: !llvm.ptr {mori.name = "fwd"}, %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: !llvm.ptr {mori.name = "total"}, %arg7: !llvm.ptr {mori.name = "out"}, %arg8: !llvm.ptr {mori.name = "out_w"}, %arg9: !llvm.ptr {mori.name = "zero_row"}, %arg10: !llvm.ptr {mori.name = "bar_slots"}, %arg11: !llvm.ptr {mori.name = "bar_epochs"}, %arg12: !llvm.ptr {mori.name = "grid_ctr"}) kernel attributes {known_block_size = array<i32: 512, 1, 1>} {
// The weights, when given, are copied next to the rows by all blocks; then the grid meets (a peer's block
// b reads weight rows any of our blocks wrote, and the device barrier pairs only block b with block b).
// CHECK: scf.if
// CHECK: "mori_comm.grid_barrier"(%arg12) : (!llvm.ptr) -> ()
// CHECK-NEXT: }
// CHECK-NEXT: "mori_comm.trace"() {event = "device_barrier", phase = "begin"} : () -> ()
// CHECK-NEXT: "mori_comm.device_barrier"(%arg10, %arg11) {max_blocks = 1024 : i64, world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_shmem.ptr"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK: "mori_comm.accumulate_rows"({{(%[0-9]+, ){9}%[0-9]+}}) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NOT: "mori_ep.
// CHECK: gpu.return
// Push: each received row is copied to its owner's staging row, then the grid and the PEs meet, then
// the K = 8 staged rows are summed locally (no peer address in the reduction).
// CHECK-LABEL: gpu.func @ep_combine_push_bf16(
// CHECK-SAME: {{^}}%arg0: !llvm.ptr {mori.name = "inp"}, %arg1: !llvm.ptr {mori.name = "inp_w"}, %arg2: !llvm.ptr {mori.name = "stage_x"}, %arg3: !llvm.ptr {mori.name = "stage_w"}, %arg4: !llvm.ptr {mori.name = "src_pos"}, %arg5: !llvm.ptr {mori.name = "fwd"}, %arg6: i32 {mori.name = "n"}, %arg7: i32 {mori.name = "hidden"}, %arg8: !llvm.ptr {mori.name = "total"}, %arg9: !llvm.ptr {mori.name = "out"}, %arg10: !llvm.ptr {mori.name = "out_w"}, %arg11: !llvm.ptr {mori.name = "zero_row"}, %arg12: !llvm.ptr {mori.name = "grid_ctr"}, %arg13: !llvm.ptr {mori.name = "bar_slots"}, %arg14: !llvm.ptr {mori.name = "bar_epochs"}) kernel attributes {known_block_size = array<i32: 512, 1, 1>} {
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK: "mori_comm.grid_barrier"(%arg12) : (!llvm.ptr) -> ()
// CHECK-NEXT: "mori_comm.trace"() {event = "device_barrier", phase = "begin"} : () -> ()
// CHECK-NEXT: "mori_comm.device_barrier"(%arg13, %arg14) {max_blocks = 1024 : i64, world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NOT: "mori_shmem.ptr"
// CHECK: "mori_comm.accumulate_rows"({{(%[0-9]+, ){9}%[0-9]+}}) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NOT: "mori_ep.
// CHECK: gpu.return
// CHECK-NEXT: }
// CHECK-NEXT: }
// With the blocks lowered too, the kernels call the helpers and no mori_ep op is left.
// CALLS-LABEL: gpu.module @bundle
// CALLS-NOT: "mori_ep.
// CALLS: func.func @__mori_comm_accumulate_rows_bf16_k8(
// CALLS-NOT: "mori_ep.
// CALLS: gpu.func @ep_dispatch_bf16(
// CALLS-NOT: "mori_ep.
// CALLS: func.call @__mori_comm_count_signal_w8(
// CALLS-NOT: "mori_ep.
// CALLS: gpu.func @ep_combine_push_bf16(
// CALLS-NOT: "mori_ep.
// CALLS: func.call @__mori_comm_accumulate_rows_bf16_k8(
// CALLS-NOT: "mori_ep.
// CALLS: // -----
module attributes {gpu.container_module} {
  gpu.module @bundle {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

// -----

// fp8 dispatch with scales: the token row (7168 bytes) goes to all destinations at once, the scales
// (scale_bytes = 56 per token) by a row_copy per destination; other ops of the gpu.module stay where they are.
// CHECK-LABEL: gpu.module @fp8
// CHECK-NEXT: gpu.func @before() kernel
// CHECK: gpu.func @ep_dispatch_fp8_e4m3fn(
// CHECK: %[[ROW:.*]] = arith.constant 7168 : i64
// CHECK: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %[[ROW]], %{{.*}}, %{{.*}}) {max_peers = 8 : i64}
// CHECK: %[[SB:.*]] = arith.constant 56 : i64
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %[[SB]], %{{.*}})
// CHECK: "mori_comm.grid_last_arrival"
// CHECK: gpu.func @after() kernel
module attributes {gpu.container_module} {
  gpu.module @fp8 {
    gpu.func @before() kernel {
      gpu.return
    }
    "mori_ep.dispatch"() {world_size = 4 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, scale_bytes = 56 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    gpu.func @after() kernel {
      gpu.return
    }
  }
}
