"""The EP op's launches (mori_compiler/ops/ep_launch.py): arguments by name from the EP schema, and a bundle
whose kernels disagree with the schema refused before anything is loaded or launched.

The bundles here are compiled from small kernels built in Python with dialects/builder.py: the schema's
parameter types, named (``mori.name``) as the schema names them, or with a deliberate difference.
"""

from __future__ import annotations

import pytest

from mori_compiler import cache
from mori_compiler._mlir import ir, new_context
from mori_compiler.dialects import registry
from mori_compiler.dialects.builder import Builder, new_gpu_module, new_kernel
from mori_compiler.ep_schema import KERNELS
from mori_compiler.ops import ep_launch
from mori_compiler.ops.bundle import PlannedKernel
from mori_compiler.options import CompileOptions
from mori_compiler.runtime import launcher

FAMILIES = ("async_combine_send", "async_combine_recv")
PLAN = [PlannedKernel(KERNELS[f], "bf16", variant) for variant in (0, 1) for f in FAMILIES]


def _module(kernels: dict[str, tuple[list[str], list[str] | None]]) -> str:
    """A gpu.module of empty kernels: name -> (parameter types "ptr"/"i32", names or None for unnamed)."""
    with new_context() as ctx, ir.Location.unknown():
        registry.load_all(ctx)
        module, body = new_gpu_module("ep")
        b = Builder(body)
        for name, (types, names) in kernels.items():
            _, entry = new_kernel(body, name, [{"ptr": b.ptr, "i32": b.i32}[t] for t in types], block_size=(256, 1, 1),
                                  param_names=names)  # fmt: skip
            Builder(entry).gpu_return()
        return str(module)


def _schema_kernels(**changes) -> dict:
    """The PLAN's kernels as the schema declares them; ``changes[family]`` edits (types, names)."""
    kernels = {}
    for k in PLAN:
        types, names = list(k.signature.types), list(k.signature.names)
        if k.signature.family in changes:
            types, names = changes[k.signature.family](types, names)
        kernels[k.name] = (types, names)
    return kernels


def _bundle(tmp_path, kernels: dict):
    return cache.compile_bundle(_module(kernels), CompileOptions(target="sm_90"), cache_root=tmp_path)


def test_bundle_records_the_schema_names(tmp_path):
    bundle = _bundle(tmp_path, _schema_kernels())
    info = bundle.kernel("ep_async_combine_recv_bf16")
    assert [p.name for p in info.params] == list(KERNELS["async_combine_recv"].names)
    assert all(p.named for p in info.params)
    assert ep_launch.bundle_problems(bundle, PLAN) == []


def _renamed(types, names):
    return types, [("cx2" if n == "cw" else n) for n in names]


def _swapped(types, names):  # two pointers in each other's place: the types alone cannot tell
    names = list(names)
    names[0], names[1] = names[1], names[0]
    return types, names


def test_a_renamed_parameter_is_refused(tmp_path):
    bundle = _bundle(tmp_path, _schema_kernels(async_combine_recv=_renamed))
    with pytest.raises(ValueError, match=r"kernel ep_async_combine_recv_bf16 of bundle \w+: parameter 1 is 'cx2' "
                                         r"\(ptr\); the EP schema's async_combine_recv kernels expect 'cw'"):
        ep_launch.check_bundle(bundle, PLAN)


def test_swapped_parameters_are_refused(tmp_path):
    bundle = _bundle(tmp_path, _schema_kernels(async_combine_send=_swapped))
    problems = ep_launch.bundle_problems(bundle, PLAN)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "parameter 0 is 'inp_w' (ptr); the EP schema's async_combine_send kernels expect 'inp' (ptr) there",
        "parameter 1 is 'inp' (ptr); the EP schema's async_combine_send kernels expect 'inp_w' (ptr) there",
    ] * 2  # the kernel of the config's hidden and its any-hidden variant


def test_unnamed_parameters_are_refused(tmp_path):
    # A bundle whose EP kernels carry no parameter names (not built by the schema's generators) is refused,
    # even where count and types agree: launching by name needs the names.
    unnamed = {name: (types, None) for name, (types, _) in _schema_kernels().items()}
    bundle = _bundle(tmp_path / "a", unnamed)
    problems = ep_launch.bundle_problems(bundle, PLAN)
    recv = "ep_async_combine_recv_bf16"
    assert len(problems) == sum(len(types) for types, _ in unnamed.values())
    assert (f"kernel {recv} of bundle {bundle.key[:12]}: parameter 3 is an unnamed i32; the EP schema's "
            "async_combine_recv kernels expect 'n' (i32) there") in problems  # fmt: skip
    short = dict(unnamed, **{recv: (unnamed[recv][0][:-1], None)})
    problems = ep_launch.bundle_problems(_bundle(tmp_path / "c", short), PLAN)
    assert any("has 10 parameters" in p and "take 11 (cx, cw, fwd, n, hidden," in p for p in problems)


