// All-gather of one row per PE, written directly in mori_shmem IR (docs/extending.md, part 1).
//
// PE p sends its local row `src` (`nbytes` bytes) into slot p of the symmetric buffer `dst` (n_pes rows)
// on every PE, then tells every PE "my row of round `round` is there" by storing `round` into slot p of
// their symmetric u64 `flags`. It then waits until every PE's flag here reached `round`, so that on
// return `dst` holds all n_pes rows on every PE. The host passes round = 1, 2, 3, ...: flags only grow,
// so nothing is ever reset.
//
// Launch: one block of 256 threads per PE (with virtual PEs: grid (1, 1), grid z = PE). The block-scope
// put must be reached by every thread of the block with the same arguments; the waits are done by one
// thread and handed to the block by the barrier.
//
// Ordering (docs/device-abi.md, "Ordering rules"):
//  * putmem_nbi only issues the stores: nothing is visible to the peer until a fence. A fence orders the
//    calling thread's own earlier stores, so every thread fences its share before the block meets;
//  * after the barrier, thread 0 fences again (its flag store is then a release of everything the
//    block wrote) and stores the flags with relaxed system-scope stores (mori_shmem.p);
//  * wait_until has no acquire: thread 0 fences after the waits, and the barrier hands the rows to the
//    rest of the block.
module attributes {gpu.container_module} {
  gpu.module @allgather {
    gpu.func @allgather(%src: !llvm.ptr, %dst: !llvm.ptr, %flags: !llvm.ptr, %nbytes: i64, %round: i64) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      %qp = arith.constant 0 : i32
      %me = "mori_shmem.my_pe"() : () -> i32
      %n = "mori_shmem.n_pes"() : () -> i32
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %n_x = arith.index_cast %n : i32 to index
      // This PE's slot in every PE's dst: dst + me * nbytes (a symmetric address, valid on every PE).
      %me64 = arith.extui %me : i32 to i64
      %offset = arith.muli %me64, %nbytes : i64
      %slot = llvm.getelementptr %dst[%offset] : (!llvm.ptr, i64) -> !llvm.ptr, i8
      %myflag = llvm.getelementptr %flags[%me] : (!llvm.ptr, i32) -> !llvm.ptr, i64
      scf.for %q = %c0 to %n_x step %c1 {
        %pe = arith.index_cast %q : index to i32
        "mori_shmem.putmem_nbi"(%slot, %src, %nbytes, %pe, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
      }
      "mori_shmem.fence"() : () -> ()
      gpu.barrier
      %tid = gpu.thread_id x
      %leader = arith.cmpi eq, %tid, %c0 : index
      scf.if %leader {
        "mori_shmem.fence"() : () -> ()
        scf.for %q = %c0 to %n_x step %c1 {
          %pe = arith.index_cast %q : index to i32
          "mori_shmem.p"(%myflag, %round, %pe, %qp) {c_type = "uint64"} : (!llvm.ptr, i64, i32, i32) -> ()
        }
        %c1_64 = arith.constant 1 : i64
        %before = arith.subi %round, %c1_64 : i64
        scf.for %q = %c0 to %n_x step %c1 {
          %pe = arith.index_cast %q : index to i32
          %flag = llvm.getelementptr %flags[%pe] : (!llvm.ptr, i32) -> !llvm.ptr, i64
          %seen = "mori_shmem.wait_until"(%flag, %before) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
        }
        "mori_shmem.fence"() : () -> ()
      }
      gpu.barrier
      gpu.return
    }
  }
}
