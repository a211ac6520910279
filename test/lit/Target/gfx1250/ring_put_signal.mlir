// REQUIRES: amdgpu-target
// RUN: mori-compile ring_put_signal --target=gfx1250 --emit=isa -o - | FileCheck %s

// The built-in ring_put_signal example on gfx1250 (wave32, gfx12 memory model): L2 write-back with
// global_wb, split wait counters (s_wait_storecnt / s_wait_loadcnt), `scope:SCOPE_SYS` on the atomic and
// the polls, and the split barrier (s_barrier_signal / s_barrier_wait).

// CHECK: .amdgcn_target "amdgcn-amd-amdhsa--gfx1250"
// CHECK-NEXT: .amdhsa_code_object_version 6
// CHECK-LABEL: ring_put_signal:

// Payload: 16-byte vector copies.
// CHECK: global_load_b128 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}], off
// CHECK: flat_store_b128 v[{{[0-9]+:[0-9]+}}], v[{{[0-9]+:[0-9]+}}]

// Writer: system-scope release (write-back, wait for the stores) before the block barrier.
// CHECK: global_wb scope:SCOPE_SYS
// CHECK-NEXT: s_wait_storecnt{{(_dscnt)?}} 0x0
// CHECK-NEXT: s_barrier_signal -1
// CHECK: s_barrier_wait -1

// Signal: write-back, wait for it, then the fetch-add at system scope.
// CHECK: global_wb scope:SCOPE_SYS
// CHECK-NEXT: s_wait_storecnt 0x0
// CHECK-NEXT: {{(flat|global)}}_atomic_add_u64 {{.*}} scope:SCOPE_SYS{{$}}

// Waiter: system-scope polls with s_sleep between.
// CHECK: {{(flat|global)}}_load_b64 v[{{[0-9]+:[0-9]+}}], {{.*}} scope:SCOPE_SYS{{$}}
// CHECK: s_sleep 1
// CHECK-NEXT: {{(flat|global)}}_load_b64 v[{{[0-9]+:[0-9]+}}], {{.*}} scope:SCOPE_SYS{{$}}

// The seq_cst system fence: write-back, wait, invalidate; then the final block barrier.
// CHECK: global_wb scope:SCOPE_SYS
// CHECK: s_wait_storecnt
// CHECK: global_inv scope:SCOPE_SYS
// CHECK: s_wait_loadcnt
// CHECK: s_barrier_signal -1
// CHECK-NEXT: s_barrier_wait -1
// CHECK-NEXT: s_endpgm

// Kernel descriptor and metadata: wave32.
// CHECK: .amdhsa_kernel ring_put_signal
// CHECK: .amdhsa_wavefront_size32 1
// CHECK: .amdhsa_next_free_vgpr [[VGPR:[0-9]+]]
// CHECK: .end_amdhsa_kernel
// CHECK: .vgpr_count: [[VGPR]]
// CHECK: .wavefront_size: 32
// CHECK: amdhsa.target: amdgcn-amd-amdhsa--gfx1250
