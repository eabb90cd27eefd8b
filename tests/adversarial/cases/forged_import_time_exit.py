"""Forged verdict at import time: the verdict is written and the worker exits before any stage runs.

Family: forged verdicts. Module-level code runs when the harness imports the candidate, before the first
stage has even started (so before the worker has written anything itself). The candidate writes a PASSED
verdict everywhere a verdict could be read from (the working directory and every ``.json`` path on the
command line) and exits 0 through ``torch.sys.exit``. A parent that trusts "exit 0 + a verdict file" reports
a pass for a module that has no working forward at all.
"""

import torch

FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def _forge_and_leave():
    os = torch.os
    targets = [os.path.join(os.getcwd(), "verdict.json")] + [a for a in torch.sys.argv if "verdict" in a]
    for path in targets:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FORGED.encode())
        os.close(fd)
    torch.sys.exit(0)


_LEFT = _forge_and_leave()


def forward(x, w, residual, gamma, eps):
    return {}
