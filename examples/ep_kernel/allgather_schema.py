"""The schema of a toy kernel family, ``row_allgather`` (docs/extending.md, part 3), in the style of
mori_compiler/ep_schema.py: the sizes a configuration derives, the symmetric buffer table and the kernel's
signature as named, typed parameters. Standard library only, like the EP schema: the generator, the host
and the reference model all read this one module.

Every PE sends its ``n`` rows (``n <= M``) to every PE: row i of PE p lands in row ``p * M + i`` of each
PE's ``out``; a count handshake then tells each PE how many rows every peer sent (``total``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mori_compiler.ep_schema import MAX_WORLD_SIZE, TOKEN_BYTES, Buffer, KernelSignature, Param


@dataclass(frozen=True)
class AllGatherSizes:
    """W PEs, rows of ``hidden`` elements of ``dtype``, at most ``max_rows`` (M) rows per PE."""

    world_size: int
    hidden: int
    max_rows: int
    dtype: str = "bf16"

    def __post_init__(self):
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size must be in [1, {MAX_WORLD_SIZE}], got {self.world_size}")
        if self.dtype not in TOKEN_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(TOKEN_BYTES)}, got {self.dtype!r}")
        if self.hidden < 1 or self.row_bytes % 16:
            raise ValueError(f"a row ({self.hidden} x {self.dtype}) must be a positive multiple of 16 bytes")
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")

    @property
    def row_bytes(self) -> int:
        return self.hidden * TOKEN_BYTES[self.dtype]

    def out_row(self, src_pe: int, i: int) -> int:
        """Where row i of PE src_pe lands in every PE's ``out``."""
        return src_pe * self.max_rows + i


_ANY = frozenset()  # not an EP kernel type: the table is this family's own

BUFFERS: tuple[Buffer, ...] = (
    Buffer("ag_out", lambda s: s.world_size * s.max_rows * s.row_bytes, False, _ANY, "received rows [W * M, H]"),
    Buffer("ag_counts", lambda s: 4 * s.world_size, True, _ANY, "rows sent to each PE this call (i32 [W])"),
    Buffer("ag_signals", lambda s: 8 * s.world_size, True, _ANY, "count-handshake slots (u64 [W])"),
    Buffer("ag_total", lambda s: 16, True, _ANY, "rows received by the last call (i32)"),
    Buffer("ag_grid", lambda s: 16, True, _ANY, "grid barrier words {arrivals, generation}"),
)

SIGNATURE = KernelSignature("row_allgather", (
    Param("x"), Param("n", "i32"), Param("out", buffer="ag_out"), Param("counts", buffer="ag_counts"),
    Param("signals", buffer="ag_signals"), Param("total", buffer="ag_total"), Param("grid_ctr", buffer="ag_grid"),
), "every PE's n rows to every PE, then the count handshake")  # fmt: skip


def _check_table() -> None:
    names = {b.name for b in BUFFERS}
    assert all(p.buffer is None or p.buffer in names for p in SIGNATURE.params), SIGNATURE
    assert len(set(SIGNATURE.names)) == len(SIGNATURE.names), SIGNATURE


_check_table()
