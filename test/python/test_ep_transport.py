"""Transport discipline of the inter-node EP kernels (docs/ep-protocols.md §16).

Every access of an inter-node kernel to a PE of another node must be a put / put-with-signal with a
queue-pair argument (``mori_comm.chunk_send``: RDMA when MORI's bitcode is linked); every P2P access
(row copies, reservations, ``mori_shmem.p``/``ptr``, handshakes, barriers) must name a PE of its own
node. Checked on the IR after ``mori-ep-to-kernels``, where the kernels are made of mori_comm blocks and
mori_shmem ops: the PE operand of every P2P op must come from ``mori_comm.node_pe`` (a PE of this node by
construction) or ``mori_shmem.my_pe``; the world-wide handshake and barrier are not used; and after
``mori-comm-to-calls`` the puts of chunk_send carry the queue pair the kernel computed (c % num_qp).
"""

from __future__ import annotations

import pytest

from mori_compiler._mlir import ir, new_context
from mori_compiler.dialects import registry
from mori_compiler.ops import EpDispatchCombineConfig, EpDispatchCombineKernelType as Kind
from mori_compiler.ops.bundle import kernel_module_source
from mori_compiler.pass_pipeline import build_pass_manager

INTERNODE = (Kind.InterNode, Kind.InterNodeV1, Kind.InterNodeV1LL)
# The PE operand of each op that addresses a PE (by operand index); chunk_send is the remote transport.
PE_OPERAND = {"mori_shmem.p": 2, "mori_shmem.ptr": 1, "mori_comm.row_copy": 3, "mori_comm.row_copy_to_peers": 3,
              "mori_comm.reserve_slot": 1, "mori_shmem.atomic_fetch_add": 2, "mori_shmem.atomic_add": 2,
              "mori_shmem.atomic_nonfetch": 2, "mori_shmem.putmem_nbi": 3}  # fmt: skip
REMOTE = {"mori_comm.chunk_send"}
# Ops without a PE operand (or whose peers are this node's by their lowering: node_* take G).
NO_PE = {"mori_shmem.my_pe", "mori_shmem.fence", "mori_shmem.quiet", "mori_shmem.wait_until", "mori_comm.node_pe",
         "mori_comm.grid_last_arrival", "mori_comm.trace",
         "mori_comm.grid_barrier", "mori_comm.accumulate_rows", "mori_comm.node_count_signal",
         "mori_comm.node_device_barrier", "mori_comm.chunk_wait"}  # fmt: skip
LOCAL_PE = {"mori_comm.node_pe", "mori_shmem.my_pe"}


def _config(kind: Kind, W: int = 8, G: int = 2) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=W, hidden_dim=256, scale_dim=4,
                                   scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=40,
                                   num_experts_per_rank=4, num_experts_per_token=4, kernel_type=kind,
                                   gpu_per_node=G, block_num=16)  # fmt: skip


def _expanded(cfg: EpDispatchCombineConfig, passes: str = "mori-ep-to-kernels{wave-size=32}"):
    ctx = new_context()
    module = registry.parse_source(kernel_module_source(cfg, 32), ctx, "input.mlir")
    build_pass_manager(f"builtin.module({passes})", ctx).run(module.operation)
    return ctx, module


