"""SIGKILL merges at random moments: resume completes each operation exactly once.

A child process (``sys.executable -c CHILD``) merges one round of staged changes with an
``on_step`` hook that sleeps a little at every phase and prints it, so a kill lands
anywhere: while sources are copied, between a rename and its record, while the op log is
rewritten...  The parent kills it with SIGKILL at a random moment after staging is done,
then runs ``resume_pending()`` as the kernel does at start-up.  After every kill:

* every file holds exactly the round's intended content (deleted files are gone);
* exactly one more operation is completed (a kill before the op was persisted leaves
  the staging area intact, and the parent merges it, as a re-approval would);
* no completed step is recorded twice, every step ended applied or already applied;
* a second ``resume_pending()`` finds nothing; no temp file is left anywhere.

The same is done for git merges, checked with ``git status`` / ``git fsck``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import Staging
from tests.unit.kernel.merge.test_merge_git import assert_clean_and_valid, git, sandbox_commit

ROOT = Path(__file__).resolve().parents[4]
SEED = 20_261_123
ROUNDS = 30
GIT_ROUNDS = 20
FILES = 6

CHILD = f"""
import random, sys, time
from pathlib import Path
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import Staging

mode, project, state, extra, round_no = sys.argv[1:6]
project, state, round_no = Path(project), Path(state), int(round_no)
rng = random.Random(round_no)

def hook(op, phase):
    print(phase, flush=True)
    time.sleep(rng.uniform(0, 0.004))

merger = Merger(project, state, on_step=hook)
if mode == "files":
    staging = Staging(Path(extra), project)
    for i in range({FILES}):
        staging.stage(f"src/f{{i}}.txt", f"round {{round_no}} file {{i}}\\n".encode() * (i + 1))
    staging.stage(f"gen/r{{round_no}}/new.txt", f"created in round {{round_no}}\\n".encode())
    if round_no > 0:
        staging.stage(f"gen/r{{round_no - 1}}/new.txt", None)
    print("STAGED", flush=True)
    merger.merge(staging)
else:
    import json
    print("STAGED", flush=True)
    merger.merge_git(Path(extra), json.loads(sys.stdin.readline()))
print("DONE", flush=True)
"""


def intended(round_no: int) -> dict[str, bytes]:
    out = {f"src/f{i}.txt": f"round {round_no} file {i}\n".encode() * (i + 1) for i in range(FILES)}
    out[f"gen/r{round_no}/new.txt"] = f"created in round {round_no}\n".encode()
    out["keep.txt"] = b"never touched\n"
    return out


def project_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def run_and_kill(args: list[str], rng: random.Random, phases: int, stdin: str = "") -> list[str]:
    """Start the child, SIGKILL it at a random phase (plus a random delay); its phases.

    The kill point is chosen by phase count, not by wall-clock time, so every machine
    sees kills spread over the whole merge; the delay moves it inside the phase.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    lines = [child.stdout.readline().strip()]
    assert lines == ["STAGED"], child.stderr.read() if child.stderr else ""
    child.stdin.write(stdin + "\n")
    child.stdin.flush()
    target = rng.randrange(phases + 1)
    while len(lines) <= target:
        line = child.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    time.sleep(rng.uniform(0, 0.004))
    os.kill(child.pid, signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    assert child.returncode in (-signal.SIGKILL, 0), err
    return lines + out.split()


def operations(state: Path) -> list[dict[str, Any]]:
    folder = state / "merges"
    return [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.exists() else []


def check_log(state: Path, expected_completed: int) -> None:
    ops = operations(state)
    assert [op["status"] for op in ops].count("completed") == expected_completed
    assert all(op["status"] == "completed" for op in ops)
    for op in ops:
        steps = [step["id"] for step in op["steps"]]
        assert len(op["completed_steps"]) == len(set(op["completed_steps"])), op["id"]
        assert sorted(op["completed_steps"]) == sorted(steps), op["id"]
        outcomes = {r["outcome"] for r in op["results"].values()}
        assert outcomes <= {"applied", "already"}, (op["id"], op["results"])
    leftovers = [p for p in (state / "merges").iterdir() if not p.name.endswith(".json")]
    assert leftovers == []


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if "fluffy" in p.name and p.name.endswith(".tmp")]


@pytest.mark.timeout(600)
def test_sigkill_during_file_merges(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "keep.txt").write_text("never touched\n")
    state = tmp_path / "state"
    last_phases: list[str] = []
    for round_no in range(ROUNDS):
        staging_root = tmp_path / "staging"
        lines = run_and_kill(
            ["files", str(project), str(state), str(staging_root), str(round_no)], rng, 26
        )
        last_phases.append(lines[-1])
        merger = Merger(project, state)
        merger.resume_pending()
        staging = Staging(staging_root, project)
        if not staging.is_empty():  # killed before the operation was persisted
            assert len(operations(state)) in (round_no, round_no + 1)
            if len(operations(state)) == round_no:
                merger.merge(staging)
        assert staging.is_empty(), (round_no, lines)
        assert project_files(project) == intended(round_no), (round_no, lines)
        check_log(state, round_no + 1)
        assert Merger(project, state).resume_pending() == []
        assert temp_files(project) == [] and temp_files(state) == []
        assert temp_files(staging_root) == []
    # the kills landed in different places: before, inside and after the steps
    assert "STAGED" in last_phases or "prepared" in last_phases
    assert any(p.startswith("applied:") for p in last_phases)
    assert any(p.startswith(("before:", "recorded:")) for p in last_phases)


@pytest.mark.timeout(600)
def test_sigkill_during_git_merges(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "log.txt").write_text("start\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    state = tmp_path / "state"
    last_phases: list[str] = []
    for round_no in range(GIT_ROUNDS):
        with (repo / "log.txt").open("a") as handle:
            handle.write(f"round {round_no}\n")
        (repo / f"file{round_no}.txt").write_text(f"{round_no}\n")
        out = tmp_path / f"output/call-{round_no}"
        result = sandbox_commit(repo, out, message=f"round {round_no}")
        lines = run_and_kill(
            ["git", str(repo), str(state), str(out), str(round_no)],
            rng,
            10,
            stdin=json.dumps(result),
        )
        last_phases.append(lines[-1])
        merger = Merger(repo, state)
        merger.resume_pending()
        if git(repo, "rev-parse", "HEAD") != result["commit"]:  # killed before the op existed
            assert len(operations(state)) == round_no, (round_no, lines)
            merger.merge_git(out, result)
        assert_clean_and_valid(repo, result["commit"])
        assert int(git(repo, "rev-list", "--count", "HEAD")) == round_no + 2
        check_log(state, round_no + 1)
        assert Merger(repo, state).resume_pending() == []
    assert len(set(last_phases)) >= 3, last_phases
    assert any(p.startswith("applied:") for p in last_phases), last_phases
