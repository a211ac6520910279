"""The layering rules of mori_compiler/__init__.py, checked on the import statements of every module.

Layers, lowest first: base (errors, env, targets, _mlir and the package root), lib_bitcode, dialects,
passes, runtime, driver (everything else in mori_compiler: options, pipeline, cache, pass_pipeline,
codeobject, examples, tools). A module may import only from its own layer or lower ones. Imports inside
functions count too: a lazy import is still a dependency. No module imports itself through others (no import
circles, lazy imports included).
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Installed package name of each source folder (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {
    "mori_compiler": REPO_ROOT / "mori_compiler",
    "mori_compiler.dialects": REPO_ROOT / "dialects",
    "mori_compiler.passes": REPO_ROOT / "passes",
    "mori_compiler.runtime": REPO_ROOT / "runtime",
    "mori_compiler.lib_bitcode": REPO_ROOT / "lib_bitcode",
}
LAYERS = ("base", "lib_bitcode", "dialects", "passes", "runtime", "driver")
BASE_MODULES = {"mori_compiler", "mori_compiler.errors", "mori_compiler.env", "mori_compiler.targets", "mori_compiler.ep_schema",
                "mori_compiler._mlir", "mori_compiler.wire_quant"}  # fmt: skip
BARE_TOP_LEVEL = {"dialects", "passes", "runtime", "lib_bitcode"}
# Third-party packages the layers below the compiler proper must never import.
HEAVY = ("mlir", "llvmlite")


def layer_of(module: str) -> str:
    if module in BASE_MODULES:
        return "base"
    for sub in ("lib_bitcode", "dialects", "passes", "runtime"):
        if module == f"mori_compiler.{sub}" or module.startswith(f"mori_compiler.{sub}."):
            return sub
    assert module.startswith("mori_compiler."), module
    return "driver"


def _module_files() -> dict[str, Path]:
    """Installed module name -> source file, for every .py file under the mapped folders."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            if any(part in ("__pycache__",) or part.startswith(".") for part in rel.parts):
                continue
            if package == "mori_compiler" and rel.parts[0] in BARE_TOP_LEVEL:
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _module_files()


def _imports(module: str, path: Path) -> list[tuple[int, str, int]]:
    """(line, imported module as written and resolved to an absolute name, relative level) of every import.

    ``from X import a`` yields X and, where ``X.a`` is a module of the project, ``X.a`` as well.
    """
    is_package = path.name == "__init__.py"
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module
            found.append((node.lineno, base, node.level))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.append((node.lineno, f"{base}.{alias.name}", node.level))
    return found


def test_every_module_is_found():
    for expected in ("mori_compiler.errors", "mori_compiler.tools.compile", "mori_compiler.examples",
                     "mori_compiler.dialects.registry", "mori_compiler.passes.codegen",
                     "mori_compiler.runtime.bundle", "mori_compiler.lib_bitcode.abi", "mori_compiler.codeobject"):  # fmt: skip
        assert expected in MODULES, expected
    assert layer_of("mori_compiler.codeobject") == "driver"
    assert layer_of("mori_compiler.pass_pipeline") == "driver"
    assert layer_of("mori_compiler.tools._cli") == "driver"
    assert layer_of("mori_compiler._mlir") == "base"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_respect_layers(module):
    path = MODULES[module]
    mine = LAYERS.index(layer_of(module))
    violations = []
    for line, imported, level in _imports(module, path):
        top = imported.split(".")[0]
        if level == 0 and top in BARE_TOP_LEVEL:
            violations.append(f"{path}:{line}: imports the bare top-level name '{imported}' "
                              f"(use mori_compiler.{imported})")  # fmt: skip
            continue
        if top != "mori_compiler":
            # The package root, errors/env/targets and the runtime work without MLIR and llvmlite.
            if top in HEAVY and layer_of(module) in ("base", "runtime") and module != "mori_compiler._mlir":
                violations.append(f"{path}:{line}: {layer_of(module)} module imports {imported}")
            continue
        theirs = LAYERS.index(layer_of(imported))
        if theirs > mine:
            violations.append(f"{path}:{line}: {module} ({LAYERS[mine]}) imports {imported} ({LAYERS[theirs]})")
    assert not violations, "\n".join(violations)


