"""MORI-IO's value types (runtime/io: enums, configs, descriptors, status, log) against MORI's API: names,
numeric values, defaults, refusals, the descriptors' wire bytes (computed by hand from the msgpack spec
below, not with msgpack), TransferStatus's semantics and wait_all. CPU only, fast."""

from __future__ import annotations

import logging
import os
import pickle
import random
import subprocess
import sys
import threading
import time

import msgpack
import pytest

import mori_compiler.io as mio
from mori_compiler.io import (BackendType, EngineDesc, IOEngineConfig, MemoryDesc, MemoryLocationType, PollCqMode,
                              RdmaBackendConfig, StatusCode, TcpBackendConfig, TransferStatus, XgmiBackendConfig,
                              set_log_level, wait_all)  # fmt: skip
from mori_compiler.runtime.io import descriptors, enums
from mori_compiler.runtime.io.log import LOGGER, TRACE

# ---- enums -------------------------------------------------------------------------------------------


def test_enum_values_are_moris():
    assert {m.name: m.value for m in BackendType} == {"Unknown": 0, "XGMI": 1, "RDMA": 2, "TCP": 3, "FABRIC": 4}
    assert {m.name: m.value for m in MemoryLocationType} == {"Unknown": 0, "CPU": 1, "GPU": 2}
    assert {m.name: m.value for m in StatusCode} == {
        "SUCCESS": 0, "INIT": 1, "IN_PROGRESS": 2, "ERR_INVALID_ARGS": 11, "ERR_NOT_FOUND": 12,
        "ERR_RDMA_OP": 13, "ERR_BAD_STATE": 14, "ERR_GPU_OP": 15,
    }  # fmt: skip
    assert {m.name: m.value for m in PollCqMode} == {"POLLING": 0, "EVENT": 1}
    assert BackendType.RDMA == 2 and int(StatusCode.ERR_GPU_OP) == 15


def test_err_begin_is_internal_and_failed_means_above_it():
    assert enums.ERR_BEGIN == 10
    assert "ERR_BEGIN" not in StatusCode.__members__
    with pytest.raises(ValueError):
        StatusCode(10)
    assert [c.name for c in StatusCode if c.failed] == [
        "ERR_INVALID_ARGS", "ERR_NOT_FOUND", "ERR_RDMA_OP", "ERR_BAD_STATE", "ERR_GPU_OP"]  # fmt: skip


# ---- configs -----------------------------------------------------------------------------------------


def test_io_engine_config_defaults_mutability_and_refusals():
    c = IOEngineConfig()
    assert (c.host, c.port) == ("", 0)
    c = IOEngineConfig("127.0.0.1", 65535)
    c.host, c.port = "10.0.0.2", 0
    assert (c.host, c.port) == ("10.0.0.2", 0)
    for bad in (-1, 65536):
        with pytest.raises(ValueError, match=r"IOEngineConfig\.port must be in \[0, 65535\]"):
            IOEngineConfig(port=bad)
    for bad in ("80", 80.0, True, None):
        with pytest.raises(TypeError, match=r"IOEngineConfig\.port must be an integer"):
            c.port = bad
    with pytest.raises(TypeError, match=r"IOEngineConfig\.host must be a str"):
        IOEngineConfig(host=b"127.0.0.1")
    with pytest.raises(AttributeError, match="no field 'prot'"):
        c.prot = 1
    assert (c.host, c.port) == ("10.0.0.2", 0)  # refused assignments change nothing


RDMA_DEFAULTS = {
    "qp_per_transfer": 1, "post_batch_size": -1, "num_worker_threads": -1, "poll_cq_mode": PollCqMode.POLLING,
    "enable_notification": True, "notif_per_qp": 1024, "enable_transfer_chunking": False, "chunk_bytes": 65536,
    "max_chunks_per_transfer": 64, "num_nics_per_transfer": 1, "max_send_wr": 0, "max_cqe_num": 0,
    "max_msg_sge": 0,
}  # fmt: skip
RDMA_CTOR_ORDER = list(RDMA_DEFAULTS)[:10]


def test_rdma_config_defaults_and_positional_order():
    c = RdmaBackendConfig()
    assert {name: getattr(c, name) for name in RDMA_DEFAULTS} == RDMA_DEFAULTS
    values = [4, 8, 2, PollCqMode.EVENT, False, 16, True, 8192, 3, 2]
    c = RdmaBackendConfig(*values)
    assert [getattr(c, name) for name in RDMA_CTOR_ORDER] == values
    assert RdmaBackendConfig(**dict(zip(RDMA_CTOR_ORDER, values))) == c
    with pytest.raises(TypeError):  # attribute-only fields, as in MORI
        RdmaBackendConfig(max_send_wr=1)
    c.max_send_wr, c.max_cqe_num, c.max_msg_sge = 256, 512, 2
    assert (c.max_send_wr, c.max_cqe_num, c.max_msg_sge) == (256, 512, 2)
    c.poll_cq_mode = 0  # an integer value becomes the member
    assert c.poll_cq_mode is PollCqMode.POLLING


