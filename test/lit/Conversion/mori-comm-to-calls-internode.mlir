// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' | FileCheck %s --check-prefix=ONCE --implicit-check-not='func.func @__mori_comm_'
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=32}' | FileCheck %s --check-prefix=W32

// The inter-node blocks (dialects/mori_comm.py; the kernels: passes/ep_internode_kernels.py): each becomes a
// call of its helper, one per variant. node_pe, node_count_signal and node_device_barrier carry the node
// size G in their symbol (`_g{G}`, after count_signal's and device_barrier's `_w{W}`); chunk_send and
// chunk_wait have one helper each. Pinned here: the peer naming (me / G) * G + ..., the node variants
// talking to the G PEs of this node only, chunk_send's puts and its one signal on the caller's queue pair,
// chunk_wait's poll then acquire fence.

// ONCE-LABEL: gpu.module @internode
// ONCE-NEXT: func.func @__mori_comm_chunk_wait(
// ONCE: func.func @__mori_comm_chunk_send(
// ONCE: func.func @__mori_comm_device_barrier_w16_g8(
// ONCE: func.func @__mori_comm_device_barrier_w8_g4(
// ONCE: func.func @__mori_comm_count_signal_w8_g4(
// ONCE: func.func @__mori_comm_node_pe_g8(
// ONCE: func.func @__mori_comm_node_pe_g4(
// ONCE: gpu.func @k(

// Helpers are added at the top of the gpu.module as they are created: the last new one first.

// chunk_wait: poll until the signal is >= base (> base - 1), then the acquire fence; the count is the
// low 32 bits.
// CHECK-LABEL: func.func @__mori_comm_chunk_wait(
// CHECK-SAME: %[[SIGP:[^:]+]]: !llvm.ptr, %[[B:[^:]+]]: i64) -> i32 {
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-NEXT: %[[BELOW:.*]] = arith.subi %[[B]], %[[ONE]] : i64
// CHECK-NEXT: %[[SEEN:.*]] = "mori_shmem.wait_until"(%[[SIGP]], %[[BELOW]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: %[[GOT:.*]] = arith.trunci %[[SEEN]] : i64 to i32
// CHECK-NEXT: return %[[GOT]] : i32

// chunk_send: a warp-uniform loop over the runs of set bits of the mask, one warp-scope putmem_nbi each
// on the caller's pe and queue pair; then one warp-scope putmem_nbi_signal (0 bytes, SET) of
// signal_base + popcount(mask) on the same pe and queue pair; the result is popcount * record bytes.
// CHECK-LABEL: func.func @__mori_comm_chunk_send(
// CHECK-SAME: %[[DEST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[REC:[^:]+]]: i64, %[[MASK:[^:]+]]: i64, %[[FLAG:[^:]+]]: !llvm.ptr, %[[BASE:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[QP:[^:]+]]: i32) -> i64 {
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : i64
// CHECK-NEXT: arith.constant 1 : i64
// CHECK-NEXT: %[[COUNT:.*]] = llvm.intr.ctpop(%[[MASK]]) : (i64) -> i64
// CHECK-NEXT: scf.while (%[[REM:.*]] = %[[MASK]]) : (i64) -> i64 {
// CHECK-NEXT: %[[MORE:.*]] = arith.cmpi ne, %[[REM]], %[[Z]] : i64
// CHECK-NEXT: scf.condition(%[[MORE]])
// CHECK: } do {
// CHECK: "mori_shmem.putmem_nbi"(%{{.*}}, %{{.*}}, %{{.*}}, %[[PE]], %[[QP]]) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
// CHECK-NOT: mori_shmem.
// CHECK: scf.yield
// CHECK-NEXT: }
// CHECK-NEXT: %[[SIGNAL:.*]] = arith.addi %[[BASE]], %[[COUNT]] : i64
// CHECK-NEXT: "mori_shmem.putmem_nbi_signal"(%[[DEST]], %[[SRC]], %[[Z]], %[[FLAG]], %[[SIGNAL]], %[[PE]], %[[QP]]) {scope = "warp", signal_op = "set"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: %[[BYTES:.*]] = arith.muli %[[COUNT]], %[[REC]] : i64
// CHECK-NEXT: return %[[BYTES]] : i64

