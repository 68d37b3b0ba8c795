"""The SSE parser: fields, comments, multi-line data, dispatch, and chunking over the wire."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.sandboxes.ai.sse import SSEEvent, SSEParser, iter_lines, iter_sse

pytestmark = pytest.mark.unit


def parse(text: str) -> list[SSEEvent]:
    return list(iter_sse(iter_lines([text.encode()])))


def test_fields_and_dispatch() -> None:
    events = parse(
        ": a comment, ignored\n"
        "event: message_start\n"
        'data: {"a": 1}\n'
        "\n"
        "data:no space after the colon\n"
        "\n"
    )
    assert events == [
        SSEEvent(data='{"a": 1}', event="message_start"),
        SSEEvent(data="no space after the colon", event="message"),
    ]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert parse("data: first\ndata:  second keeps one space\ndata\n\n") == [
        SSEEvent(data="first\n second keeps one space\n")
    ]


def test_blank_lines_and_comments_alone_dispatch_nothing() -> None:
    assert parse("\n\n: ping\n\nevent: lonely\n\n") == []


def test_event_name_resets_but_the_last_id_persists() -> None:
    events = parse("id: 7\nevent: one\ndata: a\n\ndata: b\n\nid: bad\0id\ndata: c\n\n")
    assert events == [
        SSEEvent(data="a", event="one", id="7"),
        SSEEvent(data="b", event="message", id="7"),
        SSEEvent(data="c", event="message", id="7"),  # an id with NUL is ignored
    ]


def test_retry_and_unknown_fields() -> None:
    assert parse("retry: 3000\nfoo: bar\ndata: x\n\nretry: soon\ndata: y\n\n") == [
        SSEEvent(data="x", retry=3000),
        SSEEvent(data="y"),
    ]


def test_the_last_event_without_a_blank_line_is_still_dispatched() -> None:
    assert parse("data: [DONE]") == [SSEEvent(data="[DONE]")]
    parser = SSEParser()
    assert parser.feed("data: x") is None
    assert parser.flush() == SSEEvent(data="x")
    assert parser.flush() is None


def test_lines_split_only_at_cr_lf_crlf_not_at_unicode_separators() -> None:
    text = "data: a\u2028b\x85c\x0cd\r\n\r\ndata: e\rdata: f\r\r"
    assert parse(text) == [SSEEvent(data="a\u2028b\x85c\x0cd"), SSEEvent(data="e\nf")]


def test_a_leading_bom_is_dropped() -> None:
    assert list(iter_lines([b"\xef\xbb\xbfdata: x\n"])) == ["data: x"]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    assert list(iter_lines([b"data: a\r", b"\ndata: b\r", b"\r\n"])) == [
        "data: a",
        "data: b",
        "",
    ]


# -- the property: any events, any line endings, any chunking -> the same events -------
_text = st.text(st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=20)
_events = st.lists(
    st.tuples(
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
        st.lists(_text, min_size=1, max_size=3),
    ),
    max_size=6,
)


def wire(events: list[tuple[str, list[str]]], eol: str) -> bytes:
    out = []
    for name, lines in events:
        out.append(f"event: {name}{eol}")
        out += [f"data: {line}{eol}" for line in lines]
        out.append(eol)
    return "".join(out).encode()


@settings(max_examples=150, deadline=None)
@given(
    events=_events,
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_property_chunking_never_changes_the_events(
    events: list[tuple[str, list[str]]], eol: str, cuts: list[int]
) -> None:
    data = wire(events, eol)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    # through a real httpx response body, as the adapters read it
    response = httpx.Response(200, content=iter(chunks))
    got = list(iter_sse(iter_lines(response.iter_bytes())))
    assert got == [SSEEvent(data="\n".join(lines), event=name) for name, lines in events]
