; The project's implementation of MORI's device ABI for peer-to-peer peers: the internal, target-
; neutral building blocks. The 98 exported functions (wrappers.py generates them from the ABI table) are
; thin calls into these. This file is concatenated after the target prelude, which defines the __mc_*
; helpers it calls and the state global (layout: lib_bitcode/state.py).
;
; Address model: a symmetric address is this PE's address of an object in its own heap. The peer's
; copy is at  heap_bases[pe] + (addr - heap_bases[my_pe]), heap_bases being the device array of every
; PE's heap base as mapped into this process (IPC-mapped for other processes, plain for virtual PEs).
;
; Error codes returned by int-returning functions (MORI's return 0 on success):
;   -22 (EINVAL)  pe outside [0, n_pes), unsupported size or atomic/signal op: nothing was done
;   -19 (ENODEV)  the peer's heap is not mapped in this process (not reachable by P2P): nothing was done
; Value-returning functions (fetch atomics) cannot return an error: they trap on an unsupported op.
; Scopes: 0 thread, 1 warp (all lanes of the wave, identical arguments), 2 block (all threads).

; ---- state ---------------------------------------------------------------------------------------

define internal i32 @__mc_my_pe() alwaysinline {
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

define internal i32 @__mc_n_pes() alwaysinline {
  %np = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 4
  %n = load i32, ptr addrspace(1) %np, align 4
  ret i32 %n
}

define internal i64 @__mc_heap_size() alwaysinline {
  %sp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 16
  %s = load i64, ptr addrspace(1) %sp, align 8
  ret i64 %s
}

define internal i64 @__mc_heap_base(i32 %pe) alwaysinline {
  %bp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 24
  %bases = load ptr, ptr addrspace(1) %bp, align 8
  %slot = getelementptr i64, ptr %bases, i32 %pe
  %base = load i64, ptr %slot, align 8
  ret i64 %base
}

; 0 if %pe can be reached, else the error code.
define internal i32 @__mc_check_pe(i32 %pe) alwaysinline {
entry:
  %n = call i32 @__mc_n_pes()
  %bad = icmp uge i32 %pe, %n
  br i1 %bad, label %einval, label %mapped
mapped:
  %base = call i64 @__mc_heap_base(i32 %pe)
  %none = icmp eq i64 %base, 0
  %rc = select i1 %none, i32 -19, i32 0
  ret i32 %rc
einval:
  ret i32 -22
}

; The peer's address of the symmetric object at local address %addr.
define internal ptr @__mc_peer_addr(ptr %addr, i32 %pe) alwaysinline {
  %me = call i32 @__mc_my_pe()
  %mine = call i64 @__mc_heap_base(i32 %me)
  %theirs = call i64 @__mc_heap_base(i32 %pe)
  %a = ptrtoint ptr %addr to i64
  %off = sub i64 %a, %mine
  %r = add i64 %theirs, %off
  %rp = inttoptr i64 %r to ptr
  ret ptr %rp
}

; ptr_p2p: %addr translated for direct access to %destPe; 0 outside the heap or for an unmapped peer.
define internal i64 @__mc_ptr_p2p(i64 %addr, i32 %myPe, i32 %destPe) alwaysinline {
entry:
  %mine = call i64 @__mc_heap_base(i32 %myPe)
  %size = call i64 @__mc_heap_size()
  %off = sub i64 %addr, %mine
  %inside = icmp ult i64 %off, %size
  br i1 %inside, label %which, label %zero
which:
  %self = icmp eq i32 %myPe, %destPe
  br i1 %self, label %same, label %peer
same:
  ret i64 %addr
peer:
  %rc = call i32 @__mc_check_pe(i32 %destPe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %mapped, label %zero
mapped:
  %theirs = call i64 @__mc_heap_base(i32 %destPe)
  %r = add i64 %theirs, %off
  ret i64 %r
zero:
  ret i64 0
}

; ---- cooperative copy -------------------------------------------------------------------------------
; Lane %lane of %lanes copies bytes lane, lane+lanes, ... When dst and src are equally misaligned, a byte
; head brings them to 16 bytes, the body moves 16-byte vectors (eight loads in flight before the stores),
; then a byte tail; otherwise bytes throughout.

define internal void @__mc_copy_bytes(ptr %dst, ptr %src, i64 %from, i64 %to, i64 %lane, i64 %lanes) alwaysinline {
entry:
  %j0 = add i64 %from, %lane
  br label %cond
cond:
  %j = phi i64 [ %j0, %entry ], [ %j.next, %body ]
  %more = icmp ult i64 %j, %to
  br i1 %more, label %body, label %exit
body:
  %sb = getelementptr i8, ptr %src, i64 %j
  %db = getelementptr i8, ptr %dst, i64 %j
  %b = load i8, ptr %sb, align 1
  store i8 %b, ptr %db, align 1
  %j.next = add i64 %j, %lanes
  br label %cond
exit:
  ret void
}

; Vectors [0, nvec) of 16 bytes from 16-byte aligned pointers. The main loop issues eight independent
; 16-byte loads per lane before its first store (enough bytes in flight to approach DRAM/link bandwidth
; with a few hundred threads per SM); the remainder loop moves one vector per lane.
define internal void @__mc_copy_vec16(ptr %dst, ptr %src, i64 %nvec, i64 %lane, i64 %lanes) alwaysinline {
entry:
  %o0 = mul i64 %lanes, 0
  %o1 = mul i64 %lanes, 1
  %o2 = mul i64 %lanes, 2
  %o3 = mul i64 %lanes, 3
  %o4 = mul i64 %lanes, 4
  %o5 = mul i64 %lanes, 5
  %o6 = mul i64 %lanes, 6
  %o7 = mul i64 %lanes, 7
  %l8 = shl i64 %lanes, 3
  br label %cond8
cond8:
  %i = phi i64 [ %lane, %entry ], [ %i.next, %body8 ]
  %last = add i64 %i, %o7
  %more8 = icmp ult i64 %last, %nvec
  br i1 %more8, label %body8, label %cond1
body8:
  %i0 = add i64 %i, %o0
  %i1 = add i64 %i, %o1
  %i2 = add i64 %i, %o2
  %i3 = add i64 %i, %o3
  %i4 = add i64 %i, %o4
  %i5 = add i64 %i, %o5
  %i6 = add i64 %i, %o6
  %i7 = add i64 %i, %o7
  %s0 = getelementptr <4 x i32>, ptr %src, i64 %i0
  %v0 = load <4 x i32>, ptr %s0, align 16
  %s1 = getelementptr <4 x i32>, ptr %src, i64 %i1
  %v1 = load <4 x i32>, ptr %s1, align 16
  %s2 = getelementptr <4 x i32>, ptr %src, i64 %i2
  %v2 = load <4 x i32>, ptr %s2, align 16
  %s3 = getelementptr <4 x i32>, ptr %src, i64 %i3
  %v3 = load <4 x i32>, ptr %s3, align 16
  %s4 = getelementptr <4 x i32>, ptr %src, i64 %i4
  %v4 = load <4 x i32>, ptr %s4, align 16
  %s5 = getelementptr <4 x i32>, ptr %src, i64 %i5
  %v5 = load <4 x i32>, ptr %s5, align 16
  %s6 = getelementptr <4 x i32>, ptr %src, i64 %i6
  %v6 = load <4 x i32>, ptr %s6, align 16
  %s7 = getelementptr <4 x i32>, ptr %src, i64 %i7
  %v7 = load <4 x i32>, ptr %s7, align 16
  %d0 = getelementptr <4 x i32>, ptr %dst, i64 %i0
  store <4 x i32> %v0, ptr %d0, align 16
  %d1 = getelementptr <4 x i32>, ptr %dst, i64 %i1
  store <4 x i32> %v1, ptr %d1, align 16
  %d2 = getelementptr <4 x i32>, ptr %dst, i64 %i2
  store <4 x i32> %v2, ptr %d2, align 16
  %d3 = getelementptr <4 x i32>, ptr %dst, i64 %i3
  store <4 x i32> %v3, ptr %d3, align 16
  %d4 = getelementptr <4 x i32>, ptr %dst, i64 %i4
  store <4 x i32> %v4, ptr %d4, align 16
  %d5 = getelementptr <4 x i32>, ptr %dst, i64 %i5
  store <4 x i32> %v5, ptr %d5, align 16
  %d6 = getelementptr <4 x i32>, ptr %dst, i64 %i6
  store <4 x i32> %v6, ptr %d6, align 16
  %d7 = getelementptr <4 x i32>, ptr %dst, i64 %i7
  store <4 x i32> %v7, ptr %d7, align 16
  %i.next = add i64 %i, %l8
  br label %cond8
cond1:
  %k = phi i64 [ %i, %cond8 ], [ %k.next, %body1 ]
  %more1 = icmp ult i64 %k, %nvec
  br i1 %more1, label %body1, label %exit
body1:
  %sk = getelementptr <4 x i32>, ptr %src, i64 %k
  %dk = getelementptr <4 x i32>, ptr %dst, i64 %k
  %vk = load <4 x i32>, ptr %sk, align 16
  store <4 x i32> %vk, ptr %dk, align 16
  %k.next = add i64 %k, %lanes
  br label %cond1
exit:
  ret void
}

define internal void @__mc_copy(ptr %dst, ptr %src, i64 %n, i64 %lane, i64 %lanes) alwaysinline {
entry:
  %d = ptrtoint ptr %dst to i64
  %s = ptrtoint ptr %src to i64
  %diff = xor i64 %d, %s
  %skew = and i64 %diff, 15
  %same = icmp eq i64 %skew, 0
  br i1 %same, label %aligned, label %bytes
aligned:
  %mis = and i64 %d, 15
  %to16 = sub i64 16, %mis
  %head0 = and i64 %to16, 15
  %short = icmp ult i64 %n, %head0
  %head = select i1 %short, i64 %n, i64 %head0
  call void @__mc_copy_bytes(ptr %dst, ptr %src, i64 0, i64 %head, i64 %lane, i64 %lanes)
  %rest = sub i64 %n, %head
  %nvec = lshr i64 %rest, 4
  %dv = getelementptr i8, ptr %dst, i64 %head
  %sv = getelementptr i8, ptr %src, i64 %head
  call void @__mc_copy_vec16(ptr %dv, ptr %sv, i64 %nvec, i64 %lane, i64 %lanes)
  %body = shl i64 %nvec, 4
  %tail = add i64 %head, %body
  call void @__mc_copy_bytes(ptr %dst, ptr %src, i64 %tail, i64 %n, i64 %lane, i64 %lanes)
  ret void
bytes:
  call void @__mc_copy_bytes(ptr %dst, ptr %src, i64 0, i64 %n, i64 %lane, i64 %lanes)
  ret void
}

; (lane, lanes) of the calling thread for a scope.
define internal { i64, i64 } @__mc_scope_lanes(i32 %scope) alwaysinline {
entry:
  switch i32 %scope, label %thread [ i32 1, label %warp
                                     i32 2, label %block ]
warp:
  %ln = call i32 @__mc_lane_id()
  %ws = call i32 @__mc_warp_size()
  %ln64 = zext i32 %ln to i64
  %ws64 = zext i32 %ws to i64
  %w0 = insertvalue { i64, i64 } undef, i64 %ln64, 0
  %w1 = insertvalue { i64, i64 } %w0, i64 %ws64, 1
  ret { i64, i64 } %w1
block:
  %t = call i32 @__mc_tid()
  %nt = call i32 @__mc_ntid()
  %t64 = zext i32 %t to i64
  %nt64 = zext i32 %nt to i64
  %b0 = insertvalue { i64, i64 } undef, i64 %t64, 0
  %b1 = insertvalue { i64, i64 } %b0, i64 %nt64, 1
  ret { i64, i64 } %b1
thread:
  ret { i64, i64 } { i64 0, i64 1 }
}

; ---- put / get ------------------------------------------------------------------------------------
; P2P moves the data with the calling threads' own loads and stores: when the call returns, this
; thread's share is issued (nbi) and, for gets, loaded into %dest. Puts become visible to others only
; after a fence (or the release of a put+signal).

define internal i32 @__mc_put(ptr %dest, ptr %source, i64 %bytes, i32 %pe, i32 %scope) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %remote = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  %ll = call { i64, i64 } @__mc_scope_lanes(i32 %scope)
  %lane = extractvalue { i64, i64 } %ll, 0
  %lanes = extractvalue { i64, i64 } %ll, 1
  call void @__mc_copy(ptr %remote, ptr %source, i64 %bytes, i64 %lane, i64 %lanes)
  ret i32 0
fail:
  ret i32 %rc
}

define internal i32 @__mc_get(ptr %dest, ptr %source, i64 %bytes, i32 %pe, i32 %scope) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %remote = call ptr @__mc_peer_addr(ptr %source, i32 %pe)
  %ll = call { i64, i64 } @__mc_scope_lanes(i32 %scope)
  %lane = extractvalue { i64, i64 } %ll, 0
  %lanes = extractvalue { i64, i64 } %ll, 1
  call void @__mc_copy(ptr %dest, ptr %remote, i64 %bytes, i64 %lane, i64 %lanes)
  ret i32 0
fail:
  ret i32 %rc
}

; ---- put with signal -------------------------------------------------------------------------------
; Protocol (writer): every participating thread copies its share of the payload to the peer and makes
; its own stores visible system-wide (release fence); the participants meet (thread scope: the active
; lanes of the wave; warp: the wave; block: the block); then ONE leader (thread scope: the highest
; active lane, once per wave as MORI's P2P does; warp: lane 0; block: thread 0) updates the peer's
; signal word with a system-scope release: a store for SET (9, or 3), a fetch-add for ADD (10, or 4).
; Reader: poll the signal with system-scope relaxed loads (wait_until), then fence (acquire) before
; reading the payload. Returns -22 for another signal op (nothing moved), or the pe error code.

define internal i32 @__mc_put_signal(ptr %dest, ptr %source, i64 %bytes, ptr %signalDest, i64 %signalValue,
                                     i32 %signalOp, i32 %pe, i32 %scope) alwaysinline convergent {
entry:
  %mask = call i64 @__mc_active_mask()
  switch i32 %signalOp, label %bad [ i32 9, label %check
                                     i32 3, label %check
                                     i32 10, label %check
                                     i32 4, label %check ]
check:
  %rc = call i32 @__mc_put(ptr %dest, ptr %source, i64 %bytes, i32 %pe, i32 %scope)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %publish, label %fail
publish:
  call void @__mc_fence_release_sys()
  switch i32 %scope, label %sync.thread [ i32 1, label %sync.warp
                                          i32 2, label %sync.block ]
sync.thread:
  call void @__mc_warp_sync(i64 %mask)
  %ln = call i32 @__mc_lane_id()
  %top = call i64 @llvm.ctlz.i64(i64 %mask, i1 false)
  %hi = sub i64 63, %top
  %hi32 = trunc i64 %hi to i32
  %lead.t = icmp eq i32 %ln, %hi32
  br label %elect
sync.warp:
  call void @__mc_warp_sync(i64 %mask)
  %ln.w = call i32 @__mc_lane_id()
  %lead.w = icmp eq i32 %ln.w, 0
  br label %elect
sync.block:
  call void @__mc_block_barrier()
  %t = call i32 @__mc_tid()
  %lead.b = icmp eq i32 %t, 0
  br label %elect
elect:
  %leader = phi i1 [ %lead.t, %sync.thread ], [ %lead.w, %sync.warp ], [ %lead.b, %sync.block ]
  br i1 %leader, label %signal, label %done
signal:
  %rsig = call ptr @__mc_peer_addr(ptr %signalDest, i32 %pe)
  %is_add = icmp sge i32 %signalOp, 10
  %is_add4 = icmp eq i32 %signalOp, 4
  %add = or i1 %is_add, %is_add4
  br i1 %add, label %do.add, label %do.set
do.set:
  call void @__mc_st_release_sys_i64(ptr %rsig, i64 %signalValue)
  br label %done
do.add:
  %old = call i64 @__mc_add_release_sys_i64(ptr %rsig, i64 %signalValue)
  br label %done
done:
  ret i32 0
fail:
  ret i32 %rc
bad:
  ret i32 -22
}

declare i64 @llvm.ctlz.i64(i64, i1)

; ---- immediate puts ---------------------------------------------------------------------------------
; One relaxed system-scope store of 1, 2, 4 or 8 bytes (16: one plain 16-byte store, %dest 16-aligned).

define internal i32 @__mc_put_imm(ptr %dest, ptr %val, i64 %bytes, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  switch i64 %bytes, label %bad [ i64 1, label %b1
                                  i64 2, label %b2
                                  i64 4, label %b4
                                  i64 8, label %b8
                                  i64 16, label %b16 ]
b1:
  %v1 = load i8, ptr %val, align 1
  call void @__mc_st_relaxed_sys_i8(ptr %r, i8 %v1)
  ret i32 0
b2:
  %v2 = load i16, ptr %val, align 1
  call void @__mc_st_relaxed_sys_i16(ptr %r, i16 %v2)
  ret i32 0
b4:
  %v4 = load i32, ptr %val, align 1
  call void @__mc_st_relaxed_sys_i32(ptr %r, i32 %v4)
  ret i32 0
b8:
  %v8 = load i64, ptr %val, align 1
  call void @__mc_st_relaxed_sys_i64(ptr %r, i64 %v8)
  ret i32 0
b16:
  %v16 = load <4 x i32>, ptr %val, align 1
  store <4 x i32> %v16, ptr %r, align 16
  ret i32 0
bad:
  ret i32 -22
fail:
  ret i32 %rc
}

define internal i32 @__mc_put_value_i8(ptr %dest, i8 %v, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  call void @__mc_st_relaxed_sys_i8(ptr %r, i8 %v)
  ret i32 0
fail:
  ret i32 %rc
}

define internal i32 @__mc_put_value_i16(ptr %dest, i16 %v, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  call void @__mc_st_relaxed_sys_i16(ptr %r, i16 %v)
  ret i32 0
fail:
  ret i32 %rc
}

define internal i32 @__mc_put_value_i32(ptr %dest, i32 %v, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  call void @__mc_st_relaxed_sys_i32(ptr %r, i32 %v)
  ret i32 0
fail:
  ret i32 %rc
}

define internal i32 @__mc_put_value_i64(ptr %dest, i64 %v, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  call void @__mc_st_relaxed_sys_i64(ptr %r, i64 %v)
  ret i32 0
fail:
  ret i32 %rc
}

; ---- atomics ---------------------------------------------------------------------------------------
; Relaxed at system scope (order them with fence). atomicType: INC 2, SET 3, ADD 4, AND 5, OR 6,
; XOR 7, SIGNAL_SET 9, SIGNAL_ADD 10 (non-fetching); FETCH 12, FETCH_INC 13, FETCH_ADD 14, FETCH_AND 15,
; FETCH_OR 16, FETCH_XOR 17, SWAP 18, COMPARE_SWAP 19 (fetching). Returns the old value; %valid says
; whether %op was one of the accepted ones (nothing happens otherwise).

define internal { i64, i1 } @__mc_amo64(ptr %p, i64 %v, i64 %cmp, i32 %op, i1 %fetching) alwaysinline {
entry:
  br i1 %fetching, label %fetch.ops, label %plain.ops
plain.ops:
  switch i32 %op, label %invalid [ i32 2, label %inc
                                   i32 3, label %xchg
                                   i32 9, label %xchg
                                   i32 4, label %add
                                   i32 10, label %add
                                   i32 5, label %and
                                   i32 6, label %or
                                   i32 7, label %xor ]
fetch.ops:
  switch i32 %op, label %invalid [ i32 12, label %load
                                   i32 13, label %inc
                                   i32 14, label %add
                                   i32 15, label %and
                                   i32 16, label %or
                                   i32 17, label %xor
                                   i32 18, label %xchg
                                   i32 19, label %cas ]
inc:
  %r.inc = call i64 @__mc_rmw_i64(ptr %p, i64 1, i32 0)
  br label %done
add:
  %r.add = call i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 0)
  br label %done
and:
  %r.and = call i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 1)
  br label %done
or:
  %r.or = call i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 2)
  br label %done
