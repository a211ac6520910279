"""``mori-ep-blocks-to-calls``: lower the EP building blocks to calls of helper functions.

Input: mori_ep building-block ops (row_copy, row_copy_to_peers, reserve_slot, count_signal,
grid_barrier, device_barrier, accumulate_rows) inside gpu.module. Output: ``func.call``s of helper
``func.func``s, added to the gpu.module once per variant and written with mori_shmem, gpu, scf, arith and
llvm ops (they are inlined after the link step: every non-kernel function becomes internal). Options:
``wave-size`` (32 or 64; the lane count of warp-cooperative helpers), ``vectors-per-lane`` (1 or 2, the
16-byte vectors accumulate_rows sums per lane and iteration), ``global-address-space`` and
``loop-destinations`` (the AMDGPU forms; see MoriEpBlocksToCalls).

Each helper's memory-ordering protocol is written next to it below and pinned by lit tests
(test/lit/Conversion/mori-ep-blocks-to-calls*.mlir) and by the ISA/PTX tests of the EP kernels.

Address spaces: the row copies and accumulate_rows take pointers into global memory (the kernels' buffer
arguments, symmetric-heap rows and the peer addresses mori_shmem.ptr returns; never LDS or scratch).
With ``global-address-space`` they cast them to ``!llvm.ptr<1>`` before their loads and stores; the device
ABI keeps its generic signatures (the casts are in the helpers, not the ABI lowering). The ordering is the
same in both forms: the copies' stores are plain and are published by the caller's release fence
(``mori_shmem.fence``), which orders every earlier store of the thread whatever its address space (on
AMDGPU global and flat stores both retire through vmcnt, which the fence's wait covers), and a reader's
acquire fence likewise invalidates the caches that global loads read.
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


def _vector_rounds(wave: int, targets, space: str = "", src: str = "%src") -> str:
    """The copy loop of the 16-byte-vector row copies: rounds of 8 lane-strided vectors of ``src`` (%bytes
    long), all 8 loads before the stores, each round stored to every destination of ``targets``. The tail
    (fewer than 8 vectors left for the lane) is one more round of 8 loads, all in flight together: a unit
    past the end loads vector 0 (always in the row) and does not store. A one-vector remainder loop would
    wait for each load in turn, since its stores may alias the next load (up to 7 round trips per row: on
    H200 the fixed cost of a 7 KB fp8 row at 128 tokens).

    ``targets``: a list of (guard: an i1 value or None, destination pointer), each stored in turn
    (unrolled), or a ``_DestinationLoop`` (one loop over the destinations: compact code). ``space``: the
    pointer type's address-space suffix ("" generic, "<1>" global); ``src`` and the destinations have it."""
    ptr = f"{P}{space}"

    def store_all(body_of) -> str:
        if isinstance(targets, _DestinationLoop):
            return targets.wrap(body_of("%d"), "k")
        return "\n".join(_guarded(guard, body_of(dst), f"{t}") for t, (guard, dst) in enumerate(targets))

    loads = "\n".join(f"    %i{u} = arith.addi %j, %o{u} : i64\n"
                       f"    %s{u} = llvm.getelementptr {src}[%i{u}] : ({ptr}, i64) -> {ptr}, vector<4xi32>\n"
                       f"    %v{u} = llvm.load %s{u} {{alignment = 16 : i64}} : {ptr} -> vector<4xi32>" for u in range(8))
    stores = store_all(lambda dst: "\n".join(
        f"    %p{{t}}_{u} = llvm.getelementptr {dst}[%i{u}] : ({ptr}, i64) -> {ptr}, vector<4xi32>\n"
        f"    llvm.store %v{u}, %p{{t}}_{u} {{{{alignment = 16 : i64}}}} : vector<4xi32>, {ptr}" for u in range(8)))
    tail_loads = "\n".join(f"    %ti{u} = arith.addi %j8, %o{u} : i64\n"
                            f"    %tin{u} = arith.cmpi ult, %ti{u}, %nvec : i64\n"
                            f"    %tl{u} = arith.select %tin{u}, %ti{u}, %zero : i64\n"
                            f"    %ts{u} = llvm.getelementptr {src}[%tl{u}] : ({ptr}, i64) -> {ptr}, vector<4xi32>\n"
                            f"    %tv{u} = llvm.load %ts{u} {{alignment = 16 : i64}} : {ptr} -> vector<4xi32>"
                            for u in range(8))  # fmt: skip
    tail_stores = store_all(lambda dst: "\n".join(
        f"    scf.if %tin{u} {{{{\n"
        f"      %tp{{t}}_{u} = llvm.getelementptr {dst}[%ti{u}] : ({ptr}, i64) -> {ptr}, vector<4xi32>\n"
        f"      llvm.store %tv{u}, %tp{{t}}_{u} {{{{alignment = 16 : i64}}}} : vector<4xi32>, {ptr}\n"
        f"    }}}}" for u in range(8)))  # fmt: skip
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


