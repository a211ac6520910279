"""The ``mori_ep`` dialect: MoE expert-parallel dispatch/combine, one op per kernel family.

Defined in ``mori_ep.irdl.mlir``. Each op's attributes carry the whole configuration;
``mori-ep-to-kernels`` replaces it by gpu.func kernels built from the generic communication blocks of the
``mori_comm`` dialect (dialects/mori_comm.py), which ``mori-comm-to-calls`` then lowers:

============== ===============================================================================
dispatch       IntraNode dispatch, one warp per token (docs/ep-protocols.md §8): ``ep_dispatch_<dtype>``
combine        IntraNode combine (docs/ep-protocols.md §9): ``ep_combine_pull_<dtype>`` (zero_copy) or ``_push_``
dispatch_ll    IntraNodeLL dispatch, one block per token, each vector loaded once and stored to
               every destination (docs/ep-protocols.md §8): ``ep_dispatch_ll_<dtype>``; combine as IntraNode
dispatch_send  AsyncLL send phase (docs/ep-protocols.md §10): ``ep_async_dispatch_send_<dtype>``
dispatch_recv  AsyncLL receive phase: ``ep_async_dispatch_recv_<dtype>``
combine_send   ``ep_async_combine_send_<dtype>``
combine_recv   ``ep_async_combine_recv_<dtype>``
internode_     inter-node dispatch, step 1 (InterNode, InterNodeV1, InterNodeV1LL; docs/ep-protocols.md §16):
stage          every token packed as a record, ``ep_inter_stage_<dtype>``
internode_     step 2: chunked sends to the targets (one signal per chunk), receive-and-forward on the
dispatch       targets, the same-node rows, the node's count handshake: ``ep_inter_dispatch_<dtype>``
internode_     combine step 1: per-node partials (forwarded records' back to their sources, own tokens'
combine        kept): ``ep_inter_combine_<dtype>``
internode_     combine step 2: the hierarchical fp32 sum of each token's node partials:
combine_all    ``ep_inter_combine_all_<dtype>``
============== ===============================================================================

The inter-node ops also carry ``gpu_per_node`` (G, a power of two dividing world_size), ``hop_size`` (the
PEs one send target serves: G for V1/V1LL's rail proxy, 1 for V0), ``send_all`` (1 for V1LL: every token
to every remote node) and ``num_qp`` (queue pairs per peer, in [1, MAX_QP]).

The combines of QUANT_OPS may carry the wire quantization of their bf16 rows, two optional attributes
(absent: no quantization, so that every other config's text, the bundle key's input, is unchanged):
``quant`` (wire_quant.QUANT_TYPES) and ``scale_blocks`` (>= 1 exactly when blockwise); a quantizing combine
is bf16 and not zero-copy; the other ops refuse them.

Every op may carry ``any_hidden`` (0 or 1, default 0): 1 builds the variant ``..._anyhidden`` of its kernels,
whose rows are the call's ``hidden`` (an i32 kernel argument, elements <= ``hidden``) instead of the
attribute's; the rows stay whole 16-byte vectors (the host checks). The AsyncLL halves carry the notification mode as ``early_notify``/``fused_recv`` (0 or 1, fused needs
early). ``ep_op`` builds an EP op from Python values (ops/bundle.py builds a config's module with it).
The dtypes and the limits that size device structures come from the EP schema
(mori_compiler/ep_schema.py); ``extra_verify`` states the ranges and relations IRDL cannot.
"""

from __future__ import annotations

from mori_compiler import ep_schema, wire_quant
from mori_compiler.targets import MAX_BLOCK_THREADS
from mori_compiler._mlir import ir

from .dialect_base import Dialect, OpRules
from .irdl_spec import int_attributes, string_attributes

