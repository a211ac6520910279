"""The CUDA and HIP drivers and the launcher, over recording fakes of ``cuda.bindings.driver`` and
``hip.hip`` (no GPU, no driver library, no torch needed).

The fakes follow the bindings' calling convention (every function returns a tuple whose first item is the
error enum) and keep a small model of device memory, so that copies, the device state and argument tables
can be read back. Launches decode the ``kernelParams`` pointer array during the call, as the real driver
does, using the parameter types the test declared for each kernel.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import subprocess
import sys
import types

import pytest

from mori_compiler.lib_bitcode import kernel_abi
from mori_compiler.lib_bitcode.state import (FLAG_VIRTUAL_PES, STATE_SIZE, STATE_SYMBOL, SYNC_RESERVED_BYTES,
                                             WAIT_REPORT_FORMAT, unpack_state)  # fmt: skip
from mori_compiler.runtime import driver as driver_mod
from mori_compiler.runtime import shmem
from mori_compiler.runtime.bundle import KernelInfo, KernelParam, publish_bundle
from mori_compiler.runtime.driver import DriverError, get_driver

HEAP = 1 << 20
_READ = {"ptr": ctypes.c_uint64, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "i16": ctypes.c_int16,
         "i8": ctypes.c_int8, "f64": ctypes.c_double, "f32": ctypes.c_float}  # fmt: skip


# ---- a fake GPU shared by both fake binding modules -------------------------------------------------


class Handle:
    """An opaque binding handle (CUcontext, CUmodule, CUfunction, CUdeviceptr...) convertible with int()."""

    def __init__(self, value: int = 0):
        self.value = int(value)

    def __int__(self):
        return self.value

    def __repr__(self):
        return f"<{type(self).__name__} 0x{self.value:x}>"


class FakeGPU:
    """Device memory, modules and a launch log."""

    def __init__(self):
        self.memory: dict[int, bytearray] = {}
        self.next_addr = 0x7F00_0000_0000
        self.calls: list[tuple] = []
        self.launches: list[dict] = []
        self.images: list[bytes] = []
        self.kernels: dict[str, tuple[str, ...]] = {}  # kernel name -> parameter types
        self.globals: dict[str, int] = {STATE_SYMBOL: STATE_SIZE}
        self.module_globals: dict[tuple[int, str], int] = {}
        self.occupancy = 4
        self.sm_count = 132
        self.fail: dict[str, int] = {}
        self.ipc_maps: dict[int, int] = {}
        self.peers: set[int] = set()  # other GPU ordinals this one has P2P access to

    def alloc(self, n: int) -> int:
        addr = self.next_addr
        self.memory[addr] = bytearray(n)
        self.next_addr += (n + (2 << 20) - 1) // (2 << 20) * (2 << 20) + (2 << 20)
        return addr

    def locate(self, addr: int, n: int) -> tuple[bytearray, int]:
        for base, buf in self.memory.items():
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base
        raise AssertionError(f"fake GPU: access to unallocated memory 0x{addr:x} (+{n})")

    def write(self, addr: int, data: bytes) -> None:
        buf, off = self.locate(addr, len(data))
        buf[off : off + len(data)] = data

    def read(self, addr: int, n: int) -> bytes:
        buf, off = self.locate(addr, n)
        return bytes(buf[off : off + n])

    def decode_params(self, kernel: str, address) -> list:
        types_ = self.kernels[kernel]
        if not types_:
            assert not address
            return []
        ptrs = (ctypes.c_void_p * len(types_)).from_address(int(address))
        return [_READ[t].from_address(ptrs[i]).value for i, t in enumerate(types_)]


# ---- fake cuda.bindings.driver ----------------------------------------------------------------------


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720


_CU_DESCRIPTIONS = {CUresult.CUDA_ERROR_OUT_OF_MEMORY: "out of memory",
                    CUresult.CUDA_ERROR_NOT_FOUND: "named symbol not found",
                    CUresult.CUDA_ERROR_INVALID_VALUE: "invalid argument"}  # fmt: skip


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


class CUipcMem_flags(enum.IntEnum):
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1


class CUipcMemHandle:
    def __init__(self):
        self.reserved = bytes(64)


class CUstream_flags(enum.IntEnum):
    CU_STREAM_NON_BLOCKING = 1


class CUevent_flags(enum.IntEnum):
    CU_EVENT_DISABLE_TIMING = 2


class CUcontext(Handle):
    pass


class CUdevice(Handle):
    pass


class FakeCudaModule(types.ModuleType):
    """Stands in for ``cuda.bindings.driver``: functions return (CUresult, *outs)."""

    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute
    CUipcMem_flags = CUipcMem_flags
    CUipcMemHandle = CUipcMemHandle
    CUstream_flags = CUstream_flags
    CUevent_flags = CUevent_flags
    CU_MEMHOSTALLOC_PORTABLE = 1

    def __init__(self, gpu: FakeGPU, *, current_ctx: int = 0):
        super().__init__("cuda.bindings.driver")
        self.gpu = gpu
        self.current = CUcontext(current_ctx)
        self.retained: list[int] = []
        self.next_handle = 0x1000

    def _rec(self, name, *args):
        self.gpu.calls.append((name, *args))
        err = self.gpu.fail.get(name)
        return CUresult(err) if err is not None else CUresult.CUDA_SUCCESS

    def _handle(self, cls=Handle):
        self.next_handle += 0x10
        return cls(self.next_handle)

    def cuGetErrorName(self, err):
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, _CU_DESCRIPTIONS.get(CUresult(err), "unknown error").encode()

    def cuInit(self, flags):
        return (self._rec("cuInit", flags),)

    def cuCtxGetCurrent(self):
        return self._rec("cuCtxGetCurrent"), self.current

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return (self._rec("cuCtxSetCurrent", int(ctx)),)

    def cuCtxGetDevice(self):
        return self._rec("cuCtxGetDevice"), CUdevice(0)

    def cuDeviceGet(self, ordinal):
        return self._rec("cuDeviceGet", ordinal), CUdevice(ordinal)

    def cuDevicePrimaryCtxRetain(self, dev):
        self.retained.append(int(dev))
        return self._rec("cuDevicePrimaryCtxRetain", int(dev)), CUcontext(0xC0DE + int(dev))

    def cuCtxSynchronize(self):
        return (self._rec("cuCtxSynchronize"),)

    def cuStreamSynchronize(self, stream):
        return (self._rec("cuStreamSynchronize", int(stream)),)

    def cuModuleLoadData(self, image):
        self.gpu.images.append(bytes(image))
        return self._rec("cuModuleLoadData"), self._handle()

    def cuModuleUnload(self, mod):
        return (self._rec("cuModuleUnload", int(mod)),)

    def cuModuleGetFunction(self, mod, name):
        err = self._rec("cuModuleGetFunction", int(mod), name)
        if name.decode() not in self.gpu.kernels:
            return CUresult.CUDA_ERROR_NOT_FOUND, None
        fn = self._handle()
        fn.kernel = name.decode()
        return err, fn

    def cuModuleGetGlobal(self, mod, name):
        err = self._rec("cuModuleGetGlobal", int(mod), name)
        size = self.gpu.globals.get(name.decode())
        if size is None:
            return CUresult.CUDA_ERROR_NOT_FOUND, None, None
        key = (int(mod), name.decode())
        if key not in self.gpu.module_globals:
            self.gpu.module_globals[key] = self.gpu.alloc(size)
        return err, Handle(self.gpu.module_globals[key]), size

    def cuMemAlloc(self, n):
        err = self._rec("cuMemAlloc", n)
        if err:
            return err, None
        return err, Handle(self.gpu.alloc(n))

    def cuMemFree(self, ptr):
        self.gpu.memory.pop(int(ptr))
        return (self._rec("cuMemFree", int(ptr)),)

    def cuMemcpyHtoD(self, dst, src, n):
        self.gpu.write(int(dst), bytes(src)[:n])
        return (self._rec("cuMemcpyHtoD", int(dst), n),)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.gpu.write(int(dst), bytes(src)[:n])
        return (self._rec("cuMemcpyHtoDAsync", int(dst), n, int(stream)),)

    def cuMemcpyDtoH(self, dst, src, n):
        dst[:n] = self.gpu.read(int(src), n)
        return (self._rec("cuMemcpyDtoH", int(src), n),)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        dst[:n] = self.gpu.read(int(src), n)
        return (self._rec("cuMemcpyDtoHAsync", int(src), n, int(stream)),)

    def cuMemsetD8(self, ptr, value, n):
        self.gpu.write(int(ptr), bytes([value]) * n)
        return (self._rec("cuMemsetD8", int(ptr), value, n),)

    def cuMemsetD8Async(self, ptr, value, n, stream):
        self.gpu.write(int(ptr), bytes([value]) * n)
        return (self._rec("cuMemsetD8Async", int(ptr), value, n, int(stream)),)

    def _launch(self, name, f, gx, gy, gz, bx, by, bz, shm, stream, params):
        err = self._rec(name)
        if not err:
            self.gpu.launches.append({"api": name, "kernel": f.kernel, "grid": (gx, gy, gz), "block": (bx, by, bz),
                                      "shared_mem": shm, "stream": int(stream),
                                      "params": self.gpu.decode_params(f.kernel, params)})  # fmt: skip
        return (err,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        assert not extra
        return self._launch("cuLaunchKernel", f, gx, gy, gz, bx, by, bz, shm, stream, params)

    def cuLaunchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, shm, stream, params):
        return self._launch("cuLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, shm, stream, params)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f, block, shm):
        return self._rec("cuOccupancyMaxActiveBlocksPerMultiprocessor", f.kernel, block, shm), self.gpu.occupancy

    def cuDeviceCanAccessPeer(self, dev, peer):
        return self._rec("cuDeviceCanAccessPeer", int(dev), int(peer)), int(int(peer) in self.gpu.peers)

    def cuDeviceGetAttribute(self, attr, dev):
        assert attr == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        return self._rec("cuDeviceGetAttribute", int(attr), int(dev)), self.gpu.sm_count

    def cuIpcGetMemHandle(self, ptr):
        h = CUipcMemHandle()
        h.reserved = b"IPC" + int(ptr).to_bytes(8, "little") + bytes(53)
        return self._rec("cuIpcGetMemHandle", int(ptr)), h

    def cuIpcOpenMemHandle(self, h, flags):
        err = self._rec("cuIpcOpenMemHandle", bytes(h.reserved), flags)
        mapped = self.gpu.alloc(64)
        self.gpu.ipc_maps[mapped] = int.from_bytes(h.reserved[3:11], "little")
        return err, Handle(mapped)

    def cuIpcCloseMemHandle(self, ptr):
        return (self._rec("cuIpcCloseMemHandle", int(ptr)),)

    # copy engine (MORI-IO)
    def cuMemGetAddressRange(self, ptr):
        err = self._rec("cuMemGetAddressRange", int(ptr))
        for base, buf in self.gpu.memory.items():
            if base <= int(ptr) < base + len(buf):
                return err, Handle(base), len(buf)
        return CUresult.CUDA_ERROR_NOT_FOUND, None, None

    def cuDeviceGetCount(self):
        return self._rec("cuDeviceGetCount"), 2

    def cuDeviceGetPCIBusId(self, length, dev):
        return self._rec("cuDeviceGetPCIBusId", length, int(dev)), f"0000:0{int(dev)}:00.0".upper().encode() + b"\0 "

    def cuStreamCreate(self, flags):
        return self._rec("cuStreamCreate", flags), self._handle()

    def cuStreamDestroy(self, stream):
        return (self._rec("cuStreamDestroy", int(stream)),)

    def cuEventCreate(self, flags):
        return self._rec("cuEventCreate", flags), self._handle()

    def cuEventDestroy(self, event):
        return (self._rec("cuEventDestroy", int(event)),)

    def cuEventRecord(self, event, stream):
        return (self._rec("cuEventRecord", int(event), int(stream)),)

    def cuEventQuery(self, event):
        err = self._rec("cuEventQuery", int(event))
        return (CUresult.CUDA_ERROR_NOT_READY if getattr(self, "busy", False) and not err else err,)

    def cuStreamQuery(self, stream):
        err = self._rec("cuStreamQuery", int(stream))
        return (CUresult.CUDA_ERROR_NOT_READY if getattr(self, "busy", False) and not err else err,)

    def cuEventSynchronize(self, event):
        return (self._rec("cuEventSynchronize", int(event)),)

    def cuStreamWaitEvent(self, stream, event, flags):
        return (self._rec("cuStreamWaitEvent", int(stream), int(event), flags),)

    def cuMemcpyAsync(self, dst, src, n, stream):
        self.gpu.write(int(dst), self.gpu.read(int(src), n))
        return (self._rec("cuMemcpyAsync", int(dst), int(src), n, int(stream)),)

    def cuMemHostAlloc(self, n, flags):
        return self._rec("cuMemHostAlloc", n, flags), self.gpu.alloc(n)

    def cuMemFreeHost(self, ptr):
        self.gpu.memory.pop(int(ptr))
        return (self._rec("cuMemFreeHost", int(ptr)),)

    def cuCtxPushCurrent(self, ctx):
        self.pushed = getattr(self, "pushed", []) + [self.current]
        self.current = ctx
        return (self._rec("cuCtxPushCurrent", int(ctx)),)

    def cuCtxPopCurrent(self):
        popped, self.current = self.current, self.pushed.pop()
        return self._rec("cuCtxPopCurrent"), popped


# ---- fake hip.hip -----------------------------------------------------------------------------------


class hipError_t(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorNotFound = 500
    hipErrorNotReady = 600


class hipMemcpyKind(enum.IntEnum):
    hipMemcpyDefault = 4


class hipDeviceAttribute_t(enum.IntEnum):
    hipDeviceAttributeMultiprocessorCount = 63


class hipIpcMemHandle_st:
    def __init__(self, data=bytes(64)):
        self._data = data

    @classmethod
    def fromObj(cls, obj):
        return cls(obj)

    @property
    def reserved(self):
        return bytes(self._data)


class FakeHipModule(types.ModuleType):
    """Stands in for ``hip.hip``: functions return (hipError_t, *outs)."""

    hipError_t = hipError_t
    hipDeviceAttribute_t = hipDeviceAttribute_t
    hipIpcMemHandle_st = hipIpcMemHandle_st
    hipIpcMemLazyEnablePeerAccess = 1
    hipMemcpyKind = hipMemcpyKind
    hipStreamNonBlocking = 1
    hipEventDisableTiming = 2
    hipHostMallocPortable = 1

    def __init__(self, gpu: FakeGPU, *, cooperative: bool = True):
        super().__init__("hip.hip")
        self.gpu = gpu
        self.device = 0
        self.next_handle = 0x2000
        if cooperative:
            self.hipModuleLaunchCooperativeKernel = self._coop

    def _rec(self, name, *args):
        self.gpu.calls.append((name, *args))
        err = self.gpu.fail.get(name)
        return hipError_t(err) if err is not None else hipError_t.hipSuccess

    def hipGetErrorName(self, err):
        return hipError_t.hipSuccess, hipError_t(err).name.encode()

    def hipGetErrorString(self, err):
        return hipError_t.hipSuccess, b"hip says: " + hipError_t(err).name.encode()

    def hipGetDevice(self):
        return self._rec("hipGetDevice"), self.device

    def hipSetDevice(self, d):
        self.device = d
        return (self._rec("hipSetDevice", d),)

    def hipModuleLoadData(self, image):
        self.gpu.images.append(bytes(image))
        self.next_handle += 0x10
        return self._rec("hipModuleLoadData"), Handle(self.next_handle)

    def hipModuleGetFunction(self, mod, name):
        err = self._rec("hipModuleGetFunction", int(mod), name)
        if name.decode() not in self.gpu.kernels:
            return hipError_t.hipErrorNotFound, None
        fn = Handle(0x3000)
        fn.kernel = name.decode()
        return err, fn

    def hipModuleGetGlobal(self, mod, name):
        err = self._rec("hipModuleGetGlobal", int(mod), name)
        size = self.gpu.globals.get(name.decode())
        if size is None:
            return hipError_t.hipErrorNotFound, None, None
        key = (int(mod), name.decode())
        if key not in self.gpu.module_globals:
            self.gpu.module_globals[key] = self.gpu.alloc(size)
        return err, Handle(self.gpu.module_globals[key]), size

    def hipMalloc(self, n):
        err = self._rec("hipMalloc", n)
        return err, (Handle(self.gpu.alloc(n)) if not err else None)

    def hipFree(self, ptr):
        self.gpu.memory.pop(int(ptr))
        return (self._rec("hipFree", int(ptr)),)

    def hipMemcpyHtoD(self, dst, src, n):
        self.gpu.write(int(dst), bytes(src)[:n])
        return (self._rec("hipMemcpyHtoD", int(dst), n),)

    def hipMemcpyHtoDAsync(self, dst, src, n, stream):
        self.gpu.write(int(dst), bytes(src)[:n])
        return (self._rec("hipMemcpyHtoDAsync", int(dst), n, int(stream)),)

    def hipMemcpyDtoH(self, dst, src, n):
        dst[:n] = self.gpu.read(int(src), n)
        return (self._rec("hipMemcpyDtoH", int(src), n),)

    def hipMemcpyDtoHAsync(self, dst, src, n, stream):
        dst[:n] = self.gpu.read(int(src), n)
        return (self._rec("hipMemcpyDtoHAsync", int(src), n, int(stream)),)

    def hipMemsetD8(self, ptr, value, n):
        self.gpu.write(int(ptr), bytes([value]) * n)
        return (self._rec("hipMemsetD8", int(ptr), value, n),)

    def hipMemsetD8Async(self, ptr, value, n, stream):
        self.gpu.write(int(ptr), bytes([value]) * n)
        return (self._rec("hipMemsetD8Async", int(ptr), value, n, int(stream)),)

    def hipStreamSynchronize(self, stream):
        return (self._rec("hipStreamSynchronize", int(stream)),)

    def hipDeviceSynchronize(self):
        return (self._rec("hipDeviceSynchronize"),)

    def _launch(self, name, f, gx, gy, gz, bx, by, bz, shm, stream, params):
        err = self._rec(name)
        if not err:
            self.gpu.launches.append({"api": name, "kernel": f.kernel, "grid": (gx, gy, gz), "block": (bx, by, bz),
                                      "shared_mem": shm, "stream": int(stream),
                                      "params": self.gpu.decode_params(f.kernel, params)})  # fmt: skip
        return (err,)

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        assert extra is None
        return self._launch("hipModuleLaunchKernel", f, gx, gy, gz, bx, by, bz, shm, stream, params)

    def _coop(self, f, gx, gy, gz, bx, by, bz, shm, stream, params):
        return self._launch("hipModuleLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, shm, stream, params)

    def hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(self, f, block, shm):
        return self._rec("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", block, shm), self.gpu.occupancy

    def hipDeviceCanAccessPeer(self, dev, peer):
        return self._rec("hipDeviceCanAccessPeer", dev, peer), int(peer in self.gpu.peers)

    def hipDeviceGetAttribute(self, attr, dev):
        assert attr == hipDeviceAttribute_t.hipDeviceAttributeMultiprocessorCount
        return self._rec("hipDeviceGetAttribute", int(attr), dev), self.gpu.sm_count

    def hipIpcGetMemHandle(self, ptr):
        return self._rec("hipIpcGetMemHandle", int(ptr)), hipIpcMemHandle_st(b"HIP" + bytes(61))

    def hipIpcOpenMemHandle(self, h, flags):
        err = self._rec("hipIpcOpenMemHandle", h.reserved, flags)
        return err, Handle(self.gpu.alloc(64))

    def hipIpcCloseMemHandle(self, ptr):
        return (self._rec("hipIpcCloseMemHandle", int(ptr)),)

    # copy engine (MORI-IO)
    def hipMemGetAddressRange(self, ptr):
        err = self._rec("hipMemGetAddressRange", int(ptr))
        for base, buf in self.gpu.memory.items():
            if base <= int(ptr) < base + len(buf):
                return err, Handle(base), len(buf)
        return hipError_t.hipErrorNotFound, None, None

    def hipGetDeviceCount(self):
        return self._rec("hipGetDeviceCount"), 2

    def hipDeviceGetPCIBusId(self, buf, length, device):
        text = f"0000:C{device}:00.0".encode()
        buf[: len(text)] = text
        return (self._rec("hipDeviceGetPCIBusId", length, device),)

    def hipStreamCreateWithFlags(self, flags):
        self.next_handle += 0x10
        return self._rec("hipStreamCreateWithFlags", flags), Handle(self.next_handle)

    def hipStreamDestroy(self, stream):
        return (self._rec("hipStreamDestroy", int(stream)),)

    def hipEventCreateWithFlags(self, flags):
        self.next_handle += 0x10
        return self._rec("hipEventCreateWithFlags", flags), Handle(self.next_handle)

    def hipEventDestroy(self, event):
        return (self._rec("hipEventDestroy", int(event)),)

    def hipEventRecord(self, event, stream):
        return (self._rec("hipEventRecord", int(event), int(stream)),)

    def hipEventQuery(self, event):
        err = self._rec("hipEventQuery", int(event))
        return (hipError_t.hipErrorNotReady if getattr(self, "busy", False) and not err else err,)

    def hipStreamQuery(self, stream):
        err = self._rec("hipStreamQuery", int(stream))
        return (hipError_t.hipErrorNotReady if getattr(self, "busy", False) and not err else err,)

    def hipEventSynchronize(self, event):
        return (self._rec("hipEventSynchronize", int(event)),)

    def hipStreamWaitEvent(self, stream, event, flags):
        return (self._rec("hipStreamWaitEvent", int(stream), int(event), flags),)

    def hipMemcpyAsync(self, dst, src, n, kind, stream):
        self.gpu.write(int(dst), self.gpu.read(int(src), n))
        return (self._rec("hipMemcpyAsync", int(dst), int(src), n, kind, int(stream)),)

    def hipHostMalloc(self, n, flags):
        return self._rec("hipHostMalloc", n, flags), Handle(self.gpu.alloc(n))

    def hipHostFree(self, ptr):
        self.gpu.memory.pop(int(ptr))
        return (self._rec("hipHostFree", int(ptr)),)


# ---- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """No torch (imports of it fail), no driver singletons or shmem state leaking between tests."""
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delenv("MORI_COMPILER_WAIT_LIMIT", raising=False)
    monkeypatch.delenv("MORI_SHMEM_HEAP_SIZE", raising=False)
    driver_mod._reset_drivers()
    yield
    if shmem.current_state() is not None:
        shmem.shmem_finalize()
    driver_mod._reset_drivers()


@pytest.fixture
def gpu():
    return FakeGPU()


def install_fake_cuda(monkeypatch, gpu) -> "FakeCudaModule":
    """``cuda.bindings.driver`` (and its packages) answered by a FakeCudaModule over ``gpu``, for the test."""
    module = FakeCudaModule(gpu)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = module
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", module)
    return module


@pytest.fixture
def fake_cuda(monkeypatch, gpu):
    return install_fake_cuda(monkeypatch, gpu)


def _install_hip(monkeypatch, gpu, **kw):
    module = FakeHipModule(gpu, **kw)
    hip_pkg = types.ModuleType("hip")
    hip_pkg.hip = module
    monkeypatch.setitem(sys.modules, "hip", hip_pkg)
    monkeypatch.setitem(sys.modules, "hip.hip", module)
    return module


@pytest.fixture
def fake_hip(monkeypatch, gpu):
    return _install_hip(monkeypatch, gpu)


ALL_TYPES = ("ptr", "i64", "i32", "i16", "i8", "f64", "f32")


def _kernel(name, types_, block=(128, 1, 1)):
    return KernelInfo(name, tuple(KernelParam(f"arg{i}", t) for i, t in enumerate(types_)), block)


def _bundle(tmp_path, kernels, *, backend="nvvm", state=True, virtual=False, key="f" * 64):
    return publish_bundle(tmp_path / "cache", key, target="sm_90" if backend == "nvvm" else "gfx942",
                          backend=backend, binary=b"// PTX text\n.version 7.8\n" if backend == "nvvm" else b"\x7fELF..",
                          kernels=kernels,
                          state_globals=[{"symbol": STATE_SYMBOL, "size": STATE_SIZE}] if state else [],
                          virtual_pes=virtual)  # fmt: skip


class OneRank:
    """A world of one PE (a rendezvous object for shmem_init_comm)."""

    rank, world_size = 0, 1

    def all_gather_object(self, obj):
        return [obj]

    def barrier(self):
        pass


# ---- the driver layer -------------------------------------------------------------------------------


def test_importing_the_runtime_imports_no_gpu_or_compiler_packages(tmp_path):
    code = ("import sys; import mori_compiler.runtime as r; import mori_compiler.runtime.launcher, "
            "mori_compiler.runtime.shmem, mori_compiler.runtime.driver, mori_compiler.runtime.cuda, "
            "mori_compiler.runtime.hip; r.KernelSet; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda', 'hip', 'rocm', 'mlir', 'llvmlite')); "
            "print(bad)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_get_driver_is_a_lazy_singleton(fake_cuda, fake_hip):
    cuda = get_driver("nvvm")
    assert cuda is get_driver("cuda") and type(cuda).__name__ == "CudaDriver" and cuda.backend == "nvvm"
    hip = get_driver("rocdl")
    assert hip is get_driver("hip") and type(hip).__name__ == "HipDriver"
    with pytest.raises(ValueError, match="unknown GPU backend 'spirv'"):
        get_driver("spirv")


def test_default_driver_follows_the_environment_then_torch(monkeypatch, fake_cuda, fake_hip):
    monkeypatch.setenv("MORI_COMPILER_BACKEND", "hip")
    assert driver_mod.default_driver() is get_driver("rocdl")
    monkeypatch.setenv("MORI_COMPILER_BACKEND", "spirv")
    with pytest.raises(ValueError, match="unknown GPU backend 'spirv'"):
        driver_mod.default_driver()
    monkeypatch.delenv("MORI_COMPILER_BACKEND")
    assert driver_mod.default_driver() is get_driver("nvvm")  # no torch: CUDA
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True)
    torch.version = types.SimpleNamespace(hip="6.2")
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert driver_mod.default_driver() is get_driver("rocdl")  # a ROCm build of torch: HIP
    torch.version.hip = None
    assert driver_mod.default_driver() is get_driver("nvvm")


def test_shmem_init_without_a_driver_uses_the_default_one(monkeypatch, fake_cuda, fake_hip):
    monkeypatch.setenv("MORI_COMPILER_BACKEND", "rocdl")
    shmem.shmem_init_virtual(2, device="cuda:0", heap_size=HEAP)
    assert shmem.current_state().driver is get_driver("rocdl")
    shmem.shmem_finalize()
    with pytest.raises(shmem.ShmemError, match="cannot tell which GPU 'gpu-one' is"):
        shmem.shmem_init_virtual(2, device="gpu-one", heap_size=HEAP)
    assert shmem.current_state() is None
    shmem.shmem_init_virtual(2, device=types.SimpleNamespace(index=1), heap_size=HEAP)  # a torch.device
    assert shmem.current_state().driver.device == 1
    shmem.shmem_finalize()
    shmem.shmem_init_comm(OneRank(), heap_size=HEAP)
    assert shmem.current_state().driver is get_driver("rocdl") and shmem.current_state().mode == "multiprocess"


def test_context_primary_retained_when_none_is_current(fake_cuda, gpu):
    drv = get_driver("nvvm")
    assert drv.device == 0
    assert fake_cuda.retained == [0]
    assert int(fake_cuda.current) == 0xC0DE
    names = [c[0] for c in gpu.calls]
    assert names[:3] == ["cuInit", "cuCtxGetCurrent", "cuDeviceGet"]


def test_context_current_one_is_used(monkeypatch, gpu):
    module = FakeCudaModule(gpu, current_ctx=0xAB)
    from mori_compiler.runtime.cuda import CudaDriver

    drv = CudaDriver(bindings=module)
    drv.malloc(16)
    assert module.retained == [] and int(module.current) == 0xAB


@pytest.mark.parametrize("cooperative", [False, True])
def test_launch_marshals_every_param_type(fake_cuda, gpu, cooperative):
    gpu.kernels["k"] = ALL_TYPES
    drv = get_driver("nvvm")
    fn = drv.load_module(b"// ptx").function("k")
    values = [0xFFFF_8000_1234_5678, -5, 0xFFFF_FFFF, 40000, -3, 2.5, 1.25]
    drv.launch(fn, (2, 3, 4), (64, 2, 1), list(zip(ALL_TYPES, values)), shared_mem=128, stream=77,
               cooperative=cooperative)  # fmt: skip
    (launch,) = gpu.launches
    assert launch["api"] == ("cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel")
    assert launch["grid"] == (2, 3, 4) and launch["block"] == (64, 2, 1)
    assert launch["shared_mem"] == 128 and launch["stream"] == 77
    # unsigned values of signed types arrive as their two's complement
    assert launch["params"] == [0xFFFF_8000_1234_5678, -5, -1, 40000 - 65536, -3, 2.5, 1.25]


def test_marshal_params_layout():
    array, keep = driver_mod.marshal_params([("i8", -1), ("ptr", 1 << 63), ("f32", 0.5)])
    assert len(array) == 3 and len(keep) == 3
    assert [ctypes.sizeof(k) for k in keep] == [1, 8, 4]
    assert ctypes.c_int8.from_address(array[0]).value == -1
    assert ctypes.c_uint64.from_address(array[1]).value == 1 << 63
    assert ctypes.c_float.from_address(array[2]).value == 0.5
    assert driver_mod.marshal_params([]) == (None, [])
    with pytest.raises(ValueError, match="does not fit a i8"):
        driver_mod.marshal_params([("i8", 300)])
    with pytest.raises(ValueError, match="unknown kernel parameter type 'i128'"):
        driver_mod.marshal_params([("i128", 1)])


def test_arg_table_accepts_the_values_a_direct_launch_accepts():
    # Unsigned spellings of signed parameters: the same bits in the argument table as in kernelParams.
    types, values = ("i32", "i8", "ptr"), [0xFFFFFFFF, 0x80, 1 << 63]
    record = kernel_abi.pack_record(types, values)
    array, _ = driver_mod.marshal_params(list(zip(types, values)))
    offsets, _ = kernel_abi.arg_table_layout(types)
    for t, off, addr in zip(types, offsets, array):
        size = kernel_abi.PARAM_SIZES[t]
        assert record[off:off + size] == ctypes.string_at(addr, size)
    with pytest.raises(ValueError, match="does not fit a i32"):
        kernel_abi.pack_record(("i32",), [1 << 32])


def test_kernel_without_params_passes_null(fake_cuda, gpu):
    gpu.kernels["noargs"] = ()
    drv = get_driver("nvvm")
    drv.launch(drv.load_module(b"x").function("noargs"), (1, 1, 1), (1, 1, 1), [])
    assert gpu.launches[0]["params"] == [] and gpu.launches[0]["stream"] == 0


def test_ptx_is_nul_terminated_and_elf_untouched(fake_cuda, gpu):
    drv = get_driver("nvvm")
    drv.load_module(b".version 7.8")
    drv.load_module(b".version 7.8\0")
    drv.load_module(b"\x7fELFcubin")
    assert gpu.images == [b".version 7.8\0", b".version 7.8\0", b"\x7fELFcubin"]


def test_failing_call_raises_driver_error(fake_cuda, gpu):
    gpu.fail["cuMemAlloc"] = CUresult.CUDA_ERROR_OUT_OF_MEMORY
    drv = get_driver("nvvm")
    with pytest.raises(DriverError) as info:
        drv.malloc(1 << 40)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.call == "cuMemAlloc" and err.error_name == "CUDA_ERROR_OUT_OF_MEMORY" and err.code == 2
    assert str(err) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"


def test_missing_function_and_global_name_the_call(fake_cuda, gpu):
    drv = get_driver("nvvm")
    mod = drv.load_module(b"x")
    with pytest.raises(DriverError, match="cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"):
        mod.function("nope")
    with pytest.raises(DriverError, match="cuModuleGetGlobal failed: CUDA_ERROR_NOT_FOUND .*named symbol not found"):
        mod.global_address("nope")


def test_no_cuda_driver_library(fake_cuda):
    def broken(*_):
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    fake_cuda.cuInit = broken
    with pytest.raises(DriverError, match="cuInit failed: CUDA_DRIVER_UNAVAILABLE.*libcuda"):
        get_driver("nvvm").malloc(8)


def test_copies_memset_and_sync(fake_cuda, gpu):
    drv = get_driver("nvvm")
    p = drv.malloc(64)
    drv.memcpy_htod(p, b"abcdef")
    drv.memcpy_htod(p + 8, b"xyz", stream=5)
    drv.memset_d8(p + 16, 0x5A, 4, stream=5)
    assert drv.memcpy_dtoh(p, 20) == b"abcdef\0\0xyz\0\0\0\0\0ZZZZ"
    assert drv.memcpy_dtoh(p, 3, stream=9) == b"abc"
    names = [c[0] for c in gpu.calls]
    assert names[-2:] == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]  # synchronizes that stream
    assert gpu.calls[-1] == ("cuStreamSynchronize", 9)
    drv.free(p)
    assert p not in gpu.memory


def test_occupancy_sm_count_and_ipc(fake_cuda, gpu):
    gpu.kernels["k"] = ()
    drv = get_driver("nvvm")
    fn = drv.load_module(b"x").function("k")
    gpu.occupancy, gpu.sm_count = 7, 132
    assert drv.max_active_blocks_per_sm(fn, 256, 1024) == 7
    assert ("cuOccupancyMaxActiveBlocksPerMultiprocessor", "k", 256, 1024) in gpu.calls
    assert drv.multiprocessor_count() == 132
    p = drv.malloc(4096)
    handle = drv.ipc_get_mem_handle(p)
    assert isinstance(handle, bytes) and len(handle) == 64
    mapped = drv.ipc_open_mem_handle(handle)
    assert gpu.ipc_maps[mapped] == p
    opened = [c for c in gpu.calls if c[0] == "cuIpcOpenMemHandle"][0]
    assert opened[1] == handle and opened[2] == 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    drv.ipc_close_mem_handle(mapped)
    assert gpu.calls[-1] == ("cuIpcCloseMemHandle", mapped)
    with pytest.raises(ValueError, match="64 bytes"):
        drv.ipc_open_mem_handle(b"short")


def test_peer_access_query(fake_cuda, fake_hip, gpu):
    gpu.peers = {2}
    for backend, call in (("nvvm", "cuDeviceCanAccessPeer"), ("rocdl", "hipDeviceCanAccessPeer")):
        drv = get_driver(backend)
        assert drv.can_access_peer(drv.device)  # the same GPU: no driver call needed
        assert not any(c[0] == call for c in gpu.calls)
        assert drv.can_access_peer(2) and not drv.can_access_peer(1)
        assert (call, 0, 2) in gpu.calls and (call, 0, 1) in gpu.calls


def test_current_stream_falls_back_to_0_without_torch(fake_cuda):
    assert get_driver("nvvm").current_stream() == 0


def test_current_stream_uses_torch(monkeypatch, fake_cuda):
    stream = types.SimpleNamespace(cuda_stream=0x1234)
    cuda_ns = types.SimpleNamespace(is_available=lambda: True, current_stream=lambda: stream,
                                    init=lambda: None, current_device=lambda: 0, set_device=lambda d: None)  # fmt: skip
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = cuda_ns
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert get_driver("nvvm").current_stream() == 0x1234
    cuda_ns.is_available = lambda: False
    assert get_driver("nvvm").current_stream() == 0


# ---- the HIP driver ---------------------------------------------------------------------------------


def test_hip_launch_marshalling_and_cooperative(fake_hip, gpu):
    gpu.kernels["k"] = ALL_TYPES
    drv = get_driver("rocdl")
    fn = drv.load_module(b"\x7fELF").function("k")
    assert gpu.images == [b"\x7fELF"]  # code objects are loaded as they are
    values = [0x1000, 1 << 40, -7, 7, 127, -0.5, 3.0]
    drv.launch(fn, (1, 1, 8), (64, 1, 1), list(zip(ALL_TYPES, values)), stream=3)
    drv.launch(fn, (1, 1, 8), (64, 1, 1), list(zip(ALL_TYPES, values)), cooperative=True)
    assert [lc["api"] for lc in gpu.launches] == ["hipModuleLaunchKernel", "hipModuleLaunchCooperativeKernel"]
    assert gpu.launches[0]["params"] == values and gpu.launches[0]["stream"] == 3
    assert drv.max_active_blocks_per_sm(fn, 64) == gpu.occupancy
    assert drv.multiprocessor_count() == gpu.sm_count


def test_hip_without_cooperative_launch(monkeypatch, gpu):
    _install_hip(monkeypatch, gpu, cooperative=False)
    gpu.kernels["k"] = ()
    drv = get_driver("rocdl")
    fn = drv.load_module(b"\x7fELF").function("k")
    with pytest.raises(DriverError, match="hipModuleLaunchCooperativeKernel failed: NOT_AVAILABLE"):
        drv.launch(fn, (1, 1, 1), (1, 1, 1), [], cooperative=True)


def test_hip_error_and_memory_paths(fake_hip, gpu):
    drv = get_driver("rocdl")
    p = drv.malloc(32)
    drv.memcpy_htod(p, b"hello", stream=2)
    assert drv.memcpy_dtoh(p, 5, stream=2) == b"hello"
    assert gpu.calls[-1] == ("hipStreamSynchronize", 2)
    drv.memset_d8(p, 1, 2)
    assert drv.memcpy_dtoh(p, 5) == b"\1\1llo"
    handle = drv.ipc_get_mem_handle(p)
    assert len(handle) == 64
    drv.ipc_open_mem_handle(handle)
    opened = [c for c in gpu.calls if c[0] == "hipIpcOpenMemHandle"][0]
    assert opened[1] == handle and opened[2] == 1
    gpu.fail["hipMalloc"] = hipError_t.hipErrorOutOfMemory
    with pytest.raises(DriverError, match=r"hipMalloc failed: hipErrorOutOfMemory \(2\): hip says"):
        drv.malloc(8)


# ---- KernelSet: load, state globals, launches -------------------------------------------------------


def _state_of(gpu, ks) -> dict:
    ptr, size = ks.module.global_address(STATE_SYMBOL)
    return unpack_state(gpu.read(ptr, size))


def test_bundle_state_global_is_written_after_load(fake_cuda, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["k"] = ("ptr", "i32")
    bundle = _bundle(tmp_path, [_kernel("k", ("ptr", "i32"))])
    shmem.shmem_init_comm(OneRank(), heap_size=HEAP, driver=get_driver("nvvm"))
    ks = KernelSet(bundle)
    assert gpu.images == [bundle.binary + b"\0"]
    state = _state_of(gpu, ks)
    s = shmem.current_state()
    assert state["rank"] == 0 and state["n_pes"] == 1 and state["flags"] == 0
    assert state["heap_size"] == HEAP and state["wait_limit"] == 0
    assert gpu.read(state["heap_bases"], 8) == s.heap_bases[0].to_bytes(8, "little")
    assert state["wait_report"] == s.wait_report_device and state["sync_words"] == s.heap_bases[0]
    # the copy came after the global lookup, into that global
    names = [c[0] for c in gpu.calls]
    lookup = names.index("cuModuleGetGlobal")
    assert "cuMemcpyHtoD" in names[lookup:]


def test_state_global_needs_shmem_and_stateless_bundle_does_not(fake_cuda, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["k"] = ("i32",)
    with pytest.raises(RuntimeError, match="uses shmem .*initialize it .*before loading the bundle"):
        KernelSet(_bundle(tmp_path, [_kernel("k", ("i32",))]))
    ks = KernelSet(_bundle(tmp_path, [_kernel("k", ("i32",))], state=False, key="e" * 64))
    ks.launch("k", [5], grid=(3,))
    assert gpu.launches[-1]["params"] == [5] and gpu.launches[-1]["grid"] == (3, 1, 1)
    assert gpu.launches[-1]["block"] == (128, 1, 1)  # the bundle's block


def test_launch_validates_arguments(fake_cuda, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    types_ = ("ptr", "i32", "f32")
    gpu.kernels["k"] = types_
    ks = KernelSet(_bundle(tmp_path, [_kernel("k", types_)], state=False))
    cuda_tensor = types.SimpleNamespace(data_ptr=lambda: 0xABC000, is_cuda=True, device="cuda:0")
    cpu_tensor = types.SimpleNamespace(data_ptr=lambda: 0x1, is_cuda=False, device="cpu")
    ks.launch("k", [cuda_tensor, 7, 2], block=(32, 1, 1), stream=11, shared_mem=64)
    assert gpu.launches[-1]["params"] == [0xABC000, 7, 2.0] and gpu.launches[-1]["stream"] == 11
    bad = [
        ([1, 2], r"kernel 'k' takes 3 arguments \(ptr, i32, f32\), got 2"),
        ([1, 2.5, 1.0], r"kernel 'k': parameter 1 \(arg1\) expects i32, got float 2.5"),
        ([cpu_tensor, 1, 1.0], r"parameter 0 \(arg0\) got a tensor on cpu; pointer arguments must be on the GPU"),
        ([1, cuda_tensor, 1.0], r"parameter 1 \(arg1\) expects i32, got a tensor"),
        ([1, 1 << 32, 1.0], r"parameter 1 \(arg1\) expects i32; 4294967296 is out of range"),
        ([-1, 1, 1.0], r"parameter 0 \(arg0\) expects ptr; -1 is out of range"),
        ([1, 1, "x"], r"parameter 2 \(arg2\) expects f32, got str"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            ks.launch("k", args)
    with pytest.raises(ValueError, match="grid must be"):
        ks.launch("k", [1, 1, 1.0], grid=(0, 1, 1))
    assert len(gpu.launches) == 1


def _virtual_setup(gpu, tmp_path, n_pes, types_=("ptr", "i64", "i32"), **kw):
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["vk"] = ("ptr",)  # a virtual-PE kernel takes one pointer: the argument table
    shmem.shmem_init_virtual(n_pes, heap_size=HEAP, driver=get_driver("nvvm"))
    return KernelSet(_bundle(tmp_path, [_kernel("vk", types_, block=(64, 1, 1))], virtual=True), **kw)


def test_virtual_launch_packs_the_argument_table(fake_cuda, gpu, tmp_path):
    ks = _virtual_setup(gpu, tmp_path, 4)
    state = _state_of(gpu, ks)
    assert state["flags"] == FLAG_VIRTUAL_PES and state["n_pes"] == 4 and state["rank"] == 0
    bases = struct.unpack("<4Q", gpu.read(state["heap_bases"], 32))
    assert bases == tuple(shmem.current_state().heap_bases)
    assert all(gpu.read(b, SYNC_RESERVED_BYTES) == bytes(SYNC_RESERVED_BYTES) for b in bases)

    handle = shmem.shmem_malloc(256)
    per_pe = [[shmem.shmem_ptr_p2p(handle, 0, p), -p, 10 * p] for p in range(4)]
    ks.launch_virtual("vk", per_pe, grid=(2, 3), stream=5)
    (launch,) = gpu.launches
    assert launch["api"] == "cuLaunchCooperativeKernel"
    assert launch["grid"] == (2, 3, 4) and launch["block"] == (64, 1, 1) and launch["stream"] == 5
    (table_ptr,) = launch["params"]
    expected = kernel_abi.pack_arg_table(("ptr", "i64", "i32"), per_pe)
    assert gpu.read(table_ptr, len(expected)) == expected
    ks.synchronize()  # releases the table
    assert table_ptr not in gpu.memory


def test_virtual_launch_checks_pe_count_and_args(fake_cuda, gpu, tmp_path):
    ks = _virtual_setup(gpu, tmp_path, 2)
    with pytest.raises(ValueError, match="got arguments for 3 PEs, shmem has 2"):
        ks.launch_virtual("vk", [[0, 0, 0]] * 3)
    with pytest.raises(ValueError, match=r"kernel 'vk' \(PE 1\): parameter 2 \(arg2\) expects i32"):
        ks.launch_virtual("vk", [[0, 0, 0], [0, 0, 0.5]])
    with pytest.raises(ValueError, match="compiled with virtual PEs .*use launch_virtual"):
        ks.launch("vk", [0, 0, 0])
    assert gpu.launches == []


def test_virtual_launch_refuses_more_blocks_than_fit(fake_cuda, gpu, tmp_path):
    ks = _virtual_setup(gpu, tmp_path, 8)
    gpu.occupancy, gpu.sm_count = 2, 4  # 8 co-resident blocks
    ks.launch_virtual("vk", [[0, 0, 0]] * 8, grid=(1, 1))  # 8 blocks: fits
    with pytest.raises(ValueError) as info:
        ks.launch_virtual("vk", [[0, 0, 0]] * 8, grid=(2, 1), block=(256, 1, 1))
    assert str(info.value).startswith("cooperative launch of vk needs 16 co-resident blocks; the GPU fits 8 "
                                      "(occupancy 2 blocks of 256 threads per SM x 4 SMs)")  # fmt: skip
    assert len(gpu.launches) == 1
    assert ("cuOccupancyMaxActiveBlocksPerMultiprocessor", "vk", 256, 0) in gpu.calls


def test_a_kernel_with_collectives_launches_at_most_max_blocks_in_x_only(fake_cuda, gpu, tmp_path):
    """KernelInfo.max_blocks (mori-coll-to-kernels' mori.max_blocks, kept by the bundle): grids (x <= it, 1, 1)
    launch, both direct and virtual; a wider x, or any y or z, is refused before the driver is called."""
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["ck"] = ("ptr",)
    gpu.kernels["vck"] = ("ptr",)
    limited = KernelInfo("ck", (KernelParam("arg0", "ptr"),), (64, 1, 1), (), 4)
    direct = KernelSet(_bundle(tmp_path, [limited], state=False))
    assert direct.bundle.kernel("ck").max_blocks == 4  # through bundle.json
    direct.launch("ck", [0], grid=(4, 1, 1))
    direct.launch("ck", [0], grid=1)
    for grid in ((5, 1, 1), (2, 2, 1), (1, 1, 3)):
        with pytest.raises(ValueError) as info:
            direct.launch("ck", [0], grid=grid)
        assert str(info.value) == (f"kernel 'ck' holds collectives: its grid must be (x, 1, 1) with x in [1, 4] (its "
                                   f"max_blocks: one device-barrier slot row per block), got {grid}")  # fmt: skip
    assert len(gpu.launches) == 2
    shmem.shmem_init_virtual(2, heap_size=HEAP, driver=get_driver("nvvm"))
    vk = KernelInfo("vck", (KernelParam("arg0", "ptr"),), (64, 1, 1), (), 3)
    virtual = KernelSet(_bundle(tmp_path, [vk], virtual=True, key="e" * 64))
    virtual.launch_virtual("vck", [[0], [0]], grid=(3, 1))
    with pytest.raises(ValueError, match=r"kernel 'vck' holds collectives: its grid per PE must be .* got \(4, 1, 1\)"):
        virtual.launch_virtual("vck", [[0], [0]], grid=(4, 1))
    with pytest.raises(ValueError, match=r"got \(1, 2, 1\)"):
        virtual.launch_virtual("vck", [[0], [0]], grid=(1, 2))
    assert len(gpu.launches) == 3


def test_bundle_kinds_must_match_shmem_mode(fake_cuda, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["k"] = ("i32",)
    shmem.shmem_init_virtual(2, heap_size=HEAP, driver=get_driver("nvvm"))
    with pytest.raises(RuntimeError, match="compiled without virtual PEs but shmem runs 2 virtual PEs"):
        KernelSet(_bundle(tmp_path, [_kernel("k", ("i32",))]))
    shmem.shmem_finalize()
    shmem.shmem_init_comm(OneRank(), heap_size=HEAP, driver=get_driver("nvvm"))
    with pytest.raises(RuntimeError, match="compiled with virtual PEs: initialize shmem with shmem_init_virtual"):
        KernelSet(_bundle(tmp_path, [_kernel("k", ("i32",))], virtual=True, key="d" * 64))


def test_state_is_rewritten_after_reinit(fake_cuda, gpu, tmp_path):
    ks = _virtual_setup(gpu, tmp_path, 2)
    shmem.shmem_finalize()
    with pytest.raises(RuntimeError, match="shmem was finalized"):
        ks.launch_virtual("vk", [[0, 0, 0]] * 2)
    shmem.shmem_init_virtual(4, heap_size=HEAP, driver=get_driver("nvvm"))
    ks.launch_virtual("vk", [[0, 0, 0]] * 4)
    assert _state_of(gpu, ks)["n_pes"] == 4 and gpu.launches[-1]["grid"] == (1, 1, 4)


def test_bounded_wait_report_raises_on_synchronize(fake_cuda, gpu, tmp_path, monkeypatch):
    from mori_compiler.runtime.launcher import KernelSet, WaitTimeoutError

    monkeypatch.setenv("MORI_COMPILER_WAIT_LIMIT", "1000")
    ks = _virtual_setup(gpu, tmp_path, 4)
    assert ks.wait_limit == 1000 and _state_of(gpu, ks)["wait_limit"] == 1000
    ks.synchronize()  # no report: fine
    s = shmem.current_state()
    record = struct.pack(WAIT_REPORT_FORMAT, 1, 2, 0, s.heap_bases[3] + 0x900, 1, 0)
    gpu.write(s.wait_report_device, record)
    with pytest.raises(WaitTimeoutError) as info:
        ks.synchronize()
    message = str(info.value)
    assert "after 1000 polls on PE 2" in message
    assert f"0x{s.heap_bases[3] + 0x900:x} (offset 0x900 in PE 3's heap) == 1 (0x1)" in message
    assert "last seen 0" in message
    assert info.value.report["pe"] == 2
    ks.synchronize()  # the report was reset
    ks2 = KernelSet(ks.bundle, wait_limit=5)
    assert _state_of(gpu, ks2)["wait_limit"] == 5
    with pytest.raises(ValueError, match="MORI_COMPILER_WAIT_LIMIT"):
        monkeypatch.setenv("MORI_COMPILER_WAIT_LIMIT", "lots")
        KernelSet(ks.bundle)


def test_hip_kernel_set_end_to_end(fake_hip, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    gpu.kernels["vk"] = ("ptr",)
    shmem.shmem_init_virtual(2, heap_size=HEAP, driver=get_driver("rocdl"))
    ks = KernelSet(_bundle(tmp_path, [_kernel("vk", ("i32",), block=(64, 1, 1))], backend="rocdl", virtual=True))
    ks.launch_virtual("vk", [[1], [2]])
    (launch,) = gpu.launches
    assert launch["api"] == "hipModuleLaunchCooperativeKernel" and launch["grid"] == (1, 1, 2)
    assert gpu.read(launch["params"][0], 16) == kernel_abi.pack_arg_table(("i32",), [[1], [2]])
    assert _state_of(gpu, ks)["n_pes"] == 2


def test_backend_mismatch(fake_cuda, fake_hip, gpu, tmp_path):
    from mori_compiler.runtime.launcher import KernelSet

    with pytest.raises(ValueError, match="is for rocdl, the driver is nvvm"):
        KernelSet(_bundle(tmp_path, [_kernel("k", ())], backend="rocdl", state=False), driver=get_driver("nvvm"))
    gpu.kernels["k"] = ()
    shmem.shmem_init_comm(OneRank(), heap_size=HEAP, driver=get_driver("rocdl"))
    with pytest.raises(RuntimeError, match="shmem was initialized on rocdl"):
        KernelSet(_bundle(tmp_path, [_kernel("k", ())], key="c" * 64))


# ---- the copy-engine calls MORI-IO uses ------------------------------------------------------------


@pytest.mark.parametrize("api", ["cuda", "hip"])
def test_copy_engine_calls(api, request, gpu):
    bindings = request.getfixturevalue(f"fake_{api}")
    drv = get_driver("nvvm" if api == "cuda" else "rocdl")
    prefix = "cu" if api == "cuda" else "hip"
    base = drv.malloc(4096)
    assert drv.address_range(base + 100) == (base, 4096)
    with pytest.raises(DriverError, match="AddressRange"):
        drv.address_range(12345)
    assert drv.device_count() == 2
    expected_bus = "0000:01:00.0" if api == "cuda" else "0000:c1:00.0"
    assert drv.pci_bus_id(1) == expected_bus  # lower-case, NUL and padding cut
    stream, event = drv.stream_create(), drv.event_create()
    assert isinstance(stream, int) and stream
    host = drv.host_alloc(64)
    gpu.write(base, b"copy-engine!")
    drv.memcpy_async(host, base, 12, stream)
    assert gpu.read(host, 12) == b"copy-engine!"
    drv.event_record(event, stream)
    drv.stream_wait_event(stream, event)
    assert drv.event_query(event) is True and drv.stream_query(stream) is True
    bindings.busy = True
    assert drv.event_query(event) is False  # NOT_READY is an answer, not an error
    assert drv.stream_query(stream) is False
    bindings.busy = False
    gpu.fail[f"{prefix}EventQuery"] = 1
    with pytest.raises(DriverError, match="EventQuery"):
        drv.event_query(event)
    del gpu.fail[f"{prefix}EventQuery"]
    drv.event_synchronize(event)
    drv.event_destroy(event)
    drv.stream_destroy(stream)
    drv.host_free(host)
    names = [c[0] for c in gpu.calls]
    create = "cuStreamCreate" if api == "cuda" else "hipStreamCreateWithFlags"
    assert gpu.calls[names.index(create)][1] == 1  # non-blocking
    event_create = "cuEventCreate" if api == "cuda" else "hipEventCreateWithFlags"
    assert gpu.calls[names.index(event_create)][1] == 2  # timing disabled
    if api == "hip":
        assert gpu.calls[names.index("hipMemcpyAsync")][4] == hipMemcpyKind.hipMemcpyDefault


def test_cuda_using_device_pushes_and_pops_the_primary_context(fake_cuda, gpu):
    drv = get_driver("nvvm")
    assert drv.device == 0
    gpu.calls.clear()
    with drv.using_device(0):
        pass
    assert not [c for c in gpu.calls if c[0] in ("cuCtxPushCurrent", "cuCtxPopCurrent")]  # same device: nothing
    with drv.using_device(1):
        assert fake_cuda.current is not None and int(fake_cuda.current) == 0xC0DE + 1
        drv.stream_create()  # inside: the pushed context stays current
        assert int(fake_cuda.current) == 0xC0DE + 1
    assert int(fake_cuda.current) == 0xC0DE
    names = [c[0] for c in gpu.calls]
    assert names.index("cuCtxPushCurrent") < names.index("cuStreamCreate") < names.index("cuCtxPopCurrent")
    assert ("cuDeviceGet", 1) in gpu.calls
    fake_cuda.current = CUcontext(0xC0DE + 1)  # a thread torch set to GPU 1 asks for GPU 1: nothing moves
    gpu.calls.clear()
    with drv.using_device(1):
        pass
    assert not [c for c in gpu.calls if c[0] in ("cuCtxPushCurrent", "cuCtxSetCurrent")]


def test_hip_using_device_sets_and_restores(fake_hip, gpu):
    drv = get_driver("rocdl")
    with drv.using_device(1):
        assert fake_hip.device == 1
    assert fake_hip.device == 0
    fake_hip.device = 3  # the thread was on another device: that one comes back
    with drv.using_device(1):
        assert fake_hip.device == 1
    assert fake_hip.device == 3


@pytest.mark.parametrize("api", ["cuda", "hip"])
def test_every_new_thread_gets_the_context_even_with_a_reused_ident(api, request, gpu):
    """Thread idents are reused once a thread ends: the driver must not take a new thread for an old one."""
    import threading

    request.getfixturevalue(f"fake_{api}")
    drv = get_driver("nvvm" if api == "cuda" else "rocdl")
    drv.malloc(64)
    call = "cuCtxGetCurrent" if api == "cuda" else "hipSetDevice"  # the check a new thread makes
    for _ in range(5):
        before = sum(1 for c in gpu.calls if c[0] == call)
        worker = threading.Thread(target=drv.malloc, args=(64,))
        worker.start()
        worker.join()
        assert sum(1 for c in gpu.calls if c[0] == call) == before + 1


def test_current_stream_of_a_device_uses_torchs_raw_stream_query(monkeypatch, fake_cuda):
    asked = []
    fake_torch = types.ModuleType("torch")
    fake_torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: asked.append(d) or 0x5678)
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: True, init=lambda: None, current_device=lambda: 0,
                                            set_device=lambda d: None,
                                            current_stream=lambda *a: types.SimpleNamespace(cuda_stream=0x1234))  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    drv = get_driver("nvvm")
    assert drv.current_stream(1) == 0x5678 and asked == [1]
    assert drv.current_stream() == 0x1234  # no device named: torch's current device, public API

    def broken(d):
        raise RuntimeError("no CUDA in this torch")

    fake_torch._C._cuda_getCurrentRawStream = broken
    assert drv.current_stream(0) == 0x1234  # falls back to the public path


@pytest.mark.parametrize("api", ["cuda", "hip"])
def test_peer_access_asks_about_the_named_pair(api, request, gpu):
    request.getfixturevalue(f"fake_{api}")
    drv = get_driver("nvvm" if api == "cuda" else "rocdl")
    gpu.peers.add(1)
    gpu.calls.clear()
    assert drv.peer_access(2, 2) is True and not gpu.calls  # the same GPU: no question
    assert drv.peer_access(3, 1) is True
    call = "cuDeviceCanAccessPeer" if api == "cuda" else "hipDeviceCanAccessPeer"
    assert [c[1:] for c in gpu.calls if c[0] == call] == [(3, 1)]  # not the driver's own device 0
    assert drv.peer_access(3, 2) is False