def _guarded(guard: str | None, body: str, tag: str) -> str:
    """``body`` (a template with {t} for SSA names and doubled braces) for destination ``tag``, under
    ``scf.if guard`` when a guard is given."""
    body = body.format(t=tag)
    return body if guard is None else f"    scf.if {guard} {{\n{body}\n    }}"


@dataclass(frozen=True)
class _DestinationLoop:
    """The K destinations of row_copy_to_peers as code that does not grow with K (lane k of %lo/%hi/%s32
    names destination k; flags and addresses are broadcast from lane k with ``gpu.subgroup_broadcast``,
    on AMDGPU a v_readlane, so addresses land in SGPRs): the first sending destination (%kfirst, found
    once per row) is stored to directly, then one loop over the destinations after it. Storing the first
    one outside the loop lets each store wait only for its own load (AMDGPU: rolling vmcnt(N)); a loop
    that used the round's loads first would make the backend wait for all of them, and for every store
    before them, ahead of the loop (a vmcnt(0) drain per round)."""

    max_peers: int
    space: str

    def preamble(self) -> str:
        """%kfirst (K when no destination sends), %any, and %dfirst (its address)."""
        lines = [f"  %kfirst{self.max_peers} = arith.constant {self.max_peers} : i32"]
        for k in reversed(range(self.max_peers)):  # the lowest sending k wins
            lines.append(f"""  %fk{k} = arith.constant {k} : i32
  %fs{k} = gpu.subgroup_broadcast %s32, specific_lane %fk{k} : i32
  %fon{k} = arith.cmpi ne, %fs{k}, %c0i : i32
  %kfirst{k or ""} = arith.select %fon{k}, %fk{k}, %kfirst{k + 1} : i32""")
        return "\n".join(lines) + f"""
  %kmax = arith.constant {self.max_peers} : i32
  %any = arith.cmpi ult, %kfirst, %kmax : i32
  %kread = arith.select %any, %kfirst, %c0i : i32
{self._address("%kread", "%dfirst", "first")}"""

    def _address(self, lane: str, name: str, tag: str) -> str:
        return f"""  %lo_{tag} = gpu.subgroup_broadcast %lo, specific_lane {lane} : i32
  %hi_{tag} = gpu.subgroup_broadcast %hi, specific_lane {lane} : i32
  %lo64_{tag} = arith.extui %lo_{tag} : i32 to i64
  %hi64_{tag} = arith.extui %hi_{tag} : i32 to i64
  %hs_{tag} = arith.shli %hi64_{tag}, %c32 : i64
  %a_{tag} = arith.ori %hs_{tag}, %lo64_{tag} : i64
  {name} = llvm.inttoptr %a_{tag} : i64 to {P}{self.space}"""

    def wrap(self, body: str, tag: str) -> str:
        """``body`` (a template: {t} in SSA names, doubled braces, the destination as %d) stored to the
        first sending destination, then in a loop to every later one that sends."""
        first = body.replace("%d[", "%dfirst[").format(t=f"f{tag}")
        rest = body.format(t=f"l{tag}")
        return f"""{first}
    %k1_{tag} = arith.addi %kfirst, %c1i : i32
    %k1x_{tag} = arith.index_cast %k1_{tag} : i32 to index
    %kx_{tag} = arith.constant {self.max_peers} : index
    %c1x_{tag} = arith.constant 1 : index
    scf.for %k = %k1x_{tag} to %kx_{tag} step %c1x_{tag} {{
      %k32 = arith.index_cast %k : index to i32
      %sk = gpu.subgroup_broadcast %s32, specific_lane %k32 : i32
      %on = arith.cmpi ne, %sk, %c0i : i32
      scf.if %on {{
{self._address("%k32", "%d", "k")}
{rest}
      }}
    }}"""


def _global(value: str, space: str, name: str) -> tuple[str, str]:
    """(MLIR line casting generic pointer ``value`` into address space ``space`` as %name, the new
    name); nothing to cast for the generic space."""
    if not space:
        return "", value
    return f"  %{name} = llvm.addrspacecast {value} : {P} to {P}{space}\n", f"%{name}"


