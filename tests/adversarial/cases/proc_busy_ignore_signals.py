"""An endless candidate that ignores SIGTERM, SIGINT, SIGHUP, SIGALRM and SIGXCPU before spinning.

Family: busy loops. A harness that stops an overrunning worker with a catchable signal (or relies on a CPU
rlimit's SIGXCPU) never stops this one; it must still end as a timeout within the time limit.
"""

import torch


def _ignore_everything():
    signal = torch.sys.modules["signal"]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGXCPU, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


_IGNORED = _ignore_everything()


def forward(x, w, residual, gamma, eps):
    n = 0
    while True:
        n += 1
