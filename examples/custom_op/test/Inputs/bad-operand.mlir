module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%flags: !llvm.ptr, %value: i32) kernel {
      "mori_example.signal_all"(%flags, %value) : (!llvm.ptr, i32) -> ()
      gpu.return
    }
  }
}
