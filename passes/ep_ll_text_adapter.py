"""TEMPORARY adapter (removed at merge, when the builder version of passes/ep_ll_kernels.py lands).

The text version of passes/ep_ll_kernels.py imports its MLIR text pieces from ``passes.ep_kernels``,
which is gone (the IntraNode kernels and the shared pieces are built with builders now:
passes/ep_intranode_kernels.py, passes/ep_kernel_parts.py). This module keeps those pieces as they were,
answers that import (``install()``), and parses what ep_ll_kernels returns into the module
(``build_ll_kernels``), so that the IntraNodeLL and AsyncLL kernels keep working unchanged meanwhile.
"""

from __future__ import annotations

import sys

from mori_compiler._mlir import ir
from mori_compiler.dialects.builder import GeneratorError

from .ep_kernel_parts import EpKernelConfig

P = "!llvm.ptr"


def _block(cfg: EpKernelConfig) -> str:
    """The kernels' fixed block size: it bounds the AMDGPU workgroup (flat-work-group-size) and the
    NVPTX maxntid, and the launcher uses it."""
    return f"array<i32: {cfg.warps_per_block * cfg.wave_size}, 1, 1>"


def _prologue(cfg: EpKernelConfig) -> str:
    return f"""      %qp = arith.constant 0 : i32
      %me = "mori_shmem.my_pe"() : () -> i32
      %c0i = arith.constant 0 : i32
      %c1i = arith.constant 1 : i32
      %false = arith.constant false
      %true = arith.constant true
      %K = arith.constant {cfg.top_k} : i32
      %W = arith.constant {cfg.world_size} : i32
      %R = arith.constant {cfg.recv_capacity} : i32
      %NULL = arith.constant {cfg.null_fwd} : i32
      %wave = arith.constant {cfg.wave_size} : i32
      %c0x = arith.constant 0 : index
      %c1x = arith.constant 1 : index
      %Kx = arith.constant {cfg.top_k} : index
      %tid_i = gpu.thread_id x
      %lane_i = gpu.lane_id
      %lane = arith.index_cast %lane_i : index to i32
      %bid_i = gpu.block_id x
      %nb_i = gpu.grid_dim x
      %wpb = arith.constant {cfg.warps_per_block} : index
      %wave_x = arith.constant {cfg.wave_size} : index
      %warp_in_block = arith.divui %tid_i, %wave_x : index
      %gw0 = arith.muli %bid_i, %wpb : index
      %gw = arith.addi %gw0, %warp_in_block : index
      %nw = arith.muli %nb_i, %wpb : index
      %null_ptr = llvm.mlir.zero : {P}
      %is_k = arith.cmpi ult, %lane, %K : i32
      %lane0 = arith.cmpi eq, %lane, %c0i : i32
"""


_ROUTE = """        %t = arith.index_cast {token} : index to i32
        %tK = arith.muli %t, %K : i32
        %slotidx = arith.addi %tK, %lane : i32
        %e = scf.if %is_k -> (i32) {{
          %ep = llvm.getelementptr %idx[%slotidx] : ({P}, i32) -> {P}, i32
          %ev = llvm.load %ep : {P} -> i32
          scf.yield %ev : i32
        }} else {{
          %m1 = arith.constant -1 : i32
          scf.yield %m1 : i32
        }}
        %nonneg = arith.cmpi sge, %e, %c0i : i32
        %pe_raw = arith.divsi %e, %Er : i32
        %inrange = arith.cmpi slt, %pe_raw, %W : i32
        %valid0 = arith.andi %nonneg, %inrange : i1
        %valid = arith.andi %valid0, %is_k : i1
        %pe = arith.select %valid, %pe_raw, %W : i32
        %dup = scf.for %j = %c0x to %Kx step %c1x iter_args(%d = %false) -> (i1) {{
          %j32 = arith.index_cast %j : index to i32
          %pj, %okj = gpu.shuffle idx %pe, %j32, %wave : i32
          %earlier = arith.cmpi ult, %j32, %lane : i32
          %same = arith.cmpi eq, %pj, %pe : i32
          %hit = arith.andi %earlier, %same : i1
          %d2 = arith.ori %d, %hit : i1
          scf.yield %d2 : i1
        }}
        %notdup = arith.xori %dup, %true : i1
        %rep = arith.andi %valid, %notdup : i1
        %slot = scf.if %rep -> (i32) {{
{reserve}          scf.yield %sl : i32
        }} else {{
          scf.yield %c0i : i32
        }}
        %fits = arith.cmpi ult, %slot, {capacity} : i32
        %ok = arith.andi %rep, %fits : i1
        %nofit = arith.xori %fits, %true : i1
        %overflow = arith.andi %rep, %nofit : i1
        scf.if %overflow {{
          %ov = llvm.atomicrmw add %status, %c1i monotonic : {P}, i32
        }}
        scf.if %is_k {{
          %code0 = arith.muli %pe, %R : i32
          %code1 = arith.addi %code0, %slot : i32
          %code = arith.select %ok, %code1, %NULL : i32
          %fp = llvm.getelementptr %fwd[%slotidx] : ({P}, i32) -> {P}, i32
          llvm.store %code, %fp : i32, {P}
        }}
{count_dest}        %ok32 = arith.extui %ok : i1 to i32
"""

