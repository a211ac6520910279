"""The collectives of mori_compiler.ops.collectives on virtual PEs (2, 3, 4, 8 on one GPU), against torch
on the host (bit-exact: the kernels sum in fp32 in PE order, as ``expected`` does).

Each case: random inputs from a fixed seed, outputs poisoned (NaN / 0xA5 bytes) before each call, three
calls back to back with new inputs (the workspace reused without a host sync), then CUDA-graph replay of
one call with new input contents. Sizes from 1 element (4 B) to a few MiB, odd counts, and output views
at an odd byte offset (unaligned). Bounded device waits: a protocol that never completes raises
WaitTimeoutError naming the PE and the word, instead of hanging.

Bundles: ``all_bundles(cache_root)`` lists every bundle these tests load (test/python/gpu/kernels.py's
``precompile_all`` should add it), compiled where the compiler is installed.
"""

from __future__ import annotations

import pytest

from multi_gpu import multi_gpu_shmem
from virtual_pes import virtual_pes_fixture

from mori_compiler.dialects.mori_coll_schema import BLOCK_THREADS, CollSpec

pytestmark = pytest.mark.gpu

TARGET = "sm_90"
VIRTUAL_PES = (2, 3, 4, 8)
WAIT_LIMIT = 1 << 26  # polls per wait before it gives up (a hang becomes an error)

# (op, dtype, counts, algorithm); broadcast's root is the last PE. Counts: 1 element, odd sizes, and one of
# a few MiB per collective.
CASES = [
    ("all_reduce", "f32", (1, 1027, 786433), "one_shot"),
    ("all_reduce", "bf16", (3, 65541), "one_shot"),
    ("all_reduce", "f32", (1, 1027, 786433), "two_shot"),
    ("all_reduce", "bf16", (5, 65541), "two_shot"),
    ("reduce_scatter", "f32", (1, 777, 262147), ""),
    ("reduce_scatter", "bf16", (9,), ""),
    ("all_gather", "u8", (4, 1001), ""),
    ("all_gather", "bf16", (131075,), ""),
    ("broadcast", "u8", (5,), ""),
    ("broadcast", "f32", (300001,), ""),
    ("all_to_all", "u8", (3,), ""),
    ("all_to_all", "i32", (10007,), ""),
]


# all_to_all_v: (dtype, capacity per pair); each call draws new splits in [0, capacity] (one above: clamped).
VARIABLE = [("u8", 37), ("bf16", 40001)]


def specs_for(world: int) -> list[CollSpec]:
    return ([CollSpec(op, dtype, n, world, alg, world - 1 if op == "broadcast" else 0)
             for op, dtype, counts, alg in CASES for n in counts]
            + [CollSpec("all_to_all_v", dtype, cap, world) for dtype, cap in VARIABLE])  # fmt: skip


MULTI_GPU = (2, 4, 8)  # one PE per process and GPU (run when the host has that many GPUs)


def multi_gpu_specs(world: int) -> list[CollSpec]:
    """A small matrix per world size: every collective once, odd sizes."""
    return [CollSpec("all_reduce", "bf16", 70001, world, "one_shot"), CollSpec("all_reduce", "f32", 70001, world, "two_shot"),
            CollSpec("reduce_scatter", "f32", 4099, world), CollSpec("all_gather", "u8", 100003, world),
            CollSpec("broadcast", "i32", 999, world, root=world - 1), CollSpec("all_to_all", "bf16", 5001, world),
            CollSpec("all_to_all_v", "f32", 3001, world)]  # fmt: skip


def traced_spec(world: int) -> CollSpec:
    """The collective test_traced_collective_records_its_phases runs with trace points."""
    return CollSpec("all_reduce", "bf16", 65541, world, "two_shot")


def all_bundles(cache_root, target: str = TARGET) -> list:
    """Every bundle these tests load: one per collective and PE count, compiled with virtual PEs, and the
    multi-GPU test's (compiled without)."""
    from mori_compiler.ops.collectives import coll_bundle

    virtual = [coll_bundle([s], target, virtual_pes=True, cache_root=cache_root) for w in VIRTUAL_PES for s in specs_for(w)]
    virtual += [coll_bundle([traced_spec(w)], target, virtual_pes=True, cache_root=cache_root, trace=True)
                for w in VIRTUAL_PES]  # fmt: skip
    return virtual + [coll_bundle([s], target, virtual_pes=False, cache_root=cache_root)
                      for w in MULTI_GPU for s in multi_gpu_specs(w)]  # fmt: skip


pes = virtual_pes_fixture(VIRTUAL_PES)


