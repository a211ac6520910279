// RUN: mori-opt %s -p 'mori-coll-to-kernels{wave-size=64},mori-trace-to-timer{enabled=false wave-size=64}' | FileCheck %s --implicit-check-not=mori_coll.
// RUN: mori-opt %s -p 'mori-coll-to-kernels{wave-size=64}' | FileCheck %s --check-prefix=TRACE
// RUN: mori-opt %s -p 'mori-coll-to-kernels{wave-size=32},mori-comm-to-calls{wave-size=32}' | FileCheck %s --check-prefix=CALLS
// RUN: mori-opt %s -p 'mori-coll-to-kernels{wave-size=64 one-gpu=true}' | FileCheck %s --check-prefix=ONEGPU --implicit-check-not=mori_comm.device_barrier
// RUN: mori-opt %s -p 'mori-coll-to-kernels{wave-size=64 one-gpu=true one-launch=true}' | FileCheck %s --check-prefix=ONELAUNCH --implicit-check-not=mori_comm.device_barrier

// The expansion of each collective (passes/coll_kernels.py; protocols: docs/collectives.md), world 4:
// place (the input read in place, or staged: copy_bytes into this PE's workspace; thread 0 stores the
// place's offset into sources[b]) -> device_barrier -> pull / reduce from the peers' places (mori_shmem.ptr
// of the workspace + the offset each lane read) -> device_barrier (the places are free for the next call).
// The movers (all_gather, broadcast, all_to_all) split their first meet: barrier_arrive, this PE's own
// part, barrier_wait.
// No mori_coll op is left (implicit-check-not); the slots are the workspace's start, the epochs at
// 8 x max_blocks x W = 1024, sources[b] at 1280 + 8 b, the stage at 1536.
// The phases carry trace points (compiled out here by mori-trace-to-timer{enabled=false}; kept by the TRACE
// run): "stage", then per barrier k "meet<k>", between barriers "step<k>", nothing after the closing one.

// With one-gpu (virtual PEs: every PE on this GPU) every meet is a one_gpu_barrier or a barrier_arrive /
// barrier_wait of scope "gpu" (fences at the GPU's scope), of the same operands; no device_barrier is left.
// ONEGPU-LABEL: gpu.func @coll_all_gather_u8_w4_n100(
// ONEGPU:         "mori_comm.barrier_arrive"(%arg2, %{{.+}}) {max_blocks = 32 : i64, scope = "gpu", world_size = 4 : i64}
// ONEGPU:         "mori_comm.barrier_wait"(%arg2, %{{.+}}) {scope = "gpu", world_size = 4 : i64}
// ONEGPU:         "mori_comm.one_gpu_barrier"(%arg2, %{{.+}}) {max_blocks = 32 : i64, world_size = 4 : i64}
// ONEGPU:         gpu.return
// ONEGPU-LABEL: gpu.func @coll_all_reduce_two_shot_bf16_w4_n100(
// ONEGPU:         "mori_comm.one_gpu_barrier"
// ONEGPU:         "mori_comm.barrier_arrive"({{.+}}scope = "gpu"
// ONEGPU:         "mori_comm.barrier_wait"({{.+}}scope = "gpu"
// ONEGPU:         "mori_comm.one_gpu_barrier"

