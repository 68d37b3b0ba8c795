"""Output sanitisation: redaction of every string, then truncation to the token budget."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.errors import ConfigError, ToolFailed
from fluffy.kernel.redaction import SECRET_PATTERNS, Redactor, may_hold_secret, redact
from fluffy.kernel.tools.reading.sanitizer import (
    DEFAULT_STRATEGIES,
    OutputSanitizer,
    cut,
    encoded_size,
    estimate_tokens,
    marker,
)

SHAPES = re.compile("|".join(f"(?:{p})" for _, p in SECRET_PATTERNS))
FAKE = {
    "openai_key": "sk-" + "A1b2C3d4E5f6G7h8I9j0K",
    "github_token": "ghp_" + "a" * 36,
    "aws_access_key": "AKIA" + "ABCDEFGHIJKLMNOP",
    "slack_token": "xoxb-" + "1234567890-abcdef",
    "gitlab_token": "glpat-" + "x" * 20,
    "npm_token": "npm_" + "Z" * 36,
}
_MARK = re.compile(r"\n\[\.\.\. (\d+) characters truncated \.\.\.\]\n")


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def strings_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings_of(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


# -- redaction ----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "secret"), sorted(FAKE.items()))
def test_every_builtin_prefix_is_redacted_with_its_kind(kind: str, secret: str) -> None:
    result = OutputSanitizer().sanitize("fs.read", f"config: {secret} end")
    assert secret not in result.value
    assert result.value == f"config: [REDACTED:{kind}] end"
    assert result.redactions == 1
    assert result.redacted_kinds == [kind]


def test_the_design_literal_xox_prefix_is_redacted() -> None:
    assert redact("token xox-0123456789abc") == "token [REDACTED:slack_token]"


def test_strings_in_nested_values_and_keys_are_redacted_and_counted() -> None:
    value = {
        "files": [{"path": "a.env", "text": f"A={FAKE['openai_key']}\nB={FAKE['npm_token']}"}],
        FAKE["github_token"]: 1,
        "n": [1, 2.5, True, None],
    }
    result = OutputSanitizer().sanitize("fs.read", value)
    text = compact(result.value)
    assert not any(secret in text for secret in FAKE.values())
    assert result.redactions == 3
    assert result.redacted_kinds == ["github_token", "npm_token", "openai_key"]
    assert result.value["n"] == [1, 2.5, True, None]
    assert "[REDACTED:github_token]" in result.value
    assert not result.truncated


def test_keys_that_redact_alike_are_both_kept() -> None:
    value = {FAKE["github_token"]: 1, "ghp_" + "b" * 30: 2}
    result = OutputSanitizer().sanitize("x", value)
    assert sorted(result.value.values()) == [1, 2]
    assert len(result.value) == 2


def test_policy_patterns_are_redacted_after_the_builtins() -> None:
    sanitizer = OutputSanitizer(extra_patterns=[r"corp-[0-9]{6}", r"(?i)internal secret"])
    result = sanitizer.sanitize("fs.read", "id corp-123456, INTERNAL SECRET, ok")
    assert result.value == "id [REDACTED:policy_0], [REDACTED:policy_1], ok"
    assert result.redacted_kinds == ["policy_0", "policy_1"]


def test_policy_pattern_backreferences_mean_their_own_groups() -> None:
    # Combined into one regex, \1 would refer to the first built-in's group.
    assert Redactor([r"(ab)\1"]).redact("x abab y") == "x [REDACTED:policy_0] y"


@pytest.mark.parametrize("bad", ["(unclosed", "[z-a]", "*star"])
def test_an_invalid_policy_pattern_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        OutputSanitizer(extra_patterns=["fine-[0-9]+", bad])
    assert repr(bad) in caught.value.what


@pytest.mark.parametrize("empty", ["a*", "(x)?", ""])
def test_a_policy_pattern_matching_the_empty_string_is_refused(empty: str) -> None:
    with pytest.raises(ConfigError, match="empty string"):
        Redactor([empty])


def test_a_pattern_that_matches_empty_only_in_context_never_inserts_markers() -> None:
    redactor = Redactor([r"\bx*"])  # does not fullmatch "", but matches "" before words
    assert redactor.scan("hello world") == ("hello world", [])
    assert redactor.scan("xx world") == ("[REDACTED:policy_0] world", ["policy_0"])


def test_redact_keeps_its_module_api() -> None:
    assert redact("Authorization: Bearer abcdefgh12345") == (
        "Authorization: Bearer [REDACTED:bearer]"
    )
    assert Redactor().redact("nothing here") == "nothing here"


_SHAPED = st.sampled_from([p for name, p in SECRET_PATTERNS if name != "bearer"]).flatmap(
    lambda pattern: st.from_regex(pattern)
)


@settings(max_examples=300, deadline=None)
@given(text=_SHAPED, pad=st.sampled_from([0, 64, 200, 5_000]))
def test_the_fast_precheck_never_skips_a_builtin_match(text: str, pad: int) -> None:
    """``may_hold_secret`` must hold for any text a built-in pattern matches in, short
    (its literals are looked for) or long (its patterns are searched)."""
    text = " " * pad + text + " " * (pad // 2)
    assert SHAPES.search(text)
    assert may_hold_secret(text)
    assert SHAPES.search(redact(text)) is None


@pytest.mark.parametrize("header", ["Authorization: Bearer ", "AUTHORIZATION: BEARER "])
def test_bearer_tokens_pass_the_precheck_in_any_case(header: str) -> None:
    assert may_hold_secret(header + "abcdefgh123")
    assert redact(header + "abcdefgh123") == header + "[REDACTED:bearer]"


# -- truncation ---------------------------------------------------------------------


def test_the_token_estimate_is_ceil_chars_over_four() -> None:
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    result = OutputSanitizer().sanitize("fs.read", "abc")
    assert result.original_chars == len('"abc"') == result.sanitized_chars
    assert result.sanitized_tokens == 2


@pytest.mark.parametrize(
    ("tool", "strategy"),
    [
        ("fs.read", "head"),
        ("test.run", "tail"),
        ("shell.run", "tail"),
        ("search.grep", "head"),
        ("search.glob", "head"),
        ("git.diff", "middle"),
        ("git.status", "middle"),
        ("fs.list", "middle"),
        ("plugin.custom", "middle"),
    ],
)
def test_default_strategies_by_tool(tool: str, strategy: str) -> None:
    assert OutputSanitizer().strategy_for(tool) == strategy


def test_configured_strategies_win_then_defaults_then_configured_star() -> None:
    sanitizer = OutputSanitizer(
        strategies={"fs.*": "tail", "git.diff": "head", "a.b.*": "tail", "a.*": "head", "*": "tail"}
    )
    assert sanitizer.strategy_for("fs.read") == "tail"  # configured prefix beats default exact
    assert sanitizer.strategy_for("git.diff") == "head"
    assert sanitizer.strategy_for("a.b.c") == "tail"
    assert sanitizer.strategy_for("a.x") == "head"
    assert sanitizer.strategy_for("other") == "tail"
    assert sanitizer.strategy_for("search.grep") == DEFAULT_STRATEGIES["search.*"] == "head"
    assert sanitizer.strategy_for("test.run") == "tail"
    assert OutputSanitizer(strategies={"*": "head"}).strategy_for("git.status") == "head"


@pytest.mark.parametrize(
    "strategies", [{"fs.read": "sideways"}, {"fs*": "head"}, {"*.read": "head"}, {"": "head"}]
)
def test_bad_strategy_settings_are_refused(strategies: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        OutputSanitizer(strategies=strategies)


def test_a_tiny_budget_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_result_tokens"):
        OutputSanitizer(max_result_tokens=3)


def _body(n: int) -> str:
    return "".join(f"line {i:05d}\n" for i in range(n))


def test_head_keeps_the_start_and_marks_the_cut() -> None:
    text = _body(2000)
    result = OutputSanitizer(max_result_tokens=100).sanitize("fs.read", text)
    assert result.truncated and result.sanitized_chars <= 400
    mark = _MARK.search(result.value)
    assert mark is not None and mark.end() == len(result.value)
    kept = result.value[: mark.start()]
    assert text.startswith(kept) and len(kept) > 100
    assert int(mark.group(1)) == len(text) - len(kept)
    assert result.original_chars == encoded_size(text)


def test_tail_keeps_the_end() -> None:
    text = _body(2000)
    result = OutputSanitizer(max_result_tokens=100).sanitize("test.run", text)
    mark = _MARK.match(result.value)
    assert mark is not None
    kept = result.value[mark.end() :]
    assert text.endswith(kept) and len(kept) > 100
    assert int(mark.group(1)) + len(kept) == len(text)


def test_middle_keeps_both_ends() -> None:
    text = _body(2000)
    result = OutputSanitizer(max_result_tokens=100).sanitize("git.diff", text)
    head, tail = _MARK.split(result.value)[0], _MARK.split(result.value)[2]
    assert text.startswith(head) and text.endswith(tail)
    assert abs(len(head) - len(tail)) <= 1
    assert int(_MARK.split(result.value)[1]) == len(text) - len(head) - len(tail)


def test_the_longest_strings_are_cut_and_short_ones_kept() -> None:
    value = {"summary": "3 passed", "stdout": _body(3000), "stderr": _body(500), "code": 1}
    result = OutputSanitizer(max_result_tokens=500).sanitize("test.run", value)
    assert result.truncated and result.sanitized_chars <= 2000
    assert result.value["summary"] == "3 passed" and result.value["code"] == 1
    # water-filling: both long strings keep the same number of characters
    kept = [len(_MARK.sub("", result.value[k])) for k in ("stdout", "stderr")]
    assert kept[0] == kept[1]
    assert all(_MARK.search(result.value[k]) for k in ("stdout", "stderr"))


def test_a_result_under_budget_is_untouched() -> None:
    value = {"stdout": _body(100)}
    result = OutputSanitizer(max_result_tokens=4000).sanitize("test.run", value)
    assert result.value == value and not result.truncated


def test_many_short_strings_fall_back_to_cut_json_text() -> None:
    value = [{"path": f"src/m{i}.py", "line": i} for i in range(2000)]
    result = OutputSanitizer(max_result_tokens=100).sanitize("search.grep", value)
    assert isinstance(result.value, str) and result.truncated
    assert result.sanitized_chars == encoded_size(result.value) <= 400
    assert compact(value).startswith(_MARK.split(result.value)[0])  # head strategy


def test_escapes_count_in_the_budget() -> None:
    text = '"\\\n' * 3000  # every character needs an escape in JSON
    result = OutputSanitizer(max_result_tokens=100).sanitize("fs.read", text)
    assert encoded_size(result.value) <= 400


def test_cut_keeps_exactly_what_it_says() -> None:
    assert cut("abcdef", 10, "head") == "abcdef"
    assert cut("abcdefghij", 4, "head") == "abcd" + marker(6)
    assert cut("abcdefghij", 4, "tail") == marker(6) + "ghij"
    assert cut("abcdefghij", 5, "middle") == "abc" + marker(5) + "ij"


def test_too_deep_results_are_refused() -> None:
    value: Any = "x"
    for _ in range(300):
        value = [value]
    with pytest.raises(ToolFailed, match="nested too deeply"):
        OutputSanitizer().sanitize("fs.read", value)


def test_other_types_become_text_and_are_redacted() -> None:
    result = OutputSanitizer().sanitize("x", {"t": (1, FAKE["aws_access_key"]), 3: b"ok"})
    assert result.value == {"t": [1, "[REDACTED:aws_access_key]"], "3": "ok"}


# -- properties ---------------------------------------------------------------------

_secret = st.sampled_from(sorted(FAKE.values())) | st.builds(
    lambda tail: "ghp_" + tail, st.text("abcXYZ0189", min_size=20, max_size=40)
)
_plain = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300)
_chunk = _plain | _secret | st.sampled_from(["sk-", "npm_", "AKIA", "ghp_", "-----BEGIN "])
_text = st.lists(_chunk, max_size=8).map("".join)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(_text, inner, max_size=5),
    max_leaves=40,
)
_tools = st.sampled_from(["fs.read", "test.run", "git.diff", "search.grep", "other"])
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(value=_json, tool=_tools, tokens=st.integers(min_value=25, max_value=400))
def test_output_never_exceeds_the_budget(value: Any, tool: str, tokens: int) -> None:
    result = OutputSanitizer(max_result_tokens=tokens).sanitize(tool, value)
    assert result.sanitized_chars == len(compact(result.value))
    assert result.sanitized_chars <= tokens * 4
    assert result.truncated == (len(compact(redacted(value))) > tokens * 4)


def redacted(value: Any) -> Any:
    """Independent oracle: the redacted value, without truncation."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redacted(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key, n = redact(k), 1
            while key in out:
                n += 1
                key = f"{redact(k)}#{n}"
            out[key] = redacted(v)
        return out
    return value