@pytest.mark.parametrize("field, value, error", [
    ("qp_per_transfer", 0, ValueError), ("qp_per_transfer", 1.0, TypeError), ("qp_per_transfer", 2**31, ValueError),
    ("post_batch_size", 0, ValueError), ("post_batch_size", -2, ValueError),
    ("num_worker_threads", -2, ValueError), ("num_worker_threads", "4", TypeError),
    ("poll_cq_mode", 2, ValueError), ("poll_cq_mode", StatusCode.SUCCESS, TypeError),
    ("enable_notification", 1, TypeError), ("enable_notification", None, TypeError),
    ("notif_per_qp", -1, ValueError), ("notif_per_qp", 2**32, ValueError),
    ("enable_transfer_chunking", "yes", TypeError), ("chunk_bytes", 0, ValueError),
    ("max_chunks_per_transfer", 0, ValueError), ("num_nics_per_transfer", 0, ValueError),
    ("max_send_wr", -1, ValueError), ("max_cqe_num", True, TypeError), ("max_msg_sge", -1, ValueError),
])  # fmt: skip
def test_rdma_config_refuses_bad_fields(field, value, error):
    c = RdmaBackendConfig()
    with pytest.raises(error, match=rf"RdmaBackendConfig\.{field}"):
        setattr(c, field, value)
    assert getattr(c, field) == RDMA_DEFAULTS[field]
    if field in RDMA_CTOR_ORDER:
        with pytest.raises(error, match=rf"RdmaBackendConfig\.{field}"):
            RdmaBackendConfig(**{field: value})


def test_rdma_config_cross_field_checks_at_validate():
    RdmaBackendConfig().validate()
    c = RdmaBackendConfig(chunk_bytes=1024)  # fine while chunking is off, as in MORI
    c.validate()
    c.enable_transfer_chunking = True
    with pytest.raises(ValueError, match="chunk_bytes must be >= 4096 when enable_transfer_chunking"):
        c.validate()
    c = RdmaBackendConfig(notif_per_qp=0, enable_notification=False)
    c.validate()
    c.enable_notification = True
    with pytest.raises(ValueError, match="notif_per_qp must be >= 1 when enable_notification"):
        c.validate()


def test_rdma_config_env_overrides(caplog):
    base = RdmaBackendConfig(qp_per_transfer=2)
    env = {"MORI_IO_QP_PER_TRANSFER": " 4 ", "MORI_IO_POST_BATCH_SIZE": "16", "MORI_IO_NUM_WORKER_THREADS": "3",
           "MORI_IO_POLL_CQ_MODE": "Event", "MORI_IO_ENABLE_NOTIFICATION": "off", "MORI_IO_ENABLE_CHUNKING": "YES",
           "MORI_IO_CHUNK_BYTES": "8192", "MORI_IO_MAX_CHUNKS": "8", "MORI_IO_NUM_NICS_PER_TRANSFER": "2"}  # fmt: skip
    c = base.with_env_overrides(env)
    assert (c.qp_per_transfer, c.post_batch_size, c.num_worker_threads, c.poll_cq_mode, c.enable_notification,
            c.enable_transfer_chunking, c.chunk_bytes, c.max_chunks_per_transfer, c.num_nics_per_transfer) == (
            4, 16, 3, PollCqMode.EVENT, False, True, 8192, 8, 2)  # fmt: skip
    assert base.qp_per_transfer == 2 and base.poll_cq_mode is PollCqMode.POLLING  # a copy
    assert base.with_env_overrides({"MORI_IO_POLL_CQ_MODE": "1"}).poll_cq_mode is PollCqMode.EVENT
    bad = {"MORI_IO_QP_PER_TRANSFER": "0", "MORI_IO_CHUNK_BYTES": "64k", "MORI_IO_ENABLE_NOTIFICATION": "maybe",
           "MORI_IO_POLL_CQ_MODE": "interrupt", "MORI_IO_MAX_CHUNKS": ""}  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="mori_compiler.io"):  # restores the level afterwards
        c = base.with_env_overrides(bad)
    assert c == base  # invalid values are ignored, keeping the config's, as MORI does
    text = caplog.text
    for variable in ("MORI_IO_QP_PER_TRANSFER", "MORI_IO_CHUNK_BYTES", "MORI_IO_ENABLE_NOTIFICATION",
                     "MORI_IO_POLL_CQ_MODE"):  # fmt: skip
        assert f"ignoring {variable}=" in text, text
    assert "MORI_IO_MAX_CHUNKS" not in text  # empty = unset


