"""State across calls in a module-level tensor, reached through a loop variable.

Family: state across calls. ``exp(0.0)`` at the top level is a torch tensor; freezing the tuple around it
leaves the tensor writable, and the rule on methods of module-level names does not see a loop variable. It
counts calls in place (a step towards replaying an answer after the checked calls).
"""
from coda_agent.primitives import epilogue, exp, gemm

BOX = (exp(0.0),)


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    for n in BOX:
        n.add_(1.0)
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
