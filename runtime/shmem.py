"""The ``mori.shmem``-compatible host API: symmetric memory for the project's device library.

A *PE* is one participant; every PE owns a *symmetric heap* of ``MORI_SHMEM_HEAP_SIZE`` bytes (default 1 GiB
per PE), and a symmetric object lives at the same offset in every PE's heap. Two modes:

* **multi-process** (``shmem_torch_process_group_init`` / ``shmem_init_attr`` / ``shmem_init_from_env``):
  one PE per process, on the same or different GPUs of one host; the processes exchange IPC handles with
  ``torch.distributed.all_gather_object`` and map every peer's heap. Peers on other hosts stay unmapped
  (``shmem_ptr_p2p`` → 0): there is no RDMA transport. ``torch.distributed`` must be initialized, and each
  process must have selected its GPU (``torch.cuda.set_device``) before init.
* **virtual** (``shmem_init_virtual(n_pes)``, this project's extension): N PEs in this one process on one
  GPU, for testing multi-PE kernels on a single GPU. ``shmem_malloc`` returns PE 0's address of the object
  (the symmetric handle); ``shmem_ptr_p2p(ptr, 0, p)`` gives PE p's copy; ``shmem_mype()`` is 0.

``shmem_malloc`` / ``shmem_free`` are collective in multi-process mode: every PE must call them, in the same
order, with the same sizes and alignments; a mismatch raises on every PE (MORI would corrupt memory
silently). ``shmem_buffer_register`` only records a buffer: registered buffers are not symmetric and cannot
be used with the address-based device API, which works only on heap addresses. Misuse raises
``ShmemError`` (a ValueError) or ``ShmemStateError`` (a RuntimeError) with a message saying what to do.

This module keeps the process-global state and the API over it; the rest lives by concern:

* ``heap_allocator``: the heap size (``MORI_SHMEM_HEAP_SIZE``), alignment and the first-fit allocator;
* ``shmem_comm``: the rendezvous with the other processes (torch.distributed, unique ids, the collective
  checks of init and of malloc/free);
* ``shmem_state``: ``ShmemState``, one initialized shmem: who owns which memory, the virtual-PE layout,
  addresses, allocation, the device state snapshot (``device_state_bytes``, written by runtime/launcher.py);
* ``shmem_tensors``: torch tensor views of symmetric objects;
* ``shmem_errors``: the exceptions.
"""

from __future__ import annotations

import os
import re
import threading

from . import shmem_tensors
from .driver import Driver, default_driver, torch_cuda
from .heap_allocator import heap_size_from_env
from .shmem_comm import UNIQUE_ID_BYTES, TorchComm, new_unique_id, resolve_process_group, torch_distributed
from .shmem_errors import ShmemError, ShmemOutOfMemoryError, ShmemStateError
from .shmem_state import ShmemState

__all__ = [
    "MORI_SHMEM_INIT_WITH_MPI_COMM", "MORI_SHMEM_INIT_WITH_UNIQUEID", "TORCHRUN_VARIABLES", "UNIQUE_ID_BYTES",
    "ShmemError", "ShmemOutOfMemoryError", "ShmemState", "ShmemStateError", "TorchComm",
    "current_state", "device_state_bytes", "heap_size_from_env", "mori_shmem_create_tensor", "read_wait_report",
    "reset_wait_report", "shmem_barrier_all", "shmem_buffer_deregister", "shmem_buffer_register",
    "shmem_finalize", "shmem_free", "shmem_get_unique_id", "shmem_init_attr", "shmem_init_comm",
    "shmem_init_from_env", "shmem_init_virtual", "shmem_malloc", "shmem_malloc_align", "shmem_mype",
    "shmem_npes", "shmem_ptr_p2p", "shmem_tensor", "shmem_torch_process_group_init", "state",
]  # fmt: skip

MORI_SHMEM_INIT_WITH_UNIQUEID = 1
MORI_SHMEM_INIT_WITH_MPI_COMM = 0
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# ---- the process-global state ------------------------------------------------------------------------

_STATE: ShmemState | None = None
_STATE_LOCK = threading.RLock()


def current_state() -> ShmemState | None:
    """The initialized shmem state, or None."""
    return _STATE


def state() -> ShmemState:
    """The initialized shmem state; raises ShmemStateError before init."""
    s = _STATE
    if s is None:
        raise ShmemStateError("shmem is not initialized: call shmem_torch_process_group_init(name), "
                              "shmem_init_attr(...) or shmem_init_virtual(n_pes) first")  # fmt: skip
    return s


