"""Forbidden compute: a clean epilogue helper, then its name rebound to another function.

Family: forbidden compute that passes the CPU stages. A module-level epilogue helper checked under the
epilogue rules (epilogue_helpers reads FunctionDefs by name), then rebound at top level (`helper =
host_version`, a Name is a 'constant'): the epilogue runs the unchecked one.
"""
import torch

from coda_agent.primitives import epilogue, gemm


def helper(v):           # what the static check holds to the epilogue rules
    return v * 0.0


def host_version(v):     # what actually runs inside the epilogue
    if isinstance(v, torch.Tensor):
        return v * 0.0
    return v * 0.0 + 1000.0


helper = host_version  # noqa: F811 (the rebinding is the attack)


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c + helper(acc)}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
