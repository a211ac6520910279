"""mori_compiler: an MLIR compiler for MORI's GPU communication kernels.

The package root is deliberately light: importing it must not import MLIR or llvmlite, so that the
runtime layer (``mori_compiler.runtime``) works on machines that only run precompiled kernel bundles.

Layers, lowest first (a module may import only from its own layer or lower ones):

1. base: ``mori_compiler.errors``, ``.env``, ``.targets``, ``._mlir``, ``.ep_schema``, ``.wire_quant``
2. ``mori_compiler.lib_bitcode``: the device ABI table, the state layout, the device library
3. ``mori_compiler.dialects``: IRDL dialects and their Python builders
4. ``mori_compiler.passes``: lowering passes and the LLVM-level stages
5. ``mori_compiler.runtime``: bundle loading and GPU launch (never imports MLIR or llvmlite)
6. driver: ``mori_compiler.options``, ``.pipeline``, ``.cache``, ``.examples``
7. ``mori_compiler.ops`` (the EP operators, on the cache), ``mori_compiler.tools`` (the CLIs) and
   ``mori_compiler.compat`` (MORI's module names over ops, runtime, io and lib_bitcode), ``mori_compiler.clients``
   (Triton and FlyDSL kernels calling the project's shmem device library)
"""

__version__ = "0.1.0"
