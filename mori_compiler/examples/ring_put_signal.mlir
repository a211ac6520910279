// Ring put with signal: the built-in example of `mori-compile`.
//
// PE p copies `nbytes` bytes from its local `src` into the symmetric buffer `dst` on PE (p + 1) % n,
// block-cooperatively, and adds 1 to that PE's symmetric 64-bit `signal`. Thread 0 then waits until its
// own `signal` exceeds `expected - 1` (the previous PE's put of this round has landed), fences (acquire),
// and the block barrier hands the data to every thread. One block per PE; launch with grid.z = PEs when
// the PEs are virtual PEs of one GPU.
//
// Protocol: writer = PE p-1's block (payload stores, release fence, block barrier, then one release
// fetch-add on the signal, system scope); waiter = thread 0 of PE p (system-scope relaxed polls, then an
// sc fence), then gpu.barrier publishes to the block.
module attributes {gpu.container_module} {
  gpu.module @ring_put_signal {
    gpu.func @ring_put_signal(%src: !llvm.ptr, %dst: !llvm.ptr, %signal: !llvm.ptr, %nbytes: i64, %expected: i64) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
      %me = "mori_shmem.my_pe"() : () -> i32
      %n = "mori_shmem.n_pes"() : () -> i32
      %c1 = arith.constant 1 : i32
      %me_plus_1 = arith.addi %me, %c1 : i32
      %next = arith.remsi %me_plus_1, %n : i32
      %qp = arith.constant 0 : i32
      %one = arith.constant 1 : i64
      "mori_shmem.putmem_nbi_signal"(%dst, %src, %nbytes, %signal, %one, %next, %qp) {scope = "block", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %leader = arith.cmpi eq, %tid, %c0 : index
      scf.if %leader {
        %prev = arith.subi %expected, %one : i64
        %seen = "mori_shmem.wait_until"(%signal, %prev) {cmp = "greater_than", elem = "uint64"} : (!llvm.ptr, i64) -> i64
        "mori_shmem.fence"() : () -> ()
      }
      gpu.barrier
      gpu.return
    }
  }
}
