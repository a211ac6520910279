"""The op in AUTO launch mode (MORI_EP_LAUNCH_CONFIG_MODE=AUTO), over the fakes of test_ep_internode_op.py:
a bundle and launches per warp count the tables may pick, over one set of buffers; each call's grid and
warps from the tables (winning over the call's arguments, as MORI's); an AsyncLL receive runs with its send's
geometry; the inter-node role's blocks from the rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mori_compiler.ep_schema import kernel_signature
from mori_compiler.ops import auto_launch, tuning
from test_ep_internode_op import FAKE_TORCH, H, K, W, _dispatch, config, fakes, tensor  # noqa: F401 (fixture)


def _table(directory, kind: str, phase: str, rules: list[dict]):
    path = directory / tuning.file_name("gfx942", "h200", kind, W, phase)
    path.write_text(json.dumps(dict(version="1.0", gpu_arch="gfx942", gpu_model="h200", kernel_type=kind, ep_size=W,
                                    phase=phase, rules=rules)))  # fmt: skip
    return path


def _rule(tokens: int, blocks: int, warps: int, rdma: int = 0, **more) -> dict:
    return dict(dtype="bf16", num_tokens=tokens, hidden_dim=H, block_num=blocks, rdma_block_num=rdma,
                warp_per_block=warps, **more)


def _dispatch_args():
    """(inputs, weights, scales, ids) of a small dispatch on every PE (3 tokens each)."""
    xs = [tensor(np.zeros((3, H)), "bfloat16") for _ in range(W)]
    ws = [tensor(np.zeros((3, K)), "float32") for _ in range(W)]
    ids = [tensor(np.zeros((3, K)), "int32") for _ in range(W)]
    return xs, ws, None, ids


def _launches(op) -> list[tuple[str, tuple, tuple, list[dict]]]:
    """Every launch of every warp count's kernels: (name, grid, block, per PE its arguments by name)."""
    out = []
    for launches in op._launches.values():
        for name, args, grid, block, _ in launches.kernels.launches:
            sig, _ = kernel_signature(name)
            out.append((name, grid, block, [dict(zip(sig.names, a)) for a in args]))
        launches.kernels.launches.clear()
    return out


@pytest.fixture
def auto_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("MORI_EP_LAUNCH_CONFIG_MODE", "AUTO")
    monkeypatch.setattr(FAKE_TORCH.cuda, "get_device_name", lambda device=None: "NVIDIA H200", raising=False)
    monkeypatch.setattr(auto_launch, "coresident_blocks", lambda kernels, names, threads, pes: 40)
    return tmp_path


@pytest.mark.parametrize("kind", ["InterNodeV1", "IntraNode", "AsyncLL"])
def test_each_call_takes_the_tables_geometry(fakes, auto_mode, monkeypatch, kind):
    rdma = 2 if kind == "InterNodeV1" else 0
    zero_copy = kind != "AsyncLL"
    combine_warps = 2 if zero_copy else 4
    dispatch = _table(auto_mode, kind, "dispatch", [_rule(4, 8, 4, rdma), _rule(8, 12, 16, rdma)])
    combine = _table(auto_mode, kind, "combine", [_rule(8, 6, combine_warps, rdma, zero_copy=zero_copy,
                                                        quant_type="none")])  # fmt: skip
    monkeypatch.setenv("MORI_EP_TUNING_CONFIG", f"{dispatch}:{combine}")
    op, _ = fakes(config(kind, use_external_inp_buf=False, **({} if kind == "InterNodeV1" else {"gpu_per_node": 8})))
    assert sorted(op._launches) == op.auto.warp_counts() and {4, 16, combine_warps} <= set(op._launches)
    _dispatch(op, ns=(3, 2, 0, 4), block_num=99, warp_per_block=7)  # AUTO wins over the call's geometry
    assert {(grid, block) for _, grid, block, _ in _launches(op)} == {((8, 1), (4 * 64, 1, 1))}
    _dispatch(op, ns=(3, 2, 0, 5))  # 5 tokens: the 8-token rule
    launched = _launches(op)
    assert {(grid, block) for _, grid, block, _ in launched} == {((12, 1), (16 * 64, 1, 1))}
    if kind == "InterNodeV1":  # the rule's rdma_block_num reaches the inter-node role
        assert {a["rdma_blocks"] for name, _, _, args in launched if name.startswith("ep_inter_dispatch")
                for a in args} == {2}  # fmt: skip
    ys = [tensor(np.zeros((op.config.max_recv, H)), "bfloat16") for _ in range(W)]
    inputs = ys if kind == "AsyncLL" else op.get_registered_combine_input_buffer(FAKE_TORCH.bfloat16)
    op.combine(inputs, None, [tensor(np.zeros((n, K)), "int32") for n in (3, 2, 0, 5)])
    launched = _launches(op)
    assert launched and {(grid, block) for _, grid, block, _ in launched} == {((6, 1), (combine_warps * 64, 1, 1))}