# Bytes per element of each token dtype the ops accept (views of the EP schema's tables).
DISPATCH_DTYPES = {d: ep_schema.TOKEN_BYTES[d] for d in ep_schema.DISPATCH_DTYPES}
COMBINE_DTYPES = {d: ep_schema.TOKEN_BYTES[d] for d in ep_schema.COMBINE_DTYPES}
MAX_WORLD_SIZE = ep_schema.MAX_WORLD_SIZE
# Upper bounds of the config attributes: the EP schema's (the config's own limits, in the kernels' terms).
MAX_LIMITS = {"hidden": ep_schema.MAX_HIDDEN_DIM, "experts_per_rank": ep_schema.MAX_EXPERTS_PER_RANK,
              "max_tokens_per_rank": ep_schema.MAX_TOKENS_PER_RANK, "max_recv_per_rank": ep_schema.MAX_TOKENS_PER_RANK,
              "scale_bytes": ep_schema.MAX_SCALE_DIM * ep_schema.MAX_SCALE_TYPE_SIZE,
              "max_blocks": ep_schema.MAX_BLOCKS}  # fmt: skip
HALF_OPS = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")  # AsyncLL send/recv phases
INTERNODE_OPS = ("internode_stage", "internode_dispatch", "internode_combine", "internode_combine_all")
COMBINE_OPS = ("combine", "combine_send", "combine_recv", "internode_combine", "internode_combine_all")
EP_OPS = ("dispatch", "combine", "dispatch_ll") + HALF_OPS + INTERNODE_OPS
QUANT_OPS = ("combine", "combine_send", "combine_recv")  # the combines with a wire quantization
# Optional: absent means quant "none" (so the text of every other config, the bundle key's input, is unchanged).
QUANT_ATTRIBUTES = ("quant", "scale_blocks")
MAX_QP = ep_schema.MAX_QP_PER_PE


def ep_op(short_name: str, attributes: dict, *, loc=None, ip=None) -> ir.Operation:
    """``mori_ep.<short_name>() {attributes}``: one EP op (``short_name`` in EP_OPS), each attribute an
    ``int`` (an ``i64`` IntegerAttr) or a ``str`` (a StringAttr), in the ambient context or ``loc``'s. The
    values are checked where IR from text is: compile_source runs ``extra_verify`` on a built module too."""
    if short_name not in EP_OPS:
        raise ValueError(f"mori_ep has no EP op '{short_name}' (EP ops: {', '.join(EP_OPS)})")
    with loc.context if loc is not None else ir.Context.current:
        i64 = ir.IntegerType.get_signless(64)
        attrs = {}
        for name, value in attributes.items():
            if isinstance(value, str):
                attrs[name] = ir.StringAttr.get(value)
            elif isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
                attrs[name] = ir.IntegerAttr.get(i64, value)
            else:
                raise ValueError(f"'mori_ep.{short_name}' attribute '{name}' must be an i64 int or a str, got "
                                 f"{value!r}")  # fmt: skip
        return ir.Operation.create(f"{DIALECT_NAME}.{short_name}", attributes=attrs, loc=loc, ip=ip)


