"""Resource usage of every EP kernel (IntraNode, IntraNodeLL, AsyncLL in its 3 modes; the inter-node types
InterNodeV1, InterNodeV1LL, InterNode "V0") for one AMDGPU target, from the code objects' AMDHSA metadata,
plus each kernel's instruction count; optionally the sm_90 PTX of every bundle written to a directory (to
diff two checkouts byte for byte).

    python bench/ep_kernel_resources.py [--target gfx942] [--kinds all|intra|inter] [--bitcode PATH]
                                        [--ptx-dir DIR] [--json FILE]

The config is the DeepSeek-like one of test/python/test_ep_kernels_isa.py (hidden 7168, top-8, 32 experts
per PE, 128 tokens per PE, bf16 and fp8 dispatch, fp32 scales 56 x 4 B): 8 PEs for the intra-node types,
16 PEs in 2 nodes of 8 (gpu_per_node 8) for the inter-node ones. ``--bitcode`` links the kernels against that
device bitcode (e.g. MORI's ``libmori_shmem_device.gfx942.bc``) instead of the project's library; the
resources then include MORI's transport code (RDMA and P2P paths). Runs against whichever ``mori_compiler``
the interpreter imports, so the same script measures /work/base and a working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


KINDS = ("all", "intra", "inter")


def variants(kinds: str = "all"):
    """(name, config, AsyncLL options or None) of the measured bundles: the intra-node types, the inter-node
    ones, or both (``kinds``)."""
    from mori_compiler.ops.config import EpDispatchCombineConfig, EpDispatchCombineKernelType

    def cfg(kind, **topology):
        fields = dict(data_type="bf16", rank=0, world_size=8, hidden_dim=7168, scale_dim=56, scale_type_size=4,
                      max_token_type_size=2, max_num_inp_token_per_rank=128, num_experts_per_rank=32,
                      num_experts_per_token=8, kernel_type=kind)  # fmt: skip
        return EpDispatchCombineConfig(**(fields | topology))

    K = EpDispatchCombineKernelType
    if kinds in ("all", "intra"):
        yield "intranode", cfg(K.IntraNode), None
        yield "intranode-ll", cfg(K.IntraNodeLL), None
        from mori_compiler.ops.asyncll import resolve

        for mode, flags in (("count_after_quiet", {}), ("early_notify", {"early_notify": True}),
                            ("early_notify_fused_recv", {"early_notify": True, "fused_recv": True})):  # fmt: skip
            yield f"asyncll-{mode}", cfg(K.AsyncLL), resolve({}, **flags)
    if kinds in ("all", "inter"):
        two_nodes = dict(world_size=16, gpu_per_node=8)
        yield "internode-v1", cfg(K.InterNodeV1, **two_nodes), None
        yield "internode-v1ll", cfg(K.InterNodeV1LL, **two_nodes), None
        yield "internode-v0", cfg(K.InterNode, **two_nodes), None


def instruction_counts(assembly: str) -> dict[str, int]:
    """Machine instructions per kernel in AMDGPU assembly text (labels, directives, comments excluded)."""
    counts, current = {}, None
    for line in assembly.splitlines():
        m = re.match(r"^([A-Za-z_.$][\w.$]*):", line)
        if m and not m.group(1).startswith("."):
            current = m.group(1)
            counts.setdefault(current, 0)
        elif current and line.startswith("\t") and not line.startswith(("\t.", "\t;")) and line.strip():
            counts[current] += 1
        elif line.startswith("\t.end_amdhsa_kernel") or line.startswith("\t.size"):
            current = None
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="gfx942")
    ap.add_argument("--kinds", choices=KINDS, default="all", help="which kernel types (default: all)")
    ap.add_argument("--bitcode", help="link against this device bitcode instead of the project's library")
    ap.add_argument("--ptx-dir", help="also write the sm_90 PTX of every bundle here")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args(argv)
    if args.bitcode and args.ptx_dir:
        ap.error("--ptx-dir writes sm_90 PTX, which --bitcode (an AMDGPU bitcode) cannot be linked into")
    if args.bitcode and not os.path.isfile(args.bitcode):
        ap.error(f"--bitcode {args.bitcode}: no such file")
    from mori_compiler.codeobject import read_amdgpu_code_object
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.bundle import kernel_module_source
    from mori_compiler.options import CompileOptions
    from mori_compiler.pipeline import compile_source
    from mori_compiler.targets import get_target

    rows = {}
    wave = get_target(args.target).wave_size
    options = CompileOptions(target=args.target, bitcode=(args.bitcode,) if args.bitcode else ())
    for name, cfg, mode in variants(args.kinds):
        try:
            result = compile_source(kernel_module_source(cfg, wave, mode), options, want_assembly=True)
        except MoriCompilerError as exc:  # e.g. a --bitcode built for another target
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 1
        counts = instruction_counts(result.assembly)
        info = read_amdgpu_code_object(result.binary)
        if info.undefined_symbols():
            print(f"error: {name}: the code object has undefined symbols {info.undefined_symbols()}", file=sys.stderr)
            return 1
        for k in info.kernels:
            rows[f"{name}:{k.name}"] = dict(vgpr=k.vgpr_count, sgpr=k.sgpr_count, vgpr_spill=k.vgpr_spill_count,
                                            sgpr_spill=k.sgpr_spill_count, scratch=k.scratch_bytes,
                                            instructions=counts.get(k.name, -1))  # fmt: skip
        if args.ptx_dir:
            os.makedirs(args.ptx_dir, exist_ok=True)
            ptx = compile_source(kernel_module_source(cfg, 32, mode), CompileOptions(target="sm_90"))
            with open(os.path.join(args.ptx_dir, f"{name}.ptx"), "wb") as f:
                f.write(ptx.binary)
    library = f"the device bitcode {args.bitcode}" if args.bitcode else "the project's device library"
    print(f"# {args.target}, linked with {library}")
    print(f"{'variant:kernel':64} {'VGPR':>5} {'SGPR':>5} {'vspill':>6} {'sspill':>6} {'scratch':>7} {'instr':>6}")
    for key, r in rows.items():
        print(f"{key:64} {r['vgpr']:5} {r['sgpr']:5} {r['vgpr_spill']:6} {r['sgpr_spill']:6} {r['scratch']:7} "
              f"{r['instructions']:6}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
