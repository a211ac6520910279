"""Unit tests of the fuzzing harness (test/fuzz): mutators, classifier, reducer, corpus, fork runner."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # test/: the harness is the package `fuzz`

from fuzz import corpus, json_mutators, mutators  # noqa: E402
from fuzz.classify import classify, normalize, unlocated_reason  # noqa: E402
from fuzz.executor import Case, ForkRunner, RunResult  # noqa: E402
from fuzz.reduce import ddmin, reduce_input  # noqa: E402

EXAMPLE = (Path(__file__).resolve().parents[2] / "mori_compiler" / "examples" / "ring_put_signal.mlir").read_bytes()


# ---- mutators ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(mutators.MUTATORS))
def test_mutator_is_deterministic_and_changes_the_input(name):
    fn = mutators.MUTATORS[name]
    for seed in range(20):
        a = fn(random.Random(seed), EXAMPLE, [EXAMPLE[:300]])
        b = fn(random.Random(seed), EXAMPLE, [EXAMPLE[:300]])
        assert a == b, f"{name} seed {seed}: two runs differ"
        assert a != EXAMPLE, f"{name} seed {seed}: the mutant equals its input"


@pytest.mark.parametrize("name", sorted(mutators.MUTATORS))
def test_mutator_handles_inputs_without_its_tokens(name):
    for data in (b"", b"x", b"\xff\xfe", b"module {\n}\n"):
        out = mutators.MUTATORS[name](random.Random(1), data, [])
        assert isinstance(out, bytes) and out != data, (name, data, out)


def test_mutators_differ_between_seeds():
    outputs = {mutators.mutate(random.Random(s), EXAMPLE, [EXAMPLE])[0] for s in range(30)}
    assert len(outputs) > 25


def test_token_mutators_produce_the_values_they_promise():
    found = {m for s in range(200) for m in [mutators.replace_integer(random.Random(s), EXAMPLE, [])]
             if b"2147483648" in m or b"18446744073709551616" in m}  # fmt: skip
    assert found, "boundary integers never inserted"
    dense = [mutators.mutate_dense_array(random.Random(s), EXAMPLE, []) for s in range(50)]
    assert any(b"array<index:" in d for d in dense)
    gpu = mutators.duplicate_gpu_module(random.Random(0), EXAMPLE, [])
    assert gpu.count(b"gpu.module @") == 2
    moved = [mutators.insert_op(random.Random(s), EXAMPLE, []) for s in range(400)]
    assert any(b'gpu.module @ring_put_signal {\n  %fz0 = "mori_shmem.' in m or
               b'gpu.module @ring_put_signal {\n  "mori_shmem.' in m for m in moved)  # an op outside any function
    bad = [mutators.insert_non_utf8(random.Random(s), EXAMPLE, []) for s in range(10)]
    for b in bad:
        with pytest.raises(UnicodeDecodeError):
            b.decode("utf-8")


def test_json_mutators_are_deterministic_and_change_the_configs():
    seen, unchanged = set(), 0
    bases = {json_mutators.dump(c) for c in json_mutators.BASE_LISTS}
    for seed in range(100):
        a, names_a = json_mutators.mutate_configs(random.Random(seed))
        b, names_b = json_mutators.mutate_configs(random.Random(seed))
        assert (a, names_a) == (b, names_b)
        unchanged += a in bases  # possible: an entry of a two-entry base list removed
        seen.add(a)
    assert len(seen) > 85 and unchanged <= 5
    assert json_mutators.EP_CONFIG["hidden_dim"] == 7168  # mutations work on copies


# ---- classifier ----------------------------------------------------------------------------------
def _result(code=1, err="", sig=None, timed_out=False, out=""):
    return RunResult(code, sig, timed_out, out.encode(), err.encode(), 0.1)


OPT = Case("opt", ["input.mlir", "-p", "mori-shmem-to-abi"], {"input.mlir": b""})
COMPILE = Case("compile", ["input.mlir", "--target", "sm_90", "-o", "out.ptx"], {"input.mlir": b""})
PRECOMPILE = Case("compile", ["--precompile", "configs.json"], {"configs.json": b"[]"})


@pytest.mark.parametrize(
    "case, result, outcome",
    [
        (OPT, _result(0), "ok"),
        (OPT, _result(None, timed_out=True), "hang"),
        (OPT, _result(None, "python: Types.cpp:123: Assertion `isIntOrFloat()' failed.", sig=signal.SIGABRT), "crash"),
        (OPT, _result(None, "", sig=signal.SIGSEGV), "crash"),
        (COMPILE, _result(1, "LLVM ERROR: Symbol name with unsupported characters"), "crash"),
        (COMPILE, _result(0, "UNREACHABLE executed at Value.cpp:42"), "crash"),
        (OPT, _result(1, "Traceback (most recent call last):\n  File x\nValueError: y"), "traceback"),
        (OPT, _result(0, out="Traceback (most recent call last):\nKeyError: 1"), "traceback"),
        (OPT, _result(2, "error: internal compiler error: TypeError: x"), "internal"),
        (OPT, _result(3, "error: x"), "internal"),
        (OPT, _result(1, "error: input.mlir:3:5: 'gpu.func' op expected body"), "user_error"),
        (OPT, _result(1, "error: input.mlir:3:5: a\nerror: input.mlir:7:5: b\n  note: x"), "user_error"),
        (OPT, _result(1, "error: unknown pass 'x' in -p (see mori-opt --help)"), "user_error"),
        (OPT, _result(1, "error: no such file: input.mlir"), "user_error"),
        (COMPILE, _result(1, "error: unknown target 'gfx900' (--target); allowed: gfx942"), "user_error"),
        (Case("compile", ["input.mlir", "--target", "", "-o", "o"], {"input.mlir": b""}),
         _result(1, "error: unknown target ''; allowed targets: gfx942"), "user_error"),
        (Case("compile", ["input.mlir", "--code-object-version", "-1"], {"input.mlir": b""}),
         _result(1, "error: code object version -1 is not supported; allowed: 5, 6"), "user_error"),
        (Case("opt", ["input.mlir", "-p", "\udcff"], {"input.mlir": b""}),
         _result(1, "error: the pass pipeline '\\udcff' is not valid UTF-8 text"), "user_error"),
        (Case("opt", ["input.mlir", "-p", "mori-shmem-to-abi"], {"input.mlir": b""}),
         _result(1, "error: mori-shmem-to-abi: 'mori_shmem.fence' op outside a kernel"), "unlocated"),
        (Case("opt", ["input.mlir", "-p", "builtin.module("], {"input.mlir": b""}),
         _result(1, "error: unbalanced parentheses in pass pipeline: builtin.module("), "user_error"),
        (COMPILE, _result(1, "error: gpu.module @m calls undefined functions: f; link a bitcode (--bitcode PATH)"),
         "user_error"),
        (Case("compile", ["input.mlir", "--code-object-version", "7"], {"input.mlir": b""}),
         _result(1, "error: code object version 7 is not supported; allowed: 5, 6"), "user_error"),
        (Case("compile", ["input.mlir", "--bitcode", ""], {"input.mlir": b""}),
         _result(1, "error: device bitcode file not found: "), "user_error"),
        (OPT, _result(1, "error: input.mlir:3:5: a\nerror: can't parse integer attribute -1 in nvvm.maxntid"),
         "unlocated"),
        (OPT, _result(1, "error: 'mori_ep.combine' was configured for wave size 64, the target runs 32"), "unlocated"),
        (OPT, _result(1, "error: input.mlir is not a UTF-8 text file"), "unlocated"),
        (COMPILE, _result(1, "error: -:3:49: 'llvm.mlir.constant' op bad value"), "unlocated"),
        (COMPILE, _result(1, "error: something went wrong"), "unlocated"),
        (COMPILE, _result(1, "error: expected exactly one gpu.module in the input, found 2"), "unlocated"),
        (COMPILE, _result(1, "error: input.mlir holds no gpu.module (kernels are compiled per gpu.module)"),
         "user_error"),
        (OPT, _result(1, "error: kernel 'k' parameter 0 has type index"), "unlocated"),
        (OPT, _result(1, ""), "unlocated"),
        (PRECOMPILE, _result(1, "error: config 2: 'ep' field hidden_dim must be an int, got 7168.0"), "user_error"),
        (PRECOMPILE, _result(1, "error: configs.json is not valid JSON: Expecting value"), "user_error"),
        (PRECOMPILE, _result(1, "error: compile option 'target' must be str, got int 7"), "unlocated"),
        (PRECOMPILE, _result(1, "\r[####     ] 1/2 <example x> gfx942error: config 2: bad"), "unlocated"),
        (PRECOMPILE, _result(2, "error: internal compiler error: AttributeError: x"), "internal"),
    ],
)  # fmt: skip
def test_classify(case, result, outcome):
    assert classify(case, result).outcome == outcome


def test_builtin_example_locations_count():
    case = Case("compile", ["ring_put_signal", "--target", "sm_90"], {})
    assert classify(case, _result(1, "error: <example ring_put_signal>:3:4: 'gpu.func' op x")).outcome == "user_error"


def test_stdin_locations_count():
    case = Case("opt", ["-"], {}, stdin=b"x")
    assert classify(case, _result(1, "error: <stdin>:1:1: custom op 'x' is unknown")).outcome == "user_error"


def test_unlocated_rule_accepts_option_and_whole_file_errors_only():
    names = ["input.mlir"]
    assert unlocated_reason("error: --emit=ptx does not apply to target gfx942", names) is None
    assert unlocated_reason("error: input.mlir is a directory, not an input file", names) is None
    assert unlocated_reason("error: 'gpu.func' op bad", names)
    assert unlocated_reason("error: symbol @k is not a kernel", names)
    assert unlocated_reason("  [##] 1/2 error: x", names) == "error: glued behind other output"


def test_signature_ignores_locations_numbers_and_names():
    a = classify(OPT, _result(1, "error: 'mori_ep.combine' configured for wave size 64 at input.mlir"))
    b = classify(OPT, _result(1, "error: 'mori_ep.dispatch' configured for wave size 32 at input.mlir"))
    assert a.signature == b.signature
    c = classify(OPT, _result(None, "python: /x/Types.cpp:123: Assertion `a' failed.", sig=6))
    d = classify(OPT, _result(None, "python3: /y/Types.cpp:99: Assertion `a' failed.", sig=6))
    assert c.signature == d.signature != a.signature
    assert normalize("error: x.mlir:12:7: got 2147483648") == "error: LOC got …"


# ---- reducer -------------------------------------------------------------------------------------
def test_ddmin_finds_the_minimal_failing_subset():
    items = list(range(40))
    result = ddmin(items, lambda xs: 7 in xs and 31 in xs, time.monotonic() + 10)
    assert result == [7, 31]


def test_reduce_input_shrinks_lines_then_bytes():
    data = b"".join(b"line %d\n" % i for i in range(50)) + b"crash here XY\n" + b"tail\n" * 20
    reduced = reduce_input(data, lambda d: b"XY" in d, seconds=10)
    assert reduced == b"XY"


def test_reduce_input_respects_its_time_budget():
    data = bytes(range(256)) * 4
    start = time.monotonic()
    reduce_input(data, lambda d: time.sleep(0.01) or len(d) > 3, seconds=0.5)
    assert time.monotonic() - start < 2.0


# ---- corpus --------------------------------------------------------------------------------------
def test_run_line_options_are_parsed():
    text = ("// RUN: mori-opt %s -p 'mori-ep-to-kernels{wave-size=64}' --split-input-file | FileCheck %s\n"
            "// RUN: not mori-opt %s -o %t 2>&1 | FileCheck %s\n// RUN: mori-opt --list-passes | FileCheck %s\n")  # fmt: skip
    assert corpus.opt_options_of_run_lines(text) == [["-p", "mori-ep-to-kernels{wave-size=64}", "--split-input-file"], []]


def test_corpus_covers_lit_inputs_examples_and_ep_modules():
    lit = corpus.lit_seeds()
    assert len(lit) >= 20 and all(b"// RUN" not in s.data for s in lit)
    assert any(["--split-input-file", "-p", "mori-shmem-to-abi"] in s.opt_variants for s in lit)
    compile_seeds = corpus.compile_seeds()
    assert any(b'"mori_ep.dispatch"' in s.data for s in compile_seeds)
    assert any(s.name.endswith("ring_put_signal.mlir") for s in compile_seeds)


# ---- fork runner ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fork_runner():
    runner = ForkRunner(jobs=2, timeout=3.0, warm_up=False)
    yield runner


def _with_entry(runner, fn):
    saved = dict(runner.entries)
    runner.entries["opt"] = fn
    return saved


@pytest.mark.parametrize(
    "body, outcome, check",
    [
        (lambda argv: os.abort(), "crash", lambda r: r.signal == signal.SIGABRT),
        (lambda argv: os.kill(os.getpid(), signal.SIGSEGV), "crash", lambda r: r.signal == signal.SIGSEGV),
        (lambda argv: time.sleep(60), "hang", lambda r: r.timed_out),
        (lambda argv: 1 / 0, "traceback", lambda r: b"ZeroDivisionError" in r.stderr and r.exit_code == 1),
        (lambda argv: sys.exit(2), "internal", lambda r: r.exit_code == 2),
        (lambda argv: print("error: input.mlir:1:2: bad", file=sys.stderr) or 1, "user_error",
         lambda r: r.stderr == b"error: input.mlir:1:2: bad\n"),
        (lambda argv: print(open(argv[0]).read(), end="") or 0, "ok", lambda r: r.stdout == b"module {}"),
    ],
)  # fmt: skip
def test_fork_runner_reports_what_the_child_did(fork_runner, body, outcome, check):
    saved = _with_entry(fork_runner, body)
    try:
        case = Case("opt", ["input.mlir"], {"input.mlir": b"module {}"})
        ((_, result),) = list(fork_runner.run_many([case]))
    finally:
        fork_runner.entries.update(saved)
    assert check(result), result
    assert classify(case, result).outcome == outcome


def test_fork_runner_runs_cases_in_parallel_and_keeps_them_apart(fork_runner):
    cases = [Case("opt", ["input.mlir"], {"input.mlir": b"func.func @f%d() { return }\n" % i}) for i in range(6)]
    results = dict((c.files["input.mlir"], r) for c, r in fork_runner.run_many(cases))
    assert len(results) == 6
    for data, r in results.items():
        assert r.exit_code == 0, r.stderr
        name = data.split(b"@")[1].split(b"(")[0]
        assert b"@" + name + b"()" in r.stdout and r.stdout.count(b"func.func") == 1


# ---- reach: the generator produces the shapes of issue 11's defect classes -------------------------
def test_generator_reaches_the_known_defect_shapes():
    import re

    from fuzz.campaign import CaseGenerator

    generator = CaseGenerator(99)
    shapes = {
        "gpu.func with a space in its name, for sm_90": lambda d, argv: re.search(rb'gpu\.func @"a b"', d)
        and "sm_90" in argv,
        "launch bounds out of i32 range or negative": lambda d, argv: re.search(
            rb"known_block_size = array<i32: (?:2147483648|4294967295|-1)", d),
        "mori_shmem op directly in a gpu.module": lambda d, argv: re.search(
            rb'gpu\.module @[\w"]+ \{\n\s*(?:%\w+ = )?"mori_shmem\.', d),
        "array<index: ...>": lambda d, argv: b"array<index" in d,
        "two gpu.modules": lambda d, argv: d.count(b"gpu.module @") >= 2,
        "non-UTF-8 bytes": lambda d, argv: not _is_utf8(d),
        "non-UTF-8 escape in a name or string": lambda d, argv: re.search(rb'"\\(?:ff|c3\\28)', d),
    }  # fmt: skip
    counts = dict.fromkeys(shapes, 0)
    for i in range(1500):
        case = generator.case("compile", i)
        for name, matches in shapes.items():
            counts[name] += bool(matches(case.files["input.mlir"], case.argv))
    assert all(n >= 3 for n in counts.values()), counts


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_generator_is_a_function_of_seed_tool_and_index():
    from fuzz.campaign import CaseGenerator

    a, b, other = CaseGenerator(5), CaseGenerator(5), CaseGenerator(6)
    for tool in ("opt", "compile", "precompile"):
        for i in (0, 7, 123):
            x, y, z = a.case(tool, i), b.case(tool, i), other.case(tool, i)
            assert (x.argv, x.files, x.stdin) == (y.argv, y.files, y.stdin)
            assert (x.argv, x.files, x.stdin) != (z.argv, z.files, z.stdin)
    assert b.case("opt", 3).argv != b.case("opt", 4).argv or b.case("opt", 3).files != b.case("opt", 4).files
