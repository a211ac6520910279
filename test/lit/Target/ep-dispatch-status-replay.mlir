// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=ISA
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// The IntraNode dispatch's status words and routing replay (docs/ep-protocols.md §17), world 4, top-k 4,
// 4 experts per rank, 64 slots per source (R = 256). The invalid-id count is a relaxed, device-scope
// atomic add on status word 1 (byte 4: nothing orders it, the host reads it after the kernel), next to the
// overflow count on word 0; a replay takes the recorded forward code (pe = code / R, slot = code % R, R
// when it names another PE) with no atomic; only the other path reserves (the system-scope fetch-add).

// ISA-LABEL: ep_dispatch_bf16:
// ISA-NOT: buffer_wbl2
// ISA: global_atomic_add v{{[0-9]+}}, v{{[0-9]+}}, s[[[STATUS:[0-9]+:[0-9]+]]] offset:4 sc1
// ISA: flat_atomic_add v{{[0-9]+}}, v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}} sc0 sc1
// ISA: global_atomic_add v{{[0-9]+}}, v{{[0-9]+}}, s[[[STATUS]]] sc1{{$}}
// ISA: s_endpgm

// PTX-LABEL: .entry ep_dispatch_bf16(
// PTX: ld.param.b64 {{%rd[0-9]+}}, [ep_dispatch_bf16_param_19];
// PTX-NOT: fence
// PTX: atom.global.add.u32 {{%r[0-9]+}}, [[[STATUS:%rd[0-9]+]]+4], 1;
// PTX-NOT: atom.
// PTX: ld.global.b32 [[CODE:%r[0-9]+]], [%rd{{[0-9]+}}];
// PTX-NEXT: shr.u32 {{%r[0-9]+}}, [[CODE]], 8;
// PTX-NOT: atom.
// PTX: selp.b32 {{%r[0-9]+}}, {{%r[0-9]+}}, 256, {{%p[0-9]+}};
// PTX-NEXT: bra.uni
// PTX: atom.relaxed.sys.add.u32
// PTX: atom.global.add.u32 {{%r[0-9]+}}, [[[STATUS]]], 1;
// PTX: ret;

module attributes {gpu.container_module} {
  gpu.module @m {
    "mori_ep.dispatch"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 4 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64} : () -> ()
  }
}
