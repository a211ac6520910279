"""MORI-IO benchmark, in the shape of MORI's ``tests/python/io/benchmark.py``: bandwidth and latency of
one-sided reads and writes between two engines, against a baseline measured in the same run.

What one point is: an op (read or write), an API (``engine``: ``IOEngine.batch_read/batch_write`` with one
memory pair, or one ``IOEngine.read/write`` per entry with ``--issue single``; ``session``:
``IOEngineSession.batch_*``, or one session op per entry), a message size and a batch of that many
entries. Entries are strided by default (entry i at offset ``i*(size+1)`` on both sides, so the engine can
never merge them, as MORI's default) or back to back with ``--contiguous``.

How it is measured: one iteration = issue the batch (one batch op, or N single ops) and wait for all of it
(``wait_all`` without a deadline, i.e. MORI's ``Wait()``); timed with ``time.perf_counter``. Before timing,
each point is validated once: the source bytes are fresh random bytes, one transfer runs, and the
destination's entry bytes must hash (BLAKE2b) to the source's, else the run stops with an error. Then
``--warmup`` untimed and ``--iters`` timed iterations, each engine iteration followed by one baseline
iteration of the same bytes (interleaved, so both see the same load). Reported per point: total bytes per
iteration (size x batch), GB/s (10^9 B/s) from the median iteration and from the best one, µs per iteration
(min, median), µs per transfer (= per iteration / batch), the baseline's GB/s and ratio = engine GB/s /
baseline GB/s (both medians).

Processes and backends: ``--backend tcp`` (``BackendType.TCP``; ``rdma`` is accepted and served by the same
TCP transport) with ``--mem cpu|gpu``, and ``--backend xgmi`` (GPU IPC, GPU memory only). A *target*
process (multiprocessing, spawn) creates an engine, registers its buffer and sends the packed engine and
memory descriptors to the *initiator* (this process) over a Pipe; it then stays idle in the pipe until told
to exit (the transfers are one-sided: only the engine's own threads serve them). ``--single-process``
(XGMI only) uses one engine owning both buffers, as MORI's single-process XGMI mode.

Baselines: TCP: a plain socket stream between the same two processes (the target runs a plain TCP server
thread): per iteration the initiator sends size x batch bytes with ``sendall`` and waits for a 1-byte ack
(write), or the target sends them (read), received with ``recv_into`` a preallocated buffer (goal: ratio
>= 0.8 at >= 1 MiB); its buffers are host memory also with ``--mem gpu``, so that ratio includes the
engine's GPU staging. GPU IPC: ``dst.copy_(src)`` (cudaMemcpyAsync) of size x batch bytes between two
device buffers in the initiator, synchronized and timed the same way (goal: ratio >= 0.9 at >= 1 MiB).
``--latency`` adds the small-message latency section (8 B ... 4 KiB, batch 1, ``--latency-iters``).

    python bench/io_bench.py --backend tcp --mem cpu --max-size 64MiB --json io.json
    python bench/io_bench.py --backend xgmi --op write --api session --batch 1,64 --latency --plot io.png

torch is needed only for GPU memory (where it is installed, the header names the GPUs through it);
matplotlib only for ``--plot``. Bad flags and impossible combinations exit with status 1 and one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, MemoryLocationType,
                              RdmaBackendConfig, StatusCode, TcpBackendConfig, XgmiBackendConfig, wait_all)  # fmt: skip

KIB, MIB = 1 << 10, 1 << 20
GOALS = {"socket": 0.8, "copy": 0.9}  # the ratio each baseline's goal asks for, at messages >= GOAL_MIN_SIZE
GOAL_MIN_SIZE = MIB
LATENCY_SIZES = (8, 4 * KIB)  # the latency section: 8 B ... 4 KiB, x2, batch 1
START_TIMEOUT_S = 120  # the target process's start (spawn, torch import, CUDA init)


class BenchError(Exception):
    """A problem the user can act on: printed as one line, exit status 1, no traceback."""


# ---- command line ----------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2; this CLI reports every bad input with exit status 1
        self.print_usage(sys.stderr)
        raise BenchError(message)


def parse_bytes(text: str) -> int:
    """``"4096"``, ``"64K"``/``"64KiB"``, ``"1M"``/``"1MiB"``, ``"1G"`` (binary units) -> bytes (> 0)."""
    units = {"": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": 1 << 30, "gib": 1 << 30, "b": 1}
    word = text.strip().lower()
    digits = word.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = word[len(digits) :]
    if not digits.isdigit() or unit not in units:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 8, 64K, 1MiB)")
    value = int(digits) * units[unit]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a byte count must be positive")
    return value


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of batch sizes") from None
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes must be >= 1")
    return batches


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="io_bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("what to move")
    g.add_argument("--backend", choices=("tcp", "rdma", "xgmi"), default="tcp",
                   help="tcp (rdma: the same TCP transport under BackendType.RDMA) or xgmi (GPU IPC)")
    g.add_argument("--mem", choices=("cpu", "gpu"),
                   help="memory on both sides (default: cpu for tcp/rdma, gpu for xgmi)")
    g.add_argument("--op", choices=("read", "write", "both"), default="both")
    g.add_argument("--api", choices=("engine", "session", "both"), default="both")
    g.add_argument("--issue", choices=("batch", "single", "both"), default="batch",
                   help="one batch op per iteration, or one single op per entry (MORI without --enable-batch-transfer)")
    g.add_argument("--contiguous", action="store_true", help="entries back to back (default: strided i*(size+1))")
    g = ap.add_argument_group("sweep")
    g.add_argument("--start-size", type=parse_bytes, default=8, help="smallest message (default 8)")
    g.add_argument("--max-size", type=parse_bytes, default=64 * MIB, help="largest message (default 64MiB)")
    g.add_argument("--size-factor", type=int, choices=(2, 4), default=2, help="message size step (x2 or x4)")
    g.add_argument("--batch", type=parse_batches, help="batch sizes, comma-separated (default 1)")
    g.add_argument("--batch-sweep", action="store_true", help="batch 1 ... --batch-max, x2")
    g.add_argument("--batch-max", type=positive, help="with --batch-sweep: the largest batch (default 4096)")
    g.add_argument("--max-total", type=parse_bytes, default=256 * MIB,
                   help="skip points moving more than this per iteration (default 256MiB; the buffers are this big)")
    g.add_argument("--iters", type=positive, default=20, help="timed iterations per point (default 20)")
    g.add_argument("--warmup", type=non_negative, default=2, help="untimed iterations per point (default 2)")
    g.add_argument("--latency", action="store_true", help="add the latency section: 8 B ... 4 KiB, batch 1")
    g.add_argument("--latency-iters", type=positive, help="with --latency: iterations per point (default 200)")
    g.add_argument("--timeout-s", type=positive, default=120, help="bound on each validation and control step")
    g = ap.add_argument_group("backend")
    g.add_argument("--host", default="127.0.0.1", help="address both engines (and the plain socket) listen on")
    g.add_argument("--num-connections", type=positive, help="TCP: sockets per remote engine (default 1)")
    g.add_argument("--notify", action="store_true", help="TCP: send target notifications (MORI's bench: off)")
    g.add_argument("--num-streams", type=positive, help="XGMI: copy streams per device (default 64)")
    g.add_argument("--num-events", type=positive, help="XGMI: events per device (default 64)")
    g.add_argument("--src-gpu", type=int, help="GPU memory: the initiator's device (default 0)")
    g.add_argument("--dst-gpu", type=int, help="GPU memory: the target's device (default 1 if there are two GPUs "
                                               "and the backend is xgmi, else 0)")  # fmt: skip
    g.add_argument("--single-process", action="store_true", help="XGMI: one engine owning both buffers")
    g = ap.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the results and a header (machine, config, versions)")
    g.add_argument("--plot", metavar="PATH", help="write a PNG of GB/s vs message size (needs matplotlib)")
    return ap  # fmt: skip


@dataclasses.dataclass
class Config:
    """The checked command line, with the sweep expanded."""

    args: argparse.Namespace
    ops: list[str]
    apis: list[str]
    issues: list[str]
    sizes: list[int]
    batches: list[int]

    def __getattr__(self, name):  # the flags themselves: cfg.backend, cfg.iters, ...
        if name == "args":
            raise AttributeError(name)
        return getattr(self.args, name)

    @property
    def gpu(self) -> bool:
        return self.args.mem == "gpu"

    @property
    def baseline(self) -> str:
        return "copy" if self.args.backend == "xgmi" else "socket"


def _both(value: str, pair: tuple[str, str]) -> list[str]:
    return list(pair) if value == "both" else [value]


def geometric(start: int, stop: int, factor: int) -> list[int]:
    values = []
    while start <= stop:
        values.append(start)
        start *= factor
    return values


def refuse_combinations(args: argparse.Namespace) -> None:
    """Impossible combinations, and flags that would be ignored, are errors naming the flags."""
    xgmi = args.backend == "xgmi"
    if xgmi and args.mem == "cpu":
        raise BenchError("--backend xgmi copies between GPUs by IPC: it needs --mem gpu (CPU memory: --backend tcp)")
    if args.single_process and not xgmi:
        raise BenchError("--single-process is XGMI's mode (one engine owning both GPU buffers); the TCP "
                         "backend always uses a target process")  # fmt: skip
    gpu = args.mem == "gpu" or (args.mem is None and xgmi)
    for flag, given, applies, needs in (
        ("--num-connections", args.num_connections is not None, not xgmi, "a TCP option: --backend tcp or rdma"),
        ("--notify", args.notify, not xgmi, "a TCP option: --backend tcp or rdma"),
        ("--num-streams", args.num_streams is not None, xgmi, "an XGMI option: --backend xgmi"),
        ("--num-events", args.num_events is not None, xgmi, "an XGMI option: --backend xgmi"),
        ("--src-gpu", args.src_gpu is not None, gpu, "it needs --mem gpu"),
        ("--dst-gpu", args.dst_gpu is not None, gpu, "it needs --mem gpu"),
        ("--batch-max", args.batch_max is not None, args.batch_sweep, "it needs --batch-sweep"),
        ("--latency-iters", args.latency_iters is not None, args.latency, "it needs --latency"),
    ):  # fmt: skip
        if given and not applies:
            raise BenchError(f"{flag} does not apply to this run ({needs})")
    if args.start_size > args.max_size:
        raise BenchError(f"--start-size {args.start_size} is larger than --max-size {args.max_size}")
    if args.batch is not None and args.batch_sweep:
        raise BenchError("give either --batch LIST or --batch-sweep, not both")


def fill_defaults(args: argparse.Namespace) -> None:
    """The defaults that depend on other flags (recorded in the JSON header as used)."""
    xgmi = args.backend == "xgmi"
    args.mem = args.mem or ("gpu" if xgmi else "cpu")
    if xgmi:
        args.num_streams, args.num_events = args.num_streams or 64, args.num_events or 64
    else:
        args.num_connections = args.num_connections or 1
    args.batch_max = args.batch_max or 4096
    args.latency_iters = args.latency_iters or 200


def check_outputs(args: argparse.Namespace) -> None:
    from mori_compiler.runtime.extras import is_installed, missing_text

    if args.plot and not is_installed("matplotlib"):
        raise BenchError(f"--plot needs matplotlib: {missing_text(['matplotlib'])}, or drop --plot")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise BenchError(f"{flag} {path}: the directory {Path(path).resolve().parent} does not exist")


def check_config(args: argparse.Namespace) -> Config:
    """The checked config with the sweep expanded (BenchError for a bad combination)."""
    refuse_combinations(args)
    fill_defaults(args)
    check_outputs(args)
    batches = geometric(1, args.batch_max, 2) if args.batch_sweep else (args.batch or [1])
    return Config(args, _both(args.op, ("read", "write")), _both(args.api, ("engine", "session")),
                  _both(args.issue, ("batch", "single")), geometric(args.start_size, args.max_size, args.size_factor),
                  batches)  # fmt: skip


def load_torch_gpus(cfg: Config):
    """torch, after checking that the GPUs the config names exist; fills the default devices."""
    if importlib.util.find_spec("torch") is None:
        raise BenchError(f"--mem gpu needs torch, which is not installed here (--backend {cfg.backend})")
    import torch

    if not torch.cuda.is_available():
        raise BenchError("--mem gpu: no GPU is visible (torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    if cfg.args.src_gpu is None:
        cfg.args.src_gpu = 0
    if cfg.args.dst_gpu is None:
        cfg.args.dst_gpu = 1 if cfg.backend == "xgmi" and count > 1 else 0
    for flag, device in (("--src-gpu", cfg.src_gpu), ("--dst-gpu", cfg.dst_gpu)):
        if not 0 <= device < count:
            raise BenchError(f"{flag} {device}: this machine has {count} visible GPU(s) (0 ... {count - 1})")
    return torch


# ---- the sweep ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Point:
    section: str  # "bandwidth" or "latency"
    op: str
    api: str
    issue: str
    contiguous: bool
    size: int
    batch: int
    iters: int

    @property
    def total(self) -> int:
        return self.size * self.batch

    @property
    def layout(self) -> str:
        return "contiguous" if self.contiguous else "strided"


def entry_offsets(size: int, batch: int, contiguous: bool) -> list[int]:
    """The entries' offsets, the same on both sides: back to back, or a 1-byte gap between entries (MORI's
    strided layout), so no two entries can be merged into one transfer."""
    stride = size if contiguous else size + 1
    return [i * stride for i in range(batch)]


def span(size: int, batch: int, contiguous: bool) -> int:
    return entry_offsets(size, batch, contiguous)[-1] + size


def plan_points(cfg: Config) -> tuple[list[Point], list[dict]]:
    """The points to measure (the bandwidth sweep, then the latency section) and the ones over --max-total."""
    modes = [(op, api, issue) for op in cfg.ops for api in cfg.apis for issue in cfg.issues]
    points, skipped = [], []
    for op, api, issue in modes:
        for batch in cfg.batches:
            for size in cfg.sizes:
                point = Point("bandwidth", op, api, issue, cfg.contiguous, size, batch, cfg.iters)
                if point.total > cfg.max_total:
                    skipped.append({"op": op, "api": api, "issue": issue, "size": size, "batch": batch,
                                    "reason": f"size x batch > --max-total {cfg.max_total}"})  # fmt: skip
                else:
                    points.append(point)
    if cfg.latency:
        points += [Point("latency", op, api, issue, cfg.contiguous, size, 1, cfg.latency_iters)
                   for op, api, issue in modes for size in geometric(*LATENCY_SIZES, 2)]  # fmt: skip
    if not points:
        raise BenchError(f"every point moves more than --max-total {cfg.max_total} bytes per iteration")
    return points, skipped


# ---- buffers -------------------------------------------------------------------------------------------------


class HostBuffer:
    """CPU memory: a bytearray (registers with ``register_memory``; no torch needed)."""

    def __init__(self, nbytes: int):
        self.data = bytearray(nbytes)

    def register(self, engine: IOEngine) -> MemoryDesc:
        return engine.register_memory(self.data, len(self.data), -1, MemoryLocationType.CPU)

    def fill_random(self, nbytes: int) -> None:
        self.data[:nbytes] = os.urandom(nbytes)

    def digest(self, offsets: list[int], size: int) -> str:
        view = memoryview(self.data)
        return _digest(view[o : o + size] for o in offsets)


class DeviceBuffer:
    """GPU memory: a uint8 torch tensor on one device (registers with ``register_torch_tensor``)."""

    def __init__(self, nbytes: int, device: int):
        import torch

        self.torch, self.device = torch, torch.device("cuda", device)
        self.data = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)

    def register(self, engine: IOEngine) -> MemoryDesc:
        return engine.register_torch_tensor(self.data)

    def fill_random(self, nbytes: int) -> None:
        torch = self.torch
        self.data[:nbytes] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=self.device)
        torch.cuda.synchronize(self.device)

    def digest(self, offsets: list[int], size: int) -> str:
        self.torch.cuda.synchronize(self.device)
        host = memoryview(self.data[: offsets[-1] + size].cpu().numpy()).cast("B")
        return _digest(host[o : o + size] for o in offsets)


def _digest(pieces) -> str:
    h = hashlib.blake2b(digest_size=16)
    for piece in pieces:
        h.update(piece)
    return h.hexdigest()


def make_buffer(mem: str, nbytes: int, device):
    return DeviceBuffer(nbytes, device) if mem == "gpu" else HostBuffer(nbytes)


# ---- engines -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What both processes need to build their engine and buffer (pickled to the target process)."""

    backend: str
    mem: str
    host: str
    nbytes: int
    num_connections: int | None
    notify: bool
    num_streams: int | None
    num_events: int | None


