"""Collectives on torch tensors: all_gather, all_reduce (one_shot, two_shot), reduce_scatter, broadcast,
all_to_all over the PEs of the symmetric heap (``mori_compiler.runtime.shmem``), with virtual PEs (one
process, one launch for all PEs: every tensor argument and result is a list per PE) or one PE per process.

    shmem.shmem_init_virtual(4)
    ar = Collective("all_reduce", torch.bfloat16, 1 << 20, algorithm="two_shot")
    outs = ar([x0, x1, x2, x3])          # outs[p] = x0 + x1 + x2 + x3 (fp32 sums, rounded once)

**Inputs in the symmetric heap are read in place.** When a PE's input lies in the heap (``heap_input()``,
or any tensor over ``shmem_malloc``), 16-byte aligned and apart from its output (all_gather and broadcast:
or exactly this PE's part of the output, in place), its peers read it where it is; any other input is
first copied into the workspace (the stage). Each PE decides for itself at every call; ``placement()``
says which it was. In place saves a copy of the input (and the staged path's extra traffic): on an H200
with 8 virtual PEs at 64 MiB, 1.1x (all_gather) to 2.8x (reduce_scatter) faster (bench/NOTES.md, session
13). The input must then stay unchanged until the call is done (stream order).

Each ``Collective`` is compiled once per (op, dtype, count, world size, algorithm/root) into a bundle from
the kernel cache (``coll_bundle``: keyed by the mori_coll module's text, dialects/mori_coll_schema.py, so a
GPU machine without the compiler finds a precompiled one), and owns one symmetric workspace (its header
zeroed once). A call launches one kernel on the current stream: no host sync, graph-capturable (capture
after one eager call with the same tensors: the virtual-PE argument table is uploaded by that call), calls
back to back reuse the workspace safely (docs/collectives.md). Every call must use the same grid, which
the object fixes (``blocks``).
"""

from __future__ import annotations

import os

from mori_compiler.dialects.mori_coll_schema import (BLOCK_THREADS, COLLECTIVES, ELEMENT_BYTES, HEADER_ALIGN,
                                                     REDUCING, CollSpec, auto_algorithm, kernel_source)  # fmt: skip

from .bundle import device_target

_TORCH_DTYPES = {"u8": "uint8", "i8": "int8", "bool": "bool", "fp8_e4m3fn": "float8_e4m3fn",
                 "fp8_e4m3fnuz": "float8_e4m3fnuz", "i16": "int16", "f16": "float16", "bf16": "bfloat16",
                 "i32": "int32", "f32": "float32", "i64": "int64", "f64": "float64"}  # fmt: skip
assert set(_TORCH_DTYPES) == set(ELEMENT_BYTES)


def dtype_name(dtype) -> str:
    """The schema's name of ``dtype`` (a torch dtype or a name of ELEMENT_BYTES)."""
    if isinstance(dtype, str):
        if dtype in ELEMENT_BYTES:
            return dtype
    else:
        for name, attr in _TORCH_DTYPES.items():
            if str(dtype) == f"torch.{attr}":
                return name
    raise ValueError(f"dtype must be a torch dtype or one of {', '.join(ELEMENT_BYTES)} (torch: "
                     f"{', '.join(_TORCH_DTYPES.values())}), got {dtype!r}")  # fmt: skip


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def coll_bundle(specs, target: str, *, virtual_pes: bool, cache_root=None, trace: bool = False):
    """The bundle holding the kernels of ``specs`` (CollSpecs) for ``target``: from the cache, or compiled
    now where the compiler is installed. The one path from specs to a bundle (the op and precompiling
    scripts call it, so they agree on the key)."""
    from mori_compiler.cache import get_bundle
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.options import CompileOptions
    from mori_compiler.targets import TARGETS

    if not isinstance(target, str) or target not in TARGETS:
        raise MoriCompilerError(f"coll_bundle: target must be one of {', '.join(TARGETS)}, got {target!r}")
    if cache_root is not None and not isinstance(cache_root, (str, os.PathLike)):
        raise MoriCompilerError(f"coll_bundle: cache_root must be None or a path, got {cache_root!r}")
    specs = list(specs)
    if not specs or not all(isinstance(s, CollSpec) for s in specs):
        raise MoriCompilerError(f"coll_bundle: specs must be a non-empty list of CollSpec, got {specs!r}")
    source = kernel_source(specs)  # (checks every spec: a ValueError names the field)
    if not isinstance(trace, bool):
        raise MoriCompilerError(f"coll_bundle: trace must be a bool, got {trace!r}")
    options = CompileOptions(target=target, virtual_pes=virtual_pes, trace=trace)  # trace: a bundle of its own
    # Keyed by the mori_coll text (found without MLIR); the pipeline's first pass, mori-coll-to-kernels, expands it.
    return get_bundle(source, options, cache_root=cache_root, what=f"collectives ({target})",
                      kernels=[s.kernel_name for s in specs])  # fmt: skip


