"""Prefill -> decode KV-cache transfer with MORI-IO, in two processes on one machine.

    python examples/io/kv_transfer.py                      # GPU if torch sees one, else CPU memory
    python examples/io/kv_transfer.py --device numpy       # CPU memory, no torch needed (what CI runs)
    python examples/io/kv_transfer.py --device cuda --backend xgmi --api engine

This is the shape in which serving systems use MORI-IO. The *decode* process (this one) owns a paged
KV cache, ``layers x blocks x block_tokens x heads x head_dim`` bf16 values, and gives a request some free
block slots. The *prefill* process (spawned) computes the request's KV blocks and writes them straight into
those slots of decode's cache: one-sided, decode's code takes no part in the copy. Only descriptors travel
between the processes (``pack()`` bytes over a multiprocessing Pipe), never the data.

A block of one layer is contiguous in the cache, but the blocks of successive layers are ``blocks`` blocks
apart, so the write is one batch of strided entries: one per (layer, block).

Decode then checks its cache: every written block must hash to what prefill computed (prefill sends one
SHA-256 per entry) and every other block must still hold the fill value. Exit 0 on success, 1 with a
message naming the layer and slot on any mismatch or failure (``--self-check-corrupt`` flips one byte
after the transfer to show that the check can fail).

Memory (``--device``): ``cuda`` (torch bf16 tensors on a GPU), ``cpu`` (torch bf16 tensors in CPU memory)
or ``numpy`` (NumPy arrays holding the bf16 bit patterns; the engine moves bytes, so that is the same
transfer without torch). Backends (``--backend``): ``tcp`` (sockets; CPU or GPU memory), ``xgmi``
(GPU-IPC: GPU memory only) or ``auto`` (TCP, plus GPU-IPC on a GPU; the engine picks GPU-IPC for a GPU
pair on one node). The MORI-IO guide in docs/ describes the API, the backends and the protocols.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import multiprocessing
import sys
import time

import numpy as np

from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, MemoryLocationType,
                              StatusCode, TcpBackendConfig, XgmiBackendConfig, wait_all)  # fmt: skip

HOST = "127.0.0.1"  # both engines on this machine: the TCP backend listens on loopback only
EMPTY_VALUE = -7.0  # decode's fill value: outside [-1, 1), the range of the computed K/V values
BF16_BYTES = 2
NOTICE_WAIT_S = 2.0  # --backend auto: how long to wait for a TCP notice before concluding GPU-IPC was used


class Failure(Exception):
    """A check or a step failed: the message is printed and the example exits 1."""


class UsageError(Failure):
    """A bad option (exit 1 as well: 2 means an internal error in this project's tools)."""


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    blocks: int
    block_tokens: int
    heads: int
    head_dim: int
    slots: tuple
    device: str
    backend: str
    api: str
    seed: int
    timeout_s: float
    decode_gpu: int
    prefill_gpu: int
    corrupt: str | None

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.heads * self.head_dim * BF16_BYTES

    def entries(self) -> list:
        """(layer, i, prefill offset, decode offset) of every entry of the write: block i of the request
        (prefill's tensor is ``layers x len(slots) x ...``) goes to block slot ``slots[i]`` of decode's cache."""
        n = len(self.slots)
        return [(layer, i, (layer * n + i) * self.block_bytes, (layer * self.blocks + slot) * self.block_bytes)
                for layer in range(self.layers) for i, slot in enumerate(self.slots)]  # fmt: skip


# ---- memory: the same few steps for torch tensors (GPU or CPU) and NumPy arrays ------------------------------


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns of float32 values (truncated: both processes compute the same bits)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def to_device(bits: np.ndarray, cfg: Config, gpu: int):
    """A tensor (or array) on ``cfg.device`` holding ``bits`` as bf16 values."""
    if cfg.device == "numpy":
        return bits.copy()
    import torch

    tensor = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    return tensor.to(f"cuda:{gpu}") if cfg.device == "cuda" else tensor.clone()


def host_bytes(memory) -> np.ndarray:
    """The bytes of a tensor or array, on the host, as a flat uint8 array."""
    if isinstance(memory, np.ndarray):
        return memory.view(np.uint8).reshape(-1)
    import torch

    return memory.detach().cpu().view(torch.int16).numpy().view(np.uint8).reshape(-1)


def register(engine: IOEngine, memory) -> MemoryDesc:
    if isinstance(memory, np.ndarray):
        return engine.register_memory(memory, memory.nbytes, -1, MemoryLocationType.CPU)
    return engine.register_torch_tensor(memory)  # a CUDA tensor or a CPU one: the engine reads its device


def flip_byte(memory, index: int) -> None:
    if isinstance(memory, np.ndarray):
        memory.view(np.uint8).reshape(-1)[index] ^= 0xFF
        return
    import torch

    flat = memory.view(torch.uint8).reshape(-1)
    flat[index] = flat[index] ^ 0xFF


def create_engine(key: str, cfg: Config) -> IOEngine:
    """An engine with the backends of ``cfg.backend``. Backends come before any memory is registered: the
    GPU-IPC backend takes a memory's IPC handle when it is registered, and nothing is done retroactively."""
    engine = IOEngine(key, IOEngineConfig(HOST, 0))  # port 0: an ephemeral port, written into the EngineDesc
    if cfg.backend in ("tcp", "auto"):
        engine.create_backend(BackendType.TCP, TcpBackendConfig())
    if cfg.backend == "xgmi" or (cfg.backend == "auto" and cfg.device == "cuda"):
        engine.create_backend(BackendType.XGMI, XgmiBackendConfig())
    return engine


def select_gpu(cfg: Config, gpu: int) -> None:
    if cfg.device == "cuda":
        import torch

        torch.cuda.set_device(gpu)


# ---- prefill (the spawned process, the initiator) ---------------------------------------------------------


def kv_blocks(cfg: Config) -> np.ndarray:
    """The request's KV blocks as prefill computes them: a stand-in for the model, values from the seed."""
    rng = np.random.default_rng(cfg.seed)
    shape = (cfg.layers, len(cfg.slots), cfg.block_tokens, cfg.heads, cfg.head_dim)
    return bf16_bits(rng.uniform(-1.0, 1.0, size=shape))


def prefill_process(conn, cfg: Config) -> None:
    """Entry point of the prefill process: every outcome, failures included, goes back to decode."""
    try:
        result = prefill(conn, cfg)
    except Failure as exc:  # reported by decode, which exits 1
        result = {"error": str(exc)}
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        conn.send(result)
    except OSError:
        sys.exit(1)  # decode is gone: nobody to report to


def prefill(conn, cfg: Config) -> dict:
    select_gpu(cfg, cfg.prefill_gpu)
    if not conn.poll(cfg.timeout_s):
        raise Failure(f"no descriptors from decode within {cfg.timeout_s} s")
    descriptors = conn.recv()
    decode_engine = EngineDesc.unpack(descriptors["engine"])
    decode_cache = MemoryDesc.unpack(descriptors["memory"])

    blocks = to_device(kv_blocks(cfg), cfg, cfg.prefill_gpu)
    with create_engine("prefill", cfg) as engine:
        local = register(engine, blocks)
        engine.register_remote_engine(decode_engine)
        entries = cfg.entries()
        local_offsets = [e[2] for e in entries]
        remote_offsets = [e[3] for e in entries]
        sizes = [cfg.block_bytes] * len(entries)
        uid = engine.allocate_transfer_uid()  # names the transfer to the target (inbound notices)

        # GPU memory: the engine orders the copy after the work queued on the current stream (the blocks
        # were just computed there), so no synchronize is needed before issuing it.
        start = time.perf_counter()  # the first transfer: connection set-up included
        if cfg.api == "session":
            # A session binds one (local, remote) pair to its backend once; serving systems keep it per peer.
            session = engine.create_session(local, decode_cache)
            if session is None:
                raise Failure("no backend can move prefill's memory to decode's (create_session returned None)")
            statuses = [session.batch_write(local_offsets, remote_offsets, sizes, uid)]
        else:  # the engine's batch call: one list of entries (and one status) per memory pair
            statuses = engine.batch_write([local], [local_offsets], [decode_cache], [remote_offsets], [sizes], [uid])
        code = wait_all(statuses, int(cfg.timeout_s * 1000))  # bounded: a lost peer fails, never hangs
        seconds = time.perf_counter() - start
        if code is not StatusCode.SUCCESS:
            detail = "; ".join(s.Message() for s in statuses if s.Message())
            raise Failure(f"batch_write ended with {StatusCode(code).name}: {detail or 'no message'}")

        # What decode must find: a hash of each entry's bytes, read back from prefill's own memory.
        data = host_bytes(blocks)
        digests = [hashlib.sha256(data[off : off + cfg.block_bytes]).hexdigest() for _, _, off, _ in entries]
        nbytes = sum(sizes)
        print(f"prefill: wrote {len(entries)} entries ({cfg.layers} layers x {len(cfg.slots)} blocks of "
              f"{cfg.block_bytes} B) into decode's slots {list(cfg.slots)} with {cfg.api} batch_write: "
              f"{nbytes} bytes in {seconds * 1e3:.2f} ms (connection set-up included)", flush=True)  # fmt: skip
        return {"engine": engine.get_engine_desc().pack(), "uid": uid, "digests": digests, "bytes": nbytes,
                "seconds": seconds}  # fmt: skip


# ---- decode (this process, the target) ---------------------------------------------------------------------


def decode(cfg: Config) -> str:
    """Run the example; return the summary line (``Failure`` on any mismatch)."""
    select_gpu(cfg, cfg.decode_gpu)
    shape = (cfg.layers, cfg.blocks, cfg.block_tokens, cfg.heads, cfg.head_dim)
    empty = bf16_bits(np.array(EMPTY_VALUE))
    cache = to_device(np.full(shape, empty, dtype=np.uint16), cfg, cfg.decode_gpu)
    print(f"decode: KV cache {' x '.join(map(str, shape))} bf16 ({cfg.device}), {cfg.block_bytes} B per "
          f"block; backend {cfg.backend}; request gets slots {list(cfg.slots)}", flush=True)  # fmt: skip

    with create_engine("decode", cfg) as engine:
        cache_mem = register(engine, cache)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: safe with CUDA and threads
        conn, child_conn = context.Pipe()
        process = context.Process(target=prefill_process, args=(child_conn, cfg), name="prefill", daemon=True)
        process.start()
        child_conn.close()  # ours is closed, so a prefill that dies shows up as EOF instead of a wait
        try:
            conn.send({"engine": engine.get_engine_desc().pack(), "memory": cache_mem.pack()})
            reply = receive(conn, cfg.timeout_s, process)
            if "error" in reply:
                raise Failure(f"prefill failed: {reply['error']}")
            if cfg.corrupt:
                flip_byte(cache, corrupt_index(cfg))
            prefill_key = EngineDesc.unpack(reply["engine"]).key
            route = inbound_route(engine, prefill_key, reply["uid"], cfg)
            untouched = check_cache(host_bytes(cache), reply["digests"], empty, cfg)
        finally:
            conn.close()  # a prefill still waiting for our message sees EOF and ends
            process.join(cfg.timeout_s)
            if process.is_alive():
                process.kill()
                process.join()
    return (f"OK: {reply['bytes']} bytes over {route} in {reply['seconds'] * 1e3:.2f} ms; the "
            f"{len(cfg.entries())} written blocks match prefill's, the {untouched} other blocks are untouched")


def receive(conn, timeout_s: float, process) -> dict:
    if not conn.poll(timeout_s):
        raise Failure(f"prefill sent no result within {timeout_s} s")
    try:
        return conn.recv()
    except EOFError:
        process.join(timeout_s)
        raise Failure(f"prefill exited without a result (exit code {process.exitcode})") from None


def inbound_route(engine: IOEngine, prefill_key: str, uid: int, cfg: Config) -> str:
    """Show the target side of completion: the TCP backend sends decode a notice per transfer, which
    ``pop_inbound_transfer_status`` reports (a SUCCESS status); GPU-IPC sends none (always None). With
    ``auto`` the notice (or its absence) tells which backend the engine chose."""
    expect_notice = {"tcp": True, "xgmi": False, "auto": None if cfg.device == "cuda" else True}[cfg.backend]
    wait_s = cfg.timeout_s if expect_notice else (NOTICE_WAIT_S if expect_notice is None else 0.0)
    deadline = time.monotonic() + wait_s
    status = engine.pop_inbound_transfer_status(prefill_key, uid)
    while status is None and time.monotonic() < deadline:
        time.sleep(0.005)  # the notice follows the data on the same connection: it is about to arrive
        status = engine.pop_inbound_transfer_status(prefill_key, uid)
    shown = StatusCode(status.Code()).name if status is not None else "None"
    print(f"decode: pop_inbound_transfer_status({prefill_key!r}, {uid}) -> {shown}", flush=True)
    if expect_notice and status is None:
        raise Failure(f"no inbound notice of transfer {uid} from {prefill_key!r} within {wait_s} s over TCP")
    if expect_notice is False and status is not None:
        raise Failure(f"an inbound notice of transfer {uid} arrived, but GPU-IPC sends none")
    if status is not None and not status.Succeeded():
        raise Failure(f"the inbound status of transfer {uid} is {shown}")
    return "tcp" if status is not None else "xgmi (GPU-IPC)"


def check_cache(data: np.ndarray, digests: list, empty: np.ndarray, cfg: Config) -> int:
    """Check the written blocks against prefill's hashes and every other block against the fill value;
    return the number of untouched blocks checked."""
    size = cfg.block_bytes
    for (layer, i, _, offset), digest in zip(cfg.entries(), digests):
        if hashlib.sha256(data[offset : offset + size]).hexdigest() != digest:
            raise Failure(f"layer {layer}, slot {cfg.slots[i]}: the block differs from the one prefill computed")
    empty_block = np.full(size // BF16_BYTES, empty, dtype=np.uint16).view(np.uint8)
    written = {offset for _, _, _, offset in cfg.entries()}
    untouched = 0
    for layer in range(cfg.layers):
        for slot in range(cfg.blocks):
            offset = (layer * cfg.blocks + slot) * size
            if offset in written:
                continue
            if not np.array_equal(data[offset : offset + size], empty_block):
                raise Failure(f"layer {layer}, slot {slot}: a block outside the request's slots was changed")
            untouched += 1
    return untouched


def corrupt_index(cfg: Config) -> int:
    """The byte that ``--self-check-corrupt`` flips: in the middle of the last written block, or of the
    first block the request does not use."""
    if cfg.corrupt == "written":
        return cfg.entries()[-1][3] + cfg.block_bytes // 2
    free = next(slot for slot in range(cfg.blocks) if slot not in cfg.slots)
    return free * cfg.block_bytes + cfg.block_bytes // 2


# ---- command line -------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad option is the user's error: exit 1 with the reason, no usage dump
        raise UsageError(message)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _slots(text: str) -> tuple:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block slots such as 7,2, got {text!r}") from None


def default_device() -> str:
    if importlib.util.find_spec("torch") is None:
        return "numpy"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse(argv) -> Config:
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu", "numpy"), default=None,
                   help="memory of both KV tensors (default: cuda if torch sees a GPU, else cpu; numpy without torch)")
    p.add_argument("--backend", choices=("tcp", "xgmi", "auto"), default="auto",
                   help="tcp, xgmi (GPU-IPC, GPU memory only) or auto (tcp, plus xgmi on a GPU; default)")
    p.add_argument("--api", choices=("session", "engine"), default="session",
                   help="IOEngineSession.batch_write (default) or IOEngine.batch_write")
    p.add_argument("--layers", type=_positive, default=4)
    p.add_argument("--blocks", type=_positive, default=16, help="block slots in decode's cache")
    p.add_argument("--block-tokens", type=_positive, default=16)
    p.add_argument("--heads", type=_positive, default=4)
    p.add_argument("--head-dim", type=_positive, default=64)
    p.add_argument("--slots", type=_slots, default=(7, 2), help="decode's slots for the request's blocks (7,2)")
    p.add_argument("--seed", type=int, default=0, help="seed of prefill's K/V values")
    p.add_argument("--timeout-s", type=float, default=30.0, help="bound of every wait (default 30)")
    p.add_argument("--decode-gpu", type=int, default=0)
    p.add_argument("--prefill-gpu", type=int, default=0)
    p.add_argument("--self-check-corrupt", choices=("written", "untouched"), default=None,
                   help="flip one byte of a written (or of an untouched) block after the transfer: the check "
                        "must then fail (exit 1)")  # fmt: skip
    args = p.parse_args(argv)
    device = args.device or default_device()
    if len(set(args.slots)) != len(args.slots) or not all(0 <= s < args.blocks for s in args.slots):
        p.error(f"--slots {','.join(map(str, args.slots))}: need distinct slots in [0, {args.blocks})")
    if args.self_check_corrupt == "untouched" and len(args.slots) == args.blocks:
        p.error("--self-check-corrupt untouched needs a block slot the request does not use")
    if args.backend == "xgmi" and device != "cuda":
        p.error(f"--backend xgmi (GPU-IPC) moves GPU memory only; use --device cuda, or --backend tcp for {device}")
    if device != "numpy" and importlib.util.find_spec("torch") is None:
        p.error(f"--device {device} needs torch, which is not installed; use --device numpy")
    if args.timeout_s <= 0:
        p.error(f"--timeout-s must be positive, got {args.timeout_s}")
    return Config(args.layers, args.blocks, args.block_tokens, args.heads, args.head_dim, args.slots, device,
                  args.backend, args.api, args.seed, args.timeout_s, args.decode_gpu, args.prefill_gpu,
                  args.self_check_corrupt)  # fmt: skip


def main(argv=None) -> int:
    try:
        cfg = parse(argv)
        print(decode(cfg), flush=True)
        return 0
    except UsageError as exc:
        print(f"kv_transfer: error: {exc}", file=sys.stderr, flush=True)
    except Failure as exc:
        print(f"kv_transfer: FAILED: {exc}", file=sys.stderr, flush=True)
    except Exception as exc:  # the engine's own errors (no GPU runtime, a port that cannot be bound, ...)
        print(f"kv_transfer: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
