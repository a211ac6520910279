// RUN: %exit-status mori-opt %s --split-input-file 2>&1 | FileCheck %s
// RUN: %python -c "import re; print(re.split(r'(?m)^// -----$', open(r'%s').read())[0])" > %t.first.mlir
// RUN: %exit-status mori-compile %t.first.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: %exit-status mori-opt %t.first.mlir -p mori-shmem-to-abi 2>&1 | FileCheck %s --check-prefix=COMPILE

// Regression (issue 11): a mori_shmem op directly in a gpu.module (outside any function) was accepted by
// mori-opt (exit 0) and aborted mori-compile ("UNREACHABLE executed at Value.cpp" / "Global is
// referenced by parentless instruction"). Project ops are placed where their lowering expects them:
// mori_ep's EP ops directly in a gpu.module, every other project op inside a function. Op names must
// have a dialect and an operation part ("gpu"() made MLIR abort).

// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+3]]:11: 'mori_shmem.my_pe' must be placed inside a function (gpu.func, func.func or llvm.func), not directly in gpu.module
// COMPILE: error: {{.*}}.first.mlir:[[@LINE+2]]:11: 'mori_shmem.my_pe' must be placed inside a function
gpu.module @m {
    %me = "mori_shmem.my_pe"() : () -> i32
    gpu.func @k() kernel {
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+3]]:7: 'mori_ep.dispatch' must be placed directly in a gpu.module (mori-ep-to-kernels replaces it by kernels there), not in gpu.func
gpu.module @m {
    gpu.func @k() kernel {
      "mori_ep.dispatch"() {world_size = 8 : i64, hidden = 7168 : i64, dtype = "bf16", top_k = 8 : i64, experts_per_rank = 32 : i64, max_tokens_per_rank = 4096 : i64, max_recv_per_rank = 4096 : i64, scale_bytes = 0 : i64, warps_per_block = 8 : i64, wave_size = 64 : i64} : () -> ()
      gpu.return
    }
}

// -----
// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+1]]:1: 'mori_shmem.fence' must be placed inside a function (gpu.func, func.func or llvm.func), not directly in builtin.module
"mori_shmem.fence"() : () -> ()

// -----
// Issue 12 review: the mori_comm blocks are project ops too (one was accepted at the module top and its
// barrier silently dropped from the code object).
// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+2]]:1: 'mori_comm.grid_barrier' must be placed inside a function (gpu.func, func.func or llvm.func), not directly in builtin.module
%z = llvm.mlir.zero : !llvm.ptr
"mori_comm.grid_barrier"(%z) : (!llvm.ptr) -> ()

// -----
// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+1]]:1: op name 'gpu' is not of the form 'dialect.operation'
"gpu"() : () -> ()

// -----
// CHECK: error: {{.*}}op-placement.mlir:[[@LINE+1]]:1: op name 'arith.' is not of the form 'dialect.operation'
"arith."() : () -> ()

// CHECK-NOT: error:
// CHECK: exit status: 1
// COMPILE-NOT: UNREACHABLE
// COMPILE: exit status: 1
