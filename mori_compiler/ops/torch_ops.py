"""torch.library custom ops over ``EpDispatchCombineOp``: dispatch, combine and AsyncLL's send/receive halves
as graph nodes that ``torch.compile(fullgraph=True)`` keeps (no graph break), CUDA graphs included
(``mode="reduce-overhead"``). docs/torch-compile.md shows a MoE step.

    tops = EpTorchOps(op)                                   # op: an EpDispatchCombineOp (after shmem init)
    out_x, out_w, out_s, out_idx, total = tops.dispatch(x, w, None, idx)   # a list of tuples with virtual PEs
    out, out_w = tops.combine(y, w_rows, idx)
    pending = tops.dispatch_send(x, w, None, idx)           # AsyncLL: independent work may run in between
    outs = tops.dispatch_recv(pending)

The ops, in namespace ``mori_compiler`` (``torch.ops.mori_compiler.<name>``): ``dispatch``, ``combine``,
``dispatch_send``, ``dispatch_recv``, ``combine_send``, ``combine_recv``. Their contract:

* **The op by handle.** A custom op takes tensors and scalars only, so the stateful EpDispatchCombineOp is
  named by an int, ``EpTorchOps.handle``, its key in this module's registry (one process; a handle means
  nothing in another one). ``EpTorchOps.close()`` removes it (a later call names the handle and refuses).
* **Tensor arguments are lists**, one tensor per local PE: ``n_pes`` with virtual PEs, one in a process per PE.
  The ``EpTorchOps`` methods take and return what the op's own methods do (lists per PE, or single tensors).
* **Functional, fresh outputs.** No input is mutated and no output aliases anything: each output is a copy of
  the op's registered (symmetric) buffer, which the next call overwrites and the peers write into. The eager
  op returns views of those buffers, but a custom op may not return an alias of an input or of memory the
  graph does not own (its fake implementation could not describe it, and the compiler would reuse or reorder
  around a tensor that silently changes). The copies cost device bandwidth: dispatch copies its [R, h] rows
  (R = ``recv_capacity``), [R, K] ids (and weights, scales when given) and the count; combine its [M, h] rows
  (and [M, K] weights); e.g. 8 PEs, M = 128, h = 7168 bf16: R = 1024 rows, 14.7 MB per PE read and written
  (~6 µs at the H200's ~4.8 TB/s), in one multi-tensor copy per dtype for all PEs (``torch._foreach_copy_``),
  timed by test/python/gpu/test_torch_compile_gpu.py (``test_copy_cost``). Rows ``[total, R)`` of a
  dispatch output are unspecified (as the op's).
* **Hidden state, ordered by data.** The side effects (peers' buffers, counters, the op's bookkeeping) are on
  memory no graph tensor aliases. Calls on one op are ordered by their data: combine's input comes from
  dispatch's output (the expert computation), and each AsyncLL send returns a token its receive takes. The
  ops are registered as side-effectful (``torch.fx.node.has_side_effect``) so that a call whose outputs are
  unused is not removed (the peers would wait for it).
* **Fixed addresses.** A virtual-PE launch passes its pointers in a device argument table that CUDA-graph
  capture can reuse but not upload (runtime/launcher.py). The inputs are therefore copied into buffers of this
  object (allocated once, here) and the combine rows into the op's registered combine input (which the
  zero-copy combine copies them into anyway): a table then depends only on the token counts, hidden, dtype and
  which optional inputs are given. A call seen for the first time runs in a thread of its own (on a side
  stream, waited for), so that its tables (and anything else first use allocates) never come from a CUDA-graph
  memory pool: torch.compile's CUDA-graph warm-up sends every allocation of its thread to the graph's pool and
  refuses, at its end, allocations it cannot account for. A first-seen call during a capture is refused with
  the call named: run the step once (eagerly or compiled) with the same token counts first.
* **Fake implementations** give the real outputs' shapes, dtypes and (contiguous) strides: dispatch returns
  buffers of the maximum size, [R, h], with the count as an int32 [1] tensor (no data-dependent shape).
* **Not offered** (refused with the reason): autograd (no backward: run under ``torch.no_grad()``), the
  routing handles (``routing=``, ``return_routing=``: Python objects), the standard-MoE layout methods.

This module imports torch (the ``cuda`` extra); ``mori_compiler.ops`` loads it only on ``EpTorchOps`` access.
"""

