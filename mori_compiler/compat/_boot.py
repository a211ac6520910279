"""What the ``sitecustomize`` that ``run`` writes does in each process started under it: install the
finder, then run the environment's own ``sitecustomize`` (the one ours shadows on PYTHONPATH), if any.

Kept out of the package's import (``mori_compiler.compat`` imports only the standard library at start-up)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

#: The whole sitecustomize.py that ``run`` writes into its boot directory.
SITECUSTOMIZE = (
    "try:\n"
    "    import os as _os\n"
    "    from mori_compiler.compat._boot import boot as _boot\n"
    "except ImportError:  # mori_compiler uninstalled since: nothing to install\n"
    "    pass\n"
    "else:\n"
    "    _boot(_os.path.dirname(_os.path.abspath(__file__)))\n"
)


def boot(boot_dir: str) -> None:
    from . import install

    install()
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != boot_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
