"""User-facing errors.

Every error a user can cause (bad IR, bad options, missing files, unresolved symbols) is raised as a
``MoriCompilerError``; the CLIs print it as ``error: <location>: <message>`` and exit 1. Anything else
escaping is a bug in the compiler.
"""

from __future__ import annotations


class MoriCompilerError(Exception):
    """An error caused by the user's input, with an optional source location ("file:line:col")."""

    def __init__(self, message: str, location: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class ToolchainError(MoriCompilerError):
    """A required external tool (ld.lld, a device bitcode) is missing or unusable."""


def with_filename(exc: MoriCompilerError, filename: str) -> MoriCompilerError:
    """Name the input file in a location that MLIR reported as "-" (it parses strings without one)."""
    if exc.location and exc.location.startswith("-:") and filename != "-":
        exc.location = filename + exc.location[1:]
    return exc