def _install(make) -> None:
    global _STATE
    with _STATE_LOCK:
        if _STATE is not None:
            raise ShmemStateError(f"shmem is already initialized ({_STATE.mode}, {_STATE.n_pes} PEs): call "
                                  f"shmem_finalize() before initializing again")  # fmt: skip
        _STATE = make()


def _device_index(device) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    # a torch.device has an index; a str's "index" is its method
    index = None if isinstance(device, str) else getattr(device, "index", None)
    if index is not None:
        return int(index)
    text = str(device)
    m = re.match(r"^(?:cuda|hip)?:?(\d+)$", text)
    if not m:
        raise ShmemError(f"cannot tell which GPU '{device}' is: pass an index or 'cuda:N'")
    return int(m.group(1))


# ---- init and finalize -------------------------------------------------------------------------------


def shmem_init_virtual(n_pes: int, *, device=None, heap_size: int | None = None, driver: Driver | None = None) -> int:
    """Initialize ``n_pes`` virtual PEs in this process on one GPU (``device``: index, 'cuda:N' or a
    torch.device; default the current one). Returns 0."""
    def make():
        drv = driver if driver is not None else default_driver()
        index = _device_index(device)
        if index is not None:
            drv.set_device(index)
        return ShmemState.create_virtual(drv, n_pes, heap_size)

    _install(make)
    return 0


def shmem_init_attr(flags: int, rank: int, nranks: int, unique_id, *, heap_size: int | None = None,
                    driver: Driver | None = None) -> int:  # fmt: skip
    """MORI's ``shmem_init_attr``. Only ``MORI_SHMEM_INIT_WITH_UNIQUEID`` is supported; the rendezvous is
    torch.distributed's WORLD group, which must be initialized with world size ``nranks`` and this process
    at ``rank``. Collective: every rank must call it. Returns 0."""
    if flags != MORI_SHMEM_INIT_WITH_UNIQUEID:
        raise ShmemError(f"shmem_init_attr flags={flags}: only MORI_SHMEM_INIT_WITH_UNIQUEID "
                         f"({MORI_SHMEM_INIT_WITH_UNIQUEID}) is supported (no MPI)")  # fmt: skip
    uid = bytes(unique_id)
    if len(uid) != UNIQUE_ID_BYTES:
        raise ShmemError(f"unique_id must be {UNIQUE_ID_BYTES} bytes (from shmem_get_unique_id()), got {len(uid)}")
    dist = torch_distributed()
    if not dist.is_initialized():
        raise ShmemStateError("shmem_init_attr needs torch.distributed initialized (init_process_group) with "
                              f"world size {nranks}")  # fmt: skip
    comm = TorchComm(None)
    if comm.world_size != nranks or comm.rank != rank:
        raise ShmemStateError(f"shmem_init_attr(rank={rank}, nranks={nranks}) does not match torch.distributed "
                              f"(rank {comm.rank} of world size {comm.world_size})")  # fmt: skip

    def make():
        drv = driver if driver is not None else default_driver()
        return ShmemState.create_multiprocess(drv, comm, heap_size, unique_id=uid)

    _install(make)
    return 0


def shmem_torch_process_group_init(group_name: str, *, heap_size: int | None = None,
                                   driver: Driver | None = None) -> int:  # fmt: skip
    """Initialize over the torch process group registered as ``group_name`` ('default'/'world': WORLD when
    torch.distributed is initialized). Collective over that group. Returns 0."""
    return shmem_init_comm(TorchComm(resolve_process_group(group_name)), heap_size=heap_size, driver=driver)


