"""MoE expert-parallel dispatch/combine with MORI's Python API, on kernels compiled from ``mori_ep``.

``EpDispatchCombineOp(config)`` builds its kernels once (at construction, from the bundle cache: compiled
there and then when the compiler is installed, else precompiled), allocates its buffers on the symmetric
heap and launches on the current PyTorch stream. ``dispatch``/``combine`` never compile and never
synchronize with the host, so they can be captured in a CUDA graph after one eager call with the same
tensors (the argument tables are uploaded then). Expert ids are validated on the device: every dispatch
kernel counts the ids that are neither -1 nor an expert (and drops them) in a status word the host reads
after the fact (``dispatch_status()``); ``validate="debug"`` synchronizes after each dispatch and raises
on them instead (a host synchronization per call: the debugging mode, not the serving one).

Features (docs/ep-protocols.md): ``call_local_expert_count=True`` fills ``local_expert_count`` (int32
[Er] per PE, the received (token, k) pairs whose expert is local) on the stream, every kernel type;
``return_routing=True`` / ``routing=h`` record and replay a dispatch's slot assignment
(ops/routing_handle.py; IntraNode and InterNodeV1).

Two ways to run, chosen by how shmem was initialized (mori_compiler.runtime.shmem):

* multi-process (``shmem_torch_process_group_init``): one op per process, tensors as in MORI;
* virtual PEs (``shmem_init_virtual(world_size)``): all PEs in this process and one launch; every tensor
  argument is then a list with one tensor per PE, and every result is a list per PE.

Kernel types: ``IntraNode`` (one warp per token), ``IntraNodeLL`` (one block per token, each 16-byte vector
loaded once and stored to every destination; IntraNode's combine), ``AsyncLL`` (send and receive
phases as separate kernels: ``dispatch_send()``/``dispatch_recv()``, ``combine_send()``/``combine_recv()``,
with independent work in between; ``dispatch``/``combine`` run both; output rows grouped by source PE)
and the inter-node types ``InterNode`` (MORI's V0), ``InterNodeV1`` and ``InterNodeV1LL``.
AsyncLL's notification mode (mori_compiler/ops/asyncll.py) is resolved once, at construction.

Inter-node types (docs/ep-protocols.md §15-16): the PEs form nodes of ``gpu_per_node`` PEs. A token's
same-node destinations get its row directly; a remote node gets it as a record, sent by the blocks of the
inter-node role (the first ``rdma_block_num`` of the grid): V1 once per remote node holding one of its
experts, to the rail-aligned proxy, which forwards it to that node's destinations; V1LL to every remote
node, whether or not the node holds one of its experts; V0 to each remote PE holding one of its experts.
Each leg is two kernels launched back to back on the stream: dispatch ``inter_stage`` (this PE's tokens
packed as records) then ``inter_dispatch``; combine copies the input rows and weights into the registered
buffers (``reg_x``, ``reg_w``; no copy when the input already is the registered buffer) then launches
``inter_combine`` (per node, the partial sum of each token's rows on that node, stored in the combine
dtype, returned to the token's PE) and ``inter_combine_all`` (each token's at most N partials summed in
fp32: the hierarchical combine, two roundings where the intra-node combine has one). The outputs are
IntraNode's (the same views, rows in arrival order, ``src_pos``, the combine's ``[M, H]``), and expert id -1
drops a slot in all three types (MORI's V1LL and V0 send it to PE 0). ``internode_traffic()`` reads the
bytes moved within and across nodes.

The op is the argument checks and the calls; the rest has its own module: the configuration and its
validation (config.py), the bundle and its mori_ep source (bundle.py), the symmetric buffers
(ep_buffers.py), the launches by parameter name, checked against the bundle (ep_launch.py), and the
standard-MoE layout (standard_moe.py). What they agree on is the EP schema (mori_compiler/ep_schema.py).

Semantics (docs/ep-protocols.md): a token goes once to each destination PE among its top-k experts
(lowest k represents it); outputs are views of persistent buffers that the next call overwrites; rows
``[0, total_recv)`` are valid, in arrival order; ``combine`` sums, in fp32, the rows returned by the
token's destination PEs (routing weights are not applied) and the weight rows likewise.
"""

from __future__ import annotations

import dataclasses
import struct

from mori_compiler.ep_schema import INTERNODE, STATUS_WORDS, TRAFFIC_COUNTERS, KernelType, combine_family, families
from mori_compiler.wire_quant import QUANT_COMBINE_DTYPE

from . import standard_moe
from .routing_handle import EpDispatchRoutingHandle, new_op_id
from .bundle import device_target
from .bundle import ep_bundle, kernel_module_source, kernel_names, kernel_plan  # noqa: F401 (re-exported)
from .config import (COMBINE_DTYPES, DISPATCH_DTYPES, DISPATCH_INPUT_DTYPES, IMPLEMENTED,  # noqa: F401 (re-exported)
                     MAX_BLOCKS, EpDispatchCombineConfig, EpDispatchCombineKernelType, _dtype_name, _is_int,
                     check_call_hidden, payload_kernel_dtype, validate_config)


