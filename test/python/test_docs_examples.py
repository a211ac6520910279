"""The extension guide's worked examples (examples/, docs/extending.md) compile, and the guide names files
that exist.

* part 1 (examples/shmem_kernel): the mori_shmem kernel compiles for sm_90 and gfx942 (PTX / ISA), with and
  without virtual PEs, its protocol's ordering instructions are in the code, and ``mori-compile --precompile``
  builds exactly the bundles the host script looks up; on a GPU the host script runs it on virtual PEs;
* part 2 (examples/custom_op): the example dialect's lit test passes and its kernel compiles for both
  targets (in subprocesses: the example registers its dialect and pass in the registries of its process);
* part 3 (examples/ep_kernel): the toy kernel family compiles for both targets, its comm blocks lowered,
  and its reference model places rows as the schema says;
* every repository path the docs name in code exists; no comment points at a spec outside the repository.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DOCS = REPO / "docs"
TARGETS = {"sm_90": "ptx", "gfx942": "isa"}  # cheap: stop at the assembly


@contextmanager
def _example_modules(folder: str):
    """Import an example folder's modules by their bare names (as its scripts do), then forget them."""
    path = str(EXAMPLES / folder)
    before = set(sys.modules)
    sys.path.insert(0, path)
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(path)
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if (getattr(module, "__file__", None) or "").startswith(path):
                del sys.modules[name]


