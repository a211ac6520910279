"""The GPU driver interface the runtime launches through, and the backend registry.

``Driver`` is the small set of driver-API operations the runtime needs (module load, global lookup,
memory, copies, launches, occupancy, IPC). Two implementations exist, each over its vendor's official
Python bindings, imported only when first asked for:

* ``nvvm`` (PTX bundles): ``runtime/cuda.py``, ``CudaDriver`` over ``cuda.bindings.driver``;
* ``rocdl`` (hsaco bundles): ``runtime/hip.py``, ``HipDriver`` over hip-python (``from hip import hip``).

``get_driver(backend)`` returns the process-wide instance for a backend; ``default_driver()`` the one for
callers that name none (``MORI_COMPILER_BACKEND``, else torch's GPU flavour). Pointers, streams and sizes
cross this interface as plain Python ints (0 = the default stream); modules and functions are wrapped in
``Module`` / ``Function``. Kernel parameters are ``(type_name, value)`` pairs, type names from
``kernel_abi.PARAM_SIZES``; ``marshal_params`` turns them into the ``void*[]`` array both driver APIs
take as ``kernelParams``.

This module imports only the standard library; torch is imported lazily and is optional.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from mori_compiler.lib_bitcode.kernel_abi import PARAM_SIZES, abi_value


class DriverError(RuntimeError):
    """A driver API call failed. ``call`` is the API function, ``error_name`` the error's enum name."""

    def __init__(self, call: str, error_name: str, description: str = "", code: int | None = None):
        self.call = call
        self.error_name = error_name
        self.description = description
        self.code = code
        text = f"{call} failed: {error_name}"
        if code is not None:
            text += f" ({code})"
        if description:
            text += f": {description}"
        super().__init__(text)


@dataclass(frozen=True)
class Function:
    """A kernel in a loaded module. ``handle`` is the backend's function handle (CUfunction / hipFunction_t)."""

    name: str
    handle: object
    module: "Module" = field(repr=False, compare=False)


class Module(ABC):
    """A loaded code object."""

    @abstractmethod
    def function(self, name: str) -> Function:
        """The kernel called ``name`` (raises DriverError if the code object has none)."""

    @abstractmethod
    def global_address(self, name: str) -> tuple[int, int]:
        """(device address, size in bytes) of the global called ``name``."""

    @abstractmethod
    def unload(self) -> None:
        """Unload the code object; its functions and globals become invalid."""


