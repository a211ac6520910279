"""Seeded mutators of command lines: other pipelines (upstream passes too) and pass options of odd
values for mori-opt; other --emit / --stop-after / -O / code-object / target / bitcode options for
mori-compile. A bad option must get a one-line error naming it, like a bad input."""

from __future__ import annotations

import os
import random

NON_UTF8_ARG = os.fsdecode(b"\xff\xfe")  # what Python makes of a non-UTF-8 argv word
PIPELINES = (
    "builtin.module(mori-ep-to-kernels{wave-size=64},mori-comm-to-calls{wave-size=64 vectors-per-lane=1},"
    "mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx942 index-bitwidth=64}),"
    "rocdl-attach-target{chip=gfx942 abi=600 wave64=true},reconcile-unrealized-casts)",
    "builtin.module(mori-ep-to-kernels{wave-size=32},mori-comm-to-calls{wave-size=32 vectors-per-lane=2},"
    "mori-shmem-to-abi,gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm{index-bitwidth=64}),"
    "nvvm-attach-target{chip=sm_90 features=+ptx78},reconcile-unrealized-casts)",
    "mori-comm-to-calls{wave-size=64 vectors-per-lane=1}", "mori-comm-to-calls{wave-size=32 vectors-per-lane=2}",
    "mori-ep-to-kernels{wave-size=0}", "mori-ep-to-kernels{wave-size=-1}", "mori-ep-to-kernels{wave-size=4294967360}",
    "mori-ep-to-kernels{wave-size=64 wave-size=32}", "mori-ep-to-kernels{wave-size=abc}", "mori-ep-to-kernels{}",
    "mori-comm-to-calls{wave-size=64 vectors-per-lane=0}", "mori-comm-to-calls{vectors-per-lane=-3}",
    "mori-comm-to-calls{wave-size=64 vectors-per-lane=1000000}", "mori-shmem-to-abi{chip=gfx900}",
    "mori-shmem-to-abi{chip=}", "mori-shmem-to-abi{nope=1}", "mori-virtual-pe-args{x}", "mori-virtual-pe-args",
    "builtin.module(", "func.func(canonicalize", ",,", "mori-shmem-to-abi,", "gpu.module(mori-shmem-to-abi)",
    "canonicalize{max-iterations=-1}", "canonicalize,cse,symbol-dce", "inline", "convert-scf-to-cf",
    "gpu.module(convert-gpu-to-rocdl{chipset=gfx942})", "gpu.module(convert-gpu-to-nvvm)",
    "rocdl-attach-target{chip=gfx942}", "nvvm-attach-target{chip=sm_90}", "reconcile-unrealized-casts",
    "gpu-kernel-outlining", "convert-func-to-llvm", "mori-shmem-to-abi,mori-shmem-to-abi", NON_UTF8_ARG,
    "mori-" + "x" * 500, "mori-shmem-to-abi{chip=" + NON_UTF8_ARG + "}",
)  # fmt: skip
STAGES = ("mori", "ep", "abi", "rocdl", "nvvm", "llvm-ir", "link", "opt", "isa", "ptx", "object", "hsaco", "nope", "")
EMITS = ("hsaco", "ptx", "isa", "llvm", "mlir", "bundle", "nope", "")
TARGETS = ("gfx942", "gfx950", "gfx1250", "sm_90", "gfx900", "sm_80", "", NON_UTF8_ARG)


def mutate_opt_argv(rng: random.Random, argv: list[str]) -> list[str]:
    """Another -p pipeline (or an extra flag) in place of the original options; the input stays first."""
    argv = [a for i, a in enumerate(argv) if a != "-p" and (i == 0 or argv[i - 1] != "-p")]
    if rng.random() < 0.85:
        argv += ["-p", rng.choice(PIPELINES)]
    else:
        argv += rng.choice((["--mlir-print-ir-after-all", "-p", "mori-shmem-to-abi"], ["--mlir-print-op-generic"],
                            ["--split-input-file"], ["-o", "."], ["-o", ""], ["--nope"], [NON_UTF8_ARG]))  # fmt: skip
    return argv


def mutate_compile_argv(rng: random.Random, argv: list[str], input_name: str) -> list[str]:
    """One more (or another) compile option: stage, emit kind, level, code object version, target, bitcode."""
    choice = rng.randrange(8)
    if choice == 0:
        return argv + ["--stop-after", rng.choice(STAGES)]
    if choice == 1:
        return argv + ["--emit", rng.choice(EMITS)]
    if choice == 2:
        return argv + ["-O", rng.choice(("0", "1", "2", "3", "4", "-1", "x", "99999999999999999999"))]
    if choice == 3:
        return argv + ["--code-object-version", rng.choice(("4", "5", "6", "7", "-1", "5.0"))]
    if choice == 4:
        return [a if a not in TARGETS else rng.choice(TARGETS) for a in argv]
    if choice == 5:
        return argv + ["--bitcode", rng.choice((input_name, ".", "missing.bc", ""))]  # the mutated text as bitcode
    if choice == 6:
        return argv + ["--no-device-library"]
    return [a for a in argv if a not in ("-o",) and not a.startswith("out.")] + ["-o", rng.choice((".", "", "-"))]
