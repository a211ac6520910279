"""The transfer matrix of MORI-IO's TCP backend (``BackendType.TCP`` and ``BackendType.RDMA``, which is served
by TCP here) over real loopback sockets between processes: engines in spawned children (``io_peer``) and
in this process, raw peers that misbehave on purpose.

What each test checks, byte for byte: the transferred range holds the source's (seeded random) bytes, and
every other byte of the target's slab, including the unregistered guard bytes on both sides of the
registered region, still holds the poison pattern it was filled with (for reads: the same for the local
slab). test_io_engine.py covers the single-process basics; this file covers the sizes, layouts, APIs,
several processes, notifications across processes, concurrency and the faults.

Cheap for CI: the child processes and engine pairs are module-scoped; every wait is bounded (``WAIT_MS``,
``CALL_S``), a watchdog (faulthandler) ends a hung test run with tracebacks, and a child ends when its Pipe
closes or after ``io_peer.LIFETIME_S``.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import random
import signal
import socket
import threading
import time
import zlib

import pytest

import io_peer
from io_peer import GUARD_DEFAULT, POISON_SEED, Slab, digest, pattern
from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, MemoryLocationType,
                              StatusCode, TcpBackendConfig, TransferStatus, wait_all)  # fmt: skip
from mori_compiler.runtime.io.engine import NO_BACKEND
from mori_compiler.runtime.io.tcp_frames import (FrameType, HelloFrame, MemoryQueryFrame, NotifyFrame,
                                                 ReadRequestFrame, Segment, WriteFrame, encode_frame,
                                                 encode_head)  # fmt: skip
from mori_compiler.runtime.io.tcp_socket import recv_frame, send_frame

CTX = multiprocessing.get_context("spawn")
WAIT_MS = 20_000  # bound of every transfer wait: far above what a transfer takes, far below a hang
CALL_S = 60  # bound of every answer from a child
G = GUARD_DEFAULT
MEM = 3 << 20  # the main registered region of each target child
MEM2 = 64 << 10
BIG = 64 << 20
SIZES = [1, 7, 4096, 65537, (1 << 20) + 3]
TCP, RDMA = BackendType.TCP, BackendType.RDMA
OK = int(StatusCode.SUCCESS)


@pytest.fixture(autouse=True)
def _hang_watchdog():
    """A test that hangs despite the bounded waits ends the run with every thread's traceback."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def same(actual, expected, what: str) -> None:
    """Byte-for-byte equality with a short message (the first differing offset, not a 3 MiB diff)."""
    actual, expected = bytes(actual), bytes(expected)
    if actual == expected:
        return
    if len(actual) != len(expected):
        pytest.fail(f"{what}: {len(actual)} bytes, expected {len(expected)}")
    first = next(i for i, (a, b) in enumerate(zip(actual, expected)) if a != b)
    last = max(i for i in range(len(actual)) if actual[i] != expected[i])
    pytest.fail(f"{what}: bytes differ in [{first}, {last}] (slab offsets, guard = {G})")


def done(status: TransferStatus, code=StatusCode.SUCCESS) -> TransferStatus:
    assert status.WaitFor(WAIT_MS) == code, status.Message()
    return status


def eventually(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


# ---- child processes ----


class Child:
    """A spawned daemon process running an ``io_peer`` function; every receive from it is bounded."""

    def __init__(self, target, *args):
        self.conn, child_end = CTX.Pipe()
        self.proc = CTX.Process(target=target, args=(child_end, *args), daemon=True)
        self.proc.start()
        child_end.close()

    def receive(self, timeout: float = CALL_S):
        if not self.conn.poll(timeout):
            self.kill()
            pytest.fail(f"child {self.proc.pid} did not answer within {timeout} s")
        return self.conn.recv()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)

    def stop(self) -> None:
        try:
            self.conn.send("exit" if not isinstance(self, EnginePeer) else ("exit",))
        except OSError:
            pass
        self.proc.join(5)
        self.kill()
        self.conn.close()


