"""The EP tuning tables (mori_compiler/ops/tuning.py): MORI's JSON format, the lookup passes and token buckets,
the file search with its fallback and override, the launch mode, and a clear error for every bad input."""

from __future__ import annotations

import json
import os

import pytest

from mori_compiler.ep_schema import EpDispatchCombineKernelType as KT
from mori_compiler.ops import tuning
from mori_compiler.ops.tuning import TuningTableError, load_tuning_table


def _rule(tokens, hidden=7168, dtype="bf16", blocks=64, rdma=0, warps=8, **extra):
    return dict(dtype=dtype, num_tokens=tokens, hidden_dim=hidden, block_num=blocks, rdma_block_num=rdma,
                warp_per_block=warps, **extra)  # fmt: skip


def _write(path, rule_list, phase="dispatch", kernel_type="IntraNode", arch="gfx950", model="mi355x", ep=8, **header):
    data = dict(version="1.0", gpu_arch=arch, gpu_model=model, kernel_type=kernel_type, ep_size=ep, phase=phase,
                rules=rule_list)  # fmt: skip
    data.update(header)
    path.write_text(json.dumps(data, indent=2))
    return path


def _table(tmp_path, rule_list, **kw):
    return load_tuning_table(_write(tmp_path / "t.json", rule_list, **kw))


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(tuning.TUNING_CONFIG_VAR, raising=False)
    monkeypatch.delenv(tuning.LAUNCH_MODE_VAR, raising=False)


# Format


def test_round_trip_of_a_mori_file(tmp_path):
    # The shape of MORI's shipped files: informational fields, fp4 and fp8 rules, out of order.
    rules = [_rule(256, 3584, "fp4", 256, 0, 16, bandwidth_gbps=99.75), _rule(64, 3584, "fp4", 256, 0, 4),
             _rule(128, dtype="fp8_e4m3", blocks=256, warps=4, bandwidth_gbps=131.0, latency_us=12.5)]  # fmt: skip
    table = _table(tmp_path, rules)
    assert (table.gpu_arch, table.gpu_model, table.kernel_type, table.ep_size, table.phase) == (
        "gfx950", "mi355x", KT.IntraNode, 8, "dispatch")  # fmt: skip
    assert [(r.dtype, r.num_tokens) for r in table.rules] == [("fp4", 64), ("fp4", 256), ("fp8_e4m3", 128)]
    fp8 = table.rules[2]
    assert (fp8.block_num, fp8.rdma_block_num, fp8.warp_per_block, fp8.topk) == (256, 0, 4, None)
    assert fp8.info == {"bandwidth_gbps": 131.0, "latency_us": 12.5}
    assert fp8.zero_copy is None and fp8.quant_type is None


def test_combine_file_and_internode_geometry(tmp_path):
    rules = [_rule(4, 6144, blocks=16, rdma=10, warps=2, zero_copy=False, quant_type="none",
                   avg_rdma_bandwidth_gbps=1.39, avg_xgmi_bandwidth_gbps=4.6, avg_ll_bandwidth_gbps=5.3,
                   avg_latency_us=70.7)]  # fmt: skip
    table = _table(tmp_path, rules, phase="combine", kernel_type="InterNodeV1LL", arch="gfx942", model="mi300x", ep=16)
    (rule,) = table.rules
    assert (rule.block_num, rule.rdma_block_num, rule.warp_per_block, rule.zero_copy, rule.quant_type) == (
        16, 10, 2, False, "none")  # fmt: skip
    assert set(rule.info) == {"avg_rdma_bandwidth_gbps", "avg_xgmi_bandwidth_gbps", "avg_ll_bandwidth_gbps",
                              "avg_latency_us"}  # fmt: skip


# Lookup