def _run(*argv, cwd=REPO, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---- part 1: a kernel in mori_shmem IR -------------------------------------------------------------------

SHMEM_SOURCE = EXAMPLES / "shmem_kernel" / "allgather.mlir"
# What the protocol's fences, polls and barriers become on each target (they must all be in the code).
ORDERING = {
    "ptx": (r"fence\.sc\.sys;", r"ld\.relaxed\.sys(\.global)?\.b64", r"st\.relaxed\.sys\.b64", r"bar\.sync"),
    "isa": (r"buffer_wbl2 sc0 sc1", r"buffer_inv sc0 sc1", r"s_barrier"),
}


@pytest.mark.parametrize("virtual_pes", [True, False], ids=["virtual", "per-process"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_shmem_kernel_compiles(target, virtual_pes):
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source

    stage = TARGETS[target]
    result = compile_source(SHMEM_SOURCE.read_text(encoding="utf-8"), CompileOptions(target=target, virtual_pes=virtual_pes),
                            filename=str(SHMEM_SOURCE), stop_after=stage, want_assembly=True)  # fmt: skip
    assert result.kernels == ("allgather",)
    for pattern in ORDERING[stage]:
        assert re.search(pattern, result.assembly), f"{target}: no {pattern} in the allgather kernel"
    params = [p.type for p in result.signatures["allgather"].params]
    assert params == ["ptr", "ptr", "ptr", "i64", "i64"]  # the host script's argument tuple


def test_precompile_builds_what_the_host_script_looks_up(tmp_path):
    """``mori-compile --precompile precompile.json`` (run from the repository root) records its entries
    under the requests run.py's bundle() asks for, so a GPU machine without the compiler finds them."""
    from mori_compiler.cache import bundle_request
    from mori_compiler.options import CompileOptions
    from mori_compiler.runtime.bundle import find_bundle_by_request

    entries = json.loads((EXAMPLES / "shmem_kernel" / "precompile.json").read_text())
    env = dict(os.environ, MORI_COMPILER_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "mori_compiler.tools.compile", "--precompile",
                           "examples/shmem_kernel/precompile.json"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with _example_modules("shmem_kernel") as load:
        run = load("run")
        assert {e["kernel"] for e in entries} == {run.KERNEL_ENTRY}
        source = run.SOURCE.read_text(encoding="utf-8")
        for entry in entries:
            options = CompileOptions(target=entry["target"], virtual_pes=entry["virtual_pes"])
            request = bundle_request(source, options, {"kernel": run.KERNEL_ENTRY})
            found = find_bundle_by_request(tmp_path, request, target=entry["target"], kernels=("allgather",))
            assert found is not None, f"no precompiled bundle for {entry}"
            assert found.virtual_pes == entry["virtual_pes"]


@pytest.mark.gpu
@pytest.mark.parametrize("n_pes", [2, 4, 8])
def test_shmem_example_runs_on_virtual_pes(n_pes):
    """examples/shmem_kernel/run.py's virtual-PE path on a GPU: every PE ends with every PE's row, 3 rounds.
    Bundles come from MORI_TEST_BUNDLES (default <repo>/.bundles), like the other GPU tests: precompile them
    with ``mori-compile --precompile examples/shmem_kernel/precompile.json`` where the compiler is."""
    bundles = Path(os.environ.get("MORI_TEST_BUNDLES", REPO / ".bundles"))
    with _example_modules("shmem_kernel") as load:
        load("run").run_virtual(n_pes, rounds=3, cache_root=bundles)


# ---- part 2: an op, its lowering pass and its lit test ----------------------------------------------------


def test_custom_op_lit_test_passes():
    lit = Path(sys.executable).with_name("lit")  # the venv's lit; else the installed package's entry point
    command = [str(lit)] if lit.exists() else [sys.executable, "-c", "import sys, lit.main; sys.exit(lit.main.main())"]
    proc = subprocess.run([*command, "-sv", str(EXAMPLES / "custom_op" / "test")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Passed\s*: 1\b", proc.stdout), proc.stdout


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_custom_op_kernel_compiles(target):
    proc = _run("examples/custom_op/compile_example.py", "--target", target, "--stop-after", TARGETS[target])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{target}: flag_barrier after '{TARGETS[target]}'"


def test_custom_op_registration_stays_in_its_process():
    """The example registers at run time; the project's own registries do not list it."""
    from mori_compiler.passes import ALL_PASSES

    assert "mori-example-to-shmem" not in ALL_PASSES
    proc = _run("examples/custom_op/example_opt.py", "--list-passes")
    assert proc.returncode == 0, proc.stderr
    assert "mori-example-to-shmem" in proc.stdout and "mori-shmem-to-abi" in proc.stdout
    proc = _run("examples/custom_op/example_opt.py", "--show-dialects")
    assert {"mori_shmem", "mori_example"} <= set(proc.stdout.split()), proc.stdout


# ---- part 3: a kernel family from builders and a signature -------------------------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_toy_family_compiles(target):
    with _example_modules("ep_kernel") as load:
        compile_allgather = load("compile_allgather")
        schema = load("allgather_schema")
        sizes = schema.AllGatherSizes(world_size=8, hidden=7168, max_rows=128, dtype="bf16")
        after_ep = compile_allgather.compile_allgather(sizes, target, stop_after="ep")
        result = compile_allgather.compile_allgather(sizes, target, stop_after=TARGETS[target])
    name = schema.SIGNATURE.kernel_name("bf16")
    assert result.kernels == (name,)
    assert not re.search(r'"mori_(ep|comm)\.', after_ep.mlir), "a comm block was left unlowered"
    assert after_ep.mlir.count("func.call") >= 3  # row_copy_to_peers, grid_barrier, count_signal helpers
    assert [p.type for p in after_ep.signatures[name].params] == list(schema.SIGNATURE.types)
    for param in schema.SIGNATURE.names:
        assert f'mori.name = "{param}"' in compile_allgather.kernel_source(sizes, target)


def test_toy_family_reference_places_rows_by_the_schema():
    import numpy as np

    with _example_modules("ep_kernel") as load:
        schema = load("allgather_schema")
        reference = load("allgather_reference")
        sizes = schema.AllGatherSizes(world_size=3, hidden=8, max_rows=4, dtype="bf16")
        rows = [np.full((n, 8), 10 * p + 1, dtype=np.uint16) for p, n in enumerate((2, 0, 4))]
        outs, totals = reference.expected(rows, sizes)
    assert totals == [6, 6, 6]
    for out in outs:
        assert out.shape == (3 * 4, 8)
        assert (out[sizes.out_row(0, 1)] == 1).all() and (out[sizes.out_row(2, 3)] == 21).all()
        assert (out[sizes.out_row(1, 0)] == 0).all()  # PE 1 sent nothing: its rows stay as they were


# ---- the docs ------------------------------------------------------------------------------------------------

_PATH = re.compile(r"(?<![\w/.-])((?:examples|docs|dialects|passes|runtime|lib_bitcode|mori_compiler|test|bench)/"
                   r"[\w./-]*\w)")  # fmt: skip
_FENCE = re.compile(r"```.*?```", re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_PLACEHOLDER = re.compile(r"\S*<[^>\s]+>\S*")  # `passes/ep_<kind>_kernels.py`: a pattern, not a file


def _named_paths(doc: Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    code = [m.group(0) for m in _FENCE.finditer(text)]
    code += _INLINE.findall(_FENCE.sub("", text))
    code = [_PLACEHOLDER.sub(" ", chunk) for chunk in code]
    return {m.group(1).rstrip(".") for chunk in code for m in _PATH.finditer(chunk) if "*" not in m.group(1)}


def test_docs_exist():
    for name in ("extending.md", "ep-protocols.md", "device-abi.md", "toolchain.md", "mori-io.md", "tracing.md",
                 "mori-compat.md", "torch-compile.md"):
        assert (DOCS / name).is_file(), name


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))  # every page of docs/
def test_every_path_the_docs_name_exists(doc):
    paths = _named_paths(DOCS / doc)
    if doc == "extending.md":
        assert len(paths) > 20, "the guide names the files to edit"
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"docs/{doc} names files that do not exist: {missing}"


# A reference to a spec file outside the repository (the docs/ copies are ours and fine).
_OUTSIDE = re.compile(r"(?<!docs/)\b(?:ep-semantics\.md|device-abi\.md|toolchain\.md)|shared/spec|"
                      r"\bep-semantics\b|mori-bitcode\.md|performance-anchors|\bstyle\.md|(?<!docs/)mori-io\.md")  # fmt: skip
_SCANNED = ("*.py", "*.mlir", "*.ll")
_SKIPPED = {".venv", ".git", "__pycache__", "Output", "build", "dist"}


def _code_files() -> list[Path]:
    """The repository's code files (``_SCANNED``): those git tracks or would track, or every one below REPO
    outside git (a checkout's ignored build or scratch folders are not the repository's code)."""
    git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *_SCANNED]
    try:
        listed = subprocess.run(git, cwd=REPO, capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
        paths = [REPO / name for name in listed if name]
    except (OSError, subprocess.SubprocessError):
        paths = [path for glob in _SCANNED for path in REPO.rglob(glob)]
    return sorted(p for p in paths if p.is_file() and not _SKIPPED & set(p.relative_to(REPO).parts))


def _lines_matching(pattern: re.Pattern) -> list[str]:
    """``path:line: text`` of every line of the repository's code (``_code_files``) that matches ``pattern``."""
    found = []
    for path in _code_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def references_outside_repo() -> list[str]:
    return _lines_matching(_OUTSIDE)


def test_examples_and_docs_point_inside_the_repo():
    """The examples never point outside the repository, nor do the docs at this machine's paths."""
    mine = [r for r in references_outside_repo() if r.startswith("examples/")]
    assert mine == []
    for doc in DOCS.glob("*.md"):
        assert "/work/" not in doc.read_text(encoding="utf-8"), doc.name


def test_no_reference_outside_repo():
    assert references_outside_repo() == []


def test_section_references_name_their_doc():
    """A bare ``§2.9`` was a section of a spec outside the repository; a section of ours says which doc."""
    bare = [r for r in _lines_matching(re.compile(r"§")) if "docs/" not in r.split(": ", 1)[1]]
    assert bare == []


_SECTION_REF = re.compile(r"docs/([\w-]+\.md)((?:,? ?§\d+(?:\.\d+)?(?:-§?\d+)?)+)")


def _headings(doc: str) -> set[str]:
    """The section numbers of ``docs/<doc>`` (``## 3. ...`` gives "3", ``### 2.11 ...`` gives "2.11")."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    return {m.group(1).rstrip(".") for m in re.finditer(r"(?m)^#{2,4} (\d+(?:\.\d+)*)\.? ", text)}


def test_section_references_exist():
    """Every ``docs/<doc> §N`` in the code names a section that doc has."""
    dangling = []
    for ref in _lines_matching(_SECTION_REF):
        for doc, marks in _SECTION_REF.findall(ref.split(": ", 1)[1]):
            for number in re.findall(r"\d+(?:\.\d+)?", marks):
                if number not in _headings(doc):
                    dangling.append(f"{ref.split(': ', 1)[0]}: docs/{doc} §{number}")
    assert dangling == []
