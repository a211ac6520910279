"""Device bitcode that is not the project's library (MORI's ``libmori_shmem_device.bc``, a test stub):
checked against the compile options, then linked through a prepared copy.

**Check.** MORI's bitcode is built for one target and one code object version (``hipcc --offload-arch=gfx942
-mcode-object-version=5|6``). What it was built for is read with llvmlite: the triple, the ``target-cpu`` and
``+wavefrontsize32/64`` of its function attributes, and the ``amdhsa_code_object_version`` module flag
(``i32 500`` / ``i32 600``). Any of them that contradicts the compile options is refused with an error naming
the file, what it was built for and what the options ask for. A bitcode without a value (the project's
library carries no target-cpu and no code object version) fits any.

**Prepare.** MORI's ABI functions switch on the peer's transport (P2P, RDMA, SDMA): a put of one word is about
280 LLVM instructions, an atomic 400, a fence 130, most of them the RDMA/IBGDA path and its assertions. Inlined
at each of the EP kernels' 20 to 80 call sites they make kernels of 5 to 50 KB that spill 13 to 517 SGPRs.
The prepared copy marks every exported function larger than ``OUTLINE_ABOVE`` instructions ``noinline``: each
such function is then compiled once and called from the control paths; the small ones the data paths need
(``ptr``, ``ptr_p2p``, ``my_pe``, ``n_pes``, the waits) still inline. Measured on MORI 1.2.4's gfx942 bitcode
(test_mori_bitcode.py prints the per-kernel report): SGPR spills 13–517 → 0–58 per kernel, kernel code 2–6x
and code objects 2–2.5x smaller, scratch 64–80 → 80–160 bytes (the call stack). Splitting each function into
an inlined P2P path and an out-of-line rest was measured too: the same spills (±5) with 85 % more code.

The copy lives in ``<cache>/lib/external-<sha256 of the original>-p<PREPARE_VERSION>/`` with ``facts.json``
(what the check needs), so a warm compile checks the options without importing llvmlite.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from mori_compiler.env import cache_dir
from mori_compiler.errors import MoriCompilerError
from mori_compiler.targets import GPUTarget

from .cached import cached_bitcode

OUTLINE_ABOVE = 64  # instructions; MORI's P2P-only ABI functions are 2-20, the transport-switching ones 120+
PREPARE_VERSION = 1  # bump when the preparation changes
FACTS_NAME = "facts.json"

_COV_FLAG = re.compile(r'!\{i32 \d+, !"amdhsa_code_object_version", i32 (\d+)\}')
_TARGET_CPU = re.compile(r'"target-cpu"="([^"]+)"')
_WAVE_FEATURE = re.compile(r"[+]wavefrontsize(32|64)\b")


@dataclass(frozen=True)
class BitcodeFacts:
    """What a device bitcode file was built for (None or empty: not recorded in the file)."""

    triple: str
    cpus: tuple[str, ...]
    wave_sizes: tuple[int, ...]
    code_object_version: int | None


def _parse(path: str, data: bytes):
    import llvmlite.binding as llvm

    try:
        return llvm.parse_bitcode(data)
    except RuntimeError as exc:
        raise MoriCompilerError(f"{path} is not a valid LLVM bitcode file ({' '.join(str(exc).split())})") from None


def read_facts(module) -> BitcodeFacts:
    """The facts of an llvmlite module (module flags and attributes are read from its textual form: llvmlite
    has no accessor for them)."""
    text = str(module)
    cov = _COV_FLAG.search(text)
    return BitcodeFacts(
        triple=module.triple,
        cpus=tuple(sorted(set(_TARGET_CPU.findall(text)))),
        wave_sizes=tuple(sorted({int(w) for w in _WAVE_FEATURE.findall(text)})),
        code_object_version=int(cov.group(1)) // 100 if cov else None,
    )


def _triple_parts(triple: str) -> tuple[str, ...]:
    return tuple(triple.split("-")[:3])


def check_facts(path: str, facts: BitcodeFacts, target: GPUTarget, code_object_version: int) -> None:
    """Refuse a bitcode built for another triple, GPU, wave size or code object version than the options."""
    if facts.triple and _triple_parts(facts.triple) != _triple_parts(target.triple):
        raise MoriCompilerError(
            f"device bitcode {path} is for '{facts.triple}', but target {target.name} needs '{target.triple}'")
    wrong_cpu = [cpu for cpu in facts.cpus if cpu != target.cpu]
    if wrong_cpu:
        raise MoriCompilerError(
            f"device bitcode {path} was built for {', '.join(wrong_cpu)}, not {target.cpu}; "
            "build or choose the bitcode for the same GPU")  # fmt: skip
    if target.is_amdgpu:
        wrong_wave = [w for w in facts.wave_sizes if w != target.wave_size]
        if wrong_wave:
            raise MoriCompilerError(
                f"device bitcode {path} was built for wave{wrong_wave[0]}, but {target.name} runs wave"
                f"{target.wave_size}")  # fmt: skip
        cov = facts.code_object_version
        if cov is not None and cov != code_object_version:
            raise MoriCompilerError(
                f"device bitcode {path} was built for code object version {cov} (module flag "
                f"amdhsa_code_object_version = {cov * 100}), but the compile options ask for {code_object_version}; "
                f"pass --code-object-version {cov} (CompileOptions(code_object_version={cov})) or the bitcode built "
                f"with -mcode-object-version={code_object_version} (MORI: find_bitcode(cov={code_object_version}))")


def _function_size(fn) -> int:
    return sum(1 for block in fn.blocks for _ in block.instructions)


def outlined_functions(module) -> list[str]:
    """The exported functions the prepared copy keeps out of line (larger than OUTLINE_ABOVE instructions)."""
    import llvmlite.binding as llvm

    return sorted(f.name for f in module.functions
                  if not f.is_declaration and f.linkage == llvm.Linkage.external and _function_size(f) > OUTLINE_ABOVE)  # fmt: skip


def function_attributes(fn) -> str:
    """The function attributes of an llvmlite function, as IR text."""
    return " ".join(a.decode() for a in fn.attributes)


def _prepare(module) -> bytes:
    for name in outlined_functions(module):
        fn = module.get_function(name)
        if "alwaysinline" not in function_attributes(fn).split():
            fn.add_function_attribute("noinline")
    return module.as_bitcode()


def prepared_bitcode(path: str, target: GPUTarget, code_object_version: int) -> Path:
    """The prepared, verified copy of the external bitcode ``path`` to link for these options (after checking
    that the bitcode was built for them)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MoriCompilerError(f"cannot read device bitcode {path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    folder = cache_dir() / "lib" / f"external-{digest[:24]}-p{PREPARE_VERSION}"
    facts_path = folder / FACTS_NAME

    def build_facts() -> bytes:
        return json.dumps(asdict(read_facts(_parse(path, data)))).encode()

    facts = BitcodeFacts(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in json.loads(cached_bitcode(facts_path, build_facts, "bitcode facts").read_bytes()).items()})  # fmt: skip
    check_facts(path, facts, target, code_object_version)
    name = Path(path).name if Path(path).name.endswith(".bc") else Path(path).name + ".bc"
    return cached_bitcode(folder / name, lambda: _prepare(_parse(path, data)), f"prepared copy of {path}")
