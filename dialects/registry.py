"""All dialects of the project, and parsing of user IR with errors that name op, field and location.

``parse_source`` is what the CLIs use: it checks the project's ops against their IRDL constraints
*before* MLIR sees them (see irdl_spec.py for why), then parses for real with the dialects loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from mori_compiler._mlir import ir, new_context
from mori_compiler.errors import MoriCompilerError, location_text, one_line

from . import input_checks, irdl_spec, mori_ep, mori_shmem


@dataclass(frozen=True)
class DialectInfo:
    name: str
    irdl_source: Callable[[], str]
    register_and_load: Callable[[ir.Context], None]
    extra_verify: Callable[[ir.Operation], list[str]]


DIALECTS: tuple[DialectInfo, ...] = (
    DialectInfo(mori_shmem.DIALECT_NAME, mori_shmem.irdl_source, mori_shmem.register_and_load, mori_shmem.extra_verify),
    DialectInfo(mori_ep.DIALECT_NAME, mori_ep.irdl_source, mori_ep.register_and_load, mori_ep.extra_verify),
)


def load_all(ctx: ir.Context) -> None:
    """Load every project dialect into ``ctx`` (idempotent)."""
    for d in DIALECTS:
        d.register_and_load(ctx)


def emit_irdl() -> str:
    """The IRDL of every project dialect, loadable by ``mlir-opt --irdl-file``."""
    return "\n".join(d.irdl_source() for d in DIALECTS)


@functools.cache
def op_specs() -> dict[str, irdl_spec.OpSpec]:
    specs: dict[str, irdl_spec.OpSpec] = {}
    with new_context():
        for d in DIALECTS:
            specs |= irdl_spec.read_irdl(ir.Module.parse(d.irdl_source()))
    return specs


def format_location(loc: ir.Location, filename: str) -> str:
    """``file:line:col`` of the file location in ``loc`` (MLIR names a parsed string "-"), else ``filename``."""
    return location_text(loc, filename)


def diagnostics_message(exc: ir.MLIRError, filename: str) -> MoriCompilerError:
    """Turn an MLIRError into one user error carrying every diagnostic with its location."""
    lines = []
    for d in exc.error_diagnostics:
        lines.append(f"{format_location(d.location, filename)}: {one_line(d.message)}")
    if not lines:
        return MoriCompilerError(str(exc), filename)
    first, *rest = lines
    loc, _, msg = first.partition(": ")
    return MoriCompilerError("\n".join([msg, *rest]), loc)


def verify_project_ops(module_op: ir.Operation, filename: str = "-") -> list[str]:
    """Check every op of a project dialect in ``module_op``; returns located messages."""
    specs = op_specs()
    prefixes = tuple(d.name + "." for d in DIALECTS)
    extra = {d.name: d.extra_verify for d in DIALECTS}
    errors: list[str] = []

    def visit(op):  # called by MLIR's walk: no Python recursion however deep the IR nests
        op = op.operation
        if op.name.startswith(prefixes):
            where = format_location(op.location, filename)
            spec = specs.get(op.name)
            if spec is None:
                dialect = op.name.split(".", 1)[0]
                known = ", ".join(sorted(n.split(".", 1)[1] for n in specs if n.startswith(dialect + ".")))
                errors.append(f"{where}: unknown op '{op.name}'; the {dialect} dialect has: {known}")
            else:
                problems = irdl_spec.check_op(op, spec)
                if not problems:
                    problems = extra[op.name.split(".", 1)[0]](op)
                errors.extend(f"{where}: {p}" for p in problems)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return errors


def parse_source(text: str, ctx: ir.Context, filename: str = "-") -> ir.Module:
    """Parse user IR into ``ctx`` (project dialects loaded) or raise a MoriCompilerError.

    Errors name the file, line and column; for project ops also the op, the field and what is allowed.
    Inputs MLIR would abort on are refused first (input_checks.py).
    """
    errors = input_checks.lexical_problems(text, filename)
    if not errors:
        with new_context() as scratch:
            scratch.allow_unregistered_dialects = True
            try:
                module = ir.Module.parse(text)
            except ir.MLIRError as exc:
                raise diagnostics_message(exc, filename) from None
            errors = input_checks.structural_problems(
                module.operation, lambda op: format_location(op.location, filename)
            )
            errors = errors or verify_project_ops(module.operation, filename)
    if errors:  # one line per problem: a name or string echoed in a message may hold a newline
        errors = [one_line(e) for e in errors]
        loc, _, msg = errors[0].partition(": ")
        raise MoriCompilerError("\n".join([msg] + errors[1:]), loc)
    load_all(ctx)
    with ctx:
        try:
            return ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise diagnostics_message(exc, filename) from None
