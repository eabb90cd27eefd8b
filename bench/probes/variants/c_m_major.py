"""The task's human kernel as written, with its C operand M-major: the same values in a column-major copy, made
once per input tensor outside the timed calls (a probe's shortcut; a candidate may not keep results across calls).

Why (issue 44): QuACK's epilogue moves C one subtile at a time, in TMA boxes 32 or 16 columns wide, so rows of 64
or 32 bytes, where a k-block of A or B moves rows of 128. Is a C row's cost over its plain twin its bytes or its TMA
row requests? Fitted over the 65 suite rows on an H100 (``bench/probes/tma_rows.py``), neither model separates from
the other (rms residual 1.6% by bytes, 2.0% by requests). A column-major C moves the same bytes in 128-byte rows:
half the requests at 32-column subtiles, a quarter at 16. If the loss is the requests, this variant recovers about
half of gemm_residual's and more at the 128x208 tiles; if it is the bytes, nothing. Measured on an H100 at a6b3de1
(bench/results/h100-2026-12-07-g-notes.md): nothing at 128x32 subtiles, 8-23% of the gap at 16-column ones.
The outputs must equal the kernel's as written bit for bit (the probe prints whether they do)."""

from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file

#: The C argument of each task whose human kernel reads one.
C_ARGUMENT = {"gemm_residual": "residual", "gemm_residual_rmsnorm": "residual", "gemm_rmsnorm_bwd": "dres"}
_HUMANS: dict = {}
_COPIES: dict = {}


def _task(kw):
    if "dres" in kw:
        return "gemm_rmsnorm_bwd"
    return "gemm_residual_rmsnorm" if "gamma" in kw else "gemm_residual"


def _m_major(t):
    key = (t.data_ptr(), tuple(t.shape), t._version)
    if key not in _COPIES:
        _COPIES[key] = t.t().contiguous().t()
    return _COPIES[key]


def forward(**kw):
    name = _task(kw)
    if name not in _HUMANS:
        _HUMANS[name] = import_file(find_task(name).human_file, f"c_m_major_{name}")
    arg = C_ARGUMENT[name]
    return _HUMANS[name].forward(**{**kw, arg: _m_major(kw[arg])})
