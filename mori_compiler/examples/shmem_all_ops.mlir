// Every mori_shmem op once, with representative attributes: a link test of the whole device ABI
// (compiles for every target with no undefined symbol). It is not meant to be launched.
module attributes {gpu.container_module} {
  gpu.module @all_ops {
    gpu.func @all_ops(%sym: !llvm.ptr, %loc: !llvm.ptr, %n: i64, %pe: i32, %v32: i32, %v64: i64) kernel {
      %qp = arith.constant 0 : i32
      %me = "mori_shmem.my_pe"() : () -> i32
      %np = "mori_shmem.n_pes"() : () -> i32
      %pp = "mori_shmem.ptr_p2p"(%sym, %me, %pe) : (!llvm.ptr, i32, i32) -> !llvm.ptr
      %p2 = "mori_shmem.ptr"(%sym, %pe) : (!llvm.ptr, i32) -> !llvm.ptr
      "mori_shmem.putmem_nbi"(%sym, %loc, %n, %pe, %qp) {scope = "thread"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.putmem_nbi"(%sym, %loc, %n, %pe, %qp) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.putmem_nbi"(%sym, %loc, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.put_nbi"(%sym, %loc, %n, %pe, %qp) {scope = "warp", elem = "double"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.getmem_nbi"(%loc, %sym, %n, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.get_nbi"(%loc, %sym, %n, %pe, %qp) {scope = "thread", elem = "uint32"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.getmem"(%loc, %sym, %n, %pe, %qp) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.get"(%loc, %sym, %n, %pe, %qp) {scope = "block", elem = "float"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.putmem_nbi_signal"(%sym, %loc, %n, %sym, %v64, %pe, %qp) {scope = "thread", signal_op = "set"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.putmem_nbi_signal"(%sym, %loc, %n, %sym, %v64, %pe, %qp) {scope = "warp", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.putmem_nbi_signal"(%sym, %loc, %n, %sym, %v64, %pe, %qp) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.put_size_imm_nbi"(%sym, %loc, %n, %pe, %qp) : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.p"(%sym, %v32, %pe, %qp) {c_type = "uint"} : (!llvm.ptr, i32, i32, i32) -> ()
      "mori_shmem.p"(%sym, %v64, %pe, %qp) {c_type = "ulonglong"} : (!llvm.ptr, i64, i32, i32) -> ()
      %f = arith.constant 1.5 : f32
      "mori_shmem.p"(%sym, %f, %pe, %qp) {c_type = "float"} : (!llvm.ptr, f32, i32, i32) -> ()
      %c8 = arith.constant 7 : i8
      "mori_shmem.p"(%sym, %c8, %pe, %qp) {c_type = "uchar"} : (!llvm.ptr, i8, i32, i32) -> ()
      "mori_shmem.atomic_nonfetch"(%sym, %v32, %pe, %qp) {elem = "uint32", amo = "xor"} : (!llvm.ptr, i32, i32, i32) -> ()
      %o1 = "mori_shmem.atomic_fetch"(%sym, %v64, %v64, %pe, %qp) {elem = "int64", amo = "compare_swap"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
      "mori_shmem.atomic_add"(%sym, %v64, %pe, %qp) {elem = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
      %o2 = "mori_shmem.atomic_fetch_add"(%sym, %v32, %pe, %qp) {elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> i32
      "mori_shmem.atomic_size_nonfetch"(%sym, %loc, %n, %pe, %qp) {amo = "add"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      %w1 = "mori_shmem.wait_until"(%sym, %v64) {cmp = "greater_than", elem = "int64"} : (!llvm.ptr, i64) -> i64
      %w2 = "mori_shmem.wait_until"(%sym, %v32) {cmp = "equals", elem = "uint32"} : (!llvm.ptr, i32) -> i32
      "mori_shmem.quiet"() : () -> ()
      "mori_shmem.quiet"(%pe) : (i32) -> ()
      "mori_shmem.fence"(%pe, %qp) : (i32, i32) -> ()
      "mori_shmem.barrier_all"() {scope = "block"} : () -> ()
      "mori_shmem.barrier_all"() {scope = "thread"} : () -> ()
      %s1 = arith.addi %o2, %w2 : i32
      %s2 = arith.addi %o1, %w1 : i64
      llvm.store %s1, %pp : i32, !llvm.ptr
      llvm.store %s2, %p2 : i64, !llvm.ptr
      llvm.store %np, %loc : i32, !llvm.ptr
      gpu.return
    }
  }
}
