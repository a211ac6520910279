"""MORI itself is the reference of the MORI-compatible names (mori_compiler.compat): every public name,
function, method, dataclass field and keyword argument of MORI 1.2.4's pure-Python API modules exists under
our MORI name with a compatible signature (same parameter names in the same order, a default wherever MORI
has one, ``*args`` / ``**kwargs`` where MORI takes them, extras only with defaults).

MORI's sources are read with ``ast`` out of the ``amd-mori`` wheel (zipfile): never imported, never copied.
The wheel comes from ``pip download`` into the pytest cache (or ``MORI_TEST_MORI_WHEEL=<path to the wheel>``);
where it cannot be downloaded (offline), the module is skipped with pip's own reason.

What we deliberately do not offer is listed in NOT_OFFERED with the reason; each of those names exists and
raises NotImplementedError naming itself when called. DIFFERENT lists what exists with another shape, and why.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mori_compiler.compat import MODULE_MAP

MORI_VERSION = "1.2.4"
WHEEL_NAME = f"amd_mori-{MORI_VERSION}-cp312-cp312-manylinux_2_39_x86_64.whl"
# (--timeout / --retries: offline, pip gives up in seconds, not minutes)
PIP_DOWNLOAD = ["download", "--no-deps", "--timeout", "10", "--retries", "1", "--python-version", "3.12",
                "--only-binary=:all:", "--platform", "manylinux_2_39_x86_64", f"amd-mori=={MORI_VERSION}",
                "-d"]  # fmt: skip

#: MORI's file in the wheel -> the MORI module name it is imported as (our alias of it answers).
API_FILES = {
    "mori/ops/dispatch_combine.py": "mori.ops.dispatch_combine",
    "mori/ops/local_expert_count.py": "mori.ops.local_expert_count",
    "mori/shmem/api.py": "mori.shmem.api",
    "mori/shmem/tensor_utils.py": "mori.shmem.tensor_utils",
    "mori/ir/ops.py": "mori.ir.ops",
    "mori/ir/bitcode.py": "mori.ir.bitcode",
    "mori/io/engine.py": "mori.io.engine",
}
#: MORI's package files whose exported names (imports, lazy attributes, __all__) our packages must have.
PACKAGE_FILES = {
    "mori/ops/__init__.py": "mori.ops",
    "mori/shmem/__init__.py": "mori.shmem",
    "mori/ir/__init__.py": "mori.ir",
    "mori/io/__init__.py": "mori.io",
}

#: Deliberately not offered (a stand-in that raises NotImplementedError naming it), and why.
NOT_OFFERED = {
    "mori.ops.dispatch_combine.warmup_jit_kernels": "no JIT of MORI's HIP kernels: kernels compile per config into the cache",
    "mori.ops.dispatch_combine.EpDispatchCombineOp.get_launch_config": "each call resolves its own grid (AUTO tables)",
    "mori.ops.dispatch_combine.EpDispatchCombineOp.get_debug_time_buf": "MORI's build-option timers; trace=True instead",
    "mori.ops.dispatch_combine.EpDispatchCombineOp.get_debug_time_offset": "as get_debug_time_buf",
    "mori.shmem.api.shmem_mpi_init": "no MPI bootstrap",
    "mori.shmem.api.shmem_barrier_on_stream": "the runtime ships no barrier kernel of its own",
    "mori.io.engine.IOEngine.pop_peer_failure": "peer failures are statuses (ERR_RDMA_OP), not events",
    "mori.io.FabricBackendConfig": "no FABRIC backend",
    "mori.io.fabric_alloc": "no FABRIC backend",
    "mori.io.fabric_free": "no FABRIC backend",
    "mori.io.fabric_torch_allocator": "no FABRIC backend",
    "mori.io.use_fabric_torch_allocator": "no FABRIC backend",
    "mori.io.make_fabric_mem_pool": "no FABRIC backend",
    "mori.io.fabric_mem_pool": "no FABRIC backend",
    "mori.io.PeerFailureEvent": "peer failures are statuses, not events",
    "mori.io.PeerFailureReason": "peer failures are statuses, not events",
}  # fmt: skip

#: Offered with another shape (not checked member by member), and why.
DIFFERENT = {
    "mori.ops.dispatch_combine.EpDispatchRoutingHandle": "opaque: its tensors are our kernels' routing layout, "
                                                         "not MORI's maps (dispatch(return_routing=True) makes one)",
    "mori.io.engine.IOEngineSession.__init__": "sessions are made by IOEngine.create_session only, in both",
    "mori.ops.dispatch_combine.logger": "MORI's module logger exists; the project's op logs nothing through it",
}
#: MORI methods taking ``*args`` that forward them to its C++ binding: ours spell the binding's arity out.
VARARGS_FORWARDERS = {"read", "write", "batch_read", "batch_write"}
#: Module-level names that need torch (a lazy attribute): without torch they raise the extras error.
NEEDS_TORCH = {"mori.ops.dispatch_combine.TOPK_IDX_DTYPE"}


# ---- the reference: MORI's sources from the wheel -----------------------------------------------------


def _explicit_wheel() -> Path | None:
    explicit = os.environ.get("MORI_TEST_MORI_WHEEL")
    if not explicit:
        return None
    if not Path(explicit).is_file():
        pytest.fail(f"MORI_TEST_MORI_WHEEL={explicit} does not exist")
    return Path(explicit)


def _downloaded_wheel(cache_dir: Path) -> Path:
    wheel = cache_dir / WHEEL_NAME
    if wheel.is_file() and zipfile.is_zipfile(wheel):
        return wheel
    proc = subprocess.run([sys.executable, "-m", "pip", *PIP_DOWNLOAD, str(cache_dir)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    if proc.returncode != 0 or not wheel.is_file():
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        pytest.skip(f"cannot download amd-mori=={MORI_VERSION} (the reference of the MORI API) with pip: {tail}")
    return wheel


def _cache_dir(request) -> Path:
    cache = getattr(request.config, "cache", None)  # (absent under -p no:cacheprovider)
    if cache is not None:
        return Path(cache.mkdir("amd_mori_wheel"))
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mori_compiler_tests"
    cache_dir.mkdir(parents=True, exist_ok=True)
    return cache_dir


@pytest.fixture(scope="module")
def mori_sources(request) -> dict[str, ast.Module]:
    wheel = _explicit_wheel() or _downloaded_wheel(_cache_dir(request))  # the cache is touched only when needed
    with zipfile.ZipFile(wheel) as zf:
        return {name: ast.parse(zf.read(name).decode(), name) for name in (*API_FILES, *PACKAGE_FILES)}


def _ours(mori_name: str):
    """The alias module that answers ``import mori_name`` (MODULE_MAP; that the finder serves it is
    test_mori_compat.py's concern)."""
    return importlib.import_module(MODULE_MAP[mori_name])


def _public(name: str) -> bool:
    return not name.startswith("_")


def _decorators(node) -> set[str]:
    return {ast.unparse(d).split("(")[0] for d in node.decorator_list}


# ---- signature compatibility ---------------------------------------------------------------------------


def _mori_params(fn: ast.FunctionDef, *, drop_first: bool):
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    params = [(p.arg, i >= first_default) for i, p in enumerate(positional)]
    keyword = [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return (params[1:] if drop_first else params), keyword, a.vararg is not None, a.kwarg is not None


def _our_signature(owner, name: str, *, is_method: bool) -> inspect.Signature:
    raw = inspect.getattr_static(owner, name) if is_method else getattr(owner, name)
    if isinstance(raw, (staticmethod, classmethod)):
        sig = inspect.signature(raw.__func__)
        params = list(sig.parameters.values())
        return sig.replace(parameters=params[1:] if isinstance(raw, classmethod) else params)
    sig = inspect.signature(raw)
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:] if is_method else params)


