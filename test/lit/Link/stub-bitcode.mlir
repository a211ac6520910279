// REQUIRES: amdgpu-target, nvptx-target, ld-lld
// RUN: %python -c "from mori_compiler.lib_bitcode.stub import write_stub_bitcode; write_stub_bitcode('%t.amdgcn.bc', 'amdgcn-amd-amdhsa')"
// RUN: %python -c "from mori_compiler.lib_bitcode.stub import write_stub_bitcode; write_stub_bitcode('%t.nvptx.bc', 'nvptx64-nvidia-cuda')"
// RUN: %python -c "from mori_compiler.lib_bitcode.stub import write_stub_bitcode; write_stub_bitcode('%t.partial.bc', 'amdgcn-amd-amdhsa', symbols=['mori_shmem_n_pes'])"
// RUN: mori-compile %s --bitcode %t.amdgcn.bc -o %t.hsaco | FileCheck %s --check-prefix=AMDGCN
// RUN: mori-compile %s --target=sm_90 --bitcode %t.nvptx.bc -o %t.ptx
// RUN: FileCheck %s --check-prefix=NVPTX --input-file=%t.ptx
// RUN: not mori-compile %s --bitcode %t.partial.bc -o %t.x 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not mori-compile %s --no-device-library -o %t.x 2>&1 | FileCheck %s --check-prefix=NOLIB
// RUN: not mori-compile %s --bitcode %t.nvptx.bc -o %t.x 2>&1 | FileCheck %s --check-prefix=TRIPLE
// RUN: not mori-compile %s --target=sm_90 --bitcode %t.amdgcn.bc -o %t.x 2>&1 | FileCheck %s --check-prefix=TRIPLE-NV
// RUN: not mori-compile %s --bitcode %s -o %t.x 2>&1 | FileCheck %s --check-prefix=NOT-BC
// RUN: not mori-compile %s --bitcode %t.does-not-exist.bc -o %t.x 2>&1 | FileCheck %s --check-prefix=NO-FILE

// Linking a device bitcode given with --bitcode instead of the project's library (here the test stub of
// lib_bitcode/stub.py, which defines all 98 ABI functions), and the link checks that reject bad ones.
module attributes {gpu.container_module} {
  gpu.module @stub_link {
    gpu.func @k(%buf: !llvm.ptr, %sig: !llvm.ptr, %n: i64) kernel {
      %me = "mori_shmem.my_pe"() : () -> i32
      %one = arith.constant 1 : i64
      "mori_shmem.putmem_nbi_signal"(%buf, %buf, %n, %sig, %one, %me, %me) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      %seen = "mori_shmem.wait_until"(%sig, %one) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
      "mori_shmem.fence"() : () -> ()
      gpu.return
    }
  }
}

// The full stub links for gfx942 into an hsaco (no undefined symbols), and for sm_90 into PTX.
// AMDGCN: wrote {{.*}}.hsaco ({{[0-9]+}} bytes, gfx942)
// AMDGCN: amdgcn-amd-amdhsa--gfx942: code object v6
// AMDGCN: {{^ *}}k {{[0-9]+}}
// NVPTX: .target sm_90
// NVPTX-NOT: .extern .func
// NVPTX: .visible .entry k(

// A stub with only n_pes: every function the kernel calls is named as undefined.
// MISSING: error: {{.*}}stub-bitcode.mlir:{{[0-9]+}}:{{[0-9]+}}: gpu.module @stub_link calls undefined functions:
// MISSING-SAME: mori_shmem_fence_thread
// MISSING-SAME: mori_shmem_my_pe
// MISSING-SAME: mori_shmem_putmem_nbi_signal_block
// MISSING-SAME: mori_shmem_uint64_wait_until_greater_than
// MISSING-SAME: (--bitcode PATH)
// MISSING-NOT: Traceback

// No device library at all: the same error.
// NOLIB: error: {{.*}}stub-bitcode.mlir:{{[1-9][0-9]*}}:{{[0-9]+}}: gpu.module @stub_link calls undefined functions: mori_shmem_fence_thread, mori_shmem_my_pe, mori_shmem_putmem_nbi_signal_block, mori_shmem_uint64_wait_until_greater_than;

// A bitcode for the other GPU vendor names both triples.
// TRIPLE: error: device bitcode {{.*}}.nvptx.bc is for 'nvptx64-nvidia-cuda', but target gfx942 needs 'amdgcn-amd-amdhsa'
// TRIPLE-NV: error: device bitcode {{.*}}.amdgcn.bc is for 'amdgcn-amd-amdhsa', but target sm_90 needs 'nvptx64-nvidia-cuda'

// A file that is not LLVM bitcode at all, and one that does not exist.
// NOT-BC: error: {{.*}}stub-bitcode.mlir is not a valid LLVM bitcode file (LLVM bitcode parsing error Invalid bitcode signature)
// NO-FILE: error: device bitcode file not found: {{.*}}.does-not-exist.bc
