"""``mori-compile``: compile a kernel module (an .mlir file or a built-in example) to a code object.

With no input it compiles the built-in example ``ring_put_signal`` for gfx942, writes
``ring_put_signal.gfx942.hsaco`` and prints the per-kernel resource report read from the code object's
AMDHSA metadata. ``--precompile CONFIGS.json`` builds the kernel bundles a list of configurations needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ._cli import EXIT_OK, error_on_bad_args, read_input, run_cli, write_output

EMIT_KINDS = ("hsaco", "ptx", "isa", "llvm", "mlir", "bundle")


def _parser() -> argparse.ArgumentParser:
    from mori_compiler.targets import DEFAULT_TARGET, TARGETS

    p = argparse.ArgumentParser(prog="mori-compile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("input", nargs="?", default=None,
                   help="an .mlir file, '-' for stdin, or a built-in example name (default: ring_put_signal)")  # fmt: skip
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"one of {', '.join(TARGETS)} (default {DEFAULT_TARGET})")
    p.add_argument("--emit", default=None,
                   help="what to write: hsaco (AMDGPU code object), ptx, isa, llvm (linked LLVM IR), mlir "
                        "(after --stop-after), bundle (into the cache); default hsaco / ptx")  # fmt: skip
    p.add_argument("--bitcode", action="append", default=[], metavar="PATH",
                   help="device bitcode to link instead of the project's library (e.g. MORI's libmori_shmem_device.bc)")  # fmt: skip
    p.add_argument("--no-device-library", action="store_true", help="link no device library")
    p.add_argument("--code-object-version", type=int, default=6, help="AMDGPU code object version: 5 or 6 (default 6)")
    p.add_argument("-O", dest="opt_level", type=int, default=3, help="LLVM optimization level 0-3 (default 3)")
    p.add_argument("-o", dest="output", default=None, help="output file ('-' for stdout)")
    p.add_argument("--stop-after", default=None, metavar="STAGE", help="stop after this pipeline stage and print its IR")
    p.add_argument("--print-pipeline", action="store_true", help="print the pipeline's stages and exit")
    p.add_argument("--list-examples", action="store_true", help="list the built-in examples and exit")
    p.add_argument("--no-report", action="store_true", help="do not print the resource report")
    p.add_argument("--precompile", metavar="CONFIGS_JSON",
                   help="build the bundles for a JSON list of configs: {\"kernel\": example or file, \"target\": ...} "
                        "or {\"ep\": {EpDispatchCombineConfig fields}, \"target\": \"sm_90\", \"virtual_pes\": true}")  # fmt: skip
    error_on_bad_args(p)
    return p


def _options(args):
    from mori_compiler.options import CompileOptions

    return CompileOptions(target=args.target, code_object_version=args.code_object_version,
                          opt_level=args.opt_level, bitcode=tuple(args.bitcode),
                          device_library=not args.no_device_library)  # fmt: skip


def _source(spec: str | None) -> tuple[str, str, str]:
    """(text, display name, short name) of an input file, stdin or a built-in example."""
    from mori_compiler import examples

    name = spec or examples.DEFAULT_EXAMPLE
    if name != "-" and not os.path.exists(name) and name in examples.example_names():
        return examples.example_source(name), f"<example {name}>", name
    if name != "-" and not os.path.exists(name) and not name.endswith(".mlir"):
        from mori_compiler.errors import MoriCompilerError

        raise MoriCompilerError(
            f"'{name}' is neither a file nor a built-in example ({', '.join(examples.example_names())})"
        )
    text, display = read_input(name)
    short = "stdin" if name == "-" else os.path.splitext(os.path.basename(name))[0]
    return text, display, short


def _report(binary: bytes, stream) -> None:
    from mori_compiler.codeobject import format_resource_report, read_amdgpu_code_object

    print(format_resource_report(read_amdgpu_code_object(binary)), file=stream)


def _ep_source(fields, options, index: int) -> str:
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops import EpDispatchCombineConfig, kernel_module_source, validate_config

    if not isinstance(fields, dict):
        raise MoriCompilerError(f"config {index}: 'ep' must be an object of EpDispatchCombineConfig fields")
    try:
        cfg = EpDispatchCombineConfig(**({"data_type": "bf16", "rank": 0} | fields))
        validate_config(cfg, options.gpu_target.wave_size)
    except (TypeError, ValueError) as exc:
        raise MoriCompilerError(f"config {index}: invalid EP config: {exc}") from None
    return kernel_module_source(cfg, options.gpu_target.wave_size)


def precompile(configs_path: str) -> int:
    from mori_compiler.cache import compile_bundle, get_bundle
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.options import CompileOptions

    text, _ = read_input(configs_path)
    try:
        configs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MoriCompilerError(f"{configs_path} is not valid JSON: {exc}") from None
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise MoriCompilerError(f"{configs_path} must hold a JSON list of objects")
    allowed = {"kernel", "ep", "target", "code_object_version", "opt_level", "bitcode", "device_library",
               "virtual_pes"}  # fmt: skip
    for i, config in enumerate(configs, 1):
        unknown = set(config) - allowed
        if unknown:
            raise MoriCompilerError(f"config {i} has unknown fields {sorted(unknown)}; allowed: {sorted(allowed)}")
        fields = {k: v for k, v in config.items() if k not in ("kernel", "ep")}
        options = CompileOptions(**fields)
        if "ep" in config:  # the kernels an EpDispatchCombineOp with this config loads
            source, display = _ep_source(config["ep"], options, i), "EP IntraNode kernels"
            bundle = get_bundle(source, options)
        else:
            source, display, _ = _source(config.get("kernel"))
            bundle = compile_bundle(source, options, config={"kernel": config.get("kernel")})
        bar = "#" * (30 * i // len(configs))
        print(f"\r[{bar:<30}] {i}/{len(configs)} {display} {fields.get('target', 'gfx942')}", end="", file=sys.stderr)
        print(bundle.path)
    if configs:
        print(file=sys.stderr)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from mori_compiler import examples

    if args.list_examples:
        write_output("-", "\n".join(examples.example_names()) + "\n")
        return EXIT_OK
    if args.precompile:
        return precompile(args.precompile)
    options = _options(args)
    target = options.gpu_target
    from mori_compiler import pipeline
    from mori_compiler.errors import MoriCompilerError

    if args.print_pipeline:
        write_output("-", pipeline.describe_pipeline(options, pipeline.device_bitcode(options)) + "\n")
        return EXIT_OK
    emit = args.emit or ("hsaco" if target.is_amdgpu else "ptx")
    if emit not in EMIT_KINDS:
        raise MoriCompilerError(f"unknown --emit '{emit}'; allowed: {', '.join(EMIT_KINDS)}")
    if emit == "hsaco" and not target.is_amdgpu or emit == "ptx" and not target.is_nvptx:
        raise MoriCompilerError(f"--emit={emit} does not apply to target {target.name}")
    source, display, short = _source(args.input)

    if emit == "bundle":
        from mori_compiler.cache import compile_bundle

        bundle = compile_bundle(source, options, config={"kernel": args.input or examples.DEFAULT_EXAMPLE})
        write_output("-", f"{bundle.path}\n")
        return EXIT_OK

    stop = args.stop_after or {"mlir": "abi", "llvm": "opt", "isa": "isa" if target.is_amdgpu else "ptx"}.get(emit)
    result = pipeline.compile_source(source, options, filename=display, stop_after=stop, want_assembly=emit == "isa")
    if args.stop_after or emit == "mlir":
        data = pipeline.stage_output(result)
        if isinstance(data, bytes) and args.output is None:  # never dump an ELF file on a terminal
            output = f"{short}.{target.name}.{'o' if result.stopped_after == 'object' else 'hsaco'}"
            write_output(output, data)
            print(f"wrote {output} ({len(data)} bytes, {target.name}, stopped after {result.stopped_after})")
        else:
            write_output(args.output or "-", data)
        return EXIT_OK
    if emit == "llvm":
        write_output(args.output or "-", result.linked_llvm_ir)
        return EXIT_OK
    if emit == "isa":
        write_output(args.output or "-", result.assembly)
        return EXIT_OK
    output = args.output or f"{short}.{target.name}.{'hsaco' if target.is_amdgpu else 'ptx'}"
    write_output(output, result.binary)
    stream = sys.stderr if output == "-" else sys.stdout
    if output != "-":
        print(f"wrote {output} ({len(result.binary)} bytes, {target.name})", file=stream)
    if target.is_amdgpu and not args.no_report:
        _report(result.binary, stream)
    return EXIT_OK


def entry(argv: list[str] | None = None) -> int:
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(entry())
