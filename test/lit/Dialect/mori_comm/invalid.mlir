// RUN: not mori-opt --split-input-file %s 2>&1 | FileCheck %s --implicit-check-not=error:
// RUN: %exit-status mori-opt --split-input-file %s 2>&1 | FileCheck %s --check-prefix=EXIT

// Every chunk is rejected with `error: <file>:<line>:<col>: '<op>' <field> ...` naming the op, the field
// and what is allowed (the IRDL constraints of mori_comm.irdl.mlir, then the ranges of
// dialects/mori_comm.py); exit status 1.
// EXIT: exit status: 1
// EXIT-NOT: internal compiler error
// CHECK-NOT: Traceback
// CHECK-NOT: internal compiler error

// row_copy: `bytes` is i64.
func.func @row_copy_bytes(%d: !llvm.ptr, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy' operand 'bytes' must be i64, got i32
  "mori_comm.row_copy"(%d, %d, %pe, %pe) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()
  return
}

// -----
// row_copy_to_peers: `max_peers` is 1..32 (one lane per destination).
func.func @row_copy_to_peers_max(%d: !llvm.ptr, %n: i64, %pe: i32, %on: i1) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy_to_peers' attribute 'max_peers' must be in [1, 32] (one lane per destination), got 0
  "mori_comm.row_copy_to_peers"(%d, %d, %n, %pe, %on) {max_peers = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  return
}