// With one-launch too (virtual PEs: every PE is a part of one launch, whose end closes the call): no
// closing barrier; the kernel ends after the last step (its trace point kept: no mori-trace-to-timer here).
// ONELAUNCH-LABEL: gpu.func @coll_all_gather_u8_w4_n100(
// ONELAUNCH-NOT:     "mori_comm.one_gpu_barrier"
// ONELAUNCH:         "mori_comm.barrier_arrive"(%arg2, %{{.+}}) {max_blocks = 32 : i64, scope = "gpu", world_size = 4 : i64}
// ONELAUNCH:         "mori_comm.barrier_wait"(%arg2, %{{.+}}) {scope = "gpu", world_size = 4 : i64}
// ONELAUNCH-NOT:     "mori_comm.one_gpu_barrier"
// ONELAUNCH:         scf.for
// ONELAUNCH-NOT:     "mori_comm.one_gpu_barrier"
// ONELAUNCH:         "mori_comm.trace"() {event = "step1", phase = "end"}
// ONELAUNCH-NEXT:    gpu.return
// ONELAUNCH-LABEL: gpu.func @coll_all_reduce_two_shot_bf16_w4_n100(
// ONELAUNCH:         "mori_comm.one_gpu_barrier"
// ONELAUNCH:         "mori_comm.barrier_arrive"({{.+}}scope = "gpu"
// ONELAUNCH:         "mori_comm.barrier_wait"({{.+}}scope = "gpu"
// ONELAUNCH-NOT:     "mori_comm.one_gpu_barrier"
// ONELAUNCH:         "mori_comm.trace"() {event = "step2", phase = "end"}
// ONELAUNCH-NEXT:    gpu.return

// TRACE-LABEL: gpu.func @coll_all_gather_u8_w4_n100(
// TRACE:         "mori_comm.trace"() {event = "stage", phase = "begin"}
// TRACE:         "mori_comm.copy_bytes"
// TRACE:         llvm.store {{.+}} {alignment = 8 : i64} : i64, !llvm.ptr
// TRACE-NEXT:    }
// TRACE-NEXT:    "mori_comm.trace"() {event = "stage", phase = "end"}
// TRACE-NEXT:    "mori_comm.trace"() {event = "meet0", phase = "begin"}
// TRACE-NEXT:    "mori_comm.barrier_arrive"
// TRACE:         "mori_comm.copy_bytes"
// TRACE:         "mori_comm.barrier_wait"
// TRACE-NEXT:    "mori_comm.trace"() {event = "meet0", phase = "end"}
// TRACE:         "mori_comm.trace"() {event = "step1", phase = "begin"}
// TRACE:         scf.for
// TRACE:         }
// TRACE:         "mori_comm.trace"() {event = "step1", phase = "end"}
// TRACE-NEXT:    "mori_comm.trace"() {event = "meet1", phase = "begin"}
// TRACE-NEXT:    "mori_comm.device_barrier"
// TRACE-NEXT:    "mori_comm.trace"() {event = "meet1", phase = "end"}
// TRACE-NEXT:    gpu.return

