"""MORI's FlyDSL integration (``mori.ir.flydsl``, ``.ops``, ``.runtime`` of amd-mori 1.2.4) is the reference of
mori_compiler.clients.flydsl: every public name and function of those modules exists in ours with a compatible
signature, and the device functions MORI builds from its ``MORI_DEVICE_FUNCTIONS`` are ours, with the same
symbol and types.

MORI's sources are read with ``ast`` out of the wheel (test_mori_compat_api.py's fixture logic: pip download
into the pytest cache, or MORI_TEST_MORI_WHEEL); never imported (MORI's ops module builds FlyDSL externs at
import), never copied. Nothing of MORI's FlyDSL API is left out; DIFFERENT says what behaves otherwise.
"""

from __future__ import annotations

import ast
import importlib
import zipfile

import pytest

from mori_compiler.clients import flydsl as ours
from mori_compiler.compat import MODULE_MAP
from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, SIGNAL_ADD, SIGNAL_SET
from test_mori_compat_api import _cache_dir, _downloaded_wheel, _explicit_wheel, _our_signature, signature_problems

FLYDSL_FILES = ("mori/ir/flydsl/__init__.py", "mori/ir/flydsl/ops.py", "mori/ir/flydsl/runtime.py")
MORI_OPS_FILE = "mori/ir/ops.py"  # where MORI's MORI_DEVICE_FUNCTIONS and SIGNAL_* are literals
#: MORI module -> the module of ours that answers it (the compat layer maps each to it).
OURS = {"mori.ir.flydsl": "mori_compiler.clients.flydsl", "mori.ir.flydsl.ops": "mori_compiler.clients.flydsl",
        "mori.ir.flydsl.runtime": "mori_compiler.clients.flydsl"}  # fmt: skip
#: Offered with another behaviour, and why.
DIFFERENT = {
    "get_bitcode_path": "MORI_SHMEM_BC (MORI's bitcode) is refused: its device state only MORI's runtime fills; "
                        "the project's library for FlyDSL's target instead of MORI's cov-6 bitcode",
    "shmem_module_init": "fills mori_compiler_shmem_state from mori_compiler's runtime; refuses shmem on CUDA",
}


@pytest.fixture(scope="module")
def sources(request) -> dict[str, ast.Module]:
    wheel = _explicit_wheel() or _downloaded_wheel(_cache_dir(request))
    with zipfile.ZipFile(wheel) as zf:
        return {name: ast.parse(zf.read(name).decode(), name) for name in (*FLYDSL_FILES, MORI_OPS_FILE)}


def _module_name(path: str) -> str:
    return path[:-len("/__init__.py")].replace("/", ".") if path.endswith("__init__.py") else path[:-3].replace("/", ".")


def _assigned(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise AssertionError(f"{name} is not assigned at the top of the module")


def mori_device_functions(sources) -> dict:
    return ast.literal_eval(_assigned(sources[MORI_OPS_FILE], "MORI_DEVICE_FUNCTIONS"))


def _top_level_public(tree: ast.Module) -> set[str]:
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def _exported(sources, path: str) -> set[str]:
    """What users get from MORI's file: its ``__all__`` with the dynamic part (``list(_all_ops.keys())``: one
    extern per MORI_DEVICE_FUNCTIONS entry) resolved and the names it imports from its ``runtime`` sibling;
    without an ``__all__``, its public top-level names."""
    tree = sources[path]
    if not any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
               for n in tree.body):  # fmt: skip
        return _top_level_public(tree)
    names: set[str] = set()
    for node in ast.walk(_assigned(tree, "__all__")):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.Name) and node.id == "_all_ops":
            names |= set(mori_device_functions(sources))
        elif isinstance(node, ast.Name) and node.id == "_ops_all":
            names |= _exported(sources, "mori/ir/flydsl/ops.py")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in ("runtime", "mori.ir.flydsl.runtime"):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_the_reference_is_shaped_as_expected(sources):
    """The resolution above reads MORI 1.2.4's shapes; a different MORI fails here, not silently."""
    ops_all = ast.unparse(_assigned(sources["mori/ir/flydsl/ops.py"], "__all__"))
    assert ops_all == "list(_all_ops.keys()) + ['SIGNAL_SET', 'SIGNAL_ADD']"
    assert "for name, meta in MORI_DEVICE_FUNCTIONS.items()" in ast.unparse(sources["mori/ir/flydsl/ops.py"])
    assert len(mori_device_functions(sources)) == len(MORI_DEVICE_FUNCTIONS)


@pytest.mark.parametrize("path", FLYDSL_FILES)
def test_every_name_mori_exports_is_ours(sources, path):
    mine = importlib.import_module(OURS[_module_name(path)])
    exported = _exported(sources, path)
    assert exported, path
    missing = sorted(exported - set(mine.__all__))
    assert missing == [], f"{_module_name(path)}: not in {mine.__name__}.__all__: {missing}"
    # Not needing FlyDSL to exist: the non-device names resolve now, the device names lazily.
    assert all(hasattr(mine, n) for n in exported - set(MORI_DEVICE_FUNCTIONS))


@pytest.mark.parametrize("path", FLYDSL_FILES)
def test_every_public_function_has_a_compatible_signature(sources, path):
    mine = importlib.import_module(OURS[_module_name(path)])
    problems = []
    functions = [n for n in sources[path].body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    for fn in functions:
        if not hasattr(mine, fn.name):
            problems.append(f"{fn.name}: missing")
            continue
        found = signature_problems(fn, _our_signature(mine, fn.name, is_method=False), drop_first=False,
                                   varargs_ok=False)  # fmt: skip
        problems += [f"{fn.name}: {p}" for p in found]
    assert problems == []
    if path.endswith("runtime.py"):  # the module of MORI's public functions
        assert {f.name for f in functions} == {"get_bitcode_path", "shmem_module_init", "install_hook",
                                               "install_jit_hook"}  # fmt: skip


def test_the_device_functions_are_moris_entries(sources):
    """Each extern MORI builds (symbol, argument and return types, purity) is the one ours builds (our
    test_flydsl_client.py checks that ours builds them from our table)."""
    theirs = mori_device_functions(sources)
    assert theirs == MORI_DEVICE_FUNCTIONS


def test_the_signal_operations_are_moris(sources):
    tree = sources[MORI_OPS_FILE]
    assert (ast.literal_eval(_assigned(tree, "SIGNAL_SET")), ast.literal_eval(_assigned(tree, "SIGNAL_ADD"))) == (
        ours.SIGNAL_SET, ours.SIGNAL_ADD) == (SIGNAL_SET, SIGNAL_ADD)


def test_different_names_are_offered_names():
    assert set(DIFFERENT) <= set(ours.__all__)


def test_the_compat_layer_answers_mori_flydsl_with_this_module():
    """Once mori_compiler.compat maps MORI's FlyDSL modules, it maps them here."""
    mapped = {name: MODULE_MAP[name] for name in OURS if name in MODULE_MAP}
    assert mapped == {name: OURS[name] for name in mapped}
