"""Screenshots of the viewer's pages for docs/viewer/: example run records beside the latest whole-suite bench.

    .venv/bin/python scripts/viewer_screenshots.py [OUT_DIR]    # default docs/viewer; needs /usr/bin/chromium

The runs are synthetic (tests/records_factory.py, the real record schema): a model that reached the human kernel,
one that ran every round without a correct kernel, a replay of the first, and a run on a CPU-only machine. The
human kernel and the baselines are the H200 figures of bench/results/h200-2026-12-03-e.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from coda_agent.viewer import Site, serve  # noqa: E402
from tests.records_factory import T0, make_run  # noqa: E402

BENCH = ROOT / "bench" / "results" / "h200-2026-12-03-e.json"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
SHAPES = {"llama3-8b-gateup": 2420.0, "llama3-1b-gateup": 702.0, "coda-h2048-gateup": 941.0,
          "coda-h4096-gateup": 3912.0, "ragged": 861.0}


def records(tmp: Path) -> tuple[Path, Path, Path]:
    runs, bench = tmp / "runs", tmp / "bench"
    bench.mkdir(parents=True)
    shutil.copy(BENCH, bench / BENCH.name)
    claude = make_run(runs, task="gemm_swiglu", model="anthropic/claude-sonnet-4-6", run_id="c1a2b3d4",
                      outcomes=("compile_error", "wrong_output", "passed", "passed"), times=SHAPES, cost=0.21,
                      tokens=(14200, 2600), stages=["static", "correctness", "compile", "gpu_correctness", "profile"])
    failed = make_run(runs, task="gemm_swiglu", model="openai/gpt-4.1", run_id="e5f6a7b8",
                      outcomes=("wrong_output", "runtime_error", "wrong_output"), created=T0 + timedelta(hours=1))
    summary = json.loads((failed / "summary.json").read_text()) | {"status": "completed", "stop_reason": "all 3 rounds done"}
    (failed / "summary.json").write_text(json.dumps(summary))
    make_run(runs, task="gemm_swiglu", model=f"replay/{claude}", run_id="9f8e7d6c", outcomes=("compile_error", "wrong_output", "passed", "passed"),
             times={k: v * 1.004 for k, v in SHAPES.items()}, cost=0.0, created=T0 + timedelta(hours=2))
    make_run(runs, task="gemm_swiglu", model="openai-compatible/qwen2.5-coder-32b", device="cpu", run_id="0a1b2c3d",
             outcomes=("static_rejected", "passed"), cost=0.0, created=T0 + timedelta(hours=3))
    return runs, bench, claude, failed


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "viewer"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs, bench, claude, failed = records(Path(tmp))
        server = serve(Site(runs, bench), port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                for name, path, height in (("leaderboard", "/", 1320), ("task", "/task/gemm_swiglu.html", 1500),
                                           ("run", f"/run/{claude.name}.html", 1300),
                                           ("run-failed", f"/run/{failed.name}.html", 720)):
                    page.goto(url + path)
                    page.screenshot(path=out / f"{name}.png", full_page=True,
                                    clip={"x": 0, "y": 0, "width": 1280, "height": height})
                    print(out / f"{name}.png", (out / f"{name}.png").stat().st_size // 1024, "KiB")
                browser.close()
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
