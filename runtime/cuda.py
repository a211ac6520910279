"""``CudaDriver``: the runtime's driver interface over NVIDIA's ``cuda.bindings.driver`` (cuda-bindings).

Calling convention of cuda-bindings (checked against cuda-bindings 13.3.0): every function returns a tuple
whose first item is a ``CUresult``; the remaining items are the C function's out-parameters in order
(``cuModuleGetGlobal`` → ``(err, CUdeviceptr, size)``). Handle arguments (``CUdeviceptr``, ``CUstream``,
``CUdevice``) accept plain ints; host buffers accept any object with the buffer protocol; ``kernelParams``
accepts an int, the address of a ``void*[]`` array (or None for NULL). Every result is checked: a failure
raises ``DriverError`` with the call, ``cuGetErrorName`` and ``cuGetErrorString``.

Context: on first use the driver initializes torch's CUDA (when torch has it, so that the runtime and torch
share the device's primary context), then takes the thread's current context; if there is none it retains
the primary context of ``torch.cuda.current_device()`` (or device 0) and makes it current. Other threads
that call in get the same context made current for them.
"""

from __future__ import annotations

import contextlib
import threading

from .driver import BindingsDriver, DriverError, Function, LoadedModule, Module, call_checked, torch_cuda
from .extras import import_extra

PTX_NUL = b"\0"


class CudaModule(LoadedModule):
    prefix = "cu"
    api = "CUDA"


