"""A SIGTERM handler that forges a PASSED verdict and exits 0 when the harness stops a slow candidate.

Family: forged verdicts (signal handlers) and endless candidates. forward() never returns. A harness that
stops an overrunning worker politely (SIGTERM, then waits) runs the candidate's handler (installed with
``torch.sys.modules["signal"]``), which writes a PASSED verdict and exits 0; SIGINT and SIGHUP get the same
handler. The verification must still end as a timeout within its time limit.
"""

import torch

FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def _on_term(signum, frame):
    os = torch.os
    for path in [os.path.join(os.getcwd(), "verdict.json")] + [a for a in torch.sys.argv if "verdict" in a]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FORGED.encode())
        os.close(fd)
    torch.sys.exit(0)


def _install():
    signal = torch.sys.modules["signal"]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_term)


_INSTALLED = _install()


def forward(x, w, residual, gamma, eps):
    n = 0
    while True:
        n += 1
