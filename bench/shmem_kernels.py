"""Benchmark kernels for the shmem primitives (MLIR text, virtual-PE bundles).

``bench_put_<scope>(dst, src, chunk, pe)``: every unit of the scope (a thread, a warp or a block of the
grid) puts its own ``chunk`` bytes, at offset unit * chunk, to PE ``pe``: the achieved put bandwidth.
``pingpong(sig_mine, iters, peer)``: two PEs bounce a signal ``iters`` times (PE 0 starts): the
signal round-trip latency (release put + system-scope poll + acquire, both ways).
"""

from __future__ import annotations

import sys

_PTR = "!llvm.ptr"


def _put_kernel(scope: str) -> str:
    # unit index: thread -> global thread id, warp -> global warp id, block -> block id
    unit = {
        "thread": """      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %base = arith.muli %bid, %bdim : index
      %u = arith.addi %base, %tid : index
""",
        "warp": """      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %tid = gpu.thread_id x
      %base = arith.muli %bid, %bdim : index
      %g = arith.addi %base, %tid : index
      %c32 = arith.constant 32 : index
      %u = arith.divui %g, %c32 : index
""",
        "block": """      %u = gpu.block_id x
""",
    }[scope]
    return f"""    gpu.func @bench_put_{scope}(%dst: {_PTR}, %src: {_PTR}, %chunk: i64, %pe: i32) kernel {{
      %qp = arith.constant 0 : i32
{unit}      %u64 = arith.index_cast %u : index to i64
      %off = arith.muli %u64, %chunk : i64
      %d = llvm.getelementptr %dst[%off] : ({_PTR}, i64) -> {_PTR}, i8
      %s = llvm.getelementptr %src[%off] : ({_PTR}, i64) -> {_PTR}, i8
      "mori_shmem.putmem_nbi"(%d, %s, %chunk, %pe, %qp) {{scope = "{scope}"}} : ({_PTR}, {_PTR}, i64, i32, i32) -> ()
      gpu.return
    }}
"""


PINGPONG = f"""    gpu.func @pingpong(%sig: {_PTR}, %iters: i64, %peer: i32) kernel {{
      %qp = arith.constant 0 : i32
      %me = "mori_shmem.my_pe"() : () -> i32
      %c0 = arith.constant 0 : i32
      %first = arith.cmpi eq, %me, %c0 : i32
      %lb = arith.constant 1 : index
      %n = arith.index_cast %iters : i64 to index
      %ub = arith.addi %n, %lb : index
      scf.for %i = %lb to %ub step %lb {{
        %i64 = arith.index_cast %i : index to i64
        %one = arith.constant 1 : i64
        %prev = arith.subi %i64, %one : i64
        scf.if %first {{
          "mori_shmem.p"(%sig, %i64, %peer, %qp) {{c_type = "uint64"}} : ({_PTR}, i64, i32, i32) -> ()
          %a = "mori_shmem.wait_until"(%sig, %prev) {{cmp = "greater_than", elem = "uint64"}} : ({_PTR}, i64) -> i64
          "mori_shmem.fence"() : () -> ()
        }} else {{
          %b = "mori_shmem.wait_until"(%sig, %prev) {{cmp = "greater_than", elem = "uint64"}} : ({_PTR}, i64) -> i64
          "mori_shmem.fence"() : () -> ()
          "mori_shmem.p"(%sig, %i64, %peer, %qp) {{c_type = "uint64"}} : ({_PTR}, i64, i32, i32) -> ()
        }}
      }}
      gpu.return
    }}
"""


def module() -> str:
    funcs = "".join(_put_kernel(s) for s in ("thread", "warp", "block")) + PINGPONG
    return f"module attributes {{gpu.container_module}} {{\n  gpu.module @shmem_bench {{\n{funcs}  }}\n}}\n"


def bundle(cache_root=None):
    from mori_compiler.cache import get_bundle
    from mori_compiler.options import CompileOptions

    return get_bundle(module(), CompileOptions(target="sm_90", virtual_pes=True), cache_root=cache_root,
                      what="the shmem benchmark kernels")  # fmt: skip


if __name__ == "__main__":
    print(bundle(sys.argv[1] if len(sys.argv) > 1 else None).path)