def signature_problems(fn: ast.FunctionDef, ours: inspect.Signature, *, drop_first: bool, varargs_ok: bool) -> list[str]:
    """What a call valid against MORI's ``fn`` could do that ``ours`` does not accept the same way."""
    P = inspect.Parameter
    m_pos, m_kw, m_var, m_varkw = _mori_params(fn, drop_first=drop_first)
    o = list(ours.parameters.values())
    o_pos = [p for p in o if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    o_by_name = {p.name: p for p in o}
    has_var = any(p.kind is P.VAR_POSITIONAL for p in o)
    has_varkw = any(p.kind is P.VAR_KEYWORD for p in o)
    problems = []
    for i, (name, has_default) in enumerate(m_pos):
        if i >= len(o_pos) or o_pos[i].name != name:
            got = o_pos[i].name if i < len(o_pos) else ("*args" if has_var else "nothing")
            problems.append(f"positional parameter {i} is '{name}' in MORI, '{got}' here")
        elif has_default and o_pos[i].default is P.empty:
            problems.append(f"'{name}' has a default in MORI, none here")
    for name, has_default in m_kw:
        p = o_by_name.get(name)
        if p is None or p.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD):
            if not has_varkw:
                problems.append(f"keyword '{name}' of MORI is not accepted")
        elif has_default and p.default is P.empty:
            problems.append(f"keyword '{name}' has a default in MORI, none here")
    if m_var and not has_var and not (varargs_ok and o_pos):
        problems.append("MORI takes *args, this does not")
    if m_varkw and not has_varkw:
        problems.append("MORI takes **kwargs, this does not")
    mori_names = {n for n, _ in m_pos} | {n for n, _ in m_kw}
    forwarded = m_var and varargs_ok  # ours spells out the positional arity MORI's *args forwards
    for p in o:
        if p.name not in mori_names and p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY, P.POSITIONAL_ONLY):
            if p.default is P.empty and not (forwarded and p.kind is not P.KEYWORD_ONLY):
                problems.append(f"'{p.name}' (not in MORI) is required here")
    return problems


