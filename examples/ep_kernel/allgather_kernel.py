"""The generator of the toy family ``row_allgather`` (docs/extending.md, part 3): a kernel built with
``dialects/builder.py`` from the generic comm blocks (``dialects/mori_comm.py``), its header from the
family's ``KernelSignature`` (allgather_schema.py).

Protocol (the EP dispatch's completion, minus the routing), one warp per row, rows strided over the grid:

1. block 0, threads p < W: ``counts[p] = n`` (every peer gets all n rows);
2. each warp copies its row to every PE at once (``row_copy_to_peers``: lane k names PE k; each 16-byte
   vector is loaded once and stored to every PE; plain stores, published by the fences of step 3);
3. ``grid_barrier``: this PE's blocks meet; its fences order every row store of this PE before step 4;
4. warp 0 of block 0: ``count_signal``: lane p waits until PE p consumed our previous count (flow
   control), fences (release) and sends ``counts[p] + 1``; then waits for every PE's count, fences
   (acquire: that PE's rows to us are visible), resets the slot and stores the sum into ``total``.

So when the kernel ends on PE q, rows ``[p * M, p * M + n_p)`` of its ``out`` hold PE p's rows for every p.
Counters and slots are left ready for the next call (nothing to reset from the host).
"""

from __future__ import annotations

from mori_compiler._mlir import ir
from mori_compiler.dialects import mori_comm, mori_shmem
from mori_compiler.dialects.builder import Builder, generated_location, new_gpu_module, new_kernel, verify_generated

from allgather_schema import SIGNATURE, AllGatherSizes

GENERATOR = "row_allgather"


def build_kernel(module_body: ir.Block, sizes: AllGatherSizes, *, wave_size: int, warps_per_block: int = 4) -> str:
    """Append ``ep_row_allgather_<dtype>`` to a gpu.module body; returns the kernel's name."""
    name = SIGNATURE.kernel_name(sizes.dtype)
    with generated_location(GENERATOR) as loc:
        b = Builder(module_body, loc=loc)
        types = {"ptr": b.ptr, "i32": b.i32}
        _, entry = new_kernel(module_body, name, [types[t] for t in SIGNATURE.types], param_names=SIGNATURE.names,
                              block_size=(warps_per_block * wave_size, 1, 1), loc=loc)  # fmt: skip
        b = Builder(entry, loc=loc)
        p = dict(zip(SIGNATURE.names, entry.arguments))
        world = b.const_i32(sizes.world_size)
        tid = b.thread_id()
        lane = b.index_cast(b.i32, b.lane_id())
        block = b.block_id()
        first_block = b.cmpi("eq", block, b.const_index(0))

        # 1. every peer gets all n rows
        with b.if_(b.andi(first_block, b.cmpi("ult", b.index_cast(b.i32, tid), world))):
            b.store(p["n"], b.gep(p["counts"], b.index_cast(b.i32, tid), b.i32))

        # 2. one warp per row, each row to every PE (lane k < W: destination PE k)
        wpb = b.const_index(warps_per_block)
        warp = b.divui(tid, b.const_index(wave_size))
        first_warp = b.addi(b.muli(block, wpb), warp)
        warps = b.muli(b.grid_dim(), wpb)
        me = mori_shmem.my_pe(**b.at())
        row_bytes = b.const_i64(sizes.row_bytes)
        with b.for_(first_warp, b.index_cast(b.index, p["n"]), warps) as i:
            i64 = b.index_cast(b.i64, i)
            src = b.gep(p["x"], b.muli(i64, row_bytes), b.i8)
            out_row = b.addi(b.muli(b.extui(b.i64, me), b.const_i64(sizes.max_rows)), i64)
            dest = b.gep(p["out"], b.muli(out_row, row_bytes), b.i8)  # a symmetric address: the same on every PE
            mori_comm.row_copy_to_peers(dest, src, row_bytes, lane, b.cmpi("ult", lane, world),
                                        max_peers=sizes.world_size, **b.at())  # fmt: skip

        # 3. this PE's blocks meet (publishing its row stores); 4. the count handshake, one warp
        mori_comm.grid_barrier(p["grid_ctr"], **b.at())
        with b.if_(b.andi(first_block, b.cmpi("eq", warp, b.const_index(0)))):
            mori_comm.count_signal(p["signals"], p["counts"], p["total"], world_size=sizes.world_size, **b.at())
        b.gpu_return()
    return name


def kernel_module(sizes: AllGatherSizes, *, wave_size: int, warps_per_block: int = 4) -> ir.Module:
    """A module holding the family's kernel, built in the current context (project dialects loaded)."""
    with generated_location(GENERATOR):
        module, body = new_gpu_module("row_allgather")
        build_kernel(body, sizes, wave_size=wave_size, warps_per_block=warps_per_block)
    verify_generated(module.operation, GENERATOR)
    return module
