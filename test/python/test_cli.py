"""The command-line tools ``mori-compile`` and ``mori-opt``, in subprocesses and in-process.

In a subprocess we see what a user sees (exit code, stdout, stderr, files in the working directory).
In-process, ``main(argv)`` raises ``MoriCompilerError`` for user errors and ``entry(argv)`` turns every
error into an exit code and one ``error:`` line; the in-process variants keep the error matrix fast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mori_compiler import pipeline
from mori_compiler.errors import MoriCompilerError
from mori_compiler.targets import TARGETS, get_target
from mori_compiler.tools import compile as mori_compile
from mori_compiler.tools import opt as mori_opt

ELF_MAGIC = b"\x7fELF"

# A kernel module with one project op whose operand has the wrong type (line 5: `bytes` is i32).
WRONG_OPERAND_TYPE = """\
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%d: !llvm.ptr, %n: i32) kernel {
      %qp = arith.constant 0 : i32
      "mori_shmem.putmem_nbi"(%d, %d, %n, %qp, %qp) {scope = "block"} : (!llvm.ptr, !llvm.ptr, i32, i32, i32) -> ()
      gpu.return
    }
  }
}
"""

WRONG_ATTRIBUTE = WRONG_OPERAND_TYPE.replace("%n: i32", "%n: i64").replace(
    "i32, i32, i32) -> ()", "i64, i32, i32) -> ()").replace('"block"', '"grid"')  # fmt: skip

UNKNOWN_OP = """\
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k() kernel {
      "mori_shmem.bogus"() : () -> ()
      gpu.return
    }
  }
}
"""

MALFORMED = """\
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k() kernel {
      %0 = arith.constant : i32
      gpu.return
    }
  }
}
"""

SPLIT_INPUT = """\
func.func @a() -> i32 {
  %0 = "mori_shmem.my_pe"() : () -> i32
  return %0 : i32
}
// -----
func.func @b(%x: i64) -> i32 {
  %0 = "mori_shmem.my_pe"(%x) : (i64) -> i32
  return %0 : i32
}
// -----
func.func @c() -> i32 {
  %0 = "mori_shmem.n_pes"() : () -> i32
  return %0 : i32
}
"""


def _env() -> dict:
    env = dict(os.environ)
    env.pop("MORI_COMPILER_TRACEBACK", None)
    return env


def run_tool(tool: str, *args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m mori_compiler.tools.<tool> args`` (stdout as bytes, stderr as text)."""
    proc = subprocess.run(
        [sys.executable, "-m", f"mori_compiler.tools.{tool}", *args],
        cwd=cwd, input=stdin, capture_output=True, env=_env(), timeout=300,
    )  # fmt: skip
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def assert_one_error_line(stderr: str, *needles: str) -> str:
    """stderr holds exactly one ``error:`` line (the first line), no traceback, and every needle."""
    lines = stderr.strip().splitlines()
    assert lines, "expected an error message on stderr"
    assert lines[0].startswith("error: "), stderr
    assert sum(line.startswith("error:") for line in lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    for needle in needles:
        assert needle in stderr, f"{needle!r} not in {stderr!r}"
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MORI_COMPILER_TRACEBACK", raising=False)
    return tmp_path


# ----------------------------------------------------------------------------------------------------
# mori-compile in a subprocess
# ----------------------------------------------------------------------------------------------------


def test_default_run_writes_hsaco_and_prints_report(tmp_path):
    proc = run_tool("compile", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "ring_put_signal.gfx942.hsaco"
    assert out.is_file()
    assert out.read_bytes().startswith(ELF_MAGIC)
    stdout = proc.stdout.decode()
    assert "wrote ring_put_signal.gfx942.hsaco" in stdout
    assert "amdgcn-amd-amdhsa--gfx942" in stdout  # the resource report's header
    assert re.search(r"^\s+ring_put_signal\s+\d+", stdout, re.MULTILINE), stdout  # the kernel's report row
    assert proc.stderr == ""


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target(tmp_path, target):
    proc = run_tool("compile", "--target", target, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    t = get_target(target)
    out = tmp_path / f"ring_put_signal.{target}.{'hsaco' if t.is_amdgpu else 'ptx'}"
    assert out.is_file(), os.listdir(tmp_path)
    data = out.read_bytes()
    if t.is_amdgpu:
        assert data.startswith(ELF_MAGIC)
        assert f"amdgcn-amd-amdhsa--{target}" in proc.stdout.decode()
    else:
        text = data.decode()
        assert text.startswith("//")
        assert ".target sm_90" in text
        assert ".visible .entry ring_put_signal" in text


def test_output_dash_writes_binary_to_stdout(tmp_path):
    proc = run_tool("compile", "-o", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(ELF_MAGIC)
    assert os.listdir(tmp_path) == []  # nothing written to the working directory
    assert "wrote" not in proc.stderr
    assert "ring_put_signal" in proc.stderr  # the report goes to stderr when stdout carries the binary


def test_precompile_two_configs(tmp_path, session_cache_dir):
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([
        {"kernel": "ring_put_signal", "target": "gfx942"},
        {"kernel": "ring_put_signal", "target": "sm_90", "opt_level": 2},
    ]))  # fmt: skip
    proc = run_tool("compile", "--precompile", str(configs), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.decode().split()
    assert len(paths) == 2 and paths[0] != paths[1]
    for p in paths:
        assert Path(p).parent.parent == session_cache_dir
        assert (Path(p) / "bundle.json").is_file()
    assert "[" in proc.stderr and "#" in proc.stderr  # the progress bar
    assert "1/2" in proc.stderr and "2/2" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--target", "gfx000"], ["unknown target 'gfx000'", "gfx942", "sm_90"]),
        (["missing.mlir"], ["no such file: missing.mlir"]),
        (["bad.mlir"], ["bad.mlir:1:1: byte 0xff is not valid UTF-8"]),
        (["wrong.mlir"], ["wrong.mlir:5:", "'mori_shmem.putmem_nbi'", "operand 'bytes'", "must be i64", "got i32"]),
        (["--frob"], ["unrecognized arguments: --frob"]),
    ],
)
def test_user_errors_in_subprocess(tmp_path, args, needles):
    (tmp_path / "bad.mlir").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "wrong.mlir").write_text(WRONG_OPERAND_TYPE)
    proc = run_tool("compile", *args, cwd=tmp_path)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, *needles)
    assert proc.stdout == b""


