"""Task files: schema, clear error messages, validation of references, and the shipped suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from coda_agent.cli import app
from coda_agent.tasks import TaskError, find_task, load_task, load_tasks
from coda_agent.tasks.expr import ExprError, evaluate
from coda_agent.tasks.model import STRESS_STD, Init, delicate_operators
from coda_agent.tasks.validate import validate_path

from .conftest import REPO, TASK_DIR, cli

EXAMPLE = TASK_DIR / "gemm_residual_rmsnorm.yaml"


def write_task(tmp_path: Path, edit=None, reference: str | None = None, name: str = "t",
               base: Path = EXAMPLE) -> Path:
    """A copy of a suite task (the example by default) in tmp_path, optionally edited (dict -> dict) and with
    another reference."""
    data = yaml.safe_load(base.read_text())
    data["name"] = name
    data["reference"] = "ref.py:reference"
    data["human"] = None
    if edit:
        edit(data)
    (tmp_path / "ref.py").write_text(reference or base.with_suffix(".py").read_text())
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_suite_loads_and_is_valid():
    tasks = load_tasks([TASK_DIR])
    assert tasks, "no tasks shipped"
    for task in tasks:
        report = validate_path(task.path)
        assert report.ok, report.problems


def test_example_task_derived_facts():
    task = load_task(EXAMPLE)
    dims = {"M": 8192, "N": 4096, "K": 14336}
    assert task.flops(dims) == 2 * 8192 * 4096 * 14336
    # x, w, residual, gamma in bf16; h, normed in bf16; rstd in fp32
    assert (task.min_bytes(dims)
            == 2 * (8192 * 14336 + 4096 * 14336 + 8192 * 4096 + 4096) + 2 * 2 * 8192 * 4096 + 4 * 8192)
    assert task.input_bytes(dims) == 2 * (8192 * 14336 + 4096 * 14336 + 8192 * 4096 + 4096)
    assert task.output_bytes(dims) == 2 * 2 * 8192 * 4096 + 4 * 8192
    inputs = task.make_inputs({"M": 8, "N": 16, "K": 32}, seed=1)
    assert inputs["w"].shape == (16, 32) and str(inputs["w"].dtype) == "torch.bfloat16"
    assert float(inputs["gamma"].float().min()) >= 0.5 and float(inputs["gamma"].float().max()) <= 1.5
    again = task.make_inputs({"M": 8, "N": 16, "K": 32}, seed=1)
    other = task.make_inputs({"M": 8, "N": 16, "K": 32}, seed=2)
    assert all((inputs[k] == again[k]).all() for k in inputs)
    assert not (inputs["x"] == other["x"]).all()
    assert task.tolerance.for_output("h") == (2.0, 1e-5)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("family"), "family: Field required"),
        (lambda d: d.update(family="sideways"), "family: must be 'forward', 'backward' or 'block'"),
        (lambda d: d["inputs"][1].update(dtype="bf16"), "inputs[1](w).dtype"),
        (lambda d: d["outputs"][0].update(dtype="float8_e4m3fn"),
         "outputs[0](h).dtype: must be 'bfloat16', 'float16', 'float32', 'int32' or 'int64'"),
        (lambda d: d.update(launch_budget=0), "launch_budget: Input should be greater than or equal to 1"),
        # a budget below the GEMMs listed, each a gemm() call (from a manual-seat author's task)
        (lambda d: d.update(launch_budget=1, gemms=[["M", "N", "K"], ["M", "N", "K"]]),
         "launch_budget: 1 is below the 2 GEMMs the task lists, each a gemm() call of its own"),
        (lambda d: d.update(reference="ref:reference"), "reference: must look like 'file.py:function'"),
        (lambda d: d["shapes"].pop("bench"), "needs a non-empty 'bench' shape set"),
        (lambda d: d["shapes"]["small"][0]["dims"].pop("K"),
         "inputs[0](x).shape[1]: uses K, which shape small/tiny does not bind"),
        (lambda d: d.update(colour="blue"), "colour: unknown field (typo?)"),
        (lambda d: d.update(launch_budgt=d.pop("launch_budget")),
         "launch_budgt: unknown field; did you mean launch_budget?"),
        (lambda d: d["outputs"].append(dict(d["outputs"][0])), "names must be unique"),
        (lambda d: d["tolerance"].update(outputs={"nope": {"floor": 1}}) if "tolerance" in d
         else d.update(tolerance={"outputs": {"nope": {"floor": 1}}}), "'nope', which is not an output"),
        (lambda d: d.update(tolerance={"baseline": "exact"}),
         "tolerance.baseline: must be 'eager' or 'single_rounding'"),
        (lambda d: d["inputs"][0].update(init={"replace": {"value": 0, "fraction": 1.5}}),
         "inputs[0](x).init.replace.fraction"),
        (lambda d: d["inputs"][0].update(init={"replace": {"value": "pad", "fraction": 0.5}}),
         "inputs[0](x).init.replace.value: 'pad' at shape"),
        (lambda d: d["inputs"][0].update(init={"replace": {"value": "pad", "fraction": 0.5}}),
         "'pad' uses unknown symbol 'pad'"),
        (lambda d: d["constants"].update(K=3), "constants.K: constant K has the name of a shape symbol"),
        (lambda d: d["constants"].update(big=10**400), "constants.big: constant big is beyond 2**53"),
        (lambda d: (d["constants"].update(H=4), d["inputs"][0].update(shape=["M", "H*32"])),
         "inputs[0](x).shape[1]: uses H, a constant: shapes, gemms and sol read shape symbols only; bind H "
         "in each shape's dims instead (H: 4)"),
        (lambda d: d["shapes"]["bench"][0]["dims"].update(M=10**30), "dimensions must be below 2**31"),
        (lambda d: d.update(tolerance={"factor": -1.0}), "tolerance factor must be a finite number >= 0"),
        (lambda d: d.update(tolerance={"outputs": {"h": {"floor": float("nan")}}}),
         "tolerance floor must be a finite number >= 0"),
        (lambda d: d["sol"].update(bytes="9**9**9"), "9 ** 387420489 is too large"),
        (lambda d: d["sol"].update(flops="+".join(["M"] * 100_000)), "longer than the 1000 allowed"),
    ],
)
def test_schema_errors_name_the_file_field_and_problem(tmp_path, edit, message):
    path = write_task(tmp_path, edit)
    with pytest.raises(TaskError) as err:
        load_task(path)
    text = str(err.value)
    assert str(path) in text
    assert message in text
    assert "['" not in text  # names as words, never as a Python list


def test_a_misspelt_required_field_is_one_mistake(tmp_path):
    path = write_task(tmp_path, lambda d: d.update(launch_budgt=d.pop("launch_budget")))
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert "Field required" not in str(err.value) and len(str(err.value).splitlines()) == 2


def _problem_lines(path: Path) -> list[str]:
    with pytest.raises(TaskError) as err:
        load_task(path)
    first, *lines = str(err.value).splitlines()
    assert first == f"{path}: invalid task file"
    return lines


def _points_at(path: Path, line: str, text: str) -> bool:
    """The ``line N:`` of an error line is where ``text`` is in the file."""
    n = int(re.search(r"line (\d+): ", line).group(1))
    return text in path.read_text().splitlines()[n - 1]


def test_a_bad_shape_expression_names_its_field_and_line(tmp_path):
    path = write_task(tmp_path, lambda d: d["inputs"][0].update(shape=["N*", "K"]))
    (line,) = _problem_lines(path)
    assert (re.match(r"  line \d+: inputs\[0\]\(x\)\.shape\[0\]: cannot parse 'N\*'", line)
            and "top level" not in line)
    assert _points_at(path, line, "N*")


def test_tasks_names_a_broken_task_with_its_first_mistake_and_lists_the_others(tmp_path, monkeypatch, capsys):
    write_task(tmp_path, lambda d: d["inputs"][0].update(shape=["N*", "K"]), name="broken")
    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path))
    code, out, err = cli(capsys, "tasks")
    assert code == 2 and "gemm_swiglu" in out
    assert (err.count("\n") == 1
            and re.search(r"^error: .*broken.yaml: invalid task file: line \d+: "
                          r"inputs\[0\]\(x\)\.shape\[0\]: cannot parse", err))


def test_an_unbound_symbol_names_the_tensor_that_uses_it(tmp_path):
    path = write_task(tmp_path, lambda d: d["inputs"][1].update(shape=["Q", "K"]))
    (line,) = _problem_lines(path)
    assert re.match(r"  line \d+: inputs\[1\]\(w\)\.shape\[0\]: uses Q, which no shape binds", line)
    assert _points_at(path, line, "Q")


def test_each_mistake_is_one_line_at_its_own_field(tmp_path):
    def edit(d):
        d["inputs"][0]["shape"] = ["N*", "K"]
        d["tolerance"] = {"outputs": {"nope": {"floor": 1}}}
        d["outputs"][1]["name"] = d["outputs"][0]["name"]

    lines = _problem_lines(write_task(tmp_path, edit))
    assert len(lines) == 3, lines
    fields = {re.match(r"  line \d+: (\S+):", ln).group(1) for ln in lines}
    assert fields == {"inputs[0](x).shape[0]", "tolerance.outputs.nope", "outputs[1](h).name"}, lines


def test_a_misnamed_output_is_one_line_naming_what_the_reference_returns(tmp_path, capsys):
    def edit(d):
        d["outputs"][0]["name"] = "hh"

    path = write_task(tmp_path, edit)
    report = validate_path(path)
    assert len(report.problems) == 1, report.problems
    (problem,) = report.problems
    assert re.match(
        r"line \d+: outputs\[0\]\(hh\): the reference does not return output 'hh'; it returns 'h'", problem)
    assert _points_at(path, problem, "hh")
    code, _, err = cli(capsys, "run", str(path), "--model", "mock/echo", "--no-compile", "--runs-dir",
                       str(tmp_path / "runs"))
    assert (code == 2 and err.count("\n") == 1 and "task t is not usable: line " in err
            and "outputs[0](hh)" in err)


def test_run_lists_several_problems_of_a_task_one_a_line(tmp_path, capsys):
    reference = ("import torch\ndef reference(x, w, residual, gamma, *, eps):\n"
                 "    h = torch.ones_like(residual).cumsum(-1)\n"
                 "    return {'h': h, 'normed': h * gamma * 0, 'rstd': (x @ "
                 "w.t()).float().pow(2).mean(-1).add(eps).rsqrt()}\n")
    path = write_task(tmp_path, reference=reference)
    code, _, err = cli(capsys, "run", str(path), "--model", "mock/echo", "--no-compile", "--runs-dir",
                       str(tmp_path / "runs"))
    first, *items = err.splitlines()
    assert (code == 2 and first.startswith("error: task t is not usable (")
            and f"coda-agent validate {path}" in first)
    assert len(items) >= 2 and all(i.startswith("  - ") and len(i) < 200 for i in items), err
    # said once, with the shapes it holds at
    assert sum("output 'normed' is near zero" in i for i in items) == 1
    assert any("(also at small/" in i for i in items), err


def test_replace_sets_a_fraction_of_an_input_to_a_constant(tmp_path):
    """Cross-entropy's ignore_index among the targets: the value may name a task constant."""

    def edit(d):
        d["constants"]["ignore_index"] = -100
        d["inputs"][0] = {**d["inputs"][0],
                          "init": {"dist": "normal", "replace": {"value": "ignore_index", "fraction": 0.25}}}

    task = load_task(write_task(tmp_path, edit))
    x = task.make_inputs({"M": 64, "N": 16, "K": 32}, seed=3)["x"]
    hit = x == -100
    assert 0.15 < float(hit.float().mean()) < 0.35
    assert bool((x[~hit].abs() < 10).all())  # the rest is drawn as before
    assert torch.equal(x, task.make_inputs({"M": 64, "N": 16, "K": 32}, seed=3)["x"])


