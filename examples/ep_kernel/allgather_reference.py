"""The reference model of the toy family ``row_allgather`` (NumPy only): what every PE's ``out`` and
``total`` hold after one call, computed from the schema's placement rule (``AllGatherSizes.out_row``)."""

from __future__ import annotations

import numpy as np

from allgather_schema import AllGatherSizes


def expected(rows: list, sizes: AllGatherSizes, *, before=None) -> tuple[list[np.ndarray], list[int]]:
    """(out [W * M, H] per PE, total per PE) after every PE p sent ``rows[p]`` ([n_p, H], n_p <= M).

    Rows no PE wrote keep their previous content: ``before`` (per PE), zeros by default.
    """
    W, M = sizes.world_size, sizes.max_rows
    if len(rows) != W:
        raise ValueError(f"{len(rows)} PEs' rows for world_size {W}")
    for p, r in enumerate(rows):
        if not 0 <= len(r) <= M:
            raise ValueError(f"PE {p} sends {len(r)} rows; at most max_rows = {M}")
    shape = (W * M, sizes.hidden)
    dtype = np.asarray(rows[0]).dtype
    outs = [np.array(b) if before is not None else np.zeros(shape, dtype) for b in (before or [None] * W)]
    for p, r in enumerate(rows):
        for i, row in enumerate(np.asarray(r)):
            for out in outs:
                out[sizes.out_row(p, i)] = row
    return outs, [sum(len(r) for r in rows)] * W
