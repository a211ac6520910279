"""Launch-geometry tuning tables of the EP op (MORI's v1 JSON tuning files): format, loading, lookup, writing.

The op's AUTO mode reads them through mori_compiler/ops/auto_launch.py (``tuning_table_for`` per phase,
``TuningTable.lookup`` per call, ``auto_fallback`` where no rule applies); bench/ep_tune.py measures and
writes them (``write_tuning_table``, ``merge_rules``).

**Format** (MORI's, read unchanged). One file per (arch, model, kernel type, EP size, phase), named
``{arch}_{model}_{KernelType}_ep{W}_{phase}.json``::

    {"version": "1.0", "gpu_arch": "gfx950", "gpu_model": "mi355x", "kernel_type": "IntraNode",
     "ep_size": 8, "phase": "dispatch", "rules": [{"dtype": "bf16", "num_tokens": 128, "hidden_dim": 7168,
     "block_num": 256, "rdma_block_num": 0, "warp_per_block": 8, "bandwidth_gbps": 120.5}, ...]}

A rule requires ``dtype`` (bf16 | fp8_e4m3_fnuz | fp8_e4m3 | fp4), ``num_tokens``, ``hidden_dim`` and the
geometry ``block_num``, ``rdma_block_num``, ``warp_per_block``; a combine rule also ``zero_copy`` (bool) and
``quant_type`` (none | fp8_direct_cast | fp8_blockwise). ``topk`` is optional (a rule without it matches
any top-k). The measurements (``bandwidth_gbps``, ``latency_us``, ``avg_*``) are informational: kept in
``TuningRule.info``, never read by the lookup.

**Lookup** (MORI's passes, in order; the first that finds a rule wins): (hidden_dim and topk match) →
(hidden_dim matches, any topk) → (topk matches, any hidden_dim) → (any). Every pass requires the dtype (and
for combine zero_copy and quant_type, when given) to match exactly. Within a pass the rules are scanned in
MORI's order (sorted by dtype, hidden_dim, [zero_copy, quant_type,] num_tokens; ties in file order): the
first with ``num_tokens`` >= the request wins, else the last one scanned (the largest bucket: a request above
every bucket is clamped to it).

**Ours, not MORI's.** MORI skips a bad rule or file with a log warning and runs untuned (and only warns
about a header of another arch); here every problem (missing file, not JSON, unknown, missing or repeated
field, wrong type, geometry outside the limits of mori_compiler/ops/config.py, two rules of one key, a header
that does not match the request) is an error naming the file, the rule index and the field. Our targets add ``sm_90`` (models such as ``h200``) to MORI's gfx
arches. ``MORI_EP_TUNING_CONFIG`` names one file as in MORI, or several separated by ``os.pathsep`` (each is
used for the phase its header names; a phase no file names gets no table). Dtype names: MORI's
``fp8_e4m3_fnuz`` and ``fp8_e4m3`` are this project's ``fp8_e4m3fnuz`` and ``fp8_e4m3fn``; ``bf16`` is the
same; ``fp4`` is ``fp4_e2m1fn_x2`` (rows of x2 elements, moved by the 1-byte kernels); our
``f32`` has no MORI name (no rule can hold it: its lookups find nothing). ``MORI_EP_LAUNCH_CONFIG_MODE`` is
read case-insensitively; a value other than MANUAL or AUTO is an error.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mori_compiler.ep_schema import INTERNODE, MAX_BLOCKS, MAX_HIDDEN_DIM, EpDispatchCombineKernelType
from mori_compiler.ops.config import _is_int
from mori_compiler.targets import MAX_BLOCK_THREADS, TARGETS

VERSION = "1.0"
PHASES = ("dispatch", "combine")
SHIPPED_DIR = Path(__file__).parent / "tuning_configs"
# MORI's dtype names -> this project's (None: no counterpart here).
MORI_DTYPES = {"bf16": "bf16", "fp8_e4m3_fnuz": "fp8_e4m3fnuz", "fp8_e4m3": "fp8_e4m3fn", "fp4": "fp4_e2m1fn_x2"}
_OUR_TO_MORI = {ours: mori for mori, ours in MORI_DTYPES.items() if ours}
QUANT_TYPES = ("none", "fp8_direct_cast", "fp8_blockwise")
INFO_FIELDS = ("bandwidth_gbps", "latency_us", "avg_rdma_bandwidth_gbps", "avg_xgmi_bandwidth_gbps",
               "avg_ll_bandwidth_gbps", "avg_latency_us")  # fmt: skip
_HEADER_FIELDS = ("version", "gpu_arch", "gpu_model", "kernel_type", "ep_size", "phase", "rules")
_KEY_FIELDS = {"dispatch": ("dtype", "num_tokens", "hidden_dim"),
               "combine": ("dtype", "num_tokens", "hidden_dim", "zero_copy", "quant_type")}  # fmt: skip
_GEOMETRY = ("block_num", "rdma_block_num", "warp_per_block")
_MODEL = re.compile(r"[a-z0-9]+")  # one file-name component: no "_", which separates them
MAX_EP_SIZE = 1024  # MORI ships EP16 files; an EP size above this is a typo, not a machine
MAX_RULE_TOKENS = 2**31 - 1  # a bucket bound, not a buffer size (MORI ships buckets up to 262144)

LAUNCH_MODE_VAR = "MORI_EP_LAUNCH_CONFIG_MODE"
TUNING_CONFIG_VAR = "MORI_EP_TUNING_CONFIG"
LAUNCH_MODES = ("MANUAL", "AUTO")


class TuningTableError(ValueError):
    """A tuning file (or request) that cannot be used; the message names the file, rule and field."""


@dataclass(frozen=True)
class TuningRule:
    """One rule: its key (``dtype`` in MORI's names; ``topk`` None matches any; ``zero_copy``/``quant_type``
    None in dispatch tables), its geometry and its informational measurements."""

    dtype: str
    num_tokens: int
    hidden_dim: int
    block_num: int
    rdma_block_num: int
    warp_per_block: int
    topk: int | None = None
    zero_copy: bool | None = None
    quant_type: str | None = None
    info: dict = field(default_factory=dict, compare=False)
    index: int = field(default=-1, compare=False)  # its position in the file's "rules" (for messages)


@dataclass(frozen=True)
class TuningTable:
    """A loaded file: its header and its rules in MORI's scan order (see the module docstring)."""

    path: Path
    gpu_arch: str
    gpu_model: str
    kernel_type: EpDispatchCombineKernelType
    ep_size: int
    phase: str
    rules: tuple[TuningRule, ...]

    def lookup(self, dtype: str, num_tokens: int, hidden_dim: int, topk: int | None = None,
               zero_copy: bool | None = None, quant_type: str | None = None) -> TuningRule | None:  # fmt: skip
        """The rule for a call (MORI's four passes and token buckets), or None if no rule has its dtype (and
        zero_copy/quant_type). ``dtype`` in MORI's names or ours; None for topk/zero_copy/quant_type means
        any (MORI passes zero_copy and quant_type for combine only)."""
        dtype = _request_dtype(dtype)
        for name, value in (("num_tokens", num_tokens), ("hidden_dim", hidden_dim), ("topk", topk)):
            if value is not None and (not _is_int(value) or value < 1):
                raise TuningTableError(f"tuning lookup: {name} {value!r} must be a positive int")
        if zero_copy is not None and not isinstance(zero_copy, bool):
            raise TuningTableError(f"tuning lookup: zero_copy {zero_copy!r} must be a bool or None")
        if quant_type is not None and quant_type not in QUANT_TYPES:
            raise TuningTableError(f"tuning lookup: quant_type {quant_type!r} is not one of {', '.join(QUANT_TYPES)}")
        if (zero_copy is not None or quant_type is not None) and self.phase != "combine":
            raise TuningTableError(f"tuning lookup in {self.path}: zero_copy and quant_type key combine tables only")
        candidates = [r for r in self.rules if r.dtype == dtype and (zero_copy is None or r.zero_copy == zero_copy)
                      and (quant_type is None or r.quant_type == quant_type)]  # fmt: skip

        def topk_ok(rule: TuningRule) -> bool:
            return topk is None or rule.topk is None or rule.topk == topk

        passes = (lambda r: r.hidden_dim == hidden_dim and topk_ok(r), lambda r: r.hidden_dim == hidden_dim,
                  topk_ok, lambda r: True)  # fmt: skip
        for matches in passes:
            hit = _bucket([r for r in candidates if matches(r)], num_tokens)
            if hit is not None:
                return hit
        return None


