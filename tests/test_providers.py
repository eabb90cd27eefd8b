"""Providers: the real SDK paths against a fake server on 127.0.0.1, plus mock, replay, manual and prices."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from coda_agent.messages import ChatMessage
from coda_agent.providers import (
    Completion,
    ErrorKind,
    MockProvider,
    ProviderConfigError,
    ProviderError,
    RecordedRun,
    cost_usd,
    find_price,
    get_provider,
    lookup,
    price_table,
    registered,
    registry,
)
from coda_agent.providers.manual import ManualProvider
from coda_agent.providers.mock import estimate_tokens
from coda_agent.providers.remote import _retry_after_seconds, is_loopback
from coda_agent.providers.replay import ReplayProvider
from coda_agent.providers.retry import RetryPolicy
from coda_agent.store.records import Attempt, RunHeader, Usage, write_json_atomic

from .conftest import cli
from .fake_llm_server import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    FakeLLMServer,
    anthropic_error,
    anthropic_message,
    openai_chat,
    openai_error,
)

CHAT = [
    ChatMessage(role="system", content="You write kernels."),
    ChatMessage(role="user", content="Fuse the epilogue."),
]


def complete(provider: Any, messages: list[ChatMessage] = CHAT, **kwargs: Any) -> Completion:
    kwargs.setdefault("max_tokens", 1000)
    kwargs.setdefault("temperature", 0.7)
    return asyncio.run(provider.complete(messages, **kwargs))


def failure(provider: Any, messages: list[ChatMessage] = CHAT) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        complete(provider, messages)
    return info.value


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys present, no URL or price overrides leaking in from the developer's shell, real APIs off."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-anthropic-key")
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai-key")
    monkeypatch.setenv("CODA_AGENT_NO_REAL_API", "1")
    for name in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OPENAI_COMPATIBLE_API_KEY", "CODA_AGENT_PRICES"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer().start()
    yield server
    server.stop()


def anthropic_at(server: FakeLLMServer, model: str = "claude-sonnet-4-5", **options: Any) -> Any:
    options.setdefault("retry_base_delay", 0)
    return get_provider(f"anthropic/{model}", base_url=server.url, **options)


def openai_at(server: FakeLLMServer, model: str = "gpt-4.1", **options: Any) -> Any:
    options.setdefault("retry_base_delay", 0)
    return get_provider(f"openai/{model}", base_url=f"{server.url}/v1", **options)


# --- the real SDKs against the fake server ------------------------------------------------------


def test_anthropic_reply_tokens_cost_and_request_shape(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(
        ANTHROPIC_PATH, anthropic_message("```python\nx = 1\n```", input_tokens=1000, output_tokens=500)
    )
    provider = anthropic_at(fake_llm)

    # A large max_tokens must not trip the SDK's "use streaming" guard.
    result = complete(provider, max_tokens=64000)

    assert result.text == "```python\nx = 1\n```"
    assert (result.input_tokens, result.output_tokens) == (1000, 500)
    assert result.model == "claude-sonnet-4-5-20250929"
    assert result.finish_reason == "end_turn"
    assert result.price_known
    assert result.cost_usd == pytest.approx(1000 * 3 / 1e6 + 500 * 15 / 1e6)
    [request] = fake_llm.requests
    assert request.body["system"] == "You write kernels."
    assert request.body["messages"] == [{"role": "user", "content": "Fuse the epilogue."}]
    assert request.body["max_tokens"] == 64000
    assert "temperature" not in request.body  # rejected by the current Anthropic API version
    assert "test-anthropic-key" in (
        request.headers.get("x-api-key", "") + request.headers.get("authorization", "")
    )


def test_openai_reply_tokens_cost_and_request_shape(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(OPENAI_PATH, openai_chat("def build(): ...", prompt_tokens=2000, completion_tokens=100))
    result = complete(openai_at(fake_llm), temperature=0.3)

    assert result.text == "def build(): ..."
    assert (result.input_tokens, result.output_tokens) == (2000, 100)
    assert result.finish_reason == "stop"
    assert result.cost_usd == pytest.approx(2000 * 2 / 1e6 + 100 * 8 / 1e6)
    [request] = fake_llm.requests
    assert request.body["messages"][0] == {"role": "system", "content": "You write kernels."}
    assert request.body["max_completion_tokens"] == 1000
    assert request.body["temperature"] == 0.3
    assert request.headers["authorization"] == "Bearer test-openai-key"


def test_openai_reasoning_models_get_no_temperature(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(OPENAI_PATH, openai_chat("ok"))
    complete(openai_at(fake_llm, model="o3"))
    assert "temperature" not in fake_llm.requests[0].body


def test_openai_compatible_uses_placeholder_key_max_tokens_and_unknown_price(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(OPENAI_PATH, openai_chat("hi", prompt_tokens=7, completion_tokens=3, model="qwen"))
    provider = get_provider("openai-compatible/qwen", base_url=f"{fake_llm.url}/v1", retry_base_delay=0)

    result = complete(provider)

    assert (result.text, result.input_tokens, result.output_tokens) == ("hi", 7, 3)
    assert result.cost_usd == 0.0 and not result.price_known
    [request] = fake_llm.requests
    assert request.body["max_tokens"] == 1000 and "max_completion_tokens" not in request.body
    assert request.headers["authorization"] == "Bearer not-needed"


def test_openai_compatible_key_from_chosen_env_var(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProviderError, match="MY_GATEWAY_KEY is not set") as info:
        get_provider("openai-compatible/m", base_url=f"{fake_llm.url}/v1", api_key_env="MY_GATEWAY_KEY")
    assert info.value.kind is ErrorKind.AUTH

    monkeypatch.setenv("MY_GATEWAY_KEY", "secret-1")
    fake_llm.reply(OPENAI_PATH, openai_chat("ok"))
    complete(get_provider("openai-compatible/m", base_url=f"{fake_llm.url}/v1", api_key_env="MY_GATEWAY_KEY"))
    assert fake_llm.requests[0].headers["authorization"] == "Bearer secret-1"


def test_rate_limit_is_retried_after_the_servers_retry_after(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(
        ANTHROPIC_PATH,
        anthropic_error("rate_limit_error", "slow down"),
        status=429,
        headers={"retry-after": "7"},
    )
    fake_llm.reply(ANTHROPIC_PATH, anthropic_message("done"))
    provider = anthropic_at(fake_llm, retry_base_delay=1.0)
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    provider.retry.sleep = record

    assert complete(provider).text == "done"
    assert len(fake_llm.requests) == 2
    assert waits == [7.0]


@pytest.mark.parametrize("path", [ANTHROPIC_PATH, OPENAI_PATH])
def test_server_error_then_success_is_retried(fake_llm: FakeLLMServer, path: str) -> None:
    if path == ANTHROPIC_PATH:
        fake_llm.reply(path, anthropic_error("api_error", "boom"), status=500)
        fake_llm.reply(path, anthropic_message("recovered"))
        provider = anthropic_at(fake_llm)
    else:
        fake_llm.reply(path, openai_error("boom", error_type="server_error"), status=503)
        fake_llm.reply(path, openai_chat("recovered"))
        provider = openai_at(fake_llm)
    assert complete(provider).text == "recovered"
    assert len(fake_llm.requests) == 2


def test_persistent_server_error_gives_up_after_bounded_tries(fake_llm: FakeLLMServer) -> None:
    for _ in range(3):
        fake_llm.reply(OPENAI_PATH, openai_error("overloaded", error_type="server_error"), status=500)
    error = failure(openai_at(fake_llm, max_retries=2))
    assert error.kind is ErrorKind.SERVER
    assert "gave up after 3 tries" in str(error)
    assert len(fake_llm.requests) == 3


@pytest.mark.parametrize(
    ("path", "env_var"), [(ANTHROPIC_PATH, "ANTHROPIC_API_KEY"), (OPENAI_PATH, "OPENAI_API_KEY")]
)
def test_bad_key_is_fatal_not_retried_and_names_the_env_var(
    fake_llm: FakeLLMServer, path: str, env_var: str
) -> None:
    if path == ANTHROPIC_PATH:
        fake_llm.reply(path, anthropic_error("authentication_error", "invalid x-api-key"), status=401)
        provider = anthropic_at(fake_llm)
    else:
        fake_llm.reply(path, openai_error("Incorrect API key provided", code="invalid_api_key"), status=401)
        provider = openai_at(fake_llm)
    error = failure(provider)
    assert error.kind is ErrorKind.AUTH and error.kind.fatal
    assert env_var in str(error) and "\n" not in str(error)
    assert len(fake_llm.requests) == 1


def test_unknown_model_is_not_found(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(ANTHROPIC_PATH, anthropic_error("not_found_error", "model: claude-nope"), status=404)
    error = failure(anthropic_at(fake_llm, model="claude-nope"))
    assert error.kind is ErrorKind.NOT_FOUND and error.kind.fatal
    assert "unknown model 'claude-nope'" in str(error)
    assert len(fake_llm.requests) == 1


def test_bad_request_is_recorded_not_retried(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(OPENAI_PATH, openai_error("context length exceeded"), status=400)
    error = failure(openai_at(fake_llm))
    assert error.kind is ErrorKind.BAD_REQUEST and not error.kind.retryable and not error.kind.fatal
    assert "context length exceeded" in str(error)
    assert len(fake_llm.requests) == 1


def test_insufficient_quota_is_fatal_not_a_rate_limit(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(
        OPENAI_PATH, openai_error("You exceeded your quota", code="insufficient_quota"), status=429
    )
    error = failure(openai_at(fake_llm))
    assert error.kind is ErrorKind.AUTH
    assert len(fake_llm.requests) == 1


def test_slow_server_times_out(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply(OPENAI_PATH, openai_chat("late"), delay=1.0)
    error = failure(openai_at(fake_llm, timeout=0.2, max_retries=0))
    assert error.kind is ErrorKind.TIMEOUT and error.kind.retryable


def test_connection_refused_is_retried_then_reported(fake_llm: FakeLLMServer) -> None:
    """Never reached: unreachable (fatal, the run stops); reached once before: a passing failure
    (retryable)."""
    url = fake_llm.url
    fake_llm.reply(OPENAI_PATH, openai_chat("hello"))
    reached = get_provider("openai/gpt-4.1", base_url=f"{url}/v1", retry_base_delay=0, max_retries=1)
    assert complete(reached).text == "hello"
    fake_llm.stop()  # nothing listens on that port any more
    never = get_provider("openai/gpt-4.1", base_url=f"{url}/v1", retry_base_delay=0, max_retries=1)
    error = failure(never)
    assert error.kind is ErrorKind.UNREACHABLE and error.kind.fatal and not error.kind.retryable
    assert "cannot connect" in str(error) and "is the server up" in str(error)
    later = failure(reached)
    assert later.kind is ErrorKind.TIMEOUT and not later.kind.fatal
    assert "cannot connect" in str(later) and "gave up after 2 tries" in str(later)


def test_concurrent_calls_and_a_new_event_loop_share_one_provider(fake_llm: FakeLLMServer) -> None:
    provider = openai_at(fake_llm)
    for i in range(4):
        fake_llm.reply(OPENAI_PATH, openai_chat(f"reply {i}"))

    async def three() -> list[Completion]:
        return list(
            await asyncio.gather(*(provider.complete(CHAT, max_tokens=10, temperature=1.0) for _ in range(3)))
        )

    assert sorted(c.text for c in asyncio.run(three())) == ["reply 0", "reply 1", "reply 2"]
    assert complete(provider).text == "reply 3"  # a second asyncio.run: the client is rebuilt for its loop


# --- keys and the no-real-API switch ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "env_var"),
    [("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"), ("openai/gpt-4.1", "OPENAI_API_KEY")],
)
def test_missing_key_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, spec: str, env_var: str
) -> None:
    monkeypatch.delenv(env_var)
    with pytest.raises(ProviderError) as info:
        get_provider(spec, base_url="http://127.0.0.1:9")
    assert info.value.kind is ErrorKind.AUTH
    assert str(info.value) == f"{env_var} is not set: export {env_var}=<your key> to use {spec}"


@pytest.mark.parametrize(
    ("spec", "base_url"),
    [
        ("anthropic/claude-sonnet-4-5", None),
        ("openai/gpt-4.1", None),
        ("openai/gpt-4.1", "http://10.0.0.5:8000/v1"),
        ("openai-compatible/qwen", "https://gateway.example.com/v1"),
    ],
)
def test_no_real_api_switch_refuses_remote_endpoints(spec: str, base_url: str | None) -> None:
    with pytest.raises(ProviderError, match="CODA_AGENT_NO_REAL_API") as info:
        get_provider(spec, base_url=base_url)
    assert info.value.kind is ErrorKind.DISABLED and info.value.kind.fatal


def test_no_real_api_switch_sees_the_sdk_base_url_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.example.com")
    with pytest.raises(ProviderError, match=r"proxy\.example\.com"):
        get_provider("anthropic/claude-sonnet-4-5")


def test_no_real_api_switch_is_checked_again_before_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODA_AGENT_NO_REAL_API", "0")
    provider = get_provider("anthropic/claude-sonnet-4-5")  # built while allowed; no network yet
    monkeypatch.setenv("CODA_AGENT_NO_REAL_API", "1")
    assert failure(provider).kind is ErrorKind.DISABLED


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.9.10", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000", True),
        ("http://10.0.0.1:8000", False),
        ("https://api.openai.com/v1", False),
        ("http://127.0.0.1.example.com", False),
        ("", False),
    ],
)
def test_loopback_detection(url: str, loopback: bool) -> None:
    assert is_loopback(url) is loopback


# --- get_provider -------------------------------------------------------------------------------


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(ProviderConfigError) as info:
        get_provider("gemini/pro")
    assert isinstance(info.value, ValueError) and info.value.kind is ErrorKind.CONFIG
    for entry in registered():
        assert entry.usage in str(info.value)


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("anthropic/", {}, "names no model"),
        ("openai-compatible/qwen", {}, "needs a base URL"),
        ("openai/gpt-4.1", {"temprature": 0.5}, "unknown option"),
        ("mock/echo", {"base_url": "http://127.0.0.1:1"}, "calls no API"),
        ("replay/nowhere", {}, "not a run directory"),
        ("mock/no-such-script.yaml", {}, "built-ins: echo"),
    ],
)
def test_get_provider_config_errors(spec: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ProviderConfigError, match=message):
        get_provider(spec, **kwargs)


def test_get_provider_ignores_options_set_to_none() -> None:
    provider = get_provider("mock/echo", base_url=None, repeat_last=None)
    assert complete(provider).text == "Fuse the epilogue."


def test_the_registry_says_what_each_spec_is_without_building_it() -> None:
    assert ([e.name for e in registered()]
            == ["anthropic", "openai", "openai-compatible", "mock", "replay", "manual"])
    assert {e.name for e in registered() if e.real_model} == {"anthropic", "openai", "openai-compatible"}
    assert [e.name for e in registered() if e.replays_a_run] == ["replay"]
    # nothing is built
    assert lookup("manual").name == "manual" and lookup("replay/no-such-run").replays_a_run
    assert all(e.usage.startswith(e.name) and e.help and e.needs for e in registered())
    assert ("ANTHROPIC_API_KEY" in lookup("anthropic/x").needs
            and "--base-url" in lookup("openai-compatible/x").needs)


def test_naming_or_listing_providers_imports_no_sdk() -> None:
    """Each factory imports its module when called: mock, replay and manual runs never load an SDK."""
    probe = (
        "import sys; from coda_agent.providers import get_provider, lookup, registered; "
        "[lookup(f'{e.name}/x') for e in registered()]; get_provider('mock/echo'); "
        "print(sorted(m for m in ('anthropic', 'openai', 'coda_agent.store') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_providers_command_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "providers", "--format", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and list(rows) == [e.name for e in registered()]
    assert rows["anthropic"]["sandbox_required"] and "bubblewrap" in rows["anthropic"]["needs"]
    assert rows["manual"]["spec"] == "manual[/<dir>]" and rows["mock"]["options"] == ["repeat_last"]
    code, out, _ = cli(capsys, "providers")
    assert code == 0 and all(e.usage in out for e in registered()) and "ANTHROPIC_API_KEY" in out
    code, _, err = cli(capsys, "providers", "--format", "xml")
    assert code == 2 and "unknown --format 'xml'" in err


def test_a_registered_provider_is_built_by_its_factory_with_checked_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # registrations made here vanish after
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    built: list[registry.Request] = []

    @registry.provider("canned", usage="canned/<text>", help="replies with its text",
                       options=frozenset({"times"}))
    def _canned(request: registry.Request) -> MockProvider:
        built.append(request)
        return MockProvider([request.target] * request.options.get("times", 1),
                            name=f"canned/{request.target}")

    assert complete(get_provider("canned/hello", times=2, runs_dir=Path("elsewhere"))).text == "hello"
    assert built == [registry.Request("hello", {"times": 2}, Path("elsewhere"))]
    with pytest.raises(ProviderConfigError, match=r"canned: unknown option\(s\) colour \(allowed: times\)"):
        get_provider("canned/hello", colour="red")
    with pytest.raises(ProviderConfigError, match="canned calls no API"):
        get_provider("canned/hello", base_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="registered twice"):
        registry.provider("canned", usage="canned/<x>", help="again")(_canned)


# --- retry policy -----------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_caps() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=5.0)
    for retry, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (8, 5.0)]:
        delays = [policy.delay(retry, None) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered
    assert policy.delay(0, 12.0) == 12.0
    assert policy.delay(0, 10_000.0) == policy.max_retry_after


def test_zero_base_delay_turns_all_waiting_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODA_AGENT_RETRY_BASE_DELAY", "0")
    policy = RetryPolicy()
    assert policy.base_delay == 0
    assert policy.delay(3, None) == 0 and policy.delay(0, 30.0) == 0


def test_retry_after_header_forms() -> None:
    assert _retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert _retry_after_seconds({"retry-after": "3"}) == 3.0
    in_ten = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=10), usegmt=True)
    assert 8 <= (_retry_after_seconds({"retry-after": in_ten}) or 0) <= 10
    assert _retry_after_seconds({"retry-after": "soon"}) is None
    assert _retry_after_seconds({}) is None


# --- prices -----------------------------------------------------------------------------------------


def test_cost_from_the_builtin_table() -> None:
    assert cost_usd("anthropic/claude-sonnet-4-5", 1_000_000, 1_000_000) == pytest.approx(18.0)
    assert cost_usd("openai/gpt-4o-mini", 2_000_000, 0) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("spec", "base"),
    [
        ("anthropic/claude-sonnet-4-5-20250929", "anthropic/claude-sonnet-4-5"),
        ("openai/gpt-4o-2024-08-06", "openai/gpt-4o"),
        ("openai/gpt-4o-mini-2024-07-18", "openai/gpt-4o-mini"),
        ("anthropic/claude-3-5-haiku-latest", "anthropic/claude-3-5-haiku"),
    ],
)
def test_dated_snapshots_use_their_base_price(spec: str, base: str) -> None:
    assert find_price(spec) == find_price(base) is not None


@pytest.mark.parametrize("spec", ["openai/o3-pro", "openai-compatible/qwen", "anthropic/claude-future-9"])
def test_unknown_models_have_no_price(spec: str) -> None:
    assert cost_usd(spec, 1000, 1000) is None


def test_price_file_overrides_and_extends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "anthropic/claude-sonnet-4-5: {input: 1.0, output: 2.0}\n"
        "openai-compatible/qwen: {input: 0.5, output: 0.5}\n"
    )
    monkeypatch.setenv("CODA_AGENT_PRICES", str(prices))
    assert cost_usd("anthropic/claude-sonnet-4-5", 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert cost_usd("openai-compatible/qwen", 1_000_000, 0) == pytest.approx(0.5)
    assert cost_usd("openai/gpt-4.1", 1_000_000, 0) == pytest.approx(2.0)  # untouched entries stay


def test_price_option_reaches_the_provider(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai-compatible/qwen": {"input": 10.0, "output": 20.0}}))
    fake_llm.reply(OPENAI_PATH, openai_chat("hi", prompt_tokens=100_000, completion_tokens=50_000))
    provider = get_provider("openai-compatible/qwen", base_url=f"{fake_llm.url}/v1", prices=str(prices))
    result = complete(provider)
    assert result.price_known and result.cost_usd == pytest.approx(1.0 + 1.0)


@pytest.mark.parametrize(
    "content",
    ["- not a mapping\n", "openai/x: {input: 1}\n", "openai/x: {input: one, output: 2}\n", "a: [\n"],
)
def test_bad_price_file_is_one_clear_error(tmp_path: Path, content: str) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(content)
    with pytest.raises(ProviderConfigError, match="price file"):
        price_table(prices)


# --- mock -------------------------------------------------------------------------------------------


def test_mock_list_serves_in_order_records_calls_and_errors_when_exhausted() -> None:
    provider = MockProvider(["first", {"text": "second", "input_tokens": 11, "output_tokens": 22}])
    first = complete(provider, temperature=0.2)
    second = complete(provider)
    assert (first.text, second.text) == ("first", "second")
    assert (second.input_tokens, second.output_tokens) == (11, 22)
    assert first.output_tokens == estimate_tokens("first") and first.input_tokens > 0
    assert first.cost_usd == 0.0 and first.price_known
    assert [c.messages for c in provider.calls] == [CHAT, CHAT]
    assert provider.calls[0].temperature == 0.2 and provider.calls[0].max_tokens == 1000

    error = failure(provider)
    assert error.kind is ErrorKind.CONFIG and error.kind.fatal
    assert "ran out of responses: call #3, but the script has 2" in str(error)


def test_mock_records_a_snapshot_of_the_messages() -> None:
    provider = MockProvider(["a"])
    messages = list(CHAT)
    complete(provider, messages)
    messages.append(ChatMessage(role="user", content="later"))
    assert len(provider.calls[0].messages) == 2


def test_mock_repeat_last() -> None:
    provider = MockProvider(["a", "b"], repeat_last=True)
    assert [complete(provider).text for _ in range(4)] == ["a", "b", "b", "b"]


def test_mock_scripted_errors_are_raised_as_written() -> None:
    provider = MockProvider([{"error": "rate_limit", "message": "slow down"}, "ok"])
    error = failure(provider)
    assert error.kind is ErrorKind.RATE_LIMIT and str(error) == "slow down"
    assert complete(provider).text == "ok"  # no hidden retry consumed it


def test_mock_yaml_file(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(
        "- plain reply\n"
        "- {text: counted, input_tokens: 5, output_tokens: 6, finish_reason: length}\n"
        "- {error: server}\n"
    )
    provider = get_provider(f"mock/{script}")
    assert provider.name == f"mock/{script}"
    assert complete(provider).text == "plain reply"
    counted = complete(provider)
    assert (counted.input_tokens, counted.output_tokens, counted.finish_reason) == (5, 6, "length")
    assert failure(provider).kind is ErrorKind.SERVER


def test_mock_json_file_with_repeat_last(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": ["only"], "repeat_last": True}))
    provider = get_provider(f"mock/{script}")
    assert [complete(provider).text for _ in range(3)] == ["only"] * 3


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([], "no responses"),
        ([{"txt": "typo"}], "unknown key"),
        ([{"error": "teapot"}], "is not one of"),
        ([{"input_tokens": 3}], "needs 'text'"),
        ([42], "must be a string or a mapping"),
        ("just a string", "must be a list"),
    ],
)
def test_mock_script_validation(script: Any, message: str) -> None:
    with pytest.raises(ProviderConfigError, match=message):
        MockProvider(script)


def test_mock_unreadable_file(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("responses: [\n")
    with pytest.raises(ProviderConfigError, match="cannot read mock script") as raised:
        get_provider(f"mock/{script}")
    assert "\n" not in str(raised.value) and "line 2, column 1: not valid YAML (" in str(raised.value)


def test_mock_callable_sync_and_async() -> None:
    def last_words(messages: list[ChatMessage]) -> str:
        return messages[-1].content.upper()

    async def counted(messages: list[ChatMessage]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"text": str(len(messages)), "output_tokens": 1}

    assert complete(MockProvider(last_words)).text == "FUSE THE EPILOGUE."
    result = complete(MockProvider(counted))
    assert (result.text, result.output_tokens) == ("2", 1)


def test_mock_concurrent_calls_get_replies_in_call_order() -> None:
    provider = MockProvider(["r0", "r1", "r2"])

    async def three() -> list[str]:
        results = await asyncio.gather(
            *(provider.complete(CHAT, max_tokens=5, temperature=1.0) for _ in range(3))
        )
        return [r.text for r in results]

    assert asyncio.run(three()) == ["r0", "r1", "r2"]


def test_mock_echo() -> None:
    assert complete(get_provider("mock/echo")).text == "Fuse the epilogue."


# --- replay -----------------------------------------------------------------------------------------


def _attempt(index: int, round: int, slot: int, **fields: Any) -> Attempt:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return Attempt(index=index, round=round, slot=slot, started=now, finished=now, messages=CHAT, **fields)


def _write_run(run_dir: Path, attempts: list[Attempt]) -> None:
    header = RunHeader(
        run_id="r1", created=datetime(2026, 1, 1, tzinfo=timezone.utc), task="t", task_version=1,
        task_path="tasks/t.yaml", model="anthropic/claude-sonnet-4-5",
    )  # fmt: skip
    write_json_atomic(run_dir / "header.json", header)
    for attempt in attempts:
        write_json_atomic(run_dir / "attempts" / f"{attempt.index:04d}.json", attempt)


def test_replay_serves_replies_in_call_order_with_errors(tmp_path: Path) -> None:
    _write_run(
        tmp_path,
        [
            # Round 1's two slots finished out of order: slot 1 got index 1.
            _attempt(
                1,
                1,
                1,
                raw_response="round 1 slot 1",
                usage=Usage(input_tokens=10, output_tokens=20, cost_usd=0.5),
            ),
            _attempt(2, 1, 0, raw_response="round 1 slot 0", finish_reason="length"),
            _attempt(3, 2, 0, provider_error="rate_limit: slow down"),
            _attempt(4, 3, 0, provider_error="the server hung up"),
        ],
    )
    provider = get_provider(f"replay/{tmp_path}")

    first, second = complete(provider), complete(provider)
    assert (first.text, second.text) == ("round 1 slot 0", "round 1 slot 1")
    assert (second.input_tokens, second.output_tokens, second.cost_usd) == (10, 20, 0.0)
    assert first.model == "anthropic/claude-sonnet-4-5"
    assert (first.finish_reason, second.finish_reason) == ("length", "replayed")
    limited = failure(provider)
    assert limited.kind is ErrorKind.RATE_LIMIT and "slow down" in str(limited)
    assert failure(provider).kind is ErrorKind.OTHER
    exhausted = failure(provider)
    assert exhausted.kind is ErrorKind.CONFIG and "all 4 recorded replies" in str(exhausted)


def test_replay_finds_a_run_by_id_says_what_it_replays_and_skips_what_a_resume_consumed(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    _write_run(runs / "20260101-000000_t_r1",
               [_attempt(i, i, 0, raw_response=f"reply {i}") for i in (1, 2, 3)])
    provider = get_provider("replay/r1", runs_dir=runs)  # a unique suffix, as `show` takes it
    assert provider.name == f"replay/{runs / '20260101-000000_t_r1'}"
    assert provider.replays == RecordedRun(
        spec=provider.name, task="t", task_path="tasks/t.yaml", rounds=5, candidates_per_round=1,
        task_version=1, task_hash=None,  # the header's, for a note where the task replayed onto differs
    )
    provider.skip_replies(2)
    assert complete(provider).text == "reply 3"
    assert failure(provider).kind is ErrorKind.CONFIG


def test_a_script_skips_what_a_resume_consumed_and_a_function_has_nothing_to_skip() -> None:
    scripted = MockProvider(["one", "two", "three"])
    scripted.skip_replies(2)
    assert complete(scripted).text == "three"
    assert "call #4, but the script has 3" in str(failure(scripted))
    echo = get_provider("mock/echo")
    echo.skip_replies(5)
    assert complete(echo).text == "Fuse the epilogue." and echo.replays is None


def test_replay_rejects_empty_and_corrupt_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    with pytest.raises(ProviderConfigError, match=r"replay/r1: no run 'r1'"):
        ReplayProvider("r1", tmp_path / "runs")
    (run_dir / "attempts").mkdir(parents=True)
    with pytest.raises(ProviderConfigError, match=r"header\.json: missing"):
        ReplayProvider("r1", tmp_path / "runs")
    _write_run(run_dir, [])
    with pytest.raises(ProviderConfigError, match="no finished attempts"):
        ReplayProvider("r1", tmp_path / "runs")
    (run_dir / "attempts" / "0001.json").write_text("{not json")
    with pytest.raises(ProviderConfigError, match=r"0001\.json: unreadable run record \(invalid JSON"):
        ReplayProvider("r1", tmp_path / "runs")


# --- manual -----------------------------------------------------------------------------------------


def _answer_when_prompted(directory: Path, number: int, text: str) -> threading.Thread:
    def answer() -> None:
        prompt = directory / f"prompt-{number}.md"
        deadline = time.monotonic() + 5
        while not prompt.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (directory / f"answer-{number}.md").write_text(text)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_manual_writes_the_prompt_and_waits_for_the_answer(tmp_path: Path) -> None:
    lines: list[str] = []
    provider = get_provider(f"manual/{tmp_path}", poll_interval=0.01, notify=lines.append)
    thread = _answer_when_prompted(tmp_path, 1, "```python\nkernel = 1\n```\n")

    result = complete(provider)
    thread.join()

    assert result.text == "```python\nkernel = 1\n```\n"
    assert result.cost_usd == 0.0 and not result.price_known  # shown as unknown, not as free
    prompt = (tmp_path / "prompt-1.md").read_text()
    assert "## [system]\n\nYou write kernels." in prompt and "## [user]\n\nFuse the epilogue." in prompt
    [line] = lines
    assert str(tmp_path / "prompt-1.md") in line and str(tmp_path / "answer-1.md") in line


def test_bare_manual_trades_files_in_the_run_directory_and_a_given_folder_stays(tmp_path: Path) -> None:
    bare, given = get_provider("manual"), get_provider(f"manual/{tmp_path / 'mine'}")
    assert bare.directory == Path("coda-manual")  # no run directory known yet
    for provider in (bare, given):
        provider.bind_run_dir(tmp_path / "run")
    assert (bare.directory, given.directory) == (tmp_path / "run" / "manual", tmp_path / "mine")


def test_manual_numbering_skips_stale_files(tmp_path: Path) -> None:
    (tmp_path / "answer-3.md").write_text("stale")
    provider = ManualProvider(tmp_path, poll_interval=0.01, notify=lambda _: None)
    thread = _answer_when_prompted(tmp_path, 4, "fresh")
    assert complete(provider).text == "fresh"
    thread.join()


def test_a_resumed_manual_run_takes_the_answer_saved_for_the_prompt_it_was_waiting_on(tmp_path: Path) -> None:
    from coda_agent.providers.manual import render_prompt

    # the run stopped here, then the reply was saved
    (tmp_path / "prompt-2.md").write_text(render_prompt(CHAT))
    (tmp_path / "answer-2.md").write_text("saved while the run was down")
    provider = ManualProvider(tmp_path, poll_interval=0.01, notify=lambda _: None)
    assert complete(provider).text == "saved while the run was down"
    assert not (tmp_path / "prompt-3.md").exists()
    other = tmp_path / "other"  # a newest prompt that is another chat is not reused
    other.mkdir()
    (other / "prompt-2.md").write_text("another chat")
    (other / "answer-2.md").write_text("stale")
    thread = _answer_when_prompted(other, 3, "fresh")
    assert complete(ManualProvider(other, poll_interval=0.01, notify=lambda _: None)).text == "fresh"
    thread.join()


def test_manual_times_out(tmp_path: Path) -> None:
    provider = ManualProvider(tmp_path, timeout=0.05, poll_interval=0.01, notify=lambda _: None)
    error = failure(provider)
    assert error.kind is ErrorKind.TIMEOUT and "answer-1.md" in str(error)
