"""The AsyncLL notification-protocol options (issue 5, item 3), resolved once per op.

MORI reads three environment switches when an AsyncLL op is built. Ours are read by :func:`resolve` into an
immutable :class:`AsyncLLOptions`, meant to be resolved once at op construction and baked into the op's
compiled plan (as the ``early_notify``/``fused_recv`` attributes of the ``mori_ep`` send/recv halves), so two
ops built under different settings coexist in one process. Not wired yet: ``EpDispatchCombineOp`` does not
generate AsyncLL kernels in this version; this module is their host-side contract, tested on its own.

* ``MORI_ASYNCLL_EARLY_NOTIFY``: the send phase posts each payload's ready notification on the same ordered
  channel right after the payload (instead of the receive phase posting a count after a quiet).
* ``MORI_ASYNCLL_FUSED_RECV``: the receive waits fold into the copy passes: one wave per block waits on the
  notifications, then an acquire fence and a block barrier release the copy waves. It relies on the early
  notifications (nothing else posts them before the copies), so it is rejected without them.
* ``MORI_ASYNCLL_SKIP_RESET``: accepted for compatibility with MORI's scripts; it has no effect here because
  our counters are epoch-tagged and never need a reset pass.

Each accepts exactly ``0`` or ``1`` (unset means ``0``); anything else is a :class:`AsyncLLOptionError` that
names the variable, the value and the allowed values.

The payload transport (``async_ll_transport``, MORI's name; ``MORI_ENABLE_SDMA=1`` asks for ``"sdma"`` as in
MORI) is resolved here too. Only ``"p2p"`` (the send kernel's CU stores into the peers' receive regions) is
lowered. The copy-engine transports are refused with the measured reason (docs/asyncll-copy-engine.md):

* ``"copy_engine"`` (NVIDIA, host-enqueued copies): on one H200 no host-driven copy overlaps a 4096^3 bf16
  matmul (cudaMemcpyAsync, cuMemcpyBatchAsync with PREFER_OVERLAP_WITH_COMPUTE, stream priorities: gains
  1.01-1.06x, the copy time added to the matmul's; bench/copy_engine_overlap.py, session 9), so the one-GPU
  op would gain nothing; the peer-GPU case (copy engines over NVLink) is unmeasured (no multi-GPU machine).
* ``"sdma"`` (AMD): MORI's shmem device bitcode posts SDMA copies but exports no wait for their completion
  (its quiet overloads return at once for SDMA), and the project's runtime creates no SDMA queues.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

__all__ = ["AsyncLLOptions", "AsyncLLOptionError", "AsyncLLPhaseError", "ENV_VARS", "PhaseTracker", "resolve"]

ENV_VARS = {
    "early_notify": "MORI_ASYNCLL_EARLY_NOTIFY",
    "fused_recv": "MORI_ASYNCLL_FUSED_RECV",
    "skip_reset": "MORI_ASYNCLL_SKIP_RESET",
}
SDMA_VAR = "MORI_ENABLE_SDMA"  # MORI's switch: 1 asks for the SDMA transport
TRANSPORTS = ("p2p", "copy_engine", "sdma")
# Why each copy-engine transport is refused (the module docstring has the measurements).
_UNAVAILABLE = {
    "copy_engine": ("on one GPU no host-driven copy overlaps compute (measured on the H200: 1.01-1.06x against a "
                    "4096^3 matmul, docs/asyncll-copy-engine.md); the peer-GPU copy engines are not measured yet"),
    "sdma": ("MORI's shmem device bitcode exports no SDMA completion wait and the project's runtime creates no SDMA "
             "queues (docs/asyncll-copy-engine.md, section 5.4)"),
}


class AsyncLLOptionError(ValueError):
    """An AsyncLL option with a value outside {0, 1}, or a combination the protocol cannot run."""


@dataclass(frozen=True)
class AsyncLLOptions:
    early_notify: bool = False
    fused_recv: bool = False
    skip_reset: bool = False  # accepted, no effect (see the module docstring)
    async_ll_transport: str = "p2p"

    def __post_init__(self):
        for name in ENV_VARS:
            if not isinstance(getattr(self, name), bool):
                raise AsyncLLOptionError(f"AsyncLLOptions.{name} must be a bool, got {getattr(self, name)!r}")
        transport = self.async_ll_transport
        if transport not in TRANSPORTS:
            raise AsyncLLOptionError(f"async_ll_transport={transport!r} is not allowed; allowed: "
                                     f"{', '.join(map(repr, TRANSPORTS))}")  # fmt: skip
        if transport in _UNAVAILABLE:
            raise AsyncLLOptionError(f"async_ll_transport={transport!r} is not available in this version: "
                                     f"{_UNAVAILABLE[transport]}; use 'p2p'")  # fmt: skip
        if self.fused_recv and not self.early_notify:
            raise AsyncLLOptionError(
                "MORI_ASYNCLL_FUSED_RECV=1 needs MORI_ASYNCLL_EARLY_NOTIFY=1: the fused receive waits for the "
                "notifications that only the early-notify send phase posts; set both, or neither")

    @property
    def mode(self) -> str:
        """The protocol variant, as named in the generated IR and the op's configuration."""
        if self.fused_recv:
            return "early_notify_fused_recv"
        return "early_notify" if self.early_notify else "count_after_quiet"

    def ir_attributes(self) -> dict[str, int]:
        """The attributes that carry this mode on the ``mori_ep`` send/recv halves (see dialects/mori_ep.py)."""
        return {"early_notify": int(self.early_notify), "fused_recv": int(self.fused_recv)}

    def as_dict(self) -> dict:
        return asdict(self) | {"mode": self.mode}


