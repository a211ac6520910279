"""``mori-ep-blocks-to-calls``: lower the EP building blocks to calls of helper functions.

Input: mori_ep building-block ops (row_copy, row_copy_to_peers, reserve_slot, count_signal,
grid_barrier, device_barrier, accumulate_rows) inside gpu.module. Output: ``func.call``s of helper
``func.func``s, added to the gpu.module once per variant and written with mori_shmem, gpu, scf, arith and
llvm ops (they are inlined after the link step: every non-kernel function becomes internal). Options:
``wave-size`` (32 or 64; the lane count of warp-cooperative helpers) and ``vectors-per-lane`` (1 or 2, the
16-byte vectors accumulate_rows sums per lane and iteration).

Each helper's memory-ordering protocol is written next to it below and pinned by lit tests
(test/lit/Conversion/mori-ep-blocks-to-calls.mlir) and by the ISA/PTX tests of the EP kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mori_compiler._mlir import ir, nested_ops
from mori_compiler.dialects.registry import format_location
from mori_compiler.errors import MoriCompilerError

P = "!llvm.ptr"
PREFIX = "__mori_ep_"


# ---- helper function texts ------------------------------------------------------------------------

def row_copy() -> str:
    # A warp-scope put: all lanes cooperate, 16-byte vectors when dest/source alignment allows.
    return f"""func.func @{PREFIX}row_copy(%dst: {P}, %src: {P}, %bytes: i64, %pe: i32) {{
  %qp = arith.constant 0 : i32
  "mori_shmem.putmem_nbi"(%dst, %src, %bytes, %pe, %qp) {{scope = "warp"}} : ({P}, {P}, i64, i32, i32) -> ()
  return
}}
"""


def _vector_rounds(wave: int, targets: list[tuple[str | None, str]]) -> str:
    """The copy loop of the 16-byte-vector row copies: rounds of 8 lane-strided vectors of %src (%bytes
    long), all 8 loads before the stores, each round stored to every (guard, destination pointer) of
    ``targets`` (guard: an i1 value or None). The tail (fewer than 8 vectors left for the lane) is one
    more round of 8 loads, all in flight together: a unit past the end loads vector 0 (always in the row)
    and does not store. A one-vector remainder loop would wait for each load in turn, since its stores may
    alias the next load (up to 7 round trips per row: on H200 the fixed cost of a 7 KB fp8 row at 128
    tokens)."""

    def guarded(guard: str | None, body: str) -> str:
        return body if guard is None else f"    scf.if {guard} {{\n{body}\n    }}"

    loads = "\n".join(f"    %i{u} = arith.addi %j, %o{u} : i64\n"
                       f"    %s{u} = llvm.getelementptr %src[%i{u}] : ({P}, i64) -> {P}, vector<4xi32>\n"
                       f"    %v{u} = llvm.load %s{u} {{alignment = 16 : i64}} : {P} -> vector<4xi32>" for u in range(8))
    stores = "\n".join(guarded(guard, "\n".join(
        f"    %p{t}_{u} = llvm.getelementptr {dst}[%i{u}] : ({P}, i64) -> {P}, vector<4xi32>\n"
        f"    llvm.store %v{u}, %p{t}_{u} {{alignment = 16 : i64}} : vector<4xi32>, {P}" for u in range(8)))
        for t, (guard, dst) in enumerate(targets))  # fmt: skip
    tail_loads = "\n".join(f"    %ti{u} = arith.addi %j8, %o{u} : i64\n"
                            f"    %tin{u} = arith.cmpi ult, %ti{u}, %nvec : i64\n"
                            f"    %tl{u} = arith.select %tin{u}, %ti{u}, %zero : i64\n"
                            f"    %ts{u} = llvm.getelementptr %src[%tl{u}] : ({P}, i64) -> {P}, vector<4xi32>\n"
                            f"    %tv{u} = llvm.load %ts{u} {{alignment = 16 : i64}} : {P} -> vector<4xi32>"
                            for u in range(8))  # fmt: skip
    tail_stores = "\n".join(guarded(guard, "\n".join(
        f"    scf.if %tin{u} {{\n"
        f"      %tp{t}_{u} = llvm.getelementptr {dst}[%ti{u}] : ({P}, i64) -> {P}, vector<4xi32>\n"
        f"      llvm.store %tv{u}, %tp{t}_{u} {{alignment = 16 : i64}} : vector<4xi32>, {P}\n"
        f"    }}" for u in range(8))) for t, (guard, dst) in enumerate(targets))  # fmt: skip
    offs = "\n".join(f"  %o{u} = arith.constant {u * wave} : i64" for u in range(8))
    return f"""  %lane_i = gpu.lane_id
  %lane = arith.index_cast %lane_i : index to i64
  %sixteen = arith.constant 16 : i64
  %zero = arith.constant 0 : i64
  %nvec = arith.divui %bytes, %sixteen : i64
{offs}
  %step8 = arith.constant {8 * wave} : i64
  %j8 = scf.while (%j = %lane) : (i64) -> i64 {{
    %last = arith.addi %j, %o7 : i64
    %more = arith.cmpi ult, %last, %nvec : i64
    scf.condition(%more) %j : i64
  }} do {{
  ^bb0(%j: i64):
{loads}
{stores}
    %next = arith.addi %j, %step8 : i64
    scf.yield %next : i64
  }}
  %left = arith.cmpi ult, %j8, %nvec : i64
  scf.if %left {{
{tail_loads}
{tail_stores}
  }}
