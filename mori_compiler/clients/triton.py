"""Triton kernels calling the project's shmem device library: MORI's ``mori.ir.triton``.

    from mori_compiler.clients import triton as mt      # under MORI's names: from mori.ir import triton as mt

    mt.install_hook()                                   # once: shmem kernels get this process's shmem state

    @triton.jit
    def put_to_peer(dest, src, nbytes, peer):
        mt.putmem_nbi_block(dest, src, nbytes, peer, 0)
        mt.quiet_thread()

    put_to_peer[(1,)](dest, src, nbytes, peer, extern_libs=mt.get_extern_libs())

The device functions are ``triton_ops``'s (one per ``MORI_DEVICE_FUNCTIONS`` row), the linking and the hook
``triton_runtime``'s. Shmem must be initialized (one PE per process) before the first launch of such a kernel.
MORI's ``cco`` subpackage (its LSA/SDMA/GDA communicator handles) and ``get_cco_extern_libs`` are not offered:
they drive MORI's CCO runtime (communicators, windows, SDMA queues, RDMA), which this project does not have.
"""

from __future__ import annotations

import types

from mori_compiler.compat._refuse import not_offered

from . import triton_ops as ops
from . import triton_runtime as runtime
from .triton_ops import *  # noqa: F401,F403 (the device functions, SIGNAL_SET, SIGNAL_ADD)
from .triton_ops import __all__ as _ops_all
from .triton_runtime import get_extern_libs, install_hook, uninstall_hook

CCO_NOT_OFFERED = ("MORI's CCO device API (LSA/SDMA/GDA communicators and windows) needs MORI's CCO runtime, which "
                   "mori_compiler does not have; use the shmem device functions of this module")  # fmt: skip


class _NotOfferedModule(types.ModuleType):
    """A stand-in for a MORI subpackage this project does not offer: importable, and every use of one of its
    names raises, saying why (``import mori.ir.triton.cco`` itself is refused by the compat finder)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self.__name__}.{name} is not offered by mori_compiler: {CCO_NOT_OFFERED}")


# mori.ir.triton is a package in MORI (.ops, .runtime): under MORI's names the compat finder serves its submodules
# (this module's triton_ops and triton_runtime), and Python imports a submodule only of a module with a __path__.
__path__: list[str] = []

cco = _NotOfferedModule("mori.ir.triton.cco", f"Not offered by mori_compiler: {CCO_NOT_OFFERED}")
get_cco_extern_libs = not_offered("mori.ir.triton.get_cco_extern_libs", CCO_NOT_OFFERED)

__all__ = [*_ops_all, "get_extern_libs", "install_hook", "uninstall_hook", "cco", "get_cco_extern_libs", "ops",
           "runtime"]  # fmt: skip
