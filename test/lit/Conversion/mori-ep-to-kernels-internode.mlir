// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file | FileCheck %s
// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file | FileCheck %s --check-prefix=NODE --implicit-check-not='"mori_comm.count_signal"' --implicit-check-not='"mori_comm.device_barrier"'

// The inter-node ops (InterNodeV1, InterNodeV1LL, InterNode "V0"; passes/ep_internode_kernels.py) each
// become one kernel: stage, dispatch, combine, combine_all, with the parameters of ep_schema.KERNELS (names
// as mori.name). 4 PEs in 2 nodes of 2, hidden 1024 bf16 (rows of 2048 B), top-4, 8 experts per PE, 64
// tokens (one chunk of a 64-lane wave), 16 scale bytes: records of round16(2048 + 32 + 16 + 4) = 2112 B,
// partials of round16(2048 + 16) = 2064 B. Pinned: the transport discipline (a PE of another node only
// through chunk_send, with the queue pair chunk % num_qp; every P2P peer through node_pe; the handshake
// and the barrier among the node's PEs only: the NODE run forbids the world-wide count_signal and
// device_barrier), the role split by rdma_blocks, and what tells the types apart: V1 and V0 test each
// token's experts against the hop before sending it, V1LL (send_all) sends every live token; V1/V1LL
// have 1 remote hop (the other node's rail proxy, hop_size 2), V0 has 2 (the other node's PEs, hop_size 1).
// NODE-COUNT-3: "mori_comm.node_count_signal"

