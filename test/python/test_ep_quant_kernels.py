"""The quantizing combines' bundles compiled for every target (CPU only, issue 15): on AMDGPU no scratch and
no VGPR spills in the quantizing kernels (the fp4 decode on gfx950 is the conversion instruction: in
integer arithmetic it needed 248 VGPRs and scratch); sm_90's PTX has the kernels of every kind, the wire
helpers inlined (passes/comm_quant.py marks them alwaysinline: at LLVM's threshold, with two kernels calling
them, they stayed functions, and on AMDGPU a call took 248 VGPRs and scratch). The
instructions themselves are pinned by test/lit/Target/wire-quant-*.mlir and
test/lit/Conversion/mori-ep-to-kernels-quant.mlir."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

pytest.importorskip("llvmlite.binding")

from mori_compiler.codeobject import format_resource_report, read_amdgpu_code_object  # noqa: E402
from mori_compiler.ops.bundle import kernel_module_source  # noqa: E402
from mori_compiler.ops.config import EpDispatchCombineConfig, EpDispatchCombineKernelType, validate_config  # noqa: E402
from mori_compiler.options import CompileOptions  # noqa: E402
from mori_compiler.pipeline import compile_source  # noqa: E402
from mori_compiler.targets import get_target  # noqa: E402


def _config(kind: str, quant: str) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0,
                                   scale_type_size=1, max_token_type_size=2, max_num_inp_token_per_rank=128,
                                   num_experts_per_rank=32, num_experts_per_token=8, quant_type=quant,
                                   kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip


def _compile(kind: str, quant: str, target: str):
    cfg = _config(kind, quant)
    wave = get_target(target).wave_size
    validate_config(cfg, wave, target)
    source = kernel_module_source(cfg, wave, scale_blocks=56)
    stop = "object" if get_target(target).is_amdgpu else None  # the AMDHSA metadata is in the object already
    return compile_source(source, CompileOptions(target=target, virtual_pes=True), filename=f"<{kind} {quant}>",
                          stop_after=stop)  # fmt: skip


QUANTIZING = {"IntraNode": ("ep_combine_push_bf16",),
              "AsyncLL": ("ep_async_combine_send_bf16", "ep_async_combine_recv_bf16")}


@pytest.mark.parametrize(("kind", "quant", "target"), [
    ("IntraNode", "fp8_blockwise", "gfx942"), ("IntraNode", "fp4_blockwise", "gfx950"),
    ("IntraNode", "fp8_direct_cast", "gfx1250"), ("AsyncLL", "fp8_blockwise", "gfx942"),
])  # fmt: skip
def test_amdgpu_quantizing_kernels_have_no_scratch_and_no_vgpr_spills(kind, quant, target):
    info = read_amdgpu_code_object(_compile(kind, quant, target).binary)
    report = format_resource_report(info)
    names = {k.name: k for k in info.kernels}
    for base in QUANTIZING[kind]:
        for name in (base, base + "_anyhidden"):
            k = names[name]
            assert k.scratch_bytes == 0, f"{name} uses {k.scratch_bytes} bytes of scratch\n{report}"
            assert k.vgpr_spill_count == 0, f"{name} spills {k.vgpr_spill_count} VGPRs\n{report}"


@pytest.mark.parametrize(("kind", "quant"), [("IntraNodeLL", "fp4_blockwise"), ("AsyncLL", "fp8_direct_cast")])
def test_sm90_bundles_of_the_quantizing_kinds(kind, quant):
    result = _compile(kind, quant, "sm_90")
    combines = [n for n in result.kernels if "combine" in n and "pull" not in n]
    ptx = result.binary.decode()
    assert combines and all(f".entry {n}(" in ptx for n in combines)
    # The wire helpers are alwaysinline: a call would cost the kernel its registers (AMDGPU: scratch).
    assert "__mori_comm_" not in ptx, "a mori_comm helper was left as a function"


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("quant", ["fp8_blockwise", "fp4_blockwise"])
def test_sm90_quantizing_push_combines_fit_two_blocks_per_sm(quant, tmp_path):
    """ptxas gives the push combine (both row variants) at most 128 registers: two blocks of 256 threads per
    SM, which the virtual-PE benchmark's cooperative grid (8 PEs x 32 blocks on an H200's 132 SMs) needs."""
    ptx = tmp_path / "k.ptx"
    ptx.write_bytes(_compile("IntraNode", quant, "sm_90").binary)
    done = subprocess.run(["ptxas", "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", done.stderr, re.S))
    for name in ("ep_combine_push_bf16", "ep_combine_push_bf16_anyhidden"):
        assert int(used[name]) <= 128, f"{name} uses {used[name]} registers\n{done.stderr}"
