// REQUIRES: amdgpu-target
// RUN: mori-compile %s --target=gfx942 --emit=isa -o - | FileCheck %s

// Does not hold: the EP kernels are built for at most 256 work-items per workgroup, but
// EpDispatchCombineOp launches warp_num_per_block x wave_size = 8 x 64 = 512 (warps_per_block = 8 here).
// mori-ep-to-kernels sets no workgroup-size attribute on the gpu.func kernels, so MLIR's ROCDL
// translation gives every rocdl.kernel its default "amdgpu-flat-work-group-size"="1,256"; the metadata
// then says `.max_flat_workgroup_size: 256`. HIP refuses such a launch ("Launch params (512, 1, 1) are
// larger than launch bounds (256)", hipErrorLaunchFailure), and the register budget is chosen for 256.
// Expected: each kernel's bound covers warps_per_block x wave_size.
// CHECK-LABEL: amdhsa.kernels:
// CHECK: .max_flat_workgroup_size: {{512|1024}}
// CHECK-NEXT: .name: ep_dispatch_bf16
// CHECK: .max_flat_workgroup_size: {{512|1024}}
// CHECK-NEXT: .name: ep_combine_pull_bf16
// CHECK: .max_flat_workgroup_size: {{512|1024}}
// CHECK-NEXT: .name: ep_combine_push_bf16

module attributes {gpu.container_module} {
  gpu.module @ep {
    "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 1 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64, max_blocks = 1024 : i64} : () -> ()
  }
}
