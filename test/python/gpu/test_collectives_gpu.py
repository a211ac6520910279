"""The collectives of mori_compiler.ops.collectives on virtual PEs (2, 3, 4, 8 on one GPU), against torch
on the host (bit-exact: the kernels sum in fp32 in PE order, as ``expected`` does).

Each case: random inputs from a fixed seed, outputs poisoned (NaN / 0xA5 bytes) before each call, three
calls back to back with new inputs (the workspace reused without a host sync; unaligned, aligned, unaligned
outputs), then CUDA-graph replay of one call with new input contents. Sizes from 1 element (4 B) to a few
MiB, odd counts, counts of whole 16-byte vectors (the reducers' and all_to_all's in-place layout), and
output views at an odd byte offset (unaligned). Bounded device waits: a protocol that never completes
raises WaitTimeoutError naming the PE and the word, instead of hanging.

Where the peers read a PE's input (``Collective.placement()``, after every call):

* plain inputs (torch's allocator, outside the symmetric heap): "stage" on every PE;
* heap inputs (``coll.heap_input()``, filled by ``copy_``): "input" on every PE exactly when
  ``spec.in_place_layout`` (they are 256-byte aligned and apart from the outputs), else "stage";
* a heap input one element into its allocation (misaligned): "stage"; PE 1 plain and the others in the
  heap: per PE;
* in place: all_gather's input the PE's own part of a heap output ("input" where that part is 16-byte
  aligned), broadcast's root with input == output ("input"); all_reduce with input == output and
  reduce_scatter into its own chunk of the input overlap their outputs: "stage". The outputs are poisoned
  first and the inputs written after (they alias them);
* broadcast: only the root places its input (``placement()`` gives None for the others), so only the
  root's placement is asserted.

Also: ``blocks=`` (1, max_blocks // 4, the default: all correct; bad values refused), the automatic
all_reduce algorithm (``algorithm=""``: one_shot up to ONE_SHOT_MAX_BYTES, two_shot above), two
collectives on two streams, trace points, all_to_all_v, and one PE per process across GPUs (plain and heap
inputs; skipped without enough GPUs). The 256 MiB sizes are test_collectives_large_gpu.py's.

Bundles: ``all_bundles(cache_root)`` lists every bundle these tests and test_collectives_large_gpu.py's
load (test/python/gpu/kernels.py's ``precompile_all`` adds it), compiled where the compiler is installed.
"""

from __future__ import annotations

import contextlib

import pytest

from multi_gpu import multi_gpu_shmem
from virtual_pes import virtual_pes_fixture

from mori_compiler.dialects.mori_coll_schema import BLOCK_THREADS, HEADER_ALIGN, ONE_SHOT_MAX_BYTES, CollSpec

pytestmark = pytest.mark.gpu

TARGET = "sm_90"
VIRTUAL_PES = (2, 3, 4, 8)
WAIT_LIMIT = 1 << 26  # polls per wait before it gives up (a hang becomes an error)

# (op, dtype, counts, algorithm); broadcast's root is the last PE. Counts: 1 element, odd sizes, one of a few
# MiB per collective, and (reducers, all_to_all) one of whole 16-byte vectors: in_place_layout, so heap
# inputs are read in place and the sums go straight into aligned outputs.
CASES = [
    ("all_reduce", "f32", (1, 1027, 4096, 786433), "one_shot"),
    ("all_reduce", "bf16", (3, 65536, 65541), "one_shot"),
    ("all_reduce", "f32", (1, 1027, 262144, 786433), "two_shot"),
    ("all_reduce", "bf16", (5, 65541, 65544), "two_shot"),
    ("reduce_scatter", "f32", (1, 777, 4100, 262147), ""),
    ("reduce_scatter", "bf16", (9, 24), ""),
    ("all_gather", "u8", (4, 1001, 4096), ""),
    ("all_gather", "bf16", (131075,), ""),
    ("broadcast", "u8", (5,), ""),
    ("broadcast", "f32", (300001,), ""),
    ("all_to_all", "u8", (3, 16), ""),
    ("all_to_all", "i32", (10007, 10008), ""),
]
SOURCES = ("plain", "heap")  # where test_collective_matches_torch's inputs live

# all_to_all_v: (dtype, capacity per pair); each call draws new splits in [0, capacity] (one above: clamped).
VARIABLE = [("u8", 37), ("bf16", 40001)]

# (op, dtype, count, algorithm) of the placement tests, each a spec of CASES (so of specs_for).
MIXED = [("all_reduce", "f32", 4096, "one_shot"), ("all_reduce", "f32", 262144, "two_shot"),
         ("reduce_scatter", "f32", 4100, ""), ("all_gather", "u8", 1001, ""), ("broadcast", "f32", 300001, ""),
         ("all_to_all", "i32", 10008, ""), ("all_reduce", "bf16", 65541, "one_shot")]  # fmt: skip
