"""No CTA barrier of an EP kernel sits under thread-dependent control flow (PTX, CPU only).

``bar.sync`` must be executed by every thread of the block at the same instruction; a barrier that is
control-dependent on a branch on the thread index is undefined behaviour and deadlocked on an H200 (the
PTX of that kernel is kept in data/asyncll_flat_walk_recv.sm_90.ptx). ptx_barriers.py has the analysis.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ptx_barriers import divergent_barriers, kernel_bodies

pytest.importorskip("llvmlite.binding")

DATA = Path(__file__).parent / "data"

def _kernel(name: str, body: str) -> str:
    """A tiny PTX entry with the registers the fixtures use."""
    return f""".visible .entry {name}()
{{
  .reg .pred %p<3>;
  .reg .b32 %r<4>;
{body}}}
"""


_TWO_BARRIERS = _kernel("two", """  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 2;
  @%p1 bra $L__BB0_2;
  bar.sync 0;
  bra.uni $L__BB0_3;
$L__BB0_2:
  bar.sync 0;
$L__BB0_3:
  ret;
""")

_JOINED = _kernel("joined", """  mov.u32 %r1, %tid.x;
  add.s32 %r2, %r1, 7;
  setp.lt.u32 %p1, %r2, 2;
  @%p1 bra $L__BB0_2;
  add.s32 %r3, %r1, 1;
$L__BB0_2:
  bar.sync 0;
  ret;
""")

_BLOCK_UNIFORM = _kernel("uniform", """  mov.u32 %r1, %ctaid.x;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 bra $L__BB0_2;
  bar.sync 0;
$L__BB0_2:
  ret;
""")

_TRAP_PATH = _kernel("trapping", """  mov.u32 %r1, %tid.x;
  setp.gt.u32 %p1, %r1, 64;
  @%p1 bra $L__BB0_9;
  bar.sync 0;
  ret;
$L__BB0_9:
  trap; exit;
""")


@pytest.mark.parametrize(("ptx", "flagged"), [(_TWO_BARRIERS, True), (_JOINED, False), (_BLOCK_UNIFORM, False),
                                              (_TRAP_PATH, False)], ids=["split", "joined", "block-uniform", "trap"])  # fmt: skip
def test_the_check_itself(ptx, flagged):
    (body,) = kernel_bodies(ptx).values()
    assert bool(divergent_barriers(body)) == flagged


def test_the_kernel_that_hung_is_flagged():
    ptx = (DATA / "asyncll_flat_walk_recv.sm_90.ptx").read_text()
    problems = divergent_barriers(kernel_bodies(ptx)["ep_async_dispatch_recv_bf16"])
    assert problems and all("thread-dependent branch" in p for p in problems)


def _variants():
    from mori_compiler.ops.asyncll import resolve

    yield "IntraNode", None
    yield "IntraNodeLL", None
    for flags in ({}, {"early_notify": 1}, {"early_notify": 1, "fused_recv": 1}):
        yield "AsyncLL", resolve({}, **flags)


@pytest.mark.parametrize("world_topk", [(8, 8), (2, 2)], ids=["w8-k8", "w2-k2"])
@pytest.mark.parametrize("variant", range(5), ids=["intranode", "ll", "async-quiet", "async-early", "async-fused"])
def test_ep_kernels_have_no_barrier_under_thread_dependent_branches(variant, world_topk):
    from mori_compiler.ops.dispatch_combine import EpDispatchCombineConfig, EpDispatchCombineKernelType, kernel_module_source
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source

    kind, mode = list(_variants())[variant]
    world, topk = world_topk
    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=world, hidden_dim=4096, scale_dim=8,
                                  scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=128,
                                  num_experts_per_rank=4, num_experts_per_token=topk,
                                  kernel_type=EpDispatchCombineKernelType[kind])  # fmt: skip
    result = compile_source(kernel_module_source(cfg, 32, mode), CompileOptions(target="sm_90", virtual_pes=True),
                            filename=f"<{kind} barriers>")  # fmt: skip
    bodies = kernel_bodies(result.binary.decode())
    assert bodies
    found = {name: divergent_barriers(body) for name, body in bodies.items()}
    assert not any(found.values()), {k: v[:2] for k, v in found.items() if v}