_DEST_COUNT = """        scf.if %ok {{
          %dp = llvm.getelementptr %dest_ctr[%pe] : ({P}, i32) -> {P}, i32
          %dc = llvm.atomicrmw add %dp, %c1i monotonic : {P}, i32
        }}
"""

_REMOTE_RESERVE = """          %sl = "mori_ep.reserve_slot"(%slot_ctr, %pe) : ({P}, i32) -> i32
"""


def route_token(*, reserve: str = "", capacity: str = "%R", count_dest: bool = True, token: str = "%t_x") -> str:
    """Per token %t_x (one warp; lanes < K hold one expert slot each): read the expert id, drop invalid
    ids and duplicates per destination PE (the lowest k represents it), reserve a slot on the
    destination (``reserve`` sets %sl from %pe; default: ``mori_ep.reserve_slot`` on the peer's
    %slot_ctr), drop and count (%status) reservations at or past ``capacity``, and store the forward map
    (pe * R + slot, or %NULL). ``token``: the index value of the token. Defines %t, %e, %pe, %slot, %ok,
    %ok32, %slotidx."""
    return _ROUTE.format(P=P, token=token, reserve=reserve or _REMOTE_RESERVE.format(P=P), capacity=capacity,
                         count_dest=_DEST_COUNT.format(P=P) if count_dest else "")


# Token %t's source row in %x and its weight for this lane (0.0 without weights or past K).
_TOKEN_SOURCE = """        %t64 = arith.extui %t : i32 to i64
        %src_off = arith.muli %t64, %row : i64
        %src_row = llvm.getelementptr %x[%src_off] : ({P}, i64) -> {P}, i8
        %wv = scf.if %is_k -> (f32) {{
          %wz = arith.constant 0.0 : f32
          %wr = scf.if %has_w -> (f32) {{
            %wsp = llvm.getelementptr %w[%slotidx] : ({P}, i32) -> {P}, f32
            %wl = llvm.load %wsp : {P} -> f32
            scf.yield %wl : f32
          }} else {{
            scf.yield %wz : f32
          }}
          scf.yield %wr : f32
        }} else {{
          %wz2 = arith.constant 0.0 : f32
          scf.yield %wz2 : f32
        }}
"""


def send_to_destinations(cfg: "EpKernelConfig", *, rows: bool = True, scales: bool = True) -> str:
    """For each destination of token %t (the K representatives, broadcast from their lanes): the row
    (``rows``: ``mori_ep.row_copy`` to row %dbase + slot of %out_x), the scales (``scales``: to %out_s),
    the K expert ids and weights (lanes < K) and the source position me * S + t (lane 0), as relaxed
    system-scope stores. Needs %dbase (0 for IntraNode), %src_row, %t64, %wv."""
    scale_copy = _SCALES.format(P=P, sb=cfg.scale_bytes) if scales and cfg.scale_bytes else ""
    return _SEND_LOOP.format(P=P, rows=_ROWS.format(P=P, scales=scale_copy) if rows else scale_copy)