class EnginePeer(Child):
    """An IOEngine in a child process (``io_peer.engine_peer``), driven by ``call``."""

    def __init__(self, key: str, backend: str, options: dict):
        super().__init__(io_peer.engine_peer, key, backend, options)
        self.key = key
        self.desc = None
        self.mems: dict[str, MemoryDesc] = {}

    def ready(self) -> "EnginePeer":
        self.desc = EngineDesc.unpack(self._answer(CALL_S))
        return self

    def call(self, name: str, *args, timeout: float = CALL_S):
        self.conn.send((name, *args))
        return self._answer(timeout)

    def _answer(self, timeout):
        tag, value = self.receive(timeout)
        if tag == "error":
            pytest.fail(f"engine peer {self.key!r}: {value}")
        return value

    def alloc(self, name: str, size: int) -> MemoryDesc:
        self.mems[name] = MemoryDesc.unpack(self.call("alloc", name, size))
        return self.mems[name]

    def image(self, name: str) -> bytes:
        return self.call("dump", name)

    def transfer(self, op, name, l_offs, remote: MemoryDesc, r_offs, sizes, uid):
        [(code, message)] = self.call("transfers", [(op, name, l_offs, remote.pack(), r_offs, sizes, uid)], WAIT_MS)
        return code, message


class RawPeer(Child):
    """A misbehaving listener in a child process (``io_peer.raw_peer``), registered as engine ``key``."""

    def __init__(self, key: str, mode: str, param: float = 0.0):
        super().__init__(io_peer.raw_peer, key, mode, param)
        self.key = key
        tag, self.port = self.receive()
        assert tag == "port"
        self.desc = EngineDesc._from_fields(key=key, host="127.0.0.1", port=self.port)

    def memory(self, size: int) -> MemoryDesc:
        return MemoryDesc._from_fields(engine_key=self.key, id=0, size=size, loc=MemoryLocationType.CPU)


def poison(size: int) -> bytearray:
    return bytearray(pattern(POISON_SEED, size + 2 * G))


class World:
    """The module's processes: a target child per backend type, three initiator children, and an engine
    per backend type in this process (the "parents"), all registered with each other."""

    def __init__(self):
        self.targets = {TCP: EnginePeer("target-tcp", "TCP", {"num_connections": 2}),
                        RDMA: EnginePeer("target-rdma", "RDMA", {"qp_per_transfer": 3})}  # fmt: skip
        self.initiators = [EnginePeer("ini0", "RDMA", {"qp_per_transfer": 2}),
                           EnginePeer("ini1", "TCP", {"num_connections": 4}),
                           EnginePeer("ini2", "TCP", {})]  # fmt: skip
        self.children = [*self.targets.values(), *self.initiators]
        # The TCP parent cuts frames at 256 KiB, so that 1 MiB + 3 already spreads over its 3 sockets.
        self.parents = {TCP: io_peer.make_engine("parent-tcp", "TCP", {"num_connections": 3,
                                                                      "max_frame_payload": 256 << 10}),
                        RDMA: io_peer.make_engine("parent-rdma", "RDMA", {"qp_per_transfer": 2})}  # fmt: skip
        for child in self.children:
            child.ready()
            for parent in self.parents.values():
                parent.register_remote_engine(child.desc)
                child.call("register_remote", parent.get_engine_desc().pack())
        for target in self.targets.values():
            target.alloc("mem", MEM)
            target.alloc("mem2", MEM2)
        for initiator in self.initiators:
            initiator.alloc("mem", 1 << 20)
        # The TCP parent is the target of the initiator children.
        self.sink = Slab(MEM)
        self.sink_desc = self.sink.register(self.parents[TCP])

    def close(self):
        for parent in self.parents.values():
            parent.close()
        for child in self.children:
            child.stop()


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    w.close()


class Pair:
    """A parent engine and the target child of the same backend type."""

    def __init__(self, world: World, backend: BackendType):
        self.backend, self.engine, self.peer = backend, world.parents[backend], world.targets[backend]
        self.world = world

    def reset(self, name: str = "mem") -> bytearray:
        """Fill the target's slab with poison; returns the image it now has."""
        self.peer.call("fill", name, POISON_SEED)
        return poison(self.peer.mems[name].size)

    def local(self, size: int, seed: int):
        slab = Slab(size, seed=seed)
        return slab, slab.register(self.engine)


