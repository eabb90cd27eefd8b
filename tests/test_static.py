"""The static check refuses everything outside the candidate contract, and nothing inside it."""

from __future__ import annotations

import pytest

from coda_agent.verifier.static import check_source

from .conftest import TASK_DIR

OK_HEADER = "import math\nimport torch\nfrom coda_agent.primitives import epilogue, gemm\n"


def test_every_human_kernel_passes():
    for path in sorted((TASK_DIR / "human").glob("*.py")):
        assert check_source(path.read_text()) == [], path.name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("import os\n", "import of 'os' is not allowed"),
        ("import numpy as np\n", "import of 'numpy' is not allowed"),
        ("from coda_agent.primitives import backend\n", "'backend' is not part of coda_agent.primitives"),
        ("from coda_agent.primitives._quack import run\n",
         "import from 'coda_agent.primitives._quack' is not allowed"),
        ("from coda_agent.primitives import *\n", "star imports"),
        ("def forward(x, w):\n    return {'y': x @ w.t()}\n", "the @ operator"),
        ("def forward(x, w):\n    return {'y': torch.matmul(x, w)}\n", "torch.matmul is not allowed"),
        ("def forward(x, w):\n    return {'y': x.mm(w)}\n", ".mm() is not allowed"),
        ("def forward(x, w):\n    return {'y': torch.linalg.multi_dot([x, w])}\n",
         "torch.linalg is not allowed"),
        ("def forward(x):\n    s = torch.cuda.Stream()\n    return {}\n", "torch.cuda is not allowed"),
        ("def forward(x):\n    return {'y': eval('x')}\n", "eval() is not allowed"),
        ("def forward(x):\n    return {'y': open('f').read()}\n", "open() is not allowed"),
        ("def forward(x):\n    return {'y': x.__class__}\n", "private attribute '__class__'"),
        ("class T(torch.Tensor):\n    pass\n", "class definitions"),
        ("CACHE = {}\ndef forward(x):\n    global CACHE\n    return {}\n", "global statements"),
        ("def forward(x):\n    try:\n        pass\n    except Exception:\n        pass\n    return {}\n",
         "try/except"),
        ("t = torch\ndef forward(x):\n    return {'y': t.einsum('ij,jk', x, x)}\n",
         "torch may only be used as torch.<name>"),
        ("import torch.nn.functional as F\n", "import of 'torch.nn.functional' is not allowed"),
        ("def forward(x):\n    return {'y': torch.nn.functional.linear(x, x)}\n", "torch.nn is not allowed"),
        ("for i in range(3):\n    pass\n", "top-level For statements"),
        ("def f(x):\n    return x\n", "must define a top-level function forward"),
        ("def forward(x:\n", "syntax error"),
        # names resolve as Python scopes them: a parameter named exec elsewhere leaves exec a builtin here
        ("def helper(exec):\n    return exec\ndef forward(x):\n    exec('y = 1')\n    return {}\n",
         "exec() is not allowed"),
        ("def forward(x):\n    [getattr for getattr in ()]\n    return {'y': getattr(x, 'T')}\n",
         "getattr() is not allowed"),
        ("def forward(x):\n    return {'y': [vars for vars in vars(x)]}\n", "vars() is not allowed"),
        ("def forward(x, w):\n    y = x\n    y @= w\n    return {'y': y}\n", "the @= operator"),
        ("from __future__ import braces\n", "only annotations may be imported"),
        # host code may not tell where it runs: forward() on meta tensors must do what it does on the GPU
        ("def forward(x):\n    return {'y': x if x.device.type == 'meta' else x}\n",
         "x.device may only place a new tensor"),
        ("def forward(x):\n    return {'y': x if 'meta' in f'{x}' else x}\n", "f-strings with values"),
        ("def forward(x):\n    return {'y': x if 'meta' in '%s' % x else x}\n", "%-formatting"),
        ("def forward(x):\n    return {'y': x if x.is_cuda else x}\n", "reading the attribute .is_cuda"),
        ("def forward(x):\n    return {'y': x if 'meta' in str(x) else x}\n", "str() is not allowed"),
        # an epilogue fn's body: value functions and math only
        ("@epilogue()\ndef e(acc):\n    return {'D': acc if isinstance(acc, torch.Tensor) else acc}\n",
         "isinstance() cannot be called inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc * acc.shape[0]}\n",
         "acc.shape cannot be read inside an epilogue fn"),
        # a module-level helper an epilogue calls keeps the same rules (it runs on the GPU's values too)
        ("def h(v):\n    return v * v.shape[0]\n@epilogue()\ndef e(acc):\n    return {'D': h(acc)}\n",
         "v.shape cannot be read inside an epilogue fn"),
        ("def g(v):\n    return isinstance(v, float)\ndef h(v):\n    return g(v)\n@epilogue()\ndef e(acc):\n"
         "    return {'D': h(acc)}\n",
         "isinstance() cannot be called inside an epilogue fn"),
        ("def forward(x):\n    return {'y': x if dict(device=x.device)['device'] == x.device else x}\n",
         "x.device may only place a new tensor"),
        ("def forward(x):\n    d = {}\n    d.update(device=x.device)\n    return {}\n",
         "x.device may only place a new tensor"),
        # a third pass: walrus scoping, code in annotations and decorator arguments, epilogues made by hand
        ("def forward(x):\n    y = [(exec := 1) for _ in range(2)]\n    return {}\n",
         "assignment expressions (:=)"),
        ("def note(a: [0 for v in (1,)]) -> None:\n    return None\ndef forward(x):\n    return {}\n",
         "must only name types"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc}\ndef forward(x):\n    f = epilogue()(e)\n"
         "    return {}\n",
         "epilogue may only be used as the decorator"),
        ("from coda_agent.primitives import Epilogue\n"
         "E = Epilogue(fn=None, outputs=(), pins={}, sinks={}, mode='element', params=())\n",
         "Epilogue objects are made with the decorator"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc % 1.0}\n",
         "the operator % is not allowed inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc ** 2}\n",
         "the operator ** is not allowed inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    return {'D': (acc > 0) * acc}\n",
         "comparisons are not allowed inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    if acc:\n        acc = -acc\n    return {'D': acc}\n",
         "if statements are not allowed inside an epilogue fn"),
        # a fourth pass: rebinding what an epilogue trusts by name, augmented operators, loops and indexing on
        # values
        ("from coda_agent.primitives import relu\ndef host_relu(v):\n    return v\nrelu = host_relu\n",
         "'relu' names an import or one of the module's functions: it may not be rebound"),
        ("def helper(v):\n    return v\ndef other(v):\n    return v\nhelper = other\n",
         "'helper' names an import or one of the module's functions"),
        ("def helper(v):\n    return v\ndef helper(v):\n    return v\n",
         "'helper' is defined or imported twice"),
        ("from coda_agent.primitives import sqrt\nfrom math import sqrt\n",
         "'sqrt' is defined or imported twice"),
        ("from coda_agent.primitives import sqrt\nfrom coda_agent.primitives import sqrt\n",
         "'sqrt' is defined or imported twice"),
        ("@epilogue()\ndef e(acc):\n    b = acc\n    b %= 1.0\n    return {'D': b}\n",
         "the operator %= is not allowed inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc[:, 0]}\n", "only a constant index"),
        ("@epilogue()\ndef e(acc):\n    for r in acc:\n        acc = r\n    return {'D': acc}\n",
         "for loops are not allowed inside an epilogue fn"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc * math.prod(acc)}\n",
         "math.prod() cannot be called inside an epilogue fn"),
        ("def forward(x):\n    dev = x.device\n    y = torch.zeros(3, device=dev)\n"
         "    return {'y': y if dev == y.device else y}\n", "x.device may only place a new tensor"),
        # a fifth pass: a parameter named like a module passed for the module
        ("def attr(math):\n    return math.numpy()\ndef forward(x):\n    return {'y': attr(x)}\n",
         "'math' names an import or one of the module's functions"),
        ("def forward(x):\n    for torch in (x,):\n        y = torch.numpy()\n    return {}\n",
         "'torch' names an import or one of the module's functions"),
        ("import math as m\nimport torch as m\n", "'m' is defined or imported twice"),
        ("exec: int\ndef forward(x):\n    exec('y = 1')\n    return {}\n", "exec() is not allowed"),
        ("def forward(x) -> exec('1'):\n    return {}\n", "exec() is not allowed"),
        ("@epilogue()\ndef e(acc):\n    return {'D': acc.clamp(0)}\n",
         "acc.clamp() cannot be called inside an epilogue fn"),
        # a seventh pass: meta, CPU and GPU tensors told apart without .device
        ("def forward(x):\n    if x.to('meta') is x:\n        return {}\n    return {}\n",
         "a device may not be named"),
        ("def forward(x):\n    return {'y': x.to(device='cpu') + 1}\n", "a device may not be named"),
        ("def forward(x):\n    return {'y': torch.zeros(2, device='cuda')}\n", "a device may not be named"),
        ("def forward(x):\n    d = 'me' + 'ta'\n    return {'y': x.to(d)}\n", "a device may not be named"),
        ("def forward(x, d='cpu'):\n    return {'y': x.new_zeros(2, device=d)}\n",
         "a device may not be named"),
        ("def forward(x):\n    return {'y': x.to(*['meta'])}\n", "a device may not be named"),
        # an eighth pass: a string through a helper's return, and ** arguments
        ("def where():\n    return 'meta'\ndef forward(x):\n    d = where()\n    return {'y': x.to(d)}\n",
         "a device may not be named"),
        ("def forward(x):\n    return {'y': x.to(**{'device': 'meta'})}\n", "a device may not be named"),
        ("def forward(x):\n    return {'y': x.to(torch.zeros(1).device)}\n", "torch.zeros() must say where"),
        # a ninth pass: torch.Tensor(...) made a CPU tensor with no device=, and .T passed for a device
        ("def forward(x):\n    h = torch.Tensor(2)\n    return {'y': x.to(h.device)}\n",
         "torch.Tensor names a type"),
        ("def forward(x):\n    return {'y': x.to(x.T)}\n", "a device may not be named"),
        ("def forward(x, w):\n    return {'y': x if x.t() is not w else w}\n",
         "is / is not may only compare with None"),
        # a tenth pass: a top-level constant made by a value function is a mutable object (state across calls)
        ("from coda_agent.primitives import pack\nSEEN = pack([], [])\n",
         "top-level assignments must be constants"),
        ("from coda_agent.primitives import exp\nBOX = (exp(0.0),)\n",
         "top-level assignments must be constants"),
        ("BOX = P.exp(0.0)\n", "top-level assignments must be constants"),
    ],
)
def test_violations_are_reported_with_line_and_reason(body, message):
    source = (OK_HEADER + body
              + ("" if "def forward" in body or "syntax" in message or "must define" in message
                 else "\ndef forward(x):\n    return {}\n"))
    violations = check_source(source)
    assert violations, f"not rejected: {body!r}"
    assert any(message in v.message for v in violations), [str(v) for v in violations]
    assert all(v.line >= 0 for v in violations)


