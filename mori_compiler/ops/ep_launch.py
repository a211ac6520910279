"""The kernel launches of an EP op: arguments by name from the EP schema, checked against the bundle once.

A launch names its kernel family and dtype and passes the call arguments by name (``x``, ``n``, ...);
``ep_schema.KERNELS[family].arguments`` puts them, and the address of every symmetric buffer the family
takes, in the kernel's parameter order. That order is the schema's; the bundle records the compiled
kernels' parameters (bundle.json: names from each parameter's ``mori.name``, and types), and
``check_bundle`` compares the two when the op is built, before any code is loaded: a host that disagrees
with its kernels is a ValueError naming the kernel and the parameter, never a launch with shifted
arguments. Every EP kernel parameter must carry its name (``mori.name``, set by the generators from the
schema): an unnamed one is a mismatch too.
"""

from __future__ import annotations

from mori_compiler.ep_schema import KERNELS

from .bundle import PlannedKernel
from .ep_buffers import EpBuffers


def bundle_problems(bundle, planned: list[PlannedKernel]) -> list[str]:
    """Where the bundle's kernels disagree with the EP schema's signatures of ``planned``: one message each."""
    problems = []
    for kernel in planned:
        sig, info = kernel.signature, bundle.kernels.get(kernel.name)
        where = f"kernel {kernel.name} of bundle {bundle.key[:12]}"
        if info is None:
            problems.append(f"{where}: missing (has: {', '.join(bundle.kernels)})")
            continue
        if len(info.params) != len(sig.params):
            problems.append(f"{where} has {len(info.params)} parameters ({', '.join(p.name for p in info.params)}); "
                            f"the EP schema's {sig.family} kernels take {len(sig.params)} ({', '.join(sig.names)})")
            continue
        for i, (got, want) in enumerate(zip(info.params, sig.params)):
            if got.type != want.type or not got.named or got.name != want.name:
                shown = f"'{got.name}' ({got.type})" if got.named else f"an unnamed {got.type}"
                problems.append(f"{where}: parameter {i} is {shown}; the EP schema's {sig.family} kernels expect "
                                f"'{want.name}' ({want.type}) there")  # fmt: skip
    return problems


def check_bundle(bundle, planned: list[PlannedKernel]) -> None:
    """Raise a ValueError listing every disagreement of ``bundle`` with the EP schema (see bundle_problems)."""
    problems = bundle_problems(bundle, planned)
    if problems:
        raise ValueError("the kernel bundle does not match the EP schema (rebuild it: a stale or foreign "
                         "bundle):\n  " + "\n  ".join(problems))  # fmt: skip


class EpLaunches:
    """Launches the kernels of ``bundle`` (checked against the schema here) with ``buffers``' addresses;
    ``block_threads`` threads per block; one launch for all PEs with virtual PEs, else cooperative. A call
    whose ``hidden`` is the config's (``hidden``) runs the kernel of constant rows, any other its
    ``_anyhidden`` variant."""

    def __init__(self, bundle, planned: list[PlannedKernel], buffers: EpBuffers, *, block_threads: int,
                 virtual: bool, hidden: int):  # fmt: skip
        from mori_compiler.runtime.launcher import KernelSet

        check_bundle(bundle, planned)
        self.buffers = buffers
        self.block_threads = block_threads
        self.virtual = virtual
        self.hidden = hidden
        self._addresses: dict[int, dict[str, int]] = {}  # per PE: buffer name -> address (fixed for the op)
        self.kernels = KernelSet(bundle)

    def _address_of(self, pe: int):
        table = self._addresses.setdefault(pe, {})

        def address(name: str) -> int:
            if name not in table:
                table[name] = self.buffers.address(name, pe)
            return table[name]

        return address

    def launch(self, family: str, dtype: str, calls: list[tuple[int, dict]], blocks: int) -> None:
        """Launch ``ep_<family>_<dtype>``, or its any-hidden variant when the calls' ``hidden`` (the same on
        every PE: the op checks) is not the config's: ``calls`` holds, per local PE, (pe, its call arguments
        by name)."""
        if self.buffers.freed:  # the cached addresses would point into freed heap memory
            raise RuntimeError("the op's buffers were freed (close() was called)")
        sig = KERNELS[family]
        args = [sig.arguments(self._address_of(pe), values) for pe, values in calls]
        name = sig.kernel_name(dtype, calls[0][1].get("hidden", self.hidden) != self.hidden)
        block = (self.block_threads, 1, 1)
        if self.virtual:
            self.kernels.launch_virtual(name, args, grid=(blocks, 1), block=block)
        else:
            self.kernels.launch(name, list(args[0]), grid=(blocks, 1, 1), block=block, cooperative=True)
