// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=32 chip=sm_90}' | FileCheck %s --check-prefixes=CHECK,NV
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64 chip=gfx942}' | FileCheck %s --check-prefixes=CHECK,AMD
// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=64}' 2>&1 | FileCheck %s --check-prefix=NOCHIP
// RUN: mori-compile %s --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// one_gpu_barrier (PEs on this one GPU, virtual PEs): device_barrier's protocol with both fences at the
// GPU's scope: LLVM syncscope "device" on NVPTX (fence.acq_rel.gpu), "agent" on AMDGPU (every XCD); the slot
// store and polls are device_barrier's (mori_shmem_uint64_p, wait_until). device_barrier's own fences stay
// at system scope (no syncscope).
// CHECK-LABEL: func.func @__mori_comm_device_barrier_w4(
// CHECK:        llvm.fence release
// CHECK:        llvm.fence acquire
// CHECK-LABEL: func.func @__mori_comm_one_gpu_barrier_w4(
// CHECK:        gpu.barrier
// NV:           llvm.fence syncscope("device") release
// AMD:          llvm.fence syncscope("agent") release
// CHECK-NEXT:   "mori_shmem.p"
// CHECK:        "mori_shmem.wait_until"
// NV-NEXT:      llvm.fence syncscope("device") acquire
// AMD-NEXT:     llvm.fence syncscope("agent") acquire
// CHECK:        gpu.barrier
// CHECK-LABEL: gpu.func @k(
// CHECK:        func.call @__mori_comm_one_gpu_barrier_w4(%{{.+}}, %{{.+}})
// CHECK-NEXT:   func.call @__mori_comm_device_barrier_w4(%{{.+}}, %{{.+}})

// NOCHIP: error: {{.*}}'mori_comm.one_gpu_barrier' needs the pass option chip, one of gfx942, gfx950, gfx1250, sm_90 (the target: its lowering depends on it), got ''

// PTX-LABEL: .visible .entry k(
// PTX:      bar.sync 0;
// PTX:      fence.acq_rel.gpu;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.gpu;
// PTX:      bar.sync 0;
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%slots: !llvm.ptr, %epochs: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_comm.one_gpu_barrier"(%slots, %epochs) {world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      "mori_comm.device_barrier"(%slots, %epochs) {world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}