# ----------------------------------------------------------------------------------------------------
# mori-compile in-process
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx942", "sm_90"])
def test_emit_isa(in_tmp, capsys, target):
    assert mori_compile.entry(["--target", target, "--emit=isa"]) == 0
    out = capsys.readouterr().out
    if get_target(target).is_amdgpu:
        assert ".amdhsa_kernel ring_put_signal" in out
        assert "s_endpgm" in out
    else:
        assert ".target sm_90" in out and ".visible .entry ring_put_signal" in out
    assert os.listdir(in_tmp) == []


def test_emit_llvm(in_tmp, capsys):
    assert mori_compile.entry(["--emit=llvm"]) == 0
    out = capsys.readouterr().out
    assert "define amdgpu_kernel void @ring_put_signal" in out
    assert 'target triple = "amdgcn-amd-amdhsa"' in out
    assert not re.search(r"^declare .*@mori_shmem_", out, re.MULTILINE)  # the device library is linked in


def test_emit_mlir(in_tmp, capsys):
    assert mori_compile.entry(["--emit=mlir"]) == 0
    out = capsys.readouterr().out
    assert "llvm.call @mori_shmem_putmem_nbi_signal_block" in out
    assert '"mori_shmem.' not in out


def test_emit_bundle(in_tmp, capsys, session_cache_dir):
    assert mori_compile.entry(["--emit=bundle", "--target", "sm_90"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent.parent == session_cache_dir
    assert json.loads((path / "bundle.json").read_text())["target"] == "sm_90"


def _stage_cases():
    for target in sorted(TARGETS):
        for stage in pipeline.stage_names(get_target(target)):
            yield target, stage


# What the IR printed after a stage starts with (for object/hsaco only non-empty output is checked).
_STAGE_OUTPUT = {
    "mori": "module", "ep": "module", "abi": "module", "rocdl": "module", "nvvm": "module",
    "llvm-ir": "; ModuleID", "link": "; ModuleID", "opt": "; ModuleID",
}  # fmt: skip



@pytest.mark.parametrize(
    "target, stage",
    list(_stage_cases()),
)
def test_stop_after_each_stage(in_tmp, capsys, target, stage):
    assert mori_compile.entry(["--target", target, f"--stop-after={stage}"]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    if stage in ("object", "hsaco"):  # binary stages go to a file, never to the terminal
        ext = "o" if stage == "object" else "hsaco"
        written = in_tmp / f"ring_put_signal.{target}.{ext}"
        assert written.read_bytes().startswith(b"\x7fELF") and f"stopped after {stage}" in out
        return
    assert os.listdir(in_tmp) == []
    if stage == "mori":
        assert '"mori_shmem.putmem_nbi_signal"' in out
    elif stage == "abi":
        assert '"mori_shmem.' not in out and "llvm.call @mori_shmem_" in out
    elif stage in ("rocdl", "nvvm"):
        assert ("rocdl.kernel" if stage == "rocdl" else "nvvm.kernel") in out
    elif stage == "isa":
        assert ".amdhsa_kernel ring_put_signal" in out
    elif stage == "ptx":
        assert out.startswith("//") and ".target sm_90" in out
    if stage in _STAGE_OUTPUT:
        assert out.lstrip().startswith(_STAGE_OUTPUT[stage]), out[:200]


def test_stop_after_unknown_stage(in_tmp, capsys):
    assert mori_compile.entry(["--target", "sm_90", "--stop-after=hsaco"]) == 1
    assert_one_error_line(capsys.readouterr().err, "unknown stage 'hsaco' for target sm_90", "ptx")


@pytest.mark.parametrize("target", ["gfx942", "sm_90"])
def test_print_pipeline(in_tmp, capsys, target):
    from mori_compiler.options import CompileOptions

    assert mori_compile.entry(["--target", target, "--print-pipeline"]) == 0
    out = capsys.readouterr().out
    assert pipeline.mlir_pipeline_string(CompileOptions(target=target)) in out
    for stage in pipeline.stage_names(get_target(target)):
        assert re.search(rf"^{re.escape(stage)}: ", out, re.MULTILINE), stage
    assert "libmori_shmem_device.bc" in out


def test_list_examples(in_tmp, capsys):
    assert mori_compile.entry(["--list-examples"]) == 0
    assert "ring_put_signal" in capsys.readouterr().out.split()


def test_compile_named_example_and_file(in_tmp, capsys, example_source):
    (in_tmp / "my_kernel.mlir").write_text(example_source)
    assert mori_compile.entry(["my_kernel.mlir", "--no-report"]) == 0
    assert (in_tmp / "my_kernel.gfx942.hsaco").is_file()
    assert mori_compile.entry(["ring_put_signal", "--target", "gfx950", "--no-report"]) == 0
    assert (in_tmp / "ring_put_signal.gfx950.hsaco").is_file()


def test_main_raises_user_errors(in_tmp):
    with pytest.raises(MoriCompilerError, match="unknown target 'nope'"):
        mori_compile.main(["--target", "nope"])
    with pytest.raises(MoriCompilerError, match="unrecognized arguments"):
        mori_compile.main(["--frob"])


@pytest.fixture
def bad_inputs(in_tmp):
    """Files the error matrix refers to by name (in the working directory)."""
    from mori_compiler.lib_bitcode.stub import write_stub_bitcode

    (in_tmp / "adir.mlir").mkdir()
    (in_tmp / "latin1.mlir").write_bytes("// caf\xe9\n".encode("latin-1"))
    (in_tmp / "malformed.mlir").write_text(MALFORMED)
    (in_tmp / "empty.mlir").write_text("")
    (in_tmp / "unknown_op.mlir").write_text(UNKNOWN_OP)
    (in_tmp / "wrong_type.mlir").write_text(WRONG_OPERAND_TYPE)
    (in_tmp / "wrong_attr.mlir").write_text(WRONG_ATTRIBUTE)
    (in_tmp / "notbitcode.bc").write_text("this is not bitcode\n")
    write_stub_bitcode(in_tmp / "nvptx.bc", "nvptx64-nvidia-cuda")
    (in_tmp / "notjson.json").write_text('[{"kernel": ')
    (in_tmp / "notlist.json").write_text('{"kernel": "ring_put_signal"}')
    (in_tmp / "unknownfield.json").write_text('[{"kernel": "ring_put_signal", "colour": "red"}]')
    return in_tmp


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--target", "gfx000"], ["unknown target 'gfx000'", "allowed targets: gfx942, gfx950, gfx1250, sm_90"]),
        (["missing.mlir"], ["no such file: missing.mlir"]),
        (["adir.mlir"], ["adir.mlir is a directory"]),
        (["latin1.mlir"], ["latin1.mlir:", "is not valid UTF-8"]),
        (["malformed.mlir"], ["malformed.mlir:4:"]),
        (["unknown_op.mlir"], ["unknown_op.mlir:4:7:", "unknown op 'mori_shmem.bogus'", "putmem_nbi_signal"]),
        (["wrong_type.mlir"], ["wrong_type.mlir:5:7:", "'mori_shmem.putmem_nbi'", "operand 'bytes'", "must be i64",
                               "got i32"]),
        (["wrong_attr.mlir"], ["wrong_attr.mlir:5:7:", "'mori_shmem.putmem_nbi'", "attribute 'scope'",
                               '"thread", "warp", "block"', 'got "grid"']),
        (["empty.mlir"], ["expected exactly one gpu.module in the input, found 0"]),
        (["--stop-after=bogus"], ["unknown stage 'bogus' for target gfx942; stages: mori, ep, abi, rocdl"]),
        (["-o", "nodir/out.hsaco"], ["cannot write nodir/out.hsaco"]),
        (["no_such_example"], ["'no_such_example' is neither a file nor a built-in example", "ring_put_signal"]),
        (["--emit=elf"], ["unknown --emit 'elf'", "hsaco, ptx, isa, llvm, mlir, bundle"]),
        (["--emit=ptx"], ["--emit=ptx does not apply to target gfx942"]),
        (["--emit=hsaco", "--target", "sm_90"], ["--emit=hsaco does not apply to target sm_90"]),
        (["-O", "7"], ["optimization level 7 is not supported", "0, 1, 2, 3"]),
        (["-O", "fast"], ["argument -O", "'fast'"]),
        (["--code-object-version", "4"], ["code object version 4 is not supported", "5, 6"]),
        (["--bitcode", "missing.bc"], ["device bitcode file not found: missing.bc"]),
        (["--bitcode", "notbitcode.bc"], ["notbitcode.bc is not a valid LLVM bitcode file"]),
        (["--bitcode", "nvptx.bc"], ["nvptx.bc is for 'nvptx64-nvidia-cuda'", "gfx942", "amdgcn-amd-amdhsa"]),
        (["--no-device-library"], ["calls undefined functions", "mori_shmem_putmem_nbi_signal_block",
                                   "mori_shmem_my_pe"]),
        (["--no-device-library", "--target", "sm_90"], ["calls undefined functions", "mori_shmem_fence_thread"]),
        (["--frob"], ["unrecognized arguments: --frob", "mori-compile --help"]),
        (["--precompile", "notjson.json"], ["notjson.json:1:13: not valid JSON"]),
        (["--precompile", "notlist.json"], ["notlist.json must hold a JSON list of configs, got dict"]),
        (["--precompile", "missing.json"], ["no such file: missing.json"]),
        (["--precompile", "unknownfield.json"], ["config 1: unknown field(s) \"colour\"", "target"]),
    ],
)  # fmt: skip
def test_user_errors(bad_inputs, capsys, args, needles):
    assert mori_compile.entry(args) == 1
    captured = capsys.readouterr()
    assert_one_error_line(captured.err, *needles)
    assert captured.out == ""
    assert not any(p.suffix in (".hsaco", ".ptx") for p in bad_inputs.iterdir())


def test_precompile_bitcode_given_as_string(in_tmp, capsys):
    from mori_compiler.lib_bitcode.stub import write_stub_bitcode

    write_stub_bitcode(in_tmp / "lib.bc", "amdgcn-amd-amdhsa")
    (in_tmp / "c.json").write_text('[{"kernel": "ring_put_signal", "bitcode": "lib.bc"}]')
    rc = mori_compile.entry(["--precompile", "c.json"])
    err = capsys.readouterr().err
    # Either accepted like CompileOptions(bitcode="lib.bc") does, or rejected naming the field.
    assert rc == 0 or ("bitcode" in err and "not found: l" not in err), err


def test_precompile_opt_level_of_wrong_type(in_tmp, capsys):
    (in_tmp / "c.json").write_text('[{"kernel": "ring_put_signal", "opt_level": "3"}]')
    assert mori_compile.entry(["--precompile", "c.json"]) == 1
    err = capsys.readouterr().err
    assert_one_error_line(err)
    assert "integer" in err or "'3'" in err or '"3"' in err, err


def test_internal_error_exits_2_without_traceback(in_tmp, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated compiler bug")

    monkeypatch.setattr(pipeline, "compile_source", boom)
    assert mori_compile.entry([]) == 2
    err = capsys.readouterr().err
    assert_one_error_line(err, "internal compiler error", "RuntimeError: simulated compiler bug")
    assert "MORI_COMPILER_TRACEBACK" in err


def test_internal_error_traceback_on_request(in_tmp, monkeypatch):
    monkeypatch.setattr(pipeline, "compile_source", lambda *a, **k: 1 / 0)
    monkeypatch.setenv("MORI_COMPILER_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        mori_compile.entry([])


# ----------------------------------------------------------------------------------------------------
# mori-opt
# ----------------------------------------------------------------------------------------------------


def test_opt_split_input_file_reports_bad_chunk_and_prints_good_ones(tmp_path):
    (tmp_path / "split.mlir").write_text(SPLIT_INPUT)
    proc = run_tool("opt", "split.mlir", "--split-input-file", "-p", "mori-shmem-to-abi", cwd=tmp_path)
    assert proc.returncode == 1
    # Line numbers are those of the whole file (the bad op is on line 7).
    assert_one_error_line(proc.stderr, "split.mlir:7:", "'mori_shmem.my_pe' expected 0 operands")
    out = proc.stdout.decode()
    assert "func.func @a()" in out and "func.func @c()" in out and "@b(" not in out
    assert "llvm.call @mori_shmem_my_pe()" in out and "llvm.call @mori_shmem_n_pes()" in out
    assert out.count("// -----") == 1


def test_opt_split_input_file_in_process(in_tmp, capsys):
    (in_tmp / "split.mlir").write_text(SPLIT_INPUT.replace("(%x) : (i64)", "() : ()"))
    assert mori_opt.entry(["split.mlir", "--split-input-file"]) == 0
    out = capsys.readouterr().out
    assert out.count("// -----") == 2 and '"mori_shmem.my_pe"()' in out


def test_opt_emit_irdl_loads_in_mlir(tmp_path):
    proc = run_tool("opt", "--emit-irdl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.decode()
    from mlir import ir
    from mlir.dialects import irdl

    with ir.Context() as ctx, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(text))
        assert ctx.is_registered_operation("mori_shmem.putmem_nbi_signal")
        module = ir.Module.parse('func.func @f() -> i32 {\n %0 = "mori_shmem.n_pes"() : () -> i32\n return %0 : i32\n}')
        assert module.operation.verify()


def test_opt_errors(in_tmp, capsys):
    (in_tmp / "ok.mlir").write_text(SPLIT_INPUT.split("// -----")[0])
    assert mori_opt.entry(["ok.mlir", "-p", "mori-shmem-to-abi{level=2}"]) == 1
    assert_one_error_line(capsys.readouterr().err, "pass 'mori-shmem-to-abi' has no option 'level'")
    assert mori_opt.entry(["missing.mlir"]) == 1
    assert_one_error_line(capsys.readouterr().err, "no such file: missing.mlir")
    assert mori_opt.entry(["--frob"]) == 1
    assert_one_error_line(capsys.readouterr().err, "unrecognized arguments: --frob", "mori-opt --help")


def test_opt_unknown_pass_is_one_error_line(in_tmp, capsys):
    (in_tmp / "ok.mlir").write_text(SPLIT_INPUT.split("// -----")[0])
    assert mori_opt.entry(["ok.mlir", "-p", "no-such-pass"]) == 1
    assert_one_error_line(capsys.readouterr().err, "no-such-pass")


def test_opt_list_passes_and_dialects(in_tmp, capsys):
    assert mori_opt.entry(["--list-passes"]) == 0
    out = capsys.readouterr().out
    assert "mori-shmem-to-abi" in out and "Input:" in out
    assert mori_opt.entry(["--show-dialects"]) == 0
    assert capsys.readouterr().out.split() == ["mori_shmem", "mori_comm", "mori_ep", "mori_coll"]


def test_precompile_ep_configs_are_found_by_the_op(tmp_path, monkeypatch):
    """An "ep" precompile entry builds exactly the bundle EpDispatchCombineOp looks up on a GPU machine."""
    from mori_compiler.cache import bundle_request
    from mori_compiler.ops import EpDispatchCombineConfig, kernel_module_source
    from mori_compiler.options import CompileOptions
    from mori_compiler.runtime.bundle import find_bundle_by_request

    fields = {"world_size": 4, "hidden_dim": 4096, "scale_dim": 0, "scale_type_size": 4, "max_token_type_size": 2,
              "max_num_inp_token_per_rank": 16, "num_experts_per_rank": 8, "num_experts_per_token": 4,
              "warp_num_per_block": 4, "use_external_inp_buf": False}  # fmt: skip
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([{"ep": fields, "target": "sm_90", "virtual_pes": True}]))
    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path / "cache"))
    assert mori_compile.entry(["--precompile", str(configs)]) == 0
    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, **fields)
    request = bundle_request(kernel_module_source(cfg, 32), CompileOptions(target="sm_90", virtual_pes=True))
    bundle = find_bundle_by_request(tmp_path / "cache", request)
    assert bundle is not None and "ep_dispatch_bf16" in bundle.kernels
    configs.write_text(json.dumps([{"ep": {"world_size": 4}, "target": "sm_90"}]))
    assert mori_compile.entry(["--precompile", str(configs)]) == 1


