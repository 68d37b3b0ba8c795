"""Names of the project's files as fluffy's text formats can carry them.

A POSIX file name is bytes.  Python gives a name that is not UTF-8 (an old Latin-1
checkout, an archive's, or a hostile repository's) as a ``str`` holding surrogate
escapes (PEP 383), which JSON, IPC frames, RE2's glob matchers and the model all
refuse; a name with a control character (``\\x01``) is UTF-8 but no XML report can
carry it.  Such a file is still the person's: fluffy must neither crash on it nor lose
it.

- :func:`matchable`: the name globs are matched against (each undecodable byte as
  U+FFFD: ``caf\\xe9.env`` still matches ``*.env``);
- :func:`shown`: the name where text must carry it (a tree snapshot's keys, test ids,
  messages), quoted as git quotes it (``"caf\\351.txt"``), one-to-one: :func:`unshown`
  gives the name back;
- :func:`is_utf8`: whether a name is UTF-8 text (what the model's tools can name).

The test tool's canary plugin (``plugins/test_tool/canary.py``) quotes a test file's
path exactly as :func:`shown` does, in the project's own interpreter.
"""

from __future__ import annotations

import re

_QUOTED = re.compile(rb'\\([0-3][0-7]{2}|["\\])')
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What makes a name quoted: a surrogate (not UTF-8), a C0 control character, DEL, or a
#: character XML 1.0 refuses (U+FFFE, U+FFFF).
_NEEDS_QUOTES = re.compile("[\ud800-\udfff\x00-\x1f\x7f\ufffe\uffff]")


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no surrogate escape, no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_utf8(exc: UnicodeEncodeError) -> str | None:
    """Where ``exc`` met a surrogate (text that is not UTF-8: a name's bytes), shown with
    some text around it as ASCII; None when it failed on something else."""
    if not _SURROGATE.search(exc.object[exc.start : exc.end]):
        return None
    return ascii(exc.object[max(0, exc.start - 30) : exc.end + 20])


def matchable(rel: str) -> str:
    """``rel`` with each surrogate (an undecodable byte) as U+FFFD (``rel`` itself when
    it is UTF-8)."""
    return rel if is_utf8(rel) else _SURROGATE.sub("\ufffd", rel)


def shown(rel: str) -> str:
    """``rel`` as UTF-8 text an XML report can carry: itself, unless it is not UTF-8,
    holds a control character (or U+FFFE, U+FFFF) or starts with ``"``; then git's
    quoting: in double quotes, ``\\`` and ``"`` escaped, each byte that is not part of
    a UTF-8 character and each of those characters' bytes as three-digit octal
    escapes.  Distinct names stay distinct (an unquoted one never starts with ``"``)."""
    if not rel.startswith('"') and not _NEEDS_QUOTES.search(rel):
        return rel
    out: list[str] = []
    for char in rel:
        point = ord(char)
        if 0xDC80 <= point <= 0xDCFF:  # a surrogate escape: one byte of the name
            out.append(f"\\{point - 0xDC00:03o}")
        elif 0xD800 <= point <= 0xDFFF or point in (0xFFFE, 0xFFFF):  # (a lone surrogate
            # no file name decodes to; characters no XML report carries): their bytes
            out.append("".join(f"\\{b:03o}" for b in char.encode("utf-8", "surrogatepass")))
        elif point < 0x20 or point == 0x7F:
            out.append(f"\\{point:03o}")
        elif char in '"\\':
            out.append("\\" + char)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def unshown(name: str) -> str:
    """The file name :func:`shown` gave ``name`` for (``name`` itself when unquoted)."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    raw = _QUOTED.sub(_unescape, name[1:-1].encode("utf-8"))
    return raw.decode("utf-8", "surrogateescape")


def _unescape(found: re.Match[bytes]) -> bytes:
    escape = found.group(1)
    return escape if len(escape) == 1 else bytes([int(escape, 8)])
