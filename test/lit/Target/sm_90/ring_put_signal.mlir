// REQUIRES: nvptx-target
// RUN: mori-compile ring_put_signal --target=sm_90 --emit=isa -o - | FileCheck %s
// RUN: mori-compile ring_put_signal --target=sm_90 -o - | FileCheck %s --check-prefix=DEFAULT

// The built-in ring_put_signal example as PTX for sm_90: the release fence before the block barrier,
// the signal's release atomic at system scope (inline PTX: LLVM 22 would drop both), the wait loop's
// relaxed system-scope polls with nanosleep, and the sequentially consistent system fence.

// The default output for an NVIDIA target is the PTX itself.
// DEFAULT: .version 7.8
// DEFAULT: .visible .entry ring_put_signal(

// CHECK: .version 7.8
// CHECK-NEXT: .target sm_90
// CHECK-NEXT: .address_size 64
// CHECK: .visible .entry ring_put_signal(
// CHECK: .maxntid 256, 1, 1

// Payload: 16-byte vector copies.
// CHECK: ld.global.v4.b32 {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, [%rd{{[0-9]+}}];
// CHECK: st.v4.b32 [%rd{{[0-9]+}}], {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}};

// Writer: release fence at system scope, then the block barrier; then the signal.
// CHECK: fence.acq_rel.sys;
// CHECK-NEXT: bar.sync 0;
// CHECK: atom.release.sys.add.u64 %rd{{[0-9]+}}, [%rd{{[0-9]+}}], %rd{{[0-9]+}};

// Waiter: relaxed system-scope polls, nanosleep between them, then fence.sc.sys and the barrier.
// CHECK: ld.relaxed.sys{{(.global)?}}.b64 %rd{{[0-9]+}}, [%rd{{[0-9]+}}];
// CHECK: nanosleep.u32 32;
// CHECK-NEXT: ld.relaxed.sys{{(.global)?}}.b64 %rd{{[0-9]+}}, [%rd{{[0-9]+}}];
// CHECK: fence.sc.sys;
// CHECK: bar.sync 0;
// CHECK-NEXT: ret;