def test_xgmi_config():
    c = XgmiBackendConfig()
    assert (c.num_streams, c.num_events) == (64, 64)
    c = XgmiBackendConfig(8, 0)
    assert (c.num_streams, c.num_events, c.effective_num_streams, c.effective_num_events) == (8, 0, 8, 64)
    c.num_streams = -3
    assert c.effective_num_streams == 64
    with pytest.raises(TypeError, match=r"XgmiBackendConfig\.num_events"):
        c.num_events = 2.5
    with pytest.raises(ValueError, match=r"XgmiBackendConfig\.num_streams"):
        XgmiBackendConfig(2**31)


def test_tcp_config():
    c = TcpBackendConfig()
    assert (c.num_connections, c.max_frame_payload, c.connect_timeout_ms, c.io_timeout_ms,
            c.enable_notification) == (1, 4 << 20, 5000, 5000, True)  # fmt: skip
    c.io_timeout_ms = 0
    c.num_connections = 64
    for field, value in (("num_connections", 0), ("num_connections", 65), ("max_frame_payload", 4095),
                         ("max_frame_payload", (1 << 30) + 1), ("connect_timeout_ms", 0),
                         ("io_timeout_ms", -1)):  # fmt: skip
        with pytest.raises(ValueError, match=rf"TcpBackendConfig\.{field}"):
            setattr(c, field, value)
    with pytest.raises(TypeError, match=r"TcpBackendConfig\.enable_notification"):
        TcpBackendConfig(enable_notification=0)


# ---- descriptors: wire bytes ------------------------------------------------------------------------

# msgpack spec: fixarray 0x90|n, fixstr 0xa0|n, positive fixint 0x00-0x7f, negative fixint 0xe0-0xff,
# uint16 0xcd, uint32 0xce, uint64 0xcf (big-endian), bin8 0xc4 len.
ENGINE_FIELDS = dict(key="engine-a", node_id="node-1", hostname="host", host="10.0.0.1", port=40000, pid=1234)
ENGINE_BYTES = bytes.fromhex(
    "96"                          # array of 6
    "a8" + b"engine-a".hex() +    # key
    "a6" + b"node-1".hex() +      # node_id
    "a4" + b"host".hex() +        # hostname
    "a8" + b"10.0.0.1".hex() +    # host
    "cd9c40"                      # port 40000 = 0x9c40, uint16
    "cd04d2"                      # pid 1234 = 0x04d2, uint16
)  # fmt: skip

HANDLE = bytes(range(64))
MEMORY_FIELDS = dict(engine_key="eng", id=7, device_id=1, device_bus_id="0000:1b:00.0", data=0x7F0012345000,
                     size=1 << 20, loc=MemoryLocationType.GPU, ipc_handle=HANDLE, numa_node=-1,
                     ipc_offset=4096)  # fmt: skip
MEMORY_BYTES = bytes.fromhex(
    "9f"                              # array of 15
    "a3" + b"eng".hex() +             # engine_key
    "07"                              # id 7
    "01"                              # device_id 1
    "ac" + b"0000:1b:00.0".hex() +    # device_bus_id (12 chars)
    "cf00007f0012345000"              # data, uint64
    "ce00100000"                      # size 1 MiB, uint32
    "02"                              # loc GPU
    "c440" + HANDLE.hex() +           # ipc_handle: bin8 of 64 bytes
    "ff"                              # numa_node -1
    "cd1000"                          # ipcOffset 4096, uint16
    "c440" + "00" * 64 +              # fabricHandle (zero)
    "00"                              # vpodId 0
    "a0"                              # vpodPpodId ""
    "00"                              # fabricOffset 0
    "00"                              # fabricAllocSize 0
)  # fmt: skip


def engine(**changes) -> EngineDesc:
    return EngineDesc._from_fields(**{**ENGINE_FIELDS, **changes})


def memory(**changes) -> MemoryDesc:
    return MemoryDesc._from_fields(**{**MEMORY_FIELDS, **changes})


def test_engine_desc_golden_bytes_and_round_trip():
    d = engine()
    assert d.pack() == ENGINE_BYTES
    back = EngineDesc.unpack(ENGINE_BYTES)
    assert back == d and {k: getattr(back, k) for k in ENGINE_FIELDS} == ENGINE_FIELDS
    assert EngineDesc.unpack(bytearray(ENGINE_BYTES)) == d and EngineDesc.unpack(memoryview(ENGINE_BYTES)) == d


