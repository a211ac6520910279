"""The configs of MORI-IO: ``IOEngineConfig``, ``RdmaBackendConfig`` and ``XgmiBackendConfig`` with MORI's
fields, defaults and constructor order (``src/pybind/pybind_io.cpp``), and ``TcpBackendConfig``, ours (MORI
has a ``BackendType.TCP`` value but no TCP backend).

They are mutable, like MORI's (``def_readwrite``), but every assignment is checked, in the constructor and
afterwards: a value of the wrong type is a ``TypeError``, one out of range a ``ValueError``, both naming the
field; a misspelt attribute is an ``AttributeError`` (slots). Checks that involve two fields (chunk size
with chunking on, ...) can only be made once the config is used: ``validate()``, which the engine calls at
``create_backend`` (where MORI makes the same checks). ``RdmaBackendConfig.with_env_overrides()`` applies
MORI's ``MORI_IO_*`` environment overrides, also at ``create_backend``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Callable, Mapping, Optional

from . import checks
from .enums import PollCqMode
from .log import LOGGER

_Rule = Callable[[str, object], object]


def _int(lo: int, hi: int) -> _Rule:
    return lambda where, value: checks.integer(where, value, lo, hi)


def _checked_setattr(rules: dict[str, _Rule]):
    """A ``__setattr__`` that runs the rule of the field on every assignment."""

    def __setattr__(self, name: str, value) -> None:
        rule = rules.get(name)
        if rule is None:
            raise AttributeError(f"{type(self).__name__} has no field '{name}' (fields: {', '.join(rules)})")
        object.__setattr__(self, name, rule(f"{type(self).__name__}.{name}", value))

    return __setattr__


@dataclasses.dataclass(slots=True)
class IOEngineConfig:
    """``host``: the address the engine's listener binds (an IPv4 literal for the TCP/RDMA backend; ``""``
    is fine for a GPU-IPC-only engine). ``port``: its port, 0 = an ephemeral one, chosen when the backend
    starts and written into the engine descriptor (1 is reserved by MORI as a sentinel)."""

    host: str = ""
    port: int = 0

    __setattr__ = _checked_setattr({"host": checks.string, "port": _int(*checks.U16)})


def _post_batch_size(where: str, value) -> int:
    number = checks.integer(where, value, *checks.I32)
    if number != -1 and number < 1:
        raise ValueError(f"{where} must be -1 (one chain per QP) or a positive count, got {number}")
    return number


@dataclasses.dataclass(slots=True)
class RdmaBackendConfig:
    """MORI's RDMA backend config; the TCP backend that stands in for RDMA reads the fields that have a
    meaning for sockets (``qp_per_transfer`` = sockets per remote engine, ``enable_notification``,
    ``notif_per_qp``) and accepts the others. Positional order = MORI's constructor order.
    ``max_send_wr``, ``max_cqe_num`` and ``max_msg_sge`` are attributes only (not constructor arguments),
    0 = the backend's default, as in MORI."""

    qp_per_transfer: int = 1
    post_batch_size: int = -1  # -1: ceil(work requests / QPs)
    num_worker_threads: int = -1  # <= 1: post inline; > 1: a pool of min(QPs, threads) workers
    poll_cq_mode: PollCqMode = PollCqMode.POLLING
    enable_notification: bool = True
    notif_per_qp: int = 1024
    enable_transfer_chunking: bool = False
    chunk_bytes: int = 65536
    max_chunks_per_transfer: int = 64
    num_nics_per_transfer: int = 1
    max_send_wr: int = dataclasses.field(default=0, init=False)
    max_cqe_num: int = dataclasses.field(default=0, init=False)
    max_msg_sge: int = dataclasses.field(default=0, init=False)

    __setattr__ = _checked_setattr({
        "qp_per_transfer": _int(1, checks.I32[1]),
        "post_batch_size": _post_batch_size,
        "num_worker_threads": _int(-1, checks.I32[1]),
        "poll_cq_mode": lambda where, value: checks.member(where, value, PollCqMode),
        "enable_notification": checks.boolean,
        "notif_per_qp": _int(*checks.U32),
        "enable_transfer_chunking": checks.boolean,
        "chunk_bytes": _int(1, checks.U64[1]),
        "max_chunks_per_transfer": _int(1, checks.I32[1]),
        "num_nics_per_transfer": _int(1, checks.I32[1]),
        "max_send_wr": _int(0, checks.I32[1]),
        "max_cqe_num": _int(0, checks.I32[1]),
        "max_msg_sge": _int(0, checks.I32[1]),
    })  # fmt: skip

    MIN_CHUNK_BYTES = 4096

    def validate(self) -> None:
        """The checks MORI makes when the backend is created (``ValueError`` naming the fields)."""
        if self.enable_transfer_chunking and self.chunk_bytes < self.MIN_CHUNK_BYTES:
            raise ValueError(f"RdmaBackendConfig.chunk_bytes must be >= {self.MIN_CHUNK_BYTES} when "
                             f"enable_transfer_chunking is on, got {self.chunk_bytes}")  # fmt: skip
        if self.enable_notification and self.notif_per_qp == 0:
            raise ValueError("RdmaBackendConfig.notif_per_qp must be >= 1 when enable_notification is on")

    def with_env_overrides(self, environ: Optional[Mapping[str, str]] = None) -> "RdmaBackendConfig":
        """A copy with MORI's ``MORI_IO_*`` overrides of ``environ`` (default ``os.environ``) applied, as
        MORI applies them at backend creation. A value that does not parse or is out of range is ignored
        with a warning naming the variable, keeping the config's value (MORI's behaviour)."""
        environ = os.environ if environ is None else environ
        result = copy.copy(self)
        for variable, field in RDMA_ENV_OVERRIDES.items():
            text = environ.get(variable)
            if text is None or not text.strip():
                continue
            try:
                setattr(result, field, _parse_env(field, text))
            except (TypeError, ValueError) as exc:
                LOGGER.warning("ignoring %s=%r: %s", variable, text, exc)
        return result