def test_replace_with_rows_plants_whole_rows(tmp_path):
    """The zero rows a norm's eps guards (x / max(|x|, eps)): element-wise replacement never makes one (a
    manual-seat author's L2-normalised embedding could not pass validate's constant check)."""

    def edit(d):
        rows = {"value": 0.0, "fraction": 0.25, "rows": True}
        d["inputs"][0] = {**d["inputs"][0], "init": {"dist": "normal", "replace": rows}}

    task = load_task(write_task(tmp_path, edit))
    x = task.make_inputs({"M": 64, "N": 16, "K": 32}, seed=3)["x"]
    zero = (x == 0).all(dim=1)
    assert 4 <= int(zero.sum()) <= 28 and bool((x[~zero] != 0).any(dim=1).all())


def test_a_softmax_init_draws_probability_rows(tmp_path):
    """A distillation task's teacher distribution: rows that sum to 1 (normal/uniform cannot draw them, a
    manual-seat author's KL task had to carry the row sums through its formula)."""

    def edit(d):
        d["inputs"][0] = {**d["inputs"][0], "init": {"dist": "softmax", "std": 3.0}}

    task = load_task(write_task(tmp_path, edit))
    x = task.make_inputs({"M": 64, "N": 16, "K": 32}, seed=3)["x"].float()
    assert bool((x >= 0).all()) and torch.allclose(x.sum(-1), torch.ones(64), atol=0.02)
    assert float(x.max(-1).values.mean()) > 0.3  # std 3 logits: peaked rows


def test_delicate_operators_are_read_from_the_reference_source():
    source = ("import torch\ndef reference(x, n):\n"
              "    return {'y': torch.logsumexp(x, -1) / n + x.rsqrt().sum()}\n")
    assert delicate_operators(source) == ["/", "logsumexp", "rsqrt"]
    assert delicate_operators("def reference(x, w):  # exp, log\n    return {'y': x @ w + 1}\n") == []
    # an exact GELU: no value function computes erf, so a kernel builds it (found from the manual seat)
    exact = ("import torch\ndef reference(x, g):\n"
             "    return {'y': torch.ops.aten.gelu_backward(g, x) + x.erf()}\n")
    assert delicate_operators(exact) == ["erf", "gelu_backward"]
    # softplus is log(1 + exp(x)): a naive kernel overflows (a manual seat's Mamba dt projection passed)
    assert delicate_operators("def reference(x):\n    return {'y': F.softplus(x)}\n") == ["softplus"]


