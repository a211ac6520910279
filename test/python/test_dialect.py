"""The project dialects: loading (dialect_base), the ``mori_shmem`` dialect (builders, ABI symbols, verification,
the lowering to the ABI) and the ``mori_comm`` blocks (builders, verification)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from mori_compiler._mlir import arith, func, ir
from mori_compiler.dialects import irdl_spec, mori_comm, mori_ep, mori_shmem, registry
from mori_compiler.errors import MoriCompilerError
from mori_compiler.lib_bitcode.abi import ABI_BY_SYMBOL, ABI_FUNCTIONS, abi_function
from mori_compiler.pass_pipeline import build_pass_manager

_QUIET_FENCE_TARGETS = ("", "_pe", "_pe_qp")
# LLVM type names of the ABI table -> MLIR type syntax (written out here, independently of the pass).
_MLIR_OF_LLVM = {"ptr": "!llvm.ptr", "float": "f32", "double": "f64", "i8": "i8", "i16": "i16", "i32": "i32",
                 "i64": "i64"}  # fmt: skip


def _attr_combinations(spec: irdl_spec.OpSpec):
    """Every assignment of the op's string attributes to values the IRDL allows."""
    names = list(spec.attributes)
    choices = [[json.loads(v) for v in spec.attributes[n].allowed] for n in names]
    for combo in itertools.product(*choices):
        yield dict(zip(names, combo))


def _fill(info: mori_shmem.OpInfo, attrs: dict, n_targets: int = 0) -> str:
    return info.symbol.format(**attrs, targets=_QUIET_FENCE_TARGETS[n_targets])


@pytest.fixture
def ctx():
    context = ir.Context()
    mori_shmem.DIALECT.register_and_load(context)
    return context


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------


def test_load_twice_into_one_context_is_a_no_op():
    context = ir.Context()
    assert not context.is_registered_operation("mori_shmem.my_pe")
    mori_shmem.DIALECT.register_and_load(context)
    mori_shmem.DIALECT.register_and_load(context)  # would abort the process without the guard
    registry.load_all(context)
    assert context.is_registered_operation("mori_shmem.my_pe")
    assert context.is_registered_operation("mori_shmem.putmem_nbi_signal")


def test_load_into_two_contexts():
    a, b = ir.Context(), ir.Context()
    registry.load_all(a)
    registry.load_all(b)
    for context in (a, b):
        with context:
            m = ir.Module.parse('func.func @f() -> i32 {\n %0 = "mori_shmem.my_pe"() : () -> i32\n return %0 : i32\n}')
            assert m.operation.verify()


def test_every_dialect_is_its_irdl_file(repo_root):
    """A dialect is declared once (name, IRDL file of the package): the file defines that dialect, loading
    registers its ops, and a second load is a no-op for each."""
    assert [d.name for d in registry.DIALECTS] == ["mori_shmem", "mori_comm", "mori_ep", "mori_coll"]
    context = ir.Context()
    for d in registry.DIALECTS:
        assert d.irdl_source() == (repo_root / "dialects" / d.irdl_file).read_text()
        assert f"irdl.dialect @{d.name} {{" in d.irdl_source()
        assert not d.is_loaded(context)
        d.register_and_load(context)
        d.register_and_load(context)
        assert d.is_loaded(context)
    for name in registry.op_specs():
        assert context.is_registered_operation(name), name


def test_a_dialect_outside_the_package_is_its_irdl_file(tmp_path):
    """A dialect written elsewhere (examples/) declares itself with the IRDL file's path."""
    from mori_compiler.dialects.dialect_base import Dialect

    irdl = tmp_path / "mori_t.irdl.mlir"
    irdl.write_text("irdl.dialect @mori_t {\n  irdl.operation @nop {\n  }\n}\n")
    dialect = Dialect("mori_t", irdl)
    context = ir.Context()
    dialect.register_and_load(context)
    dialect.register_and_load(context)
    assert context.is_registered_operation("mori_t.nop") and dialect.extra_verify(None) == []
    with pytest.raises(ValueError, match="does not define the dialect 'mori_u'"):
        Dialect("mori_u", irdl).register_and_load(ir.Context())


def test_irdl_source_is_the_packaged_file(repo_root):
    assert mori_shmem.DIALECT.irdl_source() == (repo_root / "dialects" / "mori_shmem.irdl.mlir").read_text()
    assert registry.emit_irdl().strip() == "\n".join(d.irdl_source() for d in registry.DIALECTS).strip()
    assert mori_shmem.DIALECT.irdl_source().strip() in registry.emit_irdl()


# ----------------------------------------------------------------------------------------------------
# Builders
# ----------------------------------------------------------------------------------------------------


def _const(ty: ir.Type) -> ir.Value:
    if isinstance(ty, ir.FloatType) or str(ty) in ("f32", "f64"):
        return arith.constant(ty, 1.0)
    return arith.constant(ty, 1)


