"""What every project dialect shares: its IRDL file in the package, loading it into a context once, and the
hook for the rules IRDL cannot state.

A dialect is an IRDL file next to this module plus a small Python module that declares it::

    DIALECT = Dialect("mori_comm", "mori_comm.irdl.mlir", extra_verify=extra_verify)

and adds its builders and documentation; ``registry.DIALECTS`` lists the declarations. Nothing else is
needed: parsing, the IRDL checks of user IR (irdl_spec.py), ``mori-opt --emit-irdl`` and
``--show-dialects`` all read the declaration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from mori_compiler._mlir import ir, irdl


class OpRules:
    """The messages of one op's ``extra_verify``: ``need(condition, message)`` records ``'<op>' message``
    when the condition fails; ``non_integer`` lists the attributes (other than ``strings``) that are not
    integers, the first check of a config-carrying op (its ranges are only meaningful on integers)."""

    def __init__(self, op: ir.Operation):
        self.name = op.name
        self.errors: list[str] = []

    def need(self, condition: bool, message: str) -> None:
        if not condition:
            self.errors.append(f"'{self.name}' {message}")

    def non_integer(self, op: ir.Operation, ints: dict, strings: tuple[str, ...] = ("dtype",)) -> list[str]:
        bad = [f"'{self.name}' attribute '{field}' must be an integer, got {op.attributes[field]}"
               for field in op.attributes if field not in strings and field not in ints]  # fmt: skip
        self.errors.extend(bad)
        return bad


def no_extra_rules(op: ir.Operation) -> list[str]:
    """The verification hook of a dialect whose IRDL says everything."""
    return []


@dataclass(frozen=True)
class Dialect:
    """One IRDL dialect.

    ``name``: the dialect's name (its ops are ``name.<op>``); ``irdl_file``: the IRDL definition, a file of
    the ``mori_compiler.dialects`` package, or the absolute path of one outside it (a dialect written
    elsewhere, e.g. examples/); ``extra_verify(op)``: messages (naming op and field, no location) for the
    rules across fields or ranges that IRDL cannot express, run on user IR after the IRDL constraints
    passed; ``optional_attributes``: names any op of the dialect may carry besides its IRDL attributes
    (IRDL has none optional; ``extra_verify`` checks their values).
    """

    name: str
    irdl_file: str | Path
    extra_verify: Callable[[ir.Operation], list[str]] = no_extra_rules
    optional_attributes: frozenset = frozenset()

    def irdl_source(self) -> str:
        """The dialect's IRDL text (what ``mori-opt --emit-irdl`` prints)."""
        return _read_irdl(str(self.irdl_file))

    def is_loaded(self, ctx: ir.Context) -> bool:
        try:
            ctx.dialects[self.name]
        except IndexError:
            return False
        return True

    def register_and_load(self, ctx: ir.Context) -> None:
        """Load the dialect into ``ctx`` once; safe to call repeatedly (a second IRDL load of a dialect
        into one context aborts the process on an MLIR assertion, hence the check)."""
        if self.is_loaded(ctx):
            return
        with ctx, ir.Location.unknown():
            irdl.load_dialects(ir.Module.parse(self.irdl_source()))
        if not self.is_loaded(ctx):  # (the next call would load it again, and abort)
            raise ValueError(f"{self.irdl_file} does not define the dialect '{self.name}'")


@functools.cache
def _read_irdl(name: str) -> str:
    source = Path(name) if Path(name).is_absolute() else files("mori_compiler.dialects").joinpath(name)
    return source.read_text(encoding="utf-8")
