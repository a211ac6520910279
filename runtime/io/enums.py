"""The enums of MORI-IO, with MORI's member names and numeric values (``include/mori/io/enum.hpp``).

They are ``IntEnum`` so that they compare equal to, and pack on the wire as, their integer values (MORI
packs every enum as a u32). ``StatusCode`` has a gap between the non-error codes and the errors: MORI's
internal ``ERR_BEGIN`` = 10 marks it and is not a member; a code is a failure iff its value is above it.
"""

from __future__ import annotations

import enum


class BackendType(enum.IntEnum):
    """The transport of a backend. ``TCP`` is MORI's placeholder value, which this project implements."""

    Unknown = 0
    XGMI = 1
    RDMA = 2
    TCP = 3
    FABRIC = 4


class MemoryLocationType(enum.IntEnum):
    """Where registered memory lives."""

    Unknown = 0
    CPU = 1
    GPU = 2


ERR_BEGIN = 10
"""Codes above this value are errors (MORI's internal ``StatusCode::ERR_BEGIN``, not a member)."""


class StatusCode(enum.IntEnum):
    """The state of a transfer: ``INIT`` (never issued), ``IN_PROGRESS``, ``SUCCESS`` or an error."""

    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15

    @property
    def failed(self) -> bool:
        """Whether the code is an error (value above ``ERR_BEGIN``)."""
        return self.value > ERR_BEGIN


class PollCqMode(enum.IntEnum):
    """How an RDMA backend polls its completion queues (accepted for MORI compatibility)."""

    POLLING = 0
    EVENT = 1
