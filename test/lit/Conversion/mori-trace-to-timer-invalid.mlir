// RUN: not mori-opt %s -p 'mori-trace-to-timer{enabled=true wave-size=32}' 2>&1 | FileCheck %s
// RUN: not mori-opt %s -p 'mori-trace-to-timer{enabled=true wave-size=48}' 2>&1 | FileCheck %s --check-prefix=BADWAVE
// RUN: %exit-status mori-opt %s -p 'mori-trace-to-timer{enabled=true}' 2>&1 | FileCheck %s --check-prefix=EXIT
// RUN: not mori-opt %s.bad-attrs -p 'mori-trace-to-timer' 2>&1 | FileCheck %s.bad-attrs --check-prefix=ATTR

// A trace point outside a kernel has no trace buffer: refused, naming the op and its location.
// CHECK: error: {{.*}}mori-trace-to-timer-invalid.mlir:{{[0-9]+}}:{{[0-9]+}}: mori_comm.trace must be inside a gpu.func kernel
// BADWAVE: pass 'mori-trace-to-timer' option wave-size must be 32 or 64, got 48
// EXIT: exit status: 1
gpu.module @m {
  func.func @helper() {
    "mori_comm.trace"() {event = "x", phase = "instant"} : () -> ()
    return
  }
}