_SCALES = """            scf.if %has_s {{
              %sb = arith.constant {sb} : i64
              %sdo = arith.muli %sl64, %sb : i64
              %sdst = llvm.getelementptr %out_s[%sdo] : ({P}, i64) -> {P}, i8
              %sso = arith.muli %t64, %sb : i64
              %ssrc = llvm.getelementptr %s[%sso] : ({P}, i64) -> {P}, i8
              "mori_ep.row_copy"(%sdst, %ssrc, %sb, %pek) : ({P}, {P}, i64, i32) -> ()
            }}
"""

_ROWS = """            %dst_off = arith.muli %sl64, %row : i64
            %dst_row = llvm.getelementptr %out_x[%dst_off] : ({P}, i64) -> {P}, i8
            "mori_ep.row_copy"(%dst_row, %src_row, %row, %pek) : ({P}, {P}, i64, i32) -> ()
{scales}"""

_SEND_LOOP = """        scf.for %k = %c0x to %Kx step %c1x {{
          %k32 = arith.index_cast %k : index to i32
          %okk, %v1 = gpu.shuffle idx %ok32, %k32, %wave : i32
          %pek, %v2 = gpu.shuffle idx %pe, %k32, %wave : i32
          %slk, %v3 = gpu.shuffle idx %slot, %k32, %wave : i32
          %send = arith.cmpi ne, %okk, %c0i : i32
          scf.if %send {{
            %drow = arith.addi %dbase, %slk : i32
            %sl64 = arith.extui %drow : i32 to i64
{rows}            scf.if %is_k {{
              %mi0 = arith.muli %drow, %K : i32
              %mi = arith.addi %mi0, %lane : i32
              %ip = llvm.getelementptr %out_idx[%mi] : ({P}, i32) -> {P}, i32
              "mori_shmem.p"(%ip, %e, %pek, %qp) {{c_type = "int32"}} : ({P}, i32, i32, i32) -> ()
              scf.if %has_w {{
                %owp = llvm.getelementptr %out_w[%mi] : ({P}, i32) -> {P}, f32
                "mori_shmem.p"(%owp, %wv, %pek, %qp) {{c_type = "float"}} : ({P}, f32, i32, i32) -> ()
              }}
            }}
            scf.if %lane0 {{
              %pos0 = arith.muli %me, %S : i32
              %pos = arith.addi %pos0, %t : i32
              %pp = llvm.getelementptr %src_pos[%drow] : ({P}, i32) -> {P}, i32
              "mori_shmem.p"(%pp, %pos, %pek, %qp) {{c_type = "int32"}} : ({P}, i32, i32, i32) -> ()
            }}
          }}
        }}
"""


# The token row to all its destinations at once (lane k < K names destination k, row %dbase + slot on
# PE pe, when %ok): each vector is loaded once and stored to every destination.
_ROW_TO_PEERS = """        %ldrow = arith.addi %dbase, %slot : i32
        %ldrow64 = arith.extui %ldrow : i32 to i64
        %ldoff = arith.muli %ldrow64, %row : i64
        %ldst = llvm.getelementptr %out_x[%ldoff] : ({P}, i64) -> {P}, i8
        "mori_ep.row_copy_to_peers"(%ldst, %src_row, %row, %pe, %ok) {{max_peers = {K} : i64}} : ({P}, {P}, i64, i32, i1) -> ()
"""


