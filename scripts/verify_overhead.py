"""Benchmark: how long ``verify()`` takes for the human kernels (the verifier's own overhead), with provenance.

    python scripts/verify_overhead.py [--stages correctness] [--shape-set small] [--repeat 3] [--out FILE.md]

Runs each human kernel's verification ``--repeat`` times in this process and prints per task the median
wall time (sandbox start, candidate import, the stage's work) as a markdown table headed by the device,
packages, date, commit and command. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from coda_agent.provenance import git_commit, package_versions
from coda_agent.tasks.loader import load_tasks
from coda_agent.verifier import Plan, verify


def _runners_bytecode(where: str) -> None:
    """Give every runner of this process the bytecode ``where`` says (coda_agent/verifier/bytecode.py)."""
    import tempfile

    from coda_agent.verifier import bytecode, client

    folder = None
    if where == "none":
        folder = Path(tempfile.mkdtemp(prefix="no_bytecode_"))
        folder.chmod(0o755)
    elif where == "checker":
        folder = bytecode.cache_root() / "python"
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not (folder / bytecode._filled_marker()).exists() and not bytecode.fill(folder):
            raise SystemExit(f"could not fill {folder}")
    client.runner_prefix = lambda: folder  # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Plan()
    ap.add_argument("--stages", default=",".join(default.stages))
    ap.add_argument("--shape-set", default=default.shape_set)
    ap.add_argument("--backend", default=default.backend)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--shapes", nargs="*", default=None, help="only these shape points of the set")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runner-bytecode", choices=("auto", "installed", "none", "checker"), default="auto",
                    help="where runners find bytecode: as verify() decides, beside the sources, nowhere (an "
                         "installation without any), or the checker's filled folder")
    args = ap.parse_args()
    if args.runner_bytecode != "auto":
        _runners_bytecode(args.runner_bytecode)
    try:
        from coda_agent.verifier import detect_sandbox

        sandbox = detect_sandbox().describe()
    except ImportError:  # a checkout from before the sandbox
        sandbox = "worker subprocess (before the sandbox)"
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()})"
    except Exception:
        device = "unknown"
    lines = [
        f"# verify() overhead: {args.stages} on {args.shape_set} shapes",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: {device}; cores: {len(__import__('os').sched_getaffinity(0))}",
        f"- commit: {git_commit()}; packages: {', '.join(f'{k} {v}' for k, v in package_versions().items())}",
        f"- isolation: {sandbox}",
        f"- command: `{shlex.join(['python', *sys.argv])}`",
        "",
        "| task | outcome | median s | min s | max s |",
        "| --- | --- | --- | --- | --- |",
    ]
    medians = []
    plan = Plan(stages=args.stages.split(","), backend=args.backend, shape_set=args.shape_set, shape_names=args.shapes)
    for task in load_tasks():
        if (args.tasks and task.name not in args.tasks) or task.human_file is None:
            continue
        source, times, outcome = task.human_file.read_text(), [], ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            v = verify(task, source, plan)
            times.append(time.perf_counter() - t0)
            outcome = v.outcome.value
        medians.append(statistics.median(times))
        lines.append(f"| {task.name} | {outcome} | {medians[-1]:.2f} | {min(times):.2f} | {max(times):.2f} |")
        print(lines[-1], flush=True)
    lines += ["", f"Median over tasks: {statistics.median(medians):.2f} s." if medians else "No tasks.", ""]
    text = "\n".join(lines)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
