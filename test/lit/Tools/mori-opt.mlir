// RUN: mori-opt --list-passes | FileCheck %s --check-prefix=LIST
// RUN: mori-opt --show-dialects | FileCheck %s --check-prefix=DIALECTS
// RUN: mori-opt --emit-irdl | FileCheck %s --check-prefix=IRDL
// RUN: mori-opt -p 'mori-shmem-to-abi,canonicalize' --mlir-print-ir-after-all %s -o %t.out 2> %t.dump
// RUN: FileCheck %s --check-prefix=DUMP --input-file=%t.dump
// RUN: FileCheck %s --check-prefix=OUT --input-file=%t.out
// RUN: mori-opt -p canonicalize - < %s | FileCheck %s --check-prefix=CANON
// RUN: mori-opt --mlir-print-op-generic %s | FileCheck %s --check-prefix=GENERIC
// RUN: not mori-opt -p no-such-pass %s 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: %exit-status mori-opt -p no-such-pass %s 2>&1 | FileCheck %s --check-prefix=EXIT
// RUN: not mori-opt -p 'mori-shmem-to-abi{chip=gfx942}' %s 2>&1 | FileCheck %s --check-prefix=OPTION

// The mori-opt driver: pass listing with each pass's contract, dialects, IRDL, IR printing after each
// pass (project and upstream passes alike), upstream passes by name, and errors for unknown passes.
func.func @f() -> i32 {
  %a = arith.constant 2 : i32
  %b = arith.addi %a, %a : i32
  %me = "mori_shmem.my_pe"() : () -> i32
  %c = arith.addi %b, %me : i32
  return %c : i32
}

// --list-passes: the pass name, its one-line summary and its Input/Output/Options contract.
// LIST: Project passes (upstream MLIR passes are accepted by name too):
// LIST: {{^  }}mori-shmem-to-abi{{$}}
// LIST-NEXT: Lower mori_shmem ops to llvm.call of MORI's device ABI and declare the callees.
// LIST-NEXT: Input: mori_shmem, {{.*}} Output: llvm {{.*}} Options: none.

// DIALECTS: {{^}}mori_shmem{{$}}
// DIALECTS-NEXT: {{^}}mori_comm{{$}}
// DIALECTS-NEXT: {{^}}mori_ep{{$}}

// IRDL: irdl.dialect @mori_shmem {
// IRDL: irdl.operation @putmem_nbi_signal {
// IRDL: irdl.dialect @mori_comm {
// IRDL: irdl.operation @row_copy_to_peers {
// IRDL: irdl.dialect @mori_ep {

// --mlir-print-ir-after-all writes a dump after every pass to stderr; stdout/-o gets the final IR only.
// DUMP: // -----// IR Dump After mori-shmem-to-abi{{.*}} //----- //
// DUMP-NEXT: module {
// DUMP-NEXT: llvm.func @mori_shmem_my_pe() -> i32
// DUMP: arith.addi %{{.*}}, %{{.*}} : i32
// DUMP: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// DUMP: %[[C4:.*]] = arith.constant 4 : i32
// OUT-NOT: IR Dump
// OUT: llvm.func @mori_shmem_my_pe() -> i32
// OUT-LABEL: func.func @f() -> i32
// OUT-NEXT: %[[C4:.*]] = arith.constant 4 : i32
// OUT-NEXT: %[[ME:.*]] = llvm.call @mori_shmem_my_pe() : () -> i32
// OUT-NEXT: %[[SUM:.*]] = arith.addi %[[ME]], %[[C4]] : i32
// OUT-NEXT: return %[[SUM]] : i32

// An upstream pass alone, reading stdin: folds the arith, keeps the mori_shmem op.
// CANON-LABEL: func.func @f() -> i32
// CANON-NEXT: %[[C4:.*]] = arith.constant 4 : i32
// CANON-NEXT: %[[ME:.*]] = "mori_shmem.my_pe"() : () -> i32
// CANON-NEXT: arith.addi %[[ME]], %[[C4]] : i32

// GENERIC: "func.func"() <{function_type = () -> i32, sym_name = "f"}> ({
// GENERIC: "mori_shmem.my_pe"() : () -> i32

// Unknown pass names and options are user errors (exit status 1).
// UNKNOWN: error: invalid pass pipeline element 'no-such-pass'
// UNKNOWN-SAME: 'no-such-pass' does not refer to a registered pass or pass pipeline
// UNKNOWN-NOT: Traceback
// EXIT: exit status: 1
// OPTION: error: pass 'mori-shmem-to-abi' has no option 'chip' (options: none)