from __future__ import annotations

import itertools
import threading
from typing import NamedTuple, Optional

from mori_compiler.runtime.extras import import_extra

torch = import_extra("torch")  # (missing: one error naming the extra to install)
Tensor = torch.Tensor

NAMESPACE = "mori_compiler"
OPS = ("dispatch", "combine", "dispatch_send", "dispatch_recv", "combine_send", "combine_recv")

_REGISTRY: dict[int, "EpTorchOps"] = {}
_HANDLES = itertools.count(1)


def registered(handle) -> "EpTorchOps":
    """The EpTorchOps registered under ``handle`` (a RuntimeError naming it when there is none)."""
    key = int(handle)
    found = _REGISTRY.get(key)
    if found is None:
        raise RuntimeError(f"{NAMESPACE} torch ops: no op is registered under handle {key} (closed with "
                           "EpTorchOps.close(), or a handle of another process); wrap the op in EpTorchOps(op)")  # fmt: skip
    return found


class PendingDispatch(NamedTuple):
    """What ``EpTorchOps.dispatch_send`` returns and ``dispatch_recv`` takes: the ordering token and the
    static facts of the send that the receive's outputs depend on."""

    token: Tensor
    hidden: int
    dtype: torch.dtype
    weights_given: tuple
    scales_given: tuple
    scale_dtype: Optional[torch.dtype]


class PendingCombine(NamedTuple):
    """What ``EpTorchOps.combine_send`` returns and ``combine_recv`` takes."""

    token: Tensor
    hidden: int
    dtype: torch.dtype
    weights_given: tuple


def _dispatch_fields(has_w: bool, has_s: bool, count: bool) -> tuple[str, ...]:
    """The names of one PE's dispatch outputs, in the order the ops return them (flattened over PEs)."""
    return ("x",) + (("w",) if has_w else ()) + (("s",) if has_s else ()) + ("idx", "total") + (
        ("count",) if count else ())  # fmt: skip


