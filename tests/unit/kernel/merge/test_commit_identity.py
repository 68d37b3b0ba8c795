"""The AI's commits name the person, with a trailer naming fluffy and the model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fluffy.cli.connect import git_identity
from fluffy.kernel.merge.identity import clean, repo_identity, with_trailer


def test_the_repositorys_own_user_is_read_as_data(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert repo_identity(tmp_path) is None
    with (tmp_path / ".git" / "config").open("a") as handle:
        handle.write('[user]\n\tname = "Ann Person"  # me\n\temail = ann@example.org\n'
                     '[alias]\n\tname = x\n')  # fmt: skip
    assert repo_identity(tmp_path) == {"name": "Ann Person", "email": "ann@example.org"}
    subprocess.run(["git", "-C", str(tmp_path), "config", "user.email", "other@example.org"],
                   check=True)  # fmt: skip
    assert git_identity(tmp_path) == {"name": "Ann Person", "email": "other@example.org"}


@pytest.mark.parametrize(("name", "email"), [("a <b>", "x@y"), ("a", "x\n@y"), ("", "x@y")])
def test_an_identity_that_would_forge_a_header_is_refused(name: str, email: str) -> None:
    assert clean(name, email) is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Add triple", "Add triple\n\nAssisted-by: fluffy (m)\n"),
        ("Add x\n\nBody.\n", "Add x\n\nBody.\n\nAssisted-by: fluffy (m)\n"),
        ("Add x\n\nSigned-off-by: A <a@b>",
         "Add x\n\nSigned-off-by: A <a@b>\nAssisted-by: fluffy (m)\n"),
        ("Add x\n\nAssisted-by: fluffy (m)", "Add x\n\nAssisted-by: fluffy (m)\n"),
    ],
)  # fmt: skip
def test_the_trailer_is_added_once_as_git_would(message: str, expected: str) -> None:
    assert with_trailer(message, "Assisted-by: fluffy (m)") == expected
    assert with_trailer(message, "") == message.rstrip() + "\n"