# The IntraNode/IntraNodeLL dispatch round: its parity selects the slot counter (double-buffered; see the
# module docstring), and thread 0 of block 0 clears the other one.
_DISPATCH_ROUND = """      // Round parity selects this round's slot counter; thread 0 of block 0 clears the other one.
      %round = llvm.load %round_ctr : {P} -> i64
      %one64 = arith.constant 1 : i64
      %par64 = arith.andi %round, %one64 : i64
      %par = arith.trunci %par64 : i64 to i32
      %slot_ctr = llvm.getelementptr %slot_ctrs[%par] : ({P}, i32) -> {P}, i32
      %other = arith.xori %par, %c1i : i32
      %tid = arith.index_cast %tid_i : index to i32
      %b0 = arith.cmpi eq, %bid_i, %c0x : index
      %t0 = arith.cmpi eq, %tid, %c0i : i32
      %first_thread = arith.andi %b0, %t0 : i1
      scf.if %first_thread {{
        %octr = llvm.getelementptr %slot_ctrs[%other] : ({P}, i32) -> {P}, i32
        "mori_shmem.p"(%octr, %c0i, %me, %qp) {{c_type = "uint32"}} : ({P}, i32, i32, i32) -> ()
      }}
"""


def dispatch_completion(cfg: "EpKernelConfig") -> str:
    """The end of an IntraNode/IntraNodeLL dispatch: the grid meets (its fences publish every payload
    store of this PE), warp 0 of block 0 runs the count handshake, and the round advances on the device."""
    return f"""      "mori_ep.grid_barrier"(%grid_ctr) : ({P}) -> ()
      %w0 = arith.cmpi eq, %warp_in_block, %c0x : index
      %first_warp = arith.andi %b0, %w0 : i1
      scf.if %first_warp {{
        "mori_ep.count_signal"(%signals, %dest_ctr, %total) {{world_size = {cfg.world_size} : i64}} : ({P}, {P}, {P}) -> ()
        scf.if %lane0 {{
          %next = arith.addi %round, %one64 : i64
          llvm.store %next, %round_ctr : i64, {P}
        }}
      }}
"""


