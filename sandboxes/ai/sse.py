"""A small incremental Server-Sent-Events parser (the WHATWG "event stream" format).

Both streaming APIs (OpenAI chat completions, Anthropic messages) speak SSE.  Lines come
from :func:`iter_lines` over the response's raw bytes rather than from
``httpx.Response.iter_lines()``: httpx splits like ``str.splitlines`` (also on U+2028,
NEL, form feed, ...), but SSE ends lines only at CR, LF or CRLF, and a JSON payload may
legally carry U+2028 or NEL unescaped.  The parser keeps only the event being built:
field lines accumulate, a blank line dispatches.

Deviation from the standard, on purpose: an event still pending when the stream ends is
dispatched rather than dropped, because some OpenAI-compatible servers end their last
event without the blank line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import msgspec

_EOL = re.compile(rb"\r\n|\r|\n")


class SSEEvent(msgspec.Struct, frozen=True):
    """One dispatched event; ``event`` is ``"message"`` when the server named none."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Feed lines one by one; ``feed`` returns an event when a blank line completes one."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._has_data = False

    def feed(self, line: str) -> SSEEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment (servers send them as keep-alives)
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry" and value.isdigit():
            self._retry = int(value)
        # any other field is ignored, as the standard says
        return None

    def flush(self) -> SSEEvent | None:
        """The end of the stream: the event still pending, if any (see the module doc)."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        event: SSEEvent | None = None
        if self._has_data:
            event = SSEEvent(
                data="\n".join(self._data),
                event=self._event or "message",
                id=self._id,
                retry=self._retry,
            )
        # the last event id persists across events (the standard's "last event ID buffer")
        self._data, self._event, self._retry, self._has_data = [], "", None, False
        return event


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """SSE lines (UTF-8) from network chunks split anywhere, even inside CRLF or a character.

    Splitting bytes is safe: CR and LF never occur inside a UTF-8 multi-byte sequence.
    A trailing CR is held back in case the next chunk starts with its LF.
    """
    pending = b""
    first = True
    for chunk in chunks:
        if not chunk:
            continue
        data = pending + chunk
        if first:
            data = data.removeprefix(b"\xef\xbb\xbf")  # the standard drops one leading BOM
            first = False
        held = data.endswith(b"\r")
        parts = _EOL.split(data[:-1] if held else data)
        pending = parts.pop() + (b"\r" if held else b"")
        for line in parts:
            yield line.decode("utf-8", "replace")
    if pending:
        parts = _EOL.split(pending)
        if not parts[-1]:
            parts.pop()
        for line in parts:
            yield line.decode("utf-8", "replace")


def iter_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Every event of a stream of lines, in order."""
    parser = SSEParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event
    last = parser.flush()
    if last is not None:
        yield last
