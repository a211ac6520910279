"""The Triton client (mori_compiler.clients.triton, MORI's mori.ir.triton) without a GPU.

Triton kernels calling the shmem device functions are compiled for sm_90 (PTX and, through the ptxas Triton
ships, a cubin) and gfx942, gfx950 and gfx1250 (hsaco files) with ``triton.compile`` and an explicit target: no call stays
unresolved, the state global ``mori_compiler_shmem_state`` survives Triton's linking as an exported symbol
(where ``shmem_module_init`` looks it up), and every row of the ABI table compiles. The load hook is driven
with the fake CUDA bindings. Skipped, with the reason, where Triton is not installed (``pip install
triton==3.6.0``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton==3.6.0)")

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mori_compiler.clients import triton as mt  # noqa: E402
from mori_compiler.clients import triton_runtime  # noqa: E402
from mori_compiler.codeobject import read_amdgpu_code_object  # noqa: E402
from mori_compiler.errors import MoriCompilerError  # noqa: E402
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, abi_function  # noqa: E402
from mori_compiler.lib_bitcode.library import library_ir  # noqa: E402
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL, unpack_state  # noqa: E402
from mori_compiler.targets import get_target  # noqa: E402

@pytest.fixture(scope="module", autouse=True)
def _fresh_triton_cache(tmp_path_factory):
    """Triton's cache keys a kernel by its source, not by the Python of the externs it calls: compile afresh."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton_cache")))
        yield


SM90 = GPUTarget("cuda", 90, 32)
GFX942 = GPUTarget("hip", "gfx942", 64)
PTX_STATE = f".visible .global .align 8 .b8 {STATE_SYMBOL}[{STATE_SIZE}];"


def _compile(fn, signature: dict, target, **options):
    libs = tuple(mt.get_extern_libs(target).items())
    return triton.compile(ASTSource(fn, signature, {}), target=target,
                          options={"extern_libs": libs, "num_warps": 1, **options})  # fmt: skip


def _assert_linked_ptx(ptx: str) -> None:
    assert PTX_STATE in ptx, "the state global is not an exported global of the kernel's module"
    unresolved = [line for line in ptx.splitlines() if line.lstrip().startswith(".extern")]
    assert not unresolved, f"unresolved externs: {unresolved}"


@triton.jit
def ring_put_signal(dest, src, nbytes, signal, out, BLOCK: tl.constexpr):
    """Each PE puts `src` into the next PE's `dest` with a signal, adds 1 per lane to the next PE's
    `signal + lane`, and records (my_pe, n_pes, the next PE's `dest` as seen from here)."""
    me = mt.my_pe()
    n = mt.n_pes()
    peer = (me + 1) % n
    mt.putmem_nbi_signal_block(dest, src, nbytes, signal, 1, mt.SIGNAL_ADD, peer, 0)
    lanes = tl.arange(0, BLOCK)
    mt.uint64_atomic_add_thread(signal + 1 + lanes, lanes.to(tl.uint64) + 1, peer, 0)
    mt.quiet_thread()
    tl.store(out, me)
    tl.store(out + 1, n)
    tl.store(out + 2, mt.ptr_p2p(dest, me, peer).to(tl.int64))


RING_SIGNATURE = {"dest": "*u8", "src": "*u8", "nbytes": "i64", "signal": "*u64", "out": "*i64", "BLOCK": "constexpr"}


def test_sm90_kernel_links_the_library_and_keeps_the_state_global():
    k = triton.compile(ASTSource(ring_put_signal, RING_SIGNATURE, {"BLOCK": 32}), target=SM90,
                       options={"extern_libs": tuple(mt.get_extern_libs("sm_90").items()), "num_warps": 1})  # fmt: skip
    ptx = k.asm["ptx"]
    _assert_linked_ptx(ptx)
    assert re.search(r"\.visible \.entry ring_put_signal\(", ptx)
    assert "atom.release.sys.add.u64" in ptx, "the signal (SIGNAL_ADD) is not a system-scope release add"
    assert "atom.relaxed.sys.add.u64" in ptx, "the lanes' remote atomic add is missing"
    assert len(k.asm["cubin"]) > 0  # ptxas assembled it: no call stayed unresolved


