"""Forged verdict, then the worker process replaces itself with ``/bin/true`` (``os.execv``).

Family: forged verdicts. ``SystemExit`` might one day be caught by the harness; ``execv`` cannot be: the
Python process is gone and ``/bin/true`` exits 0 in its place, so nothing after the candidate's call runs,
no stage result is written, and the parent reads the forged file with a clean exit status.
"""

import torch

FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def forward(x, w, residual, gamma, eps):
    os = torch.serialization.os
    for path in [os.path.join(os.getcwd(), "verdict.json")] + [a for a in torch.sys.argv if "verdict" in a]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FORGED.encode())
        os.close(fd)
    os.execv("/bin/true", ["true"])
