"""The viewer in headless Chromium on 127.0.0.1: leaderboard -> task -> run, content checked, screenshots
kept.

Uses Debian's chromium (/usr/bin/chromium, installed by .ci/run) driven by Playwright's bundled driver;
skipped with the reason when either is missing.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from urllib.parse import urljoin

import pytest

from coda_agent.viewer import Site, serve

from .records_factory import T0, bench_row, make_bench, make_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[dev]')")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium)"
)


@pytest.fixture
def viewer_url(tmp_path):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    make_bench(bench,
               [bench_row("gemm_rmsnorm", "llama3-8b", 100.0), bench_row("gemm_swiglu", "llama3-8b", 120.0)])
    make_run(runs, model="anthropic/claude-sonnet-4-5", outcomes=("compile_error", "wrong_output", "passed"),
             times={"llama3-8b": 104.0}, run_id="claude01")
    make_run(runs, model="openai/gpt-5", outcomes=("wrong_output", "passed"), times={"llama3-8b": 96.0},
             created=T0 + timedelta(hours=1))
    make_run(runs, model="openai-compatible/Qwen2.5-Coder-32B-Instruct-AWQ-int4-gs128", device="cpu",
             outcomes=("passed",),
             created=T0 + timedelta(hours=2))  # a long name must wrap, not widen the page
    (runs / "20260502-000000_gemm_rmsnorm_broken").mkdir()
    server = serve(Site(runs, bench), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _image_loaded(page, selector: str) -> bool:
    return page.eval_on_selector(selector, "img => img.complete && img.naturalWidth > 0")


def _fits(page) -> bool:
    """Nothing wider than the 1280 px window: no horizontal scrolling."""
    return page.evaluate("document.documentElement.scrollWidth") <= 1280


def test_click_from_leaderboard_to_task_to_run(viewer_url, tmp_path, capsys):
    shots = tmp_path / "screenshots"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(viewer_url + "/")
            assert page.locator("h1").inner_text() == "Leaderboard"
            summary = page.locator("table.summary")
            rows = [
                r.split("\t") for r in summary.locator("tbody tr", has_text="gemm_rmsnorm").all_inner_texts()]
            assert ([r[2].strip() for r in rows[:3]]
                    == ["human", "openai/gpt-5", "anthropic/claude-sonnet-4-5"])
            # per-shape tables folded away
            assert not page.locator("details.per-shape table.board").first.is_visible()
            assert "1 file could not be read" in page.locator("#problems").inner_text()
            assert "20260502-000000_gemm_rmsnorm_broken/header.json" in page.locator("#problems").inner_text()
            assert _image_loaded(page, "figure.chart img") and _fits(page)
            # a run name breaks only at its <wbr>s (after an underscore), never inside its date or id
            style = "e => [getComputedStyle(e).wordBreak, getComputedStyle(e).overflowWrap].join(' ')"
            assert page.eval_on_selector("td.run-name", style) == "normal normal"
            assert page.locator("td.run-name a", has_text="claude01").inner_text().replace("\n",
                                                                                           "").endswith(
                                                                                               "_claude01")
            assert "Speed not compared: runs on cpu" in page.locator(".note-line").inner_text()
            page.screenshot(path=shots / "leaderboard.png", full_page=True)

            summary.locator("a", has_text="gemm_rmsnorm").first.click()
            page.wait_for_url("**/task/gemm_rmsnorm.html")
            assert page.locator("h1").inner_text() == "gemm_rmsnorm"
            assert _image_loaded(page, "figure.chart img")
            chart = page.request.get(urljoin(page.url, page.locator("figure.chart img").get_attribute("src")))
            assert chart.ok and "cuBLAS (GEMM alone)" in chart.text()
            row = page.locator("table.board tr.model", has_text="anthropic/claude-sonnet-4-5").first
            assert "0.96×" in row.inner_text() and _fits(page)
            page.screenshot(path=shots / "task.png", full_page=True)

            row.locator("a").click()
            page.wait_for_url("**/run/*claude01.html#attempt-3")
            assert page.locator("h1").inner_text().endswith("_gemm_rmsnorm_claude01")
            assert page.locator(".tl-row").count() == 3
            assert (page.locator(".tl-outcome").all_inner_texts()
                    == ["compile_error", "wrong_output", "passed"])
            attempt = page.locator("#attempt-3")
            assert ("passed" in attempt.locator("h3").inner_text()
                    and "best" in attempt.locator("h3").inner_text())
            assert attempt.locator(".hl .k", has_text="def").first.is_visible()  # highlighted candidate code
            assert "104.0" in attempt.locator("table.timing").inner_text()
            failed = page.locator("#attempt-2")
            assert "max |err| 3.1e-01 > allowed 2.0e-02" in failed.locator("pre.reason").inner_text()
            assert "no" in failed.locator("table.errors tbody").inner_text()
            transcript = failed.locator("details.transcript")
            assert not transcript.locator(".msg-user").is_visible()
            transcript.locator("summary").click()
            assert "fuse RMSNorm into the GEMM epilogue" in transcript.locator(".msg-user").inner_text()
            assert _fits(page)
            page.screenshot(path=shots / "run.png", full_page=True)

            page.goto(viewer_url + "/run/20260502-000000_gemm_rmsnorm_broken.html")
            assert "missing (empty or incomplete run directory)" in page.locator("#problems").inner_text()
        finally:
            browser.close()
    for name in ("leaderboard.png", "task.png", "run.png"):
        assert (shots / name).stat().st_size > 10_000
    with capsys.disabled():
        print(
            f"\nviewer screenshots (artifacts): {shots / 'leaderboard.png'} {shots / 'task.png'} "
            f"{shots / 'run.png'}")
