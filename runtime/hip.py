"""``HipDriver``: the runtime's driver interface over AMD's hip-python (``from hip import hip``).

UNTESTED ON HARDWARE: no AMD GPU exists where this project is developed, so this module has only ever run
against a recording fake of ``hip.hip`` (test/python/test_runtime_fakes.py). Treat its first run on a ROCm
machine as a bring-up.

Calling convention of hip-python (checked against hip-python 10.0.0.0.1.2, which re-exports
``rocm.bindings.hip``): every function returns a tuple whose first item is a ``hipError_t`` (an IntEnum);
the other items are the C function's out-parameters (``hipModuleGetGlobal`` → ``(err, Pointer, size)``;
``hipMalloc`` → ``(err, DeviceArray)``; both convert with ``int()``). Pointer and stream arguments accept
ints; host buffers accept buffer-protocol objects; ``kernelParams`` (a ``ListOfPointer``) accepts an int,
the address of a ``void*[]`` array. ``hipGetErrorName`` / ``hipGetErrorString`` return ``(hipSuccess,
bytes)``. A failure raises ``DriverError`` naming the call and the error.

There are no explicit contexts in HIP: the driver works on the thread's current device, which it sets to
torch's current device (when torch has a GPU) or leaves as it is.
"""

from __future__ import annotations

import contextlib
import threading

from .driver import BindingsDriver, DriverError, Function, LoadedModule, Module, call_checked, torch_cuda
from .extras import import_extra


class HipModule(LoadedModule):
    prefix = "hip"
    api = "HIP"


def _text(value) -> str:
    if isinstance(value, tuple):  # hip-python: (hipSuccess, bytes)
        value = value[-1]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