class EpTorchOps:
    """An EpDispatchCombineOp registered for the ``mori_compiler`` torch ops, with MORI-shaped methods that
    call them (traceable by torch.compile). ``device``: where the op's tensors live (default the current
    CUDA device). Allocates the input staging buffers here: per local PE ``M`` rows of ``hidden_dim`` x
    ``max_token_type_size`` bytes, [M, K] weights and ids, [M, scale_dim] scales, [R, K] combine weights."""

    def __init__(self, op, *, device=None):
        c = op.config
        self.op = op
        self.config = c
        self.virtual = bool(op.virtual)
        self.n_local = int(op.n_local)
        self.is_async = bool(op.is_async)
        self.recv_capacity = int(op.sizes.recv_capacity)
        self._pe_args = list(range(self.n_local)) if self.virtual else [None]  # the op's pe= per local PE
        device = torch.device("cuda" if device is None else device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        M, K, R = c.max_num_inp_token_per_rank, c.num_experts_per_token, self.recv_capacity
        capacity = {"x": M * c.hidden_dim * c.max_token_type_size, "w": M * K * 4,
                    "s": M * max(c.scale_dim, 1) * max(c.scale_type_size, 1), "idx": M * K * 4, "cw": R * K * 4}
        self._capacity = capacity
        self._stage = [{name: torch.empty(size, dtype=torch.uint8, device=self.device)
                        for name, size in capacity.items()} for _ in range(self.n_local)]  # fmt: skip
        op.local_expert_count  # noqa: B018 - allocated now (on first use it would come from a graph's pool)
        self._side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._seen: set = set()
        self._pending: dict = {}  # AsyncLL: the send's result views, for its receive
        self.calls = 0  # op calls the implementations made (a CUDA-graph replay makes none)
        self.handle = next(_HANDLES)
        _REGISTRY[self.handle] = self

    def close(self) -> None:
        """Unregister (the op itself stays open: ``op.close()`` frees its buffers)."""
        _REGISTRY.pop(self.handle, None)

    # ---- the methods a compiled function calls ---------------------------------------------------------
    def dispatch(self, input, weights, scales, indices, block_num: int = -1, rdma_block_num: int = -1,
                 warp_per_block: int = -1, call_local_expert_count: bool = False, *, routing=None,
                 return_routing: bool = False):  # fmt: skip
        """The op's ``dispatch`` (send then receive for AsyncLL), as ``torch.ops.mori_compiler.dispatch``:
        per PE (out_x [R, h], out_w [R, K] or None, out_s or None, out_idx [R, K], total int32 [1]), fresh
        tensors; with ``call_local_expert_count=True`` a sixth element, the int32 [Er] local expert count."""
        _refuse_routing(routing, return_routing, "dispatch")
        xs, ws, ss, ids = self._lists(input, weights, scales, indices)
        _refuse_grad("dispatch", xs, ws, ss)
        flat = torch.ops.mori_compiler.dispatch(self.handle, xs, ws, ss, ids, block_num, rdma_block_num,
                                                warp_per_block, call_local_expert_count)  # fmt: skip
        return self._dispatch_tuples(flat, [w is not None for w in ws], [s is not None for s in ss],
                                     call_local_expert_count)  # fmt: skip

    def combine(self, input, weights, indices, block_num: int = -1, rdma_block_num: int = -1,
                warp_per_block: int = -1, use_external_inp_buf: int = -1, *, routing=None):  # fmt: skip
        """The op's ``combine`` (send then receive for AsyncLL), as ``torch.ops.mori_compiler.combine``: per
        PE (out [M, h], out_weights [M, K] or None), fresh tensors."""
        _refuse_routing(routing, False, "combine")
        ys, ws, ids = self._lists(input, weights, indices)
        _refuse_grad("combine", ys, ws)
        flat = torch.ops.mori_compiler.combine(self.handle, ys, ws, ids, block_num, rdma_block_num, warp_per_block,
                                               use_external_inp_buf)  # fmt: skip
        return self._combine_tuples(flat, [w is not None for w in ws])

    def dispatch_send(self, input, weights, scales, indices, block_num: int = -1, rdma_block_num: int = -1,
                      warp_per_block: int = -1) -> PendingDispatch:  # fmt: skip
        """AsyncLL: the send phase (``torch.ops.mori_compiler.dispatch_send``); returns the PendingDispatch
        that ``dispatch_recv`` takes (the outputs come from the receive)."""
        self._require_async("dispatch_send")
        xs, ws, ss, ids = self._lists(input, weights, scales, indices)
        _refuse_grad("dispatch_send", xs, ws, ss)
        token = torch.ops.mori_compiler.dispatch_send(self.handle, xs, ws, ss, ids, block_num, rdma_block_num,
                                                      warp_per_block)  # fmt: skip
        scale_dtype = next((s.dtype for s in ss if s is not None), None)
        return PendingDispatch(token, xs[0].shape[1], xs[0].dtype, tuple(w is not None for w in ws),
                               tuple(s is not None for s in ss), scale_dtype)  # fmt: skip

    def dispatch_recv(self, pending: PendingDispatch, block_num: int = -1, warp_per_block: int = -1,
                      call_local_expert_count: bool = False):  # fmt: skip
        """AsyncLL: the receive phase; returns what ``dispatch`` does."""
        self._require_async("dispatch_recv")
        p = pending
        flat = torch.ops.mori_compiler.dispatch_recv(self.handle, p.token, p.hidden, p.dtype, list(p.weights_given),
                                                     list(p.scales_given), p.scale_dtype, block_num, warp_per_block,
                                                     call_local_expert_count)  # fmt: skip
        return self._dispatch_tuples(flat, p.weights_given, p.scales_given, call_local_expert_count)

    def combine_send(self, input, weights, indices, block_num: int = -1, rdma_block_num: int = -1,
                     warp_per_block: int = -1, use_external_inp_buf: int = -1) -> PendingCombine:  # fmt: skip
        """AsyncLL: the combine's send phase; returns the PendingCombine that ``combine_recv`` takes."""
        self._require_async("combine_send")
        ys, ws, ids = self._lists(input, weights, indices)
        _refuse_grad("combine_send", ys, ws)
        token = torch.ops.mori_compiler.combine_send(self.handle, ys, ws, ids, block_num, rdma_block_num,
                                                     warp_per_block, use_external_inp_buf)  # fmt: skip
        return PendingCombine(token, ys[0].shape[1], ys[0].dtype, tuple(w is not None for w in ws))

    def combine_recv(self, pending: PendingCombine, block_num: int = -1, warp_per_block: int = -1):
        """AsyncLL: the combine's receive phase; returns what ``combine`` does."""
        self._require_async("combine_recv")
        p = pending
        flat = torch.ops.mori_compiler.combine_recv(self.handle, p.token, p.hidden, p.dtype, list(p.weights_given),
                                                    block_num, warp_per_block)  # fmt: skip
        return self._combine_tuples(flat, p.weights_given)

    # ---- argument shapes (traced) -------------------------------------------------------------------------
    def _lists(self, *args):
        """Each argument as a list with one entry per local PE (None: a list of None)."""
        out = []
        for a in args:
            if a is None:
                out.append([None] * self.n_local)
            elif self.virtual:
                if not isinstance(a, (list, tuple)) or len(a) != self.n_local:
                    raise ValueError(f"with {self.n_local} virtual PEs pass a list of {self.n_local} tensors (one per "
                                     f"PE) or None, got {type(a).__name__}")  # fmt: skip
                out.append(list(a))
            else:
                out.append([a])
        return out

    def _dispatch_tuples(self, flat, weights_given, scales_given, count: bool):
        tuples, i = [], 0
        for has_w, has_s in zip(weights_given, scales_given):
            fields = _dispatch_fields(has_w, has_s, count)
            got = dict(zip(fields, flat[i: i + len(fields)]))
            i += len(fields)
            t = (got["x"], got.get("w"), got.get("s"), got["idx"], got["total"])
            tuples.append(t + (got["count"],) if count else t)
        return self._unwrap(tuples)

    def _combine_tuples(self, flat, weights_given):
        tuples, i = [], 0
        for has_w in weights_given:
            tuples.append((flat[i], flat[i + 1] if has_w else None))
            i += 2 if has_w else 1
        return self._unwrap(tuples)

    def _require_async(self, what: str) -> None:
        if not self.is_async:
            raise ValueError(f"{what}: the send/receive halves are AsyncLL's; this op is {self.op.kernel_type.name}, "
                             "whose dispatch/combine complete the whole exchange (use dispatch() and combine())")  # fmt: skip

    # ---- the implementations (run eagerly, or by a compiled graph) ----------------------------------------
    def _check_device(self, what: str, t) -> None:
        if t.device != self.device:
            raise ValueError(f"{what} is on {t.device}; the op's tensors are on {self.device}")

    def _staging(self, pe: int, slot: str, t, what: str):
        """The first bytes of this PE's staging buffer ``slot`` as a tensor of t's shape and dtype (an address
        that never changes), for ``t`` to be copied into (None for None)."""
        if t is None:
            return None
        self._check_device(what, t)
        nbytes = t.numel() * t.element_size()
        if nbytes > self._capacity[slot]:
            raise ValueError(f"{what} {tuple(t.shape)} {t.dtype} has {nbytes} bytes, more than the op's limit "
                             f"{self._capacity[slot]} (config: max_num_inp_token_per_rank, hidden_dim, "
                             "max_token_type_size, num_experts_per_token, scale_dim)")  # fmt: skip
        return self._stage[pe][slot][:nbytes].view(t.dtype).view(t.shape)

    def _combine_rows(self, pe: int, y, what: str):
        """The rows of the op's registered combine input that ``y`` is to be copied into (a fixed address, and
        what the zero-copy combine reads: the op then copies nothing)."""
        self._check_device(what, y)
        if y.dim() != 2:
            raise ValueError(f"{what} must have 2 dimensions, got shape {tuple(y.shape)}")
        if y.shape[0] > self.recv_capacity:
            raise ValueError(f"{what} has {y.shape[0]} rows, more than the receive capacity {self.recv_capacity}")
        reg = self.op.get_registered_combine_input_buffer(y.dtype, y.shape[1], pe=self._pe_args[pe])
        return reg[: y.shape[0]]

    def _run(self, signature: tuple, call):
        """``call()``; the first time ``signature`` is seen, in a thread of its own on a side stream (see the
        module docstring: torch.compile's CUDA-graph warm-up sends every allocation of its thread to the graph's
        memory pool, and the first call uploads argument tables that must outlive it)."""
        if signature in self._seen or self._side is None:
            return call()
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{NAMESPACE}.{signature[0]}: a CUDA graph capture met a call this op has not run "
                               f"before ({_describe(signature)}); its kernel argument tables must be uploaded "
                               "before capture: run the step once (eagerly, or compiled without CUDA graphs) "
                               "with the same token counts first")  # fmt: skip
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)

        def on_side_stream():
            with torch.cuda.device(self.device), torch.cuda.stream(self._side):
                return call()

        result = run_in_own_thread(on_side_stream)
        main.wait_stream(self._side)
        self._seen.add(signature)
        return result

    def _unwrap(self, items: list):
        return items if self.virtual else items[0]

    def _stage_dispatch(self, xs, ws, ss, ids):
        n = self.n_local
        _check_count(xs, n, "input"), _check_count(ws, n, "weights"), _check_count(ss, n, "scales")
        _check_count(ids, n, "indices")
        sx = [self._staging(p, "x", xs[p], f"input[{p}]") for p in range(n)]
        sw = [self._staging(p, "w", ws[p], f"weights[{p}]") for p in range(n)]
        sc = [self._staging(p, "s", ss[p], f"scales[{p}]") for p in range(n)]
        si = [self._staging(p, "idx", ids[p], f"indices[{p}]") for p in range(n)]
        _copy_all(sx + sw + sc + si, xs + ws + ss + ids)
        signature = ("dispatch", tuple(x.dtype for x in xs), tuple(tuple(x.shape) for x in xs),
                     tuple(w is not None for w in ws), tuple(None if s is None else (s.dtype, tuple(s.shape)) for s in ss))
        return signature, (self._unwrap(sx), self._unwrap(sw), self._unwrap(sc), self._unwrap(si))

    def _stage_combine(self, ys, ws, ids):
        n = self.n_local
        _check_count(ys, n, "input"), _check_count(ws, n, "weights"), _check_count(ids, n, "indices")
        sy = [self._combine_rows(p, ys[p], f"input[{p}]") for p in range(n)]
        sw = [self._staging(p, "cw", ws[p], f"weights[{p}]") for p in range(n)]
        _copy_all(sy + sw, ys + ws)
        signature = ("combine", tuple(y.dtype for y in ys), tuple(tuple(y.shape) for y in ys),
                     tuple(None if w is None else tuple(w.shape) for w in ws), tuple(tuple(i.shape) for i in ids))
        return signature, (self._unwrap(sy), self._unwrap(sw), self._unwrap(ids))

    def _dispatch_copies(self, results, weights_given, scales_given, count: bool) -> list:
        results = results if self.virtual else [results]
        counts = self.op.local_expert_count if count else None
        counts = (counts if self.virtual else [counts]) if count else None
        views = []
        for p, (out_x, out_w, out_s, out_idx, total) in enumerate(results):
            got = {"x": out_x, "w": out_w, "s": out_s, "idx": out_idx, "total": total,
                   "count": counts[p] if count else None}
            views += [got[f] for f in _dispatch_fields(weights_given[p], scales_given[p], count)]
        return _fresh_copies(views)

    def _combine_copies(self, results, weights_given) -> list:
        results = results if self.virtual else [results]
        views = []
        for p, (out, out_w) in enumerate(results):
            views += [out, out_w] if weights_given[p] else [out]
        return _fresh_copies(views)

    def run_dispatch(self, xs, ws, ss, ids, block_num, rdma_block_num, warp_per_block, count):
        signature, args = self._stage_dispatch(xs, ws, ss, ids)
        signature += (block_num, rdma_block_num, warp_per_block, count)
        self.calls += 1
        results = self._run(signature, lambda: self.op.dispatch(*args, block_num, rdma_block_num, warp_per_block,
                                                                count))  # fmt: skip
        return self._dispatch_copies(results, [w is not None for w in ws], [s is not None for s in ss], count)

    def run_combine(self, ys, ws, ids, block_num, rdma_block_num, warp_per_block, external):
        signature, args = self._stage_combine(ys, ws, ids)
        signature += (block_num, rdma_block_num, warp_per_block, external)
        self.calls += 1
        results = self._run(signature, lambda: self.op.combine(*args, block_num, rdma_block_num, warp_per_block,
                                                               external))  # fmt: skip
        return self._combine_copies(results, [w is not None for w in ws])

    def run_dispatch_send(self, xs, ws, ss, ids, block_num, rdma_block_num, warp_per_block):
        signature, args = self._stage_dispatch(xs, ws, ss, ids)
        signature = ("dispatch_send",) + signature[1:] + (block_num, rdma_block_num, warp_per_block)
        self.calls += 1
        results = self._run(signature, lambda: self.op.dispatch_send(*args, block_num, rdma_block_num,
                                                                     warp_per_block))  # fmt: skip
        self._pending["dispatch"] = (results, signature, [w is not None for w in ws], [s is not None for s in ss],
                                     xs[0].shape[1], xs[0].dtype)  # fmt: skip
        return xs[0].new_empty((0,), dtype=torch.uint8)

    def run_dispatch_recv(self, hidden, dtype, weights_given, scales_given, block_num, warp_per_block, count):
        pending = self._pending.pop("dispatch", None)
        if pending is None:
            raise RuntimeError(f"{NAMESPACE}.dispatch_recv without a pending dispatch_send on this op: call "
                               "dispatch_send first")  # fmt: skip
        results, send_signature, sent_w, sent_s, sent_hidden, sent_dtype = pending
        if (list(weights_given), list(scales_given), hidden, dtype) != (sent_w, sent_s, sent_hidden, sent_dtype):
            raise ValueError(f"{NAMESPACE}.dispatch_recv: its description (hidden {hidden}, {dtype}, weights "
                             f"{list(weights_given)}, scales {list(scales_given)}) is not the pending send's (hidden "
                             f"{sent_hidden}, {sent_dtype}, weights {sent_w}, scales {sent_s}): pass the "
                             "PendingDispatch that dispatch_send returned")  # fmt: skip
        signature = ("dispatch_recv", send_signature, block_num, warp_per_block, count)
        self.calls += 1
        self._run(signature, lambda: self.op.dispatch_recv(block_num, warp_per_block, count))
        return self._dispatch_copies(results, sent_w, sent_s, count)

    def run_combine_send(self, ys, ws, ids, block_num, rdma_block_num, warp_per_block, external):
        signature, args = self._stage_combine(ys, ws, ids)
        signature = ("combine_send",) + signature[1:] + (block_num, rdma_block_num, warp_per_block, external)
        self.calls += 1
        results = self._run(signature, lambda: self.op.combine_send(*args, block_num, rdma_block_num, warp_per_block,
                                                                    external))  # fmt: skip
        self._pending["combine"] = (results, signature, [w is not None for w in ws], ys[0].shape[1], ys[0].dtype)
        return ys[0].new_empty((0,), dtype=torch.uint8)

    def run_combine_recv(self, hidden, dtype, weights_given, block_num, warp_per_block):
        pending = self._pending.pop("combine", None)
        if pending is None:
            raise RuntimeError(f"{NAMESPACE}.combine_recv without a pending combine_send on this op: call "
                               "combine_send first")  # fmt: skip
        results, send_signature, sent_w, sent_hidden, sent_dtype = pending
        if (list(weights_given), hidden, dtype) != (sent_w, sent_hidden, sent_dtype):
            raise ValueError(f"{NAMESPACE}.combine_recv: its description (hidden {hidden}, {dtype}, weights "
                             f"{list(weights_given)}) is not the pending send's (hidden {sent_hidden}, {sent_dtype}, "
                             f"weights {sent_w}): pass the PendingCombine that combine_send returned")  # fmt: skip
        signature = ("combine_recv", send_signature, block_num, warp_per_block)
        self.calls += 1
        self._run(signature, lambda: self.op.combine_recv(block_num, warp_per_block))
        return self._combine_copies(results, sent_w)

    # ---- the fake implementations' shapes -----------------------------------------------------------------
    def fake_dispatch(self, like, hidden: int, dtype, weights_given, scales_given, scale_dtype, count: bool) -> list:
        c, R = self.config, self.recv_capacity
        K = c.num_experts_per_token
        shapes = {"x": ((R, hidden), dtype), "w": ((R, K), torch.float32), "s": ((R, c.scale_dim), scale_dtype),
                  "idx": ((R, K), torch.int32), "total": ((1,), torch.int32),
                  "count": ((c.num_experts_per_rank,), torch.int32)}  # fmt: skip
        flat = []
        for has_w, has_s in zip(weights_given, scales_given):
            for f in _dispatch_fields(has_w, has_s, count):
                shape, dt = shapes[f]
                flat.append(like.new_empty(shape, dtype=dt))
        return flat

    def fake_combine(self, like, hidden: int, dtype, weights_given) -> list:
        c = self.config
        M, K = c.max_num_inp_token_per_rank, c.num_experts_per_token
        flat = []
        for has_w in weights_given:
            flat.append(like.new_empty((M, hidden), dtype=dtype))
            if has_w:
                flat.append(like.new_empty((M, K), dtype=torch.float32))
        return flat