def test_token_buckets_below_between_above(tmp_path):
    table = _table(tmp_path, [_rule(512, blocks=3), _rule(128, blocks=1), _rule(256, blocks=2)])
    got = {n: table.lookup("bf16", n, 7168).block_num for n in (1, 128, 129, 256, 300, 512, 513, 10**6)}
    assert got == {1: 1, 128: 1, 129: 2, 256: 2, 300: 3, 512: 3, 513: 3, 10**6: 3}


def test_dtype_is_exact_and_names_map(tmp_path):
    table = _table(tmp_path, [_rule(64, dtype="fp8_e4m3", blocks=5), _rule(64, dtype="fp8_e4m3_fnuz", blocks=6),
                              _rule(64, dtype="bf16", blocks=7)])  # fmt: skip
    assert table.lookup("fp8_e4m3fn", 64, 7168).block_num == 5  # our name of MORI's fp8_e4m3
    assert table.lookup("fp8_e4m3", 64, 7168).block_num == 5
    assert table.lookup("fp8_e4m3fnuz", 64, 7168).block_num == 6
    assert table.lookup("bf16", 64, 7168).block_num == 7
    assert table.lookup("fp4", 64, 7168) is None  # no fp4 rule: no fallback to another dtype
    assert table.lookup("f32", 64, 7168) is None  # ours, no MORI name
    with pytest.raises(TuningTableError, match=r"dtype 'float16'.*allowed: bf16, fp8_e4m3_fnuz"):
        table.lookup("float16", 64, 7168)


def test_pass_order(tmp_path):
    rules = [_rule(64, 4096, blocks=1, topk=8),   # pass 3: topk matches, another hidden
             _rule(64, 7168, blocks=2, topk=4),   # pass 2: hidden matches, another topk
             _rule(64, 2048, blocks=3, topk=2)]   # pass 4: neither  # fmt: skip
    table = _table(tmp_path, rules)
    assert table.lookup("bf16", 64, 7168, topk=8).block_num == 2  # hidden before topk
    assert table.lookup("bf16", 64, 4096, topk=8).block_num == 1  # pass 1
    assert table.lookup("bf16", 64, 1024, topk=8).block_num == 1  # pass 3
    assert table.lookup("bf16", 64, 1024, topk=9).block_num == 3  # pass 4: the first in scan order (hidden 2048)
    exact = _table(tmp_path, rules + [_rule(64, 7168, blocks=4, topk=8)])
    assert exact.lookup("bf16", 64, 7168, topk=8).block_num == 4  # pass 1 beats pass 2


def test_pass_4_scans_in_mori_order(tmp_path):
    # Across hidden sizes the scan follows MORI's sort (hidden, then tokens): the first hidden group with a
    # large enough bucket wins; a request above every bucket takes the last rule scanned.
    table = _table(tmp_path, [_rule(1024, 8192, blocks=1), _rule(128, 4096, blocks=2), _rule(512, 4096, blocks=3)])
    assert table.lookup("bf16", 100, 7168).block_num == 2
    assert table.lookup("bf16", 600, 7168).block_num == 1
    assert table.lookup("bf16", 5000, 7168).block_num == 1


def test_topk_wildcard_rules(tmp_path):
    table = _table(tmp_path, [_rule(64, blocks=1), _rule(128, blocks=2, topk=8), _rule(256, blocks=3, topk=4)])
    assert table.lookup("bf16", 100, 7168, topk=8).block_num == 2
    assert table.lookup("bf16", 100, 7168, topk=4).block_num == 3  # the topk-8 rule is skipped in pass 1
    assert table.lookup("bf16", 50, 7168, topk=4).block_num == 1  # the wildcard matches any topk
    assert table.lookup("bf16", 100, 7168).block_num == 2  # no topk asked: every rule matches
    assert table.lookup("bf16", 300, 7168, topk=6).block_num == 1  # only the wildcard in pass 1: clamped to it


