"""No reply ends a run (issue 37): whatever a model answers or a candidate prints becomes a recorded attempt
with a clear verdict, the loop goes on, and nothing a model or a candidate wrote reaches a terminal, a page or
the next prompt as a control sequence or as rich markup.

Most replies here are refused by the static check or by extraction (no runner process), so the tests stay
fast; one test runs a real candidate through ``verify`` to see its exception message on stdout.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
import yaml

from coda_agent.agent import Agent, AgentConfig
from coda_agent.agent.extract import MAX_REPLY_CHARS, extract_code
from coda_agent.execute import LocalExecutor
from coda_agent.messages import ChatMessage
from coda_agent.prompts.chat import MAX_ECHOED_CHARS
from coda_agent.providers import MockProvider, get_provider
from coda_agent.providers.manual import ManualProvider, render_prompt
from coda_agent.store.ranking import code_fingerprint
from coda_agent.store.records import Budgets
from coda_agent.store.rundir import RunReader
from coda_agent.tasks import find_task
from coda_agent.untrusted import shown, storable
from coda_agent.verifier import Plan, verify
from coda_agent.verifier.static import MAX_DEPTH, check_source
from coda_agent.verifier.static.schedule_source import pinned_schedule, without_schedule
from coda_agent.verifier.verdict import Outcome, StageResult, Verdict
from coda_agent.viewer.site import Site

from .conftest import EXAMPLE_SCRIPT, cli
from .fake_llm_server import OPENAI_PATH, FakeLLMServer, openai_chat

TASK = find_task("gemm_residual_rmsnorm")
CORRECT = yaml.safe_load(EXAMPLE_SCRIPT.read_text())["responses"][-1]["text"]
FORWARD = "def forward(x, w, residual, gamma, eps):\n    return {}\n"
REFUSED = "```python\nimport os\n\n\ndef forward(x, w, residual, gamma, eps):\n    return {}\n```"
#: What a hostile message tries on a terminal: clear the screen, home the cursor, a fake verdict in rich
#: markup, the clipboard through OSC 52 (ended by ESC \), a C1 CSI, a bell, a right-to-left override.
BAIT = "\x1b[2J\x1b[H[bold green]PASSED[/] \x1b]52;c;cm0gLXJmIH4=\x1b\\ \x9b31m \x07 \u202eevil"
RAW_CONTROLS = ("\x1b", "\x9b", "\x07", "\u202e", "\x00")


def deep_module(terms: int) -> str:
    return "from coda_agent.primitives import gemm\n\nX = " + " + ".join(["1"] * terms) + "\n\n\n" + FORWARD


def fenced(code: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```python\n{code}```\n"


def inert(text: str) -> bool:
    """No raw control, escape or bidi character (nor a lone surrogate) left in ``text``."""
    return not any(c in text for c in RAW_CONTROLS) and storable(text) == text


def run(agent: Agent):
    return asyncio.run(agent.run())


def config(**kw) -> AgentConfig:
    budgets = Budgets(**{k: kw.pop(k) for k in list(kw) if k in Budgets.model_fields})
    return AgentConfig(model="mock/poison", plan=Plan(), budgets=budgets, **kw)


# --- the one function and its boundaries ----------------------------------------------------------


def test_shown_writes_out_every_control_and_storable_replaces_lone_surrogates():
    text = shown(BAIT + "\x00\r\n\t tab \u2066x\u2069 \ud800 µs")
    assert inert(text)
    assert ("\\x1b[2J" in text and "\\x1b]52;c;" in text and "\\x9b" in text and "\\u202e" in text
            and "\\x00" in text)
    assert "\n\t tab" in text and "µs" in text and "\ufffd" in text and "[bold green]PASSED[/]" in text
    assert storable("a\ud800b\udfff") == "a\ufffdb\ufffd" and storable("plain\x1b") == "plain\x1b"


# --- deep nesting: the static check and Python's own parser --------------------------------------


@pytest.mark.parametrize("terms, says", [(1_200, f"at most {MAX_DEPTH}"), (5_000, "for Python's parser")])
def test_deeply_nested_constant_is_a_clean_static_rejection(terms, says):
    source = deep_module(terms)
    (violation,) = check_source(source)
    assert "expression nested too deeply" in violation.message and says in violation.message
    verdict = verify(TASK, source)
    assert verdict.outcome is Outcome.STATIC_REJECTED and [s.stage for s in verdict.stages] == ["static"]
    assert ("the static check rejected the candidate" in verdict.reason
            and "nested too deeply" in verdict.reason)
    # every other walker of candidate text takes it too
    assert without_schedule(source) == source and code_fingerprint(source) and pinned_schedule(source) == {}
    assert extract_code(fenced(source)).code == source


def test_nul_bytes_and_binary_junk_are_no_exception_anywhere():
    nul = "from coda_agent.primitives import gemm\x00\n\n\n" + FORWARD
    (violation,) = check_source(nul)
    assert "null bytes" in violation.message
    assert extract_code(fenced(nul)).code == nul
    junk = bytes(random.Random(0).randrange(256) for _ in range(20_000)).decode("utf-8", "surrogateescape")
    assert extract_code(junk).code is None and check_source(junk)


# --- replies that used to end the run --------------------------------------------------------------


def poison_replies() -> list[str]:
    junk = bytes(random.Random(1).randrange(256) for _ in range(50_000)).decode("utf-8", "surrogateescape")
    return [
        fenced(deep_module(1_200)),  # 1: the static check recursed into RecursionError
        fenced(deep_module(5_000)),  # 2: Python's parser raised RecursionError inside extraction
        "x" * 20_000_000,  # 3: a 20 MB reply
        fenced("from coda_agent.primitives import gemm\x00\n" + FORWARD),  # 4: a NUL byte in the code
        # 5: unwritable record
        fenced("import os\n\n\n" + FORWARD, prose="Lone surrogate \ud800 in the prose."),
        junk,  # 6: binary garbage
        BAIT + "\x00 and no code at all",  # 7: control characters and escapes
    ]


def test_poison_replies_are_recorded_attempts_and_the_loop_goes_on(tmp_path):
    provider = MockProvider([*poison_replies(), REFUSED], name="mock/poison")
    # the real verifier: each is refused statically
    agent = Agent.create(TASK, provider, config(rounds=8), tmp_path)
    summary = run(agent)
    assert summary.status == "completed" and summary.attempts == 8
    attempts = RunReader(agent.run_dir).attempts()  # the strict reader: every record parses
    outcomes = [a.outcome.value for a in attempts]
    assert outcomes == ["static_rejected", "static_rejected", "no_code", "static_rejected", "static_rejected",
                        "no_code", "no_code", "static_rejected"]
    assert "nested too deeply" in attempts[0].reason and "Python's parser" in attempts[1].reason
    assert "20,000,000 characters long" in (attempts[2].extraction_error or "")
    assert len(attempts[2].raw_response or "") < MAX_REPLY_CHARS + 200  # kept: a head and a note, not 20 MB
    assert "null bytes" in attempts[3].reason
    assert ("\ufffd" in (attempts[4].raw_response or "")
            and "Lone surrogate" in (attempts[4].raw_response or ""))
    assert storable(attempts[5].raw_response or "") == attempts[5].raw_response
    # the model's next prompts: its own runaway reply cut, the feedback free of control sequences
    for call in provider.calls[1:]:
        assert len(call.messages[-2].content) < MAX_ECHOED_CHARS + 200
        assert inert(call.messages[-1].content)


def test_non_utf8_and_garbage_from_an_openai_compatible_server_are_recorded_provider_errors(tmp_path):
    server = FakeLLMServer().start()
    try:
        body = json.dumps(openai_chat("HERE")).encode().replace(b"HERE", b"bad \xff\xfe\xed\xa0\x80 bytes")
        server.reply(OPENAI_PATH, {}, raw=body)
        server.reply(OPENAI_PATH, {}, raw=b"\x89PNG\r\n\x1a\n\x00\x00 garbage")
        server.reply(OPENAI_PATH, openai_chat("surrogate \ud800 and " + BAIT + "\n" + REFUSED))
        provider = get_provider("openai-compatible/junk", base_url=server.url + "/v1")
        agent = Agent.create(TASK, provider, config(rounds=3), tmp_path)
        summary = run(agent)
    finally:
        server.stop()
    attempts = RunReader(agent.run_dir).attempts()
    assert summary.status == "completed" and [a.outcome.value for a in attempts] == [
        "provider_error", "provider_error", "static_rejected"]
    assert all(
        "the server's reply could not be read (UnicodeDecodeError" in (a.provider_error or "")
        for a in attempts[:2])
    assert "\ufffd" in (attempts[2].raw_response or "")


# --- what a candidate prints, where it is shown ----------------------------------------------------


def _bait_verify(task, source, plan):
    """A runtime error whose message is the bait (and a lone surrogate), as a runner would report it."""
    reason = f"forward() raised at shape tiny:\nline 5: raise ValueError(...)\nValueError: {BAIT} \ud800"
    stage = StageResult(stage="correctness", outcome=Outcome.RUNTIME_ERROR, reason=reason)
    return Verdict(task=task.name, task_version=task.version, backend="torch", outcome=Outcome.RUNTIME_ERROR,
                   reason=reason, stages=[StageResult(stage="static", outcome=Outcome.PASSED), stage])


@pytest.fixture
def baited_run(tmp_path) -> tuple[Path, MockProvider]:
    provider = MockProvider([CORRECT], name="mock/poison", repeat_last=True)
    agent = Agent.create(TASK, provider, config(rounds=2), tmp_path / "runs", verify_fn=_bait_verify)
    assert run(agent).attempts == 2
    return agent.run_dir, provider


def test_a_candidates_escapes_reach_neither_the_feedback_nor_show_nor_the_leaderboard(baited_run, capsys):
    run_dir, provider = baited_run
    feedback = provider.calls[1].messages[-1].content
    assert inert(feedback) and "\\x1b]52;c;cm0gLXJmIH4=" in feedback and "[bold green]PASSED[/]" in feedback
    runs = str(run_dir.parent)
    for args in (("show", run_dir.name), ("show", run_dir.name, "--attempt", "1"), ("leaderboard",),
                 ("leaderboard", "--format", "md"), ("leaderboard", "--format", "csv"),
                 ("diff", run_dir.name, "latest")):
        code, out, err = cli(capsys, *args, "--runs-dir", runs)
        assert code == 0, (args, err)
        assert inert(out) and inert(err), args
    code, out, _ = cli(capsys, "show", run_dir.name, "--attempt", "1", "--runs-dir", runs)
    # the markup printed as text, the escapes written out
    assert "[bold green]PASSED[/]" in out and "\\x1b[2J" in out


def test_the_viewer_writes_out_what_the_html_escaping_leaves(baited_run):
    run_dir, _ = baited_run
    page = Site(run_dir.parent, None).get(f"/run/{run_dir.name}")
    html = page.body.decode()
    assert page.status == 200 and inert(html) and "\\x1b[2J" in html


def test_progress_lines_of_a_run_are_inert(tmp_path, capsys, monkeypatch):
    import coda_agent.cli.run_cmd as run_cmd

    monkeypatch.setattr(run_cmd, "open_executor", lambda kind, address=None, cpu_workers=2: LocalExecutor(
        cpu_workers=cpu_workers, verify_fn=_bait_verify))
    script = tmp_path / "poison.json"
    script.write_text(json.dumps({"responses": [CORRECT], "repeat_last": True}))
    code, out, err = cli(capsys, "run", "gemm_residual_rmsnorm", "--model", f"mock/{script}", "--rounds", "2",
                         "--no-compile", "--plain", "--runs-dir", str(tmp_path / "runs"))
    assert code == 1, out + err
    assert out.count("runtime_error") >= 2 and "[bold green]PASSED[/]" in out and inert(out) and inert(err)


def test_verify_prints_a_candidates_escapes_as_text(tmp_path, capsys):
    candidate = tmp_path / "bait.py"
    candidate.write_text(
        "from coda_agent.primitives import gemm\n\n\ndef forward(x, w, residual, gamma, eps):\n"
        f"    raise ValueError({BAIT + ' lone surrogate: ' + chr(0xD800)!r})\n"
    )
    code, out, err = cli(capsys, "verify", "gemm_residual_rmsnorm", str(candidate), "--seeds", "1",
                         "--json", str(tmp_path / "verdict.json"))
    assert code == 1 and "RUNTIME_ERROR" in out, out + err
    assert "\x1b" not in out and "\x9b" not in out and inert(out) and inert(err)
    assert "\\x1b]52;c;cm0gLXJmIH4=" in out and "[bold green]PASSED[/]" in out
    # writable: the surrogate (in every field) replaced
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    # the record keeps the words
    assert "\x1b[2J" in verdict["reason"] and "lone surrogate: \ufffd" in verdict["reason"]
    assert "lone surrogate: \ufffd" in verdict["stages"][1]["details"]["shapes"]["tiny"]["reason"]


# --- a sweep finishes its other runs ----------------------------------------------------------------


def test_a_sweep_finishes_its_other_runs_whatever_one_run_does(tmp_path, capsys, monkeypatch):
    poison = tmp_path / "poison.json"
    poison.write_text(
        json.dumps({"responses": [fenced(deep_module(5_000)), "\ud800" + BAIT, "BOOM"], "repeat_last": True}))
    import coda_agent.agent.loop as loop

    kept = loop.kept_reply

    def failing(text: str) -> str:  # a harness bug that only this model's third reply hits
        if text == "BOOM":
            raise RuntimeError("an unforeseen failure\nwith a second line")
        return kept(text)

    monkeypatch.setattr(loop, "kept_reply", failing)
    runs = tmp_path / "runs"
    code, out, err = cli(capsys, "run", "gemm_residual_rmsnorm", "gemm_rmsnorm", "--model", "mock/echo",
                         "--model", f"mock/{poison}", "--rounds", "3", "--no-compile", "--jobs", "2",
                         "--runs-dir", str(runs))
    # a run failed (as run alone exits): the sweep says so, after finishing the others
    assert code == 1, out + err
    assert "2 failed" in out.splitlines()[-1], out
    (record,) = runs.glob("*.sweep.json")
    members = json.loads(record.read_text())["members"]
    summaries = {
        (Path(m["task"]).stem, m["model"].split("/")[-1]): RunReader(runs / m["run"]).summary()
        for m in members}
    for (task, model), s in summaries.items():
        if model == "echo":
            assert s.status == "completed" and s.attempts == 3, (task, s)
        else:
            assert s.status == "failed" and s.attempts == 2, (task, s)
            assert s.stop_reason == "the run failed: RuntimeError: an unforeseen failure"
    failures = [ln for ln in err.splitlines() if "the run failed" in ln]
    assert len(failures) == 2 and all("RuntimeError: an unforeseen failure" in ln for ln in failures)
    assert all(f"{task} · mock/" in ln
               for ln, task in zip(sorted(failures), ("gemm_residual_rmsnorm", "gemm_rmsnorm"),
                                   strict=True)), failures
    assert "with a second line" not in err and inert(out) and inert(err)


def test_a_manual_answer_that_is_not_utf8_is_a_reply(tmp_path):
    messages = [ChatMessage(role="user", content="hi")]
    # asked before, answered with bytes, not text
    (tmp_path / "prompt-1.md").write_text(render_prompt(messages))
    (tmp_path / "answer-1.md").write_bytes(b"\xff\xfe junk \x00\x1b[2J")
    provider = ManualProvider(tmp_path, timeout=5, poll_interval=0.01, notify=lambda line: None)
    completion = asyncio.run(provider.complete(messages, max_tokens=10, temperature=0))
    assert completion.text == "\ufffd\ufffd junk \x00\x1b[2J" and extract_code(completion.text).code is None


def test_a_provider_message_with_surrogates_is_still_a_chat_message():
    # the chat schema takes any str; what a provider is sent was made inert where it was built
    assert ChatMessage(role="user", content=shown("\ud800\x1b")).content == "\ufffd\\x1b"
