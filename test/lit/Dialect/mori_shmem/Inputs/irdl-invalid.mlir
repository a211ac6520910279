// Invalid mori_shmem IR for stock mlir-opt (irdl-stock-mlir-opt.mlir): one error per chunk.
func.func @bad_scope(%d: !llvm.ptr, %n: i64, %pe: i32) {
  "mori_shmem.putmem_nbi"(%d, %d, %n, %pe, %pe) {scope = "grid"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()
  return
}
// -----
func.func @mixed_widths(%d: !llvm.ptr, %v: i64, %c: i32, %pe: i32) {
  %o = "mori_shmem.atomic_fetch"(%d, %v, %c, %pe, %pe) {elem = "int64", amo = "swap"} : (!llvm.ptr, i64, i32, i32, i32) -> i64
  return
}
// -----
func.func @missing_attr() {
  "mori_shmem.barrier_all"() : () -> ()
  return
}
