"""The collectives' schema (standard library only): what each ``mori_coll`` op means in sizes, the layout
of its symmetric workspace, its kernel's name, parameters and launch geometry, and the kernel module's text.

The one owner of these facts: the dialect's verifier (dialects/mori_coll.py), the generators
(passes/coll_kernels.py), the Python API (mori_compiler/ops/collectives.py) and the host reference all read
them here. Importing it needs no MLIR, so a GPU machine without the compiler computes the bundle key
(the text of ``kernel_source``) and finds a precompiled bundle.

Sizes, per op (``count`` elements of ``dtype``; W = world_size):

=============== ================= ================== ======================================================
op              input (per PE)    output (per PE)    result
=============== ================= ================== ======================================================
all_gather      count             W * count          out[p * count + i] = in_p[i]
all_reduce      count             count              out[i] = sum_p in_p[i] (fp32 sums, rounded once)
reduce_scatter  W * count         count              out[i] = sum_p in_p[me * count + i]
broadcast       count (root's)    count              out[i] = in_root[i]
all_to_all      W * count         W * count          out[p * count + i] = in_p[me * count + i]
all_to_all_v    W * count (cap.)  W * count (cap.)   in_p holds W chunks packed (chunk q: splits_p[q] <= count
                                                     elements, for PE q); out = the chunks for me, packed in PE
                                                     order; recv_counts[p] = splits_p[me]
=============== ================= ================== ======================================================

all_to_all_v's ``splits`` (this PE's i32 [W], device memory) and ``recv_counts`` (i32 [W], written) are two
more kernel parameters; a split above ``count`` is clamped to it on the device (no host sync to refuse it).

Workspace (one symmetric allocation per collective, 256-byte aligned; only the header is zeroed, once):
``[device-barrier slots: max_blocks x W u64 | epochs: max_blocks u64 | sources: max_blocks i64]`` (the
header), then the staging area (``stage``: the input's chunks, chunk c at ``c * stage_stride``), then the
reduced area (``reduced``: the sums this PE computed). Chunks and pieces are 16-byte aligned, so
accumulate_rows reads whole vectors. ``sources[b]``: where block b of this PE placed the bytes its peers
read this call, as an offset from the workspace (the stage's, or the input's when it is read in place:
``in_place_layout`` and passes/coll_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "broadcast", "all_to_all", "all_to_all_v")
REDUCING = ("all_reduce", "reduce_scatter")
ALGORITHMS = ("one_shot", "two_shot")  # all_reduce only
REDUCE_DTYPES = ("f32", "bf16")  # summed in fp32
# The movers copy bytes: any dtype of these element sizes.
ELEMENT_BYTES = {"u8": 1, "i8": 1, "bool": 1, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1, "i16": 2, "f16": 2, "bf16": 2,
                 "i32": 4, "f32": 4, "i64": 8, "f64": 8}  # fmt: skip
MAX_WORLD_SIZE = 32  # the device barrier gives each peer one thread; accumulate_rows sums up to W rows
MAX_BLOCKS = 32  # blocks per PE (device-barrier slots per block); W x 32 blocks of 256 threads fit an H200
MAX_BYTES = 1 << 34  # per input or output: offsets stay far from i64 limits
BLOCK_THREADS = 256
BYTES_PER_BLOCK = 64 << 10  # the launch takes one block per 64 KiB a PE moves, up to max_blocks
# And at most this many over all PEs (W virtual PEs' grids are co-resident on one GPU): two blocks of 256
# threads per H200 SM. Measured (session 13, 8 virtual PEs, bf16, 16 and 64 MiB, heap inputs): 32 blocks per PE
# rather than 16 speed the reducing collectives up (one-shot all_reduce 1.6x: W loads in flight per vector
# need the warps), all_gather and broadcast at 16 MiB by 4 %; all_to_all, which reads each byte once, runs 3 %
# slower with them and keeps 16 (ALL_TO_ALL_GRID_BLOCKS).
VIRTUAL_GRID_BLOCKS = 256
ALL_TO_ALL_GRID_BLOCKS = 128
ONE_SHOT_MAX_BYTES = 512 << 10  # all_reduce's automatic algorithm: one_shot up to this many bytes, two_shot above
VECTOR = 16
HEADER_ALIGN = 256
KERNEL_PARAMS = ("input", "output", "workspace")  # all pointers: the PE's own tensors, its workspace address
SPLIT_PARAMS = ("splits", "recv_counts")  # all_to_all_v's: this PE's i32 [W] split sizes, and the received ones


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


@dataclass(frozen=True)
class CollSpec:
    """One collective: ``op`` over ``count`` elements of ``dtype`` on ``world_size`` PEs; ``algorithm`` for
    all_reduce (one_shot or two_shot; "" otherwise), ``root`` for broadcast (0 otherwise), ``max_blocks``
    the most blocks per PE a launch may use (the device barrier's slots)."""

    op: str
    dtype: str
    count: int
    world_size: int
    algorithm: str = ""
    root: int = 0
    max_blocks: int = MAX_BLOCKS

    def problems(self) -> list[str]:
        """Every rule the spec breaks, each message naming the field and the allowed values (empty: valid)."""
        out = []
        if self.op not in COLLECTIVES:
            return [f"op must be one of {', '.join(COLLECTIVES)}, got {self.op!r}"]
        allowed = REDUCE_DTYPES if self.op in REDUCING else tuple(ELEMENT_BYTES)
        if self.dtype not in allowed:
            what = "summed in fp32" if self.op in REDUCING else "moved as bytes"
            out.append(f"{self.op}: 'dtype' ({what}) must be one of {', '.join(allowed)}, got {self.dtype!r}")
        for name in ("count", "world_size", "root", "max_blocks"):
            if type(getattr(self, name)) is not int:
                out.append(f"{self.op}: '{name}' must be an int, got {getattr(self, name)!r}")
        if out:
            return out
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            out.append(f"{self.op}: 'world_size' must be in [1, {MAX_WORLD_SIZE}], got {self.world_size}")
        if not 1 <= self.max_blocks <= MAX_BLOCKS:
            out.append(f"{self.op}: 'max_blocks' must be in [1, {MAX_BLOCKS}], got {self.max_blocks}")
        if self.count < 1:
            out.append(f"{self.op}: 'count' must be >= 1, got {self.count}")
        elif max(self.input_elems, self.output_elems) * ELEMENT_BYTES.get(self.dtype, 1) > MAX_BYTES:
            out.append(f"{self.op}: 'count' ({self.count}) makes the input or output larger than {MAX_BYTES} bytes")
        if self.op == "all_reduce":
            if self.algorithm not in ALGORITHMS:
                out.append(f"all_reduce: 'algorithm' must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        elif self.algorithm:
            out.append(f"{self.op}: 'algorithm' is for all_reduce only, got {self.algorithm!r}")
        if self.op == "broadcast":
            if not 0 <= self.root < self.world_size:
                out.append(f"broadcast: 'root' must be in [0, world_size = {self.world_size}), got {self.root}")
        elif self.root:
            out.append(f"{self.op}: 'root' is for broadcast only, got {self.root}")
        return out

    def check(self) -> "CollSpec":
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def elem_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def input_elems(self) -> int:
        return self.count * (self.world_size if self.op in ("reduce_scatter", "all_to_all", "all_to_all_v") else 1)

    @property
    def output_elems(self) -> int:
        return self.count * (self.world_size if self.op in ("all_gather", "all_to_all", "all_to_all_v") else 1)

    @property
    def two_shot(self) -> bool:
        return self.op == "all_reduce" and self.algorithm == "two_shot"

    @property
    def chunk_elems(self) -> int:
        """Elements of one staged chunk (two_shot: a PE's share, whole 16-byte vectors; the last ones shorter)."""
        if self.two_shot:
            return _round_up(-(-self.count // self.world_size), VECTOR // self.elem_bytes)
        return self.count

    def chunks(self) -> list[tuple[int, int]]:
        """(input byte offset, bytes) of each chunk the PE stages: chunk c lands at ``c * stage_stride``."""
        n, cb = self.count * self.elem_bytes, self.chunk_elems * self.elem_bytes
        if self.two_shot:
            return [(c * cb, max(0, min(cb, n - c * cb))) for c in range(self.world_size)]
        if self.op in ("reduce_scatter", "all_to_all", "all_to_all_v"):  # (all_to_all_v: capacities; packed)
            return [(c * n, n) for c in range(self.world_size)]
        return [(0, n)]

    @property
    def stage_stride(self) -> int:
        return _round_up(self.chunk_elems * self.elem_bytes, VECTOR)

    @property
    def whole_vectors(self) -> bool:
        """``count`` elements are whole 16-byte vectors."""
        return (self.count * self.elem_bytes) % VECTOR == 0

    @property
    def in_place_layout(self) -> bool:
        """Whether the peers may read this PE's input where it is (no staging copy), when at run time it
        lies in the symmetric heap, 16-byte aligned, apart from the output: its chunks start where the
        stage's do (one chunk, or ``count`` bytes a multiple of 16) and no whole-vector read of a sum runs
        past its end (the same condition). all_to_all_v always stages (its chunks are packed)."""
        if self.op in ("all_gather", "broadcast"):
            return True
        return self.op != "all_to_all_v" and self.whole_vectors

    @property
    def sums_into_output(self) -> bool:
        """reduce_scatter and one-shot all_reduce: the sums go straight into the output (no ``reduced`` and
        second copy) when its bytes are whole 16-byte vectors (and, at run time, the output is aligned)."""
        one_shot = self.op == "all_reduce" and self.algorithm == "one_shot"
        return (one_shot or self.op == "reduce_scatter") and self.whole_vectors

    # ---- workspace --------------------------------------------------------------------------------
    @property
    def header_bytes(self) -> int:
        """Device-barrier slots, epochs (zeroed once at allocation, never reset) and sources."""
        return _round_up(self.sources_offset + 8 * self.max_blocks, HEADER_ALIGN)

    @property
    def slots_offset(self) -> int:
        return 0

    @property
    def epochs_offset(self) -> int:
        return 8 * self.max_blocks * self.world_size

    @property
    def sources_offset(self) -> int:
        """``sources[max_blocks]`` i64: block b's offset (from the workspace) of the bytes it placed."""
        return self.epochs_offset + 8 * self.max_blocks

    @property
    def stage_offset(self) -> int:
        return self.header_bytes

    @property
    def sizes_offset(self) -> int:
        """all_to_all_v: the splits each block publishes, ``[max_blocks][W]`` u64 (block b's copy is read by
        block b of the peers: the per-block barrier orders it)."""
        return self.stage_offset + _round_up(len(self.chunks()) * self.stage_stride, HEADER_ALIGN)

    @property
    def sizes_bytes(self) -> int:
        return 8 * self.max_blocks * self.world_size if self.op == "all_to_all_v" else 0

    @property
    def reduced_offset(self) -> int:
        return self.sizes_offset + _round_up(self.sizes_bytes, HEADER_ALIGN)

    @property
    def reduced_bytes(self) -> int:
        return self.stage_stride if self.op in REDUCING else 0

    @property
    def workspace_bytes(self) -> int:
        return self.reduced_offset + _round_up(self.reduced_bytes, HEADER_ALIGN)

    # ---- kernel -----------------------------------------------------------------------------------
    @property
    def kernel_name(self) -> str:
        variant = f"_{self.algorithm}" if self.algorithm else (f"_root{self.root}" if self.op == "broadcast" else "")
        return f"coll_{self.op}{variant}_{self.dtype}_w{self.world_size}_n{self.count}"

    @property
    def blocks(self) -> int:
        """Blocks per PE of a launch: one per BYTES_PER_BLOCK the PE moves, at most max_blocks and
        VIRTUAL_GRID_BLOCKS // W (ALL_TO_ALL_GRID_BLOCKS for the all_to_alls); every call of a collective
        uses this grid: its pieces depend on it."""
        moved = max(self.input_elems, self.output_elems) * self.elem_bytes
        grid = ALL_TO_ALL_GRID_BLOCKS if self.op in ("all_to_all", "all_to_all_v") else VIRTUAL_GRID_BLOCKS
        return max(1, min(self.max_blocks, grid // self.world_size, -(-moved // BYTES_PER_BLOCK)))

    def op_attributes(self) -> list[tuple[str, object]]:
        """The op's attributes in the order the text writes them (ints are i64)."""
        attrs: list[tuple[str, object]] = [("dtype", self.dtype), ("count", self.count),
                                           ("world_size", self.world_size), ("max_blocks", self.max_blocks)]  # fmt: skip
        if self.op == "all_reduce":
            attrs.append(("algorithm", self.algorithm))
        if self.op == "broadcast":
            attrs.append(("root", self.root))
        return attrs

    @property
    def params(self) -> tuple[str, ...]:
        """The kernel's parameters (all pointers), in order."""
        return KERNEL_PARAMS + (SPLIT_PARAMS if self.op == "all_to_all_v" else ())

    def op_source(self) -> str:
        attrs = ", ".join(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v} : i64" for k, v in self.op_attributes())
        ptrs = ", ".join(["!llvm.ptr"] * len(self.params))
        operands = ", ".join(f"%{p}" for p in self.params)
        return f'"mori_coll.{self.op}"({operands}) {{{attrs}}} : ({ptrs}) -> ()'


def auto_algorithm(dtype: str, count: int) -> str:
    """all_reduce's algorithm when none is named: one_shot (one round, the lowest latency) up to
    ONE_SHOT_MAX_BYTES, two_shot (each PE reads the bytes twice, not W times) above."""
    return "one_shot" if count * ELEMENT_BYTES.get(dtype, 1) <= ONE_SHOT_MAX_BYTES else "two_shot"


def kernel_source(specs: list[CollSpec] | tuple[CollSpec, ...]) -> str:
    """The kernel module of ``specs``: one gpu.func per collective, its body the mori_coll op (what
    mori-coll-to-kernels expands). Plain text: the bundle cache key's input, computed without MLIR."""
    funcs = []
    for s in specs:
        s.check()
        params = ", ".join(f"%{p}: !llvm.ptr" for p in s.params)
        funcs.append(f"    gpu.func @{s.kernel_name}({params}) kernel attributes "
                     f"{{known_block_size = array<i32: {BLOCK_THREADS}, 1, 1>}} {{\n"
                     f"      {s.op_source()}\n      gpu.return\n    }}")  # fmt: skip
    body = "\n".join(funcs)
    return f"module attributes {{gpu.container_module}} {{\n  gpu.module @mori_coll {{\n{body}\n  }}\n}}\n"
