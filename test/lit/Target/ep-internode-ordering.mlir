// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// The inter-node signal protocols in machine code (InterNodeV1, 2 nodes of 4 PEs; docs/ep-protocols.md §16,
// passes/ep_internode_kernels.py). Dispatch, chunked send: the ballot of the chunk's tokens, the runs' puts,
// then every lane's release fence and lane 0's release store of the round-tagged signal, with no store
// between them. Receive-and-forward: the chunk signal polled with system-scope loads and a back-off, an
// acquire fence, and only then the slot reservation on the node peer (a system-scope fetch-add).
// Combine: the node barrier (release fence, epoch stores, polls, acquire fence: fence.acq_rel.sys); a record counted done only
// after a release fence, and the chunk's partials sent after an acquire fence; the hierarchical sum reads
// the received partials only after the chunk wait and an acquire fence.

// ISA-LABEL: ep_inter_dispatch_bf16:
// ISA: s_bcnt1_i32_b64
// ISA: buffer_wbl2 sc0 sc1
// ISA-NOT: _store_
// ISA: flat_store_dwordx2 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}] sc0 sc1
// ISA: flat_load_dwordx2 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}] sc0 sc1
// ISA: s_sleep 1
// ISA: buffer_wbl2 sc0 sc1
// ISA-NEXT: s_waitcnt
// ISA-NEXT: buffer_inv sc0 sc1
// ISA: flat_atomic_add v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}} sc0 sc1
// ISA: s_endpgm

// PTX-LABEL: .entry ep_inter_dispatch_bf16(
// PTX: shfl.sync.bfly.b32
// PTX: popc.b64
// PTX: fence.acq_rel.sys;
// PTX-NOT: {{[[:space:]]st\.}}
// PTX: st.release.sys.b64
// PTX: ld.relaxed.sys.global.b64
// PTX: nanosleep.u32
// PTX: fence.sc.sys;
// PTX: atom.relaxed.sys.add.u32
// PTX: bar.sync 0;
// PTX: ret;
// PTX-LABEL: .entry ep_inter_combine_bf16(
// PTX: bar.sync 0;
// PTX: fence.acq_rel.sys;
// PTX: st.relaxed.sys.b64
// PTX: ld.relaxed.sys.global.b64
// PTX: fence.acq_rel.sys;
// PTX: bar.sync 0;
// PTX: fence.sc.sys;
// PTX: atom.global.add.u32
// PTX: fence.sc.sys;
// PTX: fence.acq_rel.sys;
// PTX-NOT: {{[[:space:]]st\.}}
// PTX: st.release.sys.b64
// PTX: ret;
// PTX-LABEL: .entry ep_inter_combine_all_bf16(
// PTX: ld.relaxed.sys.global.b64
// PTX: nanosleep.u32
// PTX: fence.sc.sys;
// PTX: ld.global.v4.b32
// PTX: bar.sync 0;
// PTX: atom.global.add.u64
// PTX: ret;

module attributes {gpu.container_module} {
  gpu.module @mori_ep_internode {
    "mori_ep.internode_stage"() {world_size = 8 : i64, hidden = 2048 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, dtype = "bf16", scale_bytes = 0 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
    "mori_ep.internode_dispatch"() {world_size = 8 : i64, hidden = 2048 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, dtype = "bf16", scale_bytes = 0 : i64, gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64} : () -> ()
    "mori_ep.internode_combine"() {world_size = 8 : i64, hidden = 2048 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, dtype = "bf16", gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.internode_combine_all"() {world_size = 8 : i64, hidden = 2048 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 128 : i64, max_recv_per_rank = 128 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64, dtype = "bf16", gpu_per_node = 4 : i64, hop_size = 4 : i64, send_all = 0 : i64, num_qp = 1 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}

