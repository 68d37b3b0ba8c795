"""Frames and messages: round trips and hostile bytes (property tests)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import FrameEmpty, FrameTooLarge, InvalidPayload, IpcError, VersionUnsupported
from fluffy.ipc.protocol import (
    HEADER,
    SUPPORTED_API_VERSIONS,
    FrameReader,
    IpcMessage,
    decode_handshake,
    decode_message,
    encode,
    negotiate,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.builds(
    IpcMessage,
    id=st.text(min_size=1, max_size=40),
    type=st.sampled_from(["request", "response", "event"]),
    method=st.none() | st.text(min_size=1, max_size=30),
    params=json_values,
    result=json_values,
)


@given(st.lists(messages, min_size=1, max_size=5), st.integers(1, 64))
def test_frames_round_trip_in_any_chunking(batch: list[IpcMessage], chunk: int) -> None:
    stream = b"".join(encode(m) for m in batch)
    reader = FrameReader()
    got = []
    for start in range(0, len(stream), chunk):
        got.extend(decode_message(p) for p in reader.feed(stream[start : start + chunk]))
    assert got == batch and reader.pending == 0


def _read(reader: FrameReader, data: bytes) -> list[bytes]:
    """What the kernel's connection reads from ``data``: a whole frame at once, or
    through the buffer."""
    payload = reader.whole(data)
    return [payload] if payload is not None else list(reader.feed(data))


@given(st.lists(messages, min_size=1, max_size=5), st.lists(st.integers(1, 300), max_size=8))
def test_a_whole_frame_is_read_as_the_buffer_reads_it(
    batch: list[IpcMessage], cuts: list[int]
) -> None:
    """Reads that hold exactly one frame skip the buffer; any other read (part of one,
    several, a frame after a held part) goes through it: the frames are the same."""
    stream = b"".join(encode(m) for m in batch)
    pieces, at = [], 0
    for size in [*cuts, len(stream)]:
        pieces.append(stream[at : at + size])
        at += size
    reader = FrameReader()
    got = [decode_message(p) for piece in pieces if piece for p in _read(reader, piece)]
    assert got == batch and reader.pending == 0
    for message in batch:  # one frame per read: never buffered
        assert FrameReader().whole(encode(message)) == encode(message)[4:]


def test_a_whole_empty_or_oversized_frame_is_left_to_the_buffer_to_refuse() -> None:
    assert FrameReader().whole(HEADER.pack(0)) is None
    assert FrameReader(max_frame=4).whole(HEADER.pack(5) + b"12345") is None
    with pytest.raises(FrameTooLarge):
        _read(FrameReader(max_frame=4), HEADER.pack(5) + b"12345")
    held = FrameReader()
    assert _read(held, HEADER.pack(2) + b"{") == [] and held.pending == 5
    assert held.whole(HEADER.pack(2) + b"{}") is None  # a part is held: through the buffer


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_ever_raise_the_protocol_error(data: bytes) -> None:
    reader = FrameReader(max_frame=256)
    try:
        for payload in reader.feed(data):
            try:
                decode_message(payload)
            except InvalidPayload:
                pass
    except IpcError:
        pass


@settings(max_examples=300)
@given(st.binary(min_size=1, max_size=200))
def test_arbitrary_payloads_decode_or_raise_invalid_payload(payload: bytes) -> None:
    for decode in (decode_message, decode_handshake):
        try:
            decode(payload)
        except InvalidPayload:
            pass


def test_empty_and_oversized_frames_are_refused_at_the_header() -> None:
    with pytest.raises(FrameEmpty):
        list(FrameReader().feed(HEADER.pack(0)))
    reader = FrameReader(max_frame=1024)
    with pytest.raises(FrameTooLarge) as info:
        list(reader.feed(HEADER.pack(2**32 - 1)))  # nothing allocated for 4 GiB
    assert "4294967295" in info.value.what
    assert reader.pending == 4


@pytest.mark.parametrize(
    "payload",
    [
        b'{"id": "1", "type": "request"',
        b"\xff\xfe{}",
        b'{"id": 1, "type": "request"}',
        b'{"type": "request"}',
        b'{"id": "", "type": "request"}',
        b'{"id": "1", "type": "nope"}',
        b"[]",
        b'"x"',
        b'{"id": "1", "type": "request", "error": {"code": 1}}',
        b'{"id": "\\ud800", "type": "request", "method": "kernel.ping"}',
    ],
)
def test_bad_messages_are_invalid_payload(payload: bytes) -> None:
    with pytest.raises(InvalidPayload):
        decode_message(payload)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    message = decode_message(b'{"id": "1", "type": "request", "method": "m", "future": 1}')
    assert message.method == "m"


def test_wire_shape_is_the_design_shape() -> None:
    frame = encode(IpcMessage(id="a", type="response", result={"pong": True}))
    (length,) = HEADER.unpack(frame[:4])
    assert length == len(frame) - 4
    assert msgspec.json.decode(frame[4:]) == {
        "id": "a",
        "type": "response",
        "result": {"pong": True},
    }


def test_version_window_is_the_latest_two() -> None:
    low, high = SUPPORTED_API_VERSIONS
    assert high - low == 1
    assert negotiate(high) == high and negotiate(low) == low
    with pytest.raises(VersionUnsupported) as info:
        negotiate(high + 1)
    assert f"{low} to {high}" in info.value.what


def test_invalid_utf8_inside_a_string_is_invalid_payload() -> None:
    with pytest.raises(InvalidPayload):
        decode_message(b'{"id": "\xed\xa0\x80", "type": "request"}')