def row_copy_vec16(wave: int, space: str = "") -> str:
    # The variant for rows whose size is a constant multiple of 16 bytes (token rows; buffers are
    # 256-byte aligned): the peer address once (mori_shmem.ptr), then rounds of 8 lane-strided 16-byte
    # vectors (_vector_rounds), no byte loops. Plain stores: the caller publishes them (release fence
    # before its signal). ``space`` "<1>": the source and the peer row are addressed as global memory.
    cast_src, src = _global("%src", space, "gsrc")
    cast_peer, peer = _global("%peer", space, "gpeer")
    rounds = _vector_rounds(wave, [(None, peer)], space, src)
    return f"""func.func @{PREFIX}row_copy_vec16(%dst: {P}, %src: {P}, %bytes: i64, %pe: i32) {{
  %peer = "mori_shmem.ptr"(%dst, %pe) : ({P}, i32) -> {P}
{cast_src}{cast_peer}{rounds}  return
}}
"""


def row_copy_to_peers(wave: int, max_peers: int, space: str = "", loop: bool = False) -> str:
    # One row to up to K = max_peers destinations (lane k < K names destination k: its symmetric row
    # address and PE, and whether to send). Each lane resolves its own destination's peer address once
    # (mori_shmem.ptr; a lane that does not send resolves its own PE, so no table read is out of range),
    # then every round (_vector_rounds) loads 8 lane-strided 16-byte vectors of the source once and stores
    # them to each sending destination (addresses and flags broadcast from lane k: warp-uniform branches).
    # Compared with K row_copy calls, the row is read once, not once per destination, and a token costs
    # ceil(vectors / (8 x wave)) load round trips, not K times that. Plain stores: the caller publishes
    # them (release fence before its signal).
    # ``loop``: the K destinations are one loop (gpu.subgroup_broadcast of lane k's flag and address)
    # rather than K unrolled copies (shuffles): a fraction of the code (AMDGPU: K x 14 stores unrolled made
    # a 2,600-instruction dispatch with SGPR spills). ``space`` "<1>": source and destinations are
    # addressed as global memory (AMDGPU: global_* instead of flat_* accesses, whose shared vmcnt/lgkmcnt
    # accounting made each destination's stores start with a full drain).
    nl = "\n"
    if loop:
        bcast, targets = "", _DestinationLoop(max_peers, space)
    else:
        lines = []
        for k in range(max_peers):
            lines.append(f"""  %kk{k} = arith.constant {k} : i32
  %sk{k}, %sok{k} = gpu.shuffle idx %s32, %kk{k}, %width : i32
  %on{k} = arith.cmpi ne, %sk{k}, %c0i : i32
  %lok{k}, %look{k} = gpu.shuffle idx %lo, %kk{k}, %width : i32
  %hik{k}, %hiok{k} = gpu.shuffle idx %hi, %kk{k}, %width : i32
  %lo64_{k} = arith.extui %lok{k} : i32 to i64
  %hi64_{k} = arith.extui %hik{k} : i32 to i64
  %hs{k} = arith.shli %hi64_{k}, %c32 : i64
  %a{k} = arith.ori %hs{k}, %lo64_{k} : i64
  %d{k} = llvm.inttoptr %a{k} : i64 to {P}{space}""")
        bcast, targets = nl.join(lines) + nl, [(f"%on{k}", f"%d{k}") for k in range(max_peers)]
    cast_src, src = _global("%src", space, "gsrc")
    rounds = _vector_rounds(wave, targets, space, src)
    if loop:  # nothing to load when no destination sends
        rounds = f"{targets.preamble()}\n  %c1i = arith.constant 1 : i32\n  scf.if %any {{\n{rounds}  }}\n"
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
{cast_src}{bcast}{rounds}  return
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


