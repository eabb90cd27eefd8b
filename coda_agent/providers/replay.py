"""``replay/<run>``: serve a stored run's raw replies again, so it can be re-verified at zero cost.

``<run>`` is anything ``coda-agent show`` takes (a folder, a run id, a unique prefix or suffix, ``latest``),
found and read through the strict run-directory reader (``store/rundir.py``): the only way a provider
touches the store. Attempts are served in the order the original run asked for them: by round, then slot,
then index. An attempt that failed with a provider error replays that error (its kind is read from a
leading ``kind:`` in the recorded message, else OTHER). Token counts are the original ones, so token
budgets stop where they did; the cost is zero. Asking for more replies than the run recorded is a fatal
CONFIG error.
"""

from __future__ import annotations

from pathlib import Path

from ..messages import ChatMessage
from ..store.rundir import RunReader, RunRecordError, resolve_run
from .base import Completion, ErrorKind, Provider, ProviderConfigError, ProviderError, RecordedRun


def _recorded_error(message: str) -> ProviderError:
    head, _, _rest = message.partition(":")
    kind = ErrorKind(head.strip()) if head.strip() in {k.value for k in ErrorKind} else ErrorKind.OTHER
    return ProviderError(kind, f"replayed: {message}")


class ReplayProvider(Provider):
    """Replays one run's replies in order; records nothing, calls nothing."""

    def __init__(self, run: str | Path, runs_dir: Path) -> None:
        try:
            self.run_dir = resolve_run(run, runs_dir)
            reader = RunReader(self.run_dir)
            attempts = reader.attempts()
        except RunRecordError as exc:
            raise ProviderConfigError(f"replay/{run}: {exc}") from None
        if not attempts:
            raise ProviderConfigError(f"replay/{run}: the run has no finished attempts to replay")
        self.name = f"replay/{self.run_dir}"
        self.attempts = sorted(attempts, key=lambda a: (a.round, a.slot, a.index))
        header = reader.header
        self.model = header.model
        self.replays = RecordedRun(
            spec=self.name, task=header.task, task_path=header.task_path, rounds=header.budgets.rounds,
            candidates_per_round=header.budgets.candidates_per_round, task_version=header.task_version,
            task_hash=header.task_hash,
        )
        self._served = 0

    def skip_replies(self, count: int) -> None:
        self._served += count

    async def complete(
        self, messages: list[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        if self._served >= len(self.attempts):
            raise ProviderError(
                ErrorKind.CONFIG,
                f"{self.name}: all {len(self.attempts)} recorded replies were served already",
            )
        attempt = self.attempts[self._served]
        self._served += 1
        if attempt.provider_error:
            raise _recorded_error(attempt.provider_error)
        if attempt.raw_response is None:
            raise ProviderError(ErrorKind.OTHER, f"{self.name}: attempt {attempt.index} recorded no reply")
        return Completion(
            text=attempt.raw_response,
            model=self.model,
            input_tokens=attempt.usage.input_tokens,
            output_tokens=attempt.usage.output_tokens,
            finish_reason=attempt.finish_reason or "replayed",
        )