// InterNodeV1: hop_size = gpu_per_node (2), selective sends, 3 queue pairs.
// CHECK-LABEL: gpu.func @ep_inter_stage_bf16(
// CHECK-SAME: %arg0: !llvm.ptr {mori.name = "x"}, %arg1: !llvm.ptr {mori.name = "w"}, %arg2: !llvm.ptr {mori.name = "s"}, %arg3: !llvm.ptr {mori.name = "idx"}, %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: !llvm.ptr {mori.name = "stage"}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c2048_i64, %{{.*}})
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c16_i64, %{{.*}})
// CHECK-NOT: "mori_comm.chunk_send"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_dispatch_bf16(
// CHECK-SAME: %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: i32 {mori.name = "rdma_blocks"}
// CHECK-SAME: %arg13: !llvm.ptr {mori.name = "signals"}, %arg14: !llvm.ptr {mori.name = "grid_ctr"}, %arg15: !llvm.ptr {mori.name = "round_ctr"}
// CHECK-SAME: %arg17: !llvm.ptr {mori.name = "dest_ctr"}, %arg18: !llvm.ptr {mori.name = "total"}
// CHECK-SAME: %arg20: !llvm.ptr {mori.name = "stage"}, %arg21: !llvm.ptr {mori.name = "land"}, %arg22: !llvm.ptr {mori.name = "flag"}, %arg23: !llvm.ptr {mori.name = "smap"}, %arg24: !llvm.ptr {mori.name = "pfwd"}, %arg25: !llvm.ptr {mori.name = "traffic"}, %arg26: !llvm.ptr {mori.name = "routing"}, %arg27: !llvm.ptr {mori.name = "routing_pfwd"}) kernel
// A routing handle (routing = %arg26, routing_pfwd = %arg27) replays the recorded slots (docs/ep-protocols.md §17).
// CHECK: %[[REPLAY:.*]] = llvm.icmp "ne" %arg26, %{{.*}} : !llvm.ptr
// The inter-node role: the blocks below rdma_blocks.
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// Chunked send: one warp per (remote hop, chunk), 1 of them here; lane = token.
// CHECK: scf.for %{{.*}} = %{{.*}} to %c1{{(_[0-9]+)?}} step
// CHECK: arith.cmpi ult, %{{.*}}, %arg4 : i32
// The hop test: one of the token's K experts on the hop's PEs.
// CHECK-NEXT: scf.for %{{.*}} = %{{.*}} to %c4 step %{{.*}} iter_args(%{{.*}} = %false) -> (i1) {
// CHECK: arith.divsi %{{.*}}, %c8_i32 : i32
// CHECK: scf.yield %{{.*}} : i1
// The ballot (two 32-bit halves), the packed slot of each token in the send map, then the send.
// CHECK: gpu.shuffle  xor
// CHECK: llvm.intr.ctpop
// CHECK: llvm.getelementptr %arg23[
// CHECK: %[[LAND:.*]] = llvm.getelementptr %arg21[
// CHECK: %[[SRC:.*]] = llvm.getelementptr %arg20[
// CHECK: %[[FLAG:.*]] = llvm.getelementptr %arg22[
// The queue pair: chunk % num_qp (3); the target: hop * hop_size (2) + me % hop_size.
// CHECK: %[[NQP:.*]] = arith.constant 3 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK-NEXT: %[[HOPPE:.*]] = arith.muli %{{.*}}, %[[HS:.*]] : i32
// CHECK-NEXT: %[[RANK:.*]] = arith.remui %{{.*}}, %[[HS]] : i32
// CHECK-NEXT: %[[TARGET:.*]] = arith.addi %[[HOPPE]], %[[RANK]] : i32
// CHECK-NEXT: %[[SENT:.*]] = "mori_comm.chunk_send"(%[[LAND]], %[[SRC]], %c2112_i64, %{{.*}}, %[[FLAG]], %{{.*}}, %[[TARGET]], %[[QP]]) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
// CHECK: llvm.getelementptr %arg25[0]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// Receive and forward: every lane waits for its chunk; a record below the count is routed; its
// destinations (slots, rows) are named through node_pe.
// CHECK: %[[GOT:.*]] = "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: %[[UPTO:.*]] = arith.index_cast %[[GOT]] : i32 to index
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[UPTO]] step %{{.*}} {
// CHECK: %[[FPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[FPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[RPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[RPE]], %{{.*}}) {max_peers = 4 : i64}
// CHECK: "mori_shmem.quiet"() : () -> ()
// The same-node role: the other blocks, IntraNode's route restricted to this node, also through node_pe.
// CHECK: %[[XGMI:.*]] = arith.xori %[[RDMA]], %true : i1
// CHECK-NEXT: scf.if %[[XGMI]] {
// CHECK-NOT: "mori_comm.chunk_
// CHECK: %[[SPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[SPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[CPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[CPE]], %{{.*}}) {max_peers = 4 : i64}
// Completion: the grid meets, then the count handshake among the node's 2 PEs; the round advances.
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.grid_barrier"(%arg14) : (!llvm.ptr) -> ()
// CHECK: "mori_comm.node_count_signal"(%arg13, %arg17, %arg18) {group_size = 2 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: llvm.store %{{.*}}, %arg15 : i64, !llvm.ptr
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: i32 {mori.name = "rdma_blocks"}, %arg3: i32 {mori.name = "has_w"}, %arg4: !llvm.ptr {mori.name = "reg_x"}, %arg5: !llvm.ptr {mori.name = "reg_w"}
// CHECK-SAME: %arg11: !llvm.ptr {mori.name = "fpart"}, %arg12: !llvm.ptr {mori.name = "crecv"}, %arg13: !llvm.ptr {mori.name = "cflag"}, %arg14: !llvm.ptr {mori.name = "done"}, %arg15: !llvm.ptr {mori.name = "rounds"}, %arg16: !llvm.ptr {mori.name = "bar_slots"}, %arg17: !llvm.ptr {mori.name = "bar_epochs"}, %arg18: !llvm.ptr {mori.name = "zero_row"}, %arg19: !llvm.ptr {mori.name = "traffic"}) kernel
// The node meets first (its peers' registered rows are written).
// CHECK: "mori_comm.node_device_barrier"(%arg16, %arg17) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// Inter-node blocks: a chunk's forwarded records shared by 4 warps (one chunk per source hop here): a
// record's rows on the node's PEs (through node_pe; at most min(K, hop size) of them) summed into its
// partial; each share released and counted done; the chunk's last share sends its partials back (queue
// pair chunk % 3).
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// CHECK: "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64}
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}, %{{.*}}) {dtype = "bf16"}
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: llvm.atomicrmw add %{{.*}}, %{{.*}} monotonic : !llvm.ptr, i32
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: %[[NQP:.*]] = arith.constant 3 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK: %[[SENT:.*]] = "mori_comm.chunk_send"(%{{.*}}, %{{.*}}, %c2064_i64, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[QP]])
// CHECK: llvm.getelementptr %arg19[2]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// CHECK: "mori_shmem.quiet"() : () -> ()
// Same-node blocks: each own token's node partial.
// CHECK: arith.xori %[[RDMA]], %true : i1
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.accumulate_rows"
// CHECK-NOT: "mori_comm.chunk_
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_all_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: !llvm.ptr {mori.name = "smap"}, %arg3: !llvm.ptr {mori.name = "part"}, %arg4: !llvm.ptr {mori.name = "crecv"}, %arg5: !llvm.ptr {mori.name = "cflag"}, %arg6: !llvm.ptr {mori.name = "rounds"}, %arg7: !llvm.ptr {mori.name = "bar_slots"}, %arg8: !llvm.ptr {mori.name = "bar_epochs"}, %arg9: !llvm.ptr {mori.name = "out"}, %arg10: !llvm.ptr {mori.name = "out_w"}, %arg11: !llvm.ptr {mori.name = "zero_row"}) kernel
// CHECK: "mori_comm.node_device_barrier"(%arg7, %arg8) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// The node meets first (every peer's gathers from our registered rows are done). The lanes of the remote
// hops the token went to wait for its partial's chunk, the warp fences (acquire), then the node's partial
// and the 1 remote ones are summed.
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: }
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}, %{{.*}}) {dtype = "bf16"}
// Then warp 0 of block 0 waits for every chunk of every remote hop (no PE gets two rounds ahead).
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NOT: "mori_comm.
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @v1 {
    "mori_ep.internode_stage"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 0 : i64, num_qp = 3 : i64} : () -> ()
    "mori_ep.internode_dispatch"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 0 : i64, num_qp = 3 : i64} : () -> ()
    "mori_ep.internode_combine"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 0 : i64, num_qp = 3 : i64, max_blocks = 64 : i64} : () -> ()
    "mori_ep.internode_combine_all"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 0 : i64, num_qp = 3 : i64, max_blocks = 64 : i64} : () -> ()
  }
}

