// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=32 chip=sm_90}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-comm-to-calls{wave-size=64 chip=gfx950 global-address-space=true}' | FileCheck %s --check-prefix=AMD
// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=32}' 2>&1 | FileCheck %s --check-prefix=NOCHIP
// RUN: not mori-opt %s -p 'mori-comm-to-calls{wave-size=32 chip=sm_80}' 2>&1 | FileCheck %s --check-prefix=BADCHIP

// The wire-quantization blocks become one helper per (format, scale blocks[, sources]) variant, called
// with the op's operands. They need the target (chip): its conversion instructions make the wire codes.
// NOCHIP: error: {{.*}}'mori_comm.quantize_row' needs the pass option chip (the target, e.g. chip=sm_90)
// BADCHIP: error: {{.*}}option chip='sm_80' is not a known target (allowed: gfx942, gfx950, gfx1250, sm_90)

// (Helpers are placed at the top of the module, the latest first; each is alwaysinline: the kernels inline them.)
// accumulate_quantized_rows, fp8 blockwise, K = 2: each source's scale[0] sign (the reader's flag) is read
// once; when any is set (a warp-uniform scf.if), the scaled loops (a unit inside one block: one scale load per
// source; a unit across two blocks: two; blocks shorter than a unit: one per element), else the plain cast's
// loop. Every loop loads the K payloads first, decodes, sums 8 fp32 values per unit, rounds once to bf16 and
// stores 16 bytes.
// CHECK-LABEL: func.func @__mori_comm_accumulate_quantized_rows_e4m3fn_s56_k2(
// CHECK-SAME: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes {passthrough = ["alwaysinline"]}
// CHECK: %[[FLAG0:.*]] = arith.cmpf olt
// CHECK: %[[FLAG1:.*]] = arith.cmpf olt
// CHECK: %[[ANY:.*]] = arith.ori %[[FLAG0]], %[[FLAG1]] : i1
// CHECK: scf.if %[[ANY]] {
// CHECK: scf.if %{{.*}} {
// CHECK: scf.for
// CHECK-COUNT-2: llvm.load {{.*}} {alignment = 8 : i64} : !llvm.ptr -> vector<2xi32>
// CHECK: nvvm.convert.f8x2.to.f16x2
// CHECK: llvm.load {{.*}} {alignment = 4 : i64} : !llvm.ptr -> f32
// CHECK: arith.mulf
// CHECK: arith.truncf {{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK: } else {
// CHECK: scf.if %{{.*}} {
// CHECK: scf.for
// CHECK: } else {
// CHECK: scf.for
// The plain loop (no flag set): no scale is loaded, nothing multiplied.
// CHECK: } else {
// CHECK: scf.for
// CHECK-COUNT-2: llvm.load {{.*}} {alignment = 8 : i64} : !llvm.ptr -> vector<2xi32>
// CHECK-NOT: arith.mulf
// CHECK-NOT: : !llvm.ptr -> f32
// CHECK: arith.truncf {{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr
// CHECK: return