@FUZZ
@given(value=_json, tool=_tools, tokens=st.integers(min_value=25, max_value=400))
def test_redaction_never_leaves_a_known_secret_shape(value: Any, tool: str, tokens: int) -> None:
    result = OutputSanitizer(max_result_tokens=tokens).sanitize(tool, value)
    for text in strings_of(result.value):
        assert SHAPES.search(text) is None, text
    for secret in FAKE.values():
        assert secret not in compact(result.value)


@FUZZ
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200))
def test_non_secret_short_text_passes_unchanged(text: str) -> None:
    if SHAPES.search(text):  # the strategy may, rarely, spell a secret
        return
    result = OutputSanitizer().sanitize("fs.read", {"text": text, "list": [text]})
    assert result.value == {"text": text, "list": [text]}
    assert result.redactions == 0 and not result.truncated


@FUZZ
@given(value=_json, tokens=st.integers(min_value=25, max_value=400))
def test_truncation_only_removes_marked_text(value: Any, tokens: int) -> None:
    """Each cut string is the redacted original with marked spans removed."""
    result = OutputSanitizer(max_result_tokens=tokens).sanitize("git.diff", value)
    if not result.truncated or (isinstance(result.value, str) and not isinstance(value, str)):
        return
    before, after = strings_of(redacted(value)), strings_of(result.value)
    assert len(before) == len(after)
    for original, short in zip(before, after, strict=True):
        parts = _MARK.split(short)
        if len(parts) == 1:
            assert short == original
            continue
        head, removed, tail = parts
        assert original.startswith(head) and original.endswith(tail)
        assert len(head) + int(removed) + len(tail) == len(original)