// -----

// InterNodeV1LL: send_all = 1: no per-expert hop test in the send.
// CHECK-LABEL: gpu.func @ep_inter_stage_bf16(
// CHECK-SAME: %arg0: !llvm.ptr {mori.name = "x"}, %arg1: !llvm.ptr {mori.name = "w"}, %arg2: !llvm.ptr {mori.name = "s"}, %arg3: !llvm.ptr {mori.name = "idx"}, %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: !llvm.ptr {mori.name = "stage"}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c2048_i64, %{{.*}})
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c16_i64, %{{.*}})
// CHECK-NOT: "mori_comm.chunk_send"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_dispatch_bf16(
// CHECK-SAME: %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: i32 {mori.name = "rdma_blocks"}
// CHECK-SAME: %arg13: !llvm.ptr {mori.name = "signals"}, %arg14: !llvm.ptr {mori.name = "grid_ctr"}, %arg15: !llvm.ptr {mori.name = "round_ctr"}
// CHECK-SAME: %arg17: !llvm.ptr {mori.name = "dest_ctr"}, %arg18: !llvm.ptr {mori.name = "total"}
// CHECK-SAME: %arg20: !llvm.ptr {mori.name = "stage"}, %arg21: !llvm.ptr {mori.name = "land"}, %arg22: !llvm.ptr {mori.name = "flag"}, %arg23: !llvm.ptr {mori.name = "smap"}, %arg24: !llvm.ptr {mori.name = "pfwd"}, %arg25: !llvm.ptr {mori.name = "traffic"}, %arg26: !llvm.ptr {mori.name = "routing"}, %arg27: !llvm.ptr {mori.name = "routing_pfwd"}) kernel
// The inter-node role: the blocks below rdma_blocks.
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// Chunked send: one warp per (remote hop, chunk), 1 of them here; lane = token.
// CHECK: scf.for %{{.*}} = %{{.*}} to %c1{{(_[0-9]+)?}} step
// CHECK: arith.cmpi ult, %{{.*}}, %arg4 : i32
// No hop test: every live token is sent to every remote node (the ballot of the live lanes).
// CHECK-NOT: iter_args
// CHECK-NOT: arith.divsi
// The ballot (two 32-bit halves), the packed slot of each token in the send map, then the send.
// CHECK: gpu.shuffle  xor
// CHECK: llvm.intr.ctpop
// CHECK: llvm.getelementptr %arg23[
// CHECK: %[[LAND:.*]] = llvm.getelementptr %arg21[
// CHECK: %[[SRC:.*]] = llvm.getelementptr %arg20[
// CHECK: %[[FLAG:.*]] = llvm.getelementptr %arg22[
// The queue pair: chunk % num_qp (3); the target: hop * hop_size (2) + me % hop_size.
// CHECK: %[[NQP:.*]] = arith.constant 3 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK-NEXT: %[[HOPPE:.*]] = arith.muli %{{.*}}, %[[HS:.*]] : i32
// CHECK-NEXT: %[[RANK:.*]] = arith.remui %{{.*}}, %[[HS]] : i32
// CHECK-NEXT: %[[TARGET:.*]] = arith.addi %[[HOPPE]], %[[RANK]] : i32
// CHECK-NEXT: %[[SENT:.*]] = "mori_comm.chunk_send"(%[[LAND]], %[[SRC]], %c2112_i64, %{{.*}}, %[[FLAG]], %{{.*}}, %[[TARGET]], %[[QP]]) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
// CHECK: llvm.getelementptr %arg25[0]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// Receive and forward: every lane waits for its chunk; a record below the count is routed; its
// destinations (slots, rows) are named through node_pe.
// CHECK: %[[GOT:.*]] = "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: %[[UPTO:.*]] = arith.index_cast %[[GOT]] : i32 to index
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[UPTO]] step %{{.*}} {
// CHECK: %[[FPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[FPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[RPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[RPE]], %{{.*}}) {max_peers = 4 : i64}
// CHECK: "mori_shmem.quiet"() : () -> ()
// The same-node role: the other blocks, IntraNode's route restricted to this node, also through node_pe.
// CHECK: %[[XGMI:.*]] = arith.xori %[[RDMA]], %true : i1
// CHECK-NEXT: scf.if %[[XGMI]] {
// CHECK-NOT: "mori_comm.chunk_
// CHECK: %[[SPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[SPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[CPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[CPE]], %{{.*}}) {max_peers = 4 : i64}
// Completion: the grid meets, then the count handshake among the node's 2 PEs; the round advances.
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.grid_barrier"(%arg14) : (!llvm.ptr) -> ()
// CHECK: "mori_comm.node_count_signal"(%arg13, %arg17, %arg18) {group_size = 2 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: llvm.store %{{.*}}, %arg15 : i64, !llvm.ptr
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: i32 {mori.name = "rdma_blocks"}, %arg3: i32 {mori.name = "has_w"}, %arg4: !llvm.ptr {mori.name = "reg_x"}, %arg5: !llvm.ptr {mori.name = "reg_w"}
// CHECK-SAME: %arg11: !llvm.ptr {mori.name = "fpart"}, %arg12: !llvm.ptr {mori.name = "crecv"}, %arg13: !llvm.ptr {mori.name = "cflag"}, %arg14: !llvm.ptr {mori.name = "done"}, %arg15: !llvm.ptr {mori.name = "rounds"}, %arg16: !llvm.ptr {mori.name = "bar_slots"}, %arg17: !llvm.ptr {mori.name = "bar_epochs"}, %arg18: !llvm.ptr {mori.name = "zero_row"}, %arg19: !llvm.ptr {mori.name = "traffic"}) kernel
// The node meets first (its peers' registered rows are written).
// CHECK: "mori_comm.node_device_barrier"(%arg16, %arg17) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// Inter-node blocks: a chunk's forwarded records shared by 4 warps (one chunk per source hop here): a
// record's rows on the node's PEs (through node_pe; at most min(K, hop size) of them) summed into its
// partial; each share released and counted done; the chunk's last share sends its partials back (queue
// pair chunk % 3).
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// CHECK: "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64}
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}, %{{.*}}) {dtype = "bf16"}
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: llvm.atomicrmw add %{{.*}}, %{{.*}} monotonic : !llvm.ptr, i32
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: %[[NQP:.*]] = arith.constant 3 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK: %[[SENT:.*]] = "mori_comm.chunk_send"(%{{.*}}, %{{.*}}, %c2064_i64, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[QP]])
// CHECK: llvm.getelementptr %arg19[2]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// CHECK: "mori_shmem.quiet"() : () -> ()
// Same-node blocks: each own token's node partial.
// CHECK: arith.xori %[[RDMA]], %true : i1
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.accumulate_rows"
// CHECK-NOT: "mori_comm.chunk_
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_all_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: !llvm.ptr {mori.name = "smap"}, %arg3: !llvm.ptr {mori.name = "part"}, %arg4: !llvm.ptr {mori.name = "crecv"}, %arg5: !llvm.ptr {mori.name = "cflag"}, %arg6: !llvm.ptr {mori.name = "rounds"}, %arg7: !llvm.ptr {mori.name = "bar_slots"}, %arg8: !llvm.ptr {mori.name = "bar_epochs"}, %arg9: !llvm.ptr {mori.name = "out"}, %arg10: !llvm.ptr {mori.name = "out_w"}, %arg11: !llvm.ptr {mori.name = "zero_row"}) kernel
// CHECK: "mori_comm.node_device_barrier"(%arg7, %arg8) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// The node meets first (every peer's gathers from our registered rows are done). The lanes of the remote
// hops the token went to wait for its partial's chunk, the warp fences (acquire), then the node's partial
// and the 1 remote ones are summed.
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: }
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}, %{{.*}}) {dtype = "bf16"}
// Then warp 0 of block 0 waits for every chunk of every remote hop (no PE gets two rounds ahead).
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NOT: "mori_comm.
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @v1ll {
    "mori_ep.internode_stage"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 1 : i64, num_qp = 3 : i64} : () -> ()
    "mori_ep.internode_dispatch"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 1 : i64, num_qp = 3 : i64} : () -> ()
    "mori_ep.internode_combine"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 1 : i64, num_qp = 3 : i64, max_blocks = 64 : i64} : () -> ()
    "mori_ep.internode_combine_all"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 2 : i64, send_all = 1 : i64, num_qp = 3 : i64, max_blocks = 64 : i64} : () -> ()
  }
}