def test_combine_zero_copy_and_quant_type(tmp_path):
    rules = [_rule(64, blocks=1, zero_copy=True, quant_type="none"),
             _rule(64, blocks=2, zero_copy=False, quant_type="none"),
             _rule(64, blocks=3, zero_copy=False, quant_type="fp8_direct_cast"),
             _rule(64, blocks=4, zero_copy=True, quant_type="fp8_blockwise")]  # fmt: skip
    table = _table(tmp_path, rules, phase="combine")
    got = {(zc, q): table.lookup("bf16", 64, 7168, zero_copy=zc, quant_type=q).block_num
           for zc, q in ((True, "none"), (False, "none"), (False, "fp8_direct_cast"), (True, "fp8_blockwise"))}
    assert got == {(True, "none"): 1, (False, "none"): 2, (False, "fp8_direct_cast"): 3, (True, "fp8_blockwise"): 4}
    assert table.lookup("bf16", 64, 7168, zero_copy=False, quant_type="fp8_blockwise") is None
    with pytest.raises(TuningTableError, match="quant_type 'int4' is not one of none, fp8_direct_cast"):
        table.lookup("bf16", 64, 7168, zero_copy=True, quant_type="int4")
    dispatch = _table(tmp_path, [_rule(64)])
    with pytest.raises(TuningTableError, match="zero_copy and quant_type key combine tables only"):
        dispatch.lookup("bf16", 64, 7168, zero_copy=True)


@pytest.mark.parametrize("kw, message", [
    (dict(num_tokens=0), "num_tokens 0 must be a positive int"),
    (dict(hidden_dim=7168.0), "hidden_dim 7168.0 must be a positive int"),
    (dict(topk=True), "topk True must be a positive int"),
])  # fmt: skip
def test_bad_lookup_arguments(tmp_path, kw, message):
    table = _table(tmp_path, [_rule(64)])
    args = dict(dtype="bf16", num_tokens=64, hidden_dim=7168) | kw
    with pytest.raises(TuningTableError, match=message):
        table.lookup(**args)


# Finding the file


def test_file_name_pattern():
    assert tuning.file_name("sm_90", "h200", KT.IntraNode, 8, "dispatch") == "sm_90_h200_IntraNode_ep8_dispatch.json"
    assert tuning.file_name("gfx950", "mi355x", "InterNodeV1LL", 16, "combine") == (
        "gfx950_mi355x_InterNodeV1LL_ep16_combine.json")  # fmt: skip


def test_find_exact_model_then_another_model_of_the_arch(tmp_path):
    other = _write(tmp_path / "sm_90_h100_IntraNode_ep8_dispatch.json", [_rule(64)], arch="sm_90", model="h100")
    _write(tmp_path / "gfx942_h200_IntraNode_ep8_dispatch.json", [_rule(64)], arch="gfx942", model="h200")
    _write(tmp_path / "sm_90_h100_IntraNode_ep4_dispatch.json", [_rule(64)], arch="sm_90", model="h100", ep=4)
    find = lambda model, phase="dispatch": tuning.find_tuning_table("sm_90", model, KT.IntraNode, 8, phase, [tmp_path])
    assert find("h200") == other  # no h200 file of sm_90: another model of the same arch, never another arch
    exact = _write(tmp_path / "sm_90_h200_IntraNode_ep8_dispatch.json", [_rule(64)], arch="sm_90", model="h200")
    assert find("h200") == exact
    assert find(None) == other  # no model known: the first of the arch
    assert find("h200", "combine") is None
    assert tuning.find_tuning_table("sm_90", "h200", "IntraNodeLL", 8, "dispatch", [tmp_path]) is None
    assert tuning.find_tuning_table("gfx950", "h200", "IntraNode", 8, "dispatch", [tmp_path / "nothing"]) is None
    table = tuning.tuning_table_for("sm_90", "h200", KT.IntraNode, 8, "dispatch", [tmp_path])
    assert (table.path, table.gpu_model) == (exact, "h200")


