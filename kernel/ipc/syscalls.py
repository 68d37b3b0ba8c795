"""The kernel's syscall table: each IPC method declared once, typed, closed.

A :class:`Syscall` declares one method: its name, its parameters as a msgspec
``Struct`` with ``forbid_unknown_fields`` (decoded strictly -- no coercion -- before the
handler runs), its result type, who may call it and the API version that introduced
it.  A :class:`SyscallTable` is a set of them; a name declared twice is an error when
the table is built, so a kernel with two handlers for one name never starts.

The server (:mod:`.connection`) looks a method up, refuses a caller the declaration
does not admit (``ipc.peer_rejected``) and params that do not decode
(``ipc.invalid_payload``, naming the field), and only then runs the handler with the
typed params.  Indexing a table (``table["kernel.ping"]``) gives the same checked call
as a plain ``(context, params)`` function.

Who may call: ``CLI`` is the user's own socket (binding ``"cli"``): only the user
starts tasks, approves merges, decides exemptions.  ``ANY`` is any socket the table is
served on; a handler that treats a plugin caller differently (``session.create``
judges a plugin's mode change as the plugin's) does so itself.  An :class:`OwnSocket`
is one kind of sandbox on its own socket (bindings ``tool:...``, ``ai:...``,
``policy-sandbox``): a sandbox's socket (``tool.next``, ``ai.next``, ``policy.next``)
serves its own small table of such declarations, typed like the kernel's.

A name a table does not declare is ``ipc.unknown_method``, unless the table was built
with its own refusal (``undeclared``): a plugin's socket answers every other name with
a denial that it audits.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, NoReturn, TypeVar

import msgspec

from fluffy.errors import DuplicateSyscall, InvalidPayload, PeerRejected, UnknownMethod
from fluffy.ipc.protocol import to_json
from fluffy.kernel.ipc.context import CallContext, Handler

#: the user's CLI socket only (binding ``"cli"``)
CLI: Literal["cli"] = "cli"
#: any socket the table is served on
ANY: Literal["any"] = "any"


class OwnSocket(msgspec.Struct, frozen=True):
    """One kind of sandbox, on its own socket: the bindings ``kind`` and ``kind:...``.

    The kernel makes that socket for that one sandbox and names it with
    :meth:`binding`; a method declared for it is refused on any other socket (the
    CLI's, another kind of sandbox's), before its params are read.
    """

    kind: str
    #: who that is, as docs/ipc.md and CHANGELOG.md say it ("a plugin sandbox")
    who: str

    def binding(self, *parts: str) -> str:
        """The binding of one such socket: ``kind:part:part``."""
        return ":".join((self.kind, *parts))

    def admits(self, binding: str) -> bool:
        return binding == self.kind or binding.startswith(self.kind + ":")


Callers = Literal["cli", "any"] | OwnSocket

#: check every result against its declared type before it is sent (a developer's
#: setting: the test suite sets it; a mismatch fails the call, ResultMismatch)
CHECK_RESULTS = os.environ.get("FLUFFY_CHECK_RESULTS") == "1"


class ResultMismatch(Exception):
    """A handler returned something other than its syscall's declared result (a bug in
    the kernel, found with ``FLUFFY_CHECK_RESULTS=1``)."""


P = TypeVar("P")

WHY = (
    "the kernel decodes each syscall's params strictly before anything runs: an unknown "
    "field, a missing one or a value of the wrong type is refused, never coerced"
)


class NoParams(msgspec.Struct, forbid_unknown_fields=True):
    """The params of a syscall that takes none (``null`` or ``{}`` on the wire)."""


@dataclass(frozen=True)
class Syscall(Generic[P]):
    """One IPC method, declared once."""

    name: str
    #: the params' Struct (``forbid_unknown_fields``)
    params: type[P]
    handler: Callable[[CallContext, P], Any]
    #: the result's type: a :class:`fluffy.ipc.results.Result`, ``X | None``,
    #: ``list[X]`` or ``None`` (fluffy/ipc/results/, drawn in docs/ipc-results.md)
    result: Any
    #: the API version that introduced it (CHANGELOG.md)
    since: int
    callers: Callers = ANY
    #: what a CLI-only call does, for the refusal: "only the user may {refusal}"
    refusal: str = ""
    fix: str = "Ask the user to do it in the fluffy CLI."

    def admit(self, context: CallContext) -> None:
        """Refuse a caller the declaration does not admit (before anything runs)."""
        if self.callers is ANY:
            return
        if self.callers == CLI and context.binding != "cli":
            raise PeerRejected(
                f"only the user may {self.refusal or 'call ' + self.name}",
                why=f"this connection is {context.binding}, not the CLI's socket",
                fix=self.fix,
            )
        if isinstance(self.callers, OwnSocket) and not self.callers.admits(context.binding):
            raise PeerRejected(
                f"{self.name} is served to {self.callers.who} on its own socket only",
                why=f"this connection is {context.binding}, not a {self.callers.kind} socket",
                fix="Call it from inside that sandbox, on the socket the kernel gave it.",
            )

    def decode(self, params: Any) -> P:
        """The params as the declared Struct (``null``: no fields given)."""
        try:
            return msgspec.convert({} if params is None else params, self.params, strict=True)
        except msgspec.ValidationError as exc:
            raise InvalidPayload(
                f"{self.name}: {explain(exc)}",
                why=WHY,
                fix=f"Send {signature(self.params)} (docs/ipc.md, the method table).",
            ) from None

    def accept(self, context: CallContext, params: Any) -> P:
        self.admit(context)
        return self.decode(params)

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (asked once, not per call)."""
        return inspect.iscoroutinefunction(self.handler)

    @functools.cached_property
    def _result_decoder(self) -> msgspec.json.Decoder[Any]:
        return msgspec.json.Decoder(self.result)

    def check_result(self, result: Any) -> None:
        """Raise :class:`ResultMismatch` unless ``result``, as the wire carries it,
        decodes as the declared result type."""
        try:
            self._result_decoder.decode(to_json(result))
        except msgspec.ValidationError as exc:
            raise ResultMismatch(
                f"{self.name} returned a result its declaration does not "
                f"allow: {exc} (fluffy/ipc/results/)"
            ) from None

    def with_handler(self, handler: Callable[[CallContext, P], Any]) -> Syscall[P]:
        return replace(self, handler=handler)

    def checked(self) -> Handler:
        """A plain ``(context, params)`` handler: admit, decode, then run (sync or async
        like the declared handler)."""
        handler = self.handler
        if inspect.iscoroutinefunction(handler):

            async def run_async(context: CallContext, params: Any) -> Any:
                result = await handler(context, self.accept(context, params))
                if CHECK_RESULTS:
                    self.check_result(result)
                return result

            return run_async

        def run(context: CallContext, params: Any) -> Any:
            result = handler(context, self.accept(context, params))
            if CHECK_RESULTS:
                self.check_result(result)
            return result

        return run


