// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' --split-input-file | FileCheck %s
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' --split-input-file | FileCheck %s --check-prefix=ONCE --implicit-check-not='func.func @__mori_comm_'
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=32}' --split-input-file | FileCheck %s --check-prefix=W32
// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=48}' --split-input-file 2>&1 | FileCheck %s --check-prefix=BADWAVE
// RUN: %exit-status mori-opt %s -p 'mori-comm-to-calls{wave-size=48}' --split-input-file 2>&1 | FileCheck %s --check-prefix=BADEXIT

// Each mori_comm building block becomes a func.call of a helper `__mori_comm_<block>[_variant]` that the pass
// adds to the gpu.module once per variant; the helpers' memory-ordering steps are pinned below.
// The lane count of warp-cooperative helpers comes from the wave-size option, which is 32 or 64.
// BADWAVE: error: pass 'mori-comm-to-calls' option wave-size must be 32 or 64, got 48
// BADWAVE-NOT: Traceback
// BADEXIT: exit status: 1

// Calls and helpers: two uses of a variant share one helper; another world size or K is another
// variant. Helpers are moved to the top of the gpu.module as they are created, so the last new variant
// comes first. The ONCE run forbids any other helper definition, so none is added twice.
// ONCE-LABEL: gpu.module @calls
// ONCE-NEXT: func.func @__mori_comm_accumulate_rows_f32_k1(
// ONCE: func.func @__mori_comm_accumulate_rows_bf16_k8(
// ONCE: func.func @__mori_comm_accumulate_rows_bf16_k2(
// ONCE: func.func @__mori_comm_device_barrier_w8(
// ONCE: func.func @__mori_comm_grid_barrier(
// ONCE: func.func @__mori_comm_count_signal_w4(
// ONCE: func.func @__mori_comm_count_signal_w8(
// ONCE: func.func @__mori_comm_reserve_slot(
// ONCE: func.func @__mori_comm_row_copy(
// ONCE: gpu.func @k(
// CHECK-LABEL: gpu.func @k(
// CHECK-SAME: %[[D:[^:]+]]: !llvm.ptr, %[[S:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[PE:[^:]+]]: i32) kernel
// CHECK-NEXT: func.call @__mori_comm_row_copy(%[[D]], %[[S]], %[[N]], %[[PE]]) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK-NEXT: func.call @__mori_comm_row_copy(%[[S]], %[[D]], %[[N]], %[[PE]]) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
// CHECK-NEXT: %[[SLOT:.*]] = func.call @__mori_comm_reserve_slot(%[[D]], %[[PE]]) : (!llvm.ptr, i32) -> i32
// CHECK-NEXT: %{{.*}} = arith.addi %[[SLOT]], %[[PE]] : i32
// CHECK-NEXT: func.call @__mori_comm_count_signal_w8(%[[D]], %[[S]], %[[D]]) : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_count_signal_w8(%[[S]], %[[D]], %[[S]])
// CHECK-NEXT: func.call @__mori_comm_count_signal_w4(%[[D]], %[[S]], %[[D]])
// CHECK-NEXT: func.call @__mori_comm_grid_barrier(%[[D]]) : (!llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_grid_barrier(%[[S]]) : (!llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_device_barrier_w8(%[[D]], %[[S]]) : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_device_barrier_w8(%[[S]], %[[D]]) : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_accumulate_rows_bf16_k2(%[[D]], %[[N]], %[[S]], %[[D]]) : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_accumulate_rows_bf16_k8(%[[D]], %[[N]], %[[S]], %[[S]], %[[S]], %[[S]], %[[S]], %[[S]], %[[S]], %[[S]])
// CHECK-NEXT: func.call @__mori_comm_accumulate_rows_f32_k1(%[[D]], %[[N]], %[[S]]) : (!llvm.ptr, i64, !llvm.ptr) -> ()
// CHECK-NEXT: func.call @__mori_comm_accumulate_rows_bf16_k2(%[[S]], %[[N]], %[[D]], %[[S]])
// CHECK-NEXT: gpu.return
// CHECK-NOT: mori_comm.
module attributes {gpu.container_module} {
  gpu.module @calls {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      "mori_comm.row_copy"(%s, %d, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      %slot = "mori_comm.reserve_slot"(%d, %pe) : (!llvm.ptr, i32) -> i32
      %next = arith.addi %slot, %pe : i32
      "mori_comm.count_signal"(%d, %s, %d) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.count_signal"(%s, %d, %s) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.count_signal"(%d, %s, %d) {world_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.grid_barrier"(%d) : (!llvm.ptr) -> ()
      "mori_comm.grid_barrier"(%s) : (!llvm.ptr) -> ()
      "mori_comm.device_barrier"(%d, %s) {world_size = 8 : i64, max_blocks = 1024 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.device_barrier"(%s, %d) {world_size = 8 : i64, max_blocks = 80 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.accumulate_rows"(%d, %n, %s, %d) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.accumulate_rows"(%d, %n, %s, %s, %s, %s, %s, %s, %s, %s) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.accumulate_rows"(%d, %n, %s) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()
      "mori_comm.accumulate_rows"(%s, %n, %d, %s) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// row_copy: one warp-scope put (all lanes cooperate; the library moves 16-byte vectors when aligned).
// ONCE-LABEL: gpu.module @row_copy
// ONCE-NEXT: func.func @__mori_comm_row_copy(
// ONCE: gpu.func @k(
// CHECK-LABEL: func.func @__mori_comm_row_copy(
// CHECK-SAME: %[[DST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[BYTES:[^:]+]]: i64, %[[PE:[^:]+]]: i32) {
// CHECK-NEXT: %[[QP:.*]] = arith.constant 0 : i32
// CHECK-NEXT: "mori_shmem.putmem_nbi"(%[[DST]], %[[SRC]], %[[BYTES]], %[[PE]], %[[QP]]) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: return
// CHECK-NEXT: }
// CHECK-LABEL: gpu.func @k(
// CHECK: func.call @__mori_comm_row_copy(
module attributes {gpu.container_module} {
  gpu.module @row_copy {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
  }
}

// -----

// row_copy of a constant multiple of 16 bytes (7168 = 448 vectors): the peer address once, then rounds of
// 8 lane-strided vectors, all 8 loads before the 8 stores; the rest of the row (fewer than 8 vectors for
// the lane) is one more round of 8 loads, each past the end clamped to vector 0, then 8 guarded stores,
// so a row never costs more than ceil(vectors / (8 x wave)) load round trips.
// CHECK-LABEL: func.func @__mori_comm_row_copy_vec16(
// CHECK-SAME: %[[DST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[BYTES:[^:]+]]: i64, %[[PE:[^:]+]]: i32) {
// CHECK-NEXT: %[[PEER:.*]] = "mori_shmem.ptr"(%[[DST]], %[[PE]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-NEXT: %[[NVEC:.*]] = arith.divui %[[BYTES]], %{{.*}} : i64
// CHECK: %[[O7:.*]] = arith.constant 448 : i64
// CHECK-NEXT: %[[STEP:.*]] = arith.constant 512 : i64
// CHECK-NEXT: %[[J8:.*]] = scf.while
// CHECK: } do {
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK-COUNT-8: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK-NEXT: arith.addi %{{.*}}, %[[STEP]] : i64
// CHECK-NEXT: scf.yield
// CHECK-NEXT: }
// CHECK-NEXT: %[[LEFT:.*]] = arith.cmpi ult, %[[J8]], %[[NVEC]] : i64
// CHECK-NEXT: scf.if %[[LEFT]] {
// CHECK-NEXT: %[[I0:.*]] = arith.addi %[[J8]], %{{.*}} : i64
// CHECK-NEXT: %[[IN0:.*]] = arith.cmpi ult, %[[I0]], %[[NVEC]] : i64
// CHECK-NEXT: %[[L0:.*]] = arith.select %[[IN0]], %[[I0]], %[[ZERO]] : i64
// CHECK-NEXT: %[[S0:.*]] = llvm.getelementptr %[[SRC]][%[[L0]]] : (!llvm.ptr, i64) -> !llvm.ptr, vector<4xi32>
// CHECK-NEXT: %[[V0:.*]] = llvm.load %[[S0]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-COUNT-7: llvm.load
// CHECK-NOT: llvm.load
// CHECK: scf.if %[[IN0]] {
// CHECK-NEXT: %[[D0:.*]] = llvm.getelementptr %[[PEER]][%[[I0]]] : (!llvm.ptr, i64) -> !llvm.ptr, vector<4xi32>
// CHECK-NEXT: llvm.store %[[V0]], %[[D0]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK-NEXT: }
// CHECK-COUNT-7: llvm.store
// CHECK-NOT: llvm.load
// CHECK: return
// CHECK-LABEL: gpu.func @k(
// CHECK: func.call @__mori_comm_row_copy_vec16(
// ONCE-LABEL: gpu.module @row_copy_vec16
// ONCE-NEXT: func.func @__mori_comm_row_copy_vec16(
// W32-LABEL: func.func @__mori_comm_row_copy_vec16(
// W32: arith.constant 224 : i64
// W32-NEXT: arith.constant 256 : i64
module attributes {gpu.container_module} {
  gpu.module @row_copy_vec16 {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32) kernel {
      %n = arith.constant 7168 : i64
      "mori_comm.row_copy"(%d, %s, %n, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
  }
}

// -----

// row_copy_to_peers, K = 2 destinations: each lane resolves its own destination (mori_shmem.ptr of its
// row on its PE, or on our PE when it does not send: no out-of-range table read); lane k's flag and
// address (two 32-bit halves) are broadcast by shuffles; every round loads 8 vectors once, then stores
// them to each sending destination (8 stores per destination, behind its flag).
// CHECK-LABEL: func.func @__mori_comm_row_copy_to_peers_k2(
// CHECK-SAME: %[[DST:[^:]+]]: !llvm.ptr, %[[SRC:[^:]+]]: !llvm.ptr, %[[BYTES:[^:]+]]: i64, %[[PE:[^:]+]]: i32, %[[SEND:[^:]+]]: i1) {
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[PES:.*]] = arith.select %[[SEND]], %[[PE]], %[[ME]] : i32
// CHECK-NEXT: %[[PEER:.*]] = "mori_shmem.ptr"(%[[DST]], %[[PES]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK-COUNT-3: gpu.shuffle idx
// CHECK: %[[D0:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr
// CHECK-COUNT-3: gpu.shuffle idx
// CHECK: %[[D1:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr
// CHECK-NOT: gpu.shuffle
// CHECK: scf.while
// CHECK: } do {
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK: scf.if
// CHECK-COUNT-8: llvm.getelementptr %[[D0]][%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, vector<4xi32>
// CHECK: scf.if
// CHECK-COUNT-8: llvm.getelementptr %[[D1]][%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK: scf.yield
// The tail round: 8 clamped loads, then per destination 8 stores guarded by the unit's range.
// CHECK: scf.if
// CHECK-COUNT-8: llvm.load
// CHECK-NOT: llvm.load
// CHECK: return
// ONCE-LABEL: gpu.module @row_copy_to_peers
// ONCE-NEXT: func.func @__mori_comm_row_copy_to_peers_k2(
module attributes {gpu.container_module} {
  gpu.module @row_copy_to_peers {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32, %send: i1) kernel {
      %n = arith.constant 7168 : i64
      "mori_comm.row_copy_to_peers"(%d, %s, %n, %pe, %send) {max_peers = 2 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}

// -----

// reserve_slot: a relaxed system-scope fetch-add of 1 on the peer's 32-bit counter; the old value is the slot.
// CHECK-LABEL: func.func @__mori_comm_reserve_slot(
// CHECK-SAME: %[[CTR:[^:]+]]: !llvm.ptr, %[[PE:[^:]+]]: i32) -> i32 {
// CHECK-NEXT: %[[QP:.*]] = arith.constant 0 : i32
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT: %[[OLD:.*]] = "mori_shmem.atomic_fetch_add"(%[[CTR]], %[[ONE]], %[[PE]], %[[QP]]) {elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> i32
// CHECK-NEXT: return %[[OLD]] : i32
// CHECK-LABEL: gpu.func @k(
// CHECK: %[[SLOT:.*]] = func.call @__mori_comm_reserve_slot(%{{.*}}, %{{.*}}) : (!llvm.ptr, i32) -> i32
// CHECK-NEXT: llvm.store %[[SLOT]]
// ONCE-LABEL: gpu.module @reserve_slot
// ONCE-NEXT: func.func @__mori_comm_reserve_slot(
module attributes {gpu.container_module} {
  gpu.module @reserve_slot {
    gpu.func @k(%c: !llvm.ptr, %pe: i32) kernel {
      %slot = "mori_comm.reserve_slot"(%c, %pe) : (!llvm.ptr, i32) -> i32
      llvm.store %slot, %c : i32, !llvm.ptr
      gpu.return
    }
  }
}

// -----

// count_signal (world 8): lane p < 8 talks to PE p. Send: poll PE p's slot signals[me] (through its
// mori_shmem.ptr address) until it is 0 (flow control), fence (release: an LLVM system-scope fence, the peers
// are P2P), store count + 1 there. Then the local count is reset. Receive: poll our signals[p] until > 0,
// fence (acquire), reset it to 0; the warp
// sums the received counts (xor shuffles over the wave) and lane 0 stores the total.
// CHECK-LABEL: func.func @__mori_comm_count_signal_w8(
// CHECK-SAME: %[[SIG:[^:]+]]: !llvm.ptr, %[[CNT:[^:]+]]: !llvm.ptr, %[[TOT:[^:]+]]: !llvm.ptr) {
// CHECK: %[[LANE_X:.*]] = gpu.lane_id
// CHECK-NEXT: %[[LANE:.*]] = arith.index_cast %[[LANE_X]] : index to i32
// CHECK-NEXT: %[[W:.*]] = arith.constant 8 : i32
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[ACTIVE:.*]] = arith.cmpi ult, %[[LANE]], %[[W]] : i32
// CHECK-NEXT: %[[GOT:.*]] = scf.if %[[ACTIVE]] -> (i32) {
// CHECK-NEXT: %[[MYSLOT:.*]] = llvm.getelementptr %[[SIG]][%[[ME]]] : (!llvm.ptr, i32) -> !llvm.ptr, i64
// CHECK-NEXT: %[[PEERSLOT:.*]] = "mori_shmem.ptr"(%[[MYSLOT]], %[[LANE]]) : (!llvm.ptr, i32) -> !llvm.ptr
// CHECK-NEXT: %[[Z:.*]] = arith.constant 0 : i64
// CHECK-NEXT: %{{.*}} = "mori_shmem.wait_until"(%[[PEERSLOT]], %[[Z]]) {cmp = "equals", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: %[[CNTP:.*]] = llvm.getelementptr %[[CNT]][%[[LANE]]] : (!llvm.ptr, i32) -> !llvm.ptr, i32
// CHECK-NEXT: %[[C:.*]] = llvm.load %[[CNTP]] : !llvm.ptr -> i32
// CHECK-NEXT: %[[C64:.*]] = arith.extui %[[C]] : i32 to i64
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-NEXT: %[[V:.*]] = arith.addi %[[C64]], %[[ONE]] : i64
// CHECK-NEXT: llvm.fence release
// CHECK-NEXT: "mori_shmem.p"(%[[MYSLOT]], %[[V]], %[[LANE]], %{{.*}}) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: %[[Z32:.*]] = arith.constant 0 : i32
// CHECK-NEXT: llvm.store %[[Z32]], %[[CNTP]] : i32, !llvm.ptr
// CHECK-NEXT: %[[INSLOT:.*]] = llvm.getelementptr %[[SIG]][%[[LANE]]] : (!llvm.ptr, i32) -> !llvm.ptr, i64
// CHECK-NEXT: %[[SEEN:.*]] = "mori_shmem.wait_until"(%[[INSLOT]], %[[Z]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: llvm.fence acquire
// CHECK-NEXT: "mori_shmem.p"(%[[INSLOT]], %[[Z]], %[[ME]], %{{.*}}) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: %[[R64:.*]] = arith.subi %[[SEEN]], %[[ONE]] : i64
// CHECK-NEXT: %[[R:.*]] = arith.trunci %[[R64]] : i64 to i32
// CHECK-NEXT: scf.yield %[[R]] : i32
// CHECK-NEXT: } else {
// CHECK: %[[WIDTH:.*]] = arith.constant 64 : i32
// CHECK-NEXT: %[[O32:.*]] = arith.constant 32 : i32
// CHECK-NEXT: %[[S32:.*]], %{{.*}} = gpu.shuffle xor %[[GOT]], %[[O32]], %[[WIDTH]] : i32
// CHECK-NEXT: %[[A32:.*]] = arith.addi %[[GOT]], %[[S32]] : i32
// CHECK: gpu.shuffle xor %{{.*}}, %{{.*}}, %[[WIDTH]] : i32
// CHECK: %[[O1:.*]] = arith.constant 1 : i32
// CHECK-NEXT: %[[S1:.*]], %{{.*}} = gpu.shuffle xor %[[A2:.*]], %[[O1]], %[[WIDTH]] : i32
// CHECK-NEXT: %[[SUM:.*]] = arith.addi %[[A2]], %[[S1]] : i32
// CHECK: scf.if
// CHECK-NEXT: llvm.store %[[SUM]], %[[TOT]] : i32, !llvm.ptr
// CHECK-NEXT: }
// CHECK-NEXT: return
// Under wave-size=32 the sum starts at offset 16 and the shuffles are 32 lanes wide.
// W32-LABEL: func.func @__mori_comm_count_signal_w8(
// W32: %[[WIDTH:.*]] = arith.constant 32 : i32
// W32-NEXT: %[[O16:.*]] = arith.constant 16 : i32
// W32-NEXT: gpu.shuffle xor %{{.*}}, %[[O16]], %[[WIDTH]] : i32
// W32-NOT: arith.constant 32 : i32
// W32: return
// ONCE-LABEL: gpu.module @count_signal
// ONCE-NEXT: func.func @__mori_comm_count_signal_w8(
module attributes {gpu.container_module} {
  gpu.module @count_signal {
    gpu.func @k(%sig: !llvm.ptr, %cnt: !llvm.ptr, %tot: !llvm.ptr) kernel {
      "mori_comm.count_signal"(%sig, %cnt, %tot) {world_size = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// grid_barrier: the block meets; thread 0 reads the generation g, fences (release), adds 1 to the
// arrivals (u64, system scope). The last arriver resets the arrivals to 0 and, after a fence, publishes
// g + 1; the others poll the generation until it passes g. A fence (acquire), and the block meets again.
// CHECK-LABEL: func.func @__mori_comm_grid_barrier(
// CHECK-SAME: %[[CTR:[^:]+]]: !llvm.ptr) {
// CHECK-NEXT: %[[QP:.*]] = arith.constant 0 : i32
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT: %[[C0:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[LEADER:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK-NEXT: scf.if %[[LEADER]] {
// CHECK-NEXT: %[[NB_X:.*]] = gpu.grid_dim x
// CHECK-NEXT: %[[NB:.*]] = arith.index_cast %[[NB_X]] : index to i64
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-NEXT: %[[GENP:.*]] = llvm.getelementptr %[[CTR]][1] : (!llvm.ptr) -> !llvm.ptr, i64
// CHECK-NEXT: %[[G:.*]] = llvm.load %[[GENP]] atomic monotonic {alignment = 8 : i64} : !llvm.ptr -> i64
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: %[[OLD:.*]] = "mori_shmem.atomic_fetch_add"(%[[CTR]], %[[ONE]], %[[ME]], %[[QP]]) {elem = "uint64"} : (!llvm.ptr, i64, i32, i32) -> i64
// CHECK-NEXT: %[[LASTN:.*]] = arith.subi %[[NB]], %[[ONE]] : i64
// CHECK-NEXT: %[[LAST:.*]] = arith.cmpi eq, %[[OLD]], %[[LASTN]] : i64
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK-NEXT: "mori_shmem.p"(%[[CTR]], %[[ZERO]], %[[ME]], %[[QP]]) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: %[[G1:.*]] = arith.addi %[[G]], %[[ONE]] : i64
// CHECK-NEXT: "mori_shmem.p"(%[[GENP]], %[[G1]], %[[ME]], %[[QP]]) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: } else {
// CHECK-NEXT: %{{.*}} = "mori_shmem.wait_until"(%[[GENP]], %[[G]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: }
// CHECK-NEXT: "mori_shmem.fence"() : () -> ()
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: return
// ONCE-LABEL: gpu.module @grid_barrier
// ONCE-NEXT: func.func @__mori_comm_grid_barrier(
module attributes {gpu.container_module} {
  gpu.module @grid_barrier {
    gpu.func @k(%c: !llvm.ptr) kernel {
      "mori_comm.grid_barrier"(%c) : (!llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// device_barrier (world 8): every thread reads epoch e0 = epochs[b] before the block meets; thread 0
// stores e = e0 + 1 back. Threads p < 8: fence (release), store e into slots[b][me] on PE p, poll our
// slots[b][p] until > e - 1, fence (acquire). The block meets again.
// CHECK-LABEL: func.func @__mori_comm_device_barrier_w8(
// CHECK-SAME: %[[SLOTS:[^:]+]]: !llvm.ptr, %[[EPOCHS:[^:]+]]: !llvm.ptr) {
// CHECK-NEXT: %[[QP:.*]] = arith.constant 0 : i32
// CHECK-NEXT: %[[B_X:.*]] = gpu.block_id x
// CHECK-NEXT: %[[B:.*]] = arith.index_cast %[[B_X]] : index to i64
// CHECK-NEXT: %[[EPP:.*]] = llvm.getelementptr %[[EPOCHS]][%[[B]]] : (!llvm.ptr, i64) -> !llvm.ptr, i64
// CHECK-NEXT: %[[E0:.*]] = llvm.load %[[EPP]] : !llvm.ptr -> i64
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-NEXT: %[[E:.*]] = arith.addi %[[E0]], %[[ONE]] : i64
// CHECK-NEXT: %[[TID_X:.*]] = gpu.thread_id x
// CHECK-NEXT: %[[TID:.*]] = arith.index_cast %[[TID_X]] : index to i32
// CHECK: scf.if %{{.*}} {
// CHECK-NEXT: llvm.store %[[E]], %[[EPP]] : i64, !llvm.ptr
// CHECK-NEXT: }
// CHECK-NEXT: %[[W:.*]] = arith.constant 8 : i32
// CHECK-NEXT: %[[W64:.*]] = arith.constant 8 : i64
// CHECK-NEXT: %[[TALKER:.*]] = arith.cmpi ult, %[[TID]], %[[W]] : i32
// CHECK-NEXT: scf.if %[[TALKER]] {
// CHECK-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CHECK-NEXT: %[[ME64:.*]] = arith.extui %[[ME]] : i32 to i64
// CHECK-NEXT: %[[P64:.*]] = arith.extui %[[TID]] : i32 to i64
// CHECK-NEXT: %[[ROW:.*]] = arith.muli %[[B]], %[[W64]] : i64
// CHECK-NEXT: %[[MINE:.*]] = arith.addi %[[ROW]], %[[ME64]] : i64
// CHECK-NEXT: %[[OUT:.*]] = llvm.getelementptr %[[SLOTS]][%[[MINE]]] : (!llvm.ptr, i64) -> !llvm.ptr, i64
// CHECK-NEXT: llvm.fence release
// CHECK-NEXT: "mori_shmem.p"(%[[OUT]], %[[E]], %[[TID]], %[[QP]]) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
// CHECK-NEXT: %[[THEIRS:.*]] = arith.addi %[[ROW]], %[[P64]] : i64
// CHECK-NEXT: %[[IN:.*]] = llvm.getelementptr %[[SLOTS]][%[[THEIRS]]] : (!llvm.ptr, i64) -> !llvm.ptr, i64
// CHECK-NEXT: %[[BELOW:.*]] = arith.subi %[[E]], %[[ONE]] : i64
// CHECK-NEXT: %{{.*}} = "mori_shmem.wait_until"(%[[IN]], %[[BELOW]]) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
// CHECK-NEXT: llvm.fence acquire
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: return
// ONCE-LABEL: gpu.module @device_barrier
// ONCE-NEXT: func.func @__mori_comm_device_barrier_w8(
module attributes {gpu.container_module} {
  gpu.module @device_barrier {
    gpu.func @k(%slots: !llvm.ptr, %epochs: !llvm.ptr) kernel {
      "mori_comm.device_barrier"(%slots, %epochs) {world_size = 8 : i64, max_blocks = 1024 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// accumulate_rows bf16, K = 3: lane-strided 16-byte vectors (8 bf16), step = wave. All K loads of a
// vector come first, then the widening to f32, the K - 1 adds and one rounding back to bf16; one store.
// CHECK-LABEL: func.func @__mori_comm_accumulate_rows_bf16_k3(
// CHECK-SAME: %[[OUT:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[S0:[^:]+]]: !llvm.ptr, %[[S1:[^:]+]]: !llvm.ptr, %[[S2:[^:]+]]: !llvm.ptr) {
// CHECK: %[[PER:.*]] = arith.constant 8 : i64
// CHECK-NEXT: %[[NVEC:.*]] = arith.divui %[[N]], %[[PER]] : i64
// CHECK: %[[UB:.*]] = arith.index_cast %[[NVEC]] : i64 to index
// CHECK-NEXT: %[[STEP:.*]] = arith.constant 64 : index
// CHECK: scf.for %[[J:.*]] = %{{.*}} to %[[UB]] step %[[STEP]] {
// CHECK-NEXT: %[[J64:.*]] = arith.index_cast %[[J]] : index to i64
// CHECK-NEXT: %[[OFF:.*]] = arith.muli %[[J64]], %{{.*}} : i64
// CHECK-NEXT: %[[P0:.*]] = llvm.getelementptr %[[S0]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: %[[L0:.*]] = llvm.load %[[P0]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NEXT: %[[P1:.*]] = llvm.getelementptr %[[S1]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: %[[L1:.*]] = llvm.load %[[P1]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NEXT: %[[P2:.*]] = llvm.getelementptr %[[S2]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: %[[L2:.*]] = llvm.load %[[P2]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NEXT: %[[C0:.*]] = llvm.bitcast %[[L0]] : vector<4xi32> to vector<8xbf16>
// CHECK-NEXT: %[[F0:.*]] = arith.extf %[[C0]] : vector<8xbf16> to vector<8xf32>
// CHECK-NEXT: %[[C1:.*]] = llvm.bitcast %[[L1]] : vector<4xi32> to vector<8xbf16>
// CHECK-NEXT: %[[F1:.*]] = arith.extf %[[C1]] : vector<8xbf16> to vector<8xf32>
// CHECK-NEXT: %[[C2:.*]] = llvm.bitcast %[[L2]] : vector<4xi32> to vector<8xbf16>
// CHECK-NEXT: %[[F2:.*]] = arith.extf %[[C2]] : vector<8xbf16> to vector<8xf32>
// CHECK-NEXT: %[[A1:.*]] = arith.addf %[[F0]], %[[F1]] : vector<8xf32>
// CHECK-NEXT: %[[A2:.*]] = arith.addf %[[A1]], %[[F2]] : vector<8xf32>
// CHECK-NEXT: %[[T:.*]] = arith.truncf %[[A2]] : vector<8xf32> to vector<8xbf16>
// CHECK-NEXT: %[[R:.*]] = llvm.bitcast %[[T]] : vector<8xbf16> to vector<4xi32>
// CHECK-NEXT: %[[PO:.*]] = llvm.getelementptr %[[OUT]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: llvm.store %[[R]], %[[PO]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK-NEXT: }
// CHECK-NEXT: return
// W32-LABEL: func.func @__mori_comm_accumulate_rows_bf16_k3(
// W32: %[[STEP:.*]] = arith.constant 32 : index
// W32: scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %[[STEP]] {
// ONCE-LABEL: gpu.module @accumulate_bf16
// ONCE-NEXT: func.func @__mori_comm_accumulate_rows_bf16_k3(
module attributes {gpu.container_module} {
  gpu.module @accumulate_bf16 {
    gpu.func @k(%out: !llvm.ptr, %n: i64, %a: !llvm.ptr, %b: !llvm.ptr, %c: !llvm.ptr) kernel {
      "mori_comm.accumulate_rows"(%out, %n, %a, %b, %c) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// accumulate_rows f32, K = 2: 4 floats per vector; the K loads first, no extf/truncf (bitcasts), one
// store per vector.
// CHECK-LABEL: func.func @__mori_comm_accumulate_rows_f32_k2(
// CHECK-SAME: %[[OUT:[^:]+]]: !llvm.ptr, %[[N:[^:]+]]: i64, %[[S0:[^:]+]]: !llvm.ptr, %[[S1:[^:]+]]: !llvm.ptr) {
// CHECK: %[[PER:.*]] = arith.constant 4 : i64
// CHECK-NEXT: arith.divui %[[N]], %[[PER]] : i64
// CHECK: scf.for
// CHECK: %[[OFF:.*]] = arith.muli %{{.*}}, %{{.*}} : i64
// CHECK-NEXT: %[[P0:.*]] = llvm.getelementptr %[[S0]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: %[[L0:.*]] = llvm.load %[[P0]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NEXT: %[[P1:.*]] = llvm.getelementptr %[[S1]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: %[[L1:.*]] = llvm.load %[[P1]] {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK-NOT: arith.extf
// CHECK: %[[F0:.*]] = llvm.bitcast %[[L0]] : vector<4xi32> to vector<4xf32>
// CHECK: %[[F1:.*]] = llvm.bitcast %[[L1]] : vector<4xi32> to vector<4xf32>
// CHECK-NEXT: %[[A1:.*]] = arith.addf %[[F0]], %[[F1]] : vector<4xf32>
// CHECK-NEXT: %[[R:.*]] = llvm.bitcast %[[A1]] : vector<4xf32> to vector<4xi32>
// CHECK-NEXT: %[[PO:.*]] = llvm.getelementptr %[[OUT]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK-NEXT: llvm.store %[[R]], %[[PO]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// ONCE-LABEL: gpu.module @accumulate_f32
// ONCE-NEXT: func.func @__mori_comm_accumulate_rows_f32_k2(
module attributes {gpu.container_module} {
  gpu.module @accumulate_f32 {
    gpu.func @k(%out: !llvm.ptr, %n: i64, %a: !llvm.ptr, %b: !llvm.ptr) kernel {
      "mori_comm.accumulate_rows"(%out, %n, %a, %b) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A helper that already exists in the gpu.module (from an earlier run) is reused, not added again.
// ONCE-LABEL: gpu.module @existing
// ONCE-NEXT: func.func @__mori_comm_grid_barrier(
// ONCE: gpu.func @k(
// CHECK-LABEL: gpu.module @existing
// CHECK: func.func @__mori_comm_grid_barrier(%{{.*}}: !llvm.ptr) {
// CHECK-NEXT: return
// CHECK: gpu.func @k(%[[C:.*]]: !llvm.ptr) kernel
// CHECK-NEXT: func.call @__mori_comm_grid_barrier(%[[C]]) : (!llvm.ptr) -> ()
module attributes {gpu.container_module} {
  gpu.module @existing {
    func.func @__mori_comm_grid_barrier(%c: !llvm.ptr) {
      return
    }
    gpu.func @k(%c: !llvm.ptr) kernel {
      "mori_comm.grid_barrier"(%c) : (!llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A runtime row size masked with andi -16 (how the EP kernels state the call's row bytes, hidden * elem)
// is a multiple of 16 by construction: row_copy takes the 16-byte vector helper and row_copy_to_peers is
// accepted; the size is passed at run time.
// CHECK-LABEL: gpu.func @runtime_row(
// CHECK: %[[ROW:.*]] = arith.andi %{{.*}}, %{{.*}} : i64
// CHECK: func.call @__mori_comm_row_copy_vec16(%{{.*}}, %{{.*}}, %[[ROW]], %{{.*}})
// CHECK: func.call @__mori_comm_row_copy_to_peers_k2(%{{.*}}, %{{.*}}, %[[ROW]], %{{.*}}, %{{.*}})
// ONCE-LABEL: gpu.module @runtime_rows
// ONCE-DAG: func.func @__mori_comm_row_copy_vec16(
// ONCE-DAG: func.func @__mori_comm_row_copy_to_peers_k2(
module attributes {gpu.container_module} {
  gpu.module @runtime_rows {
    gpu.func @runtime_row(%d: !llvm.ptr, %s: !llvm.ptr, %pe: i32, %send: i1, %hidden: i32) kernel {
      %h = arith.extui %hidden : i32 to i64
      %two = arith.constant 2 : i64
      %wide = arith.muli %h, %two : i64
      %mask = arith.constant -16 : i64
      %row = arith.andi %wide, %mask : i64
      "mori_comm.row_copy"(%d, %s, %row, %pe) : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      "mori_comm.row_copy_to_peers"(%d, %s, %row, %pe, %send) {max_peers = 2 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()
      gpu.return
    }
  }
}
