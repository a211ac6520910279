"""Other kernel languages as clients of the project's shmem device library.

Each module here lets kernels written in another language call MORI's ``mori_shmem_*`` device functions
against the project's device library (lib_bitcode) and have their device state filled by the runtime
(runtime.shmem.shmem_module_init): ``triton`` (``mori.ir.triton``) and ``flydsl`` (``mori.ir.flydsl``).
Importing this package imports nothing: each client imports its language only when used.
"""
