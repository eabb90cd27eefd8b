"""The task kernels in a PyTorch model: custom ops, autograd Functions and drop-in Llama-3 modules.

    from coda_agent.torch import CodaLlamaLayer, CodaLMHead, CodaLlamaStack, Kernels

    kernels = Kernels()     # the human kernels (and QuACK's scaled-exp LM head);
                            # Kernels({"gemm_rmsnorm_bwd": "best.py"}) swaps one
    stack = CodaLlamaStack([CodaLlamaLayer(2048, 8192, 32, 8, kernels=kernels) for _ in range(16)],
                           CodaLMHead(2048, 128256, kernels=kernels))
    loss = stack(embedding(tokens), targets)  # targets may hold -100 (ignored)
    loss.backward()

Trusted code only: the kernels are imported and run in this process, outside the verifier's sandbox. Use
the human kernels or a ``best.py`` you chose to trust. The primitives' backend follows the tensors' device
(emulator on CPU, QuACK on a GPU); :mod:`.check` holds a stack's gradients to FP32 autograd by the suite's
tolerance rule. Named ``torch`` for ``coda_agent.torch``; inside it ``import torch`` is
the real torch (absolute imports), so the name costs nothing but a careful ``import coda_agent.torch as ...``.
"""

from .layer import CodaLlamaLayer, CodaLlamaStack, CodaLMHead, Stream, begin, rope_table
from .ops import CHAIN_TASKS, Kernels, TaskOp, backend_for, task_op
from .reference import ReferenceLlamaStack

__all__ = [
    "CHAIN_TASKS",
    "CodaLMHead",
    "CodaLlamaLayer",
    "CodaLlamaStack",
    "Kernels",
    "ReferenceLlamaStack",
    "Stream",
    "TaskOp",
    "backend_for",
    "begin",
    "rope_table",
    "task_op",
]
