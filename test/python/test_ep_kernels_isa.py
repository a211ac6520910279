"""The EP IntraNode kernel bundle compiled for every target (CPU only): resources and config validation.

``kernel_module_source(cfg, wave)`` (what ``EpDispatchCombineOp`` compiles) goes through
``pipeline.compile_source`` for gfx942, gfx950, gfx1250 (wave32) and sm_90, with and without virtual PEs.
For AMDGPU the code object's resource report (``codeobject.read_amdgpu_code_object``) must show, for all
five kernels, no scratch and no VGPR spill; SGPR spills are tolerated only because scratch is 0 (they
then live in VGPR lanes) and are reported as ``SgprSpillReport`` warnings. The ISA-level pins (16-byte
accesses, loads in flight, ordering instructions) are lit tests: test/lit/Target/ep-kernels-isa*.mlir.
"""

from __future__ import annotations

import re
import warnings

import pytest

pytest.importorskip("llvmlite.binding")

from mori_compiler.codeobject import format_resource_report, read_amdgpu_code_object  # noqa: E402
from mori_compiler.errors import ToolchainError  # noqa: E402
from mori_compiler.ops.dispatch_combine import (  # noqa: E402
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    kernel_module_source,
    validate_config,
)
from mori_compiler.options import CompileOptions  # noqa: E402
from mori_compiler.pipeline import compile_source  # noqa: E402
from mori_compiler.targets import get_target  # noqa: E402



def with_variants(names: tuple[str, ...]) -> tuple[str, ...]:
    """The kernels ``names`` (for the config's hidden) and their variants for any hidden."""
    return names + tuple(name + "_anyhidden" for name in names)


# The five kernels of a bf16-wide bundle (max_token_type_size 2): fp8 dispatch rides along, f32 does not;
# each for the config's hidden and for any hidden.
KERNELS = with_variants(("ep_dispatch_bf16", "ep_dispatch_fp8_e4m3fn", "ep_dispatch_fp8_e4m3fnuz",
                         "ep_combine_pull_bf16", "ep_combine_push_bf16"))  # fmt: skip
AMDGPU_TARGETS = ("gfx942", "gfx950", "gfx1250")


class SgprSpillReport(UserWarning):
    """A kernel spills SGPRs (into VGPR lanes: its scratch is 0). Allowed, but worth knowing."""


def make_config(**overrides) -> EpDispatchCombineConfig:
    """MORI's DeepSeek-like IntraNode config: 8 PEs, hidden 7168, top-8 of 32 experts per PE, bf16."""
    fields = dict(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0, scale_type_size=1,
                  max_token_type_size=2, max_num_inp_token_per_rank=128, num_experts_per_rank=32,
                  num_experts_per_token=8)  # fmt: skip
    fields.update(overrides)
    return EpDispatchCombineConfig(**fields)


def _can_link_hsaco() -> bool:
    from mori_compiler.passes.codegen import find_ld_lld

    try:
        find_ld_lld()
        return True
    except ToolchainError:
        return False


@pytest.fixture(scope="module")
def bundle():
    """bundle(target, virtual_pes) -> CompileResult, each compiled once per module (about 2 s each)."""
    cache: dict = {}
    link = _can_link_hsaco()

    def build(target: str, virtual_pes: bool):
        key = (target, virtual_pes)
        if key not in cache:
            cfg = make_config()
            wave = get_target(target).wave_size
            validate_config(cfg, wave)
            source = kernel_module_source(cfg, wave)
            # Without ld.lld the relocatable object carries the same AMDHSA metadata note.
            stop = None if link or not get_target(target).is_amdgpu else "object"
            cache[key] = compile_source(source, CompileOptions(target=target, virtual_pes=virtual_pes),
                                        filename=f"<ep bundle {target}>", stop_after=stop)  # fmt: skip
        return cache[key]

    return build


# ---- AMDGPU: resources of every kernel ------------------------------------------------------------


