"""The low-latency EP kernels of ``mori-ep-to-kernels``: IntraNodeLL dispatch and the AsyncLL halves.

Same conventions as passes/ep_kernels.py (MLIR text built from the mori_ep blocks, one ``gpu.func`` per
kernel, the shared prologue, per-token routing and per-destination stores). The protocols, with who
writes, who waits, at which scope and in which order:

**IntraNodeLL dispatch** ``ep_dispatch_ll_<dtype>`` (ep-semantics.md §3.3). One block per token
(block-strided). Warp 0 is the control warp: it routes the token (dedup per destination, a remote slot
reservation per destination, forward map), writes the compact route (count, then (pe, slot) pairs) into a
ping-pong LDS buffer, and stores the ids, weights and source position to every destination. The
block is software-pipelined with one ``gpu.barrier`` per token: in step j the data warps copy token j
(route in buffer j % 2) while the control warp routes token j + 1 into buffer (j + 1) % 2; the barrier
ending step j publishes that route, and the buffer the control warp writes in step j + 1 is the one
every data warp finished reading before that barrier (the first route is made before the loop). Warp 1 first copies the scales; warps 1.. then split the row into
16-byte vectors, **load each vector once** (four in flight per lane) and store it to every destination,
starting at a per-warp rotated destination so that the links are loaded evenly. Completion is
IntraNode's (grid barrier, then the count handshake with its release/acquire fences), so IntraNode's
combine reads the result unchanged; the counters, signals and round parity are shared with it.

**AsyncLL** (§3.6, over the P2P store transport). Every PE owns, per round parity and per source PE,
a receive region of Rp records (row, scales, ids, weights, source position) and a combine region of
Rp rows; parity r % 2 of round r double-buffers both, so a peer one round ahead never overwrites what
we are still reading (it can be at most one round ahead: its next send needs our notification of
this round). Signals are epoch-tagged, never reset: the dispatch signal of source s in round r is
``(r + 1) << 32 | count`` in our ``sig[r % 2][s]``; the combine signal is ``r + 1`` in ``csig``.
Round counters live on the device (``rounds[0]`` dispatch, ``rounds[1]`` combine) and are advanced by
the last block to finish the receive kernel (``rounds[2]``/``[3]`` count the finished blocks), so
graph replay is correct.

* ``ep_async_dispatch_send_<dtype>``: one warp per token; a **local** fetch-add on ``cnt[r % 2][pe]``
  gives the slot (slots past Rp are dropped and counted in %status); the warp stores row, scales, ids,
  weights and source position into PE pe's region ``[r % 2][me][slot]`` (relaxed system-scope stores).
  Block 0 thread 0 first clears ``cnt[(r + 1) % 2]`` (read by round r - 1's receive, which is over).
  With ``early_notify``: grid barrier, then warp 0 lanes p < W: fence (release: every payload store of
  this PE, ordered by the grid barrier's fences) and store the tagged count into PE p's ``sig[r % 2][me]``.
* ``ep_async_dispatch_recv_<dtype>``: without ``early_notify``, block 0 warp 0 lanes p < W first post
  the tagged counts (fence, then store: the send kernel's stores completed at its end, the fence orders
  them before the signal). Then the waits: ``fused_recv`` = per source s, thread 0 of **every** block
  polls ``sig[r % 2][s]`` until it carries tag r + 1, fences (acquire) and a block barrier releases the
  block's copy warps for source s (copies of source 0 start as soon as source 0 is ready); otherwise
  block 0 warp 0 lanes s < W poll all sources, fence, and a grid barrier releases every block. Records
  are copied to ``out`` rows grouped by source in PE order (exclusive prefix sum of the counts), within a
  source in slot order; ``rmap[row] = s * Rp + i`` remembers where each row came from.
* ``ep_async_combine_send_<dtype>``: each received row i goes back to its source s = rmap[i] / Rp into
  s's combine region ``[r % 2][me][rmap[i] % Rp]`` (with its weights); with ``early_notify`` a grid
  barrier and the tagged signal (fence, store into PE p's ``csig[r % 2][me]``) follow.
* ``ep_async_combine_recv_<dtype>``: post (without ``early_notify``), wait (fused: every block's warp 0
  lanes p < W poll, fence, block barrier; else block 0 then a grid barrier), then each token sums its K
  rows from the local combine region (forward map ``pe * R + slot``), as IntraNode's reduction.
"""

