// RUN: mori-opt --split-input-file %s | mori-opt --split-input-file | FileCheck %s

// Round trip of every mori_ep op (6 building blocks, 6 EP ops): operands kept in order, config
// attributes kept (printed sorted by name), variadic sources of accumulate_rows from 1 to 8.

// Building blocks: row_copy (dest, source, bytes, pe) and reserve_slot (counter, pe) -> slot.
// CHECK-LABEL: func.func @copy_and_reserve(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32)
// CHECK: "mori_ep.row_copy"(%[[D]], %[[S]], %[[N]], %[[PE]]) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK: %[[SLOT:.*]] = "mori_ep.reserve_slot"(%[[D]], %[[PE]]) : (!llvm.ptr, i32) -> i32
// CHECK: return %[[SLOT]] : i32
func.func @copy_and_reserve(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) -> i32 {
  "mori_ep.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  %slot = "mori_ep.reserve_slot"(%d, %pe) : (!llvm.ptr, i32) -> i32
  return %slot : i32
}

// -----

// Synchronization blocks: count_signal (world_size), grid_barrier (no attribute), device_barrier
// (world_size, max_blocks).
// CHECK-LABEL: func.func @sync(
// CHECK-SAME: %[[SIG:[^:]+]]: !llvm.ptr, %[[CNT:[^:]+]]: !llvm.ptr, %[[TOT:[^:]+]]: !llvm.ptr)
// CHECK: "mori_ep.count_signal"(%[[SIG]], %[[CNT]], %[[TOT]]) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_ep.count_signal"(%[[SIG]], %[[CNT]], %[[TOT]]) {world_size = 32 : i64}
// CHECK: "mori_ep.grid_barrier"(%[[TOT]]) : (!llvm.ptr) -> ()
// CHECK: "mori_ep.device_barrier"(%[[SIG]], %[[CNT]]) {max_blocks = 1024 : i64, world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_ep.device_barrier"(%[[CNT]], %[[SIG]]) {max_blocks = 1 : i64, world_size = 1 : i64}
func.func @sync(%sig: !llvm.ptr, %cnt: !llvm.ptr, %tot: !llvm.ptr) {
  "mori_ep.count_signal"(%sig, %cnt, %tot) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  "mori_ep.count_signal"(%sig, %cnt, %tot) {world_size = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  "mori_ep.grid_barrier"(%tot) : (!llvm.ptr) -> ()
  "mori_ep.device_barrier"(%sig, %cnt) {world_size = 8 : i64, max_blocks = 1024 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  "mori_ep.device_barrier"(%cnt, %sig) {max_blocks = 1 : i64, world_size = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----

// accumulate_rows: out, elems, then a variadic list of source rows; dtype bf16 or f32.
// CHECK-LABEL: func.func @accumulate(
// CHECK-SAME: %[[OUT:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[A:[^:]+]]: !llvm.ptr, %[[B:[^:]+]]: !llvm.ptr)
// CHECK: "mori_ep.accumulate_rows"(%[[OUT]], %[[N]], %[[A]]) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
// CHECK: "mori_ep.accumulate_rows"(%[[OUT]], %[[N]], %[[A]], %[[B]]) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_ep.accumulate_rows"(%[[OUT]], %[[N]], %[[A]], %[[B]], %[[A]], %[[B]], %[[A]], %[[B]], %[[A]], %[[B]]) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
func.func @accumulate(%out: !llvm.ptr, %n: i64, %a: !llvm.ptr, %b: !llvm.ptr) {
  "mori_ep.accumulate_rows"(%out, %n, %a) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
  "mori_ep.accumulate_rows"(%out, %n, %a, %b) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
  "mori_ep.accumulate_rows"(%out, %n, %a, %b, %a, %b, %a, %b, %a, %b) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----

// EP ops at the top of a gpu.module, the whole config in attributes: dispatch for every dtype (fp8 with
// scales), combine zero-copy and push for both combine dtypes, wave 32 and 64.
// CHECK: module attributes {gpu.container_module}
// CHECK-LABEL: gpu.module @ep
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "bf16", experts_per_rank = 32 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "f32", {{.*}}, wave_size = 32 : i64, world_size = 32 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "fp8_e4m3fn", {{.*}}, scale_bytes = 224 : i64,
// CHECK-NEXT: "mori_ep.dispatch"() {dtype = "fp8_e4m3fnuz", {{.*}}, hidden = 16 : i64, {{.*}}, top_k = 1 : i64, {{.*}}, world_size = 1 : i64}
// CHECK-NEXT: "mori_ep.combine"() {dtype = "bf16", experts_per_rank = 32 : i64, hidden = 7168 : i64, max_blocks = 1024 : i64, max_recv_per_rank = 64 : i64, max_tokens_per_rank = 128 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64, zero_copy = 1 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "bf16", {{.*}}, zero_copy = 0 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "f32", {{.*}}, wave_size = 32 : i64, {{.*}}, zero_copy = 1 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine"() {dtype = "f32", {{.*}}, zero_copy = 0 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 32 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 31 : i64, experts_per_rank = 4 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 16 : i64, wave_size = 32 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 224 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 1 : i64, hidden = 16 : i64, dtype = "fp8_e4m3fnuz", top_k = 1 : i64, experts_per_rank = 1 : i64, max_tokens_per_rank = 1 : i64, max_recv_per_rank = 1 : i64, scale_bytes = 0 : i64, warps_per_block = 1 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 64 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 1 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 0 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
  }
}

// -----

// The AsyncLL send/recv halves parse and print (their lowering: Conversion/mori-ep-to-kernels-asyncll.mlir).
// CHECK-LABEL: gpu.module @halves
// The AsyncLL notification mode (early_notify, fused_recv) is part of each half: all three allowed pairs.
// CHECK-NEXT: "mori_ep.dispatch_send"() {dtype = "bf16", early_notify = 0 : i64, experts_per_rank = 32 : i64, fused_recv = 0 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.dispatch_recv"() {dtype = "fp8_e4m3fn", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 0 : i64, hidden = 7168 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, scale_bytes = 0 : i64, top_k = 8 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 8 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine_send"() {dtype = "bf16", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 1 : i64, hidden = 4096 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, top_k = 4 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 16 : i64} : () -> ()
// CHECK-NEXT: "mori_ep.combine_recv"() {dtype = "f32", early_notify = 1 : i64, experts_per_rank = 32 : i64, fused_recv = 1 : i64, hidden = 4096 : i64, max_recv_per_rank = 128 : i64, max_tokens_per_rank = 128 : i64, top_k = 4 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, world_size = 16 : i64} : () -> ()
// CHECK-NEXT: }
module attributes {gpu.container_module} {
  gpu.module @halves {
    "mori_ep.dispatch_send"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 0 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.dispatch_recv"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fn", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 0 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 4 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, early_notify = 1 : i64, fused_recv = 1 : i64} : () -> ()
  }
}

// -----

// Block ops inside a kernel, as mori-ep-to-kernels leaves them: results feed other ops.
// CHECK-LABEL: gpu.func @kernel(
// CHECK-SAME: %[[C:[^:]+]]: !llvm.ptr, %[[PE:[^:]+]]: i32) kernel
// CHECK: %[[S:.*]] = "mori_ep.reserve_slot"(%[[C]], %[[PE]]) : (!llvm.ptr, i32) -> i32
// CHECK: arith.addi %[[S]], %[[PE]] : i32
// CHECK: "mori_ep.grid_barrier"(%[[C]]) : (!llvm.ptr) -> ()
module attributes {gpu.container_module} {
  gpu.module @blocks {
    gpu.func @kernel(%c: !llvm.ptr, %pe: i32) kernel {
      %s = "mori_ep.reserve_slot"(%c, %pe) : (!llvm.ptr, i32) -> i32
      %t = arith.addi %s, %pe : i32
      "mori_ep.grid_barrier"(%c) : (!llvm.ptr) -> ()
      gpu.return
    }
  }
}
