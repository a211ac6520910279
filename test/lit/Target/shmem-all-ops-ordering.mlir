// Every device ABI function linked into one kernel (the built-in example shmem_all_ops) compiles for each
// target with no undefined symbol, and the device library's atomics, immediate puts, signals, waits and
// fences carry system scope on every target (docs/device-abi.md §2.11; lib_bitcode/sources/prelude_*.ll).
// RUN: mori-compile shmem_all_ops --target=gfx942 --emit=isa -o - | FileCheck %s --check-prefix=GFX9
// RUN: mori-compile shmem_all_ops --target=gfx950 --emit=isa -o - | FileCheck %s --check-prefix=GFX9
// RUN: mori-compile shmem_all_ops --target=gfx1250 --emit=isa -o - | FileCheck %s --check-prefix=GFX1250
// RUN: mori-compile shmem_all_ops --target=sm_90 --emit=isa -o - | FileCheck %s --check-prefix=PTX
// RUN: mori-compile shmem_all_ops --target=gfx942 -o %t.hsaco --no-report
// RUN: mori-compile shmem_all_ops --target=gfx1250 -o %t.gfx1250.hsaco --no-report
// RUN: mori-compile shmem_all_ops --target=sm_90 -o %t.ptx

// On gfx942/gfx950, sc1 = system scope on atomics; sc0 sc1 on system-scope loads/stores; a system release
// writes back L2 (buffer_wbl2 sc0 sc1), a system acquire invalidates it (buffer_inv sc0 sc1); waits back off.
// GFX9-DAG: flat_atomic_add_x2 v[{{[0-9:]+}}], v[{{[0-9:]+}}] sc1
// GFX9-DAG: flat_atomic_cmpswap_x2 v[{{[0-9:]+}}], v[{{[0-9:]+}}], v[{{[0-9:]+}}] sc0 sc1
// GFX9-DAG: flat_atomic_add v{{[0-9]+}}, v[{{[0-9:]+}}], v{{[0-9]+}} sc0 sc1
// GFX9-DAG: flat_load_dwordx2 v[{{[0-9:]+}}], v[{{[0-9:]+}}] sc0 sc1
// GFX9-DAG: flat_store_dwordx2 v[{{[0-9:]+}}], v[{{[0-9:]+}}] sc0 sc1
// GFX9-DAG: flat_store_byte v[{{[0-9:]+}}], v{{[0-9]+}} sc0 sc1
// GFX9-DAG: flat_store_short v[{{[0-9:]+}}], v{{[0-9]+}} sc0 sc1
// GFX9-DAG: buffer_wbl2 sc0 sc1
// GFX9-DAG: buffer_inv sc0 sc1
// GFX9-DAG: s_sleep 1
// GFX9-NOT: flat_atomic_{{[a-z0-9_]+}} v{{[^s]*}}{{$}}

// gfx1250 has explicit SCOPE_SYS on the same operations; global_wb / global_inv for release / acquire; wave32.
// GFX1250-DAG: flat_atomic_add_u64 v[{{[0-9:]+}}], v[{{[0-9:]+}}] scope:SCOPE_SYS
// GFX1250-DAG: flat_atomic_cmpswap_b64 {{.*}} scope:SCOPE_SYS
// GFX1250-DAG: flat_atomic_xor_b32 {{.*}} scope:SCOPE_SYS
// GFX1250-DAG: flat_load_b64 {{.*}} scope:SCOPE_SYS
// GFX1250-DAG: flat_store_b64 {{.*}} scope:SCOPE_SYS
// GFX1250-DAG: flat_store_b8 {{.*}} scope:SCOPE_SYS
// GFX1250-DAG: global_wb scope:SCOPE_SYS
// GFX1250-DAG: global_inv scope:SCOPE_SYS
// GFX1250-DAG: .amdhsa_wavefront_size32 1
// GFX1250-NOT: flat_atomic_{{[a-z0-9_]+}} v{{[^:]*}}{{$}}

// On sm_90, read-modify-writes are relaxed or release at .sys scope (inline PTX, because LLVM 22 drops both for
// atomicrmw); immediate puts are relaxed .sys stores; signals are release .sys; waits poll with
// ld.relaxed.sys and nanosleep; fence = fence.sc.sys; release before a barrier = fence.acq_rel.sys.
// PTX-DAG: atom.relaxed.sys.add.u32
// PTX-DAG: atom.relaxed.sys.add.u64
// PTX-DAG: atom.relaxed.sys.xor.b32
// PTX-DAG: atom.relaxed.sys.cas.b64
// PTX-DAG: atom.release.sys.add.u64
// PTX-DAG: st.relaxed.sys.b8
// PTX-DAG: st.relaxed.sys.b16
// PTX-DAG: st.relaxed.sys.b32
// PTX-DAG: st.release.sys.b64
// PTX-DAG: ld.relaxed.sys.b64
// PTX-DAG: nanosleep.u32
// PTX-DAG: fence.sc.sys;
// PTX-DAG: fence.acq_rel.sys;
// PTX-DAG: bar.warp.sync
// PTX-NOT: atom.global.
