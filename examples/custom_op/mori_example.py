"""The ``mori_example`` dialect (docs/extending.md, part 2): its IRDL file plus this small module.

The module has the shape of every project dialect: its declaration ``DIALECT`` (a ``dialect_base.Dialect``:
the name, the IRDL file, ``extra_verify`` for the rules IRDL cannot state: none here) and one typed builder
per op with the ``(operands..., *, loc, ip)`` signature of the project's builders.

``register()`` adds the dialect and its pass to the project's registries at run time (the example edits no
file of the project); a dialect of the project itself is listed in ``dialects/registry.py`` instead, and its
pass in ``passes/__init__.py`` (docs/extending.md says how).
"""

from __future__ import annotations

from pathlib import Path

from mori_compiler._mlir import ir
from mori_compiler.dialects.dialect_base import Dialect

DIALECT_NAME = "mori_example"
IRDL_FILE = Path(__file__).with_name("mori_example.irdl.mlir")
PASS_NAME = "mori-example-to-shmem"


def extra_verify(op: ir.Operation) -> list[str]:
    """Cross-field rules IRDL cannot state; messages name the op and the field. None for these ops."""
    return []


# A dialect outside the package names its IRDL file by absolute path.
DIALECT = Dialect(DIALECT_NAME, IRDL_FILE, extra_verify)


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
