"""Compile options: one validated, frozen dataclass that is also the cache key's input."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from .errors import MoriCompilerError
from .targets import DEFAULT_TARGET, GPUTarget, get_target

CODE_OBJECT_VERSIONS = (5, 6)
MORI_SHMEM_BC_VAR = "MORI_SHMEM_BC"  # a MORI device bitcode to link instead of the project's library
OPT_LEVELS = (0, 1, 2, 3)


@dataclass(frozen=True)
class CompileOptions:
    """How to compile one kernel module.

    ``bitcode``: device bitcode files to link *instead of* the project's own device library (e.g.
    MORI's ``libmori_shmem_device.bc``); when none is given and ``device_library`` is on, the file named by
    ``MORI_SHMEM_BC`` (if set) is recorded here, so that every entry point (mori-compile, ep_bundle, the
    Python API) honours it and the cache key covers its content. ``device_library``: link the project's
    library when no ``bitcode`` is given (turn off to check that a module needs no device functions).
    ``code_object_version`` applies to AMDGPU targets (5 or 6, default 6 = ELF ABI version 4).
    ``virtual_pes``: kernels read their parameters from a per-PE argument table indexed by the grid's z
    (several PEs in one launch on one GPU; see lib_bitcode/kernel_abi.py). ``trace``: the kernels' trace
    points (``mori_comm.trace``) record the GPU's global timer into a per-kernel trace buffer (pass
    ``mori-trace-to-timer``, docs/tracing.md); off, they are compiled out (no code).
    """

    target: str = DEFAULT_TARGET
    code_object_version: int = 6
    opt_level: int = 3
    bitcode: tuple[str, ...] = ()
    device_library: bool = True
    virtual_pes: bool = False
    trace: bool = False
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        self._check_types()
        get_target(self.target)  # raises with the allowed names
        if self.code_object_version not in CODE_OBJECT_VERSIONS:
            raise MoriCompilerError(
                f"code object version {self.code_object_version} is not supported; allowed: 5, 6"
            )
        if self.opt_level not in OPT_LEVELS:
            raise MoriCompilerError(f"optimization level {self.opt_level} is not supported; allowed: 0, 1, 2, 3")
        if isinstance(self.bitcode, (str, os.PathLike)):
            object.__setattr__(self, "bitcode", (str(self.bitcode),))
        object.__setattr__(self, "bitcode", tuple(str(b) for b in self.bitcode))
        from_env = not self.bitcode and self.device_library and os.environ.get(MORI_SHMEM_BC_VAR)
        if from_env:
            object.__setattr__(self, "bitcode", (from_env,))
        for path in self.bitcode:
            if not os.path.isfile(path):
                where = f" ({MORI_SHMEM_BC_VAR})" if from_env else ""
                raise MoriCompilerError(f"device bitcode file not found{where}: {path}")

    def _check_types(self) -> None:
        expected = {"target": str, "code_object_version": int, "opt_level": int, "device_library": bool,
                    "virtual_pes": bool, "trace": bool}  # fmt: skip
        for name, ty in expected.items():
            value = getattr(self, name)
            if not isinstance(value, ty) or (ty is int and isinstance(value, bool)):
                raise MoriCompilerError(
                    f"compile option '{name}' must be {ty.__name__}, got {type(value).__name__} {value!r}"
                )
        if not isinstance(self.bitcode, (str, os.PathLike, tuple, list)) or (
            isinstance(self.bitcode, (tuple, list)) and not all(isinstance(b, (str, os.PathLike)) for b in self.bitcode)
        ):
            raise MoriCompilerError(f"compile option 'bitcode' must be a path or a list of paths, got {self.bitcode!r}")

    @property
    def gpu_target(self) -> GPUTarget:
        return get_target(self.target)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        d["bitcode"] = list(self.bitcode)
        return d


def device_bitcode(options: CompileOptions) -> list[str]:
    """The device bitcode files ``options`` link, in link order (without importing MLIR: the cache looks
    bundles up with it before the compiler is loaded).

    * default: the project's library (it also defines what the AMDGPU lowering calls);
    * ``options.bitcode`` (``--bitcode``, ``MORI_SHMEM_BC``): each file checked against the options and linked
      through its prepared copy (lib_bitcode/external.py), then, on AMDGPU, the lowering-support bitcode
      (the ockl work-item queries of MLIR's ROCDL lowering, which MORI's bitcode does not export);
    * ``device_library=False``: only the lowering-support bitcode on AMDGPU (no device functions).
    """
    target = options.gpu_target
    if not options.bitcode and options.device_library:
        from .lib_bitcode.library import library_path

        return [str(library_path(target))]
    from .lib_bitcode.external import prepared_bitcode

    files = [str(prepared_bitcode(path, target, options.code_object_version)) for path in options.bitcode]
    if target.is_amdgpu:
        from .lib_bitcode.library import lowering_support_path

        files.append(str(lowering_support_path(target, options.code_object_version)))
    return files
