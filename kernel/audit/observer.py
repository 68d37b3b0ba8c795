"""Every syscall the kernel receives becomes an audit entry (health-check pings excepted).

The IPC server hands each finished call to :class:`SyscallAuditor` (allowed, denied,
unknown methods, malformed frames, refused connections); it records a buffered
``syscall`` entry with the decision, the rule, and input/output summaries that are
redacted (:mod:`fluffy.kernel.redaction`) and truncated to 500 characters.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

import msgspec

from fluffy.kernel.audit.entry import Event, truncate
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.server import CallRecord
from fluffy.kernel.redaction import TOKEN_START, redact

_encode = msgspec.json.Encoder(enc_hook=repr).encode

#: (session_id, mode, state) of the session a call belongs to.
SessionView = Callable[[], tuple[str | None, str, str]]


#: Fields whose values are secrets whatever they look like (an API key of any shape).
SECRET_FIELDS = frozenset({"api_key", "apikey", "token", "secret", "password", "authorization"})
SECRET_SUFFIXES = ("_api_key", "_token", "_secret", "_password")


def _secret_field(key: object) -> bool:
    if not isinstance(key, str):
        return False
    lowered = key.lower()
    return lowered in SECRET_FIELDS or lowered.endswith(SECRET_SUFFIXES)


def mask_secrets(value: Any, depth: int = 0) -> Any:
    """``value`` with every secret-named field's value replaced (dicts and lists, nested)."""
    if depth > 8:
        return value
    if isinstance(value, dict):
        return {
            k: "[REDACTED:field]" if v and _secret_field(k) else mask_secrets(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_secrets(v, depth + 1) for v in value]
    return value


#: What every secret-named key (:func:`_secret_field`) ends with once the JSON text is
#: lower-cased: the name's last letters, then ``":`` (JSON escapes no letter, and no
#: character lower-cases to an escaped one).  A sound pre-check: ``"mytoken":`` matches
#: too, and the full walk then decides.  Lower-casing the whole text lowers each key as
#: ``str.lower`` would (a Kelvin sign becomes ``k``; only a final sigma depends on its
#: neighbours, and it becomes no ASCII letter).  Literals only: a pattern that scans
#: each string back from its quote is quadratic in a long one.  A value the walk would
#: leave as it is (empty, null, false: not masked) does not count: an AI host's every
#: request names its provider's ``"api_key":""``.
_MASKED_NAMES = ("api_?key", "token", "secret", "password", "authorization")
_SET = r'":(?!""|null|false|\[\]|\{\})'
Search = Callable[[Any], object]


def _searches(patterns: list[str]) -> dict[bool, tuple[Search, ...]]:
    """``patterns``' searches, by whether they search bytes (True) or text."""
    return {
        True: tuple(re.compile(p.encode()).search for p in patterns),
        False: tuple(re.compile(p).search for p in patterns),
    }


#: For long text, one pattern per name (a match of any is a match of their alternation),
#: each starting with a literal: the regex engine's prefix search finds it (~8 µs in
#: 20 KB), where the alternation was tried at every position (~140 µs).  Below _SHORT
#: bytes one search of the alternation costs less than five calls.
_EACH_NAME = _searches([f"{name}{_SET}" for name in _MASKED_NAMES])
_ANY_NAME = _searches([f"(?:{'|'.join(_MASKED_NAMES)}){_SET}"])
_SHORT = 256


#: The characters a summary is made from (then redacted and cut to 500).
KEPT = 20_000
#: What stands for the rest of a longer text in those: a fixed text, so what is kept
#: never depends on how much of the value was encoded (a count of the characters cut
#: would, and with its length where the cut falls, and what redaction then sees).
MORE = "...[more]"
#: What a built-in secret's token is made of (prefix and body: :mod:`kernel.redaction`).
TOKEN_CHARS = string.ascii_letters + string.digits + "_-."
#: The longest a built-in token can be and still be too short to match (``npm_`` and 35).
_SHORT_TOKEN = 64


def cut_kept(text: str, keep: int) -> str:
    """``text`` cut to ``keep`` characters (then :data:`MORE`).  A token cut short of its
    pattern's minimum (``sk-`` and 15 characters) would not be redacted, and redaction
    of longer secrets before it can bring it into the 500 characters shown: so the cut
    drops what follows a token's start in the last characters of the run of token
    characters it ends in (all of the run after ``bearer``)."""
    head = text[: keep - len(MORE)]
    run = len(head) - len(head.rstrip(TOKEN_CHARS))
    if run:
        start = TOKEN_START.search(head, len(head) - min(run, _SHORT_TOKEN))
        if start is not None:
            head = head[: start.start()]
        elif run < _SHORT_TOKEN and head[: len(head) - run].lower().endswith("bearer "):
            head = head[: len(head) - run]
    return head + MORE


#: Where a secret-like key must have begun to change those: masking changes the text
#: only after a key's ``":``, and a match is at most 25 characters long.  (Beyond it
#: nothing is looked at: the count of characters cut may then include a secret's.)
_WINDOW = KEPT + 32


#: Bytes of a value's encoding a summary needs: _WINDOW characters, at most 4 bytes each.
_HEAD = 4 * _WINDOW


def _names_secret(raw: bytes, text: str) -> bool:
    """Whether the first :data:`_WINDOW` characters may name a secret-like key with a
    value the walk would mask."""
    ascii = raw.isascii()  # bytes.lower lowers ASCII letters only: text otherwise
    lowered = raw[:_WINDOW].lower() if ascii else text[:_WINDOW].lower()
    searches = (_ANY_NAME if len(raw) < _SHORT else _EACH_NAME)[ascii]
    return any(search(lowered) for search in searches)


_DEEP = 32
#: A list or dict of fewer items is encoded whole (in C), not walked: a walk costs Python
#: steps per item, more than msgspec spends encoding them (a 453-message conversation:
#: walked item by item down to every leaf, its first 80 KB took 1.85 ms; msgspec encodes
#: all 373 KB in 0.35 ms).  Longer ones (a conversation's messages, its tools) are walked,
#: so a summary still costs what it keeps, not what the value holds.
_WALK = 16
#: ... and only when it is small in all: at most _NODES values inside it and no more text
#: than the bytes still wanted (one key can hold a whole conversation, a batch's ten
#: calls ten 400 KB files: those are walked, however few their items).
_NODES = 128


def _small(value: list[Any] | dict[Any, Any], room: int) -> bool:
    """Whether ``value`` holds at most :data:`_NODES` values and ``room`` characters of
    text: an estimate of its encoding's size (keys, numbers and punctuation aside),
    made without encoding it."""
    nodes = _NODES
    stack: list[Any] = [value]
    pop, push = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or kind is bytes:
            room -= len(item)
            if room < 0:
                return False
        elif kind is dict or kind is list:
            nodes -= len(item)
            if nodes < 0:
                return False
            push(item.values() if kind is dict else item)
    return True


def encoded_head(value: Any, limit: int, depth: int = 0) -> tuple[bytes, bool]:
    """The start of ``value``'s encoding, at least ``limit`` bytes of it (all of it when
    shorter), and whether it is all of it.  A big list or dict (a call's whole
    conversation) is encoded item by item until that much is written, so a summary costs
    what it keeps, not what the value holds; a cut falls between items (never inside a
    character)."""
    if (
        not isinstance(value, list | dict)
        or not value
        or depth >= _DEEP
        or (len(value) < _WALK and _small(value, limit))
    ):
        return _encode(value), True
    if isinstance(value, dict):
        if any(type(key) is not str for key in value):  # msgspec's own way with those
            return _encode(value), True
        parts = ((_encode(key) + b":", item) for key, item in value.items())
        brackets = b"{}"
    else:
        parts = ((b"", item) for item in value)
        brackets = b"[]"
    out = bytearray(brackets[:1])
    last = len(value) - 1
    for i, (key, item) in enumerate(parts):
        out += b"," + key if i else key
        piece, whole = encoded_head(item, limit - len(out), depth + 1)
        out += piece
        if not whole or (len(out) >= limit and i < last):
            return bytes(out), False
    return bytes(out + brackets[1:]), True


def summarize(value: Any) -> str:
    if value is None:
        return ""
    try:
        if isinstance(value, str):
            text = value
        else:
            # the encoding first (in C): a call's params may carry a whole conversation,
            # and only one that names a secret-like key is walked to mask its values.
            # _WINDOW bytes are _WINDOW characters of ASCII text (a conversation's head
            # took 234 µs to encode instead of 525 µs for _HEAD); more text only when
            # they are fewer.
            raw, whole = encoded_head(value, _WINDOW)
            text = raw.decode()
            if not whole and len(text) < _WINDOW:
                raw = encoded_head(value, _HEAD)[0]
                text = raw.decode()
            if isinstance(value, dict | list) and _names_secret(raw, text):
                text = encoded_head(mask_secrets(value), _HEAD)[0].decode()
    except (TypeError, ValueError, OverflowError):
        text = repr(mask_secrets(value) if isinstance(value, dict | list) else value)
    if len(text) > KEPT:
        text = cut_kept(text, KEPT)
    return truncate(redact(text))


def caller_of(call: CallRecord) -> str:
    if call.binding == "cli":
        return "user"
    return f"plugin:{call.plugin_name or '?'}@{call.binding}"


class SyscallAuditor:
    def __init__(self, log: AuditLog, session: SessionView | None = None) -> None:
        self.log = log
        self.session = session or (lambda: (None, "strict", "idle"))

    def __call__(self, call: CallRecord) -> None:
        session_id, mode, state = self.session()
        error = call.error
        output = summarize(call.result) if error is None else f"error {error.code}: {error.what}"
        metadata = {
            "request_id": call.request_id,
            "binding": call.binding,
            "peer_pid": str(call.peer.pid),
            "peer_uid": str(call.peer.uid),
        }
        if error is not None:
            metadata["error_code"] = error.code
        if call.policy_request is not None:  # replayed by the meta-policy trial
            metadata["policy_request"] = _encode(call.policy_request).decode()
        self.log.record_nowait(
            Event(
                "syscall",
                caller=caller_of(call),
                session_id=session_id,
                session_mode=mode,
                state_machine_state=state,
                syscall_type=call.method,
                policy_decision=call.decision,
                policy_rule_name=call.rule,
                deny_reason=redact(call.reason)
                if call.decision == "denied" and call.reason
                else None,
                input_summary=summarize(call.params),
                output_summary=truncate(redact(output)),
                duration_ms=round(call.duration_ms, 3),
                sandbox_id=call.container_id,
                metadata=metadata,
            )
        )
