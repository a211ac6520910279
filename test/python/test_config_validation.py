"""validate_config: every field of EpDispatchCombineConfig is checked for type and range (issue 11).

Standard library only (no MLIR, no torch): the checker is table-driven (ops/config.py ``_RULES``); these
tests walk the same table, so a new field without a rule fails ``test_every_field_has_a_rule``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from mori_compiler.ops.config import (_RULES, ConfigError, EpDispatchCombineConfig, EpDispatchCombineKernelType,
                                      config_problems, validate_config)  # fmt: skip

BASE = dict(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0, scale_type_size=4,
            max_token_type_size=2, max_num_inp_token_per_rank=128, num_experts_per_rank=32, num_experts_per_token=8)  # fmt: skip
INT_FIELDS = [name for name, rule in _RULES.items() if rule.kind == "int"]


def config(**overrides) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(**(BASE | overrides))


def rejected(wave: int = 64, **overrides) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config(**overrides), wave)
    return str(info.value)


def test_every_field_has_a_rule():
    assert [f.name for f in dataclasses.fields(EpDispatchCombineConfig)] == list(_RULES)


@pytest.mark.parametrize("wave", [32, 64])
def test_the_base_config_and_the_defaults_pass(wave):
    validate_config(config(), wave)
    validate_config(config(kernel_type=EpDispatchCombineKernelType.IntraNodeLL), wave)
    validate_config(config(kernel_type=int(EpDispatchCombineKernelType.AsyncLL), data_type="torch.float32"), wave)


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("bad", [True, False, 8.0, "8", None, [8]], ids=["True", "False", "float", "str", "None", "list"])
def test_int_fields_refuse_other_types(name, bad):
    message = rejected(**{name: bad})
    assert f"config.{name} {bad!r} must be an int, not {type(bad).__name__}" in message


@pytest.mark.parametrize("name", INT_FIELDS)
def test_int_fields_refuse_values_out_of_range(name):
    rule = _RULES[name]
    if rule.allowed:
        too_big, too_small = max(rule.allowed) + 1, min(rule.allowed) - 1
    else:
        hi = rule.hi(64) if callable(rule.hi) else rule.hi
        too_big, too_small = hi + 1, rule.lo - 1
    for value in (too_big, too_small, 2**40, -(2**40)):
        message = rejected(**{name: value})
        assert f"config.{name}" in message and str(value) in message, message


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"use_external_inp_buf": 1}, "config.use_external_inp_buf 1 must be a bool (True or False), not int"),
        ({"use_external_inp_buf": "yes"}, "config.use_external_inp_buf 'yes' must be a bool"),
        ({"kernel_type": True}, "config.kernel_type True must be an EpDispatchCombineKernelType"),
        ({"kernel_type": 4.0}, "config.kernel_type 4.0 must be an EpDispatchCombineKernelType"),
        ({"kernel_type": 9}, "config.kernel_type 9 is not a kernel type; allowed: IntraNode, InterNode"),
        ({"kernel_type": "AsyncLL"}, "config.kernel_type 'AsyncLL' must be an EpDispatchCombineKernelType"),
        ({"quant_type": "fp8"}, "config.quant_type 'fp8' is not allowed (the combine's wire quantization); allowed: "
         "'none', 'fp8_direct_cast', 'fp8_blockwise', 'fp4_blockwise'"),
        ({"quant_type": 0}, "config.quant_type 0 must be a str, not int"),
        ({"data_type": 5}, "config.data_type 5 is not a supported dtype; allowed: torch.bfloat16"),
        ({"data_type": "float16"}, "config.data_type 'float16' is not a supported dtype"),
        ({"data_type": None}, "config.data_type None is not a supported dtype"),
    ],
)  # fmt: skip
def test_other_fields_refuse_wrong_types_and_values(overrides, needle):
    assert needle in rejected(**overrides)


@pytest.mark.parametrize(
    ("overrides", "wave", "needle"),
    [
        ({"world_size": 33}, 64, "config.world_size 33 exceeds 32"),
        ({"world_size": 48}, 32, "config.world_size 48 exceeds 32"),
        ({"rank": 8}, 64, "config.rank 8 is outside [0, world_size=8)"),
        ({"hidden_dim": 7000}, 64, "config.hidden_dim 7000 must be a multiple of 16"),
        ({"hidden_dim": 2**40}, 64, "config.hidden_dim 1099511627776 exceeds 65536"),
        ({"warp_num_per_block": 10**6}, 64, "config.warp_num_per_block 1000000 exceeds 16 (a block has at most 1024 threads)"),
        ({"warp_num_per_block": 17}, 64, "exceeds 16"),
        ({"warp_num_per_block": 33}, 32, "exceeds 32"),
        ({"num_experts_per_token": 32}, 32, "(top-k 32) must be smaller than the wave size 32"),
        ({"num_experts_per_token": 9, "world_size": 1, "num_experts_per_rank": 8}, 64,
         "config.num_experts_per_token 9 exceeds the 8 experts"),
        ({"scale_dim": 8, "scale_type_size": 0}, 64, "config.scale_type_size 0 with config.scale_dim 8"),
        ({"rdma_block_num": 4}, 64,
         "config.rdma_block_num 4 is not allowed for IntraNode; allowed: 0 (intra-node kernel types use no RDMA blocks)"),
        ({"num_qp_per_pe": 2, "kernel_type": EpDispatchCombineKernelType.AsyncLL}, 64,
         "config.num_qp_per_pe 2 is not allowed for AsyncLL; allowed: 1 (intra-node kernel types use no RDMA queue pairs)"),
        ({"num_qp_per_pe": 9}, 64, "config.num_qp_per_pe 9 exceeds 8 (queue pairs per peer of the inter-node kernel types)"),
        ({"gpu_per_node": 0}, 64, "config.gpu_per_node 0 must be >= 1"),
        ({"block_num": 1025}, 64, "config.block_num 1025 exceeds 1024"),
        ({"max_total_recv_tokens": -1}, 64, "config.max_total_recv_tokens -1 must be >= 0"),
        ({"kernel_type": EpDispatchCombineKernelType.IntraNodeLL, "warp_num_per_block": 1}, 64,
         "IntraNodeLL needs >= 2 warps per block"),
    ],
)  # fmt: skip
def test_ranges_and_relations(overrides, wave, needle):
    assert needle in rejected(wave, **overrides)


def test_every_problem_is_reported_once_on_its_own_line():
    problems = config_problems(config(world_size=True, hidden_dim=7168.0, rank=0.5, rdma_block_num=3), 64)
    assert [p.split(" ", 1)[0] for p in problems] == ["config.rank", "config.world_size", "config.hidden_dim",
                                                      "config.rdma_block_num"]  # fmt: skip
    # Relations involving a field of the wrong type are not evaluated (no TypeError from comparing them).
    assert not any("outside [0, world_size" in p for p in problems)


def test_the_error_is_a_value_error_and_a_type_error():
    with pytest.raises(ValueError):
        validate_config(config(hidden_dim=8.0), 64)
    with pytest.raises(TypeError):
        validate_config(config(hidden_dim=8.0), 64)
    assert config_problems("not a config", 64) == ["config must be an EpDispatchCombineConfig, not str"]
    assert config_problems(config(), True) == ["wave_size True must be 32 or 64 (the target's lanes per wave)"]
    assert config_problems(config(), 48) == ["wave_size 48 must be 32 or 64 (the target's lanes per wave)"]


def test_numpy_integers_are_ints_and_numpy_bools_are_not():
    np = pytest.importorskip("numpy")
    validate_config(config(hidden_dim=np.int64(7168), world_size=np.int32(8)), 64)
    assert "must be an int, not bool" in rejected(world_size=np.bool_(True))


def test_ep_bundle_builds_nothing_for_an_invalid_config(tmp_path, monkeypatch):
    """ep_bundle validates before generating MLIR: a float field is reported as the field, never as an MLIR
    parse error inside generated text ("-:3:49"), and nothing is written to the cache."""
    pytest.importorskip("mlir")
    from mori_compiler.ops.dispatch_combine import ep_bundle

    monkeypatch.setenv("MORI_COMPILER_CACHE_DIR", str(tmp_path))
    for bad in ({"hidden_dim": 7168.0}, {"world_size": True}, {"warp_num_per_block": "8"}, {"rank": 0.5}):
        with pytest.raises(ConfigError, match=rf"config\.{next(iter(bad))} "):
            ep_bundle(config(**bad), "sm_90", virtual_pes=False, cache_root=tmp_path)
    assert not any(tmp_path.rglob("*.json"))


def test_the_checker_imports_only_the_standard_library():
    code = ("import sys; import mori_compiler.ops.config; "
            "print(sorted(m for m in ('mlir', 'numpy', 'torch', 'llvmlite') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("field, limit", [("hidden_dim", "MAX_HIDDEN_DIM"), ("max_num_inp_token_per_rank",
                                           "MAX_TOKENS_PER_RANK"), ("num_experts_per_rank", "MAX_EXPERTS_PER_RANK"),
                                          ("scale_dim", "MAX_SCALE_DIM"), ("world_size", "MAX_WORLD_SIZE")])  # fmt: skip
def test_the_dialect_accepts_what_the_config_accepts(field, limit):
    """A config at a bound that validate_config accepts makes mori_ep ops the dialect's verifier accepts
    (one set of bounds, the EP schema's, for hand-written ops and ops generated from a config)."""
    pytest.importorskip("mlir")
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import registry
    from mori_compiler.ops import config as cfg
    from mori_compiler.ops.bundle import kernel_module_source

    values = {"world_size": 4, "hidden_dim": 1024, "scale_dim": 4, "scale_type_size": 8,
              "max_num_inp_token_per_rank": 64, "num_experts_per_rank": 2}  # fmt: skip
    values[field] = getattr(cfg, limit)
    config = EpDispatchCombineConfig(data_type="bf16", rank=0, max_token_type_size=4, num_experts_per_token=2,
                                     **values)  # fmt: skip
    validate_config(config, 64)
    registry.parse_source(kernel_module_source(config, 64), new_context())  # raises on a refused attribute


# ---- the inter-node kernel types -----------------------------------------------------------------------

INTERNODE_TYPES = ("InterNode", "InterNodeV1", "InterNodeV1LL")


def internode(kind: str, **overrides) -> EpDispatchCombineConfig:
    """A valid inter-node config: W 8 in nodes of 4, 16 blocks (a multiple of W, as V0 needs)."""
    return config(**({"kernel_type": EpDispatchCombineKernelType[kind], "gpu_per_node": 4, "block_num": 16}
                     | overrides))  # fmt: skip


@pytest.mark.parametrize("kind", INTERNODE_TYPES)
@pytest.mark.parametrize("wave", [32, 64])
def test_the_internode_types_are_implemented_and_valid_configs_pass(kind, wave):
    from mori_compiler.ops.config import IMPLEMENTED

    assert EpDispatchCombineKernelType[kind] in IMPLEMENTED
    validate_config(internode(kind), wave)
    for world, gpus in ((8, 8), (8, 1), (16, 2), (32, 32), (1, 1)):  # one node, one PE per node, ...
        validate_config(internode(kind, world_size=world, gpu_per_node=gpus, block_num=2 * world), wave)
    validate_config(internode(kind, rdma_block_num=15, num_qp_per_pe=8), wave)


@pytest.mark.parametrize("kind", INTERNODE_TYPES)
@pytest.mark.parametrize(
    ("world", "gpus", "problems"),
    [
        (8, 3, ["gpu_per_node 3 must be a power of two", "gpu_per_node 3 must divide world_size 8 (whole nodes)"]),
        (12, 6, ["gpu_per_node 6 must be a power of two"]),  # whole nodes, but not a power of two
        (8, 16, ["gpu_per_node 16 must divide world_size 8 (whole nodes)"]),  # G > W
        (4, 8, ["gpu_per_node 8 must divide world_size 4 (whole nodes)"]),  # the default G on 4 PEs
        (12, 8, ["gpu_per_node 8 must divide world_size 12 (whole nodes)"]),
    ],
)  # fmt: skip
def test_internode_topology_problems(kind, world, gpus, problems):
    got = config_problems(internode(kind, world_size=world, gpu_per_node=gpus, block_num=4 * world), 64)
    assert got == [f"config.{p} ({kind} splits the PEs into nodes of gpu_per_node PEs)" for p in problems]


def test_the_topology_is_checked_only_for_the_internode_types():
    validate_config(config(world_size=4, gpu_per_node=3), 64)  # the intra-node kernels do not read it


@pytest.mark.parametrize("kind", INTERNODE_TYPES)
@pytest.mark.parametrize(("overrides", "needle"), [
    ({"rdma_block_num": 16}, "config.rdma_block_num 16 must be in [0, block_num=16) for {kind} (0: the op chooses; "
                             "the other blocks take the same-node role)"),
    ({"rdma_block_num": 40}, "config.rdma_block_num 40 must be in [0, block_num=16)"),
    ({"num_qp_per_pe": 0}, "config.num_qp_per_pe 0 must be >= 1 (allowed: [1, 8]) (queue pairs per peer of the "
                           "inter-node kernel types)"),
    ({"num_qp_per_pe": 9}, "config.num_qp_per_pe 9 exceeds 8"),
    ({"block_num": 1, "world_size": 1, "gpu_per_node": 1}, "config.block_num 1: {kind} needs >= 2 blocks (at least "
                                                           "one for the inter-node role and one for the same-node role)"),
])  # fmt: skip
def test_internode_grid_and_queue_pairs(kind, overrides, needle):
    assert needle.format(kind=kind) in rejected(**(dict(kernel_type=EpDispatchCombineKernelType[kind],
                                                        gpu_per_node=4, block_num=16) | overrides))  # fmt: skip


@pytest.mark.parametrize("blocks", [12, 20, 81])
def test_internode_v0_needs_a_grid_split_over_the_destination_pes(blocks):
    message = f"config.block_num {blocks} must be a multiple of world_size 8 for InterNode (V0 partitions its grid " \
              "per destination PE)"  # fmt: skip
    assert config_problems(internode("InterNode", block_num=blocks), 64) == [message]
    for kind in ("InterNodeV1", "InterNodeV1LL"):  # V1 and V1LL split the grid by role only
        validate_config(internode(kind, block_num=blocks), 64)


def test_a_kernel_type_without_kernels_is_refused(monkeypatch):
    from mori_compiler.ops import config as cfg

    monkeypatch.setattr(cfg, "IMPLEMENTED", tuple(k for k in cfg.IMPLEMENTED if k.name != "InterNodeV1LL"))
    assert ("config.kernel_type InterNodeV1LL is not implemented in this version (implemented: IntraNode, InterNode, "
            "InterNodeV1, AsyncLL, IntraNodeLL)") in rejected(kernel_type=EpDispatchCombineKernelType.InterNodeV1LL)
