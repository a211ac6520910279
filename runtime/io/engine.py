"""``IOEngine`` and ``IOEngineSession``: MORI-IO's engine with MORI's method names and positional call shapes
(MORI's python/mori/io/engine.py), over the backends that exist here.

Backends (at most one per type, as MORI):

* ``BackendType.RDMA`` and ``BackendType.TCP``: the TCP backend (``tcp_backend``). There is no RDMA NIC
  here and MORI's tests ask for RDMA, so RDMA is served by TCP with a logged warning (the RDMA config's
  ``qp_per_transfer`` becomes the number of sockets per remote engine, its ``enable_notification``, after
  MORI's ``MORI_IO_*`` overrides, the notices); ``MORI_IO_RDMA_OVER_TCP=0`` refuses instead. One engine has
  one TCP transport: asking for the other of the two types once one exists is refused.
* ``BackendType.XGMI``: the GPU-IPC backend (``gpu_ipc_backend``), GPU memory of engines on one node.
  After the RDMA/TCP backend is created it is also added automatically when ``MORI_DISABLE_AUTO_XGMI``
  starts with ``0`` and the host has a GPU (MORI's reading of that variable: auto-XGMI is off otherwise).
* ``FABRIC``/``Unknown``: out of scope; ``create_backend`` refuses them with ``NotImplementedError``.

Route (MORI's ``SelectBackend``): per (local, remote) memory pair, GPU-IPC if it can handle the pair, else
RDMA/TCP; the choice is cached per (remote engine, both locations, devices and ids) and the cache is
cleared when a backend or a remote engine is added or removed. Backends created after a memory or a remote
engine was registered do not learn about them (MORI does not replay either); a warning says so for GPU
memory registered before the GPU-IPC backend.

Memory (``regions``): CPU memory (a buffer, a CPU tensor, an int address) and GPU memory (a GPU tensor, or
an int device address with its ``device_id``, checked against the driver allocation containing it).

Errors follow MORI: no backend for a pair -> ``ERR_BAD_STATE`` "No available backend found, create
backend first"; an offset+size beyond the local or remote region, batch lists of unequal length, a local
descriptor this engine did not register -> ``ERR_INVALID_ARGS``, set before the call returns (MORI does not
check bounds for XGMI; we do for every backend); memory the target does not have (unknown, deregistered,
too small) -> ``ERR_INVALID_ARGS`` from the target's answer (TCP) or ``ERR_BAD_STATE`` (GPU IPC: it cannot be
mapped); a connection lost mid-transfer -> ``ERR_RDMA_OP``; a driver failure -> ``ERR_GPU_OP``; a target
that cannot be reached -> ``RuntimeError`` from the call that connects (the first transfer towards it).
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket
import threading
import weakref
from typing import Sequence

from . import checks
from .configs import IOEngineConfig, RdmaBackendConfig, TcpBackendConfig, XgmiBackendConfig
from .descriptors import EngineDesc, MemoryDesc, local_node_id
from .enums import BackendType, MemoryLocationType, StatusCode
from .gpu import Devices, io_driver
from .gpu_ipc_backend import GpuIpcBackend
from .log import LOGGER
from .regions import Region, cpu_region, gpu_region, is_torch_tensor, tensor_nbytes
from .status import TransferStatus, wait_all
from .tcp_backend import TcpBackend

NO_BACKEND = "No available backend found, create backend first"
_ROUTE_ORDER = (BackendType.XGMI, BackendType.FABRIC, BackendType.RDMA, BackendType.TCP)
_TCP_TYPES = (BackendType.RDMA, BackendType.TCP)
AUTO_XGMI_ENV = "MORI_DISABLE_AUTO_XGMI"  # auto-XGMI is on only when set and starting with "0" (MORI)
RDMA_OVER_TCP_ENV = "MORI_IO_RDMA_OVER_TCP"  # ours: "0" refuses BackendType.RDMA instead of serving it by TCP


RDMA_SYSFS = "/sys/class/infiniband"  # where Linux lists RDMA devices (mlx5_0, rdma0, ...)


def rdma_devices() -> list[str]:
    """The RDMA devices this host lists (for the RDMA-over-TCP warning: it names them when there are)."""
    try:
        return sorted(os.listdir(RDMA_SYSFS))
    except OSError:
        return []


def auto_xgmi_enabled() -> bool:
    return os.environ.get(AUTO_XGMI_ENV, "").startswith("0")


_OPEN_ENGINES: "weakref.WeakSet[IOEngine]" = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    """Close the engines still open at exit (MORI's engines close in their destructors): their threads
    end before the interpreter finalizes, which a daemon thread caught in finalization can abort."""
    for engine in list(_OPEN_ENGINES):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - exiting: nothing left to report to
            pass


class IOEngine:
    """A MORI-IO engine: ``IOEngine(key, config)`` (see the module docstring)."""

    def __init__(self, key: str, config: IOEngineConfig):
        key = checks.string("IOEngine key", key)
        if not key:
            raise ValueError("IOEngine key must be a non-empty string (it names the engine to its peers)")
        if not isinstance(config, IOEngineConfig):
            raise TypeError(f"IOEngine config must be an IOEngineConfig, not {type(config).__name__}")
        self._key, self._config = key, IOEngineConfig(config.host, config.port)
        self._desc = EngineDesc._from_fields(key=key, node_id=local_node_id(), hostname=os.uname().nodename,
                                             host=config.host, port=config.port, pid=os.getpid())  # fmt: skip
        self._backends: dict[BackendType, object] = {}
        self._regions: dict[int, Region] = {}
        self._memories: dict[int, MemoryDesc] = {}
        self._regions_lock = threading.Condition()  # the registry's lock; deregistration waits on it
        self._next_mem_id = itertools.count()
        self._uid_lock = threading.Lock()
        self._next_uid = 0
        self._routes: dict[tuple, BackendType] = {}
        self._driver = None  # the GPU driver and devices, on first use of GPU memory or GPU IPC
        self._devices: Devices | None = None
        _OPEN_ENGINES.add(self)

    # ---- engine and backends ----

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def create_backend(self, backend_type, config=None) -> None:
        backend_type = checks.member("create_backend type", backend_type, BackendType)
        if backend_type in self._backends:
            LOGGER.warning("IOEngine %r: backend %s already exists; create_backend ignored", self._key,
                           backend_type.name)  # fmt: skip
            return
        if backend_type is BackendType.XGMI:
            self._create_gpu_ipc(config)
        elif backend_type in _TCP_TYPES:
            self._create_tcp(backend_type, config)
            if auto_xgmi_enabled() and BackendType.XGMI not in self._backends:
                self._auto_gpu_ipc()
        else:
            raise NotImplementedError(f"create_backend: backend {backend_type.name} is not implemented; "
                                      "available: XGMI (GPU IPC), RDMA and TCP (both over TCP sockets)")  # fmt: skip
        self._routes.clear()

    def _create_tcp(self, backend_type: BackendType, config) -> None:
        if any(t in self._backends for t in _TCP_TYPES):
            other = next(t for t in _TCP_TYPES if t in self._backends)
            raise RuntimeError(f"create_backend({backend_type.name}): this engine already has the {other.name} "
                               "backend, which uses the same TCP transport; one of the two per engine")  # fmt: skip
        tcp_config = self._tcp_config(backend_type, config)
        if self._config.port == 1:
            raise RuntimeError("create_backend: IOEngineConfig.port 1 is reserved (MORI's sentinel for "
                               "'no RDMA here'); use 0 for an ephemeral port or another one")  # fmt: skip
        backend = TcpBackend(self._key, self._config.host, self._config.port, tcp_config, self._regions,
                             self._regions_lock, self._gpu_context)  # fmt: skip
        self._backends[backend_type] = backend
        self._desc = self._desc._replace(port=backend.port)

    def _create_gpu_ipc(self, config) -> None:
        if config is None:
            config = XgmiBackendConfig()
        if not isinstance(config, XgmiBackendConfig):
            raise TypeError(f"create_backend(XGMI) takes an XgmiBackendConfig, not {type(config).__name__}")
        driver, devices = self._gpu_context()
        config = XgmiBackendConfig(config.num_streams, config.num_events)
        self._backends[BackendType.XGMI] = GpuIpcBackend(self._desc, config, driver, devices, self._regions,
                                                         self._regions_lock)  # fmt: skip
        with self._regions_lock:
            earlier = sorted(r.mem_id for r in self._regions.values() if r.on_gpu)
        if earlier:
            LOGGER.warning("IOEngine %r: GPU memory %s was registered before the XGMI backend and has no IPC "
                           "handle; register it again for other processes to reach it by GPU IPC", self._key,
                           earlier)  # fmt: skip

    def _auto_gpu_ipc(self) -> None:
        """MORI's auto-XGMI after an RDMA creation: add the GPU-IPC backend if this host has a GPU."""
        try:
            driver, _ = self._gpu_context()
            has_gpu = driver.device_count() > 0
        except (RuntimeError, NotImplementedError) as exc:
            LOGGER.info("IOEngine %r: %s=0 but no GPU runtime here (%s): no XGMI backend added", self._key,
                        AUTO_XGMI_ENV, exc)  # fmt: skip
            return
        if has_gpu:
            LOGGER.info("IOEngine %r: %s=0: adding the XGMI (GPU IPC) backend", self._key, AUTO_XGMI_ENV)
            self._create_gpu_ipc(None)

    def _gpu_context(self):
        """(driver, devices) of this engine's GPU work, looked up once (RuntimeError without a GPU runtime)."""
        if self._driver is None:
            driver = io_driver()
            self._devices = Devices(driver)
            self._driver = driver
        return self._driver, self._devices

    @staticmethod
    def _tcp_config(backend_type: BackendType, config) -> TcpBackendConfig:
        if backend_type is BackendType.TCP:
            if config is None:
                return TcpBackendConfig()
            if not isinstance(config, TcpBackendConfig):
                raise TypeError(f"create_backend(TCP) takes a TcpBackendConfig, not {type(config).__name__}")
            return TcpBackendConfig(config.num_connections, config.max_frame_payload, config.connect_timeout_ms,
                                    config.io_timeout_ms, config.enable_notification)  # fmt: skip
        if config is None:
            config = RdmaBackendConfig()
        if not isinstance(config, RdmaBackendConfig):
            raise TypeError(f"create_backend(RDMA) takes an RdmaBackendConfig, not {type(config).__name__}")
        config.validate()
        config = config.with_env_overrides()
        config.validate()
        if config.qp_per_transfer > TcpBackendConfig.MAX_CONNECTIONS:
            raise ValueError(f"RdmaBackendConfig.qp_per_transfer {config.qp_per_transfer}: the TCP transport opens "
                             f"that many sockets per remote engine, at most {TcpBackendConfig.MAX_CONNECTIONS}")  # fmt: skip
        devices = rdma_devices()
        where = (f"this host's RDMA devices ({', '.join(devices)}) are not used (the project has no verbs "
                 "transport)" if devices else "this host has no RDMA device")  # fmt: skip
        if os.environ.get(RDMA_OVER_TCP_ENV, "1").strip() == "0":
            raise RuntimeError(f"create_backend(RDMA): {where}, and {RDMA_OVER_TCP_ENV}=0 refuses to serve RDMA "
                               "over TCP; use BackendType.TCP, or unset it")  # fmt: skip
        LOGGER.warning("IOEngine: %s: BackendType.RDMA is served by the TCP transport (%s=0 refuses instead)",
                       where, RDMA_OVER_TCP_ENV)  # fmt: skip
        return TcpBackendConfig(num_connections=config.qp_per_transfer, enable_notification=config.enable_notification)

    def remove_backend(self, backend_type) -> None:
        backend_type = checks.member("remove_backend type", backend_type, BackendType)
        backend = self._backends.pop(backend_type, None)
        self._routes.clear()
        if backend is not None:
            backend.close()

    def register_remote_engine(self, desc: EngineDesc) -> None:
        self._check_engine_desc("register_remote_engine", desc)
        for backend in self._backends.values():
            backend.register_remote_engine(desc)
        self._routes.clear()

    def deregister_remote_engine(self, desc: EngineDesc) -> None:
        self._check_engine_desc("deregister_remote_engine", desc)
        for backend in self._backends.values():
            backend.deregister_remote_engine(desc)
        self._routes.clear()

    @staticmethod
    def _check_engine_desc(where: str, desc) -> None:
        if not isinstance(desc, EngineDesc):
            raise TypeError(f"{where} takes an EngineDesc, not {type(desc).__name__}")

    def close(self) -> None:
        """Stop the backends' threads and close their sockets (ours; MORI's engine does it in its destructor).
        Transfers still outstanding fail with ``ERR_RDMA_OP``."""
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
        self._routes.clear()
        _OPEN_ENGINES.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- memory ----

    def register_memory(self, ptr, size, device_id, mem_loc) -> MemoryDesc:
        """Register ``size`` bytes: CPU memory (a buffer, a CPU tensor, an int address) or GPU memory (a GPU
        tensor, an int device address on GPU ``device_id``); see ``regions``."""
        size = checks.integer("register_memory size", size, *checks.U64)
        device_id = checks.integer("register_memory device_id", device_id, *checks.I32)
        mem_loc = checks.member("register_memory mem_loc", mem_loc, MemoryLocationType)
        if mem_loc is MemoryLocationType.Unknown:
            raise ValueError("register_memory: mem_loc must be MemoryLocationType.CPU or GPU, not Unknown")
        if is_torch_tensor(ptr):
            on_gpu = ptr.device.type != "cpu"
            if on_gpu != (mem_loc is MemoryLocationType.GPU):
                raise ValueError(f"register_memory: a {ptr.device.type} tensor registered as {mem_loc.name} memory")
            if on_gpu and device_id != ptr.device.index:
                raise ValueError(f"register_memory: device_id {device_id} but the tensor is on {ptr.device}")
            return self._register_tensor(ptr, size)
        mem_id = next(self._next_mem_id)
        if mem_loc is MemoryLocationType.GPU:
            driver, _ = self._gpu_context()
            region = gpu_region(mem_id, ptr, size, device_id, driver, "register_memory")
        else:
            region = cpu_region(mem_id, ptr, size, "register_memory")
        return self._add_region(region)

    def register_torch_tensor(self, tensor) -> MemoryDesc:
        if not is_torch_tensor(tensor):
            raise TypeError(f"register_torch_tensor takes a torch.Tensor, not {type(tensor).__name__}")
        return self._register_tensor(tensor, tensor_nbytes(tensor))

    def _register_tensor(self, tensor, size: int) -> MemoryDesc:
        if not tensor.is_contiguous():
            raise RuntimeError("register_torch_tensor: the tensor is not contiguous")
        kind = tensor.device.type
        if kind not in ("cpu", "cuda"):
            raise KeyError(kind)  # MORI: a device type other than cpu/cuda is a KeyError
        if size > tensor_nbytes(tensor):
            raise ValueError(f"register_memory: size {size} is larger than the tensor ({tensor_nbytes(tensor)} bytes)")
        mem_id = next(self._next_mem_id)
        if kind == "cuda":
            driver, _ = self._gpu_context()
            region = gpu_region(mem_id, tensor, size, tensor.device.index, driver, "register_torch_tensor")
        else:
            region = cpu_region(mem_id, tensor, size, "register_torch_tensor")
        return self._add_region(region)

    def _add_region(self, region: Region) -> MemoryDesc:
        bus_id = self._devices.bus_id(region.device) if region.on_gpu else ""
        desc = MemoryDesc._from_fields(engine_key=self._key, id=region.mem_id, device_id=region.device,
                                       device_bus_id=bus_id, data=region.address, size=region.size,
                                       loc=region.location)  # fmt: skip
        for backend in self._backends.values():
            desc = backend.annotate_memory(desc, region)
        with self._regions_lock:
            self._regions[region.mem_id] = region
            self._memories[region.mem_id] = desc
        return desc

    def deregister_memory(self, desc: MemoryDesc) -> None:
        if not isinstance(desc, MemoryDesc):
            raise TypeError(f"deregister_memory takes a MemoryDesc, not {type(desc).__name__}")
        if desc.engine_key != self._key:
            return
        with self._regions_lock:
            if self._memories.get(desc.id) != desc:
                return
            del self._memories[desc.id]
            region = self._regions.pop(desc.id)
            self._wait_unused(region)
        for backend in self._backends.values():
            backend.forget_memory(desc.id)
        self._routes = {k: v for k, v in list(self._routes.items()) if desc.id not in (k[5], k[6])}

    def _wait_unused(self, region: Region) -> None:
        """Return only once no peer's frame uses ``region`` (call with the registry's lock held): after
        ``deregister_memory`` no byte lands in it or is read from it, as after an RDMA deregistration. A
        peer stalled inside such a frame has its connection shut down (its transfer fails)."""
        if self._regions_lock.wait_for(lambda: region.users == 0, timeout=1.0):
            return
        for holder in list(region.holders):
            try:
                holder.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not self._regions_lock.wait_for(lambda: region.users == 0, timeout=10.0):
            LOGGER.error("IOEngine %r: memory %d is still in use by a peer after deregistration", self._key,
                         region.mem_id)  # fmt: skip

    def allocate_transfer_uid(self) -> int:
        with self._uid_lock:
            uid, self._next_uid = self._next_uid, (self._next_uid + 1) & 0xFFFF_FFFF
        return uid

    # ---- transfers ----

    def read(self, local_dest, local_offset, remote_src, remote_offset, size, transfer_uid) -> TransferStatus:
        return self._single("read", local_dest, local_offset, remote_src, remote_offset, size, transfer_uid)

    def write(self, local_src, local_offset, remote_dest, remote_offset, size, transfer_uid) -> TransferStatus:
        return self._single("write", local_src, local_offset, remote_dest, remote_offset, size, transfer_uid)

    def batch_read(self, local_dests, local_offsets, remote_srcs, remote_offsets, sizes, transfer_uids):
        return self._batch("read", local_dests, local_offsets, remote_srcs, remote_offsets, sizes, transfer_uids)

    def batch_write(self, local_srcs, local_offsets, remote_dests, remote_offsets, sizes, transfer_uids):
        return self._batch("write", local_srcs, local_offsets, remote_dests, remote_offsets, sizes, transfer_uids)

    def create_session(self, local_mem: MemoryDesc, remote_mem: MemoryDesc):
        """An ``IOEngineSession`` for the pair, or None when no backend can handle it (MORI's behaviour).
        Like MORI's RDMA backend, it asks the target about the remote region: ``RuntimeError`` when the target
        cannot be reached or does not have it registered with at least the descriptor's size."""
        _check_mem("create_session local_mem", local_mem)
        _check_mem("create_session remote_mem", remote_mem)
        backend = self._route(local_mem, remote_mem)
        if backend is None or not backend.prepare_session(local_mem, remote_mem):
            return None
        return IOEngineSession(self, backend, local_mem, remote_mem)

    def pop_inbound_transfer_status(self, remote_key, transfer_uid):
        """A ``SUCCESS`` status once every notified part of ``transfer_uid`` from engine ``remote_key`` has
        arrived, else None. A peek: the entry stays (MORI's semantics; reusing a uid keeps it complete)."""
        remote_key = checks.string("pop_inbound_transfer_status remote_key", remote_key)
        transfer_uid = checks.integer("pop_inbound_transfer_status transfer_uid", transfer_uid, *checks.U64)
        for backend in self._backends.values():
            if backend.pop_inbound(remote_key, transfer_uid):
                status = TransferStatus()
                status.SetCode(StatusCode.SUCCESS)
                return status
        return None

    @staticmethod
    def wait_all(statuses, timeout_ms: int = -1) -> StatusCode:
        return wait_all(statuses, timeout_ms)

    def _route(self, local: MemoryDesc, remote: MemoryDesc):
        """The backend for the pair: the cached choice if it still can handle it, else the first of
        GPU IPC, RDMA/TCP that can (MORI's order); None when none can."""
        key = (remote.engine_key, local.loc, remote.loc, local.device_id, remote.device_id, local.id, remote.id)
        cached = self._backends.get(self._routes.get(key))
        if cached is not None and cached.can_handle(local, remote):
            return cached
        for backend_type in _ROUTE_ORDER:
            backend = self._backends.get(backend_type)
            if backend is not None and backend.can_handle(local, remote):
                self._routes[key] = backend_type
                return backend
        return None

    def _single(self, kind, local, local_offset, remote, remote_offset, size, uid) -> TransferStatus:
        _check_mem(f"{kind} local", local)
        _check_mem(f"{kind} remote", remote)
        offsets = [_u64(f"{kind} local_offset", local_offset)]
        remote_offsets = [_u64(f"{kind} remote_offset", remote_offset)]
        sizes = [_u64(f"{kind} size", size)]
        uid = _u64(f"{kind} transfer_uid", uid)
        status = TransferStatus()
        backend = self._route(local, remote)
        if backend is None:
            status.SetCode(StatusCode.ERR_BAD_STATE, NO_BACKEND)
            return status
        self._issue(backend, kind, local, offsets, remote, remote_offsets, sizes, uid, status)
        return status

    def _batch(self, kind, locals_, local_offsets, remotes, remote_offsets, sizes, uids) -> list:
        lists = [_list(f"batch_{kind} {name}", value) for name, value in
                 (("local descs", locals_), ("local_offsets", local_offsets), ("remote descs", remotes),
                  ("remote_offsets", remote_offsets), ("sizes", sizes), ("transfer_uids", uids))]  # fmt: skip
        if len({len(x) for x in lists}) != 1:
            raise ValueError(f"batch_{kind}: the six lists must have equal lengths, got {[len(x) for x in lists]}")
        statuses = [TransferStatus() for _ in lists[0]]
        for i, (local, l_offs, remote, r_offs, sz, uid) in enumerate(zip(*lists)):
            _check_mem(f"batch_{kind} local descs[{i}]", local)
            _check_mem(f"batch_{kind} remote descs[{i}]", remote)
            backend = self._route(local, remote)
            if backend is None:
                statuses[i].SetCode(StatusCode.ERR_BAD_STATE, NO_BACKEND)
                return statuses  # MORI returns here, leaving the later statuses at INIT
            self._issue_lists(backend, kind, local, l_offs, remote, r_offs, sz,
                              _u64(f"batch_{kind} transfer_uids[{i}]", uid), statuses[i], f"batch_{kind}[{i}]")  # fmt: skip
        return statuses

    def _issue_lists(self, backend, kind, local, l_offs, remote, r_offs, sizes, uid, status, where):
        l_offs = [_u64(f"{where} local_offsets[{j}]", v) for j, v in enumerate(_list(f"{where} local_offsets", l_offs))]
        r_offs = [_u64(f"{where} remote_offsets[{j}]", v) for j, v in enumerate(_list(f"{where} remote_offsets", r_offs))]
        sizes = [_u64(f"{where} sizes[{j}]", v) for j, v in enumerate(_list(f"{where} sizes", sizes))]
        self._issue(backend, kind, local, l_offs, remote, r_offs, sizes, uid, status)

    def _issue(self, backend, kind, local, l_offs, remote, r_offs, sizes, uid, status: TransferStatus) -> None:
        """Check bounds (synchronous ERR_INVALID_ARGS), merge runs, hand them to the backend."""
        if not len(l_offs) == len(r_offs) == len(sizes):
            status.SetCode(StatusCode.ERR_INVALID_ARGS, f"{kind}: offsets and sizes lists of unequal lengths "
                                                        f"{len(l_offs)}, {len(r_offs)}, {len(sizes)}")  # fmt: skip
            return
        with self._regions_lock:
            region = self._regions.get(local.id) if local.engine_key == self._key else None
            registered = self._memories.get(local.id)
            known = region is not None and (registered is local or registered == local)
        if not known:
            status.SetCode(StatusCode.ERR_INVALID_ARGS, f"{kind}: local memory {local.id} of engine "
                                                        f"{local.engine_key!r} is not registered on this engine "
                                                        f"{self._key!r}")  # fmt: skip
            return
        for j, (lo, ro, n) in enumerate(zip(l_offs, r_offs, sizes)):
            for side, off, desc in (("local", lo, local), ("remote", ro, remote)):
                if off + n > desc.size:
                    status.SetCode(StatusCode.ERR_INVALID_ARGS,
                                   f"{kind} entry {j}: {side} range [{off}, {off + n}) is outside the "
                                   f"{desc.size}-byte region {desc.id} of engine {desc.engine_key!r}")  # fmt: skip
                    return
        status.SetCode(StatusCode.IN_PROGRESS)
        try:
            backend.transfer(kind, region, remote, _merge(l_offs, r_offs, sizes), uid, status)
        except RuntimeError as exc:
            status.SetCode(StatusCode.ERR_RDMA_OP, str(exc))
            raise


class IOEngineSession:
    """Transfers between one (local, remote) memory pair on one backend (``IOEngine.create_session``).
    ``batch_read``/``batch_write`` return one status for the whole batch."""

    def __init__(self, engine: IOEngine, backend, local_mem: MemoryDesc, remote_mem: MemoryDesc):
        self._engine, self._backend, self._local, self._remote = engine, backend, local_mem, remote_mem

    def allocate_transfer_uid(self) -> int:
        return self._engine.allocate_transfer_uid()

    def read(self, local_offset, remote_offset, size, transfer_uid) -> TransferStatus:
        return self._one("read", [local_offset], [remote_offset], [size], transfer_uid)

    def write(self, local_offset, remote_offset, size, transfer_uid) -> TransferStatus:
        return self._one("write", [local_offset], [remote_offset], [size], transfer_uid)

    def batch_read(self, local_offsets, remote_offsets, sizes, transfer_uid) -> TransferStatus:
        return self._one("read", local_offsets, remote_offsets, sizes, transfer_uid)

    def batch_write(self, local_offsets, remote_offsets, sizes, transfer_uid) -> TransferStatus:
        return self._one("write", local_offsets, remote_offsets, sizes, transfer_uid)

    def alive(self) -> bool:
        return True  # as MORI's RDMA and XGMI sessions

    def _one(self, kind, l_offs, r_offs, sizes, uid) -> TransferStatus:
        status = TransferStatus()
        self._engine._issue_lists(self._backend, kind, self._local, l_offs, self._remote, r_offs, sizes,
                                  _u64(f"session {kind} transfer_uid", uid), status, f"session {kind}")  # fmt: skip
        return status


def _merge(l_offs, r_offs, sizes) -> list:
    """Entries sorted by remote offset, remote-contiguous neighbours merged into runs:
    [(remote_offset, [(local_offset, length), ...]), ...]; zero-size entries dropped."""
    runs = []
    end = None
    for ro, lo, n in sorted((ro, lo, n) for lo, ro, n in zip(l_offs, r_offs, sizes) if n):
        if runs and ro == end:
            pieces = runs[-1][1]
            last_lo, last_n = pieces[-1]
            if last_lo + last_n == lo:
                pieces[-1] = (last_lo, last_n + n)
            else:
                pieces.append((lo, n))
        else:
            runs.append((ro, [(lo, n)]))
        end = ro + n
    return runs


def _check_mem(where: str, desc) -> None:
    if not isinstance(desc, MemoryDesc):
        raise TypeError(f"{where} must be a MemoryDesc, not {type(desc).__name__}")


def _u64(where: str, value) -> int:
    return checks.integer(where, value, *checks.U64)


def _list(where: str, value) -> list:
    if type(value) is list:
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{where} must be a list, not {type(value).__name__}")
    return list(value)
