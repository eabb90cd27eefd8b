"""``coda-agent verify``: every input mistake is one line and exit 2, never a traceback or a false PASSED."""

from __future__ import annotations

import pytest

from coda_agent.cli.inputs import default_timeout
from coda_agent.tasks import find_task
from coda_agent.verifier import Plan

from .conftest import cli

K0 = find_task("gemm_residual_rmsnorm")


def one_line_error(capsys, *args: str) -> str:
    code, out, err = cli(capsys, "verify", *args)
    assert code == 2, out + err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("seeds", ["0", "-1"])
def test_zero_or_negative_seeds_are_refused_not_passed(capsys, seeds):
    assert "must be at least 1" in one_line_error(capsys, "gemm_residual_rmsnorm", "--seeds", seeds)


def test_real_sizes_on_the_cpu_emulator_are_refused(capsys):
    err = one_line_error(capsys, "gemm_residual_rmsnorm", "--shapes", "bench")
    assert "CPU emulator runs the 'small' shapes only" in err and "--backend quack" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the machine has a GPU")
def test_the_real_kernels_without_a_gpu_are_one_line(capsys):
    assert "no CUDA GPU on this machine" in one_line_error(capsys, "gemm_swiglu", "--backend", "quack")


def test_an_unknown_shape_set_is_named(capsys):
    assert ("has no shape set 'nosuch' (has: small, bench)"
            in one_line_error(capsys, "gemm_residual_rmsnorm", "--shapes", "nosuch"))


def test_unusable_candidate_files_are_one_line(capsys, tmp_path):
    binary = tmp_path / "kernel.py"
    binary.write_bytes(b"\xff\xfe\x00\x81 not python")
    assert "not a text file" in one_line_error(capsys, "gemm_residual_rmsnorm", str(binary))
    assert "a folder, not a candidate file" in one_line_error(capsys, "gemm_residual_rmsnorm", str(tmp_path))
    assert ("no such candidate file"
            in one_line_error(capsys, "gemm_residual_rmsnorm", str(tmp_path / "nope.py")))
    assert "must be a positive number" in one_line_error(capsys, "gemm_residual_rmsnorm", "--timeout", "0")


def test_timeout_option_stops_a_looping_candidate(capsys, tmp_path):
    looping = tmp_path / "loop.py"
    looping.write_text(
        K0.human_file.read_text().replace("    out = gemm(", "    while True:\n        pass\n    out = gemm(",
                                          1))
    code, out, _ = cli(capsys, "verify", "gemm_residual_rmsnorm", str(looping), "--timeout", "6")
    assert code == 1 and "TIMEOUT" in out and "did not finish within 6 s" in out


def test_default_time_limit_follows_the_stages_and_shapes():
    assert default_timeout(K0, Plan()) == 120
    # as the run command's help says
    assert default_timeout(K0, Plan(stages=["correctness", "compile"])) == 300
    timed = Plan(stages=["gpu_correctness", "profile"], shape_set="bench")
    assert default_timeout(K0, timed) > 600  # a QuACK build per bench shape


def test_compile_only_says_it_compiles_not_that_it_passed(capsys, monkeypatch):
    """``--compile-only`` builds the kernels and checks no output: its verdict says so (exit 0 all the
    same)."""
    from coda_agent.cli import verify_cmd
    from coda_agent.verifier.verdict import StageResult, Verdict

    def built(task, source, plan):
        assert plan.stages == ["compile"]
        return Verdict(task=task.name, task_version=task.version, backend="quack-compile", outcome="passed",
                       stages=[StageResult(stage="static", outcome="passed", seconds=0.0),
                               StageResult(stage="compile", outcome="passed", seconds=9.0)])

    monkeypatch.setattr(verify_cmd, "verify", built)
    code, out, err = cli(capsys, "verify", "gemm_residual_rmsnorm", "--compile-only")
    assert code == 0, out + err
    assert (out.splitlines()[-1]
            == "COMPILES gemm_residual_rmsnorm v1 (sm_90a build only; correctness not checked)")
    assert "PASSED" not in out
    assert "cost estimate" not in out  # no estimate recorded, none printed


def test_compile_only_prints_the_cost_estimate_and_what_to_cut_first(capsys, monkeypatch):
    """The sm_90a build prices the calls at the bench shapes; verify prints that table and its largest
    avoidable cost (a manual-seat author found it only in --json: a kernel that ran its GEMM twice passed
    without a word), not the calibration's paragraph."""
    from coda_agent.cli import verify_cmd
    from coda_agent.verifier.verdict import StageResult, Verdict

    summary = ("| shape | estimate µs |\n|---|---|\n| llama3-1b-down | 712.5 |\n\n"
               "Largest avoidable cost (at llama3-1b-down): GEMM work above the listed GEMMs (2.00x).\n"
               "How far to trust it: a floor.")

    def built(task, source, plan):
        return Verdict(task=task.name, task_version=task.version, backend="quack-compile", outcome="passed",
                       stages=[StageResult(stage="static", outcome="passed", seconds=0.0),
                               StageResult(stage="compile", outcome="passed", seconds=9.0,
                                           details={"cost_summary": summary,
                                                    "cost": [{"sol_us": 356.25, "total_us": 712.5}]})])

    monkeypatch.setattr(verify_cmd, "verify", built)
    code, out, err = cli(capsys, "verify", "gemm_residual", "--compile-only")
    assert code == 0, out + err
    assert "  | llama3-1b-down | 712.5 |" in out.splitlines()
    # the fraction a CPU run's target reads (a manual seat found it only in the run's live log)
    assert "  By this estimate: 50% of the speed of light (geometric mean over the bench shapes" in out
    assert ("  Largest avoidable cost (at llama3-1b-down): GEMM work above the listed GEMMs (2.00x)."
            in out.splitlines())
    assert "How far to trust it" not in out
    assert out.splitlines()[-1].startswith("COMPILES gemm_residual v1")


def test_a_refused_host_name_prints_the_allowlist_the_refusal_names(capsys, tmp_path):
    """The static refusal of a host name ends "...: the allowlist"; verify printed no allowlist (only the
    agent's feedback had it, from a manual-seat pass). A refusal for anything else prints none."""
    body = ("import torch\nfrom coda_agent.primitives import epilogue, gemm\n\n\n@epilogue()\n"
            "def e(acc, c):\n    return {'D': acc + c}\n\n\ndef forward(x, w, residual):\n"
            "    return {'out': HOST(gemm(e, x, w.t(), C=residual)['D'])}\n")
    host = tmp_path / "host.py"
    host.write_text(body.replace("HOST", "torch.fft"))
    code, out, _ = cli(capsys, "verify", "gemm_residual", str(host))
    assert code == 1 and "torch.fft is not allowed" in out
    assert "The static check's allowlist in full" in out and "`torch.take_along_dim`" in out
    syntax = tmp_path / "syntax.py"
    syntax.write_text(body.replace("def forward(x, w, residual):", "def forward(x, w, residual)"))
    code, out, _ = cli(capsys, "verify", "gemm_residual", str(syntax))
    assert code == 1 and "syntax error" in out and "allowlist in full" not in out
