"""The collectives (docs/collectives.md) on the CPU: the schema's sizes and workspace layout, the verifier's
messages, the builder, the expansion (each collective's protocol steps, nothing of the dialect left, the
generators' sizes), a compile to PTX, and the host half of the torch API (dtype names, the reference
``expected``, argument errors). Torch-needing tests skip with the reason where torch is absent (CI)."""

from __future__ import annotations

import inspect
import itertools

import pytest

from mori_compiler.dialects.mori_coll_schema import (ALGORITHMS, COLLECTIVES, ELEMENT_BYTES, HEADER_ALIGN, MAX_BLOCKS,
                                                     REDUCE_DTYPES, VECTOR, VIRTUAL_GRID_BLOCKS, CollSpec,
                                                     kernel_source)  # fmt: skip


def all_specs(world_sizes=(1, 2, 3, 8), counts=(1, 7, 100, 4099)) -> list[CollSpec]:
    out = []
    for op, w, n in itertools.product(COLLECTIVES, world_sizes, counts):
        for dtype in ("f32", "bf16") if op in ("all_reduce", "reduce_scatter") else ("u8", "f64"):
            for alg in ALGORITHMS if op == "all_reduce" else ("",):
                out.append(CollSpec(op, dtype, n, w, alg, w - 1 if op == "broadcast" else 0))
    return out


# ---- schema -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op, ins, outs", [("all_gather", 1, 3), ("all_reduce", 1, 1), ("reduce_scatter", 3, 1),
                                           ("broadcast", 1, 1), ("all_to_all", 3, 3), ("all_to_all_v", 3, 3)])  # fmt: skip
def test_sizes_per_op(op, ins, outs):
    spec = CollSpec(op, "f32", 10, 3, "one_shot" if op == "all_reduce" else "")
    assert (spec.input_elems, spec.output_elems) == (10 * ins, 10 * outs)


def test_chunks_cover_the_input_in_aligned_strides():
    for s in all_specs():
        chunks = s.chunks()
        n = s.count * s.elem_bytes
        assert s.stage_stride % VECTOR == 0 and s.stage_stride >= max(b for _, b in chunks), s
        if s.two_shot:  # W shares, back to back, whole vectors but the last ones
            assert len(chunks) == s.world_size and sum(b for _, b in chunks) == n, s
            assert all(off == c * s.stage_stride for c, (off, _) in enumerate(chunks)), s
        else:
            assert sum(b for _, b in chunks) == s.input_elems * s.elem_bytes, s