// node_device_barrier: device_barrier's protocol with thread p < G talking to PE (me / G) * G + p; the
// slot rows still have W words (slots[b][pe]).
// CHECK-LABEL: func.func @__mori_comm_device_barrier_w16_g8(
// CHECK: arith.constant 8 : i32
// CHECK-NEXT: arith.constant 16 : i64
// CHECK-LABEL: func.func @__mori_comm_device_barrier_w8_g4(
// CHECK-SAME: %[[SLOTS:[^:]+]]: !llvm.ptr, %[[EPOCHS:[^:]+]]: !llvm.ptr) {
// CHECK: %[[TID:.*]] = arith.index_cast %{{.*}} : index to i32
// CHECK: %[[GT:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[W8:.*]] = arith.constant 8 : i64
// CHECK-NEXT: %[[TALK:.*]] = arith.cmpi ult, %[[TID]], %[[GT]] : i32
// CHECK-NEXT: scf.if %[[TALK]] {
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK: %[[N:.*]] = arith.divui %[[ME]], %[[G:.*]] : i32
// CHECK-NEXT: %[[B:.*]] = arith.muli %[[N]], %[[G]] : i32
// CHECK-NEXT: %[[PEER:.*]] = arith.addi %[[B]], %[[TID]] : i32
// CHECK: %[[ROW:.*]] = arith.muli %{{.*}}, %[[W8]] : i64
// CHECK: llvm.fence release
// CHECK-NEXT: "mori_shmem.p"(%{{.*}}, %{{.*}}, %[[PEER]], %{{.*}}) {c_type = "uint64"}
// CHECK: "mori_shmem.wait_until"(%{{.*}}, %{{.*}}) {cmp = "greater_than", elem = "uint64"}
// CHECK-NEXT: llvm.fence acquire
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: return

// node_count_signal: count_signal's protocol (flow-control wait, release fence, signal, counts reset;
// poll, acquire fence, slot reset) where lane p < G talks to PE (me / G) * G + p; the buffers are
// indexed by PE. The warp sums the counts over its 64 lanes (wave-size=32: 32).
// CHECK-LABEL: func.func @__mori_comm_count_signal_w8_g4(
// CHECK-SAME: %[[SIG:[^:]+]]: !llvm.ptr, %[[CNT:[^:]+]]: !llvm.ptr, %[[TOT:[^:]+]]: !llvm.ptr) {
// CHECK: %[[LANE:.*]] = arith.index_cast %{{.*}} : index to i32
// CHECK-NEXT: %[[GL:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[G:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[N:.*]] = arith.divui %[[ME]], %[[G]] : i32
// CHECK-NEXT: %[[B:.*]] = arith.muli %[[N]], %[[G]] : i32
// CHECK-NEXT: %[[PEER:.*]] = arith.addi %[[B]], %[[LANE]] : i32
// CHECK-NEXT: %[[TALK:.*]] = arith.cmpi ult, %[[LANE]], %[[GL]] : i32
// CHECK-NEXT: scf.if %[[TALK]] -> (i32) {
// CHECK-NEXT: %[[MINE:.*]] = llvm.getelementptr %[[SIG]][%[[ME]]] : (!llvm.ptr, i32) -> !llvm.ptr, i64
// CHECK-NEXT: %[[THERE:.*]] = "mori_shmem.ptr"(%[[MINE]], %[[PEER]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK: "mori_shmem.wait_until"(%[[THERE]], %{{.*}}) {cmp = "equals", elem = "uint64"}
// CHECK: %[[CP:.*]] = llvm.getelementptr %[[CNT]][%[[PEER]]] : (!llvm.ptr, i32) -> !llvm.ptr, i32
// CHECK: llvm.fence release
// CHECK-NEXT: "mori_shmem.p"(%[[MINE]], %{{.*}}, %[[PEER]], %{{.*}}) {c_type = "uint64"}
// CHECK-NEXT: arith.constant 0 : i32
// CHECK-NEXT: llvm.store %{{.*}}, %[[CP]] : i32, !llvm.ptr
// CHECK-NEXT: %[[IN:.*]] = llvm.getelementptr %[[SIG]][%[[PEER]]] : (!llvm.ptr, i32) -> !llvm.ptr, i64
// CHECK-NEXT: "mori_shmem.wait_until"(%[[IN]], %{{.*}}) {cmp = "greater_than", elem = "uint64"}
// CHECK-NEXT: llvm.fence acquire
// CHECK-NEXT: "mori_shmem.p"(%[[IN]], %{{.*}}, %[[ME]], %{{.*}}) {c_type = "uint64"}
// CHECK: gpu.shuffle  xor %{{.*}}, %{{.*}}, %[[W:.*]] : i32
// CHECK: llvm.store %{{.*}}, %[[TOT]] : i32, !llvm.ptr
// CHECK: return
// W32-LABEL: func.func @__mori_comm_count_signal_w8_g4(
// W32: %[[W:.*]] = arith.constant 32 : i32
// W32-NEXT: %[[S:.*]] = arith.constant 16 : i32
// W32-NEXT: gpu.shuffle  xor %{{.*}}, %[[S]], %[[W]] : i32
// W32-NOT: arith.constant 64 : i32
// W32: return