def test_a_delicate_reference_gets_a_stress_set_of_its_activations_at_large_magnitudes():
    # logsumexp; x is left at the default init, w and targets have their own
    ce = find_task("gemm_cross_entropy")
    assert ce.stress_inits() == {"x": Init(std=STRESS_STD)}
    dims = ce.shape("small")[0].dims
    plain, stress = ce.make_inputs(dims, 5), ce.make_inputs(dims, 5, stress=True)
    assert 60 < float(stress["x"].float().std()) < 68
    assert torch.equal(plain["w"], stress["w"]) and torch.equal(plain["targets"], stress["targets"])
    assert find_task("gemm_residual").stress_inits() == {}  # a GEMM and an add: nothing to stress


def test_a_task_declares_its_own_stress_set_or_none(tmp_path):
    edge = {"dist": "uniform", "low": 1e-3, "high": "2e-3"}
    declared = load_task(write_task(tmp_path, lambda d: d.update(stress={"gamma": edge}), name="declared"))
    assert declared.stress_inits() == {"gamma": Init(**edge)}
    gamma = declared.make_inputs({"M": 8, "N": 16, "K": 32}, 0, stress=True)["gamma"].float()
    assert bool(((gamma >= 0.9e-3) & (gamma <= 2.1e-3)).all())
    assert load_task(write_task(tmp_path, lambda d: d.update(stress={}), name="none")).stress_inits() == {}


def test_a_stress_block_naming_no_input_or_a_bad_expression_is_a_field_problem(tmp_path):
    lines = _problem_lines(write_task(tmp_path, lambda d: d.update(stress={"xx": {"std": 10}})))
    assert (len(lines) == 1
            and "stress.xx: names 'xx', which is not an input (inputs: x, w, residual, gamma)" in lines[0])
    lines = _problem_lines(write_task(tmp_path, lambda d: d.update(stress={"x": {"std": "Q * 2"}})))
    assert len(lines) == 1 and "stress.x" in lines[0] and "Q" in lines[0]


def test_validate_refuses_a_stress_set_the_reference_overflows_on(tmp_path):
    """Cross-entropy's backward takes lse as an input: at the default stress set's large logits, exp(logits -
    lse) overflows the reference itself, so the suite task declares a stress set with an lse to match."""
    source = TASK_DIR / "gemm_rmsnorm_cross_entropy_bwd.yaml"
    data = yaml.safe_load(source.read_text())
    assert set(data.pop("stress")) == {"x", "lse"}
    data["human"] = None
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / data["reference"].split(":")[0]).write_text(
        (TASK_DIR / data["reference"].split(":")[0]).read_text())
    report = validate_path(tmp_path / "t.yaml")
    assert report.problems == [
        "shape small/tiny: on the default stress set (x at large magnitudes) the FP32 reference's output "
        "'dlogits' has NaN/Inf, so no candidate could pass it; declare a stress: block the reference stays "
        "finite on (stress: {} for none) (also at small/ragged)"
    ]
    assert validate_path(source).ok


def test_validate_refuses_a_listed_gemm_the_reference_never_makes(tmp_path):
    """Each listed GEMM must be a gemm() call in a kernel, so an entry the reference does not compute makes
    every correct kernel a cheat (a manual-seat author's K of 2H for an (H, H) weight); either orientation of
    a product counts."""
    report = validate_path(write_task(tmp_path, lambda d: d.update(gemms=[["M", "N", "2*K"]])))
    (problem,) = report.problems
    assert re.match(r"line \d+: gemms\[0\]: \(256, 384, 256\) at shape small/tiny is no product the "
                    r"reference makes \(its products \(M, N, K\): \(256, 384, 128\)\)", problem), problem
    assert validate_path(write_task(tmp_path, lambda d: d.update(gemms=[["N", "M", "K"]]))).ok


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ninputs: [\n  - a: b\n")
    with pytest.raises(TaskError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load_task(path)


def test_cli_reports_malformed_task_in_one_clean_message(tmp_path):
    path = write_task(tmp_path, lambda d: d.update(family="sideways"))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "family" in result.output
    assert "Traceback" not in result.output
    # each mistake a problem line under FAIL, as validate's own checks print theirs (the loader's head is
    # the FAIL line)
    assert "invalid task file" not in result.output and re.search(r"\n      line \d+: family", result.output)


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("def reference(x, w, residual, gamma, *, eps):\n    raise RuntimeError('boom')\n",
         "the reference raised RuntimeError: boom"),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    return {'h': h, 'normed': h * 0, 'rstd': torch.ones(h.shape[0])}\n",
            "output 'normed' is near zero",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': torch.full((h.shape[0],), 3.0)}\n",
            "output 'rstd' is constant",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    return {'h': h, 'normed': h * gamma}\n",
            "does not return output 'rstd'",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    return {'h': h.float(), 'normed': h * gamma, 'rstd': h.float().sum(-1)}\n",
            "output 'h' comes back as torch.float32 in the task dtype, declared bfloat16",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    return {'h': h[:, :5], 'normed': h * gamma, 'rstd': h.float().sum(-1)}\n",
            "output 'h' has shape",
        ),
        (  # right at the small shapes only: a reference that reads its own quantities off the shapes
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
            "    rows = h.shape[0] if h.shape[0] < 4096 else 4096\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': h.float().sum(-1)[:rows]}\n",
            "shape bench/llama3-8b-down: output 'rstd' has shape (4096,), the task declares (8192,) (the "
            "reference, run on meta tensors)",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n"
            "    h = torch.ones_like(residual).cumsum(-1)\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': (x @ w.t()).float().sum(-1)}\n",
            "output 'h' does not change when the inputs change",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n"
            "    h = (x @ w.t()) * 0 + residual\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': h.float().pow(2).mean(-1).add(eps).rsqrt()}\n",
            # the field named, and the fix (a manual-seat author read a refusal of LayerNorm's unused beta
            # as naming neither)
            "inputs[0](x): no output changes when it alone does; a candidate could ignore it: drop it, or "
            "use it in the reference",
        ),
        (  # the FP32 run would see the task-dtype run's sum (a Megatron main_grad accumulated in place)
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n    residual.add_(x @ w.t())\n"
            "    h = residual.clone()\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': h.float().pow(2).mean(-1).add(eps).rsqrt()}\n",
            "inputs[2](residual): the reference changes it in place",
        ),
        (
            "import torch\ndef reference(x, w, residual, gamma, *, eps):\n"
            "    h = torch.nn.functional.dropout(x @ w.t(), 0.1, training=True) + residual\n"
            "    return {'h': h, 'normed': h * gamma, 'rstd': h.float().pow(2).mean(-1).add(eps).rsqrt()}\n",
            "differs between two runs of the reference on the same inputs",
        ),
    ],
)
def test_validate_rejects_broken_and_degenerate_references(tmp_path, reference, problem):
    report = validate_path(write_task(tmp_path, reference=textwrap.dedent(reference)))
    assert not report.ok
    assert any(problem in p for p in report.problems), report.problems


