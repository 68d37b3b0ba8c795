"""Audit summaries of a call's params and result: secret-named fields masked at any depth,
the same text whether the quick check or the full walk produced it (property test)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.kernel.audit.entry import truncate
from fluffy.kernel.audit.observer import cut_kept, encoded_head, mask_secrets, summarize
from fluffy.kernel.redaction import redact

pytestmark = pytest.mark.unit


def reference(value: Any) -> str:
    """The summary as it was made before the quick check: always walk, then encode."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = mask_secrets(value)
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    if len(text) > 20_000:
        text = cut_kept(text, 20_000)
    return truncate(redact(text))


KEYS = st.one_of(
    st.sampled_from(
        [
            "api_key",
            "API_KEY",
            "Token",
            "x_token",
            "my_password",
            "secret",
            "authorization",
            "input_tokens",
            "tokenizer",
            "path",
            'a"b_secret',
            "a\\_token",
            "apikey",
            "client_secret",
            "note",
            "to\u212aen",  # KELVIN SIGN: lower-cases to "token"
            "MY_PA\u017fSWORD",  # LONG S: str.lower keeps it (no secret)
            "\u0130_secret",  # I WITH DOT: lower-cases to two characters
            "\u00e9t\u00e9_token",
        ]
    ),
    st.text(max_size=12),
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=30)
    | st.sampled_from(["", 0.0, -0.0]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_the_quick_check_gives_the_walked_summary(value: Any) -> None:
    assert summarize(value) == reference(value)


def test_a_secret_deep_in_a_large_payload_is_masked() -> None:
    messages = [{"role": "user", "content": "x" * 200} for _ in range(300)]
    payload = {"messages": messages, "provider": {"settings": {"api_key": "sk-live-123"}}}
    assert "sk-live-123" not in summarize(payload)
    assert summarize({"messages": messages}) == reference({"messages": messages})


@pytest.mark.parametrize("before", range(19_940, 20_060, 9))
def test_a_secret_key_near_the_end_of_what_is_kept(before: int) -> None:
    # only the first 20,000 characters make a summary: a key that starts in them is
    # masked; one after them changes nothing the summary shows
    payload = {"a": "x" * before, "my_token": "hunter2hunter2", "z": "y" * 30_000}
    assert summarize(payload) == reference(payload)
    assert summarize([payload, {"password": "p" * 50}]) == reference(
        [payload, {"password": "p" * 50}]
    )


@pytest.mark.parametrize("pad", range(19_900, 20_000, 3))
@pytest.mark.parametrize("tail", [100, 600, 6_000])
def test_a_secret_at_the_cut_is_judged_as_in_the_whole_encoding(pad: int, tail: int) -> None:
    """Values of 20 KB to 700 KB, a secret shape right where what is kept ends: the
    summary is the one made from the whole encoding, however much of it was encoded."""
    payload = ["a" * pad, "sk-" + "b" * 40] + ["c" * 100] * tail
    assert summarize(payload) == reference(payload)


SHAPES = ["sk-", "sk-proj-", "ghp_", "AKIA", "xoxb-", "glpat-", "npm_"]


@pytest.mark.parametrize("prefix", SHAPES)
@pytest.mark.parametrize("as_text", [False, True])
def test_no_part_of_a_secret_cut_at_the_end_of_what_is_kept_is_shown(
    prefix: str, as_text: bool
) -> None:
    """Long secrets before the cut shrink to a few characters once redacted, so what
    was kept at the cut is shown: a token cut there, too short to be recognised, is not."""
    body = "Q7ZK" * 10  # 40 characters: every built-in shape's body, once whole
    before = ("sk-" + "a" * 1250 + " ") * 15  # 18,810 characters, 15 redactions
    for at in range(1, len(prefix) + len(body)):  # the cut after `at` of the token
        last = 20_000 - len("...[more]") - len(before) - at - (0 if as_text else 6) - 1
        text = before + "sk-" + "a" * (last - 3) + " " + prefix + body + " tail" * 400
        shown = summarize(text if as_text else {"a": text})
        assert "Q7Z" not in shown and "[REDACTED:openai_key]" in shown
        assert shown.endswith("...[more]")


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("fill", ["a", "0123456789abcdef", "x.y-z_"])
def test_a_long_text_of_token_characters_keeps_its_start(wrap: bool, fill: str) -> None:
    """Only a token's start in the last characters is a reason to drop anything."""
    text = fill * (30_000 // len(fill))
    shown = summarize({"content": text} if wrap else text)
    assert shown.startswith(('{"content":"' if wrap else "") + text[:200])
    assert len(shown) >= 490


def test_a_bearer_token_cut_short_is_dropped() -> None:
    before = ("sk-" + "a" * 1250 + " ") * 15
    for at in range(1, 8):
        last = 20_000 - len("...[more]") - len(before) - len("Authorization: Bearer ") - at
        text = before + "x" * last + "Authorization: Bearer " + "Q7ZKQ7ZKQ7" + " tail" * 400
        assert "Q7Z" not in summarize(text)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(min_value=0, max_value=400))
def test_the_head_of_an_encoding_is_its_start_and_long_enough(value: Any, limit: int) -> None:
    head, whole = encoded_head(value, limit)
    full = msgspec.json.encode(value)
    assert full.startswith(head) and len(head) >= min(limit, len(full))
    assert whole == (head == full)
    head.decode()  # cut between items, never inside a character


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_summary_encodes_what_it_keeps_not_the_whole_conversation(wrapped: bool) -> None:
    """``wrapped``: the conversation one key down in a one-key dict (a container of few
    items, which is encoded whole only when it is small inside)."""
    seen: list[int] = []

    class Tail:
        def __init__(self, n: int) -> None:
            self.n = n

        def __repr__(self) -> str:  # how the summary's encoder writes an unknown type
            seen.append(self.n)
            return "tail"

    messages = [{"role": "tool", "content": "é" * 300, "n": Tail(n)} for n in range(20_000)]
    written = [{**m, "n": "tail"} for m in messages[:400]]  # as the encoder writes them
    if wrapped:
        payload: dict[str, Any] = {"job_id": "j", "x": {"request": {"messages": messages}}}
        expected: dict[str, Any] = {"job_id": "j", "x": {"request": {"messages": written}}}
    else:
        payload = {"job_id": "j", "messages": messages}
        expected = {"job_id": "j", "messages": written}
    assert summarize(payload) == reference(expected)
    assert len(seen) < 400  # ~80 KB of a ~12 MB body were encoded