from __future__ import annotations

from .ep_kernels import (_DISPATCH_ROUND, _TOKEN_SOURCE, EpKernelConfig, P, _block, _prologue, _reduce_tokens,
                         dispatch_completion, return_rows, route_token, send_to_destinations)  # fmt: skip

LL_UNROLL = 4  # 16-byte vectors each data lane loads before storing them to every destination


def _max_destinations(cfg: EpKernelConfig) -> int:
    """At most one destination per distinct PE among a token's top-k experts."""
    return min(cfg.top_k, cfg.world_size)


def _route_slots(cfg: EpKernelConfig) -> int:
    """Entries of one LDS route buffer: the destination count, then (pe, slot) per destination."""
    return 1 + 2 * _max_destinations(cfg)


def _route_entry(index: str, tag: str) -> str:
    """Read route entry ``index`` (i32) of the buffer at %rbase: %dpe{tag} (destination PE) and
    %dsl64_{tag} (its slot, i64)."""
    return f"""          %pi0_{tag} = arith.muli {index}, %c2i : i32
          %pi{tag} = arith.addi %rbase1, %pi0_{tag} : i32
          %ppe{tag} = llvm.getelementptr %route[%pi{tag}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
          %dpe{tag} = llvm.load %ppe{tag} : !llvm.ptr<3> -> i32
          %psl{tag} = llvm.getelementptr %ppe{tag}[1] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i32
          %dsl{tag} = llvm.load %psl{tag} : !llvm.ptr<3> -> i32
          %dsl64_{tag} = arith.extui %dsl{tag} : i32 to i64
"""


def _common(cfg: EpKernelConfig, counter: str, index: int) -> str:
    """The AsyncLL kernels' round r (``counter[index]``), its parity, tag r + 1 and the usual predicates."""
    return f"""      %rp = llvm.getelementptr {counter}[{index}] : ({P}) -> {P}, i64
      %round = llvm.load %rp : {P} -> i64
      %one64 = arith.constant 1 : i64
      %par64 = arith.andi %round, %one64 : i64
      %par = arith.trunci %par64 : i64 to i32
      %parW = arith.muli %par, %W : i32
      %tag = arith.addi %round, %one64 : i64
      %tid = arith.index_cast %tid_i : index to i32
      %b0 = arith.cmpi eq, %bid_i, %c0x : index
      %t0 = arith.cmpi eq, %tid, %c0i : i32
      %first_thread = arith.andi %b0, %t0 : i1
      %w0 = arith.cmpi eq, %warp_in_block, %c0x : index
      %first_warp = arith.andi %b0, %w0 : i1
      %Rp = arith.constant {cfg.max_recv_per_rank} : i32
"""


def _control_warp(cfg: EpKernelConfig, token: str) -> str:
    """The control warp's work for one token (index value ``token``), its route going to the LDS buffer
    at %cbase: routing and slot reservation, the compact route (count, then (pe, slot) per destination),
    and the ids, weights and source position stored to every destination."""
    return f"""        %cbase1 = arith.addi %cbase, %c1i : i32
{route_token(token=token)}{_TOKEN_SOURCE.format(P=P)}          // Compact the route: destination i of the token is the i-th representative lane.
          %before, %count = scf.for %j = %c0x to %Kx step %c1x iter_args(%bf = %c0i, %ct = %c0i) -> (i32, i32) {{
            %j32 = arith.index_cast %j : index to i32
            %okj, %vj = gpu.shuffle idx %ok32, %j32, %wave : i32
            %earlier = arith.cmpi ult, %j32, %lane : i32
            %add = arith.select %earlier, %okj, %c0i : i32
            %bf2 = arith.addi %bf, %add : i32
            %ct2 = arith.addi %ct, %okj : i32
            scf.yield %bf2, %ct2 : i32, i32
          }}
          scf.if %ok {{
            %pi0 = arith.muli %before, %c2i : i32
            %pi = arith.addi %cbase1, %pi0 : i32
            %ppe = llvm.getelementptr %route[%pi] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
            llvm.store %pe, %ppe : i32, !llvm.ptr<3>
            %psl = llvm.getelementptr %ppe[1] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i32
            llvm.store %slot, %psl : i32, !llvm.ptr<3>
          }}
          scf.if %lane0 {{
            %pn = llvm.getelementptr %route[%cbase] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
            llvm.store %count, %pn : i32, !llvm.ptr<3>
          }}
          %dbase = arith.constant 0 : i32
{send_to_destinations(cfg, rows=False, scales=False)}
"""