MISALIGNED = [("all_gather", "u8", 1001, ""), ("all_reduce", "f32", 4096, "one_shot"),
              ("all_reduce", "bf16", 65544, "two_shot"), ("all_to_all", "i32", 10008, "")]  # fmt: skip
BLOCKS = [("all_reduce", "f32", 786433, "two_shot"), ("all_gather", "u8", 1001, ""), ("reduce_scatter", "f32", 1, "")]
# One per collective, read in place from heap inputs: test_input_rewritten_right_after_each_call's.
REWRITE = [("all_to_all", "i32", 10008, ""), ("all_gather", "u8", 4096, ""), ("reduce_scatter", "f32", 4100, ""),
           ("all_reduce", "f32", 4096, "one_shot"), ("all_reduce", "f32", 262144, "two_shot"),
           ("broadcast", "f32", 300001, "")]  # fmt: skip
# all_reduce with algorithm="": (dtype, count, the algorithm it must pick), around ONE_SHOT_MAX_BYTES.
AUTO = [("f32", 1, "one_shot"), ("bf16", ONE_SHOT_MAX_BYTES // 2, "one_shot"),
        ("bf16", ONE_SHOT_MAX_BYTES // 2 + 1, "two_shot"), ("f32", 786433, "two_shot")]  # fmt: skip


def case_spec(op: str, dtype: str, count: int, world: int, algorithm: str = "") -> CollSpec:
    return CollSpec(op, dtype, count, world, algorithm, world - 1 if op == "broadcast" else 0)


def specs_for(world: int) -> list[CollSpec]:
    """Every spec the virtual-PE tests of this file run on ``world`` PEs (one bundle each)."""
    specs = [case_spec(op, dtype, n, world, alg) for op, dtype, counts, alg in CASES for n in counts]
    specs += [CollSpec("all_to_all_v", dtype, cap, world) for dtype, cap in VARIABLE]
    specs += [case_spec(*case[:3], world, case[3]) for case in MIXED + MISALIGNED + BLOCKS + REWRITE]
    specs += [CollSpec("all_reduce", dtype, n, world, alg) for dtype, n, alg in AUTO]
    return list(dict.fromkeys(specs))  # (the placement tests' specs are CASES': no new bundle)


MULTI_GPU = (2, 4, 8)  # one PE per process and GPU (run when the host has that many GPUs)


def multi_gpu_specs(world: int) -> list[CollSpec]:
    """A small matrix per world size: every collective once, odd sizes, and whole 16-byte vectors (the
    reducers' and all_to_all's in-place layout, for the heap-input call)."""
    return [CollSpec("all_reduce", "bf16", 70001, world, "one_shot"), CollSpec("all_reduce", "f32", 70001, world, "two_shot"),
            CollSpec("reduce_scatter", "f32", 4099, world), CollSpec("all_gather", "u8", 100003, world),
            CollSpec("broadcast", "i32", 999, world, root=world - 1), CollSpec("all_to_all", "bf16", 5001, world),
            CollSpec("all_to_all_v", "f32", 3001, world),
            CollSpec("all_reduce", "bf16", 65536, world, "one_shot"),
            CollSpec("all_reduce", "f32", 262144, world, "two_shot"), CollSpec("reduce_scatter", "f32", 4100, world),
            CollSpec("all_to_all", "bf16", 5008, world)]  # fmt: skip


def traced_spec(world: int) -> CollSpec:
    """The collective test_traced_collective_records_its_phases runs with trace points."""
    return CollSpec("all_reduce", "bf16", 65541, world, "two_shot")


def all_bundles(cache_root, target: str = TARGET) -> list:
    """Every bundle these tests load: one per collective and PE count, compiled with virtual PEs, the
    multi-GPU test's (compiled without) and test_collectives_large_gpu.py's (its 256 MiB sizes)."""
    import test_collectives_large_gpu

    from mori_compiler.ops.collectives import coll_bundle

    virtual = [coll_bundle([s], target, virtual_pes=True, cache_root=cache_root) for w in VIRTUAL_PES for s in specs_for(w)]
    virtual += [coll_bundle([traced_spec(w)], target, virtual_pes=True, cache_root=cache_root, trace=True)
                for w in VIRTUAL_PES]  # fmt: skip
    return (virtual + [coll_bundle([s], target, virtual_pes=False, cache_root=cache_root)
                       for w in MULTI_GPU for s in multi_gpu_specs(w)]
            + test_collectives_large_gpu.all_bundles(cache_root, target))  # fmt: skip


pes = virtual_pes_fixture(VIRTUAL_PES)


# ---- shared steps (test_collectives_large_gpu.py uses them too) ---------------------------------------------


def random_input(spec: CollSpec, gen, pe: int):
    """PE ``pe``'s input: random values drawn from ``gen``, on its device (the host here; the GPU for the
    256 MiB sizes, where drawing on the host would be slow)."""
    import torch

    from mori_compiler.ops.collectives import torch_dtype

    dtype = torch_dtype(spec.dtype)
    n = spec.input_elems
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen, device=gen.device).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64, device=gen.device).to(dtype)


def poison(t) -> None:
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0xA5)


