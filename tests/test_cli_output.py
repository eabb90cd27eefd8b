"""Output that fits its medium (issue 41): in a file or pipe every command's tables are at most ``$COLUMNS``
wide, or :data:`~coda_agent.cli.core.PIPE_WIDTH` without it, and no name, shape or spec is cut in two; a pipe
whose reader leaves early ends every command alike."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import unicodedata

import pytest
from rich.text import Text

from coda_agent.cli.core import PIPE_WIDTH, terminal
from coda_agent.stdout import READER_GONE
from coda_agent.tasks import find_task

from .conftest import cli
from .records_factory import make_run
from .test_layering import PACKAGE


def _widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.mark.parametrize("columns", [None, "100"])
def test_tables_in_a_pipe_fit_the_width_and_keep_tokens_whole(capsys, monkeypatch, tmp_path, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns or PIPE_WIDTH)
    code, out, err = cli(capsys, "tasks")
    assert code == 0, err
    assert _widest(out) <= width
    swiglu = find_task("gemm_swiglu")
    # a shape's name and dims: on one line when it fits, each token whole
    for point in swiglu.shapes["bench"]:
        line = f"{point.name}: " + " ".join(f"{k}={v}" for k, v in point.dims.items())
        assert line in out if columns is None else all(token in out for token in line.split())
    # at 100 its longest spec and words need a little more: no token cut
    code, out, err = cli(capsys, "providers")
    assert code == 0 and (_widest(out) <= width or columns == "100") and "…" not in out
    code, specs, _ = cli(capsys, "providers", "--format", "json")
    assert all(row["spec"] in out for row in json.loads(specs))  # the --model column never wraps
    assert all(word in out for row in json.loads(specs) for word in row["needs"].split())
    code, out, _ = cli(capsys, "validate", "gemm_swiglu")
    assert code == 0 and "gemm_swiglu.yaml" in out.splitlines()[0]


def test_a_table_too_wide_for_its_width_loses_its_least_useful_columns_and_cuts_no_token():
    """A narrow terminal folded the leaderboard's names into slivers ('tas / k') and ended numbers in an
    ellipsis."""
    import io

    from rich.console import Console
    from rich.table import Table

    from coda_agent.cli.core import print_table

    def table() -> Table:
        t = Table()
        t.add_column("task", no_wrap=True)
        t.add_column("why")
        for col in ("cost", "extra"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_row("gemm_rmsnorm_cross_entropy v2", "needs CODA_AGENT_ALLOW_UNSANDBOXED=1 to run", "$0.0123",
                  "12345678")
        return t

    out = io.StringIO()
    print_table(table(), ("extra", "cost"), Console(file=out, width=80))
    text = out.getvalue()
    assert ("gemm_rmsnorm_cross_entropy v2" in text and "CODA_AGENT_ALLOW_UNSANDBOXED=1" in text
            and "…" not in text)
    assert "12345678" not in text and "$0.0123" in text and "80 columns leave out extra;" in text
    assert max(len(line.rstrip()) for line in text.splitlines()[:-1]) <= 80
    out = io.StringIO()
    # nothing may go: wider than asked, every token whole
    print_table(table(), (), Console(file=out, width=30))
    assert ("gemm_rmsnorm_cross_entropy v2" in out.getvalue() and "12345678" in out.getvalue()
            and "…" not in out.getvalue())


def test_the_leaderboard_at_80_columns_keeps_its_names_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("CODA_AGENT_BENCH_DIR", raising=False)  # the committed bench results: long task names
    code, out, err = cli(capsys, "leaderboard")
    assert code == 0, err
    assert "…" not in out and "gemm_rmsnorm_cross_entropy_bwd v" in out and "columns leave out" in out


def test_a_columns_value_that_is_no_width_is_ignored(monkeypatch):
    from coda_agent.cli.core import pipe_width

    monkeypatch.setenv("COLUMNS", "wide")
    assert pipe_width() == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "132")
    assert pipe_width() == 132


@pytest.mark.parametrize(("args", "unbuffered"), [
    (["--version"], False), (["api-doc"], True), (["tasks"], False),
    (["show", "RUN", "--format", "json"], True),
])
def test_a_pipe_closed_before_the_output_ends_the_command_quietly(tmp_path, args, unbuffered):
    """``coda-agent ... | head -1``: every command ends alike when its reader has gone (written to or not,
    buffered or not): exit 141, nothing on stderr. A command that wrote nothing to stdout keeps its own
    status."""
    run = make_run(tmp_path / "runs")
    env = {**os.environ, "CODA_AGENT_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "coda_agent",
                             *[run.name if a == "RUN" else a for a in args]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader leaves before the command has written anything
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (READER_GONE, "")


def test_a_closed_pipe_nothing_was_written_to_leaves_the_exit_status_alone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "coda_agent", "verify", "nosuch"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.decode().startswith("error: no task named 'nosuch'")


def test_lines_in_a_pipe_keep_paths_run_ids_and_reasons_whole(capsys, tmp_path):
    """Only tables wrap (their cells, at spaces); every other line is printed whole, however long:
    ``verify``'s candidate path and verdict reason, ``run``'s record, ``show``'s run id."""
    folder = tmp_path / ("a_folder_with_a_long_name_" * 4)
    folder.mkdir()
    candidate = folder / "candidate_kernel.py"
    human = find_task("gemm_residual_rmsnorm").human_file
    candidate.write_text(human.read_text().replace(", eps)}", ", eps * 1e6)}"))  # rstd far off
    code, out, _ = cli(capsys, "verify", "gemm_residual_rmsnorm", str(candidate))
    lines = out.splitlines()
    assert (code == 1
            and lines[0] == f"verifying {candidate} on gemm_residual_rmsnorm (torch, shapes: small)"), out
    (reason,) = [line for line in lines if line.startswith("output 'rstd': max error")]
    assert len(reason) > 80 and reason.endswith("+ floor)"), out

    runs = folder / "runs"
    code, out, _ = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", "mock/gemm_residual_three_attempts",
                       "--rounds", "1", "--no-compile", "--runs-dir", str(runs))
    (run,) = runs.iterdir()
    assert code == 1 and f"  record: {run}" in out.splitlines(), out
    code, out, _ = cli(capsys, "show", str(run))
    assert code == 0 and out.splitlines()[0] == f"{run.name}  (run id {run.name})", out


