"""How the suite's epilogue kernels' time over their plain twins follows what their epilogues move (issue 44): TMA
row requests or bytes. CPU only: it reads the schedule probe's records (``suite_twin.txt`` runs) and asks the human
kernels, on meta tensors (the ``shapes`` backend), which gemm calls and configs they make at each bench shape.

For a row's largest gemm call at its config, per output tile:
- the mainloop's A/B row requests: ceil(K / 64) k-blocks x (tile_m + tile_n) rows of 128 bytes;
- each (M, N)-sized stream the epilogue loads (C, a tile operand) or stores (D, an extra output): QuACK's epilogue
  moves it one subtile at a time (``GemmSm90._compute_tile_shape_or_override``: 64 or 128 rows by 32 columns, 16
  where the tile's columns are not a multiple of 32), so tile_m x tile_n / epi_n row requests of 2 x epi_n bytes
  (64 or 32), where its bytes alone would be worth tile_m x tile_n / 64 requests of 128;
- the plain twin stores one such stream (D).
Each model's extra share over the twin is a x (loaded requests / A/B requests) + b x (stored requests beyond the
twin's / A/B requests), with a and b fitted by least squares to the measured kernel / twin - 1 over every row;
the printout gives both fits' coefficients and residuals and each row's figures. On the H100 records of 6839700 the
two fits do not separate; a column-major C (``variants/c_m_major.py``, the same bytes in 128-byte rows) then refuted
the requests as the main cost (bench/results/h100-2026-12-07-g-notes.md).

    .venv/bin/python bench/probes/tma_rows.py bench/results/h100-2026-12-07-f-probe-suite.jsonl \
        bench/results/h100-2026-12-07-f-probe-suite-2.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from typing import Any

import torch

from coda_agent.primitives import Config, backend
from coda_agent.primitives.configs import kernel_config
from coda_agent.tasks import find_task, torch_dtype
from coda_agent.tasks.loader import import_file

REFERENCE = "plain twin, dynamic"


def epi_tile(c: Config) -> tuple[int, int]:
    """QuACK 0.6.5's SM90 epilogue subtile for a config (``gemm_sm90.py``: its atom layout, then
    ``_compute_tile_shape_or_override``)."""
    if c.pingpong or c.tile_m == 320:  # pingpong: one warp group a tile; 320 splits along N
        atom_m = 1
    elif c.tile_m == 192:
        atom_m = 3 if c.tile_n <= 128 else 1
    else:
        atom_m = c.tile_m // 64 if c.tile_m < 256 else 2
    if c.tile_m % 128 == 0 and atom_m > 1:
        return math.gcd(128, c.tile_m), math.gcd(32, c.tile_n)
    if c.tile_m % 192 == 0 and atom_m > 1:
        return math.gcd(192, c.tile_m), math.gcd(32, c.tile_n)
    return math.gcd(64, c.tile_m), math.gcd(32, c.tile_n)


def gemm_calls(task_name: str, dims: dict[str, int]) -> list[Any]:
    """The gemm calls the task's human kernel makes at ``dims``, on meta tensors."""
    task = find_task(task_name)
    assert task.human_file is not None
    human = import_file(task.human_file, f"tma_rows_{task_name}")
    kw: dict[str, Any] = {s.name: torch.empty(s.concrete_shape(dims), dtype=torch_dtype(s.dtype), device="meta")
                          for s in task.inputs}
    kw.update(task.constants)
    seen: list[Any] = []

    def wrap(run: Any) -> Any:
        def noted(call: Any) -> Any:
            seen.append(call)
            return run(call)
        return noted

    with backend.using("shapes", wrap=wrap):
        human.forward(**kw)
    return seen


