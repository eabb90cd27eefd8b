"""The executor seam, local: who runs where, timed jobs alone on their GPU, dead workers reported, one-line
errors.

Probe verifiers stand in for the real one where the question is scheduling; the real verifier runs where the
question is the verdict. Ray's half is in ``test_execute_ray.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from concurrent.futures import wait

import pytest

from coda_agent.agent import Agent, AgentConfig, RunEvents
from coda_agent.execute import ExecutorError, Job, LocalExecutor, open_executor
from coda_agent.providers import MockProvider
from coda_agent.store.records import Budgets
from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, verify
from coda_agent.verifier.verdict import Outcome, StageResult, Verdict

from .conftest import cli

TASK = find_task("gemm_residual")
HUMAN = TASK.human_file.read_text()
UNTIMED, TIMED, CPU = ("gpu_correctness", "bench_prepare"), ("bench",), ("correctness",)
_seen: list[tuple[str, float, float]] = []
_seen_lock = threading.Lock()


def probe(task, source, plan) -> Verdict:
    """Holds its worker for a moment and records when (the label travels in the source)."""
    start = time.monotonic()
    time.sleep(0.3)
    with _seen_lock:
        _seen.append((source, start, time.monotonic()))
    return Verdict(task=task.name, task_version=task.version, backend=plan.backend, outcome=Outcome.PASSED)


def probe_device(task, source, plan) -> Verdict:
    """Says which GPU its process sees; ``DIE`` kills the process mid-job."""
    if "DIE" in source:
        os._exit(1)
    return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED,
                   reason=os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))


def job(label: str, stages: tuple[str, ...] = CPU, source: str | None = None) -> Job:
    return Job(TASK, source or label, Plan(stages=stages, seeds=[0]), label=label)


def most_at_once(labels: set[str]) -> int:
    spans = [(s, e) for src, s, e in _seen if src in labels]
    return max(sum(1 for s2, e2 in spans if s2 <= s < e2) for s, _ in spans)


def test_cpu_jobs_run_side_by_side_up_to_the_cpu_workers():
    _seen.clear()
    with LocalExecutor(cpu_workers=2, gpus=[], verify_fn=probe) as ex:
        futures = [ex.submit(job(f"c{i}")) for i in range(5)]
        wait(futures, timeout=30)
    assert all(f.result().passed for f in futures)
    assert most_at_once({f"c{i}" for i in range(5)}) == 2


def test_a_timed_job_has_its_gpu_to_itself_while_untimed_ones_share_it_and_cpu_jobs_go_on():
    _seen.clear()
    places: dict[str, str] = {}
    with LocalExecutor(cpu_workers=2, gpu_slots=3, gpus=["0"], verify_fn=probe) as ex:
        jobs = [job("u1", UNTIMED), job("u2", UNTIMED), job("t1", TIMED), job("u3", UNTIMED),
                job("t2", TIMED), job("c1"), job("c2")]
        futures = [ex.submit(j, on_start=lambda w, j=j: places.__setitem__(j.label, w)) for j in jobs]
        wait(futures, timeout=30)
    assert all(f.result().passed for f in futures)
    assert (places
            == {"u1": "gpu0", "u2": "gpu0", "t1": "gpu0", "u3": "gpu0", "t2": "gpu0", "c1": "cpu",
                "c2": "cpu"})
    spans = {src: (s, e) for src, s, e in _seen}
    for timed in ("t1", "t2"):  # nothing else on the device while a timed job runs
        s, e = spans[timed]
        assert all(
            e2 <= s or s2 >= e for src, (s2, e2) in spans.items() if src != timed and not src.startswith("c"))
    assert most_at_once({"u1", "u2"}) == 2  # untimed jobs share the device
    # in order: the timed job was not overtaken by a later untimed one
    assert spans["t1"][1] <= spans["u3"][0]
    assert spans["c1"][0] < spans["u1"][1]  # CPU jobs did not wait for the GPU


def test_without_a_gpu_a_gpu_job_gets_the_verifiers_own_answer():
    with LocalExecutor(gpus=[]) as ex:
        placed: list[str] = []
        plan = Plan(stages=UNTIMED, backend="quack", shape_set="bench")
        verdict = ex.submit(Job(TASK, HUMAN, plan), on_start=placed.append).result(60)
    direct = verify(TASK, HUMAN, plan)
    assert placed == ["cpu"] and verdict.outcome is direct.outcome is not Outcome.PASSED
    assert verdict.reason == direct.reason and "GPU" in verdict.reason.upper()


def test_each_gpu_has_a_worker_process_seeing_only_it_and_one_that_dies_is_reported_and_replaced():
    with LocalExecutor(gpus=["3", "5"], verify_fn=probe_device) as ex:
        assert (ex.describe()
                == "local: 2 CPU workers, gpu0 (CUDA_VISIBLE_DEVICES=3), gpu1 (CUDA_VISIBLE_DEVICES=5)")
        placed: dict[str, str] = {}
        first = [
            ex.submit(job(f"t{i}", TIMED), on_start=lambda w, i=i: placed.__setitem__(f"t{i}", w))
            for i in range(2)]
        seen = {placed[f"t{i}"]: f.result(120).reason for i, f in enumerate(first)}
        assert seen == {"gpu0": "3", "gpu1": "5"}
        dead = ex.submit(job("dies", TIMED, source="DIE")).result(120)
        assert dead.outcome is Outcome.INFRA_ERROR and "worker failed while verifying" in dead.reason
        assert "BrokenProcessPool" in dead.reason
        after = [f.result(120) for f in [ex.submit(job(f"a{i}", TIMED)) for i in range(2)]]
        assert sorted(v.reason for v in after) == ["3", "5"] and all(v.passed for v in after)


def test_a_verifier_that_raises_is_an_infra_error_not_a_lost_job():
    def broken(*_a, **_k):
        raise RuntimeError("checker bug")

    with LocalExecutor(gpus=[], verify_fn=broken) as ex:
        v = ex.submit(job("x")).result(10)
    assert (v.outcome is Outcome.INFRA_ERROR
            and v.reason == "the verifier itself failed:\nRuntimeError: checker bug")


class SharedMemory:
    """A GPU whose memory holds one job: with company, an allocation fails as torch says it; ``HOG`` never
    fits."""

    def __init__(self) -> None:
        self.running = 0
        self.runs: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, task, source, plan) -> Verdict:
        with self.lock:
            self.running += 1
        time.sleep(0.2)
        with self.lock:
            company = self.running - 1
            self.runs.append((source, company))
        try:
            if company or source == "HOG":
                return Verdict(task=task.name, task_version=task.version, backend="quack",
                               outcome=Outcome.RUNTIME_ERROR,
                               reason="forward() raised: OutOfMemoryError: CUDA out of memory. Tried to "
                                      "allocate 1002.00 MiB.")
            return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED)
        finally:
            time.sleep(0.05)
            with self.lock:
                self.running -= 1


def test_a_job_that_ran_out_of_gpu_memory_beside_others_runs_again_alone_and_that_verdict_is_its_own():
    gpu = SharedMemory()
    with LocalExecutor(gpu_slots=3, gpus=["0"], verify_fn=gpu) as ex:
        futures = {name: ex.submit(job(name, UNTIMED, source=name)) for name in ("a", "b", "HOG")}
        verdicts = {name: f.result(30) for name, f in futures.items()}
    assert verdicts["a"].passed and verdicts["b"].passed  # their first runs failed only for the company
    assert verdicts["HOG"].outcome is Outcome.RUNTIME_ERROR and verdicts["HOG"].out_of_gpu_memory  # alone too
    reruns = gpu.runs[3:]
    assert (sorted(src for src, _ in reruns) == ["HOG", "a", "b"]
            and all(company == 0 for _, company in reruns))


def test_a_job_alone_on_its_gpu_that_runs_out_of_memory_is_not_run_again():
    gpu = SharedMemory()
    with LocalExecutor(gpu_slots=3, gpus=["0"], verify_fn=gpu) as ex:
        verdict = ex.submit(job("HOG", UNTIMED, source="HOG")).result(30)
    assert verdict.out_of_gpu_memory and gpu.runs == [("HOG", 0)]


def test_cancel_drops_the_queued_jobs_and_the_running_one_still_answers():
    release = threading.Event()

    def held(task, source, plan):
        release.wait(10)
        return Verdict(task=task.name, task_version=task.version, backend="torch", outcome=Outcome.PASSED)

    ex = LocalExecutor(cpu_workers=1, gpus=[], verify_fn=held)
    running, queued = ex.submit(job("r")), ex.submit(job("q"))
    assert "cpu r" in ex.activity() and "1 queued" in ex.activity()
    ex.cancel()
    release.set()
    assert queued.cancelled() and running.result(10).passed
    ex.close()
    with pytest.raises(RuntimeError, match="closed"):
        ex.submit(job("late"))


class Placed(RunEvents):
    def __init__(self) -> None:
        self.where: dict[int, str] = {}

    def attempt_placed(self, index: int, worker: str) -> None:
        self.where[index] = worker


def test_the_loop_sends_its_k_candidates_to_a_shared_executor_and_hears_where_each_ran(tmp_path):
    _seen.clear()
    events = Placed()
    cfg = AgentConfig(model="mock/test", budgets=Budgets(rounds=1, candidates_per_round=3),
                      plan=Plan(stages=CPU, seeds=[0]))
    with LocalExecutor(cpu_workers=3, gpus=[], verify_fn=probe) as ex:
        agent = Agent.create(TASK, MockProvider([f"```python\n{HUMAN}```"] * 3), cfg, tmp_path, events=events,
                             executor=ex)
        summary = asyncio.run(agent.run())
    assert summary.attempts == 3 and summary.passes == 3 and events.where == {1: "cpu", 2: "cpu", 3: "cpu"}
    assert most_at_once({HUMAN}) == 3  # the round's candidates were verified together


def test_executor_errors_are_one_line(capsys, monkeypatch, tmp_path):
    with pytest.raises(ExecutorError, match="--address names a Ray cluster"):
        open_executor("local", address="127.0.0.1:6379")
    with pytest.raises(ExecutorError, match=r"unknown executor 'dask' \(known: local, ray\)"):
        open_executor("dask")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    runs = tmp_path / "runs"
    code, _, err = cli(capsys, "run", "gemm_residual", "--model", "mock/echo", "--executor", "ray",
                       "--runs-dir", str(runs))
    assert (code == 2
            and err.strip()
            == "error: --executor ray needs Ray, which is not installed here: pip install 'coda-agent[ray]'")
    assert not runs.exists()  # nothing was started


def test_an_unreachable_ray_address_is_one_line_at_once(capsys, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'coda-agent[ray]')")
    t0 = time.monotonic()
    code, _, err = cli(capsys, "run", "gemm_residual", "gemm_swiglu", "--model", "mock/echo", "--executor",
                       "ray", "--address", "127.0.0.1:1", "--runs-dir", str(tmp_path / "runs"))
    assert code == 2 and err.strip() == "error: cannot reach a Ray cluster at 127.0.0.1:1: Connection refused"
    assert time.monotonic() - t0 < 30 and not list((tmp_path / "runs").glob("*.sweep.json"))


@pytest.mark.ray
def test_ray_without_an_address_starts_a_private_cluster_on_loopback_and_stops_it(monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'coda-agent[ray]')")
    from coda_agent.execute.on_ray import RayExecutor

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token file in the home folder
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with RayExecutor(verify_fn=probe) as ex:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        assert (ex.describe().startswith("ray at a private local cluster: ")
                and ex.describe().endswith(", no GPU"))
        assert ex.submit(job("on-ray")).result(120).passed
    assert not ray.is_initialized()


def probe_bench(task, source, plan) -> Verdict:
    """The bench's two jobs as a GPU would answer them: every shape correct, then every shape timed at 100
    µs."""
    probe(task, task.name if plan.stages == list(TIMED) else f"check {task.name}", plan)
    if plan.stages == list(UNTIMED):
        st = StageResult(stage="gpu_correctness", outcome=Outcome.PASSED,
                         details={"shapes": {s: {"outcome": "passed"} for s in plan.shape_names}})
    else:
        t = {"median_us": 100.0, "p10_us": 99.0, "p90_us": 101.0, "reps": 50}
        st = StageResult(stage="bench", outcome=Outcome.PASSED,
                         details={"shapes": {s: {"dims": {}, "candidate": t, "eager": t}
                                             for s in plan.shape_names}})
    return Verdict(task=task.name, task_version=task.version, backend="quack", outcome=Outcome.PASSED,
                   stages=[st])


def test_a_check_that_fails_after_its_correctness_stage_says_why_and_keeps_its_correct_rows():
    from coda_agent.bench.runner import BenchOptions, check_tasks, checked_rows
    from coda_agent.measure.peaks import Peaks

    def prepare_fails(task, source, plan) -> Verdict:
        passed = probe_bench(task, source, plan)
        return passed.model_copy(update={"outcome": Outcome.INFRA_ERROR,
                                         "reason": "the checker failed: bench_prepare: Inductor crashed\n"
                                                   "traceback"})

    task = find_task("gemm_residual")
    said: list[str] = []
    with LocalExecutor(cpu_workers=1, gpu_slots=1, gpus=["0"], verify_fn=prepare_fails) as ex:
        checked = check_tasks([task], BenchOptions(seeds=1), said.append, ex)
    assert (said
            == ["checked gemm_residual on gpu0: infra_error (the checker failed: bench_prepare: Inductor "
                "crashed)"])
    rows = checked_rows(task, BenchOptions(seeds=1), checked[task.name], Peaks(800.0, 4.8, "test"))
    assert rows and all(r.correct and r.pending for r in rows)


def test_the_bench_checks_side_by_side_then_times_each_task_alone_on_its_gpu_and_checkpoints_in_order():
    from coda_agent.bench.runner import BenchOptions, run_bench
    from coda_agent.measure.peaks import Peaks

    _seen.clear()
    tasks = [find_task(n) for n in ("gemm_residual", "gemm_swiglu", "gemm_rope")]
    said: list[str] = []
    saved: list[tuple[int, list[str]]] = []  # per checkpoint: tasks checked, tasks timed
    with LocalExecutor(cpu_workers=3, gpu_slots=3, gpus=["0"], verify_fn=probe_bench) as ex:
        run = run_bench(tasks, BenchOptions(seeds=1), Peaks(800.0, 4.8, "test"), "NVIDIA H200",
                        "coda-agent bench", said.append,
                        lambda r: saved.append((len({row.task for row in r.rows}),
                                                             sorted({row.task for row in r.rows
                                                                     if not row.pending}))),
                        executor=ex)
    names = [t.name for t in tasks]
    assert sorted(said[:3]) == sorted(f"checked {n} on gpu0: passed" for n in names)
    assert sorted(said[3:]) == sorted(f"timed {n} on gpu0: passed" for n in names)
    # after each checked task (nothing timed yet), then after each timed task, in the tasks' order
    assert (saved
            == [(1, []), (2, []), (3, []), (3, sorted(names[:1])), (3, sorted(names[:2])),
                (3, sorted(names))])
    assert all(r.correct and r.candidate.median_us == 100.0 for r in run.rows)
    assert most_at_once({f"check {n}" for n in names}) == 3 and most_at_once(set(names)) == 1