xor:
  %r.xor = call i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 3)
  br label %done
xchg:
  %r.xchg = call i64 @__mc_rmw_i64(ptr %p, i64 %v, i32 4)
  br label %done
load:
  %r.load = call i64 @__mc_ld_relaxed_sys_i64(ptr %p)
  br label %done
cas:
  %r.cas = call i64 @__mc_cas_i64(ptr %p, i64 %cmp, i64 %v)
  br label %done
done:
  %old = phi i64 [ %r.inc, %inc ], [ %r.add, %add ], [ %r.and, %and ], [ %r.or, %or ], [ %r.xor, %xor ],
                 [ %r.xchg, %xchg ], [ %r.load, %load ], [ %r.cas, %cas ]
  %res = insertvalue { i64, i1 } { i64 0, i1 true }, i64 %old, 0
  ret { i64, i1 } %res
invalid:
  ret { i64, i1 } { i64 0, i1 false }
}

define internal { i32, i1 } @__mc_amo32(ptr %p, i32 %v, i32 %cmp, i32 %op, i1 %fetching) alwaysinline {
entry:
  br i1 %fetching, label %fetch.ops, label %plain.ops
plain.ops:
  switch i32 %op, label %invalid [ i32 2, label %inc
                                   i32 3, label %xchg
                                   i32 9, label %xchg
                                   i32 4, label %add
                                   i32 10, label %add
                                   i32 5, label %and
                                   i32 6, label %or
                                   i32 7, label %xor ]
fetch.ops:
  switch i32 %op, label %invalid [ i32 12, label %load
                                   i32 13, label %inc
                                   i32 14, label %add
                                   i32 15, label %and
                                   i32 16, label %or
                                   i32 17, label %xor
                                   i32 18, label %xchg
                                   i32 19, label %cas ]
inc:
  %r.inc = call i32 @__mc_rmw_i32(ptr %p, i32 1, i32 0)
  br label %done
add:
  %r.add = call i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 0)
  br label %done
