// REQUIRES: amdgpu-target
// RUN: mori-compile ring_put_signal --target=gfx942 --emit=isa -o - | FileCheck %s
// RUN: mori-compile ring_put_signal --target=gfx942 --emit=isa --code-object-version=5 -o - | FileCheck %s --check-prefix=COV5

// The built-in ring_put_signal example on gfx942 (wave64, code object v6 by default): the memory-ordering
// instructions of the put + signal protocol and of the wait, as the AMDGPU memory model lowers them.

// COV5: .amdhsa_code_object_version 5
// CHECK: .amdgcn_target "amdgcn-amd-amdhsa--gfx942"
// CHECK-NEXT: .amdhsa_code_object_version 6
// CHECK-LABEL: ring_put_signal:

// Payload: 16-byte vector copies, loaded from the local source, stored through the flat peer address.
// CHECK: global_load_dwordx4 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}], off
// CHECK: flat_store_dwordx4 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}]

// Writer: system-scope release (L2 write-back, wait for the stores) before the block barrier.
// CHECK: buffer_wbl2 sc0 sc1
// CHECK-NEXT: s_waitcnt vmcnt(0)
// CHECK-NEXT: s_barrier

// Signal: a release fetch-add at system scope (write-back first; sc1 = system scope on the atomic).
// CHECK: buffer_wbl2 sc0 sc1
// CHECK-NEXT: {{(flat|global)}}_atomic_add_x2 {{.*}} sc1{{$}}

// Waiter: the first poll and the loop's polls are system-scope loads (sc0 sc1), with s_sleep between.
// CHECK: {{(flat|global)}}_load_dwordx2 v[{{[0-9]+:[0-9]+}}], {{.*}} sc0 sc1{{$}}
// CHECK: s_sleep 1
// CHECK-NEXT: {{(flat|global)}}_load_dwordx2 v[{{[0-9]+:[0-9]+}}], {{.*}} sc0 sc1{{$}}

// Then the seq_cst system fence (write-back, then invalidate) and the block barrier ending the kernel.
// CHECK: buffer_wbl2 sc0 sc1
// CHECK: buffer_inv sc0 sc1
// CHECK: s_barrier
// CHECK-NEXT: s_endpgm

// Kernel descriptor: wave64 (no wavefront_size32 directive); the VGPR count agrees with the metadata.
// CHECK: .amdhsa_kernel ring_put_signal
// CHECK-NOT: .amdhsa_wavefront_size32
// CHECK: .amdhsa_next_free_vgpr [[VGPR:[0-9]+]]
// CHECK-NOT: .amdhsa_wavefront_size32
// CHECK: .end_amdhsa_kernel
// CHECK: .set ring_put_signal.num_vgpr, [[VGPR]]
// CHECK: amdhsa.kernels:
// CHECK: .max_flat_workgroup_size: 256
// CHECK: .name: ring_put_signal
// CHECK: .vgpr_count: [[VGPR]]
// CHECK: .wavefront_size: 64
// CHECK: amdhsa.target: amdgcn-amd-amdhsa--gfx942