// -----
// row_copy_to_peers: `send` is i1.
func.func @row_copy_to_peers_send(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy_to_peers' operand 'send' must be i1, got i32
  "mori_comm.row_copy_to_peers"(%d, %d, %n, %pe, %pe) {max_peers = 8 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  return
}

// -----
// row_copy: `dest` is a pointer.
func.func @row_copy_dest(%n: i64, %d: !llvm.ptr, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy' operand 'dest' must be !llvm.ptr, got i64
  "mori_comm.row_copy"(%n, %d, %n, %pe) : (i64, !llvm.ptr, i64, i32) -> ()
  return
}

// -----
// row_copy: too few operands; the message lists the operand names.
func.func @row_copy_count(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy' expected 4 operands (dest, source, bytes, pe), got 3
  "mori_comm.row_copy"(%d, %d, %n) : (!llvm.ptr, !llvm.ptr, i64) -> ()
  return
}

// -----
// reserve_slot: the slot is i32 (the counter is 32-bit).
func.func @reserve_slot_result(%d: !llvm.ptr, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.reserve_slot' result 'slot' must be i32, got i64
  %s = "mori_comm.reserve_slot"(%d, %pe) : (!llvm.ptr, i32) -> i64
  return
}

// -----
// reserve_slot: `pe` is i32.
func.func @reserve_slot_pe(%d: !llvm.ptr, %pe: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.reserve_slot' operand 'pe' must be i32, got i64
  %s = "mori_comm.reserve_slot"(%d, %pe) : (!llvm.ptr, i64) -> i32
  return
}

// -----
// count_signal: world_size is required.
func.func @count_signal_missing(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.count_signal' missing attribute 'world_size'
  "mori_comm.count_signal"(%d, %d, %d) : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// count_signal: one lane per peer, so at most 32 PEs.
func.func @count_signal_world(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.count_signal' attribute 'world_size' must be in [1, 32], got 33
  "mori_comm.count_signal"(%d, %d, %d) {world_size = 33 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// count_signal: world_size must be an integer (a float is not).
func.func @count_signal_float(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.count_signal' attribute 'world_size' must be an integer, got 1.500000e+00 : f32
  "mori_comm.count_signal"(%d, %d, %d) {world_size = 1.5 : f32} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// grid_barrier takes no attribute.
func.func @grid_barrier_unknown(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.grid_barrier' unknown attribute 'scope' (allowed: none)
  "mori_comm.grid_barrier"(%d) {scope = "grid"} : (!llvm.ptr) -> ()
  return
}

// -----
// grid_barrier: one counter operand.
func.func @grid_barrier_count(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.grid_barrier' expected 1 operands (counter), got 2
  "mori_comm.grid_barrier"(%d, %d) : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// device_barrier: both attributes are required; an unknown one is named with the allowed ones.
func.func @device_barrier_attrs(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:3: 'mori_comm.device_barrier' missing attribute 'max_blocks'
  // CHECK-NEXT: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.device_barrier' unknown attribute 'blocks' (allowed: 'world_size', 'max_blocks')
  "mori_comm.device_barrier"(%d, %d) {world_size = 8 : i64, blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// device_barrier: world_size 0 is out of range.
func.func @device_barrier_world(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.device_barrier' attribute 'world_size' must be in [1, 32], got 0
  "mori_comm.device_barrier"(%d, %d) {world_size = 0 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// accumulate_rows: dtype is bf16 or f32 (the allowed values are listed).
func.func @accumulate_dtype(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.accumulate_rows' attribute 'dtype' must be one of "bf16", "f32", got "f16"
  "mori_comm.accumulate_rows"(%d, %n, %d) {dtype = "f16"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
  return
}

// -----
// accumulate_rows: dtype is required.
func.func @accumulate_no_dtype(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.accumulate_rows' missing attribute 'dtype' (one of "bf16", "f32")
  "mori_comm.accumulate_rows"(%d, %n, %d) : (!llvm.ptr, i64, !llvm.ptr) -> ()
  return
}

// -----
// accumulate_rows: at least one source row.
func.func @accumulate_no_source(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.accumulate_rows' needs at least one source row
  "mori_comm.accumulate_rows"(%d, %n) {dtype = "bf16"} : (!llvm.ptr, i64) -> ()
  return
}

// -----
// accumulate_rows: every source is a pointer (the variadic operand is checked value by value).
func.func @accumulate_source_type(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.accumulate_rows' operand 'sources' must be !llvm.ptr, got i64
  "mori_comm.accumulate_rows"(%d, %n, %d, %n) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr, i64) -> ()
  return
}

// -----

// row_copy_to_peers: 33 destinations do not fit a wave32 (one lane each).
func.func @row_copy_to_peers_too_many(%d: !llvm.ptr, %n: i64, %pe: i32, %on: i1) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy_to_peers' attribute 'max_peers' must be in [1, 32] (one lane per destination), got 33
  "mori_comm.row_copy_to_peers"(%d, %d, %n, %pe, %on) {max_peers = 33 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  return
}

// -----
// row_copy_to_peers: max_peers is required.
func.func @row_copy_to_peers_missing(%d: !llvm.ptr, %n: i64, %pe: i32, %on: i1) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.row_copy_to_peers' missing attribute 'max_peers'
  "mori_comm.row_copy_to_peers"(%d, %d, %n, %pe, %on) : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
  return
}

// -----
// count_signal: world_size given as a string is not an integer.
func.func @count_signal_string(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.count_signal' attribute 'world_size' must be an integer, got "eight"
  "mori_comm.count_signal"(%d, %d, %d) {world_size = "eight"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// count_signal: the total is a pointer operand, and the op has no result.
func.func @count_signal_result(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.count_signal' expected 0 results (none), got 1
  %t = "mori_comm.count_signal"(%d, %d, %d) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> i32
  return
}

// -----
// device_barrier: the slot arrays have max_blocks rows, at least one.
func.func @device_barrier_blocks(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.device_barrier' attribute 'max_blocks' must be >= 1, got 0
  "mori_comm.device_barrier"(%d, %d) {world_size = 8 : i64, max_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// one_gpu_barrier: device_barrier's attributes and ranges.
func.func @one_gpu_barrier_attrs(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.one_gpu_barrier' attribute 'world_size' must be in [1, 32], got 33
  "mori_comm.one_gpu_barrier"(%d, %d) {world_size = 33 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----

// barrier_arrive / barrier_wait: scope is "system" or "gpu".
func.func @barrier_scope(%d: !llvm.ptr, %e: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.barrier_wait' attribute 'scope' must be one of "system", "gpu", got "node"
  "mori_comm.barrier_wait"(%d, %e) {world_size = 4 : i64, scope = "node"} : (!llvm.ptr, i64) -> ()
  return
}

// -----

// device_barrier: slots and epochs are pointers.
func.func @device_barrier_operand(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.device_barrier' operand 'epochs' must be !llvm.ptr, got i64
  "mori_comm.device_barrier"(%d, %n) {world_size = 8 : i64, max_blocks = 80 : i64} : (!llvm.ptr, i64) -> ()
  return
}

// -----
// An op the dialect does not have: the message lists the ops it has.
func.func @unknown(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: unknown op 'mori_comm.broadcast'; the mori_comm dialect has: accumulate_quantized_rows, accumulate_rows, barrier_arrive, barrier_wait, chunk_send, chunk_wait, copy_bytes, count_signal, device_barrier, grid_barrier, grid_last_arrival, node_count_signal, node_device_barrier, node_pe, one_gpu_barrier, quantize_row, reserve_slot, row_copy, row_copy_to_peers, trace{{$}}
  "mori_comm.broadcast"(%d) : (!llvm.ptr) -> ()
  return
}

// ---- the inter-node blocks: node_pe, node_count_signal, node_device_barrier, chunk_send, chunk_wait ----

// -----
// node_pe: a node is group_size consecutive PEs, a power of two (3 is not).
func.func @node_pe_not_power_of_two(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.node_pe' attribute 'group_size' must be a power of two in [1, 32], got 3
  %r = "mori_comm.node_pe"(%pe) {group_size = 3 : i64} : (i32) -> i32
  return
}

// -----
// node_pe: one lane per node peer, so at most 32 PEs per node.
func.func @node_pe_too_large(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.node_pe' attribute 'group_size' must be a power of two in [1, 32], got 64
  %r = "mori_comm.node_pe"(%pe) {group_size = 64 : i64} : (i32) -> i32
  return
}

// -----
// node_pe: group_size is required.
func.func @node_pe_missing(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.node_pe' missing attribute 'group_size'
  %r = "mori_comm.node_pe"(%pe) : (i32) -> i32
  return
}

// -----
// node_pe: the PE is an i32.
func.func @node_pe_result(%pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.node_pe' result 'result' must be i32, got i64
  %r = "mori_comm.node_pe"(%pe) {group_size = 4 : i64} : (i32) -> i64
  return
}

// -----
// node_count_signal: the nodes are whole (8 does not divide 12).
func.func @node_count_signal_whole_nodes(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.node_count_signal' attribute 'group_size' (8) must divide 'world_size' (12): whole nodes
  "mori_comm.node_count_signal"(%d, %d, %d) {world_size = 12 : i64, group_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// node_count_signal: 6 is neither a power of two nor a divisor of 8: both are said.
func.func @node_count_signal_six(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 2]]:3: 'mori_comm.node_count_signal' attribute 'group_size' must be a power of two in [1, 32], got 6
  // CHECK-NEXT: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.node_count_signal' attribute 'group_size' (6) must divide 'world_size' (8): whole nodes
  "mori_comm.node_count_signal"(%d, %d, %d) {world_size = 8 : i64, group_size = 6 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// node_count_signal: group_size 0 is no node size.
func.func @node_count_signal_zero(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.node_count_signal' attribute 'group_size' must be a power of two in [1, 32], got 0
  "mori_comm.node_count_signal"(%d, %d, %d) {world_size = 8 : i64, group_size = 0 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// node_device_barrier: a node larger than the world does not divide it.
func.func @node_device_barrier_whole_nodes(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.node_device_barrier' attribute 'group_size' (16) must divide 'world_size' (8): whole nodes
  "mori_comm.node_device_barrier"(%d, %d) {world_size = 8 : i64, group_size = 16 : i64, max_blocks = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// node_device_barrier: max_blocks is required, as device_barrier's.
func.func @node_device_barrier_missing(%d: !llvm.ptr) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.node_device_barrier' missing attribute 'max_blocks'
  "mori_comm.node_device_barrier"(%d, %d) {world_size = 8 : i64, group_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
  return
}

// -----
// chunk_send: the mask is a 64-bit ballot.
func.func @chunk_send_mask(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.chunk_send' operand 'mask' must be i64, got i32
  %b = "mori_comm.chunk_send"(%d, %d, %n, %pe, %d, %n, %pe, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32, !llvm.ptr, i64, i32, i32) -> i64
  return
}

// -----
// chunk_send: the queue pair is an operand (no default); the message lists the operand names.
func.func @chunk_send_no_qp(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.chunk_send' expected 8 operands (dest, source, record_bytes, mask, signal, signal_base, pe, qp), got 7
  %b = "mori_comm.chunk_send"(%d, %d, %n, %n, %d, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32) -> i64
  return
}

// -----
// chunk_wait: the count is the signal's low 32 bits, an i32.
func.func @chunk_wait_result(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.chunk_wait' result 'count' must be i32, got i64
  %c = "mori_comm.chunk_wait"(%d, %n) : (!llvm.ptr, i64) -> i64
  return
}

// -----
// chunk_wait takes no attribute.
func.func @chunk_wait_attribute(%d: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:8: 'mori_comm.chunk_wait' unknown attribute 'world_size' (allowed: none)
  %c = "mori_comm.chunk_wait"(%d, %n) {world_size = 8 : i64} : (!llvm.ptr, i64) -> i32
  return
}

// -----
// quantize_row: `format` is one of the wire formats.
func.func @quantize_row_format(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.quantize_row' attribute 'format' must be one of
  "mori_comm.quantize_row"(%d, %d, %n, %pe) {format = "fp8", scale_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  return
}

// -----
// quantize_row: fp4 is blockwise only.
func.func @quantize_row_fp4_direct(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.quantize_row' attribute 'scale_blocks' must be >= 1 for format 'fp4_e2m1' (fp4 is blockwise only: there is no fp4 direct cast)
  "mori_comm.quantize_row"(%d, %d, %n, %pe) {format = "fp4_e2m1", scale_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  return
}

// -----
// quantize_row: `scale_blocks` is in [0, 256].
func.func @quantize_row_blocks(%d: !llvm.ptr, %n: i64, %pe: i32) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.quantize_row' attribute 'scale_blocks' must be in [0, 256], got -1
  "mori_comm.quantize_row"(%d, %d, %n, %pe) {format = "fp8_e4m3fn", scale_blocks = -1 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
  return
}

// -----
// accumulate_quantized_rows: at least one source row.
func.func @accumulate_quantized_none(%o: !llvm.ptr, %n: i64) {
  // CHECK: error: {{.*}}invalid.mlir:[[# @LINE + 1]]:3: 'mori_comm.accumulate_quantized_rows' needs at least one source row
  "mori_comm.accumulate_quantized_rows"(%o, %n, %n, %n) {format = "fp8_e4m3fn", scale_blocks = 56 : i64} : (!llvm.ptr, i64, i64, i64) -> ()
  return
}