@pytest.mark.parametrize("virtual_pes", [False, True], ids=["real-pes", "virtual-pes"])
@pytest.mark.parametrize("target", AMDGPU_TARGETS)
def test_amdgpu_kernels_have_no_scratch_and_no_vgpr_spills(bundle, target, virtual_pes):
    result = bundle(target, virtual_pes)
    assert set(result.kernels) == set(KERNELS)
    info = read_amdgpu_code_object(result.binary)
    report = format_resource_report(info)
    assert info.gfx_name == target, report
    assert sorted(k.name for k in info.kernels) == sorted(KERNELS), report
    wave = get_target(target).wave_size
    for k in info.kernels:
        assert k.wavefront_size == wave, f"{k.name}: wave {k.wavefront_size}, expected {wave}\n{report}"
        assert k.scratch_bytes == 0, f"{k.name} uses {k.scratch_bytes} bytes of scratch\n{report}"
        assert k.vgpr_spill_count == 0, f"{k.name} spills {k.vgpr_spill_count} VGPRs\n{report}"
        assert not info_uses_dynamic_stack(info, k.name), f"{k.name} has a dynamic stack\n{report}"
        if k.sgpr_spill_count:
            # Scratch is 0, so the spilled SGPRs went to VGPR lanes (v_writelane / v_readlane).
            warnings.warn(SgprSpillReport(f"{target} (virtual_pes={virtual_pes}): {k.name} spills "
                                          f"{k.sgpr_spill_count} SGPR(s) into VGPR lanes (scratch 0)"))  # fmt: skip


def info_uses_dynamic_stack(info, name: str) -> bool:
    for entry in info.metadata.get("amdhsa.kernels", []):
        if entry.get(".name") == name:
            return bool(entry.get(".uses_dynamic_stack", False))
    raise AssertionError(f"kernel {name} not in the metadata")


@pytest.mark.parametrize(
    "target",
    [
        "gfx942",
        "gfx950",
        "gfx1250",
    ],
)
def test_amdgpu_workgroup_bound_covers_the_launch(bundle, target):
    """Every kernel must accept the block EpDispatchCombineOp launches: warp_num_per_block x wave size."""
    cfg = make_config()
    threads = cfg.warp_num_per_block * get_target(target).wave_size
    info = read_amdgpu_code_object(bundle(target, False).binary)
    small = {k.name: k.max_flat_workgroup_size for k in info.kernels if k.max_flat_workgroup_size < threads}
    assert not small, f"launch uses {threads} work-items per block; kernels limited to fewer: {small}"


# ---- NVIDIA: the same five kernels in PTX, without local memory ----------------------------------


@pytest.mark.parametrize("virtual_pes", [False, True], ids=["real-pes", "virtual-pes"])
def test_sm90_ptx_has_all_kernels_and_no_local_memory(bundle, virtual_pes):
    result = bundle("sm_90", virtual_pes)
    ptx = result.assembly
    assert set(result.kernels) == set(KERNELS)
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.MULTILINE)
    assert sorted(entries) == sorted(KERNELS)
    # No stack frame (the PTX analogue of AMDGPU scratch): no local depot, no .local space.
    assert "__local_depot" not in ptx and ".local" not in ptx
    # 16-byte vector accesses (row copies and the accumulate loop; with virtual PEs the pointers come from
    # the argument table, so they are generic rather than .global) and system-scope ordering.
    assert re.search(r"\bld(\.global)?\.v4\.b32", ptx) and re.search(r"\bst(\.global)?\.v4\.b32", ptx)
    assert not re.search(r"\b(ld|st)(\.global)?\.(u8|s8|b8)\b", ptx.split(".entry ep_combine_pull_bf16(")[1]
                         .split(".entry")[0]), "byte accesses in ep_combine_pull_bf16"
    assert "fence.sc.sys;" in ptx and "atom.relaxed.sys.add.u32" in ptx


