"""Test kernels for every mori_shmem primitive, as MLIR text, compiled as virtual-PE bundles.

Each kernel does one primitive (or one protocol) so that a GPU test can check its effect from the host.
Kernels take per-PE arguments (the virtual-PE argument table), so every PE passes its own buffers.
``python -m test.python.gpu.kernels <cache dir>`` (or ``precompile()``) builds every bundle on a machine
with the compiler; GPU machines only load them.
"""

from __future__ import annotations

import itertools
import sys

TARGET = "sm_90"
SCOPES = ("thread", "warp", "block")
ELEMS = (None, "uint32", "uint64", "float", "double")
ELEM_BYTES = {None: 1, "uint32": 4, "uint64": 8, "float": 4, "double": 8}
P_TYPES = {  # c_type -> MLIR value type
    "char": "i8", "uchar": "i8", "short": "i16", "ushort": "i16", "int": "i32", "uint": "i32", "int32": "i32",
    "uint32": "i32", "long": "i64", "ulong": "i64", "longlong": "i64", "ulonglong": "i64", "int64": "i64",
    "uint64": "i64", "float": "f32", "double": "f64",
}  # fmt: skip
NONFETCH_AMOS = ("inc", "set", "add", "and", "or", "xor")
FETCH_AMOS = ("fetch", "fetch_inc", "fetch_add", "fetch_and", "fetch_or", "fetch_xor", "swap", "compare_swap")
ATOMIC_ELEMS = {"uint32": "i32", "uint64": "i64", "int64": "i64"}
WAIT_ELEMS = {"int32": "i32", "uint32": "i32", "int64": "i64", "uint64": "i64"}

_PTR = "!llvm.ptr"


def _module(name: str, params: str, body: str) -> str:
    """One kernel as a gpu.func (all_kernels_module() puts them into one gpu.module)."""
    return (
        f"    gpu.func @{name}({params}) kernel {{\n"
        "      %qp = arith.constant 0 : i32\n"
        f"{body}"
        "      gpu.return\n    }\n"
    )


def transfer_kernel(op: str, scope: str, elem: str | None) -> tuple[str, str]:
    """op in putmem_nbi/getmem_nbi/getmem (elem None) or put_nbi/get_nbi/get (typed)."""
    base = {"put": "putmem_nbi", "get_nbi": "getmem_nbi", "get": "getmem"}[op]
    name = f"{op}_{scope}_{elem or 'mem'}"
    op_name = base if elem is None else base.replace("mem", "")
    attrs = f'scope = "{scope}"' + (f', elem = "{elem}"' if elem else "")
    body = (f'      "mori_shmem.{op_name}"(%dst, %src, %count, %pe, %qp) {{{attrs}}} : '
            f"({_PTR}, {_PTR}, i64, i32, i32) -> ()\n")  # fmt: skip
    return name, _module(name, f"%dst: {_PTR}, %src: {_PTR}, %count: i64, %pe: i32", body)


def put_signal_kernel(scope: str, signal_op: str) -> tuple[str, str]:
    name = f"put_signal_{scope}_{signal_op}"
    body = (f'      "mori_shmem.putmem_nbi_signal"(%dst, %src, %n, %sig, %sigval, %pe, %qp) '
            f'{{scope = "{scope}", signal_op = "{signal_op}"}} : ({_PTR}, {_PTR}, i64, {_PTR}, i64, i32, i32) -> ()\n')  # fmt: skip
    params = f"%dst: {_PTR}, %src: {_PTR}, %n: i64, %sig: {_PTR}, %sigval: i64, %pe: i32"
    return name, _module(name, params, body)


def p_kernel(c_type: str) -> tuple[str, str]:
    ty = P_TYPES[c_type]
    name = f"p_{c_type}"
    body = f'      "mori_shmem.p"(%dst, %v, %pe, %qp) {{c_type = "{c_type}"}} : ({_PTR}, {ty}, i32, i32) -> ()\n'
    return name, _module(name, f"%dst: {_PTR}, %v: {ty}, %pe: i32", body)


def put_imm_kernel() -> tuple[str, str]:
    body = f'      "mori_shmem.put_size_imm_nbi"(%dst, %val, %n, %pe, %qp) : ({_PTR}, {_PTR}, i64, i32, i32) -> ()\n'
    return "put_imm", _module("put_imm", f"%dst: {_PTR}, %val: {_PTR}, %n: i64, %pe: i32", body)