def test_workspace_regions_are_disjoint_and_aligned():
    for s in all_specs():
        slots_end = s.epochs_offset
        epochs_end = s.epochs_offset + 8 * s.max_blocks
        assert slots_end == 8 * s.max_blocks * s.world_size and epochs_end <= s.header_bytes, s
        assert s.stage_offset == s.header_bytes and s.header_bytes % HEADER_ALIGN == 0, s
        assert s.stage_offset + len(s.chunks()) * s.stage_stride <= s.reduced_offset, s
        assert s.reduced_offset % HEADER_ALIGN == 0 and s.reduced_offset + s.reduced_bytes <= s.workspace_bytes, s
        # the last slice's 16-byte tail stays inside the reduced area and the chunk's stride
        assert s.reduced_bytes == 0 or s.reduced_bytes >= -(-s.chunk_elems * s.elem_bytes // 16) * 16, s


def test_launch_grids_fit_and_kernel_names_are_unique():
    specs = all_specs()
    assert all(1 <= s.blocks <= min(s.max_blocks, VIRTUAL_GRID_BLOCKS // s.world_size) for s in specs)
    assert len({s.kernel_name for s in specs}) == len(specs)


@pytest.mark.parametrize("spec, message", [
    (CollSpec("gather", "f32", 1, 2), "op must be one of all_gather, all_reduce"),
    (CollSpec("all_reduce", "f16", 1, 2, "one_shot"), "'dtype' (summed in fp32) must be one of f32, bf16, got 'f16'"),
    (CollSpec("all_gather", "c64", 1, 2), "'dtype' (moved as bytes) must be one of u8, i8"),
    (CollSpec("all_reduce", "f32", 1, 2, "ring"), "'algorithm' must be one of one_shot, two_shot, got 'ring'"),
    (CollSpec("all_gather", "u8", 1, 2, "one_shot"), "'algorithm' is for all_reduce only"),
    (CollSpec("all_gather", "u8", 0, 2), "'count' must be >= 1, got 0"),
    (CollSpec("all_gather", "u8", 2, 33), "'world_size' must be in [1, 32], got 33"),
    (CollSpec("broadcast", "u8", 2, 4, root=-1), "'root' must be in [0, world_size = 4), got -1"),
    (CollSpec("all_to_all", "u8", 2, 4, root=1), "'root' is for broadcast only"),
    (CollSpec("all_to_all", "u8", 2, 4, max_blocks=MAX_BLOCKS + 1), f"'max_blocks' must be in [1, {MAX_BLOCKS}]"),
    (CollSpec("all_to_all", "u8", 2.0, 4), "'count' must be an int, got 2.0"),
    (CollSpec("all_to_all", "f64", 1 << 32, 8), "larger than 17179869184 bytes"),
])  # fmt: skip
def test_spec_problems_name_the_field_and_allowed_values(spec, message):
    with pytest.raises(ValueError) as exc:
        spec.check()
    assert message in str(exc.value)


def test_every_valid_spec_checks():
    for s in all_specs():
        assert s.problems() == [], s


# ---- dialect, builder, pass -------------------------------------------------------------------------


def _context():
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import registry

    ctx = new_context()
    registry.load_all(ctx)
    return ctx


def test_kernel_source_parses_and_the_builder_makes_the_same_op():
    from mori_compiler._mlir import ir
    from mori_compiler.dialects import mori_coll, registry
    from mori_compiler.dialects.builder import Builder

    specs = [CollSpec("all_reduce", "bf16", 9, 4, "two_shot"), CollSpec("broadcast", "i64", 3, 2, root=1)]
    ctx = _context()
    module = registry.parse_source(kernel_source(specs), ctx)
    ops = [op for op in module.body.operations[0].regions[0].blocks[0].operations]
    with ctx, ir.Location.unknown():
        for fn, spec in zip(ops, specs):
            entry = fn.regions[0].blocks[0]
            parsed = entry.operations[0]
            assert mori_coll.spec_of(parsed) == spec
            b = Builder(entry, before=parsed)
            built = mori_coll.collective(*entry.arguments, spec, **b.at())
            assert str(built) == str(parsed).replace(str(parsed.location), str(built.location))
        with pytest.raises(ValueError, match="'count' must be >= 1"):
            mori_coll.collective(*entry.arguments, CollSpec("all_gather", "u8", 0, 2))


def _expanded(specs, wave=64, **options):
    from mori_compiler.dialects import registry
    from mori_compiler.passes.coll_to_kernels import MoriCollToKernels

    ctx = _context()
    module = registry.parse_source(kernel_source(specs), ctx)
    with ctx:
        MoriCollToKernels(wave_size=wave, **options)(module.operation)
        module.operation.verify()
    return module


def _op_sequence(fn) -> list[str]:
    """The protocol's steps of an expanded kernel (its trace points: _trace_points)."""
    names = []

    def visit(op):
        name = op.operation.name
        if name.startswith(("mori_comm.", "mori_shmem.ptr", "gpu.barrier", "mori_coll.")) and name != "mori_comm.trace":
            names.append(name.rpartition(".")[2])
        return __import__("mori_compiler._mlir", fromlist=["ir"]).ir.WalkResult.ADVANCE

    fn.operation.walk(visit)
    return names


# At the kernel's start, one ptr: each lane's translation of one PE's workspace (the loops shuffle the
# places' addresses made from it: no translation after a meet).
START = ["ptr"]
# The placement's steps: "check" (mori_shmem.ptr of the input's first and last byte: in the heap?) and the
# staging copies in its branch.
CHECK = ["ptr", "ptr"]


# The first meet of the movers in halves: barrier_arrive, the first half of this PE's own part (copy_bytes),
# barrier_wait, its second half (after the loads of the places are issued).
SPLIT = ["barrier_arrive", "copy_bytes", "barrier_wait", "copy_bytes"]
# A mover's pulls after its split first meet: the pull loop's copy_bytes.
PULLS = ["copy_bytes"]


@pytest.mark.parametrize("spec, steps", [
    (CollSpec("all_gather", "u8", 5, 3), START + CHECK + ["copy_bytes"] + SPLIT + PULLS + ["device_barrier"]),
    (CollSpec("broadcast", "u8", 5, 3, root=2), START + CHECK + ["copy_bytes"] + SPLIT + PULLS + ["device_barrier"]),
    # count bytes not a multiple of 16: always staged (the input's chunks do not start where the stage's do)
    (CollSpec("all_to_all", "u8", 5, 3), START + ["copy_bytes"] * 3 + SPLIT + PULLS + ["device_barrier"]),
    (CollSpec("all_to_all", "u8", 16, 3), START + CHECK + ["copy_bytes"] * 3 + SPLIT + PULLS + ["device_barrier"]),
    (CollSpec("reduce_scatter", "f32", 5, 3), START + ["copy_bytes"] * 3 + ["device_barrier"]
     + ["accumulate_rows", "barrier", "copy_bytes", "device_barrier"]),
    # whole vectors: the sums go into the output when it is aligned, through reduced otherwise
    (CollSpec("reduce_scatter", "f32", 8, 3), START + CHECK + ["copy_bytes"] * 3 + ["device_barrier"]
     + ["accumulate_rows", "accumulate_rows", "barrier", "copy_bytes", "device_barrier"]),
    (CollSpec("all_reduce", "f32", 5, 3, "one_shot"), START + ["copy_bytes", "device_barrier"]
     + ["accumulate_rows", "barrier", "copy_bytes", "device_barrier"]),
    (CollSpec("all_reduce", "f32", 8, 3, "one_shot"), START + CHECK + ["copy_bytes", "device_barrier"]
     + ["accumulate_rows", "accumulate_rows", "barrier", "copy_bytes", "device_barrier"]),
    (CollSpec("all_to_all_v", "bf16", 5, 3), ["copy_bytes", "device_barrier", "ptr", "ptr", "copy_bytes",
                                              "device_barrier"]),
    # two-shot's middle meet in halves, its own share inside; the peers' reduced from the start's ptr
    (CollSpec("all_reduce", "bf16", 40, 3, "two_shot"), START + CHECK + ["copy_bytes"] * 3 + ["device_barrier"]
     + ["accumulate_rows", "barrier_arrive", "copy_bytes", "barrier_wait", "copy_bytes", "device_barrier"]),
])  # fmt: skip
def test_each_collective_expands_into_its_protocol_steps(spec, steps):
    module = _expanded([spec])
    fn = module.body.operations[0].regions[0].blocks[0].operations[0]
    assert _op_sequence(fn) == steps


@pytest.mark.parametrize("spec", [CollSpec("all_gather", "u8", 5, 3), CollSpec("all_to_all", "u8", 16, 3),
                                  CollSpec("reduce_scatter", "f32", 8, 3), CollSpec("all_reduce", "f32", 5, 3, "one_shot"),
                                  CollSpec("all_reduce", "bf16", 40, 3, "two_shot"), CollSpec("all_to_all_v", "bf16", 5, 3),
                                  CollSpec("broadcast", "u8", 5, 3, root=2)])  # fmt: skip
def test_one_launch_expansions_have_no_closing_barrier(spec):
    """one-launch (virtual PEs: the launch's end closes a call): the same steps as without it, less the
    closing device_barrier; the meets before it stay."""
    def steps(**options):
        module = _expanded([spec], **options)
        return _op_sequence(module.body.operations[0].regions[0].blocks[0].operations[0])

    closed = steps()
    assert closed[-1] == "device_barrier"
    assert steps(one_launch=True) == closed[:-1]


def _trace_points(fn) -> list[str]:
    from mori_compiler._mlir import ir

    points = []

    def visit(op):
        if op.operation.name == "mori_comm.trace":
            a = op.operation.attributes
            points.append(f"{ir.StringAttr(a['event']).value}:{ir.StringAttr(a['phase']).value}")
        return ir.WalkResult.ADVANCE

    fn.operation.walk(visit)
    return points


@pytest.mark.parametrize("spec, meets", [(CollSpec("all_gather", "u8", 5, 3), 2),
                                         (CollSpec("all_reduce", "bf16", 40, 3, "two_shot"), 3)])  # fmt: skip
def test_each_collective_marks_its_phases_with_trace_points(spec, meets):
    """stage, then per device barrier k "meet<k>" and between two of them "step<k>" (the pulls or sums); none
    after the closing barrier (docs/collectives.md, compiled out unless the trace option)."""
    module = _expanded([spec])
    fn = module.body.operations[0].regions[0].blocks[0].operations[0]
    want = ["stage:begin", "stage:end"]
    for k in range(meets):
        want += ([f"step{k}:end"] if k else []) + [f"meet{k}:begin", f"meet{k}:end"]
        want += [f"step{k + 1}:begin"] if k + 1 < meets else []
    assert _trace_points(fn) == want


def test_two_shot_stages_only_nonempty_shares():
    # 3 elements over 4 PEs: shares of 4 elements (a 16-byte vector), only PE 0's holds data
    spec = CollSpec("all_reduce", "f32", 3, 4, "two_shot")
    assert [b for _, b in spec.chunks()] == [12, 0, 0, 0]
    module = _expanded([spec])
    fn = module.body.operations[0].regions[0].blocks[0].operations[0]
    assert _op_sequence(fn).count("copy_bytes") == 1 + 1 + 1  # one staged share, its own share, one pull (in the loop)


def test_the_pass_refuses_ops_outside_kernels():
    from mori_compiler.dialects import registry
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.passes.coll_to_kernels import MoriCollToKernels

    text = kernel_source([CollSpec("all_gather", "u8", 5, 3)]).replace(" kernel attributes", " attributes")
    ctx = _context()
    module = registry.parse_source(text, ctx)
    with ctx, pytest.raises(MoriCompilerError, match="must be inside a gpu.func kernel"):
        MoriCollToKernels(wave_size=64)(module.operation)
    with pytest.raises(MoriCompilerError, match="wave-size must be 32 or 64, got 16"):
        MoriCollToKernels(wave_size=16)(module.operation)


def test_each_collective_generator_is_under_100_lines():
    from mori_compiler.passes import coll_kernels

    sizes = {f.__name__: len(inspect.getsource(f).splitlines()) for f in set(coll_kernels.EXPANSIONS.values())}
    assert set(sizes) == {"all_gather", "broadcast", "all_to_all", "all_to_all_v", "reduce_scatter",
                          "all_reduce_one_shot", "all_reduce_two_shot"}  # fmt: skip
    assert all(n < 100 for n in sizes.values()), sizes


def test_a_collective_compiles_to_ptx_with_its_blocks_lowered():
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source

    spec = CollSpec("all_reduce", "bf16", 1000, 8, "two_shot")
    result = compile_source(kernel_source([spec]), CompileOptions(target="sm_90"), stop_after="ptx")
    assert result.kernels == (spec.kernel_name,)
    assert [p.type for p in result.signatures[spec.kernel_name].params] == ["ptr"] * 3
    ptx = result.assembly or result.binary.decode()
    assert ptx.count("fence.acq_rel.sys") >= 6 and "st.relaxed.sys.b64" in ptx  # three barriers


# ---- the torch API's host half ------------------------------------------------------------------------


def test_coll_bundle_refuses_bad_arguments():
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.collectives import coll_bundle

    with pytest.raises(MoriCompilerError, match="target must be one of"):
        coll_bundle([CollSpec("all_gather", "u8", 1, 2)], "sm_80", virtual_pes=True)
    with pytest.raises(MoriCompilerError, match="specs must be a non-empty list of CollSpec"):
        coll_bundle([], "sm_90", virtual_pes=True)
    with pytest.raises(ValueError, match="'count' must be >= 1"):
        coll_bundle([CollSpec("all_gather", "u8", 0, 2)], "sm_90", virtual_pes=True)


def test_dtype_names():
    from mori_compiler.ops.collectives import dtype_name

    assert dtype_name("bf16") == "bf16"
    with pytest.raises(ValueError, match="dtype must be a torch dtype or one of u8"):
        dtype_name("float")


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: the reference model's tests need it (pip install torch)")
    return torch


def test_torch_dtypes_map_to_the_schema():
    torch = _torch()
    from mori_compiler.ops.collectives import dtype_name, torch_dtype

    for name, size in ELEMENT_BYTES.items():
        assert dtype_name(torch_dtype(name)) == name
        assert torch.empty(0, dtype=torch_dtype(name)).element_size() == size


def test_expected_moves_rows_as_each_op_says():
    torch = _torch()
    from mori_compiler.ops.collectives import expected

    W, n = 3, 2
    ins = [torch.arange(W * n, dtype=torch.int32) + 100 * p for p in range(W)]
    a2a = expected(CollSpec("all_to_all", "i32", n, W), ins)
    assert a2a[1].tolist() == [2, 3, 102, 103, 202, 203]  # chunk 1 of every PE, in PE order
    ag = expected(CollSpec("all_gather", "i32", W * n, W), ins)
    assert all(t.tolist() == torch.cat(ins).tolist() for t in ag)
    bc = expected(CollSpec("broadcast", "i32", W * n, W, root=2), [None, None, ins[2]])
    assert all(t.tolist() == ins[2].tolist() for t in bc)


def test_expected_all_to_all_v_packs_the_received_chunks():
    torch = _torch()
    from mori_compiler.ops.collectives import expected

    spec = CollSpec("all_to_all_v", "i32", 3, 2)
    # PE 0 sends 1 element to PE 0 and 3 to PE 1; PE 1 sends 2 to PE 0 and 9 (clamped to 3) to PE 1
    ins = [torch.arange(6, dtype=torch.int32), torch.arange(6, dtype=torch.int32) + 10]
    out = expected(spec, ins, [[1, 3], [2, 9]])
    assert [t.tolist() for t in out] == [[0, 10, 11], [1, 2, 3, 12, 13, 14]]
    # a negative split sends nothing (the kernel clamps signed, to [0, count])
    out = expected(spec, ins, [[-1, 3], [2, 2]])
    assert [t.tolist() for t in out] == [[10, 11], [0, 1, 2, 12, 13]]


def test_all_to_all_v_kernel_takes_the_split_tensors():
    spec = CollSpec("all_to_all_v", "u8", 4, 2)
    assert spec.params == ("input", "output", "workspace", "splits", "recv_counts")
    assert spec.sizes_offset + spec.sizes_bytes <= spec.reduced_offset and spec.sizes_bytes == 8 * 32 * 2
    assert "%splits: !llvm.ptr, %recv_counts: !llvm.ptr" in kernel_source([spec])


def test_expected_sums_in_fp32_and_rounds_once():
    torch = _torch()
    from mori_compiler.ops.collectives import expected

    # 1 + 2^-8 + 2^-8: bf16 sums in turn give 1 (each 2^-8 is half an ulp, rounded to even), fp32 then bf16 gives
    # 1 + 2^-7 (exactly representable)
    ins = [torch.tensor([v], dtype=torch.bfloat16) for v in (1.0, 2**-8, 2**-8)]
    (out, *_) = expected(CollSpec("all_reduce", "bf16", 1, 3, "one_shot"), ins)
    assert out.item() == 1 + 2**-7
    rs = expected(CollSpec("reduce_scatter", "f32", 1, 2), [torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])])
    assert [t.tolist() for t in rs] == [[11.0], [22.0]]


def test_collective_needs_shmem():
    _torch()
    from mori_compiler.ops.collectives import Collective
    from mori_compiler.runtime import shmem

    if shmem.current_state() is not None:
        pytest.skip("shmem is initialized in this process")
    with pytest.raises(Exception, match="shmem"):
        Collective("all_gather", "u8", 4)
    with pytest.raises(ValueError, match="op must be one of"):
        Collective("gather", "u8", 4)


def test_a_traced_bundle_lists_the_phases_and_an_untraced_one_none(tmp_path):
    """trace=True compiles the trace points in (a bundle of its own, slots in phase order); the default has
    none; a non-bool trace is refused."""
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.collectives import coll_bundle

    spec = CollSpec("all_gather", "u8", 5, 3)
    plain = coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path)
    traced = coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path, trace=True)
    assert plain.key != traced.key
    assert plain.kernels[spec.kernel_name].trace_events == ()
    assert traced.kernels[spec.kernel_name].trace_events == (
        "stage:begin", "stage:end", "meet0:begin", "meet0:end", "step1:begin", "step1:end")  # fmt: skip
    with pytest.raises(MoriCompilerError, match="coll_bundle: trace must be a bool, got 1"):
        coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path, trace=1)


