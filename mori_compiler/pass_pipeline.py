"""Textual pass pipelines that mix the project's Python passes with upstream MLIR passes.

Python passes are not in MLIR's registry, so ``PassManager.parse`` cannot see them. This module splits
a pipeline such as ``builtin.module(mori-shmem-to-abi,gpu.module(convert-gpu-to-rocdl{chipset=gfx942}))``
into its top-level elements, instantiates project passes (options ``{key=value ...}`` become dataclass
fields) and hands every other element to MLIR as text.
"""

from __future__ import annotations

import dataclasses

from mori_compiler._mlir import ir, passmanager
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


def build_pass_manager(pipeline: str, ctx: ir.Context) -> passmanager.PassManager:
    """A PassManager on builtin.module for ``pipeline`` (with or without the builtin.module anchor)."""
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