def atomic_kernel(kind: str, elem: str, amo: str | None) -> tuple[str, str]:
    """kind: nonfetch / fetch / add / fetch_add / size_nonfetch. Fetching kinds store the old value to %out."""
    ty = ATOMIC_ELEMS.get(elem, "i64")
    name = f"atomic_{kind}_{elem}_{amo or ''}".rstrip("_")
    if kind == "nonfetch":
        body = (f'      "mori_shmem.atomic_nonfetch"(%dst, %v, %pe, %qp) {{elem = "{elem}", amo = "{amo}"}} : '
                f"({_PTR}, {ty}, i32, i32) -> ()\n")  # fmt: skip
    elif kind == "add":
        body = f'      "mori_shmem.atomic_add"(%dst, %v, %pe, %qp) {{elem = "{elem}"}} : ({_PTR}, {ty}, i32, i32) -> ()\n'
    elif kind == "fetch":
        body = (f'      %old = "mori_shmem.atomic_fetch"(%dst, %v, %cmp, %pe, %qp) {{elem = "{elem}", amo = "{amo}"}} : '
                f"({_PTR}, {ty}, {ty}, i32, i32) -> {ty}\n      llvm.store %old, %out : {ty}, {_PTR}\n")  # fmt: skip
    elif kind == "fetch_add":
        body = (f'      %old = "mori_shmem.atomic_fetch_add"(%dst, %v, %pe, %qp) {{elem = "{elem}"}} : '
                f"({_PTR}, {ty}, i32, i32) -> {ty}\n      llvm.store %old, %out : {ty}, {_PTR}\n")  # fmt: skip
    elif kind == "size_nonfetch":
        body = (f'      "mori_shmem.atomic_size_nonfetch"(%dst, %valp, %n, %pe, %qp) {{amo = "{amo}"}} : '
                f"({_PTR}, {_PTR}, i64, i32, i32) -> ()\n")  # fmt: skip
        return name, _module(name, f"%dst: {_PTR}, %valp: {_PTR}, %n: i64, %pe: i32", body)
    else:
        raise ValueError(kind)
    return name, _module(name, f"%dst: {_PTR}, %v: {ty}, %cmp: {ty}, %out: {_PTR}, %pe: i32", body)


def wait_kernel(elem: str, cmp: str) -> tuple[str, str]:
    """PE p stores %setv into %flag on PE %pe (the next PE), then waits on its own %flag for (cmp, %until);
    the observed value goes to %out. All PEs of the launch are co-resident, so this exercises a real
    cross-PE wait."""
    ty = WAIT_ELEMS[elem]
    name = f"wait_{elem}_{cmp}"
    c_type = {"int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"}[elem]
    body = (
        f'      "mori_shmem.p"(%flag, %setv, %pe, %qp) {{c_type = "{c_type}"}} : ({_PTR}, {ty}, i32, i32) -> ()\n'
        f'      %seen = "mori_shmem.wait_until"(%flag, %until) {{cmp = "{cmp}", elem = "{elem}"}} : ({_PTR}, {ty}) -> {ty}\n'
        '      "mori_shmem.fence"() : () -> ()\n'
        f"      llvm.store %seen, %out : {ty}, {_PTR}\n"
    )  # fmt: skip
    return name, _module(name, f"%flag: {_PTR}, %setv: {ty}, %until: {ty}, %out: {_PTR}, %pe: i32", body)