def row_features(call: Any) -> dict[str, Any]:
    """One call's tile, subtile and the epilogue's requests and bytes per A/B request, loads and extra stores."""
    c = kernel_config(call)
    em, en = epi_tile(c)
    k = int(call.A.shape[1])
    ab = math.ceil(k / 64) * (c.tile_m + c.tile_n)
    loads = [call.C] if call.C is not None else []
    loads += [op.value for op in call.operands.values() if op.kind == "tile"]
    load_widths = [int(t.shape[1]) / call.n for t in loads]
    store_widths = [shape[1] / call.n for shape in call.stored_shapes().values()]
    per_stream = c.tile_m * c.tile_n / en / ab  # requests: one a subtile row, whatever its width
    per_byte_stream = c.tile_m * c.tile_n / 64 / ab  # the same bytes in 128-byte rows
    return {
        "tile": f"{c.tile_m}x{c.tile_n} {'pingpong' if c.pingpong else 'coop'}", "epi": f"{em}x{en}",
        "loads": len(loads), "stores": len(store_widths),
        "req_loads": len(loads) * per_stream, "req_stores": (len(store_widths) - 1) * per_stream,
        "byte_loads": sum(load_widths) * per_byte_stream,
        "byte_stores": (sum(store_widths) - 1) * per_byte_stream,
    }


def measured(paths: Iterable[str]) -> dict[tuple[str, str], list[float]]:
    """(task, shape) -> the faster of QuACK's and the load-ahead kernel over the plain twin, one per record."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in paths:
        with open(path) as f:
            records = [json.loads(line) for line in f]
        for d in records:
            t = d["timings"]
            kernels = [v["median_us"] for k, v in t.items() if k.startswith("as written")]
            if REFERENCE in t and kernels:
                out.setdefault((d["task"], d["shape"]), []).append(min(kernels) / t[REFERENCE]["median_us"])
    return out


def fit(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a x0 + b x1 (no intercept: an epilogue that moves nothing costs nothing); (a, b, rms
    residual)."""
    s00 = sum(x0 * x0 for x0, _ in xs)
    s01 = sum(x0 * x1 for x0, x1 in xs)
    s11 = sum(x1 * x1 for _, x1 in xs)
    s0y = sum(x0 * y for (x0, _), y in zip(xs, ys, strict=True))
    s1y = sum(x1 * y for (_, x1), y in zip(xs, ys, strict=True))
    det = s00 * s11 - s01 * s01
    a, b = (s0y * s11 - s1y * s01) / det, (s1y * s00 - s0y * s01) / det
    rms = math.sqrt(sum((a * x0 + b * x1 - y) ** 2 for (x0, x1), y in zip(xs, ys, strict=True)) / len(ys))
    return a, b, rms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="schedule probe JSONL files (suite_twin.txt runs)")
    args = ap.parse_args()
    rows = []
    for (task, shape), ratios in sorted(measured(args.records).items()):
        dims = next((p.dims for p in find_task(task).shapes["bench"] if p.name == shape), None)
        if dims is None:
            continue
        call = max(gemm_calls(task, dims), key=lambda c: c.m * c.n * int(c.A.shape[1]))
        rows.append((f"{task} @ {shape}", row_features(call), sum(ratios) / len(ratios) - 1))
    ys = [y for *_, y in rows]
    models = {kind: fit([(f[f"{kind}_loads"], f[f"{kind}_stores"]) for _, f, _ in rows], ys)
              for kind in ("req", "byte")}
    for kind, (a, b, rms) in models.items():
        name = "row requests" if kind == "req" else "bytes"
        print(f"{name:13s} extra = {a:.3f} x loads + {b:.3f} x extra stores (per A/B request); rms residual "
              f"{100 * rms:.2f}% over {len(rows)} rows")
    print(f"\n{'row':48s} {'tile':16s} {'subtile':8s} ld st  measured  by requests  by bytes")
    for name, f, y in rows:
        pred = {kind: a * f[f"{kind}_loads"] + b * f[f"{kind}_stores"] for kind, (a, b, _) in models.items()}
        print(f"{name:48s} {f['tile']:16s} {f['epi']:8s} {f['loads']:2d} {f['stores']:2d}  {1 + y:8.3f}  "
              f"{1 + pred['req']:11.3f}  {1 + pred['byte']:8.3f}")


if __name__ == "__main__":
    main()
