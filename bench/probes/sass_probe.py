"""What the sm_90a compile of a human kernel looks like, on a CPU: register budgets, spills, instruction mix.

For each config the task's human kernel runs with at its bench shapes (found as the verifier finds them: forward()
on meta tensors through the ``shapes`` backend, each gemm call's effective config read off it), or for the one
``--config`` names, it compiles the kernel at the task's first small shape under that config through the
``quack-compile`` backend (the CuTe DSL builds sm_90a without a GPU; a kernel does not depend on the shape's
sizes) with the DSL keeping the SASS (``CUTE_DSL_KEEP=sass``), then reads the disassembly: the register budgets its
warp groups set (``USETMAXREG``), the local-memory stores and loads (``STL``/``LDL``: spills), and how many
instructions of a few kinds it holds. A probe for the "why" of a slow epilogue that needs no device time; the GPU
says how fast.

    python bench/probes/sass_probe.py gemm_rmsnorm_bwd                      # the configs of its bench shapes
    python bench/probes/sass_probe.py gemm_rmsnorm_bwd --config '{"tile_n": 128}' --keep /tmp/sass
    python bench/probes/sass_probe.py gemm_swiglu_bwd --kernel variant.py --config '{"tile_n": 192}'  # a variant

``--kernel`` compiles another file with the task's forward() in place of the human kernel (an epilogue written
another way, to set its SASS beside the human kernel's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from coda_agent.primitives import backend
from coda_agent.primitives._call import GemmCall
from coda_agent.primitives.backend import Runner
from coda_agent.primitives.configs import chosen_config, config_fields, config_from_fields, config_label
from coda_agent.tasks.loader import find_task, import_file
from coda_agent.tasks.model import torch_dtype

#: Instruction kinds counted (an opcode's first dotted part).
KINDS = {"HGMMA": "tensor-core MMA", "MUFU": "special function (exp, rcp, ...)", "UTMALDG": "TMA load",
         "UTMASTG": "TMA store", "STL": "local store (spill)", "LDL": "local load (spill)", "BAR": "barrier",
         "SYNCS": "mbarrier op"}
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
MAXREG = re.compile(r"USETMAXREG\.(\w+)(?:\.\w+)*\s+(?:\w+,\s*)?(0x[0-9a-f]+)")


def bench_configs(task_name: str, kernel: Path) -> dict[str, list[str]]:
    """Config (JSON fields; "null": QuACK's default) -> the bench shapes whose gemm calls run with it."""
    task = find_task(task_name)
    human = import_file(kernel, "sass_probe_shapes")
    found: dict[str, list[str]] = {}
    for point in task.shapes["bench"]:
        inputs = {s.name: torch.empty(s.concrete_shape(point.dims), dtype=torch_dtype(s.dtype), device="meta")
                  for s in task.inputs}

        def seen(run: Runner, shape: str = point.name) -> Runner:
            def observe(call: GemmCall) -> dict[str, torch.Tensor]:
                config = chosen_config(call)
                shapes = found.setdefault(json.dumps(None if config is None else config_fields(config)), [])
                if shape not in shapes:
                    shapes.append(shape)
                return run(call)

            return observe

        with torch.no_grad(), backend.using("shapes", wrap=seen):
            human.forward(**inputs, **task.constants)
    return found


def compile_kernel(task_name: str, kernel: Path, config: str, dump: Path) -> None:
    """Build ``kernel`` (a file with the task's forward()) for sm_90a in a child process with the DSL's dump
    settings (read at import), every gemm call under ``config`` (JSON fields of a Config; "null": QuACK's default)."""
    code = (
        "import dataclasses, json, torch\n"
        "from coda_agent.primitives import backend\n"
        "from coda_agent.primitives.configs import config_from_fields\n"
        "from coda_agent.tasks.loader import find_task, import_file\n"
        f"task = find_task({task_name!r})\n"
        f"human = import_file({str(kernel.resolve())!r}, 'sass_probe_human')\n"
        "inputs = {**task.make_inputs(dict(task.shapes['small'][0].dims), seed=0, device='cpu'), **task.constants}\n"
        f"fields = json.loads({config!r})\n"
        "config = None if fields is None else config_from_fields(fields)\n"
        "forced = lambda run: lambda call: run(dataclasses.replace(call, config=config))\n"
        "with torch.no_grad(), backend.using('quack-compile', wrap=forced):\n"
        "    human.forward(**inputs)\n"
    )
    env = {**os.environ, "CUTE_DSL_KEEP": "sass", "CUTE_DSL_DUMP_DIR": str(dump), "QUACK_CACHE_DIR": str(dump / "cache"),
           "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=dump, stderr=subprocess.DEVNULL)


def summary(sass: Path) -> str:
    text = sass.read_text(errors="replace")
    opcodes = Counter(m.group(1).split(".")[0] for m in OPCODE.finditer(text))
    budgets = ", ".join(f"{kind.lower()} {int(regs, 16)}" for kind, regs in MAXREG.findall(text)) or "none set"
    counts = "; ".join(f"{opcodes.get(op, 0)} {name}" for op, name in KINDS.items())
    return f"  {sass.name[:96]}\n    {sum(opcodes.values())} instructions; register budgets: {budgets}\n    {counts}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", help="a task with a human kernel")
    p.add_argument("--config", help='only this config, as JSON fields: \'{"tile_n": 128}\' (default: its bench shapes\')')
    p.add_argument("--keep", type=Path, help="dump here and keep the SASS (default: a temporary folder)")
    p.add_argument("--kernel", type=Path, help="a file with the task's forward() to build instead of its human kernel")
    args = p.parse_args()
    kernel = args.kernel or find_task(args.task).human_file
    assert kernel is not None, f"{args.task} has no human kernel: name one with --kernel"
    configs = {args.config: ["--config"]} if args.config else bench_configs(args.task, kernel)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (config, shapes) in enumerate(configs.items()):
            dump = (args.keep or Path(tmp)) / f"config{i}"
            dump.mkdir(parents=True, exist_ok=True)
            compile_kernel(args.task, kernel, config, dump)
            fields = json.loads(config)
            label = "default" if fields is None else config_label(config_from_fields(fields))
            print(f"{args.task}{'' if args.kernel is None else f' ({args.kernel})'} at {label} ({', '.join(shapes)}):")
            for sass in sorted(dump.glob("*.sass")):
                print(summary(sass))


if __name__ == "__main__":
    main()