def test_a_dtype_off_the_list_is_named_as_a_dtype_not_as_a_device():
    """.to(torch.float8_e4m3fn) read as naming a device, and the run log showed only that (a manual-seat
    task with an FP8 output)."""
    violations = check_source(OK_HEADER + "def forward(x):\n    return {'y': x.to(torch.float8_e4m3fn)}\n")
    assert [v.message for v in violations] == [
        "torch.float8_e4m3fn is not a dtype a candidate may use (those: bfloat16, bool, double, float, "
        "float16, float32, float64, half, int, int16, int32, int64, int8, long, uint8)"]


def test_line_numbers_point_at_the_offending_line():
    source = OK_HEADER + "\n\ndef forward(x, w):\n    y = x\n    return {'y': y @ w}\n"
    (v,) = check_source(source)
    assert v.line == 8
    assert str(v).startswith("line 8:")


SCHEDULE_HEADER = (
    "import coda_agent.primitives as P\nfrom coda_agent.primitives import Config, epilogue, gemm, schedule\n"
    "\n"
    "@epilogue()\ndef e(acc):\n    return {}\n\n"
)
FORWARD = "def forward(x, w):\n    return {'y': gemm(e, x, w.t())['D']}\n"


@pytest.mark.parametrize("decorator", [
    "@schedule({('e', 8192, 4096, 14336): Config(tile_n=208), ('e', 1, 2, 3): Config()})\n",
    "@schedule({\n    ('e', 8192, 4096, 14336): Config(tile_m=256, tile_n=160, pingpong=False, cluster_m=1, "
    "cluster_n=2),\n})\n",
    "@P.schedule({('e', 8, 16, 32): P.Config(max_swizzle_size=4)})\n",
    "@schedule({('e', 1024, 2048, 8192): Config(tile_n=128, split_k=2)})\n",
    "@schedule({})\n",
])
def test_the_pinned_schedule_on_forward_is_accepted(decorator):
    assert check_source(SCHEDULE_HEADER + decorator + FORWARD) == []


