"""Read an IRDL dialect definition into plain Python constraints, and check ops against them.

Why: IRDL verification in MLIR 22 reports failures such as ``expected 'i64' but got 'i32'`` without
naming the op or the field, and a generic op that violates IRDL cannot even be parsed. The driver
therefore first parses user IR with the project's dialects *unloaded* (unregistered ops allowed) and
checks every op of those dialects with the constraints read here from the very same IRDL file, so the
error can name the op, the field and the allowed values. The IRDL text stays the single definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mori_compiler._mlir import ir


def string_value(attr: ir.StringAttr) -> str:
    """A string attribute as a Python str, whatever its bytes: ``.value`` raises (inside nanobind) on bytes
    that are not UTF-8, which the parse-time checks refuse but IR built elsewhere may hold."""
    return attr.value_bytes.decode("utf-8", "backslashreplace")


def string_attributes(op: ir.Operation) -> dict[str, str]:
    """The op's string-valued attributes as plain Python strings."""
    attrs = op.attributes
    return {n: string_value(attrs[n]) for n in attrs if isinstance(attrs[n], ir.StringAttr)}


def int_attributes(op: ir.Operation) -> dict[str, int]:
    """The op's integer-valued attributes as plain Python ints."""
    attrs = op.attributes
    return {n: attrs[n].value for n in attrs if isinstance(attrs[n], ir.IntegerAttr)}


@dataclass(frozen=True)
class Constraint:
    """``allowed`` is the tuple of printed attributes/types that satisfy it; empty means any."""

    allowed: tuple[str, ...] = ()

    def accepts(self, printed: str) -> bool:
        return not self.allowed or printed in self.allowed

    def describe(self) -> str:
        if not self.allowed:
            return "anything"
        if len(self.allowed) == 1:
            return self.allowed[0]
        return "one of " + ", ".join(self.allowed)


@dataclass(frozen=True)
class Field:
    name: str
    constraint: Constraint
    variadic: bool = False
    optional: bool = False


@dataclass(frozen=True)
class OpSpec:
    """The IRDL signature of one op: ordered operands and results, named attributes."""

    name: str
    operands: tuple[Field, ...] = ()
    results: tuple[Field, ...] = ()
    attributes: dict[str, Constraint] = field(default_factory=dict)


def _variadicities(op: ir.Operation, count: int) -> list[str]:
    if "variadicity" not in op.attributes:
        return ["single"] * count
    # Printed as `#irdl<variadicity_array[ single,  variadic]>`.
    text = str(op.attributes["variadicity"])
    inner = text[text.index("[") + 1 : text.rindex("]")]
    return [v.strip() for v in inner.split(",") if v.strip()]


def _names(op: ir.Operation, key: str) -> list[str]:
    return [ir.StringAttr(a).value for a in ir.ArrayAttr(op.attributes[key])]


def read_irdl(module: ir.Module) -> dict[str, OpSpec]:
    """Map ``"<dialect>.<op>"`` to its OpSpec for every ``irdl.operation`` in ``module``."""
    specs: dict[str, OpSpec] = {}
    for dialect in module.body.operations:
        dialect_name = ir.StringAttr(dialect.attributes["sym_name"]).value
        for op_def in dialect.regions[0].blocks[0].operations:
            if op_def.name != "irdl.operation":
                continue
            op_name = f"{dialect_name}.{ir.StringAttr(op_def.attributes['sym_name']).value}"
            specs[op_name] = _read_operation(op_name, op_def.regions[0].blocks[0])
    return specs


def _read_operation(op_name: str, body: ir.Block) -> OpSpec:
    constraints: dict[ir.Value, Constraint] = {}
    operands: tuple[Field, ...] = ()
    results: tuple[Field, ...] = ()
    attributes: dict[str, Constraint] = {}
    for op in body.operations:
        name = op.operation.name
        if name == "irdl.is":
            constraints[op.results[0]] = Constraint((str(op.attributes["expected"]),))
        elif name == "irdl.any":
            constraints[op.results[0]] = Constraint()
        elif name == "irdl.any_of":
            allowed: list[str] = []
            for v in op.operands:
                allowed.extend(constraints[v].allowed)
            constraints[op.results[0]] = Constraint(tuple(allowed))
        elif name in ("irdl.operands", "irdl.results"):
            names = _names(op, "names")
            kinds = _variadicities(op, len(names))
            fields = tuple(
                Field(n, constraints[v], variadic=k == "variadic", optional=k == "optional")
                for n, v, k in zip(names, op.operands, kinds)
            )
            if name == "irdl.operands":
                operands = fields
            else:
                results = fields
        elif name == "irdl.attributes":
            for n, v in zip(_names(op, "attributeValueNames"), op.operands):
                attributes[n] = constraints[v]
        else:
            raise NotImplementedError(f"IRDL construct '{name}' in {op_name} is not supported by irdl_spec")
    return OpSpec(op_name, operands, results, attributes)


def _check_values(what: str, fields: tuple[Field, ...], types: list[str]) -> list[str]:
    """Match types against fields; at most one variadic field (enough for our dialects)."""
    fixed = [f for f in fields if not (f.variadic or f.optional)]
    flexible = [f for f in fields if f.variadic or f.optional]
    names = ", ".join(f.name for f in fields) or "none"
    if (not flexible and len(types) != len(fields)) or len(types) < len(fixed):
        return [f"expected {len(fields)} {what}s ({names}), got {len(types)}"]
    errors: list[str] = []
    extra = len(types) - len(fixed)
    i = 0
    for f in fields:
        count = extra if (f.variadic or f.optional) else 1
        if f.optional and count > 1:
            return [f"{what} '{f.name}' is optional but {count} values were given"]
        for t in types[i : i + count]:
            if not f.constraint.accepts(t):
                errors.append(f"{what} '{f.name}' must be {f.constraint.describe()}, got {t}")
        i += count
    return errors


def check_op(op: ir.Operation, spec: OpSpec, optional: frozenset = frozenset()) -> list[str]:
    """All constraint violations of ``op`` against ``spec``, as messages without location. ``optional``:
    attribute names the op may carry besides the IRDL's (IRDL has no optional attributes; the dialect's
    ``extra_verify`` checks their values)."""
    errors = _check_values("operand", spec.operands, [str(v.type) for v in op.operands])
    errors += _check_values("result", spec.results, [str(r.type) for r in op.results])
    present = {n: str(op.attributes[n]) for n in op.attributes}
    for name, constraint in spec.attributes.items():
        if name not in present:
            errors.append(f"missing attribute '{name}' ({constraint.describe()})")
        elif not constraint.accepts(present[name]):
            errors.append(f"attribute '{name}' must be {constraint.describe()}, got {present[name]}")
    for name in present:
        if name not in spec.attributes and name not in optional:
            allowed = ", ".join(f"'{n}'" for n in (*spec.attributes, *sorted(optional))) or "none"
            errors.append(f"unknown attribute '{name}' (allowed: {allowed})")
    if op.regions and len(op.regions):
        errors.append("must not have regions")
    return [f"'{op.name}' {e}" for e in errors]
