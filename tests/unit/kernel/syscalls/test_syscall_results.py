"""Every syscall declares its result as a closed type, and the kernel checks it.

The declarations (fluffy/ipc/results/) are drawn in docs/ipc-results.md exactly, and
CHANGELOG.md names each method's result type beside it, so that changing what a
syscall returns is a visible change to a class, a page and the changelog.  With
``FLUFFY_CHECK_RESULTS=1`` (set for every test run by tests/conftest.py) a handler
that returns something else fails its call on a real socket, sync or async.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.errors import InternalError
from fluffy.ipc import ai_types
from fluffy.ipc.client import AsyncClient
from fluffy.ipc.results import Part, Result, admin
from fluffy.ipc.results import tools as tool_results
from fluffy.ipc.results.drawing import declared, drawing, drawn_in, result_modules, result_text
from fluffy.kernel import memory_guard
from fluffy.kernel.ipc import syscalls
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.ipc.syscalls import NoParams, ResultMismatch, Syscall, SyscallTable
from fluffy.kernel.plugins import manifest
from fluffy.kernel.project import defaults, layout
from fluffy.kernel.scheduler.task import TASK_STATES
from fluffy.kernel.tools.core import registry
from fluffy.kernel.tools.routing import breaker
from fluffy.kernel.workflow import states
from unit.kernel_table import sandbox_tables, served_table

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[4]


def _all_syscalls() -> list[Syscall[Any]]:
    tables = [served_table(), *sandbox_tables().values()]
    return [syscall for table in tables for syscall in table.syscalls()]


def _named(tp: Any) -> list[type[Any]]:
    """The Result classes a declared result names (``X``, ``X | None``, ``list[X]``)."""
    if tp is None or tp is type(None):
        return []
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return [c for a in args for c in _named(a)]
    if origin is list:
        return _named(args[0])
    assert isinstance(tp, type) and issubclass(tp, Result), f"not a Result: {tp!r}"
    return [tp]


def _parts(cls: type[msgspec.Struct], seen: set[type[Any]]) -> None:
    """Every Struct reachable from ``cls``'s fields, into ``seen``."""
    for field in msgspec.structs.fields(cls):
        stack = [field.type]
        while stack:
            tp = stack.pop()
            stack.extend(typing.get_args(tp))
            if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and tp not in seen:
                seen.add(tp)
                _parts(tp, seen)


def test_every_syscall_declares_a_closed_result_type() -> None:
    everything = _all_syscalls()
    assert len(everything) >= 42
    drawn = {cls for module in result_modules() for cls in declared(module)}
    used: set[type[Any]] = set()
    for syscall in everything:
        named = _named(syscall.result)  # never dict[str, Any]: that is not a Result
        assert named or syscall.result in (None, type(None)), syscall.name
        used.update(named)
    reachable = set(used)
    for cls in used:
        _parts(cls, reachable)
    for cls in reachable:
        if cls.__module__ == ai_types.__name__:  # the AI wire's own (ai.next's job)
            continue
        assert cls.__struct_config__.forbid_unknown_fields, cls.__name__
        assert cls in drawn, f"{cls.__name__} is not declared in fluffy/ipc/results/"
    orphans = {c.__name__ for c in drawn if issubclass(c, Result)} - {c.__name__ for c in used}
    assert orphans == set(), "result types no syscall declares"
    assert {c.__name__ for c in drawn if issubclass(c, Part)} <= {c.__name__ for c in reachable}


