// REQUIRES: amdgpu-target
// RUN: sed 's/FP8/fp8_e4m3fn/' %s | mori-compile - --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=SM90
// RUN: sed 's/FP8/fp8_e4m3fnuz/' %s | mori-compile - --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=GFX942
// RUN: sed 's/FP8/fp8_e4m3fn/' %s | mori-compile - --target=gfx950 --emit=isa -o - | FileCheck %s --check-prefix=AMD
// RUN: sed 's/FP8/fp8_e4m3fn/' %s | mori-compile - --target=gfx1250 --emit=isa -o - | FileCheck %s --check-prefix=AMD
// RUN: sed 's/FP8/fp8_e4m3fn/' %s | not mori-compile - --target=gfx942 --emit=isa -o - 2>&1 | FileCheck %s --check-prefix=WRONGFMT

// The fp8 conversion instructions of the wire quantization (passes/comm_quant.py), per target: the
// quantizing row copy converts with the target's round-to-nearest-even fp8 instruction after HIP's
// saturation (sm_90 cvt.rn.satfinite.e4m3x2.f32: two values per instruction; AMDGPU v_cvt_pk_fp8_f32, the
// second pair into the upper word with op_sel), the accumulation decodes with cvt.rn.f16x2.e4m3x2 (sm_90,
// then f16 -> f32) or v_cvt_pk_f32_fp8 (AMDGPU, the upper word by sdwa/op_sel), sums in fp32 and rounds
// to bf16 once. The blockwise row reduces its blocks' amaxes in parallel, a group of lanes per block (sm_90:
// max.bf16x2 on the packed values; AMDGPU: v_max3_f32; an xor butterfly inside the group), and reads each
// unit's block multiplier from the block's owner lane (idx shuffle: AMDGPU ds_bpermute_b32).
// gfx942's instruction makes FNUZ fp8: an OCP format is refused there, naming the attribute.
// WRONGFMT: error: {{.*}}'mori_comm.quantize_row' attribute 'format' fp8_e4m3fn is not gfx942's fp8 (its conversion instructions make fp8_e4m3fnuz)

// SM90-LABEL: .entry quant_direct(
// SM90-COUNT-4: cvt.rn.satfinite.e4m3x2.f32
// SM90-NOT: cvt.rn.satfinite.e4m3x2.f32
// SM90: ret;
// SM90-LABEL: .entry quant_blockwise(
// SM90: max.bf16x2
// SM90: shfl.sync.bfly.b32
// SM90: shfl.sync.idx.b32
// SM90: cvt.rn.satfinite.e4m3x2.f32
// SM90: ret;
// SM90-LABEL: .entry dequant(
// SM90-DAG: cvt.rn.f16x2.e4m3x2
// SM90-DAG: cvt.f32.f16
// SM90-DAG: cvt.rn.bf16x2.f32
// SM90: ret;

// GFX942-LABEL: quant_direct:
// GFX942: v_cvt_pk_fp8_f32 v{{[0-9]+}}, v{{[0-9]+}}, v{{[0-9]+}}{{$}}
// GFX942: v_cvt_pk_fp8_f32 v{{[0-9]+}}, v{{[0-9]+}}, v{{[0-9]+}} op_sel:[0,0,1]
// GFX942: s_endpgm
// GFX942-LABEL: quant_blockwise:
// GFX942: v_max3_f32
// GFX942: ds_bpermute_b32
// GFX942: v_cvt_pk_fp8_f32
// GFX942: s_endpgm
// GFX942-LABEL: dequant:
// GFX942: v_cvt_pk_f32_fp8_e32
// GFX942: v_cvt_pk_f32_fp8_sdwa {{.*}} src0_sel:WORD_1
// AMD-LABEL: quant_direct:
// AMD: v_cvt_pk_fp8_f32 v{{[0-9]+}}, v{{[0-9]+}}, v{{[0-9]+}}{{$}}
// AMD: v_cvt_pk_fp8_f32 v{{[0-9]+}}, v{{[0-9]+}}, v{{[0-9]+}} op_sel:[0,0,1]
// AMD: s_endpgm
// AMD-LABEL: quant_blockwise:
// AMD: v_max3_{{(num_)?}}f32
// AMD: ds_bpermute_b32
// AMD: v_cvt_pk_fp8_f32
// AMD: s_endpgm
// AMD-LABEL: dequant:
// AMD: v_cvt_pk_f32_fp8
// AMD: v_cvt_pk_f32_fp8{{.*}}{{src0_sel:WORD_1|op_sel:\[1,0\]}}
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @quant_direct(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "FP8", scale_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
    gpu.func @quant_blockwise(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "FP8", scale_blocks = 56 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
    gpu.func @dequant(%o: !llvm.ptr, %s: !llvm.ptr, %t: !llvm.ptr, %n: i64) kernel {
      "mori_comm.accumulate_quantized_rows"(%o, %n, %n, %n, %s, %t) {format = "FP8", scale_blocks = 56 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}