def run_in_own_thread(call):
    """``call()`` run in a new thread, waited for; its result returned, its exception raised here."""
    box: dict = {}

    def body():
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=body, name=f"{NAMESPACE}-first-call")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _copy_all(destinations: list, sources: list) -> None:
    """Every source into its destination (None pairs skipped), on the current stream: one multi-tensor copy
    per dtype (a few launches for all PEs instead of one per tensor)."""
    groups: dict = {}
    for d, s in zip(destinations, sources):
        if d is not None:
            groups.setdefault(d.dtype, []).append((d, s))
    for pairs in groups.values():
        torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


def _fresh_copies(views: list) -> list:
    """Contiguous copies of ``views`` (the op's buffer views) in new tensors, in one multi-tensor copy."""
    outs = [torch.empty(v.shape, dtype=v.dtype, device=v.device) for v in views]
    _copy_all(outs, views)
    return outs


def _check_count(items: list, n: int, what: str) -> None:
    if len(items) != n:
        raise ValueError(f"{what}: {len(items)} tensors for {n} local PEs (one per PE)")


def _describe(signature: tuple) -> str:
    return ", ".join(str(part) for part in signature[1:])


def _refuse_routing(routing, return_routing, what: str) -> None:
    if routing is not None or return_routing:
        raise ValueError(f"{NAMESPACE} torch ops: {what}(routing=/return_routing=) is not offered (a routing handle "
                         "is a Python object, not a tensor a graph can carry); call the op's own dispatch/combine "
                         "for routing replay")  # fmt: skip