@pytest.mark.parametrize("spec, pe, input_at, output_at, allowed", [
    # apart (either side, touching): always allowed
    (CollSpec("all_to_all", "f32", 4, 2), 0, 0x1000, 0x1000 + 32, True),
    (CollSpec("all_to_all", "f32", 4, 2), 0, 0x1000 + 32, 0x1000, True),
    # the in-place forms
    (CollSpec("all_reduce", "bf16", 8, 4, "two_shot"), 3, 0x2000, 0x2000, True),
    (CollSpec("all_to_all", "f32", 4, 2), 1, 0x1000, 0x1000, True),
    (CollSpec("broadcast", "u8", 5, 3, root=2), 2, 0x1000, 0x1000, True),
    (CollSpec("all_gather", "u8", 5, 3), 2, 0x1000 + 10, 0x1000, True),
    (CollSpec("reduce_scatter", "f32", 4, 3), 1, 0x1000, 0x1000 + 16, True),
    # any other overlap: refused
    (CollSpec("all_reduce", "bf16", 8, 4, "one_shot"), 0, 0x2000 + 2, 0x2000, False),
    (CollSpec("all_to_all", "f32", 4, 2), 0, 0x1000 + 16, 0x1000, False),
    (CollSpec("all_gather", "u8", 5, 3), 1, 0x1000 + 10, 0x1000, False),  # PE 2's part, not PE 1's
    (CollSpec("all_gather", "u8", 5, 3), 0, 0x1000 + 1, 0x1000, False),
    (CollSpec("reduce_scatter", "f32", 4, 3), 2, 0x1000, 0x1000 + 16, False),
    (CollSpec("all_to_all_v", "bf16", 5, 3), 0, 0x1000, 0x1000, False),
])  # fmt: skip
def test_input_and_output_may_overlap_only_in_place(spec, pe, input_at, output_at, allowed):
    """aliasing_problem (Collective refuses a call with it): apart or an exact in-place form, else an error
    naming the op, the PE and the allowed form."""
    from mori_compiler.ops.collectives import aliasing_problem

    problem = aliasing_problem(spec, pe, input_at, output_at)
    if allowed:
        assert problem is None
    else:
        assert problem.startswith(f"{spec.op}: the output of PE {pe} overlaps its input other than in place (allowed: ")
        assert f"input at {input_at:#x}, output at {output_at:#x}" in problem


def test_a_kernel_with_collectives_records_its_grid_limit(tmp_path):
    """mori-coll-to-kernels marks a kernel with mori.max_blocks, the least max_blocks of its collectives; the
    bundle keeps it (KernelInfo.max_blocks), so the launcher can refuse a wider grid."""
    from mori_compiler.dialects import registry
    from mori_compiler.ops.collectives import coll_bundle
    from mori_compiler.passes.coll_to_kernels import MoriCollToKernels

    spec = CollSpec("all_gather", "u8", 5, 3, max_blocks=8)
    bundle = coll_bundle([spec], "sm_90", virtual_pes=True, cache_root=tmp_path)
    assert bundle.kernels[spec.kernel_name].max_blocks == 8
    second = CollSpec("broadcast", "u8", 5, 3, root=1, max_blocks=5)
    source = kernel_source([spec]).replace("      gpu.return", f"      {second.op_source()}\n      gpu.return")
    ctx = _context()
    module = registry.parse_source(source, ctx)
    with ctx:
        MoriCollToKernels(wave_size=64)(module.operation)
        fn = module.body.operations[0].regions[0].blocks[0].operations[0]
        assert str(fn.attributes["mori.max_blocks"]) == "5 : i64"
