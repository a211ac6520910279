"""``mori-compile``: compile a kernel module (an .mlir file or a built-in example) to a code object.

With no input it compiles the built-in example ``ring_put_signal`` for gfx942, writes
``ring_put_signal.gfx942.hsaco`` and prints the per-kernel resource report read from the code object's
AMDHSA metadata. ``--precompile CONFIGS.json`` builds the kernel bundles a list of configurations needs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    p.add_argument("--trace", action="store_true",
                   help="compile the kernels' trace points (mori_comm.trace: global-timer phase marks, docs/tracing.md)")
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
                          device_library=not args.no_device_library, trace=args.trace)  # fmt: skip


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


# --precompile: each entry is {"kernel": ...} (an example or an .mlir file, with compile options) or
# {"ep": {...}} (the bundle EpDispatchCombineOp loads, built by ops.ep_bundle: one code path with the op).
KERNEL_ENTRY_FIELDS = {"kernel": str, "target": str, "code_object_version": int, "opt_level": int,
                       "bitcode": (str, list), "device_library": bool, "virtual_pes": bool, "trace": bool}  # fmt: skip
EP_ENTRY_FIELDS = {"ep": dict, "target": str, "virtual_pes": bool, "asyncll": dict, "bitcode": (str, list),
                   "trace": bool}  # fmt: skip
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def _type_name(ty) -> str:
    return " or ".join(_TYPE_NAMES[t] for t in (ty if isinstance(ty, tuple) else (ty,)))


def _check_entry(entry, index: int) -> dict:
    """The entry's fields, each of the type its kind of entry allows; else a MoriCompilerError naming it."""
    from mori_compiler.errors import MoriCompilerError

    if not isinstance(entry, dict):
        raise MoriCompilerError(f"config {index}: must be an object ({{\"kernel\": ...}} or {{\"ep\": {{...}}}}), "
                                f"got {json.dumps(entry)[:60]}")  # fmt: skip
    if ("kernel" in entry) == ("ep" in entry):
        raise MoriCompilerError(f"config {index}: needs exactly one of \"kernel\" (an example name or .mlir file) "
                                "and \"ep\" (EpDispatchCombineConfig fields)")  # fmt: skip
    kind, allowed = ("ep", EP_ENTRY_FIELDS) if "ep" in entry else ("kernel", KERNEL_ENTRY_FIELDS)
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise MoriCompilerError(f"config {index}: unknown field(s) {', '.join(map(json.dumps, unknown))} for a \"{kind}\" entry; "
                                f"allowed: {', '.join(allowed)}")  # fmt: skip
    for name, value in entry.items():
        ty = allowed[name]
        types = ty if isinstance(ty, tuple) else (ty,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise MoriCompilerError(f"config {index}: \"{name}\" must be {_type_name(ty)}, got {json.dumps(value)[:60]}")
    if kind == "kernel" and not entry["kernel"]:
        raise MoriCompilerError(f"config {index}: \"kernel\" must name an example or an .mlir file, got \"\"")
    if entry.get("bitcode") == []:
        raise MoriCompilerError(f"config {index}: \"bitcode\" is an empty list; leave it out to link the project's library")
    if isinstance(entry.get("bitcode"), list) and not all(isinstance(b, str) for b in entry["bitcode"]):
        raise MoriCompilerError(f"config {index}: \"bitcode\" must be a path or a list of paths")
    return entry


def _ep_config(fields: dict, index: int):
    """The EpDispatchCombineConfig of an "ep" entry (``rank`` 0 and ``data_type`` bf16 unless given;
    ``kernel_type`` by name or value)."""
    import dataclasses

    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.config import EpDispatchCombineConfig, EpDispatchCombineKernelType

    names = [f.name for f in dataclasses.fields(EpDispatchCombineConfig)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise MoriCompilerError(f"config {index}: \"ep\" has unknown field(s) {', '.join(map(json.dumps, unknown))}; "
                                f"EpDispatchCombineConfig has: {', '.join(names)}")  # fmt: skip
    fields = {"data_type": "bf16", "rank": 0} | fields
    kernel_type = fields.get("kernel_type")
    if isinstance(kernel_type, str):
        if kernel_type not in EpDispatchCombineKernelType.__members__:
            raise MoriCompilerError(f"config {index}: \"ep\".kernel_type {kernel_type!r} is not a kernel type; "
                                    f"allowed: {', '.join(EpDispatchCombineKernelType.__members__)}")  # fmt: skip
        fields["kernel_type"] = EpDispatchCombineKernelType[kernel_type]
    required = [f.name for f in dataclasses.fields(EpDispatchCombineConfig)
                if f.default is dataclasses.MISSING and f.name not in fields]  # fmt: skip
    if required:
        raise MoriCompilerError(f"config {index}: \"ep\" lacks the field(s) {', '.join(required)}")
    return EpDispatchCombineConfig(**fields)


def _plan_entry(entry: dict, index: int):
    """A function that builds the checked entry's bundle and returns (bundle, what it is); everything that
    can be checked without compiling (the EP config, the AsyncLL mode, the compile options) is checked
    here, so that a bad entry fails before any entry is built."""
    from mori_compiler.errors import MoriCompilerError
    from mori_compiler.ops.asyncll import AsyncLLOptionError, resolve
    from mori_compiler.ops.config import ConfigError, EpDispatchCombineKernelType, validate_config
    from mori_compiler.ops.bundle import ep_bundle
    from mori_compiler.options import CompileOptions
    from mori_compiler.targets import get_target

    try:
        if "ep" in entry:
            config = _ep_config(entry["ep"], index)
            target = entry.get("target", "gfx942")
            validate_config(config, get_target(target).wave_size)
            if "asyncll" in entry and config.kernel_type != EpDispatchCombineKernelType.AsyncLL:
                raise MoriCompilerError(f"config {index}: \"asyncll\" applies to kernel_type AsyncLL only, not "
                                        f"{EpDispatchCombineKernelType(config.kernel_type).name}")  # fmt: skip
            asyncll = resolve(**entry["asyncll"]) if "asyncll" in entry else None
            virtual_pes = entry.get("virtual_pes", False)
            bitcode = entry.get("bitcode")
            if bitcode is not None:
                CompileOptions(target=target, bitcode=bitcode)  # a missing file fails before any entry is built
            what = f"EP {EpDispatchCombineKernelType(config.kernel_type).name} kernels"
            trace = entry.get("trace", False)
            return lambda: (ep_bundle(config, target, virtual_pes=virtual_pes, asyncll=asyncll, bitcode=bitcode,
                                      trace=trace), what)  # fmt: skip
        options = CompileOptions(**{k: v for k, v in entry.items() if k != "kernel"})
        source, display, _ = _source(entry["kernel"])
        return lambda: (_compile_bundle(source, display, options, entry["kernel"]), display)
    except (ConfigError, AsyncLLOptionError) as exc:
        raise MoriCompilerError("\n".join(f"config {index}: {line}" for line in str(exc).split("\n"))) from None
    except MoriCompilerError as exc:
        raise _naming_entry(exc, index) from None


def _build(plan, index: int):
    from mori_compiler.errors import MoriCompilerError

    try:
        return plan()
    except MoriCompilerError as exc:
        raise _naming_entry(exc, index) from None


_LOCATED_LINE = re.compile(r"(\S+:\d+:\d+): (.*)")


def _naming_entry(exc, index: int):
    """``exc`` with "config N: " on every problem line (after the location of a located one)."""
    first, *rest = exc.message.split("\n")
    lines = [f"config {index}: {first}"]
    for line in rest:
        m = _LOCATED_LINE.fullmatch(line)
        lines.append(line if line.startswith("  ") else f"{m[1]}: config {index}: {m[2]}" if m else f"config {index}: {line}")
    exc.message = "\n".join(lines)
    return exc


def _compile_bundle(source: str, display: str, options, kernel: str):
    """compile_bundle, with diagnostics located in the input file (MLIR names the parsed text "-")."""
    from mori_compiler.cache import compile_bundle
    from mori_compiler.errors import MoriCompilerError, with_filename

    try:
        return compile_bundle(source, options, config={"kernel": kernel})
    except MoriCompilerError as exc:
        raise _located_at_module(with_filename(exc, display), source, display) from None


_MODULE_ERROR = re.compile(r"(?:code object of )?gpu\.module @([\w$.\-]+) ")


def _located_at_module(exc, source: str, display: str):
    """An error of the LLVM-level stages (link, symbol checks, codegen) names the gpu.module, not a place:
    locate it at that gpu.module in the input."""
    m = _MODULE_ERROR.match(exc.message)
    if exc.location is None and m:
        from mori_compiler.dialects.input_checks import op_location

        exc.location = op_location(source, display, "gpu.module", m.group(1))
    return exc


class _Progress:
    """The progress bar on stderr (``\\r`` without a newline); ``end_line`` before anything else is printed
    there, so that no error is glued to the bar."""

    def __init__(self, total: int):
        self.total, self.open = total, False

    def show(self, i: int, what: str) -> None:
        bar = "#" * (30 * i // self.total)
        print(f"\r[{bar:<30}] {i}/{self.total} {what}", end="", file=sys.stderr, flush=True)
        self.open = True

    def end_line(self) -> None:
        if self.open:
            print(file=sys.stderr, flush=True)
            self.open = False


def precompile(configs_path: str) -> int:
    from mori_compiler.errors import MoriCompilerError

    text, display = read_input(configs_path)
    try:
        configs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MoriCompilerError(f"not valid JSON: {exc.msg}", f"{display}:{exc.lineno}:{exc.colno}") from None
    except (RecursionError, ValueError) as exc:  # nested too deeply; an integer too long to convert
        raise MoriCompilerError(f"{display} cannot be read as JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(configs, list):
        raise MoriCompilerError(f"{display} must hold a JSON list of configs, got {type(configs).__name__}")
    entries = [_check_entry(entry, i) for i, entry in enumerate(configs, 1)]
    plans = [_plan_entry(entry, i) for i, entry in enumerate(entries, 1)]
    progress = _Progress(len(entries))
    try:
        for i, (entry, plan) in enumerate(zip(entries, plans), 1):
            bundle, what = _build(plan, i)
            progress.show(i, f"{what} {entry.get('target', 'gfx942')}")
            print(bundle.path, flush=True)
    finally:
        progress.end_line()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from mori_compiler import examples

    if args.list_examples:
        write_output("-", "\n".join(examples.example_names()) + "\n")
        return EXIT_OK
    if args.precompile:
        given = _parser()
        for action in given._actions:  # parse again, keeping only what the command line names
            action.default = argparse.SUPPRESS
        spelled = {"opt_level": "-O", "output": "-o", "input": "an input file"}
        ignored = [spelled.get(k, f"--{k.replace('_', '-')}") for k in vars(given.parse_args(argv)) if k != "precompile"]
        if ignored:
            from mori_compiler.errors import MoriCompilerError

            raise MoriCompilerError(f"--precompile takes every option from its JSON entries; {', '.join(ignored)} "
                                    "would be ignored (give it in the entries)")  # fmt: skip
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

    if emit == "bundle" and (args.output or args.stop_after):
        raise MoriCompilerError(f"{'-o' if args.output else '--stop-after'} does not apply to --emit=bundle (the "
                                "bundle is written into the cache and its path printed)")  # fmt: skip
    if emit == "bundle":
        bundle = _compile_bundle(source, display, options, args.input or examples.DEFAULT_EXAMPLE)
        write_output("-", f"{bundle.path}\n")
        return EXIT_OK

    stop = args.stop_after or {"mlir": "abi", "llvm": "opt", "isa": "isa" if target.is_amdgpu else "ptx"}.get(emit)
    try:
        result = pipeline.compile_source(source, options, filename=display, stop_after=stop, want_assembly=emit == "isa")
    except MoriCompilerError as exc:
        raise _located_at_module(exc, source, display) from None
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