def test_shipped_directory_is_the_default(monkeypatch, tmp_path):
    _write(tmp_path / "gfx950_mi355x_IntraNode_ep8_dispatch.json", [_rule(64)])
    monkeypatch.setattr(tuning, "SHIPPED_DIR", tmp_path)
    assert tuning.find_tuning_table("gfx950", "mi300x", KT.IntraNode, 8, "dispatch").parent == tmp_path


def test_env_override(monkeypatch, tmp_path):
    _write(tmp_path / "gfx950_mi355x_IntraNode_ep8_dispatch.json", [_rule(64, blocks=1)])
    mine = _write(tmp_path / "mine.json", [_rule(64, blocks=9)])
    monkeypatch.setenv(tuning.TUNING_CONFIG_VAR, str(mine))
    find = lambda phase: tuning.find_tuning_table("gfx950", "mi355x", KT.IntraNode, 8, phase, [tmp_path])
    assert find("dispatch") == mine
    assert find("combine") is None  # the override decides alone: the shipped search is not used
    comb = _write(tmp_path / "comb.json", [_rule(64, zero_copy=True, quant_type="none")], phase="combine")
    monkeypatch.setenv(tuning.TUNING_CONFIG_VAR, os.pathsep.join([str(mine), str(comb)]))
    assert (find("dispatch"), find("combine")) == (mine, comb)
    monkeypatch.setenv(tuning.TUNING_CONFIG_VAR, str(tmp_path / "missing.json"))
    with pytest.raises(TuningTableError, match=r"missing\.json: not found"):
        find("dispatch")
    # An override for another kernel type or arch is refused, not used for this one.
    v1 = _write(tmp_path / "v1.json", [_rule(64, blocks=96, rdma=64)], kernel_type="InterNodeV1")
    monkeypatch.setenv(tuning.TUNING_CONFIG_VAR, str(v1))
    with pytest.raises(TuningTableError, match=r"v1\.json: field 'kernel_type' is 'InterNodeV1', but the request is for 'IntraNode'"):
        tuning.tuning_table_for("gfx950", "mi355x", KT.IntraNode, 8, "dispatch")
    with pytest.raises(TuningTableError, match=r"field 'gpu_arch' is 'gfx950', but the request is for 'gfx942'"):
        tuning.tuning_table_for("gfx942", None, KT.InterNodeV1, 8, "dispatch")


def test_header_must_match_the_file_name(tmp_path):
    _write(tmp_path / "gfx950_mi355x_IntraNode_ep8_dispatch.json", [_rule(64)], ep=4)
    with pytest.raises(TuningTableError, match=r"ep8_dispatch\.json: field 'ep_size' is 4, but the request is for 8"):
        tuning.tuning_table_for("gfx950", "mi355x", KT.IntraNode, 8, "dispatch", [tmp_path])


@pytest.mark.parametrize("args, message", [
    (("gfx90a", "x", KT.IntraNode, 8, "dispatch"), "target 'gfx90a' is not a target; allowed: gfx942"),
    (("gfx942", "MI300X", KT.IntraNode, 8, "dispatch"), "model 'MI300X' must be lower-case"),
    (("gfx942", "a_b", KT.IntraNode, 8, "dispatch"), "model 'a_b' must be lower-case"),
    (("gfx942", None, "Intra", 8, "dispatch"), "kernel_type 'Intra' is not a kernel type; allowed: IntraNode"),
    (("gfx942", None, KT.IntraNode, 0, "dispatch"), r"ep_size 0 must be an int in \[1, 1024\]"),
    (("gfx942", None, KT.IntraNode, 8, "both"), "phase 'both' is not allowed; allowed: dispatch, combine"),
])  # fmt: skip
def test_bad_find_requests(tmp_path, args, message):
    with pytest.raises(TuningTableError, match=message):
        tuning.find_tuning_table(*args, search_dirs=[tmp_path])


# Launch mode and fallback


