"""The EP op's trace option (``EpDispatchCombineOp(config, trace=True)``, ``ep_bundle(..., trace=)``) and
``kernel_trace``: every bad value is refused with an error naming it, before anything is compiled or launched.
Over the fakes of test_ep_internode_op.py (no GPU, no compiler run)."""

from __future__ import annotations

import pytest
from test_ep_internode_op import config, fakes  # noqa: F401 (fixture)

from mori_compiler.errors import MoriCompilerError
from mori_compiler.ops import EpDispatchCombineOp
from mori_compiler.ops.bundle import ep_bundle


def test_an_untraced_op_refuses_kernel_trace(fakes):  # noqa: F811
    op, _ = fakes(config("IntraNode", gpu_per_node=8))
    assert op.trace is False
    with pytest.raises(ValueError, match="built without trace points: EpDispatchCombineOp\\(config, trace=True\\)"):
        op.kernel_trace("ep_dispatch_bf16")


def test_trace_must_be_a_bool(fakes):  # noqa: F811
    fakes(config("IntraNode", gpu_per_node=8))
    with pytest.raises(ValueError, match="trace must be a bool, got 'yes'"):
        EpDispatchCombineOp(config("IntraNode", gpu_per_node=8), target="gfx942", trace="yes")
    with pytest.raises(MoriCompilerError, match="ep_bundle: trace must be a bool, got 1"):
        ep_bundle(config("IntraNode", gpu_per_node=8), "gfx942", virtual_pes=True, trace=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"kernel": "ep_nope_bf16"}, "no kernel 'ep_nope_bf16' in this op's bundle"),
    ({"kernel": "ep_dispatch_bf16", "block_num": 0}, "block_num must be a positive number of blocks per PE, got 0"),
    ({"kernel": "ep_dispatch_bf16", "block_num": True}, "block_num must be a positive number of blocks per PE"),
    ({"kernel": "ep_dispatch_bf16", "warp_per_block": 3}, "no bundle of 3 warps per block"),
])  # fmt: skip
def test_kernel_trace_refuses_what_the_op_has_not(fakes, kwargs, message):  # noqa: F811
    fakes(config("IntraNode", gpu_per_node=8))
    op = EpDispatchCombineOp(config("IntraNode", gpu_per_node=8), target="gfx942", trace=True)
    kernel = kwargs.pop("kernel")
    with pytest.raises(ValueError, match=message):
        op.kernel_trace(kernel, **kwargs)