def _emit(name: str, attrs: dict, v: dict, n_targets: int = 0) -> None:
    """Create op ``name`` with ``attrs`` through its builder (values of the right types from ``v``)."""
    ms = mori_shmem
    ptr, n, pe = v["ptr"], v["i64"], v["i32"]
    short = name.split(".", 1)[1]
    if short in ("my_pe", "n_pes"):
        getattr(ms, short)()
    elif short == "ptr_p2p":
        ms.ptr_p2p(ptr, pe, pe)
    elif short == "ptr":
        ms.ptr(ptr, pe)
    elif short in ("putmem_nbi", "getmem_nbi", "getmem"):
        getattr(ms, short)(ptr, ptr, n, pe, scope=attrs["scope"])
    elif short in ("put_nbi", "get_nbi", "get"):
        getattr(ms, short)(ptr, ptr, n, pe, scope=attrs["scope"], elem=attrs["elem"])
    elif short == "putmem_nbi_signal":
        ms.putmem_nbi_signal(ptr, ptr, n, ptr, n, pe, scope=attrs["scope"], signal_op=attrs["signal_op"], qp=pe)
    elif short == "put_size_imm_nbi":
        ms.put_size_imm_nbi(ptr, ptr, n, pe)
    elif short == "p":
        ms.p(ptr, v[mori_shmem.C_TYPE_VALUE[attrs["c_type"]]], pe, c_type=attrs["c_type"])
    elif short == "atomic_nonfetch":
        ms.atomic_nonfetch(ptr, v[mori_shmem.ELEM_VALUE[attrs["elem"]]], pe, elem=attrs["elem"], amo=attrs["amo"])
    elif short == "atomic_fetch":
        x = v[mori_shmem.ELEM_VALUE[attrs["elem"]]]
        ms.atomic_fetch(ptr, x, x, pe, elem=attrs["elem"], amo=attrs["amo"])
    elif short in ("atomic_add", "atomic_fetch_add"):
        getattr(ms, short)(ptr, v[mori_shmem.ELEM_VALUE[attrs["elem"]]], pe, elem=attrs["elem"])
    elif short == "atomic_size_nonfetch":
        ms.atomic_size_nonfetch(ptr, ptr, n, pe, amo=attrs["amo"])
    elif short == "wait_until":
        ms.wait_until(ptr, v[mori_shmem.ELEM_VALUE[attrs["elem"]]], cmp=attrs["cmp"], elem=attrs["elem"])
    elif short in ("quiet", "fence"):
        getattr(ms, short)(*[pe] * n_targets)
    elif short == "barrier_all":
        ms.barrier_all(scope=attrs["scope"])
    else:  # pragma: no cover - a new op needs a line here
        raise AssertionError(f"no builder call for {name}")


def _module_with(ctx: ir.Context, emit_all) -> ir.Module:
    """A builtin.module with ``func.func @f(%ptr)`` whose body ``emit_all(values)`` fills."""
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        ptr_t = ir.Type.parse("!llvm.ptr")
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ([ptr_t], []))
            entry = f.add_entry_block()
            with ir.InsertionPoint(entry):
                values = {"ptr": entry.arguments[0]}
                for t in ("i8", "i16", "i32", "i64", "f32", "f64"):
                    values[t] = _const(ir.Type.parse(t))
                emit_all(values)
                func.ReturnOp([])
    return module


def _every_abi_variant():
    """(op name, attributes, number of quiet/fence targets, ABI symbol) for every allowed variant."""
    specs = registry.op_specs()
    for name, info in mori_shmem.OP_INFO.items():
        for attrs in _attr_combinations(specs[name]):
            for n_targets in range(3) if info.symbol.endswith("{targets}") else (0,):
                yield name, attrs, n_targets, _fill(info, attrs, n_targets)


def test_every_builder_verifies_and_prints(ctx):
    specs = registry.op_specs()

    def emit_all(v):
        for name in mori_shmem.OP_INFO:
            attrs = next(_attr_combinations(specs[name]))
            _emit(name, attrs, v, n_targets=2 if name in ("mori_shmem.quiet", "mori_shmem.fence") else 0)

    module = _module_with(ctx, emit_all)
    assert module.operation.verify()
    assert registry.verify_project_ops(module.operation) == []
    text = str(module)
    for name in mori_shmem.OP_INFO:
        assert f'"{name}"' in text, name
    # What the builders print parses back (with the dialect loaded) and verifies the same.
    with ctx:
        assert ir.Module.parse(text).operation.verify()


def test_builder_defaults(ctx):
    def emit_all(v):
        op = mori_shmem.putmem_nbi(v["ptr"], v["ptr"], v["i64"], v["i32"])
        assert mori_shmem.string_attributes(op) == {"scope": "thread"}
        qp = op.operands[4].owner
        assert qp.name == "arith.constant" and str(qp.attributes["value"]) == "0 : i32"  # queue pair 0
        assert mori_shmem.string_attributes(mori_shmem.p(v["ptr"], v["i64"], v["i32"]).operation) == {"c_type": "int64"}
        assert mori_shmem.wait_until(v["ptr"], v["i32"], cmp="equals", elem="int32").type == v["i32"].type

    assert _module_with(ctx, emit_all).operation.verify()


