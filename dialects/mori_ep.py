"""The ``mori_ep`` dialect: MoE expert-parallel dispatch/combine and their building blocks.

Defined in ``mori_ep.irdl.mlir``. Two layers:

* **Building blocks**, each one reusable step of a communication pattern, lowered by
  ``mori-ep-blocks-to-calls`` (passes/ep_blocks.py) into calls of helper functions written with
  ``mori_shmem``, gpu, scf and llvm ops:

  ================= ==========================================================================
  op                semantics → helper symbol (and the mori_shmem ABI it calls)
  ================= ==========================================================================
  row_copy          warp-cooperative copy of a row to a peer → ``__mori_ep_row_copy_vec16``
                    (16-byte vectors, 8 loads in flight per lane; rows a constant multiple of 16
                    bytes) or ``__mori_ep_row_copy`` (``mori_shmem_putmem_nbi_warp``)
  row_copy_to_peers one row to up to ``max_peers`` destinations (lane k names destination k): each
                    16-byte vector loaded once, stored to every destination →
                    ``__mori_ep_row_copy_to_peers_k{max_peers}`` (``mori_shmem_my_pe``, one
                    ``mori_shmem_ptr`` per lane, then plain stores)
  reserve_slot      remote slot reservation, fetch-add of 1 on a peer's counter →
                    ``__mori_ep_reserve_slot`` (``mori_shmem_uint32_atomic_fetch_add_thread``)
  count_signal      count handshake with flow control (send count + 1 once the peer's slot is 0)
                    → ``__mori_ep_count_signal_w{W}`` (``wait_until``, ``fence``, ``p``)
  grid_barrier      all blocks of this PE's grid meet (sense reversal: arrivals + generation, no
                    host reset) → ``__mori_ep_grid_barrier``
  device_barrier    blocks b of all PEs meet (device-side monotone epoch per block: graph-replay
                    safe) → ``__mori_ep_device_barrier_w{W}``
  accumulate_rows   out = sum of K rows in fp32 (bf16/f32), K loads in flight per lane →
                    ``__mori_ep_accumulate_rows_{dtype}_k{K}``
  ================= ==========================================================================

* **EP ops**, whose attributes carry the whole configuration; ``mori-ep-to-kernels`` replaces each by
  gpu.func kernels built from the blocks:

  ============== ===============================================================================
  dispatch       IntraNode dispatch, one warp per token (§3.1): ``ep_dispatch_<dtype>``
  combine        IntraNode combine (§3.2): ``ep_combine_pull_<dtype>`` (zero_copy) or ``_push_``
  dispatch_ll    IntraNodeLL dispatch, one block per token, each vector loaded once and stored to
                 every destination (§3.3): ``ep_dispatch_ll_<dtype>``; combine as IntraNode
  dispatch_send  AsyncLL send phase (§3.6): ``ep_async_dispatch_send_<dtype>``
  dispatch_recv  AsyncLL receive phase: ``ep_async_dispatch_recv_<dtype>``
  combine_send   ``ep_async_combine_send_<dtype>``
  combine_recv   ``ep_async_combine_recv_<dtype>``
  ============== ===============================================================================

  The AsyncLL halves carry the notification mode as ``early_notify``/``fused_recv`` (0 or 1, fused
  needs early). Kernels are in passes/ep_kernels.py (IntraNode) and passes/ep_ll_kernels.py (LL, AsyncLL).
"""

from __future__ import annotations

from importlib.resources import files

from mori_compiler._mlir import ir

from .irdl_spec import int_attributes, string_attributes

DIALECT_NAME = "mori_ep"
IRDL_FILE = "mori_ep.irdl.mlir"

DISPATCH_DTYPES = {"bf16": 2, "f32": 4, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1}
COMBINE_DTYPES = {"bf16": 2, "f32": 4}
MAX_WORLD_SIZE = 32  # the count handshake gives each peer one lane of a warp (wave32 on gfx12)
# Upper bounds of the config attributes (the same limits as ops/config.py's EpDispatchCombineConfig
# rules, which test_config_validation.py pins equal): the kernels' token, slot and expert indices are
# 32-bit, a token row is at most 256 KiB, a block at most 1024 threads, the device barrier has 1024 slots.
MAX_LIMITS = {"hidden": 2**16, "experts_per_rank": 2**12, "max_tokens_per_rank": 2**16,
              "max_recv_per_rank": 2**16, "scale_bytes": 2**16 * 8, "max_blocks": 1024}  # fmt: skip
MAX_BLOCK_THREADS = 1024
HALF_OPS = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")  # AsyncLL send/recv phases
EP_OPS = ("dispatch", "combine", "dispatch_ll") + HALF_OPS


def irdl_source() -> str:
    return files("mori_compiler.dialects").joinpath(IRDL_FILE).read_text(encoding="utf-8")


def register_and_load(ctx: ir.Context) -> None:
    """Load ``mori_ep`` into ``ctx`` once (a second IRDL load would abort the process)."""
    if ctx.is_registered_operation("mori_ep.row_copy"):
        return
    from mori_compiler._mlir import irdl

    with ctx, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(irdl_source()))


def extra_verify(op: ir.Operation) -> list[str]:
    """Ranges and relations of config attributes (IRDL only says they exist)."""
    op = op.operation
    name = op.name
    short = name.split(".", 1)[1]
    ints, strs = int_attributes(op), string_attributes(op)
    errors: list[str] = []
    for field in op.attributes:
        if field != "dtype" and field not in ints:
            errors.append(f"'{name}' attribute '{field}' must be an integer, got {op.attributes[field]}")
    if errors:
        return errors

    def need(cond: bool, message: str) -> None:
        if not cond:
            errors.append(f"'{name}' {message}")

    if "world_size" in ints:
        need(1 <= ints["world_size"] <= MAX_WORLD_SIZE, f"attribute 'world_size' must be in [1, {MAX_WORLD_SIZE}], "
             f"got {ints['world_size']}")  # fmt: skip
    if short in EP_OPS:
        dtypes = COMBINE_DTYPES if short.startswith("combine") else DISPATCH_DTYPES
        dtype = strs.get("dtype")
        shown = repr(dtype) if dtype is not None or "dtype" not in op.attributes else str(op.attributes["dtype"])
        need(dtype in dtypes, f"attribute 'dtype' must be one of {', '.join(map(repr, dtypes))}, got {shown}")
        needed = ("world_size", "hidden", "top_k", "experts_per_rank", "max_tokens_per_rank",
                  "max_recv_per_rank", "warps_per_block", "wave_size")  # fmt: skip
        missing = [f for f in needed if f not in ints]
        need(not missing, f"needs the config attributes {', '.join(missing)}")
        for field in ("hidden", "top_k", "experts_per_rank", "max_tokens_per_rank", "max_recv_per_rank",
                      "warps_per_block", "wave_size", "max_blocks"):  # fmt: skip
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
        if "zero_copy" in ints:
            need(ints["zero_copy"] in (0, 1), "attribute 'zero_copy' must be 0 or 1")
    if short == "accumulate_rows":
        need(len(op.operands) >= 3, "needs at least one source row")
    if short == "row_copy_to_peers" and "max_peers" in ints:
        need(1 <= ints["max_peers"] <= 32, f"attribute 'max_peers' must be in [1, 32] (one lane per destination), "
             f"got {ints['max_peers']}")  # fmt: skip
    return errors