def dispatch_ll_kernel(cfg: EpKernelConfig, global_address_space: bool = False) -> str:
    # global_address_space (AMDGPU): the data path's source row and peer rows as !llvm.ptr<1> (global_*
    # loads and stores instead of flat_*; the ordering is unchanged: plain stores, published by the
    # completion's release fences like the generic ones).
    name = f"ep_dispatch_ll_{cfg.dtype}"
    space = "<1>" if global_address_space else ""
    gp = f"{P}{space}"
    src_row = "%gsrc_row" if space else "%src_row"
    half = _route_slots(cfg)
    nvec = cfg.row_bytes // 16
    data_threads = (cfg.warps_per_block - 1) * cfg.wave_size
    U = LL_UNROLL
    loads = "\n".join(f"""            %vi{u} = arith.addi %v0, %uo{u} : index
            %in{u} = arith.cmpi ult, %vi{u}, %nvec : index
            %vc{u} = arith.select %in{u}, %vi{u}, %v0 : index
            %vc64_{u} = arith.index_cast %vc{u} : index to i64
            %sp{u} = llvm.getelementptr {src_row}[%vc64_{u}] : ({gp}, i64) -> {gp}, vector<4xi32>
            %val{u} = llvm.load %sp{u} {{alignment = 16 : i64}} : {gp} -> vector<4xi32>""" for u in range(U))
    D = _max_destinations(cfg)
    # Destination d of this warp is route entry (d + warp) % nd: warps start at different PEs.
    peers = "\n".join(f"""          %dd{d} = arith.constant {d} : i32
          %has{d} = arith.cmpi ult, %dd{d}, %nd : i32
          %dr0_{d} = arith.addi %dd{d}, %warp32 : i32
          %dr{d} = arith.remui %dr0_{d}, %nd1 : i32
{_route_entry(f"%dr{d}", str(d))}          %doff{d} = arith.muli %dsl64_{d}, %row : i64
          %dst{d} = llvm.getelementptr %out_x[%doff{d}] : ({P}, i64) -> {P}, i8
          %peer{d} = "mori_shmem.ptr"(%dst{d}, %dpe{d}) : ({P}, i32) -> {P}""" for d in range(D))
    if space:
        peers += "".join(f"\n          %gpeer{d} = llvm.addrspacecast %peer{d} : {P} to {gp}" for d in range(D))
        peers += f"\n          %gsrc_row = llvm.addrspacecast %src_row : {P} to {gp}"
    peer = "%gpeer" if space else "%peer"
    stores = "\n".join(f"""            scf.if %has{d} {{
""" + "\n".join(f"""              scf.if %in{u} {{
                %dp{d}_{u} = llvm.getelementptr {peer}{d}[%vc64_{u}] : ({gp}, i64) -> {gp}, vector<4xi32>
                llvm.store %val{u}, %dp{d}_{u} {{alignment = 16 : i64}} : vector<4xi32>, {gp}
              }}""" for u in range(U)) + """
            }""" for d in range(D))
    offsets = "\n".join(f"      %uo{u} = arith.constant {u * data_threads} : index" for u in range(U))
    scales = ""
    if cfg.scale_bytes:
        scales = f"""          %scale_warp = arith.cmpi eq, %warp_in_block, %c1x : index
          %do_s = arith.andi %scale_warp, %has_s : i1
          scf.if %do_s {{
            %sb = arith.constant {cfg.scale_bytes} : i64
            %sso = arith.muli %t64, %sb : i64
            %ssrc = llvm.getelementptr %s[%sso] : ({P}, i64) -> {P}, i8
            scf.for %d = %c0x to %nd_x step %c1x {{
              %d32 = arith.index_cast %d : index to i32
{_route_entry("%d32", "s")}              %sdo = arith.muli %dsl64_s, %sb : i64
              %sdst = llvm.getelementptr %out_s[%sdo] : ({P}, i64) -> {P}, i8
              "mori_ep.row_copy"(%sdst, %ssrc, %sb, %dpes) : ({P}, {P}, i64, i32) -> ()
            }}
          }}
"""
    return f"""    llvm.mlir.global internal @{name}_route() {{addr_space = 3 : i32}} : !llvm.array<{2 * half} x i32>
    gpu.func @{name}(%x: {P}, %w: {P}, %s: {P}, %idx: {P}, %n: i32, %out_x: {P}, %out_w: {P}, %out_s: {P},
        %out_idx: {P}, %src_pos: {P}, %slot_ctrs: {P}, %signals: {P}, %grid_ctr: {P}, %round_ctr: {P}, %fwd: {P},
        %dest_ctr: {P}, %total: {P}, %status: {P}) kernel attributes {{known_block_size = {_block(cfg)}}} {{
{_prologue(cfg)}      %Er = arith.constant {cfg.experts_per_rank} : i32
      %S = arith.constant {cfg.send_stride} : i32
      %row = arith.constant {cfg.row_bytes} : i64
      %c2i = arith.constant 2 : i32
      %has_w = llvm.icmp "ne" %w, %null_ptr : {P}
      %has_s = llvm.icmp "ne" %s, %null_ptr : {P}
      %route = llvm.mlir.addressof @{name}_route : !llvm.ptr<3>
      %half = arith.constant {half} : i32
      %nvec = arith.constant {nvec} : index
      %dstride = arith.constant {data_threads * U} : index
{offsets}
{_DISPATCH_ROUND.format(P=P)}      %control = arith.cmpi eq, %warp_in_block, %c0x : index
      %data = arith.xori %control, %true : i1
      %warp32 = arith.index_cast %warp_in_block : index to i32
      %dtid = arith.subi %tid_i, %wave_x : index
      %n_x = arith.index_cast %n : i32 to index
      // Software pipeline, one block barrier per token: while the data warps copy token t (route in
      // buffer t's parity), the control warp routes token t + grid into the other buffer.
      %has_first = arith.cmpi ult, %bid_i, %n_x : index
      %ctl_first = arith.andi %control, %has_first : i1
      scf.if %ctl_first {{
        %cbase = arith.constant 0 : i32
{_control_warp(cfg, "%bid_i")}      }}
      gpu.barrier
      %last_buf = scf.for %t_x = %bid_i to %n_x step %nb_i iter_args(%buf = %c0i) -> (i32) {{
        %rbase = arith.muli %buf, %half : i32
        %rbase1 = arith.addi %rbase, %c1i : i32
        %t_next = arith.addi %t_x, %nb_i : index
        %has_next = arith.cmpi ult, %t_next, %n_x : index
        %ctl_next = arith.andi %control, %has_next : i1
        scf.if %ctl_next {{
          %nbuf = arith.xori %buf, %c1i : i32
          %cbase = arith.muli %nbuf, %half : i32
{_control_warp(cfg, "%t_next")}        }}
        scf.if %data {{
          %t = arith.index_cast %t_x : index to i32
          %t64 = arith.extui %t : i32 to i64
          %src_off = arith.muli %t64, %row : i64
          %src_row = llvm.getelementptr %x[%src_off] : ({P}, i64) -> {P}, i8
          %pn = llvm.getelementptr %route[%rbase] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i32
          %nd = llvm.load %pn : !llvm.ptr<3> -> i32
          %nd_x = arith.index_cast %nd : i32 to index
{scales}          %nd1 = arith.maxui %nd, %c1i : i32
{peers}
          scf.for %v0 = %dtid to %nvec step %dstride {{
{loads}
{stores}
          }}
        }}
        gpu.barrier
        %next = arith.xori %buf, %c1i : i32
        scf.yield %next : i32
      }}
{dispatch_completion(cfg)}      gpu.return
    }}
"""