// node_pe: pure, (me / G) * G + pe % G.
// CHECK-LABEL: func.func @__mori_comm_node_pe_g4(
// CHECK-SAME: %[[PE:[^:]+]]: i32) -> i32 {
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[G:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[NODE:.*]] = arith.divui %[[ME]], %[[G]] : i32
// CHECK-NEXT: %[[BASE:.*]] = arith.muli %[[NODE]], %[[G]] : i32
// CHECK-NEXT: %[[G2:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[LOCAL:.*]] = arith.remui %[[PE]], %[[G2]] : i32
// CHECK-NEXT: %[[R:.*]] = arith.addi %[[BASE]], %[[LOCAL]] : i32
// CHECK-NEXT: return %[[R]] : i32
// CHECK-NOT: mori_shmem.
// CHECK: }

// The calls, operands in order; results feed later ops.
// CHECK-LABEL: gpu.func @k(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[M:[^:]+]]: i64, %[[P:[^:]+]]: i32, %[[Q:[^:]+]]: i32) kernel
// CHECK-NEXT: %[[NPE:.*]] = func.call @__mori_comm_node_pe_g4(%[[P]]) : (i32) -> i32
// CHECK-NEXT: func.call @__mori_comm_node_pe_g4(%[[NPE]]) : (i32) -> i32
// CHECK-NEXT: func.call @__mori_comm_node_pe_g8(%[[P]]) : (i32) -> i32
// CHECK-NEXT: func.call @__mori_comm_count_signal_w8_g4(%[[D]], %[[S]], %[[D]]) : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_device_barrier_w8_g4(%[[D]], %[[S]]) : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_device_barrier_w16_g8(%[[S]], %[[D]]) : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: %[[SENT:.*]] = func.call @__mori_comm_chunk_send(%[[D]], %[[S]], %[[N]], %[[M]], %[[D]], %[[N]], %[[NPE]], %[[Q]]) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
// CHECK-NEXT: func.call @__mori_comm_chunk_send(%[[S]], %[[D]], %[[N]], %[[M]], %[[S]], %[[SENT]], %[[P]], %[[P]])
// CHECK-NEXT: %[[GOT2:.*]] = func.call @__mori_comm_chunk_wait(%[[S]], %[[SENT]]) : (!llvm.ptr, i64) -> i32
// CHECK-NEXT: arith.addi %[[GOT2]], %[[NPE]] : i32
// CHECK-NEXT: gpu.return
// CHECK-NOT: mori_comm.
module attributes {gpu.container_module} {
  gpu.module @internode {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %m: i64, %pe: i32, %qp: i32) kernel {
      %npe = "mori_comm.node_pe"(%pe) {group_size = 4 : i64} : (i32) -> i32
      %again = "mori_comm.node_pe"(%npe) {group_size = 4 : i64} : (i32) -> i32
      %wide = "mori_comm.node_pe"(%pe) {group_size = 8 : i64} : (i32) -> i32
      "mori_comm.node_count_signal"(%d, %s, %d) {world_size = 8 : i64, group_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.node_device_barrier"(%d, %s) {world_size = 8 : i64, group_size = 4 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.node_device_barrier"(%s, %d) {world_size = 16 : i64, group_size = 8 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      %sent = "mori_comm.chunk_send"(%d, %s, %n, %m, %d, %n, %npe, %qp) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
      %more = "mori_comm.chunk_send"(%s, %d, %n, %m, %s, %sent, %pe, %pe) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, i64, i32, i32) -> i64
      %got = "mori_comm.chunk_wait"(%s, %sent) : (!llvm.ptr, i64) -> i32
      %sum = arith.addi %got, %npe : i32
      gpu.return
    }
  }
}
