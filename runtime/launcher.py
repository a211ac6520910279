"""Load a kernel bundle onto the GPU and launch its kernels.

``KernelSet(bundle)`` loads the bundle's code object through the driver for ``bundle.backend`` and writes
every device-state global the bundle lists (``mori_compiler_shmem_state``: a snapshot of the initialized
shmem, runtime/shmem.py; a bundle that lists it needs shmem initialized first, one that lists none needs no
shmem). If shmem is finalized and initialized again, the next launch rewrites the state.

* ``launch(kernel, args, grid=..., block=...)``: one launch; ``args`` match the kernel's parameters (ints
  for integers and pointers, floats for f32/f64, CUDA torch tensors for pointers).
* ``launch_virtual(kernel, per_pe_args, grid=(gx, gy))`` (bundles compiled with virtual PEs, shmem from
  ``shmem_init_virtual``): all PEs in one cooperative launch of grid (gx, gy, n_pes), PE = blockIdx.z; the
  per-PE arguments go to the kernel as a device argument table (``kernel_abi.pack_arg_table``). Refused
  with a ValueError before launching when the GPU cannot hold all blocks at once (the PEs spin on each
  other: a partial grid would hang).

Launches go on the current PyTorch stream unless ``stream`` is given (0: the default stream).

Trace points (kernels compiled with ``trace=True``; runtime/trace.py): ``trace(kernel, grid, block)`` gives
the kernel a trace buffer for launches up to that grid and returns its ``KernelTrace`` (``read()``,
``reset()``, ``disable()``); a launch of a traced kernel whose records would not fit the buffer is refused.

Bounded-wait debug mode: ``KernelSet(..., wait_limit=N)`` or ``MORI_COMPILER_WAIT_LIMIT=N`` makes every
device wait give up after N polls and report; ``synchronize()`` then raises ``WaitTimeoutError`` naming the
PE, the address (its heap and offset), the comparison and the values, instead of hanging.
"""

from __future__ import annotations

import collections
import contextlib
import operator
import os

from mori_compiler.lib_bitcode.kernel_abi import INT_RANGES, PARAM_SIZES, pack_arg_table
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL

from . import shmem as _shmem
from .bundle import Bundle, BundleError, KernelInfo
from .driver import Driver, canonical_backend, get_driver
from .trace import KernelTrace

WAIT_LIMIT_ENV = "MORI_COMPILER_WAIT_LIMIT"
_MAX_CACHED_TABLES = 256  # argument tables kept on the device for reuse (each a few hundred bytes)
_MAX_PENDING_TABLES = 64  # driver-allocated argument tables kept alive before a forced stream sync


class WaitTimeoutError(RuntimeError):
    """A bounded device wait gave up (bounded-wait debug mode). ``report`` holds the decoded record."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def _torch_on_stream(torch, stream: int):
    """torch's current stream set to the raw ``stream`` handle for the ``with`` body (unchanged if it is)."""
    if int(stream) == int(torch.cuda.current_stream().cuda_stream):
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream))

def _wait_limit_from_env() -> int:
    text = os.environ.get(WAIT_LIMIT_ENV, "").strip()
    if not text:
        return 0
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"{WAIT_LIMIT_ENV}={text!r}: expected a number of polls (0 = unbounded)") from None
    if value < 0:
        raise ValueError(f"{WAIT_LIMIT_ENV}={text!r}: must be >= 0")
    return value


def _is_tensor(value) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "is_cuda")


def _dim3(value, what: str, kernel: str, *, dims: int = 3) -> tuple[int, ...]:
    if isinstance(value, int):
        value = (value,)
    try:
        out = tuple(operator.index(v) for v in value)
    except TypeError:
        raise ValueError(f"{kernel}: {what} must be up to {dims} integers, got {value!r}") from None
    if not 1 <= len(out) <= dims or any(v <= 0 for v in out):
        raise ValueError(f"{kernel}: {what} must be 1..{dims} positive integers, got {value!r}")
    return out + (1,) * (dims - len(out))


