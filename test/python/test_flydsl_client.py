"""FlyDSL as a client of the project's shmem (mori_compiler.clients.flydsl, ``mori.ir.flydsl``).

FlyDSL kernels calling our device functions (examples/flydsl_shmem: a ring put+signal and a P2P allgather)
are compiled compile-only for gfx942, gfx950 and gfx1250 by the driver, in a process of their own (FlyDSL
and the compiler's MLIR bindings cannot share one); their code objects are read back here with the project's
reader (mori_compiler.codeobject): the target, the kernels, the wave size, the code object version, no
undefined symbol, the state global exported. The post-load initializer FlyDSL records is ours, and given
the module a HIP loader made of that code object (the fake HIP bindings of test_runtime_fakes.py) it fills
the device state the runtime computes. The FlyDSL tests skip, saying how to install it, where it is absent.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mori_compiler.clients import flydsl as client
from mori_compiler.clients import flydsl_compile
from mori_compiler.codeobject import CodeObjectError, check_no_undefined_symbols, read_amdgpu_code_object
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime import shmem
from mori_compiler.runtime.extras import install_hint, is_installed
from mori_compiler.runtime.shmem import ShmemStateError
from mori_compiler.targets import TARGETS

sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_fakes import FakeGPU, OneRank, _install_hip, install_fake_cuda  # noqa: E402 - the shared fakes

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "flydsl_shmem"
SCRIPTS = {"ring_put_signal": EXAMPLES / "ring_put_signal.py", "allgather": EXAMPLES / "allgather.py"}
AMD_TARGETS = [t.name for t in TARGETS.values() if t.is_amdgpu]
DRIVER = [sys.executable, "-m", "mori_compiler.clients.flydsl_compile"]


def _flydsl_missing() -> str | None:
    if not is_installed("flydsl"):
        return f"FlyDSL is not installed; to run these tests: {install_hint('flydsl')} (and numpy, torch: it imports them)"
    missing = [m for m in client.UNDECLARED_DEPENDENCIES if not is_installed(m)]
    if missing:
        return f"FlyDSL imports {' and '.join(missing)}, not installed; to run these tests: pip install {' '.join(missing)}"
    return None


needs_flydsl = pytest.mark.skipif(_flydsl_missing() is not None, reason=str(_flydsl_missing()))


def _run_driver(*args, cwd=None):
    return subprocess.run([*DRIVER, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd)


# ---- without FlyDSL --------------------------------------------------------------------------------------


def test_importing_the_client_imports_neither_flydsl_nor_mlir():
    code = ("import sys; import mori_compiler.clients.flydsl as f, mori_compiler.clients.flydsl_compile; "
            "print(len(f.__all__)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flydsl', 'mlir', 'llvmlite', 'torch') "
            "or m == 'mori_compiler._mlir'))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, modules = proc.stdout.split("\n")[:2]
    assert modules == "[]"
    assert int(count) == len(MORI_DEVICE_FUNCTIONS) + 6  # + SIGNAL_ADD/SET, get_bitcode_path, the hooks, init


def test_every_device_function_is_offered_under_its_mori_name():
    assert set(MORI_DEVICE_FUNCTIONS) <= set(client.__all__) and set(MORI_DEVICE_FUNCTIONS) <= set(dir(client))
    with pytest.raises(AttributeError, match="no attribute 'not_a_device_function'"):
        client.not_a_device_function  # noqa: B018


@pytest.mark.parametrize("arch, expected", [("gfx942", "gfx942"), ("gfx942:sramecc+:xnack-", "gfx942"),
                                            ("gfx1250-strict", "gfx1250"), ("gfx950", "gfx950")])  # fmt: skip
def test_flydsl_archs_map_to_the_project_targets(arch, expected):
    assert client._project_target(arch).name == expected


@pytest.mark.parametrize("arch", ["gfx90a", "gfx1201", "sm_90", ""])
def test_an_arch_the_library_does_not_support_is_refused(arch):
    with pytest.raises(client.FlyDSLClientError, match=f"supported: {', '.join(AMD_TARGETS)}"):
        client._project_target(arch)


def test_mori_bitcode_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("MORI_SHMEM_BC", str(tmp_path / "libmori_shmem_device.bc"))
    with pytest.raises(client.FlyDSLClientError, match="MORI_SHMEM_BC=.*only MORI's runtime fills"):
        client.get_bitcode_path()


def test_install_hooks_have_nothing_to_install():
    assert client.install_hook() is None and client.install_jit_hook() is None


@pytest.fixture
def no_shmem(monkeypatch):
    """No torch, fresh drivers, no shmem state left behind (as test_runtime_fakes.py's tests run)."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(1 << 20))
    driver_mod._reset_drivers()
    yield
    if shmem.current_state() is not None:
        shmem.shmem_finalize()
    driver_mod._reset_drivers()


def test_the_initializer_refuses_before_shmem_init(no_shmem):
    with pytest.raises(ShmemStateError, match="shmem is not initialized"):
        client.shmem_module_init(0x1234)


def test_the_initializer_refuses_shmem_on_the_cuda_driver(no_shmem, monkeypatch):
    install_fake_cuda(monkeypatch, FakeGPU())
    shmem.shmem_init_comm(OneRank(), driver=driver_mod.get_driver("nvvm"))
    with pytest.raises(client.FlyDSLClientError, match="FlyDSL loads HIP modules.*nvvm driver"):
        client.shmem_module_init(0x1234)


@pytest.mark.parametrize("args, message", [
    (["--target", "sm_90", "--out", "o", "x.py"], "target 'sm_90' is not an AMDGPU target of the project; "
                                                  "allowed: gfx942, gfx950, gfx1250"),
    (["--target", "gfx942", "--out", "o", "missing.py"], "no script .*missing.py"),
    (["--target", "gfx942"], "the following arguments are required: --out, scripts"),
])  # fmt: skip
def test_the_driver_refuses_bad_input_with_exit_1(tmp_path, args, message):
    proc = _run_driver(*args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(message, proc.stderr), proc.stderr


def test_a_missing_flydsl_names_the_extra(monkeypatch):
    from mori_compiler.runtime.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "flydsl", None)  # as if not installed (nothing of it is imported here)
    with pytest.raises(MissingExtraError, match=re.escape(install_hint("flydsl"))):
        client.my_pe  # noqa: B018 - the first device function access imports FlyDSL


@needs_flydsl
def test_a_missing_undeclared_dependency_of_flydsl_is_named():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from mori_compiler.clients import flydsl\n"
            "try:\n    flydsl.device_functions()\nexcept flydsl.FlyDSLClientError as exc:\n    print(exc)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no module 'torch'" in proc.stdout and "pip install numpy torch" in proc.stdout


def test_the_driver_without_flydsl_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "flydsl", None)  # as if not installed
    for name in ("COMPILE_ONLY", "FLYDSL_GPU_ARCH", "ROCM_PATH"):  # main() sets them: restored afterwards
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(flydsl_compile, "_out_dir", None)
    script = tmp_path / "k.py"
    script.write_text("raise AssertionError('not run without FlyDSL')\n")
    assert flydsl_compile.main(["--target", "gfx942", "--out", str(tmp_path / "out"), str(script)]) == 1
    err = capsys.readouterr().err
    assert "no module 'flydsl'" in err and install_hint("flydsl") in err