#: GPT-OSS's clamped SwiGLU: the gate clamped above at ``limit``, the up projection on both sides.
CLAMPED_SWIGLU = """
import torch
def reference(x, w, *, limit, alpha):
    preact = x @ w.t()
    gate, up = preact[:, 0::2].clamp(max=limit), preact[:, 1::2].clamp(-limit, limit)
    return {"act": gate * torch.sigmoid(alpha * gate) * (up + 1), "preact": preact}
"""


def _clamped_swiglu(tmp_path: Path, x_std: float) -> Path:
    def edit(d):
        d["constants"] = {"limit": 7.0, "alpha": 1.702}
        d["inputs"][0]["init"] = {"dist": "normal", "std": x_std}

    return write_task(tmp_path, edit, CLAMPED_SWIGLU, base=TASK_DIR / "gemm_swiglu.yaml")


def test_validate_refuses_a_clamp_the_test_data_never_reaches(tmp_path):
    """Issue 48: at the suite's spread (pre-activations about N(0, 1)) the clamp at 7 never acts, so a kernel
    without it would pass verify; the line names the constant, the move that changes nothing, and the init to
    widen."""
    path = _clamped_swiglu(tmp_path, x_std=1.0)
    (problem,) = validate_path(path).problems
    assert ("constants.limit: no output changes when it moves from 7 to 10.5 (x1.5) at the small shapes"
            in problem)
    assert "widen the init of inputs[0](x) or inputs[1](w)" in problem and _points_at(path, problem, "limit")
    # a spread that reaches the clamp: alpha moves it too
    assert validate_path(_clamped_swiglu(tmp_path, x_std=4.0)).ok


def test_validate_refuses_a_mask_value_no_input_holds(tmp_path):
    """Cross-entropy's ignore_index with targets that never hold it: no spread reaches it, the data must hold
    it."""
    path = write_task(tmp_path, lambda d: d["inputs"][2]["init"].pop("replace"),
                      base=TASK_DIR / "gemm_cross_entropy.yaml")
    (problem,) = validate_path(path).problems
    assert ("constants.ignore_index: no output changes when it moves from -100 to -150 (x1.5) or to -50 "
            "(x0.5)") in problem
    assert "give the test data values where it acts" in problem and _points_at(path, problem, "ignore_index")


def test_validate_says_a_constant_the_reference_never_uses_is_to_be_dropped(tmp_path):
    """'The test data never reaches it' sent an author widening inits for a constant the reference never read
    (a manual seat's)."""
    reference = EXAMPLE.with_suffix(".py").read_text().replace("gamma, *, eps)", "gamma, *, eps, unused)")
    path = write_task(tmp_path, lambda d: d["constants"].update(unused=3.0), reference=reference)
    (problem,) = validate_path(path).problems
    assert problem.endswith("constants.unused: the reference never uses it; drop it"), problem


def test_validate_notes_a_delicate_reference_with_no_stress_set(tmp_path):
    """Every floating input with an init of its own: no stress set is drawn, and an lse without its row max
    passed (a manual seat's InfoNCE task); a note says so, the task stays valid."""
    path = write_task(tmp_path, lambda d: d["inputs"][0].update(init={"dist": "normal", "std": 0.5}),
                      base=TASK_DIR / "gemm_cross_entropy.yaml")
    report = validate_path(path)
    assert report.ok and any(n.startswith("stress: the reference calls") and "no stress set is drawn" in n
                             for n in report.notes), report.notes
    assert not any(n.startswith("stress:") for n in validate_path(TASK_DIR / "gemm_cross_entropy.yaml").notes)


def test_validate_notes_a_stress_set_that_reaches_no_delicate_operator(tmp_path):
    """A post-norm task (a manual seat's): x has an init of its own, so the default stress set redraws only
    the residual, which is added after the rsqrt; the prompt said "rsqrt must stay in range" of a set that
    never reaches it. A note says so; where the stressed input does feed the rsqrt, none."""
    post_norm = ("import torch\n\n\ndef reference(x, w, residual, gamma, *, eps):\n    y = x @ w.t()\n"
                 "    rstd = torch.rsqrt(y.float().pow(2).mean(-1) + eps)\n    h = y + residual\n"
                 "    return {'h': h, 'normed': h * gamma, 'rstd': rstd}\n")
    own = {"dist": "normal", "std": 0.5}  # an init of x's own (the default one is the standard normal)
    path = write_task(tmp_path, lambda d: d["inputs"][0].update(init=own), reference=post_norm)
    report = validate_path(path)
    assert report.ok and [n for n in report.notes if n.startswith("stress:")] == [
        "stress: the default stress set redraws residual at large magnitudes, but the operands of the "
        "reference's rsqrt are no larger there than on the ordinary test data (those inputs do not reach "
        "them), so a kernel unstable at large magnitudes passes; a stress: block names the inputs that do "
        "reach them (stress: {x: {std: 64}} draws x there)"], report.notes
    reached = write_task(tmp_path, lambda d: d["inputs"][0].update(init=own), name="reached")
    assert not any(n.startswith("stress:") for n in validate_path(reached).notes)
    # a division by a number is no delicate quotient: gemm_rmsnorm_bwd's zdz / n, its stress set elsewhere
    assert not any(n.startswith("stress:") for n in validate_path(TASK_DIR / "gemm_rmsnorm_bwd.yaml").notes)


LABEL_SMOOTHED = """import torch


def reference(x, w, targets, *, ignore_index, smoothing):
    logits = x @ w.t()
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    counted = targets != ignore_index
    picked = lf.gather(1, torch.where(counted, targets, 0)[:, None])[:, 0]
    smooth = lse - lf.mean(-1)
    loss = (1 - smoothing) * (lse - picked) + smoothing * smooth
    return {"logits": logits, "lse": lse, "loss": torch.where(counted, loss, 0.0)}
"""


def _label_smoothed(tmp_path: Path, w_mean: float) -> Path:
    """Cross-entropy with label smoothing (its mean term: the mean of the logits over the vocabulary), weights
    drawn with mean ``w_mean``."""
    def edit(d):
        d["constants"]["smoothing"] = 0.1
        d["inputs"][1]["init"] = {"dist": "normal", "mean": w_mean, "std": "1/sqrt(K)"}

    return write_task(tmp_path, edit, LABEL_SMOOTHED, base=TASK_DIR / "gemm_cross_entropy.yaml")


