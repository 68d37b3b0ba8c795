"""Sessions on a branch of their own: the person's checkout is never written while they work.

``fluffy "task" --branch`` (or ``branch: true`` in the configuration) runs the session in a
copy of the repository made for it, ``$FLUFFY_HOME/branches/<project id>/<id>``: a clone of
HEAD (its own ``.git``, no hard links to the person's objects, no hooks) on the branch
``fluffy/<id>``, with its own kernel.  The person keeps working in their checkout; two
sessions on one repository run at once, each in its copy.  The session's commits land
on its branch; then

* ``fluffy session merge ID`` fetches the branch into the person's repository and merges
  it into their current branch, only if git can do so without a conflict and without
  touching their uncommitted work or a file git does not track, ignored ones included
  (otherwise it is refused, and nothing is written);
* ``fluffy session discard ID`` stops its kernel and removes the copy and the branch.

Git runs on the host here, as the person, with hooks off and the repository's
command-running settings ignored (``core.fsmonitor``, ``core.hooksPath``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fluffy.errors import BranchError, FluffyError

SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


@dataclass(frozen=True)
class Branch:
    id: str
    project: str  # the person's checkout
    path: str  # the session's copy
    branch: str  # fluffy/<id>
    base: str  # the commit it started from
    created_at: float
    task: str = ""


def _git(cwd: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["git", *SAFE, "-c", f"safe.directory={cwd}", "-C", str(cwd), *args],
        capture_output=True, text=True, errors="surrogateescape", timeout=600, check=False,
        cwd="/",
    )  # fmt: skip
    if check and done.returncode != 0:
        raise BranchError(
            f"git {args[0]} failed in {cwd}",
            why=(done.stderr or done.stdout).strip()[-1500:],
            fix="Read git's message above; the person's repository was not changed.",
        )
    return done


def _registry(project: Path) -> Path:
    from fluffy.bootstrap.supervisor import project_id
    from fluffy.paths import fluffy_home

    return fluffy_home() / "branches" / f"{project_id(str(project))}.json"


def branches(project: Path) -> dict[str, Branch]:
    try:
        data = json.loads(_registry(project).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    found: dict[str, Branch] = {}
    for key, value in data.items():
        try:
            found[str(key)] = Branch(**value)
        except TypeError:
            continue
    return found


@contextlib.contextmanager
def _changing(project: Path) -> Iterator[dict[str, Branch]]:
    """The project's branch sessions, to change and save: one process at a time (two
    `fluffy --branch` started together would each save its own list, and one branch
    would be lost), written whole through a temporary file of this process's own."""
    path = _registry(project)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = branches(project)
        yield found
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps({k: asdict(v) for k, v in found.items()}, indent=1))
            tmp.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def start(project: Path, task: str = "") -> Branch:
    """A copy of ``project``'s HEAD on ``fluffy/<id>`` for one session."""
    from fluffy.bootstrap.supervisor import project_id
    from fluffy.cli.connect import git_identity
    from fluffy.paths import fluffy_home

    if not (project / ".git").exists():
        raise BranchError(
            f"{project} is not a git repository",
            why="a session on its own branch needs the repository's history",
            fix="Run it in a git repository, or without --branch.",
        )
    head = _git(project, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False)
    if head.returncode != 0:
        raise BranchError(
            f"{project} has no commit yet",
            why="a session's branch starts from the current commit",
            fix="Make a first commit, or run without --branch.",
        )
    ident = uuid.uuid4().hex[:12]
    path = fluffy_home() / "branches" / project_id(str(project)) / ident
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _git("/", "clone", "--quiet", "--no-hardlinks", "--no-checkout", str(project), str(path))
    name = f"fluffy/{ident}"
    _git(path, "checkout", "--quiet", "-b", name, head.stdout.strip())
    person = git_identity(project)  # the session's commits name the person
    if person is not None:
        _git(path, "config", "user.name", person["name"])
        _git(path, "config", "user.email", person["email"])
    made = Branch(
        ident, str(project), str(path), name, head.stdout.strip(), time.time(), task[:200]
    )
    with _changing(project) as found:
        found[ident] = made
    return made


