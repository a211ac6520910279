// REQUIRES: amdgpu-target
// RUN: %python -c "import llvmlite.binding as llvm; open(r'%t.bc', 'wb').write(llvm.parse_assembly('target triple = \"amdgcn-amd-amdhsa\"\ndefine void @ring_put_signal() {\n  ret void\n}\n').as_bitcode())"
// RUN: %exit-status mori-compile ring_put_signal --bitcode %t.bc -o %t.hsaco 2>&1 | FileCheck %s

// Regression (issue 11's open leftover): a device bitcode that defines a symbol of the kernel module (here
// the kernel's own name) made LLVM's linker raise, and mori-compile exited 2 with an internal compiler
// error. It is the user's input: exit 1 naming the bitcode and the symbol.

// CHECK: error: cannot link device bitcode {{.*}}Output{{/|\\}}bitcode-symbol-clash.mlir.tmp.bc: Linking globals named 'ring_put_signal': symbol multiply defined!
// CHECK: exit status: 1