and:
  %r.and = call i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 1)
  br label %done
or:
  %r.or = call i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 2)
  br label %done
xor:
  %r.xor = call i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 3)
  br label %done
xchg:
  %r.xchg = call i32 @__mc_rmw_i32(ptr %p, i32 %v, i32 4)
  br label %done
load:
  %r.load = call i32 @__mc_ld_relaxed_sys_i32(ptr %p)
  br label %done
cas:
  %r.cas = call i32 @__mc_cas_i32(ptr %p, i32 %cmp, i32 %v)
  br label %done
done:
  %old = phi i32 [ %r.inc, %inc ], [ %r.add, %add ], [ %r.and, %and ], [ %r.or, %or ], [ %r.xor, %xor ],
                 [ %r.xchg, %xchg ], [ %r.load, %load ], [ %r.cas, %cas ]
  %res = insertvalue { i32, i1 } { i32 0, i1 true }, i32 %old, 0
  ret { i32, i1 } %res
invalid:
  ret { i32, i1 } { i32 0, i1 false }
}

; Non-fetching atomic on a peer: 0, -22 (unsupported op) or the pe error code.
define internal i32 @__mc_amo_nonfetch64(ptr %dest, i64 %v, i32 %op, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  %res = call { i64, i1 } @__mc_amo64(ptr %r, i64 %v, i64 0, i32 %op, i1 false)
  %valid = extractvalue { i64, i1 } %res, 1
  %code = select i1 %valid, i32 0, i32 -22
  ret i32 %code
fail:
  ret i32 %rc
}