# ---- --precompile: every entry checked, named in the error, built through ops.ep_bundle -------------------

_EP_FIELDS = {"world_size": 2, "hidden_dim": 1024, "scale_dim": 0, "scale_type_size": 0, "max_token_type_size": 2,
              "max_num_inp_token_per_rank": 8, "num_experts_per_rank": 2, "num_experts_per_token": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("entries", "needles"),
    [
        ([{"kernel": 5}], ['config 1: "kernel" must be a string, got 5']),
        ([{"kernel": True}], ['config 1: "kernel" must be a string, got true']),
        ([{"kernel": {}}], ['config 1: "kernel" must be a string, got {}']),
        ([{"kernel": []}], ['config 1: "kernel" must be a string, got []']),
        ([{"kernel": ""}], ['config 1: "kernel" must name an example or an .mlir file, got ""']),
        ([{"kernel": "x\u0000.mlir"}], ["config 1: 'x\\x00.mlir' is not a valid file name"]),
        ([{"target": "sm_90"}], ['config 1: needs exactly one of "kernel"', '"ep"']),
        ([{"kernel": "ring_put_signal", "ep": {}}], ['config 1: needs exactly one of "kernel"']),
        ([{"kernel": "ring_put_signal"}, 7], ["config 2: must be an object"]),
        ([{"kernel": "ring_put_signal", "opt_level": 1.5}], ['config 1: "opt_level" must be an integer, got 1.5']),
        ([{"kernel": "ring_put_signal", "virtual_pes": 1}], ['config 1: "virtual_pes" must be true or false, got 1']),
        ([{"kernel": "ring_put_signal", "target": "gfx000"}], ["config 1: unknown target 'gfx000'"]),
        ([{"kernel": "ring_put_signal", "bitcode": [1]}], ['config 1: "bitcode" must be a path or a list of paths']),
        ([{"ep": _EP_FIELDS | {"hidden_dim": 1024.0}}], ["config 1: config.hidden_dim 1024.0 must be an int, not float"]),
        ([{"ep": _EP_FIELDS | {"world_size": True}}], ["config 1: config.world_size True must be an int, not bool"]),
        ([{"ep": _EP_FIELDS | {"kernel_type": "Bogus"}}], ["config 1: \"ep\".kernel_type 'Bogus' is not a kernel type"]),
        ([{"ep": _EP_FIELDS | {"colour": 1}}], ['config 1: "ep" has unknown field(s) "colour"']),
        ([{"ep": {"world_size": 2}}], ['config 1: "ep" lacks the field(s) hidden_dim']),
        ([{"ep": _EP_FIELDS, "opt_level": 2}], ['config 1: unknown field(s) "opt_level" for a "ep" entry']),
        ([{"ep": _EP_FIELDS, "bitcode": "missing.bc"}], ["config 1: device bitcode file not found: missing.bc"]),
        ([{"ep": _EP_FIELDS, "bitcode": 5}], ['config 1: "bitcode" must be a string or a list, got 5']),
        ([{"ep": _EP_FIELDS, "bitcode": []}], ['config 1: "bitcode" is an empty list']),
        ([{"ep": _EP_FIELDS, "asyncll": {"early_notify": 1}}],
         ['config 1: "asyncll" applies to kernel_type AsyncLL only, not IntraNode']),
        ([{"ep": _EP_FIELDS | {"kernel_type": "AsyncLL"}, "asyncll": {"fused_recv": 1}}],
         ["config 1: MORI_ASYNCLL_FUSED_RECV=1 needs MORI_ASYNCLL_EARLY_NOTIFY=1"]),
        ([{"ep": _EP_FIELDS, "target": "sm_90"}, {"ep": _EP_FIELDS | {"rank": 2}}],
         ["config 2: config.rank 2 is outside [0, world_size=2)"]),
    ],
)  # fmt: skip
def test_precompile_entry_errors_name_the_entry(in_tmp, capsys, entries, needles):
    (in_tmp / "configs.json").write_text(json.dumps(entries))
    assert mori_compile.entry(["--precompile", "configs.json"]) == 1
    assert_one_error_line(capsys.readouterr().err, *needles)