def test_memory_desc_golden_bytes_and_round_trip():
    d = memory()
    assert d.pack() == MEMORY_BYTES
    back = MemoryDesc.unpack(MEMORY_BYTES)
    assert back == d and back.ipc_handle == HANDLE and back.loc is MemoryLocationType.GPU
    assert {k: getattr(back, k) for k in MEMORY_FIELDS} == MEMORY_FIELDS


def test_default_memory_desc_bytes():
    d = MemoryDesc()
    assert (d.engine_key, d.id, d.device_id, d.device_bus_id, d.data, d.size, d.loc, d.ipc_handle, d.numa_node,
            d.ipc_offset) == ("", 0, -1, "", 0, 0, MemoryLocationType.Unknown, bytes(64), -1, 0)  # fmt: skip
    expected = bytes.fromhex("9f" "a0" "00" "ff" "a0" "00" "00" "00" "c440" + "00" * 64 + "ff" "00"
                             "c440" + "00" * 64 + "00" "a0" "00" "00")  # fmt: skip
    assert d.pack() == expected


def test_extreme_values_round_trip():
    d = memory(id=2**32 - 1, device_id=-(2**31), data=2**64 - 1, size=2**64 - 1, numa_node=2**31 - 1,
               ipc_offset=2**64 - 1, engine_key="ключ-é" * 100)  # fmt: skip
    back = MemoryDesc.unpack(d.pack())
    assert back == d and back.engine_key == d.engine_key and back.data == 2**64 - 1
    e = engine(port=0, pid=2**31 - 1, host="")
    assert EngineDesc.unpack(e.pack()) == e


def test_short_arrays_take_defaults_and_extra_elements_are_ignored():
    # MORI's older 9-field MemoryDesc (before ipcOffset and FABRIC): the tail takes its defaults.
    old = msgpack.packb(["eng", 7, 1, "0000:1b:00.0", 0x1000, 64, 2, HANDLE, 0], use_bin_type=True)
    d = MemoryDesc.unpack(old)
    assert (d.engine_key, d.data, d.size, d.ipc_handle, d.numa_node, d.ipc_offset) == ("eng", 0x1000, 64, HANDLE, 0, 0)
    assert MemoryDesc.unpack(b"\x90") == MemoryDesc()
    short = EngineDesc.unpack(msgpack.packb(["k", "n"]))
    assert (short.key, short.node_id, short.hostname, short.host, short.port, short.pid) == ("k", "n", "", "", 0, 0)
    # A newer peer's extra fields, of any type, are ignored.
    extended = b"\x99" + ENGINE_BYTES[1:] + msgpack.packb({"x": [1, 2]}) + b"\xc0\xc3"  # array of 9
    assert EngineDesc.unpack(extended) == engine()
    assert MemoryDesc.unpack(b"\xdc\x00\x10" + MEMORY_BYTES[1:] + b"\x05") == memory()  # array16 of 16


# ---- descriptors: behaviour -------------------------------------------------------------------------


def test_engine_desc_has_no_public_constructor_and_is_read_only():
    with pytest.raises(TypeError, match="no public constructor"):
        EngineDesc()
    with pytest.raises(TypeError, match="no public constructor"):
        EngineDesc(*ENGINE_FIELDS.values())
    d = engine()
    with pytest.raises(AttributeError, match="read-only"):
        d.port = 1
    with pytest.raises(AttributeError, match="read-only"):
        del d.key
    with pytest.raises(TypeError):
        MemoryDesc(engine_key="x")  # default-constructible only, as in MORI
    with pytest.raises(AttributeError, match="read-only"):
        memory().size = 0


def test_engine_desc_equality_compares_all_six_fields():
    d = engine()
    assert d == engine() and hash(d) == hash(engine())
    for name, other in (("key", "b"), ("node_id", "x"), ("hostname", "h2"), ("host", "10.0.0.9"), ("port", 1),
                        ("pid", 1)):  # fmt: skip
        assert d != engine(**{name: other}), name
    assert d != "engine-a" and d != memory()
    assert d._replace(port=5).port == 5 and d.port == 40000


def test_memory_desc_equality_rules():
    d = memory()
    for name, other in (("engine_key", "e2"), ("id", 8), ("device_id", 2), ("device_bus_id", "0000:1c:00.0"),
                        ("data", 1), ("size", 1), ("loc", MemoryLocationType.CPU), ("numa_node", 0),
                        ("ipc_offset", 0)):  # fmt: skip
        assert d != memory(**{name: other}), name
    # The handles and the FABRIC fields are not compared (MORI's operator==).
    same = memory(ipc_handle=bytes(64), fabric_handle=b"\x01" * 64, vpod_id=3, vpod_ppod_id="p",
                  fabric_offset=9, fabric_alloc_size=10)  # fmt: skip
    assert d == same and hash(d) == hash(same)
    assert pickle.loads(pickle.dumps(d)) == d and pickle.loads(pickle.dumps(d)).ipc_handle == HANDLE


