; Target primitives for AMDGPU (gfx942, gfx950, gfx1250). The common library sources call only these
; helpers for thread geometry, barriers and memory ordering, so every ordering decision per target is
; in one place. All are internal and always inlined.
;
; Scopes: syncscope "" is LLVM's system scope on AMDGPU; the backend emits the cache write-back /
; invalidate and wait instructions the memory model needs (e.g. buffer_wbl2 sc0 sc1 + s_waitcnt before a
; system-scope release on gfx942).

@mori_compiler_shmem_state = addrspace(1) externally_initialized global [64 x i8] zeroinitializer, align 8

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.z()
declare ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
declare void @llvm.amdgcn.s.barrier()
declare void @llvm.amdgcn.s.sleep(i32)

define internal i32 @__mc_tid() alwaysinline {
  %t = call i32 @llvm.amdgcn.workitem.id.x()
  ret i32 %t
}

; workgroup_size_x is the u16 at byte 4 of the HSA kernel dispatch packet.
define internal i32 @__mc_ntid() alwaysinline {
  %pkt = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %p = getelementptr i8, ptr addrspace(4) %pkt, i64 4
  %n16 = load i16, ptr addrspace(4) %p, align 4, !invariant.load !0
  %n = zext i16 %n16 to i32
  ret i32 %n
}

define internal i32 @__mc_block_z() alwaysinline {
  %z = call i32 @llvm.amdgcn.workgroup.id.z()
  ret i32 %z
}

; __syncthreads(): s_barrier does not wait for outstanding memory operations, the fences around it do.
define internal void @__mc_block_barrier() alwaysinline convergent {
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  ret void
}

; Back off between polls of a remote-written word so the spinning wave leaves issue slots to others.
define internal void @__mc_backoff() alwaysinline {
  call void @llvm.amdgcn.s.sleep(i32 1)
  ret void
}

define internal i64 @__mc_ld_relaxed_sys_i64(ptr %p) alwaysinline {
  %v = load atomic volatile i64, ptr %p monotonic, align 8
  ret i64 %v
}

define internal void @__mc_st_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  store atomic i64 %v, ptr %p release, align 8
  ret void
}

define internal i64 @__mc_add_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  %old = atomicrmw add ptr %p, i64 %v release, align 8
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

!0 = !{}
