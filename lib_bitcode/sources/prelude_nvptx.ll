; Target primitives for NVPTX (sm_90). Same helper names and contracts as prelude_amdgcn.ll.
;
; Why inline PTX for read-modify-writes: LLVM 22's NVPTX backend lowers `atomicrmw` to a plain
; `atom.global.<op>` whatever its ordering and syncscope (relaxed, .gpu scope), which is too weak for a
; word another GPU reads. Loads, stores, cmpxchg and fences are lowered with their ordering and system
; scope (ld.relaxed.sys, st.release.sys, atom.relaxed.sys.cas, fence.acq_rel.sys / fence.sc.sys), so
; those stay LLVM atomics.

@mori_compiler_shmem_state = addrspace(1) externally_initialized global [64 x i8] zeroinitializer, align 8

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()
declare i32 @llvm.nvvm.read.ptx.sreg.laneid()
declare i32 @llvm.nvvm.activemask()
declare void @llvm.nvvm.bar.warp.sync(i32)
declare void @llvm.nvvm.barrier0()
declare void @llvm.nvvm.nanosleep(i32)
declare void @llvm.trap()

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

define internal i32 @__mc_warp_size() alwaysinline {
  ret i32 32
}

define internal i32 @__mc_lane_id() alwaysinline {
  %l = call i32 @llvm.nvvm.read.ptx.sreg.laneid()
  ret i32 %l
}

define internal i64 @__mc_active_mask() alwaysinline convergent {
  %m = call i32 @llvm.nvvm.activemask()
  %m64 = zext i32 %m to i64
  ret i64 %m64
}

; Threads of a warp may diverge (independent thread scheduling): bar.warp.sync reconverges the lanes
; of %mask and orders their memory accesses among them.
define internal void @__mc_warp_sync(i64 %mask) alwaysinline convergent {
  %m = trunc i64 %mask to i32
  call void @llvm.nvvm.bar.warp.sync(i32 %m)
  ret void
}

; bar.sync orders the block's memory accesses at CTA scope (the PTX memory model's barrier).
define internal void @__mc_block_barrier() alwaysinline convergent {
  call void @llvm.nvvm.barrier0()
  ret void
}

define internal void @__mc_backoff() alwaysinline {
  call void @llvm.nvvm.nanosleep(i32 32)
  ret void
}

define internal void @__mc_trap() alwaysinline noreturn {
  call void @llvm.trap()
  unreachable
}

; ---- system-scope memory operations ----------------------------------------------------------------

define internal i32 @__mc_ld_relaxed_sys_i32(ptr %p) alwaysinline {
  %v = load atomic i32, ptr %p monotonic, align 4
  ret i32 %v
}

define internal i64 @__mc_ld_relaxed_sys_i64(ptr %p) alwaysinline {
  %v = load atomic i64, ptr %p monotonic, align 8
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
  %old = call i64 asm sideeffect "atom.release.sys.add.u64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
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
  %a = call i32 asm sideeffect "atom.relaxed.sys.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}"(ptr %p, i32 %v)
  ret i32 %a
and:
  %b = call i32 asm sideeffect "atom.relaxed.sys.and.b32 $0, [$1], $2;", "=r,l,r,~{memory}"(ptr %p, i32 %v)
  ret i32 %b
or:
  %c = call i32 asm sideeffect "atom.relaxed.sys.or.b32 $0, [$1], $2;", "=r,l,r,~{memory}"(ptr %p, i32 %v)
  ret i32 %c
xor:
  %d = call i32 asm sideeffect "atom.relaxed.sys.xor.b32 $0, [$1], $2;", "=r,l,r,~{memory}"(ptr %p, i32 %v)
  ret i32 %d
xchg:
  %e = call i32 asm sideeffect "atom.relaxed.sys.exch.b32 $0, [$1], $2;", "=r,l,r,~{memory}"(ptr %p, i32 %v)
  ret i32 %e
}

define internal i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 %kind) alwaysinline {
entry:
  switch i32 %kind, label %xchg [ i32 0, label %add
                                  i32 1, label %and
                                  i32 2, label %or
                                  i32 3, label %xor ]
add:
  %a = call i64 asm sideeffect "atom.relaxed.sys.add.u64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
  ret i64 %a
and:
  %b = call i64 asm sideeffect "atom.relaxed.sys.and.b64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
  ret i64 %b
or:
  %c = call i64 asm sideeffect "atom.relaxed.sys.or.b64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
  ret i64 %c
xor:
  %d = call i64 asm sideeffect "atom.relaxed.sys.xor.b64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
  ret i64 %d
xchg:
  %e = call i64 asm sideeffect "atom.relaxed.sys.exch.b64 $0, [$1], $2;", "=l,l,l,~{memory}"(ptr %p, i64 %v)
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