define internal i32 @__mc_amo_nonfetch32(ptr %dest, i32 %v, i32 %op, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %fail
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  %res = call { i32, i1 } @__mc_amo32(ptr %r, i32 %v, i32 0, i32 %op, i1 false)
  %valid = extractvalue { i32, i1 } %res, 1
  %code = select i1 %valid, i32 0, i32 -22
  ret i32 %code
fail:
  ret i32 %rc
}

; Fetching atomic on a peer: the old value; traps on an unsupported op or an unreachable pe.
define internal i64 @__mc_amo_fetch64(ptr %dest, i64 %v, i64 %cmp, i32 %op, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %trap
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  %res = call { i64, i1 } @__mc_amo64(ptr %r, i64 %v, i64 %cmp, i32 %op, i1 true)
  %valid = extractvalue { i64, i1 } %res, 1
  br i1 %valid, label %done, label %trap
done:
  %old = extractvalue { i64, i1 } %res, 0
  ret i64 %old
trap:
  call void @__mc_trap()
  unreachable
}

define internal i32 @__mc_amo_fetch32(ptr %dest, i32 %v, i32 %cmp, i32 %op, i32 %pe) alwaysinline {
entry:
  %rc = call i32 @__mc_check_pe(i32 %pe)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %go, label %trap
go:
  %r = call ptr @__mc_peer_addr(ptr %dest, i32 %pe)
  %res = call { i32, i1 } @__mc_amo32(ptr %r, i32 %v, i32 %cmp, i32 %op, i1 true)
  %valid = extractvalue { i32, i1 } %res, 1
  br i1 %valid, label %done, label %trap
done:
  %old = extractvalue { i32, i1 } %res, 0
  ret i32 %old
trap:
  call void @__mc_trap()
  unreachable
}