def extra_verify(op: ir.Operation) -> list[str]:
    """Ranges and relations of an EP op's config attributes (IRDL only says they exist)."""
    op = op.operation
    name = op.name
    short = name.split(".", 1)[1]
    ints, strs = int_attributes(op), string_attributes(op)
    rules = OpRules(op)
    if rules.non_integer(op, ints, ("dtype", "quant")):
        return rules.errors
    need = rules.need
    if short in QUANT_OPS:
        _quant_rules(short, ints, strs, need)
    else:
        for attr in QUANT_ATTRIBUTES:
            need(attr not in op.attributes, f"attribute '{attr}' is only for the combines {', '.join(QUANT_OPS)} "
                 "(the wire quantization of their rows)")  # fmt: skip

    if "world_size" in ints:
        need(1 <= ints["world_size"] <= MAX_WORLD_SIZE, f"attribute 'world_size' must be in [1, {MAX_WORLD_SIZE}], "
             f"got {ints['world_size']}")  # fmt: skip
    dtypes = COMBINE_DTYPES if short in COMBINE_OPS else DISPATCH_DTYPES
    dtype = strs.get("dtype")
    shown = repr(dtype) if dtype is not None or "dtype" not in op.attributes else str(op.attributes["dtype"])
    need(dtype in dtypes, f"attribute 'dtype' must be one of {', '.join(map(repr, dtypes))}, got {shown}")
    needed = ep_schema.SIZE_ATTRIBUTES + ("warps_per_block", "wave_size")
    missing = [f for f in needed if f not in ints]
    need(not missing, f"needs the config attributes {', '.join(missing)}")
    for field in needed[1:] + ("max_blocks",):  # (world_size's range is checked above)
        if field in ints:
            need(ints[field] >= 1, f"attribute '{field}' must be >= 1, got {ints[field]}")
    for field, limit in MAX_LIMITS.items():
        if field in ints:
            need(ints[field] <= limit, f"attribute '{field}' must be <= {limit}, got {ints[field]}")
    if "wave_size" in ints:
        need(ints["wave_size"] in (32, 64), f"attribute 'wave_size' must be 32 or 64, got {ints['wave_size']}")
        if "warps_per_block" in ints and ints["wave_size"] in (32, 64):
            most = MAX_BLOCK_THREADS // ints["wave_size"]
            need(ints["warps_per_block"] <= most, f"attribute 'warps_per_block' ({ints['warps_per_block']}) must be "
                 f"<= {most}: a block has at most {MAX_BLOCK_THREADS} threads")  # fmt: skip
        if "top_k" in ints:
            need(ints["top_k"] < ints["wave_size"],
                 f"attribute 'top_k' ({ints['top_k']}) must be smaller than the wave size ({ints['wave_size']})")
        if "world_size" in ints:
            need(ints["world_size"] <= ints["wave_size"],
                 f"attribute 'world_size' ({ints['world_size']}) must not exceed the wave size ({ints['wave_size']})")
    if short == "dispatch_ll" and "warps_per_block" in ints:
        need(ints["warps_per_block"] >= 2, f"attribute 'warps_per_block' ({ints['warps_per_block']}) must be >= 2: "
             "the LL dispatch has a control warp and at least one data warp")  # fmt: skip
    if all(ints.get(f, 0) >= 1 for f in ("top_k", "world_size", "experts_per_rank")):  # (else reported above)
        total = ints["world_size"] * ints["experts_per_rank"]
        need(ints["top_k"] <= total, f"attribute 'top_k' ({ints['top_k']}) exceeds the {total} experts "
             "(world_size x experts_per_rank)")  # fmt: skip
    if "max_recv_per_rank" in ints and "max_tokens_per_rank" in ints:
        need(ints["max_recv_per_rank"] <= ints["max_tokens_per_rank"],
             "attribute 'max_recv_per_rank' must not exceed 'max_tokens_per_rank'")
    if "hidden" in ints and dtype in dtypes:
        need(ints["hidden"] * dtypes[dtype] % 16 == 0,
             f"a token row ({ints['hidden']} x {dtype}) must be a multiple of 16 bytes")
    if "scale_bytes" in ints:
        need(ints["scale_bytes"] >= 0, "attribute 'scale_bytes' must be >= 0")
    if short in HALF_OPS:
        for field, var in (("early_notify", "MORI_ASYNCLL_EARLY_NOTIFY"), ("fused_recv", "MORI_ASYNCLL_FUSED_RECV")):
            if field in ints:
                need(ints[field] in (0, 1), f"attribute '{field}' ({var}) must be 0 or 1, got {ints[field]}")
        if ints.get("fused_recv") == 1 and ints.get("early_notify") == 0:
            need(False, "attribute 'fused_recv' = 1 needs 'early_notify' = 1 (the fused receive waits for the "
                        "notifications only the early-notify send posts)")
    if short in INTERNODE_OPS:
        _internode_rules(ints, need)
    if "zero_copy" in ints:
        need(ints["zero_copy"] in (0, 1), "attribute 'zero_copy' must be 0 or 1")
    if "any_hidden" in ints:
        need(ints["any_hidden"] in (0, 1), f"attribute 'any_hidden' must be 0 or 1, got {ints['any_hidden']}")
    return rules.errors


