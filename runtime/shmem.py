"""The ``mori.shmem``-compatible host API: symmetric memory for the project's device library.

A *PE* is one participant; every PE owns a *symmetric heap* of ``MORI_SHMEM_HEAP_SIZE`` bytes (default 1 GiB
per PE), and a symmetric object lives at the same offset in every PE's heap. Two modes:

* **multi-process** (``shmem_torch_process_group_init`` / ``shmem_init_attr`` / ``shmem_init_from_env``):
  one PE per process, on the same or different GPUs of one host; the processes exchange IPC handles over a
  rendezvous (a torch.distributed group, or for ``shmem_init_attr`` without torch.distributed the sockets its
  unique id names, ``shmem_bootstrap``) and map every peer's heap. Peers on other hosts stay unmapped
  (``shmem_ptr_p2p`` → 0): there is no RDMA transport. Each process must have selected its GPU
  (``torch.cuda.set_device``) before init.
* **virtual** (``shmem_init_virtual(n_pes)``, this project's extension): N PEs in this one process on one
  GPU, for testing multi-PE kernels on a single GPU. ``shmem_malloc`` returns PE 0's address of the object
  (the symmetric handle); ``shmem_ptr_p2p(ptr, 0, p)`` gives PE p's copy; ``shmem_mype()`` is 0.

Code objects loaded by someone else (Triton, FlyDSL, a HIP or CUDA module of the caller's) that link the
project's device library get their device state from ``shmem_module_init(module)``, as MORI's do; the
runtime's own ``KernelSet`` fills its bundles itself.

``shmem_malloc`` / ``shmem_free`` are collective in multi-process mode: every PE must call them, in the same
order, with the same sizes and alignments; a mismatch raises on every PE (MORI would corrupt memory
silently). ``shmem_buffer_register`` only records a buffer: registered buffers are not symmetric and cannot
be used with the address-based device API, which works only on heap addresses. Misuse raises
``ShmemError`` (a ValueError) or ``ShmemStateError`` (a RuntimeError) with a message saying what to do.

This module keeps the process-global state and the API over it; the rest lives by concern:

* ``heap_allocator``: the heap size (``MORI_SHMEM_HEAP_SIZE``), alignment and the first-fit allocator;
* ``shmem_comm``: the rendezvous with the other processes (torch.distributed, the collective checks of init
  and of malloc/free); ``shmem_bootstrap``: the rendezvous a unique id carries;
* ``shmem_state``: ``ShmemState``, one initialized shmem: who owns which memory, the virtual-PE layout,
  addresses, allocation, the device state snapshot (``device_state_bytes``, written by runtime/launcher.py);
* ``shmem_tensors``: torch tensor views of symmetric objects;
* ``shmem_errors``: the exceptions.
"""

from __future__ import annotations

import operator
import os
import re
import threading

from mori_compiler.ep_schema import MAX_QP_PER_PE
from mori_compiler.lib_bitcode.state import STATE_SIZE, STATE_SYMBOL

from . import shmem_bootstrap, shmem_tensors
from .driver import Driver, DriverError, Module, canonical_backend, default_driver, torch_cuda
from .heap_allocator import heap_size_from_env
from .shmem_bootstrap import UNIQUE_ID_BYTES
from .shmem_comm import TorchComm, resolve_process_group, torch_distributed
from .shmem_errors import ShmemError, ShmemOutOfMemoryError, ShmemStateError
from .shmem_state import ShmemState

__all__ = [
    "MORI_SHMEM_INIT_WITH_MPI_COMM", "MORI_SHMEM_INIT_WITH_UNIQUEID", "TORCHRUN_VARIABLES", "UNIQUE_ID_BYTES",
    "ShmemError", "ShmemOutOfMemoryError", "ShmemState", "ShmemStateError", "TorchComm",
    "current_state", "device_state_bytes", "heap_size_from_env", "mori_shmem_create_tensor", "read_wait_report",
    "reset_wait_report", "shmem_barrier_all", "shmem_buffer_deregister", "shmem_buffer_register",
    "shmem_finalize", "shmem_free", "shmem_get_unique_id", "shmem_init_attr", "shmem_init_comm",
    "shmem_init_from_env", "shmem_init_virtual", "shmem_malloc", "shmem_malloc_align", "shmem_module_init",
    "shmem_mype", "shmem_npes", "shmem_num_qp_per_pe", "shmem_ptr_p2p", "shmem_tensor",
    "shmem_torch_process_group_init", "state",
    "MoriShmemBuffer", "mori_shmem_create_tensor_list_intra_node", "mori_shmem_free_tensor", "shmem_barrier_on_stream",
    "shmem_ext_malloc_with_flags", "shmem_mpi_init", "symm_mori_shmem_tensor",
]  # fmt: skip

