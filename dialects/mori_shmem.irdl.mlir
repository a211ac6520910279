// The `mori_shmem` dialect: MORI's device shmem primitives as MLIR ops.
//
// This file is the dialect's definition. `mori-opt --emit-irdl` prints it, so a stock
// `mlir-opt --irdl-file=<file>` parses and verifies mori_shmem IR. The Python side
// (dialects/mori_shmem.py) reads the same constraints to report errors that name the op, the field
// and the allowed values, and adds the few cross-field rules IRDL cannot state (documented there).
//
// Conventions: addresses are `!llvm.ptr` (flat, address space 0) and are this PE's address of a
// symmetric object; `pe` is the target PE; `qp` selects a queue pair for RDMA peers (P2P ignores it).
// Each op lowers to one function of MORI's device ABI (lib_bitcode/abi.py).

irdl.dialect @mori_shmem {

  // ---- queries and address translation ------------------------------------------------------
  irdl.operation @my_pe {
    %i32 = irdl.is i32
    irdl.results(pe: %i32)
  }
  irdl.operation @n_pes {
    %i32 = irdl.is i32
    irdl.results(n: %i32)
  }
  irdl.operation @ptr_p2p {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    irdl.operands(addr: %ptr, my_pe: %i32, dest_pe: %i32)
    irdl.results(result: %ptr)
  }
  irdl.operation @ptr {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    irdl.operands(addr: %ptr, dest_pe: %i32)
    irdl.results(result: %ptr)
  }

  // ---- contiguous transfers: put / get, byte-sized (`*mem*`) and typed ------------------------
  irdl.operation @putmem_nbi {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope }
  }
  irdl.operation @put_nbi {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %f32 = irdl.is "float"
    %f64 = irdl.is "double"
    %elem = irdl.any_of(%u32, %u64, %f32, %f64)
    irdl.operands(dest: %ptr, source: %ptr, nelems: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope, "elem" = %elem }
  }
  irdl.operation @getmem_nbi {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope }
  }
  irdl.operation @get_nbi {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %f32 = irdl.is "float"
    %f64 = irdl.is "double"
    %elem = irdl.any_of(%u32, %u64, %f32, %f64)
    irdl.operands(dest: %ptr, source: %ptr, nelems: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope, "elem" = %elem }
  }
  irdl.operation @getmem {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope }
  }
  irdl.operation @get {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %f32 = irdl.is "float"
    %f64 = irdl.is "double"
    %elem = irdl.any_of(%u32, %u64, %f32, %f64)
    irdl.operands(dest: %ptr, source: %ptr, nelems: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope, "elem" = %elem }
  }

  // ---- put with a remote signal ----------------------------------------------------------------
  irdl.operation @putmem_nbi_signal {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %thread = irdl.is "thread"
    %warp = irdl.is "warp"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %warp, %block)
    %set = irdl.is "set"
    %add = irdl.is "add"
    %signal_op = irdl.any_of(%set, %add)
    irdl.operands(dest: %ptr, source: %ptr, bytes: %i64, signal: %ptr, signal_value: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "scope" = %scope, "signal_op" = %signal_op }
  }

  // ---- immediate puts --------------------------------------------------------------------------
  irdl.operation @put_size_imm_nbi {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    irdl.operands(dest: %ptr, value: %ptr, bytes: %i64, pe: %i32, qp: %i32)
  }
  irdl.operation @p {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %t8 = irdl.is i8
    %t16 = irdl.is i16
    %t64 = irdl.is i64
    %f32 = irdl.is f32
    %f64 = irdl.is f64
    %vty = irdl.any_of(%t8, %t16, %i32, %t64, %f32, %f64)
    %c_int = irdl.is "int"
    %c_long = irdl.is "long"
    %c_longlong = irdl.is "longlong"
    %c_float = irdl.is "float"
    %c_double = irdl.is "double"
    %c_char = irdl.is "char"
    %c_short = irdl.is "short"
    %c_uint = irdl.is "uint"
    %c_ulong = irdl.is "ulong"
    %c_ulonglong = irdl.is "ulonglong"
    %c_uchar = irdl.is "uchar"
    %c_ushort = irdl.is "ushort"
    %c_int32 = irdl.is "int32"
    %c_int64 = irdl.is "int64"
    %c_uint32 = irdl.is "uint32"
    %c_uint64 = irdl.is "uint64"
    %c_type = irdl.any_of(%c_int, %c_long, %c_longlong, %c_float, %c_double, %c_char, %c_short, %c_uint, %c_ulong, %c_ulonglong, %c_uchar, %c_ushort, %c_int32, %c_int64, %c_uint32, %c_uint64)
    irdl.operands(dest: %ptr, value: %vty, pe: %i32, qp: %i32)
    irdl.attributes { "c_type" = %c_type }
  }

  // ---- atomics (thread scope) ------------------------------------------------------------------
  irdl.operation @atomic_nonfetch {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %vty = irdl.any_of(%i32, %i64)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %s64 = irdl.is "int64"
    %elem = irdl.any_of(%u32, %u64, %s64)
    %inc = irdl.is "inc"
    %set = irdl.is "set"
    %add = irdl.is "add"
    %and = irdl.is "and"
    %or = irdl.is "or"
    %xor = irdl.is "xor"
    %amo = irdl.any_of(%inc, %set, %add, %and, %or, %xor)
    irdl.operands(dest: %ptr, value: %vty, pe: %i32, qp: %i32)
    irdl.attributes { "elem" = %elem, "amo" = %amo }
  }
  irdl.operation @atomic_fetch {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %vty = irdl.any_of(%i32, %i64)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %s64 = irdl.is "int64"
    %elem = irdl.any_of(%u32, %u64, %s64)
    %fetch = irdl.is "fetch"
    %finc = irdl.is "fetch_inc"
    %fadd = irdl.is "fetch_add"
    %fand = irdl.is "fetch_and"
    %for = irdl.is "fetch_or"
    %fxor = irdl.is "fetch_xor"
    %swap = irdl.is "swap"
    %cas = irdl.is "compare_swap"
    %amo = irdl.any_of(%fetch, %finc, %fadd, %fand, %for, %fxor, %swap, %cas)
    irdl.operands(dest: %ptr, value: %vty, compare: %vty, pe: %i32, qp: %i32)
    irdl.results(old: %vty)
    irdl.attributes { "elem" = %elem, "amo" = %amo }
  }
  irdl.operation @atomic_add {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %vty = irdl.any_of(%i32, %i64)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %s64 = irdl.is "int64"
    %elem = irdl.any_of(%u32, %u64, %s64)
    irdl.operands(dest: %ptr, value: %vty, pe: %i32, qp: %i32)
    irdl.attributes { "elem" = %elem }
  }
  irdl.operation @atomic_fetch_add {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %vty = irdl.any_of(%i32, %i64)
    %u32 = irdl.is "uint32"
    %u64 = irdl.is "uint64"
    %s64 = irdl.is "int64"
    %elem = irdl.any_of(%u32, %u64, %s64)
    irdl.operands(dest: %ptr, value: %vty, pe: %i32, qp: %i32)
    irdl.results(old: %vty)
    irdl.attributes { "elem" = %elem }
  }
  irdl.operation @atomic_size_nonfetch {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    %i32 = irdl.is i32
    %inc = irdl.is "inc"
    %set = irdl.is "set"
    %add = irdl.is "add"
    %and = irdl.is "and"
    %or = irdl.is "or"
    %xor = irdl.is "xor"
    %amo = irdl.any_of(%inc, %set, %add, %and, %or, %xor)
    irdl.operands(dest: %ptr, value: %ptr, bytes: %i64, pe: %i32, qp: %i32)
    irdl.attributes { "amo" = %amo }
  }

  // ---- waits on a local word ---------------------------------------------------------------
  irdl.operation @wait_until {
    %ptr = irdl.is !llvm.ptr
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %vty = irdl.any_of(%i32, %i64)
    %eq = irdl.is "equals"
    %gt = irdl.is "greater_than"
    %cmp = irdl.any_of(%eq, %gt)
    %s32 = irdl.is "int32"
    %u32 = irdl.is "uint32"
    %s64 = irdl.is "int64"
    %u64 = irdl.is "uint64"
    %elem = irdl.any_of(%s32, %u32, %s64, %u64)
    irdl.operands(addr: %ptr, value: %vty)
    irdl.results(observed: %vty)
    irdl.attributes { "cmp" = %cmp, "elem" = %elem }
  }

  // ---- completion, ordering, barriers ----------------------------------------------------------
  irdl.operation @quiet {
    %i32 = irdl.is i32
    irdl.operands(target: variadic %i32)
  }
  irdl.operation @fence {
    %i32 = irdl.is i32
    irdl.operands(target: variadic %i32)
  }
  irdl.operation @barrier_all {
    %thread = irdl.is "thread"
    %block = irdl.is "block"
    %scope = irdl.any_of(%thread, %block)
    irdl.attributes { "scope" = %scope }
  }
}
