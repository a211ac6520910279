"""Built-in example kernels, as MLIR source files shipped with the package.

``mori-compile`` compiles ``ring_put_signal`` when no input is given; ``mori-compile <name>`` compiles
any example by name.
"""

from __future__ import annotations

from importlib.resources import files

from mori_compiler.errors import MoriCompilerError

DEFAULT_EXAMPLE = "ring_put_signal"


def example_names() -> list[str]:
    return sorted(p.name[: -len(".mlir")] for p in files(__name__).iterdir() if p.name.endswith(".mlir"))


def example_source(name: str) -> str:
    if name not in example_names():
        raise MoriCompilerError(f"unknown example '{name}'; built-in examples: {', '.join(example_names())}")
    return files(__name__).joinpath(f"{name}.mlir").read_text()
