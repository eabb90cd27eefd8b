"""The provider registry: one entry per ``provider/`` prefix, with its lazy factory, help line and needs.

Each provider registers with ``@provider(...)`` on a factory that imports its implementation only when
called, so naming ``openai/...`` never imports the Anthropic SDK, and listing or checking specs imports
none. :func:`get_provider` builds a provider from a spec; :func:`lookup` says what a spec is without
building it (whether its candidates need the OS sandbox, whether it can join a sweep); :func:`registered`
lists the entries, for help texts and errors. A new provider is its module plus one factory below.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import settings
from .base import Provider, ProviderConfigError

#: Where a remote API is and which variable holds its key: only providers that call an API take them.
ENDPOINT_OPTIONS = frozenset({"base_url", "api_key_env"})
_REMOTE_OPTIONS = ENDPOINT_OPTIONS | {"timeout", "max_retries", "retry_base_delay", "prices"}


@dataclass(frozen=True)
class Request:
    """What a factory is asked to build."""

    target: str  # the spec after ``<name>/``: a model, a script, a run, a folder (empty where optional)
    options: dict[str, Any]  # already checked against the entry's options
    runs_dir: Path  # where run ids are looked up (``replay/<run id>``)


Factory = Callable[[Request], Provider]


@dataclass(frozen=True)
class ProviderEntry:
    """One registered provider."""

    name: str  # the prefix of its specs
    usage: str  # how a spec is written, e.g. ``anthropic/<model>``
    help: str  # one line: what it is
    needs: str  # what it needs to run (a key's variable, a flag), "nothing" when nothing
    factory: Factory
    options: frozenset[str]
    target_required: bool = True  # ``manual`` alone is a whole spec
    real_model: bool = False  # candidates come from a model nobody scripted: run them only in the OS sandbox
    replays_a_run: bool = False  # takes a recorded run's task and schedule, so it cannot join a sweep


_REGISTRY: dict[str, ProviderEntry] = {}


def provider(
    name: str, *, usage: str, help: str, needs: str = "nothing", options: frozenset[str] = frozenset(),
    target_required: bool = True, real_model: bool = False, replays_a_run: bool = False,
) -> Callable[[Factory], Factory]:
    """Register the decorated factory as the provider ``name`` (``name/...`` specs)."""

    def register(factory: Factory) -> Factory:
        if name in _REGISTRY:
            raise ValueError(f"provider {name!r} is registered twice")
        _REGISTRY[name] = ProviderEntry(
            name, usage, help, needs, factory, options, target_required, real_model, replays_a_run
        )
        return factory

    return register


def registered() -> list[ProviderEntry]:
    """Every provider, in the order registered."""
    return list(_REGISTRY.values())


def lookup(spec: str) -> ProviderEntry:
    """The entry for ``spec`` (``provider/model``); ProviderConfigError for an unknown prefix or a missing
    model."""
    name, _, target = spec.partition("/")
    entry = _REGISTRY.get(name)
    if entry is None:
        known = ", ".join(e.usage for e in registered())
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1, cutoff=0.6)
        hint = (
            f" (did you mean {f'{close[0]}/{target}' if target else _REGISTRY[close[0]].usage}?)"
            if close
            else ""
        )
        raise ProviderConfigError(f"unknown provider {spec!r}{hint}: expected one of {known}")
    if not target and entry.target_required:
        raise ProviderConfigError(f"{spec!r} names no model: expected {entry.usage}")
    return entry


def get_provider(spec: str, *, runs_dir: Path | None = None, **options: Any) -> Provider:
    """Build the provider named by ``spec`` (``provider/model``).

    Options set to None are ignored, so a CLI can pass its flags through unconditionally; ``runs_dir``
    (default ``settings.runs_dir()``) is where a run id is looked up. Raises ProviderConfigError (also a
    ValueError) for a bad spec or option, and ProviderError(AUTH or DISABLED) when a real API's key is
    missing or real calls are switched off: both fatal, one line.
    """
    entry = lookup(spec)
    given = {k: v for k, v in options.items() if v is not None}
    unknown = set(given) - entry.options
    if unknown & ENDPOINT_OPTIONS and not entry.options & ENDPOINT_OPTIONS:
        raise ProviderConfigError(f"{entry.name} calls no API: base_url and api_key_env do not apply")
    if unknown:
        allowed = ", ".join(sorted(entry.options)) or "none"
        raise ProviderConfigError(f"{entry.name}: unknown option(s) {', '.join(sorted(unknown))} (allowed: "
                                  f"{allowed})")
    return entry.factory(Request(spec.partition("/")[2], given, runs_dir or settings.runs_dir()))


# --------------------------------------------------------------------------------------------------
# The built-in providers. Each factory imports its module when called: the SDKs load only when used.


@provider(
    "anthropic", usage="anthropic/<model>", help="Anthropic messages API", real_model=True,
    needs="ANTHROPIC_API_KEY (a proxy: ANTHROPIC_BASE_URL or --base-url)", options=_REMOTE_OPTIONS,
)
def _anthropic(request: Request) -> Provider:
    from .anthropic_api import AnthropicProvider

    return AnthropicProvider(request.target, **request.options)


@provider(
    "openai", usage="openai/<model>", help="OpenAI chat completions", real_model=True,
    needs="OPENAI_API_KEY (a proxy: OPENAI_BASE_URL or --base-url)", options=_REMOTE_OPTIONS,
)
def _openai(request: Request) -> Provider:
    from .openai_api import OpenAIProvider

    return OpenAIProvider(request.target, **request.options)


@provider(
    "openai-compatible", usage="openai-compatible/<model> --base-url URL", real_model=True,
    help="any OpenAI-style server: vLLM, SGLang, Ollama, llama.cpp, gateways",
    needs="--base-url; a key in OPENAI_COMPATIBLE_API_KEY if the server wants one", options=_REMOTE_OPTIONS,
)
def _openai_compatible(request: Request) -> Provider:
    from .openai_api import OpenAICompatibleProvider

    return OpenAICompatibleProvider(request.target, **request.options)


@provider(
    "mock", usage="mock/<script.yaml|echo>", options=frozenset({"repeat_last"}),
    help="scripted replies (a YAML/JSON script, a shipped example by name, or echo): no network, no cost",
)
def _mock(request: Request) -> Provider:
    from .mock import mock_from_spec

    return mock_from_spec(request.target, **request.options)


@provider(
    "replay", usage="replay/<run>", replays_a_run=True,
    help="a recorded run's replies, in order, to re-verify it at zero cost (a folder, run id, prefix or "
         "latest)",
)
def _replay(request: Request) -> Provider:
    from .replay import ReplayProvider

    return ReplayProvider(request.target, request.runs_dir)


@provider(
    "manual", usage="manual[/<dir>]", target_required=False,
    options=frozenset({"directory", "timeout", "poll_interval", "notify"}),
    help="prompts to files, answers from files: a person or another agent is the model",
)
def _manual(request: Request) -> Provider:
    from .manual import ManualProvider

    options = dict(request.options)
    if request.target:
        options.setdefault("directory", request.target)
    return ManualProvider(**options)
