// REQUIRES: nvptx-target, amdgpu-target
// RUN: mori-compile %s --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA

// The collectives' protocols in machine code (passes/coll_kernels.py, docs/collectives.md), world 4: each
// kernel's stage stores (the stage at 1536; the path of an input outside the heap) and the store of
// its place into sources[b] come before its first device barrier, whose thread p fences (release, system scope:
// sm_90 fence.acq_rel.sys, gfx942 buffer_wbl2 sc0 sc1 + s_waitcnt vmcnt(0)), stores the epoch into PE p's
// slot (relaxed, system scope: st.relaxed.sys / flat_store sc0 sc1), polls its own slot (ld.relaxed.sys /
// flat_load sc0 sc1), fences (acquire: fence.acq_rel.sys / buffer_inv sc0 sc1) and meets the block
// (bar.sync / s_barrier). No load from a peer (on sm_90 a generic ld: the peers' addresses come from
// mori_shmem.ptr) comes before that acquire and block barrier; the pulls come after it, and a closing barrier of the same
// shape (the workspace is free for the next call) ends every kernel (these are compiled without virtual PEs:
// with them, one launch, the launch's end closes the call: mori-coll-to-kernels.mlir's ONELAUNCH run).
// all_gather, broadcast and all_to_all meet first with the barrier in halves (as two-shot's middle one):
// between the release's slot store and the polls only this PE's own part is copied (a global-space load:
// sm_90 ld.global, gfx942 SGPR-based global_load), no peer load (generic ld / flat) follows the release.

// all_gather: the stage's byte stores, the barrier (release, slot store, polls, acquire, block barrier), only then the loads from the peers' stages (generic ld: peer addresses), then the closing barrier.
// PTX-LABEL: .visible .entry coll_all_gather_u8_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.b8 [%rd{{[0-9]+}}+1536]
// The place's offset (stage or input) into sources[b], before the release; read back after the acquire
// (lane l: PE l mod 4's word), each peer's shuffled from its lane before that peer's pull.
// PTX:      st.global.b64 [%rd{{[0-9]+}}+1280], %rd{{[0-9]+}};
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.global.v4.b32
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.b64
// PTX:      shfl.sync.idx.b32
// PTX:      shfl.sync.idx.b32
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_all_gather_u8_w4_n100:
// ISA:      global_store_{{byte|dwordx4}} {{.*}} offset:1536
// ISA:      global_store_dwordx2 v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], s[{{[0-9]+:[0-9]+}}]{{( offset:1280)?$}}
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA:      global_load_dwordx4 v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}}, s[{{[0-9]+:[0-9]+}}]{{$}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// broadcast: the root's stage stores, the barrier, the pull of the root's stage, the closing barrier.
// PTX-LABEL: .visible .entry coll_broadcast_root3_f32_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.v4.b32 [%rd{{[0-9]+}}+1536]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.global.v4.b32
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_broadcast_root3_f32_w4_n100:
// ISA:      global_store_dwordx4 {{.*}} offset:1536
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA:      global_load_dwordx4 v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}}, s[{{[0-9]+:[0-9]+}}]{{$}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// all_to_all: the four chunks staged (the last at 1536 + 3 x 400), the barrier, the pulls, the closing barrier.
// PTX-LABEL: .visible .entry coll_all_to_all_i32_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.b8 [%rd{{[0-9]+}}+1936]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.global.v4.b32
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_all_to_all_i32_w4_n100:
// ISA:      global_store_{{byte|dwordx4}} {{.*}} offset:1536
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA:      global_load_dwordx4 v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}}, s[{{[0-9]+:[0-9]+}}]{{$}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// reduce_scatter: the four chunks staged (stride 208), the barrier, the four peers' loads, the block barrier before the copy of the sums, the closing barrier.
// PTX-LABEL: .visible .entry coll_reduce_scatter_bf16_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.b8 [%rd{{[0-9]+}}+2160]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_reduce_scatter_bf16_w4_n100:
// ISA:      global_store_{{byte|dwordx4}} {{.*}} offset:1536
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// one-shot all_reduce: stage, barrier, the four peers' vectors, the sum stored to `reduced` (1792), the block barrier, the copy out of `reduced`, the closing barrier.
// PTX-LABEL: .visible .entry coll_all_reduce_one_shot_f32_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.v4.b32 [%rd{{[0-9]+}}+1536]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      st.global.v4.b32 [%rd{{[0-9]+}}+2048]
// PTX:      bar.sync 0;
// PTX:      ld.global.v4.b32 {{.*}}+2048]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_all_reduce_one_shot_f32_w4_n100:
// ISA:      global_store_dwordx4 {{.*}} offset:1536
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      global_store_dwordx4 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}], off
// ISA:      s_barrier
// ISA:      global_load_dwordx4 {{.*}} offset:2048
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// two-shot all_reduce: stage (the first share at 1536; the last, short one's byte loop is laid out after the
// kernel's end, so the text order cannot show it), barrier, the peers' share loads, the barrier that publishes the sums (in halves: this PE's own share read from its `reduced`, 1792, between its slot store and polls), the loads of the peers' sums, the closing barrier.
// PTX-LABEL: .visible .entry coll_all_reduce_two_shot_bf16_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.v4.b32 [%rd{{[0-9]+}}+1536]
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.global.v4.b32
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_all_reduce_two_shot_bf16_w4_n100:
// ISA:      global_store_{{byte|dwordx4}} {{.*}} offset:1536
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// (Between the polls and the acquire only the staging of the short last share may sit in the text: its
// loop, laid out there, loads this PE's own input (global_load); a peer's bytes would be a flat_load.)
// ISA-NOT:  {{flat_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA:      global_load_dwordx4 {{.*}} offset:1792
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

