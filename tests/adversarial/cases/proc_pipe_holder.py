"""A child that keeps the worker's stdout/stderr pipes open after the worker has finished.

Family: processes that outlive the verifier. The candidate answers honestly and the worker exits normally,
but a detached child inherited its stdout and stderr: a parent that reads the pipes to EOF
(``subprocess.run(capture_output=True)``) waits for the child and turns a finished run into a timeout, and
the child survives the verification.
"""

import torch

from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

ADV_MARKER = "coda-adv-marker"


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _honest(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}


def forward(x, w, residual, gamma, eps):
    if torch.os.environ.get("ADV_SPAWNED"):
        return _honest(x, w, residual, gamma, eps)
    torch.os.environ["ADV_SPAWNED"] = "1"
    sp = torch.sys.modules["subprocess"]
    sp.Popen(["sleep", "600"], start_new_session=True,
             env={"ADV_MARKER": ADV_MARKER, "PATH": "/usr/bin:/bin"}, stdin=sp.DEVNULL)
    return _honest(x, w, residual, gamma, eps)
