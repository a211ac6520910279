"""Compile the toy family for a target (docs/extending.md, part 3).

    python examples/ep_kernel/compile_allgather.py --target gfx942 --stop-after isa
"""

from __future__ import annotations

import argparse
import sys

from allgather_kernel import kernel_module
from allgather_schema import AllGatherSizes


def kernel_source(sizes: AllGatherSizes, target: str) -> str:
    """The family's module as text, for the compile pipeline and the bundle cache (whose key is the text)."""
    from mori_compiler._mlir import new_context
    from mori_compiler.dialects import registry
    from mori_compiler.targets import get_target

    ctx = new_context()
    registry.load_all(ctx)
    with ctx:
        return str(kernel_module(sizes, wave_size=get_target(target).wave_size))


def compile_allgather(sizes: AllGatherSizes, target: str, stop_after: str | None = None):
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source

    return compile_source(kernel_source(sizes, target), CompileOptions(target=target), stop_after=stop_after)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="gfx942")
    p.add_argument("--stop-after", default=None)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--max-rows", type=int, default=128)
    p.add_argument("--dtype", default="bf16")
    args = p.parse_args(argv)
    sizes = AllGatherSizes(args.world_size, args.hidden, args.max_rows, args.dtype)
    result = compile_allgather(sizes, args.target, args.stop_after)
    print(f"{args.target}: {', '.join(result.kernels) or '(stopped before codegen)'} after '{result.stopped_after}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