def grid_barrier(space: str = "") -> str:
    # Protocol (sense-reversal on {arrivals, generation}, two u64 words): the block meets (gpu.barrier);
    # thread 0 reads the generation g, fences (release: the block's stores), and adds 1 to the arrival
    # count (relaxed, system scope). The last block to arrive resets the count to 0 and then publishes
    # g + 1 (after a fence); the others poll the generation until it passes g, then fence (acquire). The
    # block meets again. Works for any grid size per launch; no host reset (graph-replay safe).
    # The words are this PE's own: the ABI calls (atomic_fetch_add and p on our PE) translate their
    # address to itself. ``space`` "<1>" (AMDGPU): the count and the generation are written with the LLVM
    # atomics those ABI functions are made of (relaxed, system scope) on the global-space words, without
    # that translation (a quarter of a dispatch kernel's code); fences and the poll stay ABI calls.
    if space:
        ptr = f"{P}{space}"
        setup = f"""    %gctr = llvm.addrspacecast %ctr : {P} to {ptr}
    %ggen = llvm.getelementptr %gctr[1] : ({ptr}) -> {ptr}, i64
"""
        add = f"%old = llvm.atomicrmw add %gctr, %one monotonic : {ptr}, i64"
        reset = f"llvm.store %zero, %gctr atomic monotonic {{alignment = 8 : i64}} : i64, {ptr}"
        publish = f"llvm.store %g1, %ggen atomic monotonic {{alignment = 8 : i64}} : i64, {ptr}"
        me = ""
    else:
        setup = ""
        add = f"""%old = "mori_shmem.atomic_fetch_add"(%ctr, %one, %me, %qp) {{elem = "uint64"}} : ({P}, i64, i32, i32) -> i64"""
        reset = f""""mori_shmem.p"(%ctr, %zero, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()"""
        publish = f""""mori_shmem.p"(%genp, %g1, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()"""
        me = """    %me = "mori_shmem.my_pe"() : () -> i32
"""
    return f"""func.func @{PREFIX}grid_barrier(%ctr: {P}) {{
  %qp = arith.constant 0 : i32
  gpu.barrier
  %tid = gpu.thread_id x
  %c0 = arith.constant 0 : index
  %leader = arith.cmpi eq, %tid, %c0 : index
  scf.if %leader {{
    %nb_i = gpu.grid_dim x
    %nb = arith.index_cast %nb_i : index to i64
{me}    %one = arith.constant 1 : i64
    %zero = arith.constant 0 : i64
    %genp = llvm.getelementptr %ctr[1] : ({P}) -> {P}, i64
{setup}    %g = llvm.load %genp atomic monotonic {{alignment = 8 : i64}} : {P} -> i64
    "mori_shmem.fence"() : () -> ()
    {add}
    %last_n = arith.subi %nb, %one : i64
    %last = arith.cmpi eq, %old, %last_n : i64
    scf.if %last {{
      {reset}
      "mori_shmem.fence"() : () -> ()
      %g1 = arith.addi %g, %one : i64
      {publish}
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


def _vector_sum(dtype: str, k: int, tag: str, off: str, space: str = "") -> tuple[list[str], list[str], str]:
    """MLIR lines of one 16-byte vector summed over K sources at byte offset ``off``: (the K loads, the
    widening/adds/rounding, the name of the 4 x i32 result). ``tag`` keeps SSA names apart. ``space``:
    the sources' address space ("<1>": %g0 ... cast by the prologue, else %s0 ...)."""
    per_vec = 8 if dtype == "bf16" else 4
    loads, math = [], []
    ptr, base = f"{P}{space}", "g" if space else "s"
    for i in range(k):
        loads.append(f"    %p{tag}{i} = llvm.getelementptr %{base}{i}[{off}] : ({ptr}, i64) -> {ptr}, i8")
        loads.append(f"    %l{tag}{i} = llvm.load %p{tag}{i} {{alignment = 16 : i64}} : {ptr} -> vector<4xi32>")
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


def _accumulate_prologue(dtype: str, k: int, step: int, space: str = "") -> str:
    srcs = ", ".join(f"%s{i}: {P}" for i in range(k))
    casts = "".join(_global(f"%s{i}", space, f"g{i}")[0] for i in range(k)) + _global("%out", space, "gout")[0]
    return f"""func.func @{PREFIX}accumulate_rows_{dtype}_k{k}(%out: {P}, %elems: i64, {srcs}) {{
{casts}  %lane_i = gpu.lane_id
  %lane = arith.index_cast %lane_i : index to i64
  %per = arith.constant {8 if dtype == "bf16" else 4} : i64
  %nvec = arith.divui %elems, %per : i64
  %lb = arith.index_cast %lane : i64 to index
  %ub = arith.index_cast %nvec : i64 to index
  %step = arith.constant {step} : index
  %sixteen = arith.constant 16 : i64
"""


def accumulate_rows(dtype: str, k: int, wave: int, space: str = "") -> str:
    # Warp-cooperative, lane-strided 16-byte vectors; for each vector all K source loads are issued
    # before the fp32 adds, then one rounding to the output dtype. No ordering of its own: the caller
    # has acquired the sources (device barrier) before. ``space`` "<1>": sources and output as global memory.
    loads, math, result = _vector_sum(dtype, k, "", "%off", space)
    body = "\n".join(loads + math)
    ptr, out = f"{P}{space}", "%gout" if space else "%out"
    return _accumulate_prologue(dtype, k, wave, space) + f"""  scf.for %j = %lb to %ub step %step {{
    %j64 = arith.index_cast %j : index to i64
    %off = arith.muli %j64, %sixteen : i64
{body}
    %po = llvm.getelementptr {out}[%off] : ({ptr}, i64) -> {ptr}, i8
    llvm.store {result}, %po {{alignment = 16 : i64}} : vector<4xi32>, {ptr}
  }}
  return
}}
"""