def test_validate_refuses_a_term_the_test_data_keeps_too_small_to_see(tmp_path):
    """Issue 48: with zero-mean weights, label smoothing's mean over the vocabulary is about zero, and a
    kernel that leaves it out stays within the tolerance; the line names the term and its line, and what to
    draw otherwise. Moving the smoothing constant cannot show it: it also scales the target's term."""
    (problem,) = validate_path(_label_smoothed(tmp_path, 0.0)).problems
    assert problem.startswith("ref.py:10: the right term of the '-' in `smooth = lse - lf.mean(-1)`"), problem
    # which input to draw otherwise, and how: a mean over the vocabulary is the same at any spread of the
    # weights (a manual seat widened them first, as the line said), only their mean shows it
    assert "a kernel could leave it out" in problem and problem.endswith(
        "draw the inputs that feed it where it counts: inputs[1](w) drawn with a mean of one std (init: "
        "{mean: ...}) shows it"), problem
    # which of a line's sums it is, by the sizes (a LoRA's line of two '+' named neither: the manual seat)
    assert re.search(r"`smooth = lse - lf.mean\(-1\)` \(at most [0-9.e-]+ in magnitude, beside [0-9.e+]+\)",
                     problem), problem
    # weights with a mean: the logits' mean is a real term
    assert validate_path(_label_smoothed(tmp_path, 0.02)).ok


def test_each_sum_of_a_line_is_judged_and_the_invisible_one_quoted(tmp_path):
    """Two '-' on one line: only the first was judged (one verdict per line and operand), and a refusal named
    "the right term of the '-'" without saying which (a manual seat's soft-capped CE backward)."""
    reference = LABEL_SMOOTHED.replace(
        "    smooth = lse - lf.mean(-1)\n    loss = (1 - smoothing) * (lse - picked) + smoothing * smooth\n",
        "    loss = (1 - smoothing) * (lse - picked) + smoothing * (lse - lf.mean(-1))\n")

    def edit(d):
        d["constants"]["smoothing"] = 0.1
        d["inputs"][1]["init"] = {"dist": "normal", "mean": 0.0, "std": "1/sqrt(K)"}

    path = write_task(tmp_path, edit, reference, base=TASK_DIR / "gemm_cross_entropy.yaml")
    (problem,) = validate_path(path).problems
    assert problem.startswith("ref.py:10: the right term of the '-' in `lse - lf.mean(-1)` in `loss = "), \
        problem


@pytest.mark.parametrize(
    ("dims", "expected", "symbol", "fix"),
    [
        ({"M": 4096, "V": 151935, "K": 4096},
         "outputs[0](logits).shape[1]: V is 151935 at shape bench/odd: the rows of "
         "logits are 303870 bytes", "- V", "make V a multiple of 8 there (as 151936)"),
        ({"M": 4096, "V": 151936, "K": 4095},
         "inputs[0](x).shape[1]: K is 4095 at shape bench/odd: the rows of x, w are "
         "8190 bytes", "- K", "make K a multiple of 8 there (as 4096)"),
    ],
)
def test_validate_refuses_a_shape_whose_rows_tma_cannot_move(tmp_path, dims, expected, symbol, fix):
    """Issue 48: a bench shape off TMA's 16-byte row grid, where every kernel would fail to build, is the
    task's to fix: one line names the tensor, the symbol, the shape, the rule and the nearest aligned size."""
    path = write_task(tmp_path, lambda d: d["shapes"]["bench"].append({"name": "odd", "dims": dims}),
                      base=TASK_DIR / "gemm_cross_entropy.yaml")
    (problem,) = validate_path(path).problems
    assert expected in problem and "rows of a multiple of 16 bytes (8 bfloat16 elements)" in problem
    assert "the task's shape is misaligned and no kernel can run it" in problem and problem.endswith(fix)
    assert _points_at(path, problem, symbol)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1 and "the task's shape is misaligned" in result.output


WGRAD = """
name: wgrad
version: 1
family: backward
description: "new_main_grad = main_grad + dy^T @ x in FP32"
inputs:
  - {name: x, shape: [T, K], dtype: bfloat16}
  - {name: dy, shape: [T, N], dtype: bfloat16}
  - {name: main_grad, shape: [N, K], dtype: float32, init: {dist: normal, std: "sqrt(T)"}}
outputs:
  - {name: new_main_grad, shape: [N, K], dtype: float32}
shapes:
  small:
    - {name: tiny, dims: {T: 256, N: 384, K: 128}}
    - {name: ragged, dims: {T: 203, N: %d, K: 72}}
  bench:
    - {name: b, dims: {T: 8192, N: 4096, K: 4096}}
reference: ref.py:reference
tolerance: {baseline: single_rounding}
launch_budget: 2
sol: {flops: "2*N*K*T"}
gemms: [[N, K, T]]
"""


@pytest.mark.parametrize("n", [262, 264])
def test_validate_holds_m_to_the_tma_grid_where_the_reference_stores_a_m_major(tmp_path, n):
    """A weight gradient's A is dy.t(), stored (K, M): its rows are the GEMM's M long, so an M off the grid
    is a shape no kernel can run (gemm() refused it at verify while validate said ok: a manual-seat author's
    wgrad task). An M the reference never stores as a row stays free (the suite's ragged M)."""
    (tmp_path / "ref.py").write_text("def reference(x, dy, main_grad):\n"
                                     "    return {'new_main_grad': main_grad + dy.t() @ x}\n")
    path = tmp_path / "wgrad.yaml"
    path.write_text(WGRAD % n)
    problems = validate_path(path).problems
    if n == 264:
        assert problems == []
    else:
        (problem,) = problems
        assert ("inputs[1](dy).shape[1]: N is 262 at shape small/ragged: the rows of dy are 524 bytes"
                in problem)
        assert problem.endswith("make N a multiple of 8 there (as 264)")


def test_a_narrow_output_host_work_can_make_is_not_held_to_the_tma_grid(tmp_path):
    """Only a tensor of a task GEMM's width must cross into its kernel as tiles; an (M, 6) FP32 statistic
    (rstd per head, a manual-seat task's) may come from host ops, so validate does not say no kernel can run
    it."""
    reference = (EXAMPLE.with_suffix(".py").read_text()
                 + "\n\ndef with_heads(x, w, residual, gamma, *, eps):\n"
                 "    out = reference(x, w, residual, gamma, eps=eps)\n"
                 "    return {**out, 'heads': (x @ w.t() + residual).float()[:, :6]}\n")

    def edit(d):
        d["outputs"].append({"name": "heads", "shape": ["M", 6], "dtype": "float32"})
        d["reference"] = "ref.py:with_heads"

    path = write_task(tmp_path, edit, reference=reference)
    assert validate_path(path).ok, validate_path(path).problems