@pytest.mark.parametrize("arch, wave", [("gfx942", 64), ("gfx950", 64), ("gfx1250", 32)])
def test_amdgpu_kernel_links_the_library_and_exports_the_state_global(arch, wave):
    target = GPUTarget("hip", arch, wave)
    k = triton.compile(ASTSource(ring_put_signal, RING_SIGNATURE, {"BLOCK": wave}), target=target,
                       options={"extern_libs": tuple(mt.get_extern_libs(target).items()), "num_warps": 1})  # fmt: skip
    info = read_amdgpu_code_object(k.asm["hsaco"])  # the project's reader
    assert info.gfx_name == arch and info.undefined_symbols() == []
    assert [kd.name for kd in info.kernels] == ["ring_put_signal"]
    state = info.exported_symbols().get(STATE_SYMBOL)
    assert state is not None, f"hipModuleGetGlobal would not find the state global: {sorted(info.exported_symbols())}"
    assert state.size == STATE_SIZE


def _all_functions_source() -> str:
    """A kernel calling every function of the ABI table once (compile-only: its waits would spin)."""
    lines = ["import triton", "import triton.language as tl", "from mori_compiler.clients import triton as mt", "",
             "@triton.jit", "def every_function(buf, n, pe, x, out):", "    acc = tl.zeros((), tl.int64)"]  # fmt: skip
    by_type = {"int32": "pe", "uint32": "pe", "int64": "n", "float32": "x", "float64": "x"}
    for name, meta in MORI_DEVICE_FUNCTIONS.items():
        params = abi_function(meta["symbol"]).params
        args = []
        for p, t in zip(params, meta["args"]):
            args.append(("buf" if "*" in p.c_type else "n") if t == "uint64" else by_type[t])
        call = f"mt.{name}({', '.join(args)})"
        lines.append(f"    acc += {call}.to(tl.int64)" if meta["ret"] in ("int32", "uint32", "int64", "uint64")
                     else f"    {call}")  # fmt: skip
    lines.append("    tl.store(out, acc)")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def every_function(tmp_path_factory):
    path = tmp_path_factory.mktemp("triton_kernels") / "every_function_kernel.py"
    path.write_text(_all_functions_source())
    spec = importlib.util.spec_from_file_location("every_function_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Triton reads the kernel's source through its module
    spec.loader.exec_module(module)
    yield module.every_function
    sys.modules.pop(spec.name, None)


def test_every_abi_function_compiles_for_sm90(every_function):
    k = _compile(every_function, {"buf": "*i64", "n": "i64", "pe": "i32", "x": "fp32", "out": "*i64"}, SM90)
    _assert_linked_ptx(k.asm["ptx"])
    assert len(k.asm["cubin"]) > 0


def test_every_extern_is_a_row_of_the_abi_table():
    names = set(MORI_DEVICE_FUNCTIONS) | {"SIGNAL_SET", "SIGNAL_ADD"} | set(mt.ops.COMPOSED)
    assert set(mt.ops.COMPOSED) == {"putmem_thread", "putmem_warp", "putmem_block"}
    assert set(mt.ops.__all__) == names
    for name, meta in MORI_DEVICE_FUNCTIONS.items():
        fn = getattr(mt, name)
        assert fn is getattr(mt.ops, name) and fn.__name__ == name
        assert meta["symbol"] in fn.__doc__


@triton.jit
def blocking_put(dest, src, nbytes, out):
    tl.store(out, mt.putmem_thread(dest, src, nbytes, (mt.my_pe() + 1) % mt.n_pes(), 0))


def test_blocking_put_links_as_the_put_then_quiet():
    """putmem_thread (later MORI releases' blocking put) compiles to the non-blocking put's copy (16-byte
    vectors and the byte tails; P2P's quiet adds no instruction: nothing is outstanding after the stores)
    and stores its status."""
    k = _compile(blocking_put, {"dest": "*u8", "src": "*u8", "nbytes": "i64", "out": "*i32"}, SM90)
    ptx = k.asm["ptx"]
    _assert_linked_ptx(ptx)
    body = ptx[ptx.index(".entry blocking_put"):]
    assert re.search(r"ld\.v4\.b32[^\n]*\n(.*\n)*?\s*st\.v4\.b32", body), "the put's vector copy is missing"
    assert re.search(r"st\.global\.b32 \[ %rd\d+ \+ 0 \]", body), "the put's status is not stored"
    assert len(k.asm["cubin"]) > 0


@triton.jit
def float_pe(dest, src, x):
    mt.putmem_nbi_block(dest, src, 8, x, 0)


@triton.jit
def pointer_pe(dest, src):
    mt.putmem_nbi_block(dest, src, 8, src, 0)


@triton.jit
def too_few(dest):
    mt.putmem_nbi_block(dest, dest, 8)


@pytest.mark.parametrize("fn, signature, expected", [
    (float_pe, {"dest": "*u8", "src": "*u8", "x": "fp32"}, r"putmem_nbi_block: parameter 'pe' is int32; got fp32"),
    (pointer_pe, {"dest": "*u8", "src": "*u8"}, r"putmem_nbi_block: parameter 'pe' is int32, not an address"),
    (too_few, {"dest": "*u8"}, r"putmem_nbi_block\(dest, source, bytes, pe, qpId\) takes 5 argument\(s\), got 3"),
])  # fmt: skip
def test_bad_arguments_are_refused_naming_the_parameter(fn, signature, expected):
    with pytest.raises(triton.CompilationError) as err:
        _compile(fn, signature, SM90)
    assert re.search(expected, str(err.value)), str(err.value)


def test_extern_libs_is_the_library_text_per_target(monkeypatch):
    monkeypatch.delenv("MORI_SHMEM_BC", raising=False)
    for target, name in ((SM90, "sm_90"), ("sm_90", "sm_90"), (GFX942, "gfx942"), ("gfx950", "gfx950")):
        libs = mt.get_extern_libs(target)
        assert list(libs) == ["mori_shmem"]
        assert Path(libs["mori_shmem"]).read_text() == library_ir(get_target(name))


def test_library_text_needs_neither_mlir_nor_llvmlite(tmp_path):
    """As on a GPU machine with only the runtime's dependencies (no MLIR bindings, maybe no llvmlite)."""
    import subprocess

    code = ("import sys\n"
            "for name in ('mlir', 'llvmlite', 'llvmlite.binding'):\n"
            "    sys.modules[name] = None  # an import of them fails\n"
            "from mori_compiler.clients import triton as mt\n"
            "print(mt.get_extern_libs('sm_90')['mori_shmem'])\n")  # fmt: skip
    env = {**os.environ, "MORI_COMPILER_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).read_text() == library_ir(get_target("sm_90"))


@pytest.mark.parametrize("target, expected", [
    (GPUTarget("cuda", 100, 32), "no shmem device library for sm_100"),
    ("gfx90a", "no shmem device library for gfx90a"),
    (GPUTarget("metal", "m1", 32), "Triton backend 'metal' has no shmem device library"),
    (42, "target must be a target name or a triton GPUTarget"),
])  # fmt: skip
def test_unsupported_targets_are_refused(target, expected):
    with pytest.raises(MoriCompilerError, match=re.escape(expected)):
        mt.get_extern_libs(target)


def test_without_a_gpu_the_target_must_be_given():
    with pytest.raises(MoriCompilerError, match="Triton finds no GPU to compile for .*pass target="):
        mt.get_extern_libs()


def test_mori_bitcode_is_refused(monkeypatch, tmp_path):
    bc = tmp_path / "libmori_shmem_device.bc"
    bc.write_bytes(b"BC")
    monkeypatch.setenv("MORI_SHMEM_BC", str(bc))
    with pytest.raises(MoriCompilerError, match="state only MORI's runtime fills"):
        mt.get_extern_libs("sm_90")


def test_without_triton_the_error_says_how_to_install_it():
    import subprocess

    code = "import sys; sys.modules['triton'] = None\nimport mori_compiler.clients.triton\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "mori_compiler.runtime.extras.MissingExtraError: no module 'triton': Triton kernels calling our shmem "
        "(mori.ir.triton) need triton, which is not installed; install the extra: pip install -e '.[triton]' in a "
        "checkout, else pip install 'mori-compiler[triton]'"), proc.stderr  # fmt: skip


def test_cco_is_refused_with_the_reason():
    from mori_compiler.clients.triton import cco  # importable, as MORI's; every use says why not

    with pytest.raises(AttributeError, match=r"mori\.ir\.triton\.cco\.DevComm is not offered by mori_compiler: MORI's"):
        cco.DevComm  # noqa: B018
    with pytest.raises(NotImplementedError, match="get_cco_extern_libs is not offered"):
        mt.get_cco_extern_libs()


# ---- the hooks -----------------------------------------------------------------------------------------


def test_install_hook_adds_one_load_and_one_launch_hook_and_keeps_others():
    chains = (triton.knobs.runtime.kernel_load_end_hook, triton.knobs.runtime.launch_enter_hook)
    ours = (triton_runtime.on_kernel_load, triton_runtime.on_launch)
    other = lambda *args: None  # noqa: E731
    for chain in chains:
        chain.add(other)
    try:
        mt.install_hook()
        mt.install_hook()
        for chain, hook in zip(chains, ours):
            assert chain.calls.count(hook) == 1 and other in chain.calls
        mt.uninstall_hook()
        for chain, hook in zip(chains, ours):
            assert hook not in chain.calls and other in chain.calls
    finally:
        for chain in chains:
            chain.remove(other)
        mt.uninstall_hook()


def _metadata_group(tmp_path, name: str, asm: str | None) -> dict:
    if asm is None:
        return {}
    ptx = tmp_path / f"{name}.ptx"
    ptx.write_text(asm)
    return {f"{name}.ptx": str(ptx)}


def _launch(function: int):
    """What Triton passes to the launch hook (compiler.LazyDict), with an unevaluated user part."""
    from triton.compiler.compiler import LazyDict

    metadata = LazyDict({"name": "k", "function": function, "stream": 0})
    metadata.add(lambda: pytest.fail("the user's launch_metadata was evaluated"), ())
    triton.knobs.runtime.launch_enter_hook(metadata)


@pytest.fixture
def hooks(monkeypatch):
    monkeypatch.setattr(triton_runtime, "LOADED", {})
    mt.install_hook()
    yield triton.knobs.runtime.kernel_load_end_hook
    mt.uninstall_hook()


def test_launch_without_shmem_is_refused_every_time(hooks, tmp_path):
    from mori_compiler.runtime import shmem

    assert shmem.current_state() is None
    hooks(1234, 5678, "k", _metadata_group(tmp_path, "k", PTX_STATE), "hash")
    for _ in range(2):  # the refusal lasts: the loaded copy is not left unfilled for the next launch
        with pytest.raises(shmem.ShmemStateError, match="Triton kernel k calls shmem device functions, but shmem is "
                                                        "not initialized"):  # fmt: skip
            _launch(5678)


def test_kernels_without_shmem_are_left_alone(hooks, tmp_path):
    hooks(1, 2, "plain", _metadata_group(tmp_path, "plain", ".visible .entry plain()"), "hash")
    assert triton_runtime.LOADED == {}
    _launch(2)  # no shmem, no error
    hooks(3, 4, "unknown", _metadata_group(tmp_path, "unknown", None), "hash")  # assembly not found
    _launch(4)  # without shmem nothing could be filled: not refused either


@pytest.fixture
def fake_cuda(monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_runtime_fakes import FakeGPU, install_fake_cuda

    from mori_compiler.runtime import driver as driver_mod
    from mori_compiler.runtime import shmem

    gpu = FakeGPU()
    monkeypatch.setitem(sys.modules, "torch", None)
    install_fake_cuda(monkeypatch, gpu)
    driver_mod._reset_drivers()
    yield gpu, driver_mod.get_driver("nvvm")
    if shmem.current_state() is not None:
        shmem.shmem_finalize()
    driver_mod._reset_drivers()


def test_launch_fills_the_state_once_per_shmem_init(hooks, fake_cuda, tmp_path, monkeypatch):
    from test_runtime_fakes import OneRank

    from mori_compiler.runtime import shmem

    gpu, drv = fake_cuda
    handle = int(drv._call("cuModuleLoadData", b"// PTX\n"))  # the module Triton loaded
    hooks(handle, 77, "k", _metadata_group(tmp_path, "k", PTX_STATE), "h")  # loaded before shmem init
    state_of = lambda: unpack_state(gpu.read(gpu.module_globals[(handle, STATE_SYMBOL)], STATE_SIZE))  # noqa: E731
    for heap in (1 << 20, 2 << 20):  # a re-init refills at the next launch
        monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(heap))
        shmem.shmem_init_comm(OneRank(), driver=drv)
        _launch(77)
        assert (state_of()["rank"], state_of()["n_pes"], state_of()["heap_size"]) == (0, 1, heap)
        gpu.write(gpu.module_globals[(handle, STATE_SYMBOL)], bytes(STATE_SIZE))
        _launch(77)  # filled already under this shmem: no second copy
        assert state_of()["n_pes"] == 0
        shmem.shmem_finalize()


def test_launch_under_virtual_pes_is_refused(hooks, fake_cuda, tmp_path, monkeypatch):
    from mori_compiler.runtime import shmem

    gpu, drv = fake_cuda
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(1 << 20))
    shmem.shmem_init_virtual(2, driver=drv)
    hooks(int(drv._call("cuModuleLoadData", b"// PTX\n")), 79, "k", _metadata_group(tmp_path, "k", PTX_STATE), "h")
    with pytest.raises(shmem.ShmemStateError, match="Triton kernel k calls shmem device functions, but shmem runs "
                                                    "virtual PEs"):  # fmt: skip
        _launch(79)


