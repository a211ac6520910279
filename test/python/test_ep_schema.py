"""The EP schema (mori_compiler/ep_schema.py): its tables are consistent, and its sizes are the formulas the
op, the kernels and the reference model used before it owned them."""

from __future__ import annotations

import itertools

import pytest

from mori_compiler import ep_schema as S
from mori_compiler.ops.config import EpDispatchCombineConfig, EpDispatchCombineKernelType as Kind
from mori_compiler.ops.reference import EpShape

IMPLEMENTED = tuple(Kind)  # every kernel type has kernels
INTRA = (Kind.IntraNode, Kind.IntraNodeLL, Kind.AsyncLL)  # the kinds whose buffers predate the schema


def _config(kind, *, W=4, H=7168, K=8, Er=8, M=128, cap=0, tok=2, scale_dim=56, scale_size=4, external=True):
    return EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=W, hidden_dim=H, scale_dim=scale_dim,
                                   scale_type_size=scale_size, max_token_type_size=tok, max_num_inp_token_per_rank=M,
                                   num_experts_per_rank=Er, num_experts_per_token=K, max_total_recv_tokens=cap,
                                   use_external_inp_buf=external, kernel_type=kind)  # fmt: skip


def _old_buffer_sizes(c, is_async: bool) -> tuple[dict[str, int], set[str]]:
    """The op's buffer sizes as written before the schema (ops/dispatch_combine.py at 021efdf), the oracle."""
    W, K, M, H = c.world_size, c.num_experts_per_token, c.max_num_inp_token_per_rank, c.hidden_dim
    cap = c.max_total_recv_tokens
    Rp = min(-(-cap // W), M) if cap > 0 else M
    R = W * Rp
    tok, sb = H * c.max_token_type_size, c.scale_dim * c.scale_type_size
    sizes = {"out_x": R * tok, "out_w": R * K * 4, "out_s": max(R * sb, 16), "out_idx": R * K * 4, "src_pos": R * 4,
             "fwd": M * K * 4, "total": 16, "status": 16, "reg_x": R * tok, "out_c": M * tok, "out_cw": M * K * 4,
             "zero_row": max(tok, 4 * K, 16)}  # fmt: skip
    zeroed = {"total", "status", "zero_row", "fwd"}
    if is_async:
        slots = 2 * W * Rp
        sizes |= {"a_rx": slots * tok, "a_rw": slots * K * 4, "a_rs": max(slots * sb, 16), "a_ridx": slots * K * 4,
                  "a_rpos": slots * 4, "a_cx": slots * tok, "a_cw": slots * K * 4, "rmap": R * 4, "a_cnt": 2 * W * 4,
                  "a_sig": 2 * W * 8, "a_csig": 2 * W * 8, "a_rounds": 32, "a_grid": 16}  # fmt: skip
        zeroed |= {"a_cnt", "a_sig", "a_csig", "a_rounds", "a_grid"}
    else:
        push = W * M if c.use_external_inp_buf else 1
        sizes |= {"slot_ctrs": 16, "signals": 8 * W, "dispatch_grid": 16, "round_ctr": 16, "dest_ctr": 4 * W,
                  "reg_w": R * K * 4, "stage_x": push * tok, "stage_w": push * K * 4, "combine_grid": 16,
                  "bar_slots": 8 * 1024 * W, "bar_epochs": 8 * 1024}  # fmt: skip
        zeroed |= {"slot_ctrs", "signals", "dispatch_grid", "round_ctr", "dest_ctr", "combine_grid", "bar_slots",
                   "bar_epochs"}  # fmt: skip
    return sizes, zeroed


@pytest.mark.parametrize("kind,cap,external,tok", itertools.product(INTRA, (0, 300), (True, False), (1, 2, 4)))
def test_buffer_sizes_are_the_old_formulas(kind, cap, external, tok):
    cfg = _config(kind, cap=cap, external=external, tok=tok)
    want, zeroed = _old_buffer_sizes(cfg, kind == Kind.AsyncLL)
    table = S.buffers_for(kind, S.EpSizes.from_config(cfg))
    assert [b.name for b, _ in table] == list(want)  # the allocation order too: every PE allocates alike
    assert {b.name: size for b, size in table} == want
    assert {b.name for b, _ in table if b.zeroed} == zeroed


def test_derived_sizes_and_encodings():
    cfg = _config(Kind.IntraNode, W=8, M=100, cap=500)
    s = S.EpSizes.from_config(cfg)
    assert s.max_recv_per_rank == 63 == cfg.max_recv_per_rank  # ceil(500 / 8), below M
    assert s.recv_capacity == 8 * 63 == cfg.max_recv
    assert s.send_stride == 800 and s.null_fwd == 8 * 504 and s.null_src == 8 * 800
    assert s.row_bytes == 7168 * 2 and s.scale_bytes == 56 * 4 and s.async_slots == 2 * 8 * 63
    assert s.decode_fwd(s.fwd_code(5, 17)) == (5, 17) and s.fwd_code(5, 17) == 5 * 504 + 17
    assert s.decode_src_pos(s.src_pos(3, 99)) == (3, 99) and s.src_pos(3, 99) == 3 * 800 + 99
    assert S.EpSizes.from_config(_config(Kind.IntraNode, M=100)).max_recv_per_rank == 100  # no cap: M
    assert S.async_dispatch_signal(2, 5) == (3 << 32) | 5


def test_reference_shape_reads_the_schema():
    shape = EpShape(world_size=8, num_experts_per_rank=4, num_experts_per_token=6, max_num_inp_token_per_rank=100,
                    max_total_recv_tokens=500)  # fmt: skip
    s = S.EpSizes.for_routing(8, 6, 4, 100, 500)
    assert (shape.S, shape.Rp, shape.R, shape.null_fwd, shape.null_src) == (
        s.send_stride, s.max_recv_per_rank, s.recv_capacity, s.null_fwd, s.null_src)
    assert shape.encode_fwd(3, 7) == s.fwd_code(3, 7) and shape.decode_src(s.src_pos(2, 9)) == (2, 9)


def test_every_buffer_is_used_by_some_kernel_and_every_buffer_parameter_exists():
    used = {p.buffer for sig in S.KERNELS.values() for p in sig.params if p.buffer is not None}
    names = {b.name for b in S.BUFFERS}
    assert used <= names, used - names
    assert used == names, names - used
    for sig in S.KERNELS.values():
        for p in sig.params:
            if p.buffer is not None:
                buffer = next(b for b in S.BUFFERS if b.name == p.buffer)
                assert sig.kinds <= buffer.kinds, (sig.family, p.name, buffer.name)  # allocated where launched


def test_every_signature_is_well_formed():
    # (checked here rather than at import: the schema is on the warm-start path)
    for sig in S.KERNELS.values():
        assert sig.leg in S.LEGS and sig.op and sig.kinds, sig.family
        assert len(set(sig.names)) == len(sig.names), sig.family
        for p in sig.params:
            assert p.type in S.PARAM_TYPES, (sig.family, p)
            assert not p.optional or p.buffer is not None, (sig.family, p)  # only a buffer may be given as null


def test_every_kernel_type_has_its_families():
    for kind in IMPLEMENTED:
        dispatch, combine = S.families(kind, "dispatch"), S.families(kind, "combine")
        assert dispatch and combine, kind
    assert [s.family for s in S.families(Kind.IntraNodeLL, "dispatch")] == ["dispatch_ll"]
    assert [s.family for s in S.families(Kind.AsyncLL, "combine")] == ["async_combine_send", "async_combine_recv"]
    for kind in (Kind.InterNode, Kind.InterNodeV1, Kind.InterNodeV1LL):
        assert [s.family for s in S.families(kind, "dispatch")] == ["inter_stage", "inter_dispatch"]
        assert [s.family for s in S.families(kind, "combine")] == ["inter_combine", "inter_combine_all"]
    assert S.combine_family(True) == "combine_pull" and S.combine_family(False) == "combine_push"
    assert S.OP_FAMILIES["dispatch_send"] == "async_dispatch_send" and "combine" not in S.OP_FAMILIES


def test_kernel_names_round_trip():
    for family, sig in S.KERNELS.items():
        for dtype in S.TOKEN_BYTES:
            assert S.kernel_signature(sig.kernel_name(dtype)) == (sig, dtype)
    with pytest.raises(KeyError):
        S.kernel_signature("ep_nope_bf16")


def test_arguments_by_name():
    sig = S.KERNELS["async_combine_recv"]
    args = sig.arguments(lambda buffer: f"&{buffer}", {"n": 5, "hidden": 64})
    assert args == ("&a_cx", "&a_cw", "&fwd", 5, 64, "&a_csig", "&a_rounds", "&a_grid", "&out_c", "&out_cw",
                    "&zero_row")  # fmt: skip
    assert sig.arguments(lambda buffer: f"&{buffer}", {"n": 5, "hidden": 64, "out_w": 0})[9] == 0  # optional: null
    with pytest.raises(ValueError, match="missing call arguments n; unknown arguments nn"):
        sig.arguments(lambda buffer: 0, {"nn": 1, "hidden": 64})
    with pytest.raises(ValueError, match="missing call arguments hidden"):
        sig.arguments(lambda buffer: 0, {"n": 1})
    with pytest.raises(ValueError, match="out_w may only be given as 0"):
        sig.arguments(lambda buffer: 0, {"n": 1, "hidden": 64, "out_w": 1234})


def test_leg_dtypes_follow_the_token_size():
    assert S.leg_dtypes("dispatch", 1) == ["fp8_e4m3fn", "fp8_e4m3fnuz"]
    assert S.leg_dtypes("dispatch", 2) == ["bf16", "fp8_e4m3fn", "fp8_e4m3fnuz"]
    assert S.leg_dtypes("combine", 4) == ["bf16", "f32"] and S.leg_dtypes("combine", 1) == []


def test_sizes_survive_the_op_level_ir():
    """config -> EpSizes -> the mori_ep attributes of the bundle source -> EpSizes of each kernel."""
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import mori_ep, registry
    from mori_compiler.ops.asyncll import AsyncLLOptions
    from mori_compiler.ops.bundle import kernel_module_source, kernel_plan

    for kind in IMPLEMENTED:
        cfg = _config(kind, cap=300, tok=4)
        if kind in S.INTERNODE:
            cfg.gpu_per_node = 2
        host = cfg.sizes
        with new_context() as ctx:
            module = registry.parse_source(kernel_module_source(cfg, 64, AsyncLLOptions()), ctx)
            ops = list(module.body.operations[0].regions[0].blocks[0].operations)
            assert len(ops) == len(kernel_plan(cfg))
            for op, planned in zip(ops, kernel_plan(cfg)):
                assert op.operation.name == f"mori_ep.{planned.signature.op}"
                dtype = op.operation.attributes["dtype"].value
                assert dtype == planned.dtype
                kernel = S.EpSizes.from_attributes(mori_ep.int_attributes(op.operation), dtype)
                assert [getattr(kernel, f) for f in S.SIZE_ATTRIBUTES] == [getattr(host, f) for f in S.SIZE_ATTRIBUTES]
                assert kernel.token_bytes == S.TOKEN_BYTES[dtype]
                assert kernel.scale_bytes == (host.scale_bytes if planned.signature.leg == "dispatch" else 0)
                assert (kernel.gpu_per_node, kernel.hop_size) == (host.gpu_per_node, host.hop_size)


def test_the_world_size_limit_is_one_lane_per_peer():
    # The schema is standard library only, so it cannot read the targets; the count handshake gives each
    # peer one lane of the narrowest wave.
    from mori_compiler.targets import MIN_WAVE_SIZE

    assert S.MAX_WORLD_SIZE == MIN_WAVE_SIZE


@pytest.mark.parametrize("kind,G,hops", [(Kind.InterNodeV1, 4, 2), (Kind.InterNodeV1LL, 2, 4), (Kind.InterNode, 4, 8),
                                         (Kind.InterNodeV1, 8, 1)])
def test_internode_sizes(kind, G, hops):
    """Hops (send targets) per kind, record and partial layouts, chunk counts of the landing regions."""
    cfg = _config(kind, M=100)
    cfg.world_size, cfg.gpu_per_node = 8, G
    s = S.EpSizes.from_config(cfg)
    assert (s.node_size, s.nodes, s.hops) == (G, 8 // G, hops)
    assert s.hop_size == (1 if kind == Kind.InterNode else G)
    row = s.hidden * s.token_bytes
    scales = -(-s.scale_bytes // 16) * 16  # padded: the ids after them stay 16-byte aligned
    assert s.record_bytes % 16 == 0 and row + scales + 8 * s.top_k + 4 <= s.record_bytes < row + scales + 8 * s.top_k + 20
    assert s.partial_bytes % 16 == 0 and row + 4 * s.top_k <= s.partial_bytes < row + 4 * s.top_k + 16
    assert s.chunk_rows == 128 and s.max_chunks == 4  # M 100: two 64-token chunks, four 32-token ones
    sizes = dict((b.name, n) for b, n in S.buffers_for(kind, s))
    assert sizes["i_land"] == 2 * hops * s.chunk_rows * s.record_bytes
    assert sizes["i_flag"] == 2 * hops * s.max_chunks * 8 and sizes["traffic"] == 8 * len(S.TRAFFIC_COUNTERS)
    assert "stage_x" not in sizes and "a_rx" not in sizes  # no push staging, no AsyncLL regions


def test_intranode_sizes_have_no_topology():
    s = S.EpSizes.from_config(_config(Kind.IntraNode))
    assert (s.gpu_per_node, s.hop_size, s.nodes, s.hops) == (0, 0, 1, 1)
    attrs = S.internode_attributes(Kind.InterNodeV1LL, 4, 2)
    assert attrs == {"gpu_per_node": 4, "hop_size": 4, "send_all": 1, "num_qp": 2}
    assert S.internode_attributes(Kind.InterNode, 4, 1)["hop_size"] == 1
