"""Delta debugging (ddmin) of a failing input: first on lines, then on bytes, bounded in time.

``still_fails(candidate_bytes) -> bool`` decides whether a smaller input still shows the same defect
(the caller compares verdict signatures). The result is 1-minimal only when the budget allows.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence


def ddmin(items: Sequence, still_fails: Callable[[list], bool], deadline: float) -> list:
    """Zeller's ddmin over ``items``: remove chunks (complements) while the failure persists."""
    items = list(items)
    n = 2
    while len(items) >= 2 and time.monotonic() < deadline:
        chunk = max(1, len(items) // n)
        reduced = False
        for start in range(0, len(items), chunk):
            if time.monotonic() >= deadline:
                break
            candidate = items[:start] + items[start + chunk :]
            if candidate and still_fails(candidate):
                items, n, reduced = candidate, max(n - 1, 2), True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(items), n * 2)
    return items


def reduce_input(data: bytes, still_fails: Callable[[bytes], bool], seconds: float = 20.0,
                 bytes_too: bool = True) -> bytes:
    """The smallest input found within ``seconds`` that still fails: lines first, then bytes."""
    deadline = time.monotonic() + seconds
    lines = data.splitlines(keepends=True)
    lines = ddmin(lines, lambda ls: still_fails(b"".join(ls)), deadline)
    data = b"".join(lines)
    if bytes_too and len(data) <= 4096:  # byte-level only on small inputs: its cost grows with the length
        data = bytes(ddmin(list(data), lambda bs: still_fails(bytes(bs)), deadline))
    return data
