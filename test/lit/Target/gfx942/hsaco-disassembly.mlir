// REQUIRES: amdgpu-target, ld-lld, llvm-objdump
// RUN: mori-compile -o %t.hsaco --no-report
// RUN: %llvm-objdump -d %t.hsaco | FileCheck %s

// The assembled and linked code object (not only the assembly text) holds the protocol's ordering
// instructions: the default `mori-compile` output disassembled with llvm-objdump.
// CHECK: file format elf64-amdgpu
// CHECK-LABEL: <ring_put_signal>:
// CHECK: buffer_wbl2 sc0 sc1
// CHECK-NEXT: s_waitcnt vmcnt(0)
// CHECK-NEXT: s_barrier
// CHECK: buffer_wbl2 sc0 sc1
// CHECK-NEXT: {{(flat|global)}}_atomic_add_x2 {{.*}} sc1 //
// CHECK: s_sleep 1
// CHECK-NEXT: {{(flat|global)}}_load_dwordx2 {{.*}} sc0 sc1 //
// CHECK: buffer_inv sc0 sc1
// CHECK: s_barrier
// CHECK-NEXT: s_endpgm