def test_emit_outside_the_driver_is_refused():
    with pytest.raises(flydsl_compile.FlyDSLCompileError, match="inside the compile-only driver"):
        flydsl_compile.emit("k", object())


# ---- with FlyDSL: compiled in the driver's process, read back here --------------------------------------


EVERY_FUNCTION_SCRIPT = """
import flydsl.compiler as flyc
import flydsl.expr as fx

from mori_compiler.clients import flydsl as shmem
from mori_compiler.clients.flydsl_compile import emit
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS

ZERO = {"float32": fx.Float32(0.0), "float64": fx.Float64(0.0)}


@flyc.kernel
def every_function(addr: fx.Int64):
    for name, meta in MORI_DEVICE_FUNCTIONS.items():  # unrolled while tracing: one call of each
        getattr(shmem, name)(*[addr if t in ("uint64", "int64") else ZERO.get(t, 0) for t in meta["args"]])


@flyc.jit
def launch(addr: fx.Int64):
    every_function(addr).launch(grid=(1, 1, 1), block=(64, 1, 1))


emit("every_function", launch, 0)
"""


def _pinned_flydsl() -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["flydsl"]


@pytest.fixture(scope="module", params=AMD_TARGETS)
def compiled(request, tmp_path_factory, session_cache_dir):
    """The examples and a kernel calling each of the 89 device functions once, compiled for one target."""
    missing = _flydsl_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp(f"flydsl-{request.param}")
    every = out / "every_function.py"
    every.write_text(EVERY_FUNCTION_SCRIPT)
    manifest = flydsl_compile.compile_scripts([*SCRIPTS.values(), every], target=request.param, out_dir=out)
    return request.param, out, manifest


@needs_flydsl
def test_the_kernels_link_our_library_with_no_undefined_symbol(compiled):
    target, out, manifest = compiled
    from mori_compiler.lib_bitcode import find_bitcode

    assert manifest["target"] == target and manifest["flydsl_arch"] == target
    assert f"flydsl=={manifest['flydsl_version']}" in _pinned_flydsl()  # tested with the version the extra pins
    assert manifest["flydsl_warp_size"] == TARGETS[target].wave_size
    assert sorted(manifest["kernels"]) == sorted([*SCRIPTS, "every_function"])
    for name, kernel in manifest["kernels"].items():
        data = (out / kernel["file"]).read_bytes()
        check_no_undefined_symbols(data, name)
        info = read_amdgpu_code_object(data)
        assert info.undefined_symbols() == []
        assert info.gfx_name == target
        assert info.abi_version + 2 == manifest["code_object_version"]  # EI_ABIVERSION n: code object v(n+2)
        assert manifest["code_object_version"] in client.SUPPORTED_CODE_OBJECT_VERSIONS
        assert [k.name.rsplit("_", 1)[0] for k in info.kernels] == [name]  # FlyDSL names it <function>_<n>
        assert [k.wavefront_size for k in info.kernels] == [TARGETS[target].wave_size]
        exported = info.exported_symbols()
        assert STATE_SYMBOL in exported and exported[STATE_SYMBOL].size >= STATE_SIZE
        assert kernel["link_libs"] == [find_bitcode(target=target)]
        assert kernel["post_load"] == ["mori_compiler.clients.flydsl:shmem_module_init"]


