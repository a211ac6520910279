"""Seed inputs of the fuzzer: the lit inputs with the mori-opt options their RUN lines use, the built-in
examples and the EP / shmem modules that ``mori-compile`` takes."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SPLIT_MARKER = b"// -----"
# Pipelines every input is also tried with (the lit RUN lines use these).
COMMON_OPT_VARIANTS = (
    [],
    ["-p", "mori-shmem-to-abi"],
    ["--split-input-file", "-p", "mori-shmem-to-abi"],
    ["-p", "mori-ep-to-kernels{wave-size=64},mori-comm-to-calls{wave-size=64}", "--split-input-file"],
    ["-p", "mori-ep-to-kernels{wave-size=32},mori-comm-to-calls{wave-size=32}"],
    ["-p", "mori-virtual-pe-args", "--split-input-file"],
    ["--split-input-file", "--mlir-print-op-generic"],
)
_OPT_FLAGS_WITHOUT_INPUT = {"--list-passes", "--emit-irdl", "--show-dialects"}
_SHELL_STOP = {"|", ">", "2>&1", "2>", "<", "&&", ";", "||"}


@dataclass
class Seed:
    name: str  # path relative to the repository (plus #chunk for a split file's chunk)
    data: bytes
    opt_variants: list[list[str]] = field(default_factory=list)


def strip_comments(data: bytes) -> bytes:
    """Without `//` comment lines (RUN/CHECK lines and prose), keeping the `// -----` split markers."""
    lines = data.splitlines(keepends=True)
    return b"".join(line for line in lines if not line.lstrip().startswith(b"//") or line.startswith(SPLIT_MARKER))


def opt_options_of_run_lines(text: str) -> list[list[str]]:
    """The mori-opt options of each `RUN:` line that feeds the file (%s) to mori-opt."""
    variants = []
    for run in re.findall(r"RUN:(.*)", text):
        try:
            words = shlex.split(run)
        except ValueError:
            continue
        for k, word in enumerate(words):
            if word != "mori-opt":
                continue
            options, rest = [], words[k + 1 :]
            for w in rest:
                if w in _SHELL_STOP or w.startswith((">", "2>")):
                    break
                options.append(w)
            if "%s" not in options or _OPT_FLAGS_WITHOUT_INPUT & set(options) or "no-such-pass" in " ".join(options):
                continue
            cleaned, skip = [], False
            for w in options:
                if skip:
                    skip = False
                elif w == "-o":
                    skip = True
                elif w != "%s" and not w.startswith("%"):
                    cleaned.append(w)
            if cleaned not in variants:
                variants.append(cleaned)
    return variants


def lit_seeds(root: Path = REPO_ROOT) -> list[Seed]:
    seeds = []
    for path in sorted((root / "test" / "lit").rglob("*.mlir")):
        raw = path.read_bytes()
        variants = opt_options_of_run_lines(raw.decode("utf-8", "replace"))
        data = strip_comments(raw)
        if data.strip():
            seeds.append(Seed(str(path.relative_to(root)), data, variants))
    return seeds


def example_seeds(root: Path = REPO_ROOT) -> list[Seed]:
    return [Seed(str(p.relative_to(root)), strip_comments(p.read_bytes()))
            for p in sorted((root / "mori_compiler" / "examples").glob("*.mlir"))]  # fmt: skip


# Small modules shaped like the defect classes of issue 11, so that mutants also start next to them.
_KERNEL = """module attributes {{gpu.container_module}} {{
  gpu.module @m {{
    gpu.func @{name}(%p: !llvm.ptr) kernel{attrs} {{
{body}      gpu.return
    }}
  }}
}}
"""
DEFECT_SEEDS = {
    "two gpu.modules, no terminator": (
        "module attributes {gpu.container_module} {\n  gpu.module @a {\n    gpu.func @k() kernel {\n"
        "      %0 = \"mori_shmem.my_pe\"() : () -> i32\n    }\n  }\n  gpu.module @b {\n"
        "    gpu.func @k() kernel {\n    }\n  }\n}\n"),
    "index dense array": "func.func @f() attributes {a = array<index: 1>} {\n  return\n}\n",
    "symbol with a space": _KERNEL.format(name='"a b"', attrs="", body=""),
    "launch bounds": _KERNEL.format(name="k", attrs=" attributes {known_block_size = array<i32: 2147483648, 1, 1>}",
                                    body=""),
    "shmem op in a gpu.module": (
        "module attributes {gpu.container_module} {\n  gpu.module @m {\n"
        "    %0 = \"mori_shmem.my_pe\"() : () -> i32\n    gpu.func @k() kernel {\n      gpu.return\n    }\n  }\n}\n"),
    "non-UTF-8 symbol": (
        "module attributes {gpu.container_module} {\n  gpu.module @m {\n    llvm.func @\"\\ff\"()\n"
        "    gpu.func @k() kernel {\n      gpu.return\n    }\n  }\n}\n"),
    "non-UTF-8 dtype": _KERNEL.format(name="k", attrs="", body=(
        "      %n = arith.constant 16 : i64\n"
        "      \"mori_comm.accumulate_rows\"(%p, %n, %p) {dtype = \"\\c3\\28\"} : (!llvm.ptr, i64, !llvm.ptr) -> ()\n")),
}


def defect_seeds() -> list[Seed]:
    return [Seed(f"defect: {name}", text.encode()) for name, text in DEFECT_SEEDS.items()]


def compile_seeds(root: Path = REPO_ROOT) -> list[Seed]:
    """Modules for mori-compile: the examples and the lit chunks that hold a gpu.module (shmem kernels,
    EP ops at the top of a gpu.module)."""
    seeds = example_seeds(root) + defect_seeds()
    for seed in lit_seeds(root):
        for k, chunk in enumerate(seed.data.split(SPLIT_MARKER)):
            if b"gpu.module" in chunk and (b"mori_shmem." in chunk or b"mori_ep." in chunk or b"mori_comm." in chunk):
                seeds.append(Seed(f"{seed.name}#{k}", chunk.lstrip(b"\n")))
    return seeds