@pytest.mark.parametrize("field, value, error", [
    ("data", -1, ValueError), ("size", 2**64, ValueError), ("id", 2**32, ValueError), ("device_id", 2**31, ValueError),
    ("ipc_handle", bytes(63), ValueError), ("ipc_handle", "x" * 64, TypeError), ("loc", 3, ValueError),
    ("engine_key", None, TypeError), ("engine_key", "\udc80", ValueError), ("numa_node", 1.0, TypeError),
])  # fmt: skip
def test_memory_desc_fields_are_checked(field, value, error):
    with pytest.raises(error, match=rf"MemoryDesc\.{field}"):
        memory(**{field: value})


def _fields_replaced(index: int, value) -> bytes:
    values = [descriptors._wire(getattr(memory(), f.name)) for f in MemoryDesc._FIELDS]
    values[index] = value
    return msgpack.packb(values, use_bin_type=True)


BAD_MEMORY_BYTES = [
    (b"", "not one well-formed msgpack value"),
    (MEMORY_BYTES[:-1], "not one well-formed msgpack value"),
    (MEMORY_BYTES + b"\x00", "trailing bytes"),
    (b"\xc1", "starts no msgpack value"),
    (b"\x91" * 10000, "nested too deeply"),
    (b"\xdd\xff\xff\xff\xff", "max_array_len"),         # array32 of 4G elements
    (b"\x91\xdb\xff\xff\xff\xff", "not one well-formed"),  # str32 of 4 GiB, 0 bytes present
    (b"\x91\xc6" + (70000).to_bytes(4, "big") + bytes(70000), "max_bin_len"),  # a 70 kB bin
    (b"\xdf\xff\xff\xff\xff", "not one well-formed"),     # map32
    (msgpack.packb({"engine_key": "x"}), "expected a msgpack array of fields, got a map"),
    (msgpack.packb(5), "got an integer"),
    (_fields_replaced(0, b"eng"), "MemoryDesc.engine_key must be a str, not bytes"),
    (_fields_replaced(1, -1), r"MemoryDesc.id must be in \[0, 4294967295\]"),
    (_fields_replaced(1, True), "MemoryDesc.id must be an integer, not bool"),
    (_fields_replaced(4, 1.5), "MemoryDesc.data must be an integer, not float"),
    (_fields_replaced(6, 9), "MemoryDesc.loc: 9 is not a MemoryLocationType"),
    (_fields_replaced(7, bytes(63)), "MemoryDesc.ipc_handle must be exactly 64 bytes, got 63"),
    (_fields_replaced(7, "a" * 64), "MemoryDesc.ipc_handle must be bytes, not str"),
    (_fields_replaced(10, None), "MemoryDesc.fabric_handle must be bytes, not NoneType"),
    (b"\x91\xa2\xff\xfe", "not one well-formed msgpack value"),  # invalid UTF-8 in a str
    (ENGINE_BYTES, "MemoryDesc.id must be an integer, not str"),
    (b"\x91\x81\x90\x00", "unhashable"),                       # a map keyed by an array
    (b"\x91\xd4\x01\x02", "MemoryDesc.engine_key must be a str, not ExtType"),
    (b"\x91\xd6\xff\x00\x00\x00\x01", "must be a str, not Timestamp"),
    (b"\x91\xc7\x03\xff\x00\x00\x00", "not one well-formed"),  # a timestamp of a bad length
    (b"\x92\xa1k\xcb\x7f\xf8" + bytes(6), "MemoryDesc.id must be an integer, not float"),  # NaN
]  # fmt: skip


@pytest.mark.parametrize("data, message", BAD_MEMORY_BYTES, ids=[m[1][:40] for m in BAD_MEMORY_BYTES])
def test_memory_desc_unpack_refuses_bad_bytes(data, message):
    with pytest.raises(ValueError, match=message):
        MemoryDesc.unpack(data)


def test_engine_desc_unpack_refusals():
    with pytest.raises(ValueError, match=r"EngineDesc.port must be in \[0, 65535\]"):
        EngineDesc.unpack(msgpack.packb(["k", "n", "h", "1.2.3.4", 70000, 1]))
    with pytest.raises(ValueError, match="EngineDesc.key must be a str, not NoneType"):
        EngineDesc.unpack(b"\x91\xc0")
    with pytest.raises(ValueError, match="EngineDesc.node_id must be a str, not int"):
        EngineDesc.unpack(MEMORY_BYTES)
    with pytest.raises(TypeError, match="takes bytes, not str"):
        EngineDesc.unpack(ENGINE_BYTES.hex())