def _random(spec: CollSpec, gen, pe: int):
    import torch

    from mori_compiler.ops.collectives import torch_dtype

    dtype = torch_dtype(spec.dtype)
    n = spec.input_elems
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64).to(dtype)


def _poison(t):
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0xA5)


def _compare(spec: CollSpec, outs, inputs, what: str, want=None) -> None:
    import torch

    from mori_compiler.ops.collectives import expected

    if want is None:
        want = expected(spec, [None if x is None else x.cpu() for x in inputs])
    for pe, (got, exp) in enumerate(zip(outs, want)):
        got = got.cpu().reshape(-1)
        same = got.view(torch.uint8) == exp.contiguous().view(torch.uint8)
        if not bool(same.all()):
            bad = (~same).nonzero()[0].item() // spec.elem_bytes
            raise AssertionError(f"{spec.kernel_name} ({what}): PE {pe} output differs from torch's at element "
                                 f"{bad} of {got.numel()}: got {got[bad].item()}, expected {exp[bad].item()} "
                                 f"({int((~same).sum()) // spec.elem_bytes} elements differ)")  # fmt: skip


def _outputs(spec: CollSpec, world: int, unaligned: bool):
    """Per PE an output tensor; ``unaligned``: starting one element past a 256-byte boundary (an odd byte
    offset for 1-byte dtypes): the kernels' copies must not assume alignment."""
    import torch

    from mori_compiler.ops.collectives import torch_dtype

    dtype, n = torch_dtype(spec.dtype), spec.output_elems
    return [torch.empty(n + 1, dtype=dtype, device="cuda")[1:] if unaligned else
            torch.empty(n, dtype=dtype, device="cuda") for _ in range(world)]  # fmt: skip


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}-{CASES[i][3] or 'x'}-{CASES[i][1]}")
def test_collective_matches_torch(pes, case, bundle_root):
    import torch

    from mori_compiler.ops.collectives import Collective

    op, dtype, counts, alg = CASES[case]
    for count in counts:
        spec = CollSpec(op, dtype, count, pes, alg, pes - 1 if op == "broadcast" else 0)
        coll = Collective(op, dtype, count, algorithm=alg, root=spec.root, cache_root=bundle_root,
                          wait_limit=WAIT_LIMIT)  # fmt: skip
        try:
            assert coll.spec == spec, (coll.spec, spec)
            gen = torch.Generator().manual_seed(1000 * case + count)
            outputs = _outputs(spec, pes, unaligned=bool(count % 2))
            for call in range(3):  # back to back: the workspace is reused without a host sync
                inputs = [_random(spec, gen, pe).cuda() for pe in range(pes)]
                if op == "broadcast":
                    inputs = [x if pe == spec.root else None for pe, x in enumerate(inputs)]
                for t in outputs:
                    _poison(t)
                got = coll(inputs, outputs)
                assert all(g is o for g, o in zip(got, outputs))
                coll.kernels.synchronize()
                _compare(spec, got, inputs, f"call {call + 1}")
            fresh = coll(inputs)  # outputs made by the call
            coll.kernels.synchronize()
            assert [tuple(t.shape) for t in fresh] == [coll.output_shape] * pes
            _compare(spec, fresh, inputs, "call with outputs made by the op")
            _graph_replay(coll, spec, gen, outputs)
        finally:
            coll.close()


def test_two_collectives_on_two_streams(pes, bundle_root):
    """An all_reduce on one stream and an all_gather on another (each Collective its own workspace), three
    rounds launched with no host sync between them, each round into outputs of its own; all match."""
    import torch

    from mori_compiler.ops.collectives import Collective

    specs = [CollSpec("all_reduce", "f32", 1027, pes, "one_shot"), CollSpec("all_gather", "u8", 1001, pes)]
    colls = [Collective(s.op, s.dtype, s.count, algorithm=s.algorithm, cache_root=bundle_root, wait_limit=WAIT_LIMIT)
             for s in specs]  # fmt: skip
    try:
        gen = torch.Generator().manual_seed(77 + pes)
        rounds = []
        for _ in range(3):
            inputs = [[_random(s, gen, pe).cuda() for pe in range(pes)] for s in specs]
            outputs = [_outputs(s, pes, unaligned=False) for s in specs]
            for t in outputs[0] + outputs[1]:
                _poison(t)
            rounds.append((inputs, outputs))
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        for stream in streams:  # the inputs and the poison are written on the default stream
            stream.wait_stream(torch.cuda.current_stream())
        for inputs, outputs in rounds:
            for coll, stream, x, out in zip(colls, streams, inputs, outputs):
                with torch.cuda.stream(stream):
                    coll(x, out)
        torch.cuda.synchronize()
        for coll in colls:
            coll.kernels.check_waits()
        for r, (inputs, outputs) in enumerate(rounds):
            for s, x, out in zip(specs, inputs, outputs):
                _compare(s, out, x, f"{s.op} round {r + 1} on its own stream")
    finally:
        for coll in colls:
            coll.close()


