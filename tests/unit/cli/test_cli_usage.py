"""Token usage in the CLI: /usage, the line after a turn, `fluffy session list`'s columns,
and the prices setting that turns tokens into cost (ADR-044)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fluffy.cli.interactive import Context, handle
from fluffy.cli.session import sessions_table
from fluffy.cli.session_view import SessionRenderer
from fluffy.cli.usage import cost, price_for, tally_line
from fluffy.errors import ConfigError
from fluffy.settings import Price, load_settings
from unit.cli_fakes import FakeKernel, shown

pytestmark = pytest.mark.unit

STATUS = {"health": "healthy", "runtime": "docker", "container_id": "c" * 20}
PRICES = {
    "gpt-4o": Price(input=2.5, output=10.0, cached_input=1.25),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0),
}


def tally(model: str, requests: int, inp: int, out: int, cached: int = 0) -> dict[str, Any]:
    counts = {
        "requests": requests,
        "reported": requests,
        "input_tokens": inp,
        "output_tokens": out,
        "cached_tokens": cached,
    }
    return {**counts, "models": {model: dict(counts)}}


def test_cost_uses_the_cached_price_and_matches_dated_model_names() -> None:
    models = {"gpt-4o-2024-08-06": tally("x", 1, 1_000_000, 100_000, cached=400_000)["models"]["x"]}
    # 600k fresh at 2.5 + 400k cached at 1.25 + 100k out at 10 (per million)
    assert cost(models, PRICES) == pytest.approx(1.5 + 0.5 + 1.0)
    assert price_for("gpt-4o-mini", {"gpt-4o": PRICES["gpt-4o"], "gpt-4o-mini": Price(
        input=0.15, output=0.6)}).input == 0.15  # fmt: skip  # the longest prefix wins


def test_cached_input_defaults_to_the_input_price() -> None:
    models = {"claude-sonnet-4-5": {"input_tokens": 1_000_000, "cached_tokens": 1_000_000}}
    assert cost(models, PRICES) == pytest.approx(3.0)


def test_a_model_without_a_price_makes_the_cost_unknown_not_zero() -> None:
    models = {"gpt-4o": {"input_tokens": 10}, "local-llama": {"input_tokens": 10}}
    assert cost(models, PRICES) is None
    assert cost({"local-llama": {"input_tokens": 0, "output_tokens": 0}}, PRICES) == 0.0


def test_usage_shows_this_turn_the_session_cost_and_the_calibration() -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    kernel.usage[sid] = tally("gpt-4o", 5, 120_000, 4_000, cached=100_000)
    kernel.turn_usage = tally("gpt-4o", 2, 30_000, 1_000, cached=20_000)
    kernel.calibration = {"calibration": 1.274, "scale": 1.274}
    text = handle("/usage", kernel, sid, STATUS, Context(prices=PRICES)).text
    lines = text.splitlines()
    assert lines[0] == "this turn: 30,000 in (20,000 cached), 1,000 out; 2 request(s); $0.0600"
    assert lines[1] == "session:   120,000 in (100,000 cached), 4,000 out; 5 request(s); $0.2150"
    assert lines[2] == (
        "context estimate: the provider counted 1.27x the 4-characters-a-token estimate; "
        "the context budget counts 1.27x"
    )
    assert kernel.methods("session.usage") == [{"session_id": sid}]


def test_usage_without_prices_says_how_to_get_the_cost() -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    text = handle("/usage", kernel, sid, STATUS, Context()).text
    assert text.splitlines() == [
        "this turn: no model requests",
        "session:   no model requests",
        "(cost: set `prices` in the config, see `fluffy config init`)",
    ]


def test_a_provider_that_reports_nothing_is_not_shown_as_zero_tokens() -> None:
    silent = {"requests": 3, "reported": 0, "input_tokens": 0, "output_tokens": 0}
    assert tally_line(silent, PRICES) == "3 request(s); the provider reported no usage"


def _table_text(rows: list[dict[str, Any]], prices: dict[str, Price] | None) -> list[str]:
    console = Console(record=True, width=140, file=io.StringIO())
    console.print(sessions_table(rows, prices))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_session_list_shows_tokens_and_with_prices_the_cost() -> None:
    kernel = FakeKernel()
    first = kernel.call("session.create")["session_id"]
    second = kernel.call("session.create")["session_id"]
    kernel.usage[first] = tally("gpt-4o", 4, 1_500_000, 20_000)
    rows = kernel.call("session.list", {"limit": 5})["sessions"]
    plain = _table_text(rows, None)
    assert plain[0].split() == ["id", "mode", "state", "updated", "tokens", "in/out", "title"]
    (used,) = [line for line in plain if line.startswith(first)]
    assert "1.5M/20k" in used
    (idle,) = [line for line in plain if line.startswith(second)]
    assert " - " in idle  # nothing reported: a dash, not 0
    priced = _table_text(rows, PRICES)
    assert "cost" in priced[0].split()
    (used,) = [line for line in priced if line.startswith(first)]
    assert "$3.95" in used  # 1.5M in at 2.5 + 20k out at 10


def test_the_line_after_a_turn_has_its_tokens_and_cost() -> None:
    console = Console(record=True, width=120, file=io.StringIO())
    renderer = SessionRenderer(console, prices=PRICES)
    renderer.render(shown({"type": "turn_end", "status": "done", "text": "ok", "error": None,
                           "usage": tally("gpt-4o", 2, 3_000, 200)}))  # fmt: skip
    renderer.render(shown({"type": "turn_end", "status": "done", "text": "ok", "error": None,
                           "usage": {"requests": 0}}))  # fmt: skip
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert "tokens: 3,000 in, 200 out; 2 request(s); $0.0095" in lines
    assert sum("tokens:" in line for line in lines) == 1


def test_prices_are_validated_in_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    config = tmp_path / ".fluffy" / "config.yaml"
    config.parent.mkdir()
    config.write_text("prices:\n  gpt-4o: {input: 2.5, output: 10, cached_input: 1.25}\n")
    settings = load_settings(tmp_path, {}, env={})
    assert settings.prices == {"gpt-4o": Price(input=2.5, output=10.0, cached_input=1.25)}
    config.write_text("prices:\n  gpt-4o: {input: -1, output: 10}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path, {}, env={})
    assert "prices.gpt-4o.input" in caught.value.why
    config.write_text("prices:\n  gpt-4o: {input: 1, output: 10, per: token}\n")
    with pytest.raises(ConfigError):
        load_settings(tmp_path, {}, env={})