module attributes {gpu.container_module} {
  gpu.module @mori_coll {
    // CHECK-LABEL: gpu.func @coll_all_gather_u8_w4_n100(
    // CHECK-SAME:    %[[IN:[a-z0-9]+]]: !llvm.ptr, %[[OUT:[a-z0-9]+]]: !llvm.ptr, %[[WS:[a-z0-9]+]]: !llvm.ptr)
    // The kernel's grid limit (its op's max_blocks; the bundle records it, the launcher checks it).
    // CHECK-SAME:    kernel attributes {known_block_size = array<i32: 256, 1, 1>, mori.max_blocks = 32 : i64}
    // CHECK:         %[[ME:.+]] = "mori_shmem.my_pe"()
    // CHECK:         %[[EPOCHS:.+]] = llvm.getelementptr %[[WS]][%c1024_i64]
    // CHECK:         %[[STAGE:.+]] = llvm.getelementptr %[[WS]][%c1536_i64]
    // This block's sources[b] (the workspace at 1280 + 8 b); lane l translates the workspace to PE (l mod 4)
    // once, at the start (with the placing's translations, before any wait).
    // CHECK:         %[[ROW_AT:.+]] = arith.addi %{{.+}}, %c1280_i64 : i64
    // CHECK-NEXT:    %[[SOURCES:.+]] = llvm.getelementptr %[[WS]][%[[ROW_AT]]]
    // CHECK:         %[[LANE_PE:.+]] = arith.remui
    // CHECK-NEXT:    %[[THEIR_WS:.+]] = "mori_shmem.ptr"(%[[WS]], %[[LANE_PE]])
    // In place? The input's first and last byte in the heap (translated to PE me + 1), 16-byte aligned,
    // apart from the output or exactly out[me * 100].
    // CHECK:         %[[LAST:.+]] = llvm.getelementptr %[[IN]][%c99_i64]
    // CHECK-NEXT:    %[[FIRST_PEER:.+]] = "mori_shmem.ptr"(%[[IN]], %{{.+}})
    // CHECK-NEXT:    llvm.icmp "ne" %[[FIRST_PEER]]
    // CHECK-NEXT:    %[[LAST_PEER:.+]] = "mori_shmem.ptr"(%[[LAST]], %{{.+}})
    // CHECK-NEXT:    llvm.icmp "ne" %[[LAST_PEER]]
    // CHECK:         arith.cmpi ule
    // CHECK:         arith.cmpi ule
    // CHECK:         %[[OWN:.+]] = arith.cmpi eq, %{{.+}}, %{{.+}} : i64
    // CHECK:         arith.andi
    // CHECK-NEXT:    %[[DIRECT:.+]] = arith.andi
    // CHECK-NEXT:    %true = arith.constant true
    // CHECK-NEXT:    %[[STAGED:.+]] = arith.xori %[[DIRECT]], %true
    // Not in place: this unit's pieces of the input into this PE's stage: pieces of min(512 vectors (one
    // 64-lane round of copy_bytes), ceil(vectors / U)) vectors (32-bit divisions), unit u's u, u + U, ...
    // CHECK-NEXT:    scf.if %[[STAGED]] {
    // CHECK:           %[[PER:.+]] = arith.divui %{{.+}}, %[[UNITS:.+]] : i32
    // CHECK:           %[[VECS:.+]] = arith.minui %{{.+}}, %c512_i32{{.*}} : i32
    // CHECK:           %[[COUNT:.+]] = arith.divui %{{.+}}, %[[VECS]] : i32
    // CHECK:           %[[FIRST:.+]] = arith.index_cast %{{.+}} : i32 to index
    // CHECK-NEXT:      %[[END:.+]] = arith.index_cast %[[COUNT]] : i32 to index
    // CHECK-NEXT:      %[[STEP:.+]] = arith.index_cast %[[UNITS]] : i32 to index
    // CHECK-NEXT:      scf.for %{{.+}} = %[[FIRST]] to %[[END]] step %[[STEP]] {
    // CHECK:             %[[SRC:.+]] = llvm.getelementptr %[[IN]][
    // CHECK-NEXT:        "mori_comm.copy_bytes"(%{{.+}}, %[[SRC]], %{{.+}})
    // CHECK:         }
    // CHECK:         %[[IN_AT:.+]] = arith.subi
    // CHECK-NEXT:    %[[PLACE:.+]] = arith.select %[[DIRECT]], %[[IN_AT]], %c1536_i64
    // CHECK:         scf.if
    // CHECK-NEXT:      llvm.store %[[PLACE]], %[[SOURCES]] {alignment = 8 : i64} : i64, !llvm.ptr
    // The first meet in halves: arrive (publishes the place and the staged pieces), the first half of this
    // PE's own part (its input into out[me * 100]: the first ceil(J / 2) of the unit's J pieces, u + k U),
    // wait.
    // CHECK:         %[[E:.+]] = "mori_comm.barrier_arrive"(%[[WS]], %[[EPOCHS]]) {max_blocks = 32 : i64, scope = "system", world_size = 4 : i64}
    // CHECK:         %[[HALF_J:.+]] = arith.shrui %{{.+}}, %c1_i32{{.*}} : i32
    // CHECK-NEXT:    %[[HALF_SPAN:.+]] = arith.muli %[[HALF_J]], %{{.+}} : i32
    // CHECK-NEXT:    %[[SPLIT:.+]] = arith.addi %{{.+}}, %[[HALF_SPAN]] : i32
    // CHECK:         %[[TO_SPLIT:.+]] = arith.index_cast %[[SPLIT]] : i32 to index
    // CHECK:         scf.for %{{.+}} = %{{.+}} to %[[TO_SPLIT]] step
    // CHECK:           llvm.getelementptr %[[IN]][
    // CHECK-NEXT:      "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.barrier_wait"(%[[WS]], %[[E]]) {scope = "system", world_size = 4 : i64}
    // Right after it lane l issues the load of PE (l mod 4)'s sources[b]; the own part's second half
    // (the unit's other pieces) fills its round trip.
    // CHECK-NEXT:    %[[THEIRS:.+]] = llvm.getelementptr %[[THEIR_WS]][%[[ROW_AT]]]
    // CHECK-NEXT:    %[[WORD:.+]] = llvm.load %[[THEIRS]] {alignment = 8 : i64} : !llvm.ptr -> i64
    // CHECK:         scf.for
    // CHECK:           llvm.getelementptr %[[IN]][
    // CHECK-NEXT:      "mori_comm.copy_bytes"
    // CHECK:         }
    // Pull: PE (me + i) % 4 for i = 1 .. 3 (the peers): its place (its workspace plus the word, made where
    // used) shuffled from its lane (no translation in the loop), into out[p * 100].
    // CHECK:         scf.for %{{.+}} = %c1 to %c4 step
    // CHECK:           %[[P:.+]] = arith.remui
    // CHECK-NOT:       mori_shmem.ptr
    // CHECK:           llvm.getelementptr %[[THEIR_WS]][%[[WORD]]]
    // CHECK:           gpu.shuffle  idx %{{.+}}, %[[P]]
    // CHECK:           gpu.shuffle  idx %{{.+}}, %[[P]]
    // CHECK-NOT:       mori_shmem.ptr
    // CHECK:           %[[FROM:.+]] = llvm.inttoptr
    // CHECK:           scf.for
    // CHECK:             %[[FROM_SLICE:.+]] = llvm.getelementptr %[[FROM]][
    // CHECK-NEXT:        "mori_comm.copy_bytes"(%{{.+}}, %[[FROM_SLICE]], %{{.+}})
    // CHECK:         }
    // The closing meet: every peer has read this PE's place (free for the next call).
    // CHECK:         "mori_comm.device_barrier"(%[[WS]], %[[EPOCHS]]) {max_blocks = 32 : i64, world_size = 4 : i64}
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_all_gather_u8_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_gather"(%input, %output, %workspace) {dtype = "u8", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // Only the root (PE 3) places its input; the root copies its own in the first meet's halves; the other
    // PEs pull from the root's place.
    // CHECK-LABEL: gpu.func @coll_broadcast_root3_f32_w4_n100(
    // CHECK:         %[[ME:.+]] = "mori_shmem.my_pe"()
    // CHECK:         %[[ROOT:.+]] = arith.constant 3 : i32
    // CHECK:         %[[IS_ROOT:.+]] = arith.cmpi eq, %[[ME]], %[[ROOT]]
    // CHECK-NEXT:    scf.if %[[IS_ROOT]] {
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:           llvm.store
    // CHECK:         }
    // CHECK:         "mori_comm.barrier_arrive"
    // CHECK-NEXT:    scf.if %[[IS_ROOT]] {
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.barrier_wait"
    // CHECK:         gpu.shuffle  idx %{{.+}}, %[[ROOT]]
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_broadcast_root3_f32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.broadcast"(%input, %output, %workspace) {dtype = "f32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, root = 3 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // 400-byte chunks (whole vectors): in place or four chunks staged (one per destination PE), the own
    // chunk copied in the first meet's halves, then chunk `me` of every peer pulled.
    // CHECK-LABEL: gpu.func @coll_all_to_all_i32_w4_n100(
    // CHECK:         scf.if
    // CHECK-COUNT-4: "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.barrier_arrive"
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.barrier_wait"
    // CHECK-NOT:     "mori_shmem.ptr"
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK-NOT:     "mori_shmem.ptr"
    // CHECK:         scf.for
    // CHECK:           gpu.shuffle
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:         }
    // CHECK:         "mori_comm.device_barrier"
    gpu.func @coll_all_to_all_i32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all"(%input, %output, %workspace) {dtype = "i32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // Variable sizes: threads p < 4 publish min(splits[p], 100) into this block's sizes[b] (the workspace at
    // 2560); the units stage chunk q (splits[q] elements, packed) at 1536 + q * 208 (always staged); meet; walking p = 0..3,
    // read PE p's sizes[b][me] and pull that many elements of its chunk `me`; unit 0 lane 0 stores the count
    // into recv_counts[p]; meet.
    // CHECK-LABEL: gpu.func @coll_all_to_all_v_bf16_w4_n100(
    // CHECK-SAME:    %[[WSV:[a-z0-9]+]]: !llvm.ptr, %[[SPLITS:[a-z0-9]+]]: !llvm.ptr, %[[RECV:[a-z0-9]+]]: !llvm.ptr)
    // CHECK:         %[[SIZES:.+]] = llvm.getelementptr %[[WSV]][%c2560_i64]
    // CHECK:         scf.if
    // CHECK:           llvm.load %{{.+}} : !llvm.ptr -> i32
    // CHECK:           arith.minui
    // CHECK:           llvm.store %{{.+}} : i64, !llvm.ptr
    // CHECK:         scf.for %{{.+}} = %c0_i32 to %c4_i32{{.*}} iter_args
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    arith.constant 0 : i32
    // CHECK:         scf.for %[[P:.+]] = %{{.+}} iter_args
    // CHECK-NEXT:      "mori_shmem.ptr"(%[[SIZES]], %[[P]])
    // CHECK:           %[[N:.+]] = llvm.load %{{.+}} : !llvm.ptr -> i64
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:           scf.if
    // CHECK:             %[[N32:.+]] = arith.trunci %[[N]] : i64 to i32
    // CHECK-NEXT:        %[[AT:.+]] = llvm.getelementptr %[[RECV]][%[[P]]]
    // CHECK-NEXT:        llvm.store %[[N32]], %[[AT]]
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_all_to_all_v_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr, %splits: !llvm.ptr, %recv_counts: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all_v"(%input, %output, %workspace, %splits, %recv_counts) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // 200-byte chunks (not whole vectors: staged, summed through `reduced`): stage four chunks; meet; sum
    // chunk `me` of the places of PEs 0..3 (in that order: the rounding is torch's) into `reduced`; the block
    // meets (lanes hand the sums over); copy to the output; meet.
    // CHECK-LABEL: gpu.func @coll_reduce_scatter_bf16_w4_n100(
    // CHECK:         %[[RED:.+]] = llvm.getelementptr %{{.+}}[%c2560_i64]
    // CHECK-COUNT-4: "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // The four places: each from its lane (PE 0's first: the order of the sums).
    // CHECK:         gpu.shuffle  idx %{{.+}}, %c0_i32{{(_[0-9]+)?}},
    // CHECK:         gpu.shuffle  idx %{{.+}}, %c1_i32{{(_[0-9]+)?}},
    // CHECK:         gpu.shuffle  idx %{{.+}}, %c2_i32{{(_[0-9]+)?}},
    // CHECK:         gpu.shuffle  idx %{{.+}}, %c3_i32{{(_[0-9]+)?}},
    // CHECK:         scf.for
    // CHECK:           "mori_comm.accumulate_rows"({{.+}}) {dtype = "bf16"} : (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
    // CHECK:         }
    // CHECK-NEXT:    gpu.barrier
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_reduce_scatter_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.reduce_scatter"(%input, %output, %workspace) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // 400 bytes (whole vectors): in place or staged; the sums go straight into the output when it is
    // 16-byte aligned, through `reduced` otherwise.
    // CHECK-LABEL: gpu.func @coll_all_reduce_one_shot_f32_w4_n100(
    // CHECK-SAME:    %{{[a-z0-9]+}}: !llvm.ptr, %[[OUT1:[a-z0-9]+]]: !llvm.ptr, %[[WS1:[a-z0-9]+]]: !llvm.ptr
    // Lane l's workspace at PE (l mod 4): translated at the start; after the meet no translation, only
    // the loads of the places' offsets.
    // CHECK:         "mori_shmem.ptr"(%[[WS1]], %{{.+}})
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NOT:     "mori_shmem.ptr"
    // CHECK:         %[[OUT_AT:.+]] = llvm.ptrtoint %[[OUT1]]
    // CHECK:         scf.if
    // CHECK:           "mori_comm.accumulate_rows"(%{{.+}}) {dtype = "f32"}
    // CHECK:         } else {
    // CHECK:           "mori_comm.accumulate_rows"({{.+}}) {dtype = "f32"}
    // CHECK:           gpu.barrier
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:         }
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_all_reduce_one_shot_f32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%input, %output, %workspace) {dtype = "f32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "one_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    // Two shots: four shares of 32 elements (64 bytes; the last one 8 bytes) staged (200 bytes: not whole
    // vectors); meet; sum share `me` into `reduced`; meet in halves (arrive publishes the sums; this PE's
    // own share from `reduced` into the output; wait); pull share p from every peer p's `reduced`; meet.
    // CHECK-LABEL: gpu.func @coll_all_reduce_two_shot_bf16_w4_n100(
    // CHECK:         %[[RED2:.+]] = llvm.getelementptr %{{.+}}[%c1792_i64]
    // CHECK:         %[[THEIR_WS2:.+]] = "mori_shmem.ptr"(%{{.+}}, %{{.+}})
    // CHECK:         %c64_i64 = arith.constant 64 : i64
    // CHECK-COUNT-4: "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.device_barrier"
    // CHECK:         "mori_comm.accumulate_rows"(%{{.+}}) {dtype = "bf16"}
    // CHECK:         }
    // CHECK-NEXT:    %[[E2:.+]] = "mori_comm.barrier_arrive"
    // CHECK:         "mori_comm.copy_bytes"
    // CHECK:         "mori_comm.barrier_wait"(%{{.+}}, %[[E2]])
    // Each lane a peer's `reduced` (its workspace, translated once at the start, + 1792), shuffled in the
    // loop.
    // CHECK-NOT:     mori_shmem.ptr
    // CHECK:         scf.for
    // CHECK-NOT:       mori_shmem.ptr
    // CHECK:           llvm.getelementptr %[[THEIR_WS2]][%c1792_i64{{(_[0-9]+)?}}]
    // CHECK:           gpu.shuffle
    // CHECK:           "mori_comm.copy_bytes"
    // CHECK:         }
    // CHECK:         "mori_comm.device_barrier"
    // CHECK-NEXT:    gpu.return
    gpu.func @coll_all_reduce_two_shot_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%input, %output, %workspace) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "two_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// The blocks lower to their helpers (one copy_bytes helper, one device barrier for world 4).
// CALLS-DAG: func.func @__mori_comm_copy_bytes(%{{.+}}: !llvm.ptr, %{{.+}}: !llvm.ptr, %{{.+}}: i64)
// CALLS-DAG: func.func @__mori_comm_device_barrier_w4(
// CALLS-DAG: func.func @__mori_comm_accumulate_rows_bf16_k4(
// CALLS-DAG: func.func @__mori_comm_accumulate_rows_f32_k4(