# ----------------------------------------------------------------------------------------------------
# ABI symbols
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op_text, symbol",
    [
        ('"mori_shmem.my_pe"() : () -> i32', "mori_shmem_my_pe"),
        ('"mori_shmem.ptr_p2p"(%p, %i, %i) : (!llvm.ptr, i32, i32) -> !llvm.ptr', "mori_shmem_ptr_p2p"),
        ('"mori_shmem.putmem_nbi"(%p, %p, %n, %i, %i) {scope = "warp"} : (!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()',
         "mori_shmem_putmem_nbi_warp"),
        ('"mori_shmem.put_nbi"(%p, %p, %n, %i, %i) {scope = "block", elem = "float"} : '
         "(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()", "mori_shmem_put_float_nbi_block"),
        ('"mori_shmem.get"(%p, %p, %n, %i, %i) {scope = "thread", elem = "uint64"} : '
         "(!llvm.ptr, !llvm.ptr, i64, i32, i32) -> ()", "mori_shmem_get_uint64_thread"),
        ('"mori_shmem.putmem_nbi_signal"(%p, %p, %n, %p, %n, %i, %i) {scope = "block", signal_op = "add"} : '
         "(!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()", "mori_shmem_putmem_nbi_signal_block"),
        ('"mori_shmem.p"(%p, %n, %i, %i) {c_type = "ulonglong"} : (!llvm.ptr, i64, i32, i32) -> ()',
         "mori_shmem_ulonglong_p"),
        ('"mori_shmem.atomic_fetch"(%p, %n, %n, %i, %i) {elem = "int64", amo = "compare_swap"} : '
         "(!llvm.ptr, i64, i64, i32, i32) -> i64", "mori_shmem_atomic_int64_fetch_thread"),
        ('"mori_shmem.atomic_add"(%p, %i, %i, %i) {elem = "uint32"} : (!llvm.ptr, i32, i32, i32) -> ()',
         "mori_shmem_uint32_atomic_add_thread"),
        ('"mori_shmem.wait_until"(%p, %i) {cmp = "equals", elem = "int32"} : (!llvm.ptr, i32) -> i32',
         "mori_shmem_int32_wait_until_equals"),
        ('"mori_shmem.quiet"() : () -> ()', "mori_shmem_quiet_thread"),
        ('"mori_shmem.quiet"(%i) : (i32) -> ()', "mori_shmem_quiet_thread_pe"),
        ('"mori_shmem.fence"(%i, %i) : (i32, i32) -> ()', "mori_shmem_fence_thread_pe_qp"),
        ('"mori_shmem.barrier_all"() {scope = "block"} : () -> ()', "mori_shmem_barrier_all_block"),
    ],
    ids=lambda x: x if x.startswith("mori_shmem_") else None,
)  # fmt: skip
def test_abi_symbol(ctx, op_text, symbol):
    text = f"func.func @f(%p: !llvm.ptr, %n: i64, %i: i32) {{\n  {op_text}\n  return\n}}"
    with ctx:
        module = ir.Module.parse(text)
    op = module.body.operations[0].regions[0].blocks[0].operations[0]
    assert mori_shmem.abi_symbol(op) == symbol
    assert symbol in ABI_BY_SYMBOL


def test_templates_cover_exactly_the_abi_table():
    covered: dict[str, tuple] = {}
    for name, attrs, n_targets, symbol in _every_abi_variant():
        assert symbol in ABI_BY_SYMBOL, f"{name} {attrs} -> {symbol} is not an ABI function"
        # Distinct variants name distinct functions, except that an enum attribute is an argument.
        enum_arg = mori_shmem.OP_INFO[name].enum_arg
        variant = (name, tuple(sorted((k, v) for k, v in attrs.items() if not enum_arg or k != enum_arg[0])), n_targets)
        assert covered.setdefault(symbol, variant) == variant, f"{symbol} from {covered[symbol]} and {variant}"
    assert len(ABI_FUNCTIONS) == 98
    assert set(covered) == set(ABI_BY_SYMBOL), sorted(set(ABI_BY_SYMBOL) - set(covered))


def test_enum_attributes_map_to_abi_enums():
    specs = registry.op_specs()
    for info in mori_shmem.OP_INFO.values():
        if info.enum_arg is None:
            continue
        attr, position = info.enum_arg
        allowed = {json.loads(v) for v in specs[info.name].attributes[attr].allowed}
        assert allowed <= set(mori_shmem.ENUM_VALUES[attr]), (info.name, allowed)
        for attrs in _attr_combinations(specs[info.name]):
            fn = abi_function(_fill(info, attrs))
            assert fn.params[position].c_type == "atomicType", (fn.symbol, position)
    assert mori_shmem.SIGNAL_ENUM == {"set": 9, "add": 10}
    assert mori_shmem.AMO_ENUM["fetch_add"] == 14 and mori_shmem.AMO_ENUM["inc"] == 2


# ----------------------------------------------------------------------------------------------------
# Verification: IRDL constraints read back in Python, and the cross-field rules
# ----------------------------------------------------------------------------------------------------


