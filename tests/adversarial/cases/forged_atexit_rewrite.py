"""Forged verdict written by an ``atexit`` handler, after the harness wrote its real (failing) verdict.

Family: forged verdicts. The candidate returns zeros (no GEMM at all); the worker judges it wrong_output and
writes that verdict, returns from main and exits. But interpreter shutdown then runs ``atexit`` handlers,
and the candidate registered one (through ``torch.sys.modules["atexit"]``) that overwrites the verdict file
with a PASSED one. The exit status stays 0, so the parent trusts the file.
"""

import torch

FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def _overwrite_verdict():
    os = torch.os
    for path in [os.path.join(os.getcwd(), "verdict.json")] + [a for a in torch.sys.argv if "verdict" in a]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FORGED.encode())
        os.close(fd)


_HOOK = torch.sys.modules["atexit"].register(_overwrite_verdict)


def forward(x, w, residual, gamma, eps):
    m, n = residual.shape
    z = torch.zeros(m, n, dtype=residual.dtype, device=x.device)
    return {"h": z, "normed": z.clone(), "rstd": torch.zeros(m, dtype=torch.float32, device=x.device)}