def expected(spec: CollSpec, inputs: list, splits: list | None = None):
    """What every PE's output holds after the collective (torch on the host, from each PE's input as a
    CPU tensor): the sums in fp32, PE 0 first, rounded once (the kernels' order: bit-exact). all_to_all_v:
    ``splits[p]`` is PE p's split sizes (W ints, each clamped to count as the kernel does); the outputs are
    the received elements (packed, PE order; the rest of the kernel's output is not written)."""
    import torch

    W, n = spec.world_size, spec.count
    if len(inputs) != W:
        raise ValueError(f"expected: {len(inputs)} inputs for world_size {W}")
    flat = [None if x is None else x.reshape(-1) for x in inputs]
    if spec.op == "all_to_all_v":
        sizes = [[max(0, min(int(k), n)) for k in row] for row in splits]
        starts = [[sum(row[:q]) for q in range(W)] for row in sizes]
        return [torch.cat([flat[p][starts[p][q]:starts[p][q] + sizes[p][q]] for p in range(W)]) for q in range(W)]

    def total(parts):
        acc = parts[0].float()
        for part in parts[1:]:
            acc = acc + part.float()
        return acc.to(parts[0].dtype)

    if spec.op == "all_gather":
        return [torch.cat(flat) for _ in range(W)]
    if spec.op == "broadcast":
        return [flat[spec.root].clone() for _ in range(W)]
    if spec.op == "all_to_all":
        return [torch.cat([flat[p][q * n:(q + 1) * n] for p in range(W)]) for q in range(W)]
    if spec.op == "reduce_scatter":
        return [total([flat[p][q * n:(q + 1) * n] for p in range(W)]) for q in range(W)]
    return [total(flat) for _ in range(W)]  # all_reduce (either algorithm: the same order of the sums)


def aliasing_problem(spec: CollSpec, pe: int, input_at: int, output_at: int) -> str | None:
    """Why PE ``pe``'s input (``input_elems`` elements at address ``input_at``) may not overlap its output
    (``output_elems`` at ``output_at``) as it does; None when they are apart or overlap in one of the in-place
    forms: all_reduce, broadcast, all_to_all with input == output, all_gather with the input exactly this PE's
    part of the output, reduce_scatter with the output exactly this PE's chunk of the input. In those each
    unit rewrites only the bytes it staged itself; any other overlap would let one PE's pulls overwrite input
    bytes another of its blocks has not staged yet (silently wrong results). all_to_all_v: no overlap."""
    eb = spec.elem_bytes
    in_end, out_end = input_at + spec.input_elems * eb, output_at + spec.output_elems * eb
    if in_end <= output_at or out_end <= input_at:
        return None
    if spec.op == "all_gather":
        allowed = input_at == output_at + pe * spec.input_elems * eb
        form = "the input exactly this PE's part of the output"
    elif spec.op == "reduce_scatter":
        allowed = output_at == input_at + pe * spec.output_elems * eb
        form = "the output exactly this PE's chunk of the input"
    elif spec.op == "all_to_all_v":
        allowed, form = False, "none (the packed output offsets differ from the input's)"
    else:
        allowed, form = input_at == output_at, "input == output"
    if allowed:
        return None
    return (f"{spec.op}: the output of PE {pe} overlaps its input other than in place (allowed: {form}; "
            f"input at {input_at:#x}, output at {output_at:#x})")


