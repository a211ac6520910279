"""Append reproducer folders (written by a campaign) to a shared Markdown findings file, one entry per
signature not yet in it: ``python test/fuzz/findings.py OUT_DIR... --to findings.md``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz.classify import normalize  # noqa: E402

MAX_INPUT_LINES = 12
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _printable(text: str) -> str:
    """Control characters (NUL, CR, ESC...) as \\xNN, so that the file stays plain text."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _input_excerpt(folder: Path) -> str:
    for name in ("input.mlir", "configs.json", "stdin"):
        path = folder / name
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "backslashreplace")
            lines = text.splitlines()
            more = f"\n… ({len(lines) - MAX_INPUT_LINES} more lines)" if len(lines) > MAX_INPUT_LINES else ""
            extra = ""
            if name == "configs.json" and (folder / "k.mlir").is_file() and "k.mlir" in text:
                extra = "\n// k.mlir:\n" + "\n".join((folder / "k.mlir").read_bytes().decode("utf-8", "backslashreplace")
                                                     .splitlines()[:MAX_INPUT_LINES])  # fmt: skip
            return f"{name}:\n```\n" + "\n".join(lines[:MAX_INPUT_LINES]) + more + extra + "\n```"
    return "(no input file)"


def entry(folder: Path) -> tuple[str, str]:
    info = json.loads((folder / "outcome.json").read_text())
    tool = info["signature"].split("|")[1]
    info["signature"] = f"{info['outcome']}|{tool}|{normalize(info['reason'])}"  # today's normalization
    stderr = (folder / "stderr.txt").read_bytes().decode("utf-8", "backslashreplace").splitlines()
    first = next((line for line in stderr if info["reason"] and info["reason"][:40] in line), info["reason"])
    fresh = info.get("fresh_process", {})
    fresh_note = (f"fresh process: {fresh.get('outcome')} (exit {fresh.get('exit_code')}, signal {fresh.get('signal')})"
                  if fresh else "")  # fmt: skip
    text = (f"### {info['outcome']}: `{info['command'].split()[0]}` — {first[:160]}\n"
            f"- signature: `{info['signature']}`\n- command (in the reproducer folder): `{info['command']}`\n"
            f"- seen {info['count']}× in the campaign; {fresh_note}; reproducer: `{folder}`\n"
            f"- stderr: `{first[:300]}`\n\n{_input_excerpt(folder)}\n")  # fmt: skip
    return info["signature"], text


def append(folders: list[Path], target: Path, heading: str | None = None) -> int:
    known = target.read_text() if target.exists() else ""
    added = []
    for folder in sorted(folders):
        if not (folder / "outcome.json").is_file():
            continue
        signature, text = entry(folder)
        if f"`{signature}`" not in known:
            added.append(text)
            known += f"`{signature}`"
    if added:
        with target.open("a") as f:
            if heading:
                f.write(f"\n## {heading}\n\n")
            f.write(_printable("\n".join(added)))
    return len(added)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("outs", nargs="+", type=Path, help="campaign output folders")
    p.add_argument("--to", type=Path, required=True, help="the Markdown file to append to")
    p.add_argument("--heading", default=None, help="a section heading for the new entries")
    args = p.parse_args(argv)
    folders = [f for out in args.outs for f in out.iterdir() if f.is_dir()]
    print(f"{append(folders, args.to, args.heading)} new entries in {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
