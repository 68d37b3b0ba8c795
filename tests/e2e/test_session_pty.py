"""The interactive `fluffy` driven through a pseudo-terminal, on a real kernel (L1) and
real sandboxes: /status, a typed task whose merge needs the user's review, /approve,
/explore (allowed by this project's policy), /quit."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluffy.demo_session import git
from tests.e2e.project_kernel import reviewed_script, user_project

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
FLUFFY = str(Path(sys.executable).parent / "fluffy")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
POLICY_EXTRA = """
  - name: explore-allowed
    match: {syscall: session.set_mode, session_mode: [explore]}
    action: allow
"""


class Terminal:
    """A child process on a pseudo-terminal; ``expect`` waits for text on its screen."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout_s: float = 240) -> str:
        deadline = time.monotonic() + timeout_s
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared; the screen so far:\n{self.seen[-3000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # the child closed its terminal
                    data = b""
                if not data:
                    assert text in self.seen, f"EOF before {text!r}:\n{self.seen[-3000:]}"
                    break
                self.seen += ANSI.sub("", data.decode(errors="replace"))
        return self.seen

    def send(self, line: str) -> None:
        self.seen = ""  # each expectation looks at what came after the line was sent
        os.write(self.master, line.encode() + b"\r")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=120)
        finally:
            os.close(self.master)


def test_typing_a_task_reviewing_and_switching_modes_in_a_terminal(
    engine: object, images: dict[str, str], tmp_path: Path
) -> None:
    def explore_allowed(project: Path) -> None:
        policy = project / ".fluffy" / "policy.yaml"
        policy.write_text(policy.read_text() + POLICY_EXTRA)

    project, env = user_project(tmp_path, images["kernel"], prepare=explore_allowed)
    env = {
        **env,
        "TERM": "xterm",
        "PROMPT_TOOLKIT_NO_CPR": "1",
        "COLUMNS": "120",
    }
    term = Terminal([FLUFFY, "--script", str(reviewed_script(tmp_path))], project, env)
    try:
        term.expect("[strict] [idle]")
        term.send("/status")
        term.expect("mode strict, state idle")
        term.send("Add error handling to parseConfig")
        screen = term.expect("/approve", timeout_s=300)
        assert "Reading /src/democonfig/config.py" in screen
        assert "fs.write is not available in test_writing" in screen  # refused, went on
        assert "Sensitive file modification requires review" in screen
        assert "pyproject.toml" in screen
        term.expect("[strict] [reviewing]")
        term.send("/approve")
        screen = term.expect("[strict] [idle]", timeout_s=300)
        assert "approved plan" in screen and "Done." in screen
        term.send("/explore")
        term.expect("mode explore, state idle")
        term.send("/quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    log = git(project, "-c", "safe.directory=*", "log", "--format=%s")
    assert log.splitlines()[0] == "Add error handling to parseConfig"
    assert "# error handling added" in (project / "pyproject.toml").read_text()