def _post(signal: str, value: str) -> str:
    """Warp 0 of block 0, lanes p < W: release fence, then the value into PE p's ``signal[r % 2][me]``."""
    return f"""      scf.if %first_warp {{
        %talker = arith.cmpi ult, %lane, %W : i32
        scf.if %talker {{
          %mine0 = arith.addi %parW, %me : i32
          %mine = llvm.getelementptr {signal}[%mine0] : ({P}, i32) -> {P}, i64
{value}          "mori_shmem.fence"() : () -> ()
          "mori_shmem.p"(%mine, %value, %lane, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
        }}
      }}
"""


def _dispatch_count_value() -> str:
    return f"""          %cp0 = arith.addi %parW, %lane : i32
          %cp = llvm.getelementptr %cnt[%cp0] : ({P}, i32) -> {P}, i32
          %c_raw = llvm.load %cp : {P} -> i32
          %c = arith.minui %c_raw, %Rp : i32
          %c64 = arith.extui %c : i32 to i64
          %sh32 = arith.constant 32 : i64
          %tagged = arith.shli %tag, %sh32 : i64
          %value = arith.ori %tagged, %c64 : i64
"""


def _wait_all(signal: str, below: str, fused: bool) -> str:
    """Poll ``signal[r % 2][p]`` for every source p < W until it is above ``below``, then acquire.
    Fused: warp 0 of every block waits and a block barrier releases the block; otherwise warp 0 of
    block 0 waits and a grid barrier releases the grid."""
    who = "%w0" if fused else "%first_warp"
    release = "gpu.barrier" if fused else f'"mori_ep.grid_barrier"(%grid_ctr) : ({P}) -> ()'
    return f"""      scf.if {who} {{
        %listener = arith.cmpi ult, %lane, %W : i32
        scf.if %listener {{
          %in0 = arith.addi %parW, %lane : i32
          %inp = llvm.getelementptr {signal}[%in0] : ({P}, i32) -> {P}, i64
          %seen = "mori_shmem.wait_until"(%inp, {below}) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
          "mori_shmem.fence"() : () -> ()
        }}
      }}
      {release}
"""