def backend_config(spec: EngineSpec):
    """(BackendType, its config) for the benchmark's one backend."""
    if spec.backend == "xgmi":
        return BackendType.XGMI, XgmiBackendConfig(spec.num_streams, spec.num_events)
    if spec.backend == "rdma":  # served by the TCP transport; MORI's benchmark runs RDMA without notifications
        return BackendType.RDMA, RdmaBackendConfig(qp_per_transfer=spec.num_connections,
                                                   enable_notification=spec.notify)  # fmt: skip
    return BackendType.TCP, TcpBackendConfig(num_connections=spec.num_connections, enable_notification=spec.notify)


def make_engine(key: str, spec: EngineSpec) -> IOEngine:
    """An engine with the benchmark's one backend (the engine's errors become BenchError)."""
    engine = IOEngine(key, IOEngineConfig(spec.host, 0))
    try:
        engine.create_backend(*backend_config(spec))
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        engine.close()
        raise BenchError(f"engine {key!r}: creating the {spec.backend} backend failed: {exc}") from None
    return engine


def register(engine: IOEngine, buffer, what: str) -> MemoryDesc:
    try:
        return buffer.register(engine)
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        raise BenchError(f"registering the {what} buffer failed: {exc}") from None


# ---- the plain-socket baseline ---------------------------------------------------------------------------

