"""``TransferStatus``, the completion state of one transfer, and ``wait_all`` over several.

A status starts at ``INIT``; the engine sets ``IN_PROGRESS`` when it issues the transfer and the backend
later sets ``SUCCESS`` or an error code, from its own thread (``Update``, ``SetCode``) or when asked:
a backend without a completion thread (GPU-IPC: an event query) installs a *progress callback*, a
non-blocking poll that ``Code()`` and the predicates run while the status is in progress, and may install
a *wait callback*, a blocking completion, that ``Wait()`` runs instead of sleeping. Callbacks must not
hold the status's lock (they are called without it) and may be called from several threads at once.

Threads: the code and message are guarded by one condition variable; ``Update``/``SetCode`` wake the
waiters. ``Wait``/``WaitFor`` sleep on it and so release the GIL. Two differences from MORI, both so that
a status never waits on a wake-up nobody sends: a waiter with a progress callback polls it every
millisecond (MORI's bounded wait polls only when woken, so it ran to its deadline), and ``InProgress()``
yields the GIL once (``time.sleep(0)``) when the transfer is still running, so that a ``while
s.InProgress(): pass`` loop, as MORI's tests write, lets Python I/O threads complete it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Optional

from . import checks
from .enums import StatusCode

_POLL_INTERVAL_S = 0.001  # how often a waiter runs the progress callback
_IN_PROGRESS = StatusCode.IN_PROGRESS


def _code(where: str, value) -> StatusCode:
    return checks.member(where, value, StatusCode)


def _timeout(where: str, value) -> int:
    return checks.integer(where, value, *checks.I32)


class TransferStatus:
    """The state of one transfer: MORI's ``TransferStatus`` (method names and semantics as MORI's)."""

    __slots__ = ("_cond", "_code", "_message", "_progress", "_wait")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._code = StatusCode.INIT
        self._message = ""
        self._progress: Optional[Callable[[], None]] = None
        self._wait: Optional[Callable[[], None]] = None

    def __repr__(self) -> str:
        return f"TransferStatus({self._code.name}, {self._message!r})"

    # ---- reading ----

    def Code(self) -> StatusCode:
        """The code, after one progress poll if the transfer is in progress."""
        self._poll()
        return self._code

    def Message(self) -> str:
        with self._cond:
            return self._message

    def Init(self) -> bool:
        return self.Code() is StatusCode.INIT

    def InProgress(self) -> bool:
        if self.Code() is not _IN_PROGRESS:
            return False
        time.sleep(0)  # let other Python threads (a backend's I/O thread) run
        return True

    def Succeeded(self) -> bool:
        return self.Code() is StatusCode.SUCCESS

    def Failed(self) -> bool:
        return self.Code().failed

    # ---- writing (the engine and backends) ----

    def Update(self, code, msg: str) -> None:
        """Set code and message and wake the waiters, unless the status already holds an error: the first
        error wins (a transfer in several parts fails with its first failing part's code)."""
        code = _code("TransferStatus.Update code", code)
        msg = checks.string("TransferStatus.Update msg", msg)
        with self._cond:
            if self._code.failed:
                return
            self._code, self._message = code, msg
            self._cond.notify_all()

    def SetCode(self, code, msg: Optional[str] = None) -> None:
        """Set the code unconditionally (and the message, if given); wakes the waiters unless the new code is
        ``INIT`` or ``IN_PROGRESS``."""
        code = _code("TransferStatus.SetCode code", code)
        if msg is not None:
            msg = checks.string("TransferStatus.SetCode msg", msg)
        with self._cond:
            self._code = code
            if msg is not None:
                self._message = msg
            if code not in (StatusCode.INIT, _IN_PROGRESS):
                self._cond.notify_all()

    def SetMessage(self, msg: str) -> None:
        msg = checks.string("TransferStatus.SetMessage msg", msg)
        with self._cond:
            self._message = msg

    def SetProgressCallback(self, callback: Optional[Callable[[], None]]) -> None:
        """A non-blocking poll that completes the status when the transfer is done (or None)."""
        self._progress = self._callback("SetProgressCallback", callback)

    def SetWaitCallback(self, callback: Optional[Callable[[], None]]) -> None:
        """A blocking wait for the transfer, run by ``Wait()``/``WaitFor(<0)`` (or None)."""
        self._wait = self._callback("SetWaitCallback", callback)

    @staticmethod
    def _callback(where: str, callback):
        if callback is not None and not callable(callback):
            raise TypeError(f"TransferStatus.{where} takes a callable or None, not {type(callback).__name__}")
        return callback

    # ---- waiting ----

    def Wait(self) -> None:
        """Block until the transfer is no longer in progress (``WaitFor(-1)``)."""
        self.WaitFor(-1)

    def WaitFor(self, timeout_ms: int = -1) -> StatusCode:
        """Wait for completion: ``timeout_ms < 0`` without limit (through the wait callback if there is
        one), ``0`` one poll, ``> 0`` up to that many milliseconds. Returns the code, which is still
        ``IN_PROGRESS`` after a bounded wait that timed out. A status that is not in progress (never
        issued, or done) returns at once."""
        timeout_ms = _timeout("TransferStatus.WaitFor timeout_ms", timeout_ms)
        if self._code is not _IN_PROGRESS:
            return self._code
        wait = self._wait
        if timeout_ms < 0 and wait is not None:
            wait()  # blocks until done: a poll first would only cost a driver call
            return self._code
        self._poll()
        if timeout_ms == 0:
            return self._code
        if timeout_ms < 0:
            return self._sleep_until(None)
        return self._sleep_until(time.monotonic() + timeout_ms / 1000)

    def _poll(self) -> None:
        progress = self._progress
        if progress is not None and self._code is _IN_PROGRESS:
            progress()

    def _sleep_until(self, deadline: Optional[float]) -> StatusCode:
        while True:
            with self._cond:
                if self._code is not _IN_PROGRESS:
                    return self._code
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    return self._code
                if self._progress is not None:
                    timeout = _POLL_INTERVAL_S if timeout is None else min(timeout, _POLL_INTERVAL_S)
                self._cond.wait(timeout)
            self._poll()


def wait_all(statuses: Iterable[Optional[TransferStatus]], timeout_ms: int = -1) -> StatusCode:
    """Wait for several statuses (``None`` entries are skipped), MORI's ``IOEngine::WaitAll``:

    * no status: ``SUCCESS``;
    * ``timeout_ms == 0``: poll each once; the first code that is neither ``SUCCESS`` nor ``IN_PROGRESS``,
      else ``IN_PROGRESS`` if any is, else ``SUCCESS``;
    * ``< 0``: wait for every one in turn; the first code that is not ``SUCCESS`` (so a status never
      issued, still ``INIT``, counts as a failure), else ``SUCCESS``;
    * ``> 0``: the same with one deadline for all; when it passes, the first error seen so far, else
      ``IN_PROGRESS``.
    """
    timeout_ms = _timeout("wait_all timeout_ms", timeout_ms)
    statuses = list(statuses)
    for i, status in enumerate(statuses):
        if status is not None and not isinstance(status, TransferStatus):
            raise TypeError(f"wait_all statuses[{i}] must be a TransferStatus or None, not {type(status).__name__}")
    statuses = [s for s in statuses if s is not None]
    if timeout_ms == 0:
        any_in_progress = False
        for status in statuses:
            code = status.WaitFor(0)
            if code is _IN_PROGRESS:
                any_in_progress = True
            elif code is not StatusCode.SUCCESS:
                return code
        return _IN_PROGRESS if any_in_progress else StatusCode.SUCCESS
    first_error = StatusCode.SUCCESS
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
    for status in statuses:
        if deadline is None:
            code = status.WaitFor(-1)
        else:
            now = time.monotonic()
            if now >= deadline:
                return first_error if first_error is not StatusCode.SUCCESS else _IN_PROGRESS
            code = status.WaitFor(int((deadline - now) * 1000))  # truncated, as MORI's duration_cast
            if code is _IN_PROGRESS:
                return first_error if first_error is not StatusCode.SUCCESS else _IN_PROGRESS
        if code is not StatusCode.SUCCESS and first_error is StatusCode.SUCCESS:
            first_error = code
    return first_error
