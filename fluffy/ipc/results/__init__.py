"""The results of the kernel's syscalls, one typed Struct (or ``None``) per method.

Each :class:`~fluffy.kernel.ipc.syscalls.Syscall` declares its result here; the wire
carries it as a JSON object.  A result is closed (``forbid_unknown_fields``): a field a
handler adds without declaring it is a mismatch, so a change to what a syscall returns
is a change to these classes, drawn field by field in ``docs/ipc-results.md``
(generated; a unit test checks it, and CHANGELOG.md says which changes are breaking).

With ``FLUFFY_CHECK_RESULTS=1`` (the test suite sets it) the kernel decodes every
result it sends as its declared type and fails the call on a mismatch.  Standard
library and msgspec only, like the rest of :mod:`fluffy.ipc`.
"""

from __future__ import annotations

import msgspec


class Result(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A syscall's result: a closed JSON object."""


class Part(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A closed JSON object nested in a result."""