; atomic_size_nonfetch: the operand is read from %val (4 or 8 bytes).
define internal i32 @__mc_amo_size_nonfetch(ptr %dest, ptr %val, i64 %bytes, i32 %op, i32 %pe) alwaysinline {
entry:
  switch i64 %bytes, label %bad [ i64 4, label %w4
                                  i64 8, label %w8 ]
w4:
  %v4 = load i32, ptr %val, align 4
  %r4 = call i32 @__mc_amo_nonfetch32(ptr %dest, i32 %v4, i32 %op, i32 %pe)
  ret i32 %r4
w8:
  %v8 = load i64, ptr %val, align 8
  %r8 = call i32 @__mc_amo_nonfetch64(ptr %dest, i64 %v8, i32 %op, i32 %pe)
  ret i32 %r8
bad:
  ret i32 -22
}

; ---- waits -----------------------------------------------------------------------------------------
; Spin on a local word with system-scope relaxed loads until the condition holds (%kind: 0 equals,
; 1 unsigned greater-than, 2 signed greater-than); returns the value seen. No acquire (as MORI's ABI):
; callers fence before reading payload. Bounded-wait debug mode (state.wait_limit != 0): after that many
; polls the first waiter to give up records {flag, pe, cmp, addr, expected, observed} at state.wait_report
; and every waiter returns the last value seen; the host reports it (runtime/launcher.py).

define internal void @__mc_report_wait(ptr %addr, i64 %expected, i64 %seen, i32 %kind) alwaysinline {
entry:
  %rp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 48
  %report = load ptr, ptr addrspace(1) %rp, align 8
  %none = icmp eq ptr %report, null
  br i1 %none, label %exit, label %claim
claim:
  %prev = call i32 @__mc_cas_i32(ptr %report, i32 0, i32 1)
  %first = icmp eq i32 %prev, 0
  br i1 %first, label %fill, label %exit
fill:
  %me = call i32 @__mc_my_pe()
  %pe.p = getelementptr i8, ptr %report, i64 4
  store i32 %me, ptr %pe.p, align 4
  %k.p = getelementptr i8, ptr %report, i64 8
  store i32 %kind, ptr %k.p, align 4
  %a.p = getelementptr i8, ptr %report, i64 16
  %a = ptrtoint ptr %addr to i64
  store i64 %a, ptr %a.p, align 8
  %e.p = getelementptr i8, ptr %report, i64 24
  store i64 %expected, ptr %e.p, align 8
  %s.p = getelementptr i8, ptr %report, i64 32
  store i64 %seen, ptr %s.p, align 8
  call void @__mc_fence_sc_sys()
  br label %exit
exit:
  ret void
}

define internal i64 @__mc_wait_limit() alwaysinline {
  %lp = getelementptr i8, ptr addrspace(1) @mori_compiler_shmem_state, i64 40
  %l = load i64, ptr addrspace(1) %lp, align 8
  ret i64 %l
}

define internal i64 @__mc_wait64(ptr %addr, i64 %val, i32 %kind) alwaysinline {
entry:
  %limit = call i64 @__mc_wait_limit()
  br label %poll
poll:
  %polls = phi i64 [ 0, %entry ], [ %polls.next, %again ]
  %v = call i64 @__mc_ld_relaxed_sys_i64(ptr %addr)
  %eq = icmp eq i64 %v, %val
  %ugt = icmp ugt i64 %v, %val
  %sgt = icmp sgt i64 %v, %val
  %cond.gt = icmp eq i32 %kind, 1
  %cond.sgt = icmp eq i32 %kind, 2
  %pick.gt = select i1 %cond.gt, i1 %ugt, i1 %eq
  %ok = select i1 %cond.sgt, i1 %sgt, i1 %pick.gt
  br i1 %ok, label %exit, label %wait
wait:
  %polls.next = add i64 %polls, 1
  %bounded = icmp ne i64 %limit, 0
  %over = icmp uge i64 %polls.next, %limit
  %give.up = and i1 %bounded, %over
  br i1 %give.up, label %report, label %again
again:
  call void @__mc_backoff()
  br label %poll
report:
  call void @__mc_report_wait(ptr %addr, i64 %val, i64 %v, i32 %kind)
  br label %exit
exit:
  ret i64 %v
}

define internal i32 @__mc_wait32(ptr %addr, i32 %val, i32 %kind) alwaysinline {
entry:
  %limit = call i64 @__mc_wait_limit()
  br label %poll
poll:
  %polls = phi i64 [ 0, %entry ], [ %polls.next, %again ]
  %v = call i32 @__mc_ld_relaxed_sys_i32(ptr %addr)
  %eq = icmp eq i32 %v, %val
  %ugt = icmp ugt i32 %v, %val
  %sgt = icmp sgt i32 %v, %val
  %cond.gt = icmp eq i32 %kind, 1
  %cond.sgt = icmp eq i32 %kind, 2
  %pick.gt = select i1 %cond.gt, i1 %ugt, i1 %eq
  %ok = select i1 %cond.sgt, i1 %sgt, i1 %pick.gt
  br i1 %ok, label %exit, label %wait
wait:
  %polls.next = add i64 %polls, 1
  %bounded = icmp ne i64 %limit, 0
  %over = icmp uge i64 %polls.next, %limit
  %give.up = and i1 %bounded, %over
  br i1 %give.up, label %report, label %again
again:
  call void @__mc_backoff()
  br label %poll
report:
  %v64 = zext i32 %v to i64
  %val64 = zext i32 %val to i64
  call void @__mc_report_wait(ptr %addr, i64 %val64, i64 %v64, i32 %kind)
  br label %exit
exit:
  ret i32 %v
}

; ---- barrier_all -----------------------------------------------------------------------------------
; All-to-all epoch flags in the reserved head of every PE's heap (lib_bitcode/state.py SYNC_*):
; slot q (q < 255) of PE p's area = the last barrier epoch PE q announced to p; slot 255 = p's own
; epoch counter, touched only by p's barrier thread. Protocol: e = ++own; release fence; for each q:
; release-store e into slot my_pe of q's area; then for each q: poll own slot q (relaxed, system scope)
; until >= e; acquire fence. Epochs only grow, so no reset is needed between barriers.

define internal void @__mc_barrier_all() alwaysinline {
entry:
  %me = call i32 @__mc_my_pe()
  %n = call i32 @__mc_n_pes()
  %mine = call i64 @__mc_heap_base(i32 %me)
  %area = inttoptr i64 %mine to ptr
  %own = getelementptr i64, ptr %area, i64 255
  %e0 = load i64, ptr %own, align 8
  %e = add i64 %e0, 1
  store i64 %e, ptr %own, align 8
  call void @__mc_fence_release_sys()
  br label %announce
announce:
  %q = phi i32 [ 0, %entry ], [ %q.next, %announce.body ]
  %more = icmp ult i32 %q, %n
  br i1 %more, label %announce.body, label %await.pre
announce.body:
  %theirs = call i64 @__mc_heap_base(i32 %q)
  %tarea = inttoptr i64 %theirs to ptr
  %slot = getelementptr i64, ptr %tarea, i32 %me
  call void @__mc_st_release_sys_i64(ptr %slot, i64 %e)
  %q.next = add i32 %q, 1
  br label %announce
await.pre:
  %e.minus1 = sub i64 %e, 1
  br label %await
await:
  %r = phi i32 [ 0, %await.pre ], [ %r.next, %await.body ]
  %rmore = icmp ult i32 %r, %n
  br i1 %rmore, label %await.body, label %done
await.body:
  %mslot = getelementptr i64, ptr %area, i32 %r
  %seen = call i64 @__mc_wait64(ptr %mslot, i64 %e.minus1, i32 1)
  %r.next = add i32 %r, 1
  br label %await
done:
  call void @__mc_fence_acquire_sys()
  ret void
}

define internal void @__mc_barrier_all_block() alwaysinline convergent {
entry:
  call void @__mc_fence_release_sys()
  call void @__mc_block_barrier()
  %t = call i32 @__mc_tid()
  %leader = icmp eq i32 %t, 0
  br i1 %leader, label %lead, label %join
lead:
  call void @__mc_barrier_all()
  br label %join
join:
  call void @__mc_block_barrier()
  ret void
}
