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
import random
import socket
import struct
import threading
import time
import zlib

import pytest

import io_peer
from io_peer import GUARD_DEFAULT, POISON_SEED, Slab, digest, pattern
from mori_compiler.io import (BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, MemoryLocationType,
                              StatusCode, TransferStatus, wait_all)  # fmt: skip
from mori_compiler.runtime.io.engine import NO_BACKEND
from mori_compiler.runtime.io.tcp_frames import (FrameLimits, FrameType, HelloFrame, MemoryQueryFrame, NotifyFrame,
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

    EXIT: object = "exit"  # what its loop takes as the end

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
            self.conn.send(self.EXIT)
        except OSError:
            pass
        self.proc.join(5)
        self.kill()
        self.conn.close()


class EnginePeer(Child):
    """An IOEngine in a child process (``io_peer.engine_peer``), driven by ``call``."""

    EXIT = ("exit",)

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
        self.children: list[EnginePeer] = []  # what close() stops, even after a failed start()
        self.parents: dict[BackendType, IOEngine] = {}

    def _spawn(self, *args) -> EnginePeer:
        self.children.append(EnginePeer(*args))
        return self.children[-1]

    def start(self):
        self.targets = {TCP: self._spawn("target-tcp", "TCP", {"num_connections": 2}),
                        RDMA: self._spawn("target-rdma", "RDMA", {"qp_per_transfer": 3})}  # fmt: skip
        self.initiators = [self._spawn("ini0", "RDMA", {"qp_per_transfer": 2}),
                           self._spawn("ini1", "TCP", {"num_connections": 4}),
                           self._spawn("ini2", "TCP", {})]  # fmt: skip
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
    try:
        w.start()
        yield w
    finally:
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
    """(local_offsets, remote_offsets, sizes, local region size) of ``count`` disjoint entries in shuffled
    order (the remote side fits ``MEM``). Layouts: ``contiguous`` (both sides back to back: one merged run),
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
    remote, _ = lay(ordered, layout in ("strided", "zeros"))
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


# ---- notifications (the parent "parent-tcp" is the target of the initiator children) ----


def test_notifications_are_peeked_per_initiator_and_uid_and_reads_notify(world):
    target = world.parents[TCP]
    ini0, ini1 = world.initiators[:2]
    sink = world.sink_desc
    pop = target.pop_inbound_transfer_status
    uid = 0x5EED_0001  # entries are never freed: uids of this test are not used elsewhere
    assert pop("ini0", uid) is None
    assert ini0.transfer("write", "mem", [0], sink, [0], [4096], uid) == (OK, "")
    assert eventually(lambda: pop("ini0", uid) is not None)
    status = pop("ini0", uid)
    assert isinstance(status, TransferStatus) and status.Succeeded()
    assert pop("ini1", uid) is None and pop("ini0", uid + 1) is None  # per (initiator, uid)
    # the same uid from another initiator, 1 MiB: four frames (the target's 256 KiB limit) over ini1's four
    # sockets, so four NOTIFY parts
    assert ini1.transfer("write", "mem", [0], sink, [1 << 20], [1 << 20], uid) == (OK, "")
    assert eventually(lambda: pop("ini1", uid) is not None)
    for _ in range(3):  # a peek: the entry stays
        assert pop("ini0", uid).Succeeded() and pop("ini1", uid).Succeeded()
    assert ini0.transfer("read", "mem", [0], sink, [0], [65537], uid + 2) == (OK, "")  # reads notify too
    assert eventually(lambda: pop("ini0", uid + 2) is not None)
    batch = ini1.transfer("batch_write", "mem", [0, 100, 5000], sink, [9000, 7000, 8000], [50, 60, 70], uid + 3)
    assert batch == (OK, "") and eventually(lambda: pop("ini1", uid + 3) is not None)
    assert pop("ini2", uid + 3) is None


def test_an_initiator_with_notifications_off_sends_none(world):
    target = world.initiators[2]
    quiet = io_peer.make_engine("quiet-initiator", "TCP", {"enable_notification": False})
    loud = world.parents[RDMA]
    try:
        quiet.register_remote_engine(target.desc)
        slab = Slab(4096, seed=seed_of("quiet initiator"))
        uid = 0x5EED_0500
        done(quiet.write(slab.register(quiet), 0, target.mems["mem"], 0, 4096, uid))
        assert target.image("mem")[G : G + 4096] == slab.middle  # the data did land
        done(loud.write(Slab(16).register(loud), 0, target.mems["mem"], 8192, 16, uid))  # control
        assert eventually(lambda: target.call("pop", "parent-rdma", uid))
        assert not target.call("pop", "quiet-initiator", uid)
    finally:
        quiet.close()


def test_a_target_with_notifications_off_keeps_no_inbound_state(world):
    ini = world.initiators[2]
    quiet = io_peer.make_engine("quiet-target", "TCP", {"enable_notification": False})
    try:
        ini.call("fill", "mem", POISON_SEED)
        ini.call("register_remote", quiet.get_engine_desc().pack())
        slab = Slab(4096)
        mem = slab.register(quiet)
        uid = 0x5EED_0100
        assert ini.transfer("write", "mem", [0], mem, [0], [4096], uid) == (OK, "")
        # control: the same transfer into a notifying target is visible, after which the quiet one has had
        # as long to count its notice
        assert ini.transfer("write", "mem", [0], world.sink_desc, [0], [4096], uid) == (OK, "")
        assert eventually(lambda: world.parents[TCP].pop_inbound_transfer_status("ini2", uid) is not None)
        time.sleep(0.05)
        assert quiet.pop_inbound_transfer_status("ini2", uid) is None
        same(slab.middle, poison(1 << 20)[G : G + 4096], "the quiet target's memory")  # the data did land
    finally:
        quiet.close()


def test_a_transfer_the_target_refused_is_not_notified(world):
    ini0 = world.initiators[0]
    sink = world.sink_desc
    pop = world.parents[TCP].pop_inbound_transfer_status
    uid = 0x5EED_0200
    inflated = sink._replace(size=sink.size + 4096)  # gets past the initiator's check; the target refuses
    code, message = ini0.transfer("write", "mem", [0], inflated, [sink.size], [100], uid)
    assert code == int(StatusCode.ERR_INVALID_ARGS) and "outside memory" in message
    # uid + 2 goes over the same one of ini0's two sockets: once its notice is in, so would the first one be
    assert ini0.transfer("write", "mem", [0], sink, [0], [100], uid + 2) == (OK, "")
    assert eventually(lambda: pop("ini0", uid + 2) is not None)
    assert pop("ini0", uid) is None


# ---- concurrency ----


def test_initiator_processes_write_and_read_one_target_at_the_same_time(world):
    """Three initiator processes, each with 12 writes (64 KiB, its own third of the target's region) and 4
    reads (of a region nobody writes) outstanding at once, all into the parent engine."""
    target = world.parents[TCP]
    world.sink.fill(POISON_SEED)
    source = Slab(256 << 10, seed=seed_of("shared source"))
    source_desc = source.register(target)
    chunk, writes = 64 << 10, 12
    try:
        for i, ini in enumerate(world.initiators):
            ini.call("fill", "mem", seed_of("initiator", i))
        for i, ini in enumerate(world.initiators):  # all commands first: the three run at the same time
            sink, shared = world.sink_desc.pack(), source_desc.pack()
            specs = [("write", "mem", [k * chunk], sink, [i * (1 << 20) + k * chunk], [chunk], 100 * i + k)
                     for k in range(writes)]  # fmt: skip
            specs += [("read", "mem", [(writes + k) * chunk], shared, [k * chunk], [chunk], 100 * i + 50 + k)
                      for k in range(4)]  # fmt: skip
            ini.conn.send(("transfers", specs, WAIT_MS))
        results = [ini._answer(CALL_S) for ini in world.initiators]
        assert all(result == [(OK, "")] * (writes + 4) for result in results), results
        expected = poison(MEM)
        for i in range(len(world.initiators)):
            data = pattern(seed_of("initiator", i), (1 << 20) + 2 * G)
            expected[G + i * (1 << 20) : G + i * (1 << 20) + writes * chunk] = data[G : G + writes * chunk]
        same(world.sink.data, expected, "target slab")
        read_start = G + writes * chunk
        for ini in world.initiators:
            pieces = ini.call("digests", "mem", [read_start, read_start + 4 * chunk])
            assert pieces[1] == digest(source.middle), f"{ini.key} read the wrong bytes"
    finally:
        target.deregister_memory(source_desc)


def test_threads_of_one_engine_issue_concurrently(world):
    """Four threads on one engine, each with its quarter of the target: writes, a batch write, a session
    batch read of the quarter, all at the same time as the others."""
    pair = Pair(world, RDMA)
    image = pair.reset()
    remote = pair.peer.mems["mem"]
    quarter, chunk = MEM // 4, 32 << 10
    work = []
    for w in range(4):
        slab, desc = pair.local(quarter, seed_of("thread", w))
        back, back_desc = pair.local(quarter, POISON_SEED)
        work.append((slab, desc, back, back_desc))
    start, errors = threading.Barrier(4, timeout=30), []

    def run(w):
        slab, desc, back, back_desc = work[w]
        base = w * quarter
        try:
            start.wait()
            statuses = [pair.engine.write(desc, k * chunk, remote, base + k * chunk, chunk, 1000 * w + k)
                        for k in range(quarter // 2 // chunk)]  # fmt: skip
            half = quarter // 2
            offs = list(range(half, quarter - 64, 96))
            (batch,) = pair.engine.batch_write([desc], [offs], [remote], [[base + o for o in offs]],
                                               [[64] * len(offs)], [1000 * w + 500])  # fmt: skip
            statuses.append(batch)
            if wait_all(statuses, WAIT_MS) != StatusCode.SUCCESS:
                errors.append([s.Message() for s in statuses if not s.Succeeded()])
            session = pair.engine.create_session(back_desc, remote)
            status = session.batch_read([0, half], [base, base + half], [half, quarter - half], 1000 * w + 600)
            if status.WaitFor(WAIT_MS) != StatusCode.SUCCESS:
                errors.append(status.Message())
        except Exception as exc:  # reported below, in the test's thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    for w, (slab, desc, back, back_desc) in enumerate(work):
        base, half = w * quarter, quarter // 2
        image[G + base : G + base + half] = slab.data[G : G + half]
        for o in range(half, quarter - 64, 96):
            image[G + base + o : G + base + o + 64] = slab.data[G + o : G + o + 64]
        same(back.middle, image[G + base : G + base + quarter], f"thread {w}'s read-back")
        pair.engine.deregister_memory(desc)
        pair.engine.deregister_memory(back_desc)
    same(pair.peer.image("mem"), image, "target slab")


def test_many_outstanding_transfers_then_wait_all(pair):
    image = pair.reset()
    image2 = pair.reset("mem2")
    n, size = 1024, 1000
    slab, local = pair.local(n * 1024, seed_of(pair.backend, "outstanding"))
    back, back_local = pair.local(MEM2, POISON_SEED)
    remote, remote2 = pair.peer.mems["mem"], pair.peer.mems["mem2"]
    statuses = [pair.engine.write(local, i * 1024, remote, i * 1024 + 7, size, i) for i in range(n)]
    statuses += [pair.engine.read(back_local, i * 64, remote2, MEM2 - 64 - i * 64, 64, n + i)
                 for i in range(MEM2 // 64)]  # fmt: skip
    assert wait_all(statuses, WAIT_MS) == StatusCode.SUCCESS
    assert all(s.Succeeded() for s in statuses)
    for i in range(n):
        image[G + i * 1024 + 7 : G + i * 1024 + 7 + size] = slab.data[G + i * 1024 : G + i * 1024 + size]
    expected_back = poison(MEM2)
    for i in range(MEM2 // 64):
        expected_back[G + i * 64 : G + i * 64 + 64] = image2[G + MEM2 - 64 - i * 64 : G + MEM2 - i * 64]
    same(pair.peer.image("mem"), image, "target slab")
    same(back.data, expected_back, "local slab of the reads")
    same(pair.peer.image("mem2"), image2, "target's second slab")
    pair.engine.deregister_memory(local)
    pair.engine.deregister_memory(back_local)


# ---- faults ----


def test_an_unknown_or_deregistered_engine_is_bad_state(world):
    engine = world.parents[RDMA]
    other = world.initiators[2]
    slab, local = Pair(world, RDMA).local(4096, 1)
    nobody = MemoryDesc._from_fields(engine_key="nobody", id=0, size=4096, loc=MemoryLocationType.CPU)
    other.call("fill", "mem", POISON_SEED)
    try:
        for remote in (nobody, other.mems["mem"]):
            for status in (engine.write(local, 0, remote, 0, 10, 1), engine.read(local, 0, remote, 0, 10, 2),
                           *engine.batch_read([local], [[0]], [remote], [[0]], [[10]], [3])):  # fmt: skip
                assert status.Code() == StatusCode.ERR_BAD_STATE and status.Message() == NO_BACKEND
            assert engine.create_session(local, remote) is None
            engine.deregister_remote_engine(other.desc)  # the second round: an engine known, then forgotten
        same(other.image("mem"), poison(1 << 20), "the forgotten engine's slab")
    finally:
        engine.register_remote_engine(other.desc)
    done(engine.write(local, 0, other.mems["mem"], 0, 10, 4))  # known again: a new connection
    assert other.image("mem")[G : G + 10] == slab.data[G : G + 10]
    engine.deregister_memory(local)


def test_unknown_and_deregistered_remote_memory_across_processes(world):
    pair = Pair(world, TCP)
    image = pair.reset()
    peer = pair.peer
    gone = peer.alloc("gone", 4096)
    slab, local = pair.local(4096, seed_of("gone"))
    before = bytes(slab.data)
    session = pair.engine.create_session(local, gone)
    done(session.write(0, 0, 16, 1))
    peer.call("fill", "gone", POISON_SEED)
    peer.call("deregister", "gone")
    unknown = pair.peer.mems["mem"]._replace(id=4321)
    for remote in (gone, unknown):
        for status in (pair.engine.write(local, 0, remote, 0, 4096, 2), pair.engine.read(local, 0, remote, 0, 4096, 3),
                       *pair.engine.batch_write([local], [[0, 100]], [remote], [[0, 200]], [[50, 50]], [4]),
                       session.write(0, 0, 16, 5), session.batch_read([0], [0], [16], 6)):  # fmt: skip
            done(status, StatusCode.ERR_INVALID_ARGS)  # the target's answer
            assert "not registered" in status.Message()
        with pytest.raises(RuntimeError, match="not registered"):
            pair.engine.create_session(local, remote)
    same(peer.image("gone"), poison(4096), "the deregistered slab")
    same(peer.image("mem"), image, "the target's other slab")
    same(slab.data, before, "local slab")
    done(pair.engine.write(local, 0, peer.mems["mem"], 0, 8, 7))  # the connection survived the refusals
    pair.engine.deregister_memory(local)


def test_out_of_range_is_refused_synchronously_and_nothing_moves(world):
    pair = Pair(world, RDMA)
    image = pair.reset()
    slab, local = pair.local(4096, seed_of("range"))
    before = bytes(slab.data)
    remote = pair.peer.mems["mem"]
    session = pair.engine.create_session(local, remote)
    cases = [  # (local offset, remote offset, size)
        (0, MEM - 10, 11), (0, MEM + 1, 0), (0, 2**64 - 1, 1), (0, 2**63, 2**63), (4096 - 10, 0, 11), (4097, 0, 0),
        (0, 0, 4097),
    ]  # fmt: skip
    uids = iter(range(0x7000, 0x8000))
    statuses = []
    for l_off, r_off, size in cases:
        for op in ("write", "read"):
            statuses.append(getattr(pair.engine, op)(local, l_off, remote, r_off, size, next(uids)))
            statuses.append(getattr(session, op)(l_off, r_off, size, next(uids)))
    good = [(0, 0, 10), (100, 200, 10)]
    for bad in cases:  # one bad entry refuses the whole batch: the good entries do not move either
        l_offs, r_offs, sizes = zip(*good, bad)
        for op in ("write", "read"):
            statuses += getattr(pair.engine, f"batch_{op}")([local], [list(l_offs)], [remote], [list(r_offs)],
                                                            [list(sizes)], [next(uids)])  # fmt: skip
            statuses.append(getattr(session, f"batch_{op}")(list(l_offs), list(r_offs), list(sizes), next(uids)))
    for status in statuses:
        assert status.Code() == StatusCode.ERR_INVALID_ARGS and "outside" in status.Message(), status
    done(pair.engine.write(local, 0, remote, 0, 0, next(uids)))  # zero bytes at the end of both: fine
    done(pair.engine.write(local, 4096, remote, MEM, 0, next(uids)))
    last = next(uids)
    done(pair.engine.write(local, 0, remote, 0, 1, last))  # control: a notice behind which no refused one came
    assert eventually(lambda: pair.peer.call("pop", "parent-rdma", last))
    assert not any(pair.peer.call("pop", "parent-rdma", uid) for uid in range(0x7000, last))  # nothing was sent
    image[G] = before[G]
    same(pair.peer.image("mem"), image, "target slab")
    same(slab.data, before, "local slab")
    pair.engine.deregister_memory(local)


def test_deregistered_local_memory_is_refused_synchronously(world):
    pair = Pair(world, TCP)
    image = pair.reset()
    slab, local = pair.local(4096, seed_of("deregistered local"))
    before = bytes(slab.data)
    remote = pair.peer.mems["mem"]
    session = pair.engine.create_session(local, remote)
    pair.engine.deregister_memory(local)
    statuses = [pair.engine.write(local, 0, remote, 0, 100, 1), pair.engine.read(local, 0, remote, 0, 100, 2),
                *pair.engine.batch_write([local], [[0]], [remote], [[0]], [[100]], [3]),
                *pair.engine.batch_read([local], [[0]], [remote], [[0]], [[100]], [4]),
                session.write(0, 0, 100, 5), session.read(0, 0, 100, 6),
                session.batch_read([0], [0], [100], 7)]  # fmt: skip
    for status in statuses:
        assert status.Code() == StatusCode.ERR_INVALID_ARGS and "not registered" in status.Message()
    time.sleep(0.05)
    same(pair.peer.image("mem"), image, "target slab")
    same(slab.data, before, "local slab")


@pytest.mark.parametrize("op", ["write", "read"])
def test_a_peer_killed_in_the_middle_of_a_large_transfer(world, op):
    """The peer process gets part of the first frame of a 16 MiB transfer and is killed: the transfer fails
    with ERR_RDMA_OP within a bounded time (the socket closes; no waiting for io_timeout), the local slab is
    untouched outside the transferred range, and the engine goes on working with another peer."""
    engine = world.parents[TCP]
    size = 16 << 20
    peer = RawPeer("doomed-" + op, f"stall_mid_{op}", 100_000)
    slab, local = Pair(world, TCP).local(size, POISON_SEED if op == "read" else seed_of("doomed"))
    before = bytes(slab.data)
    try:
        engine.register_remote_engine(peer.desc)
        status = getattr(engine, op)(local, 0, peer.memory(size), 0, size, 1)
        tag, length = peer.receive()
        assert tag == "half" and length == 256 << 10  # a frame of the engine's 256 KiB
        assert status.WaitFor(0) == StatusCode.IN_PROGRESS
        killed = time.monotonic()
        peer.kill()
        assert status.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP
        assert time.monotonic() - killed < 3.0
        if op == "write":
            same(slab.data, before, "local slab")
        else:  # each socket got a READ_RESPONSE head and 100000 bytes for its first frame: only those landed
            outside = bytearray(slab.data)
            for k in range(3):
                start = G + k * length
                outside[start : start + 100_000] = before[start : start + 100_000]
            same(outside, before, "local slab outside the bytes that came")
        with pytest.raises(RuntimeError, match="cannot connect"):  # gone: no silent reconnection
            engine.write(local, 0, peer.memory(size), 0, 16, 2)
    finally:
        peer.stop()
        engine.deregister_remote_engine(peer.desc)
    pair = Pair(world, TCP)
    image = pair.reset()
    done(engine.write(local, 0, pair.peer.mems["mem"], 0, 1 << 20, 3))
    image[G : G + (1 << 20)] = slab.data[G : G + (1 << 20)]
    same(pair.peer.image("mem"), image, "the other peer's slab")
    engine.deregister_memory(local)


def test_an_initiator_killed_in_the_middle_of_a_write_leaves_the_target_serving(world):
    target = world.parents[TCP]
    world.sink.fill(POISON_SEED)
    offset, length, sent = 4096, 200_000, 50_000  # within the target's 256 KiB frame limit
    child = Child(io_peer.raw_initiator, target.get_engine_desc().port, "parent-tcp", world.sink_desc.id, offset,
                  length, sent)  # fmt: skip
    try:
        assert child.receive() == ("half", sent)
        child.kill()
    finally:
        child.stop()
    expected = poison(MEM)
    expected[G + offset : G + offset + sent] = b"\xab" * sent
    landed = slice(G + offset, G + offset + sent)
    assert eventually(lambda: world.sink.data[landed] == expected[landed])
    same(world.sink.data, expected, "target slab (only the bytes that came, inside the segment)")
    ini = world.initiators[1]
    ini.call("fill", "mem", POISON_SEED)
    assert ini.transfer("write", "mem", [0], world.sink_desc, [offset], [length], 0x5EED_0300) == (OK, "")
    expected[G + offset : G + offset + length] = poison(1 << 20)[G : G + length]
    same(world.sink.data, expected, "target slab after another initiator's write")


def test_a_peer_that_disconnects(world):
    """A peer that closes the connection when a request arrives fails it with ERR_RDMA_OP at once; an engine
    that closes (its sockets and listener) fails or refuses what comes next, never hangs."""
    engine = world.parents[RDMA]
    slab, local = Pair(world, RDMA).local(1 << 20, 3)
    rude = RawPeer("rude", "hello_then_close")
    leaver = EnginePeer("leaver", "TCP", {}).ready()
    try:
        engine.register_remote_engine(rude.desc)
        start = time.monotonic()
        status = engine.write(local, 0, rude.memory(1 << 20), 0, 1 << 20, 1)
        assert status.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP and time.monotonic() - start < 3.0
        engine.register_remote_engine(leaver.desc)
        remote = leaver.alloc("mem", 1 << 20)
        done(engine.write(local, 0, remote, 0, 1 << 20, 2))
        leaver.call("close_engine")
        outcomes = []
        for uid in (3, 4):
            try:
                outcomes.append(engine.write(local, 0, remote, 0, 1 << 20, uid).WaitFor(WAIT_MS))
            except RuntimeError as exc:
                outcomes.append(str(exc))
        # the first may still find the connection before its receiver saw the close: ERR_RDMA_OP; after that
        # the connection is gone and the listener too
        assert outcomes[0] == StatusCode.ERR_RDMA_OP or "cannot connect" in str(outcomes[0]), outcomes
        assert "cannot connect" in str(outcomes[1]), outcomes
    finally:
        for peer in (rude, leaver):
            engine.deregister_remote_engine(peer.desc)
            peer.stop()
    engine.deregister_memory(local)


@pytest.mark.parametrize("backend", [TCP, RDMA], ids=["TCP", "RDMA"])
def test_a_listener_port_in_use_is_a_clear_error(world, backend):
    port = world.targets[TCP].desc.port  # held by the target child's listener
    late = IOEngine("late", IOEngineConfig("127.0.0.1", port))
    with pytest.raises(RuntimeError, match=rf"cannot listen on 127\.0\.0\.1:{port}: .*in use"):
        late.create_backend(backend)
    slab = Slab(16)
    status = late.write(slab.register(late), 0, world.targets[TCP].mems["mem"], 0, 16, 1)
    assert status.Code() == StatusCode.ERR_BAD_STATE  # no half-made backend was kept
    late.close()
    pair = Pair(world, TCP)  # the holder is not disturbed
    pair.reset()
    local = pair.local(16, 5)[1]
    done(pair.engine.write(local, 0, pair.peer.mems["mem"], 0, 16, 2))
    pair.engine.deregister_memory(local)


def _header(ftype: int, body_length: int, version: int = 1) -> bytes:
    return struct.pack("<4sBBHQQ", b"MoIO", version, ftype, 0, 1, body_length)


def _write_head(segments) -> bytes:
    return encode_head(WriteFrame(1, tuple(Segment(*s) for s in segments)), sum(s[2] for s in segments), ANY_LIMITS)


def malformed_cases(mem_id: int):
    """(name, bytes a rogue sends, what the target must do). Each case sends only bytes the target reads
    before it decides (so that its close is a FIN, and its answer cannot be lost to a reset)."""
    hello = encode_frame(HelloFrame("rogue", "target-tcp"))
    low_hello = bytearray(hello[:48])
    struct.pack_into("<Q", low_hello, 24, 100)  # max_payload below the minimum of 4096
    longer = bytearray(_write_head([(mem_id, 0, 50)]))
    struct.pack_into("<Q", longer, 16, struct.unpack_from("<Q", longer, 16)[0] + 50)  # 50 more than the segment
    return [
        ("not a HELLO", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[:24], ("error", "header.magic")),
        ("HELLO with a tiny max_payload", bytes(low_hello), ("error", "hello.max_payload")),
        ("unknown version", hello + _header(2, 8, version=9), ("error", "header.version")),
        ("unknown frame type", hello + _header(99, 0), ("error", "header.type")),
        ("body_length 2**63", hello + _header(2, 2**63), ("error", "header.body_length")),
        ("WRITE above max_payload", hello + _write_head([(mem_id, 0, 8 << 20)])[:24], ("error", "header.body_length")),
        ("WRITE of no segment", hello + _header(2, 8) + struct.pack("<II", 0, 0), ("error", "write.count")),
        ("WRITE of 1025 segments", hello + _write_head([(mem_id, i, 1) for i in range(1025)])[:32],
         ("error", "write.count")),
        ("WRITE payload longer than its segments", hello + bytes(longer), ("error", "write.payload")),
        ("NOTIFY for another initiator", hello + encode_frame(NotifyFrame(0x5EED_0400, "victim")),
         ("error", "notify.initiator_key")),
        ("WRITE past the region's end", hello + _write_head([(mem_id, MEM - 10, 20)]) + b"\xcc" * 20,
         ("status", "outside memory")),
        ("WRITE near 2**64", hello + _write_head([(mem_id, 2**64 - 8, 7)]) + b"\xcc" * 7, ("status", "outside memory")),
        ("WRITE of a good and an unknown-region segment", hello + _write_head([(mem_id, 0, 100), (999, 0, 100)])
         + b"\xcc" * 200, ("status", "not registered")),
        ("READ past the region's end", hello + encode_frame(ReadRequestFrame(1, (Segment(mem_id, MEM - 1, 2),))),
         ("read_error", "outside memory")),
        ("WRITE cut short", hello + _write_head([(mem_id, 1000, 5000)]) + b"\xcc" * 2000, ("dropped", None)),
    ]  # fmt: skip


ANY_LIMITS = FrameLimits(max_payload=1 << 32, max_segments=1 << 16)
_CASE_NAMES = [case[0] for case in malformed_cases(0)]


@pytest.mark.parametrize("name", _CASE_NAMES, ids=[n.replace(" ", "-").replace("'", "") for n in _CASE_NAMES])
def test_malformed_frames_from_a_raw_socket(world, name):
    """The target (a child process) answers a bad frame with ERROR and closes, or refuses a well-formed
    request that does not fit its memory with ERR_INVALID_ARGS and keeps the connection; it writes nothing
    outside a registered region (the guards) and, except for a cut-short WRITE's bytes inside its segment,
    nothing at all; and it keeps serving another initiator meanwhile."""
    pair = Pair(world, TCP)
    image = pair.reset()
    mem_id = pair.peer.mems["mem"].id
    _, data, (expect, detail) = next(case for case in malformed_cases(mem_id) if case[0] == name)
    with socket.create_connection(("127.0.0.1", pair.peer.desc.port), timeout=10) as rogue:
        rogue.sendall(data)
        if data.startswith(encode_frame(HelloFrame("rogue", "target-tcp"))):
            assert recv_frame(rogue, timeout=10).reply
        if expect == "error":
            answer = recv_frame(rogue, timeout=10)
            assert answer.type is FrameType.ERROR and detail in answer.message, answer
            assert recv_frame(rogue, timeout=10) is None  # closed after the ERROR
        elif expect in ("status", "read_error"):
            answer = recv_frame(rogue, timeout=10)
            wanted = FrameType.STATUS if expect == "status" else FrameType.READ_RESPONSE
            assert answer.type is wanted and answer.status == StatusCode.ERR_INVALID_ARGS, answer
            assert detail in answer.message and not getattr(answer, "payload", b"")
            send_frame(rogue, MemoryQueryFrame(7, mem_id))  # the connection is still served
            info = recv_frame(rogue, timeout=10)
            assert info.type is FrameType.MEMORY_INFO and info.found and info.size == MEM
        else:
            rogue.shutdown(socket.SHUT_WR)
            image[G + 1000 : G + 3000] = b"\xcc" * 2000  # what came of the payload lands in the segment
            assert eventually(lambda: pair.peer.image("mem") == image)
        slab, local = pair.local(4096, seed_of("served meanwhile", name))
        done(pair.engine.write(local, 0, pair.peer.mems["mem"], MEM - 4096, 4096, 0x6000))
    same(pair.peer.image("mem")[: G + MEM - 4096], image[: G + MEM - 4096], "target slab")
    same(pair.peer.image("mem")[G + MEM :], image[G + MEM :], "target guard after")
    assert not pair.peer.call("pop", "victim", 0x5EED_0400) and not pair.peer.call("pop", "rogue", 0x5EED_0400)
    pair.engine.deregister_memory(local)


# ---- peers that do not answer ----


def _engine_for(peer: RawPeer, **options) -> IOEngine:
    engine = io_peer.make_engine(f"caller-of-{peer.key}", "TCP", options)
    engine.register_remote_engine(peer.desc)
    return engine


def test_a_peer_that_accepts_but_never_answers_the_hello():
    peer = RawPeer("mute-at-hello", "silent")
    engine = _engine_for(peer, connect_timeout_ms=300)
    try:
        local = Slab(4096).register(engine)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="cannot connect to engine 'mute-at-hello'.*timed out"):
            engine.write(local, 0, peer.memory(4096), 0, 4096, 1)
        assert 0.25 < time.monotonic() - start < 3.0
    finally:
        engine.close()
        peer.stop()


def test_waitfor_returns_in_progress_at_its_deadline_then_the_transfer_fails_after_io_timeout():
    peer = RawPeer("mute", "hello_then_silent")
    engine = _engine_for(peer, io_timeout_ms=600)
    try:
        local = Slab(1 << 20).register(engine)
        start = time.monotonic()
        write = engine.write(local, 0, peer.memory(1 << 20), 0, 1 << 20, 1)  # connects: HELLO answered
        read = engine.read(local, 0, peer.memory(1 << 20), 0, 4096, 2)
        waited = time.monotonic()
        assert write.WaitFor(150) == StatusCode.IN_PROGRESS
        assert 0.14 < time.monotonic() - waited < 0.5
        assert wait_all([write, read], 50) == StatusCode.IN_PROGRESS and read.InProgress()
        assert write.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP and read.WaitFor(WAIT_MS) == StatusCode.ERR_RDMA_OP
        assert 0.5 < time.monotonic() - start < 5.0
        assert "0.6 s" in write.Message()  # the message names the limit
    finally:
        engine.close()
        peer.stop()


def test_a_transfer_on_a_connection_idle_for_most_of_io_timeout_gets_the_whole_io_timeout():
    peer = RawPeer("slow", "slow_status", 0.9)  # answers every WRITE 0.9 s after it came
    engine = _engine_for(peer, io_timeout_ms=1000)
    try:
        local = Slab(4096).register(engine)
        done(engine.write(local, 0, peer.memory(4096), 0, 100, 1))  # connects; the connection then idles
        # The receiver has waited 0.3 s of its 1 s when the next write goes out (0.7 s of margin for a slow
        # machine); the answer comes 0.9 s after the write, so always after that receive timed out.
        time.sleep(0.3)
        status = engine.write(local, 0, peer.memory(4096), 0, 100, 2)
        assert status.WaitFor(WAIT_MS) == StatusCode.SUCCESS, status.Message()
    finally:
        engine.close()
        peer.stop()


def test_a_target_drops_a_peer_that_stops_reading_its_answer():
    size = 16 << 20  # more than the kernel buffers of both sides hold
    target = io_peer.make_engine("reader-target", "TCP", {"io_timeout_ms": 200, "max_frame_payload": size})
    try:
        mem = Slab(size).register(target)
        with socket.socket() as rogue:
            rogue.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            rogue.connect(("127.0.0.1", target.get_engine_desc().port))
            send_frame(rogue, HelloFrame("lazy", "reader-target", max_payload=size))
            assert recv_frame(rogue, timeout=10).reply
            send_frame(rogue, ReadRequestFrame(1, (Segment(mem.id, 0, size),)))
            time.sleep(0.8)  # not reading: the target's send stalls for four times its io_timeout
            rogue.settimeout(1)
            received = 0
            try:
                while received < size and (chunk := rogue.recv(1 << 20)):
                    received += len(chunk)
            except (TimeoutError, ConnectionResetError):
                pass
            assert received < size, "the target kept the stalled connection and sent the whole answer"
    finally:
        target.close()
