"""MORI scripts run through the compatible names: ``python -m mori_compiler.compat run``, the upstream driver
(test/mori_upstream/run.py), the standalone local expert count, and the example examples/mori_script/.

Every script here is our own, written in the patterns MORI's tests and examples use (pytest from the
repository root with ``tests.python.utils``-style imports, ``torch.multiprocessing.spawn`` children,
``subprocess`` of ``sys.executable``, ``from mori.io import ...``). MORI's own files are not in this
repository: the driver runs them from a copy (``--mori-src``); here it runs over a tree of ours.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mori_compiler.compat import run as compat_run
from mori_compiler.compat._boot import SITECUSTOMIZE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mori_script" / "ep_one_rank.py"


def _load_driver():
    spec = importlib.util.spec_from_file_location("mori_upstream_driver", REPO / "test" / "mori_upstream" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses looks its module up)
    spec.loader.exec_module(module)
    return module


driver = _load_driver()


def _run(*args, cwd, env_extra=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "mori_compiler.compat", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ---- run SCRIPT / run -m MODULE -------------------------------------------------------------------------


def test_run_script_gets_mori_names_argv_main_and_its_directory_first(tmp_path):
    _write(tmp_path / "scripts" / "helper.py", "VALUE = 41\n")
    script = _write(tmp_path / "scripts" / "main.py", """
        import sys
        import mori.shmem
        from mori.ops import EpDispatchCombineConfig
        from mori.io import IOEngine
        import helper  # a sibling module: the script's directory is first on sys.path, as `python SCRIPT` puts it
        import mori_compiler.compat as c
        assert c.is_ours(sys.modules["mori"])
        print(__name__, sys.argv[1:], helper.VALUE + 1, mori.shmem.shmem_npes.__module__)
        """)
    proc = _run(str(script), "--flag", "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "__main__ ['--flag', 'x'] 42 mori_compiler.runtime.shmem"


def test_run_leaves_no_pth_and_removes_its_boot_directory(tmp_path):
    script = _write(tmp_path / "s.py", """
        import os
        boot = os.environ["PYTHONPATH"].split(os.pathsep)[0]
        print(boot)
        print(sorted(os.listdir(boot)))
        """)
    proc = _run(str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    boot, listing = proc.stdout.splitlines()
    assert listing == "['sitecustomize.py']" and Path(boot).name.startswith("mori_compiler_compat_run_")
    assert not Path(boot).exists(), "the boot directory outlives the program"
    site_dirs = {p for p in sys.path if p.endswith("site-packages")}
    assert not any((Path(d) / "mori_compiler_compat.pth").exists() for d in site_dirs)


def test_run_module_and_pytest_from_the_repository_root(tmp_path):
    """MORI's tests run as ``python -m pytest tests/python/...`` from its root and import
    ``tests.python.utils`` (the current directory on sys.path, as ``python -m`` puts it)."""
    _write(tmp_path / "tests" / "python" / "utils.py", "def port():\n    return 0\n")
    _write(tmp_path / "tests" / "python" / "io" / "test_names.py", """
        from tests.python.utils import port
        from mori.io import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig, MemoryDesc

        def test_tcp_engine_has_a_port():
            engine = IOEngine(key="e", config=IOEngineConfig(host="127.0.0.1", port=port()))
            engine.create_backend(BackendType.TCP, TcpBackendConfig())
            assert engine.get_engine_desc().port > 0
        """)
    proc = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python/io/test_names.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    _write(tmp_path / "tool.py", "import sys, mori.ir\nprint(sys.argv[1:], len(mori.ir.MORI_DEVICE_FUNCTIONS) > 0)\n")
    proc = _run("-m", "tool", "a", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "['a'] True", proc.stderr


def test_processes_the_program_starts_get_the_names_too(tmp_path):
    """torch.multiprocessing.spawn / multiprocessing's spawn method and subprocess start fresh interpreters:
    the boot sitecustomize installs the finder in each; an environment's own sitecustomize still runs."""
    own = _write(tmp_path / "own_site" / "sitecustomize.py", "import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    script = _write(tmp_path / "spawner.py", """
        import multiprocessing as mp
        import os
        import subprocess
        import sys

        def child(queue):
            import mori.shmem
            queue.put((mori.shmem.shmem_mype.__module__, os.environ.get("OWN_SITECUSTOMIZE")))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            print(queue.get(timeout=60))
            proc.join()
            out = subprocess.run([sys.executable, "-c", "import mori.ops; print(mori.ops.EpDispatchCombineOp.__module__)"],
                                 capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr)
        """)
    proc = _run(str(script), cwd=tmp_path, env_extra={"PYTHONPATH": str(own.parent)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["('mori_compiler.runtime.shmem', 'ran')", "mori_compiler.compat.mori_ops"]


def test_run_passes_the_program_exit_status(tmp_path):
    script = _write(tmp_path / "exit3.py", "import sys, mori\nsys.exit(3)\n")
    assert _run(str(script), cwd=tmp_path).returncode == 3


@pytest.mark.parametrize("args, expected", [
    ((), "run needs a script or -m MODULE"),
    (("-m",), "-m needs a module name"),
    (("-m", "-x"), "-m needs a module name"),
    (("--bogus", "s.py"), "unknown option '--bogus' before the script"),
    (("missing.py",), "missing.py: no such file"),
    ((".",), ".: not a file"),
    (("-m", "no_such_module_here"), "no module named 'no_such_module_here'"),
    (("-m", "no_such_package.sub"), "no module named 'no_such_package.sub'"),
])  # fmt: skip
def test_run_argument_errors_are_one_line_exit_1(tmp_path, args, expected):
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {expected}") and "usage: python -m mori_compiler.compat run" in line


def test_run_refuses_where_a_real_mori_would_be_imported(tmp_path):
    _write(tmp_path / "real" / "mori" / "__init__.py", "REAL = True\n")
    script = _write(tmp_path / "s.py", "print('ran')\n")
    proc = _run(str(script), cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path / "real")})
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert proc.stderr.startswith("error: a real MORI is importable here") and str(tmp_path / "real") in proc.stderr


def test_boot_sitecustomize_is_harmless_without_mori_compiler(tmp_path):
    """A process that inherits the boot directory but cannot import mori_compiler (another interpreter,
    isolated paths) starts normally."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    proc = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                           "import sitecustomize; print('ok')", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    # -S: no site-packages, so mori_compiler is not importable (unless installed on the base path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_boot_sitecustomize_chains_to_the_environments_own_without_mori_compiler(tmp_path):
    """The same without mori_compiler: the environment's own sitecustomize (shadowed by ours) still runs."""
    boot, own = tmp_path / "boot", tmp_path / "own"
    _write(boot / "sitecustomize.py", SITECUSTOMIZE)
    _write(own / "sitecustomize.py", "import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    env = {"PYTHONPATH": os.pathsep.join([str(boot), str(own)]), "PATH": os.environ.get("PATH", "")}
    code = ("import importlib.util, os, sys\n"
            "assert importlib.util.find_spec('mori_compiler') is None, 'mori_compiler is importable here'\n"
            "print(os.environ.get('OWN_SITECUSTOMIZE'))\n")  # fmt: skip
    proc = subprocess.run([sys._base_executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)  # fmt: skip
    if "mori_compiler is importable here" in proc.stderr:
        pytest.skip(f"the base interpreter {sys._base_executable} has mori_compiler installed")
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr


def test_child_environment_puts_the_boot_directory_first():
    env = compat_run.child_environment({"PYTHONPATH": os.pathsep.join(["a", "", "b"])}, "BOOT")
    assert env["PYTHONPATH"] == os.pathsep.join(["BOOT", "a", "b"])
    assert compat_run.child_environment({}, "BOOT")["PYTHONPATH"] == "BOOT"


# ---- the standalone local expert count ------------------------------------------------------------------


def test_local_expert_count_counts_the_first_total_rows():
    torch = pytest.importorskip("torch", reason="the count runs as torch ops (pip install -e '.[cuda]')")
    from mori_compiler.compat.local_expert_count import count_local_experts

    indices = torch.tensor([[3, 0], [5, 4], [3, 5], [1, 5]], dtype=torch.int32)  # rank 1, 3 experts: ids 3..5
    count = torch.full((3,), -1, dtype=torch.int32)
    flat = lambda n: indices.flatten()[:n]  # noqa: E731
    count_local_experts(flat, torch.tensor([4], dtype=torch.int32), count, rank=1, k=2)
    assert count.tolist() == [2, 1, 3]
    count_local_experts(flat, torch.tensor([2], dtype=torch.int32), count, rank=1, k=2)
    assert count.tolist() == [1, 1, 1]  # rows 0..1 only: experts 3, 0 (not local), 5, 4
    count.fill_(9)
    count_local_experts(flat, torch.tensor([0], dtype=torch.int32), count, rank=1, k=2)
    assert count.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="token count at total_recv_token_num_ptr is -1"):
        count_local_experts(flat, torch.tensor([-1], dtype=torch.int32), count, rank=1, k=2)


@pytest.mark.parametrize("config, kwargs, expected", [
    (dict(rank=-1, num_experts_per_rank=3, num_experts_per_token=2, block_num=4, warp_num_per_block=2), {},
     r"config.rank must be an integer >= 0, got -1"),
    (dict(rank=0, num_experts_per_rank=0, num_experts_per_token=2, block_num=4, warp_num_per_block=2), {},
     r"config.num_experts_per_rank must be an integer >= 1, got 0"),
    (dict(rank=0, num_experts_per_rank=3, num_experts_per_token=2), {},
     r"needs a positive block_num \(or config.block_num\)"),
    (dict(rank=0, num_experts_per_rank=3, num_experts_per_token=2, block_num=4), {},
     r"needs a positive warp_per_block \(or config.warp_num_per_block\)"),
    (dict(rank=0, num_experts_per_rank=3, num_experts_per_token=2, block_num=4, warp_num_per_block=2),
     {"indices_ptr": 0}, r"indices_ptr must be an integer >= 1, got 0"),
    (dict(rank=0, num_experts_per_rank=3, num_experts_per_token=2, block_num=4, warp_num_per_block=2),
     {"stream": -5}, r"stream must be an integer >= 0, got -5"),
    (dict(rank=0, num_experts_per_rank=3, num_experts_per_token=2, block_num=4, warp_num_per_block=2),
     {"block_num": True}, r"block_num must be an integer >= -1, got True"),
])  # fmt: skip
def test_launch_local_expert_count_checks_its_arguments_first(config, kwargs, expected):
    pytest.importorskip("torch", reason="launch_local_expert_count needs torch (pip install -e '.[cuda]')")
    from mori_compiler.compat.local_expert_count import CppEpDispatchCombineConfig, launch_local_expert_count

    args = {"indices_ptr": 1 << 20, "total_recv_token_num_ptr": 2 << 20, "local_expert_count_ptr": 3 << 20} | kwargs
    with pytest.raises(ValueError, match=expected):
        launch_local_expert_count(CppEpDispatchCombineConfig(**config), **args)


def test_mori_cpp_and_mori_ops_offer_the_standalone_count(tmp_path):
    code = ("import mori_compiler.compat as c; c.install()\n"
            "import inspect, mori.cpp, mori.ops, mori.ops.local_expert_count as lec\n"
            "assert mori.cpp.launch_local_expert_count is mori.ops.launch_local_expert_count is lec.launch_local_expert_count\n"
            "cfg = mori.cpp.EpDispatchCombineConfig(rank=1, world_size=4, num_experts_per_rank=3, num_experts_per_token=2,"
            " warp_num_per_block=2, block_num=4)\n"
            "print(cfg.rank, cfg.hidden_dim, list(inspect.signature(mori.cpp.launch_local_expert_count).parameters))\n"
            "try:\n    mori.cpp.EpDispatchCombineConfig(bogus=1)\nexcept TypeError as e:\n    print('TypeError', 'bogus' in str(e))\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "1 0 ['config', 'indices_ptr', 'total_recv_token_num_ptr', 'local_expert_count_ptr', 'block_num', "
        "'warp_per_block', 'stream']", "TypeError True"]


# ---- the upstream driver ----------------------------------------------------------------------------------


def test_driver_reads_the_mori_names_a_file_uses():
    source = textwrap.dedent("""
        import mori
        import mori.shmem as ms
        from mori.io import IOEngine, BackendType as BT
        from mori.ir import triton as dev
        import os
        def f():
            mori.ops.EpDispatchCombineOp(None)
            ms.shmem_mype()
            BT.TCP
            dev.my_pe()
            os.path.join("a")
        """)
    names = driver.mori_names(source)
    assert {"mori", "mori.shmem", "mori.io", "mori.io.IOEngine", "mori.io.BackendType", "mori.io.BackendType.TCP",
            "mori.ir", "mori.ir.triton", "mori.ir.triton.my_pe", "mori.ops", "mori.ops.EpDispatchCombineOp",
            "mori.shmem.shmem_mype"} <= names  # fmt: skip
    assert not any(n.startswith("os") for n in names)
    calls = driver.mori_calls(source)
    assert calls == {("mori.ops.EpDispatchCombineOp", 1, ()), ("mori.shmem.shmem_mype", 0, ()),
                     ("mori.ir.triton.my_pe", 0, ())}  # fmt: skip
    assert driver.mori_calls("import mori.io as io\nio.IOEngine(*a)\nio.IOEngine('k', config=c)\n") == {
        ("mori.io.IOEngine", 1, ("config",))}  # a *args call has no known arity


def test_driver_runs_what_this_machine_can_and_says_why_not_the_rest(tmp_path):
    """Over a tree of our own files at the driver's upstream paths: a passing CPU pytest file, a name that
    does not resolve, entries that need a GPU or several, and files that are absent."""
    src = tmp_path / "src"
    _write(src / "tests" / "python" / "utils.py", "def get_free_port():\n    return 0\n")
    _write(src / "tests" / "python" / "io" / "test_engine_tcp.py", """
        from tests.python.utils import get_free_port
        from mori.io import BackendType, IOEngine, IOEngineConfig, TcpBackendConfig

        def test_port_zero_binds():
            e = IOEngine(key="k", config=IOEngineConfig(host="127.0.0.1", port=get_free_port()))
            e.create_backend(BackendType.TCP, TcpBackendConfig())
            assert e.get_engine_desc().port > 0
        """)
    _write(src / "tests" / "python" / "shmem" / "test_api.py", "import mori\nmori.shmem.shmem_no_such_function()\n")
    _write(src / "tests" / "python" / "ops" / "test_local_expert_count.py",  # a call our signature cannot take
           "import mori.cpp\ndef test_x():\n    mori.cpp.launch_local_expert_count(1, indices=2)\n")
    log = tmp_path / "log.txt"
    proc = subprocess.run([sys.executable, str(REPO / "test" / "mori_upstream" / "run.py"), "--mori-src", str(src),
                           "--out", str(log), "--timeout", "100"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the unresolvable name is a failure
    rows = {line[6:].split("  ")[0].strip(): line[:4].strip() for line in proc.stdout.splitlines()
            if line[:4] in ("pass", "fail", "skip")}  # fmt: skip
    assert rows["names tests/python/io/test_engine_tcp.py"] == "pass"
    assert rows["names tests/python/shmem/test_api.py"] == "fail"
    assert "shmem_no_such_function" in proc.stdout
    assert rows["names tests/python/ops/test_local_expert_count.py"] == "fail"
    assert "mori.cpp.launch_local_expert_count(1 positional, indices=) (TypeError: " in proc.stdout
    assert rows["io/test_engine_tcp"] == "pass"
    assert rows["ops/test_local_expert_count"] == "skip" and "needs a GPU" in proc.stdout
    assert rows["shmem/test_api"] == "skip" and "needs 8 GPUs" in proc.stdout
    assert rows["examples/io/example"] == "skip" and f"not in {src}" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("summary: ")
    assert "===== io/test_engine_tcp: exit 0" in log.read_text()


def test_driver_fails_when_nothing_ran_and_names_a_bad_out_path(tmp_path):
    """A source tree holding none of the files the driver knows is a failure (exit 1), not a silent pass; so
    is an --out it cannot write."""
    run = [sys.executable, str(REPO / "test" / "mori_upstream" / "run.py"), "--mori-src", str(tmp_path)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "error: nothing ran" in proc.stderr, proc.stdout + proc.stderr
    proc = subprocess.run(run + ["--out", str(tmp_path / "no" / "such" / "log")], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("error: --out "), proc.stderr
    assert "Traceback" not in proc.stderr


def test_driver_refuses_a_missing_source_directory(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "test" / "mori_upstream" / "run.py"), "--mori-src",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.strip() == f"error: --mori-src {tmp_path / 'nope'}: not a directory"


# ---- examples/mori_script --------------------------------------------------------------------------------


def test_example_uses_only_names_we_offer():
    outcome, detail = driver.check_names(sys.executable, EXAMPLE)
    assert outcome == "pass", detail
    names = driver.mori_names(EXAMPLE.read_text())
    assert {"mori.shmem.shmem_init_attr", "mori.ops.EpDispatchCombineOp", "mori.ops.EpDispatchCombineConfig"} <= names


def test_example_precompile_entry_is_the_example_config():
    """precompile.json builds the bundle the example's op loads: its "ep" entry is the script's CONFIG."""
    entry = json.loads((EXAMPLE.parent / "precompile.json").read_text())
    (ep,) = entry
    import ast

    tree = ast.parse(EXAMPLE.read_text())
    (config_call,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CONFIG"]
    script_fields = {k.arg: (ast.literal_eval(k.value) if k.arg != "data_type" else "bf16") for k in config_call.keywords}
    assert ep["ep"] == script_fields and ep["target"] == "sm_90" and ep["virtual_pes"] is False


def test_example_shows_its_config_without_a_gpu(tmp_path):
    pytest.importorskip("torch", reason="the example is a MORI script: it imports torch (pip install -e '.[cuda]')")
    proc = _run(str(EXAMPLE), "--show-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "world_size=1, hidden_dim=2048" in proc.stdout and "shmem: mori_compiler.compat.mori_shmem" in proc.stdout
    proc = _run(str(EXAMPLE), "--tokens", "0", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: --tokens must be in [1, 32], got 0"


@pytest.mark.gpu
def test_example_runs_on_the_gpu(tmp_path):
    """Its kernels come from the precompiled bundles (test/python/gpu/conftest.py's MORI_TEST_BUNDLES, built
    by ``mori-compile --precompile examples/mori_script/precompile.json``) where the compiler is absent."""
    bundles = os.environ.get("MORI_TEST_BUNDLES", str(REPO / ".bundles"))
    proc = _run(str(EXAMPLE), "--rounds", "2", cwd=tmp_path, timeout=300,
                env_extra={"MORI_COMPILER_CACHE_DIR": bundles})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 2 and "PE 0 of 1" in proc.stdout