def test_launch_config_mode(monkeypatch):
    assert tuning.launch_config_mode() == "MANUAL"
    for value, mode in (("AUTO", "AUTO"), ("auto", "AUTO"), ("MANUAL", "MANUAL"), ("", "MANUAL")):
        monkeypatch.setenv(tuning.LAUNCH_MODE_VAR, value)
        assert tuning.launch_config_mode() == mode
    monkeypatch.setenv(tuning.LAUNCH_MODE_VAR, "FAST")
    with pytest.raises(TuningTableError, match="MORI_EP_LAUNCH_CONFIG_MODE='FAST' is not allowed; allowed: MANUAL, AUTO"):
        tuning.launch_config_mode()


def test_auto_fallback():
    got = {k.name: tuning.auto_fallback(k) for k in KT}
    assert got == {"IntraNode": (128, 0, 16), "InterNode": (128, 0, 16), "InterNodeV1": (96, 64, 8),
                   "InterNodeV1LL": (256, 128, 8), "AsyncLL": (128, 0, 16), "IntraNodeLL": (128, 0, 16)}  # fmt: skip
    assert tuning.auto_fallback("InterNodeV1") == (96, 64, 8)


# Bad files: each names the file, the rule index and the field


def test_file_not_found_and_not_json(tmp_path):
    with pytest.raises(TuningTableError, match=r"nope\.json: not found"):
        load_tuning_table(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"version": "1.0",')
    with pytest.raises(TuningTableError, match=r"bad\.json: not JSON \(Expecting"):
        load_tuning_table(tmp_path / "bad.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TuningTableError, match=r"bin\.json: cannot be read"):
        load_tuning_table(tmp_path / "bin.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(TuningTableError, match=r"list\.json: must hold a JSON object, not list"):
        load_tuning_table(tmp_path / "list.json")
    with pytest.raises(TuningTableError, match="cannot be read"):
        load_tuning_table(tmp_path)  # a directory


@pytest.mark.parametrize("header, message", [
    (dict(version="2.0"), "field 'version' '2.0' is not supported; allowed: '1.0'"),
    (dict(gpu_arch="gfx90a"), "field 'gpu_arch' 'gfx90a' is not a target; allowed: gfx942, gfx950, gfx1250, sm_90"),
    (dict(gpu_model="MI355X"), "field 'gpu_model' 'MI355X' must be lower-case"),
    (dict(kernel_type="Fast"), "field 'kernel_type' 'Fast' is not a kernel type; allowed: IntraNode"),
    (dict(ep_size="8"), r"field 'ep_size' '8' must be an int in \[1, 1024\]"),
    (dict(ep_size=True), r"field 'ep_size' True must be an int"),
    (dict(phase="both"), "field 'phase' 'both' is not allowed; allowed: dispatch, combine"),
    (dict(rules={}), "field 'rules' must be a list, not dict"),
    (dict(comment="x"), "field 'comment' is unknown; allowed: version, gpu_arch"),
])  # fmt: skip
def test_bad_header(tmp_path, header, message):
    with pytest.raises(TuningTableError, match=r"t\.json: " + message):
        _table(tmp_path, [_rule(64)], **header)


def test_missing_header_field(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"version": "1.0", "gpu_arch": "gfx942", "rules": []}))
    with pytest.raises(TuningTableError, match=r"t\.json: field 'gpu_model' is missing"):
        load_tuning_table(path)


def _bad(rule: dict, drop=(), **changes):
    bad = {k: v for k, v in rule.items() if k not in drop} | changes
    return [_rule(64), bad]  # the bad rule is rule 1


@pytest.mark.parametrize("rules, kw, message", [
    ([_rule(64), 7], {}, "rule 1 must be a JSON object, not int"),
    (_bad(_rule(64), sm_count=80), {}, "rule 1 field 'sm_count' is unknown for a dispatch rule; allowed: dtype"),
    (_bad(_rule(64), zero_copy=True, quant_type="none"), {}, "rule 1 field 'zero_copy' is unknown for a dispatch"),
    (_bad(_rule(64), drop=("hidden_dim",)), {}, "rule 1 field 'hidden_dim' is missing"),
    (_bad(_rule(64), dtype="fp16"), {}, "rule 1 field 'dtype' 'fp16' is not allowed; allowed: bf16, fp8_e4m3_fnuz"),
    (_bad(_rule(64), num_tokens=0), {}, r"rule 1 field 'num_tokens' 0 is outside \[1, "),
    (_bad(_rule(64), num_tokens="64"), {}, "rule 1 field 'num_tokens' '64' must be an int, not str"),
    (_bad(_rule(64), hidden_dim=8), {}, r"rule 1 field 'hidden_dim' 8 is outside \[16, 65536\]"),
    (_bad(_rule(64), block_num=-1), {}, r"rule 1 field 'block_num' -1 is outside \[1, 1024\]"),
    (_bad(_rule(64), block_num=1025), {}, r"rule 1 field 'block_num' 1025 is outside \[1, 1024\]"),
    (_bad(_rule(64), block_num=64.0), {}, "rule 1 field 'block_num' 64.0 must be an int, not float"),
    (_bad(_rule(64), rdma_block_num=8), {}, r"rule 1 field 'rdma_block_num' 8 is outside \[0, 0\] \(IntraNode uses no"),
    (_bad(_rule(64), warp_per_block=0), {}, r"rule 1 field 'warp_per_block' 0 is outside \[1, 16\]"),
    (_bad(_rule(64), warp_per_block=17), {}, r"rule 1 field 'warp_per_block' 17 is outside \[1, 16\]"),
    (_bad(_rule(64), warp_per_block=1), dict(kernel_type="IntraNodeLL"),
     r"rule 1 field 'warp_per_block' 1 is outside \[2, 16\] \(IntraNodeLL: a control warp and a data warp"),
    (_bad(_rule(64), topk=64), {}, r"rule 1 field 'topk' 64 is outside \[1, 63\]"),
    (_bad(_rule(64), bandwidth_gbps="fast"), {}, "rule 1 field 'bandwidth_gbps' 'fast' must be a number >= 0"),
    (_bad(_rule(64), latency_us=-1.0), {}, "rule 1 field 'latency_us' -1.0 must be a number >= 0"),
    (_bad(_rule(64, blocks=96, rdma=64), rdma_block_num=96), dict(kernel_type="InterNodeV1"),
     r"rule 1 field 'rdma_block_num' 96 is outside \[0, 95\] \(below block_num 96"),
])  # fmt: skip
def test_bad_dispatch_rule(tmp_path, rules, kw, message):
    with pytest.raises(TuningTableError, match=r"t\.json: " + message):
        _table(tmp_path, rules, **kw)


def test_warp_limit_follows_the_wave_size(tmp_path):
    # 32-lane waves (sm_90, gfx1250): 1024 threads are 32 warps, and top-k goes up to 31.
    assert _table(tmp_path, [_rule(64, warps=32, topk=31)], arch="sm_90", model="h200").rules[0].warp_per_block == 32
    with pytest.raises(TuningTableError, match=r"'warp_per_block' 33 is outside \[1, 32\]"):
        _table(tmp_path, [_rule(64, warps=33)], arch="gfx1250", model="x")
    with pytest.raises(TuningTableError, match=r"'topk' 32 is outside \[1, 31\]"):
        _table(tmp_path, [_rule(64, topk=32)], arch="sm_90", model="h200")


@pytest.mark.parametrize("changes, drop, message", [
    ({}, ("zero_copy",), "rule 0 field 'zero_copy' is missing"),
    ({}, ("quant_type",), "rule 0 field 'quant_type' is missing"),
    (dict(zero_copy=1), (), "rule 0 field 'zero_copy' 1 must be true or false"),
    (dict(quant_type="fp4_blockwise"), (), "rule 0 field 'quant_type' 'fp4_blockwise' is not allowed; allowed: none"),
])  # fmt: skip
def test_bad_combine_rule(tmp_path, changes, drop, message):
    rule = {k: v for k, v in _rule(64, zero_copy=True, quant_type="none").items() if k not in drop} | changes
    with pytest.raises(TuningTableError, match=r"t\.json: " + message):
        _table(tmp_path, [rule], phase="combine")


def test_repeated_field_and_repeated_rule_key(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"version": "1.0", "version": "1.0"}')
    with pytest.raises(TuningTableError, match=r"t\.json: field 'version' appears twice in one object"):
        load_tuning_table(path)
    with pytest.raises(TuningTableError, match=r"t\.json: rule 2 has the key of rule 0 \(dtype, num_tokens, hidden_dim, topk\)"):
        _table(tmp_path, [_rule(64, blocks=1), _rule(128), _rule(64, blocks=2)])
    # A topk rule and a wildcard of the same bucket are two keys; so are two combine modes.
    assert len(_table(tmp_path, [_rule(64), _rule(64, topk=8)]).rules) == 2
    combine = [_rule(64, zero_copy=True, quant_type="none"), _rule(64, zero_copy=False, quant_type="none")]
    assert len(_table(tmp_path, combine, phase="combine").rules) == 2
    with pytest.raises(TuningTableError, match=r"rule 1 has the key of rule 0 \(dtype, num_tokens, hidden_dim, topk, zero_copy, quant_type\)"):
        _table(tmp_path, [combine[0], combine[0]], phase="combine")


def test_exact_model_in_any_directory_beats_another_model(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    _write(first / "sm_90_h100_IntraNode_ep8_dispatch.json", [_rule(64)], arch="sm_90", model="h100")
    exact = _write(second / "sm_90_h200_IntraNode_ep8_dispatch.json", [_rule(64)], arch="sm_90", model="h200")
    assert tuning.find_tuning_table("sm_90", "h200", KT.IntraNode, 8, "dispatch", [first, second]) == exact
    # Not a model: a file without one, or with an "_" in it, is never a fallback.
    _write(first / "sm_90_IntraNode_ep8_combine.json", [], arch="sm_90", phase="combine")
    _write(first / "sm_90_h_1_IntraNode_ep8_combine.json", [], arch="sm_90", phase="combine")
    assert tuning.find_tuning_table("sm_90", "h200", KT.IntraNode, 8, "combine", [first]) is None


def test_the_op_refuses_an_unknown_launch_mode(monkeypatch):
    from mori_compiler.ops.dispatch_combine import EpDispatchCombineOp

    monkeypatch.setenv("MORI_EP_LAUNCH_CONFIG_MODE", "sometimes")
    with pytest.raises(ValueError, match="MORI_EP_LAUNCH_CONFIG_MODE='sometimes' is not allowed"):
        EpDispatchCombineOp(None)


# Writing (bench/ep_tune.py's tables)


def _rules_of(path):
    return {(r.dtype, r.num_tokens): (r.block_num, r.warp_per_block, r.info.get("bandwidth_gbps"))
            for r in load_tuning_table(path).rules}  # fmt: skip


def test_written_table_loads_back_in_mori_format(tmp_path):
    rules = [tuning.TuningRule("bf16", 4096, 7168, 32, 0, 8, topk=8, zero_copy=True, quant_type="none",
                               info={"bandwidth_gbps": 350.5, "latency_us": 700.25}),
             tuning.TuningRule("bf16", 128, 7168, 16, 0, 4, zero_copy=False, quant_type="none")]  # fmt: skip
    path = tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "combine", rules)
    assert path.name == "sm_90_h200_IntraNode_ep8_combine.json"
    data = json.loads(path.read_text())
    assert [data[k] for k in ("version", "gpu_arch", "gpu_model", "kernel_type", "ep_size", "phase")] == [
        "1.0", "sm_90", "h200", "IntraNode", 8, "combine"]  # fmt: skip
    assert list(data["rules"][1]) == ["dtype", "num_tokens", "hidden_dim", "topk", "zero_copy", "quant_type",
                                      "block_num", "rdma_block_num", "warp_per_block", "bandwidth_gbps", "latency_us"]
    table = load_tuning_table(path)
    assert sorted(table.rules, key=lambda r: r.num_tokens) == sorted(rules, key=lambda r: r.num_tokens)
    assert table.lookup("bf16", 2000, 7168, zero_copy=True).info == {"bandwidth_gbps": 350.5, "latency_us": 700.25}


def test_write_merges_keeping_the_higher_bandwidth(tmp_path):
    def rule(tokens, blocks, bw):
        return tuning.TuningRule("bf16", tokens, 7168, blocks, 0, 8, info={"bandwidth_gbps": bw})

    tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "dispatch", [rule(128, 16, 100.0),
                                                                                        rule(4096, 32, 300.0)])
    path = tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "dispatch",
                                     [rule(128, 24, 120.0), rule(4096, 8, 250.0), rule(512, 8, 200.0)])  # fmt: skip
    assert _rules_of(path) == {("bf16", 128): (24, 8, 120.0), ("bf16", 4096): (32, 8, 300.0),
                               ("bf16", 512): (8, 8, 200.0)}  # fmt: skip
    path = tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "dispatch", [rule(128, 4, 1.0)],
                                     merge=False)  # fmt: skip
    assert _rules_of(path) == {("bf16", 128): (4, 8, 1.0)}