def _flag(environ: Mapping[str, str], var: str) -> bool:
    raw = environ.get(var)
    if raw is None:
        return False
    value = raw.strip()
    if value not in ("0", "1"):
        raise AsyncLLOptionError(f"{var}={raw!r} is not allowed: use 0 or 1 (or leave it unset for 0)")
    return value == "1"


def resolve(environ: Mapping[str, str] | None = None, **overrides: bool) -> AsyncLLOptions:
    """The options from ``environ`` (default ``os.environ``), with keyword ``overrides`` taking precedence.

    Called once when an AsyncLL op is constructed; later changes to the environment do not reach that op.
    """
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(ENV_VARS) - {"async_ll_transport"})
    if unknown:
        raise AsyncLLOptionError(f"unknown AsyncLL option(s) {unknown}; allowed: "
                                 f"{sorted([*ENV_VARS, 'async_ll_transport'])}")  # fmt: skip
    values = {name: _flag(environ, var) for name, var in ENV_VARS.items()}
    transport = overrides.pop("async_ll_transport", "sdma" if _flag(environ, SDMA_VAR) else "p2p")
    for name, value in overrides.items():
        if not (isinstance(value, bool) or (type(value) is int and value in (0, 1))):
            raise AsyncLLOptionError(f"AsyncLL option {name}={value!r} is not allowed: use 0 or 1")
        values[name] = bool(value)
    return AsyncLLOptions(**values, async_ll_transport=transport)


class AsyncLLPhaseError(RuntimeError):
    """A send/recv call out of order (recv with no send pending, or a second send before its recv)."""


class PhaseTracker:
    """Host-side order of one AsyncLL op's phases, checked before any kernel is launched.

    Each leg (``dispatch``, ``combine``) alternates send → recv. A recv with no pending send would wait for
    notifications nobody posts (a hang on the GPU), and a second send would overwrite staging the first
    recv has not read (silently wrong output); both are refused here with an error that names the call.
    Combine may only start once a dispatch has completed (it sends back the rows that dispatch received).
    """

    LEGS = ("dispatch", "combine")

    def __init__(self) -> None:
        self._pending = {leg: False for leg in self.LEGS}
        self._dispatched = False

    def pending(self, leg: str) -> bool:
        return self._pending[self._leg(leg)]

    def _leg(self, leg: str) -> str:
        if leg not in self._pending:
            raise ValueError(f"unknown AsyncLL leg {leg!r}; allowed: {', '.join(self.LEGS)}")
        return leg

    def before_send(self, leg: str) -> None:
        leg = self._leg(leg)
        if self._pending[leg]:
            raise AsyncLLPhaseError(f"{leg}_send called twice: call {leg}_recv() to complete the previous "
                                    f"{leg}_send before sending again")  # fmt: skip
        if leg == "combine" and not self._dispatched:
            raise AsyncLLPhaseError("combine_send called before a dispatch completed: call dispatch_send() and "
                                    "dispatch_recv() first")  # fmt: skip
        if leg == "combine" and self._pending["dispatch"]:
            raise AsyncLLPhaseError("combine_send called while dispatch_send is pending: call dispatch_recv() first")

    def after_send(self, leg: str) -> None:
        self._pending[self._leg(leg)] = True

    def before_recv(self, leg: str) -> None:
        leg = self._leg(leg)
        if not self._pending[leg]:
            raise AsyncLLPhaseError(f"{leg}_recv called without a pending {leg}_send: call {leg}_send() first "
                                    f"(a receive with nothing sent would wait forever)")  # fmt: skip

    def after_recv(self, leg: str) -> None:
        leg = self._leg(leg)
        self._pending[leg] = False
        if leg == "dispatch":
            self._dispatched = True

    def reset(self) -> None:
        """Forget pending phases (after ``op.reset()``, which clears the device state too)."""
        self._pending = {leg: False for leg in self.LEGS}
        self._dispatched = False