# ---- configs the kernels cannot support -------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "wave", "message"),
    [
        ({"num_experts_per_token": 64}, 64,
         r"config\.num_experts_per_token \(top-k 64\) must be smaller than the wave size 64"),
        ({"num_experts_per_token": 32}, 32,
         r"config\.num_experts_per_token \(top-k 32\) must be smaller than the wave size 32"),
        ({"world_size": 48}, 64, r"config\.world_size 48 exceeds 32 \(one lane per peer in the count handshake\)"),
        ({"world_size": 33}, 32, r"config\.world_size 33 exceeds 32"),
        ({"hidden_dim": 7000}, 64, r"config\.hidden_dim 7000 must be a multiple of 16"),
        ({"kernel_type": EpDispatchCombineKernelType.IntraNodeLL, "warp_num_per_block": 1}, 64,
         r"IntraNodeLL needs >= 2 warps per block"),
        ({"kernel_type": EpDispatchCombineKernelType.InterNodeV1, "gpu_per_node": 3}, 64,
         r"config\.gpu_per_node 3 must be a power of two"),
        ({"quant_type": "fp8_direct_cast", "kernel_type": EpDispatchCombineKernelType.InterNodeV1}, 64,
         r"config\.quant_type 'fp8_direct_cast' is not supported by kernel type InterNodeV1"),
    ],
    ids=["top-k-64-wave64", "top-k-32-wave32", "world-48", "world-33-wave32", "hidden-7000", "ll-one-warp",
         "internode-v1", "quant-fp8"],  # fmt: skip
)  # fmt: skip
def test_validate_config_rejects(overrides, wave, message):
    with pytest.raises(ValueError, match=message):
        validate_config(make_config(**overrides), wave)


def test_validate_config_accepts_the_limits():
    """The largest supported values pass: top-k = wave - 1, 32 PEs, hidden a multiple of 16."""
    validate_config(make_config(num_experts_per_token=63, world_size=32, hidden_dim=16), 64)
    validate_config(make_config(num_experts_per_token=31, world_size=32), 32)


# ---- the low-latency kernel types: IntraNodeLL and AsyncLL in each notification mode ------------------

