"""Token usage for people: ``/usage``, the line after each turn, `fluffy session list`.

The kernel counts what the providers reported (``session.usage``, ``session.list``'s
``usage``, ``turn_end``'s ``usage``: requests, input / output / cached tokens, per
model); the cost is computed here from the ``prices`` setting (US dollars per million
tokens), and only when every model that used tokens has a price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fluffy.settings import Price

MILLION = 1_000_000


def price_for(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of ``model``: its own entry, else the longest entry it starts with
    (providers answer with dated names: gpt-4o-2024-08-06 is priced as gpt-4o)."""
    if model in prices:
        return prices[model]
    known = [name for name in prices if model.startswith(name)]
    return prices[max(known, key=len)] if known else None


def cost(models: Mapping[str, Mapping[str, int]], prices: Mapping[str, Price]) -> float | None:
    """Dollars for ``models``' tokens; None when a model that used tokens has no price."""
    total = 0.0
    for model, counts in models.items():
        used = counts.get("input_tokens", 0) + counts.get("output_tokens", 0)
        if not used:
            continue
        price = price_for(model, prices)
        if price is None:
            return None
        cached = min(counts.get("cached_tokens", 0), counts.get("input_tokens", 0))
        fresh = counts.get("input_tokens", 0) - cached
        cached_price = price.input if price.cached_input is None else price.cached_input
        total += fresh * price.input + cached * cached_price
        total += counts.get("output_tokens", 0) * price.output
    return total / MILLION


def dollars(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:.2f}"


def tokens(count: int) -> str:
    """1234 -> "1.2k", 2_500_000 -> "2.5M" (a column's width)."""
    if count >= MILLION:
        return f"{count / MILLION:.1f}M"
    if count >= 10_000:
        return f"{count / 1000:.0f}k"
    if count >= 1000:
        return f"{count / 1000:.1f}k"
    return str(count)


def tally_line(tally: Mapping[str, Any], prices: Mapping[str, Price]) -> str:
    """One tally in words: "12,345 in (10,000 cached), 678 out; 3 requests; $0.0123"."""
    requests = int(tally.get("requests", 0))
    if not requests:
        return "no model requests"
    reported = int(tally.get("reported", 0))
    if not reported:
        return f"{requests} request(s); the provider reported no usage"
    cached = int(tally.get("cached_tokens", 0))
    line = f"{int(tally.get('input_tokens', 0)):,} in"
    if cached:
        line += f" ({cached:,} cached)"
    line += f", {int(tally.get('output_tokens', 0)):,} out; {requests} request(s)"
    if reported < requests:
        line += f" ({requests - reported} without usage)"
    if prices:
        spent = cost(tally.get("models") or {}, prices)
        line += "; cost n/a (a model has no price)" if spent is None else f"; {dollars(spent)}"
    return line


def usage_text(report: Mapping[str, Any], prices: Mapping[str, Price]) -> str:
    """``/usage``: this turn, the session, and the context estimate's calibration."""
    lines = [
        f"this turn: {tally_line(report.get('turn') or {}, prices)}",
        f"session:   {tally_line(report.get('session') or {}, prices)}",
    ]
    models = (report.get("session") or {}).get("models") or {}
    if len(models) > 1:
        for model, counts in sorted(models.items()):
            lines.append(f"  {model}: {tally_line(counts, prices)}")
    ratio = report.get("calibration")
    if isinstance(ratio, int | float):
        scale = float(report.get("scale") or 1.0)
        lines.append(
            f"context estimate: the provider counted {ratio:.2f}x the 4-characters-a-token "
            f"estimate; the context budget counts {scale:.2f}x"
        )
    if not prices:
        lines.append("(cost: set `prices` in the config, see `fluffy config init`)")
    return "\n".join(lines)


def turn_line(tally: Mapping[str, Any], prices: Mapping[str, Price]) -> str | None:
    """The dim line after a turn, or None when it made no model request."""
    if not int(tally.get("requests", 0)):
        return None
    return f"tokens: {tally_line(tally, prices)}"
