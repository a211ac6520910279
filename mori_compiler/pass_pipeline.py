"""Textual pass pipelines that mix the project's Python passes with upstream MLIR passes.

Python passes are not in MLIR's registry, so ``PassManager.parse`` cannot see them. This module splits
a pipeline such as ``builtin.module(mori-shmem-to-abi,gpu.module(convert-gpu-to-rocdl{chipset=gfx942}))``
into its top-level elements, instantiates project passes (options ``{key=value ...}`` become dataclass
fields) and hands every other element to MLIR as text.
"""

from __future__ import annotations

import dataclasses
import re

from mori_compiler._mlir import ir, passmanager
from mori_compiler.dialects.input_checks import NVVM_CHIP
from mori_compiler.errors import MoriCompilerError
from mori_compiler.passes import ALL_PASSES, get_pass_class


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside (), {} or []."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth < 0:
                raise MoriCompilerError(f"unbalanced ')' in pass pipeline: {text}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise MoriCompilerError(f"unbalanced parentheses in pass pipeline: {text}")
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _strip_anchor(text: str) -> str:
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        return text[len("builtin.module(") : -1]
    return text


def _parse_options(name: str, cls: type, text: str) -> dict:
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
    options = {}
    for item in text.split():
        key, eq, value = item.partition("=")
        if key not in fields:
            allowed = ", ".join(fields) or "none"
            raise MoriCompilerError(f"pass '{name}' has no option '{key}' (options: {allowed})")
        f = fields[key]
        if not eq:
            raise MoriCompilerError(f"pass '{name}' option '{key}' needs a value ({key}=...)")
        if f.type in (int, "int"):
            try:
                options[f.name] = int(value)
            except ValueError:
                raise MoriCompilerError(f"pass '{name}' option '{key}' expects an integer, got '{value}'") from None
        elif f.type in (bool, "bool"):
            if value not in ("true", "false", "1", "0"):
                raise MoriCompilerError(f"pass '{name}' option '{key}' expects true or false, got '{value}'")
            options[f.name] = value in ("true", "1")
        else:
            options[f.name] = value
    return options


def make_project_pass(element: str):
    """Instantiate a project pass from ``name`` or ``name{opt=value ...}``; None if not ours."""
    name, brace, rest = element.partition("{")
    name = name.strip()
    cls = get_pass_class(name)
    if cls is None:
        return None
    if brace and not rest.endswith("}"):
        raise MoriCompilerError(f"malformed options for pass '{name}': {element}")
    return cls(**_parse_options(name, cls, rest[:-1] if brace else ""))


_ATTACH_TARGET = re.compile(r"([\w-]+-attach-target)\s*(?:\{([^}]*)\})?")
ABI_VERSIONS = ("400", "500", "600")


def check_attach_target_options(pipeline: str) -> None:
    """Refuse options the ``*-attach-target`` passes turn into an invalid target attribute: MLIR builds
    it with an asserting ``get`` (an abort), not a diagnostic. Rules as the attributes' verifiers:
    ``O`` in 0..3, ``chip`` and ``triple`` not empty, ROCDL's ``abi`` one of 400, 500, 600, NVVM's chip an
    SM name."""
    for m in _ATTACH_TARGET.finditer(pipeline):
        name, options = m.group(1), m.group(2) or ""
        for item in options.split():
            key, _, value = item.partition("=")
            problem = None
            if key == "O" and not (value.isdigit() and int(value) <= 3):
                problem = "must be 0, 1, 2 or 3"
            elif key in ("chip", "triple") and not value:
                problem = "must not be empty"
            elif key == "abi" and name == "rocdl-attach-target" and value not in ABI_VERSIONS:
                problem = f"must be one of {', '.join(ABI_VERSIONS)}"
            elif key == "chip" and name == "nvvm-attach-target" and not NVVM_CHIP.fullmatch(value):
                problem = "must be an SM name such as sm_90"
            if problem:
                raise MoriCompilerError(f"pass '{name}' option {key}={value!r} {problem}")
        for key in ("chip", "triple"):  # `chip=` directly before the closing brace or another option
            if re.search(rf"(?:^|\s){key}=(?:\s|$)", options):
                raise MoriCompilerError(f"pass '{name}' option {key}='' must not be empty")


def build_pass_manager(pipeline: str, ctx: ir.Context) -> passmanager.PassManager:
    """A PassManager on builtin.module for ``pipeline`` (with or without the builtin.module anchor)."""
    try:
        pipeline.encode("utf-8")
    except UnicodeEncodeError:  # bytes of a command line that are not UTF-8 (Python keeps them as surrogates)
        raise MoriCompilerError(f"the pass pipeline {pipeline!r} is not valid UTF-8 text") from None
    check_attach_target_options(pipeline)
    with ctx:
        pm = passmanager.PassManager("builtin.module")
        for element in split_top_level(_strip_anchor(pipeline)):
            project_pass = make_project_pass(element)
            if project_pass is not None:
                pm.add(project_pass, project_pass.name)
                continue
            nested = [n for n in ALL_PASSES if n in element]
            if nested:
                raise MoriCompilerError(
                    f"project pass '{nested[0]}' must be a top-level element of the pipeline "
                    "(it runs on the whole module)"
                )
            try:
                pm.add(element)
            except ValueError as exc:
                detail = " ".join(str(exc).split("\n")[0].split())  # MLIR appends a caret snippet: keep line 1
                raise MoriCompilerError(
                    f"invalid pass pipeline element '{element}' ({detail}); project passes: "
                    f"{', '.join(sorted(ALL_PASSES))}; upstream MLIR passes are accepted by name"
                ) from None
    return pm