def test_precompile_error_after_a_built_entry_starts_its_own_line(in_tmp, capsys, session_cache_dir):
    (in_tmp / "k.mlir").write_text("gpu.module @m {\n}\n")  # parses; fails when compiled (no kernel)
    (in_tmp / "configs.json").write_text(json.dumps([{"kernel": "ring_put_signal"}, {"kernel": "k.mlir"}]))
    assert mori_compile.entry(["--precompile", "configs.json"]) == 1
    err = capsys.readouterr().err
    bar, error = err.rstrip("\n").split("\n")
    assert bar.startswith("\r[") and "1/2 <example ring_put_signal>" in bar
    assert error == "error: k.mlir:1:1: config 2: gpu.module @m has no kernel (gpu.func ... kernel)"


def test_precompile_kernel_file_errors_are_located_in_the_file(in_tmp, capsys):
    (in_tmp / "k.mlir").write_text('gpu.module @m {\n  "mori_shmem.my_pe"() : () -> i32\n}\n')
    (in_tmp / "configs.json").write_text(json.dumps([{"kernel": "k.mlir"}]))
    assert mori_compile.entry(["--precompile", "configs.json"]) == 1
    assert_one_error_line(capsys.readouterr().err, "error: k.mlir:2:3: config 1: 'mori_shmem.my_pe' must be placed")