def shmem_init_from_env(*, heap_size: int | None = None, backend: str = "gloo",
                        driver: Driver | None = None) -> int:  # fmt: skip
    """The torchrun path: one process per GPU, started by ``torchrun --nproc-per-node N`` (or anything
    that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT). Binds this process to GPU
    LOCAL_RANK, initializes torch.distributed from the environment when it is not yet (``backend``:
    gloo is enough, only host objects travel), then does the collective shmem init over WORLD: IPC handles
    exchanged through torch.distributed, every peer's heap mapped after checking peer access. Returns
    LOCAL_RANK (the GPU ordinal)."""
    missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
    dist = torch_distributed()
    if missing and not dist.is_initialized():
        raise ShmemError(f"shmem_init_from_env: {', '.join(missing)} not set; start one process per GPU with "
                         f"torchrun --nproc-per-node <GPUs> (it sets {', '.join(TORCHRUN_VARIABLES)})")  # fmt: skip
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ShmemError(f"LOCAL_RANK must be an integer, got {os.environ['LOCAL_RANK']!r}") from None
    drv = driver if driver is not None else default_driver()
    torch = torch_cuda()
    if torch is not None:
        count = torch.cuda.device_count()
        if not 0 <= local_rank < count:
            raise ShmemError(f"LOCAL_RANK {local_rank} but {count} GPU(s) visible to this process; start at most "
                             f"{count} processes per node")  # fmt: skip
        torch.cuda.set_device(local_rank)
    drv.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://")
    shmem_init_comm(TorchComm(None), heap_size=heap_size, driver=drv)
    return local_rank


def shmem_init_comm(comm, *, heap_size: int | None = None, driver: Driver | None = None) -> int:
    """Multi-process init over any rendezvous object with ``rank``, ``world_size``,
    ``all_gather_object(obj) -> list`` and ``barrier()`` (what TorchComm provides). Collective."""

    def make():
        drv = driver if driver is not None else default_driver()
        return ShmemState.create_multiprocess(drv, comm, heap_size)

    _install(make)
    return 0


def shmem_get_unique_id() -> bytes:
    """128 bytes: a random token and this host's name. Used only as a rendezvous key (checked equal on
    every PE by shmem_init_attr)."""
    return new_unique_id()


def shmem_finalize() -> int:
    """Release the heap, the IPC mappings and the device tables. Tensors and pointers into the heap
    become invalid. Collective in multi-process mode."""
    global _STATE
    with _STATE_LOCK:
        s = state()
        _STATE = None
        s.finalize()
    return 0


# ---- PEs, memory, barriers ---------------------------------------------------------------------------


def shmem_mype() -> int:
    return state().my_pe


def shmem_npes() -> int:
    return state().n_pes


def shmem_malloc(size: int) -> int:
    """A symmetric allocation of ``size`` bytes (256-byte aligned); returns this PE's address (virtual
    mode: PE 0's). Collective in multi-process mode."""
    return state().malloc(size)


def shmem_malloc_align(alignment: int, size: int) -> int:
    return state().malloc(size, alignment)


def shmem_free(ptr: int) -> None:
    state().free(ptr)


def shmem_buffer_register(ptr: int, size: int) -> None:
    """Record a non-heap buffer (MORI registers it for RDMA). Registered buffers are not symmetric: the
    address-based device API (put/get/ptr_p2p) works only on heap addresses."""
    state().buffer_register(ptr, size)


def shmem_buffer_deregister(ptr: int) -> None:
    state().buffer_deregister(ptr)


def shmem_ptr_p2p(ptr: int, my_pe: int, dest_pe: int) -> int:
    return state().ptr_p2p(ptr, my_pe, dest_pe)


def shmem_barrier_all() -> None:
    """Host barrier: synchronize the device, then (multi-process) a torch.distributed barrier."""
    state().barrier_all()


# ---- the device state --------------------------------------------------------------------------------


def device_state_bytes(wait_limit: int = 0) -> bytes:
    return state().device_state_bytes(wait_limit)


def read_wait_report() -> dict | None:
    """The bounded-wait report (lib_bitcode/state.py unpack_wait_report), or None when no wait gave up."""
    return state().read_wait_report()


def reset_wait_report() -> None:
    state().reset_wait_report()


# ---- torch tensors over symmetric memory -------------------------------------------------------------


def mori_shmem_create_tensor(shape, dtype):
    """A torch tensor over a fresh symmetric allocation (this PE's copy; virtual mode: PE 0's). Free it
    with ``shmem_free(t.data_ptr())``; it dangles after shmem_finalize()."""
    return shmem_tensors.new_symmetric_tensor(state(), shape, dtype)


def shmem_tensor(ptr: int, shape, dtype, pe: int | None = None):
    """A torch tensor view of the symmetric object at ``ptr`` (this PE's address) on PE ``pe`` (default
    mine; virtual mode: any PE; multi-process: a peer's heap through its IPC mapping)."""
    return shmem_tensors.symmetric_tensor_view(state(), ptr, shape, dtype, pe)