@pytest.mark.parametrize(("source", "message"), [
    ("@schedule({('e', 8, 16, 32): Config()})\ndef helper(x):\n    return x\n\n" + FORWARD,
     "may only decorate the top-level forward"),
    ("def forward(x, w):\n    @schedule({})\n    def forward(y):\n        return y\n    return {}\n",
     "may only decorate the top-level forward"),
    ("@schedule({})\n@epilogue()\n" + FORWARD, "may only decorate the top-level forward"),
    ("TABLE = {('e', 8, 16, 32): Config()}\n@schedule(TABLE)\n" + FORWARD,
     "exactly one argument, a dict literal"),
    ("@schedule({('e', 8, 16, 32): Config()}, strict=True)\n" + FORWARD,
     "exactly one argument, a dict literal"),
    ("@schedule\n" + FORWARD, "must be called with its table"),
    ("N = 8\n@schedule({('e', N, 16, 32): Config()})\n" + FORWARD, "literal (epilogue_name, M, N, K) tuples"),
    ("@schedule({('e', -8, 16, 32): Config()})\n" + FORWARD, "positive integer dims"),
    ("@schedule({('e', 8, 16): Config()})\n" + FORWARD, "literal (epilogue_name, M, N, K) tuples"),
    ("@schedule({('e', 8, 16, 32): Config(128)})\n" + FORWARD, "must be Config(field=value, ...)"),
    ("@schedule({('e', 8, 16, 32): dict(tile_n=128)})\n" + FORWARD, "must be Config(field=value, ...)"),
    ("@schedule({('e', 8, 16, 32): Config(tile_q=1)})\n" + FORWARD, "Config fields are"),
    ("@schedule({('e', 8, 16, 32): Config(pingpong=1)})\n" + FORWARD, "Config fields are"),
    ("@schedule({('e', 8, 16, 32): Config(tile_n=2 * 64)})\n" + FORWARD, "Config fields are"),
    ("@schedule({('e', 8, 16, 32): Config(), ('e', 8, 16, 32): Config()})\n" + FORWARD, "appears twice"),
    ("def forward(x, w):\n    f = schedule({})\n    return {}\n", "only be used as the decorator"),
    ("pin = schedule\n" + FORWARD, "only be used as the decorator"),
])
def test_every_other_use_of_schedule_is_refused(source, message):
    violations = check_source(SCHEDULE_HEADER + source)
    assert any(message in v.message for v in violations), [str(v) for v in violations]


