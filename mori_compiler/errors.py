"""User-facing errors.

Every error a user can cause (bad IR, bad options, missing files, unresolved symbols) is raised as a
``MoriCompilerError``; the CLIs print it as ``error: <location>: <message>`` and exit 1. Anything else
escaping is a bug in the compiler.
"""

from __future__ import annotations


def _file_location(loc):
    """The first file:line:col location inside an MLIR location (name, call-site and fused locations
    wrap them), or None."""
    for _ in range(64):  # locations nest; a bound keeps a pathological one from looping
        if loc.is_a_file():
            return loc
        if loc.is_a_name():
            loc = loc.child_loc
        elif loc.is_a_callsite():
            loc = loc.callee
        elif loc.is_a_fused():
            inner = [found for found in map(_file_location, loc.locations) if found is not None]
            return inner[0] if inner else None
        else:
            return None
    return None


def location_text(loc, filename: str = "-") -> str:
    """``file:line:col`` of an MLIR location (duck-typed: this module does not import MLIR); MLIR names a
    parsed string "-", which becomes ``filename``. Without a file location: ``filename`` alone."""
    found = _file_location(loc)
    if found is None:
        return filename
    name = filename if found.filename == "-" else found.filename
    if found.start_line == 0:  # the implicit top-level module of a file: point at its start
        return f"{name}:1:1"
    return f"{name}:{found.start_line}:{found.start_col}"


class MoriCompilerError(Exception):
    """An error caused by the user's input, with an optional source location ("file:line:col", or an MLIR
    location, which is formatted here)."""

    def __init__(self, message: str, location=None):
        super().__init__(message)
        self.message = message
        self.location = location if location is None or isinstance(location, str) else location_text(location)

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class ToolchainError(MoriCompilerError):
    """A required external tool (ld.lld, a device bitcode) is missing or unusable."""


def with_filename(exc: MoriCompilerError, filename: str) -> MoriCompilerError:
    """Name the input file in locations that MLIR reported as "-" (it parses strings without one): the
    error's own and those that begin the further lines of its message (one per problem)."""
    if filename == "-":
        return exc
    if exc.location and exc.location.startswith("-:"):
        exc.location = filename + exc.location[1:]
    lines = exc.message.split("\n")
    exc.message = "\n".join(filename + line[1:] if line.startswith("-:") else line for line in lines)
    return exc


def one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line (each error line is one problem), cut at ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
