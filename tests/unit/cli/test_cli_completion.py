"""`fluffy completion SHELL`: scripts made from the real parser, valid, and completing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fluffy.cli.completion import command_tree, script
from fluffy.cli.main import main
from fluffy.cli.task import MODES, PROVIDERS

pytestmark = pytest.mark.unit


def _write(tmp_path: Path, shell: str) -> Path:
    path = tmp_path / f"fluffy.{shell}"
    path.write_text(script(shell))
    return path


def _needs(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed")
    return found


def test_the_tree_is_the_parsers() -> None:
    nodes = command_tree()
    top = nodes["fluffy"]
    assert {"plugin", "images", "doctor", "completion", "session"} <= set(top.words)
    assert top.choices["--provider"] == list(PROVIDERS)  # the task options, at the top
    assert top.choices["--mode"] == list(MODES)
    assert "--yes" in top.flags and "--version" in top.flags
    assert set(nodes["fluffy images"].words) == {"build", "list", "prune"}
    assert "--rebuild" in nodes["fluffy images build"].flags
    assert set(nodes["fluffy completion"].words) == {"bash", "zsh", "fish"}


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == script("bash")


def _bash_complete(path: Path, *words: str) -> list[str]:
    """What bash's own completion machinery offers for ``words`` (the last one typed)."""
    array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {path}\n"
        "spec=$(complete -p fluffy) || exit 9\n"
        "function=${spec#*-F }; function=${function%% *}\n"
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}\n"
        '"$function"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_bash_script_is_valid_and_completes(tmp_path: Path) -> None:
    path = _write(tmp_path, "bash")
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert _bash_complete(path, "fluffy", "pl") == ["plugin"]
    assert _bash_complete(path, "fluffy", "--provider", "l") == ["lmstudio"]
    assert _bash_complete(path, "fluffy", "images", "build", "--r") == ["--rebuild"]
    assert _bash_complete(path, "fluffy", "completion", "z") == ["zsh"]
    assert "--mode" in _bash_complete(path, "fluffy", "--")


def test_zsh_script_is_valid_and_offers_the_words(tmp_path: Path) -> None:
    zsh = _needs("zsh")
    path = _write(tmp_path, "zsh")
    subprocess.run([zsh, "-n", str(path)], check=True)
    # the completion system's functions stood in for: what the script hands them
    program = (
        f"source {path}\n"
        '_describe() { print -l -- "${(@P)2}" }\n'
        'compadd() { shift; print -l -- "$@" }\n'
        "words=(fluffy pl); CURRENT=2; _fluffy\n"
        "print -- ---\n"
        'words=(fluffy --provider ""); CURRENT=3; _fluffy\n'
    )
    done = subprocess.run([zsh, "-f", "-c", program], capture_output=True, text=True, check=True)
    commands, providers = done.stdout.split("---\n")
    assert any(line.startswith("plugin:") for line in commands.splitlines())
    assert providers.split() == list(PROVIDERS)


def test_fish_script_is_valid_and_completes(tmp_path: Path) -> None:
    fish = _needs("fish")
    path = _write(tmp_path, "fish")
    subprocess.run([fish, "--no-execute", str(path)], check=True)

    def complete(line: str) -> list[str]:
        program = f"source {path}; complete -C '{line}'"
        done = subprocess.run(
            [fish, "--no-config", "-c", program], capture_output=True, text=True, check=True
        )
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert complete("fluffy pl") == ["plugin"]
    assert sorted(complete("fluffy --provider ")) == sorted(PROVIDERS)
    assert complete("fluffy images build --r") == ["--rebuild"]
