// REQUIRES: amdgpu-target
// RUN: mori-compile %s --target=gfx950 --emit=isa -o - | FileCheck %s --check-prefix=GFX950
// RUN: mori-compile %s --target=sm_90 --emit=ptx -o - | FileCheck %s --check-prefix=SM90
// RUN: not mori-compile %s --target=gfx942 --emit=isa -o - 2>&1 | FileCheck %s --check-prefix=REFUSED -DCHIP=gfx942
// RUN: not mori-compile %s --target=gfx1250 --emit=isa -o - 2>&1 | FileCheck %s --check-prefix=REFUSED -DCHIP=gfx1250

// fp4 (E2M1) wire rows: gfx950 converts with v_cvt_scalef32_pk_fp4_f32 at scale 1.0 (four per unit of 8
// elements, one byte each); sm_90 has no fp4 instruction and converts in integer arithmetic: seven
// threshold compares per element (round to nearest even, saturating at 6), no cvt of fp4. Decoding:
// gfx950 v_cvt_scalef32_pk_f32_fp4 at scale 1.0 (two codes each), sm_90 the code's magnitude bits placed at
// f32 bits 22-24 (the value times 2^-126, a denormal for 0 and 0.5) times 2^126 (0f7E800000): exact only
// without flush to zero, so no .ftz. gfx942 has no fp4 conversion and LLVM 22 aborts selecting gfx950's for
// gfx1250: both refuse the op, naming its attribute (no abort, no launch).
// REFUSED: error: {{.*}}'mori_comm.quantize_row' attribute 'format' fp4_e2m1 is not supported on [[CHIP]] (fp4 wire rows: gfx950, sm_90)
// REFUSED-NOT: Assertion

// GFX950-LABEL: quant:
// GFX950-COUNT-4: v_cvt_scalef32_pk_fp4_f32 v{{[0-9]+}}, v{{[0-9]+}}, v{{[0-9]+}}, 1.0
// GFX950: s_endpgm
// GFX950-LABEL: dequant:
// GFX950-COUNT-4: v_cvt_scalef32_pk_f32_fp4 v[{{[0-9]+:[0-9]+}}], v{{[0-9]+}}, 1.0
// GFX950: s_endpgm
// SM90-LABEL: .entry quant(
// SM90-NOT: e2m1
// SM90: setp.{{(gt|ge)}}.f32
// SM90: ret;
// SM90-LABEL: .entry dequant(
// SM90-NOT: .ftz
// SM90: mul.rn.f32 %r{{[0-9]+}}, %r{{[0-9]+}}, 0f7E800000;
// SM90-NOT: .ftz
// SM90: ret;
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @quant(%d: !llvm.ptr, %s: !llvm.ptr, %n: i64, %pe: i32) kernel {
      "mori_comm.quantize_row"(%d, %s, %n, %pe) {format = "fp4_e2m1", scale_blocks = 56 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32) -> ()
      gpu.return
    }
    gpu.func @dequant(%o: !llvm.ptr, %s: !llvm.ptr, %n: i64) kernel {
      "mori_comm.accumulate_quantized_rows"(%o, %n, %n, %n, %s) {format = "fp4_e2m1", scale_blocks = 56 : i64} : (!llvm.ptr, i64, i64, i64, !llvm.ptr) -> ()
      gpu.return
    }
  }
}
