// RUN: %exit-status mori-opt %s --split-input-file -p 'mori-ep-to-kernels{wave-size=64}' 2>&1 | FileCheck %s --check-prefix=WAVE
// RUN: %exit-status mori-opt %s --split-input-file -p mori-virtual-pe-args 2>&1 | FileCheck %s --check-prefix=VPE
// RUN: %python -c "import re; p = re.split(r'(?m)^// -----$', open(r'%s').read()); print(chr(10) * sum(c.count(chr(10)) for c in p[:2]) + p[2])" > %t.two.mlir
// RUN: %exit-status mori-compile %t.two.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=TWO
// RUN: %python -c "import re; p = re.split(r'(?m)^// -----$', open(r'%s').read()); print(chr(10) * sum(c.count(chr(10)) for c in p[:3]) + p[3])" > %t.none.mlir
// RUN: %exit-status mori-compile %t.none.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=NONE

// Regression (issue 11): errors about the file's content that carried no location: a wave-size mismatch
// between an EP op and the pass option, a kernel parameter the virtual-PE argument table cannot carry,
// a file with two gpu.modules or one without kernels. Each now names file:line:col of the op.

// WAVE: error: {{.*}}located-errors.mlir:[[@LINE+2]]:5: 'mori_ep.combine' was configured for wave size 32, the target runs 64
gpu.module @wave32 {
    "mori_ep.combine"() {world_size = 16 : i64, hidden = 4096 : i64, dtype = "f32", top_k = 2 : i64, experts_per_rank = 8 : i64, max_tokens_per_rank = 256 : i64, max_recv_per_rank = 256 : i64, zero_copy = 1 : i64, warps_per_block = 4 : i64, wave_size = 32 : i64, max_blocks = 80 : i64} : () -> ()
}

// -----
// VPE: error: {{.*}}located-errors.mlir:[[@LINE+2]]:5: kernel 'k' parameter 1 has type index; virtual-PE kernels take !llvm.ptr, i64, i32, i16, i8, f64, f32
gpu.module @m {
    gpu.func @k(%buf: !llvm.ptr, %i: index) kernel {
      gpu.return
    }
}

// -----
// TWO: error: {{.*}}.two.mlir:[[@LINE+6]]:1: expected exactly one gpu.module in the input, found 2
gpu.module @a {
    gpu.func @k() kernel {
      gpu.return
    }
}
gpu.module @b {
    gpu.func @k() kernel {
      gpu.return
    }
}

// -----
// NONE: error: {{.*}}.none.mlir:[[@LINE+1]]:1: gpu.module @c has no kernel (gpu.func ... kernel)
gpu.module @c {
    gpu.func @helper() {
      gpu.return
    }
}

// WAVE-NOT: error:
// WAVE: exit status: 1
// VPE-NOT: error:
// VPE: exit status: 1
// TWO: exit status: 1
// NONE: exit status: 1
