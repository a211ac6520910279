// REQUIRES: amdgpu-target, ld-lld, llvm-readelf
// RUN: mori-compile -o %t.hsaco > %t.report
// RUN: %llvm-readelf --file-header --notes %t.hsaco > %t.notes
// RUN: %llvm-readelf -s %t.hsaco > %t.syms
// RUN: cat %t.report %t.notes %t.syms | FileCheck %s
// RUN: FileCheck %s --check-prefix=UND --input-file=%t.syms

// `mori-compile` with no input builds the ring_put_signal example into an hsaco for gfx942 and prints a
// resource report; llvm-readelf must see the same code object the report describes.

// The report: one row per kernel. Capture every column to compare with the AMDHSA metadata below.
// CHECK: wrote {{.*}}.hsaco ({{[0-9]+}} bytes, gfx942)
// CHECK-NEXT: amdgcn-amd-amdhsa--gfx942: code object v6 (ELF ABI version 4, metadata version 1.2), 1 kernel(s)
// CHECK-NEXT: kernel VGPR AGPR SGPR scratch LDS kernarg wave max WG code bytes VGPR spills SGPR spills
// CHECK-NEXT: ring_put_signal [[VGPR:[0-9]+]] [[AGPR:[0-9]+]] [[SGPR:[0-9]+]] [[SCRATCH:[0-9]+]] [[LDS:[0-9]+]] [[KARG:[0-9]+]] [[WAVE:[0-9]+]] [[MAXWG:[0-9]+]] [[CODE:[0-9]+]] [[VSPILL:[0-9]+]] [[SSPILL:[0-9]+]]{{ *$}}

// ELF header: an AMDHSA code object (ELF ABI version 4 = code object v6) for gfx942.
// CHECK: Class: ELF64
// CHECK: OS/ABI: AMDGPU - HSA
// CHECK-NEXT: ABI Version: 4
// CHECK: Machine: EM_AMDGPU
// CHECK: Flags: 0x{{[0-9a-f]+}}, gfx942

// AMDHSA metadata note: the same numbers as the report.
// CHECK: AMDGPU 0x{{[0-9a-f]+}} NT_AMDGPU_METADATA (AMDGPU Metadata)
// CHECK: amdhsa.kernels:
// CHECK-NEXT: - .agpr_count: [[AGPR]]
// CHECK: .group_segment_fixed_size: [[LDS]]
// CHECK: .kernarg_segment_size: [[KARG]]
// CHECK: .max_flat_workgroup_size: [[MAXWG]]
// CHECK: .name: ring_put_signal
// CHECK: .private_segment_fixed_size: [[SCRATCH]]
// CHECK: .sgpr_count: [[SGPR]]
// CHECK-NEXT: .sgpr_spill_count: [[SSPILL]]
// CHECK-NEXT: .symbol: ring_put_signal.kd
// CHECK: .vgpr_count: [[VGPR]]
// CHECK-NEXT: .vgpr_spill_count: [[VSPILL]]
// CHECK-NEXT: .wavefront_size: [[WAVE]]
// CHECK: amdhsa.target: amdgcn-amd-amdhsa--gfx942

// Exported symbols: the kernel (its size is the report's code bytes), its descriptor, and the device
// state global the host runtime fills after loading.
// CHECK: Symbol table '.dynsym'
// CHECK-DAG: {{[0-9a-f]+}} [[CODE]] FUNC GLOBAL PROTECTED {{[0-9]+}} ring_put_signal{{ *$}}
// CHECK-DAG: {{[0-9a-f]+}} 64 OBJECT GLOBAL DEFAULT {{[0-9]+}} ring_put_signal.kd{{ *$}}
// CHECK-DAG: {{[0-9a-f]+}} {{[0-9]+}} OBJECT GLOBAL DEFAULT {{[0-9]+}} mori_compiler_shmem_state{{ *$}}

// No undefined symbol besides the null entry of each symbol table.
// UND: Symbol table '.dynsym'
// UND-NEXT: Num: Value Size Type Bind Vis Ndx Name
// UND-NEXT: 0: {{0+}} 0 NOTYPE LOCAL DEFAULT UND{{ *$}}
// UND-NOT: UND
// UND: Symbol table '.symtab'
// UND-NEXT: Num: Value Size Type Bind Vis Ndx Name
// UND-NEXT: 0: {{0+}} 0 NOTYPE LOCAL DEFAULT UND{{ *$}}
// UND-NOT: UND
