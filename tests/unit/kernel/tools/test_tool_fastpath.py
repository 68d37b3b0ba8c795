"""The kernel-native read tools over real files: confinement, caps, binary, the staged view."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.kernel.merge.staging import Staging
from fluffy.kernel.tools.reading.fastpath import FastPath
from unit.trees import write_tree


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "secret.txt").write_text("host secret\n")  # beside the project, outside it
    return write_tree(
        tmp_path / "project",
        {
            "src/pkg/mod.py": "def f():\n    return 1\n# TODO\n",
            "tests/test_mod.py": "from pkg.mod import f\n",
            ".git/config": "TODO in git\n",
        },
    )


def test_read_whole_file_and_line_range(project: Path) -> None:
    fast = FastPath(project)
    whole = fast.run("fs.read", {"path": "/src/pkg/mod.py"}, None)
    assert whole["content"] == "def f():\n    return 1\n# TODO\n"
    assert (whole["path"], whole["total_lines"], whole["staged"]) == ("src/pkg/mod.py", 3, False)
    part = fast.run("fs.read", {"path": "src/pkg/mod.py", "start_line": 2, "max_lines": 1}, None)
    assert part["content"] == "    return 1\n"
    assert (part["start_line"], part["end_line"]) == (2, 2)


@pytest.mark.parametrize("path", ["../secret.txt", "src/../../secret.txt", "/../secret.txt"])
def test_paths_outside_the_project_are_refused(project: Path, path: str) -> None:
    with pytest.raises(ToolInputInvalid, match="not inside the project"):
        FastPath(project).run("fs.read", {"path": path}, None)


def test_symlink_leading_out_is_refused_and_inside_is_resolved(project: Path) -> None:
    (project / "escape").symlink_to(project.parent / "secret.txt")
    (project / "alias.py").symlink_to(project / "src" / "pkg" / "mod.py")
    fast = FastPath(project)
    with pytest.raises(ToolInputInvalid, match="not inside the project"):
        fast.run("fs.read", {"path": "escape"}, None)
    assert fast.run("fs.read", {"path": "alias.py"}, None)["path"] == "src/pkg/mod.py"


def test_binary_files_are_described_not_returned(project: Path) -> None:
    (project / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    out = FastPath(project).run("fs.read", {"path": "blob.bin"}, None)
    assert out["binary"] is True and out["size"] == 30 and "content" not in out


def test_large_files_need_a_line_range(project: Path) -> None:
    (project / "big.txt").write_text("line\n" * 1000)
    fast = FastPath(project, read_max_bytes=1000)
    with pytest.raises(ToolFailed, match=r"more than fs\.read returns") as refused:
        fast.run("fs.read", {"path": "big.txt"}, None)
    assert "line range" in refused.value.fix
    assert fast.run("fs.read", {"path": "big.txt", "max_lines": 10}, None)["end_line"] == 10


def test_fifo_and_directories_are_not_read(project: Path) -> None:
    os.mkfifo(project / "pipe")
    fast = FastPath(project)
    with pytest.raises(ToolFailed, match="not a regular file"):
        fast.run("fs.read", {"path": "pipe"}, None)
    with pytest.raises(ToolFailed, match="directory"):
        fast.run("fs.read", {"path": "src"}, None)


def test_unknown_arguments_are_refused(project: Path) -> None:
    with pytest.raises(ToolInputInvalid, match="argument"):
        FastPath(project).run("fs.read", {"path": "x", "mode": "w"}, None)


def test_the_view_overlays_staged_changes(project: Path, tmp_path: Path) -> None:
    staging = Staging(tmp_path / "staging", project)
    staging.stage("tests/test_new.py", b"def test_x():\n    assert False  # TODO\n")
    staging.stage("src/pkg/mod.py", None)
    stage = staging
    fast = FastPath(project)
    new = fast.run("fs.read", {"path": "tests/test_new.py"}, stage)
    assert new["staged"] and "assert False" in new["content"]
    with pytest.raises(ToolFailed, match="does not exist"):
        fast.run("fs.read", {"path": "src/pkg/mod.py"}, stage)
    assert fast.run("fs.exists", {"path": "src/pkg/mod.py"}, stage)["exists"] is False
    assert fast.run("fs.exists", {"path": "tests/test_new.py"}, stage)["exists"] is True
    names = [e["name"] for e in fast.run("fs.list", {"path": "tests"}, stage)["entries"]]
    assert names == ["test_mod.py", "test_new.py"]
    grep = fast.run("search.grep", {"pattern": "TODO"}, stage)["matches"]
    assert [m["path"] for m in grep] == ["tests/test_new.py"]  # .git skipped, mod.py deleted
    for path in ("tests/test_new.py", "tests"):  # a staged file by its own path, or its folder
        grep = fast.run("search.grep", {"pattern": "TODO", "path": path}, stage)["matches"]
        assert [m["path"] for m in grep] == ["tests/test_new.py"], path
    deleted = fast.run("search.grep", {"pattern": ".", "path": "src/pkg/mod.py"}, stage)
    assert deleted["matches"] == []  # deleted in the view: nothing to search
    globbed = fast.run("search.glob", {"pattern": "tests/*.py"}, stage)["paths"]
    assert globbed == ["tests/test_mod.py", "tests/test_new.py"]
    # the project itself is untouched by staging
    assert (project / "src" / "pkg" / "mod.py").exists()
    assert not (project / "tests" / "test_new.py").exists()


def test_grep_limits_and_bad_patterns(project: Path) -> None:
    (project / "many.txt").write_text("hit\n" * 50)
    fast = FastPath(project)
    out = fast.run("search.grep", {"pattern": "hit", "max_results": 5}, None)
    assert len(out["matches"]) == 5 and out["truncated"]
    with pytest.raises(ToolInputInvalid, match="regular expression"):
        fast.run("search.grep", {"pattern": "("}, None)
    only = fast.run("search.grep", {"pattern": "def", "glob": "src/**"}, None)["matches"]
    assert [(m["path"], m["line"]) for m in only] == [("src/pkg/mod.py", 1)]


def test_grep_runs_in_linear_time_whatever_the_pattern(project: Path) -> None:
    """The red team's ``([\\w ]+)+!`` over a long line stalled L1 under Python's re
    (exponential backtracking); RE2 answers at once.  A backreference, which needs
    backtracking, is refused with RE2's reason instead of being run."""
    import time

    (project / "long.txt").write_text("a" * 40 + "\n" + "word " * 20_000 + "\n")
    fast = FastPath(project)
    started = time.process_time()
    out = fast.run("search.grep", {"pattern": r"([\w ]+)+!"}, None)
    assert out["matches"] == []
    # python's re takes over an hour on the first line alone; RE2 a few milliseconds
    assert time.process_time() - started < 5
    assert fast.run("search.grep", {"pattern": "(?i)WORD"}, None)["matches"]
    with pytest.raises(ToolInputInvalid, match="RE2") as caught:
        fast.run("search.grep", {"pattern": r"(a)\1"}, None)
    assert "backreferences" in (caught.value.fix or "")


