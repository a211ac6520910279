"""The ``mori_example`` dialect (docs/extending.md, part 2): its IRDL file plus this small module.

The module has the shape of every project dialect: its declaration ``DIALECT`` (the name, the IRDL text,
loading it into a context once, ``extra_verify`` for the rules IRDL cannot state: none here) and one typed
builder per op with the ``(operands..., *, loc, ip)`` signature of the project's builders.

``register()`` adds the dialect and its pass to the project's registries at run time (the example edits no
file of the project); a dialect of the project itself is listed in ``dialects/registry.py`` instead, and its
pass in ``passes/__init__.py`` (docs/extending.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mori_compiler._mlir import ir

DIALECT_NAME = "mori_example"
IRDL_FILE = Path(__file__).with_name("mori_example.irdl.mlir")
PASS_NAME = "mori-example-to-shmem"


def extra_verify(op: ir.Operation) -> list[str]:
    """Cross-field rules IRDL cannot state; messages name the op and the field. None for these ops."""
    return []


@dataclass(frozen=True)
class ExampleDialect:
    """The dialect's declaration, in the shape of ``dialects/dialect_base.Dialect`` (what the registry
    reads: ``name``, ``irdl_source()``, ``register_and_load(ctx)``, ``extra_verify(op)``). A dialect of the
    project declares ``DIALECT = Dialect(name, irdl_file, extra_verify)``; this one is not a file of the
    package, so it reads its IRDL from beside this module."""

    name: str = DIALECT_NAME

    def irdl_source(self) -> str:
        return IRDL_FILE.read_text(encoding="utf-8")

    def is_loaded(self, ctx: ir.Context) -> bool:
        return ctx.is_registered_operation(f"{self.name}.signal_all")

    def register_and_load(self, ctx: ir.Context) -> None:
        """Load the dialect into ``ctx`` once (a second IRDL load into one context aborts the process)."""
        if self.is_loaded(ctx):
            return
        from mori_compiler._mlir import irdl

        with ctx, ir.Location.unknown():
            irdl.load_dialects(ir.Module.parse(self.irdl_source()))

    def extra_verify(self, op: ir.Operation) -> list[str]:
        return extra_verify(op)

    def owns(self, op_name: str) -> bool:
        return op_name.startswith(self.name + ".")


DIALECT = ExampleDialect()


def signal_all(flags, value, *, loc=None, ip=None) -> ir.Operation:
    return ir.Operation.create(f"{DIALECT_NAME}.signal_all", operands=[flags, value], loc=loc, ip=ip)


def wait_all(flags, value, *, loc=None, ip=None) -> ir.Operation:
    return ir.Operation.create(f"{DIALECT_NAME}.wait_all", operands=[flags, value], loc=loc, ip=ip)


def register() -> None:
    """Make the project's tools see the dialect and the pass in this process (idempotent).

    Call it before anything parses IR: the registry reads its dialect list when it first checks an op.
    """
    from mori_compiler.dialects import registry
    from mori_compiler.passes import ALL_PASSES

    if all(d.name != DIALECT_NAME for d in registry.DIALECTS):
        registry.DIALECTS = (*registry.DIALECTS, DIALECT)
        registry.op_specs.cache_clear()  # the IRDL constraints of every registered dialect, read once

    def load_pass():
        from lower_example import MoriExampleToShmem  # noqa: PLC0415 - beside this file (sys.path[0])

        return MoriExampleToShmem

    ALL_PASSES.setdefault(PASS_NAME, load_pass)
