// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile --print-pipeline | FileCheck %s
// RUN: mori-compile --print-pipeline --target=sm_90 | FileCheck %s --check-prefix=SM90
// RUN: mori-opt -p 'builtin.module(mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64}),rocdl-attach-target{chip=gfx942 abi=600 wave64=true},reconcile-unrealized-casts)' %s -o %t.replayed.mlir
// RUN: mori-compile %s --stop-after=rocdl -o %t.staged.mlir
// RUN: diff %t.replayed.mlir %t.staged.mlir
// RUN: mori-opt -p 'builtin.module(mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm{index-bitwidth=64}),nvvm-attach-target{chip=sm_90 features=+ptx78},reconcile-unrealized-casts)' %s -o %t.replayed-nv.mlir
// RUN: mori-compile %s --target=sm_90 --stop-after=nvvm -o %t.staged-nv.mlir
// RUN: diff %t.replayed-nv.mlir %t.staged-nv.mlir

// `--print-pipeline` lists the stages and the whole MLIR part as one pass-pipeline string, and that
// string replayed by `mori-opt -p` gives exactly what the driver produces at the last MLIR stage. AMDGPU
// sets the EP passes' AMDGPU forms (global address space, destination loop, uniform addressing); sm_90
// keeps the defaults.
// CHECK: mori: verify the input against the project dialects (IRDL constraints)
// CHECK-NEXT: ep: mori-coll-to-kernels{wave-size=64},mori-ep-to-kernels{wave-size=64 uniform-addressing=true global-address-space=true},mori-comm-to-calls{wave-size=64 vectors-per-lane=1 global-address-space=true loop-destinations=true chip=gfx942}
// CHECK-NEXT: abi: mori-shmem-to-abi
// CHECK-NEXT: rocdl: gpu.module(convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64}),rocdl-attach-target{chip=gfx942 abi=600 wave64=true},reconcile-unrealized-casts
// CHECK-NEXT: llvm-ir: translate the gpu.module to LLVM IR (amdgcn-amd-amdhsa)
// CHECK-NEXT: link: llvmlite link {{.*}}libmori_shmem_device.bc; internalize all but kernels and state globals; check symbols
// CHECK-NEXT: opt: LLVM O3 for gfx942 (IR pipeline O1, codegen O3){{$}}
// CHECK-NEXT: isa: AMDGPU assembly for gfx942 (code object v6)
// CHECK-NEXT: object: ELF relocatable object
// CHECK-NEXT: hsaco: ld.lld -shared; reject undefined symbols; read AMDHSA metadata
// CHECK-NEXT: mlir pipeline: builtin.module(mori-coll-to-kernels{wave-size=64},mori-ep-to-kernels{wave-size=64 uniform-addressing=true global-address-space=true},mori-comm-to-calls{wave-size=64 vectors-per-lane=1 global-address-space=true loop-destinations=true chip=gfx942},mori-trace-to-timer{enabled=false wave-size=64},mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64}),rocdl-attach-target{chip=gfx942 abi=600 wave64=true},reconcile-unrealized-casts){{$}}

// SM90: nvvm: gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm{index-bitwidth=64}),nvvm-attach-target{chip=sm_90 features=+ptx78},reconcile-unrealized-casts
// SM90: opt: LLVM O3 for sm_90{{$}}
// SM90: ptx: PTX for sm_90 (ptx78)
// SM90-NEXT: mlir pipeline: builtin.module(mori-coll-to-kernels{wave-size=32},mori-ep-to-kernels{wave-size=32},mori-comm-to-calls{wave-size=32 vectors-per-lane=2 chip=sm_90},mori-trace-to-timer{enabled=false wave-size=32},mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm{index-bitwidth=64}),nvvm-attach-target{chip=sm_90 features=+ptx78},reconcile-unrealized-casts){{$}}

module attributes {gpu.container_module} {
  gpu.module @replay {
    gpu.func @k(%sig: !llvm.ptr, %v: i64) kernel {
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %leader = arith.cmpi eq, %tid, %c0 : index
      scf.if %leader {
        %seen = "mori_shmem.wait_until"(%sig, %v) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
        "mori_shmem.fence"() : () -> ()
      }
      gpu.barrier
      gpu.return
    }
  }
}
