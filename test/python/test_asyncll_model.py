"""AsyncLL (issue 5), CPU side: notification-option resolution and the reference receive layout."""

import numpy as np
import pytest

from mori_compiler.ops.asyncll import AsyncLLOptionError, AsyncLLOptions, AsyncLLPhaseError, PhaseTracker, resolve
from mori_compiler.ops.reference import (EpShape, asyncll_layout, check_asyncll_layout, expected_recv_counts,
                                         make_routing, make_token_counts)

# ---- options ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("early, fused, mode", [("0", "0", "count_after_quiet"), ("1", "0", "early_notify"),
                                                 ("1", "1", "early_notify_fused_recv")])  # fmt: skip
@pytest.mark.parametrize("skip", [None, "0", "1"])
def test_options_resolve_each_allowed_mode(early, fused, mode, skip):
    env = {"MORI_ASYNCLL_EARLY_NOTIFY": early, "MORI_ASYNCLL_FUSED_RECV": fused}
    if skip is not None:
        env["MORI_ASYNCLL_SKIP_RESET"] = skip
    opts = resolve(env)
    assert opts.mode == mode
    assert opts.early_notify == (early == "1") and opts.fused_recv == (fused == "1")
    assert opts.skip_reset == (skip == "1")
    assert opts.as_dict()["mode"] == mode


def test_options_default_when_unset():
    assert resolve({}) == AsyncLLOptions()
    assert resolve({}).mode == "count_after_quiet"


@pytest.mark.parametrize("var", ["MORI_ASYNCLL_EARLY_NOTIFY", "MORI_ASYNCLL_FUSED_RECV", "MORI_ASYNCLL_SKIP_RESET"])
@pytest.mark.parametrize("bad", ["2", "true", "", "-1", "01x"])
def test_options_reject_values_other_than_0_1(var, bad):
    with pytest.raises(AsyncLLOptionError, match=rf"{var}=.*use 0 or 1"):
        resolve({var: bad})


def test_fused_recv_without_early_notify_is_rejected():
    with pytest.raises(AsyncLLOptionError, match="FUSED_RECV=1 needs MORI_ASYNCLL_EARLY_NOTIFY=1"):
        resolve({"MORI_ASYNCLL_FUSED_RECV": "1"})


def test_overrides_win_and_are_validated():
    assert resolve({"MORI_ASYNCLL_EARLY_NOTIFY": "1"}, early_notify=False).mode == "count_after_quiet"
    with pytest.raises(AsyncLLOptionError, match="unknown AsyncLL option"):
        resolve({}, early=True)
    with pytest.raises(AsyncLLOptionError, match="use 0 or 1"):
        resolve({}, early_notify=2)


def test_the_transport_is_p2p_and_the_copy_engine_ones_are_refused_with_their_reason():
    assert resolve({}).async_ll_transport == "p2p" and resolve({}, async_ll_transport="p2p").as_dict()[
        "async_ll_transport"] == "p2p"  # fmt: skip
    with pytest.raises(AsyncLLOptionError, match=r"async_ll_transport=.copy_engine. is not available .* \(measured on "
                                                 r"the H200: 1.01-1.06x"):  # fmt: skip
        resolve({}, async_ll_transport="copy_engine")
    with pytest.raises(AsyncLLOptionError, match=r"'sdma' is not available .* exports no SDMA completion wait"):
        resolve({"MORI_ENABLE_SDMA": "1"})  # MORI's switch asks for it
    assert resolve({"MORI_ENABLE_SDMA": "0"}).async_ll_transport == "p2p"
    with pytest.raises(AsyncLLOptionError, match=r"MORI_ENABLE_SDMA='yes' is not allowed"):
        resolve({"MORI_ENABLE_SDMA": "yes"})
    with pytest.raises(AsyncLLOptionError, match=r"async_ll_transport='dma' is not allowed; allowed: 'p2p', "
                                                 r"'copy_engine', 'sdma'"):  # fmt: skip
        AsyncLLOptions(async_ll_transport="dma")


def test_resolved_options_are_a_snapshot(monkeypatch):
    monkeypatch.setenv("MORI_ASYNCLL_EARLY_NOTIFY", "1")
    first = resolve()
    monkeypatch.setenv("MORI_ASYNCLL_EARLY_NOTIFY", "0")
    second = resolve()
    assert first.mode == "early_notify" and second.mode == "count_after_quiet"  # the first op keeps its mode
    with pytest.raises(Exception):  # frozen: nothing can change a resolved plan
        first.early_notify = False


# ---- reference layout ------------------------------------------------------------------------------------


def _src_pos_from_layout(layout, rank, shape, R):
    pos = np.full(R, shape.null_src, dtype=np.int64)
    for seg in layout[rank]:
        for i, tok in enumerate(seg.tokens):
            pos[seg.start + i] = shape.encode_src(seg.src_rank, tok)
    return pos