def compare(spec: CollSpec, outs, want, what: str) -> None:
    """Each PE's output equals ``want``'s bit for bit (compared where ``want`` lies: host or GPU)."""
    import torch

    for pe, (got, exp) in enumerate(zip(outs, want)):
        got = got.reshape(-1).to(exp.device)
        same = got.view(torch.uint8) == exp.contiguous().view(torch.uint8)
        if not bool(same.all()):
            bad = (~same).nonzero()[0].item() // spec.elem_bytes
            raise AssertionError(f"{spec.kernel_name} ({what}): PE {pe} output differs from torch's at element "
                                 f"{bad} of {got.numel()}: got {got[bad].item()}, expected {exp[bad].item()} "
                                 f"({int((~same).sum()) // spec.elem_bytes} elements differ)")  # fmt: skip


def new_outputs(spec: CollSpec, world: int, unaligned: bool):
    """Per PE an output tensor; ``unaligned``: starting one element past a 256-byte boundary (an odd byte
    offset for 1-byte dtypes): the kernels' copies must not assume alignment."""
    import torch

    from mori_compiler.ops.collectives import torch_dtype

    dtype, n = torch_dtype(spec.dtype), spec.output_elems
    return [torch.empty(n + 1, dtype=dtype, device="cuda")[1:] if unaligned else
            torch.empty(n, dtype=dtype, device="cuda") for _ in range(world)]  # fmt: skip


def prepare(spec: CollSpec, inputs, outputs, data):
    """Before a call: poison the outputs, then write ``data[p]`` (PE p's input values; None: not read) into
    ``inputs[p]`` unless it is that tensor (heap inputs, and in-place inputs that alias the outputs, are
    written after the poison). Returns what every PE's output must hold: ``expected`` on ``data``, evaluated
    where it lies (host or GPU)."""
    from mori_compiler.ops.collectives import expected

    want = expected(spec, data)
    for t in outputs:
        poison(t)
    for x, d in zip(inputs, data):
        if x is not None and d is not None and x is not d:
            x.copy_(d)
    return want


def run_call(coll, spec: CollSpec, inputs, outputs, data, what: str):
    """One call, prepared (``prepare``), waited for and compared bit-exact; returns the outputs' values."""
    want = prepare(spec, inputs, outputs, data)
    got = coll(inputs, outputs)
    assert all(g is o for g, o in zip(got, outputs))
    coll.kernels.synchronize()
    compare(spec, got, want, what)
    return want


def check_placement(coll, spec: CollSpec, want, what: str) -> None:
    """``coll.placement()`` after the last call equals ``want`` (one word for every PE, or a list per PE).
    Broadcast: the root's only (the non-roots never place: module docstring)."""
    got = coll.placement()
    want = [want] * len(got) if isinstance(want, str) else list(want)
    if spec.op == "broadcast":
        got, want = got[spec.root], want[spec.root]
    assert got == want, f"{spec.kernel_name} ({what}): placement {got}, expected {want}"


def graph_replay(coll, spec: CollSpec, inputs, outputs, draw, replays: int = 2) -> None:
    """Capture one call on ``inputs`` and ``outputs`` (after an eager call with the same tensors), then
    replay it ``replays`` times with new input values (``draw()``: one per PE, written into ``inputs``):
    each replay's outputs match."""
    import torch

    coll(inputs, outputs)  # eager: uploads the argument table the captured launch reads
    coll.kernels.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            coll(inputs, outputs)
    for replay in range(replays):
        want = prepare(spec, inputs, outputs, draw())
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        coll.kernels.check_waits()
        compare(spec, outputs, want, f"graph replay {replay + 1}")


def _collective(spec: CollSpec, bundle_root, **kw):
    from mori_compiler.ops.collectives import Collective

    coll = Collective(spec.op, spec.dtype, spec.count, algorithm=spec.algorithm, root=spec.root,
                      cache_root=bundle_root, wait_limit=WAIT_LIMIT, **kw)  # fmt: skip
    assert coll.spec == spec, (coll.spec, spec)
    return coll