def test_result_class_names_are_unique() -> None:
    names = [cls.__name__ for module in result_modules() for cls in declared(module)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_docs_ipc_results_md_carries_the_drawing_exactly() -> None:
    page = (ROOT / "docs" / "ipc-results.md").read_text(encoding="utf-8")
    assert drawn_in(page) == drawing(), (
        "run: python -m fluffy.ipc.results.drawing --update docs/ipc-results.md"
    )


def test_changelog_names_each_syscalls_result_type() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    section = text.split("## The syscalls served", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^- `([a-z_.]+)` \([^)]*\) → (.+)$", section, re.M))
    declared_results = {s.name: result_text(s.result) for s in _all_syscalls()}
    assert listed == declared_results, "CHANGELOG.md's result types vs the declarations"


def _literal(cls: type[msgspec.Struct], name: str) -> tuple[Any, ...]:
    (field,) = [f for f in msgspec.structs.fields(cls) if f.name == name]
    return typing.get_args(field.type)


def test_the_wire_literals_are_the_kernels_own() -> None:
    """A closed set the wire names is the set the kernel's code has (else a new state,
    route or event would fail every result that carries it)."""
    assert typing.get_args(tool_results.FlowEvent) == states.EVENTS
    assert typing.get_args(tool_results.ToolRoute) == typing.get_args(registry.Route)
    assert typing.get_args(tool_results.ToolKind) == typing.get_args(registry.Kind)
    assert _literal(admin.BreakerStatus, "state") == typing.get_args(breaker.BreakerState)
    assert _literal(admin.KernelMemory, "level") == typing.get_args(memory_guard.Level)
    assert [f.name for f in msgspec.structs.fields(admin.TaskCounts)] == list(TASK_STATES)
    assert _literal(admin.ProjectLayout, "kind") == typing.get_args(layout.Kind)
    assert _literal(admin.ProjectLayout, "language") == typing.get_args(layout.Language)
    assert _literal(admin.PluginPlan, "sandbox_template") == manifest.TOOL_TEMPLATES
    assert _literal(admin.PolicySource, "source")[1] == defaults.POLICY_FILE


class Answer(Result):
    """A test result."""

    name: str
    count: int = 0


def _answer(context: CallContext, params: NoParams) -> dict[str, Any]:
    return {"name": "a", "count": 2}


def _extra(context: CallContext, params: NoParams) -> dict[str, Any]:
    return {"name": "a", "undeclared": True}


async def _wrong_type(context: CallContext, params: NoParams) -> dict[str, Any]:
    return {"name": 7}


async def _struct(context: CallContext, params: NoParams) -> Answer:
    return Answer(name="s")


TABLE = SyscallTable(
    [
        Syscall("test.answer", NoParams, _answer, Answer, since=1),
        Syscall("test.extra", NoParams, _extra, Answer, since=1),
        Syscall("test.wrong", NoParams, _wrong_type, Answer | None, since=1),
        Syscall("test.struct", NoParams, _struct, Answer, since=1),
    ]
)


async def test_a_result_its_declaration_does_not_allow_fails_the_call(tmp_path: Path) -> None:
    assert syscalls.CHECK_RESULTS  # tests/conftest.py
    server = KernelServer(TABLE)
    path = tmp_path / "run" / "kernel.sock"
    await server.listen(path, binding="cli")
    client = await AsyncClient.connect(str(path))
    try:
        assert await client.call("test.answer") == {"name": "a", "count": 2}
        assert await client.call("test.struct") == {"name": "s", "count": 0}
        for method in ("test.extra", "test.wrong"):  # sync and async handlers
            with pytest.raises(InternalError, match=rf"{method} failed: ResultMismatch"):
                await client.call(method)
        assert await client.call("test.answer") == {"name": "a", "count": 2}  # still serving
    finally:
        await client.close()
        await server.close()


def test_the_check_names_the_method_and_the_field() -> None:
    syscall = TABLE.syscall("test.extra")
    assert syscall is not None
    with pytest.raises(ResultMismatch, match=r"test\.extra returned .*unknown field `undeclared`"):
        syscall.check_result({"name": "a", "undeclared": True})
    syscall.check_result({"name": "a"})  # a declared default may be left out


async def test_without_the_setting_results_are_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syscalls, "CHECK_RESULTS", False)
    server = KernelServer(TABLE)
    path = tmp_path / "run" / "kernel.sock"
    await server.listen(path, binding="cli")
    client = await AsyncClient.connect(str(path))
    try:
        assert await client.call("test.extra") == {"name": "a", "undeclared": True}
    finally:
        await client.close()
        await server.close()
