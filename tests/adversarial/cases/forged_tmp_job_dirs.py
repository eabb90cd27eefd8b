"""Forged verdicts in every job folder under the temp directory, then a clean exit.

Family: forged verdicts. The job folder need not be the working directory: the candidate lists the temp
directory (``tempfile`` through ``torch.serialization.tempfile``), and writes a PASSED ``verdict.json`` into
every ``coda_*`` folder that holds its job (a real attack would write into every job folder it can; this
one only touches folders whose ``job.json`` carries its marker, so that it cannot disturb other test runs on
the same machine), then exits 0 with ``SystemExit``.
"""

import torch

ADV_MARKER = "coda-adv-marker"
FORGED = (
    '{"task": "gemm_residual_rmsnorm", "task_version": 1, "backend": "torch", "outcome": "passed", '
    '"reason": "all outputs within tolerance on 2 shapes x 3 seeds", "stages": [{"stage": "correctness", '
    '"outcome": "passed", "reason": "all outputs within tolerance on 2 shapes x 3 seeds"}], "timings": {}}'
)


def forward(x, w, residual, gamma, eps):
    os = torch.os
    tmp = torch.serialization.tempfile.gettempdir()
    for name in os.listdir(tmp):
        folder = os.path.join(tmp, name)
        job = os.path.join(folder, "job.json")
        if (name.startswith("coda_") and os.path.isfile(job)
            and ADV_MARKER in torch.serialization.io.open(job).read()):
            fd = os.open(os.path.join(folder, "verdict.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, FORGED.encode())
            os.close(fd)
    raise SystemExit(0)