def _refuse_grad(what: str, *lists) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for ts in lists for t in ts):
        raise ValueError(f"{NAMESPACE}.{what} has no backward (inference only): call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass tensors that do not require grad")  # fmt: skip


def _first_real(xs: list, what: str):
    if not xs:
        raise ValueError(f"{what}: no tensors (one per local PE)")
    return xs[0]


# ---- the op registrations ---------------------------------------------------------------------------------
@torch.library.custom_op(f"{NAMESPACE}::dispatch", mutates_args=())
def _dispatch(handle: int, x: list[Tensor], weights: list[Optional[Tensor]], scales: list[Optional[Tensor]],
              indices: list[Tensor], block_num: int, rdma_block_num: int, warp_per_block: int,
              call_local_expert_count: bool) -> list[Tensor]:  # fmt: skip
    return registered(handle).run_dispatch(x, weights, scales, indices, block_num, rdma_block_num, warp_per_block,
                                           call_local_expert_count)  # fmt: skip


@_dispatch.register_fake
def _dispatch_fake(handle, x, weights, scales, indices, block_num, rdma_block_num, warp_per_block,
                   call_local_expert_count):  # fmt: skip
    first = _first_real(x, "dispatch input")
    scale_dtype = next((s.dtype for s in scales if s is not None), None)
    return registered(handle).fake_dispatch(first, first.shape[1], first.dtype, [w is not None for w in weights],
                                            [s is not None for s in scales], scale_dtype, call_local_expert_count)