@contextlib.contextmanager
def _heap_tensors(spec: CollSpec, elems: int, world: int):
    """W views (one per PE) of a fresh symmetric allocation of ``elems`` elements of the spec's dtype
    (256-byte aligned), freed after (once the device is done)."""
    import torch

    from mori_compiler.ops.collectives import torch_dtype
    from mori_compiler.runtime import shmem

    handle = shmem.shmem_malloc_align(HEADER_ALIGN, elems * spec.elem_bytes)
    try:
        yield [shmem.shmem_tensor(handle, (elems,), torch_dtype(spec.dtype), pe=p) for p in range(world)]
    finally:
        torch.cuda.synchronize()
        shmem.shmem_free(handle)


def _only_root(spec: CollSpec, tensors):
    """Broadcast: the root's tensor, None for the others (never read); the list itself otherwise."""
    return [t if spec.op != "broadcast" or p == spec.root else None for p, t in enumerate(tensors)]


def _case_id(case) -> str:
    return "-".join(str(x) for x in case if x != "")


# ---- the tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}-{CASES[i][3] or 'x'}-{CASES[i][1]}")
def test_collective_matches_torch(pes, case, source, bundle_root):
    """Every count of the case: three calls back to back (outputs unaligned, aligned, unaligned), one into
    outputs the op makes, then graph replay; ``source``: the inputs are new plain tensors each call, or
    the collective's heap inputs (``heap_input()``, refilled each call). The placement after each."""
    import torch

    from mori_compiler.ops.collectives import expected

    op, dtype, counts, alg = CASES[case]
    for count in counts:
        spec = case_spec(op, dtype, count, pes, alg)
        coll = _collective(spec, bundle_root)
        try:
            heap = coll.heap_input() if source == "heap" else None
            placed = "input" if heap is not None and spec.in_place_layout else "stage"
            gen = torch.Generator().manual_seed(1000 * case + count)
            output_sets = [new_outputs(spec, pes, unaligned=True), new_outputs(spec, pes, unaligned=False)]
            for call in range(3):  # back to back: the workspace is reused without a host sync
                data = _only_root(spec, [random_input(spec, gen, pe) for pe in range(pes)])
                inputs = _only_root(spec, heap) if heap is not None else [None if d is None else d.cuda() for d in data]
                run_call(coll, spec, inputs, output_sets[call % 2], data, f"{source} inputs, call {call + 1}")
                check_placement(coll, spec, placed, f"{source} inputs, call {call + 1}")
            fresh = coll(inputs)  # outputs made by the call
            coll.kernels.synchronize()
            assert [tuple(t.shape) for t in fresh] == [coll.output_shape] * pes
            compare(spec, fresh, expected(spec, data), "call with outputs made by the op")
            replayed = heap if heap is not None else [torch.empty(spec.input_elems, dtype=coll.dtype, device="cuda")
                                                      for _ in range(pes)]  # fmt: skip
            graph_replay(coll, spec, replayed, output_sets[1],
                         lambda: [random_input(spec, gen, pe) for pe in range(pes)])  # fmt: skip
            check_placement(coll, spec, placed, f"{source} inputs, graph replay")
        finally:
            coll.close()


@pytest.mark.parametrize("case", MISALIGNED, ids=_case_id)
def test_misaligned_heap_input_is_staged(pes, case, bundle_root):
    """Heap inputs one element into their allocation (in the heap, but not 16-byte aligned) are staged,
    on every PE, and the results are right (two calls)."""
    import torch

    spec = case_spec(*case[:3], pes, case[3])
    assert spec.in_place_layout  # what would be read in place if it were aligned
    coll = _collective(spec, bundle_root)
    try:
        with _heap_tensors(spec, spec.input_elems + 1, pes) as heap:
            inputs = [t[1:] for t in heap]
            gen = torch.Generator().manual_seed(31 + spec.count + pes)
            outputs = new_outputs(spec, pes, unaligned=False)
            for call in range(2):
                data = [random_input(spec, gen, pe) for pe in range(pes)]
                run_call(coll, spec, inputs, outputs, data, f"misaligned heap inputs, call {call + 1}")
                check_placement(coll, spec, "stage", f"misaligned heap inputs, call {call + 1}")
    finally:
        coll.close()


@pytest.mark.parametrize("case", MIXED, ids=_case_id)
def test_mixed_heap_and_plain_inputs(pes, case, bundle_root):
    """PE 1's input plain, every other PE's in the heap: each PE places its own way (PE 1 "stage", the
    others "input" when the layout allows), the results are right (two calls; then PE 1 in the heap and
    the others plain)."""
    import torch

    spec = case_spec(*case[:3], pes, case[3])
    coll = _collective(spec, bundle_root)
    try:
        heap = coll.heap_input()
        gen = torch.Generator().manual_seed(57 + spec.count + pes)
        outputs = new_outputs(spec, pes, unaligned=True)
        in_place = "input" if spec.in_place_layout else "stage"
        for call, plain_pes in enumerate(({1}, set(range(pes)) - {1})):
            values = [random_input(spec, gen, pe) for pe in range(pes)]
            data = _only_root(spec, values)
            inputs = _only_root(spec, [v.cuda() if pe in plain_pes else h
                                       for pe, (v, h) in enumerate(zip(values, heap))])  # fmt: skip
            run_call(coll, spec, inputs, outputs, data, f"plain on PEs {sorted(plain_pes)}")
            want = ["stage" if pe in plain_pes else in_place for pe in range(pes)]
            check_placement(coll, spec, want, f"plain on PEs {sorted(plain_pes)}")
    finally:
        coll.close()