def _advance_round(index: int) -> str:
    """The last block to finish advances ``rounds[index]`` (its finished-block counter is
    ``rounds[index + 2]``): every block read the round before it arrives (fence, then the arrival)."""
    return f"""      gpu.barrier
      scf.if %t0 {{
        %donep = llvm.getelementptr %rounds[{index + 2}] : ({P}) -> {P}, i64
        %nb64 = arith.index_cast %nb_i : index to i64
        %last_n = arith.subi %nb64, %one64 : i64
        "mori_shmem.fence"() : () -> ()
        %arrived = "mori_shmem.atomic_fetch_add"(%donep, %one64, %me, %qp) {{elem = "uint64"}} : ({P}, i64, i32, i32) -> i64
        %is_last = arith.cmpi eq, %arrived, %last_n : i64
        scf.if %is_last {{
          %z64 = arith.constant 0 : i64
          "mori_shmem.p"(%donep, %z64, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
          "mori_shmem.p"(%rp, %tag, %me, %qp) {{c_type = "uint64"}} : ({P}, i64, i32, i32) -> ()
        }}
      }}
"""


_LOCAL_RESERVE = """          %cp = llvm.getelementptr %cnt_par[%pe] : ({P}, i32) -> {P}, i32
          %sl = llvm.atomicrmw add %cp, %c1i monotonic : {P}, i32
"""


