"""Cold compile time of this checkout against another one (default /work/base, the previous HEAD), measured
interleaved in fresh processes on this machine.

Each run is a new interpreter per checkout (its own venv) with an empty cache directory (so the device
library is built too), timing, after the imports: ``dispatch+combine`` (bench/ep_compile_time.py's bf16
source: the bf16 dispatch and the zero-copy bf16 combine, gfx942 by default; compiled from the module built
from the typed plan where the checkout has one, as ep_bundle does) and ``bundle`` (``ep_bundle(cfg, target)``
for max_token_type_size 2: the op's whole bundle, 5 kernels) as two separate cold compiles (wall time; "cpu"
rows: the process's CPU time over the same span, less sensitive to other load on the machine). Runs alternate A B A B ... so that load on the machine hits both alike;
the table gives medians and the ratio new / base.

    python bench/compile_side_by_side.py [--base /work/base] [--runs 7] [--target gfx942]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs inside the measured checkout's interpreter; only APIs that both checkouts have.
_CHILD = r"""
import json, sys, tempfile, time
t0 = time.perf_counter()
import mori_compiler.cache, mori_compiler.pipeline
from mori_compiler.cache import get_bundle
from mori_compiler.options import CompileOptions
from mori_compiler.ops import EpDispatchCombineConfig, ep_bundle, kernel_module_source
from mori_compiler.targets import get_target
imported = time.perf_counter() - t0
target = sys.argv[1]
wave = get_target(target).wave_size
cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=0,
                              scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=4096,
                              num_experts_per_rank=32, num_experts_per_token=8, use_external_inp_buf=False)
bundle = kernel_module_source(cfg, wave)
keep = lambda l: "mori_ep." not in l or ('"bf16"' in l and "zero_copy = 0" not in l)
pair = "\n".join(l for l in bundle.splitlines() if keep(l)) + "\n"
try:
    from mori_compiler.ops.bundle import build_kernel_module, module_plan
    plan = module_plan(cfg, wave)
    pplan = plan._replace(ops=tuple(o for o in plan.ops if keep(o.source())))
    assert pplan.source() == pair
    pair_module = lambda: build_kernel_module(pplan)
except ImportError:
    pair_module = None
out = {"import": imported, "built": pair_module is not None}
for name in ("dispatch+combine", "bundle"):
    with tempfile.TemporaryDirectory() as cache:
        t, c = time.perf_counter(), time.process_time()
        if name == "bundle":
            b = ep_bundle(cfg, target, virtual_pes=False, cache_root=cache)
        else:
            kw = {"module": pair_module} if pair_module else {}
            b = get_bundle(pair, CompileOptions(target=target), cache_root=cache, **kw)
        out[name] = time.perf_counter() - t
        out[name + " cpu"] = time.process_time() - c
        out[name + " kernels"] = len(b.kernels)
print(json.dumps(out))
"""


def run_once(checkout: str, target: str) -> dict:
    python = os.path.join(checkout, ".venv", "bin", "python")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MORI_COMPILER_CACHE_DIR=cache)
        proc = subprocess.run([python, "-c", _CHILD, target], cwd=checkout, env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: the measuring process failed:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="/work/base", help="the checkout to compare with (with its .venv)")
    ap.add_argument("--new", default=os.path.dirname(HERE), help="the checkout measured (default: this one)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--target", default="gfx942")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    samples = {"new": [], "base": []}
    for i in range(args.runs):
        for which in ("new", "base") if i % 2 == 0 else ("base", "new"):
            samples[which].append(run_once(getattr(args, which), args.target))
    keys = ("import", "dispatch+combine", "bundle", "dispatch+combine cpu", "bundle cpu")
    print(f"target {args.target}, {args.runs} interleaved runs per checkout, medians in ms (fresh process and cache)")
    print(f"  new:  {args.new}\n  base: {args.base}")
    print(f"{'':22} {'new':>8} {'base':>8} {'new/base':>9}")
    for key in keys:
        new = statistics.median(s[key] for s in samples["new"]) * 1e3
        base = statistics.median(s[key] for s in samples["base"]) * 1e3
        print(f"{key:22} {new:8.0f} {base:8.0f} {new / base:9.2f}")
    print(f"kernels: dispatch+combine {samples['new'][0]['dispatch+combine kernels']}, "
          f"bundle {samples['new'][0]['bundle kernels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
