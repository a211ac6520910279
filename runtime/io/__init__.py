"""MORI-IO in the runtime layer (no MLIR, no llvmlite): the one-sided point-to-point transfer engine of MORI's
``mori.io`` API (issue 14, in progress). ``mori_compiler.io`` re-exports the public names.

* ``enums``: BackendType, MemoryLocationType, StatusCode, PollCqMode (MORI's values);
* ``configs``: IOEngineConfig, RdmaBackendConfig, XgmiBackendConfig (MORI's) and TcpBackendConfig (ours);
* ``descriptors``: EngineDesc, MemoryDesc and their msgpack wire format, ``local_node_id()``;
* ``status``: TransferStatus and ``wait_all``;
* ``log``: the ``mori_compiler.io`` logger and ``set_log_level``;
* ``checks``: the argument checks the value types share;
* ``tcp_frames``: the TCP backend's frame protocol; ``tcp_socket``: frame I/O over blocking sockets;
* ``tcp_backend``: the TCP transport (listener, server and receiver threads);
* ``engine``: IOEngine and IOEngineSession (route selection, memory registry, bounds checks).
"""
