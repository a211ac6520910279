// RUN: not mori-opt %s -p 'mori-coll-to-kernels{wave-size=64}' --split-input-file 2>&1 | FileCheck %s --implicit-check-not=error:
// RUN: %exit-status mori-opt %s -p 'mori-coll-to-kernels{wave-size=64}' --split-input-file 2>&1 | FileCheck %s --check-prefix=EXIT
// RUN: not mori-opt %S/mori-coll-to-kernels.mlir -p 'mori-coll-to-kernels{wave-size=48}' 2>&1 | FileCheck %s --check-prefix=OPTION

// The collectives' verifier (dialects/mori_coll.py, dialects/mori_coll_schema.py) and the pass refuse these
// inputs with one error line naming the file, line, op, field and the allowed values (exit 1, no traceback).

// A count of 0 elements.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_reduce' attribute 'count' must be >= 1, got 0
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%i, %o, %w) {dtype = "f32", count = 0 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "one_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// The sums are f32 or bf16 (fp32 accumulation).
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_reduce' attribute 'dtype' must be one of "f32", "bf16", got "f16"
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%i, %o, %w) {dtype = "f16", count = 8 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "one_shot"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// An unknown algorithm.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_reduce' attribute 'algorithm' must be one of "one_shot", "two_shot", got "ring"
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_reduce"(%i, %o, %w) {dtype = "f32", count = 8 : i64, world_size = 4 : i64, max_blocks = 32 : i64, algorithm = "ring"} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// The movers take any dtype of the schema's element sizes, not an unknown one.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_gather' attribute 'dtype' must be one of "u8", "i8", "bool", "fp8_e4m3fn", "fp8_e4m3fnuz", "i16", "f16", "bf16", "i32", "f32", "i64", "f64", got "c64"
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_gather"(%i, %o, %w) {dtype = "c64", count = 8 : i64, world_size = 4 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// More PEs than the device barrier has lanes.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_gather' attribute 'world_size' must be in [1, 32], got 33
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_gather"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 33 : i64, max_blocks = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A root outside the world.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.broadcast' attribute 'root' must be in [0, world_size = 4), got 4
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.broadcast"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 4 : i64, max_blocks = 32 : i64, root = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// No device-barrier slots.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_to_all' attribute 'max_blocks' must be in [1, 32], got 0
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 4 : i64, max_blocks = 0 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A count that is not an integer.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_to_all' attribute 'count' must be an integer, got "8"
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all"(%i, %o, %w) {dtype = "u8", count = "8", world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// An input beyond the size bound.
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_to_all' attribute 'count' (4294967296) makes the input or output larger than 17179869184 bytes
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      "mori_coll.all_to_all"(%i, %o, %w) {dtype = "f64", count = 4294967296 : i64, world_size = 8 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// The expansion cuts slices by warps: the kernel must state its block size (pass error).
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_gather' needs its kernel to have known_block_size (the warps per block cut its pieces)
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel {
      "mori_coll.all_gather"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A block that is not whole waves (pass error).
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 4]]:7: 'mori_coll.all_gather' needs a one-dimensional block whose size is a multiple of the wave size 64 and at least world_size (4): the kernel's known_block_size is (96, 1, 1)
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 96, 1, 1>} {
      "mori_coll.all_gather"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      gpu.return
    }
  }
}

// -----

// A collective in divergent code (one thread's branch): its barriers would hang (pass error).
// CHECK: error: {{.*}}mori-coll-to-kernels-invalid.mlir:[[# @LINE + 8]]:9: 'mori_coll.all_gather' must be in its kernel's body itself, not inside scf.if, scf.for, scf.while or another region or block: every thread of the grid must reach it (its barriers would hang in divergent code)
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%i: !llvm.ptr, %o: !llvm.ptr, %w: !llvm.ptr) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      %t = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %first = arith.cmpi eq, %t, %c0 : index
      scf.if %first {
        "mori_coll.all_gather"(%i, %o, %w) {dtype = "u8", count = 8 : i64, world_size = 4 : i64, max_blocks = 8 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
      }
      gpu.return
    }
  }
}

// EXIT: exit status: 1
// OPTION: error: pass 'mori-coll-to-kernels' option wave-size must be 32 or 64, got 48
