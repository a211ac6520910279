"""mori_compiler's runtime: load kernel bundles and launch them on the GPU (no MLIR, no llvmlite).

* ``bundle``: kernel bundles (code object + ``bundle.json``), stdlib only;
* ``driver``: the driver interface and ``get_driver(backend)``; ``cuda`` (cuda-bindings) and ``hip``
  (hip-python) implement it and are imported only when a driver is first requested;
* ``shmem``: symmetric memory with a ``mori.shmem``-compatible API (multi-process over torch.distributed,
  or N virtual PEs in one process), over ``heap_allocator`` (heap size and allocator), ``shmem_comm`` (the
  rendezvous with the other processes), ``shmem_state`` (one initialized shmem: memory, addresses, device
  state), ``shmem_tensors`` (torch views) and ``shmem_errors``;
* ``launcher``: ``KernelSet`` loads a bundle, writes its device state and launches its kernels;
* ``trace``: kernel trace points at run time (records, the phase table, the Perfetto export; docs/tracing.md);
* ``extras``: the optional packages (torch, cuda-bindings, hip-python, matplotlib) and the install extras a
  missing one names;
* ``io``: MORI-IO (the ``mori.io`` API: enums, configs, descriptors with MORI's msgpack wire format, transfer
  status, the TCP backend's frame protocol; the engine comes next), re-exported by ``mori_compiler.io``.

Importing this package imports none of torch, cuda-bindings, hip-python, MLIR or llvmlite; the names below
are loaded on first access. See the package docstring of mori_compiler for the layering rules.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Bundle": "bundle", "BundleError": "bundle", "KernelInfo": "bundle", "load_bundle": "bundle",
    "Driver": "driver", "DriverError": "driver", "get_driver": "driver",
    "KernelSet": "launcher", "WaitTimeoutError": "launcher",
    "KernelTrace": "trace", "export_to_perfetto": "trace", "format_phase_table": "trace", "phase_summary": "trace",
    "ShmemError": "shmem", "ShmemStateError": "shmem",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mori_compiler.runtime' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
