"""An endless candidate at import time: the module never finishes loading.

Family: busy loops. The loop runs while the harness imports the module, before any stage (and any per-call
time limit a stage might set) is in force.
"""


def _spin():
    n = 0
    while True:
        n += 1


_NEVER = _spin()


def forward(x, w, residual, gamma, eps):
    return {}
