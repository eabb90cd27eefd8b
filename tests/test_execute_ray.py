"""The Ray executor on a real single-node cluster with two fake GPUs (Ray's ``num_gpus`` is only a count).

One cluster for the module (a start costs seconds; ``local_mode`` is gone). It binds to 127.0.0.1 only (the
conftest sets Ray's loopback gate before anything imports Ray) and writes no token into the home folder.
Skipped, saying so, where Ray is not installed.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest

ray = pytest.importorskip("ray",
                          reason="Ray is not installed (pip install 'coda-agent[ray]'): the Ray executor is "
                                 "untested")

from coda_agent.execute import Executor, Job, LocalExecutor  # noqa: E402
from coda_agent.execute.on_ray import RayExecutor  # noqa: E402
from coda_agent.store.rundir import RunReader  # noqa: E402
from coda_agent.tasks import find_task  # noqa: E402
from coda_agent.verifier import Plan, detect_sandbox  # noqa: E402
from coda_agent.verifier.verdict import Outcome, Verdict  # noqa: E402

from .conftest import cli  # noqa: E402

pytestmark = pytest.mark.ray
# The probes below travel to Ray's workers by value: this test module is not importable there.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPU, TIMED = Plan(), Plan(stages=["bench"])


@pytest.fixture(scope="module", autouse=True)
def cluster(tmp_path_factory: pytest.TempPathFactory):
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token file in the home folder; the cluster is on loopback
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", _temp_dir=str(tmp_path_factory.mktemp("ray")))
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    yield
    ray.shutdown()
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = saved


def probe(task, source, plan) -> Verdict:
    """What a worker sees of the GPUs, and when it held the job; ``DIE`` kills the worker's process."""
    if "DIE" in source:
        os._exit(1)
    start = time.time()
    time.sleep(0.5 if "SLOW" in source else 0)
    return Verdict(task=task.name, task_version=task.version, backend=plan.backend, outcome=Outcome.PASSED,
                   reason=repr(os.environ.get("CUDA_VISIBLE_DEVICES")),
                   timings={"start": start, "end": time.time()})


def placed(ex: Executor, jobs: list[Job]) -> list[tuple[str, Verdict]]:
    where: dict[int, str] = {}
    futures = [ex.submit(j, on_start=lambda w, i=i: where.__setitem__(i, w)) for i, j in enumerate(jobs)]
    verdicts = [f.result(timeout=180) for f in futures]
    return [(where[i], v) for i, v in enumerate(verdicts)]


def essence(v: Verdict) -> dict:
    """A verdict less its wall-clock figures."""
    out = v.model_dump(mode="json", exclude={"timings"})
    for st in out["stages"]:
        st.pop("seconds")
        st.pop("seconds_by_part")
    return out


def test_ray_gives_the_verdicts_the_local_executor_gives():
    """Human kernels of two tasks, a wrong one and one the static check rejects, on the CPU stage."""
    tasks = [find_task(n) for n in ("gemm_residual_rmsnorm", "gemm_swiglu")]
    human = {t.name: t.human_file.read_text() for t in tasks}
    k0 = tasks[0]
    wrong = human[k0.name].replace("h = acc + c", "h = acc - c")
    rejected = human[k0.name].replace("import", "import os\nimport", 1)
    one_seed = Plan(seeds=[0])
    jobs = [Job(t, human[t.name], one_seed, label=t.name) for t in tasks]
    jobs += [Job(k0, wrong, one_seed, label="wrong"), Job(k0, rejected, one_seed, label="rejected")]
    with LocalExecutor(cpu_workers=2, gpus=[]) as local:
        here = placed(local, jobs)
    with RayExecutor() as on_ray:
        assert on_ray.describe() == (
            "ray at a private local cluster: 2 CPUs, gpu0 (CUDA_VISIBLE_DEVICES=0), gpu1 "
            "(CUDA_VISIBLE_DEVICES=1)"
        )
        there = placed(on_ray, jobs)
    assert ([v.outcome for _, v in there]
            == [Outcome.PASSED] * 2 + [Outcome.WRONG_OUTPUT, Outcome.STATIC_REJECTED])
    assert [essence(v) for _, v in there] == [essence(v) for _, v in here]
    assert {w for w, _ in there} == {"cpu"}
    # the runner is sandboxed inside the Ray worker
    assert {v.sandbox for _, v in there[:3]} == {detect_sandbox().kind}


