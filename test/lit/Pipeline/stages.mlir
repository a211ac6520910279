// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --stop-after=mori | FileCheck %s --check-prefix=MORI
// RUN: mori-compile %s --stop-after=abi | FileCheck %s --check-prefix=ABI
// RUN: mori-compile %s --stop-after=rocdl | FileCheck %s --check-prefix=ROCDL
// RUN: mori-compile %s --target=gfx1250 --code-object-version=5 --stop-after=rocdl | FileCheck %s --check-prefix=ROCDL-GFX1250
// RUN: mori-compile %s --target=sm_90 --stop-after=nvvm | FileCheck %s --check-prefix=NVVM
// RUN: mori-compile %s --stop-after=llvm-ir | FileCheck %s --check-prefix=LLVM-IR
// RUN: mori-compile %s --target=sm_90 --stop-after=llvm-ir | FileCheck %s --check-prefix=LLVM-IR-NV
// RUN: mori-compile %s --stop-after=link | FileCheck %s --check-prefix=LINK
// RUN: mori-compile %s --emit=llvm | FileCheck %s --check-prefix=OPT
// RUN: mori-compile %s --stop-after=isa | FileCheck %s --check-prefix=ISA

// What `mori-compile --stop-after=<stage>` prints for each stage of the pipeline.
module attributes {gpu.container_module} {
  gpu.module @stages {
    gpu.func @put_signal(%buf: !llvm.ptr, %sig: !llvm.ptr, %n: i64) kernel {
      %me = "mori_shmem.my_pe"() : () -> i32
      %one = arith.constant 1 : i64
      "mori_shmem.putmem_nbi_signal"(%buf, %buf, %n, %sig, %one, %me, %me) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %leader = arith.cmpi eq, %tid, %c0 : index
      scf.if %leader {
        "mori_shmem.fence"() : () -> ()
      }
      gpu.barrier
      gpu.return
    }
  }
}

// mori: the verified input, mori_shmem ops untouched.
// MORI-LABEL: gpu.func @put_signal(
// MORI: "mori_shmem.my_pe"() : () -> i32
// MORI: "mori_shmem.putmem_nbi_signal"
// MORI: scf.if

// abi: ABI calls and their declarations inside the gpu.module; gpu and scf ops still there.
// ABI-LABEL: gpu.module @stages {
// ABI-NEXT: llvm.func @mori_shmem_fence_thread() -> i32
// ABI-NEXT: llvm.func @mori_shmem_my_pe() -> i32
// ABI-NEXT: llvm.func @mori_shmem_putmem_nbi_signal_block(!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32, i32) -> i32
// ABI: gpu.func @put_signal(
// ABI-NOT: mori_shmem.
// ABI: scf.if
// ABI: gpu.barrier

// rocdl: the target attribute, an llvm.func kernel with rocdl.kernel, control flow and barrier in LLVM/ROCDL.
// ROCDL: gpu.module @stages [#rocdl.target<chip = "gfx942">]
// ROCDL: llvm.func @put_signal({{.*}}) attributes {{.*}}rocdl.kernel
// ROCDL: %[[ME:.*]] = llvm.call @mori_shmem_my_pe() : () -> i32
// ROCDL: llvm.call @mori_shmem_putmem_nbi_signal_block({{.*}}, %[[ME]], %[[ME]])
// ROCDL: rocdl.workitem.id.x
// ROCDL: llvm.cond_br
// ROCDL: llvm.call @mori_shmem_fence_thread() : () -> i32
// ROCDL: rocdl.barrier
// ROCDL-NOT: scf.
// ROCDL-NOT: gpu.func

// rocdl for gfx1250 with code object v5: wave32 and ABI 500 in the target attribute.
// ROCDL-GFX1250: gpu.module @stages [#rocdl.target<chip = "gfx1250", abi = "500", flags = {no_wave64}>]

// nvvm (sm_90): the NVVM target with PTX 7.8, nvvm.kernel, nvvm ops.
// NVVM: gpu.module @stages [#nvvm.target<chip = "sm_90", features = "+ptx78">]
// NVVM: llvm.func @put_signal({{.*}}) attributes {{.*}}nvvm.kernel
// NVVM: llvm.call @mori_shmem_my_pe() : () -> i32
// NVVM: nvvm.read.ptx.sreg.tid.x
// NVVM: nvvm.barrier0

// llvm-ir: the gpu.module as LLVM IR, an amdgpu_kernel / ptx_kernel calling the declared ABI functions.
// LLVM-IR-DAG: declare i32 @mori_shmem_my_pe()
// LLVM-IR-DAG: declare i32 @mori_shmem_putmem_nbi_signal_block(ptr, ptr, i64, ptr, i64, i32, i32, i32)
// LLVM-IR: define amdgpu_kernel void @put_signal(ptr %0, ptr %1, i64 %2)
// LLVM-IR: call i32 @mori_shmem_putmem_nbi_signal_block(ptr %0, ptr %0, i64 %2, ptr %1, i64 1, i32 10,
// LLVM-IR: call void @llvm.amdgcn.s.barrier()
// LLVM-IR-NV: define ptx_kernel void @put_signal(ptr %0, ptr %1, i64 %2)

// link: the device library is linked in; every function but the kernel is internal.
// LINK: target triple = "amdgcn-amd-amdhsa"
// LINK: define amdgpu_kernel void @put_signal(
// LINK-DAG: define internal i32 @mori_shmem_my_pe()
// LINK-DAG: define internal i32 @mori_shmem_putmem_nbi_signal_block(
// LINK-DAG: define internal i32 @mori_shmem_fence_thread()
// LINK-NOT: declare {{.*}}@mori_shmem_

// isa: AMDGPU assembly.
// ISA: .amdgcn_target "amdgcn-amd-amdhsa--gfx942"
// ISA: put_signal:
// ISA: s_endpgm

// --emit=llvm (after link + opt): the device library is linked and inlined, only the kernel is left
// external and the state global stays exported for the runtime.
// OPT: target triple = "amdgcn-amd-amdhsa"
// OPT: @mori_compiler_shmem_state = {{.*}}addrspace(1) externally_initialized global
// OPT: define amdgpu_kernel void @put_signal(
// OPT-NOT: call {{.*}}@mori_shmem_
// OPT-NOT: declare {{.*}}@mori_shmem_