@pytest.mark.parametrize("W, M, seed", [(2, 1, 0), (4, 64, 1), (8, 128, 2)])
def test_layout_groups_by_source_in_pe_order(W, M, seed):
    shape = EpShape(W, 4, min(4, 4 * W), M)
    counts = make_token_counts(shape, seed)
    counts[0] = 0  # a zero-token peer still owns an (empty) segment on every receiver
    idx = make_routing("random", counts, shape, seed)
    layout = asyncll_layout(idx, shape)
    totals = expected_recv_counts(idx, shape)
    for rank in range(W):
        segs = layout[rank]
        assert [s.src_rank for s in segs] == list(range(W))
        assert segs[0].start == 0 and segs[-1].stop == totals[rank]
        assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))  # exclusive prefix sum
        assert segs[0].tokens == []
        for seg in segs:
            assert seg.tokens == sorted(seg.tokens)
            for tok in seg.tokens:  # every row really routes to this rank
                pes = {int(e) // shape.Er for e in idx[seg.src_rank][tok] if 0 <= e < shape.num_experts}
                assert rank in pes
        check_asyncll_layout(rank, _src_pos_from_layout(layout, rank, shape, shape.R), totals[rank], layout, shape)


def test_layout_checker_catches_swaps_and_wrong_counts():
    shape = EpShape(4, 2, 3, 32)
    idx = make_routing("random", [32] * 4, shape, 7)
    layout = asyncll_layout(idx, shape)
    rank = 1
    total = layout[rank][-1].stop
    pos = _src_pos_from_layout(layout, rank, shape, shape.R)
    with pytest.raises(AssertionError, match="total_recv"):
        check_asyncll_layout(rank, pos, total - 1, layout, shape)
    seg = next(s for s in layout[rank] if len(s.tokens) >= 2)
    within = pos.copy()
    within[[seg.start, seg.start + 1]] = within[[seg.start + 1, seg.start]]
    with pytest.raises(AssertionError, match="sender's order"):
        check_asyncll_layout(rank, within, total, layout, shape)
    check_asyncll_layout(rank, within, total, layout, shape, strict_order=False)  # same set: tolerated
    a, b = [s for s in layout[rank] if s.tokens][:2]
    across = pos.copy()
    across[[a.start, b.start]] = across[[b.start, a.start]]
    with pytest.raises(AssertionError, match="belong to PE"):
        check_asyncll_layout(rank, across, total, layout, shape, strict_order=False)


# ---- the mode in the IR ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"MORI_ASYNCLL_EARLY_NOTIFY": "1"},
                                 {"MORI_ASYNCLL_EARLY_NOTIFY": "1", "MORI_ASYNCLL_FUSED_RECV": "1"}])  # fmt: skip
def test_resolved_mode_verifies_on_every_half(env):
    """The op's AsyncLL kernel module carries the resolved mode on every half, and it verifies."""
    from mori_compiler._mlir import ir
    from mori_compiler.dialects.registry import parse_source
    from mori_compiler.ops.dispatch_combine import (EpDispatchCombineConfig, EpDispatchCombineKernelType,
                                                    kernel_module_source)  # fmt: skip

    cfg = EpDispatchCombineConfig(data_type=None, rank=0, world_size=4, hidden_dim=1024, scale_dim=0, scale_type_size=0,
                                  max_token_type_size=2, max_num_inp_token_per_rank=16, num_experts_per_rank=2,
                                  num_experts_per_token=2, kernel_type=EpDispatchCombineKernelType.AsyncLL)  # fmt: skip
    options = resolve(env)
    module = parse_source(kernel_module_source(cfg, 64, options), ir.Context())
    printed = str(module)
    # Within 2-byte tokens: dispatch bf16 and both fp8 kinds, combine bf16; each for the config's hidden
    # and for any hidden.
    counts = {half: printed.count(f'"mori_ep.{half}"') for half in ("dispatch_send", "dispatch_recv", "combine_send",
                                                                    "combine_recv")}  # fmt: skip
    assert counts == {"dispatch_send": 6, "dispatch_recv": 6, "combine_send": 2, "combine_recv": 2}
    assert printed.count("any_hidden = 1 : i64") == 8
    for key, value in options.ir_attributes().items():
        assert printed.count(f"{key} = {value} : i64") == 16


# ---- phase order -----------------------------------------------------------------------------------------


def _run(tracker, leg, phase):
    getattr(tracker, f"before_{phase}")(leg)
    getattr(tracker, f"after_{phase}")(leg)


def test_phase_tracker_accepts_the_normal_order_repeatedly():
    t = PhaseTracker()
    for _ in range(3):
        _run(t, "dispatch", "send")
        assert t.pending("dispatch")
        _run(t, "dispatch", "recv")
        _run(t, "combine", "send")
        _run(t, "combine", "recv")
        assert not t.pending("dispatch") and not t.pending("combine")


@pytest.mark.parametrize("calls, message", [
    ([("dispatch", "recv")], "dispatch_recv called without a pending dispatch_send"),
    ([("dispatch", "send"), ("dispatch", "send")], "dispatch_send called twice"),
    ([("combine", "send")], "combine_send called before a dispatch completed"),
    ([("dispatch", "send"), ("dispatch", "recv"), ("dispatch", "send"), ("combine", "send")],
     "combine_send called while dispatch_send is pending"),
    ([("dispatch", "send"), ("dispatch", "recv"), ("combine", "recv")], "combine_recv called without a pending"),
    ([("dispatch", "send"), ("dispatch", "recv"), ("combine", "send"), ("combine", "send")],
     "combine_send called twice"),
])  # fmt: skip
def test_phase_tracker_refuses_out_of_order_calls(calls, message):
    t = PhaseTracker()
    *ok, (leg, phase) = calls
    for c in ok:
        _run(t, *c)
    with pytest.raises(AsyncLLPhaseError, match=message):
        getattr(t, f"before_{phase}")(leg)


def test_phase_tracker_reset_and_unknown_leg():
    t = PhaseTracker()
    _run(t, "dispatch", "send")
    t.reset()
    with pytest.raises(AsyncLLPhaseError):
        t.before_recv("dispatch")
    with pytest.raises(ValueError, match="unknown AsyncLL leg 'gather'"):
        t.before_send("gather")
