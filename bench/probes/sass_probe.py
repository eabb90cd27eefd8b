"""What the sm_90a compile of a human kernel looks like, on a CPU: register budgets, spills, instruction mix.

Compiles the task's human kernel through the ``quack-compile`` backend at one shape (the CuTe DSL builds sm_90a
without a GPU) with the DSL keeping the SASS (``CUTE_DSL_KEEP=sass``), then reads each kernel's disassembly: the
register budgets its warp groups set (``USETMAXREG``), the local-memory stores and loads (``STL``/``LDL``: spills),
and how many instructions of a few kinds it holds (tensor-core MMAs, special-function ops, TMA copies). A probe for
the "why" of a slow epilogue that needs no device time; the GPU says how fast.

    python bench/probes/sass_probe.py gemm_swiglu_bwd
    python bench/probes/sass_probe.py gemm_rmsnorm_bwd --config '{"tile_n": 128}' --keep /tmp/sass
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: Instruction kinds counted (an opcode's first dotted part).
KINDS = {"HGMMA": "tensor-core MMA", "MUFU": "special function (exp, rcp, ...)", "UTMALDG": "TMA load",
         "UTMASTG": "TMA store", "STL": "local store (spill)", "LDL": "local load (spill)", "BAR": "barrier",
         "SYNCS": "mbarrier op"}
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
MAXREG = re.compile(r"USETMAXREG\.(\w+)(?:\.\w+)*\s+(?:\w+,\s*)?(0x[0-9a-f]+)")


def compile_human(task_name: str, shape: str | None, config: str | None, dump: Path) -> None:
    """Build the human kernel for sm_90a in a child process with the DSL's dump settings (read at import); every
    gemm call under ``config`` (JSON fields of a Config) where given."""
    code = (
        "import dataclasses, json, torch\n"
        "from coda_agent.primitives import backend\n"
        "from coda_agent.primitives.configs import config_from_fields\n"
        "from coda_agent.tasks.loader import find_task, import_file\n"
        f"task = find_task({task_name!r})\n"
        "human = import_file(task.human_file, 'sass_probe_human')\n"
        f"points = [p for p in task.shapes['small'] if {shape!r} in (None, p.name)]\n"
        "inputs = {**task.make_inputs(dict(points[0].dims), seed=0, device='cpu'), **task.constants}\n"
        f"config = None if {config!r} is None else config_from_fields(json.loads({config!r}))\n"
        "def forced(run):\n"
        "    return run if config is None else (lambda call: run(dataclasses.replace(call, config=config)))\n"
        "with torch.no_grad(), backend.using('quack-compile', wrap=forced):\n"
        "    human.forward(**inputs)\n"
    )
    env = {**os.environ, "CUTE_DSL_KEEP": "sass", "CUTE_DSL_DUMP_DIR": str(dump), "QUACK_CACHE_DIR": str(dump / "cache"),
           "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=dump)


def summary(sass: Path) -> str:
    text = sass.read_text(errors="replace")
    opcodes = Counter(m.group(1).split(".")[0] for m in OPCODE.finditer(text))
    budgets = ", ".join(f"{kind.lower()} {int(regs, 16)}" for kind, regs in MAXREG.findall(text)) or "none set"
    counts = "; ".join(f"{opcodes.get(op, 0)} {name}" for op, name in KINDS.items())
    return f"{sass.name[:100]}\n  {sum(opcodes.values())} instructions; register budgets: {budgets}\n  {counts}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", help="a task with a human kernel")
    p.add_argument("--shape", help="a shape of the task's small set (default: its first)")
    p.add_argument("--config", help='every gemm call under this config, as JSON fields: \'{"tile_n": 128}\'')
    p.add_argument("--keep", type=Path, help="dump here and keep the SASS (default: a temporary folder)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dump = args.keep or Path(tmp)
        dump.mkdir(parents=True, exist_ok=True)
        compile_human(args.task, args.shape, args.config, dump)
        for sass in sorted(dump.glob("*.sass")):
            print(summary(sass))


if __name__ == "__main__":
    main()
