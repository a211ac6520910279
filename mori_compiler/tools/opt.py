"""``mori-opt``: run pass pipelines on MLIR files holding the project's dialects (modelled on mlir-opt)."""

from __future__ import annotations

import argparse
import re
import sys

from mori_compiler.errors import MoriCompilerError

from ._cli import EXIT_OK, EXIT_USER_ERROR, error_on_bad_args, read_input, report, run_cli, write_output

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mori-opt", description=__doc__)
    p.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' for stdin)")
    p.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    p.add_argument("-p", "--pass-pipeline", default="", help="pass pipeline: project passes and upstream MLIR passes")
    p.add_argument("--split-input-file", action="store_true", help="process each '// -----' chunk separately")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after each pass (stderr)")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in generic form")
    p.add_argument("--list-passes", action="store_true", help="list the project's passes and exit")
    p.add_argument("--show-dialects", action="store_true", help="list the project's dialects and exit")
    p.add_argument("--emit-irdl", action="store_true", help="print the IRDL of the project's dialects and exit")
    error_on_bad_args(p)
    return p


def list_passes() -> str:
    from mori_compiler.passes import ALL_PASSES

    lines = []
    for name, load in sorted(ALL_PASSES.items()):
        doc = (load().__doc__ or "").strip().splitlines()
        lines.append(f"  {name}")
        lines += [f"      {line.strip()}" for line in doc if line.strip()]
    return "Project passes (upstream MLIR passes are accepted by name too):\n" + "\n".join(lines) + "\n"


def _chunks(text: str, split: bool) -> list[tuple[str, int]]:
    """(chunk text, line offset) pairs; line numbers in diagnostics stay those of the whole file."""
    if not split:
        return [(text, 0)]
    chunks, offset, start = [], 0, 0
    for m in SPLIT_MARKER.finditer(text):
        chunks.append((text[start : m.start()], offset))
        offset += text[start : m.end()].count("\n")
        start = m.end()
    chunks.append((text[start:], offset))
    return chunks


def process_chunk(text: str, filename: str, args) -> str:
    from mori_compiler._mlir import ir, new_context
    from mori_compiler.dialects import registry
    from mori_compiler.errors import MoriCompilerError, with_filename
    from mori_compiler.pass_pipeline import build_pass_manager

    ctx = new_context()
    module = registry.parse_source(text, ctx, filename)
    if args.pass_pipeline:
        pm = build_pass_manager(args.pass_pipeline, ctx)
        if args.mlir_print_ir_after_all:
            pm.enable_ir_printing(print_after_all=True)
        try:
            pm.run(module.operation)
        except ir.MLIRError as exc:
            raise registry.diagnostics_message(exc, filename) from None
        except MoriCompilerError as exc:
            raise with_filename(exc, filename) from None
    return module.operation.get_asm(print_generic_op_form=args.mlir_print_op_generic)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_passes:
        write_output(args.output, list_passes())
        return EXIT_OK
    if args.show_dialects or args.emit_irdl:
        from mori_compiler.dialects import registry

        text = registry.emit_irdl() if args.emit_irdl else "\n".join(d.name for d in registry.DIALECTS) + "\n"
        write_output(args.output, text)
        return EXIT_OK
    try:
        args.pass_pipeline.encode("utf-8")
    except UnicodeEncodeError:  # raw command-line bytes that are not UTF-8 (kept by Python as surrogates)
        raise MoriCompilerError(f"option -p/--pass-pipeline {args.pass_pipeline!r} is not valid text (the command "
                                "line holds characters that cannot be encoded)") from None  # fmt: skip
    text, filename = read_input(args.input)
    outputs, failed = [], False
    for chunk, offset in _chunks(text, args.split_input_file):
        try:
            outputs.append(process_chunk("\n" * offset + chunk, filename, args))
        except MoriCompilerError as exc:  # reported per chunk like mlir-opt; anything else is a compiler bug
            report(exc)
            failed = True
    write_output(args.output, "// -----\n".join(outputs))
    return EXIT_USER_ERROR if failed else EXIT_OK


def entry(argv: list[str] | None = None) -> int:
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(entry())
