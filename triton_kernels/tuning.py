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

    def __post_init__(self):
        for name in ("block", "persistent_cols", "loop_cols", "row_tile"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Tuning.{name}={value} is not valid: Triton blocks are powers of two")


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
