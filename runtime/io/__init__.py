"""MORI-IO in the runtime layer (no MLIR, no llvmlite): the one-sided point-to-point transfer engine of MORI's
``mori.io`` API (issue 14, in progress). Its modules: the enums, configs, descriptors (with their msgpack
wire format) and transfer status of the API, and the TCP backend's frame protocol. ``mori_compiler.io``
re-exports the public names.
"""
