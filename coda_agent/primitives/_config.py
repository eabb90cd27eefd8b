"""The GEMM kernel configuration and its SM90 rules: torch-free, so verdicts and records that name a config
load fast."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

Mode = Literal["element", "acc_pair", "packed"]
#: Which of B's dims is contiguous, as QuACK labels it: "k" (B = w.t() of an (N, K) weight) or "n" (a (K, N)
#: tensor).
Major = Literal["k", "n"]
#: The most K splits a Config may ask for (each split's K range must stay long enough to pipeline).
MAX_SPLIT_K = 16
#: The largest swizzle group a Config may ask for (the tune stage tries 4, 8 and 16).
MAX_SWIZZLE = 64

#: The alignment QuACK compiles every tile tensor for (``quack.compile_utils.div_for_dtype``): TMA copies rows
#: of 16 bytes at a time, so a row stride or start off that grid breaks the kernel on the GPU, not the CPU
#: compile.
TMA_ALIGN_BYTES = 16


def tma_row_multiple(itemsize: int) -> int:
    """What a row's element count must be a multiple of for TMA to move it (8 for 16-bit elements, 4 for
    32-bit): gemm() checks every tile it moves by it, and ``coda-agent validate`` every tile-shaped tensor of
    a task."""
    return max(1, TMA_ALIGN_BYTES // itemsize)


class EpilogueError(ValueError):
    """A candidate broke the epilogue contract (declaration, call or fn result)."""


@dataclass(frozen=True)
class Config:
    """Explicit GEMM kernel configuration (SM90 rules).

    ``Config()`` is QuACK's SM90 default: 128x192 tile, 2x1 cluster, pingpong. A gemm call that names no
    config runs, with wave cost = ceil(tiles / 132) x tile_m x tile_n (partial tiles counted, clusters not): -
    acc_pair mode: the default; packed mode: 128x128 (2x1, pingpong); - element mode: 64 x N rounded up to 16
    if N < 192; the default if under 132 tiles; else cooperative 128x256 if K >= 8192, the
      epilogue is light (no (M, N) tile operand besides C, no RowVecReduce) and its wave cost is no higher
      than the default's; else 128x128 (2x1, pingpong) if the default's wave cost is at least 1.05x its own;
      else the default.

    Whether to pass one: a GPU run times each correct candidate's valid configs and pins the fastest with
    :func:`schedule` (over ``config=``); a CPU-only run times none. So pass none unless you know a better one
    for the bench shapes. SM90's rules, checked where the config is used: pingpong tile_m 64, 128 or 192 with
    tile_n at most 256, 208 or 128 respectively; cooperative (``pingpong=False``) tile_m up to 320; tile_n a
    multiple of 16 (of 32 in acc_pair mode with an extra output). split_k > 1 splits K over that many CTAs
    per output tile (serial: the same result run to run; the epilogue runs once): it fills a GPU whose grid of
    tiles is too small, and needs D.
    load_ahead: where the epilogue reads C or an (M, N) tile operand (element/acc_pair mode, or packed at
    pingpong tile_n > 128; split_k 1), a producer warp loads them during the mainloop (the harness's SM90
    kernel); False, or any other call, runs QuACK's kernel, which loads them when its epilogue starts. Outputs
    match bit for bit.
    """

    tile_m: int = 128
    tile_n: int = 192
    cluster_m: int = 2
    cluster_n: int = 1
    pingpong: bool = True
    max_swizzle_size: int = 8
    split_k: int = 1
    load_ahead: bool = True

    def __post_init__(self) -> None:
        # each field its own type, as it is made: a list kept in a module-level Config would be state the
        # module's frozen globals do not freeze (a red-team pass)
        for f in fields(self):
            value, flag = getattr(self, f.name), f.type in ("bool", bool)
            if type(value) is not (bool if flag else int):
                want = "True or False" if flag else "an int"
                raise EpilogueError(f"invalid Config: {f.name} must be {want}, got {value!r}")

    def check(self, mode: Mode, has_outputs: bool, store_d: bool = True, b_major: Major = "k") -> None:
        """Reject configs QuACK would reject on SM90, or could not build, with the rule that failed."""
        problems = []
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            problems.append(f"split_k must be 1 to {MAX_SPLIT_K}, got {self.split_k}")
        elif self.split_k > 1 and not store_d:
            problems.append("split_k > 1 needs D stored (store_d=True): the last split's epilogue writes it")
        if self.tile_n % 16:
            problems.append(f"tile_n={self.tile_n} must be a multiple of 16")
        if self.pingpong:
            limits = {64: 256, 128: 208, 192: 128}
            if self.tile_m not in limits:
                problems.append(f"pingpong needs tile_m to be one of {', '.join(map(str, limits))}, got "
                                f"{self.tile_m}")
            elif self.tile_n > limits[self.tile_m]:
                problems.append(f"pingpong with tile_m={self.tile_m} needs tile_n <= {limits[self.tile_m]}")
        elif self.tile_m not in (64, 128, 192, 256, 320):
            problems.append(f"cooperative needs tile_m in (64, 128, 192, 256, 320), got {self.tile_m}")
        elif self.tile_m in (192, 320):  # QuACK splits these along N between the two warp groups
            most = 256 if self.tile_m == 192 else 160
            if self.tile_n % 32 or self.tile_n > most:
                problems.append(f"cooperative with tile_m={self.tile_m} needs tile_n a multiple of 32 and <= "
                                f"{most}")
        elif self.tile_n > 512 or (self.tile_n > 256 and self.tile_n % 32):
            problems.append("cooperative needs tile_n <= 256, or a multiple of 32 up to 512")
        if self.cluster_m * self.cluster_n not in (1, 2, 4):
            problems.append("cluster_m * cluster_n must be 1, 2 or 4")
        if not 1 <= self.max_swizzle_size <= MAX_SWIZZLE:
            problems.append(f"max_swizzle_size (tiles the scheduler walks along one dimension before the "
                            f"next row or column) must be 1 to {MAX_SWIZZLE}, got {self.max_swizzle_size}")
        if mode == "acc_pair" and has_outputs and self.tile_n % 32:
            problems.append("acc_pair mode with extra outputs needs tile_n % 32 == 0")
        split = (f"cooperative {self.tile_m}x{self.tile_n} splits the tile along N between its two warp "
                 "groups, and ")
        unsplit = "use tile_m 128 or 256, or 192 with tile_n <= 128"
        if mode == "acc_pair" and has_outputs and self.splits_n:
            problems.append(split + "QuACK's SM90 kernel then stores acc_pair mode's half-width outputs "
                                    "wrongly "
                            "(measured on the H200: gemm_rmsnorm_gemm's act at 8000 x 20000 x 4000): "
                            f"{unsplit}")
        if b_major == "n" and self.splits_n:
            problems.append(split + "QuACK's SM90 kernel does not build that with an N-major B (the CuTe DSL "
                                    "compiler "
                            f"aborts): pass B K-major (w.t() of an (N, K) weight), or {unsplit}")
        if problems:
            raise EpilogueError("invalid Config: " + "; ".join(problems))

    @property
    def splits_n(self) -> bool:
        """Whether QuACK lays the two warp groups of a cooperative tile side by side along N (tile_m 320, or
        192 with tile_n > 128: ``GemmSm90.__init__``'s atom layout) instead of along M."""
        return not self.pingpong and (self.tile_m == 320 or (self.tile_m == 192 and self.tile_n > 128))
