"""How the PEs' processes talk to each other (multi-process mode only): host objects, never device memory.

* The *rendezvous object* is anything with ``rank``, ``world_size``, ``all_gather_object(obj) -> list``
  and ``barrier()``; ``TorchComm`` provides it over a torch.distributed process group (gloo is enough).
  ``resolve_process_group`` finds a group registered by name. (``shmem_bootstrap`` makes MORI's unique id
  and the rendezvous object it carries.)
* *Init records*: at init every PE all-gathers one record (``init_record``: its PE, host, process, GPU,
  heap size, heap base, IPC handle, unique id, or the error that stopped it); ``gather_init_records``
  checks that every PE agrees before anyone maps a peer's heap. ``gather_failures`` all-gathers each PE's
  outcome of a later step, so that a failure on one PE fails every PE instead of leaving the others waiting.
* *Same calls on every PE*: MORI corrupts memory silently when PEs allocate in different orders. Here every
  ``shmem_malloc`` / ``shmem_free`` all-gathers (call number, size, alignment, resulting offset) and
  ``call_mismatch`` names both PEs' calls when they differ, so every PE raises. This makes malloc/free
  collective: every PE must call them, in the same order. Every PE takes part even when its own call
  failed, so that a local error never leaves the others waiting in the collective.
"""

from __future__ import annotations

import os
import socket

from .extras import import_extra
from .heap_allocator import HEAP_SIZE_ENV
from .shmem_errors import ShmemError, ShmemStateError


# ---- the rendezvous ----------------------------------------------------------------------------------


class TorchComm:
    """The collectives shmem needs, over a torch.distributed process group (None = WORLD)."""

    def __init__(self, group=None):
        self.dist = import_extra("torch.distributed")
        self.group = group
        try:
            self.rank = int(self.dist.get_rank(group=group))
            self.world_size = int(self.dist.get_world_size(group=group))
        except Exception:  # noqa: BLE001 - a C++ ProcessGroup the Python layer does not know
            if group is None:
                raise
            self.rank, self.world_size = int(group.rank()), int(group.size())

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)


def torch_distributed():
    """The torch.distributed module; ShmemStateError when torch or its distributed package is missing."""
    try:
        dist = import_extra("torch.distributed")
    except Exception as exc:  # noqa: BLE001
        raise ShmemStateError(f"multi-process shmem needs torch.distributed, which cannot be imported ({exc})") from exc
    if not dist.is_available():
        raise ShmemStateError("multi-process shmem needs torch.distributed, which this torch build lacks")
    return dist


def resolve_process_group(group_name: str):
    """The torch process group registered as ``group_name`` (None stands for WORLD)."""
    dist = torch_distributed()
    pg = None
    try:
        c10d = import_extra("torch._C._distributed_c10d")
        pg = c10d._resolve_process_group(group_name)
    except Exception:  # noqa: BLE001 - not registered (or no registry in this torch)
        pg = None
    if pg is not None:
        world = getattr(getattr(dist, "group", None), "WORLD", None)
        return None if world is not None and pg is world else pg
    if group_name.lower() in ("default", "world") and dist.is_initialized():
        return None
    if not dist.is_initialized():
        raise ShmemStateError(f"torch process group '{group_name}' not found and torch.distributed is not "
                              f"initialized: call torch.distributed.init_process_group first")  # fmt: skip
    raise ShmemError(f"no torch process group is registered as '{group_name}'; register one with "
                     f"torch._C._distributed_c10d._register_process_group('{group_name}', group), or use "
                     f"'default' for the WORLD group")  # fmt: skip


# ---- init: every PE's heap and identity --------------------------------------------------------------


def process_identity() -> int:
    """Tells processes on one host apart (the pid; tests that simulate ranks with threads replace it)."""
    return os.getpid()