def _walk(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


def _kernels(module):
    body = module.body.operations[0].regions[0].blocks[0]
    return {op.attributes["sym_name"].value: op.operation for op in body.operations if op.operation.name == "gpu.func"}


def _defining(value: ir.Value) -> str:
    owner = value.owner
    return "block argument" if isinstance(owner, ir.Block) else owner.name


def transport_problems(fn: ir.Operation) -> tuple[list[str], int]:
    """(the P2P accesses of ``fn`` that may reach another node, the number of remote sends)."""
    problems, remote = [], 0
    for op in _walk(fn):
        name = op.name
        if not name.startswith(("mori_shmem.", "mori_comm.")):
            continue
        if name in REMOTE:
            remote += 1
        elif name in PE_OPERAND:
            src = _defining(op.operands[PE_OPERAND[name]])
            if src not in LOCAL_PE:
                problems.append(f"{name} at {op.location}: PE from {src}")
        elif name not in NO_PE:
            problems.append(f"{name}: not classified (a P2P op? a remote one?)")
    return problems, remote


@pytest.mark.parametrize("kind", INTERNODE, ids=lambda k: k.name)
@pytest.mark.parametrize("W,G", [(8, 2), (16, 8)])
def test_every_off_node_access_is_a_put(kind, W, G):
    ctx, module = _expanded(_config(kind, W, G))
    with ctx:
        kernels = _kernels(module)
        assert len(kernels) == 16  # (two legs x (bf16, fp8 ocp, fp8 fnuz dispatch; bf16 combine) + ...) x 2 variants
        sends = {}
        for name, fn in kernels.items():
            problems, remote = transport_problems(fn)
            assert not problems, f"{name}: " + "; ".join(problems)
            sends[name.rsplit("_", 1)[0] if "fp8" not in name else name] = remote
        # The dispatch's chunked send, and the combine's partials back: through chunk_send only.
        assert sends["ep_inter_dispatch"] == 1 and sends["ep_inter_combine"] == 1
        assert sends["ep_inter_stage"] == 0 and sends["ep_inter_combine_all"] == 0


def test_the_check_catches_a_world_wide_peer(monkeypatch):
    """A P2P store to a PE computed from an expert id (any node) is reported."""
    from mori_compiler.passes import ep_internode_kernels

    monkeypatch.setattr(ep_internode_kernels, "_peer", lambda f, topo: (lambda pe: pe))
    ctx, module = _expanded(_config(Kind.InterNodeV1))
    with ctx:
        problems, _ = transport_problems(_kernels(module)["ep_inter_dispatch_bf16"])
    assert any("mori_comm.row_copy_to_peers" in p for p in problems)
    assert any("mori_comm.reserve_slot" in p for p in problems)


def test_the_chunk_puts_carry_the_queue_pair():
    """After mori-comm-to-calls, chunk_send's puts and its signal use the helper's qp argument, which the
    kernels pass as chunk % num_qp (a queue pair per chunk, as MORI's)."""
    cfg = _config(Kind.InterNodeV1)
    cfg.num_qp_per_pe = 4
    ctx, module = _expanded(cfg, "mori-ep-to-kernels{wave-size=32}, mori-comm-to-calls{wave-size=32}")
    with ctx:
        body = module.body.operations[0].regions[0].blocks[0]
        helper = next(op.operation for op in body.operations if op.operation.name == "func.func"
                      and op.attributes["sym_name"].value == "__mori_comm_chunk_send")  # fmt: skip
        qp_arg = helper.regions[0].blocks[0].arguments[7]
        puts = [op for op in _walk(helper) if op.name in ("mori_shmem.putmem_nbi", "mori_shmem.putmem_nbi_signal")]
        assert {op.name for op in puts} == {"mori_shmem.putmem_nbi", "mori_shmem.putmem_nbi_signal"}
        assert all(op.operands[len(op.operands) - 1] == qp_arg for op in puts)
        text = str(_kernels(module)["ep_inter_dispatch_bf16"])
        assert "arith.remui" in text and "call @__mori_comm_chunk_send" in text


@pytest.mark.parametrize("top_k,scale_bytes", [(1, 0), (4, 224), (5, 3), (8, 56), (9, 16), (31, 1)])
def test_record_fields_are_aligned(top_k, scale_bytes):
    """Every field of an inter-node record sits where its accesses need it: the row and the scales at
    16 bytes (vector copies), ids, weights and the position at 4; the fields do not overlap and fit."""
    from mori_compiler.passes.ep_internode_kernels import _record
    from mori_compiler.passes.ep_kernel_parts import EpKernelConfig

    cfg = EpKernelConfig(world_size=8, hidden=2064, dtype="bf16", top_k=top_k, experts_per_rank=4,
                         max_tokens_per_rank=37, max_recv_per_rank=37, wave_size=32, scale_bytes=scale_bytes,
                         gpu_per_node=2, hop_size=2)  # fmt: skip
    rec = _record(cfg)
    row = cfg.row_bytes
    assert rec.scales == row and rec.scales % 16 == 0 and rec.ids % 16 == 0
    assert rec.ids >= rec.scales + scale_bytes and rec.weights == rec.ids + 4 * top_k
    assert rec.position == rec.weights + 4 * top_k and rec.position % 4 == 0
    assert rec.position + 4 <= rec.size == cfg.sizes.record_bytes and rec.size % 16 == 0
