"""Output sanitisation: every tool result is redacted, then cut to the token budget.

Design (Output Sanitization): applied to every tool result before the AI sees it; not a
policy check.  Two steps, in this order:

1. **Redact** every string of the (JSON-able) result -- values and object keys -- with
   :class:`fluffy.kernel.redaction.Redactor`: the high-confidence prefixes (``sk-``,
   ``ghp_``, ``gho_``, ``AKIA``, ``xox-``, ``glpat-``, ``npm_``, ...) plus policy.yaml's
   ``tools.redact_patterns``.  No generic "long random string" detection.
2. **Truncate** if the result is over ``max_result_tokens``.  Tokens are *estimated* as
   ``ceil(chars / 4)`` where ``chars`` is the length of the compact JSON encoding
   (``separators=(",", ":")``, ``ensure_ascii=False``): the budget in characters is
   ``4 * max_result_tokens``.  The longest strings are cut first ("water-filling": one
   cap ``C`` is found, the largest for which the result fits, and every string that a
   cut shortens keeps ``C`` characters), following the tool's strategy -- ``head`` keeps
   the start, ``tail`` the end, ``middle`` both ends -- with a marker
   ``\\n[... N characters truncated ...]\\n`` where text was removed.  When even that
   cannot fit (many short strings, huge arrays), the whole result is replaced by its
   JSON text, cut the same way, so the budget always holds.

The sanitizer keeps no copy of the original; the router audits original and result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, get_args

import msgspec

from fluffy.errors import ConfigError, ToolFailed
from fluffy.kernel.redaction import Redactor

Strategy = Literal["head", "tail", "middle"]
STRATEGIES: Final[tuple[Strategy, ...]] = get_args(Strategy)
CHARS_PER_TOKEN: Final = 4
MIN_RESULT_TOKENS: Final = 25  # 100 characters: room for a marker and a little text
MAX_DEPTH: Final = 200

#: Fallback strategies by tool name or ``ns.*`` prefix; anything else: ``middle``.
DEFAULT_STRATEGIES: Final[Mapping[str, Strategy]] = {
    "fs.read": "head",
    "test.run": "tail",
    "shell.run": "tail",
    "search.*": "head",
    "git.diff": "middle",
}


def estimate_tokens(chars: int) -> int:
    """The design's token estimate: one token per 4 characters, rounded up."""
    return -(-chars // CHARS_PER_TOKEN)


def encoded_size(value: Any) -> int:
    """Characters of ``value``'s compact JSON encoding (what the budget counts)."""
    return len(_encode(value))


def marker(removed: int) -> str:
    return f"\n[... {removed} characters truncated ...]\n"


def cut(text: str, keep: int, strategy: Strategy) -> str:
    """``text`` with all but ``keep`` characters removed, per ``strategy``, marked."""
    removed = len(text) - keep
    if removed <= 0:
        return text
    mark = marker(removed)
    if strategy == "head":
        return text[:keep] + mark
    if strategy == "tail":
        return mark + text[len(text) - keep :]
    tail = keep // 2
    return text[: keep - tail] + mark + text[len(text) - tail :]


class SanitizeResult(msgspec.Struct, frozen=True):
    """A sanitised tool result and what was done to it (sizes in JSON characters)."""

    value: Any
    original_chars: int
    sanitized_chars: int
    truncated: bool
    redactions: int
    redacted_kinds: list[str] = msgspec.field(default_factory=list)

    @property
    def sanitized_tokens(self) -> int:
        return estimate_tokens(self.sanitized_chars)


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _check_strategies(strategies: Mapping[str, str]) -> dict[str, Strategy]:
    checked: dict[str, Strategy] = {}
    for name, strategy in strategies.items():
        star = name.find("*")
        if (
            not name
            or (star != -1 and not (name == "*" or name.endswith(".*")))
            or (star != -1 and star != len(name) - 1)
        ):
            raise ConfigError(
                f"truncation key {name!r} is not a tool name or an 'ns.*' prefix",
                fix="Use a tool name (fs.read), a namespace prefix (search.*) or '*'.",
                why="tools.truncation keys name the tools whose output they shorten",
            )
        if strategy not in STRATEGIES:
            raise ConfigError(
                f"truncation strategy {strategy!r} for {name!r} is unknown",
                fix="Use one of head, tail, middle.",
                why="a truncation strategy says which part of a long output is kept",
            )
        checked[name] = strategy
    return checked


def _lookup(table: Mapping[str, Strategy], tool: str) -> Strategy | None:
    """Exact name, then the longest ``ns.*`` prefix (``*`` alone is not looked at)."""
    if tool in table:
        return table[tool]
    parts = tool.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end]) + ".*"
        if prefix in table:
            return table[prefix]
    return None


class _Slot:
    """Where one string of the result lives, so a cut can be written back."""

    __slots__ = ("_enc", "container", "key", "text")

    def __init__(self, container: list[Any] | dict[str, Any], key: Any, text: str) -> None:
        self.container = container
        self.key = key
        self.text = text
        self._enc = -1

    @property
    def enc(self) -> int:
        """Length of the string's JSON encoding (computed for the strings a cut looks at)."""
        if self._enc < 0:
            self._enc = len(_encode(self.text))
        return self._enc


