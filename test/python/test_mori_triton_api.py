"""MORI 1.2.4's ``mori.ir.triton`` is the reference of the Triton client (mori_compiler.clients.triton_*).

MORI's package, ``ops`` and ``runtime`` modules are read with ``ast`` out of the ``amd-mori`` wheel (never
imported, never copied; the wheel is found or downloaded as test_mori_compat_api.py does, which skips with
pip's reason offline). Checked: every name MORI's package exports exists here; ``get_extern_libs`` and
``install_hook`` take MORI's arguments; there is one device function per row of MORI's
``MORI_DEVICE_FUNCTIONS`` (read from its ``mori/ir/ops.py``), calling the same symbol with the same
argument and return types. What is not offered is listed in NOT_OFFERED with the reason, and raises naming it.
"""

from __future__ import annotations

import ast
import importlib
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install triton==3.6.0): the client needs it")

sys.path.insert(0, str(Path(__file__).parent))
from test_mori_compat_api import (  # noqa: E402 - the wheel's finder and the signature checker
    _cache_dir,
    _downloaded_wheel,
    _explicit_wheel,
    _our_signature,
    signature_problems,
)

from mori_compiler.compat import MODULE_MAP  # noqa: E402

#: MORI's module -> ours (what compat's MODULE_MAP maps it to, once it does).
OURS = {
    "mori.ir.triton": "mori_compiler.clients.triton",
    "mori.ir.triton.ops": "mori_compiler.clients.triton_ops",
    "mori.ir.triton.runtime": "mori_compiler.clients.triton_runtime",
}
FILES = {
    "mori/ir/triton/__init__.py": "mori.ir.triton",
    "mori/ir/triton/runtime.py": "mori.ir.triton.runtime",
    "mori/ir/ops.py": "mori.ir.ops",
    "mori/ir/triton/cco/__init__.py": "mori.ir.triton.cco",
}
#: Deliberately not offered, and why (each raises naming itself).
NOT_OFFERED = {
    "mori.ir.triton.cco": "MORI's CCO device API (communicators, windows, SDMA, GDA) needs MORI's CCO runtime",
    "mori.ir.triton.get_cco_extern_libs": "as cco",
}


@pytest.fixture(scope="module")
def mori_sources(request) -> dict[str, ast.Module]:
    wheel = _explicit_wheel() or _downloaded_wheel(_cache_dir(request))
    with zipfile.ZipFile(wheel) as zf:
        return {name: ast.parse(zf.read(name).decode(), name) for name in FILES}


def _mori_device_functions(tree: ast.Module) -> dict:
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MORI_DEVICE_FUNCTIONS":
            return ast.literal_eval(node.value)
    raise AssertionError("mori/ir/ops.py has no MORI_DEVICE_FUNCTIONS literal (the reader is out of date)")


def _package_exports(tree: ast.Module) -> set[str]:
    """Names MORI's mori/ir/triton/__init__.py binds or lists in __all__ (its ``*`` import of ops aside)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names if a.name != "*"}
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__all__":
                        names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return {n for n in names if not n.startswith("_")}


def test_compat_maps_mori_names_to_these_modules():
    for mori_name, ours in OURS.items():
        assert MODULE_MAP.get(mori_name, ours) == ours, f"compat maps {mori_name} to {MODULE_MAP[mori_name]}"
        importlib.import_module(ours)


def test_every_name_of_mori_ir_triton_exists(mori_sources):
    ours = importlib.import_module(OURS["mori.ir.triton"])
    exported = _package_exports(mori_sources["mori/ir/triton/__init__.py"])
    assert {"get_extern_libs", "install_hook", "cco", "get_cco_extern_libs"} <= exported, sorted(exported)
    exported |= set(_mori_device_functions(mori_sources["mori/ir/ops.py"])) | {"SIGNAL_SET", "SIGNAL_ADD"}
    problems = []
    for name in sorted(exported):
        qualname = f"mori.ir.triton.{name}"
        if qualname in NOT_OFFERED:
            continue
        if not hasattr(ours, name):
            problems.append(f"{qualname}: missing")
    assert not problems, "\n".join(problems)


def test_not_offered_names_raise_naming_themselves(mori_sources):
    ours = importlib.import_module(OURS["mori.ir.triton"])
    cco_names = _package_exports(mori_sources["mori/ir/triton/cco/__init__.py"]) - {"__all__"}
    assert {"DevComm", "Window", "get_extern_libs"} <= cco_names, sorted(cco_names)
    for name in sorted(cco_names):  # the stand-in is importable; each of MORI's cco names says why not
        with pytest.raises(AttributeError, match=rf"mori\.ir\.triton\.cco\.{name} is not offered by mori_compiler"):
            getattr(ours.cco, name)
    with pytest.raises(NotImplementedError, match="get_cco_extern_libs is not offered by mori_compiler"):
        ours.get_cco_extern_libs()


def test_runtime_functions_take_moris_arguments(mori_sources):
    tree = mori_sources["mori/ir/triton/runtime.py"]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    assert {f.name for f in functions} == {"get_extern_libs", "install_hook"}, [f.name for f in functions]
    problems = []
    for module in (OURS["mori.ir.triton.runtime"], OURS["mori.ir.triton"]):
        ours = importlib.import_module(module)
        for fn in functions:
            sig = _our_signature(ours, fn.name, is_method=False)
            problems += [f"{module}.{fn.name}: {p}" for p in signature_problems(fn, sig, drop_first=False,
                                                                                 varargs_ok=False)]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_one_device_function_per_mori_row_with_moris_symbol_and_types(mori_sources):
    from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS as OUR_TABLE

    ops = importlib.import_module(OURS["mori.ir.triton.ops"])
    mori_table = _mori_device_functions(mori_sources["mori/ir/ops.py"])
    assert len(mori_table) == 89
    problems = []
    for name, meta in mori_table.items():
        fn = getattr(ops, name, None)
        if fn is None:
            problems.append(f"mori.ir.triton.ops.{name}: missing")
            continue
        ours = OUR_TABLE[name]
        for field in ("symbol", "args", "ret"):
            if ours[field] != meta[field]:
                problems.append(f"{name}: {field} is {meta[field]!r} in MORI, {ours[field]!r} here")
        if bool(ours.get("pure")) != bool(meta.get("pure")):
            problems.append(f"{name}: pure={meta.get('pure', False)} in MORI")
        params = [p for p in _our_signature(ops, name, is_method=False).parameters if p != "_semantic"]
        if len(params) != len(meta["args"]):
            problems.append(f"{name}: takes {len(params)} arguments here, {len(meta['args'])} in MORI")
        if meta["symbol"] not in (fn.__doc__ or ""):
            problems.append(f"{name}: does not call {meta['symbol']}")
    extra = sorted(set(OUR_TABLE) - set(mori_table))
    assert not extra, f"device functions MORI does not have: {extra}"
    assert not problems, "\n".join(problems)
