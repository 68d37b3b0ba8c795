"""Audit summaries of a call's params and result: secret-named fields masked at any depth,
the same text whether the quick check or the full walk produced it (property test)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.kernel.audit.entry import truncate
from fluffy.kernel.audit.observer import mask_secrets, summarize
from fluffy.kernel.redaction import redact

pytestmark = pytest.mark.unit


def reference(value: Any) -> str:
    """The summary as it was made before the quick check: always walk, then encode."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = mask_secrets(value)
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return truncate(redact(truncate(text, 20_000)))


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
