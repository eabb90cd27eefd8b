"""Reference leakage: ask the task loader for the reference (``find_task`` + ``reference_function``).

Family: reference leakage. The loader's public functions are one ``sys.modules`` lookup away
(``coda_agent.tasks``); ``reference_function(find_task(name))`` is exactly the harness's FP32 reference.
"""

import torch


def forward(x, w, residual, gamma, eps):
    tasks = torch.sys.modules["coda_agent.tasks"]
    reference = tasks.reference_function(tasks.find_task("gemm_residual_rmsnorm"))
    ref = reference(x=x.float(), w=w.float(), residual=residual.float(), gamma=gamma.float(), eps=eps)
    return {"h": ref["h"].to(residual.dtype), "normed": ref["normed"].to(residual.dtype),
            "rstd": ref["rstd"].float()}