_MISSING = re.compile(r"Object missing required field `([^`]*)`(?: - at `\$([^`]*)`)?")
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`(?: - at `\$([^`]*)`)?")
_AT = re.compile(r"(.*) - at `\$([^`]*)`")


def explain(error: msgspec.ValidationError) -> str:
    """msgspec's message with the field named as the caller wrote it:
    ``missing request_id``, ``unknown field extra``, ``provider.model: expected ...``."""
    text = str(error)
    if found := _MISSING.fullmatch(text):
        return f"params: missing {_field(found[2], found[1])}"
    if found := _UNKNOWN.fullmatch(text):
        return f"params: unknown field {_field(found[2], found[1])}"
    if found := _AT.fullmatch(text):
        return f"params.{_field(found[2])}: {found[1][:1].lower()}{found[1][1:]}"
    return f"params: {text[:1].lower()}{text[1:]}"  # the params themselves (not an object)


def _field(at: str | None, name: str = "") -> str:
    path = (at or "").lstrip(".")
    return f"{path}.{name}" if path and name else path or name


def signature(params: type[Any]) -> str:
    """``{session_id, text, provider?}``: the fields a Struct takes (``?``: optional)."""
    fields = msgspec.structs.fields(params)
    names = [f.encode_name + ("" if f.required else "?") for f in fields]
    return "{" + ", ".join(names) + "}" if names else "no params (null or {})"


#: How a table refuses a name it does not declare: it raises (a FluffyError), and may
#: note the decision its audit entry carries (``note_decision``).
Undeclared = Callable[[CallContext, str], None]


class SyscallTable(Mapping[str, Handler]):
    """A closed set of syscalls; a name declared twice raises :class:`DuplicateSyscall`.

    As a mapping it gives each method's checked handler (admit, decode, run).
    ``undeclared`` refuses every other name (default: ``ipc.unknown_method``); a table
    joined from this one keeps its declarations only.
    """

    def __init__(
        self,
        *groups: Iterable[Syscall[Any]] | SyscallTable,
        undeclared: Undeclared | None = None,
    ) -> None:
        self._syscalls: dict[str, Syscall[Any]] = {}
        self._undeclared = undeclared
        for group in groups:
            for syscall in group.syscalls() if isinstance(group, SyscallTable) else group:
                first = self._syscalls.get(syscall.name)
                if first is not None:
                    raise DuplicateSyscall(
                        f"the syscall {syscall.name!r} is declared twice "
                        f"({_where(first)} and {_where(syscall)})"
                    )
                self._syscalls[syscall.name] = syscall

    def syscall(self, name: str) -> Syscall[Any] | None:
        return self._syscalls.get(name)

    def syscalls(self) -> list[Syscall[Any]]:
        return list(self._syscalls.values())

    def refuse(self, context: CallContext, name: str) -> NoReturn:
        """Refuse ``name``, which this table does not declare (nothing else runs)."""
        if self._undeclared is not None:
            self._undeclared(context, name)
        raise UnknownMethod(f"unknown method {name!r}; methods: {', '.join(sorted(self))}")

    def replaced(self, name: str, handler: Callable[[CallContext, Any], Any]) -> SyscallTable:
        """This table with one method's handler replaced (its declaration kept)."""
        return SyscallTable(
            (s.with_handler(handler) if s.name == name else s for s in self._syscalls.values()),
            undeclared=self._undeclared,
        )

    def __getitem__(self, name: str) -> Handler:
        found = self.syscall(name)
        if found is None:
            raise KeyError(name)
        return found.checked()

    def __iter__(self) -> Iterator[str]:
        return iter(self._syscalls)

    def __len__(self) -> int:
        return len(self._syscalls)


def _where(syscall: Syscall[Any]) -> str:
    handler = syscall.handler
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"
