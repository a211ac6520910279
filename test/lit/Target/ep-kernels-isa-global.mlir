// REQUIRES: amdgpu-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o %t.gfx942.s
// RUN: mori-compile %s --target=gfx950 --emit=isa -o %t.gfx950.s
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=gfx1250 --emit=isa -o %t.gfx1250.s
//
// The row of each dispatch kernel: from the line before its first 16-byte global store to its last one.
// RUN: awk '/^ep_dispatch_bf16:/,/^\.Lfunc_end/' %t.gfx942.s > %t.d942.s
// RUN: awk '/global_store_dwordx4/{if(!s)s=NR; e=NR} {l[NR]=$0} END{for(i=s-1;i<=e;i++)print l[i]}' %t.d942.s \
// RUN:   | FileCheck %s --check-prefix=ROW --implicit-check-not='vmcnt(0)' --implicit-check-not=flat_
// RUN: awk '/^ep_dispatch_fp8_e4m3fnuz:/,/^\.Lfunc_end/' %t.gfx942.s \
// RUN:   | awk '/global_store_dwordx4/{if(!s)s=NR; e=NR} {l[NR]=$0} END{for(i=s-1;i<=e;i++)print l[i]}' \
// RUN:   | FileCheck %s --check-prefix=ROW8 --implicit-check-not='vmcnt(0)' --implicit-check-not=flat_
// RUN: awk '/^ep_dispatch_bf16:/,/^\.Lfunc_end/' %t.gfx950.s \
// RUN:   | awk '/global_store_dwordx4/{if(!s)s=NR; e=NR} {l[NR]=$0} END{for(i=s-1;i<=e;i++)print l[i]}' \
// RUN:   | FileCheck %s --check-prefix=ROW --implicit-check-not='vmcnt(0)' --implicit-check-not=flat_
// RUN: FileCheck %s --check-prefix=PULL --input-file=%t.gfx942.s
// RUN: FileCheck %s --check-prefix=GRID --input-file=%t.d942.s --implicit-check-not=scratch_ \
// RUN:   --implicit-check-not=src_private_base --implicit-check-not=flat_atomic_add_x2
// RUN: FileCheck %s --check-prefix=PULL --input-file=%t.gfx950.s
// RUN: awk '/^ep_dispatch_bf16:/,/^\.Lfunc_end/' %t.gfx1250.s | grep -oE '(global|flat)_(load|store)_b128' \
// RUN:   | uniq -c | FileCheck %s --check-prefix=RUNS1250
// RUN: FileCheck %s --check-prefix=GFX1250 --input-file=%t.gfx1250.s

// The AMDGPU memory path of the EP kernels (IntraNode, world 8, hidden 7168, top-8; wave64 for gfx942
// and gfx950, wave32 for gfx1250). The row copies and the combine's accumulate loop address rows as
// global memory (mori-comm-to-calls global-address-space: the generic pointers are addrspacecast,
// the device ABI keeps its signatures), so they use global_* instructions with rolling waits instead of
// flat_* ones, and the dispatch's destinations are a loop (loop-destinations). Before: every peer store
// was a flat_store_dwordx4 and each destination's group of 8 began with s_waitcnt vmcnt(0), 16 drains
// per row (the flat counter is shared with LDS, so the wait pass could not count the stores down).

// gfx942 / gfx950, bf16 row (14336 bytes = 14 vectors per lane: one round of 8 and a tail of 6): no
// vmcnt(0) and no flat access anywhere between the first and the last store of the row (the
// implicit-check-nots above). The first destination's 8 stores each wait for their own load only
// (vmcnt(7): 7 later loads, or stores, may still be in flight), from an SGPR base; the loop over the
// other destinations (flag and address by v_readlane from lane k) stores without waiting; the tail's
// stores wait vmcnt(5) (6 vectors).
// ROW: s_waitcnt vmcnt(7){{$}}
// ROW-NEXT: global_store_dwordx4 v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], s[{{[0-9]+:[0-9]+}}]{{$}}
// ROW-COUNT-7: s_waitcnt vmcnt(7){{$}}
// ROW: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, s{{[0-9]+}}
// ROW: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, s{{[0-9]+}}
// ROW-NOT: s_waitcnt
// ROW: global_store_dwordx4 v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], s[{{[0-9]+:[0-9]+}}]{{$}}
// ROW-COUNT-7: global_store_dwordx4
// ROW: global_load_dwordx4
// ROW: s_waitcnt vmcnt(5){{$}}
// ROW-NEXT: global_store_dwordx4
// ROW-COUNT-5: s_waitcnt vmcnt(5){{$}}
// ROW: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, s{{[0-9]+}}
// ROW-NOT: s_waitcnt
// ROW: global_store_dwordx4
// fp8 row (7168 bytes = 7 vectors per lane: the tail round only): rolling vmcnt(6).
// ROW8: s_waitcnt vmcnt(6){{$}}
// ROW8-NEXT: global_store_dwordx4
// ROW8-COUNT-6: s_waitcnt vmcnt(6){{$}}
// ROW8: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, s{{[0-9]+}}
// ROW8-NOT: s_waitcnt
// ROW8: global_store_dwordx4

