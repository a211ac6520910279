"""The shmem device functions as Triton externs (``mori.ir.triton.ops``): one per ``MORI_DEVICE_FUNCTIONS`` row.

Inside a ``@triton.jit`` kernel, ``my_pe()``, ``putmem_nbi_block(dest, src, nbytes, pe, qp)``... become calls
of the library's ``mori_shmem_*`` symbols (``tl.core.extern_elementwise``); the kernel is launched with
``extern_libs=get_extern_libs()`` so that Triton links the library (``triton_runtime.py``).

Arguments follow the metadata view of the ABI table (lib_bitcode/abi.py): addresses are ``uint64``, and a
Triton pointer passed where an address belongs is converted (``ptrtoint``); integers are converted to the
parameter's width and signedness; a float argument of an integer parameter, or a pointer where no address
belongs, is refused at compile time naming the function and the parameter (never truncated silently).
``ptr_p2p`` returns an address: ``.to(tl.pointer_type(tl.int32))`` makes it a pointer.

Triton runs scalar code in every thread of the program, so a call with scalar arguments is made by all
``num_warps * 32`` threads: the ``*_block`` functions (all threads of the block together) fit that;
``*_thread`` functions with side effects (atomics, puts, signals) act once per thread, so give them tensor
arguments with one element per thread (a block of exactly ``num_warps * 32`` elements) or mean it. As in
MORI's P2P transport, ``putmem_nbi_signal_thread`` moves every thread's payload but updates the signal once
per wave, from its highest active lane (docs/device-abi.md).
"""

from __future__ import annotations

import inspect

from mori_compiler.runtime.extras import import_extra

import_extra("triton")  # first on its own: a missing Triton is one error naming the extra (triton==3.6.0)
import triton.language as tl  # noqa: E402
from triton.language import core  # noqa: E402

from mori_compiler.lib_bitcode.abi import MORI_DEVICE_FUNCTIONS, SIGNAL_ADD, SIGNAL_SET, abi_function

#: The library name Triton records on each extern call (the file comes from ``extern_libs``).
LIBRARY_NAME = "libmori_shmem_device"

_TRITON_TYPES = {
    "int32": tl.int32, "uint32": tl.uint32, "int64": tl.int64, "uint64": tl.uint64,
    "float32": tl.float32, "float64": tl.float64,
}  # fmt: skip


def _convert(value, param: str, dtype, fn_name: str, _semantic):
    """``value`` as the parameter's Triton type, or a clear error when the conversion would lose meaning."""
    value = _semantic.to_tensor(value)
    src = value.dtype
    if src == dtype:
        return value
    if src.is_ptr():
        if dtype != tl.uint64:
            raise TypeError(f"{fn_name}: parameter {param!r} is {dtype}, not an address; got a pointer ({src})")
        return value.to(tl.uint64, _semantic=_semantic)
    if src.is_floating() and not dtype.is_floating():
        raise TypeError(f"{fn_name}: parameter {param!r} is {dtype}; got {src} (convert it explicitly)")
    return value.to(dtype, _semantic=_semantic)


def _make_extern(name: str, meta: dict):
    symbol = meta["symbol"]
    params = tuple(p.name for p in abi_function(symbol).params)
    arg_types = tuple(_TRITON_TYPES[t] for t in meta["args"])
    ret_type = _TRITON_TYPES[meta["ret"]]
    is_pure = bool(meta.get("pure", False))

    def call(*args, _semantic=None):
        if len(args) != len(params):
            raise TypeError(f"{name}({', '.join(params)}) takes {len(params)} argument(s), got {len(args)}")
        converted = [_convert(a, p, t, name, _semantic) for a, p, t in zip(args, params, arg_types)]
        return core.extern_elementwise(LIBRARY_NAME, "", converted, {arg_types: (symbol, ret_type)},
                                       is_pure=is_pure, _semantic=_semantic)  # fmt: skip

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{symbol}`` ({', '.join(f'{p}: {t}' for p, t in zip(params, meta['args']))}) -> {meta['ret']}"
    positional = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_ONLY) for p in params]
    semantic = inspect.Parameter("_semantic", inspect.Parameter.KEYWORD_ONLY, default=None)
    call.__signature__ = inspect.Signature(positional + [semantic])  # Triton passes _semantic when it is named
    _CALLS[name] = call
    return core.extern(call)


_CALLS: dict = {}  # name -> the unwrapped builder of each device function (for the composed ones below)
_EXTERNS = {name: _make_extern(name, meta) for name, meta in MORI_DEVICE_FUNCTIONS.items()}


def _make_blocking_put(scope: str):
    """``putmem_<scope>(dest, source, bytes, pe, qp)``: MORI's blocking put (later MORI releases have it; its
    1.2.4 table and the project's ABI do not): ``putmem_nbi_<scope>`` then ``quiet_thread`` in every calling
    thread (each thread's puts complete before it goes on). Returns the put's status."""
    put, quiet = _CALLS[f"putmem_nbi_{scope}"], _CALLS["quiet_thread"]

    def call(dest, source, bytes, pe, qp, _semantic=None):
        status = put(dest, source, bytes, pe, qp, _semantic=_semantic)
        quiet(_semantic=_semantic)
        return status

    call.__name__ = call.__qualname__ = f"putmem_{scope}"
    call.__doc__ = _make_blocking_put.__doc__.replace("<scope>", scope)
    return core.extern(call)


#: Device functions composed of the ABI's (no symbol of their own).
COMPOSED = {f"putmem_{scope}": _make_blocking_put(scope) for scope in ("thread", "warp", "block")}
globals().update(_EXTERNS)
globals().update(COMPOSED)

__all__ = [*_EXTERNS, *COMPOSED, "SIGNAL_ADD", "SIGNAL_SET"]