def test_validate_notes_an_eps_no_tolerance_sees_and_refuses_nothing_for_it():
    """A kernel that drops a LayerNorm's eps passes verify (rows of ordinary size): validate's constant check
    moved eps bit for bit and said nothing, which two manual-seat authors read as eps being checked. Now a
    note says so; the task stays valid."""
    path = REPO / "bench" / "accept" / "tasks" / "gemm_residual_layernorm.yaml"
    report = validate_path(path)
    assert report.ok and len(report.notes) == 1
    assert ("constants.eps: a kernel that leaves it out (0) or uses 100 x it (0.001) stays within the "
            "tolerance" in report.notes[0])
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "note: line" in result.output and "1/1 task files valid" in result.output
    assert validate_path(TASK_DIR / "gemm_residual.yaml").notes == []  # no constant


def test_a_reference_nan_on_the_ordinary_inputs_gets_no_stress_advice(tmp_path):
    """A stress: block cannot fix a reference that is NaN everywhere (a manual-seat author's p * p.log() at
    p = 0): only the NaN line is said."""
    reference = (EXAMPLE.with_suffix(".py").read_text()
                 + "\n\ndef nan(x, w, residual, gamma, *, eps):\n"
                 "    out = reference(x, w, residual, gamma, eps=eps)\n"
                 "    return {**out, 'rstd': out['rstd'] * (x.float().sum(-1) * 0.0).log()}\n")
    path = write_task(tmp_path, lambda d: d.update(reference="ref.py:nan"), reference=reference)
    problems = validate_path(path).problems
    assert any("output 'rstd' of the FP32 reference has NaN/Inf" in p for p in problems), problems
    assert not any("stress" in p for p in problems), problems


def test_validate_refuses_a_task_dtype_reference_that_overflows_where_fp32_does_not(tmp_path):
    """In float16 a logsumexp without the max overflows at 11: the allowance, twice its error, was infinite
    and any output passed."""
    def fp16(d: dict) -> None:
        for t in d["inputs"] + d["outputs"]:
            if t["dtype"] == "bfloat16":
                t["dtype"] = "float16"
        d["stress"] = {}

    reference = ("import torch\ndef reference(x, w, residual, gamma, *, eps):\n    h = x @ w.t() + residual\n"
                 "    lse = (h * 8).exp().sum(-1, keepdim=True).log()\n"
                 "    return {'h': h, 'normed': h * gamma + lse,\n"
                 "            'rstd': h.float().pow(2).mean(-1).add(eps).rsqrt()}\n")
    report = validate_path(write_task(tmp_path, fp16, reference=reference))
    assert any("output 'normed' of the task-dtype reference, the baseline the tolerance scales with, has "
               "NaN/Inf on the ordinary inputs" in p for p in report.problems), report.problems


def test_validate_notes_an_eps_only_a_tiny_row_holds_a_kernel_to(tmp_path):
    """A row of zeros shows eps's absence (NaN) but not an eps 100 times too large: a norm of a row by its own
    statistic is 0 there whatever eps is (a manual seat's QK-norm task passed a kernel with eps 1e-4 for
    1e-6). Rows of a tiny spread show both."""
    def planted(value: float):
        def edit(d: dict) -> None:
            d["inputs"][2]["init"] = {"replace": {"value": value, "fraction": 0.1, "rows": True}}
        return edit

    reference = ("import torch\ndef reference(x, w, residual, gamma, *, eps):\n"
                 "    h = x @ w.t()\n    r = residual.float()\n"
                 "    normed = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * gamma\n"
                 "    return {'h': h, 'normed': normed, 'rstd': h.float().pow(2).mean(-1)}\n")
    zeros = validate_path(write_task(tmp_path, planted(0.0), reference=reference, name="zeros"))
    assert zeros.ok and any("uses 100 x it" in n and "leaves it out" not in n
                            for n in zeros.notes), zeros.notes
    tiny = validate_path(write_task(tmp_path, planted(1e-3), reference=reference, name="tiny"))
    assert tiny.ok and not any("constants.eps" in n for n in tiny.notes), tiny.notes


ZLOSS_TASK = """\
name: zloss
version: 1
family: forward
description: an LM head's cross-entropy with PaLM's z-loss.
inputs:
  - {name: x, shape: [M, K], dtype: bfloat16}
  - {name: w, shape: [V, K], dtype: bfloat16, init: {dist: normal, std: "1/sqrt(K)"}}
  - {name: targets, shape: [M], dtype: int64, init: {dist: randint, low: 0, high: V}}
outputs:
  - {name: loss, shape: [M], dtype: float32}
  - {name: lse, shape: [M], dtype: float32}
constants: {z_loss: 1.0e-4}
shapes:
  small: [{name: tiny, dims: {M: 256, V: 512, K: 128}}]
  bench: [{name: b, dims: {M: 8192, V: 32768, K: 4096}}]
reference: ref.py:reference
launch_budget: 16
sol: {flops: "2*M*V*K"}
gemms: [[M, V, K]]
"""


def test_validate_names_single_rounding_where_the_eager_baseline_hides_a_term(tmp_path):
    """z * lse**2 (0.005 beside a loss of 10) hides under the eager baseline, whose bf16 logits set the
    tolerance; a manual seat widened the weights as the refusal advised, in vain, and found single_rounding
    by trial. The refusal names it where it shows the term."""
    (tmp_path / "ref.py").write_text(
        "import torch\ndef reference(x, w, targets, *, z_loss):\n    logits = (x @ w.t()).float()\n"
        "    lse = torch.logsumexp(logits, dim=-1)\n    picked = logits.gather(1, targets[:, None])[:, 0]\n"
        "    return {'loss': lse - picked + z_loss * lse * lse, 'lse': lse}\n")
    (tmp_path / "t.yaml").write_text(ZLOSS_TASK)
    report = validate_path(tmp_path / "t.yaml")
    assert any("z_loss * lse * lse" in p and "under tolerance: {baseline: single_rounding} (the FP32 "
               "reference rounded once) it shows" in p for p in report.problems), report.problems
    (tmp_path / "t.yaml").write_text(ZLOSS_TASK + "tolerance: {baseline: single_rounding}\n")
    assert validate_path(tmp_path / "t.yaml").ok


def test_validate_refuses_an_input_drawn_too_flat_to_see(tmp_path):
    """A norm weight of ones (nn.RMSNorm's init), or one within 0.5% of them: a kernel that never reads it
    passed verify."""
    for low, high in ((1.0, 1.0), (0.995, 1.005)):
        path = write_task(tmp_path, lambda d, lo=low, hi=high: d["inputs"][3].update(
            init={"dist": "uniform", "low": lo, "high": hi}))
        report = validate_path(path)
        assert any("inputs[3](gamma): replaced by its mean" in p and "wider spread" in p
                   for p in report.problems), report.problems


def test_missing_reference_function_is_reported(tmp_path):
    path = write_task(tmp_path, lambda d: d.update(reference="ref.py:nope"))
    report = validate_path(path)
    assert any("has no function 'nope'" in p for p in report.problems)


def test_expressions_are_safe_arithmetic():
    assert evaluate("2*M*N*K", {"M": 2, "N": 3, "K": 4}) == 48
    assert evaluate("1/sqrt(K)", {"K": 16}) == 0.25
    assert evaluate("cdiv(N, 128)", {"N": 300}) == 3
    with pytest.raises(ExprError, match="unknown symbol 'Q'"):
        evaluate("Q + 1", {"M": 1})
    with pytest.raises(ExprError, match="only numbers"):
        evaluate("__import__('os')", {})