// all_to_all_v: the published split (its store into the workspace's sizes[b] at 2560) and the staged chunks come
// before the barrier's release; the peers' sizes (generic 64-bit loads) and chunks are read after its acquire.
// PTX-LABEL: .visible .entry coll_all_to_all_v_bf16_w4_n100(
// PTX-NOT:  {{ld(\.v4)?\.b(8|32)}} 
// PTX:      st.global.b32 [%rd{{[0-9]+}}+2560]
// PTX:      st.global.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX:      ld.b64
// PTX:      ld.v4.b32
// PTX:      bar.sync 0;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      fence.acq_rel.sys;
// PTX:      st.relaxed.sys.b64
// PTX:      ld.relaxed.sys.global.b64
// PTX:      fence.acq_rel.sys;
// PTX-NOT:  {{ld(\.global)?(\.v4)?\.b(8|32)}} 
// PTX:      bar.sync 0;
// PTX-NOT:  bar.sync
// PTX:      ret;
// ISA-LABEL: coll_all_to_all_v_bf16_w4_n100:
// ISA:      global_store_dwordx2 {{.*}} offset:2560
// ISA:      global_store_dwordx4
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA:      flat_load_dwordx2
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      global_load_dwordx4
// ISA:      s_barrier
// ISA:      buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt vmcnt(0)
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_store_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      flat_load_dwordx2 {{.*}} sc0 sc1
// ISA-NOT:  {{(global|flat)_load_(ubyte|dwordx4)}}
// ISA:      buffer_inv sc0 sc1
// ISA:      s_barrier
// ISA-NOT:  s_barrier
// ISA:      s_endpgm

module attributes {gpu.container_module} {
  gpu.module @mori_coll {
    gpu.func @coll_all_gather_u8_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_gather"(%input, %output, %workspace) {dtype = "u8", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_broadcast_root3_f32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.broadcast"(%input, %output, %workspace) {dtype = "f32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, root = 3 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_all_to_all_i32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all"(%input, %output, %workspace) {dtype = "i32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_reduce_scatter_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.reduce_scatter"(%input, %output, %workspace) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_all_reduce_one_shot_f32_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%input, %output, %workspace) {dtype = "f32", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "one_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_all_reduce_two_shot_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%input, %output, %workspace) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "two_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
    gpu.func @coll_all_to_all_v_bf16_w4_n100(%input: !llvm.ptr, %output: !llvm.ptr, %workspace: !llvm.ptr, %splits: !llvm.ptr, %recv_counts: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all_v"(%input, %output, %workspace, %splits, %recv_counts) {dtype = "bf16", count = 100 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}
