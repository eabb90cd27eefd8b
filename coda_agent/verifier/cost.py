"""The CPU's cost estimate of a candidate: what its forward() moves and launches at a shape, in microseconds.

The runner's op log of one call (forward() on meta tensors at a bench shape, see ``verifier.trace``) records
each gemm call's shape, sinks and the bytes it moves (``GemmCall.hbm_bytes``: A, B, C, tile and vector
operands, D, the extra outputs, the reduces) and each host op with its largest tensor. The estimate prices
them with the roofline the speed of light uses (:mod:`.peaks`), each tensor moved once:

- a gemm call: ``max(2·M·N·K / peak FLOP/s, its bytes / peak bandwidth)``;
- every launch past the task's GEMMs (a reduce sink's finalisation, a host op): :data:`LAUNCH_US`;
- a host op's traffic: its largest tensor read and written in FP32.

It is a floor, not a forecast: the GEMM mainloop's own efficiency, wave quantisation, L2 and the config are
left out. How well it ranks the hand-written kernels' measured H200 times is calibrated by
``bench/probes/cost_calibration.py`` (result: ``bench/calibration/h200-2026-12-03-cost-calibration.md``), and
said in :data:`HOW_WELL`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measure.peaks import Peaks
from .trace import op_launches  # the launch rule's own counts

#: What one extra kernel launch costs on the stream (a small kernel back to back with the GEMM), in µs.
LAUNCH_US = 3.0
#: A pinned tile this small or smaller (M x N elements) gets a note: the estimate leaves the config out, and
#: on the H200 a gemm_residual pinned to 64x64 ran 2.5x its tuned config's time (docs/run.md, "Tuning").
SMALL_TILE = 64 * 64
#: GEMM FLOPs this much above the task's listed GEMMs count as surplus work (not a rounding of the sizes).
FLOPS_SLACK = 1.01
#: The epilogue's byte classes (beyond the GEMM's A and B), as the feedback names them.
EPILOGUE_BYTES = {
    "C": "the C operand read", "tiles": "full-tile operands read",
    "vectors": "row/column vector operands read", "D": "D stored", "outputs": "extra outputs stored",
    "reduces": "reduce results", "copies": "the backend's contiguous copies of strided operands",
}
#: The calibration's verdict, shown with the estimate (bench/calibration/h200-2026-12-03-cost-calibration.md).
HOW_WELL = (
    "a floor from bytes, FLOPs and launches. Against the 65 measured H200 rows of the hand-written kernels "
    "it ranks the times with Spearman 0.996 (measured/estimate 0.98x to 1.30x, median 1.04x), but that is "
    "mostly GEMM size: it ranks time over the speed of light with Spearman 0.29 only. Use it to compare "
    "bytes and launches between candidates, not to predict how close to the speed of light a kernel gets"
)


@dataclass(frozen=True)
class CostEstimate:
    """One call of forward() at one shape, priced on the roofline (see the module docstring)."""

    shape: str
    gemms: int
    flops: float
    bytes_by_kind: dict[str, int]
    launches: int
    host_ops: list[str]
    host_bytes: int
    compute_us: float
    memory_us: float
    gemm_us: float
    launch_us: float
    host_us: float
    tiles: int
    host_launches: int = 0
    sol_us: float | None = None
    min_bytes: float | None = None
    task_flops: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total_us(self) -> float:
        return self.gemm_us + self.launch_us + self.host_us

    @property
    def epilogue_bytes(self) -> int:
        return sum(v for k, v in self.bytes_by_kind.items() if k in EPILOGUE_BYTES)

    @property
    def bytes_per_tile(self) -> float:
        """Epilogue bytes per output tile (C, operands, D, extra outputs, reduces: what the epilogue
        moves)."""
        return self.epilogue_bytes / max(self.tiles, 1)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(total_us=round(self.total_us, 2), epilogue_bytes=self.epilogue_bytes,
                 bytes_per_tile=round(self.bytes_per_tile))
        for k in ("compute_us", "memory_us", "gemm_us", "launch_us", "host_us", "flops"):
            d[k] = round(d[k], 2)
        return d

    def dominant(self) -> str:
        """What a faster candidate would cut first: the largest avoidable part of the estimate, in words."""
        parts: list[tuple[float, str]] = []
        # GEMM work above the task's listed GEMMs: a product computed twice (a statistic's pass, then the
        # same GEMM again to apply it) costs its whole mainloop again
        if self.task_flops and self.flops > FLOPS_SLACK * self.task_flops:
            surplus = self.flops - self.task_flops
            parts.append((self.gemm_us * surplus / self.flops,
                          f"GEMM work above the task's listed GEMMs ({self.flops / self.task_flops:.2f}x "
                          f"their FLOPs in {self.gemms} gemm calls: a product computed more than once; each "
                          "listed GEMM once, its epilogue doing the rest)"))
        # traffic above the task's minimum, where the GEMMs are memory-bound at all
        total_bytes = sum(self.bytes_by_kind.values())
        if self.memory_us > self.compute_us and self.min_bytes is not None and total_bytes > self.min_bytes:
            floor = max(self.compute_us, self.memory_us * self.min_bytes / total_bytes)
            biggest = max(EPILOGUE_BYTES, key=lambda k: self.bytes_by_kind.get(k, 0))
            parts.append((self.memory_us - floor, "HBM bytes above the task's minimum "
                                                  f"({(total_bytes - self.min_bytes) / 1e6:.0f} MB more; the "
                                                  f"epilogue's largest: {EPILOGUE_BYTES[biggest]}, "
                                                  f"{self.bytes_by_kind.get(biggest, 0) / 1e6:.0f} MB)"))
        extra = self.launches - self.gemms
        if extra > 0:
            parts.append((self.launch_us + self.host_launches * LAUNCH_US,
                          f"{extra} launch(es) besides the GEMM kernels (reduce finalisation, host ops: "
                                          f"{', '.join(self.host_ops[:4]) or 'none'})"))
        if self.host_bytes:
            parts.append((self.host_us - self.host_launches * LAUNCH_US,
                          f"host ops' traffic ({self.host_bytes / 1e6:.1f} MB)"))
        parts = [p for p in parts if p[0] > 0.005 * self.total_us]
        if not parts:
            return "nothing avoidable: the estimate is the GEMM's own roof (compute or its operands' bytes)"
        cost, what = max(parts)
        return f"{what}, about {cost:.0f} µs of the {self.total_us:.0f} µs estimate"


def estimate(ops: Sequence[Mapping[str, Any]], peaks: Peaks, *, shape: str = "", sol_us: float | None = None,
             min_bytes: float | None = None, task_flops: float | None = None) -> CostEstimate:
    """The cost of one call from its op log (the runner's records of gemm calls and host ops);
    ``task_flops``: 2·M·N·K summed over the task's listed GEMMs, against which surplus GEMM work shows."""
    bw, rate = peaks.hbm_tbps * 1e12, peaks.tflops_bf16 * 1e12
    by_kind: dict[str, int] = {}
    flops = compute = memory = gemm_us = 0.0
    launches = gemms = tiles = host_bytes = host_launches = 0
    host: list[str] = []
    notes: list[str] = []
    for op in ops:
        if "gemm" in op:
            m, n, k = (int(v) for v in op["gemm"])
            raw = op.get("bytes")
            moved = {str(key): max(int(v), 0) for key, v in raw.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool) and v
                     == v} if isinstance(raw, dict) else {}
            for key, v in moved.items():
                by_kind[key] = by_kind.get(key, 0) + v
            f = 2.0 * m * n * k
            c_us, m_us = f / rate * 1e6, sum(moved.values()) / bw * 1e6
            flops, compute, memory, gemm_us = flops + f, compute + c_us, memory + m_us, gemm_us + max(c_us,
                                                                                                      m_us)
            gemms += 1
            launches += op_launches(op)
            got = op.get("config")
            cfg: Mapping[str, Any] = got if isinstance(got, dict) else {}
            tm, tn = (v if isinstance(v, int) and v > 0 else d for v, d in ((cfg.get("tile_m"), 128),
                                                                            (cfg.get("tile_n"), 192)))
            tiles += -(-m // tm) * -(-n // tn)
            if "tile_m" in cfg and "tile_n" in cfg and tm * tn <= SMALL_TILE and not notes:
                notes.append(f"a gemm call pins a {tm}x{tn} tile, which this estimate does not price (it "
                             "leaves the config out); on the H200 a gemm_residual pinned to 64x64 ran 2.5x "
                             "its tuned config's time. A GPU run's tune stage picks the config: leave Config "
                             "out unless a shape needs one")
        elif count := op_launches(op):
            host.append(str(op.get("op")))
            # an op log from before the runner counted bytes: its largest tensor read and written in FP32
            host_bytes += int(op["bytes"]) if "bytes" in op else 2 * 4 * int(op.get("numel", 0))
            launches += count
            host_launches += count
    launch_us = (launches - gemms - host_launches) * LAUNCH_US
    host_us = host_launches * LAUNCH_US + host_bytes / bw * 1e6
    return CostEstimate(
        shape=shape, gemms=gemms, flops=flops, bytes_by_kind=by_kind, launches=launches, host_ops=host,
        host_bytes=host_bytes, compute_us=compute, memory_us=memory, gemm_us=gemm_us, launch_us=launch_us,
        host_us=host_us, tiles=tiles, host_launches=host_launches, sol_us=sol_us, min_bytes=min_bytes,
        task_flops=task_flops, notes=notes,
    )


def summary(estimates: Sequence[CostEstimate]) -> str:
    """The estimate in a few lines for the feedback: per shape, then what a faster candidate would cut."""
    if not estimates:
        return ""
    lines = ["| shape | estimate µs | SoL µs | GEMM roof µs | extra launches | host ops | epilogue MB (per "
             "tile KB) |",
             "|---|---|---|---|---|---|---|"]
    for e in estimates:
        sol = f"{e.sol_us:.1f}" if e.sol_us is not None else "-"
        lines.append(f"| {e.shape} | {e.total_us:.1f} | {sol} | {e.gemm_us:.1f} | {e.launches - e.gemms} | "
                     f"{len(e.host_ops)} | {e.epilogue_bytes / 1e6:.1f} ({e.bytes_per_tile / 1e3:.0f}) |")
    worst = max(estimates, key=lambda e: e.total_us / e.sol_us if e.sol_us else 0.0)
    lines.append("")
    lines.append(f"Largest avoidable cost (at {worst.shape}): {worst.dominant()}.")
    lines += [f"Note: {n}." for n in dict.fromkeys(n for e in estimates for n in e.notes)]
    lines.append(f"How far to trust it: {HOW_WELL}.")
    return "\n".join(lines)
