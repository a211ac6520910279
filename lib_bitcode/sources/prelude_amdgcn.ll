; Target primitives for AMDGPU (gfx942, gfx950 wave64; gfx1250 wave32). The common sources
; (shmem_core.ll) call only these helpers for thread geometry, barriers and memory ordering, so every
; ordering decision per target is in one place. All are internal and always inlined.
;
; Scopes: syncscope "" is LLVM's system scope on AMDGPU; the backend emits the cache write-back /
; invalidate and wait instructions the memory model needs (on gfx942: buffer_wbl2 sc0 sc1 + s_waitcnt
; before a system-scope release; sc0 sc1 on system-scope loads and atomics).

@mori_compiler_shmem_state = addrspace(1) externally_initialized global [64 x i8] zeroinitializer, align 8

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.z()
declare ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
declare void @llvm.amdgcn.s.barrier()
declare void @llvm.amdgcn.s.sleep(i32)
declare i32 @llvm.amdgcn.mbcnt.lo(i32, i32)
declare i32 @llvm.amdgcn.mbcnt.hi(i32, i32)
declare i32 @llvm.amdgcn.wavefrontsize()
declare i64 @llvm.amdgcn.ballot.i64(i1)
declare void @llvm.amdgcn.wave.barrier()
declare void @llvm.trap()

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

define internal i32 @__mc_warp_size() alwaysinline {
  %w = call i32 @llvm.amdgcn.wavefrontsize()
  ret i32 %w
}

; mbcnt counts the set mask bits below this lane: with an all-ones mask that is the lane id
; (the hi half adds nothing in wave32).
define internal i32 @__mc_lane_id() alwaysinline {
  %lo = call i32 @llvm.amdgcn.mbcnt.lo(i32 -1, i32 0)
  %id = call i32 @llvm.amdgcn.mbcnt.hi(i32 -1, i32 %lo)
  ret i32 %id
}

define internal i64 @__mc_active_mask() alwaysinline convergent {
  %m = call i64 @llvm.amdgcn.ballot.i64(i1 true)
  ret i64 %m
}

; The lanes of a wave execute in lock step; the wave barrier only keeps the compiler from moving
; memory operations across it. Cross-lane visibility comes from the caller's release fences.
define internal void @__mc_warp_sync(i64 %mask) alwaysinline convergent {
  fence syncscope("wavefront") release
  call void @llvm.amdgcn.wave.barrier()
  fence syncscope("wavefront") acquire
  ret void
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

define internal void @__mc_trap() alwaysinline noreturn {
  call void @llvm.trap()
  unreachable
}

; ---- system-scope memory operations ----------------------------------------------------------------
; Polled words: volatile + monotonic keeps LICM from hoisting the load out of a spin loop.

define internal i32 @__mc_ld_relaxed_sys_i32(ptr %p) alwaysinline {
  %v = load atomic volatile i32, ptr %p monotonic, align 4
  ret i32 %v
}

define internal i64 @__mc_ld_relaxed_sys_i64(ptr %p) alwaysinline {
  %v = load atomic volatile i64, ptr %p monotonic, align 8
  ret i64 %v
}

define internal void @__mc_st_relaxed_sys_i8(ptr %p, i8 %v) alwaysinline {
  store atomic i8 %v, ptr %p monotonic, align 1
  ret void
}

define internal void @__mc_st_relaxed_sys_i16(ptr %p, i16 %v) alwaysinline {
  store atomic i16 %v, ptr %p monotonic, align 2
  ret void
}

define internal void @__mc_st_relaxed_sys_i32(ptr %p, i32 %v) alwaysinline {
  store atomic i32 %v, ptr %p monotonic, align 4
  ret void
}

define internal void @__mc_st_relaxed_sys_i64(ptr %p, i64 %v) alwaysinline {
  store atomic i64 %v, ptr %p monotonic, align 8
  ret void
}

define internal void @__mc_st_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  store atomic i64 %v, ptr %p release, align 8
  ret void
}

define internal i64 @__mc_add_release_sys_i64(ptr %p, i64 %v) alwaysinline {
  %old = atomicrmw add ptr %p, i64 %v release, align 8
  ret i64 %old
}

