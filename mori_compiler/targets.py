"""GPU targets the compiler knows, as frozen data.

A target fixes everything that differs between GPUs at compile time: the LLVM triple and CPU name, the
wavefront (warp) size that warp-scope ABI functions assume, and the MLIR lowering used for it. Backend
differences are data here, not branches scattered through the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MoriCompilerError

MAX_BLOCK_THREADS = 1024  # a block has at most 1024 threads on every supported GPU


@dataclass(frozen=True)
class GPUTarget:
    """One compile target. ``backend`` is ``"rocdl"`` (AMDGPU code object) or ``"nvvm"`` (PTX)."""

    name: str
    backend: str
    triple: str
    wave_size: int
    # Extra LLVM subtarget features for codegen (e.g. the PTX ISA version on NVPTX).
    features: str = ""

    @property
    def is_amdgpu(self) -> bool:
        return self.backend == "rocdl"

    @property
    def is_nvptx(self) -> bool:
        return self.backend == "nvvm"

    @property
    def cpu(self) -> str:
        return self.name

    @property
    def device_syncscope(self) -> str:
        """The LLVM syncscope of a fence that orders memory among all threads of one GPU (every XCD of an
        MI300: AMDGPU's "agent"; NVPTX's "device", i.e. ``fence.acq_rel.gpu``)."""
        return "agent" if self.is_amdgpu else "device"


TARGETS: dict[str, GPUTarget] = {
    t.name: t
    for t in (
        GPUTarget("gfx942", "rocdl", "amdgcn-amd-amdhsa", 64),
        GPUTarget("gfx950", "rocdl", "amdgcn-amd-amdhsa", 64),
        # gfx12 parts run wave32; MORI builds its bitcode for gfx1250 with warpSize 32.
        GPUTarget("gfx1250", "rocdl", "amdgcn-amd-amdhsa", 32),
        # PTX ISA 7.8 is the first to cover sm_90 and is accepted by every CUDA 12/13 driver.
        GPUTarget("sm_90", "nvvm", "nvptx64-nvidia-cuda", 32, features="+ptx78"),
    )
}
MIN_WAVE_SIZE = min(t.wave_size for t in TARGETS.values())  # lanes of the narrowest wave (32)

DEFAULT_TARGET = "gfx942"


def get_target(name: str) -> GPUTarget:
    """Return the target called ``name`` or raise an error listing the allowed names."""
    try:
        return TARGETS[name]
    except KeyError:
        allowed = ", ".join(TARGETS)
        raise MoriCompilerError(f"unknown target '{name}'; allowed targets: {allowed}") from None