def call_checked(bindings, call: str, args, *, success: int, error_text, unavailable: str, package: str):
    """Call ``bindings.<call>(*args)`` of a binding whose functions return (status, *values) and turn a
    failure into a DriverError. Returns None, the one value, or the tuple of values."""
    fn = getattr(bindings, call, None)
    if fn is None:
        raise DriverError(call, "NOT_AVAILABLE", f"this {package} version has no such function")
    try:
        result = fn(*args)
    except RuntimeError as exc:  # e.g. the driver library cannot be loaded on this machine
        raise DriverError(call, unavailable, str(exc)) from exc
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(err) != success:
        name, desc = error_text(err)
        raise DriverError(call, name, desc, int(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


class LoadedModule(Module):
    """A module loaded through a driver API whose module calls are ``<prefix>ModuleGetFunction``,
    ``<prefix>ModuleGetGlobal`` and ``<prefix>ModuleUnload`` (CUDA: ``cu``, HIP: ``hip``)."""

    prefix = ""
    api = ""

    def __init__(self, driver, handle):
        self._driver = driver
        self.handle = handle
        self._functions: dict[str, Function] = {}
        self._unloaded = False

    def _live(self):
        if self._unloaded:
            raise RuntimeError(f"this {self.api} module was unloaded")
        return self.handle

    def function(self, name: str) -> Function:
        fn = self._functions.get(name)
        if fn is None:
            handle = self._driver._call(f"{self.prefix}ModuleGetFunction", self._live(), name.encode())
            fn = self._functions[name] = Function(name, handle, self)
        return fn

    def global_address(self, name: str) -> tuple[int, int]:
        ptr, size = self._driver._call(f"{self.prefix}ModuleGetGlobal", self._live(), name.encode())
        return int(ptr), int(size)

    def unload(self) -> None:
        if not self._unloaded:
            self._driver._call(f"{self.prefix}ModuleUnload", self.handle)
            self._unloaded = True
            self._functions.clear()


# ctypes type of each kernel parameter type: the driver copies sizeof(parameter) bytes from the
# address in kernelParams[i], so each value needs a scalar of exactly its size.
CTYPES = {
    "ptr": ctypes.c_uint64,
    "i64": ctypes.c_int64,
    "i32": ctypes.c_int32,
    "i16": ctypes.c_int16,
    "i8": ctypes.c_int8,
    "f64": ctypes.c_double,
    "f32": ctypes.c_float,
}
assert set(CTYPES) == set(PARAM_SIZES) and all(ctypes.sizeof(CTYPES[t]) == PARAM_SIZES[t] for t in CTYPES)

def _to_ctype(type_name: str, value):
    try:
        ctype = CTYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown kernel parameter type '{type_name}' (known: {', '.join(CTYPES)})") from None
    return ctype(abi_value(type_name, value))


def marshal_params(params) -> tuple[object, list]:
    """The ``void*[]`` kernelParams array for ``params`` ((type_name, value) pairs), and the ctypes objects
    it points into. Keep both alive until the launch call has returned (the driver copies the values
    during the call). With no parameters the array is None (kernelParams = NULL)."""
    scalars = [_to_ctype(t, v) for t, v in params]
    if not scalars:
        return None, []
    array = (ctypes.c_void_p * len(scalars))(*(ctypes.addressof(s) for s in scalars))
    return array, scalars


def params_address(array) -> int:
    """The address to pass as kernelParams (0 for no parameters)."""
    return 0 if array is None else ctypes.addressof(array)


_torch_import_failed = False  # an import of torch failed once: not tried again (each try searches sys.path)


def _import_torch():
    """torch if it can be imported, else None (never raises). Cheap after the first call: these are asked
    on every MORI-IO transfer of GPU memory."""
    global _torch_import_failed
    torch = sys.modules.get("torch")
    if torch is not None or "torch" in sys.modules:  # loaded, or deliberately blocked (None)
        return torch
    if _torch_import_failed:
        return None
    try:
        return importlib.import_module("torch")
    except Exception:  # noqa: BLE001 - an unusable torch is the same as none
        _torch_import_failed = True
        return None


def torch_cuda():
    """torch when it is importable and has a usable GPU backend (CUDA or ROCm), else None."""
    torch = _import_torch()
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


class Driver(ABC):
    """The driver operations the runtime needs. All pointers and streams are ints; ``stream=None`` means
    the default stream (for copies: a synchronous copy)."""

    backend: str = ""  # "nvvm" or "rocdl"
    api: str = ""  # "CUDA" / "HIP", for messages

    # ---- modules -------------------------------------------------------------------------------
    @abstractmethod
    def load_module(self, image: bytes) -> Module: ...

    # ---- memory --------------------------------------------------------------------------------
    @abstractmethod
    def malloc(self, n: int) -> int:
        """Device memory (cudaMalloc class: never managed memory)."""

    @abstractmethod
    def free(self, ptr: int) -> None: ...

    @abstractmethod
    def memcpy_htod(self, dst: int, data: bytes, stream: int | None = None) -> None:
        """Copy ``data`` to device address ``dst``; with a stream, ordered on it (pageable source: the
        bytes are staged before the call returns, so ``data`` may be dropped afterwards)."""

    @abstractmethod
    def memcpy_dtoh(self, src: int, n: int, stream: int | None = None) -> bytes:
        """``n`` bytes from device address ``src``; with a stream, ordered on it and synchronized."""

    @abstractmethod
    def memset_d8(self, ptr: int, value: int, n: int, stream: int | None = None) -> None: ...

    # ---- launch --------------------------------------------------------------------------------
    @abstractmethod
    def launch(self, fn: Function, grid, block, params, *, shared_mem: int = 0, stream: int | None = None,
               cooperative: bool = False) -> None:  # fmt: skip
        """Launch ``fn`` on ``grid`` x ``block`` (3-tuples) with ``params`` ((type_name, value) pairs).
        ``cooperative`` guarantees that all blocks are co-resident (or fails the launch)."""

    @abstractmethod
    def max_active_blocks_per_sm(self, fn: Function, block_threads: int, shared_mem: int = 0) -> int: ...

    @abstractmethod
    def multiprocessor_count(self) -> int: ...

    # ---- IPC -----------------------------------------------------------------------------------
    @abstractmethod
    def ipc_get_mem_handle(self, ptr: int) -> bytes:
        """The 64-byte IPC handle of the allocation whose base is ``ptr``."""

    @abstractmethod
    def ipc_open_mem_handle(self, handle: bytes) -> int:
        """Map another process's allocation; returns its base address in this process."""

    @abstractmethod
    def ipc_close_mem_handle(self, ptr: int) -> None: ...

    # ---- copy engine: streams, events, async copies, pinned host memory (MORI-IO) ---------------
    # Not every driver has them (the shmem tests' fakes do not): the defaults refuse clearly.

    def _unsupported(self, what: str):
        raise NotImplementedError(f"{type(self).__name__} has no {what} (MORI-IO's GPU memory needs it)")

    def address_range(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the device allocation containing ``ptr``; DriverError if it is not device memory
        (torch tensors are sub-allocations of larger segments: IPC handles name the segment's base)."""
        self._unsupported("address_range")

    def pci_bus_id(self, ordinal: int) -> str:
        """The lower-case PCI bus id of GPU ``ordinal`` ("0000:00:06.0")."""
        self._unsupported("pci_bus_id")

    def device_count(self) -> int:
        self._unsupported("device_count")

    def stream_create(self) -> int:
        """A new non-blocking stream (never synchronizes with the legacy default stream) on this device."""
        self._unsupported("stream_create")

    def stream_destroy(self, stream: int) -> None:
        self._unsupported("stream_destroy")

    def event_create(self):
        """A new event with timing disabled (the cheap kind); an opaque handle."""
        self._unsupported("event_create")

    def event_destroy(self, event) -> None:
        self._unsupported("event_destroy")

    def event_record(self, event, stream: int | None) -> None:
        self._unsupported("event_record")

    def event_query(self, event) -> bool:
        """True once the work before the event's last record is done, False while it runs (never blocks)."""
        self._unsupported("event_query")

    def stream_query(self, stream: int | None) -> bool:
        """True when all work queued on ``stream`` so far is done, False while some runs (never blocks)."""
        self._unsupported("stream_query")

    def event_synchronize(self, event) -> None:
        self._unsupported("event_synchronize")

    def stream_wait_event(self, stream: int, event) -> None:
        """Work queued on ``stream`` later runs after the event's last record."""
        self._unsupported("stream_wait_event")

    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None:
        """Copy ``n`` bytes between any two addresses the GPU can reach (device, peer device, pinned host:
        unified addressing infers the direction), ordered on ``stream``."""
        self._unsupported("memcpy_async")

    def host_alloc(self, n: int) -> int:
        """``n`` bytes of page-locked host memory, usable by every device's copies."""
        self._unsupported("host_alloc")

    def host_free(self, ptr: int) -> None:
        self._unsupported("host_free")

    @contextlib.contextmanager
    def using_device(self, ordinal: int):
        """Inside the block the calling thread's driver calls work on GPU ``ordinal`` (its streams,
        events and copies); the previous device is restored after. The same device: nothing changes."""
        if int(ordinal) != self.device:
            self.set_device(ordinal)  # drivers of one device refuse another one here
        yield

    # ---- synchronization -----------------------------------------------------------------------
    @abstractmethod
    def stream_synchronize(self, stream: int | None) -> None: ...

    @abstractmethod
    def device_synchronize(self) -> None: ...

    # ---- devices and streams -------------------------------------------------------------------
    @property
    def device(self) -> int:
        """The ordinal of the GPU this driver works on."""
        return 0

    def set_device(self, ordinal: int) -> None:
        """Work on GPU ``ordinal`` from now on (the default: the current torch device, else 0)."""
        if ordinal != self.device:
            raise ValueError(f"{type(self).__name__} supports only device {self.device}, not {ordinal}")

    def can_access_peer(self, peer_ordinal: int) -> bool:
        """Whether kernels on this driver's GPU can load and store GPU ``peer_ordinal``'s memory directly
        (P2P over NVLink / xGMI / PCIe). The same GPU always can."""
        return peer_ordinal == self.device

    def peer_access(self, device: int, peer: int) -> bool:
        """Whether GPU ``device`` can load and store GPU ``peer``'s memory directly (any two ordinals;
        ``can_access_peer`` asks for this driver's own device). Drivers that know only their device say
        so for it and refuse other pairs."""
        if device == peer:
            return True
        return device == self.device and self.can_access_peer(peer)

    @property
    def torch_interop(self) -> bool:
        """True when torch tensors can be allocated on this driver's device (real drivers with a GPU torch)."""
        return False

    def current_stream(self, device: int | None = None) -> int:
        """The current PyTorch stream's handle (of ``device``, default torch's current device) when torch
        is importable (and has a GPU), else 0. With a device, torch's raw-stream query is used when it has
        one (the one Triton uses: a few hundred ns, where the public API costs tens of µs here)."""
        if device is not None:
            torch = _import_torch()
            raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
            if raw is not None:
                try:
                    return int(raw(int(device)))
                except Exception:  # noqa: BLE001 - no usable CUDA in this torch: the public path decides
                    pass
        torch = torch_cuda()
        if torch is None:
            return 0
        try:
            stream = torch.cuda.current_stream() if device is None else torch.cuda.current_stream(device)
            return int(stream.cuda_stream)
        except Exception:  # noqa: BLE001 - no usable torch stream: the default stream
            return 0



class BindingsDriver(Driver):
    """The part of the CUDA and HIP drivers that only differs by name: both bindings spell their copy, memset,
    stream-sync and IPC calls ``<prefix><Name>`` with the same arguments and out-values, and launch kernels
    with the same argument list. Subclasses set ``prefix`` and implement ``_call(name, *args)`` (which binds
    their context or device first and checks the result)."""

    prefix: str = ""

    def _call(self, call: str, *args):
        raise NotImplementedError

    def memcpy_htod(self, dst: int, data: bytes, stream: int | None = None) -> None:
        data = bytes(data)
        if not data:
            return
        if stream is None:
            self._call(f"{self.prefix}MemcpyHtoD", int(dst), data, len(data))
        else:
            self._call(f"{self.prefix}MemcpyHtoDAsync", int(dst), data, len(data), int(stream))

    def memcpy_dtoh(self, src: int, n: int, stream: int | None = None) -> bytes:
        if n == 0:
            return b""
        buf = bytearray(n)
        if stream is None:
            self._call(f"{self.prefix}MemcpyDtoH", buf, int(src), n)
        else:
            # The host buffer is only valid after the copy: wait for the stream before returning it.
            self._call(f"{self.prefix}MemcpyDtoHAsync", buf, int(src), n, int(stream))
            self._call(f"{self.prefix}StreamSynchronize", int(stream))
        return bytes(buf)

    def memset_d8(self, ptr: int, value: int, n: int, stream: int | None = None) -> None:
        if stream is None:
            self._call(f"{self.prefix}MemsetD8", int(ptr), value & 0xFF, int(n))
        else:
            self._call(f"{self.prefix}MemsetD8Async", int(ptr), value & 0xFF, int(n), int(stream))

    def _launch(self, call: str, fn: Function, grid, block, params, shared_mem: int, stream: int | None,
                *trailing) -> None:  # fmt: skip
        """``call(f, gx, gy, gz, bx, by, bz, shared_mem, stream, kernel_params, *trailing)``."""
        gx, gy, gz = (int(v) for v in grid)
        bx, by, bz = (int(v) for v in block)
        array, keep = marshal_params(params)
        kernel_params = params_address(array) or None
        hstream = 0 if stream is None else int(stream)
        self._call(call, fn.handle, gx, gy, gz, bx, by, bz, int(shared_mem), hstream, kernel_params, *trailing)
        del array, keep  # alive until here: the driver copied the values during the call

    def ipc_get_mem_handle(self, ptr: int) -> bytes:
        handle = self._call(f"{self.prefix}IpcGetMemHandle", int(ptr))
        return bytes(handle.reserved)

    def ipc_close_mem_handle(self, ptr: int) -> None:
        self._call(f"{self.prefix}IpcCloseMemHandle", int(ptr))

    def stream_synchronize(self, stream: int | None) -> None:
        self._call(f"{self.prefix}StreamSynchronize", 0 if stream is None else int(stream))

    def event_record(self, event, stream: int | None) -> None:
        self._call(f"{self.prefix}EventRecord", event, 0 if stream is None else int(stream))

    def event_synchronize(self, event) -> None:
        self._call(f"{self.prefix}EventSynchronize", event)

    def event_destroy(self, event) -> None:
        self._call(f"{self.prefix}EventDestroy", event)

    def stream_wait_event(self, stream: int, event) -> None:
        self._call(f"{self.prefix}StreamWaitEvent", int(stream), event, 0)

    def stream_destroy(self, stream: int) -> None:
        self._call(f"{self.prefix}StreamDestroy", int(stream))

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = self._call(f"{self.prefix}MemGetAddressRange", int(ptr))
        return int(base), int(size)

    def pci_bus_id(self, ordinal: int) -> str:
        raw = self._call(f"{self.prefix}DeviceGetPCIBusId", 32, self._device_handle(int(ordinal)))
        text = raw.decode(errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        return text.split("\0", 1)[0].strip().lower()

    def _device_handle(self, ordinal: int):
        return ordinal

    @property
    def torch_interop(self) -> bool:
        return torch_cuda() is not None


BACKEND_ENV = "MORI_COMPILER_BACKEND"  # the backend of default_driver(): nvvm / cuda or rocdl / hip
_DRIVER_MODULES = {"nvvm": ("mori_compiler.runtime.cuda", "CudaDriver"),
                   "rocdl": ("mori_compiler.runtime.hip", "HipDriver")}  # fmt: skip
_ALIASES = {"cuda": "nvvm", "nvidia": "nvvm", "hip": "rocdl", "rocm": "rocdl", "amdgpu": "rocdl"}
_drivers: dict[str, Driver] = {}
_drivers_lock = threading.Lock()


def canonical_backend(backend: str) -> str:
    name = _ALIASES.get(backend, backend)
    if name not in _DRIVER_MODULES:
        raise ValueError(f"unknown GPU backend '{backend}' (known: nvvm (CUDA), rocdl (HIP))")
    return name


def get_driver(backend: str) -> Driver:
    """The process-wide driver for ``backend`` ("nvvm" → CUDA, "rocdl" → HIP), created on first use."""
    name = canonical_backend(backend)
    with _drivers_lock:
        driver = _drivers.get(name)
        if driver is None:
            module_name, class_name = _DRIVER_MODULES[name]
            driver = getattr(importlib.import_module(module_name), class_name)()
            _drivers[name] = driver
        return driver


def default_driver() -> Driver:
    """The driver for callers that name no backend (shmem init): ``MORI_COMPILER_BACKEND`` if set, else
    the one torch was built for (ROCm torch: rocdl; otherwise, or without torch: nvvm)."""
    backend = os.environ.get(BACKEND_ENV)
    if not backend:
        torch = torch_cuda()
        backend = "rocdl" if torch is not None and getattr(torch.version, "hip", None) else "nvvm"
    return get_driver(backend)


def _reset_drivers() -> None:
    """Forget the driver singletons (tests)."""
    with _drivers_lock:
        _drivers.clear()
