"""What the ``sitecustomize`` that ``run`` writes does in each process started under it: install the
finder, then run the environment's own ``sitecustomize`` (the one ours shadows on PYTHONPATH), if any.

The chaining is in the written file itself (standard library only), so a child interpreter that cannot
import mori_compiler (another Python started with the same PYTHONPATH) still runs its own sitecustomize.
Kept out of the package's import (``mori_compiler.compat`` imports only the standard library at start-up)."""

from __future__ import annotations

#: The whole sitecustomize.py that ``run`` writes into its boot directory.
SITECUSTOMIZE = (
    "import os as _os, sys as _sys\n"
    "try:\n"
    "    from mori_compiler.compat import install as _install\n"
    "except ImportError:  # mori_compiler is not importable in this interpreter: nothing to install\n"
    "    pass\n"
    "else:\n"
    "    _install()\n"
    "\n"
    "\n"
    "def _chain(boot_dir):  # the environment's own sitecustomize, which this file shadows\n"
    "    import importlib.machinery, importlib.util\n"
    "\n"
    "    path = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != boot_dir]\n"
    "    spec = importlib.machinery.PathFinder.find_spec('sitecustomize', path)\n"
    "    if spec is not None and spec.loader is not None:\n"
    "        module = importlib.util.module_from_spec(spec)\n"
    "        _sys.modules['sitecustomize'] = module\n"
    "        spec.loader.exec_module(module)\n"
    "\n"
    "\n"
    "_chain(_os.path.dirname(_os.path.abspath(__file__)))\n"
)