def _irdl_fields_by_regex(text: str) -> dict[str, dict[str, list[str]]]:
    """An independent reading of the IRDL text: op -> {"operands": [...], "results": [...], "attributes": [...]}."""
    ops = {}
    for m in re.finditer(r"irdl\.operation @(\w+) \{(.*?)\n  \}", text, re.DOTALL):
        body = m.group(2)
        entry = {}
        for kind in ("operands", "results"):
            mm = re.search(rf"irdl\.{kind}\((.*)\)\s*$", body, re.MULTILINE)
            entry[kind] = [item.split(":")[0].strip() for item in mm.group(1).split(",")] if mm else []
        mm = re.search(r"irdl\.attributes \{(.*?)\}", body)
        entry["attributes"] = re.findall(r'"(\w+)" =', mm.group(1)) if mm else []
        ops[f"mori_shmem.{m.group(1)}"] = entry
    return ops


def test_read_irdl_reproduces_the_fields():
    expected = _irdl_fields_by_regex(mori_shmem.DIALECT.irdl_source())
    with ir.Context():
        specs = irdl_spec.read_irdl(ir.Module.parse(mori_shmem.DIALECT.irdl_source()))
    assert set(specs) == set(expected) == set(mori_shmem.OP_INFO)
    for name, spec in specs.items():
        assert [f.name for f in spec.operands] == expected[name]["operands"], name
        assert [f.name for f in spec.results] == expected[name]["results"], name
        assert sorted(spec.attributes) == sorted(expected[name]["attributes"]), name
    assert [f.variadic for f in specs["mori_shmem.quiet"].operands] == [True]
    assert specs["mori_shmem.putmem_nbi"].operands[2].constraint.allowed == ("i64",)
    assert specs["mori_shmem.p"].attributes["c_type"].accepts('"ulonglong"')
    assert not specs["mori_shmem.p"].attributes["c_type"].accepts('"bool"')


def _first_op(body: str, args: str = "%p: !llvm.ptr, %n: i64, %i: i32, %f: f32"):
    """(module, its first op in @f), parsed as registry.parse_source checks user IR: with the project's
    dialects unloaded (IRDL would already reject some of these ops, with a message naming no field).
    The caller keeps the module alive while it uses the op."""
    scratch = ir.Context()
    scratch.allow_unregistered_dialects = True
    with scratch:
        module = ir.Module.parse(f"func.func @f({args}) {{\n  {body}\n  return\n}}")
    return module, module.body.operations[0].regions[0].blocks[0].operations[0]


@pytest.mark.parametrize(
    "body, needles",
    [
        ('"mori_shmem.p"(%p, %n, %i, %i) {c_type = "int"} : (!llvm.ptr, i64, i32, i32) -> ()',
         ["'mori_shmem.p' operand 'value' must be i32", 'c_type = "int"', "got i64"]),
        ('"mori_shmem.p"(%p, %i, %i, %i) {c_type = "float"} : (!llvm.ptr, i32, i32, i32) -> ()',
         ["operand 'value' must be f32"]),
        ('"mori_shmem.atomic_nonfetch"(%p, %n, %i, %i) {elem = "uint32", amo = "add"} : (!llvm.ptr, i64, i32, i32) -> ()',
         ["'mori_shmem.atomic_nonfetch' operand 'value' must be i32", 'elem = "uint32"']),
        ('%r = "mori_shmem.atomic_fetch"(%p, %n, %i, %i, %i) {elem = "int64", amo = "swap"} : '
         "(!llvm.ptr, i64, i32, i32, i32) -> i64", ["operand 'compare' must be i64"]),
        ('%r = "mori_shmem.atomic_fetch_add"(%p, %n, %i, %i) {elem = "uint64"} : (!llvm.ptr, i64, i32, i32) -> i32',
         ["result must be i64"]),
        ('%r = "mori_shmem.wait_until"(%p, %i) {cmp = "equals", elem = "int64"} : (!llvm.ptr, i32) -> i32',
         ["'mori_shmem.wait_until' operand 'value' must be i64"]),
        ('"mori_shmem.quiet"(%i, %i, %i) : (i32, i32, i32) -> ()', ["'mori_shmem.quiet' takes at most 2 operands"]),
        ('"mori_shmem.fence"(%i, %i, %i) : (i32, i32, i32) -> ()', ["'mori_shmem.fence' takes at most 2 operands"]),
    ],
)  # fmt: skip
def test_extra_verify_rules(body, needles):
    module, op = _first_op(body)
    errors = mori_shmem.extra_verify(op)
    assert len(errors) >= 1
    for needle in needles:
        assert any(needle in e for e in errors), (needle, errors)


