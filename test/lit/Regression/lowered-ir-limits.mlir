// REQUIRES: nvptx-target, amdgpu-target
// RUN: %python -c "import re, sys; p = re.split(r'(?m)^// -----$', open(r'%s').read()); [open(r'%t.' + str(i) + '.mlir', 'w').write(chr(10) * sum(c.count(chr(10)) for c in p[:i]) + c) for i, c in enumerate(p)]"
// RUN: %exit-status mori-compile %t.0.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=INTRINSIC
// RUN: %exit-status mori-compile %t.1.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=SPACE
// RUN: %exit-status mori-compile %t.2.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=F128
// RUN: %exit-status mori-compile %t.3.mlir --target sm_90 -o %t.ptx 2>&1 | FileCheck %s --check-prefix=SCOPE
// RUN: %exit-status mori-compile %t.4.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=ASM
// RUN: %exit-status mori-compile %t.5.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=WIDE
// RUN: %exit-status mori-compile %t.6.mlir --target gfx942 -o %t.hsaco 2>&1 | FileCheck %s --check-prefix=HUGE

// Regression (issue 11, found by fuzzing): IR that MLIR's translation or LLVM's GPU back ends abort on
// instead of reporting. An unknown intrinsic made the C API print a NULL module (a segfault: translation
// now runs in a forked child and its diagnostics come back located); address space 7/99 pointers, f128
// arithmetic, an unknown syncscope and inline asm whose constraints do not match its operands were
// "LLVM ERROR"/assertion aborts, as was an i16777215 parameter (LLVM's integers stop at 2**23 bits). Each
// is now an error at the op.

// INTRINSIC: error: {{.*}}.0.mlir:[[@LINE+4]]:12: could not find LLVM intrinsic: "llvm.bogus.thing"
// INTRINSIC: exit status: 1
gpu.module @m {
    gpu.func @k(%p: !llvm.ptr, %a: i32) kernel {
      %r = llvm.call_intrinsic "llvm.bogus.thing"(%a) : (i32) -> i32
      gpu.return
    }
}

// -----
// SPACE: error: {{.*}}.1.mlir:[[@LINE+4]]:12: pointer address space 7 is not supported by the GPU back ends (allowed: 0, 1, 3, 4, 5)
// SPACE: exit status: 1
gpu.module @m {
    gpu.func @k(%p: !llvm.ptr, %a: i32) kernel {
      %q = llvm.addrspacecast %p : !llvm.ptr to !llvm.ptr<7>
      llvm.store %a, %q : i32, !llvm.ptr<7>
      gpu.return
    }
}

// -----
// F128: error: {{.*}}.2.mlir:[[@LINE+3]]:5: type f128 is not supported by the GPU back ends (floats are at most 64 bits)
// F128: exit status: 1
gpu.module @m {
    gpu.func @k(%p: !llvm.ptr, %a: f128, %b: f128) kernel {
      %c = arith.divf %a, %b : f128
      llvm.store %c, %p : f128, !llvm.ptr
      gpu.return
    }
}

// -----
// SCOPE: error: {{.*}}.3.mlir:[[@LINE+4]]:7: 'llvm.fence' syncscope "agent" is not defined for this target (allowed: '', 'singlethread', 'block', 'cluster', 'device')
// SCOPE: exit status: 1
gpu.module @m {
    gpu.func @k() kernel {
      llvm.fence syncscope("agent") seq_cst
      gpu.return
    }
}

// -----
// ASM: error: {{.*}}.4.mlir:[[@LINE+4]]:12: 'llvm.inline_asm' constraints "=v,~{vcc}" name 0 input(s) but the op has 1 operand(s)
// ASM: exit status: 1
gpu.module @m {
    gpu.func @k(%a: i32) kernel {
      %r = llvm.inline_asm has_side_effects "v_mov_b32 $0, $1", "=v,~{vcc}" %a : (i32) -> i32
      gpu.return
    }
}

// -----
// WIDE: error: {{.*}}.5.mlir:[[@LINE+3]]:5: integer type i16777215 is wider than 1024 bits, which the GPU back ends do not support
// WIDE: exit status: 1
gpu.module @m {
    gpu.func @k(%p: i16777215) kernel {
      gpu.return
    }
}

// -----
// A 2**31-element array argument exhausted memory in codegen (a hang); a 2 GiB alloca made LLVM exit with
// an unlocated "stack frame size exceeds limit".
// HUGE: error: {{.*}}.6.mlir:[[@LINE+4]]:5: a value of type !llvm.array<2147483647 x i8> has 2147483647 elements
// HUGE: error: {{.*}}.6.mlir:[[@LINE+5]]:12: 'llvm.alloca' of 2147483647 bytes exceeds the 131056 bytes of private memory
// HUGE: exit status: 1
gpu.module @m {
    gpu.func @k(%p: !llvm.array<2147483647 x i8>, %q: !llvm.ptr) kernel {
      %c1 = arith.constant 1 : i32
      %a = llvm.alloca %c1 x !llvm.array<2147483647 x i8> : (i32) -> !llvm.ptr<5>
      %b = llvm.addrspacecast %a : !llvm.ptr<5> to !llvm.ptr
      llvm.store %b, %q : !llvm.ptr, !llvm.ptr
      gpu.return
    }
}