def test_traced_collective_records_its_phases(pes, bundle_root, tmp_path):
    """A two-shot all_reduce built with trace=True: every PE's warps record stage, meet0..2 and step1..2 in
    that order, the result is still right, and the Perfetto export holds a slice per phase."""
    import json

    import torch

    from mori_compiler.ops.collectives import Collective
    from mori_compiler.runtime.trace import export_to_perfetto, phase_summary

    spec = traced_spec(pes)
    coll = Collective(spec.op, spec.dtype, spec.count, algorithm=spec.algorithm, cache_root=bundle_root,
                      wait_limit=WAIT_LIMIT, trace=True)  # fmt: skip
    try:
        gen = torch.Generator().manual_seed(4242 + pes)
        inputs = [_random(spec, gen, pe).cuda() for pe in range(pes)]
        outputs = _outputs(spec, pes, unaligned=False)
        for t in outputs:
            _poison(t)
        recorder = coll.kernel_trace()
        coll(inputs, outputs)
        coll.kernels.synchronize()
        _compare(spec, outputs, inputs, "traced call")
        trace = recorder.read()
        order = ["stage:begin", "stage:end", "meet0:begin", "meet0:end", "step1:begin", "step1:end", "meet1:begin",
                 "meet1:end", "step2:begin", "step2:end", "meet2:begin", "meet2:end"]  # fmt: skip
        summaries = phase_summary(trace)
        assert sorted(s.pe for s in summaries) == list(range(pes))
        for s in summaries:
            assert s.warps == spec.blocks * BLOCK_THREADS // 32, (s.pe, s.warps)  # every warp of every block recorded
            medians = [s.timeline[point].median for point in order]
            assert medians == sorted(medians), (s.pe, dict(zip(order, medians)))
            assert all(s.inverted.get(e, 0) == 0 for e in ("stage", "meet0", "step1", "meet1", "step2", "meet2"))
        export_to_perfetto(tmp_path / "coll.json", trace)
        events = json.loads((tmp_path / "coll.json").read_text())["traceEvents"]
        names = {e.get("name") for e in events if e.get("ph") in ("X", "B")}
        assert {"stage", "meet0", "step1", "meet1", "step2", "meet2"} <= names, names
    finally:
        coll.close()


def _graph_replay(coll, spec: CollSpec, gen, outputs) -> None:
    """Capture one call (after an eager call with the same tensors), then replay it twice with new input
    contents: each replay's outputs match."""
    import torch

    inputs = [torch.empty(spec.input_elems, dtype=outputs[0].dtype, device="cuda") for _ in outputs]
    coll(inputs, outputs)  # eager: uploads the argument table the captured launch reads
    coll.kernels.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            coll(inputs, outputs)
    for replay in range(2):
        fresh = [_random(spec, gen, pe) for pe in range(len(inputs))]
        for dst, src in zip(inputs, fresh):
            dst.copy_(src)
        for t in outputs:
            _poison(t)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        coll.kernels.check_waits()
        _compare(spec, outputs, inputs, f"graph replay {replay + 1}")


