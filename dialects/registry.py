"""All dialects of the project, and parsing of user IR with errors that name op, field and location.

``parse_source`` is what the CLIs use: it checks the project's ops against their IRDL constraints
*before* MLIR sees them (see irdl_spec.py for why), then parses for real with the dialects loaded.
"""

from __future__ import annotations

import functools

from mori_compiler._mlir import ir, new_context
from mori_compiler.errors import MoriCompilerError, location_text, one_line

from . import input_checks, irdl_spec, mori_coll, mori_comm, mori_ep, mori_shmem
from .dialect_base import Dialect

# Every project dialect (a new one: its IRDL file, a module declaring it with dialect_base.Dialect, and a
# line here). Lower dialects first: mori_ep and mori_coll expand into mori_comm, which lowers to mori_shmem.
DIALECTS: tuple[Dialect, ...] = (mori_shmem.DIALECT, mori_comm.DIALECT, mori_ep.DIALECT, mori_coll.DIALECT)


def project_prefixes() -> tuple[str, ...]:
    """The op-name prefixes (``"<dialect>."``) of the dialects in DIALECTS (read at each call: a tool may
    register a dialect of its own, as examples/custom_op does)."""
    return tuple(d.name + "." for d in DIALECTS)


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


def diagnostics_message(exc: ir.MLIRError, filename: str) -> MoriCompilerError:
    """Turn an MLIRError into one user error carrying every diagnostic with its location."""
    lines = []
    for d in exc.error_diagnostics:
        lines.append(f"{location_text(d.location, filename)}: {one_line(d.message)}")
    if not lines:
        return MoriCompilerError(str(exc), filename)
    first, *rest = lines
    loc, _, msg = first.partition(": ")
    return MoriCompilerError("\n".join([msg, *rest]), loc)


def verify_project_ops(module_op: ir.Operation, filename: str = "-") -> list[str]:
    """Check every op of a project dialect in ``module_op``; returns located messages."""
    specs = op_specs()
    prefixes = project_prefixes()
    extra = {d.name: d.extra_verify for d in DIALECTS}
    optional = {d.name: d.optional_attributes for d in DIALECTS}
    errors: list[str] = []

    def visit(op):  # called by MLIR's walk: no Python recursion however deep the IR nests
        op = op.operation
        if op.name.startswith(prefixes):
            where = location_text(op.location, filename)
            spec = specs.get(op.name)
            if spec is None:
                dialect = op.name.split(".", 1)[0]
                known = ", ".join(sorted(n.split(".", 1)[1] for n in specs if n.startswith(dialect + ".")))
                errors.append(f"{where}: unknown op '{op.name}'; the {dialect} dialect has: {known}")
            else:
                problems = irdl_spec.check_op(op, spec, optional[op.name.split(".", 1)[0]])
                if not problems:
                    problems = extra[op.name.split(".", 1)[0]](op)
                errors.extend(f"{where}: {p}" for p in problems)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return errors


def structural_problems(module_op: ir.Operation, where) -> list[str]:
    """input_checks' structural checks of ``module_op`` for the project's dialects (``where(op)`` formats
    an op's location)."""
    return input_checks.structural_problems(module_op, where, project_prefixes())


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
            errors = structural_problems(module.operation, lambda op: location_text(op.location, filename))
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