def test_signature_checker_finds_differences():
    fn = ast.parse("def f(self, a, b=1, *, c=2): pass").body[0]

    def sig(text):
        ns = {}
        exec(text, ns)  # noqa: S102 - a literal of this test
        return _our_signature(type("C", (), {"f": ns["f"]}), "f", is_method=True)

    assert signature_problems(fn, sig("def f(self, a, b=1, *, c=2, d=3): pass"), drop_first=True, varargs_ok=False) == []
    assert signature_problems(fn, sig("def f(self, a, b=1, **kw): pass"), drop_first=True, varargs_ok=False) == []
    assert signature_problems(fn, sig("def f(self, a, x=0, b=1, *, c=2): pass"), drop_first=True, varargs_ok=False) == [
        "positional parameter 1 is 'b' in MORI, 'x' here"]
    assert signature_problems(fn, sig("def f(self, a, b, *, c=2): pass"), drop_first=True, varargs_ok=False) == [
        "'b' has a default in MORI, none here"]
    assert signature_problems(fn, sig("def f(self, a, b=1): pass"), drop_first=True, varargs_ok=False) == [
        "keyword 'c' of MORI is not accepted"]
    assert signature_problems(fn, sig("def f(self, a, b=1, *, c=2, e): pass"), drop_first=True, varargs_ok=False) == [
        "'e' (not in MORI) is required here"]
    star = ast.parse("def f(*a): pass").body[0]
    assert signature_problems(star, sig("def f(self, x): pass"), drop_first=False, varargs_ok=False) == [
        "MORI takes *args, this does not", "'x' (not in MORI) is required here"]
    assert signature_problems(star, sig("def f(self, x): pass"), drop_first=False, varargs_ok=True) == []


# ---- the checks ---------------------------------------------------------------------------------------


def _check_not_offered(qualname: str, obj) -> list[str]:
    """A name listed as not offered exists, and calling it (no arguments: each refusal comes first) raises
    NotImplementedError naming it."""
    short = qualname.rsplit(".", 1)[-1]
    try:
        obj()
    except NotImplementedError as exc:
        return [] if short in str(exc) else [f"{qualname}: its error does not name it: {exc}"]
    except Exception as exc:  # noqa: BLE001 - reported
        return [f"{qualname}: calling it raised {type(exc).__name__}: {exc}, not NotImplementedError"]
    return [f"{qualname}: calling it did not raise NotImplementedError (remove it from NOT_OFFERED)"]


def _class_problems(qualname: str, node: ast.ClassDef, ours) -> list[str]:
    problems = []
    if not inspect.isclass(ours):
        return [f"{qualname}: a class in MORI, {type(ours).__name__} here"]
    if "dataclass" in _decorators(node):
        fields = [(ast.unparse(n.target), n.value is not None) for n in node.body if isinstance(n, ast.AnnAssign)]
        if not dataclasses.is_dataclass(ours):
            problems.append(f"{qualname}: a dataclass in MORI, not here")
        else:
            mine = [f for f in dataclasses.fields(ours) if f.init]
            for i, (name, has_default) in enumerate(fields):
                if i >= len(mine) or mine[i].name != name:
                    problems.append(f"{qualname}: field {i} is '{name}' in MORI, "
                                    f"'{mine[i].name if i < len(mine) else 'nothing'}' here")  # fmt: skip
                elif has_default and mine[i].default is dataclasses.MISSING and mine[i].default_factory is dataclasses.MISSING:
                    problems.append(f"{qualname}.{name}: has a default in MORI, none here")
    for item in node.body:
        if not isinstance(item, ast.FunctionDef) or not (_public(item.name) or item.name == "__init__"):
            continue
        member = f"{qualname}.{item.name}"
        if member in DIFFERENT or (item.name == "__init__" and "dataclass" in _decorators(node)):
            continue
        if not hasattr(ours, item.name):
            problems.append(f"{member}: missing")
            continue
        if member in NOT_OFFERED:
            problems += _check_not_offered(member, getattr(ours, item.name))
            continue
        decorators = _decorators(item)
        if "property" in decorators:
            if not isinstance(inspect.getattr_static(ours, item.name), property):
                problems.append(f"{member}: a property in MORI, not here")
            continue
        sig = _our_signature(ours, item.name, is_method=True)
        for p in signature_problems(item, sig, drop_first="staticmethod" not in decorators,
                                    varargs_ok=item.name in VARARGS_FORWARDERS):  # fmt: skip
            problems.append(f"{member}: {p}")
    return problems