def test_a_missing_kernel_is_refused(tmp_path):
    kernels = _schema_kernels()
    del kernels["ep_async_combine_send_bf16"]
    with pytest.raises(ValueError, match="kernel ep_async_combine_send_bf16 of bundle .*: missing"):
        ep_launch.check_bundle(_bundle(tmp_path, kernels), PLAN)


class _Buffers:
    freed = False

    def address(self, name: str, pe: int) -> int:
        return hash((name, pe)) & 0xFFFF_FFFF_FFFF


class _RecordingKernelSet:
    made: list = []

    def __init__(self, bundle):
        self.launches = []
        _RecordingKernelSet.made.append(self)

    def launch_virtual(self, name, args, *, grid, block):
        self.launches.append((name, args, grid, block))


def test_a_mismatching_bundle_is_never_loaded_or_launched(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "KernelSet", _RecordingKernelSet)
    _RecordingKernelSet.made = []
    bundle = _bundle(tmp_path, _schema_kernels(async_combine_recv=_renamed))
    with pytest.raises(ValueError, match="does not match the EP schema"):
        ep_launch.EpLaunches(bundle, PLAN, _Buffers(), block_threads=256, virtual=True, hidden=32)
    assert _RecordingKernelSet.made == []  # refused before the code object was loaded


def test_launch_arguments_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "KernelSet", _RecordingKernelSet)
    bundle = _bundle(tmp_path, _schema_kernels())
    buffers = _Buffers()
    launches = ep_launch.EpLaunches(bundle, PLAN, buffers, block_threads=256, virtual=True, hidden=32)
    launches.launch("async_combine_recv", "bf16", [(0, {"n": 3, "hidden": 32}), (1, {"n": 4, "hidden": 32, "out_w": 0})],
                    blocks=5)  # fmt: skip
    ((name, args, grid, block),) = launches.kernels.launches
    assert (name, grid, block) == ("ep_async_combine_recv_bf16", (5, 1), (256, 1, 1))
    a = buffers.address
    assert args == [
        (a("a_cx", 0), a("a_cw", 0), a("fwd", 0), 3, 32, a("a_csig", 0), a("a_rounds", 0), a("a_grid", 0),
         a("out_c", 0), a("out_cw", 0), a("zero_row", 0)),
        (a("a_cx", 1), a("a_cw", 1), a("fwd", 1), 4, 32, a("a_csig", 1), a("a_rounds", 1), a("a_grid", 1),
         a("out_c", 1), 0, a("zero_row", 1)),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="missing call arguments inp, inp_w, hidden"):
        launches.launch("async_combine_send", "bf16", [(0, {})], blocks=1)
    # A smaller hidden than the config's runs the any-hidden variant, with the call's hidden.
    launches.launch("async_combine_recv", "bf16", [(0, {"n": 3, "hidden": 16})], blocks=2)
    name, args, _, _ = launches.kernels.launches[-1]
    assert name == "ep_async_combine_recv_bf16_anyhidden" and args[0][4] == 16


def test_no_launch_after_the_buffers_are_freed(tmp_path, monkeypatch):
    # The launcher caches buffer addresses: once close() freed the buffers, a launch must refuse rather
    # than write into freed heap memory.
    monkeypatch.setattr(launcher, "KernelSet", _RecordingKernelSet)
    buffers = _Buffers()
    launches = ep_launch.EpLaunches(_bundle(tmp_path, _schema_kernels()), PLAN, buffers, block_threads=256,
                                    virtual=True, hidden=32)  # fmt: skip
    launches.launch("async_combine_recv", "bf16", [(0, {"n": 3, "hidden": 32})], blocks=1)
    buffers.freed = True
    with pytest.raises(RuntimeError, match=r"freed \(close\(\) was called\)"):
        launches.launch("async_combine_recv", "bf16", [(0, {"n": 3, "hidden": 32})], blocks=1)
    assert len(launches.kernels.launches) == 1