def async_dispatch_send_kernel(cfg: EpKernelConfig, early_notify: bool) -> str:
    notify = ""
    if early_notify:
        notify = f"""      "mori_ep.grid_barrier"(%grid_ctr) : ({P}) -> ()
{_post("%sig", _dispatch_count_value())}"""
    clear = "\n".join(f"""        %cc{p}i = arith.constant {p} : i32
        %cc{p}a = arith.addi %oparW, %cc{p}i : i32
        %cc{p} = llvm.getelementptr %cnt[%cc{p}a] : ({P}, i32) -> {P}, i32
        llvm.store %c0i, %cc{p} : i32, {P}""" for p in range(cfg.world_size))
    return f"""    gpu.func @ep_async_dispatch_send_{cfg.dtype}(%x: {P}, %w: {P}, %s: {P}, %idx: {P}, %n: i32, %out_x: {P}, %out_w: {P},
        %out_s: {P}, %out_idx: {P}, %src_pos: {P}, %cnt: {P}, %sig: {P}, %rounds: {P}, %fwd: {P}, %status: {P},
        %grid_ctr: {P}) kernel attributes {{known_block_size = {_block(cfg)}}} {{
{_prologue(cfg)}{_common(cfg, "%rounds", 0)}      %Er = arith.constant {cfg.experts_per_rank} : i32
      %S = arith.constant {cfg.send_stride} : i32
      %row = arith.constant {cfg.row_bytes} : i64
      %has_w = llvm.icmp "ne" %w, %null_ptr : {P}
      %has_s = llvm.icmp "ne" %s, %null_ptr : {P}
      %cnt_par = llvm.getelementptr %cnt[%parW] : ({P}, i32) -> {P}, i32
      %opar = arith.xori %par, %c1i : i32
      %oparW = arith.muli %opar, %W : i32
      scf.if %first_thread {{
{clear}
      }}
      // Records for PE pe land in its region [r % 2][me][slot].
      %dbase0 = arith.addi %parW, %me : i32
      %dbase = arith.muli %dbase0, %Rp : i32
      %n_x = arith.index_cast %n : i32 to index
      scf.for %t_x = %gw to %n_x step %nw {{
{route_token(reserve=_LOCAL_RESERVE.format(P=P), capacity="%Rp", count_dest=False)}{_TOKEN_SOURCE.format(P=P)}{send_to_destinations(cfg)}      }}
{notify}      gpu.return
    }}
"""