def barrier_kernel(scope: str) -> tuple[str, str]:
    """Rounds of: store round*1000 + me into slot `me` of PE %pe's %slots (relaxed put), barrier_all, read own
    slot of the previous PE into %out[round]. Correct only if barrier_all orders and publishes the puts."""
    name = f"barrier_{scope}"
    body = f"""      %me = "mori_shmem.my_pe"() : () -> i32
      %n = "mori_shmem.n_pes"() : () -> i32
      %c0 = arith.constant 0 : i64
      %c1 = arith.constant 1 : i64
      %c1000 = arith.constant 1000 : i64
      %me64 = arith.extsi %me : i32 to i64
      %n32 = arith.constant 1 : i32
      %prev0 = arith.addi %me, %n : i32
      %prev1 = arith.subi %prev0, %n32 : i32
      %prev = arith.remsi %prev1, %n : i32
      %prev64 = arith.extsi %prev : i32 to i64
      %tid = gpu.thread_id x
      %zero = arith.constant 0 : index
      %leader = arith.cmpi eq, %tid, %zero : index
      %lb = arith.index_cast %c0 : i64 to index
      %ub = arith.index_cast %rounds : i64 to index
      %st = arith.constant 1 : index
      scf.for %r = %lb to %ub step %st {{
        %r64 = arith.index_cast %r : index to i64
        %rk = arith.muli %r64, %c1000 : i64
        %val = arith.addi %rk, %me64 : i64
        scf.if %leader {{
          %slot = llvm.getelementptr %slots[%me64] : ({_PTR}, i64) -> {_PTR}, i64
          "mori_shmem.p"(%slot, %val, %pe, %qp) {{c_type = "int64"}} : ({_PTR}, i64, i32, i32) -> ()
        }}
        "mori_shmem.barrier_all"() {{scope = "{scope}"}} : () -> ()
        scf.if %leader {{
          %mine = llvm.getelementptr %slots[%prev64] : ({_PTR}, i64) -> {_PTR}, i64
          %got = llvm.load %mine : {_PTR} -> i64
          %o = llvm.getelementptr %out[%r64] : ({_PTR}, i64) -> {_PTR}, i64
          llvm.store %got, %o : i64, {_PTR}
        }}
        "mori_shmem.barrier_all"() {{scope = "{scope}"}} : () -> ()
      }}
"""
    return name, _module(name, f"%slots: {_PTR}, %out: {_PTR}, %rounds: i64, %pe: i32", body)


def query_kernel() -> tuple[str, str]:
    """out[0] = my_pe, out[1] = n_pes, out[2 + q] = ptr_p2p(addr, me, q) for q < n, then ptr(addr, q),
    then ptr_p2p(outside, me, 0)."""
    body = f"""      %me = "mori_shmem.my_pe"() : () -> i32
      %n = "mori_shmem.n_pes"() : () -> i32
      %me64 = arith.extsi %me : i32 to i64
      %n64 = arith.extsi %n : i32 to i64
      llvm.store %me64, %out : i64, {_PTR}
      %o1 = llvm.getelementptr %out[1] : ({_PTR}) -> {_PTR}, i64
      llvm.store %n64, %o1 : i64, {_PTR}
      %lb = arith.constant 0 : index
      %ub = arith.index_cast %n : i32 to index
      %st = arith.constant 1 : index
      scf.for %q = %lb to %ub step %st {{
        %q32 = arith.index_cast %q : index to i32
        %q64 = arith.index_cast %q : index to i64
        %pp = "mori_shmem.ptr_p2p"(%addr, %me, %q32) : ({_PTR}, i32, i32) -> {_PTR}
        %ppi = llvm.ptrtoint %pp : {_PTR} to i64
        %i2 = arith.constant 2 : i64
        %s1 = arith.addi %q64, %i2 : i64
        %o2 = llvm.getelementptr %out[%s1] : ({_PTR}, i64) -> {_PTR}, i64
        llvm.store %ppi, %o2 : i64, {_PTR}
        %p2 = "mori_shmem.ptr"(%addr, %q32) : ({_PTR}, i32) -> {_PTR}
        %p2i = llvm.ptrtoint %p2 : {_PTR} to i64
        %s2 = arith.addi %s1, %n64 : i64
        %o3 = llvm.getelementptr %out[%s2] : ({_PTR}, i64) -> {_PTR}, i64
        llvm.store %p2i, %o3 : i64, {_PTR}
      }}
      %c0 = arith.constant 0 : i32
      %ob = "mori_shmem.ptr_p2p"(%outside, %me, %c0) : ({_PTR}, i32, i32) -> {_PTR}
      %obi = llvm.ptrtoint %ob : {_PTR} to i64
      %two = arith.constant 2 : i64
      %twon = arith.muli %n64, %two : i64
      %last = arith.addi %twon, %two : i64
      %o4 = llvm.getelementptr %out[%last] : ({_PTR}, i64) -> {_PTR}, i64
      llvm.store %obi, %o4 : i64, {_PTR}
"""
    return "query", _module("query", f"%addr: {_PTR}, %outside: {_PTR}, %out: {_PTR}", body)