@torch.library.custom_op(f"{NAMESPACE}::combine", mutates_args=())
def _combine(handle: int, x: list[Tensor], weights: list[Optional[Tensor]], indices: list[Tensor], block_num: int,
             rdma_block_num: int, warp_per_block: int, use_external_inp_buf: int) -> list[Tensor]:  # fmt: skip
    return registered(handle).run_combine(x, weights, indices, block_num, rdma_block_num, warp_per_block,
                                          use_external_inp_buf)  # fmt: skip


@_combine.register_fake
def _combine_fake(handle, x, weights, indices, block_num, rdma_block_num, warp_per_block, use_external_inp_buf):
    first = _first_real(x, "combine input")
    return registered(handle).fake_combine(first, first.shape[1], first.dtype, [w is not None for w in weights])


@torch.library.custom_op(f"{NAMESPACE}::dispatch_send", mutates_args=())
def _dispatch_send(handle: int, x: list[Tensor], weights: list[Optional[Tensor]], scales: list[Optional[Tensor]],
                   indices: list[Tensor], block_num: int, rdma_block_num: int, warp_per_block: int) -> Tensor:  # fmt: skip
    return registered(handle).run_dispatch_send(x, weights, scales, indices, block_num, rdma_block_num, warp_per_block)


@_dispatch_send.register_fake
def _dispatch_send_fake(handle, x, weights, scales, indices, block_num, rdma_block_num, warp_per_block):
    registered(handle)
    return _first_real(x, "dispatch_send input").new_empty((0,), dtype=torch.uint8)


