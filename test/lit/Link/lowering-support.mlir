// REQUIRES: amdgpu-target
// RUN: mori-compile %s --no-device-library --emit=isa -o - | FileCheck %s
// RUN: mori-compile %s --no-device-library --code-object-version=5 --emit=isa -o - | FileCheck %s
// RUN: mori-compile %s --target=gfx1250 --no-device-library --emit=isa -o - | FileCheck %s

// gpu.block_dim / gpu.grid_dim lower (convert-gpu-to-rocdl) to calls of ROCm's ockl __ockl_get_local_size /
// __ockl_get_num_groups. Without the project's library (--no-device-library, --bitcode) the lowering-support
// bitcode (lib_bitcode/sources/lowering_support_amdgcn.ll) defines them from the code object v5/v6 hidden
// kernel arguments: block_count_{x,y,z} u32 at 0/4/8, group_size_{x,y,z} u16 at 12/14/16 after the explicit
// arguments (here one 8-byte pointer). Both inline: no call, no ROCm bitcode, no undefined symbol; the
// partial-workgroup remainder (ockl's get_local_size) folds away for these kernels.
module attributes {gpu.container_module} {
  gpu.module @dims {
    gpu.func @k(%out: !llvm.ptr) kernel {
      %b = gpu.block_dim x
      %g = gpu.grid_dim y
      %b64 = arith.index_cast %b : index to i64
      %g64 = arith.index_cast %g : index to i64
      %s = arith.addi %b64, %g64 : i64
      llvm.store %s, %out : i64, !llvm.ptr
      gpu.return
    }
  }
}

// CHECK-LABEL: {{^}}k:
// CHECK-NOT: s_swappc
// CHECK-DAG: s_load_{{b32|dword}} {{s[0-9]+}}, s[0:1], 0x14
// CHECK-DAG: s_load_{{b32|dword}} {{s[0-9]+}}, s[0:1], 0xc
// CHECK-NOT: s_swappc
// CHECK: s_endpgm
// CHECK-NOT: __ockl
// CHECK: .offset: 8
// CHECK-NEXT: .size: 4
// CHECK-NEXT: .value_kind: hidden_block_count_x
// CHECK: .offset: 20
// CHECK-NEXT: .size: 2
// CHECK-NEXT: .value_kind: hidden_group_size_x
