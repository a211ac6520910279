"""The errors of the shmem runtime (raised by every shmem module, re-exported by ``runtime/shmem.py``).

Misuse is reported with a message saying what to do, rather than by faulting the GPU or hanging: a bad
argument is a ``ShmemError`` (a ValueError), a call in the wrong state a ``ShmemStateError`` (a
RuntimeError).
"""

from __future__ import annotations


class ShmemError(ValueError):
    """A shmem call got an invalid argument (bad pointer, size, PE, alignment...)."""


class ShmemStateError(RuntimeError):
    """A shmem call was made in the wrong state (before init, init twice, mismatched PEs...)."""


class ShmemOutOfMemoryError(ShmemError, MemoryError):
    """The symmetric heap has no free block large enough."""