def all_kernels() -> dict[str, str]:
    kernels = {}
    for op, scope, elem in itertools.product(("put", "get_nbi", "get"), SCOPES, ELEMS):
        name, src = transfer_kernel(op, scope, elem)
        kernels[name] = src
    for scope, sig in itertools.product(SCOPES, ("set", "add")):
        kernels.update([put_signal_kernel(scope, sig)])
    for c_type in P_TYPES:
        kernels.update([p_kernel(c_type)])
    kernels.update([put_imm_kernel(), query_kernel()])
    for elem in ATOMIC_ELEMS:
        for amo in NONFETCH_AMOS:
            kernels.update([atomic_kernel("nonfetch", elem, amo)])
        for amo in FETCH_AMOS:
            kernels.update([atomic_kernel("fetch", elem, amo)])
        kernels.update([atomic_kernel("add", elem, None), atomic_kernel("fetch_add", elem, None)])
    kernels.update([atomic_kernel("size_nonfetch", "size", "add")])
    for elem, cmp in itertools.product(WAIT_ELEMS, ("equals", "greater_than")):
        kernels.update([wait_kernel(elem, cmp)])
    for scope in ("thread", "block"):
        kernels.update([barrier_kernel(scope)])
    return kernels


MODULE_NAME = "shmem_tests"


def all_kernels_module() -> str:
    """Every test kernel in one gpu.module: one bundle, one module load on the GPU."""
    funcs = "".join(all_kernels().values())
    return ("module attributes {gpu.container_module} {\n"
            f"  gpu.module @{MODULE_NAME} {{\n{funcs}  }}\n}}\n")  # fmt: skip


def options():
    from mori_compiler.options import CompileOptions

    return CompileOptions(target=TARGET, virtual_pes=True)


def bundle(cache_root=None, *, virtual_pes: bool = True):
    """The bundle of all test kernels (compiled here if the compiler is installed, else precompiled).
    ``virtual_pes=False`` gives the one-PE-per-process build used by the multi-process tests."""
    from mori_compiler.cache import get_bundle

    opts = options() if virtual_pes else options().__class__(target=TARGET)
    return get_bundle(all_kernels_module(), opts, cache_root=cache_root, what="the shmem test kernels")


def ring_bundle(cache_root=None):
    from mori_compiler.cache import get_bundle
    from mori_compiler.examples import example_source

    return get_bundle(example_source("ring_put_signal"), options(), cache_root=cache_root, what="ring_put_signal")


def ep_bundles(cache_root, configs, *, virtual_pes: bool = True) -> list:
    """The EP kernel bundles of ``configs`` (EpDispatchCombineConfig, or (config, AsyncLL options) pairs),
    as EpDispatchCombineOp builds them."""
    from mori_compiler.ops import ep_bundle

    pairs = [c if isinstance(c, tuple) else (c, None) for c in configs]
    bundles = (ep_bundle(c, TARGET, virtual_pes=virtual_pes, asyncll=o, cache_root=cache_root) for c, o in pairs)
    return list({b.key: b for b in bundles}.values())  # configs that differ only at run time share one


def precompile_all(cache_root) -> list:
    """Every bundle the GPU tests load."""
    import test_collectives_gpu
    import test_ep_auto_gpu
    import test_ep_dispatch_features_gpu
    import test_ep_gpu
    import test_ep_hidden_gpu
    import test_ep_internode_gpu
    import test_ep_ll_gpu
    import test_ep_multigpu
    import test_ep_quant_gpu
    import test_examples_gpu
    import test_torch_compile_gpu

    bundles = [bundle(cache_root), bundle(cache_root, virtual_pes=False), ring_bundle(cache_root)]
    multi = [test_ep_multigpu.multi_gpu_config(w, 0, kind) for w in (2, 4, 8) for kind in test_ep_multigpu.KINDS]
    return (bundles + ep_bundles(cache_root, list(test_ep_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_ep_ll_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_ep_internode_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_ep_hidden_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_ep_dispatch_features_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_ep_auto_gpu.all_configs()))
            + ep_bundles(cache_root, list(test_torch_compile_gpu.all_configs()))
            + ep_bundles(cache_root, multi, virtual_pes=False)
            + test_ep_quant_gpu.precompile(cache_root, TARGET)
            + test_examples_gpu.precompile(cache_root, TARGET)
            + test_collectives_gpu.all_bundles(cache_root))  # fmt: skip


if __name__ == "__main__":
    for b in precompile_all(sys.argv[1] if len(sys.argv) > 1 else None):
        print(f"{len(b.kernels)} kernels in {b.path}")
