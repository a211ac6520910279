// RUN: mori-opt --split-input-file %s | mori-opt --split-input-file | FileCheck %s

// Round trip of every mori_comm op: operands kept in order, attributes kept (printed sorted by name),
// variadic sources of accumulate_rows from 1 to 8.

// row_copy (dest, source, bytes, pe) and reserve_slot (counter, pe) -> slot.// CHECK-LABEL: func.func @copy_and_reserve(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32)
// CHECK: "mori_comm.row_copy"(%[[D]], %[[S]], %[[N]], %[[PE]]) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK: %[[SLOT:.*]] = "mori_comm.reserve_slot"(%[[D]], %[[PE]]) : (!llvm.ptr, i32) -> i32
// CHECK: return %[[SLOT]] : i32
func.func @copy_and_reserve(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) -> i32 {
  "mori_comm.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  %slot = "mori_comm.reserve_slot"(%d, %pe) : (!llvm.ptr, i32) -> i32
  return %slot : i32
}

// -----

// Synchronization blocks: count_signal (world_size), grid_barrier (no attribute), device_barrier and one_gpu_barrier
// (world_size, max_blocks).
// CHECK-LABEL: func.func @sync(
// CHECK-SAME: %[[SIG:[^:]+]]: !llvm.ptr, %[[CNT:[^:]+]]: !llvm.ptr, %[[TOT:[^:]+]]: !llvm.ptr)
// CHECK: "mori_comm.count_signal"(%[[SIG]], %[[CNT]], %[[TOT]]) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_comm.count_signal"(%[[SIG]], %[[CNT]], %[[TOT]]) {world_size = 32 : i64}
// CHECK: "mori_comm.grid_barrier"(%[[TOT]]) : (!llvm.ptr) -> ()
// CHECK: "mori_comm.device_barrier"(%[[SIG]], %[[CNT]]) {max_blocks = 1024 : i64, world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_comm.device_barrier"(%[[CNT]], %[[SIG]]) {max_blocks = 1 : i64, world_size = 1 : i64}
// CHECK: "mori_comm.one_gpu_barrier"(%[[SIG]], %[[CNT]]) {max_blocks = 32 : i64, world_size = 8 : i64}
func.func @sync(%sig: !llvm.ptr, %cnt: !llvm.ptr, %tot: !llvm.ptr) {
  "mori_comm.count_signal"(%sig, %cnt, %tot) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.count_signal"(%sig, %cnt, %tot) {world_size = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.grid_barrier"(%tot) : (!llvm.ptr) -> ()
  "mori_comm.device_barrier"(%sig, %cnt) {world_size = 8 : i64, max_blocks = 1024 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.device_barrier"(%cnt, %sig) {max_blocks = 1 : i64, world_size = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.one_gpu_barrier"(%sig, %cnt) {world_size = 8 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----

// accumulate_rows: out, elems, then a variadic list of source rows; dtype bf16 or f32.
// CHECK-LABEL: func.func @accumulate(
// CHECK-SAME: %[[OUT:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[A:[^:]+]]: !llvm.ptr, %[[B:[^:]+]]: !llvm.ptr)
// CHECK: "mori_comm.accumulate_rows"(%[[OUT]], %[[N]], %[[A]]) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
// CHECK: "mori_comm.accumulate_rows"(%[[OUT]], %[[N]], %[[A]], %[[B]]) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_comm.accumulate_rows"(%[[OUT]], %[[N]], %[[A]], %[[B]], %[[A]], %[[B]], %[[A]], %[[B]], %[[A]], %[[B]]) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
func.func @accumulate(%out: !llvm.ptr, %n: i64, %a: !llvm.ptr, %b: !llvm.ptr) {
  "mori_comm.accumulate_rows"(%out, %n, %a) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
  "mori_comm.accumulate_rows"(%out, %n, %a, %b) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.accumulate_rows"(%out, %n, %a, %b, %a, %b, %a, %b, %a, %b) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----

// row_copy_to_peers: lane k names destination k (dest, pe, send); max_peers from 1 to 32.
// CHECK-LABEL: func.func @to_peers(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[ON:[^:]+]]: i1)
// CHECK: "mori_comm.row_copy_to_peers"(%[[D]], %[[S]], %[[N]], %[[PE]], %[[ON]]) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
// CHECK: "mori_comm.row_copy_to_peers"(%[[S]], %[[D]], %[[N]], %[[PE]], %[[ON]]) {max_peers = 1 : i64}
// CHECK: "mori_comm.row_copy_to_peers"(%[[D]], %[[S]], %[[N]], %[[PE]], %[[ON]]) {max_peers = 32 : i64}
func.func @to_peers(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32, %on: i1) {
  "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %on) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  "mori_comm.row_copy_to_peers"(%s, %d, %n, %pe, %on) {max_peers = 1 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %on) {max_peers = 32 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  return
}

// -----

// Block ops inside a kernel, as mori-ep-to-kernels leaves them (the input of mori-comm-to-calls): results feed other ops.
// CHECK-LABEL: gpu.func @kernel(
// CHECK-SAME: %[[C:[^:]+]]: !llvm.ptr, %[[PE:[^:]+]]: i32) kernel
// CHECK: %[[S:.*]] = "mori_comm.reserve_slot"(%[[C]], %[[PE]]) : (!llvm.ptr, i32) -> i32
// CHECK: arith.addi %[[S]], %[[PE]] : i32
// CHECK: "mori_comm.grid_barrier"(%[[C]]) : (!llvm.ptr) -> ()
module attributes {gpu.container_module} {
  gpu.module @blocks {
    gpu.func @kernel(%c: !llvm.ptr, %pe: i32) kernel {
      %s = "mori_comm.reserve_slot"(%c, %pe) : (!llvm.ptr, i32) -> i32
      %t = arith.addi %s, %pe : i32
      "mori_comm.grid_barrier"(%c) : (!llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// The inter-node blocks: node_pe (group_size) -> i32; node_count_signal (world_size, group_size) and
// node_device_barrier (world_size, group_size, max_blocks), whose operands are count_signal's and
// device_barrier's; chunk_send (8 operands, the queue pair last) -> bytes; chunk_wait -> count.
// CHECK-LABEL: func.func @internode(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[M:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32)
// CHECK: %[[NPE:.*]] = "mori_comm.node_pe"(%[[PE]]) {group_size = 8 : i64} : (i32) -> i32
// CHECK: "mori_comm.node_pe"(%[[NPE]]) {group_size = 1 : i64} : (i32) -> i32
// CHECK: "mori_comm.node_count_signal"(%[[D]], %[[S]], %[[D]]) {group_size = 8 : i64, world_size = 16 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: "mori_comm.node_device_barrier"(%[[D]], %[[S]]) {group_size = 4 : i64, max_blocks = 80 : i64, world_size = 32 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK: %[[SENT:.*]] = "mori_comm.chunk_send"(%[[D]], %[[S]], %[[N]], %[[M]], %[[D]], %[[N]], %[[NPE]], %[[QP]]) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
// CHECK: %[[GOT:.*]] = "mori_comm.chunk_wait"(%[[S]], %[[SENT]]) : (!llvm.ptr, i64) -> i32
// CHECK: return %[[GOT]] : i32
func.func @internode(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %m: i64, %pe: i32, %qp: i32) -> i32 {
  %npe = "mori_comm.node_pe"(%pe) {group_size = 8 : i64} : (i32) -> i32
  %one = "mori_comm.node_pe"(%npe) {group_size = 1 : i64} : (i32) -> i32
  "mori_comm.node_count_signal"(%d, %s, %d) {world_size = 16 : i64, group_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  "mori_comm.node_device_barrier"(%d, %s) {world_size = 32 : i64, group_size = 4 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  %sent = "mori_comm.chunk_send"(%d, %s, %n, %m, %d, %n, %npe, %qp) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
  %got = "mori_comm.chunk_wait"(%s, %sent) : (!llvm.ptr, i64) -> i32
  return %got : i32
}

// -----

// Wire quantization: quantize_row (dest, source, elems, pe) and accumulate_quantized_rows (out, first,
// count, elems, sources...), with their format and scale_blocks.
// CHECK-LABEL: func.func @wire(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32)
// CHECK: "mori_comm.quantize_row"(%[[D]], %[[S]], %[[N]], %[[PE]]) {format = "fp8_e4m3fn", scale_blocks = 0 : i64}
// CHECK: "mori_comm.quantize_row"(%[[S]], %[[D]], %[[N]], %[[PE]]) {format = "fp4_e2m1", scale_blocks = 56 : i64}
// CHECK: "mori_comm.accumulate_quantized_rows"(%[[D]], %[[N]], %[[N]], %[[N]], %[[S]], %[[D]]) {format = "fp8_e4m3fnuz", scale_blocks = 7 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()
func.func @wire(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) {
  "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "fp8_e4m3fn", scale_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  "mori_comm.quantize_row"(%s, %d, %n, %pe) {format = "fp4_e2m1", scale_blocks = 56 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  "mori_comm.accumulate_quantized_rows"(%d, %n, %n, %n, %s, %d) {format = "fp8_e4m3fnuz", scale_blocks = 7 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()
  return
}
