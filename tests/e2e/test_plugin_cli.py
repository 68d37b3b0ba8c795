"""`fluffy plugin ...` as a user runs it: install under review, list, info, disable, remove.

No kernel and no engine: installing writes the plugin store in FLUFFY_HOME (a temporary
folder here).  Without a terminal and without --yes nothing is installed; on a terminal
(a pseudo-terminal here) the user's answer decides.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLUFFY = str(Path(sys.executable).parent / "fluffy")
EXAMPLE = ROOT / "examples" / "plugins" / "lint-tool"
POLICY = """
capabilities:
  - name: lint
    match: {syscall: [lint.check, fs.read], caller_tag: [third_party]}
    action: allow
"""


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return tmp_path / "fluffy-home"


def env_of(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLUFFY_PLUGIN_STORE",)}
    env["FLUFFY_HOME"] = str(home)
    return env


def fluffy(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, "plugin", *args],
        capture_output=True,
        text=True,
        env=env_of(home),
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def data(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def store_entries(home: Path) -> set[str]:
    root = home / "plugins"
    return {p.name for p in root.iterdir() if p.is_dir()} if root.exists() else set()


def test_without_a_terminal_and_without_yes_nothing_is_installed(home: Path) -> None:
    proc = fluffy(home, "install", str(EXAMPLE))
    assert proc.returncode == 1
    assert "ERROR: lint-tool 1.0.0 was not installed: there is no terminal" in proc.stderr
    assert "Fix: Run it on a terminal and answer yes, or pass --yes" in proc.stderr
    assert "lint.check" in proc.stdout and "capabilities fs.read" in proc.stdout  # it was shown
    assert store_entries(home) == set()
    assert data(fluffy(home, "list", "--json"))["plugins"] == []


def test_install_list_info_disable_enable_remove(home: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".fluffy").mkdir(parents=True)
    (project / ".fluffy" / "policy.yaml").write_text(POLICY)
    proc = fluffy(home, "install", str(EXAMPLE), "--yes", "--json", "--project", str(project))
    assert proc.returncode == 0, proc.stderr
    installed = data(proc)
    assert installed["installed"]["state"] == "REGISTERED"
    assert installed["installed"]["tools"] == ["lint.check"]
    assert installed["installed"]["tags"] == ["example", "lint", "third_party"]
    assert installed["plan"]["warnings"] == []  # the project's policy allows what it needs
    assert store_entries(home) == {"lint-tool"}
    copy = home / "plugins" / "lint-tool" / "1.0.0"
    assert (copy / "plugin.py").read_bytes() == (EXAMPLE / "plugin.py").read_bytes()

    listed = data(fluffy(home, "list", "--json"))["plugins"]
    assert [(p["name"], p["version"], p["state"]) for p in listed] == [
        ("lint-tool", "1.0.0", "REGISTERED")
    ]
    info = data(fluffy(home, "info", "lint-tool", "--json"))
    assert info["integrity"]["ok"] is True and info["required_capabilities"] == ["fs.read"]

    off = fluffy(home, "disable", "lint-tool", "--reason", "trying without it", "--json")
    assert off.returncode == 0, off.stderr
    assert (data(off)["state"], data(off)["reason"]) == ("DISABLED", "trying without it")
    on = fluffy(home, "enable", "lint-tool", "--json")
    assert on.returncode == 0 and data(on)["state"] == "REGISTERED"

    again = fluffy(home, "install", str(EXAMPLE), "--yes")
    assert again.returncode == 1
    assert "a plugin named 'lint-tool' is already registered" in again.stderr

    (copy / "plugin.py").write_text("PLUGIN = None\n")  # tampered in the store
    shown = fluffy(home, "info", "lint-tool")
    assert "CHANGED" in shown.stdout and "state                  DISABLED" not in shown.stdout

    listed = fluffy(home, "list")
    assert "lint-tool 1.0.0  REGISTERED  tools: lint.check" in listed.stdout
    unconfirmed = fluffy(home, "remove", "lint-tool")  # no terminal to ask on, no --yes
    assert unconfirmed.returncode == 1 and "--yes was not given" in unconfirmed.stderr
    assert "lint-tool" in fluffy(home, "list").stdout  # still installed
    removed = fluffy(home, "remove", "lint-tool", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert store_entries(home) == set()
    assert data(fluffy(home, "list", "--json"))["plugins"] == []
    missing = fluffy(home, "info", "lint-tool")
    assert missing.returncode == 3 and "no plugin named 'lint-tool'" in missing.stderr


def test_hostile_plugins_are_rejected_and_listed_with_reasons(home: Path, tmp_path: Path) -> None:
    escaping = tmp_path / "escaping"
    escaping.mkdir()
    for name in ("manifest.yaml", "plugin.py"):
        (escaping / name).write_bytes((EXAMPLE / name).read_bytes())
    (escaping / "keys").symlink_to(Path.home())
    bad_yaml = tmp_path / "bad-yaml"
    bad_yaml.mkdir()
    (bad_yaml / "manifest.yaml").write_text("name: x\ntools: [\n")
    for folder, message in (
        (escaping, "keys is a symbolic link to"),
        (bad_yaml, "not valid YAML"),
    ):
        proc = fluffy(home, "install", str(folder), "--yes")
        assert proc.returncode == 1, proc.stdout
        assert message in proc.stderr
    assert store_entries(home) == set()
    rejected = data(fluffy(home, "list", "--rejected", "--json"))["plugins"]
    assert {Path(r["manifest_path"]).parent.name: r["state"] for r in rejected} == {
        "escaping": "REJECTED",
        "bad-yaml": "REJECTED",
    }
    reasons = {Path(r["manifest_path"]).parent.name: r["reason"] for r in rejected}
    assert "leaves the plugin folder" in reasons["escaping"]
    assert "bad-yaml/manifest.yaml:3: not valid YAML" in reasons["bad-yaml"]
    assert data(fluffy(home, "list", "--json"))["plugins"] == []


def _run_on_a_terminal(home: Path, answer: bytes) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [FLUFFY, "plugin", "install", str(EXAMPLE)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env_of(home),
        close_fds=True,
    )
    os.close(slave)
    output = b""
    answered = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not answered and b"[y/N]" in output:
                os.write(master, answer)
                answered = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert answered, output.decode(errors="replace")
    return code, output.decode(errors="replace")


def test_on_a_terminal_the_users_answer_decides(home: Path) -> None:
    code, output = _run_on_a_terminal(home, b"n\n")
    assert code == 1 and "not installed" in output
    assert store_entries(home) == set()
    code, output = _run_on_a_terminal(home, b"y\n")
    assert code == 0 and "installed lint-tool 1.0.0" in output, output
    assert store_entries(home) == {"lint-tool"}