def _enum_members_used(tree: ast.Module, enum_name: str) -> set[str]:
    """MORI's enums come from its C++ extension: the members its Python code uses are the ones to offer."""
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == enum_name}


@pytest.mark.parametrize("path", sorted(API_FILES))
def test_every_public_name_of_mori_exists_with_a_compatible_signature(mori_sources, path):
    mori_name = API_FILES[path]
    tree, ours = mori_sources[path], _ours(mori_name)
    problems = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in filter(_public, names):
            qualname = f"{mori_name}.{name}"
            if qualname in DIFFERENT:
                assert hasattr(ours, name), f"{qualname}: listed as different, but missing"
                continue
            if qualname in NEEDS_TORCH:
                try:
                    getattr(ours, name)
                except ImportError as exc:
                    assert "torch" in str(exc), f"{qualname}: {exc}"
                continue
            if not hasattr(ours, name):
                problems.append(f"{qualname}: missing")
                continue
            obj = getattr(ours, name)
            if qualname in NOT_OFFERED:
                problems += _check_not_offered(qualname, obj)
            elif isinstance(node, ast.ClassDef):
                problems += _class_problems(qualname, node, obj)
                for member in _enum_members_used(tree, name):
                    if not hasattr(obj, member):
                        problems.append(f"{qualname}.{member}: enum member used by MORI, missing")
            elif isinstance(node, ast.FunctionDef):
                sig = _our_signature(ours, name, is_method=False)
                problems += [f"{qualname}: {p}" for p in signature_problems(node, sig, drop_first=False, varargs_ok=False)]
    assert not problems, "\n".join(problems)


def _exported_names(tree: ast.Module) -> set[str]:
    """What a MORI package's __init__ exports: the names it imports, its lazy attributes, its __all__."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names if a.name != "*"}
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Dict, ast.List)):
            target = ast.unparse(node.targets[0])
            if target == "_LAZY_ATTRS":
                names |= {k.value for k in node.value.keys}
            elif target == "__all__":
                names |= {e.value for e in node.value.elts}
    return {n for n in names if _public(n)}


@pytest.mark.parametrize("path", sorted(PACKAGE_FILES))
def test_every_name_a_mori_package_exports_exists(mori_sources, path):
    mori_name = PACKAGE_FILES[path]
    ours = _ours(mori_name)
    exported = _exported_names(mori_sources[path])
    assert exported, f"{path}: no exported names found (the reader of MORI's package files is broken)"
    missing = sorted(n for n in exported if not hasattr(ours, n))
    assert not missing, f"{mori_name} lacks MORI's {missing}"
    for name in exported:
        qualname = f"{mori_name}.{name}"
        if qualname in NOT_OFFERED:
            assert not _check_not_offered(qualname, getattr(ours, name))


def test_star_import_of_mori_shmem_api_matches(mori_sources):
    # ``from mori.shmem import *`` takes MORI's api names: every public function of api.py must be in our __all__.
    api = {n.name for n in mori_sources["mori/shmem/api.py"].body if isinstance(n, ast.FunctionDef) and _public(n.name)}
    missing = sorted(api - set(_ours("mori.shmem").__all__))
    assert not missing, missing


def test_every_listed_exception_is_a_name_of_mori(mori_sources):
    # The lists name only what MORI has (no stale entries).
    known = set()
    for path, mori_name in {**API_FILES, **PACKAGE_FILES}.items():
        tree = mori_sources[path]
        known |= {f"{mori_name}.{n}" for n in _exported_names(tree)}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                known.add(f"{mori_name}.{node.name}")
                if isinstance(node, ast.ClassDef):
                    known |= {f"{mori_name}.{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
            elif isinstance(node, ast.Assign):
                known |= {f"{mori_name}.{t.id}" for t in node.targets if isinstance(t, ast.Name)}
    stale = sorted((set(NOT_OFFERED) | set(DIFFERENT) | NEEDS_TORCH) - known)
    assert not stale, stale