@pytest.mark.parametrize("dtype, cap", VARIABLE)
def test_all_to_all_v_matches_torch(pes, dtype, cap, bundle_root):
    """Random splits per PE and call (one of them above the capacity: clamped; one negative: 0), poisoned outputs, three calls,
    then a graph replay with new splits in the same tensors; the received elements and counts match."""
    import torch

    from mori_compiler.ops.collectives import Collective, expected

    spec = CollSpec("all_to_all_v", dtype, cap, pes)
    coll = Collective("all_to_all_v", dtype, cap, cache_root=bundle_root, wait_limit=WAIT_LIMIT)
    try:
        gen = torch.Generator().manual_seed(cap + pes)
        outputs = _outputs(spec, pes, unaligned=True)
        inputs = [torch.empty(spec.input_elems, dtype=outputs[0].dtype, device="cuda") for _ in range(pes)]
        splits = [torch.empty(pes, dtype=torch.int32, device="cuda") for _ in range(pes)]
        recv = [torch.empty(pes, dtype=torch.int32, device="cuda") for _ in range(pes)]

        def draw():
            rows = [torch.randint(0, cap + 1, (pes,), generator=gen, dtype=torch.int32) for _ in range(pes)]
            rows[0][-1] = cap + 5  # clamped to cap by the kernel (and by expected)
            rows[-1][0] = -3  # a negative split sends nothing (kernel and expected)
            for dst, row in zip(splits, rows):
                dst.copy_(row)
            for pe, x in enumerate(inputs):
                x.copy_(_random(spec, gen, pe))
            for t in outputs + recv:
                _poison(t)
            return [r.tolist() for r in rows]

        def check(rows, what):
            want = expected(spec, [x.cpu() for x in inputs], rows)
            got_counts = [r.cpu().tolist() for r in recv]
            assert got_counts == [[max(0, min(rows[p][q], cap)) for p in range(pes)] for q in range(pes)], (what, got_counts)
            _compare(spec, [o[: w.numel()] for o, w in zip(outputs, want)], None, what, want=want)

        for call in range(3):
            rows = draw()
            got, counts = coll(inputs, outputs, splits=splits, recv_counts=recv)
            assert all(g is o for g, o in zip(got, outputs)) and all(c is r for c, r in zip(counts, recv))
            coll.kernels.synchronize()
            check(rows, f"call {call + 1}")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                coll(inputs, outputs, splits=splits, recv_counts=recv)
        for replay in range(2):
            rows = draw()
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            coll.kernels.check_waits()
            check(rows, f"graph replay {replay + 1}")
    finally:
        coll.close()


def test_collective_refuses_bad_arguments(pes, bundle_root):
    import torch

    from mori_compiler.ops.collectives import Collective

    coll = Collective("all_gather", torch.uint8, 4, cache_root=bundle_root)
    try:
        x = [torch.zeros(4, dtype=torch.uint8, device="cuda") for _ in range(pes)]
        with pytest.raises(ValueError, match=f"list of {pes} tensors"):
            coll(x[0])
        with pytest.raises(ValueError, match="must hold 4 elements"):
            coll([torch.zeros(5, dtype=torch.uint8, device="cuda")] * pes)
        with pytest.raises(ValueError, match="must be torch.uint8"):
            coll([t.float() for t in x])
        with pytest.raises(ValueError, match="must be on the GPU"):
            coll([t.cpu() for t in x])
    finally:
        coll.close()


def _multi_gpu_worker(rank: int, world: int, init_file: str, bundle_root: str):
    """One PE per process: every process draws every PE's inputs from the shared seeds, runs each collective
    three times and checks its own output (bit-exact)."""
    import torch

    from mori_compiler.ops.collectives import Collective, expected
    from mori_compiler.runtime import shmem

    with multi_gpu_shmem(rank, world, init_file, bundle_root):
        for k, spec in enumerate(multi_gpu_specs(world)):
            coll = Collective(spec.op, spec.dtype, spec.count, algorithm=spec.algorithm, root=spec.root,
                              cache_root=bundle_root, wait_limit=WAIT_LIMIT)  # fmt: skip
            try:
                for call in range(3):
                    gen = torch.Generator().manual_seed(7919 * k + call)
                    ins = [_random(spec, gen, pe) for pe in range(world)]
                    out = _outputs(spec, 1, unaligned=bool(call % 2))[0]
                    _poison(out)
                    if spec.op == "all_to_all_v":
                        rows = [torch.randint(0, spec.count + 1, (world,), generator=gen, dtype=torch.int32)
                                for _ in range(world)]  # fmt: skip
                        got, recv = coll(ins[rank].cuda(), out, splits=rows[rank].cuda())
                        torch.cuda.synchronize()
                        want = expected(spec, ins, [r.tolist() for r in rows])[rank]
                        assert recv.cpu().tolist() == [int(rows[p][rank]) for p in range(world)], (rank, spec)
                        _compare(spec, [got[: want.numel()]], None, f"PE {rank} call {call + 1}", want=[want])
                        continue
                    got = coll(ins[rank].cuda(), out)
                    torch.cuda.synchronize()
                    _compare(spec, [got], None, f"PE {rank} call {call + 1}", want=[expected(spec, ins)[rank]])
            finally:
                coll.close()
                shmem.shmem_barrier_all()


@pytest.mark.parametrize("world", MULTI_GPU)
def test_collectives_across_gpus(world, bundle_root):
    import os
    import tempfile

    import torch
    import torch.multiprocessing as mp

    found = torch.cuda.device_count()
    if found < world:
        pytest.skip(f"needs {world} GPUs of one host, found {found}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_multi_gpu_worker, args=(world, os.path.join(tmp, "rendezvous"), str(bundle_root)), nprocs=world,
                 join=True)  # fmt: skip