class CudaDriver(BindingsDriver):
    backend = "nvvm"
    api = "CUDA"
    prefix = "cu"

    def __init__(self, bindings=None):
        # ``bindings``: the cuda.bindings.driver module (tests pass a fake); imported here, lazily.
        self._cu = bindings if bindings is not None else import_extra("cuda.bindings.driver")
        self._lock = threading.RLock()
        self._ctx = None
        self._device_ordinal = None
        self._cudevice = None
        self._retained = []  # CUdevice handles whose primary context we retained
        # Threads that have the context current: a thread-local mark of the binding generation it saw
        # (thread idents are reused after a thread ends, so a set of idents would lie).
        self._bound = threading.local()
        self._generation = 0
        self._primary_contexts: dict = {}  # ordinal -> CUcontext retained for using_device

    # ---- error checking ------------------------------------------------------------------------
    def _error_text(self, err) -> tuple[str, str]:
        name, desc = getattr(err, "name", str(err)), ""
        try:
            rc, text = self._cu.cuGetErrorName(err)
            if int(rc) == 0 and text:
                name = text.decode() if isinstance(text, bytes) else str(text)
            rc, text = self._cu.cuGetErrorString(err)
            if int(rc) == 0 and text:
                desc = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001 - the error itself is what matters
            pass
        return name, desc

    def _raw(self, call: str, *args):
        """Call ``cuda.bindings.driver.<call>`` and check its CUresult; returns the out-values
        (None, one value, or a tuple)."""
        return call_checked(self._cu, call, args, success=int(self._cu.CUresult.CUDA_SUCCESS),
                            error_text=self._error_text, unavailable="CUDA_DRIVER_UNAVAILABLE", package="cuda-bindings")

    def _call(self, call: str, *args):
        self._ensure_context()
        return self._raw(call, *args)

    # ---- context -------------------------------------------------------------------------------
    def _ensure_context(self) -> None:
        if getattr(self._bound, "generation", -1) == self._generation or getattr(self._bound, "scoped", 0):
            return  # bound already, or inside using_device (whose context must stay current)
        with self._lock:
            if self._ctx is None:
                self._bind(None)
            else:
                current = self._raw("cuCtxGetCurrent")
                if current is None or int(current) != int(self._ctx):
                    self._raw("cuCtxSetCurrent", self._ctx)
            self._bound.generation = self._generation

    def _bind(self, ordinal: int | None) -> None:
        """Find or create the context to work in: the current one, else the primary context of
        ``ordinal`` (default: torch's current device, else 0)."""
        torch = torch_cuda()
        if torch is not None:
            if ordinal is not None:
                torch.cuda.set_device(ordinal)
            torch.cuda.init()
            if ordinal is None:
                ordinal = torch.cuda.current_device()
        self._raw("cuInit", 0)
        ctx = self._raw("cuCtxGetCurrent")
        if ctx is not None and int(ctx) != 0:
            dev = self._raw("cuCtxGetDevice")
            if ordinal is not None and int(dev) != ordinal:
                ctx = None  # current context is another device's: use ordinal's primary context
        if ctx is None or int(ctx) == 0:
            dev = self._raw("cuDeviceGet", 0 if ordinal is None else ordinal)
            ctx = self._raw("cuDevicePrimaryCtxRetain", dev)
            self._retained.append(dev)
            self._raw("cuCtxSetCurrent", ctx)
        self._ctx = ctx
        self._cudevice = dev
        self._device_ordinal = int(dev)
        self._generation += 1  # every other thread re-checks its context
        self._bound.generation = self._generation

    @property
    def device(self) -> int:
        self._ensure_context()
        return self._device_ordinal

    def set_device(self, ordinal: int) -> None:
        with self._lock:
            if self._ctx is not None and ordinal == self._device_ordinal:
                self._ensure_context()
                return
            self._bind(int(ordinal))

    def peer_access(self, device: int, peer: int) -> bool:
        if int(device) == int(peer):
            return True
        handles = (self._call("cuDeviceGet", int(device)), self._call("cuDeviceGet", int(peer)))
        return bool(self._call("cuDeviceCanAccessPeer", *handles))

    def can_access_peer(self, peer_ordinal: int) -> bool:
        if int(peer_ordinal) == self.device:
            return True
        peer = self._call("cuDeviceGet", int(peer_ordinal))
        return bool(self._call("cuDeviceCanAccessPeer", self._cudevice, peer))

    # ---- modules -------------------------------------------------------------------------------
    def load_module(self, image: bytes) -> Module:
        image = bytes(image)
        if not image.startswith(b"\x7fELF") and not image.endswith(PTX_NUL):
            image += PTX_NUL  # PTX text: cuModuleLoadData reads a NUL-terminated string
        return CudaModule(self, self._call("cuModuleLoadData", image))

    # ---- memory --------------------------------------------------------------------------------
    def malloc(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"cannot allocate {n} bytes")
        return int(self._call("cuMemAlloc", int(n)))

    def free(self, ptr: int) -> None:
        self._call("cuMemFree", int(ptr))

    # ---- launch --------------------------------------------------------------------------------
    def launch(self, fn: Function, grid, block, params, *, shared_mem: int = 0, stream: int | None = None,
               cooperative: bool = False) -> None:  # fmt: skip
        if cooperative:
            self._launch("cuLaunchCooperativeKernel", fn, grid, block, params, shared_mem, stream)
        else:
            self._launch("cuLaunchKernel", fn, grid, block, params, shared_mem, stream, 0)  # extra = NULL

    def max_active_blocks_per_sm(self, fn: Function, block_threads: int, shared_mem: int = 0) -> int:
        return int(self._call("cuOccupancyMaxActiveBlocksPerMultiprocessor", fn.handle, int(block_threads),
                              int(shared_mem)))  # fmt: skip

    def multiprocessor_count(self) -> int:
        attr = self._cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        self._ensure_context()
        return int(self._call("cuDeviceGetAttribute", attr, self._cudevice))

    # ---- IPC -----------------------------------------------------------------------------------
    def ipc_open_mem_handle(self, handle: bytes) -> int:
        handle = bytes(handle)
        if len(handle) != 64:
            raise ValueError(f"a CUDA IPC memory handle has 64 bytes, got {len(handle)}")
        h = self._cu.CUipcMemHandle()
        h.reserved = handle
        flags = int(self._cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return int(self._call("cuIpcOpenMemHandle", h, flags))

    # ---- copy engine (MORI-IO) -----------------------------------------------------------------
    def _device_handle(self, ordinal: int):
        return self._call("cuDeviceGet", ordinal)

    def device_count(self) -> int:
        self._raw("cuInit", 0)
        return int(self._raw("cuDeviceGetCount"))

    def stream_create(self) -> int:
        return int(self._call("cuStreamCreate", int(self._cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))

    def event_create(self):
        return self._call("cuEventCreate", int(self._cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))

    def event_query(self, event) -> bool:
        return self._ready("cuEventQuery", event)

    def stream_query(self, stream: int | None) -> bool:
        return self._ready("cuStreamQuery", 0 if stream is None else int(stream))

    def _ready(self, call: str, handle) -> bool:
        """A query whose NOT_READY is an answer (False), not an error."""
        self._ensure_context()
        err = getattr(self._cu, call)(handle)[0]
        if int(err) == int(self._cu.CUresult.CUDA_ERROR_NOT_READY):
            return False
        if int(err) != int(self._cu.CUresult.CUDA_SUCCESS):
            name, desc = self._error_text(err)
            raise DriverError(call, name, desc, int(err))
        return True

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        if n:
            self._call("cuMemcpyAsync", int(dst), int(src), int(n), int(stream))

    def host_alloc(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"cannot allocate {n} bytes of pinned host memory")
        return int(self._call("cuMemHostAlloc", int(n), int(self._cu.CU_MEMHOSTALLOC_PORTABLE)))

    def host_free(self, ptr: int) -> None:
        self._call("cuMemFreeHost", int(ptr))

    @contextlib.contextmanager
    def using_device(self, ordinal: int):
        """Makes GPU ``ordinal``'s context current on this thread for the block (pushed, popped after, when
        another one is current) without touching the thread's context otherwise: a thread torch set to
        another GPU keeps it."""
        ordinal = int(ordinal)
        with self._lock:
            if self._ctx is None:
                self._bind(None)
            ctx = self._ctx if ordinal == self._device_ordinal else self._primary_contexts.get(ordinal)
            if ctx is None:
                dev = self._raw("cuDeviceGet", ordinal)
                ctx = self._primary_contexts[ordinal] = self._raw("cuDevicePrimaryCtxRetain", dev)
                self._retained.append(dev)
        current = self._raw("cuCtxGetCurrent")
        pushed = current is None or int(current) != int(ctx)
        if pushed:
            self._raw("cuCtxPushCurrent", ctx)
        self._bound.scoped = getattr(self._bound, "scoped", 0) + 1
        try:
            yield
        finally:
            self._bound.scoped -= 1
            if pushed:
                self._raw("cuCtxPopCurrent")

    # ---- synchronization -----------------------------------------------------------------------
    def device_synchronize(self) -> None:
        self._call("cuCtxSynchronize")