@pytest.mark.parametrize("count", (4096, 1001))
def test_all_gather_in_place(pes, count, bundle_root):
    """all_gather whose input is the PE's own part of its heap output (``out[me * count:(me + 1) * count]``):
    read in place where that part is 16-byte aligned (every PE at 4096 bytes; at 1001 only PE 0: the others
    stage), the results right (two calls)."""
    import torch

    spec = case_spec("all_gather", "u8", count, pes)
    coll = _collective(spec, bundle_root)
    try:
        with _heap_tensors(spec, spec.output_elems, pes) as outputs:
            inputs = [out[pe * count:(pe + 1) * count] for pe, out in enumerate(outputs)]
            gen = torch.Generator().manual_seed(91 + count + pes)
            for call in range(2):
                data = [random_input(spec, gen, pe) for pe in range(pes)]
                run_call(coll, spec, inputs, outputs, data, f"in place, call {call + 1}")
                want = ["input" if pe * count % 16 == 0 else "stage" for pe in range(pes)]
                check_placement(coll, spec, want, f"in place, call {call + 1}")
    finally:
        coll.close()


@pytest.mark.parametrize("dtype, count", [("f32", 300001), ("u8", 5)])
def test_broadcast_root_in_place(pes, dtype, count, bundle_root):
    """The root's input is its output (heap): read in place; every PE's output right (two calls)."""
    import torch

    spec = case_spec("broadcast", dtype, count, pes)
    coll = _collective(spec, bundle_root)
    try:
        with _heap_tensors(spec, spec.output_elems, pes) as outputs:
            inputs = _only_root(spec, outputs)
            gen = torch.Generator().manual_seed(113 + count + pes)
            for call in range(2):
                data = _only_root(spec, [random_input(spec, gen, pe) for pe in range(pes)])
                run_call(coll, spec, inputs, outputs, data, f"root in place, call {call + 1}")
                check_placement(coll, spec, "input", f"root in place, call {call + 1}")
    finally:
        coll.close()


@pytest.mark.parametrize("count, alg", [(4096, "one_shot"), (262144, "two_shot")])
def test_all_reduce_input_is_output(pes, count, alg, bundle_root):
    """all_reduce with input == output (a heap tensor, in_place_layout): it overlaps the output, so every PE
    stages it; the sums are right (two calls; the output is the input, so it holds the values, not poison)."""
    import torch

    spec = case_spec("all_reduce", "f32", count, pes, alg)
    assert spec.in_place_layout  # staged for the overlap, not for the layout
    coll = _collective(spec, bundle_root)
    try:
        with _heap_tensors(spec, spec.output_elems, pes) as buffers:
            gen = torch.Generator().manual_seed(131 + count + pes)
            for call in range(2):
                data = [random_input(spec, gen, pe) for pe in range(pes)]
                run_call(coll, spec, buffers, buffers, data, f"input is output, call {call + 1}")
                check_placement(coll, spec, "stage", f"input is output, call {call + 1}")
    finally:
        coll.close()


@pytest.mark.parametrize("dtype, count", [("f32", 4100), ("bf16", 24)])
def test_reduce_scatter_into_own_chunk(pes, dtype, count, bundle_root):
    """reduce_scatter whose output is its own chunk of its heap input (``in[me * count:(me + 1) * count]``):
    it overlaps, so every PE stages; the sums are right and the input's other chunks untouched (two calls)."""
    import torch

    spec = case_spec("reduce_scatter", dtype, count, pes)
    coll = _collective(spec, bundle_root)
    try:
        with _heap_tensors(spec, spec.input_elems, pes) as inputs:
            outputs = [x[pe * count:(pe + 1) * count] for pe, x in enumerate(inputs)]
            gen = torch.Generator().manual_seed(151 + count + pes)
            for call in range(2):
                data = [random_input(spec, gen, pe) for pe in range(pes)]
                run_call(coll, spec, inputs, outputs, data, f"into its own chunk, call {call + 1}")
                check_placement(coll, spec, "stage", f"into its own chunk, call {call + 1}")
                for pe, (x, d) in enumerate(zip(inputs, data)):
                    others = torch.cat([x[:pe * count], x[(pe + 1) * count:]]).cpu()
                    kept = torch.cat([d[:pe * count], d[(pe + 1) * count:]])
                    assert torch.equal(others.view(torch.uint8), kept.view(torch.uint8)), (pe, call)
    finally:
        coll.close()