@pytest.mark.parametrize(
    "body",
    [
        '"mori_shmem.p"(%p, %n, %i, %i) {c_type = "ulong"} : (!llvm.ptr, i64, i32, i32) -> ()',
        '"mori_shmem.p"(%p, %f, %i, %i) {c_type = "float"} : (!llvm.ptr, f32, i32, i32) -> ()',
        '%r = "mori_shmem.atomic_fetch"(%p, %i, %i, %i, %i) {elem = "uint32", amo = "fetch"} : '
        "(!llvm.ptr, i32, i32, i32, i32) -> i32",
        '"mori_shmem.fence"(%i, %i) : (i32, i32) -> ()',
        '"mori_shmem.barrier_all"() {scope = "thread"} : () -> ()',
    ],
    ids=["p-ulong", "p-float", "atomic_fetch", "fence", "barrier_all"],
)
def test_extra_verify_accepts_consistent_ops(body):
    module, op = _first_op(body)
    assert mori_shmem.extra_verify(op) == []


def test_parse_source_reports_extra_verify_with_location():
    text = ('func.func @f(%p: !llvm.ptr, %n: i64, %i: i32) {\n'
            '  "mori_shmem.p"(%p, %n, %i, %i) {c_type = "int"} : (!llvm.ptr, i64, i32, i32) -> ()\n  return\n}\n')  # fmt: skip
    with pytest.raises(MoriCompilerError) as info:
        registry.parse_source(text, ir.Context(), "k.mlir")
    assert info.value.location == "k.mlir:2:3"
    assert "operand 'value' must be i32" in info.value.message


def test_parse_source_reports_every_violation():
    text = ('func.func @f(%p: !llvm.ptr, %i: i32) {\n'
            '  "mori_shmem.barrier_all"() {scope = "warp"} : () -> ()\n'
            '  "mori_shmem.ptr"(%p) : (!llvm.ptr) -> !llvm.ptr\n  return\n}\n')  # fmt: skip
    with pytest.raises(MoriCompilerError) as info:
        registry.parse_source(text, ir.Context(), "k.mlir")
    text = str(info.value)
    assert text.startswith("k.mlir:2:3: 'mori_shmem.barrier_all' attribute 'scope' must be one of")
    assert 'got "warp"' in text
    assert "k.mlir:3:" in text and "'mori_shmem.ptr' expected 2 operands (addr, dest_pe), got 1" in text


# ----------------------------------------------------------------------------------------------------
# The lowering: mori-shmem-to-abi
# ----------------------------------------------------------------------------------------------------


def _walk(op):
    op = op.operation
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _walk(inner)


def test_lowering_of_every_variant_declares_the_abi_types(ctx):
    variants = list(_every_abi_variant())
    module = _module_with(ctx, lambda v: [_emit(name, attrs, v, n) for name, attrs, n, _ in variants])
    assert module.operation.verify()
    assert registry.verify_project_ops(module.operation) == []

    build_pass_manager("mori-shmem-to-abi", ctx).run(module.operation)
    assert module.operation.verify()
    ops = list(_walk(module))
    assert not [op.name for op in ops if op.name.startswith("mori_shmem.")]
    declared = {
        op.attributes["sym_name"].value: str(op.attributes["function_type"]) for op in ops if op.name == "llvm.func"
    }
    assert set(declared) == set(ABI_BY_SYMBOL)
    with ctx:
        for symbol, fn_type in declared.items():
            fn = ABI_BY_SYMBOL[symbol]
            params = ", ".join(_MLIR_OF_LLVM[t] for t in fn.llvm_param_types)
            expected = str(ir.Type.parse(f"!llvm.func<{_MLIR_OF_LLVM[fn.llvm_return]} ({params})>"))
            assert fn_type == expected, (symbol, fn_type, expected)
    callees = [op.attributes["callee"].value for op in ops if op.name == "llvm.call"]
    assert sorted(set(callees)) == sorted(ABI_BY_SYMBOL)
    assert len(callees) == len(variants)


def test_lowering_passes_enum_constants(ctx):
    text = """func.func @f(%p: !llvm.ptr, %n: i64, %i: i32) -> i64 {
  "mori_shmem.putmem_nbi_signal"(%p, %p, %n, %p, %n, %i, %i) {scope = "thread", signal_op = "add"} : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr, i64, i32, i32) -> ()
  %r = "mori_shmem.atomic_fetch"(%p, %n, %n, %i, %i) {elem = "uint64", amo = "fetch_add"} : (!llvm.ptr, i64, i64, i32, i32) -> i64
  %q = "mori_shmem.ptr"(%p, %i) : (!llvm.ptr, i32) -> !llvm.ptr
  %w = "mori_shmem.wait_until"(%q, %r) {cmp = "equals", elem = "uint64"} : (!llvm.ptr, i64) -> i64
  return %w : i64
}"""
    with ctx:
        module = ir.Module.parse(text)
    build_pass_manager("builtin.module(mori-shmem-to-abi)", ctx).run(module.operation)
    out = str(module)
    assert "arith.constant 10 : i32" in out  # SIGNAL_ADD
    assert "arith.constant 14 : i32" in out  # AMO_FETCH_ADD
    assert "llvm.ptrtoint" in out and "llvm.inttoptr" in out  # mori_shmem_ptr takes and returns uint64_t
    assert "llvm.call @mori_shmem_uint64_wait_until_equals" in out
    # wait_until equals returns the awaited value, not the ABI's 0.
    assert re.search(r"return %\w+ : i64", out)
    assert module.operation.verify()


