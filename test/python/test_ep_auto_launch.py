"""AUTO launch configuration (mori_compiler/ops/auto_launch.py): rule hits through MORI's passes and buckets,
the clamped fallback, the warp counts an op must build, the per-call cache, the co-residency binding, the
GPU model name, and clear errors naming the file and rule for every table the op cannot run."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType, tuning
from mori_compiler.ops.auto_launch import (AutoLaunch, LaunchGeometry, coresident_blocks, gpu_model_name,
                                           leg_kernel_names)  # fmt: skip
from mori_compiler.ops.tuning import TuningTableError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from ep_tune import make_config  # noqa: E402  (the tuner's shape: W 8, hidden 7168, top-8 of 256 experts)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(tuning.TUNING_CONFIG_VAR, raising=False)
    monkeypatch.delenv(tuning.LAUNCH_MODE_VAR, raising=False)


def _rule(tokens, dtype="bf16", blocks=32, warps=8, hidden=7168, rdma=0, **extra):
    return dict(dtype=dtype, num_tokens=tokens, hidden_dim=hidden, block_num=blocks, rdma_block_num=rdma,
                warp_per_block=warps, **extra)  # fmt: skip


def _comb(tokens, zero_copy=True, **kw):
    return _rule(tokens, zero_copy=zero_copy, quant_type="none", **kw)


def _write(directory, phase, rules, kind="IntraNode", model="h200", ep=8, arch="sm_90"):
    path = Path(directory) / tuning.file_name(arch, model, kind, ep, phase)
    path.write_text(json.dumps(dict(version="1.0", gpu_arch=arch, gpu_model=model, kernel_type=kind, ep_size=ep,
                                    phase=phase, rules=rules)))  # fmt: skip
    return path


def _config(kind="IntraNode", **changes):
    return dataclasses.replace(make_config(kind, 8, 4096, 8), **changes)


def _auto(tmp_path, config=None, model="h200"):
    return AutoLaunch(config or _config(), "sm_90", model, search_dirs=[tmp_path])


# ---- hits, passes, buckets ------------------------------------------------------------------------------------

def test_rule_hits_by_token_bucket_and_names_its_rule(tmp_path):
    path = _write(tmp_path, "dispatch", [_rule(4096, blocks=16, warps=16), _rule(128, blocks=32, warps=4),
                                         _rule(512, dtype="fp8_e4m3", blocks=64, warps=8)])  # fmt: skip
    _write(tmp_path, "combine", [_comb(128, blocks=33), _comb(128, zero_copy=False, blocks=16, warps=16)])
    auto = _auto(tmp_path)
    assert auto.geometry("dispatch", "bf16", 100) == LaunchGeometry(32, 0, 4)
    assert auto.geometry("dispatch", "bf16", 128) == (32, 0, 4)
    assert auto.geometry("dispatch", "bf16", 129) == (16, 0, 16)  # the next bucket
    assert auto.geometry("dispatch", "bf16", 60000) == (16, 0, 16)  # above every bucket: clamped to the largest
    assert auto.geometry("dispatch", "fp8_e4m3fn", 7) == (64, 0, 8)  # our dtype name, MORI's fp8_e4m3 rule
    assert auto.explain("dispatch", "bf16", 100) == f"rule 1 of {path}"  # the file's index, not the scan order
    assert auto.geometry("combine", "bf16", 4096, zero_copy=True) == (33, 0, 8)
    assert auto.geometry("combine", "bf16", 4096, zero_copy=False) == (16, 0, 16)
    assert auto.geometry("combine", "bf16", 4096) == (33, 0, 8)  # default form: zero-copy


def test_passes_prefer_the_call_hidden_then_any(tmp_path):
    _write(tmp_path, "dispatch", [_rule(128, hidden=4096, blocks=16), _rule(128, hidden=7168, blocks=32),
                                  _rule(128, hidden=2048, blocks=8, topk=4)])  # fmt: skip
    auto = _auto(tmp_path)
    assert auto.geometry("dispatch", "bf16", 64, hidden=4096).block_num == 16
    assert auto.geometry("dispatch", "bf16", 64).block_num == 32  # default hidden: the config's 7168
    # hidden 1024 has no rule: pass 3 (the top-k of the config, 8, or any) finds the first wildcard (hidden 4096)
    assert auto.geometry("dispatch", "bf16", 64, hidden=1024).block_num == 16


def test_another_model_of_the_arch_is_used(tmp_path):
    _write(tmp_path, "dispatch", [_rule(128, blocks=24)])
    assert _auto(tmp_path, model="h100").geometry("dispatch", "bf16", 1).block_num == 24
    assert _auto(tmp_path, model=None).geometry("dispatch", "bf16", 1).block_num == 24


# ---- fallback and warp counts ---------------------------------------------------------------------------------

def test_fallback_without_tables_and_its_clamp(tmp_path):
    auto = _auto(tmp_path)
    assert auto.tables == {"dispatch": None, "combine": None}
    assert auto.geometry("dispatch", "bf16", 128) == (128, 0, 16)  # MORI's hard-coded AUTO fallback
    assert auto.explain("combine", "bf16", 128) == "fallback"
    assert auto.warp_counts() == [8, 16]  # the config's and the fallback's
    auto.bind_coresidency(lambda leg, warps: {"dispatch": 20, "combine": 12}[leg])
    assert auto.geometry("dispatch", "bf16", 128) == (20, 0, 16)
    assert auto.geometry("combine", "bf16", 128) == (12, 0, 16)


def test_internode_fallback_keeps_its_roles_when_clamped(tmp_path):
    v1 = _auto(tmp_path, _config("InterNodeV1", gpu_per_node=4, use_external_inp_buf=False))
    assert v1.geometry("dispatch", "bf16", 64) == (96, 64, 8)
    v1.bind_coresidency(lambda leg, warps: 48)
    assert v1.geometry("dispatch", "bf16", 64) == (48, 32, 8)  # the RDMA share scaled with the grid
    v0 = _auto(tmp_path, _config("InterNode", gpu_per_node=4, use_external_inp_buf=False))
    v0.bind_coresidency(lambda leg, warps: 30)
    assert v0.geometry("combine", "bf16", 64) == (24, 0, 16)  # a multiple of world_size 8 (V0's partition)
    v0.bind_coresidency(lambda leg, warps: 5)
    with pytest.raises(ValueError, match="InterNode combine: no rule applies.*cannot run"):
        v0.geometry("combine", "bf16", 64)


def test_warp_counts_are_the_reachable_rules(tmp_path):
    _write(tmp_path, "dispatch", [_rule(128, warps=4), _rule(128, dtype="fp8_e4m3", warps=8),
                                  _rule(128, dtype="fp8_e4m3_fnuz", warps=8),
                                  _rule(128, dtype="fp4", hidden=3584, warps=2)])  # fmt: skip
    _write(tmp_path, "combine", [_comb(128, warps=16, blocks=16), _comb(128, zero_copy=False, warps=4)])
    # Every dtype and form has a rule (fp4 x2 rows too: they move with the 1-byte kernels): no fallback.
    assert _auto(tmp_path).warp_counts() == [2, 4, 8, 16]
    assert _auto(tmp_path).geometry("dispatch", "fp4_e2m1fn_x2", 128, hidden=3584).warp_per_block == 2
    # Built for the zero-copy combine only: the push rule cannot be reached.
    assert _auto(tmp_path, _config(use_external_inp_buf=False, warp_num_per_block=2)).warp_counts() == [2, 4, 8, 16]
    # Without an fp8 rule that dtype falls back (16 warps).
    _write(tmp_path, "dispatch", [_rule(128, warps=4)])
    _write(tmp_path, "combine", [_comb(128, warps=4), _comb(128, zero_copy=False, warps=4)])
    assert _auto(tmp_path).warp_counts() == [4, 8, 16]
    assert _auto(tmp_path).geometry("dispatch", "fp8_e4m3fn", 128) == (128, 0, 16)


def test_asyncll_combine_reads_the_caller_tensor(tmp_path):
    _write(tmp_path, "combine", [_comb(128, zero_copy=True, warps=4), _comb(128, zero_copy=False, warps=8,
                                                                            blocks=12)], kind="AsyncLL")  # fmt: skip
    auto = _auto(tmp_path, _config("AsyncLL", use_external_inp_buf=False))
    assert auto.combine_forms() == (False,)
    assert auto.geometry("combine", "bf16", 128) == (12, 0, 8)
    assert 4 not in auto.warp_counts()  # the zero-copy rule is unreachable for AsyncLL
    with pytest.raises(ValueError, match="zero_copy True is not a combine form of this op; allowed: False"):
        auto.geometry("combine", "bf16", 128, zero_copy=True)


# ---- per-call cost --------------------------------------------------------------------------------------------

def test_geometry_is_cached_per_key(tmp_path, monkeypatch):
    _write(tmp_path, "dispatch", [_rule(128)])
    auto = _auto(tmp_path)
    calls = []
    real = tuning.TuningTable.lookup
    monkeypatch.setattr(tuning.TuningTable, "lookup", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    for _ in range(5):
        auto.geometry("dispatch", "bf16", 100)
    auto.geometry("dispatch", "bf16", 101)
    assert len(calls) == 2
    monkeypatch.setattr("mori_compiler.ops.auto_launch._MAX_CACHED", 8)
    for n in range(20):
        auto.geometry("dispatch", "bf16", n)
    assert len(auto._cache) <= 8  # bounded: a full cache starts over


# ---- bad tables: clear errors naming the file, the rule, the field -------------------------------------------

def test_unparsable_file_is_named(tmp_path):
    path = tmp_path / tuning.file_name("sm_90", "h200", "IntraNode", 8, "dispatch")
    path.write_text('{"version": "1.0", rules: [}')
    with pytest.raises(TuningTableError, match=f"tuning file {path}: not JSON"):
        _auto(tmp_path)


def test_unknown_field_is_named(tmp_path):
    path = _write(tmp_path, "combine", [_comb(128), _comb(256, block_count=3)])
    with pytest.raises(TuningTableError, match=rf"tuning file {path}: rule 1 field 'block_count' is unknown"):
        _auto(tmp_path)


def test_geometry_outside_the_limits_is_named(tmp_path):
    path = _write(tmp_path, "dispatch", [_rule(128, blocks=4096)])
    with pytest.raises(TuningTableError, match=rf"{path}: rule 0 field 'block_num' 4096 is outside \[1, 1024\]"):
        _auto(tmp_path)
    path = _write(tmp_path, "dispatch", [_rule(128, warps=64)])
    with pytest.raises(TuningTableError, match=r"rule 0 field 'warp_per_block' 64 is outside \[1, 32\]"):
        _auto(tmp_path)


def test_rule_the_op_cannot_run_is_named_at_construction(tmp_path):
    # V0 partitions its grid per destination PE: 36 blocks do not split over 8 PEs.
    path = _write(tmp_path, "dispatch", [_rule(64, blocks=32, rdma=8), _rule(128, blocks=36, rdma=8)], kind="InterNode")
    cfg = _config("InterNode", gpu_per_node=4, use_external_inp_buf=False)
    with pytest.raises(TuningTableError, match=rf"tuning file {path}: rule 1 \(dtype bf16, num_tokens 128, hidden_dim "
                                               r"7168\) cannot run on this InterNode op .*multiple of world_size 8"):
        _auto(tmp_path, cfg)
    # rdma_block_num 0 means the config's: 40 RDMA blocks do not leave a same-node block in a grid of 32.
    path = _write(tmp_path, "dispatch", [_rule(64, blocks=32, rdma=0)], kind="InterNodeV1")
    cfg = _config("InterNodeV1", gpu_per_node=4, use_external_inp_buf=False, rdma_block_num=40, block_num=64)
    with pytest.raises(TuningTableError, match=rf"{path}: rule 0 .*rdma_block_num 40 must be in \[0, block_num=32\)"):
        _auto(tmp_path, cfg)


def test_unreachable_rules_are_checked_too(tmp_path):
    # An fp4 rule is never looked up by this op, but a table of rules it cannot run is a bad table.
    path = _write(tmp_path, "dispatch", [_rule(64, blocks=32, rdma=8), _rule(64, dtype="fp4", blocks=36, rdma=8)],
                  kind="InterNode")  # fmt: skip
    with pytest.raises(TuningTableError, match=rf"{path}: rule 1 \(dtype fp4, .*multiple of world_size 8"):
        _auto(tmp_path, _config("InterNode", gpu_per_node=4, use_external_inp_buf=False))


def test_rule_beyond_coresidency_is_named(tmp_path):
    _write(tmp_path, "dispatch", [_rule(128, blocks=32, warps=8)])
    path = _write(tmp_path, "combine", [_comb(128, blocks=16), _comb(4096, blocks=64, warps=4)])
    auto = _auto(tmp_path)
    with pytest.raises(TuningTableError, match=rf"{path}: rule 1 \(dtype bf16, num_tokens 4096, hidden_dim 7168, "
                                               r"zero_copy true, quant_type none\) .*only 40 blocks of 4 warps per PE "
                                               "fit co-resident"):  # fmt: skip
        auto.bind_coresidency(lambda leg, warps: {4: 40, 8: 33, 16: 16}[warps])
    auto.bind_coresidency(lambda leg, warps: 64)  # fits
    assert auto.geometry("combine", "bf16", 4096) == (64, 0, 4)


def test_table_of_another_kernel_type_or_ep_size_is_refused(tmp_path):
    path = _write(tmp_path, "dispatch", [_rule(128)], kind="IntraNodeLL")
    (tmp_path / tuning.file_name("sm_90", "h200", "IntraNode", 8, "dispatch")).write_text(path.read_text())
    with pytest.raises(TuningTableError, match="'kernel_type' is 'IntraNodeLL', but the request is for 'IntraNode'"):
        _auto(tmp_path)


@pytest.mark.parametrize("call, message", [
    (dict(leg="gather"), "leg 'gather' is not one of dispatch, combine"),
    (dict(dtype="int8"), "dispatch dtype 'int8' is not one this op's kernels take"),
    (dict(dtype="f32"), "dispatch dtype 'f32' is not one"),  # 4-byte rows: wider than max_token_type_size 2
    (dict(tokens=-1), "tokens -1 must be an int >= 0"),
    (dict(tokens=True), "tokens True must be an int"),
    (dict(hidden=8192), r"hidden 8192 must be an int in \[1, config.hidden_dim=7168\]"),
    (dict(zero_copy=True), "zero_copy and quant_type key combine geometries only"),
    (dict(leg="combine", quant_type="int4"), "quant_type 'int4' is not allowed"),
    (dict(leg="combine", zero_copy=1), "zero_copy 1 is not a combine form"),
])  # fmt: skip
def test_bad_call_arguments(tmp_path, call, message):
    auto = _auto(tmp_path)
    args = dict(leg="dispatch", dtype="bf16", tokens=128) | call
    leg, dtype, tokens = args.pop("leg"), args.pop("dtype"), args.pop("tokens")
    with pytest.raises(ValueError, match=message):
        auto.geometry(leg, dtype, tokens, **args)


def test_bad_construction_arguments(tmp_path):
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.config import ConfigError

    with pytest.raises(MoriCompilerError, match="unknown target 'sm_80'"):
        AutoLaunch(_config(), "sm_80", "h200", search_dirs=[tmp_path])
    with pytest.raises(TuningTableError, match="tuning model 'H200' must be lower-case"):
        AutoLaunch(_config(), "sm_90", "H200", search_dirs=[tmp_path])
    with pytest.raises(ConfigError, match="config.block_num 0"):
        AutoLaunch(_config(block_num=0), "sm_90", "h200", search_dirs=[tmp_path])


# ---- the GPU model name and co-residency ---------------------------------------------------------------------

@pytest.mark.parametrize("name, model", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA H200 NVL", "h200"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
])  # fmt: skip
def test_gpu_model_name(name, model):
    assert gpu_model_name(name) == model


@pytest.mark.parametrize("name", ["", "NVIDIA", "NVIDIA H200?", 7])
def test_gpu_model_name_refuses_names_without_a_model(name):
    with pytest.raises(ValueError, match="GPU device name"):
        gpu_model_name(name)


class _FakeKernels:
    """A loaded bundle as coresident_blocks sees it: a driver with occupancy per kernel, and its functions."""

    def __init__(self, per_sm: dict, sms: int):
        self.asked = []
        kernels = self

        class Driver:
            def max_active_blocks_per_sm(self, fn, threads, shared_mem):
                kernels.asked.append((fn, threads, shared_mem))
                return per_sm[fn]

            def multiprocessor_count(self):
                return sms

        class Module:
            def function(self, name):
                return name

        self.driver, self.module = Driver(), Module()


def test_coresident_blocks_is_the_least_occupancy_shared_by_the_pes():
    names = leg_kernel_names(_config(), "combine")
    assert names == ["ep_combine_pull_bf16", "ep_combine_push_bf16", "ep_combine_pull_bf16_anyhidden",
                     "ep_combine_push_bf16_anyhidden"]  # (any hidden: the variants too)
    kernels = _FakeKernels({"ep_combine_pull_bf16": 3, "ep_combine_push_bf16": 2, "ep_combine_pull_bf16_anyhidden": 3,
                            "ep_combine_push_bf16_anyhidden": 4}, sms=132)
    assert coresident_blocks(kernels, names, 256, 8) == 33  # 2 per SM x 132 SMs / 8 virtual PEs
    assert coresident_blocks(kernels, names, 256, 1) == 264
    assert {(t, s) for _, t, s in kernels.asked} == {(256, 0)}


def test_config_of_the_tests_is_the_tuners():
    cfg = _config()
    assert isinstance(cfg, EpDispatchCombineConfig) and cfg.kernel_type == EpDispatchCombineKernelType.IntraNode
    assert (cfg.world_size, cfg.hidden_dim, cfg.num_experts_per_token, cfg.use_external_inp_buf) == (8, 7168, 8, True)


def test_device_gpu_model_from_torch(monkeypatch):
    import types

    from mori_compiler.ops.auto_launch import device_gpu_model

    names = {None: "NVIDIA H200", 1: "NVIDIA"}
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_name=lambda device=None: names[device]))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert device_gpu_model() == "h200"
    assert device_gpu_model(1) is None  # no model in the name: any model's table of the arch (MORI's fallback)