; Relaxed read-modify-write at system scope; %kind: 0 add, 1 and, 2 or, 3 xor, 4 exchange.
define internal i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 %kind) alwaysinline {
entry:
  switch i32 %kind, label %xchg [ i32 0, label %add
                                  i32 1, label %and
                                  i32 2, label %or
                                  i32 3, label %xor ]
add:
  %a = atomicrmw add ptr %p, i32 %v monotonic, align 4
  ret i32 %a
and:
  %b = atomicrmw and ptr %p, i32 %v monotonic, align 4
  ret i32 %b
or:
  %c = atomicrmw or ptr %p, i32 %v monotonic, align 4
  ret i32 %c
xor:
  %d = atomicrmw xor ptr %p, i32 %v monotonic, align 4
  ret i32 %d
xchg:
  %e = atomicrmw xchg ptr %p, i32 %v monotonic, align 4
  ret i32 %e
}

define internal i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 %kind) alwaysinline {
entry:
  switch i32 %kind, label %xchg [ i32 0, label %add
                                  i32 1, label %and
                                  i32 2, label %or
                                  i32 3, label %xor ]
add:
  %a = atomicrmw add ptr %p, i64 %v monotonic, align 8
  ret i64 %a
and:
  %b = atomicrmw and ptr %p, i64 %v monotonic, align 8
  ret i64 %b
or:
  %c = atomicrmw or ptr %p, i64 %v monotonic, align 8
  ret i64 %c
xor:
  %d = atomicrmw xor ptr %p, i64 %v monotonic, align 8
  ret i64 %d
xchg:
  %e = atomicrmw xchg ptr %p, i64 %v monotonic, align 8
  ret i64 %e
}

define internal i32 @__mc_cas_i32(ptr %p, i32 %cmp, i32 %v) alwaysinline {
  %r = cmpxchg ptr %p, i32 %cmp, i32 %v monotonic monotonic, align 4
  %old = extractvalue { i32, i1 } %r, 0
  ret i32 %old
}

define internal i64 @__mc_cas_i64(ptr %p, i64 %cmp, i64 %v) alwaysinline {
  %r = cmpxchg ptr %p, i64 %cmp, i64 %v monotonic monotonic, align 8
  %old = extractvalue { i64, i1 } %r, 0
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

; ---- ockl work-item queries ------------------------------------------------------------------------
; MLIR's convert-gpu-to-rocdl lowers gpu.block_dim / gpu.grid_dim to these ROCm device-library (ockl)
; functions; defining them here from the HSA dispatch packet keeps code objects free of ROCm's
; device libraries. Packet: workgroup_size_{x,y,z} u16 at bytes 4, 6, 8; grid_size_{x,y,z} u32 at 12, 16, 20.

define i64 @__ockl_get_local_size(i32 %dim) alwaysinline {
  %pkt = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %d = and i32 %dim, 3
  %ok = icmp ult i32 %d, 3
  %dd = select i1 %ok, i32 %d, i32 0
  %off0 = shl i32 %dd, 1
  %off = add i32 %off0, 4
  %off64 = zext i32 %off to i64
  %p = getelementptr i8, ptr addrspace(4) %pkt, i64 %off64
  %v16 = load i16, ptr addrspace(4) %p, align 2, !invariant.load !0
  %v = zext i16 %v16 to i64
  %r = select i1 %ok, i64 %v, i64 1
  ret i64 %r
}

define i64 @__ockl_get_num_groups(i32 %dim) alwaysinline {
  %pkt = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %d = and i32 %dim, 3
  %ok = icmp ult i32 %d, 3
  %dd = select i1 %ok, i32 %d, i32 0
  %goff0 = shl i32 %dd, 2
  %goff = add i32 %goff0, 12
  %goff64 = zext i32 %goff to i64
  %gp = getelementptr i8, ptr addrspace(4) %pkt, i64 %goff64
  %grid = load i32, ptr addrspace(4) %gp, align 4, !invariant.load !0
  %wg = call i64 @__ockl_get_local_size(i32 %dd)
  %wg32 = trunc i64 %wg to i32
  %sum = add i32 %grid, %wg32
  %sum1 = sub i32 %sum, 1
  %n = udiv i32 %sum1, %wg32
  %n64 = zext i32 %n to i64
  %r = select i1 %ok, i64 %n64, i64 1
  ret i64 %r
}