MORI_SHMEM_INIT_WITH_UNIQUEID = 1
MORI_SHMEM_INIT_WITH_MPI_COMM = 0
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
NUM_QP_ENV = "MORI_NUM_QP_PER_PE"
DEFAULT_NUM_QP_PER_PE = 4  # MORI's default in code (its guide says 1)

# ---- the process-global state ------------------------------------------------------------------------

_STATE: ShmemState | None = None
_STATE_LOCK = threading.RLock()
_NUM_QP_PER_PE = DEFAULT_NUM_QP_PER_PE  # read from MORI_NUM_QP_PER_PE at each init, as MORI reads it


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


def _check_not_initialized() -> None:
    s = _STATE
    if s is not None:
        raise ShmemStateError(f"shmem is already initialized ({s.mode}, {s.n_pes} PEs): call shmem_finalize() "
                              f"before initializing again")  # fmt: skip


def _install(make) -> None:
    global _STATE, _NUM_QP_PER_PE
    with _STATE_LOCK:
        _check_not_initialized()
        qp = num_qp_from_env()
        _STATE = make()
        _NUM_QP_PER_PE = qp


def num_qp_from_env() -> int:
    """``MORI_NUM_QP_PER_PE`` (default 4, MORI's), in [1, MAX_QP_PER_PE]; a bad value is an error."""
    text = os.environ.get(NUM_QP_ENV, "").strip()
    if not text:
        return DEFAULT_NUM_QP_PER_PE
    try:
        value = int(text, 10)
    except ValueError:
        raise ShmemError(f"{NUM_QP_ENV}={text!r}: expected an integer in [1, {MAX_QP_PER_PE}]") from None
    if not 1 <= value <= MAX_QP_PER_PE:
        raise ShmemError(f"{NUM_QP_ENV}={value}: must be in [1, {MAX_QP_PER_PE}]")
    return value


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
                    driver: Driver | None = None, timeout: float | None = None) -> int:  # fmt: skip
    """MORI's ``shmem_init_attr``: ``MORI_SHMEM_INIT_WITH_UNIQUEID`` only (no MPI). Collective: every rank
    0 .. nranks-1 calls it with the id rank 0 got from ``shmem_get_unique_id()``. Where torch.distributed is
    initialized its WORLD group is the rendezvous (and must be this rank of nranks); otherwise the id carries
    it, as in MORI: rank 0 serves on the listener the id names and the others connect to it
    (runtime/shmem_bootstrap.py; ``timeout``: a finite number of seconds > 0, default
    ``MORI_COMPILER_RENDEZVOUS_TIMEOUT`` or 300). ``unique_id``: the id's bytes (or any buffer of them);
    ``rank`` / ``nranks``: integers (numpy's too). Everything that can fail on this rank alone is checked
    before the rendezvous. Returns 0."""
    if flags != MORI_SHMEM_INIT_WITH_UNIQUEID:
        raise ShmemError(f"shmem_init_attr flags={flags}: only MORI_SHMEM_INIT_WITH_UNIQUEID "
                         f"({MORI_SHMEM_INIT_WITH_UNIQUEID}) is supported (no MPI)")  # fmt: skip
    uid = _unique_id_bytes(unique_id)
    rank, nranks = _integer("rank", rank), _integer("nranks", nranks)
    if not 0 <= rank < nranks:
        raise ShmemError(f"shmem_init_attr(rank={rank}, nranks={nranks}): rank must be in [0, nranks)")
    if timeout is not None:
        timeout = shmem_bootstrap.check_timeout(timeout, "shmem_init_attr timeout")
    # Before any rendezvous, what can fail here alone: the other ranks would otherwise wait for nothing.
    _check_not_initialized()
    num_qp_from_env()
    dist = _initialized_torch_distributed()
    if dist is not None:
        if timeout is not None:
            raise ShmemError("shmem_init_attr timeout= applies to the unique id's rendezvous, but torch.distributed "
                             "is initialized and its WORLD group is the rendezvous; leave timeout out")  # fmt: skip
        shmem_bootstrap.release_all()  # no id's listener is used: torch.distributed is the rendezvous
        comm = TorchComm(None)
        if comm.world_size != nranks or comm.rank != rank:
            raise ShmemStateError(f"shmem_init_attr(rank={rank}, nranks={nranks}) does not match torch.distributed "
                                  f"(rank {comm.rank} of world size {comm.world_size})")  # fmt: skip
    else:
        shmem_bootstrap.release_all(keep=uid)  # ids got on every rank, only rank 0's used (a common MORI pattern)
        comm = shmem_bootstrap.connect(uid, rank, nranks, timeout=timeout)

    def make():
        drv = driver if driver is not None else default_driver()
        return ShmemState.create_multiprocess(drv, comm, heap_size, unique_id=uid)

    try:
        _install(make)
    except BaseException:
        if isinstance(comm, shmem_bootstrap.UniqueIdComm):
            comm.close()
        raise
    return 0