def async_dispatch_recv_kernel(cfg: EpKernelConfig, early_notify: bool, fused_recv: bool) -> str:
    post = "" if early_notify else _post("%sig", _dispatch_count_value())
    tag_below = """      %thirty_two = arith.constant 32 : i64
      %tag_hi = arith.shli %tag, %thirty_two : i64
      %below = arith.subi %tag_hi, %one64 : i64
"""
    if fused_recv:
        wait_all, wait_one = "", f"""        scf.if %t0 {{
          %s_seen = "mori_shmem.wait_until"(%sp, %below) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
          "mori_shmem.fence"() : () -> ()
        }}
        gpu.barrier
"""
    else:
        wait_all, wait_one = _wait_all("%sig", "%below", fused=False), ""
    scales = ""
    if cfg.scale_bytes:
        scales = f"""          %sb = arith.constant {cfg.scale_bytes} : i64
          %sso = arith.muli %srow64, %sb : i64
          %ssrc = llvm.getelementptr %rs[%sso] : ({P}, i64) -> {P}, i8
          %sdo = arith.muli %orow64, %sb : i64
          %sdst = llvm.getelementptr %out_s[%sdo] : ({P}, i64) -> {P}, i8
          "mori_ep.row_copy"(%sdst, %ssrc, %sb, %me) : ({P}, {P}, i64, i32) -> ()
"""
    return f"""    gpu.func @ep_async_dispatch_recv_{cfg.dtype}(%rx: {P}, %rw: {P}, %rs: {P}, %ridx: {P}, %rpos: {P}, %cnt: {P}, %sig: {P},
        %rounds: {P}, %grid_ctr: {P}, %out_x: {P}, %out_w: {P}, %out_s: {P}, %out_idx: {P}, %src_pos: {P}, %rmap: {P},
        %total: {P}) kernel attributes {{known_block_size = {_block(cfg)}}} {{
{_prologue(cfg)}{_common(cfg, "%rounds", 0)}      %row = arith.constant {cfg.row_bytes} : i64
{tag_below}{post}{wait_all}      %mask32 = arith.constant 4294967295 : i64
      %Wx = arith.index_cast %W : i32 to index
      // Rows grouped by source in PE order: source s starts at the sum of the counts of sources < s.
      %sum = scf.for %s_x = %c0x to %Wx step %c1x iter_args(%base = %c0i) -> (i32) {{
        %src = arith.index_cast %s_x : index to i32
        %si = arith.addi %parW, %src : i32
        %sp = llvm.getelementptr %sig[%si] : ({P}, i32) -> {P}, i64
{wait_one}        %v = "mori_shmem.wait_until"(%sp, %below) {{cmp = "greater_than", elem = "uint64"}} : ({P}, i64) -> i64
        %c64 = arith.andi %v, %mask32 : i64
        %c = arith.trunci %c64 : i64 to i32
        %c_x = arith.index_cast %c : i32 to index
        %region0 = arith.muli %si, %Rp : i32
        scf.for %i_x = %gw to %c_x step %nw {{
          %i = arith.index_cast %i_x : index to i32
          %srow = arith.addi %region0, %i : i32
          %orow = arith.addi %base, %i : i32
          %srow64 = arith.extui %srow : i32 to i64
          %orow64 = arith.extui %orow : i32 to i64
          %so = arith.muli %srow64, %row : i64
          %sx = llvm.getelementptr %rx[%so] : ({P}, i64) -> {P}, i8
          %oo = arith.muli %orow64, %row : i64
          %ox = llvm.getelementptr %out_x[%oo] : ({P}, i64) -> {P}, i8
          "mori_ep.row_copy"(%ox, %sx, %row, %me) : ({P}, {P}, i64, i32) -> ()
{scales}          scf.if %is_k {{
            %sk0 = arith.muli %srow, %K : i32
            %sk = arith.addi %sk0, %lane : i32
            %ok0 = arith.muli %orow, %K : i32
            %okk = arith.addi %ok0, %lane : i32
            %pi = llvm.getelementptr %ridx[%sk] : ({P}, i32) -> {P}, i32
            %iv = llvm.load %pi : {P} -> i32
            %qi = llvm.getelementptr %out_idx[%okk] : ({P}, i32) -> {P}, i32
            llvm.store %iv, %qi : i32, {P}
            %pw = llvm.getelementptr %rw[%sk] : ({P}, i32) -> {P}, f32
            %wv = llvm.load %pw : {P} -> f32
            %qw = llvm.getelementptr %out_w[%okk] : ({P}, i32) -> {P}, f32
            llvm.store %wv, %qw : f32, {P}
          }}
          scf.if %lane0 {{
            %pp = llvm.getelementptr %rpos[%srow] : ({P}, i32) -> {P}, i32
            %pos = llvm.load %pp : {P} -> i32
            %qp2 = llvm.getelementptr %src_pos[%orow] : ({P}, i32) -> {P}, i32
            llvm.store %pos, %qp2 : i32, {P}
            %m0 = arith.muli %src, %Rp : i32
            %m = arith.addi %m0, %i : i32
            %qm = llvm.getelementptr %rmap[%orow] : ({P}, i32) -> {P}, i32
            llvm.store %m, %qm : i32, {P}
          }}
        }}
        %next = arith.addi %base, %c : i32
        scf.yield %next : i32
      }}
      scf.if %first_thread {{
        llvm.store %sum, %total : i32, {P}
      }}
{_advance_round(0)}      gpu.return
    }}
"""


# AsyncLL combine: received row i came from source owner = rmap[i] / Rp, slot rmap[i] % Rp; it returns to
# the owner's combine region [r % 2][me][slot] (%dbase = (r % 2 * W + me) * Rp).
_ASYNC_LOCATE = """        %mp = llvm.getelementptr %rmap[%i] : ({P}, i32) -> {P}, i32
        %m = llvm.load %mp : {P} -> i32
        %owner = arith.divui %m, %Rp : i32
        %slot = arith.remui %m, %Rp : i32
        %drow = arith.addi %dbase, %slot : i32
"""


