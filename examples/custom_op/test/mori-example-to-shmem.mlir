// The example pass: each mori_example op becomes its mori_shmem protocol, in place, at its location.
// RUN: %example-opt %s -p mori-example-to-shmem | FileCheck %s
// RUN: %example-opt %s -p mori-example-to-shmem,mori-shmem-to-abi | FileCheck %s --check-prefix=ABI
// RUN: not %example-opt %S/Inputs/bad-operand.mlir 2>&1 | FileCheck %s --check-prefix=ERR

// CHECK-LABEL: gpu.func @k(
// CHECK-SAME:      %[[FLAGS:.*]]: !llvm.ptr, %[[V:.*]]: i64)
// CHECK-NOT:     mori_example.
// signal_all: the release fence first, then value into slot my_pe of every PE.
// CHECK:         "mori_shmem.fence"() : () -> ()
// CHECK:         %[[ME:.*]] = "mori_shmem.my_pe"()
// CHECK:         %[[SLOT:.*]] = llvm.getelementptr %[[FLAGS]][%[[ME]]] : (!llvm.ptr, i32) -> !llvm.ptr, i64
// CHECK:         "mori_shmem.n_pes"()
// CHECK:         scf.for
// CHECK:           "mori_shmem.p"(%[[SLOT]], %[[V]], %{{.*}}, %{{.*}}) {c_type = "uint64"}
// wait_all: polls every PE's slot until it passes value - 1, then the acquire fence.
// CHECK:         %[[BEFORE:.*]] = arith.subi %[[V]], %{{.*}} : i64
// CHECK:         scf.for %[[Q:.*]] =
// CHECK:           %[[Q32:.*]] = arith.index_cast %[[Q]] : index to i32
// CHECK:           %[[IN:.*]] = llvm.getelementptr %[[FLAGS]][%[[Q32]]]
// CHECK:           "mori_shmem.wait_until"(%[[IN]], %[[BEFORE]]) {cmp = "greater_than", elem = "uint64"}
// CHECK:         }
// CHECK-NEXT:    "mori_shmem.fence"() : () -> ()
// CHECK-NEXT:    gpu.return

// After the project's own lowering only ABI calls remain.
// ABI-NOT:       "mori_
// ABI:           llvm.call @mori_shmem_fence_thread()
// ABI:           llvm.call @mori_shmem_uint64_p(
// ABI:           llvm.call @mori_shmem_uint64_wait_until_greater_than(
// ABI-NOT:       "mori_

// The registered dialect gets the project's checks: the op, the field and what is allowed.
// ERR: error: {{.*}}bad-operand.mlir:4:7: 'mori_example.signal_all' operand 'value' must be i64, got i32

module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%flags: !llvm.ptr, %value: i64) kernel {
      "mori_example.signal_all"(%flags, %value) : (!llvm.ptr, i64) -> ()
      "mori_example.wait_all"(%flags, %value) : (!llvm.ptr, i64) -> ()
      gpu.return
    }
  }
}