class OutputSanitizer:
    """Redacts and truncates tool results (one per kernel; settings from policy.yaml)."""

    def __init__(
        self,
        max_result_tokens: int = 4000,
        extra_patterns: Sequence[str] = (),
        strategies: Mapping[str, Strategy] | None = None,
    ) -> None:
        if isinstance(extra_patterns, str):
            raise ConfigError(
                "redaction patterns must be a list of strings, not one string",
                why="tools.redaction patterns is a YAML list",
                fix="Write the patterns as a list: [pattern-one, pattern-two].",
            )
        if not isinstance(max_result_tokens, int) or max_result_tokens < MIN_RESULT_TOKENS:
            raise ConfigError(
                f"max_result_tokens {max_result_tokens!r} is too small",
                why=f"a result needs room for a truncation marker ({MIN_RESULT_TOKENS} tokens)",
                fix=f"Set tools.max_result_tokens to at least {MIN_RESULT_TOKENS}.",
            )
        self.max_result_tokens = max_result_tokens
        self.max_chars = max_result_tokens * CHARS_PER_TOKEN
        self._redactor = Redactor(extra_patterns)
        self._strategies = _check_strategies(strategies or {})

    def strategy_for(self, tool: str) -> Strategy:
        """Configured (exact name, longest ``ns.*``), else the defaults, else the configured
        ``*``, else middle."""
        return (
            _lookup(self._strategies, tool)
            or _lookup(DEFAULT_STRATEGIES, tool)
            or self._strategies.get("*", "middle")
        )

    def sanitize(self, tool: str, value: Any) -> SanitizeResult:
        kinds: list[str] = []
        slots: list[_Slot] = []
        root: list[Any] = [None]
        root[0] = self._redact(value, kinds, slots, root, 0, 0)  # refuses too-deep nesting
        original_chars = encoded_size(_plain(value))
        result = root[0]
        size = encoded_size(result)
        truncated = size > self.max_chars
        if truncated:
            strategy = self.strategy_for(tool)
            if not _fit(slots, size, self.max_chars, strategy):
                text = _encode(result)
                root = [text]
                slot = _Slot(root, 0, text)
                fitted = _fit([slot], slot.enc, self.max_chars, strategy)
                assert fitted, "the budget always holds a marker"
            result = root[0]
            size = encoded_size(result)
        return SanitizeResult(
            value=result,
            original_chars=original_chars,
            sanitized_chars=size,
            truncated=truncated,
            redactions=len(kinds),
            redacted_kinds=sorted(set(kinds)),
        )

    def _redact(
        self,
        value: Any,
        kinds: list[str],
        slots: list[_Slot],
        container: list[Any] | dict[str, Any],
        key: Any,
        depth: int,
    ) -> Any:
        if depth > MAX_DEPTH:
            raise ToolFailed(
                "the tool's result is nested too deeply to sanitise",
                why=f"results may nest at most {MAX_DEPTH} levels",
                fix="Return a flatter result.",
            )
        if isinstance(value, str):
            text, found = self._redactor.scan(value)
            kinds.extend(found)
            slots.append(_Slot(container, key, text))
            return text
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for raw_key, item in value.items():
                name, found = self._redactor.scan(_key_text(raw_key))
                kinds.extend(found)
                unique, n = name, 1
                while unique in out:  # two keys redacted alike: keep both
                    n += 1
                    unique = f"{name}#{n}"
                out[unique] = None
                out[unique] = self._redact(item, kinds, slots, out, unique, depth + 1)
            return out
        if isinstance(value, list | tuple):
            items: list[Any] = [None] * len(value)
            for i, item in enumerate(value):
                items[i] = self._redact(item, kinds, slots, items, i, depth + 1)
            return items
        return self._redact(_other_text(value), kinds, slots, container, key, depth)


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return _encode(key)  # what json.dumps makes of such keys
    return _other_text(key)


def _other_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _plain(value: Any) -> Any:
    """``value`` made JSON-encodable the way :meth:`OutputSanitizer._redact` does it."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {_key_text(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _other_text(value)


def _cuts(slots: Sequence[_Slot], keep: int) -> list[_Slot]:
    """The strings a cap of ``keep`` characters shortens (slots sorted longest first)."""
    chosen: list[_Slot] = []
    for slot in slots:
        removed = len(slot.text) - keep
        # The marker costs len + 2 encoded (two "\n"); each removed character >= 1.
        if removed <= len(marker(removed)) + 2:
            break  # removed - marker grows with the length: no shorter string gains
        chosen.append(slot)
    return chosen


def _size_with_cap(slots: Sequence[_Slot], base: int, budget: int, keep: int, how: Strategy) -> int:
    total = base
    for slot in _cuts(slots, keep):
        total += len(_encode(cut(slot.text, keep, how))) - slot.enc
        if total <= budget:
            break  # the remaining cuts only shrink it further
    return total


def _fit(slots: Sequence[_Slot], base: int, budget: int, how: Strategy) -> bool:
    """Cut the strings with the largest cap that fits ``budget``; False if none does."""
    ordered = sorted(slots, key=lambda s: len(s.text), reverse=True)
    if _size_with_cap(ordered, base, budget, 0, how) > budget:
        return False
    lo, hi = 0, budget  # no string needs to keep more than the whole budget
    while lo < hi:  # the largest cap whose size was seen to fit
        mid = (lo + hi + 1) // 2
        if _size_with_cap(ordered, base, budget, mid, how) <= budget:
            lo = mid
        else:
            hi = mid - 1
    for slot in _cuts(ordered, lo):
        slot.container[slot.key] = cut(slot.text, lo, how)
    return True
