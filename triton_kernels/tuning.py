"""Block sizes of the generated kernels. They are launch-time constants, not part of a kernel's source,
so changing them never regenerates a kernel."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    block: int = 1024              # pointwise: elements per program
    persistent_cols: int = 4096    # rows up to this long are held whole in registers (one read of each input)
    loop_cols: int = 1024          # longer rows are walked in chunks of this many columns
    row_tile: int = 4096           # row kernels: rows x columns per program
    pointwise_warps: int = 4
    row_warps: int = 0             # row kernels' warps; 0: one per 256 elements of the tile, at most 16
    column_block: int = 64         # column sums: columns per program (loads coalesce along them)
    column_rows: int = 32          # column sums: rows per step of a program's walk
    column_programs: int = 1024    # column sums: about this many programs (column blocks x row splits)
    column_warps: int = 4

    def __post_init__(self):
        for name in ("block", "persistent_cols", "loop_cols", "row_tile", "column_block", "column_rows"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Tuning.{name}={value} is not valid: Triton blocks are powers of two")

    def warps_for_rows(self, tile: int) -> int:
        return self.row_warps or min(16, max(1, tile // 256))


# The launch shapes a CUDA launch is timed with (autotune): around the defaults, never changing a
# kernel's spec (persistent_cols and loop_cols stay), so every candidate runs the same source.
POINTWISE_CANDIDATES = tuple(Tuning(block=b, pointwise_warps=w) for b, w in
                             ((1024, 4), (512, 4), (2048, 4), (2048, 8), (4096, 8)))
ROW_CANDIDATES = tuple(Tuning(row_tile=t, row_warps=w) for t, w in
                       ((4096, 0), (1024, 4), (2048, 4), (4096, 8), (8192, 8), (8192, 16)))
# column sums, around the fastest on an H100 by GPU time (bias gradients of [16384, 768] bf16, LayerNorm's
# weight/bias gradients in fp32): narrow column blocks with few row splits, or wide ones with more
COLUMN_CANDIDATES = tuple(Tuning(column_block=c, column_rows=r, column_programs=p, column_warps=w)
                          for c, r, p, w in ((64, 32, 1024, 4), (32, 32, 256, 8), (32, 16, 512, 4),
                                             (128, 16, 512, 4), (64, 64, 256, 4), (64, 64, 1024, 4),
                                             (64, 64, 512, 8), (32, 128, 512, 8)))


# Launch shapes under Triton's interpreter (CPU, TRITON_INTERPRET=1: the tests). It runs a grid's programs
# one after another in Python, each op a numpy call over the block, so fewer and larger programs run
# faster (the HF matrix's triton tests: 507 -> 358 s of test time on 2 cores). The kernels are the same source as on a
# GPU (persistent_cols and loop_cols unchanged), and at the tests' sizes the grids keep several programs.
INTERPRETER = Tuning(block=4096, row_tile=16384, column_programs=4)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