def test_runtime_never_imports_heavy_packages():
    for module, path in MODULES.items():
        if layer_of(module) != "runtime":
            continue
        for line, imported, _ in _imports(module, path):
            assert imported.split(".")[0] not in HEAVY, f"{path}:{line}: {imported}"


def test_codeobject_is_stdlib_only():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for line, imported, _ in _imports("mori_compiler.codeobject", MODULES["mori_compiler.codeobject"]):
        top = imported.split(".")[0]
        assert top in stdlib or imported == "mori_compiler.errors", f"codeobject.py:{line}: {imported}"


@pytest.mark.parametrize("module", ["mori_compiler.ep_schema", "mori_compiler.wire_quant"])
def test_ep_schema_is_stdlib_only(module):
    # The compiler, the runtime, the op and the reference model all read it, each without the others
    # (the EP schema sizes the combine's wire rows by mori_compiler.wire_quant, itself stdlib only).
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for line, imported, _ in _imports(module, MODULES[module]):
        assert imported.split(".")[0] in stdlib or imported == "mori_compiler.wire_quant", f"{module}:{line}: {imported}"


def test_import_resolution_is_right():
    # Relative imports resolve against the package (for __init__.py: the package itself).
    found = {imp for _, imp, _ in _imports("mori_compiler.dialects.registry", MODULES["mori_compiler.dialects.registry"])}
    assert {"mori_compiler.dialects", "mori_compiler.dialects.irdl_spec", "mori_compiler.dialects.mori_shmem"} <= found
    found = {imp for _, imp, _ in _imports("mori_compiler.passes.codegen", MODULES["mori_compiler.passes.codegen"])}
    assert "mori_compiler.passes.device_link" in found
    found = {imp for _, imp, _ in _imports("mori_compiler.cache", MODULES["mori_compiler.cache"])}
    assert {"mori_compiler", "mori_compiler.runtime.bundle", "mori_compiler.pipeline"} <= found


# ---- import circles ----------------------------------------------------------------------------------


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (module level and inside functions). A module's own
    ancestor packages are left out: Python imports them first for every submodule, so they close no circle."""
    graph = {}
    for module, path in MODULES.items():
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        graph[module] = {imp for _, imp, _ in _imports(module, path)
                         if imp in MODULES and imp != module and imp not in ancestors}  # fmt: skip
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules, the first repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_circle_finder_finds_circles():
    assert set(_circle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()})) == {"a", "b", "c"}
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles():
    circle = _circle(_import_graph())
    assert circle is None, "import circle (module-level or in functions): " + " -> ".join(circle)


_NO_HEAVY_SCRIPT = r"""
import sys
sys.modules["mlir"] = None
sys.modules["llvmlite"] = None
import mori_compiler.runtime.bundle as bundle
import mori_compiler.lib_bitcode.abi as abi
import mori_compiler.lib_bitcode.state as state
b = bundle.load_bundle(sys.argv[1])
assert b.target == "gfx942" and "ring_put_signal" in b.kernels, b
assert b.binary[:4] == b"\x7fELF"
assert len(abi.ABI_FUNCTIONS) == 98
assert len(state.pack_state(rank=1, n_pes=2)) == state.STATE_SIZE
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("mlir", "llvmlite") and sys.modules[m] is not None)
assert not heavy, heavy
print("ok", b.key)
"""


def test_runtime_and_abi_work_without_mlir_and_llvmlite(tmp_path, example_source):
    from mori_compiler.cache import compile_bundle
    from mori_compiler.options import CompileOptions

    bundle = compile_bundle(example_source, CompileOptions(target="gfx942"), cache_root=tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", _NO_HEAVY_SCRIPT, str(bundle.path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok {bundle.key}"


def test_package_root_is_light(tmp_path):
    code = "import sys; sys.modules['mlir'] = None; sys.modules['llvmlite'] = None; import mori_compiler; print(mori_compiler.__version__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
