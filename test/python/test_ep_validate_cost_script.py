"""bench/ep_validate_cost.py without a GPU: its precompile mode builds the bundles its GPU run loads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ep_validate_cost.py"


def _load():
    spec = importlib.util.spec_from_file_location("ep_validate_cost", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_precompile_builds_the_bundle_of_each_token_count(tmp_path, capsys):
    bench = _load()
    assert bench.main(["--precompile", str(tmp_path), "--tokens", "16", "--blocks", "8", "--warps", "4"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    tokens, path = line.split()
    assert tokens == "16" and Path(path).is_dir() and (Path(path) / "bundle.json").is_file()
    assert bench.MODES == (True, "debug") and [bench._label(m) for m in bench.MODES] == ["device", "debug"]
