"""``IOEngine`` and ``IOEngineSession``: MORI-IO's engine with MORI's method names and positional call shapes
(MORI's python/mori/io/engine.py), over the backends that exist here.

Backends: ``BackendType.RDMA`` and ``BackendType.TCP`` are both served by the TCP backend (``tcp_backend``;
there is no RDMA NIC here, and MORI's tests ask for RDMA); the RDMA config's ``qp_per_transfer`` becomes the
number of sockets per remote engine and its ``enable_notification`` (after MORI's ``MORI_IO_*`` environment
overrides) the notices. One engine has one TCP transport: asking for the other of the two types once one
exists is refused. ``XGMI`` (the GPU-IPC backend) is not implemented yet and ``FABRIC``/``Unknown`` are out
of scope: ``create_backend`` refuses them with ``NotImplementedError``.

Memory: CPU memory only for now. ``register_memory`` takes an object with the buffer protocol (bytearray,
numpy array, ...), a CPU torch tensor, or a raw ``int`` address of CPU memory (wrapped with ctypes: the
caller keeps that memory alive and at least ``size`` bytes long until ``deregister_memory``). The engine
keeps a byte view of the first ``size`` bytes, so the buffer stays alive while registered. GPU memory is
refused (``NotImplementedError``) until the GPU-IPC backend comes.

Errors follow MORI: no backend for a pair -> ``ERR_BAD_STATE`` "No available backend found, create
backend first"; an offset+size beyond the local or remote region, batch lists of unequal length, a local
descriptor this engine did not register -> ``ERR_INVALID_ARGS``, set before the call returns; memory the
target does not have (unknown, deregistered, too small) -> ``ERR_INVALID_ARGS`` from the target's answer;
a connection lost mid-transfer -> ``ERR_RDMA_OP``; a target that cannot be reached -> ``RuntimeError`` from
the call that connects (the first transfer towards it).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from typing import Sequence

from . import checks
from .configs import IOEngineConfig, RdmaBackendConfig, TcpBackendConfig
from .descriptors import EngineDesc, MemoryDesc, local_node_id
from .enums import BackendType, MemoryLocationType, StatusCode
from .log import LOGGER
from .status import TransferStatus, wait_all
from .tcp_backend import Region, TcpBackend

NO_BACKEND = "No available backend found, create backend first"
_ROUTE_ORDER = (BackendType.XGMI, BackendType.FABRIC, BackendType.RDMA, BackendType.TCP)
_TCP_TYPES = (BackendType.RDMA, BackendType.TCP)


def _byte_view(buffer, size: int, where: str) -> tuple[memoryview, int]:
    """A writable byte view of the first ``size`` bytes of ``buffer`` and its address."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"{where}: expected an int address, an object with the buffer protocol or a torch "
                        f"tensor, not {type(buffer).__name__}") from None  # fmt: skip
    if view.readonly:
        raise ValueError(f"{where}: the buffer is read-only (a transfer could not write into it)")
    if not view.c_contiguous:
        raise ValueError(f"{where}: the buffer is not contiguous")
    view = view.cast("B") if (view.format != "B" or view.ndim != 1) else view
    if size > view.nbytes:
        raise ValueError(f"{where}: size {size} is larger than the buffer ({view.nbytes} bytes)")
    view = view[:size]
    address = ctypes.addressof(ctypes.c_char.from_buffer(view)) if size else 0
    return view, address


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
        self._backends: dict[BackendType, TcpBackend] = {}
        self._regions: dict[int, Region] = {}
        self._memories: dict[int, MemoryDesc] = {}
        self._regions_lock = threading.Lock()
        self._next_mem_id = itertools.count()
        self._uid_lock = threading.Lock()
        self._next_uid = 0

    # ---- engine and backends ----

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def create_backend(self, backend_type, config=None) -> None:
        backend_type = checks.member("create_backend type", backend_type, BackendType)
        if backend_type in self._backends:
            LOGGER.warning("IOEngine %r: backend %s already exists; create_backend ignored", self._key,
                           backend_type.name)  # fmt: skip
            return
        if backend_type not in _TCP_TYPES:
            later = " (the GPU-IPC backend is a later step)" if backend_type is BackendType.XGMI else ""
            raise NotImplementedError(f"create_backend: backend {backend_type.name} is not implemented yet{later}; "
                                      "available: RDMA and TCP (both over TCP sockets)")  # fmt: skip
        if any(t in self._backends for t in _TCP_TYPES):
            other = next(t for t in _TCP_TYPES if t in self._backends)
            raise RuntimeError(f"create_backend({backend_type.name}): this engine already has the {other.name} "
                               "backend, which uses the same TCP transport; one of the two per engine")  # fmt: skip
        tcp_config = self._tcp_config(backend_type, config)
        if self._config.port == 1:
            raise RuntimeError("create_backend: IOEngineConfig.port 1 is reserved (MORI's sentinel for "
                               "'no RDMA here'); use 0 for an ephemeral port or another one")  # fmt: skip
        backend = TcpBackend(self._key, self._config.host, self._config.port, tcp_config, self._regions,
                             self._regions_lock)  # fmt: skip
        self._backends[backend_type] = backend
        self._desc = self._desc._replace(port=backend.port)

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
        LOGGER.info("IOEngine: the RDMA backend is served by the TCP transport (no RDMA NIC is used)")
        return TcpBackendConfig(num_connections=config.qp_per_transfer, enable_notification=config.enable_notification)

    def remove_backend(self, backend_type) -> None:
        backend_type = checks.member("remove_backend type", backend_type, BackendType)
        backend = self._backends.pop(backend_type, None)
        if backend is not None:
            backend.close()

    def register_remote_engine(self, desc: EngineDesc) -> None:
        self._check_engine_desc("register_remote_engine", desc)
        for backend in self._backends.values():
            backend.register_remote_engine(desc)

    def deregister_remote_engine(self, desc: EngineDesc) -> None:
        self._check_engine_desc("deregister_remote_engine", desc)
        for backend in self._backends.values():
            backend.deregister_remote_engine(desc)

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- memory ----

    def register_memory(self, ptr, size, device_id, mem_loc) -> MemoryDesc:
        """Register ``size`` bytes of CPU memory: ``ptr`` is a buffer, a CPU torch tensor or an int address."""
        size = checks.integer("register_memory size", size, *checks.U64)
        device_id = checks.integer("register_memory device_id", device_id, *checks.I32)
        mem_loc = checks.member("register_memory mem_loc", mem_loc, MemoryLocationType)
        if mem_loc is not MemoryLocationType.CPU:
            raise NotImplementedError(f"register_memory: {mem_loc.name} memory is not supported yet (CPU memory "
                                      "only; GPU memory comes with the GPU-IPC backend)")  # fmt: skip
        owner = ptr
        if _is_torch_tensor(ptr):
            return self._register_tensor(ptr, size)
        if isinstance(ptr, int) and not isinstance(ptr, bool):
            if ptr <= 0 or size == 0:
                raise ValueError(f"register_memory: address {ptr:#x} with size {size}: need a non-null address "
                                 "and a positive size")  # fmt: skip
            owner = (ctypes.c_char * size).from_address(ptr)
        view, address = _byte_view(owner, size, "register_memory")
        return self._add_region(view, address, owner, device_id)

    def register_torch_tensor(self, tensor) -> MemoryDesc:
        if not _is_torch_tensor(tensor):
            raise TypeError(f"register_torch_tensor takes a torch.Tensor, not {type(tensor).__name__}")
        return self._register_tensor(tensor, _tensor_nbytes(tensor))

    def _register_tensor(self, tensor, size: int) -> MemoryDesc:
        if not tensor.is_contiguous():
            raise RuntimeError("register_torch_tensor: the tensor is not contiguous")
        kind = tensor.device.type
        if kind == "cuda":
            raise NotImplementedError("register_torch_tensor: GPU tensors are not supported yet (they come with "
                                      "the GPU-IPC backend); CPU tensors only")  # fmt: skip
        if kind != "cpu":
            raise KeyError(kind)  # MORI: a device type other than cpu/cuda is a KeyError
        if size > _tensor_nbytes(tensor):
            raise ValueError(f"register_memory: size {size} is larger than the tensor ({_tensor_nbytes(tensor)} bytes)")
        address = tensor.data_ptr()
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B") if size else memoryview(bytearray())
        return self._add_region(view, address, tensor, -1)

    def _add_region(self, view: memoryview, address: int, owner, device_id: int) -> MemoryDesc:
        mem_id = next(self._next_mem_id)
        desc = MemoryDesc._from_fields(engine_key=self._key, id=mem_id, device_id=device_id, data=address,
                                       size=view.nbytes, loc=MemoryLocationType.CPU)  # fmt: skip
        with self._regions_lock:
            self._regions[mem_id] = Region(view, owner)
            self._memories[mem_id] = desc
        return desc

    def deregister_memory(self, desc: MemoryDesc) -> None:
        if not isinstance(desc, MemoryDesc):
            raise TypeError(f"deregister_memory takes a MemoryDesc, not {type(desc).__name__}")
        if desc.engine_key != self._key:
            return
        with self._regions_lock:
            if self._memories.get(desc.id) == desc:
                del self._memories[desc.id]
                del self._regions[desc.id]

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
        backend = self._route(remote_mem)
        if backend is None:
            return None
        backend.check_remote_memory(remote_mem.engine_key, remote_mem.id, remote_mem.size)
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

    def _route(self, remote: MemoryDesc):
        for backend_type in _ROUTE_ORDER:
            backend = self._backends.get(backend_type)
            if backend is not None and backend.can_handle(remote.engine_key):
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
        backend = self._route(remote)
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
            backend = self._route(remote)
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
            known = region is not None and self._memories.get(local.id) == local
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
            backend.transfer(kind, remote.engine_key, remote.id, _merge(l_offs, r_offs, sizes), region, uid,
                             status.Update)  # fmt: skip
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
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{where} must be a list, not {type(value).__name__}")
    return list(value)


def _is_torch_tensor(value) -> bool:
    torch = __import__("sys").modules.get("torch")  # torch is never imported here: a tensor implies it is loaded
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor_nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()