def _unique_id_bytes(unique_id) -> bytes:
    """The id as bytes (bytes, bytearray, a buffer or a sequence of byte values), of UNIQUE_ID_BYTES bytes."""
    got = f"got a {type(unique_id).__name__}"
    if not isinstance(unique_id, (int, str)):  # bytes(n) would be n zeros, bytes(str) a TypeError
        try:
            uid = bytes(unique_id)
        except (TypeError, ValueError):
            uid = None
        if uid is not None:
            if len(uid) != UNIQUE_ID_BYTES:
                got = f"got {len(uid)}"
            else:
                return uid
    raise ShmemError(f"shmem_init_attr unique_id must be the {UNIQUE_ID_BYTES} bytes of shmem_get_unique_id(), {got}")


def _integer(name: str, value) -> int:
    """``value`` as an int (anything with __index__: an int, a numpy integer), never a bool."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ShmemError(f"shmem_init_attr {name} must be an integer, got {value!r}") from None


def _initialized_torch_distributed():
    """torch.distributed when it is importable and initialized, else None (the unique id's rendezvous)."""
    try:
        dist = torch_distributed()
    except ShmemStateError:
        return None
    return dist if dist.is_initialized() else None


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


def shmem_mpi_init() -> int:
    """MORI's MPI init: not offered (no MPI here). Refused with what to use instead."""
    raise NotImplementedError("shmem_mpi_init: mori_compiler has no MPI bootstrap; use "
                              "shmem_torch_process_group_init(name), shmem_init_attr(flags, rank, nranks, uid) or "
                              "shmem_init_from_env() under torchrun")  # fmt: skip


def shmem_get_unique_id() -> bytes:
    """128 bytes for ``shmem_init_attr``, to be called by rank 0 and handed to every rank (as MORI's): a random
    token and the address of a rendezvous listener this call opens in this process (runtime/shmem_bootstrap.py).
    Every PE checks at init that all got the same id. The listeners of ids this process does not use are
    closed by the next ``shmem_init_attr`` (all but the id it is given) and by ``shmem_finalize``."""
    return shmem_bootstrap.new_unique_id()


def shmem_finalize() -> int:
    """Release the heap, the IPC mappings and the device tables. Tensors and pointers into the heap
    become invalid. Collective in multi-process mode."""
    global _STATE
    with _STATE_LOCK:
        s = state()
        _STATE = None
        try:
            s.finalize()
        finally:
            if isinstance(s.comm, shmem_bootstrap.UniqueIdComm):
                s.comm.close()  # the unique id's sockets
            shmem_bootstrap.release_all()  # and the listeners of ids got since init and never used
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


def shmem_ext_malloc_with_flags(size: int, flags: int) -> int:
    """MORI's allocation with flags. Only ``flags == 0`` (a plain ``shmem_malloc``) is offered: the heap is
    one device allocation, so there is no per-object memory kind to choose."""
    if isinstance(flags, bool) or not isinstance(flags, int) or flags != 0:
        raise NotImplementedError(f"shmem_ext_malloc_with_flags(size, flags={flags!r}): only flags=0 is offered "
                                  f"(the symmetric heap is one device allocation, with no per-object memory kind)")  # fmt: skip
    return shmem_malloc(size)


def shmem_free(ptr: int) -> None:
    state().free(ptr)


def shmem_buffer_register(ptr: int, size: int) -> int:
    """Record a non-heap buffer (MORI registers it for RDMA). Registered buffers are not symmetric: the
    address-based device API (put/get/ptr_p2p) works only on heap addresses. Returns 0."""
    state().buffer_register(ptr, size)
    return 0


_NO_SIZE = object()


def shmem_buffer_deregister(ptr: int, size: int = _NO_SIZE) -> int:
    """Forget the buffer registered at ``ptr``; ``size`` must be the size it was registered with (MORI's
    signature: both are required). Returns 0."""
    s = state()
    ptr = int(ptr)
    registered = s.registered.get(ptr)
    if size is _NO_SIZE:
        hint = f" ({registered} for the buffer at 0x{ptr:x})" if registered is not None else ""
        raise ShmemError(f"shmem_buffer_deregister(ptr, size): size is required, as in MORI; pass the size the "
                         f"buffer was registered with{hint}")  # fmt: skip
    if registered is not None and (isinstance(size, bool) or not isinstance(size, int) or size != registered):
        raise ShmemError(f"shmem_buffer_deregister(0x{ptr:x}, {size!r}): the buffer was registered with "
                         f"{registered} bytes; pass that size")  # fmt: skip
    s.buffer_deregister(ptr)
    return 0


def shmem_ptr_p2p(dest_ptr: int, my_pe: int, dest_pe: int) -> int:
    return state().ptr_p2p(dest_ptr, my_pe, dest_pe)


def shmem_num_qp_per_pe() -> int:
    """Queue pairs per peer, as MORI reports them: ``MORI_NUM_QP_PER_PE`` at init (default 4). The project
    reaches peers over P2P and creates no queue pairs; the number is what an inter-node EP config may ask
    for (``num_qp_per_pe``) on MORI's own transport."""
    state()
    return _NUM_QP_PER_PE


def shmem_barrier_all() -> None:
    """Host barrier: synchronize the device, then (multi-process) a torch.distributed barrier."""
    state().barrier_all()


def shmem_barrier_on_stream(stream=None) -> None:
    """MORI's device-side barrier kernel on a stream: not offered (the runtime ships no kernel of its own).
    Refused with what to use instead."""
    raise NotImplementedError("shmem_barrier_on_stream: the runtime has no barrier kernel of its own to enqueue; "
                              "call shmem_barrier_all() (host: device sync + barrier) or a barrier inside your "
                              "kernel (mori_shmem barrier_all, MORI_DEVICE_FUNCTIONS' shmem barrier)")  # fmt: skip


# ---- the device state --------------------------------------------------------------------------------

_NOT_FOUND = ("CUDA_ERROR_NOT_FOUND", "hipErrorNotFound")


def _foreign_module(drv: Driver, module) -> Module:
    """A ``Module`` over a module handle someone else loaded: our own Module as it is, else a raw handle
    (an int, or a binding handle convertible with int(): Triton's ``kernel.module``, FlyDSL's and HIP's
    ``hipModule_t``, cuda-bindings' ``CUmodule``). It is never unloaded here: its loader owns it."""
    if isinstance(module, Module):
        return module
    if module is None or isinstance(module, (bool, float, str, bytes)):
        raise ShmemError(f"shmem_module_init: expected a loaded module (a module handle as an int, as Triton's "
                         f"kernel.module, or a hipModule_t / CUmodule), got {module!r}")  # fmt: skip
    try:
        handle = int(module)
    except (TypeError, ValueError):
        raise ShmemError(f"shmem_module_init: cannot read a module handle from {type(module).__name__} (expected an "
                         f"int, a hipModule_t / CUmodule, or a mori_compiler runtime Module)") from None  # fmt: skip
    if handle <= 0:
        raise ShmemError(f"shmem_module_init: module handle {handle} is not a loaded module")
    backend = canonical_backend(drv.backend)
    if backend == "nvvm":
        from .cuda import CudaModule as module_class
    else:
        from .hip import HipModule as module_class
    if not hasattr(drv, "_call"):
        raise ShmemError(f"shmem_module_init: the {drv.backend} driver of this shmem cannot look up globals of a "
                         f"raw module handle; pass a mori_compiler runtime Module")  # fmt: skip
    return module_class(drv, handle)


def _state_global(mod: Module, symbol: str) -> tuple[int, int] | None:
    try:
        return mod.global_address(symbol)
    except DriverError as exc:
        if exc.error_name in _NOT_FOUND:
            return None
        raise


def shmem_module_init(hip_module, *, wait_limit: int = 0) -> int:
    """Fill the device state of a code object that someone else loaded (MORI's ``shmem_module_init``):
    Triton's ``kernel.module``, a FlyDSL or HIP ``hipModule_t``, a CUDA ``CUmodule``, or a runtime ``Module``.
    Call it after shmem init, once per loaded module (the copy is a snapshot, so again after a re-init).
    Returns 0 when the module's ``mori_compiler_shmem_state`` was written, and -1, as MORI does, when the
    module has no shmem state at all (a kernel that calls no shmem function: Triton's hook calls it for
    every kernel). A module linked with MORI's own bitcode (``_ZN4mori5shmem15globalGpuStatesE``) needs
    MORI's runtime and is refused, as are virtual PEs (their kernels are launched by ``KernelSet``).
    ``wait_limit``: the bounded-wait poll count written into the state (0: wait forever)."""
    s = state()
    if s.virtual:
        raise ShmemStateError(f"shmem_module_init: shmem runs {s.n_pes} virtual PEs in this process, whose kernels "
                              f"need per-PE arguments (compile with virtual_pes=True and launch with KernelSet); a "
                              f"module loaded elsewhere runs with multi-process shmem (one PE per process)")  # fmt: skip
    data = s.device_state_bytes(wait_limit)
    mod = _foreign_module(s.driver, hip_module)
    found = _state_global(mod, STATE_SYMBOL)
    if found is None:
        from mori_compiler.lib_bitcode.abi import MORI_STATE_SYMBOL

        if _state_global(mod, MORI_STATE_SYMBOL) is not None:
            raise ShmemStateError(f"shmem_module_init: the module holds MORI's device state ({MORI_STATE_SYMBOL}): "
                                  f"it was linked with MORI's libmori_shmem_device.bc, whose state only MORI's "
                                  f"runtime can fill; link the project's library (mori.ir.find_bitcode() without "
                                  f"MORI_SHMEM_BC) or run it with MORI")  # fmt: skip
        return -1
    ptr, size = found
    if size < STATE_SIZE:
        raise ShmemStateError(f"shmem_module_init: {STATE_SYMBOL} in the module has {size} bytes; the runtime "
                              f"writes {STATE_SIZE} (the module's device library and this runtime disagree)")  # fmt: skip
    s.driver.memcpy_htod(ptr, data)
    return 0


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


# MORI's mori.shmem.tensor_utils names, over the views above.


class MoriShmemBuffer:
    """``nbytes`` bytes of device memory at ``ptr`` as a CUDA array (what torch.as_tensor takes), as MORI's."""

    def __init__(self, ptr: int, nbytes: int, dtype):
        self.ptr, self.nbytes, self.dtype = int(ptr), int(nbytes), dtype
        self.__cuda_array_interface__ = {"data": (self.ptr, False), "shape": (self.nbytes,), "typestr": "<u1",
                                         "strides": None, "version": 3}  # fmt: skip


def symm_mori_shmem_tensor(tensor, peer: int):
    """PE ``peer``'s copy of the symmetric tensor ``tensor`` (this PE's view of it)."""
    return shmem_tensor(tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, pe=peer)


def mori_shmem_free_tensor(tensor) -> None:
    """Free the symmetric allocation behind ``tensor`` (from mori_shmem_create_tensor)."""
    shmem_free(tensor.data_ptr())


def mori_shmem_create_tensor_list_intra_node(shape, dtype, num_ranks: int):
    """A fresh symmetric tensor and its view on each of PEs 0 .. num_ranks-1."""
    tensor = mori_shmem_create_tensor(shape, dtype)
    return [symm_mori_shmem_tensor(tensor, pe) for pe in range(num_ranks)]