def init_record(*, pe: int, device: int, heap_size: int, base: int, handle: bytes, unique_id: bytes | None,
                error: str | None) -> dict:  # fmt: skip
    """This PE's init record: who it is (PE, host, process, GPU), its heap (size, base as mapped in its own
    process, IPC handle), the unique id it was given, or the error that stopped it (then base is 0)."""
    return {"pe": pe, "host": socket.gethostname(), "pid": process_identity(), "device": device,
            "heap_size": heap_size, "base": base, "handle": handle,
            "unique_id": bytes(unique_id) if unique_id is not None else None, "error": error}  # fmt: skip


def gather_init_records(comm, mine: dict, n_pes: int) -> list[dict]:
    """Every PE's init record, in PE order; raises ShmemStateError (on every PE) unless all agree.
    Collective."""
    infos = comm.all_gather_object(mine)
    problem = _check_init_records(infos, mine, n_pes)
    if problem:
        raise ShmemStateError(problem)
    return infos


def _check_init_records(infos: list, mine: dict, n_pes: int) -> str | None:
    if len(infos) != n_pes:
        return f"shmem init: the process group returned {len(infos)} PEs' data, expected {n_pes}"
    for q, info in enumerate(infos):
        if info.get("error"):
            return f"shmem init failed on PE {q}: {info['error']}"
        if info["pe"] != q:
            return f"shmem init: PE data out of order (slot {q} holds PE {info['pe']})"
    for q, info in enumerate(infos):
        if info["heap_size"] != mine["heap_size"]:
            return (f"shmem init: PE {q} has a {info['heap_size']}-byte heap, PE {mine['pe']} a "
                    f"{mine['heap_size']}-byte one; set the same {HEAP_SIZE_ENV} on every PE")  # fmt: skip
        if info["unique_id"] != mine["unique_id"]:
            return (f"shmem init: PE {q} passed a different unique id than PE {mine['pe']}; every PE must pass "
                    f"the id that one PE got from shmem_get_unique_id()")  # fmt: skip
        if q != mine["pe"] and info["host"] == mine["host"] and info["pid"] == mine["pid"]:
            return (f"shmem init: PEs {mine['pe']} and {q} are the same process; multi-process shmem needs one "
                    f"process per PE (use shmem_init_virtual for several PEs in one process)")  # fmt: skip
    return None


def gather_failures(comm, local_error: str | None, what: str) -> None:
    """All-gather every PE's outcome of a step (``local_error``: None when it succeeded here); raises
    ShmemStateError ``what: PE q: error; ...`` on every PE if any PE failed. Collective."""
    errors = comm.all_gather_object(local_error)
    failed = [(q, e) for q, e in enumerate(errors) if e]
    if failed:
        raise ShmemStateError(f"{what}: " + "; ".join(f"PE {q}: {e}" for q, e in failed))


# ---- malloc/free: the same calls on every PE ---------------------------------------------------------


def call_mismatch(comm, my_pe: int, call: dict, error: str | None) -> str | None:
    """All-gather this PE's shmem call (``call``: op, seq, size, alignment, offset, error kind) and its error
    message; the message naming both calls for the first PE whose call differs, or None. Collective."""
    records = comm.all_gather_object(dict(call, message=error))
    for q, theirs in enumerate(records):
        if q == my_pe or {k: theirs.get(k) for k in call} == call:
            continue
        return (f"symmetric allocation mismatch at shmem call #{call['seq']}: PE {my_pe} did "
                f"{_describe(dict(call, message=error))}, PE {q} did {_describe(theirs)}; every PE must make the "
                f"same shmem_malloc/shmem_free calls (same sizes and alignments) in the same order")
    return None


def _describe(record: dict) -> str:
    if record.get("op") == "malloc":
        out = f"shmem_malloc(size={record['size']}, alignment={record['alignment']})"
    else:
        off = record.get("offset")
        out = "shmem_free(" + (f"offset 0x{off:x}" if off is not None else "a pointer outside the heap") + ")"
    if record.get("error"):
        return f"{out} -> error: {record.get('message') or record['error']}"
    if record.get("op") == "malloc":
        out += f" -> offset 0x{record['offset']:x}"
    return out
