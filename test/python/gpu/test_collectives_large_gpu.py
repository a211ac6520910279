"""The collectives at 256 MiB on 2 and 8 virtual PEs (one GPU), bit-exact against torch evaluated on the GPU
(``expected`` on CUDA tensors: on the host it would take minutes).

Each collective once where the larger of a PE's input and output is 256 MiB (all_gather and all_to_all u8,
the reducers bf16 (fp32 sums), broadcast bf16), and two odd counts just below it whose bytes are not whole
16-byte vectors (in_place_layout False: even heap inputs are staged; the outputs at an odd offset): one
Collective per size, one call with plain inputs (placement "stage") and one with its heap inputs
(``heap_input()``: "input" exactly when ``spec.in_place_layout``), the outputs poisoned before each; one
CUDA-graph replay of the two-shot all_reduce. Inputs are drawn on the GPU from fixed seeds.

The heap (``HEAP_SIZE`` per PE, computed from the specs: the largest workspace plus its heap input, and
64 MiB of headroom; 896 MiB, the one-shot all_reduce's 512 MiB workspace + 256 MiB input) holds one
Collective at a time: each test closes (frees) its own. GPU memory at 8 PEs: 8 heaps (7 GiB) and the plain
inputs, outputs and expected values (about 2 GiB each), well under 100 GiB.

Bundles: ``all_bundles`` (test_collectives_gpu.py's ``all_bundles`` includes it, so kernels.py's
``precompile_all`` reaches it).
"""

from __future__ import annotations

import pytest

from test_collectives_gpu import TARGET, WAIT_LIMIT, check_placement, graph_replay, new_outputs, random_input, run_call
from virtual_pes import virtual_pes_fixture

from mori_compiler.dialects.mori_coll_schema import HEADER_ALIGN, CollSpec

pytestmark = pytest.mark.gpu

LARGE_PES = (2, 8)
LARGE_BYTES = 256 << 20  # the larger of a PE's input and output
ODD = 3  # elements the odd counts lack (not whole 16-byte vectors)

# (op, dtype, algorithm, odd); broadcast's root is the last PE.
LARGE = [("all_gather", "u8", "", False), ("all_reduce", "bf16", "one_shot", False),
         ("all_reduce", "bf16", "two_shot", False), ("reduce_scatter", "bf16", "", False),
         ("broadcast", "bf16", "", False), ("all_to_all", "u8", "", False),
         ("all_reduce", "bf16", "two_shot", True), ("all_to_all", "u8", "", True)]  # fmt: skip
GRAPH_CASE = LARGE.index(("all_reduce", "bf16", "two_shot", False))


def large_spec(case, world: int) -> CollSpec:
    """The spec of ``case`` on ``world`` PEs: the larger of its input and output LARGE_BYTES (less ODD
    elements' worth per chunk for the odd ones)."""
    op, dtype, alg, odd = case
    probe = CollSpec(op, dtype, 1, world, alg, world - 1 if op == "broadcast" else 0)
    count = LARGE_BYTES // probe.elem_bytes // max(probe.input_elems, probe.output_elems) - (ODD if odd else 0)
    spec = CollSpec(op, dtype, count, world, alg, probe.root).check()
    assert spec.in_place_layout == (not odd or op in ("all_gather", "broadcast")), spec
    return spec


def large_specs(world: int) -> list[CollSpec]:
    return [large_spec(case, world) for case in LARGE]


def _heap_need(spec: CollSpec) -> int:
    """Heap bytes a test of ``spec`` allocates: the workspace and one heap input (256-byte granules)."""
    granule = HEADER_ALIGN
    return -(-spec.workspace_bytes // granule) * granule + -(-spec.input_elems * spec.elem_bytes // granule) * granule


_MIB64 = 64 << 20
HEAP_SIZE = -(-max(_heap_need(s) for w in LARGE_PES for s in large_specs(w)) // _MIB64) * _MIB64 + _MIB64


def all_bundles(cache_root, target: str = TARGET) -> list:
    """Every bundle these tests load (virtual PEs)."""
    from mori_compiler.ops.collectives import coll_bundle

    return [coll_bundle([s], target, virtual_pes=True, cache_root=cache_root)
            for w in LARGE_PES for s in large_specs(w)]  # fmt: skip


pes = virtual_pes_fixture(LARGE_PES, heap_size=HEAP_SIZE)


def _case_id(case) -> str:
    op, dtype, alg, odd = case
    return "-".join([op] + ([alg] if alg else []) + [dtype, "odd" if odd else "256MiB"])


def _collective(spec: CollSpec, bundle_root):
    from mori_compiler.ops.collectives import Collective

    coll = Collective(spec.op, spec.dtype, spec.count, algorithm=spec.algorithm, root=spec.root,
                      cache_root=bundle_root, wait_limit=WAIT_LIMIT)  # fmt: skip
    assert coll.spec == spec, (coll.spec, spec)
    return coll


def _only_root(spec: CollSpec, tensors):
    return [t if spec.op != "broadcast" or p == spec.root else None for p, t in enumerate(tensors)]


@pytest.mark.parametrize("case", LARGE, ids=_case_id)
def test_large_collective_matches_torch(pes, case, bundle_root):
    """One call with plain inputs (they are the drawn values), one with the same values in the heap inputs;
    both bit-exact against ``expected`` on the GPU; the placement after each."""
    import torch

    spec = large_spec(case, pes)
    coll = _collective(spec, bundle_root)
    try:
        gen = torch.Generator(device="cuda").manual_seed(LARGE.index(case) * 100 + pes)
        data = _only_root(spec, [random_input(spec, gen, pe) for pe in range(pes)])
        outputs = new_outputs(spec, pes, unaligned=bool(spec.count % 2))
        run_call(coll, spec, data, outputs, data, "plain inputs")
        check_placement(coll, spec, "stage", "plain inputs")
        heap = _only_root(spec, coll.heap_input())
        run_call(coll, spec, heap, outputs, data, "heap inputs")
        check_placement(coll, spec, "input" if spec.in_place_layout else "stage", "heap inputs")
    finally:
        coll.close()


def test_large_graph_replay(pes, bundle_root):
    """The 256 MiB two-shot all_reduce captured on its heap inputs and replayed once with new values."""
    import torch

    spec = large_spec(LARGE[GRAPH_CASE], pes)
    coll = _collective(spec, bundle_root)
    try:
        gen = torch.Generator(device="cuda").manual_seed(4099 + pes)
        heap = coll.heap_input()
        graph_replay(coll, spec, heap, new_outputs(spec, pes, unaligned=False),
                     lambda: [random_input(spec, gen, pe) for pe in range(pes)], replays=1)  # fmt: skip
        check_placement(coll, spec, "input", "graph replay")
    finally:
        coll.close()