def test_top_level_declarations_may_be_made_by_calls():
    source = (OK_HEADER.replace("epilogue, gemm", "ColVecReduce, Config, RowVecLoad, epilogue, gemm") +
              "CONFIG = Config(tile_n=192)\nPINS = {'gamma': RowVecLoad()}\n"
              "SINKS = (ColVecReduce(scaled=True),)\n"
              "@epilogue()\ndef e(acc, c):\n    return {'D': acc + c}\n"
              "def forward(x, w, residual):\n"
              "    return {'out': gemm(e, x, w.t(), C=residual, config=CONFIG)['D']}\n")
    assert check_source(source) == []


def test_what_the_new_rules_leave_alone():
    """Placing tensors, messages that only stop, type hints, value functions and helpers in an epilogue."""
    source = ("from __future__ import annotations\n"
              + OK_HEADER.replace("epilogue, gemm", "epilogue, exp, gemm") +
              "def scaled(v, s: float):\n    return exp(v) * s\n"
              "@epilogue()\ndef e(acc, c):\n    return {'D': scaled(acc, math.sqrt(2.0)) + c * float(3)}\n"
              "def forward(x: torch.Tensor, w, residual) -> dict[str, torch.Tensor]:\n"
              "    assert x.is_contiguous(), 'x is ' + str(x.shape)\n"
              "    scale = 2.0 ** -0.5\n"
              "    if x.shape[1] != w.shape[1]:\n"
              "        raise ValueError(f'K differs: {x.shape} {w.shape}')\n"
              "    assert x.dim() == 2, f'x is {x.dim()}-d'\n"
              "    dev = x.device\n"
              "    if residual is None or (x.dim() == 2) is True or x.dtype is not torch.float32:\n"
              "        pass\n"
              "    y = x.to(dtype=x.dtype)\n"
              "    zero = torch.zeros(x.shape[0], device=x.device).to(dev) + torch.ones(1, device=dev)\n"
              "    return {'out': gemm(e, x, w.t(), C=residual)['D'], 'zero': zero}\n")
    assert check_source(source) == []


