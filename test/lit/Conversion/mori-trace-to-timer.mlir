// RUN: mori-opt %s -p 'mori-trace-to-timer{enabled=true wave-size=32}' | FileCheck %s
// RUN: mori-opt %s -p 'mori-trace-to-timer{enabled=true wave-size=64}' | FileCheck %s --check-prefix=W64
// RUN: mori-opt %s -p 'mori-trace-to-timer' | FileCheck %s --check-prefix=OFF --implicit-check-not=readsteadycounter --implicit-check-not=mori_comm.trace --implicit-check-not=__mori_trace

// Trace points: every lane reads the timer first, then loads the kernel's buffer address from its global and,
// when it is not 0 (the same for the whole kernel: no branch on the lane, a trace point never splits a warp),
// stores the value to its warp's slot linear_warp * E + e. Slots are numbered by first appearance
// (a repeated event:phase reuses its slot); the kernel lists them in mori.trace_events. Off: erased.

// CHECK: llvm.mlir.global external @__mori_trace_k(dense<0> : tensor<2xi64>) {addr_space = 1 : i32, alignment = 8 : i64, externally_initialized} : !llvm.array<2 x i64>
// CHECK: gpu.func @k() kernel attributes {mori.trace_events = ["phase:begin", "phase:end", "mark:instant"]}
// CHECK: %[[T:.*]] = llvm.call_intrinsic "llvm.readsteadycounter"() : () -> i64
// CHECK-NOT: gpu.lane_id
// CHECK: %[[G:.*]] = llvm.mlir.addressof @__mori_trace_k : !llvm.ptr<1>
// CHECK: %[[BUF:.*]] = llvm.load %[[G]] {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK: arith.cmpi ne, %[[BUF]]
// CHECK: gpu.block_id  z
// CHECK: arith.constant 32 : i64
// CHECK: %[[E:.*]] = arith.constant 3 : i64
// CHECK: %[[W:.*]] = arith.muli %{{.*}}, %[[E]] : i64
// CHECK: %[[S:.*]] = arith.constant 0 : i64
// CHECK: arith.addi %[[W]], %[[S]] : i64
// CHECK: %[[CAP_AT:.*]] = llvm.getelementptr %[[G]][1] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK: %[[CAP:.*]] = llvm.load %[[CAP_AT]] {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK: arith.cmpi ult, %{{.*}}, %[[CAP]] : i64
// CHECK: scf.if
// CHECK: llvm.inttoptr %[[BUF]] : i64 to !llvm.ptr<1>
// CHECK: llvm.store %[[T]], %{{.*}} {alignment = 8 : i64} : i64, !llvm.ptr<1>
// The second point is slot 1, the loop's third slot 2, the repeated "phase:begin" slot 0 again.
// CHECK: arith.constant 1 : i64
// CHECK: scf.for
// CHECK: readsteadycounter
// CHECK: arith.constant 2 : i64
// CHECK: readsteadycounter
// CHECK: %[[E2:.*]] = arith.constant 3 : i64
// CHECK: arith.muli %{{.*}}, %[[E2]] : i64
// CHECK-NEXT: %[[S0:.*]] = arith.constant 0 : i64
// CHECK: gpu.return
// CHECK: gpu.func @untraced() kernel {
// CHECK-NEXT: gpu.return

// W64: gpu.func @k() kernel attributes {mori.trace_events = ["phase:begin", "phase:end", "mark:instant"]}
// W64: arith.constant 64 : i64
// W64: arith.constant 63 : i64

// OFF: gpu.func @k() kernel {
// OFF-NEXT: arith.constant
// OFF-NEXT: arith.constant
// OFF-NEXT: arith.constant
// OFF-NEXT: scf.for
// OFF-NEXT: }
// OFF-NEXT: gpu.return
gpu.module @m {
  gpu.func @k() kernel {
    "mori_comm.trace"() {event = "phase", phase = "begin"} : () -> ()
    "mori_comm.trace"() {event = "phase", phase = "end"} : () -> ()
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    scf.for %i = %c0 to %c4 step %c1 {
      "mori_comm.trace"() {event = "mark", phase = "instant"} : () -> ()
    }
    "mori_comm.trace"() {event = "phase", phase = "begin"} : () -> ()
    gpu.return
  }
  gpu.func @untraced() kernel {
    gpu.return
  }
}