def _random_object(rng: random.Random, depth: int = 0):
    kinds = ["int", "neg", "big", "str", "bin", "float", "bool", "nil"] + (["list", "map"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randrange(0, 300)
    if kind == "neg":
        return -rng.randrange(1, 2**40)
    if kind == "big":
        return rng.randrange(2**32, 2**64)
    if kind == "str":
        return "".join(rng.choice("ab:é0") for _ in range(rng.randrange(20)))
    if kind == "bin":
        return rng.randbytes(rng.choice([0, 1, 63, 64, 65, 200]))
    if kind == "float":
        return rng.random()
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "nil":
        return None
    if kind == "list":
        return [_random_object(rng, depth + 1) for _ in range(rng.randrange(18))]
    return {rng.randrange(5): _random_object(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_unpack_fuzz_only_value_errors_in_bounded_time():
    rng = random.Random(20261201)
    valid = [MEMORY_BYTES, ENGINE_BYTES, MemoryDesc().pack()]
    inputs = [rng.randbytes(rng.randrange(40)) for _ in range(1500)]
    for _ in range(1500):  # mutated valid descriptors: flipped bytes, truncations, splices
        b = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        inputs.append(bytes(b[: rng.randrange(len(b) + 1)]) if rng.random() < 0.3 else bytes(b))
    for _ in range(1500):  # random msgpack values, mostly arrays of the right length
        obj = _random_object(rng)
        if rng.random() < 0.7:
            obj = [_random_object(rng, 3) for _ in range(rng.choice([6, 15, 16, 3]))]
        inputs.append(msgpack.packb(obj, use_bin_type=True))
    start = time.monotonic()
    outcomes = {"ok": 0, "refused": 0}
    for data in inputs:
        for cls in (EngineDesc, MemoryDesc):
            try:
                desc = cls.unpack(data)
            except ValueError:
                outcomes["refused"] += 1
            else:
                outcomes["ok"] += 1
                assert cls.unpack(desc.pack()) == desc  # whatever is accepted re-packs to itself
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes
    assert time.monotonic() - start < 20


def test_local_node_id(monkeypatch, tmp_path):
    monkeypatch.setenv("MORI_NODE_ID", "node-x")
    assert descriptors.local_node_id() == "node-x"
    monkeypatch.delenv("MORI_NODE_ID")
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    monkeypatch.setattr(descriptors, "_BOOT_ID", str(boot))
    assert descriptors.local_node_id() == "1234-abcd"
    monkeypatch.setenv("MORI_NODE_ID", "")  # empty = unset
    assert descriptors.local_node_id() == "1234-abcd"
    boot.write_text("")
    import socket

    assert descriptors.local_node_id() == socket.gethostname()
    monkeypatch.setattr(descriptors, "_BOOT_ID", str(tmp_path / "missing"))
    assert descriptors.local_node_id() == socket.gethostname()


# ---- TransferStatus ---------------------------------------------------------------------------------


def within(seconds: float, fn, *args):
    """``fn(*args)`` on a daemon thread, failing (instead of hanging the suite) if it blocks longer."""
    result = []
    t = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)}{args} still blocked after {seconds} s"
    return result[0]


def in_progress() -> TransferStatus:
    s = TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    return s


def test_status_starts_init_and_predicates():
    s = TransferStatus()
    assert s.Code() is StatusCode.INIT and s.Message() == "" and s.Init()
    assert not (s.InProgress() or s.Succeeded() or s.Failed())
    expected = {StatusCode.SUCCESS: "Succeeded", StatusCode.INIT: "Init", StatusCode.IN_PROGRESS: "InProgress"}
    for code in StatusCode:
        s.SetCode(code)
        got = {name for name in ("Init", "InProgress", "Succeeded", "Failed") if getattr(s, name)()}
        assert got == {expected.get(code, "Failed")}, code
    s.SetCode(13)  # an integer value is accepted and becomes the member
    assert s.Code() is StatusCode.ERR_RDMA_OP


def test_update_first_error_wins_and_setcode_is_unconditional():
    s = in_progress()
    s.Update(StatusCode.SUCCESS, "part one")
    assert s.Code() is StatusCode.SUCCESS and s.Message() == "part one"
    s.Update(StatusCode.ERR_RDMA_OP, "first")  # a success does not protect
    s.Update(StatusCode.ERR_INVALID_ARGS, "second")
    s.Update(StatusCode.SUCCESS, "late success")
    assert (s.Code(), s.Message()) == (StatusCode.ERR_RDMA_OP, "first")
    s.SetCode(StatusCode.SUCCESS)
    assert (s.Code(), s.Message()) == (StatusCode.SUCCESS, "first")  # SetCode leaves the message
    s.SetCode(StatusCode.IN_PROGRESS, "again")
    s.SetMessage("m")
    assert (s.Code(), s.Message()) == (StatusCode.IN_PROGRESS, "m")


def test_status_refusals():
    s = TransferStatus()
    with pytest.raises(ValueError, match="TransferStatus.SetCode code: 10 is not a StatusCode"):
        s.SetCode(10)
    with pytest.raises(TypeError, match="TransferStatus.Update code must be a StatusCode, not BackendType"):
        s.Update(BackendType.RDMA, "")
    with pytest.raises(TypeError, match="TransferStatus.Update msg must be a str"):
        s.Update(StatusCode.SUCCESS, None)
    with pytest.raises(TypeError, match="TransferStatus.WaitFor timeout_ms must be an integer"):
        s.WaitFor(1.5)
    with pytest.raises(TypeError, match="SetProgressCallback takes a callable"):
        s.SetProgressCallback(5)
    assert s.Code() is StatusCode.INIT


def test_waitfor_returns_at_once_unless_in_progress():
    s = TransferStatus()
    start = time.monotonic()
    assert s.WaitFor(5000) is StatusCode.INIT and s.WaitFor() is StatusCode.INIT
    s.SetCode(StatusCode.ERR_GPU_OP)
    s.Wait()
    assert s.WaitFor(5000) is StatusCode.ERR_GPU_OP
    assert time.monotonic() - start < 1
    assert in_progress().WaitFor(0) is StatusCode.IN_PROGRESS


def test_waitfor_times_out():
    s = in_progress()
    start = time.monotonic()
    assert s.WaitFor(150) is StatusCode.IN_PROGRESS
    assert 0.14 <= time.monotonic() - start < 3


def _complete_later(s: TransferStatus, delay: float, code=StatusCode.SUCCESS) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), s.Update(code, "done")))
    t.start()
    return t