def _reduce_tokens(cfg: EpKernelConfig, source_row: str, *, uniform: bool = False, setup: str = "",
                   narrow: bool = False) -> str:
    """Per token: K source rows (valid ones from `source_row(k)`, else the zero row) summed in fp32, and
    the K weight vectors. `source_row` is MLIR text computing %src{k}/%wsrc{k} from %pe{k}, %sl{k}, %t.
    ``uniform``: lane k's forward entry is broadcast with gpu.subgroup_broadcast (AMDGPU: v_readlane into
    SGPRs, so the per-token address arithmetic is scalar) instead of a shuffle. ``setup``: MLIR text run
    once per warp before the token loop. ``narrow``: work-item divisions in 32 bits where they fit."""
    lines = []
    for k in range(cfg.top_k):
        bcast = (f"%f{k} = gpu.subgroup_broadcast %fl, specific_lane %k{k} : i32" if uniform else
                 f"%f{k}, %fv{k} = gpu.shuffle idx %fl, %k{k}, %wave : i32")  # fmt: skip
        lines.append(f"""        %k{k} = arith.constant {k} : i32
        {bcast}
        %valid{k} = arith.cmpi ne, %f{k}, %NULL : i32
        %pe{k} = arith.divui %f{k}, %R : i32
        %sl{k} = arith.remui %f{k}, %R : i32
        %sl64_{k} = arith.extui %sl{k} : i32 to i64
{source_row.format(k=k)}        %src{k} = arith.select %valid{k}, %row{k}, %zero_row : {P}
        %wsrc{k} = arith.select %valid{k}, %wrow{k}, %zero_row : {P}""")
    srcs = ", ".join(f"%srco{k}" for k in range(cfg.top_k))
    types = ", ".join([P, "i64"] + [P] * cfg.top_k)
    offs = "\n".join(f"        %srco{k} = llvm.getelementptr %src{k}[%boff] : ({P}, i64) -> {P}, i8"
                      for k in range(cfg.top_k))
    wsum, cur = [], "%wz"
    wp = f"{P}<1>" if uniform else P  # uniform (AMDGPU): the weight rows as global memory too
    for k in range(cfg.top_k):
        cast = f"          %wg{k} = llvm.addrspacecast %wsrc{k} : {P} to {wp}\n" if uniform else ""
        wsum.append(f"""{cast}          %wp{k} = llvm.getelementptr %{"wg" if uniform else "wsrc"}{k}[%lane] : ({wp}, i32) -> {wp}, f32
          %wl{k} = llvm.load %wp{k} : {wp} -> f32
          %ws{k} = arith.addf {cur}, %wl{k} : f32""")
        cur = f"%ws{k}"
    per_token = "\n".join(lines)
    nvec = cfg.row_bytes // 16
    per_vec = 16 // cfg.elem_bytes
    # Work items are (token, slice of the row): with few tokens, several warps share a token, so that
    # every warp of the grid has loads in flight (the latency of a row is then split, not serialized).
    # narrow: the divisions in 32 bits when every work item index fits (64-bit division is ~100
    # instructions on AMDGPU, expanded next to its 32-bit fast path).
    narrow = narrow and cfg.max_tokens_per_rank * nvec < 2**31

    def div(result: str, op: str, a: str, b: str) -> str:
        if not narrow:
            return f"%{result} = arith.{op} {a}, {b} : index"
        return (f"%{result}_a = arith.index_castui {a} : index to i32\n"
                f"        %{result}_b = arith.index_castui {b} : index to i32\n"
                f"        %{result}_n = arith.{op} %{result}_a, %{result}_b : i32\n"
                f"        %{result} = arith.index_castui %{result}_n : i32 to index")  # fmt: skip

    return f"""{setup}      %n_x = arith.index_cast %n : i32 to index
      %nvec = arith.constant {nvec} : index
      %n1 = arith.maxui %n_x, %c1x : index
      {div("spt0", "divui", "%nw", "%n1")}
      %spt1 = arith.maxui %spt0, %c1x : index
      %spt = arith.minui %spt1, %nvec : index
      %chunk0 = arith.addi %nvec, %spt : index
      %chunk1 = arith.subi %chunk0, %c1x : index
      {div("chunk", "divui", "%chunk1", "%spt")}
      %items = arith.muli %n_x, %spt : index
      scf.for %it = %gw to %items step %nw {{
        {div("t_x", "divui", "%it", "%spt")}
        {div("sl_x", "remui", "%it", "%spt")}
        %v0 = arith.muli %sl_x, %chunk : index
        %v1a = arith.addi %v0, %chunk : index
        %v1 = arith.minui %v1a, %nvec : index
        %nonempty = arith.cmpi ult, %v0, %v1 : index
        scf.if %nonempty {{
        %t = arith.index_cast %t_x : index to i32
        %t64 = arith.extui %t : i32 to i64
        %tK = arith.muli %t, %K : i32
        %fidx = arith.addi %tK, %lane : i32
        %fl = scf.if %is_k -> (i32) {{
          %fp = llvm.getelementptr %fwd[%fidx] : ({P}, i32) -> {P}, i32
          %fv = llvm.load %fp : {P} -> i32
          scf.yield %fv : i32
        }} else {{
          scf.yield %NULL : i32
        }}
{per_token}
        %v0_64 = arith.index_cast %v0 : index to i64
        %sixteen = arith.constant 16 : i64
        %boff = arith.muli %v0_64, %sixteen : i64
        %nv = arith.subi %v1, %v0 : index
        %nv64 = arith.index_cast %nv : index to i64
        %pervec = arith.constant {per_vec} : i64
        %elems = arith.muli %nv64, %pervec : i64
{offs}
        %oo = arith.muli %t64, %rowc : i64
        %oo2 = arith.addi %oo, %boff : i64
        %orow = llvm.getelementptr %out[%oo2] : ({P}, i64) -> {P}, i8
        "mori_ep.accumulate_rows"(%orow, %elems, {srcs}) {{dtype = "{cfg.dtype}"}} : ({types}) -> ()
        %want_w = llvm.icmp "ne" %out_w, %null_ptr : {P}
        %first_slice = arith.cmpi eq, %sl_x, %c0x : index
        %lane_w0 = arith.andi %want_w, %is_k : i1
        %lane_w = arith.andi %lane_w0, %first_slice : i1
        scf.if %lane_w {{
          %wz = arith.constant 0.0 : f32
{chr(10).join(wsum)}
          %owp = llvm.getelementptr %out_w[%fidx] : ({P}, i32) -> {P}, f32
          llvm.store {cur}, %owp : f32, {P}
        }}
        }}
      }}
"""