def test_precompile_names_the_entry_on_every_error_line(in_tmp, capsys):
    (in_tmp / "k.mlir").write_text('gpu.module @m {\n  gpu.func @k() kernel {\n    %x = "mori_comm.count_signal"() : () -> i32'
                                   "\n    gpu.return\n  }\n}\n")  # fmt: skip
    (in_tmp / "configs.json").write_text(json.dumps([{"kernel": "ring_put_signal"}, {"kernel": "k.mlir"}]))
    assert mori_compile.entry(["--precompile", "configs.json"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) > 1 and all(line.startswith("error: k.mlir:3:10: config 2: 'mori_comm.count_signal' ") for line in lines)


def test_precompile_asyncll_entry_is_the_bundle_ep_bundle_builds(tmp_path, monkeypatch, capsys):
    """An AsyncLL "ep" entry (an internal error before: the CLI re-implemented ep_bundle) builds exactly the
    bundle ops.ep_bundle returns for the same config and notification mode."""
    from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType, ep_bundle
    from mori_compiler.ops.asyncll import resolve

    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path / "cache"))
    configs = tmp_path / "configs.json"
    entry = {"ep": _EP_FIELDS | {"kernel_type": "AsyncLL"}, "target": "sm_90", "asyncll": {"early_notify": True}}
    configs.write_text(json.dumps([entry]))
    assert mori_compile.entry(["--precompile", str(configs)]) == 0
    printed = capsys.readouterr().out.strip()
    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, **_EP_FIELDS,
                                  kernel_type=EpDispatchCombineKernelType.AsyncLL)  # fmt: skip
    bundle = ep_bundle(cfg, "sm_90", virtual_pes=False, asyncll=resolve({}, early_notify=True),
                       cache_root=tmp_path / "cache")  # fmt: skip
    assert printed == str(bundle.path)
    assert "ep_async_dispatch_send_bf16" in bundle.kernels
