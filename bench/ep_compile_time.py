"""Compile time of the EP IntraNode kernels (one dispatch + one combine) for one target, on this machine.

Cold: an empty cache (the device library is built too); cached: the bundle is found in the cache. Both
exclude the Python import, which is reported separately, as is a whole process doing a cold compile.

    python bench/ep_compile_time.py [--target gfx942] [--dtypes bf16|all]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def ep_source(target_name: str, dtypes: str) -> str:
    from mori_compiler.ops import EpDispatchCombineConfig, kernel_module_source
    from mori_compiler.targets import get_target

    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0,
                                  scale_type_size=4, max_token_type_size=2 if dtypes == "bf16" else 4,
                                  max_num_inp_token_per_rank=4096, num_experts_per_rank=32, num_experts_per_token=8,
                                  use_external_inp_buf=False)  # fmt: skip
    source = kernel_module_source(cfg, get_target(target_name).wave_size)
    if dtypes == "bf16":  # the bf16 dispatch and the zero-copy bf16 combine: what a bf16 layer launches
        keep = lambda l: "mori_ep." not in l or ('"bf16"' in l and "zero_copy = 0" not in l)  # noqa: E731
        source = "\n".join(l for l in source.splitlines() if keep(l)) + "\n"
    return source


def compile_once(target_name: str, dtypes: str, cache: str):
    from mori_compiler.cache import get_bundle
    from mori_compiler.options import CompileOptions

    return get_bundle(ep_source(target_name, dtypes), CompileOptions(target=target_name), cache_root=cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="gfx942")
    ap.add_argument("--dtypes", default="bf16", choices=("bf16", "all"))
    args = ap.parse_args(argv)
    t = time.perf_counter()
    import mori_compiler.cache  # noqa: F401
    import mori_compiler.pipeline  # noqa: F401 - the compiler's imports (MLIR, llvmlite)

    import_ms = (time.perf_counter() - t) * 1e3
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        bundle = compile_once(args.target, args.dtypes, cache)
        cold_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        compile_once(args.target, args.dtypes, cache)
        cached_ms = (time.perf_counter() - t) * 1e3
    with tempfile.TemporaryDirectory() as cache:
        code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                f"import ep_compile_time as m; m.compile_once({args.target!r}, {args.dtypes!r}, {cache!r})")  # fmt: skip
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        process_ms = (time.perf_counter() - t) * 1e3
    print(f"target {args.target}, kernels: {', '.join(bundle.kernels)}")
    print(f"import {import_ms:.0f} ms | cold compile {cold_ms:.0f} ms | cached {cached_ms:.1f} ms | "
          f"whole process (cold) {process_ms:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
