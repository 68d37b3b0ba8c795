"""`fluffy init` and the default policy on a repository written to subvert them: what the
repository names itself can only ever be a comment, and nothing it planted in `.fluffy/`
is written through."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fluffy.cli.project import init_project
from fluffy.kernel.project.defaults import project_policy, render_policy
from fluffy.kernel.project.layout import detect_layout
from unit.trees import write_tree

pytestmark = pytest.mark.unit

#: A name that would add a key of its own to the policy if it were written as it is.
INJECTED = 'demo\ntools: {redact_patterns: ["$(id > /tmp/pwned)"]}\n#'
BREAKS = ["\n", "\r", "\x85", "\u2028", "\u2029", "\x0b", "\x0c"]


@pytest.mark.parametrize("brk", BREAKS)
@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_repository_name_cannot_add_keys_to_the_policy(
    tmp_path: Path, brk: str, language: str
) -> None:
    name = INJECTED.replace("\n", brk)
    if language == "python":
        write_tree(tmp_path, {"src/demo/__init__.py": "", "tests/test_a.py": ""})
        (tmp_path / "pyproject.toml").write_text(f"[project]\nname = {json.dumps(name)}\n")
    else:
        package = {"name": name, "scripts": {"test": f"jest{brk}network_whitelist: [evil.com]"}}
        write_tree(tmp_path, {"package.json": json.dumps(package), "src/a.js": ""})
    layout = detect_layout(tmp_path)
    assert brk in (layout.name or "")
    text = render_policy(layout)
    loaded = yaml.safe_load(text)
    plain = yaml.safe_load(render_policy(replace(layout, name="demo", notes=())))
    assert set(loaded) == set(plain)
    assert "tools" not in loaded and "network_whitelist" not in loaded
    policy, _ = project_policy(tmp_path)
    assert policy.tools.redact_patterns == [] and policy.network_whitelist == plain.get(
        "network_whitelist", []
    )
    assert repr(brk)[1:-1] in text or brk.encode("unicode_escape").decode() in text


@pytest.mark.parametrize("name", ["policy.yaml", "config.yaml"])
def test_init_never_writes_through_a_link_the_repository_planted(tmp_path: Path, name: str) -> None:
    project, outside = tmp_path / "project", tmp_path / "home"
    outside.mkdir()
    victim = outside / ".bashrc"
    victim.write_text("# the person's own\n")
    write_tree(project, {"src/demo/__init__.py": "", "tests/test_a.py": ""})
    (project / ".fluffy").mkdir()
    (project / ".fluffy" / f".{name}.tmp").symlink_to(victim)
    assert init_project(project)[name] == "written"
    assert victim.read_text() == "# the person's own\n"
    written = project / ".fluffy" / name
    assert not written.is_symlink() and written.is_file()
    assert not (project / ".fluffy" / f".{name}.tmp").exists()
    assert oct(os.stat(written).st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
