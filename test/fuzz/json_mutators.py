"""Seeded mutators of ``--precompile`` config lists: wrong types (bool/float/str for ints), huge and
negative ints, unknown fields, empty and nested values, entries that are not objects, lone surrogates
(valid JSON, not encodable as UTF-8) and non-UTF-8 bytes in the file."""

from __future__ import annotations

import copy
import json
import random

EP_CONFIG = {"world_size": 8, "hidden_dim": 7168, "scale_dim": 0, "scale_type_size": 0, "max_token_type_size": 2,
             "max_num_inp_token_per_rank": 64, "num_experts_per_rank": 32, "num_experts_per_token": 8}  # fmt: skip
EP_FIELDS = (*EP_CONFIG, "data_type", "rank", "warp_num_per_block", "block_num", "max_total_recv_tokens",
             "use_external_inp_buf", "kernel_type", "gpu_per_node", "rdma_block_num", "num_qp_per_pe",
             "quant_type")  # fmt: skip
ENTRY_FIELDS = ("kernel", "ep", "target", "code_object_version", "opt_level", "bitcode", "device_library",
                "virtual_pes")  # fmt: skip
BASE_LISTS = (
    [{"kernel": "ring_put_signal", "target": "gfx942"}],
    [{"kernel": "shmem_all_ops", "target": "sm_90"}, {"kernel": "ring_put_signal", "target": "sm_90", "opt_level": 2}],
    [{"kernel": "k.mlir", "target": "gfx942"}],
    [{"ep": EP_CONFIG, "target": "gfx942"}],
    [{"ep": EP_CONFIG, "target": "sm_90", "virtual_pes": True}],
    [{"ep": {**EP_CONFIG, "kernel_type": 5}, "target": "gfx942"}],
    [{"ep": {**EP_CONFIG, "kernel_type": 4, "data_type": "bf16"}, "target": "gfx942"}],
    [{"kernel": "ring_put_signal", "target": "gfx942"}, {"ep": EP_CONFIG, "target": "gfx942", "opt_level": 1}],
)
VALUES = (True, False, None, 0, -1, 1, 2, 3, 5, 6, 7, 2**31, 2**31 - 1, 2**32, 2**40, 2**63, 2**64, 10**6, 10**30,
          -(2**63), 0.5, 1.0, 8.0, 7168.0, -0.0, 1e309, float("nan"), "", "8", "7168", "bf16", "f32", "fp8_e4m3fn",
          "torch.bfloat16", "none", "fp8", "gfx942", "sm_90", "gfx900", "gfx1250", "\ud800", "\udcff", "é", "a b",
          "\x00", "x" * 300, [], [1], [[]], {}, {"a": 1}, {"a": {"b": []}}, "ring_put_signal", "shmem_all_ops",
          "k.mlir", "missing.mlir", ".", "-", "..", "k.mlir\x00", "lib.bc", ["lib.bc"], ["missing.bc"], [5],
          "IntraNode", "AsyncLL", 4, 5, 8, 64, 1024, 1025)  # fmt: skip
UNKNOWN_FIELDS = ("colour", "", "Kernel", "ep ", "\ud800", "kernel\x00", "__class__", "config")
NOT_OBJECTS = (5, "x", [], None, True, 1.5, [{}])
NON_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xfe\xff")


def _pick_object(rng, configs):
    """An object inside the list to change: an entry or an entry's "ep" object."""
    objects = [c for c in configs if isinstance(c, dict)]
    objects += [c["ep"] for c in objects if isinstance(c.get("ep"), dict)]
    return rng.choice(objects) if objects else None


def set_field(rng, configs):
    obj = _pick_object(rng, configs)
    if obj is None:
        return [{"kernel": rng.choice(VALUES)}]
    fields = EP_FIELDS if "world_size" in obj or "hidden_dim" in obj else ENTRY_FIELDS
    key = rng.choice(list(obj) + list(fields)) if rng.random() < 0.5 else rng.choice(fields)
    obj[key] = copy.deepcopy(rng.choice(VALUES))
    return configs


def delete_field(rng, configs):
    obj = _pick_object(rng, configs)
    if obj:
        del obj[rng.choice(list(obj))]
    return configs


def unknown_field(rng, configs):
    obj = _pick_object(rng, configs)
    if obj is not None:
        obj[rng.choice(UNKNOWN_FIELDS)] = copy.deepcopy(rng.choice(VALUES))
    return configs


def nest_value(rng, configs):
    obj = _pick_object(rng, configs)
    if obj:
        key = rng.choice(list(obj))
        obj[key] = rng.choice(([obj[key]], {"value": obj[key]}, [[obj[key]]]))
    return configs


def entry_not_object(rng, configs):
    if configs:
        configs[rng.randrange(len(configs))] = copy.deepcopy(rng.choice(NOT_OBJECTS))
    else:
        configs.append(rng.choice(NOT_OBJECTS))
    return configs


def duplicate_entry(rng, configs):
    if configs:
        configs.insert(rng.randrange(len(configs) + 1), copy.deepcopy(rng.choice(configs)))
    return configs


def replace_list(rng, configs):
    return rng.choice(([], {}, {"configs": configs}, "x", 5, None, [configs], configs[:1] * 3))


STRUCTURE_MUTATORS = {
    "set_field": set_field, "delete_field": delete_field, "unknown_field": unknown_field,
    "nest_value": nest_value, "entry_not_object": entry_not_object, "duplicate_entry": duplicate_entry,
    "replace_list": replace_list,
}  # fmt: skip
WEIGHTS = {"set_field": 8, "delete_field": 2, "unknown_field": 1, "nest_value": 1, "entry_not_object": 1,
           "duplicate_entry": 1, "replace_list": 1}  # fmt: skip


def dump(configs) -> bytes:
    """One entry per line (so that the line reducer removes whole entries); lone surrogates escaped."""
    if isinstance(configs, list):
        body = ",\n".join(json.dumps(c) for c in configs)
        return ("[\n" + body + "\n]\n").encode("ascii") if configs else b"[]\n"
    return json.dumps(configs).encode("ascii")


def byte_damage(rng, data: bytes) -> bytes:
    """Non-UTF-8 bytes inside a string, or a truncation."""
    if rng.random() < 0.7:
        quotes = [i + 1 for i, b in enumerate(data) if b == ord('"')] or [len(data)]
        i = rng.choice(quotes)
        return data[:i] + rng.choice(NON_UTF8) + data[i:]
    return data[: rng.randrange(max(1, len(data)))]


def mutate_configs(rng: random.Random, max_stack: int = 3) -> tuple[bytes, list[str]]:
    """A mutated config list (JSON bytes) and the mutators applied."""
    base = copy.deepcopy(rng.choice(BASE_LISTS))
    names = list(STRUCTURE_MUTATORS)
    configs, applied = copy.deepcopy(base), []
    for _ in range(rng.randint(1, max_stack)):
        name = rng.choices(names, [WEIGHTS[n] for n in names])[0]
        configs = STRUCTURE_MUTATORS[name](rng, configs)
        applied.append(name)
        if not isinstance(configs, list):
            break
    data = dump(configs)
    if data == dump(base):  # the mutations cancelled out (a field set to its own value): change something
        configs = unknown_field(rng, configs)
        applied.append("unknown_field")
        data = dump(configs)
    if rng.random() < 0.12:
        data = byte_damage(rng, data)
        applied.append("byte_damage")
    return data, applied