def _bucket(rules: list[TuningRule], num_tokens: int) -> TuningRule | None:
    """The first rule (scan order) whose bucket holds ``num_tokens``, else the last (clamp), else None."""
    for rule in rules:
        if num_tokens <= rule.num_tokens:
            return rule
    return rules[-1] if rules else None


def _request_dtype(dtype) -> str | None:
    if dtype in MORI_DTYPES:
        return dtype
    if dtype in _OUR_TO_MORI:
        return _OUR_TO_MORI[dtype]
    if dtype == "f32":
        return None  # ours, with no MORI name: no rule has it
    allowed = ", ".join(list(MORI_DTYPES) + list(_OUR_TO_MORI) + ["f32"])
    raise TuningTableError(f"tuning lookup: dtype {dtype!r} is not a dtype name; allowed: {allowed}")


def kernel_type_of(kernel_type) -> EpDispatchCombineKernelType:
    """An ``EpDispatchCombineKernelType`` from the enum or its name (as in file names and headers)."""
    if isinstance(kernel_type, EpDispatchCombineKernelType):
        return kernel_type
    if isinstance(kernel_type, str) and kernel_type in EpDispatchCombineKernelType.__members__:
        return EpDispatchCombineKernelType[kernel_type]
    names = ", ".join(EpDispatchCombineKernelType.__members__)
    raise TuningTableError(f"kernel_type {kernel_type!r} is not a kernel type; allowed: {names}")