def test_an_expression_parsed_once_is_evaluated_afresh_with_each_binding():
    """A task op evaluates its outputs' shapes at every call, from one parse of each expression."""
    assert [evaluate("2*N + M", {"M": m, "N": 3}) for m in (1, 5)] == [7, 11]
    with pytest.raises(ExprError, match="cannot parse"):
        evaluate("N*", {"N": 1})
    with pytest.raises(ExprError, match="cannot parse"):
        evaluate("N*", {"N": 1})


def test_tasks_command_lists_the_suite():
    result = CliRunner().invoke(app, ["tasks"])
    assert result.exit_code == 0, result.output
    assert "gemm_residual_rmsnorm" in result.output and "forward" in result.output


def test_tasks_are_found_in_the_suite_then_coda_agent_tasks_then_dot_tasks(tmp_path, monkeypatch, capsys):
    extra, work = tmp_path / "extra", tmp_path / "work"
    extra.mkdir()
    (work / "tasks").mkdir(parents=True)
    write_task(extra, name="mine")
    write_task(work / "tasks", name="local")
    monkeypatch.chdir(work)
    monkeypatch.setenv("CODA_AGENT_TASKS", str(extra) + os.pathsep)  # empty entries are skipped, as in PATH
    assert find_task("mine").path == (extra / "mine.yaml").resolve()
    assert find_task("local").path == (work / "tasks" / "local.yaml").resolve()
    assert find_task("gemm_residual").path == TASK_DIR / "gemm_residual.yaml"
    code, out, err = cli(capsys, "tasks", "--format", "json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert (len(rows) == 15 and rows["mine"]["source"] == "CODA_AGENT_TASKS"
            and rows["local"]["source"] == "./tasks")
    assert rows["gemm_residual"]["source"] == "built-in" and rows["gemm_swiglu"]["shapes"]["small"]
    assert rows["gemm_residual"]["shadows"] is None and len(rows["mine"]["task_hash"]) == 12
    code, out, _ = cli(capsys, "tasks")
    assert code == 0 and "15 tasks" in out and "built-in" in out and "./tasks" in out

    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path / "nosuch"))
    code, _, err = cli(capsys, "tasks")
    assert code == 2 and err.count("\n") == 1 and "CODA_AGENT_TASKS" in err and "no such folder" in err
    code, _, err = cli(capsys, "run", "nosuch", "--model", "mock/echo")
    assert code == 2 and err.count("\n") == 1


def test_a_file_that_is_no_task_is_skipped_with_one_line_and_the_rest_listed(tmp_path, monkeypatch, capsys):
    write_task(tmp_path, name="mine")
    (tmp_path / "notes.yaml").write_text("responses: [hello]\n")  # a mock script beside the task
    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path))
    code, out, err = cli(capsys, "tasks", "--format", "json")
    assert code == 0 and "mine" in {r["name"] for r in json.loads(out)} and len(json.loads(out)) == 14
    assert err.count("\n") == 1 and "skipped:" in err and "notes.yaml" in err
    code, _, err = cli(capsys, "tasks", str(tmp_path / "notes.yaml"))
    assert code == 2 and "notes.yaml" in err


def test_a_task_is_found_by_its_name_field_when_its_file_is_named_otherwise(tmp_path, monkeypatch):
    (tmp_path / "foo.yaml").write_text(write_task(tmp_path, name="bias_gelu").read_text())
    (tmp_path / "bias_gelu.yaml").unlink()
    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path))
    assert find_task("bias_gelu").path == (tmp_path / "foo.yaml").resolve()
    assert find_task("foo").name == "bias_gelu"


def test_every_command_skips_a_yaml_file_that_is_no_task_alike(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    write_task(folder, name="mine")
    (folder / "notes.yaml").write_text("responses: [hello]\n")  # a mock script beside the task
    skipped = f"skipped: {folder / 'notes.yaml'}: not a task file (none of inputs, outputs, reference)\n"
    code, out, err = cli(capsys, "tasks", str(folder))
    assert code == 0 and err == skipped and "mine" in out
    code, out, err = cli(capsys, "validate", str(folder))
    assert code == 0 and err == skipped and "1/1 task files valid" in out
    code, out, err = cli(capsys, "run", str(folder), "--model", "mock/echo", "--rounds", "1", "--no-compile",
                         "--runs-dir", str(tmp_path / "runs"))
    assert code == 1 and err.startswith(skipped) and "1 task(s) × 1 model(s) = 1 run," in out, err


def test_a_task_is_named_by_its_name_field_everywhere_and_a_typo_gets_a_suggestion(tmp_path, monkeypatch,
                                                                                   capsys):
    (tmp_path / "foo.yaml").write_text(write_task(tmp_path, name="bias_gelu").read_text())
    (tmp_path / "bias_gelu.yaml").unlink()
    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path))
    code, out, _ = cli(capsys, "tasks", "--format", "json")
    assert code == 0 and "bias_gelu" in {r["name"] for r in json.loads(out)}
    code, _, err = cli(capsys, "run", "nosuch", "--model", "mock/echo")
    assert code == 2 and err.count("\n") == 1 and "bias_gelu" in err and "foo" not in err.split("known:")[1]
    code, _, err = cli(capsys, "run", "gemm_swigl", "--model", "mock/echo")
    assert code == 2 and err.count("\n") == 1 and "did you mean gemm_swiglu? known:" in err, err
    code, _, err = cli(capsys, "verify", "bias_gelo")
    assert code == 2 and "did you mean bias_gelu?" in err, err


