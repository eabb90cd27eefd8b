"""Leaderboard logic on synthetic records, its text formats, and the store commands (leaderboard, show,
diff)."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from datetime import timedelta

import pytest

from coda_agent.cli import main
from coda_agent.store import leaderboard as lb
from coda_agent.store import leaderboard_text as lbt
from coda_agent.store.index import Index
from coda_agent.tasks.loader import BUILTIN_TASK_DIR

from .records_factory import H200, REASONS, T0, bench_row, make_bench, make_run

B200 = "NVIDIA B200"


def board(tmp_path, **kw) -> lb.Leaderboard:
    with Index.open(tmp_path / "runs", tmp_path / "bench") as ix:
        ix.refresh()
        return lb.build(ix, **kw)


def entry(group: lb.Group, author: str) -> lb.Entry:
    return next(e for e in group.entries if e.author == author)


def group(groups: list[lb.Group], version: int, device: str, shape: str | None) -> lb.Group:
    return next(g for g in groups if (g.task_version, g.device, g.shape) == (version, device, shape))


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["coda-agent", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())


def test_best_correct_kernel_of_each_author_with_what_it_took(tmp_path):
    runs = tmp_path / "runs"
    make_bench(tmp_path / "bench", [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    make_run(runs, model="anthropic/claude", outcomes=("passed",), times={"llama3-8b": 110.0}, cost=0.02)
    faster = make_run(runs, model="anthropic/claude", outcomes=("wrong_output", "compile_error", "passed"),
                      times={"llama3-8b": 104.0}, cost=0.10, created=T0 + timedelta(hours=1))
    make_run(runs, model="openai/gpt-5", outcomes=("wrong_output", "wrong_output"),
             created=T0 + timedelta(hours=2))

    b = board(tmp_path)
    assert b.apart == []
    timed = group(b.groups, 1, H200, "llama3-8b")
    assert [e.author for e in timed.entries] == [
        "human", "anthropic/claude", "eager", "torch.compile", "cuBLAS (GEMM alone)", "SoL"]
    claude = entry(timed, "anthropic/claude")
    assert (claude.time_us, claude.run, claude.attempt) == (104.0, faster.name, 3)
    assert ((claude.rounds, claude.attempts, claude.tokens, claude.first_correct_attempt)
            == (3, 3, 3 * 3800, 3))
    assert claude.cost_usd == pytest.approx(0.30) and claude.seconds_to_first_correct == pytest.approx(80.0)
    assert (claude.runs, claude.correct_runs) == (2, 2)
    assert claude.vs_eager == pytest.approx(200 / 104) and claude.vs_compiled == pytest.approx(150 / 104)
    assert claude.vs_human == pytest.approx(100 / 104) and claude.pct_sol == pytest.approx(100 * 80 / 104)
    human = entry(timed, "human")
    assert ((human.vs_human, human.correct, human.run, human.source)
            == (1.0, True, None, str(tmp_path / "bench" / "h200-20260501-120000.json")))
    assert entry(timed, "eager").vs_eager == 1.0 and entry(timed, "SoL").pct_sol == 100.0

    failed = group(b.groups, 1, H200, None)  # same task version and device, nothing timed
    gpt = entry(failed, "openai/gpt-5")
    assert ((gpt.correct, gpt.time_us, gpt.vs_human, gpt.attempts, gpt.runs, gpt.correct_runs)
            == (False, None, None, 2, 1, 0))
    assert gpt.note == "no correct kernel (budget_exhausted)"


def test_rows_compare_only_within_version_and_device_the_rest_is_apart(tmp_path):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)], name="h200.json")
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 70.0, eager=140.0)], device=B200,
               created=T0 + timedelta(days=1), name="b200.json")
    make_run(runs, model="anthropic/claude", outcomes=("passed",), times={"llama3-8b": 104.0})
    make_run(runs, model="anthropic/claude", outcomes=("passed",), times={"llama3-8b": 75.0}, device=B200,
             created=T0 + timedelta(hours=1))
    make_run(runs, model="openai/gpt-5", version=2, outcomes=("passed",), times={"llama3-8b": 90.0},
             created=T0 + timedelta(hours=2))

    b = board(tmp_path)
    # the latest task version is the main table; v1 (both devices) is apart
    assert [(g.task_version, g.device, g.shape) for g in b.groups] == [(2, H200, "llama3-8b")]
    v2 = b.groups[0]
    assert [e.author for e in v2.entries] == ["openai/gpt-5"]
    # v1's numbers are never borrowed
    assert v2.entries[0].vs_human is None and v2.entries[0].vs_eager is None
    assert {(g.task_version, g.device) for g in b.apart} == {(1, H200), (1, B200)}
    on_b200 = group(b.apart, 1, B200, "llama3-8b")
    assert entry(on_b200, "anthropic/claude").vs_human == pytest.approx(70 / 75)
    assert entry(on_b200, "anthropic/claude").vs_eager == pytest.approx(140 / 75)
    on_h200 = group(b.apart, 1, H200, "llama3-8b")
    assert entry(on_h200, "anthropic/claude").vs_human == pytest.approx(100 / 104)

    only_b200 = board(tmp_path, device="nvidia  b200")  # spacing and case do not matter
    assert [(g.task_version, g.device) for g in only_b200.groups] == [(1, B200)] and only_b200.apart == []


def test_main_device_prefers_bench_results_then_recency(tmp_path):
    make_bench(tmp_path / "bench", [bench_row("gemm_swiglu", "s", 100.0)])
    make_run(tmp_path / "runs", task="gemm_swiglu", outcomes=("passed",), times={"s": 99.0})
    make_run(tmp_path / "runs", task="gemm_swiglu", outcomes=("passed",), device=B200, times={"s": 50.0},
             created=T0 + timedelta(days=3))
    b = board(tmp_path)
    assert {g.device for g in b.groups} == {H200} and {g.device for g in b.apart} == {B200}
    make_run(tmp_path / "runs", task="gemm_swiglu", model="x/y", outcomes=("passed",), device="cpu",
             created=T0 + timedelta(days=4))
    assert {g.device for g in board(tmp_path, task="gemm_swiglu").groups} == {H200}


def test_cpu_only_runs_show_correctness_and_cost_never_times(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, model="mock/good", device="cpu", outcomes=("static_rejected", "passed"), cost=0.0)
    make_run(runs, model="anthropic/claude", device="cpu", outcomes=("wrong_output", "passed", "passed"),
             cost=0.04)
    make_run(runs, model="openai/gpt-5", device="cpu", outcomes=("wrong_output",),
             created=T0 + timedelta(hours=1))
    b = board(tmp_path)
    assert len(b.groups) == 1
    g = b.groups[0]
    assert (g.device, g.shape, g.timed) == ("cpu", None, False)
    assert [(e.author, e.correct) for e in g.entries] == [
        ("anthropic/claude", True), ("mock/good", True), ("openai/gpt-5", False)]
    assert all(
        e.time_us is None and e.vs_eager is None and e.vs_human is None and e.pct_sol is None
        for e in g.entries)
    assert (entry(g, "mock/good").cost_usd == 0.0
            and entry(g, "anthropic/claude").cost_usd == pytest.approx(0.12))
    md = lbt.to_markdown(b)
    assert "untimed (correctness and cost)" in md and "time µs" not in md and "×eager" not in md
    assert "| mock/good | yes | 1/1 | 2 | 2 | 7.6k | $0 | 50.0s (#2) |" in md
    rows = list(csv.DictReader(io.StringIO(lbt.to_csv(b))))
    assert {r["time_us"] for r in rows} == {""} and {r["device"] for r in rows} == {"cpu"}


def test_session_timings_stand_in_when_no_bench_covers_the_shape(tmp_path):
    make_run(tmp_path / "runs", model="openai/gpt-5", outcomes=("passed",), times={"llama3-8b": 90.0},
             session={"llama3-8b": {"human_us": 99.0, "eager": 180.0, "compiled": 120.0, "cublas": 85.0,
                                    "sol_us": 60.0}})
    g = board(tmp_path).groups[0]
    assert ([e.author for e in g.entries]
            == ["openai/gpt-5", "human", "eager", "torch.compile", "cuBLAS (GEMM alone)", "SoL"])
    gpt = entry(g, "openai/gpt-5")
    assert gpt.vs_human == pytest.approx(99 / 90) and gpt.vs_eager == pytest.approx(2.0)
    assert gpt.pct_sol == pytest.approx(100 * 60 / 90)
    assert "timed in the session of run" in entry(g, "human").note


def test_incorrect_human_kernel_and_a_human_run_record(tmp_path):
    make_bench(tmp_path / "bench", [bench_row("t", "s", 100.0, correct=False)])
    g = board(tmp_path).groups[0]
    human = entry(g, "human")
    assert (human.correct, human.time_us, human.note) == (False, None, "output y outside tolerance")
    assert entry(g, "eager").vs_human is None  # no correct human: no "vs human" for anyone
    make_run(tmp_path / "runs", task="t", model="human", outcomes=("passed",), times={"s": 95.0})
    human = entry(board(tmp_path).groups[0], "human")
    assert (human.correct, human.time_us, human.runs) == (True, 95.0, 1)


def test_a_newer_bench_that_did_not_time_a_row_or_ran_out_of_memory_leaves_the_older_finding(tmp_path):
    make_bench(tmp_path / "bench",
               [bench_row("t", "a", 100.0), bench_row("t", "b", 100.0), bench_row("t", "c", 100.0)])
    oom, wrong = bench_row("t", "b", None, correct=False), bench_row("t", "c", None, correct=False)
    oom.verdict_reason = ("forward() raised: OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 "
                          "MiB.")
    pending = bench_row("t", "a",
                        None).model_copy(
                            update={"pending": True, "cublas": None, "eager": None, "compiled": None})
    make_bench(tmp_path / "bench", [pending, oom, wrong], created=T0 + timedelta(hours=1))
    groups = {g.shape: g for g in board(tmp_path).groups}
    assert ((entry(groups["a"], "human").time_us, entry(groups["a"], "cuBLAS (GEMM alone)").time_us)
            == (100.0, 95.0))
    assert (entry(groups["b"], "human").correct, entry(groups["b"], "human").time_us) == (True, 100.0)
    assert not entry(groups["c"], "human").correct  # a failure of the kernel's own is the newer finding
    make_bench(tmp_path / "bench", [oom.model_copy(update={"shape": "d"})], created=T0 + timedelta(hours=2))
    alone = entry({g.shape: g for g in board(tmp_path).groups}["d"], "human")
    # nothing older: shown, but not as the kernel's failure
    assert (alone.correct, alone.note) == (None, lb.NOT_JUDGED)


def test_json_and_csv_carry_every_group_and_problem(tmp_path):
    make_bench(tmp_path / "bench", [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    make_run(tmp_path / "runs", outcomes=("passed",), times={"llama3-8b": 104.0})
    make_run(tmp_path / "runs", version=2, outcomes=("passed",), device="cpu",
             created=T0 + timedelta(hours=1))
    (tmp_path / "runs" / "bad").mkdir()
    b = board(tmp_path)
    data = json.loads(lbt.to_json(b))
    assert [(g["task_version"], g["device"], g["timed"]) for g in data["groups"]] == [(2, "cpu", False)]
    assert [(g["task_version"], g["shape"]) for g in data["apart"]] == [(1, "llama3-8b")]
    assert data["problems"][0]["file"].endswith("runs/bad/header.json")
    rows = list(csv.DictReader(io.StringIO(lbt.to_csv(b))))
    assert ([(r["section"], r["author"]) for r in rows][:2]
            == [("main", "anthropic/claude-sonnet-4-5"), ("apart", "human")])
    assert len(rows) == 1 + 2 + 4


# ------------------------------------------------------------------------------------------------ CLI


@pytest.fixture
def cli_store(tmp_path, monkeypatch):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(runs))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(bench))
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    a = make_run(runs, model="anthropic/claude", outcomes=("compile_error", "wrong_output", "passed"),
                 times={"llama3-8b": 104.0}, run_id="aaaa1111")
    b = make_run(runs, model="openai/gpt-5", version=2, outcomes=("passed", "wrong_output"),
                 times={"llama3-8b": 90.0}, params={"temperature": 0.7, "top_p": 0.9},
                 stages=["static", "correctness", "compile"], created=T0 + timedelta(hours=1),
                 run_id="bbbb2222", code="def forward(x):\n    return x\n")
    return a, b


def test_leaderboard_command_formats_and_errors(cli_store, monkeypatch, capsys):
    # the summary: a row per task version, device, author
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard")
    assert code == 0 and "geometric means over the timed shapes" in out and "shape llama3-8b" not in out
    assert ("gemm_rmsnorm v2" in out and "gemm_rmsnorm v1" in out and "anthropic/claude" in out
            and "0.96×" in out)
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--format", "json")
    rows = {(r["task_version"], r["author"]): r for r in json.loads(out)["summary"]}
    assert list(rows) == [(2, "openai/gpt-5"), (1, "human"), (1, "anthropic/claude")]
    claude = rows[(1, "anthropic/claude")]
    assert claude["section"] == "apart" and claude["shapes"] == claude["of_shapes"] == 1 and claude["correct"]
    assert claude["vs_human"] == pytest.approx(100 / 104) and claude["vs_cublas"] == pytest.approx(95 / 104)
    assert claude["vs_eager"] == pytest.approx(200 / 104) and claude["cost_usd"] == pytest.approx(0.15)
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--task", "gemm_rmsnorm")
    assert "gemm_rmsnorm v2 · NVIDIA H200 · shape llama3-8b" in out and "other versions / devices" in out
    assert "cuBLAS (GEMM alone)" in out
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--format", "json", "--task", "gemm_rmsnorm")
    assert code == 0 and json.loads(out)["groups"][0]["entries"][0]["author"] == "openai/gpt-5"
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "-f", "md")
    assert (code == 0 and out.startswith("# Leaderboard (summary")
            and "| gemm_rmsnorm v1 (old version) | NVIDIA H200 | human |" in out)
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "-f", "md", "-t", "gemm_rmsnorm")
    assert code == 0 and out.startswith("# Leaderboard") and "## Other versions / devices" in out
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "-f", "csv")
    assert (code == 0 and out.splitlines()[0].startswith("section,task,task_version,device,author")
            and len(out.splitlines()) == 4)
    code, _, err = run_cli(monkeypatch, capsys, "leaderboard", "-f", "csv", "--device", "cpu")
    assert code == 2 and "no runs or bench results on device 'cpu' (known: NVIDIA H200)" in err
    code, _, err = run_cli(monkeypatch, capsys, "leaderboard", "--task", "nope")
    assert code == 2 and "no runs or bench results for task 'nope' (known: gemm_rmsnorm)" in err
    code, _, err = run_cli(monkeypatch, capsys, "leaderboard", "--task", "gemm_rmsnrm")
    assert code == 2 and "did you mean gemm_rmsnorm?" in err
    code, _, err = run_cli(monkeypatch, capsys, "leaderboard", "--format", "xml")
    assert code == 2 and "unknown --format 'xml'" in err


def test_leaderboard_names_bad_files_and_still_prints(cli_store, monkeypatch, capsys):
    a, _ = cli_store
    (a / "summary.json").write_text("{")
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard")
    assert code == 0 and "anthropic/claude" in out
    assert f"{a / 'summary.json'}: invalid JSON" in err


def test_show_prints_the_attempt_timeline(cli_store, monkeypatch, capsys):
    a, _ = cli_store
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa")
    assert code == 0
    assert f"{a.name}  (run id aaaa1111)" in out
    assert "task gemm_rmsnorm v1 · model anthropic/claude · device NVIDIA H200" in out
    lines = [
        row for row in map(str.split, out.splitlines()) if len(row) > 3 and row[1] in ("1.0", "2.0", "3.0")]
    assert [row[:4] for row in lines] == [["1", "1.0", "+0.0s", "compile_error"],
                                          ["2", "2.0", "+30.0s", "wrong_output"],
                                          ["3", "3.0", "+1m00s", "passed"]]
    assert "SyntaxError: invalid syntax" in out and "104.0 @llama3-8b" in out and "3.0k/800" in out
    assert "3 attempts in 3 rounds, 1 passed, best #3 (104.0 µs) · tokens 11.4k · $0.15" in out
    code, _, err = run_cli(monkeypatch, capsys, "show", "zzz")
    assert code == 2 and "no run 'zzz'" in err


def test_show_one_attempt_in_full_and_as_json(cli_store, monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "--attempt", "2")
    assert code == 0 and "attempt #2 (round 2, slot 0): wrong_output" in out
    assert REASONS["wrong_output"] in out and "eps=1e-2" in out  # the whole reason, and the code
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "-a", "3", "--format", "json")
    assert code == 0 and json.loads(out)["index"] == 3 and "eps=1e-6" in json.loads(out)["code"]
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "--format", "json")
    data = json.loads(out)
    assert (code == 0 and data["header"]["run_id"] == "aaaa1111"
            and [a["index"] for a in data["attempts"]] == [1, 2, 3])
    code, _, err = run_cli(monkeypatch, capsys, "show", "aaaa", "--attempt", "9")
    assert code == 2 and "has no attempt #9 (attempts: 1, 2, 3)" in err


def test_show_prints_where_each_stage_spent_its_time(cli_store, monkeypatch, capsys):
    a, _ = cli_store
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "--attempt", "2")
    assert (code == 0
            and "correctness 2.5 s: runner start 0.60, reference FP32 0.90, candidate 0.40, checks 0.30, "
                "other 0.30" in out)
    assert "static 0.01 s\n" in out  # a stage with no parts: its total alone
    # a record from before the parts were kept (no seconds_by_part) loads and shows its total
    path = a / "attempts" / "0003.json"
    record = json.loads(path.read_text())
    for stage in record["verdict"]["stages"]:
        stage.pop("seconds_by_part", None)
    path.write_text(json.dumps(record))
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "--attempt", "3")
    assert code == 0 and "correctness 2.5 s\n" in out and "attempt #3 (round 3, slot 0): passed" in out
    # the run's table, stage x part over its attempts (#2 has the parts; #1 and #3 the stage's total only)
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "--breakdown", "--format", "json")
    rows = {(r["stage"], r["part"]): r for r in json.loads(out)}
    assert (code == 0 and rows[("correctness", "(stage)")]["attempts"] == 3
            and rows[("correctness", "(stage)")]["total_s"] == 7.5)
    assert rows[("correctness", "reference FP32")] == {"stage": "correctness", "part": "reference FP32",
                                                       "attempts": 1, "total_s": 0.9, "median_s": 0.9,
                                                       "max_s": 0.9, "share": pytest.approx(0.12)}
    assert rows[("correctness", "other")]["total_s"] == pytest.approx(0.3)
    code, out, _ = run_cli(monkeypatch, capsys, "show", "aaaa", "-b")
    assert code == 0 and "verification time over 3 verified attempts" in out
    assert re.search(r"reference FP32\s+1\s+0\.9\s+0\.90\s+0\.90\s+12%", out)


def test_show_a_run_with_a_broken_header_names_it(cli_store, monkeypatch, capsys):
    a, _ = cli_store
    (a / "header.json").write_text("[]")
    code, out, err = run_cli(monkeypatch, capsys, "show", str(a))
    assert code == 0 and "3 attempts in 3 rounds" in out
    assert f"{a / 'header.json'}: does not match the schema" in err


def test_diff_shows_header_changes_outcomes_and_code(cli_store, monkeypatch, capsys):
    a, b = cli_store
    code, out, _ = run_cli(monkeypatch, capsys, "diff", "aaaa1111", "bbbb2222")
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["model"] == ["anthropic/claude", "openai/gpt-5"]
    assert rows["task_version"] == ["1", "2"]
    assert rows["params.temperature"] == ["0.2", "0.7"] and rows["params.top_p"] == ["-", "0.9"]
    assert rows["verifier_stages"] == ["static,", "correctness", "static,", "correctness,", "compile"]
    assert rows["1"] == ["compile_error", "passed", "changed"]
    assert rows["2"] == ["wrong_output", "wrong_output"]
    assert rows["3"] == ["passed", "-", "changed"]
    assert f"--- {a.name}/best.py" in out and f"+++ {b.name}/best.py" in out
    assert ("+    return x" in out
            and "-    return gemm(x, w, epilogue=epilogue.rmsnorm(gamma, eps=1e-6))" in out)


def test_unpriced_models_say_so_in_every_table(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(runs))
    run = make_run(runs, model="openai-compatible/qwen", outcomes=("wrong_output", "passed"), priced=False,
                   run_id="cafe01")
    for args in (("leaderboard",), ("leaderboard", "--task", "gemm_rmsnorm"), ("show", "cafe01")):
        code, out, _ = run_cli(monkeypatch, capsys, *args)
        assert code == 0 and "unpriced" in out and "$0" not in out, out
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--format", "json", "--task", "gemm_rmsnorm")
    entry = next(
        e for g in json.loads(out)["groups"] for e in g["entries"] if e["author"] == "openai-compatible/qwen")
    assert entry["cost_usd"] is None and entry["cost_known"] is False
    from coda_agent.viewer import Site

    page = Site(runs, tmp_path / "bench").get(f"/run/{run.name}.html")
    assert page.status == 200 and "unpriced" in page.body.decode()


# ------------------------------------------------------------------------------------------------ honest
# summaries


def test_old_versions_replays_and_failed_runs_are_marked_in_the_cli(tmp_path, monkeypatch, capsys):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(runs))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(bench))
    make_bench(bench,
               [bench_row("gemm_rmsnorm", "llama3-8b", 100.0),
                bench_row("gemm_rmsnorm", "llama3-8b", 100.0, version=2)])
    original = make_run(runs, model="anthropic/claude", version=2, outcomes=("passed",),
                        times={"llama3-8b": 104.0}, run_id="orig0001", cost=0.4)
    make_run(runs, model=f"replay/{original}", version=2, outcomes=("passed",), times={"llama3-8b": 101.0},
             run_id="replay01", cost=0.0, created=T0 + timedelta(hours=1))
    failed = make_run(runs, model="openai/gpt-5", version=2, outcomes=("wrong_output", "compile_error"),
                      run_id="fail0001", created=T0 + timedelta(hours=2))
    summary = json.loads((failed / "summary.json").read_text()) | {"status": "completed"}
    (failed / "summary.json").write_text(json.dumps(summary))
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--format", "json")
    rows = {(r["task_version"], r["author"]): r for r in json.loads(out)["summary"]}
    assert (2, "anthropic/claude") in rows and not any(a.startswith("replay") for _, a in rows)
    claude = rows[(2, "anthropic/claude")]
    # a replay costs what its original did
    assert claude["runs"] == 2 and claude["cost_usd"] == pytest.approx(0.4)
    # its time counts for the model that wrote the replies
    assert claude["vs_human"] == pytest.approx(100 / 101)
    assert rows[(1, "human")]["apart_why"] == "old version"
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard")
    assert code == 0 and "gemm_rmsnorm v1 (old version)" in out and "replay/" not in out
    code, out, _ = run_cli(monkeypatch, capsys, "show", "fail0001")
    assert code == 0 and "status completed, no correct kernel" in out
    code, out, _ = run_cli(monkeypatch, capsys, "show", "replay01")
    assert "model anthropic/claude (a replay of run " + original.name + ")" in out


def test_leaderboard_says_why_speed_is_not_compared_and_where_bench_results_are(tmp_path, monkeypatch,
                                                                                capsys):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(runs))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(bench))
    make_run(runs, model="anthropic/claude", device="cpu", outcomes=("passed",))
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard")
    assert code == 0 and "anthropic/claude" in out
    assert "Speed not compared: runs on cpu have no GPU to time them" in err
    assert f"no bench results found in {bench}" in err and "not the wheel" in err
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard")
    assert "no bench results found" not in err and "Speed not compared" in err


def test_a_run_that_ended_before_its_first_attempt_is_no_authors_result(tmp_path, monkeypatch, capsys):
    """A provider's set-up error ends a run with no attempt: no row, no run in an author's count; the runs
    left out are named (stderr, JSON)."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(runs))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(tmp_path / "bench"))
    make_run(runs, model="anthropic/claude", outcomes=("passed",))
    unstarted = []
    for hours, model in ((1, "anthropic/claude"), (2, "openai/gpt-5")):
        run = make_run(runs, model=model, outcomes=(), created=T0 + timedelta(hours=hours))
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(
            json.dumps({**summary, "status": "failed", "stop_reason": "no OPENAI_API_KEY"}))
        unstarted.append(run.name)
    b = board(tmp_path)
    assert [(e.author, e.runs) for g in b.groups for e in g.entries] == [("anthropic/claude", 1)]
    assert b.no_attempts == unstarted
    code, out, err = run_cli(monkeypatch, capsys, "leaderboard")
    assert code == 0 and "openai/gpt-5" not in out and "1/1" in out
    assert ("not counted: 2 runs with no attempts (ended before the first, e.g. on a provider's set-up "
            f"error): {', '.join(unstarted)}") in err
    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--format", "json")
    assert (json.loads(out)["no_attempts"] == unstarted
            and [r["author"] for r in json.loads(out)["summary"]] == ["anthropic/claude"])
    from coda_agent.viewer import Site

    html = Site(runs, tmp_path / "bench").get("/").body.decode()
    assert "not counted: 2 runs with no attempts" in html