def _load_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TuningTableError(f"tuning file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TuningTableError(f"tuning file {path}: cannot be read ({exc})") from None
    def unique(pairs):
        names = [name for name, _ in pairs]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # json would keep the last silently
            raise TuningTableError(f"tuning file {path}: field {twice[0]!r} appears twice in one object")
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise TuningTableError(f"tuning file {path}: not JSON ({exc})") from None


def load_tuning_table(path) -> TuningTable:
    """Read and validate a MORI v1 tuning file; a TuningTableError names the first problem."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TuningTableError(f"tuning file {path}: must hold a JSON object, not {type(data).__name__}")

    def bad(where: str, message: str) -> TuningTableError:
        return TuningTableError(f"tuning file {path}: {where} {message}")

    unknown = sorted(set(data) - set(_HEADER_FIELDS))
    if unknown:
        raise bad(f"field {unknown[0]!r}", f"is unknown; allowed: {', '.join(_HEADER_FIELDS)}")
    missing = [name for name in _HEADER_FIELDS if name not in data]
    if missing:
        raise bad(f"field {missing[0]!r}", "is missing")
    if data["version"] != VERSION:
        raise bad("field 'version'", f"{data['version']!r} is not supported; allowed: {VERSION!r}")
    if data["gpu_arch"] not in TARGETS:
        raise bad("field 'gpu_arch'", f"{data['gpu_arch']!r} is not a target; allowed: {', '.join(TARGETS)}")
    if not isinstance(data["gpu_model"], str) or not _MODEL.fullmatch(data["gpu_model"]):
        raise bad("field 'gpu_model'", f"{data['gpu_model']!r} must be lower-case letters and digits (e.g. mi355x, h200)")
    if data["kernel_type"] not in EpDispatchCombineKernelType.__members__:
        raise bad("field 'kernel_type'", f"{data['kernel_type']!r} is not a kernel type; allowed: "
                  f"{', '.join(EpDispatchCombineKernelType.__members__)}")  # fmt: skip
    if not _is_int(data["ep_size"]) or not 1 <= data["ep_size"] <= MAX_EP_SIZE:
        raise bad("field 'ep_size'", f"{data['ep_size']!r} must be an int in [1, {MAX_EP_SIZE}]")
    if data["phase"] not in PHASES:
        raise bad("field 'phase'", f"{data['phase']!r} is not allowed; allowed: {', '.join(PHASES)}")
    if not isinstance(data["rules"], list):
        raise bad("field 'rules'", f"must be a list, not {type(data['rules']).__name__}")
    kind = EpDispatchCombineKernelType[data["kernel_type"]]
    phase = data["phase"]
    wave = TARGETS[data["gpu_arch"]].wave_size
    rules = [_parse_rule(raw, i, phase, kind, wave, lambda field_, msg, i=i: bad(f"rule {i} field {field_!r}", msg))
             if isinstance(raw, dict) else _not_object(bad, i, raw) for i, raw in enumerate(data["rules"])]  # fmt: skip
    seen = {}
    for i, rule in enumerate(rules):
        key = (rule.dtype, rule.num_tokens, rule.hidden_dim, rule.topk, rule.zero_copy, rule.quant_type)
        if key in seen:  # the later one could never be found
            raise bad(f"rule {i}", f"has the key of rule {seen[key]} (dtype, num_tokens, hidden_dim, topk"
                      f"{', zero_copy, quant_type' if phase == 'combine' else ''}): keep one")  # fmt: skip
        seen[key] = i
    return TuningTable(path, data["gpu_arch"], data["gpu_model"], kind, data["ep_size"], phase,
                       tuple(sorted(rules, key=_scan_order(phase))))  # fmt: skip


def _scan_order(phase: str):
    """MORI's scan order of a phase's rules (a sort key; sorted() keeps file order among ties)."""
    if phase == "dispatch":
        return lambda r: (r.dtype, r.hidden_dim, r.num_tokens)
    return lambda r: (r.dtype, r.hidden_dim, r.zero_copy, r.quant_type, r.num_tokens)


def _not_object(bad, index: int, raw):
    raise bad(f"rule {index}", f"must be a JSON object, not {type(raw).__name__}")


def _parse_rule(raw: dict, index: int, phase: str, kind: EpDispatchCombineKernelType, wave: int, bad) -> TuningRule:
    """One rule, validated against the limits of mori_compiler/ops/config.py (``bad(field, message)``)."""
    required = _KEY_FIELDS[phase] + _GEOMETRY
    allowed = required + ("topk",) + INFO_FIELDS
    for name in raw:
        if name not in allowed:
            raise bad(name, f"is unknown for a {phase} rule; allowed: {', '.join(allowed)}")
    for name in required:
        if name not in raw:
            raise bad(name, f"is missing (a {phase} rule requires {', '.join(required)})")

    def integer(name: str, lo: int, hi: int, why: str = "") -> int:
        value = raw[name]
        if not _is_int(value):
            raise bad(name, f"{value!r} must be an int, not {type(value).__name__}")
        if not lo <= value <= hi:
            raise bad(name, f"{value} is outside [{lo}, {hi}]{why}")
        return value

    if raw["dtype"] not in MORI_DTYPES:
        raise bad("dtype", f"{raw['dtype']!r} is not allowed; allowed: {', '.join(MORI_DTYPES)}")
    max_warps = MAX_BLOCK_THREADS // wave
    min_warps = 2 if kind == EpDispatchCombineKernelType.IntraNodeLL else 1
    warps_why = (" (IntraNodeLL: a control warp and a data warp at least;" if min_warps == 2 else " (") + (
        f" a block has at most {MAX_BLOCK_THREADS} threads of {wave}-lane waves)")  # fmt: skip
    block_num = integer("block_num", 1, MAX_BLOCKS, " (device-barrier epoch slots per PE)")
    if kind in INTERNODE:
        rdma = integer("rdma_block_num", 0, block_num - 1, f" (below block_num {block_num}: the other blocks "
                       "take the same-node role)")  # fmt: skip
    else:
        rdma = integer("rdma_block_num", 0, 0, f" ({kind.name} uses no RDMA blocks)")
    rule = dict(dtype=raw["dtype"], num_tokens=integer("num_tokens", 1, MAX_RULE_TOKENS),
                hidden_dim=integer("hidden_dim", 16, MAX_HIDDEN_DIM), block_num=block_num, rdma_block_num=rdma,
                warp_per_block=integer("warp_per_block", min_warps, max_warps, warps_why))
    if "topk" in raw:
        rule["topk"] = integer("topk", 1, wave - 1, f" (top-k is smaller than the wave size {wave})")
    if phase == "combine":
        if not isinstance(raw["zero_copy"], bool):
            raise bad("zero_copy", f"{raw['zero_copy']!r} must be true or false")
        if raw["quant_type"] not in QUANT_TYPES:
            raise bad("quant_type", f"{raw['quant_type']!r} is not allowed; allowed: {', '.join(QUANT_TYPES)}")
        rule.update(zero_copy=raw["zero_copy"], quant_type=raw["quant_type"])
    info = {}
    for name in INFO_FIELDS:
        if name in raw:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise bad(name, f"{value!r} must be a number >= 0 (informational)")
            info[name] = value
    return TuningRule(**rule, info=info, index=index)


def file_name(arch: str, model: str, kernel_type, ep_size: int, phase: str) -> str:
    """MORI's file name of a table: ``{arch}_{model}_{KernelType}_ep{W}_{phase}.json``."""
    return f"{arch}_{model}_{kernel_type_of(kernel_type).name}_ep{ep_size}_{phase}.json"


def _check_request(target: str, model, kernel_type, ep_size, phase) -> EpDispatchCombineKernelType:
    if target not in TARGETS:
        raise TuningTableError(f"tuning target {target!r} is not a target; allowed: {', '.join(TARGETS)}")
    if model is not None and (not isinstance(model, str) or not _MODEL.fullmatch(model)):
        raise TuningTableError(f"tuning model {model!r} must be lower-case letters and digits (e.g. h200) or None")
    if not _is_int(ep_size) or not 1 <= ep_size <= MAX_EP_SIZE:
        raise TuningTableError(f"tuning ep_size {ep_size!r} must be an int in [1, {MAX_EP_SIZE}]")
    if phase not in PHASES:
        raise TuningTableError(f"tuning phase {phase!r} is not allowed; allowed: {', '.join(PHASES)}")
    return kernel_type_of(kernel_type)


def find_tuning_table(target: str, model: str | None, kernel_type, ep_size: int, phase: str,
                      search_dirs=None) -> Path | None:  # fmt: skip
    """The file of a table, or None. ``MORI_EP_TUNING_CONFIG`` (if set) decides alone: the listed file whose
    header names ``phase``. Otherwise the file of ``model`` in the first of ``search_dirs`` (default: the
    shipped directory) that has one, else the first (by directory, then name) of another model of the same
    arch."""
    kind = _check_request(target, model, kernel_type, ep_size, phase)
    override = os.environ.get(TUNING_CONFIG_VAR)
    if override:
        for entry in override.split(os.pathsep):
            if entry and load_tuning_table(entry).phase == phase:
                return Path(entry)
        return None
    directories = [Path(d) for d in ([SHIPPED_DIR] if search_dirs is None else search_dirs)]
    if model is not None:
        for directory in directories:
            if (directory / file_name(target, model, kind, ep_size, phase)).is_file():
                return directory / file_name(target, model, kind, ep_size, phase)
    prefix, suffix = f"{target}_", f"_{kind.name}_ep{ep_size}_{phase}.json"
    for directory in directories:
        for path in sorted(directory.iterdir()) if directory.is_dir() else ():
            name = path.name
            if (name.startswith(prefix) and name.endswith(suffix) and _MODEL.fullmatch(name[len(prefix):-len(suffix)])
                    and path.is_file()):  # fmt: skip
                return path
    return None


def tuning_table_for(target: str, model: str | None, kernel_type, ep_size: int, phase: str,
                     search_dirs=None) -> TuningTable | None:  # fmt: skip
    """The loaded table of a request (``find_tuning_table``), or None; a file whose header names another
    arch, kernel type, EP size or phase than the request is an error (its geometry was tuned for another
    machine or kernel). Another model is allowed: that is the fallback."""
    path = find_tuning_table(target, model, kernel_type, ep_size, phase, search_dirs)
    if path is None:
        return None
    table = load_tuning_table(path)
    kind = kernel_type_of(kernel_type)
    for name, got, want in (("gpu_arch", table.gpu_arch, target), ("kernel_type", table.kernel_type.name, kind.name),
                            ("ep_size", table.ep_size, ep_size), ("phase", table.phase, phase)):  # fmt: skip
        if got != want:
            raise TuningTableError(f"tuning file {path}: field {name!r} is {got!r}, but the request is for {want!r}")
    return table


def launch_config_mode() -> str:
    """``MORI_EP_LAUNCH_CONFIG_MODE``: "MANUAL" (unset or empty; the default) or "AUTO" (case-insensitive)."""
    value = os.environ.get(LAUNCH_MODE_VAR, "").strip()
    if not value:
        return "MANUAL"
    if value.upper() not in LAUNCH_MODES:
        raise TuningTableError(f"{LAUNCH_MODE_VAR}={value!r} is not allowed; allowed: {', '.join(LAUNCH_MODES)}")
    return value.upper()


def auto_fallback(kernel_type) -> tuple[int, int, int]:
    """AUTO mode's geometry where no rule applies, as MORI's: (block_num, rdma_block_num, warp_per_block)."""
    kind = kernel_type_of(kernel_type)
    if kind == EpDispatchCombineKernelType.InterNodeV1:
        return (96, 64, 8)
    if kind == EpDispatchCombineKernelType.InterNodeV1LL:
        return (256, 128, 8)
    return (128, 0, 16)


# ---- writing (bench/ep_tune.py) -----------------------------------------------------------------------------

def rule_json(rule: TuningRule) -> dict:
    """A rule as MORI writes it: the key, the geometry, then the informational measurements."""
    out = {"dtype": rule.dtype, "num_tokens": rule.num_tokens, "hidden_dim": rule.hidden_dim}
    if rule.topk is not None:
        out["topk"] = rule.topk
    if rule.zero_copy is not None:
        out.update(zero_copy=rule.zero_copy, quant_type=rule.quant_type)
    out.update(block_num=rule.block_num, rdma_block_num=rule.rdma_block_num, warp_per_block=rule.warp_per_block)
    out.update({name: rule.info[name] for name in INFO_FIELDS if name in rule.info})
    return out


def table_json(table: TuningTable) -> dict:
    """The file's JSON object (MORI's v1 header and the rules in scan order)."""
    return {"version": VERSION, "gpu_arch": table.gpu_arch, "gpu_model": table.gpu_model,
            "kernel_type": table.kernel_type.name, "ep_size": table.ep_size, "phase": table.phase,
            "rules": [rule_json(r) for r in table.rules]}  # fmt: skip


def _rule_key(rule: TuningRule) -> tuple:
    return (rule.dtype, rule.num_tokens, rule.hidden_dim, rule.topk, rule.zero_copy, rule.quant_type)


def merge_rules(old, new) -> list[TuningRule]:
    """The rules of ``old`` and ``new`` (iterables of TuningRule), one per key: where both have a key, the
    one with the higher ``bandwidth_gbps`` (MORI's merge on save; a rule without it counts as 0; a tie keeps
    the new one, the later measurement)."""
    merged = {_rule_key(r): r for r in old}
    for rule in new:
        kept = merged.get(_rule_key(rule))
        if kept is None or rule.info.get("bandwidth_gbps", 0) >= kept.info.get("bandwidth_gbps", 0):
            merged[_rule_key(rule)] = rule
    return list(merged.values())


def write_tuning_table(directory, gpu_arch: str, gpu_model: str, kernel_type, ep_size: int, phase: str,
                       rules, *, merge: bool = True) -> Path:  # fmt: skip
    """Write (merging with an existing file of the same name when ``merge``: ``merge_rules``) the table
    ``{arch}_{model}_{KernelType}_ep{W}_{phase}.json`` in ``directory``; returns its path. The result is
    read back with ``load_tuning_table`` before it replaces the file, so a table that would not load is
    never written (and an existing file that does not load is an error, not overwritten)."""
    kind = _check_request(gpu_arch, gpu_model, kernel_type, ep_size, phase)
    if gpu_model is None:
        raise TuningTableError("write_tuning_table: gpu_model must name the GPU model (e.g. h200)")
    path = Path(directory) / file_name(gpu_arch, gpu_model, kind, ep_size, phase)
    rules = list(rules)
    if merge and path.exists():
        rules = merge_rules(load_tuning_table(path).rules, rules)
    table = TuningTable(path, gpu_arch, gpu_model, kind, ep_size, phase, tuple(sorted(rules, key=_scan_order(phase))))
    text = json.dumps(table_json(table), indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_tuning_table(tmp)  # validated as any reader will validate it
    except TuningTableError:
        tmp.unlink()
        raise
    os.replace(tmp, path)
    return path