@pytest.fixture(params=[TCP, RDMA], ids=["TCP", "RDMA"])
def pair(world, request) -> Pair:
    return Pair(world, request.param)


# ---- data movement: sizes x read/write x engine/session ----


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("api", ["engine", "session"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_single_transfer(pair, op, api, size):
    image = pair.reset()
    slab, local = pair.local(size + 8, seed_of(pair.backend, op, api, size))
    before = bytes(slab.data)
    remote = pair.peer.mems["mem"]
    l_off, r_off = 5, MEM - size - 1  # the remote range ends one byte before the region's end
    uid = pair.engine.allocate_transfer_uid()
    if api == "engine":
        status = getattr(pair.engine, op)(local, l_off, remote, r_off, size, uid)
    else:
        status = getattr(pair.engine.create_session(local, remote), op)(l_off, r_off, size, uid)
    done(status)
    expected_local = bytearray(before)
    if op == "write":
        image[G + r_off : G + r_off + size] = before[G + l_off : G + l_off + size]
    else:
        expected_local[G + l_off : G + l_off + size] = image[G + r_off : G + r_off + size]
    same(pair.peer.image("mem"), image, "target slab")
    same(slab.data, expected_local, "local slab")
    pair.engine.deregister_memory(local)


@pytest.mark.parametrize("op", ["write", "read"])
def test_64_mib_once_per_direction(world, op):
    pair = Pair(world, TCP if op == "write" else RDMA)
    pair.peer.alloc("big", BIG)
    try:
        seed = seed_of("big", op)
        slab, local = pair.local(BIG, seed if op == "write" else POISON_SEED)
        if op == "read":
            pair.peer.call("fill", "big", seed)
        done(getattr(pair.engine, op)(local, 0, pair.peer.mems["big"], 0, BIG, pair.engine.allocate_transfer_uid()))
        pieces = pair.peer.call("digests", "big", [G, G + BIG])
        if op == "write":
            source = bytes(slab.data)
            guards = poison(BIG)
            assert pieces == [digest(guards[:G]), digest(source[G : G + BIG]), digest(guards[G + BIG :])]
        else:
            remote = pattern(seed, BIG + 2 * G)
            assert pieces == [digest(remote[:G]), digest(remote[G : G + BIG]), digest(remote[G + BIG :])]
            guards = poison(BIG)
            same(slab.data[:G], guards[:G], "local guard before")
            same(slab.data[G + BIG :], guards[G + BIG :], "local guard after")
            assert digest(slab.middle) == pieces[1]
        pair.engine.deregister_memory(local)
    finally:
        pair.peer.call("free", "big")


# ---- batches: entries, layouts, several memory pairs ----


def entries(count: int, layout: str, seed: int):
    """(local_offsets, remote_offsets, sizes) of ``count`` disjoint entries, in shuffled order, and the
    local and remote sizes they need. Layouts: ``contiguous`` (both sides back to back: one merged run),
    ``remote_contiguous`` (remote back to back, local scattered: one run of many pieces), ``strided``
    (gaps on both sides), ``zeros`` (strided, a quarter of the entries zero-sized, one of them at the very
    end of both regions)."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 64) for _ in range(count)]
    if layout == "zeros":
        for i in rng.sample(range(count), count // 4):
            sizes[i] = 0

    def lay(order, gaps: bool):
        offsets, pos = [0] * count, 3
        for i in order:
            pos += rng.randint(1, 32) if gaps else 0
            offsets[i] = pos
            pos += sizes[i]
        return offsets, pos + 1

    ordered = list(range(count))
    shuffled = rng.sample(ordered, count)
    remote, remote_end = lay(ordered, layout in ("strided", "zeros"))
    if layout == "contiguous":
        local, local_end = lay(ordered, False)
    else:
        local, local_end = lay(shuffled, layout != "remote_contiguous")
    if layout == "zeros":
        sizes.append(0)
        local.append(local_end)
        remote.append(MEM)  # zero bytes at offset == region size: in bounds
    order = rng.sample(range(len(sizes)), len(sizes))
    return [local[i] for i in order], [remote[i] for i in order], [sizes[i] for i in order], local_end


def apply(target: bytearray, source, dst_offs, src_offs, sizes) -> None:
    for d, s, n in zip(dst_offs, src_offs, sizes):
        target[G + d : G + d + n] = source[G + s : G + s + n]


@pytest.mark.parametrize("layout", ["contiguous", "remote_contiguous", "strided", "zeros"])
@pytest.mark.parametrize("count", [1, 3, 64, 4096])
@pytest.mark.parametrize("api", ["engine", "session"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_batch(pair, op, api, count, layout):
    seed = seed_of(pair.backend, op, api, count, layout)
    l_offs, r_offs, sizes, local_size = entries(count, layout, seed)
    image = pair.reset()
    slab, local = pair.local(local_size, seed)
    before = bytes(slab.data)
    remote = pair.peer.mems["mem"]
    uid = pair.engine.allocate_transfer_uid()
    if api == "engine":
        (status,) = getattr(pair.engine, f"batch_{op}")([local], [l_offs], [remote], [r_offs], [sizes], [uid])
    else:
        status = getattr(pair.engine.create_session(local, remote), f"batch_{op}")(l_offs, r_offs, sizes, uid)
    done(status)
    expected_local = bytearray(before)
    if op == "write":
        apply(image, before, r_offs, l_offs, sizes)
    else:
        apply(expected_local, image, l_offs, r_offs, sizes)
    same(pair.peer.image("mem"), image, "target slab")
    same(slab.data, expected_local, "local slab")
    pair.engine.deregister_memory(local)


@pytest.mark.parametrize("op", ["write", "read"])
def test_engine_batch_over_several_memory_pairs_and_processes(world, op):
    """One batch call, four pairs: two regions of one target process, one of another process, and a pair
    with no entries (immediately SUCCESS); one status per pair."""
    engine = world.parents[RDMA]
    t, other = world.targets[RDMA], world.initiators[2]
    for peer, name in ((t, "mem"), (t, "mem2"), (other, "mem")):
        peer.call("fill", name, POISON_SEED)
    images = {(t.key, "mem"): poison(MEM), (t.key, "mem2"): poison(MEM2), (other.key, "mem"): poison(1 << 20)}
    remotes = [t.mems["mem"], t.mems["mem2"], other.mems["mem"], t.mems["mem"]]
    names = [(t.key, "mem"), (t.key, "mem2"), (other.key, "mem"), (t.key, "mem")]
    plans = [entries(n, layout, seed_of(op, n, layout)) for n, layout in ((50, "strided"), (7, "contiguous"),
                                                                           (300, "remote_contiguous"))]  # fmt: skip
    plans.append(([], [], [], 8))
    slabs = [Slab(plan[3], seed=seed_of(op, i)) for i, plan in enumerate(plans)]
    locals_ = [slab.register(engine) for slab in slabs]
    befores = [bytes(slab.data) for slab in slabs]
    uids = [engine.allocate_transfer_uid() for _ in plans]
    statuses = getattr(engine, f"batch_{op}")(locals_, [p[0] for p in plans], remotes, [p[1] for p in plans],
                                              [p[2] for p in plans], uids)  # fmt: skip
    assert len(statuses) == 4 and statuses[3].Code() == StatusCode.SUCCESS  # no entries: done at once
    assert wait_all(statuses, WAIT_MS) == StatusCode.SUCCESS
    for (l_offs, r_offs, sizes, _), name, slab, before in zip(plans, names, slabs, befores):
        expected_local = bytearray(before)
        if op == "write":
            apply(images[name], before, r_offs, l_offs, sizes)
        else:
            apply(expected_local, images[name], l_offs, r_offs, sizes)
        same(slab.data, expected_local, f"local slab of the pair to {name}")
    for (key, name), image in images.items():
        same((t if key == t.key else other).image(name), image, f"{key} {name}")
    for local in locals_:
        engine.deregister_memory(local)
