; The project's own implementation of MORI's device ABI for peer-to-peer peers (common to all targets).
; It uses only the target helpers of prelude_<arch>.ll and the state global (layout: lib_bitcode/state.py).
;
; Address model: every symmetric address is this PE's address of an object in its own heap. The
; peer's copy is at  heap_bases[pe] + (addr - heap_bases[my_pe])  where heap_bases is the device array of
; every PE's heap base as mapped into this process (IPC-mapped for other processes, plain pointers for
; virtual PEs sharing one GPU).

; This file is concatenated after the prelude, which defines the __mc_* helpers and the state global.

; ---- state -------------------------------------------------------------------------------------

define i32 @mori_shmem_my_pe() {
  %rank = load i32, ptr addrspace(1) @mori_compiler_shmem_state, align 8
  %fp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 8
  %flags = load i32, ptr addrspace(1) %fp, align 8
  ; flags bit 0 = virtual PEs: the PEs of one launch are its grid's z slices.
  %virt = and i32 %flags, 1
  %is_virt = icmp ne i32 %virt, 0
  %z = call i32 @__mc_block_z()
  %off = select i1 %is_virt, i32 %z, i32 0
  %pe = add i32 %rank, %off
  ret i32 %pe
}

define i32 @mori_shmem_n_pes() {
  %np = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 4
  %n = load i32, ptr addrspace(1) %np, align 4
  ret i32 %n
}

define internal i64 @__mc_heap_base(i32 %pe) alwaysinline {
  %bp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 24
  %bases = load ptr, ptr addrspace(1) %bp, align 8
  %slot = getelementptr i64, ptr %bases, i32 %pe
  %base = load i64, ptr %slot, align 8
  ret i64 %base
}

; The peer's address of the symmetric object at local address %addr.
define internal ptr @__mc_peer_addr(ptr %addr, i32 %pe) alwaysinline {
  %me = call i32 @mori_shmem_my_pe()
  %mine = call i64 @__mc_heap_base(i32 %me)
  %theirs = call i64 @__mc_heap_base(i32 %pe)
  %a = ptrtoint ptr %addr to i64
  %off = sub i64 %a, %mine
  %r = add i64 %theirs, %off
  %rp = inttoptr i64 %r to ptr
  ret ptr %rp
}

; ---- block-cooperative copy ------------------------------------------------------------------------
; 16-byte vector copies when both pointers are 16-byte aligned (then a byte tail), bytes otherwise.

define internal void @__mc_copy_block(ptr %dst, ptr %src, i64 %n) alwaysinline {
entry:
  %tid32 = call i32 @__mc_tid()
  %nt32 = call i32 @__mc_ntid()
  %tid = zext i32 %tid32 to i64
  %nt = zext i32 %nt32 to i64
  %d = ptrtoint ptr %dst to i64
  %s = ptrtoint ptr %src to i64
  %ds = or i64 %d, %s
  %mis = and i64 %ds, 15
  %aligned = icmp eq i64 %mis, 0
  br i1 %aligned, label %vec.pre, label %byte.pre

vec.pre:
  %nvec = lshr i64 %n, 4
  br label %vec.cond
vec.cond:
  %i = phi i64 [ %tid, %vec.pre ], [ %i.next, %vec.body ]
  %more = icmp ult i64 %i, %nvec
  br i1 %more, label %vec.body, label %tail.pre
vec.body:
  %sp = getelementptr <4 x i32>, ptr %src, i64 %i
  %dp = getelementptr <4 x i32>, ptr %dst, i64 %i
  %v = load <4 x i32>, ptr %sp, align 16
  store <4 x i32> %v, ptr %dp, align 16
  %i.next = add i64 %i, %nt
  br label %vec.cond
tail.pre:
  %done = shl i64 %nvec, 4
  br label %byte.loop.pre

byte.pre:
  br label %byte.loop.pre
byte.loop.pre:
  %start = phi i64 [ %done, %tail.pre ], [ 0, %byte.pre ]
  %j0 = add i64 %start, %tid
  br label %byte.cond
byte.cond:
  %j = phi i64 [ %j0, %byte.loop.pre ], [ %j.next, %byte.body ]
  %bmore = icmp ult i64 %j, %n
  br i1 %bmore, label %byte.body, label %exit
byte.body:
  %sb = getelementptr i8, ptr %src, i64 %j
  %db = getelementptr i8, ptr %dst, i64 %j
  %b = load i8, ptr %sb, align 1
  store i8 %b, ptr %db, align 1
  %j.next = add i64 %j, %nt
  br label %byte.cond
exit:
  ret void
}

; ---- put with signal, block scope ------------------------------------------------------------------
; Protocol (writer side): every thread copies its share of the payload to the peer, then makes its own
; stores visible system-wide (release fence), then the block meets at a barrier; after it, thread 0
; updates the peer's signal word with a system-scope release (store for SET, fetch-add for ADD).
; Reader side: poll the signal with system-scope relaxed loads (wait_until), then an acquire fence
; (mori_shmem_fence_thread) before reading the payload.
; Returns 0, or -22 (EINVAL) for a signal op other than SET (3, 9) / ADD (4, 10); nothing is signalled then.

define i32 @mori_shmem_putmem_nbi_signal_block(ptr %dest, ptr %source, i64 %bytes, ptr %signalDest,
                                                i64 %signalValue, i32 %signalOp, i32 %pe, i32 %qpId) {
entry:
  %rdest = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  call void @__mc_copy_block(ptr %rdest, ptr %source, i64 %bytes)
  call void @__mc_fence_release_sys()
  call void @__mc_block_barrier()
  %tid = call i32 @__mc_tid()
  %leader = icmp eq i32 %tid, 0
  br i1 %leader, label %signal, label %done
signal:
  %rsig = call ptr @__mc_peer_addr(ptr %signalDest, i32 %pe)
  switch i32 %signalOp, label %bad [ i32 9, label %set
                                     i32 3, label %set
                                     i32 10, label %add
                                     i32 4, label %add ]
set:
  call void @__mc_st_release_sys_i64(ptr %rsig, i64 %signalValue)
  br label %done
add:
  %old = call i64 @__mc_add_release_sys_i64(ptr %rsig, i64 %signalValue)
  br label %done
bad:
  ret i32 -22
done:
  ret i32 0
}

; ---- waits ------------------------------------------------------------------------------------------
; Spin with system-scope relaxed loads the optimizer cannot hoist; no acquire (as MORI's ABI).

define i64 @mori_shmem_uint64_wait_until_greater_than(ptr %addr, i64 %val) {
entry:
  br label %poll
poll:
  %v = call i64 @__mc_ld_relaxed_sys_i64(ptr %addr)
  %ok = icmp ugt i64 %v, %val
  br i1 %ok, label %exit, label %wait
wait:
  call void @__mc_backoff()
  br label %poll
exit:
  ret i64 %v
}

; ---- completion and ordering ------------------------------------------------------------------------
; P2P puts complete when their stores issue, so quiet has nothing to drain; fence adds the system-scope
; sequentially consistent fence that orders (and, after a wait, acquires) memory.

define i32 @mori_shmem_quiet_thread() {
  ret i32 0
}

define i32 @mori_shmem_fence_thread() {
  call void @__mc_fence_sc_sys()
  ret i32 0
}