@torch.library.custom_op(f"{NAMESPACE}::dispatch_recv", mutates_args=())
def _dispatch_recv(handle: int, token: Tensor, hidden: int, dtype: torch.dtype, weights_given: list[bool],
                   scales_given: list[bool], scale_dtype: Optional[torch.dtype], block_num: int, warp_per_block: int,
                   call_local_expert_count: bool) -> list[Tensor]:  # fmt: skip
    return registered(handle).run_dispatch_recv(hidden, dtype, weights_given, scales_given, block_num, warp_per_block,
                                                call_local_expert_count)  # fmt: skip


@_dispatch_recv.register_fake
def _dispatch_recv_fake(handle, token, hidden, dtype, weights_given, scales_given, scale_dtype, block_num,
                        warp_per_block, call_local_expert_count):  # fmt: skip
    return registered(handle).fake_dispatch(token, hidden, dtype, weights_given, scales_given, scale_dtype,
                                            call_local_expert_count)  # fmt: skip


@torch.library.custom_op(f"{NAMESPACE}::combine_send", mutates_args=())
def _combine_send(handle: int, x: list[Tensor], weights: list[Optional[Tensor]], indices: list[Tensor],
                  block_num: int, rdma_block_num: int, warp_per_block: int, use_external_inp_buf: int) -> Tensor:  # fmt: skip
    return registered(handle).run_combine_send(x, weights, indices, block_num, rdma_block_num, warp_per_block,
                                               use_external_inp_buf)  # fmt: skip


