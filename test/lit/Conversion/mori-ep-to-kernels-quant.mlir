// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=32}' | FileCheck %s
// RUN: mori-compile %s --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=PTX
// RUN: sed 's/wave_size = 32/wave_size = 64/' %s | mori-compile - --target=gfx950 --emit=isa -o - | FileCheck %s --check-prefix=GFX950
// RUN: sed 's/wave_size = 32/wave_size = 64/' %s | not mori-compile - --target=gfx942 --emit=isa -o - 2>&1 | FileCheck %s --check-prefix=GFX942

// The quantizing combines (optional quant / scale_blocks on the bf16 combines; hidden 1024, 56 blocks):
// each received row is written to its owner as a wire row (mori_comm.quantize_row, the target's fp8
// "fp8_e4m3" or fp4), the staging / combine-region rows are wire rows apart (fp8 blockwise: 1024 payload
// bytes + 56 f32 scales = 1248; the direct cast: 1024; any hidden: computed from the call's row, 16-byte
// aligned), and each token's K wire rows are dequantized in the fp32 sum (accumulate_quantized_rows, the
// output slice's first element and count, the call's row in elements). gfx942 has no fp4 conversion: the
// fp4 combine is refused there, naming the op and the attribute.
// GFX942: error: {{.*}}'mori_comm.quantize_row' attribute 'format' fp4_e2m1 is not supported on gfx942 (fp4 wire rows: gfx950, sm_90)

// CHECK-LABEL: gpu.func @ep_combine_push_bf16(
// CHECK: %[[ROW:.*]] = arith.constant 2048 : i64
// CHECK: %[[ELEMS:.*]] = arith.shrui %[[ROW]], %c1_i64 : i64
// CHECK: %[[DROW:.*]] = arith.muli %{{.*}}, %c1248_i64 : i64
// CHECK: %[[DST:.*]] = llvm.getelementptr %arg2[%[[DROW]]]
// CHECK: %[[SOFF:.*]] = arith.muli %{{.*}}, %[[ROW]] : i64
// CHECK: %[[SRC:.*]] = llvm.getelementptr %arg0[%[[SOFF]]]
// CHECK: "mori_comm.quantize_row"(%[[DST]], %[[SRC]], %[[ELEMS]], %{{.*}}) {format = "fp8_e4m3", scale_blocks = 56 : i64}
// CHECK: "mori_comm.device_barrier"
// CHECK-COUNT-8: arith.muli %{{.*}}, %c1248_i64{{.*}} : i64
// CHECK: "mori_comm.accumulate_quantized_rows"({{.*}}) {format = "fp8_e4m3", scale_blocks = 56 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
// CHECK-NOT: "mori_comm.accumulate_rows"
// CHECK-LABEL: gpu.func @ep_combine_push_bf16_anyhidden(
// The wire stride of the call's row: ((row >> 1 >> 1) + 15 & -16) + 4 * 56, + 15 & -16.
// CHECK: %[[AROW:.*]] = arith.andi %{{.*}}, %c-16_i64 : i64
// CHECK: %[[AEL:.*]] = arith.shrui %[[AROW]], %c1_i64 : i64
// CHECK: %[[PAY:.*]] = arith.shrui %[[AEL]], %c1_i64{{.*}} : i64
// CHECK: arith.addi %[[PAY]], %c15_i64 : i64
// CHECK: arith.addi %{{.*}}, %c224_i64 : i64
// CHECK: "mori_comm.quantize_row"({{.*}}) {format = "fp4_e2m1", scale_blocks = 56 : i64}
// CHECK: "mori_comm.accumulate_quantized_rows"({{.*}}) {format = "fp4_e2m1", scale_blocks = 56 : i64}
// CHECK-LABEL: gpu.func @ep_async_combine_send_bf16(
// CHECK: "mori_comm.quantize_row"({{.*}}) {format = "fp8_e4m3", scale_blocks = 0 : i64}
// CHECK-LABEL: gpu.func @ep_async_combine_recv_bf16(
// CHECK: "mori_comm.accumulate_quantized_rows"({{.*}}) {format = "fp8_e4m3", scale_blocks = 0 : i64}

// sm_90: the push combine's quantization in PTX (the block amax's xor butterfly, OCP fp8 conversions) and
// its reduction's decode; fp4 without any cvt of e2m1 (software).
// PTX-LABEL: .visible .entry ep_combine_push_bf16(
// PTX: shfl.sync.bfly.b32
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: cvt.rn.f16x2.e4m3x2
// PTX-LABEL: .visible .entry ep_combine_push_bf16_anyhidden(
// PTX-NOT: e2m1
// PTX-LABEL: .visible .entry ep_async_combine_send_bf16(
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX-LABEL: .visible .entry ep_async_combine_recv_bf16(
// PTX: cvt.rn.f16x2.e4m3x2
// GFX950-LABEL: ep_combine_push_bf16:
// GFX950: v_cvt_pk_fp8_f32
// GFX950: v_cvt_pk_f32_fp8
// GFX950-LABEL: ep_combine_push_bf16_anyhidden:
// GFX950: v_cvt_scalef32_pk_fp4_f32
module attributes {gpu.container_module} {
  gpu.module @bundle {
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, max_blocks = 1024 : i64, quant = "fp8_blockwise", scale_blocks = 56 : i64} : () -> ()
    "mori_ep.combine"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", any_hidden = 1 : i64, top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, zero_copy = 0 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, max_blocks = 1024 : i64, quant = "fp4_blockwise", scale_blocks = 56 : i64} : () -> ()
    "mori_ep.combine_send"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, early_notify = 0 : i64, fused_recv = 0 : i64, quant = "fp8_direct_cast", scale_blocks = 0 : i64} : () -> ()
    "mori_ep.combine_recv"() {world_size = 8 : i64, hidden = 1024 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 64 : i64, max_recv_per_rank = 64 : i64, warps_per_block = 8 : i64, wave_size = 32 : i64, early_notify = 0 : i64, fused_recv = 0 : i64, quant = "fp8_direct_cast", scale_blocks = 0 : i64} : () -> ()
  }
}