def test_manual_mode_keeps_one_bundle_and_refuses_another_warp_count(fakes, monkeypatch):
    monkeypatch.delenv("MORI_EP_LAUNCH_CONFIG_MODE", raising=False)
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    assert op.auto is None and list(op._launches) == [op.config.warp_num_per_block]
    with pytest.raises(ValueError, match="warp_per_block 7: the kernels were compiled for 8"):
        _dispatch(op, warp_per_block=7)
    # The receive halves check it too (AsyncLL).
    asyncll, _ = fakes(config("AsyncLL", gpu_per_node=8))
    asyncll.dispatch_send(*_dispatch_args(), block_num=4)
    with pytest.raises(ValueError, match="warp_per_block 7: the kernels were compiled for 8"):
        asyncll.dispatch_recv(warp_per_block=7)


def test_a_rule_the_op_cannot_run_is_refused_at_construction(fakes, auto_mode, monkeypatch):
    bad = _table(auto_mode, "IntraNode", "dispatch", [_rule(4, 2000, 4)])  # past MAX_BLOCKS
    monkeypatch.setenv("MORI_EP_TUNING_CONFIG", str(bad))
    with pytest.raises(tuning.TuningTableError, match=r"sm_90|gfx942_h200_IntraNode_ep4_dispatch.json.*rule"):
        fakes(config("IntraNode", gpu_per_node=8))


def test_a_process_per_pe_combines_with_the_grid_every_pe_shares(fakes, auto_mode, monkeypatch):
    # With one process per PE the token counts differ per PE; the combine's device barrier pairs block b of
    # every PE, so its geometry must not follow the local count: the rule of the config's count is taken.
    dispatch = _table(auto_mode, "IntraNode", "dispatch", [_rule(4, 8, 4), _rule(8, 12, 16)])
    combine = _table(auto_mode, "IntraNode", "combine", [_rule(4, 6, 4, zero_copy=False, quant_type="none"),
                                                         _rule(8, 10, 8, zero_copy=False, quant_type="none")])  # fmt: skip
    monkeypatch.setenv("MORI_EP_TUNING_CONFIG", f"{dispatch}:{combine}")
    op, _ = fakes(config("IntraNode", gpu_per_node=8, rank=1), virtual=False, rank=1)
    x, w, idx = (tensor(np.zeros((3, n)), dt) for n, dt in ((H, "bfloat16"), (K, "float32"), (K, "int32")))
    op.dispatch(x, w, None, idx)
    assert {(grid, block) for _, grid, block, _ in _launches(op)} == {((8, 1, 1), (4 * 64, 1, 1))}  # its own count
    op.combine(tensor(np.zeros((2, H)), "bfloat16"), None, idx)
    assert {(grid, block) for _, grid, block, _ in _launches(op)} == {((10, 1, 1), (8 * 64, 1, 1))}  # M = 8's rule
