"""Are the EP kernels of this checkout the same code as another checkout's? (refactoring check)

Writes, for a matrix of EP configurations (every kernel type, AsyncLL notification modes, two sizes, one
odd) and targets (sm_90, gfx942, gfx950, gfx1250), the final assembly of each config's whole bundle (PTX
or AMDGPU ISA) and the MLIR after the ``ep`` stage (kernel parameter names and locations stripped), then
compares two such dumps. Identical assembly means identical behaviour and speed on the GPU.

    python bench/kernel_equivalence.py dump DIR          # with this checkout's interpreter
    python bench/kernel_equivalence.py compare BASE NEW   # exit 1 when any assembly differs
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

TARGETS = ("sm_90", "gfx942", "gfx950", "gfx1250")
SIZES = {  # name: (world_size, hidden, top_k, experts_per_rank, tokens, scale_dim, max_total_recv)
    "big": (8, 7168, 8, 32, 128, 56, 0),
    "odd": (3, 2064, 5, 3, 37, 7, 50),
}
KINDS = {"intranode": (0, {}), "ll": (5, {}), "async": (4, {}), "async-early": (4, {"early_notify": True}),
         "async-fused": (4, {"early_notify": True, "fused_recv": True})}  # fmt: skip


def cases() -> list[tuple[str, str, str]]:
    out = []
    for target in TARGETS:
        for size in SIZES:
            for kind in KINDS:
                if kind.startswith("async-") and (size != "big" or target not in ("sm_90", "gfx942")):
                    continue
                out.append((target, size, kind))
    return out


def _strip(mlir: str) -> str:
    mlir = re.sub(r" \{mori\.name = \"[^\"]*\"\}", "", mlir)
    return re.sub(r" loc\([^)]*\)", "", mlir)


def _one(case: tuple[str, str, str], out_dir: str) -> str:
    from mori_compiler.options import CompileOptions
    from mori_compiler.ops import EpDispatchCombineConfig, kernel_module_source
    from mori_compiler.ops.asyncll import resolve
    from mori_compiler.pipeline import compile_source
    from mori_compiler.targets import get_target

    target, size, kind = case
    W, H, K, E, M, sd, cap = SIZES[size]
    ktype, mode = KINDS[kind]
    cfg = EpDispatchCombineConfig(data_type="bf16", rank=0, world_size=W, hidden_dim=H, scale_dim=sd,
                                  scale_type_size=4, max_token_type_size=4, max_num_inp_token_per_rank=M,
                                  num_experts_per_rank=E, num_experts_per_token=K, max_total_recv_tokens=cap,
                                  kernel_type=ktype)  # fmt: skip
    wave = get_target(target).wave_size
    asyncll = resolve({}, **mode) if ktype == 4 else None
    source = kernel_module_source(cfg, wave, asyncll)
    try:  # what ep_bundle compiles: the module built from the typed plan (older checkouts: the text)
        from mori_compiler.ops.bundle import build_kernel_module, module_plan

        source = build_kernel_module(module_plan(cfg, wave, asyncll))
    except ImportError:
        pass
    options = CompileOptions(target=target, virtual_pes=(size == "odd"))
    name = f"{target}-{size}-{kind}"
    ep = compile_source(source, options, stop_after="ep")
    with open(os.path.join(out_dir, name + ".mlir"), "w") as f:
        f.write(_strip(ep.mlir))
    final = "ptx" if target == "sm_90" else "isa"
    asm = compile_source(source, options, stop_after=final, want_assembly=True).assembly
    with open(os.path.join(out_dir, name + ".s"), "w") as f:
        f.write(asm)
    return name


def dump(out_dir: str, jobs: int) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with ProcessPoolExecutor(jobs) as pool:
        for name in pool.map(_one, cases(), [out_dir] * len(cases())):
            print(name, flush=True)


def compare(base: str, new: str) -> int:
    differ = 0
    for target, size, kind in cases():
        name = f"{target}-{size}-{kind}"
        for ext in (".s", ".mlir"):
            a, b = (open(os.path.join(d, name + ext)).read() for d in (base, new))
            if a != b:
                lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "base", "new", n=1, lineterm=""))
                print(f"DIFFERENT {name}{ext}: {len(lines)} diff lines; first: " + " | ".join(lines[2:8]))
                differ += ext == ".s"
    print(f"{len(cases())} cases, {differ} with different assembly")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir")
    d.add_argument("--jobs", type=int, default=os.cpu_count())
    c = sub.add_parser("compare")
    c.add_argument("base")
    c.add_argument("new")
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.dir, args.jobs)
        return 0
    return compare(args.base, args.new)


if __name__ == "__main__":
    sys.exit(main())