def test_lowering_rejects_a_conflicting_declaration(ctx):
    text = """llvm.func @mori_shmem_my_pe() -> i64
func.func @f() -> i32 {
  %0 = "mori_shmem.my_pe"() : () -> i32
  return %0 : i32
}"""
    with ctx:
        module = ir.Module.parse(text)
    with pytest.raises(MoriCompilerError, match="already declared with another type"):
        build_pass_manager("mori-shmem-to-abi", ctx).run(module.operation)


# ---- input checks: what MLIR would abort on is refused before it sees it (issue 11) -----------------------

from mori_compiler.dialects import input_checks  # noqa: E402


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("func.func @f() attributes {a = array<index: 1>} {\n  return\n}\n", "f.mlir:1:32: a dense array's element type"),
        ("!t = index\nfunc.func @f() attributes {a = array < !t >} {\n  return\n}\n", "f.mlir:2:32: a dense array's"),
        ('llvm.func @"\\ff"()\n', "f.mlir:1:11: this quoted name is not valid UTF-8"),
        ('"test.op"() {s = "ok", t = "\\c3\\28"} : () -> ()\n', "f.mlir:1:28: this string is not valid UTF-8"),
        ('func.func @f() attributes {a = #rocdl.target<abi = "7">}\n', "#rocdl.target 'abi' must be"),
        ("module {}\n\ud800\n", "f.mlir:2:1: the input holds a character that is not valid UTF-8"),
        # (fuzzing, session 13: MLIR aborted on this one)
        ('llvm.mlir.zero:!llvm.ptr"', 'f.mlir:1:25: a string literal is not closed before the end of its line'),
        ('"a.b"() {s = "x\\"} : () -> ()\n', "f.mlir:1:14: a string literal is not closed"),
    ],
)  # fmt: skip
def test_lexical_problems(text, needle):
    problems = input_checks.lexical_problems(text, "f.mlir")
    assert len(problems) == 1 and needle in problems[0], problems


@pytest.mark.parametrize(
    "text",
    [
        '// array<index: 1> in a comment\nfunc.func @f() attributes {doc = "array<index: 1> \\c3\\a9"} {\n  return\n}\n',
        "func.func @f() attributes {a = array<i64: 1>, b = !llvm.struct<(array<2 x i8>)>} {\n  return\n}\n",
        'llvm.mlir.global internal constant @bytes("\\ff\\00") {addr_space = 0 : i32} : !llvm.array<2 x i8>\n',
        "tensor<2xindex>", "",
    ],
)  # fmt: skip
def test_lexical_problems_accept_valid_text(text):
    assert input_checks.lexical_problems(text, "f.mlir") == []


def test_lexer_never_raises_on_arbitrary_text():
    import random

    rng = random.Random(11)
    alphabet = list('array<index: 1>"\\@%#!^=ff\n/-é\ud800\x00xyz0123456789[]{}') + ["\U0001F600", "٣", "ǅ"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        assert isinstance(input_checks.lexical_problems(text, "f"), list)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('gpu.module @m {\n  "mori_shmem.quiet"() : () -> ()\n}\n', "f.mlir:2:3: 'mori_shmem.quiet' must be placed inside a function"),
        ('"gpu"() : () -> ()\n', "f.mlir:1:1: op name 'gpu' is not of the form 'dialect.operation'"),
        ('gpu.module @m {\n  gpu.func @"a\\01"() kernel {\n    gpu.return\n  }\n}\n', "symbol name 'a\\x01' holds a control character"),
        ("gpu.module @m {\n  gpu.func @k() kernel attributes {known_block_size = array<i32: 1024, 2, 1>} {\n    gpu.return\n"
         "  }\n}\n", "f.mlir:2:3: 'gpu.func' attribute 'known_block_size' [1024, 2, 1] has 2048 threads"),
    ],
)  # fmt: skip
def test_parse_source_refuses_what_mlir_would_abort_on(text, needle):
    with pytest.raises(MoriCompilerError) as info:
        registry.parse_source(text, ir.Context(), "f.mlir")
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("name", "kernel", "nvptx", "ok"),
    [("k", True, True, True), ("ep_dispatch_bf16", True, True, True), ("a b", True, True, False),
     ("a.b", True, True, False), ("a.b", False, True, True), ("1a", True, True, False), ("$a", True, True, True),
     ("llvm.nvvm.barrier0", False, True, True), ("a b", True, False, True), ("", True, False, False),
     ("a\nb", False, False, False)],
)  # fmt: skip
def test_target_symbol_names(name, kernel, nvptx, ok):
    assert (input_checks.target_symbol_problem(name, is_kernel=kernel, nvptx=nvptx) is None) == ok


# ----------------------------------------------------------------------------------------------------
# mori_comm: the generic communication blocks (their lowering: test/lit/Conversion/mori-comm-to-calls*)
# ----------------------------------------------------------------------------------------------------

