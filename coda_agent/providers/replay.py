"""``replay/<run-dir>``: serve a stored run's raw replies again, so it can be re-verified at zero cost.

Attempts are read from ``<run-dir>/attempts/NNNN.json`` (see ``store/records.py``) and served in
the order the original run asked for them: by round, then slot, then index. An attempt that failed
with a provider error replays that error (its kind is read from a leading ``kind:`` in the recorded
message, else OTHER). Token counts are the original ones, so token budgets stop where they did;
the cost is zero. Asking for more replies than the run recorded is a fatal CONFIG error.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ..messages import ChatMessage
from ..store.records import Attempt, RunHeader
from .base import Completion, ErrorKind, Provider, ProviderConfigError, ProviderError


def load_attempts(run_dir: Path) -> list[Attempt]:
    """The run's finished attempts in call order; one clear error for a missing or corrupt run."""
    attempts_dir = run_dir / "attempts"
    if not attempts_dir.is_dir():
        raise ProviderConfigError(f"replay/{run_dir}: not a run directory (no attempts/ folder)")
    attempts = []
    for path in sorted(attempts_dir.glob("*.json")):
        try:
            attempts.append(Attempt.model_validate_json(path.read_text()))
        except (OSError, ValidationError) as exc:
            raise ProviderConfigError(f"replay/{run_dir}: cannot read {path.name}: {exc}") from exc
    if not attempts:
        raise ProviderConfigError(f"replay/{run_dir}: the run has no finished attempts to replay")
    return sorted(attempts, key=lambda a: (a.round, a.slot, a.index))


def _recorded_error(message: str) -> ProviderError:
    head, _, _rest = message.partition(":")
    kind = ErrorKind(head.strip()) if head.strip() in {k.value for k in ErrorKind} else ErrorKind.OTHER
    return ProviderError(kind, f"replayed: {message}")


class ReplayProvider(Provider):
    """Replays one run's replies in order; records nothing, calls nothing."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.name = f"replay/{run_dir}"
        self.attempts = load_attempts(self.run_dir)
        self.model = self._original_model()
        self._served = 0

    def _original_model(self) -> str:
        try:
            return RunHeader.model_validate_json((self.run_dir / "header.json").read_text()).model
        except (OSError, ValidationError):
            return self.name

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
