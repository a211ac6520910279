// RUN: mori-opt %s -p mori-virtual-pe-args --split-input-file | FileCheck %s

// The parameters become loads from record blockIdx.z of one argument table; the record lays them out
// at their natural alignment (ptr at 0, i32 at 8, i64 at 16) with the stride rounded up to 8 (24).
// CHECK-LABEL: gpu.func @k(%arg0: !llvm.ptr) kernel
// CHECK-SAME: mori.arg_table_stride = 24 : i64
// CHECK: %[[Z:.*]] = gpu.block_id z
// CHECK: %[[Z64:.*]] = arith.index_cast %[[Z]] : index to i64
// CHECK: %[[STRIDE:.*]] = arith.constant 24 : i64
// CHECK: %[[OFF:.*]] = arith.muli %[[Z64]], %[[STRIDE]] : i64
// CHECK: %[[REC:.*]] = llvm.getelementptr %arg0[%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK: %[[P0:.*]] = llvm.getelementptr %[[REC]][0]
// CHECK: %[[BUF:.*]] = llvm.load %[[P0]] : !llvm.ptr -> !llvm.ptr
// CHECK: %[[P1:.*]] = llvm.getelementptr %[[REC]][8]
// CHECK: %[[PE:.*]] = llvm.load %[[P1]] : !llvm.ptr -> i32
// CHECK: %[[P2:.*]] = llvm.getelementptr %[[REC]][16]
// CHECK: %[[N:.*]] = llvm.load %[[P2]] : !llvm.ptr -> i64
// CHECK: "mori_shmem.putmem_nbi"(%[[BUF]], %[[BUF]], %[[N]], %[[PE]], %{{.*}})
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%buf: !llvm.ptr, %pe: i32, %n: i64) kernel {
      %qp = arith.constant 0 : i32
      "mori_shmem.putmem_nbi"(%buf, %buf, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      gpu.return
    }
  }
}

// -----

// Non-kernel functions keep their signature; a kernel without parameters gets the table (stride 8).
// CHECK-LABEL: gpu.func @helper(%arg0: i32)
// CHECK-LABEL: gpu.func @empty(%arg0: !llvm.ptr) kernel
// CHECK-SAME: mori.arg_table_stride = 8 : i64
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @helper(%x: i32) {
      gpu.return
    }
    gpu.func @empty() kernel {
      gpu.return
    }
  }
}
