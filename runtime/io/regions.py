"""Registered memory as the backends see it: ``Region`` (where the bytes are and what keeps them alive) and
the builders that turn what ``register_memory`` / ``register_torch_tensor`` accept into one.

What is accepted:

* CPU memory: an object with the buffer protocol (bytearray, numpy array, ...), a CPU torch tensor, or an
  ``int`` address (wrapped with ctypes: the caller keeps that memory alive and at least ``size`` bytes long
  until ``deregister_memory``). The region keeps a writable byte view, so a buffer stays alive while
  registered.
* GPU memory: a CUDA/ROCm torch tensor (contiguous; any view into a larger allocation), or an ``int``
  device address with its ``device_id``. The driver is asked for the allocation that contains it, and a
  range that does not fit inside that allocation is refused: no transfer can then touch bytes the caller
  does not own.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field

from ..driver import DriverError
from .enums import MemoryLocationType


@dataclass
class Region:
    """``size`` bytes at ``address``: CPU memory (``view`` holds its bytes, ``device`` is -1) or GPU memory
    on GPU ``device`` (``view`` is None; ``base`` and ``allocation_size`` describe the driver allocation
    that contains it). ``owner`` keeps the memory alive while registered."""

    mem_id: int
    location: MemoryLocationType
    address: int
    size: int
    device: int = -1
    owner: object = None
    view: memoryview | None = None
    base: int = 0
    allocation_size: int = 0
    # The TCP target's frames using the region now: the connections (sockets) and their count. Changed
    # under the engine's registry condition; deregistration waits for the count to reach zero.
    users: int = 0
    holders: dict = field(default_factory=dict)

    def hold(self, holder) -> None:
        self.users += 1
        self.holders[holder] = self.holders.get(holder, 0) + 1

    def unhold(self, holder) -> None:
        self.users -= 1
        left = self.holders.get(holder, 0) - 1
        if left > 0:
            self.holders[holder] = left
        else:
            self.holders.pop(holder, None)

    @property
    def on_gpu(self) -> bool:
        return self.location is MemoryLocationType.GPU

    def contains(self, offset: int, length: int) -> bool:
        return offset + length <= self.size

    def slice(self, offset: int, length: int) -> memoryview | None:
        """The bytes [offset, offset+length) of CPU memory, or None when outside the region."""
        if self.view is None or not self.contains(offset, length):
            return None
        return self.view[offset : offset + length]


def is_torch_tensor(value) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a tensor implies torch is loaded
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


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


def cpu_region(mem_id: int, memory, size: int, where: str) -> Region:
    """A CPU region from a buffer, a CPU tensor or an int address."""
    owner = memory
    if is_torch_tensor(memory):
        address = memory.data_ptr()
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B") if size else memoryview(b"")
        return Region(mem_id, MemoryLocationType.CPU, address, size, -1, memory, view)
    if isinstance(memory, int) and not isinstance(memory, bool):
        if memory <= 0 or size == 0:
            raise ValueError(f"{where}: address {memory:#x} with size {size}: need a non-null address and a "
                             "positive size")  # fmt: skip
        owner = (ctypes.c_char * size).from_address(memory)
    view, address = _byte_view(owner, size, where)
    return Region(mem_id, MemoryLocationType.CPU, address, size, -1, owner, view)


def gpu_region(mem_id: int, memory, size: int, device: int, driver, where: str) -> Region:
    """A GPU region from a GPU tensor or an int device address on GPU ``device``; checked against the
    driver allocation that contains it."""
    if is_torch_tensor(memory):
        address, owner = memory.data_ptr(), memory
    elif isinstance(memory, int) and not isinstance(memory, bool):
        address, owner = memory, None
    else:
        raise TypeError(f"{where}: GPU memory is a GPU torch tensor or an int device address, not "
                        f"{type(memory).__name__}")  # fmt: skip
    if address <= 0 or size == 0:
        raise ValueError(f"{where}: GPU address {address:#x} with size {size}: need a non-null address and a "
                         "positive size")  # fmt: skip
    if device < 0:
        raise ValueError(f"{where}: GPU memory needs its device_id (the GPU ordinal), got {device}")
    try:
        with driver.using_device(device):
            base, allocation_size = driver.address_range(address)
    except DriverError as exc:
        raise ValueError(f"{where}: {address:#x} is not GPU memory of device {device} ({exc})") from None
    if address + size > base + allocation_size:
        raise ValueError(f"{where}: [{address:#x}, +{size}) runs past the end of its GPU allocation "
                         f"[{base:#x}, +{allocation_size})")  # fmt: skip
    return Region(mem_id, MemoryLocationType.GPU, address, size, device, owner, None, base, allocation_size)
