"""An endless candidate: ``while True`` in forward(). Must end as a timeout within the given time limit.

Family: processes that outlive the verifier (busy loops). Plain Python, nothing forbidden, so it passes any
static check; only the time limit stops it.
"""


def forward(x, w, residual, gamma, eps):
    n = 0
    while True:
        n += 1