def test_waitfor_and_wait_are_woken_by_another_thread():
    s = in_progress()
    t = _complete_later(s, 0.2)
    start = time.monotonic()
    assert within(10, s.WaitFor, 30_000) is StatusCode.SUCCESS
    assert 0.15 <= time.monotonic() - start < 10  # woken by the Update, long before the timeout
    t.join()
    s = in_progress()
    t = _complete_later(s, 0.05, StatusCode.ERR_BAD_STATE)
    within(10, s.Wait)
    assert s.Code() is StatusCode.ERR_BAD_STATE and s.Message() == "done"
    t.join()


def test_waiting_sleeps_instead_of_spinning():
    s = in_progress()
    cpu = time.process_time()
    assert s.WaitFor(300) is StatusCode.IN_PROGRESS
    assert time.process_time() - cpu < 0.1  # the waiter slept (GIL released), it did not poll


def test_progress_callback_drives_code_and_waits():
    s = in_progress()
    polls = []

    def progress():
        polls.append(1)
        if len(polls) == 3:
            s.Update(StatusCode.SUCCESS, "")

    s.SetProgressCallback(progress)
    assert s.InProgress() and s.Code() is StatusCode.IN_PROGRESS and len(polls) == 2
    assert s.Succeeded() and len(polls) == 3
    assert s.Code() is StatusCode.SUCCESS and len(polls) == 3  # not polled once done
    # Neither an unbounded nor a bounded wait needs a wake-up when a progress callback exists.
    for timeout in (-1, 10_000):
        s = in_progress()
        deadline = time.monotonic() + 0.1
        s.SetProgressCallback(lambda s=s, d=deadline: time.monotonic() > d and s.SetCode(StatusCode.SUCCESS))
        assert within(5, s.WaitFor, timeout) is StatusCode.SUCCESS


def test_wait_callback_used_by_unbounded_waits_only():
    s = in_progress()
    calls = []
    s.SetWaitCallback(lambda: (calls.append(1), s.SetCode(StatusCode.SUCCESS)))
    assert s.WaitFor(50) is StatusCode.IN_PROGRESS and calls == []
    within(10, s.Wait)
    assert calls == [1] and s.Succeeded()