@pytest.mark.parametrize("case", REWRITE, ids=_case_id)
def test_input_rewritten_right_after_each_call(pes, case, bundle_root):
    """Virtual PEs have no closing barrier (the launch's end closes a call: passes/coll_kernels.py, "Close"):
    three calls on heap inputs read in place, each input rewritten on the stream right before the next
    call (no host sync between): every call's outputs hold the result of the inputs it was called with."""
    import torch

    from mori_compiler.ops.collectives import expected

    spec = case_spec(*case[:3], pes, case[3])
    assert spec.in_place_layout
    coll = _collective(spec, bundle_root)
    try:
        heap = _only_root(spec, coll.heap_input())
        gen = torch.Generator().manual_seed(77 * pes + len(case[0]))
        rounds = [_only_root(spec, [random_input(spec, gen, pe) for pe in range(pes)]) for _ in range(3)]
        on_gpu = [[None if d is None else d.cuda() for d in data] for data in rounds]
        outputs = [new_outputs(spec, pes, unaligned=False) for _ in rounds]
        for out in outputs:
            for t in out:
                poison(t)
        torch.cuda.synchronize()
        for data, out in zip(on_gpu, outputs):
            for x, d in zip(heap, data):
                if x is not None:
                    x.copy_(d)  # the previous call's peers may only just have read it: stream order
            coll(heap, out)
        coll.kernels.synchronize()
        for call, (data, out) in enumerate(zip(rounds, outputs)):
            compare(spec, out, expected(spec, data), f"call {call + 1}, its inputs rewritten for the next call")
        check_placement(coll, spec, "input", "inputs rewritten between calls")
    finally:
        coll.close()


