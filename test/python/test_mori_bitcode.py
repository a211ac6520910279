"""MORI's real device bitcode links every kernel family, through every documented switch (CPU only).

The fixtures are MORI 1.2.4's own ``libmori_shmem_device.bc`` for gfx942, code object v6 and v5 (built as
docs/device-abi.md §4.1 describes). They are looked up in ``$MORI_TEST_MORI_BC_DIR``, else in
``../shared/mori_bc`` beside the repository (where CI has them); without them the module is skipped with that
reason. Each family (the built-in shmem examples, EP IntraNode, IntraNodeLL, AsyncLL in its three notification
modes, the inter-node types InterNodeV1, InterNodeV1LL and InterNode "V0" in 2 nodes of 8 PEs) is compiled once
per code object version, v6 with the v6 bitcode and v5 with the cov5 one; between them every switch is used:
``mori-compile --bitcode``, ``MORI_SHMEM_BC`` (mori-compile and ``ep_bundle``), ``CompileOptions(bitcode=)``
(and ``ep_bundle(bitcode=)`` where it exists). Each code object is read back:
gfx942 and the requested code object version, no undefined symbol, the kernels present, MORI's state global
exported in the dynamic symbol table (``mori.shmem.shmem_module_init`` looks it up there), no VGPR spill and
bounded SGPR spills. The resource report of every kernel is printed (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llvmlite.binding")

from mori_compiler.codeobject import STB_GLOBAL, format_resource_report, read_amdgpu_code_object  # noqa: E402
from mori_compiler.errors import ToolchainError  # noqa: E402
from mori_compiler.examples import example_names, example_source  # noqa: E402
from mori_compiler.lib_bitcode.abi import MORI_STATE_SIZE, MORI_STATE_SYMBOL  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
MORI_BC_DIR = Path(os.environ.get("MORI_TEST_MORI_BC_DIR") or REPO_ROOT.parent / "shared" / "mori_bc")
BITCODE = {6: MORI_BC_DIR / "libmori_shmem_device.gfx942.bc", 5: MORI_BC_DIR / "libmori_shmem_device.gfx942.cov5.bc"}
VERSIONS = (6, 5)
# Inlined, MORI's transport-switching functions made the EP kernels spill up to 517 SGPRs; kept out of line
# (lib_bitcode/external.py) they spill at most 58 (MORI 1.2.4, gfx942).
MAX_SGPR_SPILLS = 96


def _missing_reason() -> str | None:
    missing = [str(p) for p in BITCODE.values() if not p.is_file()]
    if missing:
        return (f"MORI's device bitcode not found ({', '.join(missing)}); set MORI_TEST_MORI_BC_DIR to a folder "
                "with libmori_shmem_device.gfx942.bc and libmori_shmem_device.gfx942.cov5.bc")  # fmt: skip
    from mori_compiler.passes.codegen import find_ld_lld

    try:
        find_ld_lld()
    except ToolchainError as exc:
        return f"no ld.lld to link code objects: {exc}"
    return None


_REASON = _missing_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

EP_MODES = {"count_after_quiet": {}, "early_notify": {"early_notify": 1},
            "early_notify_fused_recv": {"early_notify": 1, "fused_recv": 1}}  # fmt: skip
INTERNODE_FAMILIES = ("InterNodeV1", "InterNodeV1LL", "InterNode")
FAMILIES = (*example_names(), "IntraNode", "IntraNodeLL", *(f"AsyncLL-{mode}" for mode in EP_MODES),
            *INTERNODE_FAMILIES)
# The inter-node bundle (bf16-wide): per dispatch dtype the stage and dispatch kernels, then the two combines.
_INTERNODE_FIXED = {f"ep_inter_{k}_{dt}" for dt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz") for k in ("stage", "dispatch")
                    } | {"ep_inter_combine_bf16", "ep_inter_combine_all_bf16"}  # fmt: skip
# Each kernel for the config's hidden and its variant for any hidden.
INTERNODE_KERNELS = _INTERNODE_FIXED | {name + "_anyhidden" for name in _INTERNODE_FIXED}


def _ep_config(kind):
    """The DeepSeek-like config: 8 PEs (intra-node types) or 2 nodes of 8 (inter-node types)."""
    from mori_compiler.ep_schema import INTERNODE
    from mori_compiler.ops.dispatch_combine import EpDispatchCombineConfig

    nodes = dict(world_size=16, gpu_per_node=8) if kind in INTERNODE else dict(world_size=8)
    return EpDispatchCombineConfig(data_type="bf16", rank=0, hidden_dim=7168, scale_dim=0, scale_type_size=1,
                                   max_token_type_size=2, max_num_inp_token_per_rank=128, num_experts_per_rank=32,
                                   num_experts_per_token=8, kernel_type=kind, **nodes)  # fmt: skip


def _ep_parts(family: str):
    """(config, AsyncLL options or None) of an EP family."""
    from mori_compiler.ops.asyncll import resolve
    from mori_compiler.ops.dispatch_combine import EpDispatchCombineKernelType as Kind

    kind, _, mode = family.partition("-")
    return _ep_config(getattr(Kind, kind)), (resolve({}, **EP_MODES[mode]) if mode else None)


@contextlib.contextmanager
def _environ(**values: str | None):
    """Set (or, for None, unset) environment variables for the block; restore them afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _mori_compile(args: list[str], env: dict) -> None:
    cli = [sys.executable, "-m", "mori_compiler.tools.compile"]
    proc = subprocess.run(cli + args, env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mori-compile {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"


def _build_example(family: str, cov: int, out: Path) -> tuple[bytes, set[str], str]:
    """The examples go through mori-compile: --bitcode for v6, MORI_SHMEM_BC for v5."""
    hsaco = out / f"{family}.v{cov}.hsaco"
    args = [family, "--target", "gfx942", "--code-object-version", str(cov), "-o", str(hsaco)]
    if cov == 6:
        _mori_compile(args + ["--bitcode", str(BITCODE[cov])], {})
        switch = "mori-compile --bitcode"
    else:
        _mori_compile(args, {"MORI_SHMEM_BC": str(BITCODE[cov])})
        switch = "mori-compile with MORI_SHMEM_BC"
    kernels = set(re.findall(r"gpu\.func @(\w+)\([^)]*\)[^{]*\bkernel\b", example_source(family)))
    return hsaco.read_bytes(), kernels, switch


def _build_ep(family: str, cov: int) -> tuple[bytes, set[str], str]:
    """IntraNode v6 through ep_bundle with MORI_SHMEM_BC; IntraNodeLL and the inter-node types v6 through
    ep_bundle(bitcode=) where it exists; everything else through CompileOptions(bitcode=) (ep_bundle compiles
    code object v6 only)."""
    from mori_compiler.cache import get_bundle
    from mori_compiler.ops.dispatch_combine import ep_bundle, kernel_module_source
    from mori_compiler.options import CompileOptions

    cfg, asyncll = _ep_parts(family)
    bitcode = str(BITCODE[cov])
    if cov == 6 and family == "IntraNode":
        with _environ(MORI_SHMEM_BC=bitcode):
            bundle = ep_bundle(cfg, "gfx942", virtual_pes=False)
        switch = "ep_bundle with MORI_SHMEM_BC"
    elif cov == 6 and family in ("IntraNodeLL", *INTERNODE_FAMILIES) and "bitcode" in inspect.signature(
            ep_bundle).parameters:
        bundle = ep_bundle(cfg, "gfx942", virtual_pes=False, bitcode=bitcode)
        switch = "ep_bundle(bitcode=)"
    else:
        options = CompileOptions(target="gfx942", code_object_version=cov, bitcode=bitcode)
        bundle = get_bundle(kernel_module_source(cfg, 64, asyncll), options, what=family)
        switch = "CompileOptions(bitcode=)"
    # The bundle records the bitcode it was linked with (the cache key covers its content).
    assert bundle.config["options"]["bitcode"] == [bitcode], bundle.config["options"]
    return bundle.binary, set(bundle.kernels), switch


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(family, cov) -> (code object bytes, kernel names from the MLIR side, switch used); each built
    once per module, in a module-scoped cache."""
    cache = tmp_path_factory.mktemp("mori_bc_cache")
    results: dict = {}

    def build(family: str, cov: int):
        if (family, cov) not in results:
            with _environ(MORI_COMPILER_CACHE_DIR=str(cache), MORI_SHMEM_BC=None):
                if family in example_names():
                    results[family, cov] = _build_example(family, cov, cache)
                else:
                    results[family, cov] = _build_ep(family, cov)
        return results[family, cov]

    return build


@pytest.fixture(scope="module")
def state_size():
    """state_size(cov): bytes of MORI's state global as the bitcode defines it."""
    import llvmlite.binding as llvm

    from mori_compiler.passes.device_link import target_machine
    from mori_compiler.targets import get_target

    data = str(target_machine(get_target("gfx942")).target_data)
    sizes = {}
    for cov, path in BITCODE.items():
        gv = llvm.parse_bitcode(path.read_bytes()).get_global_variable(MORI_STATE_SYMBOL)
        sizes[cov] = llvm.create_target_data(data).get_abi_size(gv.global_value_type)
    return sizes.__getitem__


@pytest.mark.parametrize("cov", VERSIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_links_with_mori_bitcode(compiled, state_size, family, cov):
    binary, kernels, switch = compiled(family, cov)
    info = read_amdgpu_code_object(binary)
    report = format_resource_report(info)
    print(f"\n{family}, code object v{cov}, MORI's bitcode via {switch}:\n{report}")
    assert info.gfx_name == "gfx942", report
    assert info.abi_version + 2 == cov, report
    assert info.undefined_symbols() == [], report
    assert kernels and {k.name for k in info.kernels} == kernels, report
    exported = info.exported_symbols()
    assert {f"{k}.kd" for k in kernels} <= set(exported), sorted(exported)
    state = exported.get(MORI_STATE_SYMBOL)
    assert state is not None, f"{MORI_STATE_SYMBOL} is not in the dynamic symbol table: {sorted(exported)}"
    assert state.bind == STB_GLOBAL and state.size == state_size(cov) >= MORI_STATE_SIZE, state
    for k in info.kernels:
        assert k.vgpr_spill_count == 0, f"{k.name} spills {k.vgpr_spill_count} VGPRs\n{report}"
        assert k.sgpr_spill_count <= MAX_SGPR_SPILLS, f"{k.name} spills {k.sgpr_spill_count} SGPRs\n{report}"
    # MORI's transport-switching functions are called, not inlined (lib_bitcode/external.py).
    if family.startswith("IntraNode"):
        local_functions = {s.name for s in info.symbols if s.type == 2}
        # (uint32_p: the dispatch's clear of the other round's slot counter; the dispatch's metadata stores go
        # through peer addresses translated once per token, the combines' weights through float_p.)
        assert {"mori_shmem_uint32_p", "mori_shmem_fence_thread"} <= local_functions, sorted(local_functions)


@pytest.mark.parametrize("cov", VERSIONS)
@pytest.mark.parametrize("family", INTERNODE_FAMILIES)
def test_internode_bundle_has_its_16_kernels_and_calls_mori_transport(compiled, family, cov):
    """The inter-node code object linked with MORI's bitcode holds exactly the 16 kernels of the bundle (8, and their any-hidden variants), and
    chunk_send's puts reach MORI's transport-switching functions (RDMA or P2P by the peer), called, not
    inlined."""
    binary, kernels, _ = compiled(family, cov)
    info = read_amdgpu_code_object(binary)
    report = format_resource_report(info)
    assert kernels == INTERNODE_KERNELS and {k.name for k in info.kernels} == INTERNODE_KERNELS, report
    local_functions = {s.name for s in info.symbols if s.type == 2}
    transport = {"mori_shmem_putmem_nbi_warp", "mori_shmem_putmem_nbi_signal_warp"}
    assert transport <= local_functions, sorted(local_functions)


def test_mismatched_version_and_target_are_refused():
    """The v5 bitcode with code object v6, and either bitcode for another GPU: a clear error, nothing built."""
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.options import CompileOptions, device_bitcode

    with pytest.raises(MoriCompilerError, match=r"built for code object version 5 \(module flag "
                                                r"amdhsa_code_object_version = 500\), but the compile options ask for 6"):  # fmt: skip
        device_bitcode(CompileOptions(target="gfx942", bitcode=str(BITCODE[5])))
    with pytest.raises(MoriCompilerError, match="built for code object version 6 .* ask for 5"):
        device_bitcode(CompileOptions(target="gfx942", code_object_version=5, bitcode=str(BITCODE[6])))
    with pytest.raises(MoriCompilerError, match="was built for gfx942, not gfx950"):
        device_bitcode(CompileOptions(target="gfx950", bitcode=str(BITCODE[6])))
    with pytest.raises(MoriCompilerError, match="is for 'amdgcn-amd-amdhsa', but target sm_90 needs"):
        device_bitcode(CompileOptions(target="sm_90", bitcode=str(BITCODE[6])))
