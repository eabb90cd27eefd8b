"""A stand-in for the agent process (``coda-agent run``) that calls ``verify()`` for the adversarial tests.

The real agent holds the provider API keys in its *initial* environment (the shell exported them), and the
verifier runs candidates below it. ``os.environ`` changes made inside a running process (pytest's
monkeypatch) never show up in ``/proc/<pid>/environ``, so a test that only monkeypatched keys into the
pytest process could not see a candidate read them from its parent. This helper is started with the fake
keys in its environment from the beginning, exactly like the agent, and serves verification requests:

    stdin:  one JSON object per line: {"task", "source", "plan": <Plan JSON>}
    stdout: one line per request: <token> + {"verdict": <Verdict JSON>, "wall_s": float}
            or <token> + {"error": <traceback>} when verify() itself raised.

The token (argv[1]) lets the driver skip anything else that might reach this process's stdout.

The helper makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process the verification
starts that detaches (double fork, ``setsid``) is re-parented to this helper instead of init, so the driver
finds every survivor by walking this helper's descendants, and never mistakes another user's process on a
shared machine for one. Between requests the helper reaps its exited children.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import time
import traceback

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Where prctl is refused (an unusual seccomp profile), survivors are still found by their marker."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"agent_proc: prctl(PR_SET_CHILD_SUBREAPER) failed (errno {ctypes.get_errno()}); "
              "detached survivors without the case's marker will not be found", file=sys.stderr)


def _reap() -> None:
    """Collect exited orphans (only between requests, never while verify() waits on its own child)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main() -> int:
    token = sys.argv[1]
    _become_subreaper()
    from coda_agent.tasks import find_task
    from coda_agent.verifier import Plan, verify

    out = sys.stdout
    out.write(token + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        t0 = time.perf_counter()
        try:
            task = find_task(req["task"])
            verdict = verify(task, req["source"], Plan.model_validate(req["plan"]))
            reply = {"verdict": verdict.model_dump_json(), "wall_s": time.perf_counter() - t0}
        except BaseException:
            reply = {"error": traceback.format_exc(limit=8), "wall_s": time.perf_counter() - t0}
        out.write(token + json.dumps(reply) + "\n")
        out.flush()
        _reap()
    return 0


if __name__ == "__main__":
    sys.exit(main())
