"""`fluffy config init|set|get|show` through the CLI's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fluffy.cli.main import EXIT_ERROR, EXIT_OK, main
from fluffy.settings import ENV_VARS, KEY_VARS, load_settings

pytestmark = pytest.mark.unit


@pytest.fixture()
def project(tmp_path: Path, fluffy_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in [*ENV_VARS, *{v for names in KEY_VARS.values() for v in names}]:
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


def test_init_writes_a_commented_user_config_that_loads_as_defaults(
    project: Path, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "init"]) == EXIT_OK
    path = fluffy_home / "config.yaml"
    text = path.read_text()
    assert "OPENAI_API_KEY" in text and "# provider: scripted" in text
    assert yaml.safe_load(text) is None  # every line a comment: defaults apply
    assert str(path) in capsys.readouterr().out
    assert load_settings(project, {}).provider == "scripted"


def test_init_refuses_to_overwrite_without_force(
    project: Path, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "init", "--project"]) == EXIT_OK
    path = project / ".fluffy" / "config.yaml"
    path.write_text("model: mine\n")
    assert main(["config", "init", "--project"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err
    assert path.read_text() == "model: mine\n"
    assert main(["config", "init", "--project", "--force"]) == EXIT_OK
    assert "model: mine" not in path.read_text()
    assert not (fluffy_home / "config.yaml").exists()  # --project writes the project's only


def test_set_validates_keeps_other_keys_and_writes_atomically(
    project: Path, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = fluffy_home / "config.yaml"
    assert main(["config", "set", "provider", "openai"]) == EXIT_OK
    assert main(["config", "set", "context_window", "200000"]) == EXIT_OK
    assert yaml.safe_load(user.read_text()) == {"provider": "openai", "context_window": 200000}
    assert main(["config", "set", "provider", "anthropic"]) == EXIT_OK
    assert yaml.safe_load(user.read_text()) == {"provider": "anthropic", "context_window": 200000}
    assert sorted(p.name for p in fluffy_home.iterdir()) == ["config.yaml"]  # no temp left
    capsys.readouterr()

    assert main(["config", "set", "mode", "yolo"]) == EXIT_ERROR
    assert main(["config", "set", "context_window", "12"]) == EXIT_ERROR
    assert main(["config", "set", "colour", "red"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "mode" in err and "context_window" in err and "unknown setting 'colour'" in err
    assert yaml.safe_load(user.read_text()) == {"provider": "anthropic", "context_window": 200000}

    assert main(["config", "set", "model", "local-model", "--project"]) == EXIT_OK
    assert yaml.safe_load((project / ".fluffy" / "config.yaml").read_text()) == {
        "model": "local-model"
    }


def test_set_refuses_api_keys_with_the_environment_fix(
    project: Path, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "set", "api_key", "sk-" + "s" * 40]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "OPENAI_API_KEY" in err and "sk-sss" not in err
    assert not (fluffy_home / "config.yaml").exists()


def test_get_prints_the_effective_value(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "set", "theme", "dark", "--project"]) == EXIT_OK
    capsys.readouterr()
    assert main(["config", "get", "theme"]) == EXIT_OK
    assert capsys.readouterr().out == "dark\n"
    monkeypatch.setenv("FLUFFY_THEME", "light")
    assert main(["config", "get", "theme", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {
        "key": "theme",
        "value": "light",
        "source": "env FLUFFY_THEME",
    }
    assert main(["config", "get", "nope"]) == EXIT_ERROR


def test_show_lists_every_value_with_its_source_never_the_key(
    project: Path,
    fluffy_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "set", "provider", "openai"]) == EXIT_OK
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + "k" * 40)
    monkeypatch.setenv("FLUFFY_MODEL", "gpt-4o")
    capsys.readouterr()
    assert main(["config", "show", "--json"]) == EXIT_OK
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["settings"]["provider"] == "openai" and shown["settings"]["model"] == "gpt-4o"
    assert shown["sources"]["provider"] == str(fluffy_home / "config.yaml")
    assert shown["sources"]["model"] == "env FLUFFY_MODEL"
    assert shown["sources"]["theme"] == "default"
    assert shown["api_key_env"] == "OPENAI_API_KEY" and "sk-kkk" not in out

    assert main(["config", "show"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "model" in text and "env FLUFFY_MODEL" in text and "set (OPENAI_API_KEY)" in text
    assert "sk-kkk" not in text


def test_show_reports_a_broken_file_as_an_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project / ".fluffy" / "config.yaml"
    path.parent.mkdir()
    path.write_text("api_key: sk-abc\n")
    assert main(["config", "show", "--json"]) == EXIT_ERROR
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "config.invalid" and str(path) in error["what"]


@pytest.mark.parametrize(
    ("user", "repo", "cli", "expected"),
    [
        (True, False, None, True),  # a cloned repository cannot turn it off
        (True, True, None, True),
        (False, True, None, True),  # ... it may turn it on
        (None, False, None, False),
        (True, False, False, False),  # the person's own option may
    ],
)
def test_a_repository_cannot_turn_off_the_persons_branch_setting(
    project: Path,
    fluffy_home: Path,
    user: bool | None,
    repo: bool,
    cli: bool | None,
    expected: bool,
) -> None:
    if user is not None:
        fluffy_home.mkdir(parents=True, exist_ok=True)
        (fluffy_home / "config.yaml").write_text(f"branch: {str(user).lower()}\n")
    (project / ".fluffy").mkdir()
    (project / ".fluffy" / "config.yaml").write_text(f"branch: {str(repo).lower()}\n")
    assert load_settings(project, {"branch": cli}).branch is expected


@pytest.mark.parametrize(
    "command", [["init", "--project"], ["set", "mode", "explore", "--project"]]
)
@pytest.mark.parametrize("planted", [".fluffy", ".fluffy/config.yaml"])
def test_project_settings_are_never_written_through_a_planted_link(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
    planted: str,
) -> None:  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.yaml").write_text("# the person's own\n")
    if planted == ".fluffy":
        (project / ".fluffy").symlink_to(elsewhere)
    else:
        (project / ".fluffy").mkdir()
        (project / ".fluffy" / "config.yaml").symlink_to(elsewhere / "config.yaml")
    force = ["--force"] if command[0] == "init" else []
    assert main(["config", *command, *force]) == EXIT_ERROR
    assert "is a link" in capsys.readouterr().err
    assert (elsewhere / "config.yaml").read_text() == "# the person's own\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["config.yaml"]
