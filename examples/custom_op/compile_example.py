"""Compile flag_barrier.mlir (written with the mori_example dialect) for a target (docs/extending.md, part 2).

    python examples/custom_op/compile_example.py --target gfx942 --stop-after isa

The example pass is not one of the pipeline's stages, so it runs first, on its own; what it leaves (mori_shmem,
gpu, scf, arith, llvm) is what ``compile_source`` takes. A pass of the project itself would instead get a
place in the stage list of mori_compiler/pipeline.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mori_example

SOURCE = Path(__file__).with_name("flag_barrier.mlir")


def lowered_source(path: Path = SOURCE) -> str:
    """The example's kernel with the mori_example ops lowered: text holding only the project's dialects."""
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import registry
    from mori_compiler.pass_pipeline import build_pass_manager

    mori_example.register()
    ctx = new_context()
    module = registry.parse_source(path.read_text(encoding="utf-8"), ctx, str(path))  # checked against the IRDL
    build_pass_manager(mori_example.PASS_NAME, ctx).run(module.operation)
    return str(module)


def compile_example(target: str, stop_after: str | None = None):
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source

    return compile_source(lowered_source(), CompileOptions(target=target), filename=str(SOURCE), stop_after=stop_after)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="gfx942")
    p.add_argument("--stop-after", default=None, help="a pipeline stage (isa for AMDGPU, ptx for NVIDIA, ...)")
    args = p.parse_args(argv)
    result = compile_example(args.target, args.stop_after)
    print(f"{args.target}: {', '.join(result.kernels) or '(stopped before codegen)'} "
          f"after '{result.stopped_after}'")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