def _quant_rules(short: str, ints: dict, strs: dict, need) -> None:
    """The combine's wire quantization: a known quant type, of the bf16 combine only, not zero-copy, with
    scale blocks exactly when blockwise."""
    if "quant" not in strs and "quant" not in ints and "scale_blocks" not in ints:
        return  # no wire quantization
    quant = strs.get("quant")
    if quant not in wire_quant.QUANT_TYPES:
        need(False, f"attribute 'quant' must be one of {', '.join(map(repr, wire_quant.QUANT_TYPES))}, got {quant!r}")
        return
    blocks = ints.get("scale_blocks")
    if blocks is None:
        need(False, f"attribute 'quant' {quant!r} needs the attribute 'scale_blocks' (0, or the blockwise scale "
             "blocks)")  # fmt: skip
        return
    if quant in wire_quant.BLOCKWISE_QUANT_TYPES:
        need(1 <= blocks <= wire_quant.MAX_COMBINE_SCALE_DIM, f"attribute 'scale_blocks' must be in [1, "
             f"{wire_quant.MAX_COMBINE_SCALE_DIM}] for quant {quant!r}, got {blocks}")  # fmt: skip
    else:
        need(blocks == 0, f"attribute 'scale_blocks' must be 0 for quant {quant!r} (no block scales), got {blocks}")
    if quant == "none":
        return
    dtype = wire_quant.QUANT_COMBINE_DTYPE
    need(strs.get("dtype") == dtype, f"attribute 'quant' {quant!r} needs dtype '{dtype}' (only the bf16 combine is "
         f"quantized), got {strs.get('dtype')!r}")  # fmt: skip
    need(ints.get("zero_copy", 0) == 0, f"attribute 'quant' {quant!r} needs zero_copy = 0 (rows are quantized as they "
         "are pushed; the zero-copy combine reads them in place)")  # fmt: skip


def _internode_rules(ints: dict, need) -> None:
    """The topology attributes of an inter-node op: G a power of two dividing world_size, hop_size G or 1,
    send_all 0 or 1 (only with hop_size G: V1LL), num_qp in [1, MAX_QP]."""
    g, w = ints.get("gpu_per_node"), ints.get("world_size")
    if g is None or w is None:
        return
    if not (g >= 1 and not g & (g - 1) and w % g == 0):
        need(False, f"attribute 'gpu_per_node' ({g}) must be a power of two dividing 'world_size' ({w})")
        return
    hop, send_all, qp = ints.get("hop_size"), ints.get("send_all"), ints.get("num_qp")
    need(hop in (1, g), f"attribute 'hop_size' must be 'gpu_per_node' ({g}: V1, V1LL) or 1 (V0), got {hop}")
    need(send_all in (0, 1), f"attribute 'send_all' must be 0 or 1, got {send_all}")
    need(not (send_all == 1 and hop == 1 and g > 1), "attribute 'send_all' = 1 (V1LL) needs 'hop_size' = 'gpu_per_node'")
    if qp is not None:
        need(1 <= qp <= MAX_QP, f"attribute 'num_qp' must be in [1, {MAX_QP}], got {qp}")


# Attributes an EP op may carry besides its IRDL ones, checked by extra_verify: any_hidden (any op, default
# 0) and the wire quantization (QUANT_ATTRIBUTES, only the QUANT_OPS; absent: none).
OPTIONAL_ATTRIBUTES = frozenset({"any_hidden", *QUANT_ATTRIBUTES})
DIALECT = Dialect("mori_ep", "mori_ep.irdl.mlir", extra_verify, OPTIONAL_ATTRIBUTES)
DIALECT_NAME = DIALECT.name