class HipDriver(BindingsDriver):
    backend = "rocdl"
    api = "HIP"
    prefix = "hip"

    def __init__(self, bindings=None):
        # ``bindings``: the hip.hip module (tests pass a fake); imported here, lazily.
        self._hip = bindings if bindings is not None else import_extra("hip").hip
        self._lock = threading.RLock()
        self._device_ordinal = None
        # Threads whose current device is set: a thread-local mark of the generation they saw (thread
        # idents are reused after a thread ends, so a set of idents would lie).
        self._bound = threading.local()
        self._generation = 0

    # ---- error checking ------------------------------------------------------------------------
    def _error_text(self, err) -> tuple[str, str]:
        name, desc = getattr(err, "name", str(err)), ""
        try:
            name = _text(self._hip.hipGetErrorName(err)) or name
            desc = _text(self._hip.hipGetErrorString(err))
        except Exception:  # noqa: BLE001
            pass
        return name, desc

    def _raw(self, call: str, *args):
        return call_checked(self._hip, call, args, success=int(self._hip.hipError_t.hipSuccess),
                            error_text=self._error_text, unavailable="HIP_RUNTIME_UNAVAILABLE", package="hip-python")

    def _call(self, call: str, *args):
        self._ensure_device()
        return self._raw(call, *args)

    # ---- device --------------------------------------------------------------------------------
    def _ensure_device(self) -> None:
        if getattr(self._bound, "generation", -1) == self._generation or getattr(self._bound, "scoped", 0):
            return  # set already, or inside using_device (whose device must stay current)
        with self._lock:
            if self._device_ordinal is None:
                torch = torch_cuda()
                if torch is not None:
                    torch.cuda.init()
                    self._device_ordinal = int(torch.cuda.current_device())
                else:
                    self._device_ordinal = int(self._raw("hipGetDevice"))
            self._raw("hipSetDevice", self._device_ordinal)
            self._bound.generation = self._generation

    @property
    def device(self) -> int:
        self._ensure_device()
        return self._device_ordinal

    def set_device(self, ordinal: int) -> None:
        with self._lock:
            torch = torch_cuda()
            if torch is not None:
                torch.cuda.set_device(int(ordinal))
            self._device_ordinal = int(ordinal)
            self._generation += 1  # every thread sets the new device on its next call
            self._ensure_device()

    # ---- modules -------------------------------------------------------------------------------
    def load_module(self, image: bytes) -> Module:
        return HipModule(self, self._call("hipModuleLoadData", bytes(image)))

    # ---- memory --------------------------------------------------------------------------------
    def malloc(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"cannot allocate {n} bytes")
        return int(self._call("hipMalloc", int(n)))

    def free(self, ptr: int) -> None:
        self._call("hipFree", int(ptr))

    # ---- launch --------------------------------------------------------------------------------
    def launch(self, fn: Function, grid, block, params, *, shared_mem: int = 0, stream: int | None = None,
               cooperative: bool = False) -> None:  # fmt: skip
        if cooperative:
            if getattr(self._hip, "hipModuleLaunchCooperativeKernel", None) is None:
                raise DriverError("hipModuleLaunchCooperativeKernel", "NOT_AVAILABLE",
                                  "this hip-python has no cooperative module launch, which virtual-PE kernels "
                                  "need (all blocks co-resident); upgrade hip-python (ROCm >= 6)")  # fmt: skip
            self._launch("hipModuleLaunchCooperativeKernel", fn, grid, block, params, shared_mem, stream)
        else:
            self._launch("hipModuleLaunchKernel", fn, grid, block, params, shared_mem, stream, None)  # extra = NULL

    def max_active_blocks_per_sm(self, fn: Function, block_threads: int, shared_mem: int = 0) -> int:
        # The module-function variant: fn is a hipFunction_t from hipModuleGetFunction.
        return int(self._call("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", fn.handle, int(block_threads),
                              int(shared_mem)))  # fmt: skip

    def multiprocessor_count(self) -> int:
        attr = self._hip.hipDeviceAttribute_t.hipDeviceAttributeMultiprocessorCount
        return int(self._call("hipDeviceGetAttribute", attr, self.device))

    def peer_access(self, device: int, peer: int) -> bool:
        if int(device) == int(peer):
            return True
        return bool(self._call("hipDeviceCanAccessPeer", int(device), int(peer)))

    def can_access_peer(self, peer_ordinal: int) -> bool:
        if int(peer_ordinal) == self.device:
            return True
        return bool(self._call("hipDeviceCanAccessPeer", self.device, int(peer_ordinal)))

    # ---- IPC -----------------------------------------------------------------------------------
    def ipc_open_mem_handle(self, handle: bytes) -> int:
        buf = bytearray(handle)
        if len(buf) != 64:
            raise ValueError(f"a HIP IPC memory handle has 64 bytes, got {len(buf)}")
        # hipIpcMemHandle_st.fromObj over a writable buffer wraps our 64 bytes (buf must outlive the call).
        h = self._hip.hipIpcMemHandle_st.fromObj(buf)
        ptr = self._call("hipIpcOpenMemHandle", h, int(self._hip.hipIpcMemLazyEnablePeerAccess))
        del buf
        return int(ptr)

    # ---- copy engine (MORI-IO) -----------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._raw("hipGetDeviceCount"))

    def pci_bus_id(self, ordinal: int) -> str:
        buf = bytearray(32)  # hip-python fills a caller's char buffer
        self._call("hipDeviceGetPCIBusId", buf, len(buf), int(ordinal))
        return bytes(buf).split(b"\0", 1)[0].decode(errors="replace").strip().lower()

    def stream_create(self) -> int:
        return int(self._call("hipStreamCreateWithFlags", int(self._hip.hipStreamNonBlocking)))

    def event_create(self):
        return self._call("hipEventCreateWithFlags", int(self._hip.hipEventDisableTiming))

    def event_query(self, event) -> bool:
        return self._ready("hipEventQuery", event)

    def stream_query(self, stream: int | None) -> bool:
        return self._ready("hipStreamQuery", 0 if stream is None else int(stream))

    def _ready(self, call: str, handle) -> bool:
        """A query whose NOT_READY is an answer (False), not an error."""
        self._ensure_device()
        err = getattr(self._hip, call)(handle)
        err = err[0] if isinstance(err, tuple) else err
        if int(err) == int(self._hip.hipError_t.hipErrorNotReady):
            return False
        if int(err) != int(self._hip.hipError_t.hipSuccess):
            name, desc = self._error_text(err)
            raise DriverError(call, name, desc, int(err))
        return True

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        if n:
            kind = int(self._hip.hipMemcpyKind.hipMemcpyDefault)  # direction from unified addressing
            self._call("hipMemcpyAsync", int(dst), int(src), int(n), kind, int(stream))

    def host_alloc(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"cannot allocate {n} bytes of pinned host memory")
        return int(self._call("hipHostMalloc", int(n), int(self._hip.hipHostMallocPortable)))

    def host_free(self, ptr: int) -> None:
        self._call("hipHostFree", int(ptr))

    @contextlib.contextmanager
    def using_device(self, ordinal: int):
        """Sets the thread's current device to ``ordinal`` for the block and restores the one it had."""
        ordinal = int(ordinal)
        previous = int(self._raw("hipGetDevice"))
        if previous != ordinal:
            self._raw("hipSetDevice", ordinal)
        self._bound.scoped = getattr(self._bound, "scoped", 0) + 1
        try:
            yield
        finally:
            self._bound.scoped -= 1
            if previous != ordinal:
                self._raw("hipSetDevice", previous)

    # ---- synchronization -----------------------------------------------------------------------
    def device_synchronize(self) -> None:
        self._call("hipDeviceSynchronize")
