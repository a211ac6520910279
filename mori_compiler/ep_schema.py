"""The EP schema: the one owner of what the EP compiler, runtime, op and reference model must agree on.

Standard library only (the runtime and the reference model import it without MLIR). It holds:

* the token dtypes and the limits that size device structures (``MAX_BLOCKS``, ``MAX_WORLD_SIZE``);
* ``EpSizes``: the sizes a configuration derives (S, R, Rp, the null forward code, ...), with the index
  encodings the kernels write and the host and the reference model read; ``SIZE_ATTRIBUTES``, the
  mori_ep op attributes that carry them from the op (``EpSizes.from_config``) to the kernel generators
  (``EpSizes.from_attributes``);
* ``BUFFERS``: the symmetric buffer table (name, size rule, zeroed at allocation, kernel types using it),
  ``buffers_for(kind, sizes)`` the buffers of one kernel type;
* ``KERNELS``: every EP kernel family's signature as named, typed parameters, each either a symmetric
  buffer (the host passes that buffer's address on the launching PE) or a call argument (the host passes
  it by name), with the mori_ep op it comes from, its leg and the kernel types launching it
  (``families(kind, leg)``). Kernel generators build their ``gpu.func`` headers from it, the bundle
  records the names, and the op's launches are checked against the bundle by name.

Index encodings (docs/ep-protocols.md):

* forward map entry of (token t, k): ``pe * R + slot`` for the slot reserved on destination ``pe``, or
  ``W * R`` (``null_fwd``) when the expert id was invalid, a duplicate destination, or the receiver was
  full;
* source position of a received row: ``src_pe * S + token`` with ``S = W * M``;
* AsyncLL receive map: ``src_pe * Rp + i`` for the i-th record from ``src_pe``; its dispatch signal of
  round r is ``(r + 1) << 32 | count`` and its combine signal ``r + 1`` (epoch-tagged, never reset).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from collections import namedtuple

from mori_compiler.wire_quant import wire_row_bytes

TOKEN_BYTES = {"bf16": 2, "f32": 4, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1}
DISPATCH_DTYPES = ("bf16", "f32", "fp8_e4m3fn", "fp8_e4m3fnuz")
COMBINE_DTYPES = ("bf16", "f32")
# Dispatch is a byte mover: a payload dtype without kernels of its own moves with the kernels of a dtype of
# its element size. fp4 x2 (torch.float4_e2m1fn_x2): one byte holds two E2M1 values, a row of hidden / 2
# such elements (MORI's convention), moved by the 1-byte kernels.
DISPATCH_PAYLOAD_KERNELS = {"fp4_e2m1fn_x2": "fp8_e4m3fn"}
DISPATCH_INPUT_DTYPES = DISPATCH_DTYPES + tuple(DISPATCH_PAYLOAD_KERNELS)
MAX_BLOCKS = 1024  # device-barrier epoch slots per PE: the largest grid a combine may use
MAX_WORLD_SIZE = 32  # the count handshake gives each peer one lane of a wave: targets.MIN_WAVE_SIZE (a test)
# Upper bounds of the config, and why (ops/config.py checks the config against them, dialects/mori_ep.py
# the op attributes):
MAX_HIDDEN_DIM = 2**16  # a token row is at most 256 KiB (f32); the largest MoE models use 7168
MAX_TOKENS_PER_RANK = 2**16  # receive slots = world_size * tokens <= 2**21, times top-k < 2**27: the
#                              kernels' token, slot and (token, k) indices are 32-bit
MAX_EXPERTS_PER_RANK = 2**12  # expert ids (world_size * experts <= 2**17) index per-expert counters
MAX_SCALE_DIM = 2**16  # scales of one token: at most one per element of a MAX_HIDDEN_DIM row
MAX_SCALE_TYPE_SIZE = 8  # bytes of one scale element
MAX_QP_PER_PE = 8  # queue pairs per peer of the inter-node sends (chunk c uses c % num_qp): a bound we chose,
#                    above the 1 or 2 of MORI's configurations (MORI clamps the value to its shmem's setting)


def dtypes_within(dtypes: tuple[str, ...], max_token_bytes: int) -> list[str]:
    """The dtypes of ``dtypes`` whose elements fit in ``max_token_bytes`` (the token buffers' element size)."""
    return [d for d in dtypes if TOKEN_BYTES[d] <= max_token_bytes]


class EpDispatchCombineKernelType(enum.IntEnum):
    """MORI's kernel types (values as MORI's enum); all are implemented (the inter-node ones: docs/ep-protocols.md §16)."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5


KernelType = EpDispatchCombineKernelType


# The mori_ep attributes every EP op carries that are the EpSizes fields of the same name: the op's module
# plan sets them (ops/bundle.py module_plan), the kernel generators read them back (EpSizes.from_attributes).
SIZE_ATTRIBUTES = ("world_size", "hidden", "top_k", "experts_per_rank", "max_tokens_per_rank", "max_recv_per_rank")


class EpSizes(namedtuple("EpSizes", ("world_size", "hidden", "top_k", "experts_per_rank", "max_tokens_per_rank",
                                     "max_recv_per_rank", "token_bytes", "scale_bytes", "external_input",
                                     "gpu_per_node", "hop_size", "combine_quant", "scale_blocks"),
                         defaults=(2, 0, True, 0, 0, "none", 0))):  # fmt: skip
    """The compile-time sizes of one EP configuration, in the kernels' terms.

    W world_size, H hidden, K top_k, Er experts_per_rank, M max_tokens_per_rank, Rp max_recv_per_rank
    (receive slots per source PE), token_bytes (bytes per element of a token row: the widest token dtype
    for the host, which sizes the buffers by it; the kernel's dtype for a kernel, whose rows are packed
    at its own dtype), scale_bytes (bytes of one token's scales), external_input (the push combine's
    staging buffers are sized only when used); for the inter-node kernel types, gpu_per_node (G; 0: one
    node) and hop_size (the PEs one inter-node send reaches through one target: G for InterNodeV1/V1LL,
    whose target is the rail-aligned proxy of a node, 1 for InterNode, which sends to each remote PE;
    0: no inter-node sends); combine_quant and scale_blocks, the bf16 combine's wire quantization
    (mori_compiler/wire_quant.py; its wire rows size the push staging and AsyncLL combine rows, see
    ``combine_row_bytes``). An immutable tuple (``collections.namedtuple``: cheaper to
    import than a dataclass or ``typing``; the schema is on the warm-start path).
    """

    __slots__ = ()

    @classmethod
    def from_config(cls, cfg, scale_blocks: int = 0) -> "EpSizes":
        """From a MORI ``EpDispatchCombineConfig`` (duck-typed); ``scale_blocks``: a blockwise
        ``quant_type``'s scale blocks per row (read from the environment by ops/config.py)."""
        return cls(world_size=cfg.world_size, hidden=cfg.hidden_dim, top_k=cfg.num_experts_per_token,
                   experts_per_rank=cfg.num_experts_per_rank, max_tokens_per_rank=cfg.max_num_inp_token_per_rank,
                   max_recv_per_rank=recv_per_rank(cfg.max_num_inp_token_per_rank, cfg.max_total_recv_tokens,
                                                   cfg.world_size),
                   token_bytes=cfg.max_token_type_size, scale_bytes=cfg.scale_dim * cfg.scale_type_size,
                   external_input=bool(cfg.use_external_inp_buf),
                   **internode_sizes(KernelType(cfg.kernel_type), cfg.gpu_per_node),
                   combine_quant=getattr(cfg, "quant_type", "none"), scale_blocks=scale_blocks)  # fmt: skip

    @classmethod
    def from_attributes(cls, values: dict, dtype: str) -> "EpSizes":
        """Of one kernel: from its mori_ep op's attribute values by name (``SIZE_ATTRIBUTES``, ``scale_bytes``,
        the topology, the string ``quant`` and ``scale_blocks``: what the generators' EpKernelConfig holds) and
        its dtype."""
        return cls(**{name: values[name] for name in SIZE_ATTRIBUTES}, token_bytes=TOKEN_BYTES[dtype],
                   scale_bytes=values.get("scale_bytes", 0), gpu_per_node=values.get("gpu_per_node", 0),
                   hop_size=values.get("hop_size", 0), combine_quant=values.get("quant", "none"),
                   scale_blocks=values.get("scale_blocks", 0))  # fmt: skip

    @classmethod
    def for_routing(cls, world_size: int, top_k: int, experts_per_rank: int, max_tokens_per_rank: int,
                    max_total_recv: int = 0) -> "EpSizes":
        """The sizes routing and the index encodings need (the reference model): no token rows (hidden 0)."""
        return cls(world_size=world_size, hidden=0, top_k=top_k, experts_per_rank=experts_per_rank,
                   max_tokens_per_rank=max_tokens_per_rank,
                   max_recv_per_rank=recv_per_rank(max_tokens_per_rank, max_total_recv, world_size))  # fmt: skip

    @property
    def send_stride(self) -> int:  # S = W * M: the source-position encoding's stride
        return self.world_size * self.max_tokens_per_rank

    @property
    def recv_capacity(self) -> int:  # R = W * Rp: rows a PE can receive per dispatch
        return self.world_size * self.max_recv_per_rank

    @property
    def null_fwd(self) -> int:  # the forward-map code of a slot that sent nothing
        return self.world_size * self.recv_capacity

    @property
    def null_src(self) -> int:  # the source-position code that decodes to pe == W
        return self.world_size * self.send_stride

    @property
    def row_bytes(self) -> int:  # one token row at the widest dtype
        return self.hidden * self.token_bytes

    @property
    def combine_row_bytes(self) -> int:
        """One push-staging / AsyncLL combine row: the widest token row, or a wider wire row of the bf16
        combine's quantization (small rows: the block scales can outweigh the payload)."""
        if self.combine_quant == "none":
            return self.row_bytes
        return max(self.row_bytes, wire_row_bytes(self.combine_quant, self.hidden, self.scale_blocks))

    @property
    def async_slots(self) -> int:  # AsyncLL records per PE: per round parity (2) and source PE (W), Rp each
        return 2 * self.world_size * self.max_recv_per_rank

    # ---- inter-node (docs/ep-protocols.md §16) ----
    @property
    def node_size(self) -> int:  # G (the whole world when no topology is set)
        return self.gpu_per_node or self.world_size

    @property
    def nodes(self) -> int:  # N = W / G
        return self.world_size // self.node_size

    @property
    def hop_pes(self) -> int:  # PEs one inter-node send target serves (hop_size; G when unset)
        return self.hop_size or self.node_size

    @property
    def hops(self) -> int:  # inter-node send targets a PE can have: W / hop_pes (N for V1, W for V0)
        return self.world_size // self.hop_pes

    @property
    def chunk_rows(self) -> int:  # records of one source's landing region: M rounded up to whole chunks
        return -(-self.max_tokens_per_rank // MAX_CHUNK) * MAX_CHUNK

    @property
    def max_chunks(self) -> int:  # chunk signals per source: chunks of the smallest size
        return -(-self.max_tokens_per_rank // MIN_CHUNK)

    @property
    def record_bytes(self) -> int:
        """One token's inter-node record: row | scales (padded to 16 bytes) | K expert ids (i32) | K
        weights (f32) | source position (i32), padded to 16 bytes (docs/ep-protocols.md §16)."""
        return _round16(self.row_bytes + _round16(self.scale_bytes) + 8 * self.top_k + 4)

    @property
    def partial_bytes(self) -> int:  # one combine partial: row | K weights (f32), padded to 16 bytes
        return _round16(self.row_bytes + 4 * self.top_k)

    def fwd_code(self, pe: int, slot: int) -> int:
        return pe * self.recv_capacity + slot

    def decode_fwd(self, code: int) -> tuple[int, int]:  # (pe, slot)
        return divmod(code, self.recv_capacity)

    def src_pos(self, pe: int, token: int) -> int:
        return pe * self.send_stride + token

    def decode_src_pos(self, code: int) -> tuple[int, int]:  # (pe, token)
        return divmod(code, self.send_stride)


class EpTopology(namedtuple("EpTopology", ("world_size", "gpu_per_node"))):
    """The nodes of an EP group (docs/ep-protocols.md §15): W PEs, G per node, N = W / G nodes; PE p is on
    node ``p // G`` with local rank ``p % G``. The inter-node kernels send a token of PE r to a remote node n
    once, to the rail-aligned proxy ``n * G + r % G`` (the PE of node n with r's local rank), which forwards
    it to its node's destinations. ``topology_problems`` says which (W, G) are valid."""

    __slots__ = ()

    @property
    def nodes(self) -> int:  # N
        return self.world_size // self.gpu_per_node

    def node_of(self, pe: int) -> int:
        return pe // self.gpu_per_node

    def local_rank(self, pe: int) -> int:
        return pe % self.gpu_per_node

    def proxy(self, src_pe: int, node: int) -> int:
        """The PE of ``node`` that receives ``src_pe``'s tokens for that node (``src_pe`` itself on its own)."""
        return node * self.gpu_per_node + src_pe % self.gpu_per_node

    def node_pes(self, node: int) -> range:
        return range(node * self.gpu_per_node, (node + 1) * self.gpu_per_node)


def topology_problems(world_size: int, gpu_per_node: int) -> list[str]:
    """Why (W, G) is no EP topology (MORI's rule: G a power of two that divides W); empty when it is one."""
    if not isinstance(gpu_per_node, int) or isinstance(gpu_per_node, bool) or gpu_per_node < 1:
        return [f"gpu_per_node must be a positive integer, got {gpu_per_node!r}"]
    problems = []
    if gpu_per_node & (gpu_per_node - 1):
        problems.append(f"gpu_per_node {gpu_per_node} must be a power of two")
    if world_size % gpu_per_node:
        problems.append(f"gpu_per_node {gpu_per_node} must divide world_size {world_size} (whole nodes)")
    return problems


# Inter-node chunks are one wave of tokens (a lane per token): 32 or 64. Buffers are sized for both.
MIN_CHUNK, MAX_CHUNK = 32, 64
INTERNODE = frozenset({KernelType.InterNode, KernelType.InterNodeV1, KernelType.InterNodeV1LL})
# Per inter-node kernel type: PEs per send target (None: G, the rail-aligned proxy of a node; 1: the PE
# itself) and whether a token goes only to the targets whose PEs hold one of its experts (V1LL sends
# every token to every remote node).
INTERNODE_KINDS = {KernelType.InterNode: (1, True), KernelType.InterNodeV1: (None, True),
                   KernelType.InterNodeV1LL: (None, False)}  # fmt: skip


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def internode_sizes(kind: KernelType, gpu_per_node: int) -> dict:
    """The EpSizes fields of the topology: {} for the intra-node kernel types."""
    if kind not in INTERNODE_KINDS:
        return {}
    hop, _ = INTERNODE_KINDS[kind]
    return {"gpu_per_node": gpu_per_node, "hop_size": hop or gpu_per_node}


def internode_attributes(kind: KernelType, gpu_per_node: int, num_qp_per_pe: int) -> dict:
    """The mori_ep attributes of an inter-node kernel type's ops (besides the sizes): G, the PEs per send
    target, whether every token goes to every remote target (V1LL), the queue pairs per peer."""
    _, selective = INTERNODE_KINDS[kind]
    return {**internode_sizes(kind, gpu_per_node), "send_all": int(not selective), "num_qp": num_qp_per_pe}


def recv_per_rank(max_tokens: int, max_total_recv: int, world_size: int) -> int:
    """Rp: receive slots per source PE, ``ceil(max_total_recv / W)`` capped at M (M when no cap is set)."""
    return min(-(-max_total_recv // world_size), max_tokens) if max_total_recv > 0 else max_tokens


def async_dispatch_signal(round_: int, count: int) -> int:
    return (round_ + 1) << 32 | count


# ---- the symmetric buffer table ---------------------------------------------------------------------

_SYNC = frozenset({KernelType.IntraNode, KernelType.IntraNodeLL})  # the intra-node count-handshake kernel types
_ASYNC = frozenset({KernelType.AsyncLL})
_INTER = INTERNODE  # (the buffer table's short name)
_HANDSHAKE = _SYNC | _INTER  # the kernel types with the count handshake and the device barrier
_ALL = _SYNC | _ASYNC | _INTER


class Buffer(namedtuple("Buffer", ("name", "size", "zeroed", "kinds", "doc"))):
    """One symmetric buffer of an EP op: allocated on every PE (256-byte aligned), ``size(sizes)`` bytes (a
    function of EpSizes), zero-filled at allocation when ``zeroed`` (counters, signals and flags the kernels
    expect to start at 0; they leave them ready for the next call), used by the kernel types ``kinds``."""

    __slots__ = ()


def _tok(s: EpSizes) -> int:
    return s.row_bytes


BUFFERS: tuple[Buffer, ...] = (
    Buffer("out_x", lambda s: s.recv_capacity * _tok(s), False, _ALL, "dispatch output rows [R, H]"),
    Buffer("out_w", lambda s: s.recv_capacity * s.top_k * 4, False, _ALL, "dispatch output weights [R, K] f32"),
    Buffer("out_s", lambda s: max(s.recv_capacity * s.scale_bytes, 16), False, _ALL, "dispatch output scales"),
    Buffer("out_idx", lambda s: s.recv_capacity * s.top_k * 4, False, _ALL, "dispatch output expert ids [R, K]"),
    Buffer("src_pos", lambda s: s.recv_capacity * 4, False, _ALL, "source position of each received row"),
    Buffer("fwd", lambda s: s.max_tokens_per_rank * s.top_k * 4, True, _ALL, "forward map [M, K]"),
    Buffer("total", lambda s: 16, True, _ALL, "rows received by the last dispatch (i32)"),
    Buffer("status", lambda s: 16, True, _ALL, "dispatch status words, cumulative (i32 each): STATUS_WORDS"),
    Buffer("reg_x", lambda s: s.recv_capacity * _tok(s), False, _ALL, "registered combine input [R, H]"),
    Buffer("out_c", lambda s: s.max_tokens_per_rank * _tok(s), False, _ALL, "combine output [M, H]"),
    Buffer("out_cw", lambda s: s.max_tokens_per_rank * s.top_k * 4, False, _ALL, "combine output weights"),
    Buffer("zero_row", lambda s: max(s.combine_row_bytes, 4 * s.top_k, 16), True, _ALL,
           "a row of zeros (absent sources)"),
    # AsyncLL: per round parity and source PE, Rp records to receive and Rp rows to combine.
    Buffer("a_rx", lambda s: s.async_slots * _tok(s), False, _ASYNC, "receive records: rows"),
    Buffer("a_rw", lambda s: s.async_slots * s.top_k * 4, False, _ASYNC, "receive records: weights"),
    Buffer("a_rs", lambda s: max(s.async_slots * s.scale_bytes, 16), False, _ASYNC, "receive records: scales"),
    Buffer("a_ridx", lambda s: s.async_slots * s.top_k * 4, False, _ASYNC, "receive records: expert ids"),
    Buffer("a_rpos", lambda s: s.async_slots * 4, False, _ASYNC, "receive records: source positions"),
    Buffer("a_cx", lambda s: s.async_slots * s.combine_row_bytes, False, _ASYNC, "combine region: rows"),
    Buffer("a_cw", lambda s: s.async_slots * s.top_k * 4, False, _ASYNC, "combine region: weights"),
    Buffer("rmap", lambda s: s.recv_capacity * 4, False, _ASYNC, "output row -> src_pe * Rp + record"),
    Buffer("a_cnt", lambda s: 2 * s.world_size * 4, True, _ASYNC, "slot counters [2][W]"),
    Buffer("a_sig", lambda s: 2 * s.world_size * 8, True, _ASYNC, "dispatch signals [2][W] (epoch-tagged)"),
    Buffer("a_csig", lambda s: 2 * s.world_size * 8, True, _ASYNC, "combine signals [2][W] (epoch-tagged)"),
    Buffer("a_rounds", lambda s: 32, True, _ASYNC, "rounds: dispatch, combine, finished blocks of each"),
    Buffer("a_grid", lambda s: 16, True, _ASYNC, "grid barrier words {arrivals, generation}"),
    # IntraNode / IntraNodeLL and the inter-node types: the count handshake, the grid and device barriers.
    Buffer("slot_ctrs", lambda s: 16, True, _HANDSHAKE, "slot counters, double-buffered by round parity"),
    Buffer("signals", lambda s: 8 * s.world_size, True, _HANDSHAKE, "count-handshake slots [W] u64"),
    Buffer("dispatch_grid", lambda s: 16, True, _HANDSHAKE, "dispatch grid barrier words"),
    Buffer("round_ctr", lambda s: 16, True, _HANDSHAKE, "dispatch round (u64, advanced on the device)"),
    Buffer("dest_ctr", lambda s: 4 * s.world_size, True, _HANDSHAKE, "tokens sent to each PE this round"),
    Buffer("reg_w", lambda s: s.recv_capacity * s.top_k * 4, False, _HANDSHAKE, "registered combine weights"),
    Buffer("stage_x", lambda s: _push_rows(s) * s.combine_row_bytes, False, _SYNC,
           "push-combine staging rows [W*M, H]"),
    Buffer("stage_w", lambda s: _push_rows(s) * s.top_k * 4, False, _SYNC, "push-combine staging weights"),
    Buffer("combine_grid", lambda s: 16, True, _SYNC, "push-combine grid barrier words"),
    Buffer("bar_slots", lambda s: 8 * MAX_BLOCKS * s.world_size, True, _HANDSHAKE, "device barrier [MAX_BLOCKS][W]"),
    Buffer("bar_epochs", lambda s: 8 * MAX_BLOCKS, True, _HANDSHAKE, "device barrier epoch per block"),
    # The inter-node types (docs/ep-protocols.md §16): per round parity (2) and send source (hops), a
    # landing region of chunk_rows records and a signal per chunk, each way.
    Buffer("i_stage", lambda s: s.chunk_rows * s.record_bytes, False, _INTER, "this PE's tokens as records [M]"),
    Buffer("i_land", lambda s: 2 * s.hops * s.chunk_rows * s.record_bytes, False, _INTER,
           "records received from remote sources [2][hops][chunk_rows]"),
    Buffer("i_flag", lambda s: 2 * s.hops * s.max_chunks * 8, True, _INTER,
           "dispatch chunk signals [2][hops][chunks] u64 (round-tagged)"),
    Buffer("i_smap", lambda s: max(s.max_tokens_per_rank * s.hops * 4, 16), False, _INTER,
           "send map [M][hops]: a token's record slot at each target, -1 when not sent"),
    Buffer("i_pfwd", lambda s: s.hops * s.chunk_rows * s.top_k * 4, False, _INTER,
           "forward map of the records this PE forwarded [hops][chunk_rows][K]"),
    Buffer("i_part", lambda s: s.max_tokens_per_rank * (s.row_bytes + 4 * s.top_k), False, _INTER,
           "combine: this node's partial of each own token: rows [M, H], then weights [M, K] f32"),
    Buffer("i_fpart", lambda s: s.hops * s.chunk_rows * s.partial_bytes, False, _INTER,
           "combine: partials of the forwarded records [hops][chunk_rows]"),
    Buffer("i_crecv", lambda s: 2 * s.hops * s.chunk_rows * s.partial_bytes, False, _INTER,
           "combine: partials received from the targets [2][hops][chunk_rows]"),
    Buffer("i_cflag", lambda s: 2 * s.hops * s.max_chunks * 8, True, _INTER,
           "combine chunk signals [2][hops][chunks] u64 (round-tagged)"),
    Buffer("i_done", lambda s: s.hops * s.max_chunks * 4, True, _INTER, "combine: finished records per chunk"),
    Buffer("i_rounds", lambda s: 32, True, _INTER, "combine round, finished blocks (u64 each)"),
    Buffer("traffic", lambda s: 8 * len(TRAFFIC_COUNTERS), True, _INTER,
           "bytes moved, cumulative (u64 each): TRAFFIC_COUNTERS"),
)
# The inter-node kernels' byte counters (buffer ``traffic``, in this order): bytes put to PEs of other
# nodes ("rdma") and bytes stored to or read from PEs of this node ("xgmi"), per leg; what each counts is
# docs/ep-protocols.md §16's.
TRAFFIC_COUNTERS = ("dispatch_rdma", "dispatch_xgmi", "combine_rdma", "combine_xgmi")
# The dispatch kernels' status words (buffer ``status``, i32 each, in this order, cumulative since the op's
# construction; relaxed local atomics, read by the host after the fact): ``overflow``, the (token, PE)
# sends dropped because the receiver was full; ``invalid_ids``, the (token, k) slots of this PE's tokens
# whose expert id is neither -1 (a legal drop) nor in [0, W * Er) (dropped too: a null forward entry).
STATUS_WORDS = ("overflow", "invalid_ids")
BUFFER_NAMES = frozenset(b.name for b in BUFFERS)


def _push_rows(s: EpSizes) -> int:
    return s.world_size * s.max_tokens_per_rank if s.external_input else 1


def buffers_for(kind: KernelType, sizes: EpSizes) -> list[tuple[Buffer, int]]:
    """(buffer, bytes) of every symmetric buffer kernel type ``kind`` uses, in allocation order."""
    return [(b, b.size(sizes)) for b in BUFFERS if kind in b.kinds]


# ---- kernel signatures ------------------------------------------------------------------------------

PARAM_TYPES = ("ptr", "i32")


class Param(namedtuple("Param", ("name", "type", "buffer", "optional"), defaults=("ptr", None, False))):
    """A kernel parameter: ``name`` (as in the gpu.func and bundle.json), ``type`` ("ptr" or "i32"), and
    ``buffer``, the symmetric buffer the host passes (None: a call argument the host passes by name).
    An ``optional`` buffer is passed unless the call gives the parameter as 0 (a null pointer: the
    combine's output weights when the caller has no weights)."""

    __slots__ = ()


def _b(name: str, buffer: str | None = None) -> Param:
    return Param(name, "ptr", buffer or name)


_N = Param("n", "i32")  # tokens of this PE's call
# The call's hidden size, in elements of the kernel's dtype (<= the config's; docs/ep-protocols.md, "runtime
# hidden"): every user-visible row ([R, h] outputs, the registered combine input, the combine output) is
# packed at h * elem bytes; the internal layouts (inter-node records and partials) keep the config's row size.
_HIDDEN = Param("hidden", "i32")
_RDMA_BLOCKS = Param("rdma_blocks", "i32")  # the inter-node kernels: blocks [0, rdma_blocks) do the inter-node work
_OUT_CW = Param("out_w", "ptr", "out_cw", optional=True)  # the combine's output weights; null without weights


LEGS = ("dispatch", "combine")
# Every kernel exists twice in a bundle: for the config's hidden (rows of constant size) and, named with
# this suffix, for any hidden up to it (the call's ``hidden``; the fp4 leg of an op, or a smaller model).
ANY_HIDDEN_SUFFIX = "_anyhidden"


class KernelSignature:
    """The parameters of the kernels ``ep_<family>_<dtype>``, in order, and where the family comes from:
    the ``mori_ep`` op ``op`` (with ``zero_copy`` for the combine's two forms), the ``leg`` it runs
    (dispatch or combine: its dtypes) and the kernel types ``kinds`` that launch it. Immutable; the
    tuples a launch reads are computed once here."""

    __slots__ = ("family", "params", "doc", "op", "leg", "kinds", "zero_copy", "names", "types", "call_arguments",
                 "optional_buffers", "_slots")  # fmt: skip

    def __init__(self, family: str, params: tuple[Param, ...], doc: str, op: str = "", leg: str = "dispatch",
                 kinds: frozenset = frozenset(), zero_copy: int | None = None):  # fmt: skip
        set_ = object.__setattr__
        for name, value in (("family", family), ("params", tuple(params)), ("doc", doc), ("op", op), ("leg", leg),
                            ("kinds", frozenset(kinds)), ("zero_copy", zero_copy)):  # fmt: skip
            set_(self, name, value)
        set_(self, "names", tuple(p.name for p in self.params))
        set_(self, "types", tuple(p.type for p in self.params))
        # The parameters the host passes by name (not symmetric buffers), and the buffer parameters a
        # call may give as 0 (null) by name.
        set_(self, "call_arguments", tuple(p.name for p in self.params if p.buffer is None))
        set_(self, "optional_buffers", tuple(p.name for p in self.params if p.optional))
        set_(self, "_slots", tuple((p.name, p.buffer) for p in self.params))

    def __setattr__(self, name, value):
        raise AttributeError(f"KernelSignature is immutable (setting {name!r})")

    def __repr__(self) -> str:
        return f"KernelSignature({self.family!r}, {', '.join(self.names)})"

    def kernel_name(self, dtype: str, any_hidden: bool = False) -> str:
        """``ep_<family>_<dtype>``, the kernel of the config's hidden, or with ``any_hidden`` the variant that
        takes any hidden up to it (``..._anyhidden``)."""
        return f"ep_{self.family}_{dtype}" + (ANY_HIDDEN_SUFFIX if any_hidden else "")

    def arguments(self, buffer_address: Callable[[str], int], values: dict) -> tuple:
        """The launch arguments in parameter order: each buffer's address (``buffer_address(name)``) and
        each call argument from ``values`` by name (an optional buffer: 0 from ``values``, else its
        address); a missing or unknown name, or an optional buffer given as other than 0, is a ValueError."""
        given = len(values) - sum(1 for n in self.optional_buffers if n in values)
        if given != len(self.call_arguments) or not all(n in values for n in self.call_arguments) or any(
                values.get(n, 0) != 0 for n in self.optional_buffers):  # fmt: skip
            self._refuse(values)
        return tuple(values[name] if name in values else buffer_address(buffer) for name, buffer in self._slots)

    def _refuse(self, values: dict) -> None:
        unknown = set(values) - set(self.call_arguments) - set(self.optional_buffers)
        missing = [n for n in self.call_arguments if n not in values]
        not_null = [n for n in self.optional_buffers if values.get(n, 0) != 0]
        raise ValueError(f"kernels ep_{self.family}_*: " + "; ".join(
            ([f"missing call arguments {', '.join(missing)}"] if missing else [])
            + ([f"unknown arguments {', '.join(sorted(unknown))}"] if unknown else [])
            + ([f"{', '.join(not_null)} may only be given as 0 (null)"] if not_null else [])))  # fmt: skip


_TOKENS_IN = (Param("x"), Param("w"), Param("s"), Param("idx"), _N, _HIDDEN)  # rows, weights, scales, ids, count, hidden
_DISPATCH = _TOKENS_IN + (
    _b("out_x"), _b("out_w"), _b("out_s"), _b("out_idx"), _b("src_pos"), _b("slot_ctrs"), _b("signals"),
    _b("grid_ctr", "dispatch_grid"), _b("round_ctr"), _b("fwd"), _b("dest_ctr"), _b("total"), _b("status"),
)  # fmt: skip

# The routing replay (IntraNode, InterNodeV1; docs/ep-protocols.md §17): a [n, K] i32 forward map recorded by an
# earlier dispatch (a routing handle's copy of ``fwd``), whose slots this dispatch takes instead of
# reserving them; 0 (null): reserve as usual.
_ROUTING = Param("routing")
# InterNodeV1's replay also takes the slots of the records this PE forwarded as a proxy: a recorded copy of
# ``i_pfwd`` ([hops][chunk_rows][K] i32); null with ``routing``.
_ROUTING_PFWD = Param("routing_pfwd")

KERNELS: dict[str, KernelSignature] = {s.family: s for s in (
    KernelSignature("dispatch", _DISPATCH + (_ROUTING,), "IntraNode dispatch: one warp per token", "dispatch", "dispatch",
                    frozenset({KernelType.IntraNode})),
    KernelSignature("dispatch_ll", _DISPATCH, "IntraNodeLL dispatch: one block per token", "dispatch_ll", "dispatch",
                    frozenset({KernelType.IntraNodeLL})),
    KernelSignature("combine_pull", (
        Param("inp_w"), _b("reg_x"), _b("reg_w"), _b("fwd"), _N, _HIDDEN, _b("total"), _b("out", "out_c"), _OUT_CW,
        _b("zero_row"), _b("bar_slots"), _b("bar_epochs"), _b("grid_ctr", "combine_grid"),
    ), "zero-copy combine: sums rows read from the peers' registered buffers", "combine", "combine", _SYNC, 1),
    KernelSignature("combine_push", (
        Param("inp"), Param("inp_w"), _b("stage_x"), _b("stage_w"), _b("src_pos"), _b("fwd"), _N, _HIDDEN, _b("total"),
        _b("out", "out_c"), _OUT_CW, _b("zero_row"), _b("grid_ctr", "combine_grid"), _b("bar_slots"),
        _b("bar_epochs"),
    ), "push combine: rows written to their owners' staging rows, then summed locally", "combine", "combine", _SYNC, 0),
    KernelSignature("async_dispatch_send", _TOKENS_IN + (
        _b("out_x", "a_rx"), _b("out_w", "a_rw"), _b("out_s", "a_rs"), _b("out_idx", "a_ridx"),
        _b("src_pos", "a_rpos"), _b("cnt", "a_cnt"), _b("sig", "a_sig"), _b("rounds", "a_rounds"), _b("fwd"),
        _b("status"), _b("grid_ctr", "a_grid"),
    ), "AsyncLL dispatch send phase", "dispatch_send", "dispatch", _ASYNC),
    KernelSignature("async_dispatch_recv", (
        _HIDDEN, _b("rx", "a_rx"), _b("rw", "a_rw"), _b("rs", "a_rs"), _b("ridx", "a_ridx"), _b("rpos", "a_rpos"),
        _b("cnt", "a_cnt"), _b("sig", "a_sig"), _b("rounds", "a_rounds"), _b("grid_ctr", "a_grid"), _b("out_x"),
        _b("out_w"), _b("out_s"), _b("out_idx"), _b("src_pos"), _b("rmap"), _b("total"),
    ), "AsyncLL dispatch receive phase", "dispatch_recv", "dispatch", _ASYNC),
    KernelSignature("async_combine_send", (
        Param("inp"), Param("inp_w"), _HIDDEN, _b("cx", "a_cx"), _b("cw", "a_cw"), _b("rmap"), _b("total"),
        _b("csig", "a_csig"), _b("rounds", "a_rounds"), _b("grid_ctr", "a_grid"),
    ), "AsyncLL combine send phase", "combine_send", "combine", _ASYNC),
    KernelSignature("async_combine_recv", (
        _b("cx", "a_cx"), _b("cw", "a_cw"), _b("fwd"), _N, _HIDDEN, _b("csig", "a_csig"), _b("rounds", "a_rounds"),
        _b("grid_ctr", "a_grid"), _b("out", "out_c"), _OUT_CW, _b("zero_row"),
    ), "AsyncLL combine receive phase", "combine_recv", "combine", _ASYNC),
    # The inter-node types (docs/ep-protocols.md §16): each leg is several kernels, launched in this order.
    KernelSignature("inter_stage", _TOKENS_IN + (_b("stage", "i_stage"),),
                    "inter-node dispatch, step 1: this PE's tokens packed as records", "internode_stage",
                    "dispatch", _INTER),  # fmt: skip
    KernelSignature("inter_dispatch", _TOKENS_IN + (
        _RDMA_BLOCKS, _b("out_x"), _b("out_w"), _b("out_s"), _b("out_idx"), _b("src_pos"), _b("slot_ctrs"),
        _b("signals"), _b("grid_ctr", "dispatch_grid"), _b("round_ctr"), _b("fwd"), _b("dest_ctr"), _b("total"),
        _b("status"), _b("stage", "i_stage"), _b("land", "i_land"), _b("flag", "i_flag"), _b("smap", "i_smap"),
        _b("pfwd", "i_pfwd"), _b("traffic"), _ROUTING, _ROUTING_PFWD,
    ), "inter-node dispatch, step 2: chunked sends to the targets, receive-and-forward, same-node rows",
        "internode_dispatch", "dispatch", _INTER),
    KernelSignature("inter_combine", (
        _N, _HIDDEN, _RDMA_BLOCKS, Param("has_w", "i32"), _b("reg_x"), _b("reg_w"), _b("fwd"), _b("round_ctr"),
        _b("flag", "i_flag"), _b("pfwd", "i_pfwd"), _b("part", "i_part"), _b("fpart", "i_fpart"),
        _b("crecv", "i_crecv"), _b("cflag", "i_cflag"), _b("done", "i_done"), _b("rounds", "i_rounds"),
        _b("bar_slots"), _b("bar_epochs"), _b("zero_row"), _b("traffic"),
    ), "inter-node combine, step 1: per-node partials, the forwarded records' partials back to their sources",
        "internode_combine", "combine", _INTER),
    KernelSignature("inter_combine_all", (
        _N, _HIDDEN, _b("smap", "i_smap"), _b("part", "i_part"), _b("crecv", "i_crecv"), _b("cflag", "i_cflag"),
        _b("rounds", "i_rounds"), _b("bar_slots"), _b("bar_epochs"), _b("out", "out_c"), _OUT_CW, _b("zero_row"),
    ), "inter-node combine, step 2: each token's node partials summed in fp32", "internode_combine_all",
        "combine", _INTER),
)}  # fmt: skip

# Which mori_ep op becomes which kernel family (combine: by its zero_copy attribute).
OP_FAMILIES = {sig.op: family for family, sig in KERNELS.items() if sig.zero_copy is None}


def combine_family(zero_copy: bool) -> str:
    return next(f for f, sig in KERNELS.items() if sig.op == "combine" and sig.zero_copy == int(bool(zero_copy)))


def families(kind: KernelType, leg: str) -> list[KernelSignature]:
    """The kernel families kernel type ``kind`` launches on ``leg``, in the bundle's order."""
    return [sig for sig in KERNELS.values() if kind in sig.kinds and sig.leg == leg]


def leg_dtypes(leg: str, max_token_bytes: int) -> list[str]:
    """The token dtypes a bundle compiles ``leg`` for, given the token buffers' element size."""
    return dtypes_within(DISPATCH_DTYPES if leg == "dispatch" else COMBINE_DTYPES, max_token_bytes)


def kernel_signature(kernel_name: str) -> tuple[KernelSignature, str]:
    """(signature, dtype) of an EP kernel name ``ep_<family>_<dtype>`` (or its ``_anyhidden`` variant);
    KeyError when it is none."""
    kernel_name = kernel_name.removesuffix(ANY_HIDDEN_SUFFIX)
    for dtype in sorted(TOKEN_BYTES, key=len, reverse=True):
        suffix = "_" + dtype
        if kernel_name.startswith("ep_") and kernel_name.endswith(suffix):
            family = kernel_name[3: -len(suffix)]
            if family in KERNELS:
                return KERNELS[family], dtype
    raise KeyError(kernel_name)