def _check_collective_grid(kernel: KernelInfo, grid3, what: str) -> None:
    """A kernel with collectives (``kernel.max_blocks``: mori-coll-to-kernels) launches (at most max_blocks, 1,
    1) blocks per PE: block x owns row x of the device barrier's slots, so a wider grid, or one with y or z,
    would make blocks share slots and write past them (a hang or wrong results, not an error)."""
    limit = kernel.max_blocks
    if limit is not None and (grid3[0] > limit or grid3[1] != 1 or grid3[2] != 1):
        raise ValueError(f"kernel '{kernel.name}' holds collectives: its {what} must be (x, 1, 1) with x in "
                         f"[1, {limit}] (its max_blocks: one device-barrier slot row per block), got {tuple(grid3)}")


def convert_args(kernel: KernelInfo, args, *, pe: int | None = None) -> list[tuple[str, object]]:
    """``args`` checked against ``kernel``'s parameters, as (type_name, value) pairs; ValueError naming the
    kernel, the parameter index and its expected type on any mismatch."""
    where = f"kernel '{kernel.name}'" + (f" (PE {pe})" if pe is not None else "")
    args = list(args)
    types = kernel.param_types
    if len(args) != len(types):
        raise ValueError(f"{where} takes {len(types)} arguments ({', '.join(types) or 'none'}), got {len(args)}")
    out = []
    for i, (t, v) in enumerate(zip(types, args)):
        name = kernel.params[i].name
        if t not in PARAM_SIZES:
            raise ValueError(f"{where}: parameter {i} ({name}) has unknown type '{t}'")
        if _is_tensor(v):
            if t != "ptr":
                raise ValueError(f"{where}: parameter {i} ({name}) expects {t}, got a tensor (tensors pass as ptr)")
            if not v.is_cuda:
                raise ValueError(f"{where}: parameter {i} ({name}) got a tensor on {getattr(v, 'device', 'the CPU')}; "
                                 f"pointer arguments must be on the GPU")  # fmt: skip
            out.append((t, int(v.data_ptr())))
            continue
        if t in ("f32", "f64"):
            if isinstance(v, (bool, str, bytes)) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
                raise ValueError(f"{where}: parameter {i} ({name}) expects {t}, got {type(v).__name__} {v!r}")
            out.append((t, float(v)))
            continue
        if isinstance(v, float):
            raise ValueError(f"{where}: parameter {i} ({name}) expects {t}, got float {v!r}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise ValueError(f"{where}: parameter {i} ({name}) expects {t}, got {type(v).__name__} {v!r}") from None
        low, high = INT_RANGES[t]
        if not low <= iv < high:
            raise ValueError(f"{where}: parameter {i} ({name}) expects {t}; {iv} is out of range")
        out.append((t, iv))
    return out


class KernelSet:
    """A loaded bundle: its code object on the GPU, state globals written, kernels ready to launch."""

    def __init__(self, bundle: Bundle, *, driver: Driver | None = None, wait_limit: int | None = None):
        self.bundle = bundle
        self.driver = driver if driver is not None else get_driver(bundle.backend)
        if canonical_backend(self.driver.backend) != canonical_backend(bundle.backend):
            raise ValueError(f"bundle {bundle.key[:12]} is for {bundle.backend}, the driver is {self.driver.backend}")
        self.wait_limit = _wait_limit_from_env() if wait_limit is None else int(wait_limit)
        if self.wait_limit < 0:
            raise ValueError(f"wait_limit must be >= 0 (0 = unbounded), got {self.wait_limit}")
        self._state_symbols = self._check_state_globals()
        self._shmem_state = None
        self._sm_count = None
        self._pending: list[tuple[int, int]] = []  # (device table, stream) kept alive until synchronize()
        # Launches repeat with the same arguments (benchmarks, graph capture, steady-state EP layers):
        # identical argument tables are uploaded once and reused; occupancy is asked once per shape.
        self._tables: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        self._occupancy: dict[tuple, int] = {}
        self._traces: dict[str, KernelTrace] = {}  # kernel name -> its enabled trace
        self.module = self.driver.load_module(bundle.binary)
        try:
            self._write_state()
        except BaseException:
            self.module.unload()
            raise

    # ---- state globals -------------------------------------------------------------------------
    def _check_state_globals(self) -> list[str]:
        symbols = []
        for g in self.bundle.state_globals:
            symbol = g.get("symbol") if isinstance(g, dict) else str(g)
            if symbol != STATE_SYMBOL:
                raise BundleError(f"bundle {self.bundle.key[:12]} needs device state '{symbol}', which this runtime "
                                  f"cannot fill (it fills {STATE_SYMBOL}; MORI's own bitcode state is filled by "
                                  f"mori.shmem.shmem_module_init)")  # fmt: skip
            symbols.append(symbol)
        return symbols

    def _write_state(self) -> None:
        if not self._state_symbols:
            return
        s = _shmem.current_state()
        if s is None:
            raise RuntimeError(f"bundle {self.bundle.key[:12]} ({', '.join(self.bundle.kernels)}) uses shmem "
                               f"({STATE_SYMBOL}): initialize it (shmem_init_virtual, shmem_torch_process_group_init "
                               f"or shmem_init_attr) before loading the bundle")  # fmt: skip
        if canonical_backend(s.driver.backend) != canonical_backend(self.bundle.backend):
            raise RuntimeError(f"shmem was initialized on {s.driver.backend}, bundle {self.bundle.key[:12]} is for "
                               f"{self.bundle.backend}")  # fmt: skip
        if self.bundle.virtual_pes and not s.virtual:
            raise RuntimeError(f"bundle {self.bundle.key[:12]} was compiled with virtual PEs: initialize shmem with "
                               f"shmem_init_virtual(n_pes), not in multi-process mode")  # fmt: skip
        if s.virtual and not self.bundle.virtual_pes:
            raise RuntimeError(f"bundle {self.bundle.key[:12]} was compiled without virtual PEs but shmem runs "
                               f"{s.n_pes} virtual PEs in this process; compile with virtual_pes=True")  # fmt: skip
        data = s.device_state_bytes(self.wait_limit)
        for symbol in self._state_symbols:
            ptr, size = self.module.global_address(symbol)
            if size < STATE_SIZE:
                raise BundleError(f"{symbol} in bundle {self.bundle.key[:12]} has {size} bytes; the runtime writes "
                                  f"{STATE_SIZE} (device library and runtime disagree on the state layout)")  # fmt: skip
            self.driver.memcpy_htod(ptr, data)
        self._shmem_state = s

    def _refresh_state(self) -> None:
        """Rewrite the state globals if shmem was re-initialized since they were written."""
        if not self._state_symbols:
            return
        s = _shmem.current_state()
        if s is None:
            raise RuntimeError(f"shmem was finalized; bundle {self.bundle.key[:12]} needs it initialized to launch")
        if s is not self._shmem_state:
            self._write_state()

    # ---- launches ------------------------------------------------------------------------------
    def _kernel(self, kernel) -> KernelInfo:
        if isinstance(kernel, KernelInfo):
            return self.bundle.kernel(kernel.name)
        return self.bundle.kernel(kernel)

    def _block(self, info: KernelInfo, block) -> tuple[int, int, int]:
        if block is None:
            block = info.block
        if block is None:
            raise ValueError(f"kernel '{info.name}': no block size given and the bundle records none")
        return _dim3(block, "block", info.name)

    def launch(self, kernel, args, *, grid=(1, 1, 1), block=None, shared_mem: int = 0, stream: int | None = None,
               cooperative: bool = False) -> None:  # fmt: skip
        """Launch ``kernel`` (a name or KernelInfo) once with ``args``."""
        info = self._kernel(kernel)
        if self.bundle.virtual_pes:
            raise ValueError(f"kernel '{info.name}' was compiled with virtual PEs (it takes an argument table): "
                             f"use launch_virtual(kernel, per_pe_args, grid=(gx, gy))")  # fmt: skip
        params = convert_args(info, args)
        grid3 = _dim3(grid, "grid", info.name)
        _check_collective_grid(info, grid3, "grid")
        block3 = self._block(info, block)
        self._refresh_state()
        fn = self.module.function(info.name)
        if self._traces:
            self._note_traced_launch(info.name, grid3, block3)
        if stream is None:
            stream = self.driver.current_stream()
        if cooperative and self._capturing():  # recorded as an ordinary kernel node: check co-residency here
            self._check_coresident(info.name, fn, grid3[0] * grid3[1] * grid3[2], block3, int(shared_mem))
            cooperative = False
        self.driver.launch(fn, grid3, block3, params, shared_mem=int(shared_mem), stream=stream,
                           cooperative=cooperative)  # fmt: skip

    def launch_virtual(self, kernel, per_pe_args, *, grid=(1, 1), block=None, shared_mem: int = 0,
                       stream: int | None = None) -> None:  # fmt: skip
        """Launch all virtual PEs of ``kernel`` at once: ``per_pe_args[p]`` are PE p's arguments."""
        info = self._kernel(kernel)
        if not self.bundle.virtual_pes:
            raise ValueError(f"kernel '{info.name}' was not compiled with virtual PEs: use launch()")
        self._refresh_state()
        s = self._shmem_state if self._state_symbols else _shmem.state()
        if not s.virtual:
            raise RuntimeError(f"virtual-PE launch of '{info.name}' needs shmem_init_virtual(n_pes); shmem runs in "
                               f"{s.mode} mode")  # fmt: skip
        per_pe_args = list(per_pe_args)
        if len(per_pe_args) != s.n_pes:
            raise ValueError(f"virtual-PE launch of '{info.name}': got arguments for {len(per_pe_args)} PEs, "
                             f"shmem has {s.n_pes} (shmem_npes())")  # fmt: skip
        values = [[v for _, v in convert_args(info, a, pe=p)] for p, a in enumerate(per_pe_args)]
        gx, gy, _ = _dim3(grid, "grid", info.name, dims=2) + (1,)
        _check_collective_grid(info, (gx, gy, 1), "grid per PE")
        block3 = self._block(info, block)
        fn = self.module.function(info.name)
        self._check_coresident(info.name, fn, gx * gy * s.n_pes, block3, int(shared_mem))
        if self._traces:
            self._note_traced_launch(info.name, (gx, gy, s.n_pes), block3)
        table = pack_arg_table(info.param_types, values)
        if stream is None:
            stream = self.driver.current_stream()
        # Co-residency was checked above; a cooperative launch also guarantees it, except while a CUDA
        # graph is being captured, where the kernel node is recorded as an ordinary launch.
        cooperative = not self._capturing()
        cached = self._cached_table(info.name, table, stream)
        if cached is not None:
            self.driver.launch(fn, (gx, gy, s.n_pes), block3, [("ptr", cached)], shared_mem=int(shared_mem),
                               stream=stream, cooperative=cooperative)  # fmt: skip
            return
        if not cooperative:
            raise RuntimeError(f"virtual-PE launch of '{info.name}' during graph capture with arguments it has not "
                               "seen before: run it once eagerly with the same tensors first (its argument table "
                               "must be on the device before capture)")  # fmt: skip
        with self._device_table(table, stream) as table_ptr:
            self.driver.launch(fn, (gx, gy, s.n_pes), block3, [("ptr", table_ptr)], shared_mem=int(shared_mem),
                               stream=stream, cooperative=cooperative)  # fmt: skip

    def _capturing(self) -> bool:
        if not self.driver.torch_interop:
            return False
        import torch  # noqa: PLC0415 - optional, lazily

        return bool(torch.cuda.is_current_stream_capturing())

    def _cached_table(self, name: str, table: bytes, stream: int) -> int | None:
        """The device address of an argument table uploaded before (reused: its bytes never change), or None
        after uploading it for next time. Only with torch, whose allocator keeps the buffer alive here."""
        if not self.driver.torch_interop:
            return None
        key = (name, table)  # any stream: graph capture runs on a side stream and must find the eager upload
        dev = self._tables.get(key)
        if dev is not None:
            self._tables.move_to_end(key)
            return int(dev.data_ptr())
        import torch  # noqa: PLC0415 - optional, lazily

        with _torch_on_stream(torch, stream):
            dev = torch.frombuffer(bytearray(table), dtype=torch.uint8).to(torch.device("cuda", self.driver.device))
        self._tables[key] = dev  # a synchronous upload: ready before any launch that uses it
        if len(self._tables) > _MAX_CACHED_TABLES and not self._capturing():
            # Launches on any stream may still read the oldest table: let them finish before freeing it.
            torch.cuda.synchronize()
            self._tables.popitem(last=False)
        return int(dev.data_ptr())

    def _check_coresident(self, name: str, fn, blocks: int, block3, shared_mem: int) -> None:
        threads = block3[0] * block3[1] * block3[2]
        shape = (name, threads, shared_mem)
        if shape not in self._occupancy:
            self._occupancy[shape] = self.driver.max_active_blocks_per_sm(fn, threads, shared_mem)
        per_sm = self._occupancy[shape]
        if self._sm_count is None:
            self._sm_count = self.driver.multiprocessor_count()  # fixed per device: one driver call
        sms = self._sm_count
        if blocks > per_sm * sms:
            raise ValueError(f"cooperative launch of {name} needs {blocks} co-resident blocks; the GPU fits "
                             f"{per_sm * sms} (occupancy {per_sm} blocks of {threads} threads"
                             f"{f' with {shared_mem} bytes of shared memory' if shared_mem else ''} per SM x {sms} "
                             f"SMs); use a smaller grid or fewer PEs")  # fmt: skip

    @contextlib.contextmanager
    def _device_table(self, table: bytes, stream: int):
        """A device copy of ``table`` that stays valid until the kernel launched on ``stream`` has read it."""
        torch = None
        if self.driver.torch_interop:
            import torch  # noqa: PLC0415 - optional, lazily
        if torch is not None:
            # A torch allocation made while the launch stream is current belongs to that stream: torch's
            # caching allocator hands it out again only to later work on the same stream, which runs after
            # our kernel. The pinned staging buffer is likewise kept until the copy has run.
            with _torch_on_stream(torch, stream):
                host = torch.frombuffer(bytearray(table), dtype=torch.uint8).pin_memory()
                dev = torch.empty(len(table), dtype=torch.uint8, device=torch.device("cuda", self.driver.device))
                dev.copy_(host, non_blocking=True)
                yield int(dev.data_ptr())
            return
        if len(self._pending) >= _MAX_PENDING_TABLES:
            self._free_pending()
        ptr = self.driver.malloc(len(table))
        try:
            self.driver.memcpy_htod(ptr, table, stream)
            yield ptr
        except BaseException:
            self.driver.stream_synchronize(stream)
            self.driver.free(ptr)
            raise
        self._pending.append((ptr, stream))

    def _free_pending(self) -> None:
        pending, self._pending = self._pending, []
        for stream in dict.fromkeys(s for _, s in pending):
            self.driver.stream_synchronize(stream)
        for ptr, _ in pending:
            self.driver.free(ptr)

    # ---- trace points (runtime/trace.py) --------------------------------------------------------
    def trace(self, kernel, grid, block=None, *, pe: int | None = None, n_pes: int | None = None) -> KernelTrace:
        """Enable ``kernel``'s trace points for launches up to ``grid`` x ``block`` (default: the bundle's
        block) and return its KernelTrace; tracing it again replaces the earlier buffer. ``grid`` is what the
        launches take: (gx, gy) with virtual PEs (z is the PE; ``n_pes`` defaults to shmem's), else up to 3
        values. ``pe``: this process's PE for the records (default: shmem's, else 0)."""
        info = self._kernel(kernel)
        block3 = self._block(info, block)
        if self.bundle.virtual_pes:
            if pe is not None:
                raise ValueError(f"trace of '{info.name}': with virtual PEs the PE is the grid's z index; pe= "
                                 "applies to a process per PE only")  # fmt: skip
            if n_pes is None:
                s = _shmem.current_state()
                if s is None:
                    raise ValueError(f"trace of '{info.name}' (virtual PEs): pass n_pes= or initialize shmem first")
                n_pes = s.n_pes
            if isinstance(n_pes, bool) or not isinstance(n_pes, int) or n_pes <= 0:
                raise ValueError(f"trace of '{info.name}': n_pes must be a positive number of PEs, got {n_pes!r}")
            gx, gy, _ = _dim3(grid, "grid", info.name, dims=2) + (1,)
            grid3, pe = (gx, gy, n_pes), 0
        else:
            if n_pes is not None:
                raise ValueError(f"trace of '{info.name}': n_pes= applies to virtual PEs only (bundle "
                                 f"{self.bundle.key[:12]} has none)")  # fmt: skip
            if pe is None:
                s = _shmem.current_state()
                pe = s.my_pe if s is not None else 0
            if isinstance(pe, bool) or not isinstance(pe, int) or pe < 0:
                raise ValueError(f"trace of '{info.name}': pe must be a PE number >= 0, got {pe!r}")
            grid3 = _dim3(grid, "grid", info.name)
        old = self._traces.pop(info.name, None)
        if old is not None:
            old.disable()
        trace = KernelTrace(self, info, grid3, block3, pe=pe)
        self._traces[info.name] = trace
        return trace

    def _note_traced_launch(self, name: str, grid3, block3) -> None:
        trace = self._traces.get(name)
        if trace is None:
            return
        if not trace.enabled:  # disabled through the KernelTrace itself
            del self._traces[name]
            return
        trace.launched(grid3, block3)

    def _disable_traces(self) -> None:
        traces, self._traces = self._traces, {}
        for trace in traces.values():
            trace.disable()

    # ---- synchronization and bounded waits -----------------------------------------------------
    def synchronize(self) -> None:
        """Wait for all work on the device, release launch buffers, then check_waits()."""
        self.driver.device_synchronize()
        self._free_pending()
        self.check_waits()

    def check_waits(self) -> None:
        """Raise WaitTimeoutError if a bounded wait gave up (resetting the report); no-op without shmem."""
        s = self._shmem_state
        if s is None or s.finalized or _shmem.current_state() is not s:
            return
        report = s.read_wait_report()
        if report is None:
            return
        s.reset_wait_report()
        raise WaitTimeoutError(describe_wait_report(report, s, self.wait_limit), report)

    def close(self) -> None:
        """Free launch buffers and trace buffers, and unload the code object."""
        try:
            self._free_pending()
            self._disable_traces()
        finally:
            self.module.unload()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_WAIT_OPS = {"equals": "==", "greater_than (unsigned)": "> (unsigned)", "greater_than (signed)": "> (signed)"}


def describe_wait_report(report: dict, s=None, wait_limit: int | None = None) -> str:
    """One line for a bounded-wait report: the PE, the word (its heap and offset), the comparison, the values."""
    addr = report["addr"]
    where = f"0x{addr:x}"
    located = s.locate(addr) if s is not None else None
    if located is not None:
        pe, off = located
        where += f" (offset 0x{off:x} in PE {pe}'s heap)"
    elif s is not None:
        where += " (not in any PE's symmetric heap)"
    limit = f" after {wait_limit} polls" if wait_limit else ""
    op = _WAIT_OPS.get(report["kind"], report["kind"])
    return (f"bounded wait gave up{limit} on PE {report['pe']}: waiting until the word at {where} {op} "
            f"{report['expected']} (0x{report['expected']:x}); last seen {report['seen']} (0x{report['seen']:x})")