def test_one_long_lived_actor_per_gpu_each_seeing_only_its_gpu_and_cpu_tasks_none():
    jobs = [Job(find_task("gemm_residual"), f"SLOW {i}", TIMED, label=f"t{i}") for i in range(4)]
    jobs += [Job(find_task("gemm_residual"), f"cpu {i}", CPU, label=f"c{i}") for i in range(2)]
    with RayExecutor(verify_fn=probe) as ex:
        results = placed(ex, jobs)
    gpu = [(w, v) for w, v in results[:4]]
    assert sorted(w for w, _ in gpu) == ["gpu0", "gpu0", "gpu1", "gpu1"]
    assert {(w, v.reason) for w, v in gpu} == {("gpu0", "'0'"), ("gpu1", "'1'")}
    # GPU-blind, not merely unset
    assert [(w, v.reason) for w, v in results[4:]] == [("cpu", "''"), ("cpu", "''")]
    for device in ("gpu0", "gpu1"):  # timed jobs never overlap on one device...
        (a, b) = [v.timings for w, v in gpu if w == device]
        assert a["end"] <= b["start"] or b["end"] <= a["start"]
    first = {w: min(v.timings["start"] for w2, v in gpu if w2 == w) for w in ("gpu0", "gpu1")}
    ends = {w: min(v.timings["end"] for w2, v in gpu if w2 == w) for w in ("gpu0", "gpu1")}
    # ...and the two devices work side by side
    assert first["gpu1"] < ends["gpu0"] and first["gpu0"] < ends["gpu1"]


def test_a_worker_that_dies_is_reported_not_hung_on_and_its_gpu_comes_back():
    task = find_task("gemm_residual")
    with RayExecutor(verify_fn=probe) as ex:
        t0 = time.monotonic()
        (gpu_where, gpu_dead), (cpu_where, cpu_dead) = placed(ex,
                                                              [Job(task, "DIE", TIMED),
                                                               Job(task, "DIE", CPU)])
        assert time.monotonic() - t0 < 60
        assert gpu_dead.outcome is cpu_dead.outcome is Outcome.INFRA_ERROR
        assert gpu_dead.reason.startswith(
            f"the {gpu_where} worker failed while verifying this candidate (Actor")
        assert (cpu_where == "cpu"
                and cpu_dead.reason.startswith("the cpu worker failed while verifying this candidate ("))
        again = placed(ex, [Job(task, "after", TIMED), Job(task, "after", TIMED), Job(task, "after", CPU)])
    assert all(v.passed for _, v in again), [(w, v.reason) for w, v in again]
    assert sorted(w for w, _ in again) == ["cpu", "gpu0", "gpu1"]


def test_run_with_k_candidates_and_a_sweep_on_ray(capsys, tmp_path):
    runs = tmp_path / "runs"
    code, out, err = cli(capsys, "run", "gemm_residual_rmsnorm", "--model",
                         "mock/gemm_residual_three_attempts", "-k", "3", "--rounds", "1", "--no-compile",
                         "--seeds", "1", "--executor", "ray", "--plain", "--runs-dir", str(runs))
    assert code == 0, out + err
    assert "verifying on ray at a private local cluster: 2 CPUs, gpu0" in out
    # every attempt line says where it was verified
    assert len(re.findall(r"· verify [\d.]+ s on cpu ·", out)) == 3
    (run_dir,) = runs.iterdir()
    # the three candidates of one round, verified side by side: a syntax error, a wrong statistic, a correct
    # kernel
    assert [a.outcome for a in RunReader(run_dir).attempts()] == ["static_rejected", "wrong_output", "passed"]
    code, out, err = cli(capsys, "run", "gemm_residual", "gemm_swiglu", "--model", "mock/echo", "--rounds",
                         "1", "--no-compile", "--seeds", "1", "--executor", "ray", "--runs-dir",
                         str(tmp_path / "sweep"))
    assert code == 1, out + err  # mock/echo writes no correct kernel
    assert "verifying on ray at" in out and len(re.findall(r"· verify [\d.]+ s on cpu ·", out)) == 2
