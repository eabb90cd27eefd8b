"""Forged verdict written by a background thread once the harness's main thread has finished.

Family: forged verdicts. A thread started at import (``torch.serialization.threading``) waits until the
main thread is done (the worker has written its final, failing verdict and is shutting down; Python joins
non-daemon threads at exit), then overwrites the verdict file with a PASSED one and ends, so the process
still exits 0. The candidate itself returns garbage (``torch.empty``) and skips all work.
"""

import torch

FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def _after_main():
    threading = torch.serialization.threading
    main = threading.main_thread()
    pause = threading.Event()
    while main.is_alive():
        pause.wait(0.005)
    os = torch.os
    for path in [os.path.join(os.getcwd(), "verdict.json")] + [a for a in torch.sys.argv if "verdict" in a]:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FORGED.encode())
        os.close(fd)


_WATCHER = torch.serialization.threading.Thread(target=_after_main)
_STARTED = _WATCHER.start()


def forward(x, w, residual, gamma, eps):
    m, n = residual.shape
    return {
        "h": torch.empty(m, n, dtype=residual.dtype, device=x.device),
        "normed": torch.empty(m, n, dtype=residual.dtype, device=x.device),
        "rstd": torch.empty(m, dtype=torch.float32, device=x.device),
    }