LL_VARIANTS = {
    # name: (kernel type, AsyncLL options or None, kernels of a bf16-wide bundle)
    "intranode-ll": (EpDispatchCombineKernelType.IntraNodeLL, None,
                     with_variants(("ep_dispatch_ll_bf16", "ep_dispatch_ll_fp8_e4m3fn", "ep_dispatch_ll_fp8_e4m3fnuz",
                                    "ep_combine_pull_bf16", "ep_combine_push_bf16"))),
    **{f"asyncll-{mode}": (EpDispatchCombineKernelType.AsyncLL, mode,
                           with_variants(tuple(f"ep_async_{half}_{dt}" for half in ("dispatch_send", "dispatch_recv")
                                               for dt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz"))
                                         + ("ep_async_combine_send_bf16", "ep_async_combine_recv_bf16")))
       for mode in ("count_after_quiet", "early_notify", "early_notify_fused_recv")},
}  # fmt: skip
_MODE_FLAGS = {"count_after_quiet": {}, "early_notify": {"early_notify": 1},
               "early_notify_fused_recv": {"early_notify": 1, "fused_recv": 1}}  # fmt: skip


@pytest.mark.parametrize("variant", list(LL_VARIANTS))
@pytest.mark.parametrize("target", AMDGPU_TARGETS + ("sm_90",))
def test_low_latency_kernels_compile_for_every_target(target, variant):
    """Every LL/AsyncLL kernel compiles for every target without scratch (AMDGPU) or local memory (PTX);
    the LL dispatch keeps its ping-pong route buffer in LDS / shared memory."""
    from mori_compiler.ops.asyncll import resolve

    kind, mode, kernels = LL_VARIANTS[variant]
    cfg = make_config(kernel_type=kind, scale_dim=56, scale_type_size=4)
    wave = get_target(target).wave_size
    validate_config(cfg, wave)
    options = resolve({}, **_MODE_FLAGS[mode]) if mode else None
    source = kernel_module_source(cfg, wave, options)
    if mode:
        assert source.count(f"early_notify = {int(options.early_notify)} : i64") == len(kernels)
    stop = None if _can_link_hsaco() or not get_target(target).is_amdgpu else "object"
    result = compile_source(source, CompileOptions(target=target), filename=f"<{variant} {target}>", stop_after=stop)
    assert sorted(result.kernels) == sorted(kernels)
    if not get_target(target).is_amdgpu:
        ptx = result.binary.decode()
        assert "__local_depot" not in ptx and ".local" not in ptx
        if kind == EpDispatchCombineKernelType.IntraNodeLL:
            assert re.search(r"\.shared \.align \d+ \.b8 ep_dispatch_ll_bf16_route\[136\]", ptx), "route buffer"
        return
    info = read_amdgpu_code_object(result.binary)
    report = format_resource_report(info)
    for k in info.kernels:
        assert k.scratch_bytes == 0, f"{k.name} uses {k.scratch_bytes} bytes of scratch\n{report}"
        assert k.vgpr_spill_count == 0, f"{k.name} spills {k.vgpr_spill_count} VGPRs\n{report}"
        want_lds = 2 * (1 + 2 * 8) * 4 if k.name.startswith("ep_dispatch_ll_") else 0  # two (count, 8 x (pe, slot))
        assert k.lds_bytes == want_lds, f"{k.name}: LDS {k.lds_bytes}, expected {want_lds}\n{report}"


# ---- the inter-node kernel types: InterNodeV1, InterNodeV1LL, InterNode (V0) ---------------------------

INTERNODE_KINDS = {"v1": EpDispatchCombineKernelType.InterNodeV1, "v1ll": EpDispatchCombineKernelType.InterNodeV1LL,
                   "v0": EpDispatchCombineKernelType.InterNode}  # fmt: skip
# A bf16-wide bundle: per dispatch dtype the stage and dispatch kernels, then the two combine kernels; all
# of them for the config's hidden, then their variants for any hidden.
INTERNODE_KERNELS = with_variants(tuple(f"ep_inter_{k}_{dt}" for dt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz")
                                        for k in ("stage", "dispatch"))
                                  + ("ep_inter_combine_bf16", "ep_inter_combine_all_bf16"))
# The any-hidden variant of the V1LL dispatch spills 36 bytes to scratch on gfx942/gfx950 (its SGPRs are at
# the limit with one more live uniform, the call's row size); the config-hidden kernels the benchmarks
# measure have none. A bound, so that a growth shows.
ANY_HIDDEN_SCRATCH_LIMIT = 64


@pytest.mark.parametrize("kind", list(INTERNODE_KINDS))
@pytest.mark.parametrize("target", AMDGPU_TARGETS + ("sm_90",))
def test_internode_kernels_compile_for_every_target(target, kind):
    """The 8 inter-node kernels of 2 nodes of 8 PEs (DeepSeek-like sizes, fp32 scales) compile for every
    target and link against the project's device library with no undefined symbol; no VGPR spill, no
    scratch (AMDGPU), no local memory (PTX)."""
    cfg = make_config(kernel_type=INTERNODE_KINDS[kind], world_size=16, gpu_per_node=8, scale_dim=56,
                      scale_type_size=4)  # fmt: skip
    wave = get_target(target).wave_size
    validate_config(cfg, wave)
    link = _can_link_hsaco()
    stop = None if link or not get_target(target).is_amdgpu else "object"
    result = compile_source(kernel_module_source(cfg, wave), CompileOptions(target=target),
                            filename=f"<internode {kind} {target}>", stop_after=stop)  # fmt: skip
    assert list(result.kernels) == list(INTERNODE_KERNELS)
    if not get_target(target).is_amdgpu:
        ptx = result.binary.decode()
        assert "__local_depot" not in ptx and ".local" not in ptx
        assert sorted(re.findall(r"\.entry (\w+)", ptx)) == sorted(INTERNODE_KERNELS)
        return
    info = read_amdgpu_code_object(result.binary)
    report = format_resource_report(info)
    assert info.gfx_name == target, report
    if link:
        assert info.undefined_symbols() == [], report
    assert sorted(k.name for k in info.kernels) == sorted(INTERNODE_KERNELS), report
    for k in info.kernels:
        assert k.wavefront_size == wave, f"{k.name}: wave {k.wavefront_size}, expected {wave}\n{report}"
        limit = ANY_HIDDEN_SCRATCH_LIMIT if k.name.endswith("_anyhidden") else 0
        assert k.scratch_bytes <= limit, f"{k.name} uses {k.scratch_bytes} bytes of scratch\n{report}"
        assert k.vgpr_spill_count == 0, f"{k.name} spills {k.vgpr_spill_count} VGPRs\n{report}"