def test_tasks_and_validate_take_task_names_as_run_and_verify_do(capsys):
    code, out, _ = cli(capsys, "tasks", "gemm_rope", "--format", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["gemm_rope"]
    code, out, _ = cli(capsys, "tasks", "gemm_rope")
    assert code == 0 and "1 task" in out and "1 tasks" not in out
    code, out, _ = cli(capsys, "validate", "gemm_swiglu")
    assert code == 0 and "1/1 task files valid" in out
    code, _, err = cli(capsys, "validate", "nosuch")
    assert code == 2 and err.count("\n") == 1 and "no task named 'nosuch'" in err


def test_tasks_refuses_an_unknown_shape_set_and_format(capsys, tmp_path):
    code, _, err = cli(capsys, "tasks", "--shapes", "nosuch")
    assert (code == 2 and err.count("\n") == 1 and "no task has a shape set 'nosuch'" in err
            and "bench, small" in err)
    code, _, err = cli(capsys, "tasks", "--format", "xml")
    assert code == 2 and "table or json" in err
    code, _, err = cli(capsys, "tasks", str(tmp_path))
    assert code == 2 and f"no task files (*.yaml) in {tmp_path}" in err
    code, _, err = cli(capsys, "validate", str(tmp_path))
    assert code == 2 and err == f"error: no task files (*.yaml) in {tmp_path}\n"


def test_version_answers_without_importing_torch():
    probe = ("import sys; from coda_agent.launch import main; sys.argv = ['coda-agent', '--version']; "
             "main(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    from coda_agent import __version__

    assert out.split("\n")[:2] == [f"coda-agent {__version__}", "False"]


@pytest.mark.parametrize("command",
                         ["", "run", "verify", "tasks", "validate", "bench", "leaderboard", "show", "view",
                          "index rebuild"])
def test_help_shows_no_python_types(command):
    result = CliRunner().invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0 and "Usage" in result.output
    assert "<bool>" not in result.output and "list[" not in result.output


def test_version_flag():
    from coda_agent import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"coda-agent {__version__}"


def test_a_task_file_that_does_not_load_is_an_error_for_tasks_as_for_run(tmp_path, capsys):
    """``tasks DIR`` lists what loads and names each file that does not, one error line each, exit 2: the exit
    ``run DIR`` gives on the same folder (a YAML file that is no task at all is skipped by both)."""
    write_task(tmp_path, name="good")
    broken = write_task(tmp_path, lambda d: d.update(family="sideways"), name="broken")
    code, out, err = cli(capsys, "tasks", str(tmp_path))
    assert code == 2 and "good" in out, out + err
    assert err.startswith(f"error: {broken}: invalid task file: line ") and "family: must be" in err
    assert err.count("\n") == 1
    code, out, err = cli(capsys, "tasks", str(tmp_path), "--format", "json")
    assert code == 2 and [r["name"] for r in json.loads(out)] == ["good"]
    code, _, err = cli(capsys, "run", str(tmp_path), "--model", "mock/echo", "--runs-dir",
                       str(tmp_path / "runs"))
    assert code == 2 and str(broken) in err


def test_an_unknown_task_names_every_place_it_was_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CODA_AGENT_TASKS", raising=False)
    code, _, err = cli(capsys, "run", "nosuch", "--model", "mock/echo")
    assert code == 2 and err.startswith(
        f"error: no task named 'nosuch' in the built-in suite {TASK_DIR}, $CODA_AGENT_TASKS (not set), "
        "./tasks (no such folder here) (known: ")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "more").mkdir()
    monkeypatch.setenv("CODA_AGENT_TASKS", str(tmp_path / "more"))
    code, _, err = cli(capsys, "verify", "nosuch")
    assert (code == 2
            and f"in the built-in suite {TASK_DIR}, $CODA_AGENT_TASKS {tmp_path / 'more'}, ./tasks (known: "
            in err)


def test_a_task_is_its_content_its_fields_and_reference_not_its_human_kernel(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    copy = load_task(write_task(tmp_path / "a"))
    before = copy.content_hash
    assert len(before) == 12
    (tmp_path / "b" / "human.py").write_text("# one author's answer\n")
    with_human = write_task(tmp_path / "b", edit=lambda d: d.update(human="human.py"))
    with_human.write_text("# a comment, the same task\n" + with_human.read_text())
    assert load_task(with_human).content_hash == before  # a human kernel is an answer, not the operator
    assert (load_task(write_task(tmp_path / "b", edit=lambda d: d.update(launch_budget=9))).content_hash
            != before)
    (tmp_path / "a" / "ref.py").write_text((tmp_path / "a" / "ref.py").read_text() + "\n# edited\n")
    assert copy.content_hash != before  # the reference defines the operator


def test_a_local_copy_of_a_built_in_is_listed_and_its_name_refused_while_they_differ(tmp_path, monkeypatch,
                                                                                     capsys):
    """An edited copy of a built-in task in ./tasks is listed beside it, and ``run NAME`` says that the name
    stands for two tasks (both files named) instead of silently taking one; run by its path, either is used.
    An unedited copy is the same task: the name finds it."""
    local = tmp_path / "tasks"
    local.mkdir()
    builtin = TASK_DIR / "gemm_residual.yaml"
    for f in (builtin, builtin.with_suffix(".py")):
        (local / f.name).write_text(f.read_text())
    (local / "gemm_residual.yaml").write_text(
        builtin.read_text().replace("human: human/gemm_residual.py\n", ""))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CODA_AGENT_TASKS", raising=False)
    assert find_task("gemm_residual").path == builtin  # the human kernel is not the operator: the same task
    (local / "gemm_residual.py").write_text(builtin.with_suffix(".py").read_text() + "\n# edited\n")
    with pytest.raises(TaskError) as refused:
        find_task("gemm_residual")
    message = str(refused.value)
    assert ("\n" not in message and str(builtin) in message
            and str((local / "gemm_residual.yaml").resolve()) in message)
    assert "pass the path of the one you mean" in message
    assert find_task("tasks/gemm_residual.yaml").path == (local / "gemm_residual.yaml").resolve()

    code, out, err = cli(capsys, "tasks", "--format", "json")
    rows = [r for r in json.loads(out) if r["name"] == "gemm_residual"]
    assert code == 0 and [r["source"] for r in rows] == ["built-in", "./tasks"]
    assert rows[0]["task_hash"] != rows[1]["task_hash"] and "run each by its path" in rows[1]["shadows"]
    code, out, _ = cli(capsys, "tasks")
    assert code == 0 and "run each by its path" in " ".join(out.split())
    code, _, err = cli(capsys, "run", "gemm_residual", "--model", "mock/echo")
    assert code == 2 and "stands for 2 different tasks" in err and err.count("\n") == 1


def test_a_missing_human_kernel_says_the_field_is_optional_in_every_command(tmp_path, capsys):
    path = write_task(tmp_path, edit=lambda d: d.update(human="human/t.py"))
    with pytest.raises(TaskError,
                       match=r"line \d+: human: human/t.py not found next to the task \(the field is "
                             r"optional: fix"):
        load_task(path)
    code, _, listed = cli(capsys, "tasks", str(path))
    assert code == 2 and "human/t.py not found" in listed and "drop the line" in listed
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == 1 and "human/t.py not found" in out and "drop the line" in out


def test_a_python_file_given_as_a_task_names_the_task_file(tmp_path, capsys):
    path = write_task(tmp_path)
    with pytest.raises(TaskError,
                       match=r"ref\.py: the reference of a task, not a task file; pass the task: .*t\.yaml"):
        find_task(str(tmp_path / "ref.py"))
    human = TASK_DIR / "human" / "gemm_residual.py"
    with pytest.raises(TaskError,
                       match=r"the human kernel of a task, not a task file; pass the task: "
                             r".*gemm_residual\.yaml"):
        load_task(human)
    (tmp_path / "other.py").write_text("x = 1\n")
    code, out, _ = cli(capsys, "validate", str(tmp_path / "other.py"))
    assert code == 1 and "other.py: a Python file, not a task file; pass the task's YAML file" in out
    code, _, err = cli(capsys, "tasks", str(path.with_name("ref.py")))
    assert code == 2 and "the reference of a task, not a task file; pass the task:" in err