// quantize_row, fp4 blockwise (56 blocks, wave 32: 4 lanes per block, 8 blocks a round, 7 rounds, two owner
// registers per lane): the amax rounds (a loop carrying the two registers; each lane's units of its block
// 4 loads at a time, their magnitudes' max on the packed bf16 values (sign bits cleared, llvm.intr.maxnum:
// max.bf16x2), its group's max by 2 xor shuffles, one idx shuffle to the block's owner lane), the
// ballot of "any block scaled" (5 xor shuffles), the scales stored after the payload (block 0 negated when any
// was), then the conversion loop (two rounds of lane-strided units a step, their loads first; a unit's
// multiplier read from its block's owner lane, one idx shuffle: each lane offers the owner register of the
// round's block it owns), multiplied, converted and stored.
// CHECK-LABEL: func.func @__mori_comm_quantize_row_e2m1_s56(
// CHECK: scf.for %{{.*}} = %c0 to %c7 step %c1 iter_args({{.*}}) -> (f32, f32)
// CHECK: scf.for {{.*}} step %c16 iter_args
// CHECK-COUNT-4: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK: arith.constant dense<2147450879> : vector<4xi32>
// CHECK-COUNT-3: llvm.intr.maxnum({{.*}}) : (vector<8xbf16>, vector<8xbf16>) -> vector<8xbf16>
// CHECK: scf.yield
// CHECK-COUNT-2: gpu.shuffle  xor {{.*}} : f32
// CHECK: gpu.shuffle  idx {{.*}} : f32
// CHECK-COUNT-5: gpu.shuffle  xor {{.*}} : i32
// CHECK: arith.negf
// CHECK: llvm.store {{.*}} {alignment = 4 : i64} : f32, !llvm.ptr
// CHECK: scf.for
// CHECK-COUNT-2: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK: gpu.shuffle  idx
// CHECK-NOT: gpu.shuffle
// CHECK: arith.mulf
// CHECK: gpu.shuffle  idx
// CHECK-NOT: gpu.shuffle
// CHECK: arith.mulf
// CHECK: llvm.store {{.*}} {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK: return

// quantize_row, fp8 direct cast (sm_90): the peer row once, lane-strided units of 8 bf16 elements
// (one 16-byte load), HIP's saturation (clamp to +-448, inf -> NaN), two NVVM conversions per 4 elements
// (the pair's second value first: the instruction puts its first operand in the upper byte), 8 bytes stored.
// CHECK-LABEL: func.func @__mori_comm_quantize_row_e4m3fn_s0(
// CHECK: "mori_shmem.ptr"
// CHECK: scf.for
// CHECK: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr -> vector<4xi32>
// CHECK: arith.constant 4.480000e+02 : f32
// CHECK: arith.constant 0x7FC00000 : f32
// CHECK: nvvm.convert.f32x2.to.f8x2 {{.*}} {rnd = #nvvm.fp_rnd_mode<rn>, sat = #nvvm.sat_mode<satfinite>} : i16(f8E4M3FN)
// CHECK: llvm.store {{.*}} {alignment = 8 : i64} : vector<2xi32>, !llvm.ptr
// CHECK-NOT: gpu.shuffle
// CHECK: return

// CHECK-LABEL: gpu.func @k(
// CHECK: call @__mori_comm_quantize_row_e4m3fn_s0(
// CHECK: call @__mori_comm_quantize_row_e2m1_s56(
// CHECK: call @__mori_comm_accumulate_quantized_rows_e4m3fn_s56_k2(
// CHECK-NOT: mori_comm.

// AMDGPU (gfx950): the ROCDL conversions, rows addressed as global memory.
// AMD-LABEL: func.func @__mori_comm_accumulate_quantized_rows_e4m3fn_s56_k2(
// AMD: rocdl.cvt.pk.f32.fp8 {{.*}}[false]
// AMD: rocdl.cvt.pk.f32.fp8 {{.*}}[true]
// AMD-LABEL: func.func @__mori_comm_quantize_row_e2m1_s56(
// AMD-COUNT-4: rocdl.cvt.scalef32.pk.fp4.f32
// AMD-LABEL: func.func @__mori_comm_quantize_row_e4m3fn_s0(
// AMD: llvm.addrspacecast {{.*}} : !llvm.ptr to !llvm.ptr<1>
// AMD: rocdl.cvt.pk.fp8.f32 {{.*}}[false]
// AMD: rocdl.cvt.pk.fp8.f32 {{.*}}[true]
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "fp8_e4m3fn", scale_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "fp4_e2m1", scale_blocks = 56 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      "mori_comm.accumulate_quantized_rows"(%d, %n, %n, %n, %s, %d) {format = "fp8_e4m3fn", scale_blocks = 56 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}