// -----

// InterNode (V0): hop_size 1, the token goes to each remote PE holding one of its experts; one queue pair.
// CHECK-LABEL: gpu.func @ep_inter_stage_bf16(
// CHECK-SAME: %arg0: !llvm.ptr {mori.name = "x"}, %arg1: !llvm.ptr {mori.name = "w"}, %arg2: !llvm.ptr {mori.name = "s"}, %arg3: !llvm.ptr {mori.name = "idx"}, %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: !llvm.ptr {mori.name = "stage"}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c2048_i64, %{{.*}})
// CHECK: "mori_comm.row_copy"(%{{.*}}, %{{.*}}, %c16_i64, %{{.*}})
// CHECK-NOT: "mori_comm.chunk_send"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_dispatch_bf16(
// CHECK-SAME: %arg4: i32 {mori.name = "n"}, %arg5: i32 {mori.name = "hidden"}, %arg6: i32 {mori.name = "rdma_blocks"}
// CHECK-SAME: %arg13: !llvm.ptr {mori.name = "signals"}, %arg14: !llvm.ptr {mori.name = "grid_ctr"}, %arg15: !llvm.ptr {mori.name = "round_ctr"}
// CHECK-SAME: %arg17: !llvm.ptr {mori.name = "dest_ctr"}, %arg18: !llvm.ptr {mori.name = "total"}
// CHECK-SAME: %arg20: !llvm.ptr {mori.name = "stage"}, %arg21: !llvm.ptr {mori.name = "land"}, %arg22: !llvm.ptr {mori.name = "flag"}, %arg23: !llvm.ptr {mori.name = "smap"}, %arg24: !llvm.ptr {mori.name = "pfwd"}, %arg25: !llvm.ptr {mori.name = "traffic"}, %arg26: !llvm.ptr {mori.name = "routing"}, %arg27: !llvm.ptr {mori.name = "routing_pfwd"}) kernel
// The inter-node role: the blocks below rdma_blocks.
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// Chunked send: one warp per (remote hop, chunk), 2 of them here; lane = token.
// CHECK: scf.for %{{.*}} = %{{.*}} to %c2{{(_[0-9]+)?}} step
// CHECK: arith.cmpi ult, %{{.*}}, %arg4 : i32
// The hop test: one of the token's K experts on the hop's PEs.
// CHECK-NEXT: scf.for %{{.*}} = %{{.*}} to %c4 step %{{.*}} iter_args(%{{.*}} = %false) -> (i1) {
// CHECK: arith.divsi %{{.*}}, %c8_i32 : i32
// CHECK: scf.yield %{{.*}} : i1
// The ballot (two 32-bit halves), the packed slot of each token in the send map, then the send.
// CHECK: gpu.shuffle  xor
// CHECK: llvm.intr.ctpop
// CHECK: llvm.getelementptr %arg23[
// CHECK: %[[LAND:.*]] = llvm.getelementptr %arg21[
// CHECK: %[[SRC:.*]] = llvm.getelementptr %arg20[
// CHECK: %[[FLAG:.*]] = llvm.getelementptr %arg22[
// The queue pair: chunk % num_qp (1); the target: hop * hop_size (1) + me % hop_size.
// CHECK: %[[NQP:.*]] = arith.constant 1 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK-NEXT: %[[HOPPE:.*]] = arith.muli %{{.*}}, %[[HS:.*]] : i32
// CHECK-NEXT: %[[RANK:.*]] = arith.remui %{{.*}}, %[[HS]] : i32
// CHECK-NEXT: %[[TARGET:.*]] = arith.addi %[[HOPPE]], %[[RANK]] : i32
// CHECK-NEXT: %[[SENT:.*]] = "mori_comm.chunk_send"(%[[LAND]], %[[SRC]], %c2112_i64, %{{.*}}, %[[FLAG]], %{{.*}}, %[[TARGET]], %[[QP]]) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
// CHECK: llvm.getelementptr %arg25[0]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// Receive and forward: every lane waits for its chunk; a record below the count is routed; its
// destinations (slots, rows) are named through node_pe.
// CHECK: %[[GOT:.*]] = "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: %[[UPTO:.*]] = arith.index_cast %[[GOT]] : i32 to index
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[UPTO]] step %{{.*}} {
// CHECK: %[[FPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[FPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[RPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[RPE]], %{{.*}}) {max_peers = 4 : i64}
// CHECK: "mori_shmem.quiet"() : () -> ()
// The same-node role: the other blocks, IntraNode's route restricted to this node, also through node_pe.
// CHECK: %[[XGMI:.*]] = arith.xori %[[RDMA]], %true : i1
// CHECK-NEXT: scf.if %[[XGMI]] {
// CHECK-NOT: "mori_comm.chunk_
// CHECK: %[[SPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.reserve_slot"(%{{.*}}, %[[SPE]]) : (!llvm.ptr, i32) -> i32
// CHECK: %[[CPE:.*]] = "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64} : (i32) -> i32
// CHECK-NEXT: "mori_comm.row_copy_to_peers"(%{{.*}}, %{{.*}}, %c2048_i64, %[[CPE]], %{{.*}}) {max_peers = 4 : i64}
// Completion: the grid meets, then the count handshake among the node's 2 PEs; the round advances.
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.grid_barrier"(%arg14) : (!llvm.ptr) -> ()
// CHECK: "mori_comm.node_count_signal"(%arg13, %arg17, %arg18) {group_size = 2 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK: llvm.store %{{.*}}, %arg15 : i64, !llvm.ptr
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: i32 {mori.name = "rdma_blocks"}, %arg3: i32 {mori.name = "has_w"}, %arg4: !llvm.ptr {mori.name = "reg_x"}, %arg5: !llvm.ptr {mori.name = "reg_w"}
// CHECK-SAME: %arg11: !llvm.ptr {mori.name = "fpart"}, %arg12: !llvm.ptr {mori.name = "crecv"}, %arg13: !llvm.ptr {mori.name = "cflag"}, %arg14: !llvm.ptr {mori.name = "done"}, %arg15: !llvm.ptr {mori.name = "rounds"}, %arg16: !llvm.ptr {mori.name = "bar_slots"}, %arg17: !llvm.ptr {mori.name = "bar_epochs"}, %arg18: !llvm.ptr {mori.name = "zero_row"}, %arg19: !llvm.ptr {mori.name = "traffic"}) kernel
// The node meets first (its peers' registered rows are written).
// CHECK: "mori_comm.node_device_barrier"(%arg16, %arg17) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// Inter-node blocks: a chunk's forwarded records shared by 4 warps (two chunks per source hop here): a
// record's row on its one destination (V0: the PE itself, through node_pe) is its partial; each share
// released and counted done; the chunk's last share sends its partials back (queue pair chunk % 1).
// CHECK: %[[RDMA:.*]] = arith.cmpi ult, %block_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[RDMA]] {
// CHECK: "mori_comm.node_pe"(%{{.*}}) {group_size = 2 : i64}
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}) {dtype = "bf16"}
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: llvm.atomicrmw add %{{.*}}, %{{.*}} monotonic : !llvm.ptr, i32
// CHECK: "mori_shmem.fence"() : () -> ()
// CHECK: %[[NQP:.*]] = arith.constant 1 : i32
// CHECK-NEXT: %[[QP:.*]] = arith.remui %{{.*}}, %[[NQP]] : i32
// CHECK: %[[SENT:.*]] = "mori_comm.chunk_send"(%{{.*}}, %{{.*}}, %c2064_i64, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[QP]])
// CHECK: llvm.getelementptr %arg19[2]
// CHECK-NEXT: llvm.atomicrmw add %{{.*}}, %[[SENT]] monotonic : !llvm.ptr, i64
// CHECK: "mori_shmem.quiet"() : () -> ()
// Same-node blocks: each own token's node partial.
// CHECK: arith.xori %[[RDMA]], %true : i1
// CHECK-NOT: "mori_comm.chunk_
// CHECK: "mori_comm.accumulate_rows"
// CHECK-NOT: "mori_comm.chunk_
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @ep_inter_combine_all_bf16(
// CHECK-SAME: %arg0: i32 {mori.name = "n"}, %arg1: i32 {mori.name = "hidden"}, %arg2: !llvm.ptr {mori.name = "smap"}, %arg3: !llvm.ptr {mori.name = "part"}, %arg4: !llvm.ptr {mori.name = "crecv"}, %arg5: !llvm.ptr {mori.name = "cflag"}, %arg6: !llvm.ptr {mori.name = "rounds"}, %arg7: !llvm.ptr {mori.name = "bar_slots"}, %arg8: !llvm.ptr {mori.name = "bar_epochs"}, %arg9: !llvm.ptr {mori.name = "out"}, %arg10: !llvm.ptr {mori.name = "out_w"}, %arg11: !llvm.ptr {mori.name = "zero_row"}) kernel
// CHECK: "mori_comm.node_device_barrier"(%arg7, %arg8) {group_size = 2 : i64, max_blocks = 64 : i64, world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
// The node meets first (every peer's gathers from our registered rows are done). The lanes of the remote
// hops the token went to wait for its partial's chunk, the warp fences (acquire), then the node's partial
// and the 2 remote ones are summed.
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: }
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK: "mori_comm.accumulate_rows"(%{{.*}}, %c1024_i64, %{{.*}}, %{{.*}}, %{{.*}}) {dtype = "bf16"}
// Then warp 0 of block 0 waits for every chunk of every remote hop (no PE gets two rounds ahead).
// CHECK: "mori_comm.chunk_wait"(%{{.*}}, %{{.*}}) : (!llvm.ptr, i64) -> i32
// CHECK-NOT: "mori_comm.
// CHECK: gpu.return
module attributes {gpu.container_module} {
  gpu.module @v0 {
    "mori_ep.internode_stage"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
    "mori_ep.internode_dispatch"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, scale_bytes = 16 : i64, gpu_per_node = 2 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
    "mori_ep.internode_combine"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 64 : i64} : () -> ()
    "mori_ep.internode_combine_all"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, gpu_per_node = 2 : i64, hop_size = 1 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 64 : i64} : () -> ()
  }
}
