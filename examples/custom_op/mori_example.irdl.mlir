// The `mori_example` dialect: a tiny dialect of docs/extending.md, part 2 (not part of the project).
//
// Two ops that together make a flag barrier over a symmetric u64 array `flags` (one slot per PE), lowered
// by the example's pass `mori-example-to-shmem` (lower_example.py) into mori_shmem ops.

irdl.dialect @mori_example {

  // Tell every PE "I reached `value`": a release fence, then `value` into slot my_pe of `flags` on every
  // PE (relaxed system-scope stores). Called by one thread.
  irdl.operation @signal_all {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(flags: %ptr, value: %i64)
  }

  // Wait until every PE's slot of the local `flags` is at least `value`, then an acquire fence. Called
  // by one thread.
  irdl.operation @wait_all {
    %ptr = irdl.is !llvm.ptr
    %i64 = irdl.is i64
    irdl.operands(flags: %ptr, value: %i64)
  }
}
