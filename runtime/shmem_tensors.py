"""Torch tensors over symmetric memory: zero-copy views of heap bytes (torch is imported on first use).

A view is made through the CUDA array interface (``torch.as_tensor`` on a description of the device
bytes), so it aliases the heap without owning it: it is valid until the object is freed or shmem is
finalized. Views are checked against the allocator first: the bytes must lie inside one object of this
PE's heap, and a peer's copy is reached through ``ShmemState.ptr_p2p``.
"""

from __future__ import annotations

from .extras import import_extra
from .shmem_errors import ShmemError
from .shmem_state import ShmemState


class _DeviceBytes:
    """A zero-copy description of device bytes for torch.as_tensor (the CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (int(ptr), False),
                                         "strides": None, "version": 2}  # fmt: skip


def _shape_tuple(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ShmemError(f"negative dimension in shape {shape}")
    return shape


def _tensor_view(s: ShmemState, addr: int, shape, dtype):
    torch = import_extra("torch")
    shape = _shape_tuple(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=torch.device("cuda", s.driver.device))
    raw = torch.as_tensor(_DeviceBytes(addr, nbytes), device=torch.device("cuda", s.driver.device))
    return raw.view(dtype).view(shape)


def _nbytes(shape, dtype) -> int:
    torch = import_extra("torch")
    numel = 1
    for d in _shape_tuple(shape):
        numel *= d
    return numel * torch.empty((), dtype=dtype).element_size()


def new_symmetric_tensor(s: ShmemState, shape, dtype):
    """A tensor over a fresh allocation of ``s`` (at least one byte), viewed at this PE's address."""
    ptr = s.malloc(max(_nbytes(shape, dtype), 1))
    return _tensor_view(s, ptr, shape, dtype)


def symmetric_tensor_view(s: ShmemState, ptr: int, shape, dtype, pe: int | None = None):
    """A tensor view of the object at ``ptr`` (this PE's address) on PE ``pe`` (default: this PE)."""
    nbytes = _nbytes(shape, dtype)
    s.check_object(ptr, max(nbytes, 1), "shmem_tensor")
    pe = s.my_pe if pe is None else s.check_pe(pe, "pe")
    addr = s.ptr_p2p(ptr, s.my_pe, pe)
    if not addr:
        raise ShmemError(f"shmem_tensor: PE {pe}'s heap is not mapped in this process (another host)")
    return _tensor_view(s, addr, shape, dtype)