# Operands, results and attributes of each block: the first seven are what the ops had as mori_ep ops before
# they moved; the node variants and the chunked send/wait are the inter-node kernels' (issue 13).
_COMM_SIGNATURES = {
    "mori_comm.row_copy": (["dest", "source", "bytes", "pe"], [], []),
    "mori_comm.row_copy_to_peers": (["dest", "source", "bytes", "pe", "send"], [], ["max_peers"]),
    "mori_comm.copy_bytes": (["dest", "source", "bytes"], [], []),
    "mori_comm.reserve_slot": (["counter", "pe"], ["slot"], []),
    "mori_comm.count_signal": (["signals", "counts", "total"], [], ["world_size"]),
    "mori_comm.grid_barrier": (["counter"], [], []),
    "mori_comm.device_barrier": (["slots", "epochs"], [], ["max_blocks", "world_size"]),
    "mori_comm.one_gpu_barrier": (["slots", "epochs"], [], ["max_blocks", "world_size"]),
    "mori_comm.barrier_arrive": (["slots", "epochs"], ["epoch"], ["max_blocks", "scope", "world_size"]),
    "mori_comm.barrier_wait": (["slots", "epoch"], [], ["scope", "world_size"]),
    "mori_comm.accumulate_rows": (["out", "elems", "sources"], [], ["dtype"]),
    "mori_comm.node_pe": (["pe"], ["result"], ["group_size"]),
    "mori_comm.node_count_signal": (["signals", "counts", "total"], [], ["group_size", "world_size"]),
    "mori_comm.node_device_barrier": (["slots", "epochs"], [], ["group_size", "max_blocks", "world_size"]),
    "mori_comm.chunk_send": (["dest", "source", "record_bytes", "mask", "signal", "signal_base", "pe", "qp"], ["bytes"],
                             []),
    "mori_comm.chunk_wait": (["signal", "signal_base"], ["count"], []),
    "mori_comm.trace": ([], [], ["event", "phase"]),
    "mori_comm.grid_last_arrival": (["counter"], ["last"], []),
    "mori_comm.quantize_row": (["dest", "source", "elems", "pe"], [], ["format", "scale_blocks"]),
    "mori_comm.accumulate_quantized_rows": (["out", "first", "count", "elems", "sources"], [], ["format", "scale_blocks"]),
}


def test_comm_ops_are_the_generic_blocks_and_mori_ep_keeps_only_ep_ops():
    specs = registry.op_specs()
    comm = {n: ([f.name for f in s.operands], [f.name for f in s.results], sorted(s.attributes))
            for n, s in specs.items() if n.startswith("mori_comm.")}  # fmt: skip
    assert comm == _COMM_SIGNATURES
    assert specs["mori_comm.accumulate_rows"].operands[2].variadic
    assert sorted(n.split(".", 1)[1] for n in specs if n.startswith("mori_ep.")) == sorted(mori_ep.EP_OPS)


@pytest.fixture
def all_ctx():
    context = ir.Context()
    registry.load_all(context)
    return context


def test_comm_builders_verify_and_print(all_ctx):
    def emit_all(v):
        ptr, n, pe = v["ptr"], v["i64"], v["i32"]
        with ir.Location.unknown():
            on = arith.constant(ir.IntegerType.get_signless(1), 1)
        mori_comm.row_copy(ptr, ptr, n, pe)
        mori_comm.row_copy_to_peers(ptr, ptr, n, pe, on, max_peers=8)
        mori_comm.copy_bytes(ptr, ptr, n)
        slot = mori_comm.reserve_slot(ptr, pe)
        assert str(slot.type) == "i32"
        mori_comm.count_signal(ptr, ptr, ptr, world_size=8)
        mori_comm.grid_barrier(ptr)
        mori_comm.device_barrier(ptr, ptr, world_size=4, max_blocks=80)
        mori_comm.one_gpu_barrier(ptr, ptr, world_size=2, max_blocks=16)
        epoch = mori_comm.barrier_arrive(ptr, ptr, world_size=3, max_blocks=16, scope="gpu")
        assert str(epoch.type) == "i64"
        mori_comm.barrier_wait(ptr, epoch, world_size=3, scope="gpu")
        mori_comm.accumulate_rows(ptr, n, [ptr, ptr, ptr], dtype="bf16")
        npe = mori_comm.node_pe(pe, group_size=4)
        assert str(npe.type) == "i32"
        mori_comm.node_count_signal(ptr, ptr, ptr, world_size=16, group_size=8)
        mori_comm.node_device_barrier(ptr, ptr, world_size=16, group_size=2, max_blocks=64)
        sent = mori_comm.chunk_send(ptr, ptr, n, n, ptr, n, npe, pe)
        assert str(sent.type) == "i64"
        assert str(mori_comm.chunk_wait(ptr, sent).type) == "i32"
        mori_comm.quantize_row(ptr, ptr, n, pe, format="fp8_e4m3fn", scale_blocks=56)
        mori_comm.accumulate_quantized_rows(ptr, n, n, n, [ptr, ptr], format="fp4_e2m1", scale_blocks=7)
        mori_comm.trace("dispatch.route", "begin")
        assert str(mori_comm.grid_last_arrival(ptr).type) == "i1"

    module = _module_with(all_ctx, emit_all)
    assert module.operation.verify()
    assert registry.verify_project_ops(module.operation) == []
    text = str(module)
    for name in _COMM_SIGNATURES:
        assert f'"{name}"' in text, name
    assert "{max_blocks = 80 : i64, world_size = 4 : i64}" in text and '{dtype = "bf16"}' in text
    assert "{max_blocks = 16 : i64, world_size = 2 : i64}" in text
    assert '{max_blocks = 16 : i64, scope = "gpu", world_size = 3 : i64}' in text and '{scope = "gpu", world_size = 3 : i64}' in text
    assert "{group_size = 8 : i64, world_size = 16 : i64}" in text and "{group_size = 4 : i64}" in text
    assert "{group_size = 2 : i64, max_blocks = 64 : i64, world_size = 16 : i64}" in text
    with all_ctx:
        assert ir.Module.parse(text).operation.verify()