def _find(project: Path, ident: str) -> Branch:
    found = branches(project).get(ident)
    if found is None:
        raise BranchError(
            f"there is no branch session {ident} for {project}",
            why="`fluffy session branches` lists them",
            fix="Use one of the ids it lists.",
        )
    return found


def merge(project: Path, ident: str) -> dict[str, Any]:
    """Bring the session's branch into the person's current branch (no conflict, their
    uncommitted work untouched: otherwise git refuses and nothing changes)."""
    made = _find(project, ident)
    _git(project, "fetch", "--quiet", made.path, f"+{made.branch}:refs/heads/{made.branch}")
    ahead = _git(project, "rev-list", "--count", f"HEAD..{made.branch}").stdout.strip()
    if ahead == "0":
        raise BranchError(
            f"{made.branch} has nothing your branch lacks",
            why="the session made no commit (or it is merged already)",
            fix=f"`fluffy session discard {ident}` removes it.",
        )
    tried = _git(project, "merge-tree", "--write-tree", "HEAD", made.branch, check=False)
    if tried.returncode != 0:
        raise BranchError(
            f"{made.branch} conflicts with your branch",
            why=tried.stdout.strip()[-1500:],
            fix=f"Merge it yourself (`git merge {made.branch}`) and resolve the conflict, "
            f"or `fluffy session discard {ident}`.",
        )
    _refuse_untracked(project, ident, tried.stdout.split("\n", 1)[0].strip())
    _git(project, "merge", "--no-edit", made.branch)
    done = _git(project, "rev-parse", "HEAD").stdout.strip()
    discard(project, ident)
    return {"id": ident, "branch": made.branch, "head": done, "commits": int(ahead)}


def _refuse_untracked(project: Path, ident: str, tree: str) -> None:
    """Refuse the merge when it would write over a file git does not track.

    git refuses to overwrite an untracked file, but an *ignored* one (``.env``, a local
    settings file) it takes as its own to replace: a session that committed a file of
    that name would overwrite the person's with no word.  So every path the merge adds or
    changes is looked up first; one that is in the folder but not in the index stops it.
    """
    changed = _git(project, "diff", "--name-only", "-z", "--no-renames", "HEAD", tree).stdout
    tracked = set(_git(project, "ls-files", "-z").stdout.split("\0"))
    kept = [
        shown
        for path in changed.split("\0")
        if path
        for shown in [_untracked_in_the_way(project, path, tracked)]
        if shown is not None
    ]
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        raise BranchError(
            f"merging the session would overwrite your own files that git does not track: {shown}",
            why="the session committed files of those names; git would replace ignored files "
            "without asking, and they are yours (nothing was changed)",
            fix=f"Move those files away first, or look at the branch (`git diff HEAD "
            f"fluffy/{ident}`) and take what you want by hand; `fluffy session discard "
            f"{ident}` removes it.",
        )


def _untracked_in_the_way(project: Path, path: str, tracked: set[str]) -> str | None:
    """What of the person's the merge would replace to write ``path``: the file itself, or
    a file (or a link) where one of its folders must go (``.env`` for ``.env/x``)."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        here = "/".join(parts[:depth])
        where = project / here
        if not os.path.lexists(where):
            return None
        if depth < len(parts) and where.is_dir() and not where.is_symlink():
            continue  # a real folder on the way
        return None if here in tracked else here
    return None


def discard(project: Path, ident: str) -> dict[str, Any]:
    """Stop the session's kernel, remove its copy and its branch."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli.lifecycle import stop_kernel
    from fluffy.paths import fluffy_home

    made = _find(project, ident)
    with contextlib.suppress(FluffyError):
        stop_kernel(made.path)
    shutil.rmtree(made.path, ignore_errors=True)
    home = paths(fluffy_home(), made.path)
    shutil.rmtree(home["base"], ignore_errors=True)
    _git(project, "branch", "-D", made.branch, check=False)
    with _changing(project) as found:
        found.pop(ident, None)
    return {"id": ident, "branch": made.branch, "discarded": True}


def share_environment(project: Path, copy: Path) -> None:
    """The copy's kernel uses the environment built for the person's project (same image,
    same record) when the copy's dependency files are the same."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    source = paths(fluffy_home(), str(project))["state"] / "envs"
    target = paths(fluffy_home(), str(copy))["state"] / "envs"
    if source.is_dir() and not target.exists():
        shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("built"))