// gfx942 completion of the dispatch (grid_last_arrival on this PE's own arrival word, as global memory with
// LLVM's relaxed system-scope atomics instead of ABI calls that translate our own address): the block
// meets; thread 0 fences (release: write back L2 and wait, no invalidate: an LLVM release fence, not the
// ABI's full fence), then the 64-bit arrival fetch-add at system scope (global_atomic_add_x2 ... sc0 sc1, no
// run-time private-address branch: no scratch). The last arriver resets the count (system-scope store) and
// fences (acquire: wait and invalidate, no write-back); the block meets again (the acquire
// then covers its other threads); no block waits for the others (no s_sleep poll before the handshake); the
// flag reaches warp 0 from lane 0 (v_readlane), whose last block then runs the count handshake.
// GRID: s_barrier
// GRID: buffer_wbl2 sc0 sc1
// GRID-NEXT: s_waitcnt vmcnt(0)
// GRID-NOT: {{_store_|_atomic_|s_sleep|buffer_inv}}
// GRID: global_atomic_add_x2 v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], s[{{[0-9]+:[0-9]+}}] sc0 sc1
// GRID-NOT: {{s_sleep|buffer_wbl2}}
// GRID: global_store_dwordx2 v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], s[{{[0-9]+:[0-9]+}}] sc0 sc1
// GRID-NEXT: s_waitcnt vmcnt(0)
// GRID-NEXT: buffer_inv sc0 sc1
// GRID: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, 0
// GRID: s_barrier
// GRID-NOT: s_barrier
// GRID: s_sleep 1
// GRID: s_endpgm

// Pull combine: each warp resolves the peers' base addresses of the registered rows and weights once
// (the only address translations: flat loads of the heap-base table before the token loop); per token,
// from the first broadcast of a forward entry (v_readlane of lane 0) to the first row load, there is no
// wait and no flat access: the K source addresses are scalar arithmetic on broadcast bases. The K = 8
// 16-byte row loads are global loads, issued back to back.
// PULL-LABEL: {{^}}ep_combine_pull_bf16:
// PULL: v_readlane_b32 s{{[0-9]+}}, v{{[0-9]+}}, 0{{$}}
// PULL-NOT: {{s_waitcnt|flat_}}
// PULL-COUNT-8: global_load_dwordx4 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}], off{{$}}
// PULL-NOT: flat_load_dwordx4
// PULL: global_store_dwordx4
// PULL-LABEL: .amdhsa_kernel ep_combine_pull_bf16

// gfx1250 (separate load and store counters): the dispatch row's 16-byte accesses are global_*_b128
// only, in runs (a round's loads, its stores to the first destination and, in the loop body, to the
// others; then the tail's, with one 16-byte load of heap-table entries for the metadata addresses among
// them), with no flat 16-byte access before the last of them (the flat ones after it are the device
// library's own stores). The first destination's stores count the loads down one by one (s_wait_loadcnt
// 7 ... 0).
// RUNS1250: {{^ *}}{{[0-9]+}} global_load_b128
// RUNS1250-NEXT: {{^ *}}16 global_store_b128
// RUNS1250-NEXT: {{^ *}}{{[0-9]+}} global_load_b128
// RUNS1250-NEXT: {{^ *}}{{[0-9]+}} global_store_b128
// RUNS1250-NEXT: {{^ *}}1 global_load_b128
// RUNS1250-NEXT: {{^ *}}{{[0-9]+}} global_store_b128
// RUNS1250-NOT: global_store_b128
// GFX1250-LABEL: {{^}}ep_dispatch_bf16:
// GFX1250: s_wait_loadcnt 0x7
// GFX1250-NEXT: global_store_b128
// GFX1250-NEXT: s_wait_loadcnt 0x6
// GFX1250-NEXT: global_store_b128
// GFX1250-LABEL: {{^}}ep_combine_pull_bf16:
// GFX1250: global_load_b128
// GFX1250-LABEL: .amdhsa_kernel ep_combine_pull_bf16

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "fp8_e4m3fnuz", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
