"""Compare two builds' EP benchmark results leg by leg: ``python bench/ab_compare.py BASE.json... -- NEW.json...``.

Each file is the ``--json`` output of ``bench/ep_bench.py`` or ``bench/ep_ll_bench.py``. Rows are matched by
(variant, leg, dtype, tokens, blocks); with several rounds per side (interleaved runs of one session) the
median of each side is compared. Prints new/base time per leg (< 1 is faster) and exits 1 when a leg is
slower than ``--tolerance`` (default 3 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict


def _times(paths: list[str]) -> dict[tuple, list[float]]:
    times: dict[tuple, list[float]] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                key = (row.get("variant", "IntraNode"), row["leg"], row["dtype"], row.get("tokens", 0), row["blocks"])
                times[key].append(row["us"])
    return times


def compare(base_paths: list[str], new_paths: list[str], tolerance: float) -> int:
    base, new = _times(base_paths), _times(new_paths)
    missing = sorted(set(base) ^ set(new))
    if missing:
        print(f"rows present on one side only: {missing}")
    print(f"{'variant':<16}{'leg':<15}{'dtype':<6}{'tokens':>7}{'blocks':>7}{'base us':>10}{'new us':>10}{'new/base':>9}")
    slower = 0
    for key in sorted(set(base) & set(new)):
        b, n = statistics.median(base[key]), statistics.median(new[key])
        ratio = n / b
        flag = "  SLOWER" if ratio > 1 + tolerance else ""
        slower += bool(flag)
        print(f"{key[0]:<16}{key[1]:<15}{key[2]:<6}{key[3]:>7}{key[4]:>7}{b:>10.1f}{n:>10.1f}{ratio:>9.3f}{flag}")
    print(f"{slower} of {len(set(base) & set(new))} legs slower than {tolerance:.0%}")
    return 1 if slower or missing else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("files", nargs="+", help="BASE.json ... -- NEW.json ...")
    if "--" not in argv:
        ap.error("separate the base files from the new files with --")
    split = argv.index("--")
    opts = ap.parse_args(argv[:split])
    return compare(opts.files, argv[split + 1:], opts.tolerance)


if __name__ == "__main__":
    sys.exit(main())