"""


def row_copy_vec16(wave: int) -> str:
    # The variant for rows whose size is a constant multiple of 16 bytes (token rows; buffers are
    # 256-byte aligned): the peer address once (mori_shmem.ptr), then rounds of 8 lane-strided 16-byte
    # vectors (_vector_rounds), no byte loops. Plain stores: the caller publishes them (release fence
    # before its signal).
    return f"""func.func @{PREFIX}row_copy_vec16(%dst: {P}, %src: {P}, %bytes: i64, %pe: i32) {{
  %peer = "mori_shmem.ptr"(%dst, %pe) : ({P}, i32) -> {P}
{_vector_rounds(wave, [(None, "%peer")])}  return
}}
"""


def row_copy_to_peers(wave: int, max_peers: int) -> str:
    # One row to up to K = max_peers destinations (lane k < K names destination k: its symmetric row
    # address and PE, and whether to send). Each lane resolves its own destination's peer address once
    # (mori_shmem.ptr; a lane that does not send resolves its own PE, so no table read is out of range),
    # then every round (_vector_rounds) loads 8 lane-strided 16-byte vectors of the source once and stores
    # them to each sending destination (addresses and flags broadcast from lane k by shuffles: warp-uniform
    # branches). Compared with K row_copy calls, the row is read once, not once per destination, and a token
    # costs ceil(vectors / (8 x wave)) load round trips, not K times that. Plain stores: the caller
    # publishes them (release fence before its signal).
    bcast = []
    for k in range(max_peers):
        bcast.append(f"""  %kk{k} = arith.constant {k} : i32
  %sk{k}, %sok{k} = gpu.shuffle idx %s32, %kk{k}, %width : i32
  %on{k} = arith.cmpi ne, %sk{k}, %c0i : i32
  %lok{k}, %look{k} = gpu.shuffle idx %lo, %kk{k}, %width : i32
  %hik{k}, %hiok{k} = gpu.shuffle idx %hi, %kk{k}, %width : i32
  %lo64_{k} = arith.extui %lok{k} : i32 to i64
  %hi64_{k} = arith.extui %hik{k} : i32 to i64
  %hs{k} = arith.shli %hi64_{k}, %c32 : i64
  %a{k} = arith.ori %hs{k}, %lo64_{k} : i64
  %d{k} = llvm.inttoptr %a{k} : i64 to {P}""")
    nl = "\n"
    targets = [(f"%on{k}", f"%d{k}") for k in range(max_peers)]
    return f"""func.func @{PREFIX}row_copy_to_peers_k{max_peers}(%dst: {P}, %src: {P}, %bytes: i64, %pe: i32, %send: i1) {{
  %me = "mori_shmem.my_pe"() : () -> i32
  %pe_s = arith.select %send, %pe, %me : i32
  %peer = "mori_shmem.ptr"(%dst, %pe_s) : ({P}, i32) -> {P}
  %pi = llvm.ptrtoint %peer : {P} to i64
  %c32 = arith.constant 32 : i64
  %c0i = arith.constant 0 : i32
  %lo = arith.trunci %pi : i64 to i32
  %pih = arith.shrui %pi, %c32 : i64
  %hi = arith.trunci %pih : i64 to i32
  %s32 = arith.extui %send : i1 to i32
  %width = arith.constant {wave} : i32
{nl.join(bcast)}
{_vector_rounds(wave, targets)}  return
}}
"""


def reserve_slot() -> str:
    # Relaxed system-scope fetch-add on the peer's counter: slots are unique per destination and round;
    # ordering comes later from the count handshake (release fence + acquire fence).
    return f"""func.func @{PREFIX}reserve_slot(%ctr: {P}, %pe: i32) -> i32 {{
  %qp = arith.constant 0 : i32
  %one = arith.constant 1 : i32
  %slot = "mori_shmem.atomic_fetch_add"(%ctr, %one, %pe, %qp) {{elem = "uint32"}} : ({P}, i32, i32, i32) -> i32
  return %slot : i32
}}
"""


def _warp_sum_i32(value: str, wave: int, prefix: str) -> tuple[str, str]:
    lines, cur, off = [], value, wave // 2
    while off >= 1:
        lines.append(f"  %{prefix}o{off} = arith.constant {off} : i32")
        lines.append(f"  %{prefix}s{off}, %{prefix}ok{off} = gpu.shuffle xor %{cur.lstrip('%')}, %{prefix}o{off}, "
                     f"%{prefix}width : i32")  # fmt: skip
        lines.append(f"  %{prefix}a{off} = arith.addi %{cur.lstrip('%')}, %{prefix}s{off} : i32")
        cur, off = f"%{prefix}a{off}", off // 2
    return "\n".join([f"  %{prefix}width = arith.constant {wave} : i32", *lines]), cur


def count_signal(world: int, wave: int) -> str:
    # Protocol (one warp; lane p < W talks to PE p), per ep-semantics.md §3.0:
    #  send:    wait (remote, relaxed system-scope polls) until PE p's slot signals[me] is 0, i.e. PE p
    #           consumed our previous round (flow control); fence (release: our payload stores to p are
    #           ordered before); relaxed system-scope store of count+1 into PE p's signals[me].
    #  receive: poll our signals[p] until > 0; fence (acquire: PE p's payload is visible); count = v - 1;
    #           reset our slot to 0 with a relaxed system-scope store (PE p polls it next round).
    # Counts travel as count + 1 so that 0 means "nothing yet". The warp sums the counts into *total.
    total, last = _warp_sum_i32("%got", wave, "r")
    return f"""func.func @{PREFIX}count_signal_w{world}(%signals: {P}, %counts: {P}, %total: {P}) {{
  %qp = arith.constant 0 : i32
  %lane_i = gpu.lane_id
  %lane = arith.index_cast %lane_i : index to i32
  %world = arith.constant {world} : i32
  %me = "mori_shmem.my_pe"() : () -> i32
  %active = arith.cmpi ult, %lane, %world : i32
  %got = scf.if %active -> (i32) {{
    %myslot = llvm.getelementptr %signals[%me] : ({P}, i32) -> {P}, i64
    %peerslot = "mori_shmem.ptr"(%myslot, %lane) : ({P}, i32) -> {P}
    %z64 = arith.constant 0 : i64
    %free = "mori_shmem.wait_until"(%peerslot, %z64) {{cmp = "equals", elem = "uint64"}} : ({P}, i64) -> i64
    %cntp = llvm.getelementptr %counts[%lane] : ({P}, i32) -> {P}, i32
    %cnt = llvm.load %cntp : {P} -> i32
    %cnt64 = arith.extui %cnt : i32 to i64
    %one64 = arith.constant 1 : i64
    %value = arith.addi %cnt64, %one64 : i64
    "mori_shmem.fence"() : () -> ()
    "mori_shmem.p"(%myslot, %value, %lane, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
    %z32 = arith.constant 0 : i32
    llvm.store %z32, %cntp : i32, {P}
    %inslot = llvm.getelementptr %signals[%lane] : ({P}, i32) -> {P}, i64
    %seen = "mori_shmem.wait_until"(%inslot, %z64) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
    "mori_shmem.fence"() : () -> ()
    "mori_shmem.p"(%inslot, %z64, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
    %recv64 = arith.subi %seen, %one64 : i64
    %recv = arith.trunci %recv64 : i64 to i32
    scf.yield %recv : i32
  }} else {{
    %zero = arith.constant 0 : i32
    scf.yield %zero : i32
  }}
{total}
  %c0 = arith.constant 0 : i32
  %first = arith.cmpi eq, %lane, %c0 : i32
  scf.if %first {{
    llvm.store {last}, %total : i32, {P}
  }}
  return
}}
"""


def grid_barrier() -> str:
    # Protocol (sense-reversal on {arrivals, generation}, two u64 words): the block meets (gpu.barrier);
    # thread 0 reads the generation g, fences (release: the block's stores), and adds 1 to the arrival
    # count (relaxed, system scope). The last block to arrive resets the count to 0 and then publishes
    # g + 1 (after a fence); the others poll the generation until it passes g, then fence (acquire). The
    # block meets again. Works for any grid size per launch; no host reset (graph-replay safe).
    return f"""func.func @{PREFIX}grid_barrier(%ctr: {P}) {{
  %qp = arith.constant 0 : i32
  gpu.barrier
  %tid = gpu.thread_id x
  %c0 = arith.constant 0 : index
  %leader = arith.cmpi eq, %tid, %c0 : index
  scf.if %leader {{
    %nb_i = gpu.grid_dim x
    %nb = arith.index_cast %nb_i : index to i64
    %me = "mori_shmem.my_pe"() : () -> i32
    %one = arith.constant 1 : i64
    %zero = arith.constant 0 : i64
    %genp = llvm.getelementptr %ctr[1] : ({P}) -> {P}, i64
    %g = llvm.load %genp atomic monotonic {{alignment = 8 : i64}} : {P} -> i64
    "mori_shmem.fence"() : () -> ()
    %old = "mori_shmem.atomic_fetch_add"(%ctr, %one, %me, %qp) {{elem = "uint64"}} : ({P}, i64, i32, i32) -> i64
    %last_n = arith.subi %nb, %one : i64
    %last = arith.cmpi eq, %old, %last_n : i64
    scf.if %last {{
      "mori_shmem.p"(%ctr, %zero, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
      "mori_shmem.fence"() : () -> ()
      %g1 = arith.addi %g, %one : i64
      "mori_shmem.p"(%genp, %g1, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
    }} else {{
      %seen = "mori_shmem.wait_until"(%genp, %g) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
    }}
    "mori_shmem.fence"() : () -> ()
  }}
  gpu.barrier
  return
}}
"""


def device_barrier(world: int) -> str:
    # Protocol (block b of PE me meets block b of every PE): every thread reads epoch e0 = epochs[b]
    # (this PE's private counter for block b), the block meets, thread 0 stores e = e0 + 1 back (no one
    # reads it again this round). Threads p < W: fence (release: everything this PE wrote before the
    # barrier), relaxed system-scope store of e into slots[b][me] on PE p; poll our slots[b][p] until
    # >= e; fence (acquire). The block meets. Epochs only grow and are kept on the device, so graph
    # replay is correct and no reset is needed. The op's max_blocks sizes the slot arrays; blocks beyond it are a
    # launch error (host check).
    return f"""func.func @{PREFIX}device_barrier_w{world}(%slots: {P}, %epochs: {P}) {{
  %qp = arith.constant 0 : i32
  %b_i = gpu.block_id x
  %b = arith.index_cast %b_i : index to i64
  %epp = llvm.getelementptr %epochs[%b] : ({P}, i64) -> {P}, i64
  %e0 = llvm.load %epp : {P} -> i64
  gpu.barrier
  %one = arith.constant 1 : i64
  %e = arith.addi %e0, %one : i64
  %tid_i = gpu.thread_id x
  %tid = arith.index_cast %tid_i : index to i32
  %c0 = arith.constant 0 : i32
  %leader = arith.cmpi eq, %tid, %c0 : i32
  scf.if %leader {{
    llvm.store %e, %epp : i64, {P}
  }}
  %world = arith.constant {world} : i32
  %world64 = arith.constant {world} : i64
  %talker = arith.cmpi ult, %tid, %world : i32
  scf.if %talker {{
    %me = "mori_shmem.my_pe"() : () -> i32
    %me64 = arith.extui %me : i32 to i64
    %p64 = arith.extui %tid : i32 to i64
    %row = arith.muli %b, %world64 : i64
    %mine = arith.addi %row, %me64 : i64
    %outslot = llvm.getelementptr %slots[%mine] : ({P}, i64) -> {P}, i64
    "mori_shmem.fence"() : () -> ()
    "mori_shmem.p"(%outslot, %e, %tid, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
    %theirs = arith.addi %row, %p64 : i64
    %inslot = llvm.getelementptr %slots[%theirs] : ({P}, i64) -> {P}, i64
    %below = arith.subi %e, %one : i64
    %seen = "mori_shmem.wait_until"(%inslot, %below) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
    "mori_shmem.fence"() : () -> ()
  }}
  gpu.barrier
  return
}}
"""


def _vector_sum(dtype: str, k: int, tag: str, off: str) -> tuple[list[str], list[str], str]:
    """MLIR lines of one 16-byte vector summed over K sources at byte offset ``off``: (the K loads, the
    widening/adds/rounding, the name of the 4 x i32 result). ``tag`` keeps SSA names apart."""
    per_vec = 8 if dtype == "bf16" else 4
    loads, math = [], []
    for i in range(k):
        loads.append(f"    %p{tag}{i} = llvm.getelementptr %s{i}[{off}] : ({P}, i64) -> {P}, i8")
        loads.append(f"    %l{tag}{i} = llvm.load %p{tag}{i} {{alignment = 16 : i64}} : {P} -> vector<4xi32>")
    for i in range(k):
        if dtype == "bf16":
            math.append(f"    %c{tag}{i} = llvm.bitcast %l{tag}{i} : vector<4xi32> to vector<8xbf16>")
            math.append(f"    %f{tag}{i} = arith.extf %c{tag}{i} : vector<8xbf16> to vector<8xf32>")
        else:
            math.append(f"    %f{tag}{i} = llvm.bitcast %l{tag}{i} : vector<4xi32> to vector<4xf32>")
    cur = f"%f{tag}0"
    for i in range(1, k):
        math.append(f"    %acc{tag}{i} = arith.addf {cur}, %f{tag}{i} : vector<{per_vec}xf32>")
        cur = f"%acc{tag}{i}"
    if dtype == "bf16":
        math.append(f"    %rt{tag} = arith.truncf {cur} : vector<8xf32> to vector<8xbf16>")
        math.append(f"    %ro{tag} = llvm.bitcast %rt{tag} : vector<8xbf16> to vector<4xi32>")
    else:
        math.append(f"    %ro{tag} = llvm.bitcast {cur} : vector<4xf32> to vector<4xi32>")
    return loads, math, f"%ro{tag}"


def _accumulate_prologue(dtype: str, k: int, step: int) -> str:
    srcs = ", ".join(f"%s{i}: {P}" for i in range(k))
    return f"""func.func @{PREFIX}accumulate_rows_{dtype}_k{k}(%out: {P}, %elems: i64, {srcs}) {{
  %lane_i = gpu.lane_id
  %lane = arith.index_cast %lane_i : index to i64
  %per = arith.constant {8 if dtype == "bf16" else 4} : i64
  %nvec = arith.divui %elems, %per : i64
  %lb = arith.index_cast %lane : i64 to index
  %ub = arith.index_cast %nvec : i64 to index
  %step = arith.constant {step} : index
  %sixteen = arith.constant 16 : i64
"""


def accumulate_rows(dtype: str, k: int, wave: int) -> str:
    # Warp-cooperative, lane-strided 16-byte vectors; for each vector all K source loads are issued
    # before the fp32 adds, then one rounding to the output dtype. No ordering of its own: the caller
    # has acquired the sources (device barrier) before.
    loads, math, result = _vector_sum(dtype, k, "", "%off")
    body = "\n".join(loads + math)
    return _accumulate_prologue(dtype, k, wave) + f"""  scf.for %j = %lb to %ub step %step {{
    %j64 = arith.index_cast %j : index to i64
    %off = arith.muli %j64, %sixteen : i64
{body}
    %po = llvm.getelementptr %out[%off] : ({P}, i64) -> {P}, i8
    llvm.store {result}, %po {{alignment = 16 : i64}} : vector<4xi32>, {P}
  }}
  return
}}
"""


def accumulate_rows_x2(dtype: str, k: int, wave: int) -> str:
    # As accumulate_rows with two vectors per lane per iteration (j and j + wave): all 2K loads before the
    # adds. When the second vector is past the end it re-reads the first (loads stay unconditional) and
    # is not stored.
    la, ma, ra = _vector_sum(dtype, k, "a", "%offa")
    lb, mb, rb = _vector_sum(dtype, k, "b", "%offb")
    body = "\n".join(la + lb + ma + mb)
    return _accumulate_prologue(dtype, k, 2 * wave) + f"""  %wave = arith.constant {wave} : i64
  scf.for %j = %lb to %ub step %step {{
    %ja = arith.index_cast %j : index to i64
    %jb0 = arith.addi %ja, %wave : i64
    %second = arith.cmpi ult, %jb0, %nvec : i64
    %jb = arith.select %second, %jb0, %ja : i64
    %offa = arith.muli %ja, %sixteen : i64
    %offb = arith.muli %jb, %sixteen : i64
{body}
    %poa = llvm.getelementptr %out[%offa] : ({P}, i64) -> {P}, i8
    llvm.store {ra}, %poa {{alignment = 16 : i64}} : vector<4xi32>, {P}
    scf.if %second {{
      %pob = llvm.getelementptr %out[%offb] : ({P}, i64) -> {P}, i8
      llvm.store {rb}, %pob {{alignment = 16 : i64}} : vector<4xi32>, {P}
    }}
  }}
  return
}}
"""


def _constant_multiple_of_16(value: ir.Value) -> bool:
    owner = value.owner
    if not isinstance(owner, ir.Block) and owner.name == "arith.constant":
        return isinstance(owner.attributes["value"], ir.IntegerAttr) and owner.attributes["value"].value % 16 == 0
    return False


def helper_for(op: ir.Operation, wave: int, vectors_per_lane: int = 1) -> tuple[str, str]:
    """(helper symbol, helper text) for a block op."""
    name = op.name.split(".", 1)[1]
    attrs = op.attributes
    if name == "row_copy":
        if _constant_multiple_of_16(op.operands[2]):
            return f"{PREFIX}row_copy_vec16", row_copy_vec16(wave)
        return f"{PREFIX}row_copy", row_copy()
    if name == "row_copy_to_peers":
        if not _constant_multiple_of_16(op.operands[2]):
            raise MoriCompilerError(f"'{op.name}' operand 'bytes' must be a constant multiple of 16 (the row is "
                                    f"copied in 16-byte vectors)", format_location(op.location, "-"))  # fmt: skip
        k = attrs["max_peers"].value
        return f"{PREFIX}row_copy_to_peers_k{k}", row_copy_to_peers(wave, k)
    if name == "reserve_slot":
        return f"{PREFIX}reserve_slot", reserve_slot()
    if name == "count_signal":
        world = attrs["world_size"].value
        return f"{PREFIX}count_signal_w{world}", count_signal(world, wave)
    if name == "grid_barrier":
        return f"{PREFIX}grid_barrier", grid_barrier()
    if name == "device_barrier":
        world = attrs["world_size"].value
        return f"{PREFIX}device_barrier_w{world}", device_barrier(world)
    if name == "accumulate_rows":
        dtype, k = attrs["dtype"].value, len(op.operands) - 2
        build = accumulate_rows_x2 if vectors_per_lane == 2 else accumulate_rows
        return f"{PREFIX}accumulate_rows_{dtype}_k{k}", build(dtype, k, wave)
    raise MoriCompilerError(f"'{op.name}' is not a building block", op.location)


def insert_functions(gm: ir.Operation, text: str) -> None:
    """Parse ``text`` (one or more top-level ops) and move its ops to the top of gpu.module ``gm``."""
    parsed = ir.Module.parse(text)  # kept alive while its ops move: a dead parent would free them
    body = gm.regions[0].blocks[0]
    anchor = body.operations[0]
    for op in list(parsed.body.operations):
        op.operation.move_before(anchor)


BLOCK_OPS = ("mori_ep.row_copy", "mori_ep.row_copy_to_peers", "mori_ep.reserve_slot", "mori_ep.count_signal",
             "mori_ep.grid_barrier", "mori_ep.device_barrier", "mori_ep.accumulate_rows")  # fmt: skip


@dataclass(frozen=True)
class MoriEpBlocksToCalls:
    """Lower mori_ep building blocks to calls of helper functions added to the gpu.module.

    Input: mori_ep block ops in gpu.module. Output: func.call + func.func helpers using mori_shmem, gpu,
    scf, arith, llvm. Options: wave-size (32 or 64); vectors-per-lane (1 or 2: 16-byte vectors each lane
    accumulates per iteration; 2 doubles the loads in flight, measured faster on sm_90, while on AMDGPU
    the scheduler then splits the loads around a wait, so the pipeline picks 1 there).
    """

    name: ClassVar[str] = "mori-ep-blocks-to-calls"
    wave_size: int = 64
    vectors_per_lane: int = 1

    def __call__(self, op: ir.Operation, pass_=None) -> None:
        if self.wave_size not in (32, 64):
            raise MoriCompilerError(f"pass '{self.name}' option wave-size must be 32 or 64, got {self.wave_size}")
        if self.vectors_per_lane not in (1, 2):
            raise MoriCompilerError(f"pass '{self.name}' option vectors-per-lane must be 1 or 2, got "
                                    f"{self.vectors_per_lane}")  # fmt: skip
        with op.context:
            for gm in op.operation.regions[0].blocks[0].operations:
                if gm.operation.name == "gpu.module":
                    self._lower_module(gm.operation)

    def _lower_module(self, gm: ir.Operation) -> None:
        found = nested_ops(gm, lambda inner: inner.name in BLOCK_OPS)
        body = gm.regions[0].blocks[0]
        defined = {o.attributes["sym_name"].value for o in body.operations if "sym_name" in o.attributes}
        for op in found:
            symbol, text = helper_for(op, self.wave_size, self.vectors_per_lane)
            if symbol not in defined:
                insert_functions(gm, text)
                defined.add(symbol)
            results = [r.type for r in op.results]
            with ir.InsertionPoint(op), op.location:
                call = ir.Operation.create("func.call", results=results, operands=list(op.operands),
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(symbol)})  # fmt: skip
            for old, new in zip(op.results, call.results):
                old.replace_all_uses_with(new)
            op.erase()