def test_verify_says_what_a_call_launches_against_the_budget(capsys):
    """A task author sets a budget from it (a manual-seat pass found the count only in the record's JSON)."""
    code, out, _ = cli(capsys, "verify", "gemm_residual_rmsnorm")
    assert code == 0 and ("  launches: 4 kernels at shape tiny (the CPU's estimate; host ops: "
                          "aten::add.Tensor, aten::rsqrt_); 4 at llama3-8b-down, 4 at llama3-1b-down, 4 at "
                          "coda-h2048, 4 at coda-h4096, 4 at ragged on meta tensors, budget 4") in out, out


def test_an_escape_sequence_from_a_task_or_its_reference_is_written_out_by_every_command(capsys, tmp_path):
    """A shape's name or a reference's exception holding ``\\x1b[31m``: every command shows it as text
    (:func:`coda_agent.untrusted.shown`), none lets the terminal act on it or drops it."""
    import yaml

    example = find_task("gemm_residual_rmsnorm")
    data = yaml.safe_load(example.path.read_text())
    data.update(name="esc", reference="esc.py:reference", human=None)
    data["shapes"]["small"][0]["name"] = "tiny\x1bRED"
    (tmp_path / "esc.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "esc.py").write_text(example.reference_file.read_text())
    data.update(name="raises", reference="raises.py:reference",
                shapes=yaml.safe_load(example.path.read_text())["shapes"])
    (tmp_path / "raises.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "raises.py").write_text("def reference(**kw):\n    raise ValueError('boom \\x1b[31mRED')\n")
    runs = ("--runs-dir", str(tmp_path / "runs"))
    for args, shows in [
        (("tasks", str(tmp_path / "esc.yaml"), "--shapes", "small"), "tiny\\x1bRED"),
        (("validate", str(tmp_path / "raises.yaml")), "boom \\x1b[31mRED"),
        (("run", str(tmp_path / "raises.yaml"), "--model", "mock/echo", *runs), "boom \\x1b[31mRED"),
        (("verify", str(tmp_path / "esc.yaml"), str(example.human_file)), "tiny\\x1bRED/0"),
    ]:
        _, out, err = cli(capsys, *args)
        assert shows in out + err and "\x1b" not in out + err, (args, out + err)


#: What a terminal would act on, in a run folder's, a task's and a model's name: a colour, a C1 CSI, a bell, a
#: right-to-left override, DEL (a folder's name cannot hold NUL or "/").
CONTROLS = "\x1b[31m\x9b2J\x07\u202e\x7f"


def raw_controls(text: str) -> set[str]:
    """The control and bidi characters left raw in ``text`` (newline and tab are text)."""
    return {
        c for c in text if (unicodedata.category(c) == "Cc" and c not in "\n\t") or "\u202a" <= c <= "\u202e"}


def test_names_with_control_characters_are_written_out_by_every_command_that_shows_runs(capsys, tmp_path):
    runs = tmp_path / "runs"
    evil = make_run(runs, task=f"gemm_rmsnorm{CONTROLS}", model=f"evil/{CONTROLS}",
                    outcomes=("wrong_output", "passed"),
                    times={"llama3-8b": 90.0})  # the task's name is in the folder's too
    renamed = make_run(runs, model=f"evil/{CONTROLS}", outcomes=("passed",), times={"llama3-8b": 95.0},
                       run_id="ren")
    renamed = renamed.rename(renamed.with_name(renamed.name + CONTROLS))
    where = ("--runs-dir", str(runs), "--bench-dir", str(tmp_path / "bench"))
    for args in [("leaderboard", *where), ("leaderboard", "-f", "md", *where),
                 ("leaderboard", "-f", "csv", *where), ("leaderboard", "-f", "json", *where),
                 ("leaderboard", "--task", f"gemm_rmsnorm{CONTROLS}", *where), ("index", "rebuild", *where),
                 ("view", "--export", str(tmp_path / f"site{CONTROLS}"), *where)]:
        code, out, err = cli(capsys, *args)
        assert code == 0 and not raw_controls(out + err), (args, out + err)
    for args in [("show", evil.name), ("show", renamed.name), ("show", renamed.name, "-f", "json"),
                 ("show", evil.name, "-a", "1"), ("show", evil.name, "-a", "1", "-f", "json"),
                 ("diff", evil.name, renamed.name), ("show", f"nothing{CONTROLS}")]:
        code, out, err = cli(capsys, *args, "--runs-dir", str(runs))
        assert (code == (2 if args[1].startswith("nothing") else 0)
                and not raw_controls(out + err)), (args, out + err)
    _, out, _ = cli(capsys, "show", renamed.name, "--runs-dir", str(runs))
    assert "ren\\x1b[31m\\x9b2J\\x07\\u202e\\x7f" in out and "evil/\\x1b[31m" in out  # visible, not dropped


def test_a_console_writes_out_the_controls_of_what_it_prints_and_keeps_its_own_colours():
    """The hook of :func:`coda_agent.cli.core.terminal` is the last word on whatever a command prints, even
    text no one escaped; rich's colour codes are not text and pass (rich drops a bell from text itself)."""
    buffer = io.StringIO()
    terminal(file=buffer, force_terminal=True,
             color_system="standard").print(Text(f"run{CONTROLS}", style="bold"))
    assert buffer.getvalue() == "\x1b[1mrun\\x1b[31m\\x9b2J\\u202e\\x7f\x1b[0m\n"


def test_every_console_is_made_by_terminal():
    """A command that made its own rich console would print a run folder's name raw again."""
    made = [f"{p.relative_to(PACKAGE)}:{node.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "Console"]
    assert len(made) == 1 and made[0].startswith("cli/core.py:"), made
