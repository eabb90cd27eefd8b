"""Reference leakage: import the task's reference file with ``importlib`` and call it.

Family: reference leakage. The reference file sits next to the task YAML; the candidate finds the folder
through ``coda_agent.tasks.loader.BUILTIN_TASK_DIR`` (falling back to the repository on ``PYTHONPATH``),
loads it with ``importlib.util.spec_from_file_location`` (``torch.sys.modules["importlib.util"]``) and calls
``reference`` in FP32.
"""

import torch


def forward(x, w, residual, gamma, eps):
    os = torch.os
    util = torch.sys.modules["importlib.util"]
    loader = torch.sys.modules.get("coda_agent.tasks.loader")
    folders = [str(loader.BUILTIN_TASK_DIR)] if loader is not None else []
    folders += [os.path.join(p, "tasks") for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for folder in folders:
        path = os.path.join(folder, "gemm_residual_rmsnorm.py")
        if os.path.exists(path):
            spec = util.spec_from_file_location("adv_stolen_reference", path)
            module = util.module_from_spec(spec)
            spec.loader.exec_module(module)
            ref = module.reference(x.float(), w.float(), residual.float(), gamma.float(), eps=eps)
            return {"h": ref["h"].to(residual.dtype), "normed": ref["normed"].to(residual.dtype),
                    "rstd": ref["rstd"].float()}
    raise RuntimeError("reference file not found")