@_combine_send.register_fake
def _combine_send_fake(handle, x, weights, indices, block_num, rdma_block_num, warp_per_block, use_external_inp_buf):
    registered(handle)
    return _first_real(x, "combine_send input").new_empty((0,), dtype=torch.uint8)


@torch.library.custom_op(f"{NAMESPACE}::combine_recv", mutates_args=())
def _combine_recv(handle: int, token: Tensor, hidden: int, dtype: torch.dtype, weights_given: list[bool],
                  block_num: int, warp_per_block: int) -> list[Tensor]:  # fmt: skip
    return registered(handle).run_combine_recv(hidden, dtype, weights_given, block_num, warp_per_block)


@_combine_recv.register_fake
def _combine_recv_fake(handle, token, hidden, dtype, weights_given, block_num, warp_per_block):
    return registered(handle).fake_combine(token, hidden, dtype, weights_given)


def _keep_calls() -> None:
    """Mark every op side-effectful, so that dead-code elimination keeps a call whose outputs are unused."""
    mark = getattr(torch.fx.node, "has_side_effect", None)
    if mark is None:  # (older torch: calls whose outputs are unused may be removed; every MoE step uses them)
        return
    for name in OPS:
        mark(getattr(getattr(torch.ops, NAMESPACE), name).default)


_keep_calls()