def test_a_function_torch_allows_is_a_method_too_where_both_exist():
    """A manual-seat author found ``torch.repeat_interleave(t, 2)`` accepted and ``t.repeat_interleave(2)``
    refused: the same op, one launch either way."""
    source = (OK_HEADER + "@epilogue()\ndef e(acc, c):\n    return {'D': acc + c}\n"
              "def forward(x, w, residual):\n"
              "    r = residual.repeat_interleave(1, dim=0)\n"
              "    return {'out': gemm(e, x, w.t(), C=torch.repeat_interleave(r, 1, dim=0))['D']}\n")
    assert check_source(source) == []
    # the rule, for every such function (another author's d.addcmul_(...) was refused beside an allowed
    # d.sub_(...), and torch.addcmul passed)
    import torch

    from coda_agent.verifier.static.contract import METHODS, TORCH_FUNCTIONS

    assert sorted(n for n in TORCH_FUNCTIONS if hasattr(torch.Tensor, n) and n not in METHODS) == []


def test_math_on_numbers_is_a_constant_anywhere():
    """math.f(...) of numbers, math.pi/e and + - * / is a float constant at the top level and in an epilogue
    fn; a docstring, numbers on the left of a value, operators and keyword arguments in host glue pass too."""
    source = ('"""A kernel."""\n' + OK_HEADER +
              "K = math.sqrt(2.0 / math.pi)\nL = -math.log(2) * 3\n"
              "@epilogue()\ndef e(acc):\n    return {'D': 0.5 * acc * math.sqrt(2.0 / math.pi) + K * L}\n"
              "def forward(x, w):\n    d = gemm(e, x, w.t())['D']\n"
              "    return {'out': torch.nan_to_num(d, nan=0.0) - 2.0 * d}\n")
    assert check_source(source) == []


@pytest.mark.parametrize(("body", "message"), [
    ("K = math.sqrt(math.prod([2]))\n", "top-level assignments must be constants"),
    ("@epilogue()\ndef e(acc):\n    return {'D': math.sqrt(acc * 2.0)}\n",
     "math.sqrt() cannot be called inside an epilogue fn"),
    ("@epilogue\ndef e(acc):\n    return {'D': acc}\n", "write @epilogue() with parentheses"),
])
def test_math_on_values_and_bare_epilogue_are_refused(body, message):
    violations = check_source(OK_HEADER + body + "def forward(x):\n    return {}\n")
    assert any(message in v.message for v in violations), [str(v) for v in violations]


def test_every_rule_of_every_family_is_in_the_registry():
    """A rule that no kind of node lists in RULES would never run; every registered rule belongs to a
    family."""
    import inspect

    from coda_agent.verifier.static import (
        calls,
        constructs,
        definitions,
        epilogue,
        host,
        imports,
        module,
        names,
        stores,
    )
    from coda_agent.verifier.static.rules import RULES

    families = (calls, constructs, definitions, epilogue, host, imports, module, names, stores)
    defined = {f for m in families for name, f in vars(m).items()
               if inspect.isfunction(f) and f.__module__ == m.__name__ and not name.startswith("_")}
    registered = {rule for rules in RULES.values() for rule in rules}
    assert defined == registered, sorted(f.__name__ for f in defined ^ registered)


def test_the_prompts_read_the_pinned_schedule_without_the_tune_stage():
    """The feedback shows a pinned schedule from its source form, not through the tune stage and its
    machinery."""
    import subprocess
    import sys

    code = "import sys, coda_agent.prompts.feedback; print('coda_agent.verifier.tuning' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_copy_of_a_task_constant_is_refused_where_no_kernel_writes_that_number_otherwise():
    """Contract rule 4 (use the arguments, not copies of the values): a manual seat's 1e-6 for eps passed.
    Integers and simple binary fractions are anyone's (tile sizes, 0.5, a cap of 30.0), so not held."""
    from coda_agent.tasks import find_task
    from coda_agent.verifier import verify
    from coda_agent.verifier.static.copies import copied_constants

    task = find_task("gemm_residual_rmsnorm")
    human = task.human_file.read_text()
    assert copied_constants(human, task.constants) == []
    copied = human.replace("w.shape[0], eps)", "w.shape[0], 1e-6)")
    assert copied != human
    (violation,) = copied_constants(copied, task.constants)
    assert violation.message.startswith("1e-06 is the value of the task's constant eps: use the argument eps")
    v = verify(task, copied)
    assert v.outcome.value == "static_rejected" and "constant eps" in v.reason
    assert copied_constants("x = 0.5 * 30.0 + 128\n", {"half": 0.5, "cap": 30.0, "tile": 128}) == []
    assert [c.line for c in copied_constants("a = 1\nb = 0.1\n", {"smoothing": 0.1})] == [2]