def internode_rdma_blocks(config: EpDispatchCombineConfig, blocks: int, rdma_block_num) -> int:
    """The blocks ``[0, rdma_blocks)`` of an inter-node kernel type's grid of ``blocks`` that take the
    inter-node role (the others the same-node role): the call's ``rdma_block_num`` if > 0, else
    ``config.rdma_block_num`` if > 0, else half the grid (at least 1). A ValueError when a role would be
    left without a block, or when InterNode's (V0's) grid is not a multiple of world_size."""
    kind = EpDispatchCombineKernelType(config.kernel_type)
    if blocks < 2:
        raise ValueError(f"block_num {blocks}: {kind.name} needs >= 2 blocks (at least one for the inter-node role "
                         "and one for the same-node role)")  # fmt: skip
    if kind == EpDispatchCombineKernelType.InterNode and blocks % config.world_size:
        raise ValueError(f"block_num {blocks} must be a multiple of world_size {config.world_size} for InterNode "
                         "(V0 partitions its grid per destination PE)")  # fmt: skip
    call = -1 if rdma_block_num is None else rdma_block_num
    if not _is_int(call) or call < -1:
        raise ValueError(f"rdma_block_num must be an int >= -1 (-1 or 0: the config's), got {rdma_block_num!r}")
    if call > 0:
        rdma, origin = int(call), ""
    elif config.rdma_block_num > 0:
        rdma, origin = config.rdma_block_num, " (config.rdma_block_num)"
    else:
        return max(1, blocks // 2)
    if not 1 <= rdma <= blocks - 1:
        raise ValueError(f"rdma_block_num {rdma}{origin} must be in [1, {blocks - 1}] for {kind.name} with "
                         f"{blocks} blocks (the other blocks take the same-node role)")  # fmt: skip
    return rdma


class EpDispatchCombineOp:
    """EP dispatch/combine (MORI's ``mori.ops.EpDispatchCombineOp`` API) for every kernel type: IntraNode,
    IntraNodeLL, AsyncLL, InterNode (V0), InterNodeV1 and InterNodeV1LL.

    ``asyncll``: for AsyncLL, the notification mode (an :class:`AsyncLLOptions`, or a dict of overrides of
    the ``MORI_ASYNCLL_*`` variables); resolved once here and compiled into this op's kernels.

    ``validate``: expert ids are always checked on the device (the kernels count and drop the invalid
    ones: ``dispatch_status()``). ``True`` (default): no host synchronization on any call (``False`` is
    refused: the device-side check has no host cost and no off switch).
    ``"debug"``: after each dispatch (AsyncLL: each receive) the host synchronizes and raises a ValueError
    naming the PE and the count of invalid ids it sent; this costs one host synchronization per dispatch
    (the stream drains, so the launch of the next call no longer overlaps the kernels) and it refuses
    CUDA-graph capture.

    ``trace``: the kernels are compiled with their phase trace points (docs/tracing.md; a bundle of its own);
    ``kernel_trace(kernel)`` then records a launch's per-warp phase times. Off (default), no trace code exists.
    """

    VALIDATE_MODES = (True, "debug")

    def __init__(self, config: EpDispatchCombineConfig, *, target: str | None = None, validate=True,
                 asyncll=None, trace: bool = False):  # fmt: skip
        from .tuning import launch_config_mode

        auto_mode = launch_config_mode() == "AUTO"  # read once, as MORI's
        from mori_compiler.runtime.extras import import_extra

        torch = import_extra("torch")  # (missing: one error naming the extra to install)

        from mori_compiler.runtime import shmem
        from mori_compiler.targets import get_target

        from .asyncll import AsyncLLOptions, PhaseTracker, resolve
        from .ep_buffers import EpBuffers
        from .ep_launch import EpLaunches

        if validate is False:
            raise ValueError("validate=False: expert ids are always checked on the device (dropped and counted, no "
                             "host cost: dispatch_status()); use validate=True (the default) or 'debug'")  # fmt: skip
        if not any(validate is mode or (isinstance(mode, str) and validate == mode) for mode in self.VALIDATE_MODES):
            raise ValueError(f"validate must be True or 'debug', got {validate!r}")
        if not isinstance(trace, bool):
            raise ValueError(f"trace must be a bool, got {trace!r}")
        self.config = config
        self.validate = validate
        self.trace = trace
        self.op_id = new_op_id()
        state = shmem.state()
        if state.n_pes != config.world_size:
            raise ValueError(f"config.world_size {config.world_size} differs from shmem_npes() {state.n_pes}")
        self.virtual = bool(state.virtual)
        if not self.virtual and shmem.shmem_mype() != config.rank:
            raise ValueError(f"config.rank {config.rank} differs from shmem_mype() {shmem.shmem_mype()}")
        self.target = get_target(target or device_target(state))
        validate_config(config, self.target.wave_size, self.target.name)
        self.kernel_type = EpDispatchCombineKernelType(config.kernel_type)
        self.asyncll = None
        if self.kernel_type == EpDispatchCombineKernelType.AsyncLL:
            self.asyncll = asyncll if isinstance(asyncll, AsyncLLOptions) else resolve(**(asyncll or {}))
            self._phases = PhaseTracker()
        self.sizes = config.sizes  # (reads MORI_FP8_COMBINE_SCALE_DIM once: the kernels and buffers use it)
        self.auto = None
        warp_counts = [config.warp_num_per_block]
        if auto_mode:  # each call's geometry from the tuning tables (ops/auto_launch.py)
            from .auto_launch import AutoLaunch, device_gpu_model

            self.auto = AutoLaunch(config, self.target.name, device_gpu_model())
            warp_counts = self.auto.warp_counts()
        # The warps per block are compiled in: a bundle per warp count a call may get, over one set of buffers.
        bundles = {w: ep_bundle(dataclasses.replace(config, warp_num_per_block=w), self.target.name,
                                virtual_pes=self.virtual, asyncll=self.asyncll, scale_blocks=self.sizes.scale_blocks,
                                trace=trace)
                   for w in warp_counts}  # fmt: skip
        self.bundle = bundles[config.warp_num_per_block]
        plan = kernel_plan(config)
        if not self.is_async and not self.is_internode:
            self._dispatch_family = families(self.kernel_type, "dispatch")[0].family
        self.buffers = EpBuffers(self.kernel_type, self.sizes, self._pes(), virtual=self.virtual)
        wave = self.target.wave_size
        try:  # each bundle is checked against the EP schema before it is loaded
            self._launches = {w: EpLaunches(b, plan, self.buffers, block_threads=w * wave, virtual=self.virtual,
                                            hidden=config.hidden_dim) for w, b in bundles.items()}  # fmt: skip
            self.launches = self._launches[config.warp_num_per_block]
            if self.auto is not None:
                self.auto.bind_coresidency(self._coresident_limit)
        except BaseException:
            self.close()
            raise
        torch.cuda.synchronize()  # every PE's buffers are zeroed before any peer can write into them
        shmem.shmem_barrier_all()
        self._last_n = [0] * self.n_local
        self._pending: dict = {}  # AsyncLL: what a recv launch needs from its send (dtype, grid, results)
        self._status_seen = [[0] * len(STATUS_WORDS) for _ in range(self.n_local)]  # debug mode: read last
        self._local_counts = None  # per PE [Er] int32 and [R] row numbers 0..R-1: made on first use

    def _coresident_limit(self, leg: str, warps: int) -> int:
        """AUTO: the largest grid per PE of ``warps``-warp blocks that are all resident at once for ``leg``'s
        kernels (their grid barriers need it), asked of the driver once per (leg, warps)."""
        from .auto_launch import coresident_blocks, leg_kernel_names

        cache = self.__dict__.setdefault("_coresident", {})
        if (leg, warps) not in cache:
            cache[leg, warps] = coresident_blocks(self._launches[warps].kernels, leg_kernel_names(self.config, leg),
                                                  warps * self.target.wave_size, self.n_local)  # fmt: skip
        return cache[leg, warps]

    def _check_warps(self, warp_per_block) -> None:
        """MANUAL mode: a call's ``warp_per_block`` is -1 (None) or the compiled one."""
        if warp_per_block not in (-1, None, self.config.warp_num_per_block):
            raise ValueError(f"warp_per_block {warp_per_block}: the kernels were compiled for "
                             f"{self.config.warp_num_per_block}")  # fmt: skip

    def _call_geometry(self, leg: str, dtype: str, tokens: int, hidden: int, block_num, rdma_block_num,
                       warp_per_block, zero_copy=None):  # fmt: skip
        """(the launches, grid blocks, rdma_block_num) of a call. MANUAL: the call's block_num (-1: the
        config's) and rdma_block_num; its warp_per_block must be the compiled one. AUTO: the tuning tables'
        geometry for (leg, dtype, tokens, hidden, combine form), which wins over the call's arguments as in
        MORI; with a process per PE the combines with a device barrier look up the config's token count (see
        below), as virtual PEs launch all PEs with one geometry (of the largest count) anyway."""
        if self.auto is None:
            self._check_warps(warp_per_block)
            return self.launches, self._grid(block_num), rdma_block_num
        if leg == "combine" and not self.virtual and not self.is_async:
            # Every PE must launch the same combine grid (its device barrier pairs block b of each PE), and a
            # process knows only its own token count: the lookup takes the one all share, the config's.
            tokens = self.config.max_num_inp_token_per_rank
        g = self.auto.geometry(leg, dtype, tokens, hidden=hidden, zero_copy=zero_copy)
        return self._launches[g.warp_per_block], self._grid(g.block_num), g.rdma_block_num

    @property
    def kernels(self):
        """The loaded bundle (a runtime KernelSet: ``synchronize()``, ``check_waits()``)."""
        return self.launches.kernels

    @property
    def is_async(self) -> bool:
        return self.kernel_type == EpDispatchCombineKernelType.AsyncLL

    @property
    def is_internode(self) -> bool:
        return self.kernel_type in INTERNODE

    # ---- buffers ---------------------------------------------------------------------------------
    @property
    def n_local(self) -> int:
        return self.config.world_size if self.virtual else 1

    def _pes(self) -> list[int]:
        from mori_compiler.runtime import shmem

        return list(range(self.config.world_size)) if self.virtual else [shmem.shmem_mype()]

    def _view(self, name: str, pe: int, shape, dtype):
        return self.buffers.view(name, pe, shape, dtype)

    # ---- argument checks ---------------------------------------------------------------------------
    def _per_pe(self, value, what: str) -> list:
        if self.virtual:
            if value is None:
                return [None] * self.n_local
            if not isinstance(value, (list, tuple)) or len(value) != self.n_local:
                raise ValueError(f"{what}: with {self.n_local} virtual PEs pass a list of {self.n_local} tensors "
                                 "(one per PE) or None")  # fmt: skip
            return list(value)
        return [value]

    @staticmethod
    def _check_tensor(t, what: str, *, ndim: int, dtypes=None, shape0=None, dim1=None):
        import torch

        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{what} must be on a CUDA device, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        if t.dim() != ndim:
            raise ValueError(f"{what} must have {ndim} dimensions, got shape {tuple(t.shape)}")
        if dtypes is not None and t.dtype not in dtypes:
            raise ValueError(f"{what} has dtype {t.dtype}; allowed: {', '.join(str(d) for d in dtypes)}")
        if shape0 is not None and t.shape[0] != shape0:
            raise ValueError(f"{what} has {t.shape[0]} rows, expected {shape0}")
        if dim1 is not None and t.shape[1] != dim1:
            raise ValueError(f"{what} has {t.shape[1]} columns, expected {dim1}")

    def _grid(self, block_num) -> int:
        blocks = self.config.block_num if block_num in (-1, None) else int(block_num)
        if not 1 <= blocks <= MAX_BLOCKS:
            raise ValueError(f"block_num must be in [1, {MAX_BLOCKS}], got {blocks}")
        return blocks

    def _token_dtype(self, t, what: str, allowed, leg: str, previous: tuple | None) -> tuple[str, str, int]:
        """(dtype name, the kernels' dtype, hidden) of token tensor ``t`` ([n, hidden]), checked against the
        leg and the other PEs: ``hidden`` <= config.hidden_dim with rows of whole 16-byte vectors (the call's
        rows are packed at its hidden), and the same dtype and hidden on every PE of the launch."""
        c = self.config
        self._check_tensor(t, what, ndim=2)
        name = _dtype_name(t.dtype)
        if name not in allowed or t.element_size() > c.max_token_type_size:
            raise ValueError(f"{leg} {what} dtype {t.dtype} is not supported: {leg} takes "
                             f"{', '.join(allowed)} within max_token_type_size {c.max_token_type_size}")  # fmt: skip
        hidden = t.shape[1]
        check_call_hidden(hidden, t.element_size(), c.hidden_dim, f"{leg} {what}")
        if previous not in (None, (name, hidden)):
            raise ValueError(f"all PEs must {leg} the same dtype and hidden size ({previous[0]} x {previous[1]} vs "
                             f"{name} x {hidden})")  # fmt: skip
        return name, payload_kernel_dtype(name), hidden

    # ---- dispatch ----------------------------------------------------------------------------------
    def dispatch(self, input, weights, scales, indices, block_num: int = -1, rdma_block_num: int = -1,
                 warp_per_block: int = -1, call_local_expert_count: bool = False, *, routing=None,
                 return_routing: bool = False):  # fmt: skip
        """Send every token to the PEs of its experts. Returns (out, out_weights, out_scales, out_indices,
        total_recv) per PE (a tuple, or a list of tuples with virtual PEs); with ``return_routing=True`` a
        sixth element, the EpDispatchRoutingHandle recording this dispatch's slots (IntraNode, InterNodeV1), which
        ``routing=`` replays (no slot atomics; collective: every PE replays the same recorded round).
        ``call_local_expert_count=True``: ``local_expert_count`` is refilled after the dispatch, on the
        stream. AsyncLL: send, then receive. Inter-node types: ``rdma_block_num`` blocks (see
        internode_rdma_blocks) take the inter-node role. Never synchronizes the host (but see ``validate``).
        The input's hidden may be any up to config.hidden_dim (rows of whole 16-byte vectors); every PE must
        dispatch the same dtype and hidden (checked across virtual PEs; with a process per PE a peer's rows
        land at its own row size, as in MORI)."""
        self._check_flag(call_local_expert_count, "call_local_expert_count")
        if self.is_async:
            self._routing_refusal(routing, return_routing, "dispatch")
            results = self.dispatch_send(input, weights, scales, indices, block_num, rdma_block_num, warp_per_block)
            self.dispatch_recv(block_num, warp_per_block, call_local_expert_count)
            return results
        self._routing_refusal(routing, return_routing, "dispatch")
        dtype, tokens, results, (launches, blocks, rdma) = self._dispatch_inputs(
            input, weights, scales, indices, block_num, rdma_block_num, warp_per_block, routing)  # fmt: skip
        replay = [{"routing": 0}] * self.n_local if routing is None else routing.kernel_arguments()
        if self.is_internode:
            rdma_blocks = internode_rdma_blocks(self.config, blocks, rdma)
            launches.launch("inter_stage", dtype, tokens, blocks)
            launches.launch("inter_dispatch", dtype, [(pe, {**args, "rdma_blocks": rdma_blocks, "routing_pfwd": 0, **r})
                                                      for (pe, args), r in zip(tokens, replay)], blocks)  # fmt: skip
        elif self.kernel_type == KernelType.IntraNode:
            launches.launch(self._dispatch_family, dtype, [(pe, {**args, **r}) for (pe, args), r in zip(tokens, replay)],
                            blocks)  # fmt: skip
        else:
            launches.launch(self._dispatch_family, dtype, tokens, blocks)
        self._after_dispatch(call_local_expert_count)
        if return_routing:
            handle = self._record_routing([args["n"] for _, args in tokens])
            results = [r + (handle,) for r in results]
        return results if self.virtual else results[0]

    # ---- dispatch features: device-side validation, local expert count, routing handle ---------------
    def _routing_refusal(self, routing, return_routing, what: str) -> None:
        """A ValueError (before any launch) for a routing-handle request the kernel type cannot serve, or a
        ``routing`` that is no handle."""
        if routing is None and not return_routing:
            return
        if not isinstance(return_routing, bool):
            raise ValueError(f"{what}: return_routing must be a bool, got {return_routing!r}")
        field = "routing" if routing is not None else "return_routing"
        if self.kernel_type not in (KernelType.IntraNode, KernelType.InterNodeV1):
            raise ValueError(f"{what}: {field}= is not offered for the {self.kernel_type.name} kernel type (MORI's "
                             "routing handle exists for IntraNode and InterNodeV1 only)")  # fmt: skip
        if routing is not None and not isinstance(routing, EpDispatchRoutingHandle):
            raise ValueError(f"{what}: routing must be an EpDispatchRoutingHandle (from dispatch(..., "
                             f"return_routing=True)) or None, got {type(routing).__name__}")  # fmt: skip

    def _record_routing(self, ns: list[int]) -> EpDispatchRoutingHandle:
        """The handle of the dispatch just launched: clones of each PE's forward map, on the stream (they hold
        the values once the dispatch has run; no host synchronization). At least one token's K entries, so that
        a PE without tokens still replays: its kernel takes "replay" from a non-null map, and an InterNodeV1
        proxy forwards other PEs' records whatever its own count (a null map there would reserve slots)."""
        import torch

        K = self.config.num_experts_per_token
        fwd = [self._view("fwd", pe, (max(n, 1) * K,), torch.int32).clone() for pe, n in zip(self._pes(), ns)]
        pfwd = [self._proxy_forward_map(pe).clone() for pe in self._pes()] if self.is_internode else None
        return EpDispatchRoutingHandle(self.op_id, self.config, self._pes(), ns, fwd, pfwd)

    def _proxy_forward_map(self, pe: int):
        """InterNodeV1: PE pe's forward map of the records it forwarded as a proxy (``i_pfwd``, all of it)."""
        import torch

        s = self.sizes
        return self._view("i_pfwd", pe, (s.hops * s.chunk_rows * s.top_k,), torch.int32)

    def _use_routing(self, routing, ns: list[int]) -> None:
        """combine(routing=h): the handle checked against the call, then its forward maps copied into the
        op's (``fwd``; InterNodeV1 also ``i_pfwd``) on the stream, before the combine kernels."""
        import torch

        routing.check(self.op_id, self.config, self._pes(), ns, "combine")
        K = self.config.num_experts_per_token
        for i, (pe, fwd, n) in enumerate(zip(self._pes(), routing.fwd, routing.n)):
            _copy_rows(fwd[: n * K], self._view("fwd", pe, (n * K,), torch.int32))
            if routing.pfwd is not None:
                _copy_rows(routing.pfwd[i], self._proxy_forward_map(pe))

    def _after_dispatch(self, call_local_expert_count) -> None:
        """What follows a complete dispatch on the stream: the local expert count when asked, the debug
        mode's check."""
        if call_local_expert_count:
            self._count_local_experts()
        if self.validate == "debug":
            self._debug_check()

    @staticmethod
    def _check_flag(value, name: str) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")

    def _count_local_experts(self) -> None:
        """``local_expert_count`` of each PE: zeroed, then +1 per received (row < total, k) whose expert
        id is one of this PE's (``out_idx // Er == pe``); torch ops on the current stream (a few small
        kernels, no host synchronization, graph-capturable: the counts stay on the device)."""
        import torch

        c = self.config
        R, Er = self.sizes.recv_capacity, c.num_experts_per_rank
        counts, rows = self._local_count_tensors()
        for pe, count in zip(self._pes(), counts):
            out_idx = self._view("out_idx", pe, (R, c.num_experts_per_token), torch.int32)
            expert = out_idx - pe * Er  # local experts are [0, Er)
            received = (rows < self._view("total", pe, (1,), torch.int32)).unsqueeze(1)  # rows [0, total)
            local = (expert >= 0) & (expert < Er) & received
            count.zero_()
            count.scatter_add_(0, (expert * local).flatten().long(), local.flatten().int())

    def _local_count_tensors(self):
        """(per PE the [Er] int32 count, the [R] int32 row numbers), allocated on first use (an eager call
        comes before a graph capture, as for the argument tables)."""
        import torch

        if self._local_counts is None:
            device = f"cuda:{torch.cuda.current_device()}"
            c = self.config
            self._local_counts = ([torch.zeros(c.num_experts_per_rank, dtype=torch.int32, device=device)
                                   for _ in self._pes()],
                                  torch.arange(self.sizes.recv_capacity, dtype=torch.int32, device=device))  # fmt: skip
        return self._local_counts

    @property
    def local_expert_count(self):
        """MORI's ``local_expert_count``: int32 [Er] (a list per PE with virtual PEs), what the last dispatch
        with ``call_local_expert_count=True`` counted (zeros before the first): the received (token, k)
        pairs whose expert k is on this PE. A view of a persistent buffer, valid once that dispatch ran."""
        counts, _ = self._local_count_tensors()
        return list(counts) if self.virtual else counts[0]

    def _status_words(self) -> list[list[int]]:
        """Every local PE's status words (STATUS_WORDS, cumulative), read after a synchronization."""
        import torch

        torch.cuda.synchronize()
        words = len(STATUS_WORDS)
        return [[int(v) for v in self._view("status", pe, (words,), torch.int32).cpu().tolist()] for pe in self._pes()]

    def dispatch_status(self):
        """Synchronizes; per PE a dict over ``ep_schema.STATUS_WORDS``, cumulative since construction:
        ``overflow`` (sends dropped because a receiver was full), ``invalid_ids`` (this PE's (token, k)
        slots whose expert id was neither -1 nor in [0, W * Er): dropped). A list with virtual PEs."""
        status = [dict(zip(STATUS_WORDS, words)) for words in self._status_words()]
        return status if self.virtual else status[0]

    def kernel_trace(self, kernel: str, block_num: int | None = None, warp_per_block: int | None = None):
        """Start recording kernel ``kernel``'s phase trace points (an op built with ``trace=True``): its
        runtime KernelTrace (runtime/trace.py: ``reset()``, ``read()``, ``disable()``), for launches of up to
        ``block_num`` blocks per PE (default config.block_num) of the bundle of ``warp_per_block`` warps
        (default the config's). ``kernel`` is a kernel name of the bundle, e.g. ``ep_dispatch_bf16``."""
        if not self.trace:
            raise ValueError("kernel_trace: this op was built without trace points: EpDispatchCombineOp(config, "
                             "trace=True)")  # fmt: skip
        c = self.config
        warps = c.warp_num_per_block if warp_per_block is None else warp_per_block
        if warps not in self._launches:
            raise ValueError(f"kernel_trace: no bundle of {warps} warps per block (this op has {sorted(self._launches)})")
        blocks = c.block_num if block_num is None else block_num
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks <= 0:
            raise ValueError(f"kernel_trace: block_num must be a positive number of blocks per PE, got {block_num!r}")
        kernels = self._launches[warps].kernels
        if kernel not in kernels.bundle.kernels:
            raise ValueError(f"kernel_trace: no kernel '{kernel}' in this op's bundle (has: "
                             f"{', '.join(sorted(kernels.bundle.kernels))})")  # fmt: skip
        grid = (blocks,) if self.virtual else (blocks, 1, 1)
        return kernels.trace(kernel, grid, n_pes=self.n_local if self.virtual else None)

    def _debug_check(self) -> None:
        """validate="debug": synchronize and raise when a PE's dispatch sent invalid expert ids."""
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("validate='debug' synchronizes after each dispatch, which a CUDA graph capture "
                               "cannot do: build the op with validate=True (the kernels still count invalid ids: "
                               "dispatch_status())")  # fmt: skip
        words = self._status_words()
        seen, self._status_seen = self._status_seen, words
        bad = STATUS_WORDS.index("invalid_ids")
        c = self.config
        for pe, now, before in zip(self._pes(), words, seen):
            if now[bad] != before[bad]:
                raise ValueError(f"dispatch: indices[{pe}] held {now[bad] - before[bad]} expert ids neither -1 nor in "
                                 f"[0, {c.world_size * c.num_experts_per_rank}) (world_size x "
                                 "num_experts_per_rank); those slots were dropped (validate='debug')")  # fmt: skip

    def _dispatch_inputs(self, input, weights, scales, indices, block_num, rdma_block_num, warp_per_block,
                         routing=None):  # fmt: skip
        """Checks every PE's dispatch arguments (and the routing handle against them); returns (dtype,
        [(pe, the dispatch kernels' call arguments x, w, s, idx, n, hidden by name)], the per-PE result
        views, the call's geometry: _call_geometry's (launches, grid blocks, rdma_block_num))."""
        import torch

        c = self.config
        xs, ws, ss, ids = (self._per_pe(a, n) for a, n in ((input, "input"), (weights, "weights"),
                                                            (scales, "scales"), (indices, "indices")))  # fmt: skip
        seen = None
        tokens, results = [], []
        for i, pe in enumerate(self._pes()):
            x, w, s, idx = xs[i], ws[i], ss[i], ids[i]
            name, dtype, hidden = self._token_dtype(x, f"input[{pe}]", DISPATCH_INPUT_DTYPES, "dispatch", seen)
            seen = (name, hidden)
            n = x.shape[0]
            if n > c.max_num_inp_token_per_rank:
                raise ValueError(f"input[{pe}] has {n} tokens, more than max_num_inp_token_per_rank "
                                 f"{c.max_num_inp_token_per_rank}")  # fmt: skip
            self._check_tensor(idx, f"indices[{pe}]", ndim=2, dtypes=(torch.int32,), shape0=n,
                               dim1=c.num_experts_per_token)  # fmt: skip
            if w is not None:
                self._check_tensor(w, f"weights[{pe}]", ndim=2, dtypes=(torch.float32,), shape0=n,
                                   dim1=c.num_experts_per_token)  # fmt: skip
            if s is not None:
                if not c.scale_dim:
                    raise ValueError("scales were given but config.scale_dim is 0")
                self._check_tensor(s, f"scales[{pe}]", ndim=2, shape0=n, dim1=c.scale_dim)
                if s.element_size() != c.scale_type_size:
                    raise ValueError(f"scales[{pe}] element size {s.element_size()} != scale_type_size {c.scale_type_size}")
            if x.device.index != torch.cuda.current_device():
                raise ValueError(f"input[{pe}] is on {x.device}, the op runs on cuda:{torch.cuda.current_device()}")
            tokens.append((pe, {"x": x.data_ptr(), "w": 0 if w is None else w.data_ptr(),
                                "s": 0 if s is None else s.data_ptr(), "idx": idx.data_ptr(), "n": n,
                                "hidden": hidden}))  # fmt: skip
            R, K = self.sizes.recv_capacity, c.num_experts_per_token
            results.append((
                self._view("out_x", pe, (R * hidden * x.element_size(),), torch.uint8).view(x.dtype).view(R, hidden),
                self._view("out_w", pe, (R, K), torch.float32),
                self._view("out_s", pe, (R, c.scale_dim), s.dtype) if s is not None else None,
                self._view("out_idx", pe, (R, K), torch.int32),
                self._view("total", pe, (1,), torch.int32),
            ))  # fmt: skip
        ns = [args["n"] for _, args in tokens]
        geometry = self._call_geometry("dispatch", name, max(ns), hidden, block_num, rdma_block_num, warp_per_block)
        if routing is not None:
            routing.check(self.op_id, self.config, self._pes(), ns, "dispatch")
        self._last_n = ns  # (only once every check passed: a refused call leaves the last routing)
        return dtype, tokens, results, geometry

    def dispatch_send(self, input, weights, scales, indices, block_num: int = -1, rdma_block_num: int = -1,
                      warp_per_block: int = -1, call_local_expert_count: bool = False, *, routing=None,
                      return_routing: bool = False):  # fmt: skip
        """AsyncLL: post every token to its destinations and return the output views (valid once
        ``dispatch_recv()`` has run on the stream); the local expert count is the receive's
        (``dispatch_recv(call_local_expert_count=True)``). Other kernel types: ``dispatch``."""
        if not self.is_async:
            return self.dispatch(input, weights, scales, indices, block_num, rdma_block_num, warp_per_block,
                                 call_local_expert_count, routing=routing, return_routing=return_routing)  # fmt: skip
        self._routing_refusal(routing, return_routing, "dispatch_send")
        if call_local_expert_count is not False:
            raise ValueError("dispatch_send: AsyncLL counts the local experts once the rows are received: pass "
                             "call_local_expert_count=True to dispatch_recv()")  # fmt: skip
        self._phases.before_send("dispatch")
        dtype, tokens, results, (launches, blocks, _) = self._dispatch_inputs(
            input, weights, scales, indices, block_num, rdma_block_num, warp_per_block)  # fmt: skip
        launches.launch("async_dispatch_send", dtype, tokens, blocks)
        self._phases.after_send("dispatch")
        # What the receive launch takes from its send: dtype, hidden and, in AUTO mode, the geometry.
        self._pending["dispatch"] = (dtype, tokens[0][1]["hidden"], launches, blocks)
        return results if self.virtual else results[0]

    def dispatch_recv(self, block_num: int = -1, warp_per_block: int = -1, call_local_expert_count: bool = False):
        """AsyncLL only: wait for every peer's tokens and lay them out (rows grouped by source PE)."""
        if not self.is_async:
            raise RuntimeError(f"dispatch_recv is only used by the AsyncLL kernel type; {self.kernel_type.name}'s "
                               "dispatch_send (= dispatch) completes the whole exchange")  # fmt: skip
        self._check_flag(call_local_expert_count, "call_local_expert_count")
        self._phases.before_recv("dispatch")
        dtype, hidden, launches, blocks = self._pending["dispatch"]
        if self.auto is None:
            self._check_warps(warp_per_block)
            blocks = self._grid(block_num)
        calls = [(pe, {"hidden": hidden}) for pe in self._pes()]
        launches.launch("async_dispatch_recv", dtype, calls, blocks)
        self._phases.after_recv("dispatch")
        self._after_dispatch(call_local_expert_count)  # (the exchange is whole: a debug error leaves none pending)

    # ---- combine -----------------------------------------------------------------------------------
    def combine(self, input, weights, indices, block_num: int = -1, rdma_block_num: int = -1,
                warp_per_block: int = -1, use_external_inp_buf: int = -1, call_reset: bool = False, *,
                routing=None):  # fmt: skip
        """Sum each token's rows back from its destination PEs. Returns (out [M, H], out_weights [M, K] or
        None) per PE. AsyncLL: send, then receive. Inter-node types: see _internode_combine. ``routing``
        (IntraNode, InterNodeV1): a routing handle whose forward maps the combine uses (copied into the op's on the
        stream first); the rows are those the last dispatch laid out, which must be the handle's recorded
        dispatch or a replay of it."""
        self._routing_refusal(routing, False, "combine")
        if self.is_async:
            results = self.combine_send(input, weights, indices, block_num, rdma_block_num, warp_per_block,
                                        use_external_inp_buf, call_reset)  # fmt: skip
            self.combine_recv(block_num, warp_per_block)
            return results
        if self.is_internode:
            return self._internode_combine(input, weights, indices, block_num, rdma_block_num, warp_per_block, routing)
        c = self.config
        external = c.use_external_inp_buf if use_external_inp_buf in (-1, None) else bool(use_external_inp_buf)
        if external and not c.use_external_inp_buf:
            raise ValueError("use_external_inp_buf=1 needs the op built with config.use_external_inp_buf=True "
                             "(the push staging buffer)")  # fmt: skip
        if not external and c.quant_type != "none":  # refused, not silently unquantized
            raise ValueError(f"config.quant_type {c.quant_type!r} needs the push combine: use_external_inp_buf=0 "
                             "(zero-copy) reads the rows unquantized")  # fmt: skip
        dtype, rows, results, (launches, blocks, _) = self._combine_inputs(
            input, weights, indices, block_num, rdma_block_num, warp_per_block, zero_copy=not external)  # fmt: skip
        if routing is not None:
            self._use_routing(routing, [n for _, (_, _, n, _, _) in rows])
        calls = []
        for pe, (y, w, n, hidden, out_w) in rows:
            if external:
                calls.append((pe, {"inp": y.data_ptr(), "inp_w": w, "n": n, "hidden": hidden, **out_w}))
            else:
                _copy_rows(y, self.get_registered_combine_input_buffer(y.dtype, hidden, pe=pe))
                calls.append((pe, {"inp_w": w, "n": n, "hidden": hidden, **out_w}))
        launches.launch(combine_family(zero_copy=not external), dtype, calls, blocks)
        return results if self.virtual else results[0]

    def _internode_combine(self, input, weights, indices, block_num, rdma_block_num, warp_per_block, routing=None):
        """The inter-node combine: the input rows and weights copied into the registered buffers (torch
        copies on the current stream; none where the input already is the registered buffer), then
        ``inter_combine`` and ``inter_combine_all``. Both forms of ``use_external_inp_buf`` are accepted:
        the kernels always read the registered buffers (as MORI's V1), so a caller that writes the expert
        outputs into ``get_registered_combine_input_buffer()`` saves the copy."""
        import torch

        dtype, rows, results, (launches, blocks, rdma) = self._combine_inputs(input, weights, indices, block_num,
                                                                              rdma_block_num, warp_per_block)
        rdma_blocks = internode_rdma_blocks(self.config, blocks, rdma)
        R, K = self.sizes.recv_capacity, self.config.num_experts_per_token
        if routing is not None:
            self._use_routing(routing, [n for _, (_, _, n, _, _) in rows])
        ws = self._per_pe(weights, "weights")
        combine_calls, sum_calls = [], []
        for i, (pe, (y, _, n, hidden, out_w)) in enumerate(rows):
            w = ws[i]
            if w is not None and w.shape[0] > R:
                raise ValueError(f"weights[{pe}] has {w.shape[0]} rows, more than the receive capacity {R}")
            _copy_rows(y, self.get_registered_combine_input_buffer(y.dtype, hidden, pe=pe))
            if w is not None:
                _copy_rows(w, self._view("reg_w", pe, (R, K), torch.float32))
            combine_calls.append((pe, {"n": n, "hidden": hidden, "rdma_blocks": rdma_blocks,
                                       "has_w": int(w is not None)}))  # fmt: skip
            sum_calls.append((pe, {"n": n, "hidden": hidden, **out_w}))
        launches.launch("inter_combine", dtype, combine_calls, blocks)
        launches.launch("inter_combine_all", dtype, sum_calls, blocks)
        return results if self.virtual else results[0]

    def _combine_inputs(self, input, weights, indices, block_num, rdma_block_num, warp_per_block, zero_copy=None):
        """Checks every PE's combine arguments; returns (dtype, [(pe, (input, weights address, n, hidden, the
        output-weights argument: {} for the buffer, {"out_w": 0} for none))], the per-PE result views ([M,
        hidden] rows), the call's geometry (_call_geometry's: launches, grid blocks, rdma_block_num))."""
        import torch

        c = self.config
        ys, ws, ids = (self._per_pe(a, n) for a, n in ((input, "input"), (weights, "weights"), (indices, "indices")))
        seen, rows, results = None, [], []
        for i, pe in enumerate(self._pes()):
            y, w, idx = ys[i], ws[i], ids[i]
            name, dtype, hidden = self._token_dtype(y, f"input[{pe}]", COMBINE_DTYPES, "combine", seen)
            seen = (name, hidden)
            if c.quant_type != "none" and name != QUANT_COMBINE_DTYPE:
                raise ValueError(f"config.quant_type {c.quant_type!r} quantizes bf16 combines; input[{pe}] is "
                                 f"{y.dtype} (combine bf16 rows, or build an op with quant_type 'none')")  # fmt: skip
            self._check_tensor(idx, f"indices[{pe}]", ndim=2, dtypes=(torch.int32,), dim1=c.num_experts_per_token)
            n = idx.shape[0]
            if n != self._last_n[i]:
                raise ValueError(f"indices[{pe}] has {n} tokens but the last dispatch sent {self._last_n[i]}; combine "
                                 "takes the routing given to dispatch")  # fmt: skip
            if y.shape[0] > self.sizes.recv_capacity:
                raise ValueError(f"input[{pe}] has {y.shape[0]} rows, more than the receive capacity "
                                 f"{self.sizes.recv_capacity}")  # fmt: skip
            if w is not None:
                self._check_tensor(w, f"weights[{pe}]", ndim=2, dtypes=(torch.float32,), dim1=c.num_experts_per_token)
            out_w = {} if w is not None else {"out_w": 0}  # the output weights buffer, or null
            rows.append((pe, (y, 0 if w is None else w.data_ptr(), n, hidden, out_w)))
            M, K = c.max_num_inp_token_per_rank, c.num_experts_per_token
            out = self._view("out_c", pe, (M * hidden * y.element_size(),), torch.uint8).view(y.dtype)
            results.append((out.view(M, hidden), self._view("out_cw", pe, (M, K), torch.float32) if w is not None
                            else None))  # fmt: skip
        n_most = max(n for _, (_, _, n, _, _) in rows)
        geometry = self._call_geometry("combine", dtype, n_most, hidden, block_num, rdma_block_num, warp_per_block,
                                       zero_copy)  # fmt: skip
        return dtype, rows, results, geometry

    def combine_send(self, input, weights, indices, block_num: int = -1, rdma_block_num: int = -1,
                     warp_per_block: int = -1, use_external_inp_buf: int = -1, call_reset: bool = False, *,
                     routing=None):  # fmt: skip
        """AsyncLL: return every received row to its source PE; returns the (out, out_weights) views (valid
        once ``combine_recv()`` has run on the stream). Other kernel types: ``combine``."""
        if not self.is_async:
            return self.combine(input, weights, indices, block_num, rdma_block_num, warp_per_block,
                                use_external_inp_buf, call_reset, routing=routing)  # fmt: skip
        self._routing_refusal(routing, False, "combine_send")
        self._phases.before_send("combine")
        dtype, rows, results, (launches, blocks, _) = self._combine_inputs(input, weights, indices, block_num,
                                                                           rdma_block_num, warp_per_block)
        calls = [(pe, {"inp": y.data_ptr(), "inp_w": w, "hidden": h}) for pe, (y, w, n, h, out_w) in rows]
        launches.launch("async_combine_send", dtype, calls, blocks)
        self._phases.after_send("combine")
        recv_calls = [(pe, {"n": n, "hidden": h, **out_w}) for pe, (y, w, n, h, out_w) in rows]
        self._pending["combine"] = (dtype, recv_calls, launches, blocks)
        return results if self.virtual else results[0]

    def combine_recv(self, block_num: int = -1, warp_per_block: int = -1):
        """AsyncLL only: wait for every destination's rows and sum them per token."""
        if not self.is_async:
            raise RuntimeError(f"combine_recv is only used by the AsyncLL kernel type; {self.kernel_type.name}'s "
                               "combine_send (= combine) completes the whole exchange")  # fmt: skip
        self._phases.before_recv("combine")
        dtype, calls, launches, blocks = self._pending["combine"]
        if self.auto is None:
            self._check_warps(warp_per_block)
            blocks = self._grid(block_num)
        launches.launch("async_combine_recv", dtype, calls, blocks)
        self._phases.after_recv("combine")

    # ---- standard-MoE (DeepEP) layout: standard_moe.py ------------------------------------------------
    def convert_dispatch_output(self, dispatch_out_x, dispatch_out_topk_idx, *, pe: int | None = None):
        """(packed_recv_x [Er, W*M, H], packed_recv_count [Er], packed_recv_src_info [Er, W*M],
        packed_recv_layout_range (empty)) from a dispatch's outputs (one PE's, ``pe`` with virtual PEs)."""
        import torch

        rank = self._pes()[0] if pe is None else pe
        total = self._view("total", rank, (1,), torch.int32)
        return standard_moe.dispatch_output_to_standard(self.sizes, dispatch_out_x, dispatch_out_topk_idx, total, rank)

    def convert_combine_input(self, packed_recv_x, packed_recv_src_info, packed_recv_layout_range, *,
                              pe: int | None = None):  # fmt: skip
        """The registered combine input [R, H], each received row i set to sum over its local experts k of
        w[i, k] * packed_recv_x[e_k][position of row i] (fp32 accumulate), ready for a zero-copy combine."""
        import torch

        rank = self._pes()[0] if pe is None else pe
        R, K = self.sizes.recv_capacity, self.sizes.top_k
        out_idx = self._view("out_idx", rank, (R, K), torch.int32)
        out_w = self._view("out_w", rank, (R, K), torch.float32)
        total = self._view("total", rank, (1,), torch.int32)
        reg = self.get_registered_combine_input_buffer(packed_recv_x.dtype, packed_recv_x.shape[-1], pe=rank)
        return standard_moe.standard_to_combine_input(self.sizes, packed_recv_x, out_idx, out_w, total, rank, reg)

    def dispatch_standard_moe(self, input, weights, scales, indices, **kwargs):
        """dispatch, then the DeepEP layout of its output (per PE with virtual PEs)."""
        outs = self.dispatch(input, weights, scales, indices, **kwargs)
        outs = outs if self.virtual else [outs]
        conv = [self.convert_dispatch_output(o[0], o[3], pe=pe) for o, pe in zip(outs, self._pes())]
        return conv if self.virtual else conv[0]

    def combine_standard_moe(self, input, weights, indices, **kwargs):
        """Expert outputs in the DeepEP layout [Er, W*M, H] (routing weights applied here, as MORI's) →
        (out [M, H], None)."""
        if self.config.use_external_inp_buf and not (self.is_async or self.is_internode):
            raise ValueError("combine_standard_moe uses the zero-copy combine: build the op with "
                             "use_external_inp_buf=False")  # fmt: skip
        packed = self._per_pe(input, "input")
        regs = [self.convert_combine_input(x, None, None, pe=pe) for x, pe in zip(packed, self._pes())]
        res = self.combine(regs if self.virtual else regs[0], None, indices, **kwargs)
        res = res if self.virtual else [res]
        out = [(o, None) for o, _ in res]
        return out if self.virtual else out[0]

    # ---- state -------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Nothing to do on the device: every kernel leaves its counters ready for the next call (as
        MORI's). AsyncLL refuses while a send waits for its recv (the peers' notifications are in flight)."""
        if self.is_async:
            pending = [leg for leg in self._phases.LEGS if self._phases.pending(leg)]
            if pending:
                raise RuntimeError(f"reset() with {pending[0]}_send pending: call {pending[0]}_recv() first")

    def get_registered_combine_input_buffer(self, dtype, hidden_dim: int = -1, *, pe: int | None = None):
        """The [R, hidden] view of the symmetric buffer the zero-copy combine reads (per PE with virtual PEs);
        ``hidden_dim`` <= config.hidden_dim (-1: the config's), the rows packed at it as a combine of that
        hidden reads them."""
        import torch

        c = self.config
        hidden = c.hidden_dim if hidden_dim in (-1, None) else hidden_dim
        size = torch.empty((), dtype=dtype).element_size()
        if size > c.max_token_type_size:
            raise ValueError(f"dtype {dtype} is wider than max_token_type_size {c.max_token_type_size}")
        check_call_hidden(hidden, size, c.hidden_dim, "get_registered_combine_input_buffer hidden_dim")
        if pe is None and self.virtual:
            return [self.get_registered_combine_input_buffer(dtype, hidden, pe=p) for p in self._pes()]
        pe = self._pes()[0] if pe is None else pe
        raw = self._view("reg_x", pe, (self.sizes.recv_capacity * hidden * size,), torch.uint8)
        return raw.view(dtype).view(self.sizes.recv_capacity, hidden)

    def get_dispatch_src_token_pos(self):
        """Synchronizes; int32 [total_recv] with srcRank * (W * M) + srcTok for every received row."""
        import torch

        torch.cuda.synchronize()
        out = []
        for pe in self._pes():
            total = int(self._view("total", pe, (1,), torch.int32)[0])
            out.append(self._view("src_pos", pe, (self.sizes.recv_capacity,), torch.int32)[:total].clone())
        return out if self.virtual else out[0]

    def dispatch_overflow(self):
        """Tokens dropped since construction because a receiver's capacity (max_total_recv_tokens) was
        exceeded: they are not written anywhere, and combine leaves them out (synchronizes)."""
        import torch

        torch.cuda.synchronize()
        counts = [int(self._view("status", pe, (1,), torch.int32)[0]) for pe in self._pes()]
        return counts if self.virtual else counts[0]

    def internode_traffic(self):
        """Bytes the inter-node kernels moved since construction (synchronizes): per PE a dict over
        ``ep_schema.TRAFFIC_COUNTERS``: ``dispatch_rdma``/``combine_rdma``, the records and partials put to
        PEs of other nodes; ``dispatch_xgmi``/``combine_xgmi``, the rows stored to or read from PEs of this
        node (docs/ep-protocols.md §16 says what each counts). A list with virtual PEs."""
        import torch

        if not self.is_internode:
            raise RuntimeError(f"internode_traffic: the {self.kernel_type.name} kernel type has no traffic counters "
                               "(only InterNode, InterNodeV1 and InterNodeV1LL count their bytes)")  # fmt: skip
        torch.cuda.synchronize()
        width = 8 * len(TRAFFIC_COUNTERS)  # one little-endian u64 each
        counts = []
        for pe in self._pes():
            raw = bytes(self._view("traffic", pe, (width,), torch.uint8).cpu().tolist())
            counts.append(dict(zip(TRAFFIC_COUNTERS, struct.unpack(f"<{len(TRAFFIC_COUNTERS)}Q", raw))))
        return counts if self.virtual else counts[0]

    def close(self) -> None:
        """Free the op's symmetric buffers (every PE must close its ops in the same order)."""
        buffers = getattr(self, "buffers", None)
        if buffers is not None:  # (kept: its views and the launches then refuse, naming close())
            buffers.free()

    def config_dict(self) -> dict:
        mode = {"asyncll": self.asyncll.as_dict()} if self.asyncll else {}
        return dataclasses.asdict(self.config) | {"target": self.target.name, "virtual_pes": self.virtual} | mode


def _copy_rows(src, registered) -> None:
    """``src``'s rows into the first rows of the registered buffer view ``registered`` (same dtype, same
    row width), on the current stream; nothing to do when ``src`` already is that buffer (zero-copy)."""
    if src.data_ptr() != registered.data_ptr():
        registered[: src.shape[0]].copy_(src)