@pytest.mark.parametrize(
    "body, needle",
    [
        ('"mori_comm.count_signal"(%p, %p, %p) {world_size = 0 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()',
         "'mori_comm.count_signal' attribute 'world_size' must be in [1, 32], got 0"),
        ('"mori_comm.device_barrier"(%p, %p) {world_size = 33 : i64, max_blocks = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()',
         "'mori_comm.device_barrier' attribute 'world_size' must be in [1, 32], got 33"),
        ('"mori_comm.device_barrier"(%p, %p) {world_size = 2 : i64, max_blocks = -1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()',
         "'mori_comm.device_barrier' attribute 'max_blocks' must be >= 1, got -1"),
        ('"mori_comm.row_copy_to_peers"(%p, %p, %n, %i, %b) {max_peers = 64 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()',
         "'mori_comm.row_copy_to_peers' attribute 'max_peers' must be in [1, 32] (one lane per destination), got 64"),
        ('"mori_comm.row_copy_to_peers"(%p, %p, %n, %i, %b) {max_peers = "8"} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()',
         "'mori_comm.row_copy_to_peers' attribute 'max_peers' must be an integer, got \"8\""),
        ('"mori_comm.accumulate_rows"(%p, %n) {dtype = "f32"} : (!llvm.ptr, i64) -> ()',
         "'mori_comm.accumulate_rows' needs at least one source row"),
        ('%r = "mori_comm.node_pe"(%i) {group_size = 12 : i64} : (i32) -> i32',
         "'mori_comm.node_pe' attribute 'group_size' must be a power of two in [1, 32], got 12"),
        ('"mori_comm.node_count_signal"(%p, %p, %p) {world_size = 6 : i64, group_size = 4 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()',
         "'mori_comm.node_count_signal' attribute 'group_size' (4) must divide 'world_size' (6): whole nodes"),
        ('"mori_comm.node_device_barrier"(%p, %p) {world_size = 8 : i64, group_size = 32 : i64, max_blocks = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()',
         "'mori_comm.node_device_barrier' attribute 'group_size' (32) must divide 'world_size' (8): whole nodes"),
    ],
)  # fmt: skip
def test_comm_extra_verify_rules(body, needle):
    module, op = _first_op(body, "%p: !llvm.ptr, %n: i64, %i: i32, %b: i1")
    assert mori_comm.extra_verify(op) == [needle]


@pytest.mark.parametrize(
    "body",
    [
        '"mori_comm.count_signal"(%p, %p, %p) {world_size = 32 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()',
        '"mori_comm.device_barrier"(%p, %p) {world_size = 1 : i64, max_blocks = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()',
        '"mori_comm.row_copy_to_peers"(%p, %p, %n, %i, %b) {max_peers = 1 : i64} : (!llvm.ptr, !llvm.ptr, i64, i32, i1) -> ()',
        '"mori_comm.accumulate_rows"(%p, %n, %p) {dtype = "f32"} : (!llvm.ptr, i64, !llvm.ptr) -> ()',
        '"mori_comm.grid_barrier"(%p) : (!llvm.ptr) -> ()',
        '%r = "mori_comm.node_pe"(%i) {group_size = 32 : i64} : (i32) -> i32',
        '"mori_comm.node_count_signal"(%p, %p, %p) {world_size = 32 : i64, group_size = 1 : i64} : (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()',
        '"mori_comm.node_device_barrier"(%p, %p) {world_size = 8 : i64, group_size = 8 : i64, max_blocks = 1 : i64} : (!llvm.ptr, !llvm.ptr) -> ()',
    ],
    ids=["count_signal-32", "device_barrier-1", "to_peers-1", "accumulate-1", "grid_barrier", "node_pe-32",
         "node_count_signal-1", "node_device_barrier-whole-world"],
)
def test_comm_extra_verify_accepts_the_bounds(body):
    module, op = _first_op(body, "%p: !llvm.ptr, %n: i64, %i: i32, %b: i1")
    assert mori_comm.extra_verify(op) == []
