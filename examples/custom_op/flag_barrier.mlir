// A kernel written with the example dialect: every PE's block publishes its `data` row with block-scope
// puts, then the flag barrier of mori_example (one thread), then the block meets again.
module attributes {gpu.container_module} {
  gpu.module @flag_barrier {
    gpu.func @flag_barrier(%data: !llvm.ptr, %src: !llvm.ptr, %nbytes: i64, %flags: !llvm.ptr, %round: i64) kernel attributes {known_block_size = array<i32: 128, 1, 1>} {
      %qp = arith.constant 0 : i32
      %me = "mori_shmem.my_pe"() : () -> i32
      %n = "mori_shmem.n_pes"() : () -> i32
      %c1 = arith.constant 1 : i32
      %me1 = arith.addi %me, %c1 : i32
      %next = arith.remui %me1, %n : i32
      "mori_shmem.putmem_nbi"(%data, %src, %nbytes, %next, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      "mori_shmem.fence"() : () -> ()
      gpu.barrier
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %leader = arith.cmpi eq, %tid, %c0 : index
      scf.if %leader {
        "mori_example.signal_all"(%flags, %round) : (!llvm.ptr, i64) -> ()
        "mori_example.wait_all"(%flags, %round) : (!llvm.ptr, i64) -> ()
      }
      gpu.barrier
      gpu.return
    }
  }
}