_HEADER = struct.Struct("<cQ")  # op (b"W" write, b"R" read, b"Q" quit), byte count


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("the peer closed the plain socket")
        view = view[n:]


class PlainSocketServer:
    """The target's side of the socket baseline: one connection, served by one thread (idle, blocked in
    ``recv``, while the engine transfers run)."""

    def __init__(self, host: str, nbytes: int):
        self.buffer = memoryview(bytearray(nbytes))
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, name="io-bench-plain-socket", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = memoryview(bytearray(_HEADER.size))
        with sock:
            try:
                while True:
                    _recv_exact(sock, header)
                    op, nbytes = _HEADER.unpack(header)
                    if op == b"W":
                        _recv_exact(sock, self.buffer[:nbytes])
                        sock.sendall(b"\x01")
                    elif op == b"R":
                        sock.sendall(self.buffer[:nbytes])
                    else:
                        return
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


class SocketBaseline:
    """The initiator's side: one iteration moves ``nbytes`` over the plain socket (write: sendall + 1-byte
    ack; read: the target sends, ``recv_into`` a preallocated buffer)."""

    name = "plain TCP socket"

    def __init__(self, host: str, port: int, nbytes: int, timeout_s: float):
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise BenchError(f"the plain-socket baseline cannot connect to {host}:{port}: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = memoryview(bytearray(nbytes))
        self.ack = memoryview(bytearray(1))

    def run(self, op: str, nbytes: int) -> None:
        self.sock.sendall(_HEADER.pack(b"W" if op == "write" else b"R", nbytes))
        if op == "write":
            self.sock.sendall(self.buffer[:nbytes])
            _recv_exact(self.sock, self.ack)
        else:
            _recv_exact(self.sock, self.buffer[:nbytes])

    def close(self) -> None:
        try:
            self.sock.sendall(_HEADER.pack(b"Q", 0))
        except OSError:
            pass
        self.sock.close()


class CopyBaseline:
    """The GPU-IPC baseline: ``dst.copy_(src)`` (cudaMemcpyAsync / peer copy) of ``nbytes`` between two
    device buffers of the initiator on the initiator's and the target's devices, then synchronize."""

    name = "cudaMemcpyAsync (torch copy_)"

    def __init__(self, torch, nbytes: int, local_device: int, remote_device: int):
        self.torch = torch
        self.local = torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", local_device))
        self.remote = torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", remote_device))
        self.devices = sorted({local_device, remote_device})

    def run(self, op: str, nbytes: int) -> None:
        src, dst = (self.local, self.remote) if op == "write" else (self.remote, self.local)
        dst[:nbytes].copy_(src[:nbytes])
        for device in self.devices:
            self.torch.cuda.synchronize(device)

    def close(self) -> None:
        pass


# ---- the target ------------------------------------------------------------------------------------------


def target_main(conn, spec: EngineSpec, device, baseline_bytes: int) -> None:
    """The target process: engine, registered buffer, plain-socket server; ships its descriptors, then
    answers digest requests (between points, never during one) until told to exit."""
    engine = server = None
    try:
        if spec.mem == "gpu":
            import torch

            torch.cuda.set_device(device)
        engine = make_engine("io-bench-target", spec)
        buffer = make_buffer(spec.mem, spec.nbytes, device)
        buffer.fill_random(spec.nbytes)
        memory = register(engine, buffer, "target")
        server = PlainSocketServer(spec.host, baseline_bytes) if baseline_bytes else None
        conn.send(("ready", engine.get_engine_desc().pack(), memory.pack(), server.port if server else None))
        engine.register_remote_engine(EngineDesc.unpack(conn.recv()))
        while True:
            request = conn.recv()
            if request[0] != "digest":
                return
            conn.send(("digest", buffer.digest(entry_offsets(*request[1:]), request[1])))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception as exc:  # reported by the initiator as one line
        try:
            conn.send(("error", str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        if server is not None:
            server.close()
        if engine is not None:
            engine.close()


class RemoteTarget:
    """The initiator's handle on the target process."""

    def __init__(self, spec: EngineSpec, device, baseline_bytes: int, timeout_s: float):
        self.timeout_s = timeout_s
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target_main, args=(child, spec, device, baseline_bytes), daemon=True)
        self.proc.start()
        child.close()
        try:
            _, engine_bytes, memory_bytes, self.baseline_port = self._answer("ready", START_TIMEOUT_S)
        except BenchError:
            self.close()
            raise
        self.engine_desc, self.memory = EngineDesc.unpack(engine_bytes), MemoryDesc.unpack(memory_bytes)

    def _answer(self, kind: str, timeout_s: float):
        if not self.conn.poll(timeout_s):
            raise BenchError(f"the target process did not answer within {timeout_s} s")
        try:
            reply = self.conn.recv()
        except EOFError:
            raise BenchError(f"the target process exited (status {self.proc.exitcode})") from None
        if reply[0] == "error":
            raise BenchError(f"target process: {reply[1]}")
        if reply[0] != kind:
            raise BenchError(f"the target process answered {reply[0]!r} where {kind!r} was expected")
        return reply

    def introduce(self, engine_desc: EngineDesc) -> None:
        self.conn.send(engine_desc.pack())

    def digest(self, size: int, batch: int, contiguous: bool) -> str:
        self.conn.send(("digest", size, batch, contiguous))
        return self._answer("digest", self.timeout_s)[1]

    def close(self) -> None:
        try:
            self.conn.send(("exit",))
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


class LocalTarget:
    """XGMI --single-process: the destination buffer is registered on the initiator's own engine."""

    baseline_port = None

    def __init__(self, engine: IOEngine, spec: EngineSpec, device: int):
        self.buffer = make_buffer(spec.mem, spec.nbytes, device)
        self.buffer.fill_random(spec.nbytes)
        self.memory = register(engine, self.buffer, "destination")
        self.engine_desc = engine.get_engine_desc()

    def introduce(self, engine_desc: EngineDesc) -> None:
        pass

    def digest(self, size: int, batch: int, contiguous: bool) -> str:
        return self.buffer.digest(entry_offsets(size, batch, contiguous), size)

    def close(self) -> None:
        pass


# ---- one point -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Initiator:
    engine: IOEngine
    buffer: object
    local: MemoryDesc
    remote: MemoryDesc
    sessions: dict = dataclasses.field(default_factory=dict)

    def session(self):
        if "session" not in self.sessions:
            try:
                session = self.engine.create_session(self.local, self.remote)
            except RuntimeError as exc:
                raise BenchError(f"create_session failed: {exc}") from None
            if session is None:
                raise BenchError("create_session returned None: no backend handles this memory pair")
            self.sessions["session"] = session
        return self.sessions["session"]


def issuer(init: Initiator, point: Point):
    """A function that issues one iteration's transfers and returns their statuses (the argument lists are
    built once, outside the timing)."""
    offsets = entry_offsets(point.size, point.batch, point.contiguous)
    sizes = [point.size] * point.batch
    engine, local, remote, size = init.engine, init.local, init.remote, point.size
    uid = engine.allocate_transfer_uid
    if point.api == "engine":
        if point.issue == "batch":
            batch_op = engine.batch_write if point.op == "write" else engine.batch_read
            return lambda: batch_op([local], [offsets], [remote], [offsets], [sizes], [uid()])
        single = engine.write if point.op == "write" else engine.read
        return lambda: [single(local, o, remote, o, size, uid()) for o in offsets]
    session = init.session()
    if point.issue == "batch":
        batch_op = session.batch_write if point.op == "write" else session.batch_read
        return lambda: [batch_op(offsets, offsets, sizes, uid())]
    single = session.write if point.op == "write" else session.read
    return lambda: [single(o, o, size, uid()) for o in offsets]


def issue_checked(issue, what: str) -> list:
    """``issue()``, with the engine's synchronous errors (a target that cannot be reached, ...) as BenchError."""
    try:
        return issue()
    except (RuntimeError, ValueError, TypeError) as exc:
        raise BenchError(f"{what}: issuing the transfers failed: {exc}") from None


def check_statuses(statuses, code: StatusCode, what: str, timeout_s=None) -> None:
    if code is StatusCode.SUCCESS:
        return
    if code is StatusCode.IN_PROGRESS:
        raise BenchError(f"{what}: the transfers did not complete within {timeout_s} s")
    bad = next((s for s in statuses if s.Code() is not StatusCode.SUCCESS), None)
    raise BenchError(f"{what}: transfer failed with {code.name}: {bad.Message() if bad else ''}")


def describe(point: Point) -> str:
    return f"{point.op} {point.api}/{point.issue} {point.layout} size {human(point.size)} batch {point.batch}"


def validate(init: Initiator, target, point: Point, issue, timeout_s: float) -> None:
    """One transfer of fresh random source bytes; the destination's entries must hash to the source's."""
    offsets = entry_offsets(point.size, point.batch, point.contiguous)
    nbytes = span(point.size, point.batch, point.contiguous)
    # The initiator's buffer is the source of a write and the destination of a read: fresh random bytes make
    # a write's source new to the target, and a read's destination unequal to the target's bytes until it lands.
    init.buffer.fill_random(nbytes)
    what = f"validation of {describe(point)}"
    statuses = issue_checked(issue, what)
    check_statuses(statuses, wait_all(statuses, int(timeout_s * 1000)), what, timeout_s)
    local = init.buffer.digest(offsets, point.size)
    remote = target.digest(point.size, point.batch, point.contiguous)
    if local != remote:
        source, dest = ("initiator", "target") if point.op == "write" else ("target", "initiator")
        raise BenchError(f"validation FAILED for {describe(point)}: after one {point.op}, the {dest}'s entry bytes "
                         f"differ from the {source}'s (BLAKE2b {local} vs {remote})")  # fmt: skip


def measure(point: Point, issue, baseline, warmup: int) -> tuple[list[float], list[float]]:
    """Interleaved timing: each engine iteration (issue + wait all) is followed by one baseline iteration of
    the same bytes. Seconds per iteration, engine and baseline."""

    what = describe(point)

    def engine_iteration():  # wait_all without a deadline, as MORI's Wait(): a bounded wait would poll
        statuses = issue_checked(issue, what)  # GPU-IPC events only every millisecond
        check_statuses(statuses, wait_all(statuses), what)

    def baseline_iteration():
        baseline.run(point.op, point.total)

    for _ in range(warmup):
        engine_iteration()
        baseline_iteration()
    engine_times, baseline_times = [], []
    clock = time.perf_counter
    for _ in range(point.iters):
        t0 = clock()
        engine_iteration()
        t1 = clock()
        baseline_iteration()
        t2 = clock()
        engine_times.append(t1 - t0)
        baseline_times.append(t2 - t1)
    return engine_times, baseline_times


def summarize(seconds: list[float], total: int, batch: int) -> dict:
    """GB/s (10^9 B/s) from the median and from the best iteration; µs per iteration and per transfer."""
    best, median = min(seconds), statistics.median(seconds)
    return {"GBps_median": total / median / 1e9, "GBps_best": total / best / 1e9,
            "us_per_iter_min": best * 1e6, "us_per_iter_median": median * 1e6,
            "us_per_transfer_min": best * 1e6 / batch, "us_per_transfer_median": median * 1e6 / batch}  # fmt: skip


def run_point(init: Initiator, target, point: Point, baseline, cfg: Config) -> dict:
    issue = issuer(init, point)
    validate(init, target, point, issue, cfg.timeout_s)
    engine_times, baseline_times = measure(point, issue, baseline, cfg.warmup)
    engine = summarize(engine_times, point.total, point.batch)
    base = summarize(baseline_times, point.total, point.batch)
    return {"section": point.section, "op": point.op, "api": point.api, "issue": point.issue, "layout": point.layout,
            "size": point.size, "batch": point.batch, "total_bytes": point.total, "iters": point.iters,
            "validated": True, "engine": engine, "baseline": dict(base, kind=cfg.baseline),
            "ratio": engine["GBps_median"] / base["GBps_median"]}  # fmt: skip


# ---- setup and the run -------------------------------------------------------------------------------------


def engine_spec(cfg: Config, nbytes: int) -> EngineSpec:
    return EngineSpec(cfg.backend, cfg.mem, cfg.host, nbytes, cfg.num_connections, cfg.notify, cfg.num_streams,
                      cfg.num_events)  # fmt: skip


def run_all(cfg: Config, points: list[Point], torch) -> list[dict]:
    """Build the target, the initiator and the baseline, run every point, tear everything down."""
    nbytes = max(span(p.size, p.batch, p.contiguous) for p in points)
    baseline_bytes = max(p.total for p in points)
    spec = engine_spec(cfg, nbytes)
    engine = target = baseline = None
    try:
        if cfg.gpu:
            torch.cuda.set_device(cfg.src_gpu)
        engine = make_engine("io-bench-initiator", spec)
        if cfg.single_process:
            target = LocalTarget(engine, spec, cfg.dst_gpu)
        else:
            target = RemoteTarget(spec, cfg.dst_gpu, baseline_bytes if cfg.baseline == "socket" else 0, cfg.timeout_s)
            engine.register_remote_engine(target.engine_desc)
            target.introduce(engine.get_engine_desc())
        buffer = make_buffer(cfg.mem, nbytes, cfg.src_gpu)
        init = Initiator(engine, buffer, register(engine, buffer, "initiator"), target.memory)
        if cfg.baseline == "socket":
            baseline = SocketBaseline(cfg.host, target.baseline_port, baseline_bytes, cfg.timeout_s)
        else:
            baseline = CopyBaseline(torch, baseline_bytes, cfg.src_gpu, cfg.dst_gpu)
        results = []
        for point in points:
            results.append(run_point(init, target, point, baseline, cfg))
            print_row(results[-1], first=len(results) == 1 or results[-2]["section"] != point.section)
        return results
    except OSError as exc:
        raise BenchError(f"socket error: {exc}") from None
    finally:
        if baseline is not None:
            baseline.close()
        if target is not None:
            target.close()
        if engine is not None:
            engine.close()


# ---- reporting -------------------------------------------------------------------------------------------


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def machine_info(torch) -> dict:
    info = {"hostname": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if torch is not None and torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        info["gpus"] = []
    return info


def versions(torch) -> dict:
    found = {"python": platform.python_version()}
    for package in ("mori_compiler", "msgpack"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    try:
        found["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                      capture_output=True, text=True, timeout=10).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        found["git"] = None
    if torch is not None:
        found["torch"], found["cuda"] = torch.__version__, torch.version.cuda
    return found


def header(cfg: Config, torch) -> dict:
    """Machine (GPU names through torch where it is installed, even for CPU runs), config, versions."""
    if torch is None and importlib.util.find_spec("torch") is not None:
        import torch
    config = dict(vars(cfg.args), sizes=cfg.sizes, batches=cfg.batches, baseline=cfg.baseline)
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_info(torch),
            "config": config, "versions": versions(torch),
            "measurement": "one iteration = issue the batch + wait all (perf_counter); GB/s = 10^9 B/s from the "
                           "median (GBps_median) and the fastest (GBps_best) iteration; us_per_transfer = "
                           "us_per_iter / batch; baseline iterations interleaved with the engine's; "
                           "ratio = engine GBps_median / baseline GBps_median"}  # fmt: skip


def print_header(head: dict, cfg: Config) -> None:
    m = head["machine"]
    gpus = ", ".join(m["gpus"]) or "no GPU"
    mode = "single process" if cfg.single_process else "two processes"
    print(f"{m['hostname']}: {m['cpu_count']} CPUs, {gpus}; MORI-IO {cfg.backend} backend, {cfg.mem} memory, {mode}; "
          f"baseline {'plain TCP socket' if cfg.baseline == 'socket' else 'cudaMemcpyAsync'}; "
          f"{cfg.iters} iters (+{cfg.warmup} warm-up), validated; GB/s = 10^9 B/s of the median iteration")  # fmt: skip


_COLUMNS = (("op", 6), ("api", 8), ("issue", 7), ("layout", 11), ("size", 8), ("batch", 6), ("total", 9),
            ("GB/s med", 9), ("GB/s best", 10), ("us/iter min", 12), ("us/iter med", 12), ("us/xfer med", 12),
            ("base GB/s", 10), ("base us med", 12), ("ratio", 7))  # fmt: skip


def print_row(r: dict, first: bool) -> None:
    if first:
        print(f"\n[{r['section']}]")
        print("".join(f"{name:>{width}}" for name, width in _COLUMNS))
    e, b = r["engine"], r["baseline"]
    cells = (r["op"], r["api"], r["issue"], r["layout"], human(r["size"]), r["batch"], human(r["total_bytes"]),
             f"{e['GBps_median']:.3f}", f"{e['GBps_best']:.3f}", f"{e['us_per_iter_min']:.1f}",
             f"{e['us_per_iter_median']:.1f}", f"{e['us_per_transfer_median']:.2f}", f"{b['GBps_median']:.3f}",
             f"{b['us_per_iter_median']:.1f}", f"{r['ratio']:.2f}")  # fmt: skip
    print("".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, _COLUMNS)), flush=True)


def goal_summary(results: list[dict], baseline: str) -> dict:
    target = GOALS[baseline]
    judged = [r for r in results if r["section"] == "bandwidth" and r["size"] >= GOAL_MIN_SIZE]
    met = [r for r in judged if r["ratio"] >= target]
    return {"ratio": target, "min_size": GOAL_MIN_SIZE, "points": len(judged), "met": len(met),
            "min_ratio": min((r["ratio"] for r in judged), default=None)}  # fmt: skip


def plot(results: list[dict], path: str, title: str, baseline_name: str) -> None:
    """GB/s vs message size (log2 x): one solid line per engine series, one dashed per baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    rows = [r for r in results if r["section"] == "bandwidth"]
    series, baselines = {}, {}
    for r in rows:
        series.setdefault((r["op"], r["api"], r["issue"], r["layout"], r["batch"]), []).append(r)
        baselines.setdefault((r["op"], r["batch"]), {}).setdefault(r["size"], []).append(r["baseline"]["GBps_median"])
    for (op, api, issue, layout, batch), points in series.items():
        ax.plot([p["size"] for p in points], [p["engine"]["GBps_median"] for p in points], marker="o",
                label=f"MORI-IO {op}, {api} API ({issue}), {layout}, batch {batch}")  # fmt: skip
    for (op, batch), by_size in baselines.items():
        sizes = sorted(by_size)
        ax.plot(sizes, [statistics.median(by_size[s]) for s in sizes], ls="--",
                label=f"{baseline_name} {op} batch {batch}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s (10^9 B/s, median iteration)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    try:
        cfg = check_config(build_parser().parse_args(argv))
        torch = load_torch_gpus(cfg) if cfg.gpu else None
        points, skipped = plan_points(cfg)
        head = header(cfg, torch)
        print_header(head, cfg)
        results = run_all(cfg, points, torch)
    except BenchError as exc:
        print(f"io_bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("io_bench: interrupted", file=sys.stderr)
        return 130
    goal = goal_summary(results, cfg.baseline)
    if skipped:
        print(f"\n{len(skipped)} point(s) skipped: size x batch > --max-total {human(cfg.max_total)}")
    verdict = (f"met at {goal['met']} of {goal['points']} point(s), lowest {goal['min_ratio']:.2f}" if goal["points"]
               else "no bandwidth point in this sweep")  # fmt: skip
    print(f"goal: ratio >= {goal['ratio']} at messages >= {human(GOAL_MIN_SIZE)}: {verdict}")
    if cfg.json:
        document = {"benchmark": "io_bench", "header": head, "points": results, "skipped": skipped, "goal": goal}
        Path(cfg.json).write_text(json.dumps(document, indent=1))
    if cfg.plot:
        baseline_name = "plain socket" if cfg.baseline == "socket" else "cudaMemcpyAsync"
        plot(results, cfg.plot, f"MORI-IO {cfg.backend} ({cfg.mem} memory) vs {baseline_name}", baseline_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
