"""The symmetric buffers of an EP op: allocated from the EP schema's buffer table, zeroed, addressed per PE.

``EpBuffers(kind, sizes, pes, virtual)`` allocates every buffer ``ep_schema.buffers_for(kind, sizes)``
lists, in the table's order (every PE allocates the same sequence, so the heap offsets agree), and zeroes
the ones marked ``zeroed`` on each local PE. With virtual PEs a buffer's address on PE ``pe`` is its
symmetric address translated to that PE's heap; in a process per PE it is the handle itself.
"""

from __future__ import annotations

from mori_compiler.ep_schema import EpSizes, KernelType, buffers_for

ALIGNMENT = 256  # bytes: every buffer starts on a 256-byte boundary (16-byte vectors, and cache lines)
MAX_CACHED_VIEWS = 1024  # views kept per op (their shapes depend on the call's hidden only); more start over


class EpBuffers:
    """The symmetric buffers of one op on the local PEs ``pes`` (all of them with virtual PEs)."""

    def __init__(self, kind: KernelType, sizes: EpSizes, pes: list[int], *, virtual: bool):
        from mori_compiler.runtime.extras import import_extra

        torch = import_extra("torch")  # (missing: one error naming the extra to install)

        from mori_compiler.runtime import shmem

        self.pes = list(pes)
        self.virtual = virtual
        self._views: dict = {}  # (name, pe, shape, dtype) -> the tensor: made once (tens of µs each), reused
        table = buffers_for(kind, sizes)
        self.sizes = {buf.name: size for buf, size in table}
        self.handles: dict[str, int] | None = {}
        for buf, size in table:
            self.handles[buf.name] = shmem.shmem_malloc_align(ALIGNMENT, size)
        for buf, size in table:
            if buf.zeroed:  # counters, signals and flags start at 0 (the kernels leave them so)
                for pe in self.pes:
                    self.view(buf.name, pe, (size,), torch.uint8).zero_()

    def _handle(self, name: str) -> int:
        if self.handles is None:
            raise RuntimeError("the op's buffers were freed (close() was called)")
        try:
            return self.handles[name]
        except KeyError:
            raise KeyError(f"no symmetric buffer '{name}' for this kernel type "
                           f"(has: {', '.join(self.handles)})") from None

    def address(self, name: str, pe: int) -> int:
        """The device address of buffer ``name`` on PE ``pe`` (what a kernel launched for ``pe`` is passed)."""
        from mori_compiler.runtime import shmem

        handle = self._handle(name)
        return shmem.shmem_ptr_p2p(handle, 0, pe) if self.virtual else handle

    def view(self, name: str, pe: int, shape, dtype):
        """A tensor view of buffer ``name`` on PE ``pe`` (its start, ``shape`` elements of ``dtype``). The same
        tensor object for the same arguments: the op's outputs are views of persistent buffers (as MORI's), and
        making a view through the CUDA array interface costs tens of µs, per PE and output, on every call."""
        key = (name, pe, shape if isinstance(shape, tuple) else tuple(shape), dtype)
        found = self._views.get(key)
        if found is not None and self.handles is not None:
            return found
        from mori_compiler.runtime import shmem

        made = shmem.shmem_tensor(self._handle(name), shape, dtype, pe=pe if self.virtual else None)
        if len(self._views) >= MAX_CACHED_VIEWS:
            self._views.clear()
        self._views[key] = made
        return made

    @property
    def freed(self) -> bool:
        return self.handles is None

    def free(self) -> None:
        """Free every buffer (in reverse allocation order); every PE must free its ops in the same order."""
        from mori_compiler.runtime import shmem

        handles, self.handles = self.handles, None
        self._views.clear()
        if handles is None or shmem.current_state() is None:
            return
        import torch

        torch.cuda.synchronize()
        for handle in reversed(list(handles.values())):
            shmem.shmem_free(handle)
