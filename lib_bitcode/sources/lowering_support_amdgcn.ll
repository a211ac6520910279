; Lowering support for AMDGPU: the functions MLIR's convert-gpu-to-rocdl lowering calls that are not part
; of MORI's device ABI. gpu.block_dim and gpu.grid_dim become calls of ROCm's device-library (ockl) work-item
; queries; a device bitcode other than the project's library (MORI's libmori_shmem_device.bc keeps its copies
; internal) does not export them, so this module is linked beside such a bitcode (options.device_bitcode) and
; code objects never need ROCm's ockl.
;
; The definitions read what ROCm's ockl reads for code object v5 and v6 (the only versions the compiler
; emits): the hidden kernel arguments that start at llvm.amdgcn.implicitarg.ptr (AMDGPUUsage, "Code Object V5
; Metadata"; v6 keeps the v5 layout):
;
;   offset  0, 4, 8   u32  hidden_block_count_{x,y,z}  workgroups in the grid per dimension
;   offset 12, 14, 16 u16  hidden_group_size_{x,y,z}   workgroup size per dimension
;   offset 18, 20, 22 u16  hidden_remainder_{x,y,z}    size of the last, partial workgroup (0 if none)
;
; get_local_size is the group size, or the remainder in the grid's last partial workgroup (OpenCL semantics,
; as ockl); get_num_groups is the block count. A dimension outside 0..2 answers 1, as ockl does. The loads are
; kept in the shape the AMDGPU backend recognizes (constant offsets from implicitarg.ptr after inlining), so
; a known block size or a uniform grid folds them. Definitions are linkonce_odr: a bitcode that brings its own
; exported copies wins without a clash.

declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workgroup.id.y()
declare i32 @llvm.amdgcn.workgroup.id.z()

define internal i32 @__mc_support_group_id(i32 %dim) alwaysinline nounwind {
entry:
  switch i32 %dim, label %z [
    i32 0, label %x
    i32 1, label %y
  ]
x:
  %gx = call i32 @llvm.amdgcn.workgroup.id.x()
  ret i32 %gx
y:
  %gy = call i32 @llvm.amdgcn.workgroup.id.y()
  ret i32 %gy
z:
  %gz = call i32 @llvm.amdgcn.workgroup.id.z()
  ret i32 %gz
}

; The u32 hidden_block_count of %dim (in 0..2).
define internal i32 @__mc_support_block_count(i32 %dim) alwaysinline nounwind {
  %args = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
  %d = zext i32 %dim to i64
  %off = shl i64 %d, 2
  %p = getelementptr inbounds i8, ptr addrspace(4) %args, i64 %off
  %n = load i32, ptr addrspace(4) %p, align 4, !invariant.load !0
  ret i32 %n
}

define linkonce_odr hidden i64 @__ockl_get_local_size(i32 %dim) alwaysinline nounwind {
entry:
  %ok = icmp ult i32 %dim, 3
  br i1 %ok, label %query, label %other
query:
  %args = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
  %d = zext i32 %dim to i64
  %d2 = shl i64 %d, 1
  %size_off = add i64 %d2, 12
  %rem_off = add i64 %d2, 18
  %size_p = getelementptr inbounds i8, ptr addrspace(4) %args, i64 %size_off
  %rem_p = getelementptr inbounds i8, ptr addrspace(4) %args, i64 %rem_off
  %size16 = load i16, ptr addrspace(4) %size_p, align 2, !invariant.load !0
  %rem16 = load i16, ptr addrspace(4) %rem_p, align 2, !invariant.load !0
  %group = call i32 @__mc_support_group_id(i32 %dim)
  %count = call i32 @__mc_support_block_count(i32 %dim)
  %full = icmp ult i32 %group, %count
  %v16 = select i1 %full, i16 %size16, i16 %rem16
  %v = zext i16 %v16 to i64
  ret i64 %v
other:
  ret i64 1
}

define linkonce_odr hidden i64 @__ockl_get_num_groups(i32 %dim) alwaysinline nounwind {
entry:
  %ok = icmp ult i32 %dim, 3
  br i1 %ok, label %query, label %other
query:
  %n = call i32 @__mc_support_block_count(i32 %dim)
  %v = zext i32 %n to i64
  ret i64 %v
other:
  ret i64 1
}

!0 = !{}