def test_write_refuses_a_table_that_would_not_load(tmp_path):
    bad = tuning.TuningRule("bf16", 128, 7168, 2048, 0, 8)  # more blocks than the epoch slots
    with pytest.raises(TuningTableError, match=r"rule 0 field 'block_num' 2048 is outside \[1, 1024\]"):
        tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "dispatch", [bad])
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left
    existing = tmp_path / "sm_90_h200_IntraNode_ep8_dispatch.json"
    existing.write_text("{not json")
    with pytest.raises(TuningTableError, match="not JSON"):
        tuning.write_tuning_table(tmp_path, "sm_90", "h200", "IntraNode", 8, "dispatch",
                                  [tuning.TuningRule("bf16", 128, 7168, 16, 0, 8)])  # fmt: skip
    assert existing.read_text() == "{not json"  # an unreadable table is reported, never overwritten
    with pytest.raises(TuningTableError, match="gpu_model must name the GPU model"):
        tuning.write_tuning_table(tmp_path, "sm_90", None, "IntraNode", 8, "dispatch", [])


def test_shipped_tables_load():
    """Every shipped file is the README or a table named after its header whose rules an op of its kind and
    EP size accepts (mori_compiler/ops/auto_launch.py checks them against the config when an op is built)."""
    from mori_compiler.ops.auto_launch import AutoLaunch
    from mori_compiler.ops.config import EpDispatchCombineConfig

    names = sorted(p.name for p in tuning.SHIPPED_DIR.iterdir())
    assert "README.md" in names
    for name in names:
        if name == "README.md":
            continue
        table = load_tuning_table(tuning.SHIPPED_DIR / name)
        assert name == tuning.file_name(table.gpu_arch, table.gpu_model, table.kernel_type, table.ep_size, table.phase)
        ep = table.ep_size
        cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=ep, hidden_dim=7168, scale_dim=0,
                                      scale_type_size=0, max_token_type_size=2, max_num_inp_token_per_rank=4096,
                                      num_experts_per_rank=max(1, 256 // ep), num_experts_per_token=8,
                                      use_external_inp_buf=True, kernel_type=table.kernel_type,
                                      gpu_per_node=min(8, ep))  # fmt: skip
        auto = AutoLaunch(cfg, table.gpu_arch, table.gpu_model)
        assert auto.tables[table.phase].path == tuning.SHIPPED_DIR / name
