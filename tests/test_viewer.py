"""The viewer without a browser: pages and their JSON twins, escaping, bad files, static export, the
server."""

from __future__ import annotations

import json
import socket
import threading
import unicodedata
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from coda_agent.tasks import find_task
from coda_agent.viewer import Site, export_site, serve

from .records_factory import T0, bench_row, make_bench, make_run
from .test_leaderboard import run_cli

EVIL = "<script>alert('x')</script>"


class Links(HTMLParser):
    """hrefs and srcs of a page, and its visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [v for k, v in attrs if k in ("href", "src") and v]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Links:
    p = Links()
    p.feed(html)
    return p


@pytest.fixture
def site(tmp_path) -> tuple[Site, Path, Path]:
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    make_bench(bench,
               [bench_row("gemm_rmsnorm", "llama3-8b", 100.0), bench_row("gemm_swiglu", "llama3-8b", 120.0)])
    a = make_run(runs, model="anthropic/claude", outcomes=("wrong_output", "passed"),
                 times={"llama3-8b": 104.0})
    evil = make_run(runs, model=f"evil/{EVIL}", task="gemm_swiglu", outcomes=("passed",),
                    times={"llama3-8b": 90.0}, created=T0 + timedelta(hours=1),
                    code=f"# {EVIL}\ndef forward(x):\n    return x\n")
    return Site(runs, bench), a, evil


def get(site: Site, path: str) -> tuple[int, str]:
    page = site.get(path)
    return page.status, page.body.decode()


def test_leaderboard_page_and_its_json_twin(site):
    s, a, _ = site
    status, html = get(s, "/")
    assert status == 200
    text = " ".join(parse(html).text)
    assert "Leaderboard" in text and "anthropic/claude" in text and "0.96×" in text
    links = parse(html).links
    assert "task/gemm_rmsnorm.html" in links and f"run/{a.name}.html#attempt-2" in links
    assert "plots/speedup.svg" in links and "index.json" in links
    status, body = get(s, "/index.json")
    data = json.loads(body)
    assert status == 200
    assert {g["task"] for g in data["groups"]} == {"gemm_rmsnorm", "gemm_swiglu"}
    claude = next(e for g in data["groups"] for e in g["entries"] if e["author"] == "anthropic/claude")
    assert claude["time_us"] == 104.0 and claude["vs_human"] == pytest.approx(100 / 104)
    assert [r["dir"] for r in data["runs"]][-1] == a.name


def test_leaderboard_page_opens_with_the_summary(site):
    s, _, _ = site
    html = get(s, "/")[1]
    summary_at, per_shape_at = (html.index('<table class="board summary">'),
                                html.index('<details class="per-shape">'))
    assert summary_at < html.index("<h2>Runs") < per_shape_at < html.index('<table class="board" data-task')
    summary = html[summary_at:html.index("</table>", summary_at)]
    assert summary.index(">human<") < summary.index(">anthropic/claude<") and "0.96×" in summary
    rows = json.loads(get(s, "/index.json")[1])["summary"]
    assert ([(r["task"], r["author"]) for r in rows][:2]
            == [("gemm_rmsnorm", "human"), ("gemm_rmsnorm", "anthropic/claude")])
    labels = [
        t.text
        for t in ET.fromstring(s.get("/plots/speedup.svg").body).iter("{http://www.w3.org/2000/svg}text")]
    assert "gemm_rmsnorm v1 · NVIDIA H200 — geomean speedup vs eager over 1 shape" in labels
    # the summary, drawn: ×eager per author
    assert "0.96×" not in " ".join(labels) and "1.92×  (1 shape)" in labels


def test_the_front_page_lists_the_newest_runs_only(site, monkeypatch):
    s, a, evil = site
    monkeypatch.setattr("coda_agent.viewer.site.RECENT_RUNS", 1)
    html = get(s, "/")[1]
    runs = html[html.index("<h2>Runs"):html.index("</table>", html.index("<h2>Runs"))]
    assert evil.name in runs and a.name not in runs and "… and 1 older runs" in html


def test_task_page_shows_the_task_itself(site):
    s, _, _ = site
    text = " ".join(" ".join(parse(get(s, "/task/gemm_rmsnorm")[1]).text).split())
    task = find_task("gemm_rmsnorm")
    for expected in (" ".join(task.description.split()), "conventions", "launch budget 2", "Shapes",
                     "llama3-8b-qkv", "FP32 reference", "human kernel", "def forward"):
        assert expected in text, expected
    assert json.loads(get(s, "/task/gemm_rmsnorm.json")[1])["definition"]["name"] == "gemm_rmsnorm"


def test_task_page_chart_and_json(site):
    s, a, _ = site
    status, html = get(s, "/task/gemm_rmsnorm")
    assert status == 200 and get(s, "/task/gemm_rmsnorm.html")[1] == html
    assert ("../plots/task/gemm_rmsnorm.svg" in parse(html).links
            and f"../run/{a.name}.html" in parse(html).links)
    svg = s.get("/plots/task/gemm_rmsnorm.svg")
    assert svg.content_type == "image/svg+xml"
    root = ET.fromstring(svg.body)  # well-formed XML
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert ({"human", "anthropic/claude", "eager", "torch.compile", "cuBLAS (GEMM alone)", "SoL"}
            <= set(labels))
    assert "1.92×  (104.0 µs)" in labels
    data = json.loads(get(s, "/task/gemm_rmsnorm.json")[1])
    assert data["task"] == "gemm_rmsnorm" and [r["dir"] for r in data["runs"]] == [a.name]
    assert get(s, "/task/nope")[0] == 404 and json.loads(get(s, "/task/nope.json")[1]) == {
        "error": "no runs or bench results for task 'nope'"}


def test_run_page_timeline_transcript_code_and_tables(site):
    s, a, _ = site
    status, html = get(s, f"/run/{a.name}")
    assert status == 200
    text = " ".join(" ".join(parse(html).text).split())
    for expected in ("anthropic/claude", "wrong_output", "passed",
                     "output y: max |err| 3.1e-01 > allowed 2.0e-02", "error vs FP32 reference",
                     "tolerance baseline: eager", "verifier stages",
                     "You write kernels with the primitive API.", "timing", "104.0",
                     "candidate code (6 lines)", "transcript (2 messages + reply)"):
        assert expected in text, expected
    # pygments
    assert '<span class="k">def</span><span class="w"> </span><span class="nf">forward</span>' in html
    assert 'href="#attempt-2"' in html and 'class="tl-bar outcome-passed"' in html
    assert "where the time went (s)" in text  # each stage's parts, the rest as 'other'
    assert "runner start 0.60, reference FP32 0.90, candidate 0.40, checks 0.30, other 0.30" in text
    data = json.loads(get(s, f"/run/{a.name}.json")[1])
    assert data["header"]["model"] == "anthropic/claude" and [x["index"] for x in data["attempts"]] == [1, 2]
    assert data["attempts"][0]["verdict"]["outcome"] == "wrong_output" and data["problems"] == []
    assert get(s, "/run/nope")[0] == 404 and get(s, "/run/../../etc/passwd")[0] == 404
    assert get(s, "/static/style.css")[1].count(".hl") > 5  # pygments styles appended


def test_everything_is_escaped(site):
    s, _, evil = site
    for path in ("/", "/task/gemm_swiglu", f"/run/{evil.name}"):
        html = get(s, path)[1]
        assert EVIL not in html and "&lt;script&gt;" in html, path
    svg = get(s, "/plots/speedup.svg")[1]
    assert EVIL not in svg and ET.fromstring(svg) is not None
    assert json.loads(get(s, f"/run/{evil.name}.json")[1])["header"]["model"] == f"evil/{EVIL}"


def test_bad_and_empty_records_are_named_not_fatal(site, tmp_path):
    s, a, _ = site
    (a / "summary.json").write_text("{oops")
    broken = tmp_path / "runs" / "20260509-000000_gemm_rmsnorm_broken"
    broken.mkdir()
    (broken / "header.json").write_text("")
    # rows that do not parse (a JSON file with no rows at all is another record beside the results: skipped)
    (tmp_path / "bench" / "garbage.json").write_text('{"rows": [1, 2]}')
    status, html = get(s, "/")
    assert status == 200 and "anthropic/claude" in html
    problems = html[html.index('id="problems"'):]
    assert "3 files could not be read" in problems
    for name in (f"{a.name}/summary.json", f"{broken.name}/header.json", "bench/garbage.json"):
        assert name in problems, name
    status, html = get(s, f"/run/{broken.name}")
    assert status == 200 and "header.json</code>: empty file" in html and "No finished attempts yet." in html
    status, html = get(s, f"/run/{a.name}")
    assert status == 200 and "no readable summary.json; figures rolled up from the attempts" in html


def test_empty_runs_folder(tmp_path):
    s = Site(tmp_path / "runs", tmp_path / "bench")
    status, html = get(s, "/")
    assert status == 200 and "Nothing to compare yet" in html
    svg = get(s, "/plots/speedup.svg")[1]
    assert "no timed results yet" in svg
    assert json.loads(get(s, "/index.json")[1]) == {"groups": [], "apart": [], "problems": [],
                                                    "no_attempts": [], "summary": [], "runs": []}


def test_cpu_only_task_page_says_there_is_no_timing(tmp_path):
    make_run(tmp_path / "runs", device="cpu", outcomes=("passed",))
    html = get(Site(tmp_path / "runs", None), "/task/gemm_rmsnorm")[1]
    assert ("No timing for this task yet" in html and "time µs" not in html
            and "untimed: correctness and cost only" in html)


def test_export_writes_a_static_site_whose_links_resolve(site, tmp_path):
    s, _, evil = site
    out = tmp_path / "site"
    n = export_site(s, out)
    assert n == 4 + 3 * 2 + 2 * 2
    for page in out.rglob("*.html"):
        for link in parse(page.read_text()).links:
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.exists(), f"{page.relative_to(out)} links to missing {link}"
    assert json.loads((out / "run" / f"{evil.name}.json").read_text())["dir"] == evil.name
    assert (out / "plots" / "speedup.svg").read_text().startswith("<svg")


def test_server_on_loopback_serves_pages_with_safe_headers(site):
    s, a, _ = site
    server = serve(s, port=0)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/task/gemm_rmsnorm.json", timeout=10) as r:
            assert r.status == 200 and json.load(r)["task"] == "gemm_rmsnorm"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/run/{a.name}", timeout=10) as r:
            assert "script-src" not in r.headers["Content-Security-Policy"]
            assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert b"anthropic/claude" in r.read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
        assert err.value.code == 404
        rebind = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Host": "evil.example:80"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(rebind, timeout=10)
        assert err.value.code == 403
    finally:
        server.shutdown()
        server.server_close()
    assert server.server_address[0] == "127.0.0.1"


#: What a terminal or a browser would act on, in a run folder's, a task's and a model's name: a colour, a C1
#: CSI, a bell, a right-to-left override, DEL (a folder's name cannot hold NUL or "/").
CONTROLS = "\x1b[31m\x9b2J\x07\u202e\x7f"


def raw_controls(text: str) -> set[str]:
    """The control and bidi characters left raw in ``text`` (newline and tab are text)."""
    return {
        c for c in text if (unicodedata.category(c) == "Cc" and c not in "\n\t") or "\u202a" <= c <= "\u202e"}


def test_names_with_control_characters_are_written_out_on_every_page_served_and_exported(tmp_path):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    make_run(runs, model="anthropic/claude", outcomes=("passed",), times={"llama3-8b": 104.0})
    make_run(runs, task=f"gemm_rmsnorm{CONTROLS}", model=f"evil/{CONTROLS}",
             outcomes=("wrong_output", "passed"),
             # the task's name is in the folder's too
             times={"llama3-8b": 90.0}, created=T0 + timedelta(hours=1))
    renamed = make_run(runs, model=f"evil/{CONTROLS}", outcomes=("passed",), times={"llama3-8b": 95.0},
                       run_id="ren")
    renamed.rename(renamed.with_name(renamed.name + CONTROLS))
    s = Site(runs, bench)
    paths = s.paths()
    pages = {p: s.get(p) for p in paths}
    assert all(page.status == 200 for page in pages.values())
    for path, page in pages.items():
        assert not raw_controls(page.body.decode()), path
    names = "".join(
        page.body.decode() for page in pages.values() if page.content_type.startswith("text/html"))
    assert "evil/\\x1b[31m\\x9b2J\\x07\\u202e\\x7f" in names and "gemm_rmsnorm\\x1b[31m" in names
    assert "ren\\x1b[31m" in names  # the renamed folder's name, on the front page and its own

    out = tmp_path / "site"
    export_site(s, out)
    for page in out.rglob("*"):
        if page.is_file():
            assert not raw_controls(page.read_text()), page
            assert not raw_controls(page.name)

    server = serve(s, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for path in paths:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{path}",
                                        timeout=10) as r:
                assert not raw_controls(r.read().decode()), path
    finally:
        server.shutdown()
        server.server_close()


def test_view_refuses_other_hosts_without_the_unsafe_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(tmp_path / "bench"))  # not the repository's results
    code, _, err = run_cli(monkeypatch, capsys, "view", "--host", "0.0.0.0")
    assert code == 2 and "refusing to serve on 0.0.0.0" in err and "--unsafe-host" in err
    code, _, err = run_cli(monkeypatch, capsys, "view", "--port", "70000")
    assert code == 2 and "must be 0-65535" in err
    with socket.socket() as busy:  # another viewer holds the port: the fix is another --port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli(monkeypatch, capsys, "view", "--port", str(port))
    assert (code == 2 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in err
            and "pass another --port" in err)
    make_run(tmp_path / "runs", outcomes=("passed",))
    code, out, _ = run_cli(monkeypatch, capsys, "view", "--export", str(tmp_path / "out"))
    assert code == 0 and "wrote 9 files" in out and (tmp_path / "out" / "index.html").exists()


def test_status_replays_old_versions_and_untimed_rows_are_shown_honestly(tmp_path):
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    make_bench(bench, [bench_row("gemm_rmsnorm", "llama3-8b", 100.0)])
    original = make_run(runs, model="anthropic/claude", outcomes=("passed",), times={"llama3-8b": 104.0},
                        run_id="orig0001")
    replay = make_run(runs, model=f"replay/{original}", outcomes=("passed",), times={"llama3-8b": 103.0},
                      run_id="replay01", created=T0 + timedelta(hours=1))
    failed = make_run(runs, model="openai/gpt-5", outcomes=("wrong_output",), run_id="fail0001",
                      created=T0 + timedelta(hours=2))
    summary = json.loads((failed / "summary.json").read_text()) | {"status": "completed"}
    (failed / "summary.json").write_text(json.dumps(summary))
    make_run(runs, model="openai/gpt-5", version=2, device="cpu", outcomes=("passed",),
             created=T0 + timedelta(hours=3))
    site = Site(runs, bench)
    status, html = get(site, "/")
    assert status == 200
    assert '<td class="l status-bad">completed, no correct kernel</td>' in html
    assert '<td class="l status-ok">target reached, 1 correct</td>' in html
    assert "replay/" not in html.replace(f"replay/{original}", "") and "(replay of " in html
    assert "Speed not compared: runs on cpu have no GPU to time them" in html
    assert "no bench results found" not in html
    assert '<div class="note">old version, not compared</div>' in html
    # run names break only after an underscore, never inside the date or the id
    assert "_<wbr>gemm_<wbr>rmsnorm_<wbr>fail0001</a>" in html
    summary_rows = json.loads(get(site, "/index.json")[1])["summary"]
    assert {r["author"] for r in summary_rows} == {"human", "anthropic/claude", "openai/gpt-5"}
    status, page = get(site, f"/run/{failed.name}.html")
    assert 'class="status-bad">completed, no correct kernel' in page
    status, page = get(site, f"/run/{replay.name}.html")
    assert "<dd>anthropic/claude <span class=\"muted\">(a replay of run" in page
    status, html = get(Site(runs, tmp_path / "no-bench"), "/")
    assert f"no bench results found in {tmp_path / 'no-bench'}" in html and "not the wheel" in html


def test_a_task_kept_outside_the_search_path_is_found_where_its_runs_recorded_it(tmp_path):
    """A manual seat's task page said its task file was missing though its runs' headers named it."""
    import yaml

    from coda_agent.tasks import find_task
    from coda_agent.viewer.site import _task_spec

    suite = find_task("gemm_residual")
    data = yaml.safe_load(suite.path.read_text())
    data.update(name="my_gate", reference=f"{suite.reference_file.name}:reference", human=None)
    (tmp_path / suite.reference_file.name).write_text(suite.reference_file.read_text())
    mine = tmp_path / "my_gate.yaml"
    mine.write_text(yaml.safe_dump(data))
    assert _task_spec("my_gate") is None
    spec = _task_spec("my_gate", [None, str(tmp_path / "gone.yaml"), str(mine)])
    assert spec is not None and spec.name == "my_gate"
    assert _task_spec("other_name", [str(mine)]) is None  # a recorded file now holding another task: not it