# MORI's environment overrides of the RDMA config fields (src/io/rdma/backend_impl.cpp).
RDMA_ENV_OVERRIDES = {
    "MORI_IO_QP_PER_TRANSFER": "qp_per_transfer",
    "MORI_IO_POST_BATCH_SIZE": "post_batch_size",
    "MORI_IO_NUM_WORKER_THREADS": "num_worker_threads",
    "MORI_IO_POLL_CQ_MODE": "poll_cq_mode",
    "MORI_IO_ENABLE_NOTIFICATION": "enable_notification",
    "MORI_IO_ENABLE_CHUNKING": "enable_transfer_chunking",
    "MORI_IO_CHUNK_BYTES": "chunk_bytes",
    "MORI_IO_MAX_CHUNKS": "max_chunks_per_transfer",
    "MORI_IO_NUM_NICS_PER_TRANSFER": "num_nics_per_transfer",
}
_BOOL_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}
_POLL_WORDS = {"0": PollCqMode.POLLING, "polling": PollCqMode.POLLING, "1": PollCqMode.EVENT, "event": PollCqMode.EVENT}


def _parse_env(field: str, text: str):
    word = text.strip().lower()
    if field == "poll_cq_mode":
        if word not in _POLL_WORDS:
            raise ValueError(f"not one of {', '.join(_POLL_WORDS)}")
        return _POLL_WORDS[word]
    if field in ("enable_notification", "enable_transfer_chunking"):
        if word not in _BOOL_WORDS:
            raise ValueError(f"not a boolean ({', '.join(_BOOL_WORDS)})")
        return _BOOL_WORDS[word]
    try:
        return int(word, 10)
    except ValueError:
        raise ValueError("not an integer") from None


@dataclasses.dataclass(slots=True)
class XgmiBackendConfig:
    """MORI's XGMI backend config (the GPU-IPC backend reads it): copy streams and initially created
    events per device; a value <= 0 means the default 64, as in MORI (``effective_*``)."""

    num_streams: int = 64
    num_events: int = 64

    __setattr__ = _checked_setattr({"num_streams": _int(*checks.I32), "num_events": _int(*checks.I32)})

    DEFAULT_COUNT = 64

    @property
    def effective_num_streams(self) -> int:
        return self.num_streams if self.num_streams > 0 else self.DEFAULT_COUNT

    @property
    def effective_num_events(self) -> int:
        return self.num_events if self.num_events > 0 else self.DEFAULT_COUNT


@dataclasses.dataclass(slots=True)
class TcpBackendConfig:
    """Our TCP backend's config (MORI has none; ``BackendType.TCP`` is only an enum value there).

    * ``num_connections``: sockets per remote engine; a transfer's parts are spread over them starting at
      ``uid % num_connections`` (the stand-in for RDMA's ``qp_per_transfer``);
    * ``max_frame_payload``: the most payload bytes one frame carries; larger transfers are split, and a
      frame announcing more is refused as malformed (so a peer cannot make us allocate without bound);
    * ``connect_timeout_ms``: how long connecting to a remote engine may take before the call that builds
      the connection raises (> 0);
    * ``io_timeout_ms``: how long a socket may stall in a send or receive before its transfers fail with
      ``ERR_RDMA_OP`` (0 = no limit, like MORI's ``MORI_IO_CP_TIMEOUT_MS``);
    * ``enable_notification``: send the target a notice per transfer so that it can
      ``pop_inbound_transfer_status``, as the RDMA backend does.
    """

    num_connections: int = 1
    max_frame_payload: int = 4 << 20
    connect_timeout_ms: int = 5000
    io_timeout_ms: int = 5000
    enable_notification: bool = True

    MAX_CONNECTIONS = 64
    FRAME_PAYLOAD_RANGE = (4096, 1 << 30)

    __setattr__ = _checked_setattr({
        "num_connections": _int(1, MAX_CONNECTIONS),
        "max_frame_payload": _int(*FRAME_PAYLOAD_RANGE),
        "connect_timeout_ms": _int(1, checks.I32[1]),
        "io_timeout_ms": _int(0, checks.I32[1]),
        "enable_notification": checks.boolean,
    })  # fmt: skip