def accumulate_rows_x2(dtype: str, k: int, wave: int, space: str = "") -> str:
    # As accumulate_rows with two vectors per lane per iteration (j and j + wave): all 2K loads before the
    # adds. When the second vector is past the end it re-reads the first (loads stay unconditional) and
    # is not stored.
    la, ma, ra = _vector_sum(dtype, k, "a", "%offa", space)
    lb, mb, rb = _vector_sum(dtype, k, "b", "%offb", space)
    body = "\n".join(la + lb + ma + mb)
    ptr, out = f"{P}{space}", "%gout" if space else "%out"
    return _accumulate_prologue(dtype, k, 2 * wave, space) + f"""  %wave = arith.constant {wave} : i64
  scf.for %j = %lb to %ub step %step {{
    %ja = arith.index_cast %j : index to i64
    %jb0 = arith.addi %ja, %wave : i64
    %second = arith.cmpi ult, %jb0, %nvec : i64
    %jb = arith.select %second, %jb0, %ja : i64
    %offa = arith.muli %ja, %sixteen : i64
    %offb = arith.muli %jb, %sixteen : i64
{body}
    %poa = llvm.getelementptr {out}[%offa] : ({ptr}, i64) -> {ptr}, i8
    llvm.store {ra}, %poa {{alignment = 16 : i64}} : vector<4xi32>, {ptr}
    scf.if %second {{
      %pob = llvm.getelementptr {out}[%offb] : ({ptr}, i64) -> {ptr}, i8
      llvm.store {rb}, %pob {{alignment = 16 : i64}} : vector<4xi32>, {ptr}
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


def helper_for(op: ir.Operation, wave: int, vectors_per_lane: int = 1, *, global_space: bool = False,
               loop_destinations: bool = False) -> tuple[str, str]:
    """(helper symbol, helper text) for a block op (options: see MoriEpBlocksToCalls)."""
    name = op.name.split(".", 1)[1]
    space = "<1>" if global_space else ""
    attrs = op.attributes
    if name == "row_copy":
        if _constant_multiple_of_16(op.operands[2]):
            return f"{PREFIX}row_copy_vec16", row_copy_vec16(wave, space)
        return f"{PREFIX}row_copy", row_copy()
    if name == "row_copy_to_peers":
        if not _constant_multiple_of_16(op.operands[2]):
            raise MoriCompilerError(f"'{op.name}' operand 'bytes' must be a constant multiple of 16 (the row is "
                                    f"copied in 16-byte vectors)", format_location(op.location, "-"))  # fmt: skip
        k = attrs["max_peers"].value
        return f"{PREFIX}row_copy_to_peers_k{k}", row_copy_to_peers(wave, k, space, loop_destinations)
    if name == "reserve_slot":
        return f"{PREFIX}reserve_slot", reserve_slot()
    if name == "count_signal":
        world = attrs["world_size"].value
        return f"{PREFIX}count_signal_w{world}", count_signal(world, wave)
    if name == "grid_barrier":
        return f"{PREFIX}grid_barrier", grid_barrier(space)
    if name == "device_barrier":
        world = attrs["world_size"].value
        return f"{PREFIX}device_barrier_w{world}", device_barrier(world)
    if name == "accumulate_rows":
        dtype, k = attrs["dtype"].value, len(op.operands) - 2
        build = accumulate_rows_x2 if vectors_per_lane == 2 else accumulate_rows
        return f"{PREFIX}accumulate_rows_{dtype}_k{k}", build(dtype, k, wave, space)
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
    the scheduler then splits the loads around a wait, so the pipeline picks 1 there);
    global-address-space (the row copies and accumulate_rows address their rows as ``!llvm.ptr<1>``,
    casting the generic pointers they get: AMDGPU global memory, where every buffer and peer row lives;
    the pipeline sets it for AMDGPU); loop-destinations (row_copy_to_peers loops over its K destinations
    instead of unrolling them: compact code; the pipeline sets it for AMDGPU, while sm_90 keeps the
    unrolled form it was measured with).
    """

    name: ClassVar[str] = "mori-ep-blocks-to-calls"
    wave_size: int = 64
    vectors_per_lane: int = 1
    global_address_space: bool = False
    loop_destinations: bool = False

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
            symbol, text = helper_for(op, self.wave_size, self.vectors_per_lane, global_space=self.global_address_space,
                                      loop_destinations=self.loop_destinations)  # fmt: skip
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