def async_combine_send_kernel(cfg: EpKernelConfig, early_notify: bool) -> str:
    notify = ""
    if early_notify:
        notify = f"""      "mori_ep.grid_barrier"(%grid_ctr) : ({P}) -> ()
{_post("%csig", "")}"""
    return f"""    gpu.func @ep_async_combine_send_{cfg.dtype}(%inp: {P}, %inp_w: {P}, %cx: {P}, %cw: {P}, %rmap: {P}, %total: {P},
        %csig: {P}, %rounds: {P}, %grid_ctr: {P}) kernel attributes {{known_block_size = {_block(cfg)}}} {{
{_prologue(cfg)}{_common(cfg, "%rounds", 1)}      %rowc = arith.constant {cfg.row_bytes} : i64
      %value = arith.addi %round, %one64 : i64
      %has_iw = llvm.icmp "ne" %inp_w, %null_ptr : {P}
      // Row i returns to its source s into s's combine region [r % 2][me][slot].
      %dbase0 = arith.addi %parW, %me : i32
      %dbase = arith.muli %dbase0, %Rp : i32
{return_rows(_ASYNC_LOCATE.format(P=P), "%cx", "%cw")}{notify}      gpu.return
    }}
"""


def async_combine_recv_kernel(cfg: EpKernelConfig, early_notify: bool, fused_recv: bool,
                              uniform_addressing: bool = False) -> str:
    post = "" if early_notify else _post("%csig", "")
    # Rows of token t's destination pe{k} are in our combine region [r % 2][pe{k}][slot{k}].
    source = f"""        %cr0_{{k}} = arith.addi %parW, %pe{{k}} : i32
        %cr1_{{k}} = arith.muli %cr0_{{k}}, %Rp : i32
        %cr2_{{k}} = arith.addi %cr1_{{k}}, %sl{{k}} : i32
        %cr64_{{k}} = arith.extui %cr2_{{k}} : i32 to i64
        %xo{{k}} = arith.muli %cr64_{{k}}, %rowc : i64
        %row{{k}} = llvm.getelementptr %cx[%xo{{k}}] : ({P}, i64) -> {P}, i8
        %wo{{k}} = arith.muli %cr64_{{k}}, %kb : i64
        %wrow{{k}} = llvm.getelementptr %cw[%wo{{k}}] : ({P}, i64) -> {P}, i8
"""
    reduce = _reduce_tokens(cfg, source, uniform=uniform_addressing, narrow=uniform_addressing)
    return f"""    gpu.func @ep_async_combine_recv_{cfg.dtype}(%cx: {P}, %cw: {P}, %fwd: {P}, %n: i32, %csig: {P}, %rounds: {P},
        %grid_ctr: {P}, %out: {P}, %out_w: {P}, %zero_row: {P}) kernel attributes {{known_block_size = {_block(cfg)}}} {{
{_prologue(cfg)}{_common(cfg, "%rounds", 1)}      %rowc = arith.constant {cfg.row_bytes} : i64
      %kb = arith.constant {4 * cfg.top_k} : i64
      %value = arith.addi %round, %one64 : i64
{post}{_wait_all("%csig", "%round", fused=fused_recv)}{reduce}{_advance_round(1)}      gpu.return
    }}
"""


def async_kernels_for(op_name: str, cfg: EpKernelConfig, early_notify: bool, fused_recv: bool,
                      uniform_addressing: bool = False) -> str:
    """The kernel of one AsyncLL half (the notification mode comes from the op's attributes;
    ``uniform_addressing``: see MoriEpToKernels)."""
    if op_name == "mori_ep.dispatch_send":
        return async_dispatch_send_kernel(cfg, early_notify)
    if op_name == "mori_ep.dispatch_recv":
        return async_dispatch_recv_kernel(cfg, early_notify, fused_recv)
    if op_name == "mori_ep.combine_send":
        return async_combine_send_kernel(cfg, early_notify)
    return async_combine_recv_kernel(cfg, early_notify, fused_recv, uniform_addressing)