class Collective:
    """One collective, compiled once: ``op`` (one of COLLECTIVES) over ``count`` elements of ``dtype`` (see
    dialects/mori_coll_schema.py for each op's input and output sizes) on every PE of the initialized
    shmem; ``algorithm`` for all_reduce (one_shot or two_shot; default: one_shot up to ONE_SHOT_MAX_BYTES,
    two_shot above), ``root`` for broadcast; ``blocks``: blocks per PE of every launch (default
    ``spec.blocks``; at most max_blocks, and with virtual PEs W x blocks must be co-resident). ``target``: the
    GPU's (default: sm_90 on CUDA, gfx942 on HIP); ``cache_root``: the kernel cache; ``wait_limit``: polls
    per device wait before it gives up (KernelSet's: a hang becomes a WaitTimeoutError); ``trace``: compile the
    phase trace points in (``kernel_trace()``; docs/tracing.md). Collective in
    multi-process mode: every PE constructs, calls and closes the same collectives in the same order."""

    def __init__(self, op: str, dtype, count: int, *, algorithm: str = "", root: int = 0, blocks: int | None = None,
                 target: str | None = None, cache_root=None, wait_limit: int | None = None, trace: bool = False):  # fmt: skip
        from mori_compiler.runtime.extras import import_extra

        torch = import_extra("torch")
        from mori_compiler.runtime import shmem
        from mori_compiler.runtime.launcher import KernelSet

        if op not in COLLECTIVES:
            raise ValueError(f"op must be one of {', '.join(COLLECTIVES)}, got {op!r}")
        state = shmem.state()
        self.virtual = bool(state.virtual)
        name = dtype_name(dtype)
        if op == "all_reduce" and algorithm == "" and type(count) is int:
            algorithm = auto_algorithm(name, count)
        self.spec = CollSpec(op, name, count, state.n_pes, algorithm, root)
        self.spec.check()
        if blocks is None:
            blocks = self.spec.blocks
        elif type(blocks) is not int or not 1 <= blocks <= self.spec.max_blocks:
            raise ValueError(f"{op}: blocks must be an int in [1, max_blocks = {self.spec.max_blocks}], got {blocks!r}")
        self.blocks = blocks  # every call's grid (the pieces depend on it)
        self.pes = list(range(state.n_pes)) if self.virtual else [shmem.shmem_mype()]
        self.target = target or device_target(state)
        if not isinstance(trace, bool):
            raise ValueError(f"{op}: trace must be a bool, got {trace!r}")
        self.trace = trace
        bundle = coll_bundle([self.spec], self.target, virtual_pes=self.virtual, cache_root=cache_root, trace=trace)
        self.kernels = KernelSet(bundle, wait_limit=wait_limit)
        self.dtype = torch_dtype(self.spec.dtype)
        self._heap_inputs: list[int] = []  # heap_input()'s allocations, freed by close()
        self._called = False  # placement() has a last call to report
        self._handle = shmem.shmem_malloc_align(HEADER_ALIGN, self.spec.workspace_bytes)
        for pe in self.pes:  # the device-barrier slots and epochs start at 0 (the kernels never reset them)
            shmem.shmem_tensor(self._handle, (self.spec.header_bytes,), torch.uint8,
                               pe=pe if self.virtual else None).zero_()  # fmt: skip
        self._workspace = [shmem.shmem_ptr_p2p(self._handle, 0, pe) if self.virtual else self._handle for pe in self.pes]
        torch.cuda.synchronize()  # zeroed on every PE before any peer writes into it
        shmem.shmem_barrier_all()

    def heap_input(self):
        """A fresh input in the symmetric heap (a list of W views with virtual PEs, one per PE; this PE's
        tensor otherwise; uninitialized), which the peers read in place. Freed by ``close()``; collective
        in multi-process mode (every PE allocates the same in the same order)."""
        from mori_compiler.runtime import shmem

        if self.kernels is None:
            raise RuntimeError(f"{self.spec.op}: the collective was closed")
        nbytes = self.spec.input_elems * self.spec.elem_bytes
        handle = shmem.shmem_malloc_align(HEADER_ALIGN, nbytes)
        self._heap_inputs.append(handle)
        views = [shmem.shmem_tensor(handle, self.input_shape, self.dtype, pe=pe if self.virtual else None)
                 for pe in self.pes]  # fmt: skip
        return views if self.virtual else views[0]

    def placement(self):
        """Where each PE's peers read its input in the last call: "input" (in place) or "stage" (copied into
        the workspace first); None for a broadcast's non-roots (they place nothing); a list per PE with
        virtual PEs. Synchronizes the device (a diagnostic)."""
        import torch

        from mori_compiler.runtime import shmem

        if self.kernels is None:
            raise RuntimeError(f"{self.spec.op}: the collective was closed")
        if not self._called:
            raise RuntimeError(f"{self.spec.op}: placement() reports the last call, and there was none yet")
        self.kernels.synchronize()
        s, found = self.spec, []
        for pe in self.pes:
            if s.op == "broadcast" and pe != s.root:
                found.append(None)
                continue
            if not s.in_place_layout:  # never read in place (all_to_all_v, or chunks not whole vectors)
                found.append("stage")
                continue
            header = shmem.shmem_tensor(self._handle, (s.header_bytes // 8,), torch.int64,
                                        pe=pe if self.virtual else None)  # fmt: skip
            offset = int(header[s.sources_offset // 8].item())
            found.append("stage" if offset == s.stage_offset else "input")
        return found if self.virtual else found[0]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.spec.input_elems,)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.spec.output_elems,)

    def _check(self, t, what: str, elems: int, device=None):
        import torch

        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{self.spec.op}: {what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda" or (device is not None and t.device != device):
            raise ValueError(f"{self.spec.op}: {what} must be on the GPU of the shmem heap ({device or 'cuda'}), "
                             f"got {t.device}")  # fmt: skip
        if t.dtype != self.dtype:
            raise ValueError(f"{self.spec.op}: {what} must be {self.dtype} (compiled for it), got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{self.spec.op}: {what} must be contiguous")
        if t.numel() != elems:
            raise ValueError(f"{self.spec.op}: {what} must hold {elems} elements (count {self.spec.count}, "
                             f"world_size {self.spec.world_size}), got {t.numel()} (shape {tuple(t.shape)})")  # fmt: skip

    def _per_pe(self, value, what: str) -> list:
        if self.virtual:
            if not isinstance(value, (list, tuple)) or len(value) != len(self.pes):
                raise ValueError(f"{self.spec.op}: with {len(self.pes)} virtual PEs pass {what} as a list of "
                                 f"{len(self.pes)} tensors (one per PE), got {type(value).__name__}")  # fmt: skip
            return list(value)
        return [value]

    def __call__(self, input, output=None, *, splits=None, recv_counts=None, stream=None):
        """Run the collective: ``input`` (a list per PE with virtual PEs; for broadcast only the root's is
        read, the others may be None) into ``output`` (same form; default: new tensors of
        ``output_shape``). Returns the outputs. A PE's input and output may overlap only in place
        (``aliasing_problem``: a ValueError otherwise). Nothing is synchronized: the result is ready in stream order.
        The calls of one Collective share its workspace and epochs: keep them in one stream order (concurrent
        collectives on two streams: one Collective per stream, each has its own workspace).

        all_to_all_v: ``splits`` (int32 CUDA tensors of W elements, per PE: the elements for each PE, packed in
        ``input`` in PE order; each at most ``count``, larger ones are clamped, negative ones count as 0; the
        output must not overlap the input) and optionally
        ``recv_counts`` (int32 [W] per PE, written: the elements received from each PE, packed in ``output``
        in PE order); returns ``(outputs, recv_counts)``."""
        import torch

        if self.kernels is None:
            raise RuntimeError(f"{self.spec.op}: the collective was closed")
        s = self.spec
        variable = s.op == "all_to_all_v"
        if (splits is not None or recv_counts is not None) and not variable:
            raise ValueError(f"{s.op}: splits and recv_counts are for all_to_all_v only")
        inputs = self._per_pe(input, "input")
        outputs = [None] * len(self.pes) if output is None else self._per_pe(output, "output")
        device = torch.device("cuda", torch.cuda.current_device())  # the shmem heap's GPU (as EpDispatchCombineOp)
        for i, pe in enumerate(self.pes):
            if inputs[i] is not None or s.op != "broadcast" or pe == s.root:
                self._check(inputs[i], f"input of PE {pe}", s.input_elems, device)
            if outputs[i] is None:
                outputs[i] = torch.empty(self.output_shape, dtype=self.dtype, device=device)
            self._check(outputs[i], f"output of PE {pe}", s.output_elems, device)
            if inputs[i] is None:  # a broadcast's non-root input is never read: any valid address
                inputs[i] = outputs[i]
            if s.op != "broadcast" or pe == s.root:  # (a non-root's input is never read)
                problem = aliasing_problem(s, pe, inputs[i].data_ptr(), outputs[i].data_ptr())
                if problem:
                    raise ValueError(problem)
        args = [(inputs[i].data_ptr(), outputs[i].data_ptr(), self._workspace[i]) for i in range(len(self.pes))]
        if variable:
            counts = self._split_tensors(splits, recv_counts, device)
            args = [a + (sp.data_ptr(), rc.data_ptr()) for a, (sp, rc) in zip(args, counts)]
        block = (BLOCK_THREADS, 1, 1)
        if self.virtual:
            self.kernels.launch_virtual(s.kernel_name, args, grid=(self.blocks, 1), block=block, stream=stream)
        else:
            self.kernels.launch(s.kernel_name, list(args[0]), grid=(self.blocks, 1, 1), block=block, stream=stream,
                                cooperative=True)  # fmt: skip
        self._called = True
        if variable:
            received = [rc for _, rc in counts]
            return (outputs, received) if self.virtual else (outputs[0], received[0])
        return outputs if self.virtual else outputs[0]

    def _split_tensors(self, splits, recv_counts, device) -> list[tuple]:
        import torch

        if splits is None:
            raise ValueError("all_to_all_v: pass splits (int32 tensors of world_size elements: the elements for "
                             "each PE, packed in the input in PE order)")  # fmt: skip
        sends = self._per_pe(splits, "splits")
        recvs = [None] * len(self.pes) if recv_counts is None else self._per_pe(recv_counts, "recv_counts")
        W = self.spec.world_size
        for i, pe in enumerate(self.pes):
            if recvs[i] is None:
                recvs[i] = torch.empty(W, dtype=torch.int32, device=device or "cuda")
            for what, t in (("splits", sends[i]), ("recv_counts", recvs[i])):
                if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.numel() != W or not t.is_contiguous():
                    raise ValueError(f"all_to_all_v: {what} of PE {pe} must be a contiguous int32 tensor of {W} "
                                     f"elements, got {t!r:.80}")  # fmt: skip
                if t.device.type != "cuda" or (device is not None and t.device != device):
                    raise ValueError(f"all_to_all_v: {what} of PE {pe} must be on {device or 'cuda'} (the kernel "
                                     f"reads it: no host sync), got {t.device}")  # fmt: skip
        return list(zip(sends, recvs))

    def kernel_trace(self):
        """Start recording this collective's phase trace points ("stage", "meet<k>", "step<k>"; a Collective
        built with ``trace=True``): the runtime KernelTrace (runtime/trace.py: ``read()``, ``reset()``,
        ``disable()``; ``export_to_perfetto``) of its kernel, for the launches that follow."""
        if not self.trace:
            raise ValueError(f"{self.spec.op}: kernel_trace needs a Collective built with trace=True")
        grid = (self.blocks, 1) if self.virtual else (self.blocks, 1, 1)
        return self.kernels.trace(self.spec.kernel_name, grid, n_pes=len(self.pes) if self.virtual else None)

    def close(self) -> None:
        """Free the workspace (after the device finished with it); collective in multi-process mode."""
        from mori_compiler.runtime import shmem

        if self.kernels is None:
            return
        self.kernels.synchronize()
        self.kernels = None
        if shmem.current_state() is not None:
            for handle in [self._handle, *self._heap_inputs]:
                shmem.shmem_free(handle)
        self._heap_inputs = []


__all__ = ["Collective", "coll_bundle", "expected", "dtype_name", "COLLECTIVES", "REDUCING"]