def test_the_persons_secret_files_are_neither_read_nor_searched(
    project: Path, tmp_path: Path
) -> None:
    """A prompt-injected model reading `.env` got its values (issue 31's red team)."""
    (project / ".env").write_text("DB_PASSWORD=hunter2-very-secret\n")
    (project / ".env.example").write_text("DB_PASSWORD=change-me\n")
    (project / "deploy").mkdir()
    (project / "deploy" / "server.key").write_text("PASSWORD=hunter2-very-secret\n")
    fast = FastPath(project)
    for path in (".env", "deploy/server.key"):
        with pytest.raises(ToolFailed, match="holds secrets"):
            fast.run("fs.read", {"path": path}, None)
    assert "change-me" in fast.run("fs.read", {"path": ".env.example"}, None)["content"]
    found = fast.run("search.grep", {"pattern": "PASSWORD"}, None)["matches"]
    assert [m["path"] for m in found] == [".env.example"]
    stage = Staging(tmp_path / "stage", project)
    stage.stage(".env", b"MINE=1\n")  # the session's own version: it wrote it
    assert fast.run("fs.read", {"path": ".env"}, stage)["content"] == "MINE=1\n"


@pytest.mark.parametrize(
    ("secret", "public"),
    [
        ("prod.env", "prod.env.example"),
        ("config/staging.env", "config/staging.env.sample"),
        (".aws/credentials", "docs/credentials.md"),
        ("credentials.json", "credentials.json.template"),
        (".streamlit/secrets.toml", ".streamlit/config.toml"),
        ("infra/prod.tfvars", "infra/prod.tfvars.example"),
        ("infra/terraform.tfstate", "infra/main.tf"),
        ("ops/.kube/config", "ops/kube.yaml"),
        (".pgpass", "pg.conf"),
        ("web/.htpasswd", "web/.htaccess"),
    ],
)
def test_more_kinds_of_secret_files_are_held_back(secret: str, public: str) -> None:
    """Red team pass 2 named these: each a common home of a person's credentials."""
    from fluffy.kernel.globs import is_secret_file

    assert is_secret_file(secret) and not is_secret_file(public)


def test_the_kernel_tools_schemas_are_their_models_made_when_first_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry is built while the kernel starts; a kernel tool's JSON schema is
    made from its model only when something reads it (a model told its tools), and is
    then exactly pydantic's."""
    from fluffy.kernel.tools.reading import fastpath

    made: list[str] = []
    schema_of = fastpath._Args.model_json_schema.__func__  # type: ignore[attr-defined]

    def counting(cls: type[fastpath._Args], *args: Any, **kwargs: Any) -> dict[str, Any]:
        made.append(cls.__name__)
        return schema_of(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(fastpath._Args, "model_json_schema", classmethod(counting))
    tools = fastpath.kernel_tools()
    assert made == [] and set(tools) == set(fastpath.ARGS)
    _, schema = tools["fs.read"]
    assert dict(schema) == schema_of(fastpath.ARGS["fs.read"])
    assert schema["type"] == "object" and "path" in schema["properties"]
    assert made == ["ReadArgs"]  # once: kept after the first read
