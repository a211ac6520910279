"""bench/io_bench.py on the CPU: its TCP mode over loopback (two processes) for a tiny sweep, its JSON, its
refusal of impossible flag combinations, and its data validation catching misplaced bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mori_compiler.io import StatusCode

BENCH = Path(__file__).resolve().parents[2] / "bench" / "io_bench.py"


def run_bench(*args, timeout=120):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout)


def load_bench():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import io_bench
    finally:
        sys.path.remove(str(BENCH.parent))
    return io_bench


def test_tcp_sweep_writes_validated_points_with_ratios(tmp_path):
    out = tmp_path / "io.json"
    batches = [1, 3]
    proc = run_bench("--backend", "tcp", "--mem", "cpu", "--op", "both", "--api", "both", "--start-size", "1K",
                     "--max-size", "256K", "--size-factor", "4", "--batch", "1,3", "--max-total", "512K",
                     "--iters", "3", "--warmup", "1", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    head = doc["header"]
    assert head["machine"]["cpu_count"] >= 1 and head["machine"]["hostname"]
    assert head["config"]["backend"] == "tcp" and head["config"]["num_connections"] == 1
    assert head["config"]["sizes"] == [1024, 4096, 16384, 65536, 262144] and head["versions"]["python"]
    points = doc["points"]
    expected = {(op, api, size, batch) for op in ("read", "write") for api in ("engine", "session")
                for size in head["config"]["sizes"] for batch in batches if size * batch <= 512 * 1024}  # fmt: skip
    assert {(p["op"], p["api"], p["size"], p["batch"]) for p in points} == expected
    assert len(points) == len(expected)
    assert {(s["size"], s["batch"]) for s in doc["skipped"]} == {(262144, 3)}  # 768 KiB > --max-total
    for p in points:
        engine, base = p["engine"], p["baseline"]
        assert p["validated"] is True and p["layout"] == "strided" and p["total_bytes"] == p["size"] * p["batch"]
        assert 0 < engine["GBps_median"] <= engine["GBps_best"] and base["GBps_median"] > 0
        assert engine["us_per_iter_min"] <= engine["us_per_iter_median"]
        assert engine["us_per_transfer_median"] == pytest.approx(engine["us_per_iter_median"] / p["batch"])
        assert base["kind"] == "socket"
        assert p["ratio"] == pytest.approx(engine["GBps_median"] / base["GBps_median"]) and p["ratio"] > 0
    assert "[bandwidth]" in proc.stdout and "ratio" in proc.stdout


def test_single_ops_contiguous_batches_and_the_latency_section(tmp_path):
    out = tmp_path / "io.json"
    proc = run_bench("--op", "write", "--api", "session", "--issue", "both", "--contiguous", "--start-size", "8",
                     "--max-size", "32", "--size-factor", "4", "--batch", "2", "--iters", "2", "--latency",
                     "--latency-iters", "2", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    points = json.loads(out.read_text())["points"]
    bandwidth = {(p["issue"], p["size"], p["batch"]) for p in points if p["section"] == "bandwidth"}
    latency = {(p["issue"], p["size"], p["batch"]) for p in points if p["section"] == "latency"}
    assert bandwidth == {(issue, size, 2) for issue in ("batch", "single") for size in (8, 32)}
    assert latency == {(issue, 8 << k, 1) for issue in ("batch", "single") for k in range(10)}  # 8 B ... 4 KiB
    assert all(p["layout"] == "contiguous" and p["validated"] and p["ratio"] > 0 for p in points)
    assert "[latency]" in proc.stdout


@pytest.mark.parametrize("args, says", [
    (["--backend", "xgmi", "--mem", "cpu"], "needs --mem gpu"),
    (["--single-process"], "--single-process"),
    (["--num-streams", "4"], "--num-streams does not apply"),
    (["--backend", "xgmi", "--notify"], "--notify does not apply"),
    (["--batch", "0"], "batch sizes must be >= 1"),
    (["--start-size", "1M", "--max-size", "1K"], "--start-size"),
    (["--latency-iters", "5"], "--latency-iters does not apply to this run"),
])  # fmt: skip
def test_impossible_combinations_are_refused_clearly(args, says):
    proc = run_bench(*args, timeout=60)
    assert proc.returncode == 1
    assert f"io_bench: error:" in proc.stderr and says in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_validation_catches_bytes_that_land_in_the_wrong_place():
    bench = load_bench()
    spec = bench.EngineSpec("tcp", "cpu", "127.0.0.1", 4096, 1, False, None, None)
    initiator, target_engine = bench.make_engine("init", spec), bench.make_engine("target", spec)
    try:
        initiator.register_remote_engine(target_engine.get_engine_desc())
        target = bench.LocalTarget(target_engine, spec, None)  # the destination, registered on the target engine
        buffer = bench.HostBuffer(4096)
        init = bench.Initiator(initiator, buffer, bench.register(initiator, buffer, "initiator"), target.memory)
        point = bench.Point("bandwidth", "write", "engine", "batch", False, 100, 4, 1)
        bench.validate(init, target, point, bench.issuer(init, point), 10)  # the right bytes pass
        shifted = lambda: [initiator.write(init.local, o, init.remote, o + 1, 100, 7)  # noqa: E731
                           for o in bench.entry_offsets(100, 4, False)]  # fmt: skip
        with pytest.raises(bench.BenchError, match="validation FAILED for write engine/batch strided size 100B"):
            bench.validate(init, target, point, shifted, 10)
        failing = lambda: [initiator.write(init.local, 0, init.remote, 4000, 200, 8)]  # noqa: E731  out of bounds
        with pytest.raises(bench.BenchError, match=StatusCode.ERR_INVALID_ARGS.name):
            bench.validate(init, target, point, failing, 10)
    finally:
        initiator.close()
        target_engine.close()
