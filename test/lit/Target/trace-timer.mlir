// REQUIRES: amdgpu-target, nvptx-target
// RUN: mori-compile %s --trace --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=GFX9
// RUN: mori-compile %s --trace --target=gfx950 --emit=isa -o - | FileCheck %s --check-prefix=GFX9
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --trace --target=gfx1250 --emit=isa -o - | FileCheck %s --check-prefix=GFX12
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --trace --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --trace --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=SHFL
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=SHFL
// RUN: sed -e 's/wave_size = 64/wave_size = 32/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=OFF --implicit-check-not=globaltimer --implicit-check-not=__mori_trace

// The IntraNode dispatch's phase trace points (docs/tracing.md) on every target: the timer is the GPU's global
// one (sm_90 %globaltimer, CDNA s_memrealtime, gfx12 s_sendmsg_rtn_b64 REALTIME), the trace-buffer address
// a global the runtime writes (exported: never internalized), the store a plain 8-byte store by lane 0.
// Without --trace there is no trace code at all. The trace code never branches on the lane: the kernel keeps
// exactly its 2 block barriers and 54 warp shuffles (a lane-0 branch once let LLVM duplicate the code after it
// per lane group, and the copies' shuffles deadlocked on sm_90).

// GFX9-LABEL: ep_dispatch_bf16:
// GFX9: s_memrealtime
// GFX9: __mori_trace_ep_dispatch_bf16
// GFX9: global_store_dwordx2
// GFX9: .globl __mori_trace_ep_dispatch_bf16

// GFX12-LABEL: ep_dispatch_bf16:
// GFX12: s_sendmsg_rtn_b64 {{.*}}sendmsg(MSG_RTN_GET_REALTIME)
// GFX12: .globl __mori_trace_ep_dispatch_bf16

// PTX: .visible .global .align 8 .b8 __mori_trace_ep_dispatch_bf16[16];
// PTX-LABEL: .entry ep_dispatch_bf16(
// PTX: mov.u64 {{.*}}, %globaltimer;
// PTX: ld.global.b64 {{.*}}[__mori_trace_ep_dispatch_bf16]
// The slot count (word 1) bounds the store: nothing past the buffer, whatever grid replays the kernel.
// PTX: ld.global.b64 {{.*}}[__mori_trace_ep_dispatch_bf16+8]
// PTX: setp.{{(lt|ge)}}.u64
// PTX: st.global.{{[bu]}}64 [%rd{{[0-9]+}}], %rd{{[0-9]+}};
// PTX: atom.{{.*}}add
// PTX-COUNT-2: bar.sync
// PTX-NOT: bar.sync

// SHFL-LABEL: .entry ep_dispatch_bf16(
// SHFL-COUNT-54: shfl.sync
// SHFL-NOT: shfl.sync

// OFF-LABEL: .entry ep_dispatch_bf16(

module attributes {gpu.container_module} {
  gpu.module @m {
    "mori_ep.dispatch"() {world_size = 4 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 4 : i64, experts_per_rank = 4 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, scale_bytes = 0 : i64, warps_per_block = 4 : i64, wave_size = 64 : i64} : () -> ()
  }
}