def test_a_bench_folder_that_does_not_exist_is_named_as_such(tmp_path):
    assert lbt.missing_bench_note(tmp_path / "nope").startswith(
        f"no bench results found in {tmp_path / 'nope'} (no such folder)")
    assert "(no such folder)" not in lbt.missing_bench_note(tmp_path)  # there, but empty


def test_two_tasks_under_one_name_never_share_a_row_and_old_records_join_the_one_they_match(tmp_path,
                                                                                            monkeypatch,
                                                                                            capsys):
    """A task's identity is its content: an edited copy of a built-in, run under the built-in's name and
    version, is ranked apart and labelled; a run recorded before hashes joins the one content its name has, if
    only one."""
    runs = tmp_path / "runs"
    builtin = str(BUILTIN_TASK_DIR / "gemm_rmsnorm.yaml")
    make_bench(tmp_path / "bench", [bench_row("gemm_rmsnorm", "s", 100.0, task_hash="aaaa")])
    make_run(runs, model="a/old", outcomes=("passed",), times={"s": 120.0})  # no hash: recorded before hashes
    make_run(runs, model="a/builtin", outcomes=("passed",), times={"s": 110.0}, task_hash="aaaa",
             task_path=builtin, created=T0 + timedelta(hours=1))
    assert [e.author for e in board(tmp_path).groups[0].entries][:3] == ["human", "a/builtin", "a/old"]
    assert board(tmp_path).groups[0].content == ""  # one content: nothing to tell apart

    make_run(runs, model="a/edited", outcomes=("passed",), times={"s": 50.0}, task_hash="bbbb",
             task_path="/home/me/tasks/gemm_rmsnorm.yaml", created=T0 + timedelta(hours=2))
    b = board(tmp_path)
    main, apart = b.groups[0], next(g for g in b.apart if g.task_hash == "bbbb")
    assert (main.task_hash, [e.author for e in main.entries][:2]) == ("aaaa", ["human", "a/builtin"])
    assert main.content == "content aaaa, built-in" and "(content aaaa, built-in)" in main.title
    assert [e.author for e in apart.entries] == ["a/edited"] and apart.entries[0].vs_human is None
    assert apart.content == "content bbbb, /home/me/tasks/gemm_rmsnorm.yaml"
    # a record without a hash is no longer known to be either: a group of its own
    assert [e.author for e in main.entries if e.kind != "baseline"] == ["human", "a/builtin"]
    unknown = next(g for g in (*b.groups, *b.apart) if g.task_hash is None)
    assert [e.author for e in unknown.entries] == ["a/old"] and unknown.content == "content not recorded"
    summary = {r.author: r for r in lb.summarize(b)}
    assert summary["a/edited"].apart_why == "other content" and summary["a/builtin"].section == "main"

    code, out, _ = run_cli(monkeypatch, capsys, "leaderboard", "--runs-dir", str(runs), "--bench-dir",
                           str(tmp_path / "bench"))
    assert code == 0 and "content bbbb" in out and "content aaaa, built-in" in out


def test_a_raised_errors_headline_leads_with_the_error():
    """`show` cut a runtime error's reason to its first line and the module's line under it, never reaching
    the error the call raised (a manual seat); an introduction followed by one line reads as before."""
    raised = ("forward() raised at shape tiny {'M': 256, 'E': 64, 'K': 128}:\n"
              "line 13: lg = gemm(logits, x, w.t(), config=Config(tile_m=256))\n"
              "EpilogueError: invalid Config: pingpong needs tile_m to be one of 64, 128, 192, got 256")
    assert lbt.headline(raised, 200) == ("EpilogueError: invalid Config: pingpong needs tile_m to be one of "
                                         "64, 128, 192, got 256 (forward() raised at shape tiny {'M': 256, "
                                         "'E': 64, 'K': 128})")
    static = "the static check rejected the candidate:\nline 2: import of 'numpy' is not allowed"
    assert lbt.headline(static) == ("the static check rejected the candidate: line 2: import of 'numpy' is "
                                    "not allowed")
