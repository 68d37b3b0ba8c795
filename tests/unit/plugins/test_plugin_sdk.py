"""The tool-plugin SDK: schemas, paths, the view, diffs, the context, one job's execution."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import ConfigError, ToolFailed, ToolInputInvalid
from fluffy.images.spec import SANDBOX_PARTS
from fluffy.plugins.sdk import (
    ENV_ALLOW,
    ProjectView,
    Roots,
    ToolContext,
    ToolDefinition,
    ToolPlugin,
    check_plugin,
    check_schema,
    execute_job,
    link_stays_inside,
    normalise_path,
    scrubbed,
    unified_diff,
    validate,
)
from fluffy.plugins.sdk.diff import split_lines

ROOT = Path(__file__).resolve().parents[3]


# -- applying a unified diff (independent of the SDK's writer) --------------------------
def apply_patch(old: str | None, diff: str) -> str:
    """Apply a one-file unified diff made by ``unified_diff`` to ``old``; checks context."""
    source = split_lines(old or "")
    lines = split_lines(diff)
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ ")
    out: list[str] = []
    pos, i = 0, 2
    while i < len(lines):
        head = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@\n", lines[i])
        assert head, lines[i]
        start, count = int(head[1]), int(head[2] or "1")
        begin = start - 1 if count else start
        assert begin >= pos
        out.extend(source[pos:begin])
        pos, i = begin, i + 1
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, body = lines[i][0], lines[i][1:]
            no_newline = i + 1 < len(lines) and lines[i + 1].startswith("\\ No newline")
            if no_newline:
                assert body.endswith("\n")
                body = body[:-1]
            if tag in " -":
                assert source[pos] == body, (source[pos], body)
                pos += 1
            if tag in " +":
                out.append(body)
            i += 2 if no_newline else 1
    out.extend(source[pos:])
    return "".join(out)


texts = st.lists(st.sampled_from(["a", "b", "c", "", "a\r", "\tb"]), max_size=10).flatmap(
    lambda lines: st.sampled_from(["\n".join(lines), "\n".join(lines) + "\n"])
)


@settings(max_examples=300, deadline=None)
@given(old=st.none() | texts, new=texts)
def test_diff_applies_to_give_the_new_text(old: str | None, new: str) -> None:
    diff = unified_diff("src/x.py", old, new)
    if (old or "") == new:
        assert diff == ""
        return
    assert diff.startswith("--- /dev/null\n" if old is None else "--- a/src/x.py\n")
    assert diff.split("\n")[1] == "+++ b/src/x.py"
    assert apply_patch(old, diff) == new


def test_diff_marks_a_missing_final_newline_like_git(tmp_path: Path) -> None:
    diff = unified_diff("f.txt", "one\ntwo", "one\nthree")
    assert diff.endswith(
        "-two\n\\ No newline at end of file\n+three\n\\ No newline at end of file\n"
    )
    (tmp_path / "f.txt").write_text("one\ntwo")
    (tmp_path / "p.diff").write_text(diff)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "f.txt").read_text() == "one\nthree"


def test_diff_is_empty_for_an_empty_new_file() -> None:
    assert unified_diff("f", None, "") == ""


# -- schemas --------------------------------------------------------------------------
OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 5},
        "count": {"type": "integer", "minimum": 1, "maximum": 3, "default": 2},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "nested": {
            "type": "object",
            "properties": {"deep": {"type": "integer", "default": 7}},
            "additionalProperties": False,
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


def test_validate_accepts_good_input_and_fills_defaults() -> None:
    check_schema(OBJECT)
    checked = validate(OBJECT, {"path": "x", "ratio": 1, "tags": ["a"], "nested": {}})
    assert checked == {"path": "x", "ratio": 1, "tags": ["a"], "nested": {"deep": 7}, "count": 2}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "args: expected object, got array"),
        ({}, "missing required argument(s): path"),
        ({"path": 1}, "args.path: expected string, got integer"),
        ({"path": ""}, "at least 1 characters"),
        ({"path": "toolong"}, "at most 5 characters"),
        ({"path": "x", "count": True}, "args.count: expected integer, got boolean"),
        ({"path": "x", "count": 2.0}, "expected integer, got number"),
        ({"path": "x", "count": 9}, "at most 3"),
        ({"path": "x", "count": 0}, "at least 1"),
        ({"path": "x", "ratio": "1"}, "expected number"),
        ({"path": "x", "flag": 1}, "expected boolean"),
        ({"path": "x", "mode": "c"}, "must be one of 'a', 'b'"),
        ({"path": "x", "tags": ["a", 1]}, "args.tags[1]: expected string"),
        ({"path": "x", "tags": ["a", "b", "c"]}, "at most 2 items"),
        ({"path": "x", "nested": {"deep": "no"}}, "args.nested.deep: expected integer"),
        ({"path": "x", "nested": {"other": 1}}, "unknown argument(s) other"),
        ({"path": "x", "extra": 1}, "unknown argument(s) extra"),
    ],
)
def test_validate_refuses_bad_input_naming_the_argument(args: Any, message: str) -> None:
    with pytest.raises(ToolInputInvalid) as caught:
        validate(OBJECT, args)
    assert message in caught.value.what


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "pattern": "x"}, "unsupported keyword(s) pattern"),
        ({"type": "object", "oneOf": []}, "unsupported keyword(s) oneOf"),
        ({"type": "float"}, "not one of"),
        ({"description": "no type"}, "needs a 'type'"),
        ({"type": "integer", "minLength": 1}, "minLength applies to string"),
        ({"type": "string", "maxLength": -1}, "non-negative integer"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "true or false"),
        ({"type": "object", "required": ["a"]}, "undeclared properties: a"),
        ({"type": "object", "properties": {"a": {"type": "x"}}}, "$.a: type"),
        ({"type": "string", "enum": []}, "non-empty list"),
        ({"type": "integer", "default": "1"}, "default does not match"),
        ({"type": "array", "items": {"type": "string", "format": "uri"}}, "$[]"),
    ],
)
def test_check_schema_refuses_what_the_validator_cannot_check(
    schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_schema(schema)
    assert message in caught.value.what


def test_defaults_are_copies() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "default": []}}}
    first = validate(schema, {})
    first["xs"].append(1)
    assert validate(schema, {}) == {"xs": []}


# -- paths ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a/b.py", "a/b.py"),
        ("./a//b/./c", "a/b/c"),
        ("a/", "a"),
        ("x..y/z", "x..y/z"),
        (".gitignore", ".gitignore"),
        ("sub/.github/ci.yml", "sub/.github/ci.yml"),
    ],
)
def test_paths_are_normalised(path: str, expected: str) -> None:
    assert normalise_path(path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "empty"),
        (".", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/../b", "'..'"),
        (".git/config", ".git"),
        ("sub/.GIT/hooks/x", ".git"),
        ("a\x00b", "NUL"),
        ("x" * 5000, "longer"),
    ],
)
def test_bad_paths_are_refused(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        normalise_path(path)


def test_the_root_is_allowed_only_when_asked() -> None:
    assert normalise_path(".", allow_root=True) == "."
    assert normalise_path("./", allow_root=True) == "."


@pytest.mark.parametrize(
    ("rel", "target", "inside"),
    [
        ("a/link", "b", True),
        ("a/link", "../b/c", True),
        ("a/b/link", "../../c", True),
        ("link", "../x", False),
        ("a/link", "../../x", False),
        ("a/link", "/etc/passwd", False),
        ("a/link", "d/../x", False),
        ("link", ".git/config", False),
        ("link", "", False),
    ],
)
def test_links_stay_inside_only_when_they_only_descend_after_climbing(
    rel: str, target: str, inside: bool
) -> None:
    assert link_stays_inside(rel, target) is inside


# -- the view -------------------------------------------------------------------------
@pytest.fixture()
def roots(tmp_path: Path) -> Roots:
    roots = Roots(tmp_path / "workspace", tmp_path / "staged", tmp_path / "output")
    for folder in (roots.workspace, roots.staged, roots.output):
        folder.mkdir()
    (roots.workspace / "src").mkdir()
    (roots.workspace / "src" / "a.py").write_text("a = 1\n")
    (roots.workspace / "src" / "b.py").write_text("b = 1\n")
    (roots.workspace / "README").write_text("hi\n")
    (roots.workspace / ".git").mkdir()
    (roots.workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    tree = roots.staged / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.py").write_text("a = 2\n")
    (tree / "src" / "new.py").write_text("new = 1\n")
    (roots.staged / "deleted.txt").write_text("src/b.py\n\n")
    return roots


def test_the_view_overlays_staged_changes(roots: Roots) -> None:
    view = ProjectView(roots.workspace, roots.staged)
    assert view.read_bytes("src/a.py") == b"a = 2\n"
    assert view.read_bytes("README") == b"hi\n"
    assert not view.is_file("src/b.py")
    assert view.is_file("src/new.py") and view.is_dir("src") and view.is_dir(".")
    assert view.list_dir(".") == ["README", "src"]
    assert view.list_dir("src") == ["a.py", "new.py"]
    assert [e.path for e in view.walk()] == ["README", "src/a.py", "src/new.py"]
    assert [e.path for e in view.walk("src/a.py")] == ["src/a.py"]
    with pytest.raises(ToolInputInvalid, match="does not exist"):
        view.read_bytes("src/b.py")
    with pytest.raises(ToolInputInvalid, match="folder"):
        view.read_bytes("src")


def test_the_view_leaves_out_names_no_answer_can_carry(roots: Roots) -> None:
    # a name that is not UTF-8 (fluffy.pathnames): a plugin's JSON answer would fail on it
    (roots.workspace / os.fsdecode(b"caf\xe9.txt")).write_text("the person's\n")
    (roots.workspace / "link").symlink_to(os.fsdecode(b"caf\xe9.txt"))
    view = ProjectView(roots.workspace, roots.staged)
    assert view.list_dir(".") == ["README", "link", "src"]
    entries = {e.path: e.link for e in view.walk()}
    assert entries == {"README": None, "link": "caf\ufffd.txt", "src/a.py": None,
                       "src/new.py": None}  # fmt: skip


def test_the_view_without_staged_changes_is_the_workspace(roots: Roots, tmp_path: Path) -> None:
    view = ProjectView(roots.workspace, tmp_path / "missing")
    assert view.read_bytes("src/b.py") == b"b = 1\n"
    assert [e.path for e in view.walk()] == ["README", "src/a.py", "src/b.py"]


def test_the_view_never_follows_links_out(roots: Roots, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    (roots.workspace / "out").symlink_to(secret)
    (roots.workspace / "outdir").symlink_to(tmp_path)
    (roots.workspace / "in").symlink_to("README")
    view = ProjectView(roots.workspace, roots.staged)
    with pytest.raises(ValueError, match="outside the project"):
        view.read_bytes("out")
    with pytest.raises(ValueError, match="outside the project"):
        view.read_bytes("outdir/secret.txt")
    assert not view.is_file("out") and not view.is_dir("outdir")
    assert view.read_bytes("in") == b"hi\n"
    links = {e.path: e.link for e in view.walk() if e.link is not None}
    assert links == {"in": "README", "out": str(secret), "outdir": str(tmp_path)}


# -- the context ----------------------------------------------------------------------
def context(roots: Roots, **kwargs: Any) -> ToolContext:
    options: dict[str, Any] = {
        "call_id": "call-1",
        "view": ProjectView(roots.workspace, roots.staged),
        "output": roots.output,
        "env": scrubbed(os.environ),
        **kwargs,
    }
    return ToolContext(**options)


def test_run_takes_a_list_only(roots: Roots) -> None:
    ctx = context(roots)
    with pytest.raises(TypeError, match="not a string"):
        ctx.run("echo hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty"):
        ctx.run([])
    result = ctx.run([sys.executable, "-c", "import os; print(os.getcwd())"], input="")
    assert result.ok and result.stdout.strip() == os.path.realpath(roots.workspace)
    echoed = ctx.run(
        [sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"], input="ab"
    )
    assert echoed.stdout.strip() == "ba"


def test_run_reports_a_missing_program(roots: Roots) -> None:
    with pytest.raises(ToolFailed, match="no such program"):
        context(roots).run(["fluffy-no-such-program-x"])


def test_run_sees_the_scrubbed_environment_only(
    roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    ctx = ToolContext(
        call_id="c", view=ProjectView(roots.workspace, roots.staged), output=roots.output
    )
    assert "OPENAI_API_KEY" not in ctx.env and set(ctx.env) <= set(ENV_ALLOW)
    with pytest.raises(TypeError):
        ctx.env["X"] = "y"  # type: ignore[index]
    shown = ctx.run([sys.executable, "-c", "import os; print(sorted(os.environ))"]).stdout
    assert "OPENAI_API_KEY" not in shown
    extra = ctx.run([sys.executable, "-c", "import os; print(os.environ['X'])"], env={"X": "1"})
    assert extra.stdout.strip() == "1"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_run_kills_the_whole_process_group_on_timeout(roots: Roots) -> None:
    script = "import subprocess, sys, time\n"
    script += "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    script += "print(child.pid, flush=True)\ntime.sleep(60)\n"
    result = context(roots).run([sys.executable, "-c", script], timeout_s=1)
    assert result.timed_out and not result.ok and result.exit_code < 0
    assert result.duration_s < 30  # generous: the point is that it did not wait 60 s
    grandchild = int(result.stdout.split()[0])
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_context_reads_the_view_and_refuses_bad_paths(roots: Roots) -> None:
    ctx = context(roots)
    assert ctx.read_file("src/a.py") == "a = 2\n" and ctx.read_bytes("README") == b"hi\n"
    assert ctx.file_exists("src/new.py") and not ctx.file_exists("src/b.py")
    assert ctx.list_dir("src") == ["a.py", "new.py"] and ctx.list_dir() == ["README", "src"]
    for bad in ("/etc/passwd", "../x", ".git/HEAD", ""):
        with pytest.raises(ValueError):
            ctx.read_file(bad)
    (roots.workspace / "bin.dat").write_bytes(b"\xff\xfe")
    with pytest.raises(ToolInputInvalid, match="not UTF-8"):
        ctx.read_file("bin.dat")


def test_write_file_lands_in_the_calls_own_output(roots: Roots) -> None:
    ctx = context(roots)
    written = ctx.write_file("reports/out.txt", "data")
    assert written == roots.output / "call-1" / "files" / "reports" / "out.txt"
    assert written.read_text() == "data"
    for bad in ("/tmp/x", "../x", "a/../../x", ".git/x"):
        with pytest.raises(ValueError):
            ctx.write_file(bad, "x")
    assert not (roots.workspace / "reports").exists()


def test_context_refuses_unsafe_call_ids_and_modes(roots: Roots) -> None:
    for bad in ("../x", "", "a/b", ".hidden", "x" * 200):
        with pytest.raises(ValueError, match="call_id"):
            context(roots, call_id=bad)
    with pytest.raises(ValueError, match="session_mode"):
        context(roots, session_mode="yolo")


def test_emitted_changes_are_files_under_the_call(roots: Roots) -> None:
    ctx = context(roots)
    call = roots.output / "call-1"
    assert ctx.emit_patch("src/a.py", "a = 2\n") is None  # unchanged (against the view)
    patch = ctx.emit_patch("src/a.py", "a = 3\n")
    assert patch == {"path": "src/a.py", "op": "patch", "file": "0.diff"}
    assert apply_patch("a = 2\n", (call / "0.diff").read_text()) == "a = 3\n"
    created = ctx.emit_patch("./docs//new.md", "# new\n")
    assert created == {"path": "docs/new.md", "op": "patch", "file": "1.diff"}
    assert (call / "1.diff").read_text().startswith("--- /dev/null\n+++ b/docs/new.md\n")
    assert ctx.emit_patch("empty.txt", "") == {
        "path": "empty.txt",
        "op": "full",
        "file": "2.content",
    }
    assert ctx.emit_full("data.bin", b"\x00\x01") == {
        "path": "data.bin",
        "op": "full",
        "file": "3.content",
    }
    assert (call / "3.content").read_bytes() == b"\x00\x01"
    assert ctx.emit_delete("README") == {"path": "README", "op": "delete"}
    assert [c["path"] for c in ctx.changes] == [
        "src/a.py",
        "docs/new.md",
        "empty.txt",
        "data.bin",
        "README",
    ]
    with pytest.raises(ToolInputInvalid, match="cannot be deleted"):
        ctx.emit_delete("src/b.py")  # staged for deletion already
    with pytest.raises(ToolInputInvalid, match="folder"):
        ctx.emit_patch("src", "x")
    with pytest.raises(ToolInputInvalid, match="README is a file"):
        ctx.emit_patch("README/inside.txt", "x")
    with pytest.raises(ValueError, match=r"\.git"):
        ctx.emit_full(".git/config", "x")


def test_the_last_change_of_a_path_wins(roots: Roots) -> None:
    ctx = context(roots)
    ctx.emit_patch("src/a.py", "first\n")
    ctx.emit_patch("src/a.py", "second\n")
    assert ctx.changes == [{"path": "src/a.py", "op": "patch", "file": "1.diff"}]
    assert not (roots.output / "call-1" / "0.diff").exists()


def test_a_non_text_original_falls_back_to_full_content(roots: Roots) -> None:
    (roots.workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    change = context(roots).emit_patch("latin1.txt", "café\n")
    assert change == {"path": "latin1.txt", "op": "full", "file": "0.content"}


def test_a_read_only_tool_cannot_emit_changes(roots: Roots) -> None:
    ctx = context(roots, read_only=True, tool_name="search.grep")
    with pytest.raises(ToolFailed, match="read-only"):
        ctx.emit_patch("x.txt", "x")


# -- definitions and plugins ----------------------------------------------------------
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def test_tool_definitions_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"namespace\.verb"):
        ToolDefinition("write", "d", SCHEMA)
    with pytest.raises(ConfigError, match="type 'object'"):
        ToolDefinition("fs.write", "d", {"type": "string"})
    with pytest.raises(ConfigError, match="unsupported keyword"):
        ToolDefinition("fs.write", "d", {"type": "object", "patternProperties": {}})
    with pytest.raises(ConfigError, match="output_mode"):
        ToolDefinition("fs.write", "d", SCHEMA, output_mode="diff")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s"):
        ToolDefinition("fs.write", "d", SCHEMA, timeout_s=0)
    with pytest.raises(ConfigError, match="description"):
        ToolDefinition("fs.write", " ", SCHEMA)
    tool = ToolDefinition("fs.write", "d", SCHEMA, read_only=True, truncation="head")
    assert ToolDefinition.from_dict(tool.to_dict()) == tool
    with pytest.raises(ConfigError, match="unknown tool definition field"):
        ToolDefinition.from_dict({**tool.to_dict(), "outputMode": "patch"})


def _plugin(tools: list[ToolDefinition], handlers: dict[str, Any], name: str = "demo") -> Any:
    class Demo(ToolPlugin):
        def tools(self) -> list[ToolDefinition]:
            return tools

        def handlers(self) -> dict[str, Any]:
            return handlers

    plugin = Demo()
    plugin.name = name
    return plugin


def test_check_plugin_requires_one_handler_per_tool() -> None:
    tool = ToolDefinition("demo.echo", "d", SCHEMA)
    other = ToolDefinition("demo.other", "d", SCHEMA)
    assert set(check_plugin(_plugin([tool], {"demo.echo": print}))) == {"demo.echo"}
    with pytest.raises(ConfigError, match="no handler"):
        check_plugin(_plugin([tool, other], {"demo.echo": print}))
    with pytest.raises(ConfigError, match=r"undefined tools: demo\.other"):
        check_plugin(_plugin([tool], {"demo.echo": print, "demo.other": print}))
    with pytest.raises(ConfigError, match="twice"):
        check_plugin(_plugin([tool, tool], {"demo.echo": print}))
    with pytest.raises(ConfigError, match="plugin name"):
        check_plugin(_plugin([tool], {"demo.echo": print}, name="Bad Name"))
    with pytest.raises(ConfigError, match="not a ToolPlugin"):
        check_plugin(object())


# -- executing a job ------------------------------------------------------------------
def echo(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    if args["text"] == "crash":
        raise RuntimeError("handler exploded")
    if args["text"] == "bad-path":
        ctx.read_file("../outside")
    if args["text"] == "not-a-dict":
        return ["x"]  # type: ignore[return-value]
    if args["text"] == "not-json":
        return {"x": object()}
    if args["text"] == "sets-changes":
        return {"changes": []}
    if args["text"] == "exit":
        raise SystemExit(3)
    ctx.emit_patch("out.txt", args["text"])
    return {"echo": args["text"], "mode": ctx.session_mode, "sandbox": ctx.sandbox_id}


def peek(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"text": ctx.read_file("README")}


TOOLS = check_plugin(
    _plugin(
        [
            ToolDefinition("demo.echo", "Echo", SCHEMA),
            ToolDefinition("demo.peek", "Peek", {"type": "object"}, read_only=True),
        ],
        {"demo.echo": echo, "demo.peek": peek},
    )
)


def job(text: Any, **extra: Any) -> dict[str, Any]:
    return {
        "call_id": "c1",
        "tool": "demo.echo",
        "args": {"text": text},
        "session_mode": "explore",
        "sandbox_id": "sb-1",
        **extra,
    }


def test_a_job_runs_to_a_result_with_its_changes(roots: Roots) -> None:
    reply = execute_job(TOOLS, "demo", job("hello\n"), roots)
    assert reply.pop("duration_ms") >= 0
    assert reply == {
        "call_id": "c1",
        "ok": True,
        "result": {
            "echo": "hello\n",
            "mode": "explore",
            "sandbox": "sb-1",
            "changes": [{"path": "out.txt", "op": "patch", "file": "0.diff"}],
        },
    }
    assert apply_patch(None, (roots.output / "c1" / "0.diff").read_text()) == "hello\n"
    peeked = execute_job(TOOLS, "demo", {**job(""), "tool": "demo.peek", "args": None}, roots)
    assert peeked["result"] == {"text": "hi\n"}  # read-only: no "changes"


@pytest.mark.parametrize(
    ("the_job", "code", "text"),
    [
        (job(5), "tool.input_invalid", "args.text: expected string, got integer"),
        (job("x", args={}), "tool.input_invalid", "missing required argument(s): text"),
        (job("x", tool="demo.nope"), "tool.not_found", "'demo.nope' is not a tool"),
        (job("x", call_id="../evil"), "tool.input_invalid", "call_id"),
        (job("x", session_mode="god"), "tool.input_invalid", "session_mode"),
        ("not a job", "tool.input_invalid", "must be an object"),
        (job("bad-path"), "tool.input_invalid", "contains '..'"),
        (job("crash"), "tool.failed", "RuntimeError: handler exploded"),
        (job("exit"), "tool.failed", "SystemExit"),
        (job("not-a-dict"), "tool.failed", "returned a list, not a dict"),
        (job("not-json"), "tool.failed", "not JSON"),
        (job("sets-changes"), "tool.failed", "set 'changes'"),
    ],
)
def test_a_failing_job_is_a_structured_error(
    roots: Roots, the_job: Any, code: str, text: str
) -> None:
    log = io.StringIO()
    reply = execute_job(TOOLS, "demo", the_job, roots, log=log)
    assert reply["ok"] is False and reply["call_id"] == (
        the_job["call_id"] if isinstance(the_job, dict) else ""
    )
    error = reply["error"]
    assert error["code"] == code and text in error["message"]
    assert "Traceback" not in error["message"] and "Fix:" in error["message"]
    assert isinstance(error["retryable"], bool)
    if code == "tool.failed" and "Error" in text:
        assert "Traceback" in log.getvalue()  # the traceback goes to the host's stderr only


# -- layering -------------------------------------------------------------------------
ALLOWED = (
    "msgspec",
    "pathspec",  # the search tool's globs (in the code-executor image, where tools run)
    # what of fluffy the images carry (images/spec.py), but the sandbox's own side
    *(
        "fluffy." + part.removesuffix(".py")
        for part in SANDBOX_PARTS
        if part not in ("__init__.py", "_version.py", "py.typed", "sandboxes", "seccomp")
    ),
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports"
            names.add(node.module or "")
    return names


def test_plugins_and_their_host_import_only_what_l2_images_carry() -> None:
    files = [*sorted((ROOT / "plugins").rglob("*.py")), ROOT / "sandboxes" / "plugin_host.py"]
    assert len(files) > 10
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            ok = top in sys.stdlib_module_names or any(
                name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED
            )
            assert ok, f"{path.relative_to(ROOT)} imports {name}"
            assert not name.startswith("fluffy.kernel"), path