def test_concurrent_updates_keep_code_and_message_together():
    s = in_progress()
    codes = [StatusCode.ERR_INVALID_ARGS, StatusCode.ERR_RDMA_OP, StatusCode.ERR_BAD_STATE, StatusCode.ERR_GPU_OP]
    barrier = threading.Barrier(len(codes))

    def worker(code):
        barrier.wait()
        for _ in range(200):
            s.Update(StatusCode.SUCCESS, "ok")
            s.Update(code, code.name)

    threads = [threading.Thread(target=worker, args=(c,)) for c in codes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.Code() in codes and s.Message() == s.Code().name


# ---- wait_all ---------------------------------------------------------------------------------------


def done(code) -> TransferStatus:
    s = TransferStatus()
    s.SetCode(code)
    return s


def test_wait_all_poll():
    assert wait_all([]) is StatusCode.SUCCESS and wait_all([], 0) is StatusCode.SUCCESS
    assert wait_all([done(0), None, done(0)], 0) is StatusCode.SUCCESS
    assert wait_all([in_progress(), done(0)], 0) is StatusCode.IN_PROGRESS
    mixed = [in_progress(), done(StatusCode.ERR_GPU_OP), done(StatusCode.ERR_RDMA_OP)]
    assert wait_all(mixed, 0) is StatusCode.ERR_GPU_OP
    assert wait_all([done(0), TransferStatus()], 0) is StatusCode.INIT


def test_wait_all_unbounded_waits_for_every_status():
    a, b, c = in_progress(), in_progress(), in_progress()
    threads = [_complete_later(a, 0.05), _complete_later(b, 0.1, StatusCode.ERR_RDMA_OP),
               _complete_later(c, 0.15, StatusCode.ERR_GPU_OP)]  # fmt: skip
    assert within(10, wait_all, [a, b, c]) is StatusCode.ERR_RDMA_OP
    assert c.Code() is StatusCode.ERR_GPU_OP  # waited for, although b had already failed
    for t in threads:
        t.join()
    assert wait_all([done(0), TransferStatus()], -1) is StatusCode.INIT  # never issued = failure


def test_wait_all_bounded():
    start = time.monotonic()
    assert wait_all([done(0), in_progress(), in_progress()], 150) is StatusCode.IN_PROGRESS
    assert 0.14 <= time.monotonic() - start < 3
    assert wait_all([done(StatusCode.ERR_BAD_STATE), in_progress()], 50) is StatusCode.ERR_BAD_STATE
    a = in_progress()
    t = _complete_later(a, 0.05)
    assert within(10, wait_all, [a, done(0)], 10_000) is StatusCode.SUCCESS
    t.join()
    with pytest.raises(TypeError, match=r"wait_all statuses\[1\] must be a TransferStatus"):
        wait_all([done(0), StatusCode.SUCCESS])


# ---- logging and the public module -------------------------------------------------------------------


def test_set_log_level():
    before = LOGGER.level
    try:
        for name, level in (("trace", TRACE), ("DEBUG", logging.DEBUG), ("Info", logging.INFO),
                            ("warn", logging.WARNING), ("warning", logging.WARNING), ("error", logging.ERROR),
                            ("CRITICAL", logging.CRITICAL)):  # fmt: skip
            set_log_level(name)
            assert LOGGER.level == level and LOGGER.name == "mori_compiler.io"
        with pytest.raises(ValueError, match="unknown MORI-IO log level 'verbose'.*trace, debug, info, warn"):
            set_log_level("verbose")
        with pytest.raises(TypeError):
            set_log_level(10)
        assert LOGGER.level == logging.CRITICAL
    finally:
        LOGGER.setLevel(before)


@pytest.mark.parametrize("env, level, warned", [
    ({}, "ERROR", False), ({"MORI_IO_LOG_LEVEL": "debug"}, "DEBUG", False),
    ({"MORI_GLOBAL_LOG_LEVEL": "info"}, "INFO", False),
    ({"MORI_IO_LOG_LEVEL": "trace", "MORI_GLOBAL_LOG_LEVEL": "info"}, "TRACE", False),
    ({"MORI_IO_LOG_LEVEL": "loud"}, "ERROR", True),
])  # fmt: skip
def test_log_level_from_environment(env, level, warned):
    clean = {k: v for k, v in os.environ.items() if k not in ("MORI_IO_LOG_LEVEL", "MORI_GLOBAL_LOG_LEVEL")}
    code = "import logging, mori_compiler.io; print(logging.getLevelName(logging.getLogger('mori_compiler.io').level))"
    proc = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == level
    assert ("unknown MORI-IO log level 'loud'" in proc.stderr) == warned, proc.stderr


def test_public_module_exports_moris_names():
    present = {"IOEngineConfig", "StatusCode", "BackendType", "EngineDesc", "MemoryDesc", "MemoryLocationType",
               "PollCqMode", "RdmaBackendConfig", "XgmiBackendConfig", "set_log_level", "TransferStatus"}  # fmt: skip
    assert present <= set(mio.__all__)
    for name in mio.__all__:
        assert getattr(mio, name) is not None
    from mori_compiler.runtime.io import status

    assert mio.TransferStatus is status.TransferStatus and mio.wait_all is status.wait_all
