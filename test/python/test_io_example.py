"""examples/io/kv_transfer.py, the two-process prefill -> decode KV-cache example of MORI-IO, runs and its
check can fail.

CPU memory over the TCP backend in CI (NumPy arrays: no torch needed; torch CPU tensors where torch is
installed); on a GPU machine also GPU memory over TCP, GPU-IPC and ``auto``. Each run is a subprocess
(the example spawns its prefill process) bounded by a timeout, so a hang fails the test.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "io" / "kv_transfer.py"
SUMMARY = re.compile(r"^OK: (\d+) bytes over (tcp|xgmi \(GPU-IPC\)) in [\d.]+ ms; the (\d+) written blocks match "
                     r"prefill's, the (\d+) other blocks are untouched$", re.MULTILINE)  # fmt: skip
BF16 = 2


def run_example(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), "--timeout-s", "20", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def check_success(proc, *, layers, blocks, slots, block_bytes, route="tcp"):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr  # no warning, no traceback
    match = SUMMARY.search(proc.stdout)
    assert match, proc.stdout
    nbytes, shown_route, written, untouched = match.groups()
    assert int(nbytes) == layers * len(slots) * block_bytes
    assert shown_route.startswith(route)
    assert int(written) == layers * len(slots)
    assert int(untouched) == layers * (blocks - len(slots))
    return proc.stdout


@pytest.mark.parametrize("api", ["session", "engine"])
def test_cpu_transfer_over_tcp(api):
    out = check_success(run_example("--device", "numpy", "--api", api), layers=4, blocks=16, slots=(7, 2),
                        block_bytes=16 * 4 * 64 * BF16)  # the defaults  # fmt: skip
    assert f"with {api} batch_write" in out  # the prefill process reports from its side
    assert "pop_inbound_transfer_status('prefill', 0) -> SUCCESS" in out  # TCP notifies the target


def test_cpu_transfer_with_other_geometry():
    out = check_success(run_example("--device", "numpy", "--backend", "tcp", "--layers", "3", "--blocks", "5",
                                    "--block-tokens", "8", "--heads", "2", "--head-dim", "16", "--slots", "4,0,2",
                                    "--seed", "9"),
                        layers=3, blocks=5, slots=(4, 0, 2), block_bytes=8 * 2 * 16 * BF16)  # fmt: skip
    assert "slots [4, 0, 2]" in out


@pytest.mark.parametrize("where, message", [
    ("written", r"layer 3, slot 2: the block differs from the one prefill computed"),
    ("untouched", r"layer 0, slot 0: a block outside the request's slots was changed"),
])  # fmt: skip
def test_a_corrupted_cache_is_detected(where, message):
    """One byte flipped after the transfer (in the last written block, or in the first free one) fails the
    run with exit 1 and names the block: the example's check is not vacuous."""
    proc = run_example("--device", "numpy", "--self-check-corrupt", where)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(rf"^kv_transfer: FAILED: {message}$", proc.stderr, re.MULTILINE), proc.stderr
    assert "Traceback" not in proc.stderr and "OK:" not in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--device", "numpy", "--backend", "xgmi"], "--backend xgmi (GPU-IPC) moves GPU memory only"),
    (["--device", "numpy", "--slots", "3,3"], "need distinct slots in [0, 16)"),
    (["--device", "numpy", "--blocks", "4", "--slots", "4"], "need distinct slots in [0, 4)"),
    (["--device", "numpy", "--layers", "0"], "must be at least 1, got 0"),
    (["--backend", "rdma"], "invalid choice: 'rdma'"),
])  # fmt: skip
def test_bad_options_are_refused_clearly(args, message):
    proc = run_example(*args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("kv_transfer: error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_cpu_torch_tensors_over_tcp():
    check_success(run_example("--device", "cpu", "--backend", "tcp"), layers=4, blocks=16, slots=(7, 2),
                  block_bytes=16 * 4 * 64 * BF16)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("backend, route", [("tcp", "tcp"), ("xgmi", "xgmi"), ("auto", "xgmi")])
@pytest.mark.parametrize("api", ["session", "engine"])
def test_gpu_transfer(backend, route, api):
    """GPU memory: staged through host memory over TCP, or GPU-IPC (which ``auto`` picks for a GPU pair on
    one node, and which sends the target no notice)."""
    out = check_success(run_example("--device", "cuda", "--backend", backend, "--api", api), layers=4, blocks=16,
                        slots=(7, 2), block_bytes=16 * 4 * 64 * BF16, route=route)  # fmt: skip
    notice = "SUCCESS" if route == "tcp" else "None"
    assert f"pop_inbound_transfer_status('prefill', 0) -> {notice}" in out


@pytest.mark.gpu
def test_gpu_corruption_is_detected():
    proc = run_example("--device", "cuda", "--backend", "xgmi", "--self-check-corrupt", "written")
    assert proc.returncode == 1 and "layer 3, slot 2: the block differs" in proc.stderr, proc.stderr