@needs_flydsl
def test_the_initializer_flydsl_records_fills_the_state_of_the_loaded_module(compiled, no_shmem, monkeypatch):
    """What FlyDSL's loader does after hipModuleLoad, over the fake HIP bindings: the module answers
    hipModuleGetGlobal with what the code object really exports."""
    target, out, manifest = compiled
    kernel = manifest["kernels"]["ring_put_signal"]
    module_name, qualname = kernel["post_load"][0].split(":")
    initializer = getattr(importlib.import_module(module_name), qualname)
    assert initializer is client.shmem_module_init
    gpu = FakeGPU()
    hip = _install_hip(monkeypatch, gpu)
    data = (out / kernel["file"]).read_bytes()
    gpu.globals = {name: sym.size for name, sym in read_amdgpu_code_object(data).exported_symbols().items()}
    shmem.shmem_init_comm(OneRank(), driver=driver_mod.get_driver("rocdl"))
    err, handle = hip.hipModuleLoadData(data)
    assert initializer(int(handle)) == 0
    written = gpu.read(gpu.module_globals[(int(handle), STATE_SYMBOL)], STATE_SIZE)
    assert written == shmem.device_state_bytes()


UNDEFINED_SCRIPT = """
import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.extern_link import link_extern
from flydsl.expr.extern import ffi

from mori_compiler.clients import flydsl as shmem
from mori_compiler.clients.flydsl_compile import emit

missing = link_extern(ffi("mori_shmem_not_in_the_library", [], "int32"), bitcode_path=shmem.get_bitcode_path())


@flyc.kernel
def calls_a_missing_function(x: fx.Int64):
    missing()
    shmem.quiet_thread()


@flyc.jit
def launch(x: fx.Int64):
    calls_a_missing_function(x).launch(grid=(1, 1, 1), block=(64, 1, 1))


emit("undefined", launch, 0)
"""


@needs_flydsl
def test_a_function_outside_the_library_is_reported_undefined(tmp_path):
    """The check above can fail: ld.lld -shared leaves the symbol undefined, the reader names it."""
    script = tmp_path / "undefined.py"
    script.write_text(UNDEFINED_SCRIPT)
    manifest = flydsl_compile.compile_scripts([script], target="gfx942", out_dir=tmp_path / "out")
    data = (tmp_path / "out" / manifest["kernels"]["undefined"]["file"]).read_bytes()
    assert read_amdgpu_code_object(data).undefined_symbols() == ["mori_shmem_not_in_the_library"]
    with pytest.raises(CodeObjectError, match="mori_shmem_not_in_the_library"):
        check_no_undefined_symbols(data)


@needs_flydsl
def test_a_failing_script_is_reported_with_its_line(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("# a user's script with a bug\n\nraise ValueError('no kernel here')\n")
    proc = _run_driver("--target", "gfx950", "--out", tmp_path / "out", script)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{script}:3: ValueError: no kernel here" in proc.stderr
    empty = tmp_path / "empty.py"
    empty.write_text("KERNELS = []\n")
    proc = _run_driver("--target", "gfx950", "--out", tmp_path / "out", empty)
    assert proc.returncode == 1 and "no kernel emitted" in proc.stderr


DESCRIBE = """
import json, os
os.environ["COMPILE_ONLY"] = "1"
from mori_compiler.clients import flydsl as shmem
print(json.dumps({name: {"symbol": f.extern.symbol, "args": f.extern._arg_type_names, "ret": f.extern._ret_type_name,
                         "pure": f.extern.is_pure, "init": f.module_init_fn is shmem.shmem_module_init,
                         "linked": type(f).__mro__[1].__name__}
                  for name, f in shmem.device_functions().items()}))
"""


@needs_flydsl
def test_each_device_function_is_a_linked_flydsl_extern_of_its_abi_entry():
    proc = subprocess.run([sys.executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert sorted(described) == sorted(MORI_DEVICE_FUNCTIONS)
    for name, meta in MORI_DEVICE_FUNCTIONS.items():
        got = described[name]
        assert (got["symbol"], got["args"], got["ret"], got["pure"]) == (
            meta["symbol"], meta["args"], meta["ret"], meta.get("pure", False)), name
        assert got["init"] and got["linked"] == "LinkedExternFunction", name