def test_a_module_without_state_is_dropped_at_its_first_launch(hooks, fake_cuda, tmp_path, monkeypatch):
    from test_runtime_fakes import OneRank

    from mori_compiler.runtime import shmem

    gpu, drv = fake_cuda
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(1 << 20))
    shmem.shmem_init_comm(OneRank(), driver=drv)
    gpu.globals = {}
    handle = int(drv._call("cuModuleLoadData", b"// PTX\n"))
    hooks(handle, 78, "unknown", _metadata_group(tmp_path, "unknown", None), "h")
    assert 78 in triton_runtime.LOADED
    _launch(78)
    assert 78 not in triton_runtime.LOADED


# ---- the example and the GPU test's kernels, compiled here ----------------------------------------------


@pytest.mark.parametrize("target, binary", [("sm_90", "cubin"), ("gfx942", "hsaco")])
def test_example_compiles_without_a_gpu(target, binary):
    import subprocess

    example = Path(__file__).resolve().parents[2] / "examples" / "triton_shmem" / "ring.py"
    proc = subprocess.run([sys.executable, str(example), "--compile-only", "--target", target], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(rf"{target}: put_row_to_next compiled \(\d+ bytes of {binary}\)\n", proc.stdout), proc.stdout


def test_gpu_test_kernels_compile_with_one_element_per_thread():
    """The GPU test's kernels compile for sm_90, and their *_thread calls get one tensor element per thread
    (a replicated layout would make each call once per copy)."""
    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    import test_triton_shmem_gpu as g

    sizes = {"CHUNK": g.CHUNK, "LANES": g.LANES}
    kernels = [
        (g.query, {"buf": "*u8", "out": "*i64"}, {}),
        (g.put_ring, dict.fromkeys(("d_block", "d_warp", "d_thread", "d_typed", "src"), "*u8") | {"nbytes": "i32"},
         sizes),
        (g.put_signal_ring, {"d_block": "*u8", "d_thread": "*u8", "src": "*u8", "nbytes": "i32", "sig_add": "*i64",
                             "sig_set": "*i64"}, sizes),
        (g.atomics, dict.fromkeys(("counters", "fetch_words", "set_words", "cas_words", "fetched", "cas_old"), "*i64"),
         {"LANES": g.LANES}),
    ]  # fmt: skip
    libs = tuple(mt.get_extern_libs("sm_90").items())
    for fn, signature, constants in kernels:
        signature = signature | dict.fromkeys(constants, "constexpr")
        k = triton.compile(ASTSource(fn, signature, constants), target=SM90,
                           options={"extern_libs": libs, "num_warps": 1})  # fmt: skip
        _assert_linked_ptx(k.asm["ptx"])
        layouts = set(re.findall(r"#ttg\.blocked<\{[^}]*\}>", k.asm["ttgir"]))
        one_per_thread = {"#ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [1], order = [0]}>"}
        assert layouts == (one_per_thread if constants else set()), (fn.__name__, layouts)
