"""Outcome classes of a CLI run, and the signature that failures are deduplicated by.

Classes (first that applies):
  hang        the run did not finish within the timeout
  crash       killed by a signal (SIGABRT, SIGSEGV, ...), or stderr shows an LLVM/MLIR fatal error
              ("LLVM ERROR", "UNREACHABLE", "Assertion ... failed", nanobind's "GIL was not held")
  traceback   "Traceback (most recent call last)" on stdout or stderr
  internal    exit status 2 (internal compiler error), or any status other than 0 and 1
  unlocated   exit 1 with an `error:` line that is about the input's content but has no location in it
              (see ``unlocated_reason`` for the rule), or exit 1 without any `error:` line
  user_error  exit 1, every `error:` line located or about an option / the input as a whole
  ok          exit 0

Rule for "about the content" (mori-opt, mori-compile on a file), for each `error:` line in turn:
1. it holds ``NAME:LINE:COL`` with NAME one of the run's input names (the file given, ``<stdin>``, a
   built-in example's ``<example NAME>``): located, fine. A location in another text (``-:3:49`` of
   generated MLIR) does not count;
2. it names an option by its flag (``--bitcode``, ``-p``), says "pass pipeline", or quotes the value of
   an option given on the command line (``unknown target 'gfx900'``, ``code object version -1``;
   not a ``-p`` pipeline, whose passes a content error may name): fine, it is about that option;
3. it is about bytes ("UTF-8", "byte", "codec", "decode"): unlocated (a bad byte has a position);
4. it names the input file as a whole (NAME not followed by ``:digit``): fine (missing, unreadable, no
   gpu.module in it, ...);
5. it mentions an IR entity: a dialect-qualified name (``nvvm.maxntid``, ``gpu.module``), an
   ``@symbol``, "op", "attribute", "operand", "region", "terminator", "parameter", "kernel": unlocated;
6. it names an option by what it sets ("target", "bitcode", "code object version", a pass...): fine;
7. anything else: unlocated (it says neither where in the file nor which option is wrong).

For ``--precompile CONFIGS.json`` the unit is the list entry: every `error:` line must name an entry
("config 3", "entry 3") or be about the JSON file as a whole (its name); other exit-1 errors are
``unlocated``. An `error:` glued behind other output on the same line (the progress bar) is
``unlocated`` too.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

from .executor import Case, RunResult

OUTCOMES = ("ok", "user_error", "unlocated", "internal", "crash", "traceback", "hang")
FAILURES = frozenset({"unlocated", "internal", "crash", "traceback", "hang"})

FATAL_MARKERS = ("LLVM ERROR", "UNREACHABLE", "Assertion", "GIL was not held", "incref_check", "decref_check",
                 "Segmentation fault", "Fatal Python error", "terminate called")  # fmt: skip
TRACEBACK = "Traceback (most recent call last)"
FLAG = re.compile(r"(?:^|[\s'\"(=])--[a-z][\w-]+|(?:^|[\s'\"(])-[pO]\b")  # --target, --bitcode, -p, -O
# An option by its flag or by what it sets (checked after IR entities: "the target runs 32" of an op is not).
OPTION_WORDS = re.compile(r"(?:^|[\s'\"(=])--?[A-Za-z][\w-]*|\bpass(?:es)?\b|\bpipeline\b|\btarget\b|\bbitcode\b"
                          r"|code object version|optimization level|cannot write|\boutput\b|\bstage\b|\bemit\b")
IR_ENTITY = re.compile(
    r"\b[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_.]*\b(?<!\.mlir)(?<!\.json)(?<!\.hsaco)(?<!\.ptx)(?<!\.bc)(?<!\.ll)"
    r"|@\S|\bop\b|\bops\b|\battribute|\boperand|\bregion|\bterminator|\bparameter|\bkernel\b"
)  # fmt: skip
BYTES = re.compile(r"\bUTF-?8\b|\butf-?8\b|\bbytes?\b|\bcodec\b|\bdecode\b")
ENTRY = re.compile(r"\b(?:config|entry|configs?\[)\s*\[?\d+")


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str  # the stderr line (or fact) that decided it
    signature: str  # outcome + tool + normalized reason: one defect class

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def normalize(line: str) -> str:
    """A stderr line without what varies between instances of one defect: paths, locations, numbers,
    quoted names."""
    line = re.sub(r"^python[\d.]*: ", "", line)  # the program name before an assertion message
    line = re.sub(r"^.*?\[#* *\] \d+/\d+ .*?(?=error:)", "PROGRESS ", line)  # what precedes a glued error:
    line = re.sub(r"\S*:\d+:\d+:?", "LOC", line)
    line = re.sub(r"(?<![\w])/\S+", "PATH", line)
    line = re.sub(r"@\"(?:[^\"\\]|\\.)*\"|@[\w$.-]+", "@SYM", line)
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line)
    line = re.sub(r"\{[^{}]*\}|\[[^\[\]]*\]", "…", line)  # Python reprs of values: {}, [...]
    line = re.sub(r"\bgot (?:a |an )?\w+\b.*", "got …", line)  # "must be int, got bool True"
    line = re.sub(r"(not found|no such file|cannot read|is a directory)(:?) .*", r"\1\2 …", line)
    line = re.sub(r"\bnot (?:a |an )?(?:dict|list|float|int|bool|str|NoneType)\b", "not T", line)
    line = re.sub(r"0x[0-9a-fA-F]+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", "N", line)
    return re.sub(r"\s+", " ", line).strip()[:160]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def _located(line: str, names: list[str]) -> bool:
    return any(re.search(re.escape(n) + r":\d+:\d+", line) for n in names)


def _names_option_value(message: str, option_values: list[str]) -> bool:
    """Whether the message quotes the value of a command-line option (`'gfx900'`, `-1`, a pipeline)."""
    return any(f"'{v}'" in message or f'"{v}"' in message
               or (v and re.search(r"(?<![\w.-])" + re.escape(v) + r"(?![\w.-])", message)) for v in option_values)  # fmt: skip


def option_values(argv: list[str], names: list[str]) -> list[str]:
    """The words of a command line that may be option values: each word after a flag, but flags, the
    input names and pipelines (a pass error that merely names its pass is not an option error)."""
    return [a for i, a in enumerate(argv) if i and argv[i - 1].startswith("-") and argv[i - 1] != "-"
            and argv[i - 1] not in ("-p", "--pass-pipeline") and not a.startswith("--") and a not in names]  # fmt: skip


def unlocated_reason(line: str, names: list[str], precompile: bool = False,
                     values: list[str] = ()) -> str | None:  # fmt: skip
    """Why an `error:` line breaks the location rule (module docstring), or None when it is fine."""
    if not line.startswith("error:"):
        return "error: glued behind other output"
    message = line[len("error:"):].strip()
    if precompile:
        if ENTRY.search(message) or any(n in message for n in names):
            return None
        return "names neither a config entry nor the file"
    if _located(message, names):
        return None
    if _names_option_value(message, list(values)) or FLAG.search(message) or "pass pipeline" in message:
        return None  # about an option: it quotes the option's value, names its flag or the pipeline
    if BYTES.search(message):
        return "about bytes of the input (they have a position), without a location"
    if any(re.search(re.escape(n) + r"(?!:\d)", message) for n in names):
        return None  # the file as a whole: missing, unreadable, holds no gpu.module, ...
    if IR_ENTITY.search(message):
        return "about the input's content, without a location"
    if OPTION_WORDS.search(message):
        return None
    return "neither located nor about an option or the file"


def input_names(case: Case) -> list[str]:
    names = case.input_names()
    argv = case.argv
    if case.tool == "compile" and not names:  # a built-in example (the default: ring_put_signal)
        positional = [a for a in argv if not a.startswith("-")]
        names = [f"<example {positional[0] if positional else 'ring_put_signal'}>"]
    return names


def classify(case: Case, result: RunResult) -> Verdict:
    tool = "precompile" if "--precompile" in case.argv else case.tool
    err, out = _text(result.stderr), _text(result.stdout)

    def verdict(outcome: str, reason: str) -> Verdict:
        return Verdict(outcome, reason, f"{outcome}|{tool}|{normalize(reason)}")

    if result.timed_out:
        return verdict("hang", "timeout")
    fatal = next((line for line in err.splitlines() if any(m in line for m in FATAL_MARKERS)), None)
    if result.signal is not None or fatal:
        name = _signal.Signals(result.signal).name if result.signal else f"exit {result.exit_code}"
        return verdict("crash", fatal or f"killed by {name}: {_last_line(err)}")
    if TRACEBACK in err or TRACEBACK in out:
        return verdict("traceback", _last_line(err if TRACEBACK in err else out))
    if result.exit_code == 2:
        lines = error_lines(err)
        ice = next((line for line in lines if "internal compiler error" in line), None)
        return verdict("internal", ice or next(iter(lines), _last_line(err)))
    if result.exit_code == 0:
        return verdict("ok", "")
    if result.exit_code != 1:
        return verdict("internal", f"exit status {result.exit_code}: {_last_line(err)}")
    lines = error_lines(err)
    if not lines:
        return verdict("unlocated", f"exit 1 without an error: line: {_last_line(err)}")
    names = input_names(case)
    if tool == "precompile":
        names = [a for a in case.argv if a in case.files] or names
    values = option_values(case.argv, names)
    for line in lines:
        why = unlocated_reason(line, names, precompile=tool == "precompile", values=values)
        if why:
            return verdict("unlocated", line)
    return verdict("user_error", lines[0])


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
