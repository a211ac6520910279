"""MORI's module names (mori_compiler.compat) and the shmem parity functions (runtime/shmem.py).

The finder runs in subprocesses only (so this process never resolves ``mori``): the names map to the alias
modules, a real ``mori`` on the path always wins (and ``status`` / ``enable`` say so), ``mori.shmem`` imports
neither MLIR nor llvmlite, and the set-up step writes, keeps and removes its ``.pth`` file. The shmem
functions run over the fake CUDA bindings of test_runtime_fakes.py.
"""

from __future__ import annotations

import errno
import math
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import types

import pytest

from mori_compiler import compat
from mori_compiler.compat import __main__ as cli
from mori_compiler.lib_bitcode.abi import MORI_STATE_SYMBOL
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL, unpack_state
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime import shmem, shmem_bootstrap, shmem_comm
from mori_compiler.runtime.shmem import ShmemError, ShmemStateError

from test_runtime_fakes import FakeGPU, OneRank, install_fake_cuda  # noqa: E402 - the shared fake bindings


def _python(code: str, *, cwd, env_extra: dict | None = None, args=()) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, *args, "-c", code] if code else [sys.executable, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


_WITH_FINDER = "import mori_compiler.compat as c; c.install()\n"


def test_mori_names_map_to_the_alias_modules(tmp_path):
    code = _WITH_FINDER + (
        "import importlib, sys\n"
        "for name, alias in c.MODULE_MAP.items():\n"
        "    assert importlib.import_module(name) is importlib.import_module(alias), name\n"
        "import mori, mori.shmem, mori.ops, mori.ir, mori.io\n"
        "assert c.is_ours(mori) and mori.shmem.shmem_malloc is importlib.import_module('mori_compiler.runtime.shmem').shmem_malloc\n"
        "from mori.ops import EpDispatchCombineOp, EpDispatchCombineConfig, EpDispatchCombineKernelType\n"
        "from mori.ir import MORI_DEVICE_FUNCTIONS, SIGNAL_SET, SIGNAL_ADD, find_bitcode, get_bitcode_path\n"
        "from mori.io import IOEngine, IOEngineConfig, BackendType\n"
        "from mori.shmem.api import shmem_module_init, shmem_num_qp_per_pe\n"
        "from mori.shmem.tensor_utils import MoriShmemBuffer, symm_mori_shmem_tensor, mori_shmem_free_tensor, "
        "mori_shmem_create_tensor_list_intra_node\n"
        "assert 'mori.shmem.tensor_utils' in c.MODULE_MAP\n"
        "import mori_compiler.ops as ops\n"
        "assert issubclass(EpDispatchCombineOp, ops.EpDispatchCombineOp) and EpDispatchCombineConfig is ops.EpDispatchCombineConfig\n"
        "assert len(MORI_DEVICE_FUNCTIONS) > 50 and (SIGNAL_SET, SIGNAL_ADD) == (9, 10)\n"
        "print('ok')\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_ir_submodules_import_by_from_import(tmp_path):
    """``from mori.ir import ops, bitcode`` (MORI's own scripts' form) and ``mori.ir.triton`` as a package."""
    code = _WITH_FINDER + ("from mori.ir import ops, bitcode\n"
                           "import mori.ir, importlib.util\n"
                           "assert ops is bitcode is mori.ir\n"
                           "assert importlib.util.find_spec('mori.ir.triton').submodule_search_locations is not None\n"
                           "print('ok')\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize("name, expected", [
    ("mori.ir.triton.cco", "mori.ir.triton.cco: MORI's CCO device API"),
    ("mori.jit", "mori.jit: there is no JIT of MORI's HIP sources"),
    ("mori.ccl", "mori.ccl is not one of mori_compiler's MORI-compatible modules"),
])  # fmt: skip
def test_modules_not_offered_raise_a_clear_import_error(tmp_path, name, expected):
    code = _WITH_FINDER + f"import {name}\n"
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"ModuleNotFoundError: {expected}" in proc.stderr, proc.stderr


def test_mori_submodules_load_on_attribute_access(tmp_path):
    # MORI's own tests do `import mori` and then use `mori.shmem.shmem_mype()`, `mori.ops.EpDispatchCombineConfig`.
    code = _WITH_FINDER + (
        "import sys, mori\n"
        "assert 'mori.shmem' not in sys.modules and 'mori_compiler.ops' not in sys.modules\n"
        "assert mori.shmem.shmem_mype and mori.ops.EpDispatchCombineConfig and mori.ir.find_bitcode and mori.io.IOEngine\n"
        "try:\n"
        "    mori.ccl\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "module 'mori' (mori_compiler's MORI-compatible names) has no attribute 'ccl'"


def test_mori_cpp_offers_the_names_clients_take_from_it(tmp_path):
    code = _WITH_FINDER + (
        "from mori.cpp import TransferStatus, StatusCode, MemoryDesc, MORI_SHMEM_INIT_WITH_UNIQUEID\n"
        "import mori.cpp, mori.io, mori.shmem\n"
        "assert TransferStatus is mori.io.TransferStatus and MemoryDesc is mori.io.MemoryDesc\n"
        "assert MORI_SHMEM_INIT_WITH_UNIQUEID == mori.shmem.MORI_SHMEM_INIT_WITH_UNIQUEID\n"
        "try:\n"
        "    from mori.cpp import UMBPClient\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, 'UMBPClient' in str(exc))\n"
        "try:\n"
        "    mori.cpp.UMBPClient\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == "ImportError True"
    assert second.startswith("mori.cpp.UMBPClient: MORI's C++ extension does not exist in mori_compiler; its mori.cpp "
                             "offers only BackendType, ")  # fmt: skip


def test_without_the_set_up_step_mori_is_not_importable(tmp_path):
    proc = _python("import mori", cwd=tmp_path)
    assert proc.returncode == 1 and "No module named 'mori'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("imports", ["mori.shmem, mori.shmem.api",
                                     "mori.ops, mori.ir, mori.io, mori.cpp; from mori.ops import EpDispatchCombineOp"])
def test_mori_names_import_neither_mlir_nor_llvmlite(tmp_path, imports):
    # GPU machines have neither: mori.shmem needs only the runtime, and no MORI name imports the compiler
    # before something is compiled.
    code = _WITH_FINDER + (
        "import sys\n"
        f"import {imports}\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('mlir', 'llvmlite'))\n"
        "assert not heavy, heavy\n"
        "print('ok')\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _fake_real_mori(root):
    pkg = root / "mori"
    (pkg / "shmem").mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    (pkg / "shmem" / "__init__.py").write_text("REAL_SHMEM = True\n")
    return pkg


def test_a_real_mori_always_wins(tmp_path):
    real = _fake_real_mori(tmp_path / "site")
    code = _WITH_FINDER + (
        "import mori, mori.shmem\n"
        "assert mori.REAL and mori.shmem.REAL_SHMEM and not c.is_ours(mori), mori\n"
        "try:\n"
        "    import mori.ops\n"
        "except ModuleNotFoundError as exc:\n"
        "    assert 'mori_compiler' not in str(exc), exc  # the real MORI's (missing) module, not ours\n"
        "else:\n"
        "    raise AssertionError('our mori.ops served under a real mori')\n"
        "print(mori.__file__)\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path, env_extra={"PYTHONPATH": str(real.parent)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(real / "__init__.py")


def test_a_real_mori_found_by_a_finder_appended_later_wins(tmp_path):
    # An import hook installed after start-up (after our finder) that finds a real mori: it wins, not ours.
    real = _fake_real_mori(tmp_path / "hidden")  # not on sys.path: only the late finder knows it
    code = _WITH_FINDER + (
        "import importlib.util, sys\n"
        "class Late:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == 'mori': return importlib.util.spec_from_file_location('mori', {str(real / '__init__.py')!r})\n"
        "sys.meta_path.append(Late())\n"
        "import mori\n"
        "assert mori.REAL and not c.is_ours(mori), mori\n"
        "print(c.other_mori().where)\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(real / "__init__.py")


def test_a_later_finder_that_asks_the_import_system_gets_no_answer_from_us(tmp_path):
    # A finder after ours that looks names up through importlib.util.find_spec (guarding itself against its own
    # re-entry) re-enters our finder: no recursion, it finds nothing, and ours serves mori.
    code = _WITH_FINDER + (
        "import importlib.util, sys\n"
        "class Asking:\n"
        "    busy = False\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mori' and not Asking.busy:\n"
        "            Asking.busy = True\n"
        "            print('asked', importlib.util.find_spec(name))\n"
        "            Asking.busy = False\n"
        "sys.meta_path.append(Asking())\n"
        "import mori\n"
        "print(c.is_ours(mori))\n")  # fmt: skip
    proc = _python(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["asked", "None", "True"]


def test_status_and_enable_name_a_real_mori(tmp_path):
    real = _fake_real_mori(tmp_path / "site")
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    env = {"PYTHONPATH": str(real.parent)}
    status = _python("", cwd=tmp_path, env_extra=env, args=("-m", "mori_compiler.compat", "status", "--site-dir", str(site_dir)))
    assert status.returncode == 0, status.stderr
    assert f"import mori: a real MORI at {real / '__init__.py'} (mori_compiler's names are not used)" in status.stdout
    enable = _python("", cwd=tmp_path, env_extra=env, args=("-m", "mori_compiler.compat", "enable", "--site-dir", str(site_dir)))
    assert enable.returncode == 1
    assert enable.stderr.startswith(f"error: a real MORI is importable here ({real / '__init__.py'})"), enable.stderr
    assert not list(site_dir.iterdir())


def test_a_directory_named_mori_is_reported_as_one(tmp_path):
    # A clone of MORI's sources in the current directory: a namespace package to Python, not an installed MORI.
    (tmp_path / "mori" / "python").mkdir(parents=True)
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    run = lambda cmd: _python("", cwd=tmp_path, env_extra={"PYTHONPATH": ""},  # noqa: E731
                              args=("-m", "mori_compiler.compat", cmd, "--site-dir", str(site_dir)))  # fmt: skip
    status = run("status")
    assert status.returncode == 0, status.stderr
    assert (f"import mori: a directory named mori at {tmp_path / 'mori'}, without __init__.py, shadows "
            f"mori_compiler's names (run from another directory)") in status.stdout  # fmt: skip
    enable = run("enable")
    assert enable.returncode == 1 and "pip uninstall" not in enable.stderr
    assert enable.stderr.startswith(f"error: a directory named mori ({tmp_path / 'mori'}) is on the import path"), enable.stderr
    assert "run enable (and your scripts) from another directory" in enable.stderr
    assert not list(site_dir.iterdir())


def test_enable_disable_status_round_trip(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    pth = site_dir / cli.PTH_NAME

    def run(*args):
        proc = _python("", cwd=tmp_path, args=("-m", "mori_compiler.compat", *args, "--site-dir", str(site_dir)))
        return proc.returncode, proc.stdout.strip(), proc.stderr.strip()

    assert run("status") == (0, f"set-up file: {pth} (absent)\nimport mori: ModuleNotFoundError (run `python -m "
                                f"mori_compiler.compat enable`)", "")  # fmt: skip
    rc, out, _ = run("enable")
    assert rc == 0 and out.startswith(f"enabled: {pth}") and pth.read_text() == cli.PTH_LINE
    assert run("enable") == (0, f"already enabled: {pth}", "")
    rc, out, _ = run("status")
    assert rc == 0 and "import mori: mori_compiler's MORI-compatible names" in out and "(present)" in out
    # A new interpreter that processes the site directory gets MORI's names from the .pth alone.
    proc = _python(f"import site; site.addsitedir({str(site_dir)!r}); import mori.shmem, mori; "
                   f"print(mori.__mori_compiler_alias__)", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert run("disable") == (0, f"disabled: removed {pth}", "")
    assert run("disable") == (0, f"not enabled (no {pth})", "")
    rc, out, err = run("bogus")
    assert rc == 1 and not out and err.startswith("error: argument command: invalid choice: 'bogus'")


def test_enable_refuses_a_directory_it_cannot_write(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(cli.CompatError, match="is not a directory"):
        cli.enable(not_a_dir)
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)  # (root may write anywhere)
    with pytest.raises(cli.CompatError, match=r"cannot write .*mori_compiler_compat.pth: .* is not writable"):
        cli.enable(tmp_path)
    assert not (tmp_path / cli.PTH_NAME).exists()


def test_the_pth_line_is_harmless_without_mori_compiler(tmp_path):
    # An environment where mori_compiler was uninstalled: the guarded line does nothing, prints nothing.
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / cli.PTH_NAME).write_text(cli.PTH_LINE)
    code = ("import sys, importlib.util as u; sys.meta_path.insert(0, type('Hide', (), {'find_spec': "
            "staticmethod(lambda n, p=None, t=None: (_ for _ in ()).throw(ImportError(n)) if n == 'mori_compiler' "
            "else None)})()); u.find_spec = lambda n, *a: None; import site; site.addsitedir(sys.argv[1]); "
            "print(any(type(f).__name__ == 'MoriAliasFinder' for f in sys.meta_path))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(site_dir)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "False" and not proc.stderr, proc.stderr


def test_finder_is_installed_once_and_last(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    compat.install()
    compat.install()
    assert sum(isinstance(f, compat.MoriAliasFinder) for f in sys.meta_path) == 1
    assert isinstance(sys.meta_path[-1], compat.MoriAliasFinder)


# ---- shmem parity: shmem_module_init, shmem_num_qp_per_pe, shmem_buffer_deregister, the refusals ---------


@pytest.fixture
def cuda(monkeypatch):
    gpu = FakeGPU()
    monkeypatch.setitem(sys.modules, "torch", None)
    install_fake_cuda(monkeypatch, gpu)
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", str(1 << 20))
    monkeypatch.delenv("MORI_NUM_QP_PER_PE", raising=False)
    driver_mod._reset_drivers()
    yield gpu, driver_mod.get_driver("nvvm")
    if shmem.current_state() is not None:
        shmem.shmem_finalize()
    driver_mod._reset_drivers()


def _foreign_module(drv) -> int:
    """A module someone else loaded: its raw handle as an int, as Triton's ``kernel.module``."""
    return int(drv._call("cuModuleLoadData", b"// PTX\n"))


def test_shmem_module_init_fills_a_module_loaded_elsewhere(cuda):
    gpu, drv = cuda
    shmem.shmem_init_comm(OneRank(), driver=drv)
    handle = _foreign_module(drv)
    assert shmem.shmem_module_init(handle, wait_limit=7) == 0
    state_addr = gpu.module_globals[(handle, STATE_SYMBOL)]
    fields = unpack_state(gpu.read(state_addr, STATE_SIZE))
    assert (fields["rank"], fields["n_pes"], fields["wait_limit"]) == (0, 1, 7)
    assert fields["heap_size"] == 1 << 20
    # A binding handle object (hipModule_t / CUmodule) works as its int does.
    assert shmem.shmem_module_init(type("CUmodule", (), {"__int__": lambda self: handle})()) == 0


def test_shmem_module_init_without_state_returns_minus_one_and_refuses_mori_state(cuda):
    gpu, drv = cuda
    shmem.shmem_init_comm(OneRank(), driver=drv)
    gpu.globals = {}
    assert shmem.shmem_module_init(_foreign_module(drv)) == -1  # MORI's answer for a module without state
    gpu.globals = {MORI_STATE_SYMBOL: 80}
    with pytest.raises(ShmemStateError, match=r"holds MORI's device state \(_ZN4mori5shmem15globalGpuStatesE\)"):
        shmem.shmem_module_init(_foreign_module(drv))
    gpu.globals = {STATE_SYMBOL: STATE_SIZE - 8}
    with pytest.raises(ShmemStateError, match=f"has {STATE_SIZE - 8} bytes; the runtime writes {STATE_SIZE}"):
        shmem.shmem_module_init(_foreign_module(drv))


@pytest.mark.parametrize("bad, expected", [(None, "expected a loaded module"), ("0x1", "expected a loaded module"),
                                           (True, "expected a loaded module"), (0, "is not a loaded module"),
                                           (object(), "cannot read a module handle from object")])  # fmt: skip
def test_shmem_module_init_refuses_what_is_not_a_module(cuda, bad, expected):
    _, drv = cuda
    shmem.shmem_init_comm(OneRank(), driver=drv)
    with pytest.raises(ShmemError, match=expected):
        shmem.shmem_module_init(bad)


def test_shmem_module_init_needs_init_and_refuses_virtual_pes(cuda):
    _, drv = cuda
    with pytest.raises(ShmemStateError, match="shmem is not initialized"):
        shmem.shmem_module_init(1)
    shmem.shmem_init_virtual(2, driver=drv)
    with pytest.raises(ShmemStateError, match="2 virtual PEs in this process"):
        shmem.shmem_module_init(_foreign_module(drv))


def test_shmem_num_qp_per_pe(cuda, monkeypatch):
    _, drv = cuda
    shmem.shmem_init_comm(OneRank(), driver=drv)
    assert shmem.shmem_num_qp_per_pe() == 4  # MORI's default
    shmem.shmem_finalize()
    monkeypatch.setenv("MORI_NUM_QP_PER_PE", "2")
    shmem.shmem_init_comm(OneRank(), driver=drv)
    assert shmem.shmem_num_qp_per_pe() == 2
    shmem.shmem_finalize()
    for bad in ("0", "9", "two"):
        monkeypatch.setenv("MORI_NUM_QP_PER_PE", bad)
        with pytest.raises(ShmemError, match=f"MORI_NUM_QP_PER_PE={bad!r}|MORI_NUM_QP_PER_PE={bad}:"):
            shmem.shmem_init_comm(OneRank(), driver=drv)
        assert shmem.current_state() is None


def test_buffer_deregister_takes_and_checks_the_size(cuda):
    _, drv = cuda
    shmem.shmem_init_comm(OneRank(), driver=drv)
    assert shmem.shmem_buffer_register(0x5000_0000, 4096) == 0
    with pytest.raises(ShmemError, match=r"size is required, as in MORI; .* \(4096 for the buffer at 0x50000000\)"):
        shmem.shmem_buffer_deregister(0x5000_0000)
    with pytest.raises(ShmemError, match="was registered with 4096 bytes; pass that size"):
        shmem.shmem_buffer_deregister(0x5000_0000, 16)
    assert shmem.shmem_buffer_deregister(0x5000_0000, 4096) == 0
    with pytest.raises(ShmemError, match="no buffer is registered at that address"):
        shmem.shmem_buffer_deregister(0x5000_0000, 4096)


def test_what_shmem_does_not_offer_is_refused_by_name(cuda):
    _, drv = cuda
    with pytest.raises(NotImplementedError, match="shmem_mpi_init: mori_compiler has no MPI bootstrap"):
        shmem.shmem_mpi_init()
    with pytest.raises(NotImplementedError, match="shmem_barrier_on_stream: the runtime has no barrier kernel"):
        shmem.shmem_barrier_on_stream(0)
    shmem.shmem_init_comm(OneRank(), driver=drv)
    with pytest.raises(NotImplementedError, match=r"shmem_ext_malloc_with_flags\(size, flags=1\): only flags=0"):
        shmem.shmem_ext_malloc_with_flags(256, 1)
    ptr = shmem.shmem_ext_malloc_with_flags(256, 0)
    assert shmem.state().locate(ptr) is not None  # flags 0: a plain symmetric allocation
    shmem.shmem_free(ptr)


# ---- shmem_init_attr without torch.distributed: the rendezvous the unique id carries ----------------

_RANK0 = r"""
import sys
from mori_compiler.runtime import shmem_bootstrap as b
uid = b.new_unique_id()
print(uid.hex(), flush=True)
comm = b.connect(uid, 0, int(sys.argv[1]), timeout=60)
print(comm.all_gather_object(("pe", comm.rank)), flush=True)
comm.barrier()
"""
_RANK_N = r"""
import sys
from mori_compiler.runtime import shmem_bootstrap as b
comm = b.connect(bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), timeout=60)
print(comm.all_gather_object(("pe", comm.rank)), flush=True)
comm.barrier()
"""


def test_unique_id_rendezvous_across_processes(tmp_path):
    n = 3
    rank0 = subprocess.Popen([sys.executable, "-c", _RANK0, str(n)], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    procs = []
    try:
        uid = rank0.stdout.readline().strip()
        assert len(bytes.fromhex(uid)) == 128, rank0.stderr.read()
        for r in (2, 1):
            procs.append(subprocess.Popen([sys.executable, "-c", _RANK_N, uid, str(r), str(n)], cwd=tmp_path,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
        outs = [p.communicate(timeout=90) for p in procs]
        out0, err0 = rank0.communicate(timeout=90)
    finally:
        for p in [rank0, *procs]:  # none left behind when a rank fails or hangs
            p.kill()
            p.wait()
    expected = "[('pe', 0), ('pe', 1), ('pe', 2)]"
    assert rank0.returncode == 0 and out0.strip() == expected, err0
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == expected, err


def _thread_ranks(n, fn):
    results = [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[r] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def test_shmem_state_over_the_unique_id_rendezvous(monkeypatch):
    # Two PEs as threads (each its own fake driver, IPC shared), the comm the unique id carries.
    from test_runtime_shmem import FakeDriver, IpcRegistry

    monkeypatch.setattr(shmem_comm, "process_identity", threading.get_ident)
    uid = shmem.shmem_get_unique_id()
    ipc = IpcRegistry()
    drivers = [FakeDriver(ipc), FakeDriver(ipc)]

    def rank(r):
        comm = shmem_bootstrap.connect(uid, r, 2, timeout=20)
        return shmem.ShmemState.create_multiprocess(drivers[r], comm, 1 << 20, unique_id=uid)

    states = _thread_ranks(2, rank)
    assert [s.my_pe for s in states] == [0, 1], states
    assert all(s.heap_bases[0] and s.heap_bases[1] for s in states)
    ptrs = _thread_ranks(2, lambda r: states[r].malloc(256))  # collective over the sockets
    assert ptrs[0] - states[0].my_base == ptrs[1] - states[1].my_base
    _thread_ranks(2, lambda r: (states[r].finalize(), states[r].comm.close()))


def test_shmem_init_attr_needs_no_torch_distributed(cuda):
    _, drv = cuda  # (torch is absent in this test: sys.modules["torch"] = None)
    uid = shmem.shmem_get_unique_id()
    assert shmem.shmem_init_attr(shmem.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, uid, driver=drv) == 0
    s = shmem.state()
    assert (s.mode, s.n_pes, s.my_pe) == ("multiprocess", 1, 0)
    assert isinstance(s.comm, shmem_bootstrap.UniqueIdComm)
    shmem.shmem_finalize()
    assert s.comm._hub is None and s.comm._peers == [None]


@pytest.mark.parametrize("rank, nranks, expected", [(2, 2, r"rank must be in \[0, nranks\)"),
                                                    (-1, 2, r"rank must be in \[0, nranks\)"),
                                                    (True, 2, "rank must be an integer"),
                                                    (0, 2.0, "nranks must be an integer")])  # fmt: skip
def test_shmem_init_attr_checks_rank_and_nranks(cuda, rank, nranks, expected):
    _, drv = cuda
    with pytest.raises(ShmemError, match=expected):
        shmem.shmem_init_attr(1, rank, nranks, shmem.shmem_get_unique_id(), driver=drv)


def test_rendezvous_errors_name_the_problem():
    # A rank that never comes: rank 0 says which, within the timeout.
    uid = shmem_bootstrap.new_unique_id()
    with pytest.raises(ShmemStateError, match=r"rank\(s\) \[1, 2\] did not join within 0.3 s"):
        shmem_bootstrap.connect(uid, 0, 3, timeout=0.3)
    # The listener is gone with that attempt: this process can no longer be rank 0 of that id.
    with pytest.raises(ShmemStateError, match="rank 0 must be the process that called shmem_get_unique_id"):
        shmem_bootstrap.connect(uid, 0, 3, timeout=0.3)
    with pytest.raises(ShmemError, match="carries no rendezvous address"):
        shmem_bootstrap.connect(b"x" * 128, 1, 2, timeout=0.3)
    for rank, nranks in ((0, 1 << 40), (3, 2), (-1, 2)):
        with pytest.raises(ShmemError, match=rf"rank={rank}, nranks={nranks}: expected 0 <= rank < nranks <= 65536"):
            shmem_bootstrap.connect(uid, rank, nranks, timeout=0.3)
    # Nobody listens at the id's address any more: refused, so the joining rank fails at once, not at the deadline.
    started = time.monotonic()
    with pytest.raises(ShmemStateError, match=r"rank 1 cannot reach rank 0 at [^ ]+:\d+: the connection was refused, "
                                              r"so rank 0's listener is gone .*the unique id is stale or rank 0 exited"):
        shmem_bootstrap.connect(uid, 1, 3, timeout=30)
    assert time.monotonic() - started < 1


def test_rendezvous_refuses_disagreeing_ranks_and_ignores_strangers():
    uid = shmem_bootstrap.new_unique_id()
    token, host, port = shmem_bootstrap.parse_unique_id(uid)
    stranger = socket.create_connection((host, port), timeout=5)
    stranger.sendall(shmem_bootstrap._HELLO.pack(b"\0" * 16, b"\0" * 32, 1, 2))  # a wrong MAC: dropped unread

    def rank(r):
        return shmem_bootstrap.connect(uid, r, 2 if r == 0 else 3, timeout=5)

    results = _thread_ranks(2, rank)
    stranger.close()
    for r in results:
        assert isinstance(r, ShmemStateError), r
        assert "a process joined as rank 1 of 3 (rank 0 has nranks=2)" in str(r)


def test_rendezvous_encoding_round_trips_and_refuses_what_it_did_not_make():
    b = shmem_bootstrap
    record = {"pe": 1, "host": "h", "pid": -7, "heap_size": 1 << 40, "handle": b"\0\xff" * 32, "unique_id": None,
              "error": "\u00e9", "ok": True, "no": False, "x": 0.5, "calls": [(1, (2, [3])), ()], "big": -(1 << 200)}  # fmt: skip
    assert b.decode(b.encode(record)) == record
    assert type(b.decode(b.encode([(1,)]))[0]) is tuple
    for bad, why in [(b"", "a tag runs past the end"), (b"Q", "unknown tag b'Q'"), (b"NN", "1 stray byte"),
                     (b"L\xff\xff\xff\xff", "a list of length 4294967295 runs past the end"),
                     (b"S\x02\0\0\0\xff\xfe", "a str that is not UTF-8"),
                     (b"L\x01\0\0\0" * 20 + b"N", "nested deeper than 16"),
                     (b"M\x01\0\0\0L\0\0\0\0N", "a dict key that is not hashable \\(list\\)"),
                     (__import__("pickle").dumps(("pe", 0)), "unknown tag")]:  # fmt: skip
        with pytest.raises(b._Malformed, match=why):
            b.decode(bad)
    with pytest.raises(ShmemError, match="cannot send a object"):
        b.encode([object()])


def _uid_at(token: bytes, port: int, host: str = "127.0.0.1") -> bytes:
    b = shmem_bootstrap
    return (b.MAGIC + token + struct.pack("<HB", port, len(host)) + host.encode()).ljust(b.UNIQUE_ID_BYTES, b"\0")


def _stranger_server(reply, token: bytes = b"t" * 16):
    """A server at the id's address that is not rank 0 (a stale id's reused port): it reads the hello, sends
    ``reply(nonce)`` and holds the connection open until the test ends. Returns (uid, stop)."""
    b = shmem_bootstrap
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve():
        sock, _ = listener.accept()
        with sock:
            nonce = sock.recv(b._HELLO.size)[: b.NONCE_BYTES]
            sock.sendall(reply(nonce))
            done.wait(10)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return _uid_at(token, listener.getsockname()[1]), done.set


def _frame(kind: bytes, payload: bytes = b"", length: int | None = None) -> bytes:
    return shmem_bootstrap._FRAME.pack(kind, len(payload) if length is None else length) + payload


_PROVEN = lambda nonce: _frame(b"A", shmem_bootstrap._serve_mac(b"t" * 16, nonce))  # noqa: E731 - rank 0's proof


@pytest.mark.parametrize("reply, why", [
    (lambda n: _frame(b"O", length=1 << 40), r"a frame of kind b'O' where rank 0's proof was due"),
    (lambda n: _frame(b"Z"), r"a frame of kind b'Z' where rank 0's proof was due"),
    (lambda n: _frame(b"A", length=1 << 40), r"a 1099511627776-byte proof \(a proof has 32 bytes\)"),
    (lambda n: _frame(b"A", b"\0" * 32), "a proof that does not match the id's token"),
    (lambda n: _PROVEN(n) + _frame(b"O", length=1 << 40), r"a 1099511627776-byte frame \(at most MAX_FRAME_BYTES"),
    (lambda n: _PROVEN(n) + _frame(b"A", b"\0" * 32), r"a frame of kind b'A' where an object or an error was due"),
    (lambda n: _PROVEN(n) + _frame(b"O", b"x"), "a 1-byte start signal"),
])  # fmt: skip
def test_a_joining_rank_trusts_nothing_that_is_not_rank_0(reply, why):
    uid, stop = _stranger_server(reply)
    started = time.monotonic()
    try:
        with pytest.raises(ShmemStateError, match=f"rank 1: what answers at 127.0.0.1:\\d+ is not rank 0 of this "
                                                  f"unique id \\({why}"):  # fmt: skip
            shmem_bootstrap.connect(uid, 1, 2, timeout=5)
    finally:
        stop()
    assert time.monotonic() - started < 3  # refused at once, never read up to the length, never waiting it out


@pytest.mark.parametrize("frame, why", [
    (_frame(b"O", __import__("pickle").dumps([("pe", 0), None])), r"malformed frame from rank 0 \(unknown tag"),
    (_frame(b"O", shmem_bootstrap.encode([1, 2, 3])), r"malformed frame from rank 0 \(a list where the list of 2"),
    (_frame(b"O", length=shmem_bootstrap.MAX_FRAME_BYTES + 1), f"a {shmem_bootstrap.MAX_FRAME_BYTES + 1}-byte frame"),
    (_frame(b"Q"), "a frame of kind b'Q' where an object or an error was due"),
    (b"", r"lost rank 0 \((Connection\w*|BrokenPipe)Error"),  # the send or the recv notices the close
])  # fmt: skip
def test_a_joined_rank_refuses_malformed_frames_from_rank_0(frame, why):
    # Rank 0 proved it holds the token, starts the rendezvous, then answers the first gather with ``frame``.
    uid, stop = _stranger_server(lambda n: _PROVEN(n) + _frame(b"O") + frame if frame else _PROVEN(n) + _frame(b"O"))
    try:
        comm = shmem_bootstrap.connect(uid, 1, 2, timeout=5)
        if not frame:
            stop()
        started = time.monotonic()
        with pytest.raises(ShmemStateError, match=f"shmem rendezvous: rank 1 .*{why}"):
            comm.all_gather_object(("pe", 1))
        assert time.monotonic() - started < 3
        comm.close()
    finally:
        stop()


@pytest.mark.parametrize("frame, why", [
    (_frame(b"O", length=1 << 40), r"malformed frame from rank 1 \(a 1099511627776-byte frame"),
    (_frame(b"E", b"x"), r"malformed frame from rank 1 \(a frame of kind b'E' where an object was due"),
    (_frame(b"O", b"\x80\x04K\x01."), r"malformed frame from rank 1 \(unknown tag b'\\x80'"),
])  # fmt: skip
def test_rank_0_refuses_malformed_frames_from_a_joined_rank(frame, why):
    b = shmem_bootstrap
    uid = b.new_unique_id()
    token, host, port = b.parse_unique_id(uid)
    result = {}

    def rank0():
        try:
            comm = b.connect(uid, 0, 2, timeout=5)
            result["error"] = None
            comm.all_gather_object(("pe", 0))
        except ShmemStateError as exc:
            result["error"] = exc

    thread = threading.Thread(target=rank0)
    thread.start()
    nonce = b"n" * b.NONCE_BYTES
    with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:  # rank 1, holding the token
        peer.sendall(b._HELLO.pack(nonce, b._join_mac(token, nonce, 1, 2), 1, 2))
        proof = b._recv_exact(peer, b._FRAME.size + 32, b._Deadline(5))
        assert proof == _frame(b"A", b._serve_mac(token, nonce))
        thread_started = time.monotonic()
        peer.sendall(frame)
        thread.join(3)
        assert not thread.is_alive() and time.monotonic() - thread_started < 3, "rank 0 hung"
    assert isinstance(result["error"], ShmemStateError) and re.search(why, str(result["error"])), result


def test_a_joining_rank_fails_at_once_on_an_unknown_host_and_retries_an_unreachable_one(monkeypatch):
    uid = _uid_at(b"t" * 16, 1, "no-such-host.invalid")
    calls = []

    def unknown(address, timeout=None):
        calls.append(address)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(shmem_bootstrap.socket, "create_connection", unknown)
    with pytest.raises(ShmemStateError, match=r"rank 1 cannot reach rank 0 at no-such-host.invalid:1: the host name "
                                              r"'no-such-host.invalid' does not resolve here \(Name or service"):  # fmt: skip
        shmem_bootstrap.connect(uid, 1, 2, timeout=30)
    assert len(calls) == 1

    def unreachable(address, timeout=None):
        calls.append(address)
        raise OSError(errno.ENETUNREACH, os.strerror(errno.ENETUNREACH))

    calls.clear()
    monkeypatch.setattr(shmem_bootstrap.socket, "create_connection", unreachable)
    with pytest.raises(ShmemStateError, match=f"cannot reach rank 0 at no-such-host.invalid:1 \\({os.strerror(errno.ENETUNREACH)}"):
        shmem_bootstrap.connect(uid, 1, 2, timeout=0.3)
    assert len(calls) > 1  # retried to the deadline: the route may come up


def test_rendezvous_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("MORI_COMPILER_RENDEZVOUS_TIMEOUT", "2.5")
    assert shmem_bootstrap.timeout_from_env() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("MORI_COMPILER_RENDEZVOUS_TIMEOUT", bad)
        with pytest.raises(ShmemError, match=f"MORI_COMPILER_RENDEZVOUS_TIMEOUT={bad!r}: expected a finite number of "
                                             f"seconds > 0"):  # fmt: skip
            shmem_bootstrap.timeout_from_env()


def test_quant_type_members_are_the_config_strings():
    from mori_compiler.compat.mori_ops import EpDispatchCombineQuantType as Q

    assert [str(m) for m in Q] == ["none", "fp8_direct_cast", "fp8_blockwise", "fp4_blockwise"]
    assert f"{Q.Fp8BlockwiseQuant}" == "fp8_blockwise" and Q("fp4_blockwise") is Q.Fp4BlockwiseQuant


def test_op_adapter_size_queries_and_geometry_checks():
    # The adapter's own logic, on an object that has only what it reads (building a real op needs torch).
    from mori_compiler.compat.mori_ops import EpDispatchCombineOp, _geometry
    from mori_compiler.ops import EpDispatchCombineConfig

    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=4, hidden_dim=256, scale_dim=0,
                                  scale_type_size=1, max_token_type_size=2, max_num_inp_token_per_rank=8,
                                  num_experts_per_rank=2, num_experts_per_token=2, max_total_recv_tokens=12)  # fmt: skip
    op = object.__new__(EpDispatchCombineOp)
    op.sizes = cfg.sizes
    assert op.max_num_tokens_to_send_per_rank() == 8 and op.max_num_tokens_to_send() == 32
    assert op.max_num_tokens_to_recv_per_rank() == 3 and op.max_num_tokens_to_recv() == 12  # min(ceil(12/4), 8)
    assert op.decode_send_flat_idx(70) == (2, 6)
    assert _geometry(-1, "x") == -1 and _geometry(64, "x") == 64
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match="x must be -1 \\(default\\) or a positive integer"):
            _geometry(bad, "x")
    for name in ("get_launch_config", "get_debug_time_buf", "get_debug_time_offset"):
        with pytest.raises(NotImplementedError, match=f"EpDispatchCombineOp.{name} is not offered by mori_compiler"):
            getattr(op, name)()


def test_op_adapter_passes_mori_positional_arguments_by_name(monkeypatch):
    # MORI's dispatch_send(input, weights, scales, indices, block_num, warp_per_block, call_local_expert_count):
    # the project's own has rdma_block_num fifth, so the adapter must pass everything by name.
    from mori_compiler.compat.mori_ops import EpDispatchCombineOp
    from mori_compiler.ops import EpDispatchCombineOp as ProjectOp

    calls = []
    for name in ("dispatch_send", "combine_send", "dispatch_standard_moe", "combine_standard_moe"):
        monkeypatch.setattr(ProjectOp, name, lambda self, *a, _n=name, **k: calls.append((_n, a, k)))
    op = object.__new__(EpDispatchCombineOp)
    op.dispatch_send("x", "w", "s", "i", 4, 8, True)
    op.combine_send("y", "w", "i", 4, 8)
    op.dispatch_standard_moe("x", "w", "s", "i", 4, 2, 8)
    op.combine_standard_moe("y", "w", "i", 4, 2, 8, True)
    assert calls == [
        ("dispatch_send", ("x", "w", "s", "i"), {"block_num": 4, "warp_per_block": 8, "call_local_expert_count": True}),
        ("combine_send", ("y", "w", "i"), {"block_num": 4, "warp_per_block": 8}),
        ("dispatch_standard_moe", ("x", "w", "s", "i"), {"block_num": 4, "rdma_block_num": 2, "warp_per_block": 8}),
        ("combine_standard_moe", ("y", "w", "i"), {"block_num": 4, "rdma_block_num": 2, "warp_per_block": 8,
                                                   "call_reset": True}),
    ]  # fmt: skip


def test_shmem_init_attr_refuses_before_any_rendezvous(cuda):
    _, drv = cuda
    with pytest.raises(ShmemError, match="unique_id must be the 128 bytes of shmem_get_unique_id\\(\\), got a int"):
        shmem.shmem_init_attr(1, 0, 1, 128, driver=drv)
    shmem.shmem_init_virtual(2, driver=drv)
    started = time.monotonic()
    with pytest.raises(ShmemStateError, match="shmem is already initialized \\(virtual, 2 PEs\\)"):
        shmem.shmem_init_attr(1, 0, 2, shmem.shmem_get_unique_id(), driver=drv, timeout=30)
    assert time.monotonic() - started < 5  # refused at once, not after waiting for rank 1


@pytest.mark.parametrize("uid, got", [(None, "got a NoneType"), (1.5, "got a float"), ("x" * 128, "got a str"),
                                      (128, "got a int"), (True, "got a bool"), (b"short", "got 5"),
                                      ([300] * 128, "got a list"), (object(), "got a object")])  # fmt: skip
def test_shmem_init_attr_refuses_what_is_not_a_unique_id(cuda, uid, got):
    _, drv = cuda
    with pytest.raises(ShmemError, match=rf"shmem_init_attr unique_id must be the 128 bytes of "
                                         rf"shmem_get_unique_id\(\), {got}$"):  # fmt: skip
        shmem.shmem_init_attr(1, 0, 1, uid, driver=drv)


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, "abc", "5", True, -1, 0, 0.0, [5]])
def test_shmem_init_attr_checks_the_timeout(cuda, timeout):
    _, drv = cuda
    started = time.monotonic()
    with pytest.raises(ShmemError, match=rf"shmem_init_attr timeout={re.escape(repr(timeout))}: expected a finite "
                                         rf"number of seconds > 0$"):  # fmt: skip
        shmem.shmem_init_attr(1, 0, 2, shmem.shmem_get_unique_id(), driver=drv, timeout=timeout)
    assert time.monotonic() - started < 5 and shmem.current_state() is None


def test_shmem_init_attr_takes_numpy_integers_and_whole_timeouts(cuda):
    np = pytest.importorskip("numpy")
    _, drv = cuda
    uid = bytearray(shmem.shmem_get_unique_id())  # any buffer of the id's bytes
    assert shmem.shmem_init_attr(np.int32(1), np.int64(0), np.int64(1), uid, driver=drv, timeout=np.float32(5)) == 0
    assert (shmem.shmem_mype(), shmem.shmem_npes()) == (0, 1) and shmem.state().comm.timeout == 5.0
    shmem.shmem_finalize()


def test_shmem_init_attr_checks_the_environment_before_the_rendezvous(cuda, monkeypatch):
    _, drv = cuda
    monkeypatch.setenv("MORI_NUM_QP_PER_PE", "lots")
    started = time.monotonic()
    with pytest.raises(ShmemError, match="MORI_NUM_QP_PER_PE='lots': expected an integer"):
        shmem.shmem_init_attr(1, 0, 2, shmem.shmem_get_unique_id(), driver=drv, timeout=30)
    assert time.monotonic() - started < 5  # not after waiting for rank 1


def test_unused_unique_ids_leave_no_listener_open(cuda, monkeypatch):
    _, drv = cuda
    b = shmem_bootstrap
    ids = [shmem.shmem_get_unique_id() for _ in range(3)]  # every rank gets one, rank 0's is used
    assert b.open_listener_count() >= 3
    shmem.shmem_init_attr(1, 0, 1, ids[1], driver=drv)
    assert b.open_listener_count() == 0  # the unused ones closed at init, the used one after the rendezvous
    with pytest.raises(ShmemStateError, match="rank 1 cannot reach rank 0 .*refused"):
        b.connect(ids[0], 1, 2, timeout=5)  # really closed
    shmem.shmem_get_unique_id()
    shmem.shmem_finalize()
    assert b.open_listener_count() == 0  # and those got after init, at finalize
    # With torch.distributed as the rendezvous no id's listener is used: closed even when init then refuses.
    dist = types.ModuleType("torch.distributed")
    dist.is_available = dist.is_initialized = lambda: True
    dist.get_rank, dist.get_world_size = (lambda group=None: 0), (lambda group=None: 2)
    torch = types.ModuleType("torch")
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    uid = shmem.shmem_get_unique_id()
    with pytest.raises(ShmemStateError, match="does not match torch.distributed"):
        shmem.shmem_init_attr(1, 0, 1, uid, driver=drv)
    assert b.open_listener_count() == 0


def test_shmem_init_attr_with_torch_distributed_takes_no_timeout(cuda, monkeypatch):
    _, drv = cuda
    dist = types.ModuleType("torch.distributed")
    dist.is_available = dist.is_initialized = lambda: True
    dist.get_rank, dist.get_world_size = (lambda group=None: 0), (lambda group=None: 1)
    torch = types.ModuleType("torch")
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    with pytest.raises(ShmemError, match="timeout= applies to the unique id's rendezvous, but torch.distributed"):
        shmem.shmem_init_attr(1, 0, 1, shmem.shmem_get_unique_id(), driver=drv, timeout=5)
    assert shmem.current_state() is None
