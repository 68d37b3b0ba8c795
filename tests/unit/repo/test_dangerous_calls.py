"""Dangerous calls stay in named modules: starting processes, replacing one (exec), the
container engines' SDKs and sockets, and seccomp.  A module that gains one fails this
test until it is added below with the reason it needs it (a review point); a module that
no longer makes one must leave the list (it stays exact)."""

from __future__ import annotations

import ast

from tests.repo_files import ROOT, tracked

_EXEC = {"execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
         "system", "popen", "fork", "forkpty", "spawnv", "spawnl", "posix_spawn",
         "posix_spawnp"}  # fmt: skip
_MODULES = {"subprocess": "subprocess", "pty": "subprocess", "docker": "engine-sdk",
            "podman": "engine-sdk", "pyseccomp": "seccomp", "ctypes": "native"}  # fmt: skip
_ENGINE_NAMES = ("docker.sock", "podman.sock", "engine.sock", "DOCKER_HOST", "CONTAINER_HOST")

#: module -> (what it does that is dangerous, why it may)
ALLOWED: dict[str, tuple[set[str], str]] = {
    # the host side: the bootstrap and the CLI start the L1 kernel on the engine
    "bootstrap/__main__.py": ({"engine-socket"}, "passes DOCKER_HOST on to the supervisor"),
    "bootstrap/engine.py": ({"engine-socket"}, "finds the engine's socket (stdlib client)"),
    "bootstrap/l1.py": ({"engine-socket"}, "mounts the gate's engine socket into L1"),
    "gate/server.py": ({"engine-socket"}, "the engine gate: the only way L1 reaches the engine"),
    "fluffy/cli/lifecycle.py": (
        {"subprocess", "engine-socket"},
        "starts the bootstrap (fluffy start); checks the gate's socket path fits first",
    ),
    "fluffy/cli/connect.py": ({"subprocess"}, "starts the kernel; reads the person's git identity"),
    "fluffy/cli/branches.py": ({"subprocess"}, "git on the host: a branch session's copy, merge"),
    "fluffy/cli/config.py": ({"subprocess"}, "opens the user's $EDITOR on a policy file"),
    "fluffy/demo_session.py": ({"subprocess"}, "git on the demo's fresh copy"),
    "fluffy/doctor_kernel.py": ({"engine-socket"}, "checks the gate's socket exists"),
    # images are built on the host, never by the kernel
    "images/base.py": ({"subprocess"}, "debootstrap and tar for the Debian base"),
    "images/envdownload.py": ({"subprocess"}, "pip download of wheels (never an sdist)"),
    "images/envstage.py": ({"subprocess"}, "git describe for a project environment's tag"),
    "images/pyindex.py": ({"subprocess"}, "pip config list: the person's index settings"),
    "images/lock.py": ({"subprocess"}, "pip-compile of the requirements lock"),
    "images/wheelhouse.py": ({"subprocess"}, "pip download of the wheels the images install"),
    # the kernel: only the container layer speaks to the engine
    "kernel/containers/docker_runtime.py": ({"engine-sdk"}, "the Docker runtime"),
    "kernel/containers/podman_runtime.py": ({"engine-sdk"}, "the Podman runtime"),
    "kernel/containers/engine.py": ({"engine-sdk", "engine-socket"}, "engine detection"),
    "kernel/containers/errors.py": ({"engine-sdk"}, "maps the SDKs' exceptions to the tree"),
    "kernel/tools/sandbox/sandboxes.py": (
        {"engine-socket"},
        "points sandboxes at the gate's socket",
    ),
    "kernel/ai/provider.py": ({"subprocess"}, "the provider host as a process (no engine)"),
    "kernel/audit/recovery.py": ({"subprocess"}, "sqlite3 .recover of a damaged database"),
    "kernel/workflow/evidence.py": ({"subprocess"}, "the host's pytest when no sandbox runs"),
    # inside sandboxes and plugins
    "plugins/sdk/run.py": ({"subprocess"}, "a tool plugin's command, in its sandbox"),
    "plugins/container_tool/plugin.py": (
        {"subprocess"},
        "container.run: the command a person reviewed (or a rule allowed), in its sandbox",
    ),
    "sandboxes/envbuild.py": ({"subprocess"}, "pip in the environment-build sandbox"),
    "sandboxes/nodebuild.py": (
        {"subprocess"},
        "node --version, chmod in the Node environment's build",
    ),
    "sandboxes/nodescripts.py": ({"subprocess"}, "packages' install scripts in the image build"),
    "sandboxes/mcp_host.py": ({"exec"}, "becomes the MCP server on its socket"),
    "sandboxes/probe.py": (
        {"engine-socket", "exec", "native", "subprocess"},
        "the escape probes: attempts that must fail inside a sandbox",
    ),
    "seccomp/compile.py": ({"native", "seccomp"}, "compiles profiles with libseccomp"),
}


def _kinds(tree: ast.AST) -> set[str]:
    kinds: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            kinds |= {_MODULES[a.name.split(".")[0]] for a in node.names
                      if a.name.split(".")[0] in _MODULES}  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top = node.module.split(".")[0]
            if top in _MODULES:
                kinds.add(_MODULES[top])
            if top == "os" and any(a.name in _EXEC for a in node.names):
                kinds.add("exec")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in _EXEC:
                kinds.add("exec")
            if node.value.id == "asyncio" and node.attr.startswith("create_subprocess"):
                kinds.add("subprocess")
        elif isinstance(node, ast.Constant) and str(node.value).endswith(_ENGINE_NAMES):
            kinds.add("engine-socket")
    return kinds


def _found() -> dict[str, set[str]]:
    found = {}
    for path in tracked("*.py", skip=("tests/", "benchmarks/", "scripts/")):
        kinds = _kinds(ast.parse(path.read_text(encoding="utf-8")))
        if kinds:
            found[str(path.relative_to(ROOT))] = kinds
    return found


def test_dangerous_calls_stay_in_the_listed_modules() -> None:
    found = _found()
    unlisted = {m: sorted(k) for m, k in found.items() if m not in ALLOWED}
    assert not unlisted, f"dangerous calls in modules not listed here: {unlisted}"
    grown = {m: sorted(k - ALLOWED[m][0]) for m, k in found.items() if k - ALLOWED[m][0]}
    assert not grown, f"listed modules doing more than they are allowed: {grown}"
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"listed modules that no longer make such calls (remove them): {stale}"


def test_the_scanner_sees_each_kind() -> None:
    source = (
        "import subprocess\nimport os\nfrom docker import DockerClient\n"
        "os.execvp('x', ['x'])\nS = '/var/run/docker.sock'\nimport pyseccomp\nimport ctypes\n"
        "async def f():\n    import asyncio\n    await asyncio.create_subprocess_exec('x')\n"
    )
    assert _kinds(ast.parse(source)) == {"subprocess", "exec", "engine-sdk",
                                         "engine-socket", "seccomp", "native"}  # fmt: skip
    assert _kinds(ast.parse("import os\nos.getcwd()\n")) == set()