@pytest.mark.parametrize("case", BLOCKS, ids=_case_id)
def test_collective_blocks(pes, case, bundle_root):
    """``blocks=1``, ``max_blocks // 4`` (co-resident with every PE count here) and the default: each a
    Collective of its own (``coll.blocks``), right with heap inputs and then plain ones."""
    import torch

    spec = case_spec(*case[:3], pes, case[3])
    gen = torch.Generator().manual_seed(171 + spec.count + pes)
    for blocks in (1, spec.max_blocks // 4, None):
        coll = _collective(spec, bundle_root, blocks=blocks)
        try:
            assert coll.blocks == (spec.blocks if blocks is None else blocks), (blocks, coll.blocks)
            heap = coll.heap_input()
            outputs = new_outputs(spec, pes, unaligned=True)
            for source in SOURCES[::-1]:
                data = [random_input(spec, gen, pe) for pe in range(pes)]
                inputs = heap if source == "heap" else [d.cuda() for d in data]
                run_call(coll, spec, inputs, outputs, data, f"blocks={blocks}, {source} inputs")
                placed = "input" if source == "heap" and spec.in_place_layout else "stage"
                check_placement(coll, spec, placed, f"blocks={blocks}, {source} inputs")
        finally:
            coll.close()


def test_collective_refuses_bad_blocks(pes, bundle_root):
    """``blocks`` outside [1, max_blocks], or not an int, is refused by name before anything is allocated;
    max_blocks itself is accepted."""
    from mori_compiler.ops.collectives import Collective

    for bad in (0, 33, "4", True, 2.0, -1):
        with pytest.raises(ValueError, match=r"all_gather: blocks must be an int in \[1, max_blocks = 32\]"):
            Collective("all_gather", "u8", 4, blocks=bad, cache_root=bundle_root)
    coll = Collective("all_gather", "u8", 4, blocks=32, cache_root=bundle_root)  # (not launched: at 8 PEs 256 blocks)
    try:
        assert coll.blocks == 32
    finally:
        coll.close()


@pytest.mark.parametrize("dtype, count, alg", AUTO, ids=[_case_id(case) for case in AUTO])
def test_all_reduce_picks_its_algorithm(pes, dtype, count, alg, bundle_root):
    """``algorithm=""`` (the default): one_shot up to ONE_SHOT_MAX_BYTES, two_shot above (``auto_algorithm``);
    the collective it builds is right."""
    import torch

    from mori_compiler.dialects.mori_coll_schema import auto_algorithm
    from mori_compiler.ops.collectives import Collective

    assert auto_algorithm(dtype, count) == alg
    coll = Collective("all_reduce", dtype, count, cache_root=bundle_root, wait_limit=WAIT_LIMIT)
    try:
        spec = CollSpec("all_reduce", dtype, count, pes, alg)
        assert coll.spec == spec, coll.spec
        gen = torch.Generator().manual_seed(191 + count + pes)
        data = [random_input(spec, gen, pe) for pe in range(pes)]
        run_call(coll, spec, [d.cuda() for d in data], new_outputs(spec, pes, unaligned=False), data, "automatic")
    finally:
        coll.close()


def test_two_collectives_on_two_streams(pes, bundle_root):
    """An all_reduce on one stream and an all_gather on another (each Collective its own workspace), three
    rounds launched with no host sync between them, each round into outputs of its own; all match."""
    import torch

    from mori_compiler.ops.collectives import expected

    specs = [CollSpec("all_reduce", "f32", 1027, pes, "one_shot"), CollSpec("all_gather", "u8", 1001, pes)]
    colls = [_collective(s, bundle_root) for s in specs]
    try:
        gen = torch.Generator().manual_seed(77 + pes)
        rounds = []
        for _ in range(3):
            inputs = [[random_input(s, gen, pe).cuda() for pe in range(pes)] for s in specs]
            outputs = [new_outputs(s, pes, unaligned=False) for s in specs]
            for t in outputs[0] + outputs[1]:
                poison(t)
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
                compare(s, out, expected(s, [t.cpu() for t in x]), f"{s.op} round {r + 1} on its own stream")
    finally:
        for coll in colls:
            coll.close()


def test_traced_collective_records_its_phases(pes, bundle_root, tmp_path):
    """A two-shot all_reduce built with trace=True: every PE's warps record stage, meet0, step1, meet1, step2
    in that order (virtual PEs: no closing meet), the result is still right, and the Perfetto export holds
    a slice per phase."""
    import json

    import torch

    from mori_compiler.runtime.trace import export_to_perfetto, phase_summary

    spec = traced_spec(pes)
    coll = _collective(spec, bundle_root, trace=True)
    try:
        gen = torch.Generator().manual_seed(4242 + pes)
        data = [random_input(spec, gen, pe) for pe in range(pes)]
        recorder = coll.kernel_trace()
        run_call(coll, spec, [d.cuda() for d in data], new_outputs(spec, pes, unaligned=False), data, "traced call")
        trace = recorder.read()
        order = ["stage:begin", "stage:end", "meet0:begin", "meet0:end", "step1:begin", "step1:end", "meet1:begin",
                 "meet1:end", "step2:begin", "step2:end"]  # fmt: skip
        summaries = phase_summary(trace)
        assert sorted(s.pe for s in summaries) == list(range(pes))
        for s in summaries:
            assert s.warps == spec.blocks * BLOCK_THREADS // 32, (s.pe, s.warps)  # every warp of every block recorded
            medians = [s.timeline[point].median for point in order]
            assert medians == sorted(medians), (s.pe, dict(zip(order, medians)))
            assert all(s.inverted.get(e, 0) == 0 for e in ("stage", "meet0", "step1", "meet1", "step2"))
        export_to_perfetto(tmp_path / "coll.json", trace)
        events = json.loads((tmp_path / "coll.json").read_text())["traceEvents"]
        names = {e.get("name") for e in events if e.get("ph") in ("X", "B")}
        assert {"stage", "meet0", "step1", "meet1", "step2"} <= names, names
        assert "meet2" not in names, names
    finally:
        coll.close()


@pytest.mark.parametrize("dtype, cap", VARIABLE)
def test_all_to_all_v_matches_torch(pes, dtype, cap, bundle_root):
    """Random splits per PE and call (one of them above the capacity: clamped; one negative: 0), poisoned outputs, three calls,
    then a graph replay with new splits in the same tensors; the received elements and counts match. Heap
    inputs are staged too (all_to_all_v never reads in place: its chunks are packed)."""
    import torch

    from mori_compiler.ops.collectives import expected

    spec = CollSpec("all_to_all_v", dtype, cap, pes)
    coll = _collective(spec, bundle_root)
    try:
        gen = torch.Generator().manual_seed(cap + pes)
        outputs = new_outputs(spec, pes, unaligned=True)
        inputs = [torch.empty(spec.input_elems, dtype=outputs[0].dtype, device="cuda") for _ in range(pes)]
        heap = coll.heap_input()
        splits = [torch.empty(pes, dtype=torch.int32, device="cuda") for _ in range(pes)]
        recv = [torch.empty(pes, dtype=torch.int32, device="cuda") for _ in range(pes)]

        def draw(into):
            rows = [torch.randint(0, cap + 1, (pes,), generator=gen, dtype=torch.int32) for _ in range(pes)]
            rows[0][-1] = cap + 5  # clamped to cap by the kernel (and by expected)
            rows[-1][0] = -3  # a negative split sends nothing (kernel and expected)
            for dst, row in zip(splits, rows):
                dst.copy_(row)
            for pe, x in enumerate(into):
                x.copy_(random_input(spec, gen, pe))
            for t in outputs + recv:
                poison(t)
            return [r.tolist() for r in rows]

        def check(into, rows, what):
            want = expected(spec, [x.cpu() for x in into], rows)
            got_counts = [r.cpu().tolist() for r in recv]
            assert got_counts == [[max(0, min(rows[p][q], cap)) for p in range(pes)] for q in range(pes)], (what, got_counts)
            compare(spec, [o[: w.numel()] for o, w in zip(outputs, want)], want, what)
            check_placement(coll, spec, "stage", what)

        for call, into in enumerate((inputs, heap, inputs)):
            rows = draw(into)
            got, counts = coll(into, outputs, splits=splits, recv_counts=recv)
            assert all(g is o for g, o in zip(got, outputs)) and all(c is r for c, r in zip(counts, recv))
            coll.kernels.synchronize()
            check(into, rows, f"call {call + 1}{' (heap inputs)' if into is heap else ''}")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                coll(inputs, outputs, splits=splits, recv_counts=recv)
        for replay in range(2):
            rows = draw(inputs)
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            coll.kernels.check_waits()
            check(inputs, rows, f"graph replay {replay + 1}")
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
        shared = torch.zeros(4 * pes + 1, dtype=torch.uint8, device="cuda")  # input one byte into the output
        with pytest.raises(ValueError, match="all_gather: the output of PE 0 overlaps its input other than in place"):
            coll([shared[1:5]] * pes, [shared[: 4 * pes]] * pes)
        # A launch by hand with more blocks than the kernel's max_blocks (its device-barrier slot rows): refused.
        assert coll.kernels.bundle.kernel(coll.spec.kernel_name).max_blocks == coll.spec.max_blocks
        with pytest.raises(ValueError, match="holds collectives: its grid per PE must be"):
            coll.kernels.launch_virtual(coll.spec.kernel_name, [[0, 0, 0]] * pes, grid=(coll.spec.max_blocks + 1, 1),
                                        block=(BLOCK_THREADS, 1, 1))  # fmt: skip
    finally:
        coll.close()


def _multi_gpu_call(coll, spec: CollSpec, rank: int, world: int, gen, input_of, what: str, *, unaligned: bool,
                    heap: bool) -> None:  # fmt: skip
    """One call on PE ``rank``: every process draws every PE's input from the shared seed, ``input_of(x)``
    makes this PE's input tensor of its values (``heap``: a heap input); its own output (``unaligned``: at
    an odd offset) is checked bit-exact, and its placement."""
    import torch

    from mori_compiler.ops.collectives import expected

    ins = [random_input(spec, gen, pe) for pe in range(world)]
    out = new_outputs(spec, 1, unaligned=unaligned)[0]
    x = input_of(ins[rank])
    poison(out)
    if spec.op == "all_to_all_v":
        rows = [torch.randint(0, spec.count + 1, (world,), generator=gen, dtype=torch.int32) for _ in range(world)]
        got, recv = coll(x, out, splits=rows[rank].cuda())
        torch.cuda.synchronize()
        want = expected(spec, ins, [r.tolist() for r in rows])[rank]
        assert recv.cpu().tolist() == [int(rows[p][rank]) for p in range(world)], (rank, spec, what)
        compare(spec, [got[: want.numel()]], [want], f"PE {rank} {what}")
    else:
        got = coll(x, out)
        torch.cuda.synchronize()
        compare(spec, [got], [expected(spec, ins)[rank]], f"PE {rank} {what}")
    if spec.op != "broadcast" or rank == spec.root:  # (a non-root never places: the module docstring)
        assert coll.placement() == ("input" if heap and spec.in_place_layout else "stage"), (rank, spec, what)


def _multi_gpu_worker(rank: int, world: int, init_file: str, bundle_root: str):
    """One PE per process: every process draws every PE's inputs from the shared seeds, runs each collective
    three times with plain inputs and once with a heap input (``heap_input()``: every PE allocates it, in
    the same order) and checks its own output (bit-exact) and placement."""
    import torch

    from mori_compiler.runtime import shmem

    with multi_gpu_shmem(rank, world, init_file, bundle_root):
        for k, spec in enumerate(multi_gpu_specs(world)):
            coll = _collective(spec, bundle_root)
            try:
                for call in range(3):
                    gen = torch.Generator().manual_seed(7919 * k + call)
                    _multi_gpu_call(coll, spec, rank, world, gen, lambda x: x.cuda(), f"call {call + 1}",
                                    unaligned=bool(call % 2), heap=False)  # fmt: skip
                heap = coll.heap_input()
                gen = torch.Generator().manual_seed(7919 * k + 3)
                _multi_gpu_call(coll, spec, rank, world, gen, heap.copy_, "call 4 (heap input)", unaligned=False,
                                heap=True)  # fmt: skip
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
