"""The person's secret files stay out of test views unless the person lets them in."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fluffy.kernel.project.testsecrets import (
    ALLOWED_FILE,
    SecretFiles,
    allowed_secrets,
    kept_out,
    set_allowed,
)
from fluffy.kernel.tools.testing.testview import TestViews
from fluffy.kernel.workflow.evidence import snapshot_trees
from unit.gitrepo import git
from unit.trees import write_tree

pytestmark = pytest.mark.unit

FILES = {
    "src/app.py": "x = 1\n",
    "tests/test_app.py": "def test_x(): pass\n",
    "tests/certs/server.pem": "CERT\n",  # the repository's (tracked): anyone has it
    ".env.test": "MODE=test\n",  # likewise
    ".env.example": "TOKEN=\n",  # an example is no secret
}


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = write_tree(tmp_path / "p", FILES)
    git(root.parent, "init", "-q", str(root))
    git(root, "add", "-A")
    write_tree(root, {".env": "TOKEN=hunter2\n", "keys/deploy.key": "KEY\n", "notes.txt": "n\n"})
    return root


def test_untracked_secrets_are_hidden_and_the_repositorys_are_not(
    project: Path, tmp_path: Path
) -> None:
    hide = SecretFiles(project, tmp_path / "state").hidden()
    assert hide(".env") and hide("keys/deploy.key")
    assert not any(hide(rel) for rel in [*FILES, "notes.txt"])


def test_the_person_lets_tests_read_one_and_takes_it_back(project: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    set_allowed(state, [".env"])
    assert allowed_secrets(state) == {".env"}
    assert oct((state / ALLOWED_FILE).stat().st_mode & 0o777) == "0o644"
    secrets = SecretFiles(project, state)
    assert not secrets.hidden()(".env") and secrets.hidden()("keys/deploy.key")
    set_allowed(state, [])
    assert secrets.hidden()(".env")  # read anew for each sync
    assert kept_out(project, state) == ([".env", "keys/deploy.key"], [])


def test_a_file_committed_meanwhile_is_the_repositorys(project: Path, tmp_path: Path) -> None:
    secrets = SecretFiles(project, tmp_path / "state")
    assert secrets.hidden()(".env")
    git(project, "add", "-f", ".env")  # the index changed: read again
    assert not secrets.hidden()(".env")


@pytest.mark.parametrize("record", ["not json", '{"allow": ".env"}', '[".env"]', '{"allow": [1]}'])
def test_a_garbled_record_allows_nothing(tmp_path: Path, record: str) -> None:
    (tmp_path / ALLOWED_FILE).write_text(record)
    assert allowed_secrets(tmp_path) == frozenset()


def test_without_a_readable_index_every_secret_looking_file_is_hidden(tmp_path: Path) -> None:
    project = write_tree(tmp_path / "p", FILES)
    (project / ".git").write_text("gitdir: /elsewhere\n")  # a worktree: index unknown
    hide = SecretFiles(project, tmp_path / "state").hidden()
    assert hide("tests/certs/server.pem") and hide(".env.test") and not hide("src/app.py")
    os.unlink(project / ".git")  # no repository at all: nothing is tracked
    assert SecretFiles(project, tmp_path / "state").hidden()(".env.test")


def test_the_view_leaves_them_out_but_its_hashes_are_the_projects(
    project: Path, tmp_path: Path
) -> None:
    """The evidence of a run is compared with the project's own hashes (a staleness
    check): a hidden file still counts in them, it is only not laid in."""
    state = tmp_path / "state"
    views = TestViews(state, project, os.geteuid())
    synced = views.sync("s", {}, None)
    assert not (synced.folder / ".env").exists() and not (synced.folder / "keys").exists()
    assert (synced.folder / "tests/certs/server.pem").read_text() == "CERT\n"
    assert synced.hidden == (".env", "keys/deploy.key")
    tests, sources = snapshot_trees(project)
    assert (synced.tests.digest, synced.sources.digest) == (tests.digest, sources.digest)
    (project / ".env").write_text("TOKEN=changed\n")  # changed while hidden: still counted
    again = views.sync("s", {}, None)
    assert again.sources.digest == snapshot_trees(project)[1].digest != sources.digest
    set_allowed(state, [".env"])  # allowed: laid in; then taken back: removed again
    assert (views.sync("s", {}, None).folder / ".env").read_text() == "TOKEN=changed\n"
    set_allowed(state, [])
    assert not (views.sync("s", {}, None).folder / ".env").exists()


def test_what_the_session_wrote_itself_is_not_hidden(project: Path, tmp_path: Path) -> None:
    staged = write_tree(tmp_path / "staged", {".env": "TOKEN=fake\n"})
    overlay = {".env": hashlib.sha256(b"TOKEN=fake\n").hexdigest()}
    views = TestViews(tmp_path / "state", project, os.geteuid())
    synced = views.sync("s", overlay, staged)
    assert (synced.folder / ".env").read_text() == "TOKEN=fake\n"
    assert synced.hidden == ("keys/deploy.key",)


def test_a_committed_placeholder_the_person_filled_in_is_theirs(
    project: Path, tmp_path: Path
) -> None:
    """A repository can commit `.env` and ask the person to put their key in it."""
    secrets = SecretFiles(project, tmp_path / "state")
    assert not secrets.hidden()(".env.test")
    (project / ".env.test").write_text("MODE=test\nTOKEN=the-persons\n")
    assert secrets.hidden()(".env.test")
    (project / ".env.test").write_text(FILES[".env.test"])
    git(project, "update-index", "--skip-worktree", ".env.test")  # kept local on purpose
    assert SecretFiles(project, tmp_path / "state").hidden()(".env.test")


@pytest.mark.parametrize(
    ("name", "secret"),
    [(".ENV", True), ("app/.Env.Local", True), ("certs/Server.PEM", True), ("id_RSA", True),
     ("x/SECRETS/y", True), (".ENV.EXAMPLE", False), ("README.md", False),
     (".env\udcff", False), ("k\udcff.pem", True)],
)  # fmt: skip
def test_a_secrets_name_is_known_in_any_case_and_in_any_bytes(name: str, secret: bool) -> None:
    from fluffy.kernel.globs import is_secret_file

    assert is_secret_file(name) is secret


def test_the_persons_own_command_sees_their_files_as_on_the_host(
    project: Path, tmp_path: Path
) -> None:
    """`fluffy sandbox run` is the person's command, not the model's: its copy of the
    project (made when the sandbox cannot read the folder) hides nothing."""
    views = TestViews(tmp_path / "state", project, os.geteuid(), persons=True)
    synced = views.sync("run", {}, None)
    assert (synced.folder / ".env").read_text() == "TOKEN=hunter2\n" and synced.hidden == ()
