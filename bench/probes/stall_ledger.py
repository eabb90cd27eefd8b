"""Where each profiled kernel's warps wait, per SASS instruction: the ledger of ``bench/probes/ncu_source.sh``.

Reads ncu's SASS page (``ncu --import R --page source --print-source sass --csv``; one block per kernel) and, with
the details page beside it, prints for each GEMM kernel: its duration and cycles, the share of warp-state samples
per stall reason, the instructions that hold the most samples, and the mainloop's A/B stage count (the constant
its pipeline index wraps at, read off the compare beside the HGMMAs). A CPU tool: the profile comes from the GPU.

    python bench/probes/stall_ledger.py .gpuwork/ncu-source/sass.csv --details .gpuwork/ncu-source/details.csv
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
#: Only the GEMM kernels (QuACK's and the load-ahead kernel's); torch's own kernels in the range are skipped.
GEMM = re.compile(r"^kernel_cutlass_kernel_")
#: The mainloop's stage wrap: ``UISETP.NE.U32.AND UPn, UPT, URm, 0xS, UPT`` next to the HGMMAs.
STAGE_WRAP = re.compile(r"UISETP\.NE\.U32\.AND UP\d, UPT, UR\d+, 0x([0-9a-f]+), UPT")


def kernels(path: Path) -> list[tuple[str, list[dict[str, str]]]]:
    """Each kernel block of the SASS page: its name and one dict per instruction."""
    found: list[tuple[str, list[dict[str, str]]]] = []
    header: list[str] = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                found.append((row[1], []))
            elif row[0] == "Address":
                header = row
            elif found:
                found[-1][1].append(dict(zip(header, row, strict=False)))
    return found


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def durations(path: Path | None) -> list[tuple[str, str]]:
    """(duration µs, elapsed cycles) of each profiled GEMM kernel, in profile order."""
    if path is None:
        return []
    seen: dict[str, dict[str, str]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if GEMM.match(row["Kernel Name"]) and row["Metric Name"] in ("Duration", "Elapsed Cycles"):
                seen.setdefault(row["ID"], {})[row["Metric Name"]] = row["Metric Value"]
    return [(v.get("Duration", "?"), v.get("Elapsed Cycles", "?")) for _, v in sorted(seen.items(), key=lambda kv: int(kv[0]))]


def ab_stages(rows: list[dict[str, str]]) -> str:
    """The mainloop's stage count, as the compares around its HGMMAs wrap it (``?`` where none is found)."""
    hgmma = [i for i, r in enumerate(rows) if "HGMMA" in r["Source"]]
    if not hgmma:
        return "?"
    wraps = {int(m.group(1), 16) for r in rows[hgmma[0] - 40:hgmma[-1] + 10]
             if (m := STAGE_WRAP.search(r["Source"])) and int(m.group(1), 16) > 1}
    return "/".join(map(str, sorted(wraps))) or "?"


def ledger(name: str, rows: list[dict[str, str]], top: int) -> list[str]:
    total = sum(number(r[SAMPLES]) for r in rows) or 1.0
    reasons = [h for h in rows[0] if h.startswith("stall_") and not h.endswith("(Not Issued)")] if rows else []
    by_reason = Counter({h[6:]: sum(number(r[h]) for r in rows) for h in reasons})
    lines = [f"  A/B stages {ab_stages(rows)}; {int(total)} samples; stalls: "
             + ", ".join(f"{k} {v / total:.1%}" for k, v in by_reason.most_common(6))]
    heaviest = sorted(range(len(rows)), key=lambda i: -number(rows[i][SAMPLES]))[:top]
    for i in sorted(heaviest):
        r = rows[i]
        reason = max(reasons, key=lambda h: number(r[h]))[6:] if reasons else "?"
        lines.append(f"  {i:5d} {number(r[SAMPLES]) / total:6.1%} {reason:16s} executed {r['Instructions Executed']:>9s}"
                     f"  {r['Source'].strip()[:100]}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sass", type=Path, help="ncu's SASS page as CSV")
    p.add_argument("--details", type=Path, help="ncu's details page as CSV (durations)")
    p.add_argument("--top", type=int, default=12, help="instructions to show per kernel")
    p.add_argument("--span", action="append", default=[], metavar="K:NAME=A-B[+C-D...]",
                   help="the samples of GEMM kernel K (0 first) in SASS rows A to B inclusive (rows as the ledger "
                        "numbers them), summed under NAME: say, the math warps' mainloop, epilogue and wait for "
                        "their next tile (repeatable)")
    args = p.parse_args()
    times = iter(durations(args.details))
    for name, rows in kernels(args.sass):
        if not GEMM.match(name):
            continue
        duration, cycles = next(times, ("?", "?"))
        print(f"== {name[len('kernel_cutlass_kernel_'):][:100]}\n  {duration} us, {cycles} cycles")
        print("\n".join(ledger(name, rows, args.top)))
    gemms = [rows for name, rows in kernels(args.sass) if GEMM.match(name)]
    for spec in args.span:
        k, _, rest = spec.partition(":")
        label, _, ranges = rest.partition("=")
        rows = gemms[int(k)]
        total = sum(number(r[SAMPLES]) for r in rows) or 1.0
        picked = sum(number(rows[i][SAMPLES]) for part in ranges.split("+")
                     for i in range(int(part.split("-")[0]), int(part.split("-")[1]) + 1))
        print(f"span {k} {label}: {int(picked)} samples, {picked / total:.1%} of the kernel's")


if __name__ == "__main__":
    main()
