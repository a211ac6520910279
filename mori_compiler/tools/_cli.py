"""What both CLIs share: exit codes and turning errors into one-line messages (never a traceback)."""

from __future__ import annotations

import errno
import os
import sys
from typing import Callable

from mori_compiler.errors import MoriCompilerError

EXIT_OK, EXIT_USER_ERROR, EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


def report(exc: MoriCompilerError, stream=None) -> None:
    stream = stream or sys.stderr
    first, *rest = str(exc).split("\n")
    print(f"error: {first}", file=stream)
    for line in rest:
        print(line if line.startswith("  ") else f"error: {line}", file=stream)


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    try:
        return main(argv)
    except MoriCompilerError as exc:
        report(exc)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        if exc.errno not in _FULL_OUTPUT_ERRNOS:
            return _internal_error(exc)
        print(f"error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        return _internal_error(exc)


# A full disk or a failing output device (stdout redirected to /dev/full): the environment, not a bug.
_FULL_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


def _internal_error(exc: Exception) -> int:
    """A compiler bug: said in one line; the traceback only on request."""
    if os.environ.get("MORI_COMPILER_TRACEBACK"):
        raise exc
    print(f"error: internal compiler error: {type(exc).__name__}: {exc} "
          "(set MORI_COMPILER_TRACEBACK=1 for the traceback, and please report it)", file=sys.stderr)  # fmt: skip
    return EXIT_INTERNAL_ERROR


MAX_INPUT_BYTES = 256 << 20


def read_input(path: str) -> tuple[str, str]:
    """(text, display name) of a file or of stdin ("-")."""
    display = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:  # also ends reading an endless device (/dev/zero) instead of hanging
            raise MoriCompilerError(f"{display} is larger than {MAX_INPUT_BYTES >> 20} MiB; inputs are MLIR text files")
        return data.decode("utf-8"), display
    except UnicodeDecodeError as exc:
        from mori_compiler.dialects.input_checks import file_not_utf8_message

        raise MoriCompilerError(file_not_utf8_message(data, display, exc)) from None
    except FileNotFoundError:
        raise MoriCompilerError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise MoriCompilerError(f"{path} is a directory, not an input file") from None
    except OSError as exc:
        raise MoriCompilerError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeEncodeError):  # a NUL or a lone surrogate in the name (from JSON)
        raise MoriCompilerError(f"{path!r} is not a valid file name") from None


def write_output(path: str | None, data: str | bytes) -> None:
    if path in (None, "-"):
        try:
            if isinstance(data, bytes):
                sys.stdout.buffer.write(data)
            else:
                sys.stdout.write(data)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:  # e.g. stdout redirected to a full disk (/dev/full)
            raise MoriCompilerError(f"cannot write to stdout: {exc.strerror}") from None
        return
    try:
        with open(path, "wb") as f:  # text as UTF-8, whatever the locale
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    except OSError as exc:
        raise MoriCompilerError(f"cannot write {path}: {exc.strerror}") from None


class ArgumentError(MoriCompilerError):
    pass


def error_on_bad_args(parser) -> None:
    """Make argparse report usage errors as our errors (exit 1, one line) instead of exit 2."""

    def error(message):
        raise ArgumentError(f"{message} (see {parser.prog} --help)")

    parser.error = error
