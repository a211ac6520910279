"""The MORI-IO logger (``logging`` logger ``mori_compiler.io``) and MORI's way to set its level.

MORI's level names (case-insensitive): trace, debug, info, warn, error, critical; ``trace`` is a level of
ours below DEBUG. The initial level comes from ``MORI_IO_LOG_LEVEL``, else ``MORI_GLOBAL_LOG_LEVEL``, else
``error``, as in MORI; ``set_log_level`` overrides it. Unlike MORI, which turns any other string into
``error`` without a word, an unknown name is refused (``set_log_level``) or warned about (environment);
``"warning"``, which MORI's own benchmark passes meaning *warn*, is accepted as an alias of ``warn``.
"""

from __future__ import annotations

import logging
import os

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

LOGGER = logging.getLogger("mori_compiler.io")

LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_ALIASES = {"warning": "warn"}
DEFAULT_LEVEL = "error"


def level_of(name: str) -> int:
    """The ``logging`` level of a MORI level name; ``ValueError`` naming the allowed ones."""
    if not isinstance(name, str):
        raise TypeError(f"log level must be a str, not {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in LEVELS:
        raise ValueError(f"unknown MORI-IO log level {name!r} (allowed, any case: {', '.join(LEVELS)})")
    return LEVELS[key]


def set_log_level(level: str) -> None:
    """Set the level of the MORI-IO logger (overrides ``MORI_IO_LOG_LEVEL``)."""
    LOGGER.setLevel(level_of(level))


def _level_from_environment() -> int:
    for variable in ("MORI_IO_LOG_LEVEL", "MORI_GLOBAL_LOG_LEVEL"):
        value = os.environ.get(variable)
        if value:
            try:
                return level_of(value)
            except ValueError as exc:
                LOGGER.warning("%s: %s; using %r", variable, exc, DEFAULT_LEVEL)
                break
    return LEVELS[DEFAULT_LEVEL]


LOGGER.setLevel(_level_from_environment())
