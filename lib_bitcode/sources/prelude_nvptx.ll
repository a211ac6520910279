; Target primitives for NVPTX (sm_90). Same helper names and contracts as prelude_amdgcn.ll.
;
; Why inline PTX for the read-modify-write: LLVM 22's NVPTX backend lowers `atomicrmw ... release`
; to a plain `atom.global.add` (relaxed, .gpu scope), dropping both the ordering and the system scope
; that a signal read by another GPU needs. Loads, stores and fences are lowered correctly
; (ld.relaxed.sys, st.release.sys, fence.acq_rel.sys / fence.sc.sys), so they stay LLVM atomics.

@mori_compiler_shmem_state = addrspace(1) externally_initialized global [64 x i8] zeroinitializer, align 8

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
declare void @llvm.nvvm.barrier0()
declare void @llvm.nvvm.nanosleep(i32)

define internal i32 @__mc_tid() alwaysinline {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  ret i32 %t
}

define internal i32 @__mc_ntid() alwaysinline {
  %n = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  ret i32 %n
}

define internal i32 @__mc_block_z() alwaysinline {
  %z = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
  ret i32 %z
}

; bar.sync orders the block's memory accesses at CTA scope (PTX memory model: barrier synchronizes).
define internal void @__mc_block_barrier() alwaysinline convergent {
  call void @llvm.nvvm.barrier0()
  ret void
}

define internal void @__mc_backoff() alwaysinline {
  call void @llvm.nvvm.nanosleep(i32 32)
  ret void
}

define internal i64 @__mc_ld_relaxed_sys_i64(ptr %p) alwaysinline {
  %v = load atomic i64, ptr %p monotonic, align 8
  ret i64 %v
}

define internal void @__mc_st_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  store atomic i64 %v, ptr %p release, align 8
  ret void
}

define internal i64 @__mc_add_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  %old = call i64 asm sideeffect "atom.release.sys.add.u64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
  ret i64 %old
}

define internal void @__mc_fence_release_sys() alwaysinline {
  fence release
  ret void
}

define internal void @__mc_fence_acquire_sys() alwaysinline {
  fence acquire
  ret void
}

define internal void @__mc_fence_sc_sys() alwaysinline {
  fence seq_cst
  ret void
}