# Once per warp (combine pull, uniform-addressing): lane p < W holds PE p's addresses of the registered
# rows and weights (other lanes their own PE's), split in 32-bit halves for broadcasts.
def return_rows(locate: str, dst_x: str, dst_w: str) -> str:
    """Every received row i < *%total (one warp each) goes back to its owner: ``locate`` (MLIR text)
    computes %owner and %drow from %i; the warp copies input row i into row %drow of ``dst_x`` on the
    owner (``mori_ep.row_copy``) and lanes < K store its weights into ``dst_w`` (relaxed system scope).
    Needs %inp, %inp_w, %has_iw, %rowc, %total."""
    return f"""      %tot = llvm.load %total : {P} -> i32
      %tot_x = arith.index_cast %tot : i32 to index
      scf.for %i_x = %gw to %tot_x step %nw {{
        %i = arith.index_cast %i_x : index to i32
        %i64 = arith.extui %i : i32 to i64
{locate}        %drow64 = arith.extui %drow : i32 to i64
        %do = arith.muli %drow64, %rowc : i64
        %dst = llvm.getelementptr {dst_x}[%do] : ({P}, i64) -> {P}, i8
        %io = arith.muli %i64, %rowc : i64
        %src = llvm.getelementptr %inp[%io] : ({P}, i64) -> {P}, i8
        "mori_ep.row_copy"(%dst, %src, %rowc, %owner) : ({P}, {P}, i64, i32) -> ()
        %send_w = arith.andi %has_iw, %is_k : i1
        scf.if %send_w {{
          %iK = arith.muli %i, %K : i32
          %wi = arith.addi %iK, %lane : i32
          %wsp = llvm.getelementptr %inp_w[%wi] : ({P}, i32) -> {P}, f32
          %wv = llvm.load %wsp : {P} -> f32
          %dK = arith.muli %drow, %K : i32
          %dwi = arith.addi %dK, %lane : i32
          %dwp = llvm.getelementptr {dst_w}[%dwi] : ({P}, i32) -> {P}, f32
          "mori_shmem.p"(%dwp, %wv, %owner, %qp) {{c_type = "float"}} : ({P}, f32, i32, i32) -> ()
        }}
      }}
"""



def install() -> None:
    """Answer ep_ll_kernels' ``from .ep_kernels import ...`` with this module."""
    sys.modules.setdefault(f"{__package__}.ep_kernels", sys.modules[__name__])


def build_ll_kernels(ep: ir.Operation, cfg: EpKernelConfig, *, uniform_addressing: bool,
                     global_address_space: bool) -> list[ir.Operation]:  # fmt: skip
    """The text kernels of ep_ll_kernels for EP op ``ep`` (dispatch_ll or an AsyncLL half), parsed and
    moved before ``ep``; a text that does not parse is a GeneratorError naming its generator."""
    install()
    from . import ep_ll_kernels
    from mori_compiler.dialects import mori_ep

    if ep.name == "mori_ep.dispatch_ll":
        generator = "ep_ll_kernels.dispatch_ll_kernel"
        text = ep_ll_kernels.dispatch_ll_kernel(cfg, global_address_space)
    else:
        generator = "ep_ll_kernels.async_kernels_for"
        ints = mori_ep.int_attributes(ep)
        text = ep_ll_kernels.async_kernels_for(ep.name, cfg, bool(ints["early_notify"]), bool(ints["fused_recv"]),
                                               uniform_addressing)  # fmt: skip
    try:
        parsed = ir.Module.parse("gpu.module @tmp {\n" + text + "}\n")
    except ir.MLIRError as exc:
        raise GeneratorError(generator, str(exc)) from None
    ops = list(parsed.body.operations[0].regions[0].blocks[0].operations)
    for op in ops:
        op.operation.move_before(ep)
    return [op.operation for op in ops]
